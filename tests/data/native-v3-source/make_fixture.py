"""Writes the values of tests/data/native-v3 (a format 3 checkpoint, kept so
that readers of later formats are tested on real format 3 files) as one
safetensors file; the checkpoint was made from it at the commit that added
it (format 3) by

    python3 tests/data/native-v3-source/make_fixture.py values.safetensors
    ckpt split values.safetensors --strategy tests/data/native-v3-source/strategy.json \
        --redundancy parity:2 -o tests/data/native-v3

and the tests compare it with this file's output, regenerated. What it
adds to the format 2 fixture's kinds of pieces: tile checksums
(formats/native.md, "Tile checksums (format 3)"): `big` (f32, rows of
4 KiB: 2 column tiles of 512, bands of 1,024 rows, so a second band of 6
rows), `wide` (f64, rows of 32,800 bytes: 16 column tiles of 257
columns, the last of 245) and `cube` (a 3-D bf16 piece, whose rows run on
across its slices), beside row-block and untiled pieces split over tp and
sharded over dp. The values are the format 2 fixture's patterns.
Usage: make_fixture.py OUT.safetensors"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "native-v2-source"))
import make_fixture as v2  # noqa: E402  (the same patterns and writer)

TENSORS = {  # name: (dtype, shape)
    "big": ("F32", [1030, 1024]),
    "wide": ("F64", [40, 4100]),
    "cube": ("BF16", [2, 150, 2048]),
    "w": ("F32", [16, 8]),
    "h": ("F16", [6, 4]),
    "s1": ("F32", [12]),
    "step": ("I64", []),
}

if __name__ == "__main__":
    v2.write(sys.argv[1], TENSORS)
