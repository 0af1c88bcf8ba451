"""Writes the SYNTHESIZED DeepSpeed ZeRO fixtures of this folder with
Debian's PyTorch 1.13 through tests/python/deepspeed_fixtures.py (which
follows DeepSpeed's writer code; DeepSpeed is not installable here):
zero2/ (stage 2, 2 data-parallel ranks) and zero3/ (stage 3, 3 ranks),
each a checkpoint directory with `latest` and global_step7/, with buffers,
a frozen and a shared parameter. tests/ckpt/torch_mutation_test.cc damages
their files thousands of ways and compares what it reads with
values.json (every tensor's bytes, from the generator's NumPy
re-implementation of zero_to_fp32). Rerun:
/usr/bin/python3 tests/data/deepspeed/make_fixtures.py"""
import json
import os
import shutil
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "python"))
import deepspeed_fixtures as dsf  # noqa: E402

values = {}
for name, stage, dp in (("zero2", 2, 2), ("zero3", 3, 3)):
    root = os.path.join(here, name)
    shutil.rmtree(root, ignore_errors=True)
    params, groups = dsf.model(seed=39)
    dsf.write(root, stage, dp, params, groups, buffers={"h.0.mask": torch.tril(torch.ones(2, 2))},
              frozen={"wte.weight": torch.arange(6.0).reshape(3, 2)},
              shared={"lm_head.weight": "h.0.fc.weight"})
    ref = dsf.reference(os.path.join(root, "global_step7"))
    values[name] = {n: {"hex": a.tobytes().hex()} for n, a in ref.items()}
with open(os.path.join(here, "values.json"), "w") as f:
    json.dump(values, f, indent=1, sort_keys=True)
    f.write("\n")
