"""Tessera: strategy-aware checkpoints of parallel training, from Python.

    import tessera
    w = tessera.open("ckpt/step-100").read("h.0.mlp.c_fc.weight")

Reading (any format Tessera reads: native, safetensors, MindSpore .ckpt and
safetensors rank directories, HDF5), transforming (merge, split, reshard,
convert), and sliced saves and loads from trainers with resharding on load.
The core is C++ (tessera._tessera); this module adds the Python conveniences.

dtypes: numpy has no bfloat16, so bf16 tensors are read as numpy.uint16
holding their raw bits (`tessera.torch` turns them into torch.bfloat16
without a copy), and save_shards takes bf16 shards as uint16 the same way.
"""

import collections
import json
import os

try:
    import numpy  # noqa: F401  (the extension's arrays are numpy's)
except ImportError as e:
    raise ImportError(
        "tessera needs numpy, which this Python cannot import: pip install numpy, or "
        "apt-get install python3-numpy (a virtualenv sees Debian's when made with "
        "--system-site-packages)", name="numpy") from e

from . import _tessera as _c
from ._tessera import (  # noqa: F401  (re-exported)
    DataLossError,
    Error,
    FileMapping,
    InvalidArgumentError,
    IOError,
    NotFoundError,
    SaveHandle,
    Strategy,
    __version__,
)

__all__ = [
    "open", "transform", "save_shards", "load_shards", "strategy", "Reader", "Slice",
    "TensorInfo", "Strategy", "SaveHandle", "FileMapping", "Error", "InvalidArgumentError",
    "NotFoundError", "DataLossError", "IOError",
]

TensorInfo = collections.namedtuple(
    "TensorInfo", ["name", "dtype", "shape", "split_shape", "layout", "numpy_dtype"])
TensorInfo.__doc__ = """A tensor of a checkpoint: its dtype ("f32", "bf16", ...), global
shape, split shape (the shape boxes are over: the layout's view when it has
one, else the shape), layout as text, and the numpy dtype reads return."""


def _path(p):
    return os.fspath(p) if p is not None else ""


def strategy(mesh=None, tensors=None):
    """A Strategy from Python values: mesh {"dp": 2, "tp": 2} (ordered, outermost
    first) and tensors {name: {"shape": [...], "dtype": "f32", "split": [None, "tp"],
    "opt_shard": "dp", ...}} as in transform/strategy.md."""
    doc = {"format": "tessera.strategy", "version": 1, "tensors": tensors or {}}
    if mesh:
        doc["mesh"] = {"axes": list(mesh.keys()), "shape": list(mesh.values())}
    return Strategy.from_json(json.dumps(doc))


def _as_strategy(s):
    """A Strategy from a Strategy, a dict (the JSON form), JSON text or a path."""
    if s is None or isinstance(s, Strategy):
        return s
    if isinstance(s, dict):
        return Strategy.from_json(json.dumps(s))
    if isinstance(s, str) and s.lstrip().startswith("{"):
        return Strategy.from_json(s)
    return Strategy.load(os.fspath(s))


def _box(box, ndim=None):
    """A box as [(start, stop), ...] from pairs or slices with explicit bounds."""
    if box is None:
        return None
    out = []
    for d in box:
        if isinstance(d, slice):
            if d.step not in (None, 1) or d.start is None or d.stop is None:
                raise InvalidArgumentError(
                    f"box {box!r}: a slice in a box needs a start and a stop and no step")
            out.append((int(d.start), int(d.stop)))
        else:
            start, stop = d
            out.append((int(start), int(stop)))
    if ndim is not None and len(out) != ndim:
        raise InvalidArgumentError(f"box {box!r} has {len(out)} dimensions, the tensor {ndim}")
    return out


class Reader:
    """A checkpoint opened for reading (tessera.open). Reads verify checksums
    where the format records them and read only the byte ranges they need."""

    def __init__(self, impl):
        self._r = impl

    path = property(lambda self: self._r.path)
    format = property(lambda self: self._r.format, doc="native, safetensors, mindspore, ...")
    step = property(lambda self: self._r.step)
    metadata = property(lambda self: self._r.metadata, doc="user key -> bytes")
    strategy = property(lambda self: self._r.strategy, doc="every tensor's saved layout")

    def keys(self):
        return self._r.names()

    def __iter__(self):
        return iter(self._r.names())

    def __len__(self):
        return len(self._r.names())

    def __contains__(self, name):
        return self._r.has(name)

    def info(self, name):
        return TensorInfo(name, *self._r.info(name))

    @property
    def tensors(self):
        """{name: TensorInfo}, in checkpoint order."""
        return {n: self.info(n) for n in self._r.names()}

    def read(self, name, box=None, copy=False):
        """Tensor `name` (or `box` of it: one (start, stop) per dimension of its split
        shape) as a numpy array. When the bytes are one contiguous run of a mapped
        file the array is a read-only view of the mapping (no copy; `copy=True`
        forces one); otherwise a new array."""
        return self._r.read(name, _box(box), copy)

    get_tensor = read  # safetensors' name

    def read_into(self, name, box, out):
        """Reads `box` of `name` into the C-contiguous writable array `out`."""
        self._r.read_into(name, _box(box), out)

    def get_slice(self, name):
        """safetensors-style lazy slice: reader.get_slice("w")[0:10, :]."""
        return Slice(self, name)

    def recoveries(self):
        """What reads had to rebuild from redundancy (lost or corrupt files)."""
        return self._r.recoveries()

    def close(self):
        self._r.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<tessera.Reader {self.format} {self.path!r}: {len(self)} tensors, step {self.step}>"


class Slice:
    """Numpy basic indexing over a tensor, reading only the bounding box."""

    def __init__(self, reader, name):
        self._reader = reader
        self._info = reader.info(name)
        self.name = name

    def get_shape(self):
        return list(self._info.split_shape)

    def get_dtype(self):
        return self._info.dtype

    shape = property(lambda self: tuple(self._info.split_shape))

    def __getitem__(self, key):
        import numpy as np
        shape = self._info.split_shape
        if not isinstance(key, tuple):
            key = (key,)
        if any(k is Ellipsis for k in key):
            i = next(i for i, k in enumerate(key) if k is Ellipsis)
            fill = len(shape) - (len(key) - 1)
            key = key[:i] + (slice(None),) * fill + key[i + 1:]
        if len(key) > len(shape):
            raise IndexError(f"tensor '{self.name}': {len(key)} indices for {len(shape)} dimensions")
        key = key + (slice(None),) * (len(shape) - len(key))
        box, post = [], []
        for d, (k, n) in enumerate(zip(key, shape)):
            if isinstance(k, slice):
                r = range(*k.indices(n))
                if len(r) == 0:
                    box.append((0, 0))
                    post.append(slice(None))
                else:
                    lo, hi = min(r[0], r[-1]), max(r[0], r[-1]) + 1
                    box.append((lo, hi))
                    post.append(slice(None, None, k.step) if k.step not in (None, 1) else slice(None))
            else:
                i = int(k)
                if i < -n or i >= n:
                    raise IndexError(f"tensor '{self.name}': index {i} out of range for dimension "
                                     f"{d} of size {n}")
                i %= n
                box.append((i, i + 1))
                post.append(0)
        if any(hi <= lo for lo, hi in box):
            out = np.empty([hi - lo for lo, hi in box], dtype=self._info.numpy_dtype)
        else:
            out = self._reader.read(self.name, box)
        return out[tuple(post)]


def open(path, strategy=None):  # noqa: A001  (tessera.open, as safetensors' safe_open)
    """Opens a checkpoint in any format Tessera reads, recognised by content.
    `strategy` is a MindSpore strategy file or stage directory (needed for a
    MindSpore distributed checkpoint directory), or a Tessera strategy file the
    recorded layouts are checked against."""
    return Reader(_c.open(_path(path), _path(strategy)))


def transform(src, out, strategy=None, mesh=None, format=None, compress=None,
              memory_budget=None, progress=None, *, src_strategy=None, redundancy=None,
              max_shard_size=None, threads=0, overwrite=False, prefix=None):
    """What `ckpt merge|split|reshard|convert` do: writes every tensor of `src`
    to `out` under a destination strategy, atomically.

    strategy: a Strategy, its dict/JSON form, or a path to a Tessera or MindSpore
      strategy file; mesh: {"dp": 2, "tp": 4} or "dp=2,tp=4" (the source's split
      axes on a new mesh); neither: merged (every tensor whole).
    format: native (default), safetensors, mindspore, mindspore-safetensors, hdf5, torch.
    compress: "zstd" or "zstd:LEVEL" (native); redundancy: "rs:K+M" or "parity:G".
    memory_budget: bytes held at once (int, or "256MiB"); progress(done, total).
    Returns {"tensors", "pieces", "bytes", "seconds"}."""
    strategy_file, strategy_obj = "", None
    if isinstance(strategy, (str, os.PathLike)) and not str(strategy).lstrip().startswith("{"):
        strategy_file = os.fspath(strategy)
    else:
        strategy_obj = _as_strategy(strategy)
    if isinstance(mesh, dict):
        mesh = ",".join(f"{k}={v}" for k, v in mesh.items())
    return _c.transform(_path(src), _path(out), _path(src_strategy), strategy_file, strategy_obj,
                        mesh or "", format or "native", compress or "none", redundancy or "none",
                        memory_budget, max_shard_size, int(threads), bool(overwrite), prefix or "",
                        progress)


def _shards(tensors):
    import numpy as np
    out = {}
    for name, value in tensors.items():
        if isinstance(value, tuple) and len(value) == 2:
            box, array = value
            box = _box(box)
        else:
            box, array = None, value
        out[name] = (box, np.ascontiguousarray(array))
    return out


def save_shards(path, step, strategy, rank, tensors, comm, redundancy=None, async_=False, *,
                metadata=None, hosts=None, overwrite=False, compress=None):
    """Collective: writes a sliced native checkpoint from N processes.

    strategy: every tensor's layout over the N ranks (Strategy, dict, JSON or path).
    tensors: {name: array} or {name: (box, array)}: this rank's box of each tensor it
      holds (the box, when given, is checked against the strategy's).
    comm: any object with barrier() and allgather_object(obj) -> list (e.g.
      tessera.torch.TorchComm()); only small records go through it.
    Replicated boxes are written once; redundancy "replicas:K", "parity:G" or
    "rs:K+M" adds copies or parity (placed on other hosts where `hosts`, one name
    per rank, or the processes' host names allow). Rank 0 commits atomically once
    every rank has written.
    async_=True returns a SaveHandle once the arrays are copied; call its done()
    (say, once per step) or wait() on every rank to commit."""
    return _c.save_shards(_path(path), int(step), _as_strategy(strategy), int(rank),
                          _shards(tensors), comm, redundancy or "", bool(async_), metadata or {},
                          list(hosts or []), bool(overwrite), compress or "")


def load_shards(path, strategy=None, rank=0, out=None, *, src_strategy=None):
    """This rank's box of every tensor of `strategy` (default: the checkpoint's
    own), read from the checkpoint at `path` whatever strategy it was saved with
    (reshard on load), reading only the byte ranges needed. Returns {name: array};
    with out={name: array}, reads into those arrays instead."""
    return _c.load_shards(_path(path), _path(src_strategy), _as_strategy(strategy), int(rank), out)


def __getattr__(name):
    # tessera.torch is imported on first use: `import tessera` never imports torch.
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'tessera' has no attribute {name!r}")
