"""tessera.open / read / get_slice over every format we read, zero-copy
reads, and hostile files."""
import json
import os
import re
import struct
import subprocess
import sys

import numpy as np
import pytest

import tessera
from conftest import BUILD, FIXTURES, run, whole


def test_metadata_and_layouts(sliced):
    r = tessera.open(sliced)
    assert r.format == "native" and r.step == 1000
    assert "synthetic_seed" in r.metadata and isinstance(r.metadata["synthetic_seed"], bytes)
    assert r.strategy.mesh == {"dp": 2, "tp": 2} and r.strategy.world_size == 4
    info = r.info("wte")
    assert info.dtype == "f32" and info.shape == (256, 128) and info.numpy_dtype == np.float32
    assert "split [tp, -]" in info.layout
    assert "optimizer.wte.exp_avg" in r and len(r) == len(r.keys())
    assert r.strategy.box("wte", 3) == [(192, 256), (0, 128)]  # tp1, then dp1 (ZeRO)


def test_every_format_reads_the_same(sliced, tmp_path, ckpt_bin):
    ref = whole(tessera.open(sliced))
    outs = {
        "safetensors": tmp_path / "m.safetensors",
        "hdf5": tmp_path / "m.h5",
        "mindspore": tmp_path / "m.ckpt",
        "mindspore-safetensors": tmp_path / "ms",
    }
    for fmt, out in outs.items():
        tessera.transform(sliced, out, format=fmt)
    run(ckpt_bin, "merge", sliced, "-o", tmp_path / "native", "--quiet")
    outs["native"] = tmp_path / "native"
    for fmt, out in outs.items():
        r = tessera.open(out)
        got = whole(r)
        assert sorted(got) == sorted(ref), fmt  # MindSpore formats store names sorted
        for n in ref:
            assert got[n].dtype == ref[n].dtype and np.array_equal(got[n], ref[n]), (fmt, n)
    # Independent readers of the files we wrote: h5py, and safetensors by hand.
    import h5py
    with h5py.File(outs["hdf5"], "r") as f:
        assert np.array_equal(f["wte"][()], ref["wte"])
    with open(outs["safetensors"], "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        lo, hi = header["wpe"]["data_offsets"]
        f.seek(base + lo)
        wpe = np.frombuffer(f.read(hi - lo), dtype=np.float32).reshape(header["wpe"]["shape"])
    assert np.array_equal(wpe, ref["wpe"])


def test_boxes_and_slices(sliced):
    r = tessera.open(sliced)
    w = np.array(r.read("h.0.mlp.c_fc.weight"))
    assert np.array_equal(r.read("h.0.mlp.c_fc.weight", [(3, 70), (100, 300)]), w[3:70, 100:300])
    assert np.array_equal(r.read("h.0.mlp.c_fc.weight", [slice(0, 2), slice(5, 6)]), w[0:2, 5:6])
    s = r.get_slice("h.0.mlp.c_fc.weight")
    assert s.get_shape() == list(w.shape) and s.get_dtype() == "f32"
    for key in [(slice(0, 10), slice(None)), (5,), (-1, slice(None, None, 7)), (Ellipsis, 3),
                (slice(100, 2, -3), slice(4, 4)), (slice(None), slice(-5, None))]:
        got = s[key]
        assert np.array_equal(got, w[key]), key
    with pytest.raises(IndexError):
        s[10_000]
    with pytest.raises(tessera.InvalidArgumentError, match="c_fc.weight"):
        r.read("h.0.mlp.c_fc.weight", [(0, 1000), (0, 1)])
    with pytest.raises(tessera.NotFoundError, match="no tensor 'nope'"):
        r.read("nope")


def test_zero_copy_is_zero_copy(tmp_path):
    """A whole 64 MiB tensor read from a merged native checkpoint is a view of
    the mapping: no copy, no anonymous memory."""
    n = 4096
    big = np.arange(n * n, dtype=np.float32).reshape(n, n)
    s = tessera.strategy(tensors={"big": {"shape": [n, n], "dtype": "f32"}})
    path = tmp_path / "zc"
    tessera.save_shards(path, 1, s, 0, {"big": big}, _SoloComm())
    del big

    def rss_anon():
        with open("/proc/self/status") as f:
            return int(re.search(r"RssAnon:\s+(\d+) kB", f.read()).group(1)) * 1024

    r = tessera.open(path)
    before = rss_anon()
    a = r.read("big")
    total = float(a.sum(dtype=np.float64))  # touches every page
    grown = rss_anon() - before
    assert total == float(n * n) * (n * n - 1) / 2
    assert not a.flags.owndata and not a.flags.writeable
    base = a.base
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, tessera.FileMapping) and base.size == n * n * 4
    assert grown < 16 << 20, f"RssAnon grew by {grown} bytes reading a 64 MiB tensor"
    with pytest.raises(ValueError):
        a[0, 0] = 1.0  # read-only
    # The mapping outlives the reader.
    r.close()
    del r
    assert a[n - 1, n - 1] == n * n - 1
    # copy=True gives an owned array.
    c = tessera.open(path).read("big", copy=True)
    assert c.flags.owndata and c.flags.writeable and np.array_equal(c, a)


def test_safetensors_zero_copy(tmp_path):
    n = 1024
    s = tessera.strategy(tensors={"x": {"shape": [n, n], "dtype": "f32"}})
    tessera.save_shards(tmp_path / "n", 0, s, 0, {"x": np.ones((n, n), np.float32)}, _SoloComm())
    tessera.transform(tmp_path / "n", tmp_path / "x.safetensors", format="safetensors")
    a = tessera.open(tmp_path / "x.safetensors").read("x")
    assert not a.flags.owndata and a.sum() == n * n
    rows = tessera.open(tmp_path / "x.safetensors").read("x", [(10, 200), (0, n)])
    assert not rows.flags.owndata and rows.shape == (190, n)


def test_mindspore_fixtures_bf16():
    case = FIXTURES / "transform_cases" / "dp2mp4_opt_to_mp2pp2_opt"
    dist = tessera.open(case / "src", strategy=case / "src_strategy.ckpt")
    assert dist.format == "mindspore"
    names = dist.keys()
    bf16 = [n for n in names if dist.info(n).dtype == "bf16"]
    assert bf16, "the fixture has bf16 tensors"
    # Rank 0's own file holds rank 0's box of each tensor it stores.
    rank0 = tessera.open(case / "src" / "rank_0" / "checkpoint_0.ckpt")
    for n in rank0.keys():
        if n not in dist:
            continue
        info = dist.info(n)
        box = dist.strategy.box(n, 0)
        got = dist.read(n, box) if box is not None else None
        mine = rank0.read(n)
        if got is None:
            continue
        assert got.dtype == info.numpy_dtype == mine.dtype
        assert np.array_equal(got.reshape(-1), mine.reshape(-1)), n
    # bf16 is its raw bits as uint16; tessera.torch makes it bfloat16 without a copy.
    n = bf16[0]
    a = dist.read(n)
    assert a.dtype == np.uint16
    torch = pytest.importorskip("torch")
    t = tessera.torch.from_numpy(np.array(a), "bf16")
    assert t.dtype == torch.bfloat16
    assert np.array_equal(tessera.torch.to_numpy(t), a)


def test_transform_verbs(sliced, tmp_path, ckpt_bin):
    # reshard to another mesh, split by a strategy, compress, progress.
    calls = []
    st = tessera.transform(sliced, tmp_path / "tp4", mesh={"dp": 1, "tp": 4}, compress="zstd",
                           progress=lambda done, total: calls.append((done, total)))
    assert st["tensors"] == len(tessera.open(sliced)) and calls and calls[-1][0] == calls[-1][1]
    r = tessera.open(tmp_path / "tp4")
    assert r.strategy.mesh == {"dp": 1, "tp": 4}
    assert np.array_equal(r.read("wte"), tessera.open(sliced).read("wte"))
    run(ckpt_bin, "verify", tmp_path / "tp4")
    # A destination strategy as a dict; the tensors it leaves out stay whole.
    dst = {"mesh": {"axes": ["tp"], "shape": [2]},
           "tensors": {"wte": {"shape": [256, 128], "split": [None, "tp"]}}}
    tessera.transform(sliced, tmp_path / "cols", strategy=dst, memory_budget="1MiB")
    r = tessera.open(tmp_path / "cols")
    assert "split [-, tp]" in r.info("wte").layout and np.array_equal(
        r.read("wte"), tessera.open(sliced).read("wte"))
    # Errors name what is wrong; nothing is left at the output.
    with pytest.raises(tessera.InvalidArgumentError, match="not both"):
        tessera.transform(sliced, tmp_path / "x", strategy=dst, mesh="tp=2")
    with pytest.raises(tessera.InvalidArgumentError, match="format 'zip'"):
        tessera.transform(sliced, tmp_path / "x", format="zip")
    with pytest.raises(tessera.Error, match="axis"):
        tessera.transform(sliced, tmp_path / "x", mesh="pp=2")
    assert not (tmp_path / "x").exists()

    def boom(done, total):
        raise KeyboardInterrupt("stop")

    with pytest.raises(KeyboardInterrupt):
        tessera.transform(sliced, tmp_path / "y", progress=boom)


def test_load_shards_out(sliced):
    s = tessera.open(sliced).strategy
    box = s.box("wte", 1)
    shape = tuple(hi - lo for lo, hi in box)
    buf = np.zeros(shape, np.float32)
    got = tessera.load_shards(sliced, None, 1, out={"wte": buf})
    assert got["wte"] is buf and np.array_equal(buf, tessera.open(sliced).read("wte", box))
    with pytest.raises(tessera.InvalidArgumentError, match=r"out\['wte'\] on rank 1: an array of shape"):
        tessera.load_shards(sliced, None, 1, out={"wte": np.zeros(shape[::-1], np.float32)})
    with pytest.raises(tessera.NotFoundError, match="'wtee' is not in the strategy"):
        tessera.load_shards(sliced, None, 1, out={"wtee": buf})
    with pytest.raises(tessera.InvalidArgumentError, match="float64"):
        tessera.load_shards(sliced, None, 1, out={"wte": buf.astype(np.float64)})


def test_transform_to_more_files_than_the_soft_descriptor_limit(tmp_path):
    # 256 destination data files under a soft limit of 64 descriptors: the
    # writer parks (closes) the files it is done with beyond its share of
    # the limit and reopens them to sync at commit; the process's limit is
    # left as it was.
    src = tmp_path / "src"
    run(BUILD / "samples" / "make_checkpoint", "-o", src, "--mesh", "dp=8,tp=2", "--zero",
        "--optimizer", "--layers", "1", "--embed", "64", "--vocab", "256", "--context", "32")
    script = ("import resource, sys, tessera; "
              "tessera.transform(sys.argv[1], sys.argv[2], mesh='dp=128,tp=2', threads=1); "
              "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    done = subprocess.run(["bash", "-c", 'ulimit -Sn 64 && exec "$0" -c "$1" "$2" "$3"', sys.executable,
                           script, str(src), str(tmp_path / "out")], check=True, capture_output=True, text=True)
    assert done.stdout.strip() == "64"
    out = tessera.open(tmp_path / "out")
    assert out.strategy.world_size == 256 and len(os.listdir(tmp_path / "out")) > 256
    ref = whole(tessera.open(src))
    got = whole(out)
    assert ref.keys() == got.keys() and all(np.array_equal(ref[k], got[k]) for k in ref)


HOSTILE = r"""
import sys, tessera
try:
    r = tessera.open(sys.argv[1])
    for n in r.keys():
        r.read(n)
except tessera.Error as e:
    print("raised", type(e).__name__, e)
    sys.exit(0)
print("no error")
sys.exit(3)
"""


def test_hostile_and_truncated_files(sliced, tmp_path):
    """Damaged files raise named exceptions; the interpreter never crashes
    (each case in a child process, so a crash would show as a signal)."""
    tessera.transform(sliced, tmp_path / "m.safetensors", format="safetensors")
    tessera.transform(sliced, tmp_path / "m.ckpt", format="mindspore")
    run_ = lambda p: subprocess.run([sys.executable, "-c", HOSTILE, str(p)],
                                    capture_output=True, text=True,
                                    env=dict(os.environ))
    cases = []
    data = (tmp_path / "m.safetensors").read_bytes()
    for i, cut in enumerate([4, 20, len(data) // 2, len(data) - 1]):
        p = tmp_path / f"trunc{i}.safetensors"
        p.write_bytes(data[:cut])
        cases.append(p)
    bad = tmp_path / "header.safetensors"
    bad.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    cases.append(bad)
    ms = (tmp_path / "m.ckpt").read_bytes()
    p = tmp_path / "trunc.ckpt"
    p.write_bytes(ms[: len(ms) * 2 // 3])
    cases.append(p)
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(os.urandom(4096))
    cases.append(garbage)
    # A native checkpoint with a flipped byte in a data file.
    import shutil
    flipped = tmp_path / "flipped"
    shutil.copytree(sliced, flipped)
    df = sorted(flipped.glob("data-*.tsr"))[0]
    b = bytearray(df.read_bytes())
    b[len(b) // 2] ^= 0x40
    df.write_bytes(bytes(b))
    cases.append(flipped)
    for p in cases:
        res = run_(p)
        assert res.returncode == 0, (p.name, res.returncode, res.stdout, res.stderr)
        assert "raised" in res.stdout and p.name in res.stdout, (p.name, res.stdout)
    res = run_(flipped)
    assert "DataLossError" in res.stdout


class _SoloComm:
    """A one-process comm for single-rank saves."""

    def barrier(self):
        pass

    def allgather_object(self, obj):
        return [obj]
