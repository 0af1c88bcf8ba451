"""The PyTorch peer of loading a checkpoint on another mesh (resharding on
load): what a PyTorch user without DCP does (Debian's torch 1.13 has no
torch.distributed.checkpoint). Each source rank saved its tp shard with
torch.save; every destination rank torch.loads the source files, cats each
tensor's shards and keeps its own chunk (a copy, as a trainer would).

  torch_load_reshard.py setup LAYOUT.json DIR SRC_TP    # untimed
  torch_load_reshard.py load DIR SRC_TP DST_TP LAYOUT.json  # prints seconds

LAYOUT.json is `ckpt inspect --json` of the Tessera checkpoint compared, so
both sides hold the same tensors (split over "tp" on the same dimension of
their view). The DST_TP destination ranks run as processes at once.
"""
import json
import multiprocessing
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reshard import setup, split_dim  # noqa: E402  (the same source files)


def load_rank(args):
    src, src_tp, dst_tp, rank, layout_path = args
    torch.set_num_threads(1)
    tensors = json.load(open(layout_path))["tensors"]
    shards = [torch.load(os.path.join(src, "rank_%d.pt" % r)) for r in range(src_tp)]
    mine = {}
    for t in tensors:
        d = split_dim(t)
        if d is None:
            mine[t["name"]] = shards[0][t["name"]].clone()
            continue
        full = torch.cat([s[t["name"]] for s in shards], dim=d)
        mine[t["name"]] = torch.chunk(full, dst_tp, dim=d)[rank].clone()
    return sum(v.numel() for v in mine.values())


def load(src, src_tp, dst_tp, layout_path):
    start = time.time()
    jobs = [(src, src_tp, dst_tp, r, layout_path) for r in range(dst_tp)]
    if dst_tp == 1:
        load_rank(jobs[0])
    else:
        with multiprocessing.get_context("fork").Pool(dst_tp) as pool:
            pool.map(load_rank, jobs)
    print("%.3f" % (time.time() - start))


if __name__ == "__main__":
    if sys.argv[1] == "setup":
        setup(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        load(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
