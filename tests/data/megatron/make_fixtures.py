"""Writes the SYNTHESIZED Megatron-LM fixture of this folder with Debian's
PyTorch 1.13 through tests/python/megatron_fixtures.py (which follows
Megatron's writer code; Megatron cannot run here): tp2pp2/, a megatron.core
GPT of 4 layers with swiglu over 2 tensor- and 2 pipeline-parallel ranks,
with its tracker file. tests/ckpt/torch_mutation_test.cc damages its files
thousands of ways and compares what it reads with values.json (the
unsharded model's bytes). Rerun: /usr/bin/python3 tests/data/megatron/make_fixtures.py"""
import json
import os
import shutil
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "python"))
import megatron_fixtures as mf  # noqa: E402

root = os.path.join(here, "tp2pp2")
shutil.rmtree(root, ignore_errors=True)
full = mf.model("mcore", hidden=4, heads=2, ffn=8, vocab=8, seq=4, swiglu=True, seed=45)
mf.write(root, full, "mcore", tp=2, pp=2, vp=1, swiglu=True)
with open(os.path.join(here, "values.json"), "w") as f:
    json.dump({n: {"shape": list(t.shape), "hex": t.numpy().tobytes().hex()} for n, t in full.items()},
              f, indent=1, sort_keys=True)
    f.write("\n")
