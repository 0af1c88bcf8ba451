"""DeepSpeed ZeRO checkpoints (stages 1, 2, 3; fp16 and bf16 optimizer files;
rigid and elastic optimizer states; buffers, frozen and shared parameters),
SYNTHESIZED by deepspeed_fixtures.py (DeepSpeed is not installable here),
read by Tessera: every weight and moment bitwise equal to a NumPy
re-implementation of zero_to_fp32's arithmetic and to the values the
generator partitioned; converted to safetensors in one command, resharded to
other data-parallel sizes and back bit for bit; damaged and hostile
directories refused by name."""
import json
import os
import shutil
import struct
import subprocess
import zipfile

import numpy as np
import pytest

import tessera
from conftest import run

torch = pytest.importorskip("torch")
import deepspeed_fixtures as dsf  # noqa: E402  (needs torch)

BUFFERS = {"h.0.mask": torch.tril(torch.ones(3, 3))}
SHARED = {"lm_head.weight": "h.0.fc.weight"}


def make(root, stage, dp, **kw):
    params, groups = dsf.model()
    frozen = {"wte.weight": torch.arange(15.0).reshape(5, 3)}
    moments = dsf.write(root, stage, dp, params, groups, buffers=BUFFERS, frozen=frozen,
                        shared=SHARED, **kw)
    truth = {n: p.numpy() for n, p in params.items()}
    truth.update({f"optimizer.{n}.{k}": m[n].numpy() for k, m in moments.items() for n in params})
    truth.update({n: b.numpy() for n, b in BUFFERS.items()})
    truth["lm_head.weight"] = truth["h.0.fc.weight"]
    if stage >= 2:
        truth.update({n: t.numpy() for n, t in frozen.items()})
    return truth


CASES = [
    (1, 2, {}), (1, 3, {}), (2, 2, {}), (2, 3, {"elastic": True}), (2, 4, {}),
    (3, 2, {}), (3, 3, {}), (3, 4, {}), (1, 2, {"bf16": True}), (1, 3, {"bf16": True}),
]


@pytest.mark.parametrize("stage,dp,kw", CASES,
                         ids=[f"zero{s}-dp{d}" + "".join(f"-{k}" for k in kw) for s, d, kw in CASES])
def test_values_equal_zero_to_fp32(tmp_path, stage, dp, kw):
    truth = make(tmp_path, stage, dp, **kw)
    ref = dsf.reference(tmp_path / "global_step7")
    r = tessera.open(str(tmp_path))
    assert r.format == "deepspeed"
    assert sorted(r.keys()) == sorted(ref) == sorted(truth)
    for name in ref:
        got = r.read(name)
        assert got.dtype == ref[name].dtype and got.shape == ref[name].shape, name
        assert np.array_equal(got.view(np.uint8), ref[name].view(np.uint8)), name
        assert np.array_equal(got.view(np.uint8), truth[name].view(np.uint8)), name
    # A region cut across the partitions (rows and columns).
    w = r.read("h.0.fc.weight", box=[(2, 6), (1, 4)])
    assert np.array_equal(w, truth["h.0.fc.weight"][2:6, 1:4])
    stage_text = r.metadata["deepspeed.zero_stage"]
    assert stage_text in (str(stage), str(stage).encode())


def test_tag_directory_and_inspect(tmp_path, ckpt_bin):
    make(tmp_path, 2, 2)
    out = subprocess.run([ckpt_bin, "inspect", tmp_path / "global_step7", "--json"],
                         check=True, capture_output=True, text=True).stdout
    j = json.loads(out)
    assert j["format"] == "deepspeed" and j["step"] == 7
    md = {m["key"]: m["text"] for m in j["metadata"]}
    assert md["deepspeed.zero_stage"] == "2"
    assert md["deepspeed.optimizer_state_dict.loss_scaler.cur_scale"] == "65536.0"
    run(ckpt_bin, "verify", tmp_path)


def test_convert_to_safetensors_and_torch(tmp_path, ckpt_bin):
    truth = make(tmp_path / "ds", 3, 3)
    run(ckpt_bin, "convert", tmp_path / "ds", "-o", tmp_path / "st", "--format", "safetensors",
        "--max-shard-size", "1KB", "-q")
    index = json.load(open(tmp_path / "st" / "model.safetensors.index.json"))
    assert len(set(index["weight_map"].values())) > 1
    r = tessera.open(str(tmp_path / "st"))
    for name, want in truth.items():
        assert np.array_equal(r.read(name), want), name
    run(ckpt_bin, "convert", tmp_path / "ds", "-o", tmp_path / "model.pt", "--format", "torch", "-q")
    sd = torch.load(tmp_path / "model.pt", weights_only=True)
    for name, want in truth.items():
        assert np.array_equal(sd[name].numpy(), want), name


def zero_strategy(ckpt_bin, src, dp):
    """Every tensor replicated over dp with its optimizer shard on dp where
    dimension 0 divides (ZeRO-1 over dp ranks)."""
    j = json.loads(subprocess.run([ckpt_bin, "inspect", src, "--json"], check=True,
                                  capture_output=True, text=True).stdout)
    tensors = {}
    for t in j["tensors"]:
        spec = {"shape": t["shape"], "dtype": t["dtype"], "split": [None] * len(t["shape"])}
        if t["shape"] and t["shape"][0] % dp == 0:
            spec["opt_shard"] = ["dp"]
        tensors[t["name"]] = spec
    return {"mesh": {"axes": ["dp"], "shape": [dp]}, "tensors": tensors}


@pytest.mark.parametrize("dp", [3, 5])
def test_reshard_to_other_dp_sizes(tmp_path, ckpt_bin, dp):
    make(tmp_path / "ds", 2, 2)
    (tmp_path / "s.json").write_text(json.dumps(zero_strategy(ckpt_bin, tmp_path / "ds", dp)))
    run(ckpt_bin, "reshard", tmp_path / "ds", "-o", tmp_path / "n", "--strategy",
        tmp_path / "s.json", "-q")
    j = json.loads(subprocess.run([ckpt_bin, "inspect", tmp_path / "n", "--json"], check=True,
                                  capture_output=True, text=True).stdout)
    assert j["mesh"] == {"dp": dp}
    run(ckpt_bin, "merge", tmp_path / "n", "-o", tmp_path / "m", "-q")
    run(ckpt_bin, "diff", tmp_path / "m", tmp_path / "ds")


def fails(ckpt_bin, *args):
    p = subprocess.run([str(a) for a in (ckpt_bin,) + args], capture_output=True, text=True)
    assert p.returncode != 0, p.stdout
    return p.stderr


def test_damaged_directories(tmp_path, ckpt_bin):
    make(tmp_path / "a", 3, 3)
    tag = tmp_path / "a" / "global_step7"
    # A missing rank.
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    os.remove(tmp_path / "b" / "global_step7" / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt" in fails(ckpt_bin, "inspect", tmp_path / "b")
    # A leftover rank of a larger job.
    shutil.copytree(tmp_path / "a", tmp_path / "c")
    shutil.copy(tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                tmp_path / "c" / "global_step7" / "zero_pp_rank_3_mp_rank_00_optim_states.pt")
    assert "more optimizer files than partition_count 3" in fails(ckpt_bin, "inspect", tmp_path / "c")
    # Tensor parallelism is refused by name.
    shutil.copytree(tmp_path / "a", tmp_path / "d")
    shutil.copy(tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                tmp_path / "d" / "global_step7" / "zero_pp_rank_0_mp_rank_01_optim_states.pt")
    assert "model-parallel" in fails(ckpt_bin, "inspect", tmp_path / "d")
    # 'latest' naming nothing.
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "latest").write_text("global_step9")
    fails(ckpt_bin, "inspect", tmp_path / "e")
    # Partitions that do not hold the parameters param_shapes names.
    params, groups = dsf.model()
    params["h.0.fc.weight"] = torch.randn(7, 6)
    dsf.write(tmp_path / "f", 2, 2, params, groups)
    p, g = dsf.model()
    shapes = [dict((n, p[n].shape) for n in names) for names in g]
    m = tmp_path / "f" / "global_step7" / "mp_rank_00_model_states.pt"
    state = torch.load(m, weights_only=False)
    state["param_shapes"] = shapes
    torch.save(state, m)
    err = fails(ckpt_bin, "inspect", tmp_path / "f")
    assert "group 0's parameters take" in err and "'f'" not in err
    # Formats of DeepSpeed this reader does not take are named.
    shutil.copytree(tmp_path / "a", tmp_path / "u")
    (tmp_path / "u" / "latest_universal").write_text("global_step7_universal")
    assert "universal checkpoints" in fails(ckpt_bin, "inspect", tmp_path / "u")
    shutil.copytree(tmp_path / "a", tmp_path / "x")
    shutil.copy(tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                tmp_path / "x" / "global_step7" / "expp_rank_0_mp_rank_00_optim_states.pt")
    assert "mixture-of-experts" in fails(ckpt_bin, "inspect", tmp_path / "x")
    # A flipped byte in a partition: found by verify and by reads, naming the file.
    shutil.copytree(tmp_path / "a", tmp_path / "g")
    victim = tmp_path / "g" / "global_step7" / "zero_pp_rank_2_mp_rank_00_optim_states.pt"
    with zipfile.ZipFile(victim) as z:
        info = next(i for i in z.infolist() if "/data/" in i.filename and i.file_size > 16)
    with open(victim, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
        f.seek(info.header_offset + 30 + name_len + extra_len + 4)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x10]))
    err = fails(ckpt_bin, "verify", tmp_path / "g")
    assert "zero_pp_rank_2_mp_rank_00_optim_states.pt" in err and "CRC-32" in err


def test_hostile_objects_are_inert(tmp_path, ckpt_bin):
    make(tmp_path, 2, 2)
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))
    m = tmp_path / "global_step7" / "mp_rank_00_model_states.pt"
    state = torch.load(m, weights_only=False)
    state["ds_config"] = Evil()
    torch.save(state, m, pickle_protocol=2)
    out = subprocess.run([ckpt_bin, "inspect", tmp_path], check=True, capture_output=True,
                         text=True).stdout
    assert "system" in out and not marker.exists()
