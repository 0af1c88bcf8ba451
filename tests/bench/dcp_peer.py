"""PyTorch's distributed checkpoint (DCP) as the peer of Tessera's sliced
save and reshard-on-load (dcp_bench.sh). Debian's torch 1.13 carries DCP
as torch.distributed._shard.checkpoint; it fails to import under Python
3.11 only because a dataclass of its metadata has a mutable default that
3.11 rejects. dcp_shim, imported first, turns such a default
into a default_factory, which is what newer torch does (tests/python/dcp_shim.py).

The state: N tensors of S x S float32 (16 x 4096^2 = 1 GiB by default),
t[i][r, c] = i + r * 1e-3 + c * 1e-7 (checked after each load, outside
the clock), ShardedTensors over WORLD gloo processes (ChunkShardingSpec).

  dcp_peer.py save DIR WORLD [N S]   # sharded by rows; seconds, median of 3
  dcp_peer.py load DIR WORLD [N S]   # saved by rows, loaded by columns
  dcp_peer.py merge DIR [N S]        # one process, whole tensors

Destination state dicts are allocated and touched before the clock, as a
trainer's are before it loads. Prints "seconds <median>".
"""
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import dcp_shim  # noqa: E402,F401  (before torch.distributed._shard)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._shard.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.distributed._shard import sharded_tensor  # noqa: E402
from torch.distributed._shard.sharding_spec import ChunkShardingSpec  # noqa: E402

ROUNDS = 3
# TESSERA_BENCH_COLD=1 (dcp_bench.sh's cold runs, root only): the page cache
# dropped before each timed load, as the Tessera side does.
COLD = os.environ.get("TESSERA_BENCH_COLD") == "1"


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def expected(i, rows, cols):
    """t[i] over rows x cols (ranges), as float32."""
    r = torch.arange(rows.start, rows.stop, dtype=torch.float64).unsqueeze(1)
    c = torch.arange(cols.start, cols.stop, dtype=torch.float64).unsqueeze(0)
    return (i + r * 1e-3 + c * 1e-7).to(torch.float32)


def sharded(world, dim, n, s, fill):
    spec = ChunkShardingSpec(dim=dim, placements=["rank:%d/cpu" % r for r in range(world)])
    out = {}
    for i in range(n):
        t = sharded_tensor.empty(spec, s, s)
        for shard in t.local_shards():
            off = shard.metadata.shard_offsets
            size = shard.metadata.shard_sizes
            rows = range(off[0], off[0] + size[0])
            cols = range(off[1], off[1] + size[1])
            if fill:
                shard.tensor.copy_(expected(i, rows, cols))
            else:
                shard.tensor.fill_(-1.0)  # touched before the clock
        out["t%02d" % i] = t
    return out


def check(state, n):
    for i in range(n):
        for shard in state["t%02d" % i].local_shards():
            off = shard.metadata.shard_offsets
            size = shard.metadata.shard_sizes
            want = expected(i, range(off[0], off[0] + size[0]), range(off[1], off[1] + size[1]))
            if not torch.equal(shard.tensor, want):
                raise SystemExit("dcp_peer: tensor t%02d loaded wrong" % i)


def worker(rank, world, mode, path, n, s, init, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    times = []
    for round_ in range(ROUNDS):
        if mode == "save":
            state = sharded(world, 0, n, s, fill=True)
            target = "%s/r%d" % (path, round_)
            if rank == 0:
                os.sync()  # the last round's writeback out of the way (both sides)
            dist.barrier()
            t0 = time.perf_counter()
            dcp.save_state_dict(state, dcp.FileSystemWriter(target))
            dist.barrier()
            times.append(time.perf_counter() - t0)
        else:  # load: saved by rows, read by columns
            state = sharded(world, 1, n, s, fill=False)
            if rank == 0 and COLD:
                drop_caches()
            dist.barrier()
            t0 = time.perf_counter()
            dcp.load_state_dict(state, dcp.FileSystemReader(path))
            dist.barrier()
            times.append(time.perf_counter() - t0)
            check(state, n)
    if rank == 0:
        results.put(statistics.median(times))
    dist.destroy_process_group()


def run(world, mode, path, n, s):
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        mp.start_processes(worker, args=(world, mode, path, n, s, init, results), nprocs=world,
                           join=True, start_method="spawn")
    return results.get()


def merge(path, n, s):
    torch.set_num_threads(1)
    times = []
    for _ in range(ROUNDS):
        state = {"t%02d" % i: torch.full((s, s), -1.0) for i in range(n)}
        if COLD:
            drop_caches()
        t0 = time.perf_counter()
        dcp.load_state_dict(state, dcp.FileSystemReader(path), no_dist=True)
        times.append(time.perf_counter() - t0)
        for i in range(n):
            if not torch.equal(state["t%02d" % i], expected(i, range(s), range(s))):
                raise SystemExit("dcp_peer: merged tensor t%02d wrong" % i)
    return statistics.median(times)


def main():
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "merge":
        n, s = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (16, 4096)
        print("seconds %.4f" % merge(path, n, s))
        return
    world = int(sys.argv[3])
    n, s = (int(sys.argv[4]), int(sys.argv[5])) if len(sys.argv) > 5 else (16, 4096)
    if mode == "save":
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        seconds = run(world, "save", path, n, s)
        # Keep the first round's checkpoint as DIR/ckpt for the loads.
        os.rename(os.path.join(path, "r0"), os.path.join(path, "ckpt"))
        for r in range(1, ROUNDS):
            shutil.rmtree(os.path.join(path, "r%d" % r), ignore_errors=True)
    elif mode == "load":
        seconds = run(world, "load", path, n, s)
    else:
        raise SystemExit("usage: dcp_peer.py save|load DIR WORLD [N S] | merge DIR [N S]")
    print("seconds %.4f" % seconds)


if __name__ == "__main__":
    main()
