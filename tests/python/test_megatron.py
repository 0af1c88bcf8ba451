"""Megatron-LM legacy checkpoints (mp_rank directories; legacy and
megatron.core names; tensor, pipeline and virtual-pipeline parallel; swiglu),
SYNTHESIZED by megatron_fixtures.py (Megatron cannot run here), read by
Tessera merged across ranks: every tensor bitwise equal to the unsharded
model's; converted to safetensors, resharded to other tensor-parallel
sizes and back; damaged directories refused by name."""
import json
import shutil
import subprocess

import numpy as np
import pytest

import tessera
from conftest import run

torch = pytest.importorskip("torch")
import megatron_fixtures as mf  # noqa: E402  (needs torch)

CASES = [
    ("mcore", 2, 1, 1, False), ("mcore", 2, 2, 1, True), ("mcore", 1, 2, 2, False),
    ("mcore", 2, 2, 2, True), ("legacy", 2, 1, 1, False), ("legacy", 2, 2, 2, False),
    ("legacy", 4, 1, 1, True),
]


def make(root, family, tp, pp, vp, swiglu, **kw):
    full = mf.model(family, swiglu=swiglu)
    mf.write(root, full, family, tp, pp, vp, swiglu, **kw)
    return full


@pytest.mark.parametrize("family,tp,pp,vp,swiglu", CASES,
                         ids=[f"{f}-tp{t}-pp{p}-vp{v}" + ("-swiglu" if s else "")
                              for f, t, p, v, s in CASES])
def test_merged_tensors_equal_the_unsharded_model(tmp_path, family, tp, pp, vp, swiglu):
    full = make(tmp_path, family, tp, pp, vp, swiglu)
    r = tessera.open(str(tmp_path))
    assert r.format == "megatron" and r.step == 100
    assert sorted(r.keys()) == sorted(full)
    for name, t in full.items():
        got = r.read(name)
        assert got.shape == tuple(t.shape) and np.array_equal(got, t.numpy()), name
    # A box across the ranks' slices, rows and columns.
    qkv = [n for n in full if n.endswith("qkv.weight") or n.endswith("query_key_value.weight")][-1]
    assert np.array_equal(r.read(qkv, box=[(3, 21), (2, 7)]), full[qkv].numpy()[3:21, 2:7])
    md = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in r.metadata.items()}
    assert md["megatron.tensor_parallel"] == str(tp)
    assert md["megatron.args.swiglu"] == str(swiglu)
    assert "megatron.not_read" in md  # the optimizer and RNG tensors


def test_quick_geglu_is_gated_too(tmp_path):
    full = mf.model("mcore", swiglu=True)
    mf.write(tmp_path, full, "mcore", 2, 1, 1, True, gated_flag="quick_geglu")
    r = tessera.open(str(tmp_path))
    for name, t in full.items():
        assert np.array_equal(r.read(name), t.numpy()), name


def tp_strategy(ckpt_bin, src, tp):
    """Megatron's own cut at another tensor-parallel size, as a Tessera strategy."""
    j = json.loads(subprocess.run([ckpt_bin, "inspect", src, "--json"], check=True,
                                  capture_output=True, text=True).stdout)
    tensors = {}
    for t in j["tensors"]:
        split = [None] * len(t["shape"])
        if t["name"].endswith(mf.ROWS + mf.FC1):
            split[0] = ["tp"]
        elif t["name"].endswith(mf.COLUMNS):
            split[1] = ["tp"]
        tensors[t["name"]] = {"shape": t["shape"], "dtype": t["dtype"], "split": split}
    return {"mesh": {"axes": ["tp"], "shape": [tp]}, "tensors": tensors}


def test_convert_and_reshard(tmp_path, ckpt_bin):
    full = make(tmp_path / "m", "mcore", 2, 2, 1, False)
    run(ckpt_bin, "convert", tmp_path / "m", "-o", tmp_path / "st", "--format", "safetensors",
        "--max-shard-size", "2KB", "-q")
    st = tessera.open(str(tmp_path / "st"))
    for name, t in full.items():
        assert np.array_equal(st.read(name), t.numpy()), name
    for tp in (4, 8):
        (tmp_path / "s.json").write_text(json.dumps(tp_strategy(ckpt_bin, tmp_path / "m", tp)))
        out = tmp_path / f"tp{tp}"
        run(ckpt_bin, "reshard", tmp_path / "m", "-o", out, "--strategy", tmp_path / "s.json", "-q")
        run(ckpt_bin, "merge", out, "-o", tmp_path / f"merged{tp}", "-q")
        run(ckpt_bin, "diff", tmp_path / f"merged{tp}", tmp_path / "st")


def fails(ckpt_bin, *args):
    p = subprocess.run([str(a) for a in (ckpt_bin,) + args], capture_output=True, text=True)
    assert p.returncode != 0, p.stdout
    return p.stderr


def test_damaged_directories(tmp_path, ckpt_bin):
    make(tmp_path / "a", "mcore", 2, 2, 1, False)
    it = "iter_0000100"
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / it / "mp_rank_01_001")
    assert "mp_rank_01_001" in fails(ckpt_bin, "inspect", tmp_path / "b")
    shutil.copytree(tmp_path / "a", tmp_path / "c")
    shutil.copytree(tmp_path / "a" / it / "mp_rank_01_000", tmp_path / "c" / it / "mp_rank_02_000")
    assert "mp_rank_02_000 is beyond the sizes" in fails(ckpt_bin, "inspect", tmp_path / "c")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "latest_checkpointed_iteration.txt").write_text("200")
    assert "iter_0000200" in fails(ckpt_bin, "inspect", tmp_path / "d")
    # A tensor the split table does not know, with tensor parallelism.
    full = mf.model("mcore")
    full["decoder.layers.0.mlp.router.weight"] = torch.randn(4, 8)
    mf.write(tmp_path / "e", full, "mcore", 2, 1, 1)
    err = fails(ckpt_bin, "inspect", tmp_path / "e")
    assert "decoder.layers.0.mlp.router.weight" in err and "split table" in err
    # checkpoint_version 0's QKV layout cannot be merged.
    mf.write(tmp_path / "f", mf.model("legacy"), "legacy", 2, 1, 1, version=0.0)
    assert "checkpoint_version 0" in fails(ckpt_bin, "inspect", tmp_path / "f")
    # ... and so does a file without one (Megatron reads it as version 0).
    mf.write(tmp_path / "g", mf.model("legacy"), "legacy", 2, 1, 1, version=None)
    assert "checkpoint_version 0" in fails(ckpt_bin, "inspect", tmp_path / "g")
    # Another layer stack (multi-token prediction) across pipeline stages.
    full = mf.model("mcore")
    full["mtp.layers.0.enorm.weight"] = torch.randn(8)
    mf.write(tmp_path / "h", full, "mcore", 1, 2, 1)
    err = fails(ckpt_bin, "inspect", tmp_path / "h")
    assert "mtp.layers.0.enorm.weight" in err and "layer stack" in err
    # Expert-parallel rank directories.
    ep = tmp_path / "i" / "iter_0000100" / "mp_rank_00_000_000"
    ep.mkdir(parents=True)
    shutil.copy(tmp_path / "a" / it / "mp_rank_00_000" / "model_optim_rng.pt", ep)
    (tmp_path / "i" / "latest_checkpointed_iteration.txt").write_text("100")
    assert "expert-parallel" in fails(ckpt_bin, "inspect", tmp_path / "i")
