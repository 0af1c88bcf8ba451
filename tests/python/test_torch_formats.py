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


def test_verify_says_what_it_checked(tmp_path, ckpt_bin):
    for how, kwargs, said in [("zip", {}, "checked against the CRC-32 of every storage"),
                              ("legacy", {"_use_new_zipfile_serialization": False},
                               "keeps no checksums")]:
        p = tmp_path / f"{how}.pt"
        torch.save(state(), p, **kwargs)
        out = subprocess.run([str(ckpt_bin), "verify", str(p)], check=True, capture_output=True,
                             text=True).stdout
        assert "0 problems" in out and said in out, out


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


def zip_with_pickle(path, payload, storages=()):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", payload)
        for i, data in enumerate(storages):
            z.writestr(f"archive/data/{i}", data)
        z.writestr("archive/version", "3\n")


def u(text):
    """BINUNICODE of `text`."""
    b = text.encode()
    return b"X" + len(b).to_bytes(4, "little") + b


def tensor_pickle(numel, size_opcodes):
    """_rebuild_tensor_v2 of storage '0' (FloatStorage of `numel`), offset 0,
    the size the given opcodes push, strides ()."""
    numel_op = b"\x8a\x08" + numel.to_bytes(8, "little")
    return (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((" + u("storage") +
            b"ctorch\nFloatStorage\n" + u("0") + u("cpu") + numel_op + b"tQK\x00" +
            size_opcodes + b")\x89tR.")


def test_hostile_shapes_found_in_review(tmp_path):
    cases = [
        # torch.Size rebuilt from no arguments.
        ("size", tensor_pickle(4, b"ctorch\nSize\n)R"), [b"\0" * 16], "tuple of integers"),
        # A storage whose byte count overflows: must not read past its record.
        ("numel", tensor_pickle((1 << 62) + 16, b")"), [b"\0" * 64], "impossible size"),
        # Memoized names copied into thousands of globals.
        ("globals", b"\x80\x04" + u("m" * 500000) + b"\x94" + u("n") + b"\x94" +
         b"h\x00h\x01\x930" * 2000 + b"N.", [], "global names"),
    ]
    for name, payload, storages, what in cases:
        f = tmp_path / f"{name}.pt"
        zip_with_pickle(f, payload, storages)
        with pytest.raises(Exception, match=what):
            r = tessera.open(f)
            for k in r.keys():
                r.read(k)
    # Shared references fanned out 2^30 times: shown within a bound.
    levels = b"\x80\x02]q\x000"
    for i in range(1, 31):
        levels += b"}(" + (b"h" + bytes([i - 1])) * 8 + b"uq" + bytes([i]) + (b"0" if i < 30 else b"")
    f = tmp_path / "fanout.pt"
    zip_with_pickle(f, levels + b".")
    try:
        r = tessera.open(f)
        assert len(r.keys()) == 0 and all(len(v) < 100000 for v in r.metadata.values())
    except Exception as e:
        assert any(w in str(e) for w in ("too many values", "deeper", "names longer"))
    # The same record name twice: readers disagree on which counts.
    f = tmp_path / "twice.pt"
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with zipfile.ZipFile(f, "w") as z:
            z.writestr("archive/data.pkl", b"\x80\x02}.")
            z.writestr("archive/data.pkl", b"\x80\x02}.")
    with pytest.raises(Exception, match="appears twice"):
        tessera.open(f)
    # POP right after MARK pops the mark, as in CPython.
    f = tmp_path / "popmark.pt"
    zip_with_pickle(f, b"\x80\x02(0}.")
    assert len(tessera.open(f).keys()) == 0


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
        ("many", b"\x80\x02" + b")0" * ((1 << 22) + 1) + b"N.", "more than 4194304 values"),
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


DCP_WRITER = r'''
import io, os, sys
sys.path.insert(0, "@HERE@")
import dcp_shim  # torch 1.13's DCP under Python 3.11 (test code only)
import torch, torch.distributed as dist, torch.multiprocessing as mp
import torch.distributed._shard.checkpoint as dcp
from torch.distributed._shard import sharded_tensor
from torch.distributed._shard.sharding_spec import ChunkShardingSpec

def work(rank, world, out, per_rank, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(world)])
    st = sharded_tensor.empty(spec, 7, 5, dtype=torch.bfloat16)
    full = (torch.arange(35, dtype=torch.float32).reshape(7, 5) / 8 - 2).bfloat16()
    for sh in st.local_shards():
        o = sh.metadata.shard_offsets[0]
        sh.tensor.copy_(full[o:o + sh.tensor.shape[0]])
    cols = sharded_tensor.empty(ChunkShardingSpec(dim=1, placements=spec.placements), 3, 6)
    for sh in cols.local_shards():
        o = sh.metadata.shard_offsets[1]
        sh.tensor.copy_(torch.arange(18, dtype=torch.float32).reshape(3, 6)[:, o:o + sh.tensor.shape[1]])
    state = {"sharded": st, "cols": cols, "plain": torch.arange(10, dtype=torch.float32) * 1.5,
             "ids": torch.arange(4), "blob": io.BytesIO(b"hello")}
    dcp.save_state_dict(state, dcp.FileSystemWriter(out, single_file_per_rank=per_rank))
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(work, args=(2, sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])), nprocs=2)
'''.replace("@HERE@", os.path.dirname(os.path.abspath(__file__)))


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("per_rank", [False, True])
def test_dcp_from_two_gloo_processes(tmp_path, ckpt_bin, per_rank):
    writer = tmp_path / "w.py"
    writer.write_text(DCP_WRITER)
    ck = tmp_path / "ck"
    subprocess.run(["/usr/bin/python3", str(writer), str(ck), "1" if per_rank else "0",
                    str(free_port())], check=True, timeout=300)
    r = tessera.open(ck)
    assert r.format == "dcp"
    full = (torch.arange(35, dtype=torch.float32).reshape(7, 5) / 8 - 2).bfloat16()
    assert np.array_equal(r.read("sharded"), bits(full))
    assert np.array_equal(r.read("sharded", [(2, 6), (1, 4)]), bits(full[2:6, 1:4]))
    cols = torch.arange(18, dtype=torch.float32).reshape(3, 6)
    assert np.array_equal(r.read("cols"), cols.numpy())
    assert np.array_equal(r.read("cols", [(1, 3), (2, 5)]), cols[1:3, 2:5].numpy())
    assert np.array_equal(r.read("plain"), (torch.arange(10) * 1.5).float().numpy())
    assert np.array_equal(r.read("ids"), np.arange(4))
    assert r.metadata["dcp.blob"].startswith(b"bytes item")
    out = tmp_path / "o.safetensors"
    run(ckpt_bin, "convert", ck, "-o", out, "--format", "safetensors", "--quiet")
    assert np.array_equal(tessera.open(out).read("sharded"), bits(full))
    # A damaged storage is named: flip a bit of "plain"'s bytes where they lie.
    needle = (torch.arange(10) * 1.5).float().numpy().tobytes()
    victim = next(p for p in ck.iterdir() if needle in p.read_bytes())
    data = bytearray(victim.read_bytes())
    data[data.find(needle) + 13] ^= 0x08
    victim.write_bytes(bytes(data))
    out = subprocess.run([str(ckpt_bin), "verify", str(ck)], capture_output=True, text=True)
    assert out.returncode != 0 and victim.name in (out.stdout + out.stderr)


DCP2_GENERATOR = r'''
"""A torch 2.x DCP directory, synthesized: no torch 2.x here. Stand-ins of
torch.distributed.checkpoint's metadata dataclasses under their real
module and class names (TensorProperties pickles its state as a tuple, as
2.x's __getstate__ does), items that are torch.save archives written by
this torch (1.13) one after another in one file per rank, a raw bytes item
as 2.x writes it, planner_data as 2.x's flattening records it."""
import dataclasses, io, pickle, sys, types
from typing import Any, List, Optional
import torch

def module(name):
    m = types.ModuleType(name)
    sys.modules[name] = m
    return m

md = module("torch.distributed.checkpoint.metadata")
fs = module("torch.distributed.checkpoint.filesystem")

def place(cls, m):
    cls.__module__ = m.__name__
    setattr(m, cls.__name__, cls)
    return cls

@dataclasses.dataclass
class ChunkStorageMetadata:
    offsets: Any
    sizes: Any

@dataclasses.dataclass
class TensorProperties:
    dtype: Any
    def __getstate__(self):
        return (self.dtype, torch.strided, False, torch.contiguous_format, False)

@dataclasses.dataclass
class TensorStorageMetadata:
    properties: Any
    size: Any
    chunks: List[Any]

@dataclasses.dataclass
class BytesStorageMetadata:
    pass

@dataclasses.dataclass(frozen=True)
class MetadataIndex:
    fqn: str
    offset: Optional[Any] = None
    index: Optional[int] = None

@dataclasses.dataclass
class Metadata:
    state_dict_metadata: Any
    planner_data: Any = None
    storage_data: Any = None

@dataclasses.dataclass
class _StorageInfo:
    relative_path: str
    offset: int
    length: int
    transform_descriptors: Any = None

for c in (ChunkStorageMetadata, TensorProperties, TensorStorageMetadata, BytesStorageMetadata,
          MetadataIndex, Metadata):
    place(c, md)
place(_StorageInfo, fs)

out, transform = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None
import os
os.makedirs(out)
full = torch.arange(24, dtype=torch.float32).reshape(6, 4) / 4
moment = torch.arange(6, dtype=torch.float64)
files = {0: io.BytesIO(), 1: io.BytesIO()}
sdm, storage = {}, {}
def zstd(data):
    # torch >= 2.8's "stream.zstd" transform: the item's torch.save bytes
    # through a zstd compressor (here libzstd through ctypes).
    import ctypes, ctypes.util
    z = ctypes.CDLL(ctypes.util.find_library("zstd") or "libzstd.so.1")
    z.ZSTD_compressBound.restype = ctypes.c_size_t
    z.ZSTD_compressBound.argtypes = [ctypes.c_size_t]
    z.ZSTD_compress.restype = ctypes.c_size_t
    z.ZSTD_compress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
                                ctypes.c_int]
    cap = z.ZSTD_compressBound(len(data))
    out = ctypes.create_string_buffer(cap)
    n = z.ZSTD_compress(out, cap, data, len(data), 3)
    return out.raw[:n]

def item(rank, fqn, tensor, offsets):
    f = files[rank]
    start = f.tell()
    b = io.BytesIO()
    torch.save(tensor.clone(), b)
    f.write(zstd(b.getvalue()) if transform == "stream.zstd" and fqn == "model.w" else b.getvalue())
    storage[MetadataIndex(fqn, torch.Size(offsets), 0)] = _StorageInfo(
        f"__{rank}_0.distcp", start, f.tell() - start,
        [transform] if transform and fqn == "model.w" else None)
chunks = []
for rank, rows in ((0, range(0, 3)), (1, range(3, 6))):
    item(rank, "model.w", full[rows.start:rows.stop], (rows.start, 0))
    chunks.append(ChunkStorageMetadata(torch.Size((rows.start, 0)), torch.Size((3, 4))))
sdm["model.w"] = TensorStorageMetadata(TensorProperties(torch.float32), torch.Size((6, 4)), chunks)
item(0, "optim.state.0.exp_avg", moment, (0,))
sdm["optim.state.0.exp_avg"] = TensorStorageMetadata(
    TensorProperties(torch.float64), torch.Size((6,)),
    [ChunkStorageMetadata(torch.Size((0,)), torch.Size((6,)))])
start = files[1].tell()
files[1].write(b"raw bytes")
storage[MetadataIndex("extra")] = _StorageInfo("__1_0.distcp", start, 9)
sdm["extra"] = BytesStorageMetadata()
planner = {"model.w": ("model", "w"), "optim.state.0.exp_avg": ("optim", "state", 0, "exp_avg"),
           "extra": ("extra",)}
for rank, f in files.items():
    with open(os.path.join(out, f"__{rank}_0.distcp"), "wb") as o:
        o.write(f.getvalue())
with open(os.path.join(out, ".metadata"), "wb") as o:
    pickle.dump(Metadata(sdm, planner, storage), o)
'''


def test_dcp_2x_names_synthesized(tmp_path, ckpt_bin):
    gen = tmp_path / "gen.py"
    gen.write_text(DCP2_GENERATOR)
    ck = tmp_path / "ck"
    subprocess.run(["/usr/bin/python3", str(gen), str(ck)], check=True)
    r = tessera.open(ck)
    assert r.format == "dcp"
    assert sorted(r.keys()) == ["model.w", "optim.state.0.exp_avg"]
    assert np.array_equal(r.read("model.w"), (np.arange(24, dtype=np.float32) / 4).reshape(6, 4))
    assert np.array_equal(r.read("optim.state.0.exp_avg"), np.arange(6, dtype=np.float64))
    assert r.metadata["dcp.extra"] == b"bytes item, 9 bytes at " + \
        str((ck / "__1_0.distcp").stat().st_size - 9).encode() + b" of __1_0.distcp"
    # torch >= 2.8's "stream.zstd" items are decompressed (to a temporary
    # file, then read as any item); other transforms are refused by name.
    ck2 = tmp_path / "zstd"
    subprocess.run(["/usr/bin/python3", str(gen), str(ck2), "stream.zstd"], check=True)
    r2 = tessera.open(ck2)
    assert np.array_equal(r2.read("model.w"), (np.arange(24, dtype=np.float32) / 4).reshape(6, 4))
    assert np.array_equal(r2.read("model.w", [(2, 5), (1, 3)]),
                          (np.arange(24, dtype=np.float32) / 4).reshape(6, 4)[2:5, 1:3])
    run(ckpt_bin, "verify", ck2)
    ck3 = tmp_path / "lz4"
    subprocess.run(["/usr/bin/python3", str(gen), str(ck3), "stream.lz4"], check=True)
    out = subprocess.run([str(ckpt_bin), "inspect", str(ck3)], capture_output=True, text=True)
    assert out.returncode == 1 and "model.w" in out.stderr and "stream.lz4" in out.stderr
    # A damaged stream is named, not read.
    data = bytearray((ck2 / "__0_0.distcp").read_bytes())
    data[20] ^= 0xff
    (ck2 / "__0_0.distcp").write_bytes(bytes(data))
    out = subprocess.run([str(ckpt_bin), "inspect", str(ck2)], capture_output=True, text=True)
    assert out.returncode != 0 and "__0_0.distcp" in out.stderr


def test_format_torch_is_what_torch_load_reads(tmp_path, ckpt_bin):
    obj = state()
    src = tmp_path / "s.pt"
    torch.save(obj, src)
    want = flatten(obj)
    out = tmp_path / "flat.pt"
    run(ckpt_bin, "convert", src, "-o", out, "--format", "torch", "--quiet")
    with zipfile.ZipFile(out) as z:  # Python's reader checks every CRC-32
        assert z.testzip() is None
    for weights_only in (False, True):
        got = torch.load(out, weights_only=weights_only)
        assert isinstance(got, collections.OrderedDict) and list(got) == list(want)
        for n, t in want.items():
            assert got[n].dtype == t.dtype and got[n].shape == t.shape, n
            assert torch.equal(got[n].detach(), t.detach().contiguous()), n
    # Hugging Face shards with an index, from a sliced native checkpoint.
    native = tmp_path / "native"
    run(ckpt_bin, "convert", src, "-o", native, "--quiet")
    shards = tmp_path / "shards"
    run(ckpt_bin, "convert", native, "-o", shards, "--format", "torch", "--max-shard-size",
        "4000", "--quiet")
    index = json.loads((shards / "pytorch_model.bin.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2
    merged = {}
    for f in files:
        merged.update(torch.load(shards / f, weights_only=True))
    assert sorted(merged) == sorted(want)
    for n, t in want.items():
        assert torch.equal(merged[n].detach(), t.detach().contiguous()), n
    # ... and back through Tessera: every bit kept.
    r = tessera.open(shards)
    for n, t in want.items():
        assert np.array_equal(r.read(n), bits(t)), n


def test_zip64_more_than_65535_records_both_ways(tmp_path, ckpt_bin):
    # torch.save's own writer needs Zip64 for 70,000 storages; so does ours.
    obj = {f"t{i}": torch.tensor([i], dtype=torch.int32) for i in range(70000)}
    src = tmp_path / "many.pt"
    torch.save(obj, src)
    r = tessera.open(src)
    assert len(r.keys()) == 70000 and r.read("t69999")[0] == 69999
    out = tmp_path / "many-out.pt"
    run(ckpt_bin, "convert", src, "-o", out, "--format", "torch", "--quiet")
    with zipfile.ZipFile(out) as z:
        assert len(z.infolist()) == 70003 and z.testzip() is None
    got = torch.load(out, weights_only=True)
    assert len(got) == 70000 and int(got["t12345"][0]) == 12345


DCP_LOADER = DCP_WRITER.split("def work(")[0] + r'''
from torch.distributed._shard.sharded_tensor import ShardedTensor

def work(rank, world, ck, out, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    place = [f"rank:{r}/cpu" for r in range(world)]
    # Shardings other than the saved ones, and plain tensors.
    state = {"w": sharded_tensor.zeros(ChunkShardingSpec(dim=1, placements=place), 8, 5),
             "big": sharded_tensor.zeros(ChunkShardingSpec(dim=0, placements=place), 64, 48),
             "b": torch.zeros(6, dtype=torch.bfloat16), "ids": torch.zeros(4, dtype=torch.int64),
             "s": torch.zeros(())}
    dcp.load_state_dict(state, dcp.FileSystemReader(ck))
    got = {}
    for k, v in state.items():
        if isinstance(v, ShardedTensor):
            for sh in v.local_shards():
                got[k] = (list(sh.metadata.shard_offsets), sh.tensor.clone())
        else:
            got[k] = ([], v.clone())
    torch.save(got, os.path.join(out, f"got{rank}.pt"))
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(work, args=(2, sys.argv[1], sys.argv[2], int(sys.argv[3])), nprocs=2)
'''


def test_format_dcp_is_what_dcp_load_state_dict_reads(tmp_path, ckpt_bin):
    """`--format dcp` under a 2-rank strategy (rows of one tensor, columns of
    another, the rest replicated: stored once), loaded by torch 1.13's
    load_state_dict from two gloo processes onto other shardings."""
    torch.manual_seed(5)
    want = {"w": torch.randn(8, 5), "big": torch.randn(64, 48),
            "b": torch.randn(6).bfloat16(), "ids": torch.arange(4) * 7, "s": torch.tensor(2.5)}
    torch.save(want, tmp_path / "src.pt")
    split = {"w": [["tp"], None], "big": [None, ["tp"]]}
    strategy = {"mesh": {"axes": ["tp"], "shape": [2]}, "tensors": {
        k: {"shape": list(v.shape), "dtype": {torch.float32: "f32", torch.bfloat16: "bf16",
                                              torch.int64: "i64"}[v.dtype],
            "split": split.get(k, [None] * v.dim())} for k, v in want.items()}}
    (tmp_path / "s.json").write_text(json.dumps(strategy))
    ck = tmp_path / "ck"
    run(ckpt_bin, "reshard", tmp_path / "src.pt", "-o", ck, "--format", "dcp", "--strategy",
        tmp_path / "s.json", "-q")
    assert sorted(p.name for p in ck.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    loader = tmp_path / "l.py"
    loader.write_text(DCP_LOADER)
    subprocess.run(["/usr/bin/python3", str(loader), str(ck), str(tmp_path), str(free_port())],
                   check=True, timeout=300)
    for rank in range(2):
        got = torch.load(tmp_path / f"got{rank}.pt")
        for k, (offsets, t) in got.items():
            ref = want[k]
            for d, o in enumerate(offsets):
                ref = ref.narrow(d, o, t.shape[d])
            assert t.dtype == ref.dtype and torch.equal(t, ref), (rank, k)
    # Tessera reads it back as DCP, every bit.
    r = tessera.open(ck)
    assert r.format == "dcp"
    for k, v in want.items():
        assert np.array_equal(r.read(k), bits(v)), k


def test_megatron_torch_dist_is_dcp_with_common_state(tmp_path, ckpt_bin):
    """Megatron's torch_dist layout (SYNTHESIZED: a DCP directory, here
    written by Tessera, plus Megatron's metadata.json and common.pt): the
    tensors as DCP holds them (layers on a prepended axis), common.pt's
    args and iteration as metadata and step."""
    import argparse
    layers = torch.arange(2 * 6 * 4, dtype=torch.float32).reshape(2, 6, 4)
    torch.save({"decoder.layers.self_attention.linear_qkv.weight": layers}, tmp_path / "src.pt")
    ck = tmp_path / "ck"
    run(ckpt_bin, "convert", tmp_path / "src.pt", "-o", ck, "--format", "dcp", "-q")
    (ck / "metadata.json").write_text('{"sharded_backend": "torch_dist", "sharded_backend_version": 1, '
                                      '"common_backend": "torch", "common_backend_version": 1}')
    torch.save({"args": argparse.Namespace(num_layers=2, tensor_model_parallel_size=2),
                "iteration": 5, "checkpoint_version": 3.0}, ck / "common.pt")
    r = tessera.open(ck)
    assert r.format == "dcp" and r.step == 5
    assert np.array_equal(r.read("decoder.layers.self_attention.linear_qkv.weight"), layers.numpy())
    assert r.metadata["megatron.args.num_layers"] == b"2"
    assert b"torch_dist" in r.metadata["megatron.metadata.json"]
