"""Writes the torch.save fixtures of this folder with Debian's PyTorch 1.13
(python3-torch 1.13.1+dfsg-4): small.pt (the zip format) and
small-legacy.pt (_use_new_zipfile_serialization=False), the same object in
each. tests/ckpt/torch_mutation_test.cc damages them thousands of ways and
compares with the values listed in small.json (written here too, from
torch.load). Rerun: /usr/bin/python3 tests/data/torch/make_fixtures.py"""
import collections
import json
import os

import torch

here = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(20261127)
a = torch.randn(4, 6)
lin = torch.nn.Linear(6, 3)
opt = torch.optim.SGD(lin.parameters(), lr=0.5, momentum=0.9)
lin(torch.randn(2, 6)).sum().backward()
opt.step()
obj = {
    "model": lin.state_dict(),
    "optimizer": opt.state_dict(),
    "views": {"a": a, "rows": a[1:3], "t": a.t()},
    "half": torch.randn(5).half(),
    "bf16": torch.randn(2, 3).bfloat16(),
    "ids": torch.arange(6),
    "mask": torch.tensor([True, False, True]),
    "ordered": collections.OrderedDict([("w", torch.ones(2))]),
    "iteration": 42,
}
torch.save(obj, os.path.join(here, "small.pt"))
torch.save(obj, os.path.join(here, "small-legacy.pt"), _use_new_zipfile_serialization=False)


def flatten(o, path=""):
    if isinstance(o, torch.Tensor):
        return {path: o}
    out = {}
    if isinstance(o, dict):
        for k, v in o.items():
            out.update(flatten(v, f"{path}.{k}" if path else str(k)))
    return out


values = {}
for name, t in flatten(torch.load(os.path.join(here, "small.pt"))).items():
    t = t.contiguous()
    raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
    values[name] = {"shape": list(t.shape), "hex": raw.hex()}
with open(os.path.join(here, "small.json"), "w") as f:
    json.dump(values, f, indent=1, sort_keys=True)
    f.write("\n")
