"""PyTorch's torch.save files, written here by Debian's PyTorch 1.13 (zip
format, legacy format, pickle protocol 4, Hugging Face shards with an
index), read by Tessera without running their pickles: every tensor equal to
torch.load's, bit for bit; conversions; damaged and hostile files."""
import collections
import io
import json
import os
import pickle
import subprocess
import zipfile

import numpy as np
import pytest

import tessera
from conftest import run

torch = pytest.importorskip("torch")


def bits(t):
    """A tensor's values as numpy, bf16 as its uint16 bits (as tessera reads it)."""
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def flatten(obj, path=""):
    """Tensors by path, as Tessera names them."""
    join = (lambda k: f"{path}.{k}" if path else str(k))
    if isinstance(obj, torch.Tensor):
        return {path or "tensor": obj}
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, join(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flatten(v, join(i)))
    return out


def state():
    torch.manual_seed(0)
    a = torch.randn(6, 5)
    lin = torch.nn.Linear(5, 3)
    opt = torch.optim.Adam(lin.parameters(), lr=1e-3)
    lin(torch.randn(2, 5)).sum().backward()
    opt.step()
    return {
        "model": lin.state_dict(),
        "optimizer": opt.state_dict(),
        # Views of one storage: rows at an offset, a transpose, a strided column.
        "views": {"a": a, "rows": a[2:5], "t": a.t(), "col": a[:, 1]},
        "f16": torch.randn(4, 3).half(),
        "bf16": torch.randn(3, 4).bfloat16(),
        "f64": torch.randn(2, 3, dtype=torch.float64),
        "i64": torch.arange(7) - 3,
        "i32": torch.arange(4, dtype=torch.int32),
        "u8": torch.arange(5, dtype=torch.uint8),
        "bool": torch.rand(5) > 0.5,
        "param": torch.nn.Parameter(torch.randn(2, 2)),
        "nested": [{"x": torch.ones(3)}, (torch.zeros(2, 2), 7)],
        "ordered": collections.OrderedDict([("w", torch.randn(3))]),
        "big": torch.randn(300, 257),  # over 64 KiB: read through a mapping
        "iteration": 42,
        "scalar": torch.tensor(3.5),
    }


def check_equal(path, obj):
    r = tessera.open(path)
    assert r.format == "torch"
    want = flatten(obj)
    assert sorted(r.keys()) == sorted(want)
    for name, t in want.items():
        got = r.read(name)
        ref = bits(t)
        assert got.shape == ref.shape and got.dtype == ref.dtype, name
        assert np.array_equal(got, ref), name
    return r


@pytest.mark.parametrize("how", ["zip", "legacy", "protocol4"])
def test_every_tensor_equals_torch_load(tmp_path, how):
    obj = state()
    p = tmp_path / "s.pt"
    kwargs = {"zip": {}, "legacy": {"_use_new_zipfile_serialization": False},
              "protocol4": {"pickle_protocol": 4}}[how]
    torch.save(obj, p, **kwargs)
    r = check_equal(p, torch.load(p))
    assert r.step == 42
    assert r.metadata["torch.optimizer.param_groups"].startswith(b"[{'lr': 0.001")
    # A box of a transposed view and of a strided column.
    t = obj["views"]["t"]
    assert np.array_equal(r.read("views.t", [(1, 4), (2, 6)]), t[1:4, 2:6].numpy())
    assert np.array_equal(r.read("views.col", [(2, 5)]), obj["views"]["col"][2:5].numpy())


def test_conversions_keep_every_bit(tmp_path, ckpt_bin):
    obj = state()
    p = tmp_path / "s.pt"
    torch.save(obj, p)
    want = {n: bits(t) for n, t in flatten(obj).items()}
    outs = {"safetensors": tmp_path / "o.safetensors", "native": tmp_path / "o-native",
            "hdf5": tmp_path / "o.h5"}
    for fmt, out in outs.items():
        run(ckpt_bin, "convert", p, "-o", out, "--format", fmt, "--quiet")
        r = tessera.open(out)
        for n, ref in want.items():
            assert np.array_equal(r.read(n), ref), (fmt, n)
    run(ckpt_bin, "verify", outs["native"])
    # ckpt diff between the source and its conversion finds nothing.
    run(ckpt_bin, "diff", p, outs["safetensors"])


def test_hugging_face_shards_with_an_index(tmp_path, ckpt_bin):
    torch.manual_seed(1)
    shards = [{"a.weight": torch.randn(4, 4), "a.bias": torch.randn(4)},
              {"b.weight": torch.randn(2, 4).half()}]
    weight_map = {}
    for i, s in enumerate(shards):
        name = f"pytorch_model-{i + 1:05d}-of-{len(shards):05d}.bin"
        torch.save(s, tmp_path / name)
        weight_map.update({k: name for k in s})
    (tmp_path / "pytorch_model.bin.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    for path in (tmp_path, tmp_path / "pytorch_model.bin.index.json"):
        r = tessera.open(path)
        for s in shards:
            for n, t in s.items():
                assert np.array_equal(r.read(n), bits(t)), n
    out = tmp_path / "hf"
    run(ckpt_bin, "convert", tmp_path, "-o", out, "--format", "safetensors", "--quiet")
    assert np.array_equal(tessera.open(out).read("b.weight"), bits(shards[1]["b.weight"]))


def test_a_damaged_storage_is_named(tmp_path):
    p = tmp_path / "s.pt"
    torch.save({"w": torch.arange(100, dtype=torch.float32)}, p)
    data = bytearray(p.read_bytes())
    with zipfile.ZipFile(p) as z:
        info = next(i for i in z.infolist() if i.filename.endswith("/data/0"))
    # The record's data follows its local header.
    local_extra = int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
    at = info.header_offset + 30 + len(info.filename.encode()) + local_extra
    data[at + 17] ^= 0x40
    p.write_bytes(bytes(data))
    r = tessera.open(p)
    with pytest.raises(Exception, match=r"data/0.*CRC-32"):
        r.read("w")


def zip_with_pickle(path, payload):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", payload)
        z.writestr("archive/version", "3\n")


class RunsCode:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_hostile_pickles_run_nothing(tmp_path, ckpt_bin):
    marker = tmp_path / "ran"
    # torch.save of an object that would run a command when unpickled
    # (GLOBAL posix system + REDUCE), beside a tensor: the tensor reads, the
    # call is shown by name, and nothing runs.
    p = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(3), "x": RunsCode(f"touch {marker}")}, p)
    r = tessera.open(p)
    assert np.array_equal(r.read("w"), np.ones(3, np.float32))
    assert r.metadata["torch.x"].startswith(b"posix.system")
    out = subprocess.run([str(ckpt_bin), "inspect", str(p)], capture_output=True, text=True)
    assert out.returncode == 0 and "posix.system" in out.stdout
    # builtins.eval and subprocess.Popen the same way, through raw pickles.
    def text(s):
        return b"X" + len(s).to_bytes(4, "little") + s
    for name, payload in [
        ("eval", b"\x80\x02cbuiltins\neval\n" + text(b"open('x','w')") + b"\x85R."),
        ("popen", b"\x80\x02csubprocess\nPopen\n" + text(b"touch") + b"\x85R."),
    ]:
        zip_with_pickle(tmp_path / f"{name}.pt", payload)
        r = tessera.open(tmp_path / f"{name}.pt")
        assert len(r.keys()) == 0
    # Opcodes with no inert reading are refused by name.
    for name, payload, opcode in [
        ("inst", b"(S'touch x'\nios\nsystem\n.", "INST"),
        ("obj", b"\x80\x02(cos\nsystem\nS'touch x'\no.", "OBJ"),
        ("persid", b"Pfoo\n.", "PERSID"),
        ("ext", b"\x80\x02\x82\x01.", "EXT1"),
    ]:
        f = tmp_path / f"{name}.pt"
        zip_with_pickle(f, payload)
        with pytest.raises(Exception, match=f"{opcode}.*refused"):
            tessera.open(f)
        out = subprocess.run([str(ckpt_bin), "inspect", str(f)], capture_output=True, text=True)
        assert out.returncode == 1 and str(f) in out.stderr and "refused" in out.stderr
    # Hostile shapes: a cycle, deep nesting, a memo key far away.
    for name, payload, what in [
        ("cycle", b"\x80\x02]q\x00h\x00a.", "nest deeper"),
        ("deep", b"\x80\x02" + b"]" * 5000 + b"a" * 4999 + b".", "nest deeper"),
        ("memo", b"\x80\x02Nr\xff\xff\xff\xffj\x00\x00\x00\x10.", "never stored"),
        ("long", b"\x80\x02X\xff\xff\xff\x7f", "past the end"),
    ]:
        f = tmp_path / f"{name}.pt"
        zip_with_pickle(f, payload)
        with pytest.raises(Exception, match=what):
            tessera.open(f)
    assert not marker.exists() and not (tmp_path / "x").exists()


def test_a_pickle_stream_too_short_or_wrong(tmp_path):
    for payload in [b"", b"\x80\x02", b"\x80\x09N.", b"\x80\x02NN."]:
        f = tmp_path / "bad.pt"
        zip_with_pickle(f, payload)
        with pytest.raises(Exception, match="pickle"):
            tessera.open(f)
