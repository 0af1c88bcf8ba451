"""Writes the PyTorch DCP fixture of this folder with Debian's PyTorch 1.13
(torch.distributed._shard.checkpoint, from two gloo processes,
single_file_per_rank): small/ holds a bf16 ShardedTensor cut by rows, an
f32 one cut by columns, plain tensors (stored once, by rank 0) and a bytes
item. tests/ckpt/torch_mutation_test.cc damages its files thousands of
ways and compares what it reads with values.json (every tensor's bytes,
written here too). Rerun: /usr/bin/python3 tests/data/dcp/make_fixtures.py"""
import io
import json
import os
import shutil
import socket
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "python"))
import dcp_shim  # noqa: E402,F401  (torch 1.13's DCP under Python 3.11)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._shard.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.distributed._shard import sharded_tensor  # noqa: E402
from torch.distributed._shard.sharding_spec import ChunkShardingSpec  # noqa: E402


def full():
    return {"rows": (torch.arange(35, dtype=torch.float32).reshape(7, 5) / 8 - 2).bfloat16(),
            "cols": torch.arange(18, dtype=torch.float32).reshape(3, 6) * 0.25,
            "plain": torch.arange(10, dtype=torch.float32) * 1.5, "ids": torch.arange(4) - 1}


def work(rank, world, out, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    place = [f"rank:{r}/cpu" for r in range(world)]
    f = full()
    state = {"plain": f["plain"], "ids": f["ids"], "blob": io.BytesIO(b"hello")}
    for name, dim, dtype in (("rows", 0, torch.bfloat16), ("cols", 1, torch.float32)):
        st = sharded_tensor.empty(ChunkShardingSpec(dim=dim, placements=place),
                                  *f[name].shape, dtype=dtype)
        for sh in st.local_shards():
            o = sh.metadata.shard_offsets[dim]
            sh.tensor.copy_(f[name].narrow(dim, o, sh.tensor.shape[dim]))
        state[name] = st
    dcp.save_state_dict(state, dcp.FileSystemWriter(out, single_file_per_rank=True))
    dist.destroy_process_group()


if __name__ == "__main__":
    out = os.path.join(here, "small")
    shutil.rmtree(out, ignore_errors=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(work, args=(2, out, port), nprocs=2)
    values = {}
    for name, t in full().items():
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        values[name] = {"shape": list(t.shape), "hex": raw.hex()}
    with open(os.path.join(here, "values.json"), "w") as f:
        json.dump(values, f, indent=1, sort_keys=True)
        f.write("\n")
