"""Writes the values of tests/data/native-v2 (a format 2 checkpoint, kept so
that readers of later formats are tested on real format 2 files) as one
safetensors file; the checkpoint was made from it at 05c75b0 (format 2) by

    python3 tests/data/native-v2-source/make_fixture.py values.safetensors
    ckpt split values.safetensors --strategy tests/data/native-v2-source/strategy.json \
        --redundancy parity:2 -o tests/data/native-v2

and the tests compare it with this file's output, regenerated. What it
holds: a raw piece longer than one checksum block (`big`, 1 MiB + 4 KiB:
two block checksums), pieces split over tp, sharded over dp (ZeRO) and
placed on pipeline stages, a tied tensor on two stages (`tied`, a copy
stage), f32, f16, bf16 and i64 dtypes, several data files, whole-file
checksums, an XOR parity group and the manifest's copy. The values are
patterns (the files compress in git), each tensor its own.
Usage: make_fixture.py OUT.safetensors"""
import json
import struct
import sys

import numpy as np

TENSORS = {  # name: (dtype, shape)
    "big": ("F32", [2056, 128]),
    "w": ("F32", [16, 8]),
    "b": ("F32", [8]),
    "h": ("F16", [6, 4]),
    "e": ("BF16", [4, 8]),
    "tied": ("F32", [10, 4]),
    "s1": ("F32", [12]),
    "step": ("I64", []),
}


def values(name, dtype, shape):
    n = int(np.prod(shape)) if shape else 1
    seed = sum(ord(c) for c in name)
    i = np.arange(n, dtype=np.int64)
    if dtype == "I64":
        return np.full(n, 1000 + seed, dtype=np.int64)
    x = (((i * 7 + seed) % 251) - 125).astype(np.float32) / 64
    if dtype == "F64":  # (none here; the format 3 fixture's)
        return x.astype(np.float64)
    if dtype == "F16":
        return x.astype(np.float16)
    if dtype == "BF16":  # the top half of each f32 (exact: x has few bits)
        return (x.view(np.uint32) >> 16).astype(np.uint16)
    return x


def write(path, tensors):
    """Writes `tensors` ({name: (dtype, shape)}) with their values to `path`."""
    header, blobs, at = {}, [], 0
    for name, (dtype, shape) in tensors.items():
        data = values(name, dtype, shape).tobytes()
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


if __name__ == "__main__":
    write(sys.argv[1], TENSORS)
