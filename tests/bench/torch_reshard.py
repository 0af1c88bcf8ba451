"""The PyTorch peer of `ckpt reshard`: what a PyTorch user without DCP does.

Debian's python3-torch (1.13) ships no torch.distributed.checkpoint and its
torch.distributed._shard does not import on Python 3.11, so the peer is the
classic per-rank state-dict route (Megatron-style conversion scripts): every
source rank's shards saved with torch.save; the reshard loads all of them,
concatenates each tensor's pieces, chunks them for the new ranks and saves
one file per destination rank.

  torch_reshard.py setup LAYOUT.json DIR SRC_TP     # untimed: write the source
  torch_reshard.py reshard DIR OUT SRC_TP DST_TP LAYOUT.json  # timed

LAYOUT.json is `ckpt inspect --json` of the Tessera checkpoint being compared,
so both sides move the same tensors with the same shapes and split dims.
Replicated tensors are held by every rank and saved by rank 0 only (as the
Tessera side stores them once).
"""
import json
import os
import sys

import torch


def split_dim(t):
    for d, axes in enumerate(t["dim_axes"]):
        if "tp" in axes:
            return d
    return None


def setup(layout_path, out, tp):
    tensors = json.load(open(layout_path))["tensors"]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    for r in range(tp):
        sd = {}
        for t in tensors:
            d = split_dim(t)
            if d is None and r != 0:
                continue
            shape = list(t.get("view") or t["shape"])  # splits are over the view
            if d is not None:  # torch.chunk's piece r
                c = -(-shape[d] // tp)
                shape[d] = max(0, min(c, shape[d] - r * c))
            sd[t["name"]] = torch.empty(shape, dtype=torch.float32).normal_(0, 0.02)
        torch.save(sd, os.path.join(out, "rank_%d.pt" % r))


def reshard(src, out, src_tp, dst_tp, layout_path):
    tensors = json.load(open(layout_path))["tensors"]
    shards = [torch.load(os.path.join(src, "rank_%d.pt" % r)) for r in range(src_tp)]
    os.makedirs(out, exist_ok=True)
    outs = [{} for _ in range(dst_tp)]
    for t in tensors:
        d = split_dim(t)
        if d is None:
            outs[0][t["name"]] = shards[0][t["name"]]
            continue
        full = torch.cat([s[t["name"]] for s in shards], dim=d)
        for r, piece in enumerate(torch.chunk(full, dst_tp, dim=d)):
            outs[r][t["name"]] = piece.clone()
    for r, sd in enumerate(outs):
        torch.save(sd, os.path.join(out, "rank_%d.pt" % r))


if __name__ == "__main__":
    torch.set_num_threads(2)
    if sys.argv[1] == "setup":
        setup(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        reshard(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
