"""Processes of the Python package's multi-process tests, one per rank over
torch.distributed (gloo on loopback):

    workers.py MODE RANK WORLD PORT DIR

MODE:
  train2    2 processes: sharded training (weights by rows, Adam moments
            ZeRO-style), an async save_shards after step 3 while training goes
            on, 6 steps in all.
  resume4   4 processes: load_shards of that checkpoint under another
            strategy (weights by columns over 2, moments over the other 2),
            3 more steps.
  errors    2 processes: bad calls raise on every rank, naming the fault.
  replicas  2 processes: a replicated tensor is written once; redundancy.

Each writes what the test checks into DIR as rank<R>.<mode>.json / .npz.
"""
import json
import os
import sys
import threading
import time

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tessera  # noqa: E402
import tessera.torch as tt  # noqa: E402

# The model: fc1 (32x16) + tanh + fc2 (8x32), MSE on a fixed batch.
SHAPES = {"fc1.weight": [32, 16], "fc1.bias": [32], "fc2.weight": [8, 32], "fc2.bias": [8]}
LR, BETAS, EPS = 1e-2, (0.9, 0.999), 1e-8
STEPS, SAVE_AT = 6, 3


def batch():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(64, 16, generator=g)
    y = torch.randn(64, 8, generator=g)
    return x, y


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def loss_of(params, x, y):
    h = torch.tanh(x @ params["fc1.weight"].T + params["fc1.bias"])
    out = h @ params["fc2.weight"].T + params["fc2.bias"]
    return torch.nn.functional.mse_loss(out, y)


def moment_names(p):
    return [f"optimizer.{p}.exp_avg", f"optimizer.{p}.exp_avg_sq"]


def strategy_rows():
    """2 processes: each 2-D weight split by rows; every moment split ZeRO-style
    (by rows, biases' in halves) while biases stay replicated."""
    t = {}
    for p, shape in SHAPES.items():
        t[p] = {"shape": shape, "split": ["r", None] if len(shape) == 2 else [None]}
        for m in moment_names(p):
            t[m] = {"shape": shape, "split": ["r"] + [None] * (len(shape) - 1)}
    return tessera.strategy(mesh={"r": 2}, tensors=t)


def strategy_cols():
    """4 processes: weights split by columns over a (replicated over b), moments
    split by rows over b (replicated over a)."""
    t = {}
    for p, shape in SHAPES.items():
        t[p] = {"shape": shape, "split": [None, "a"] if len(shape) == 2 else [None]}
        for m in moment_names(p):
            t[m] = {"shape": shape, "split": ["b"] + [None] * (len(shape) - 1)}
    return tessera.strategy(mesh={"a": 2, "b": 2}, tensors=t)


def region(a, box):
    return a[tuple(slice(lo, hi) for lo, hi in box)]


class Sharded:
    """A rank's shards of the parameters and Adam moments under `strategy`.
    Each step gathers the full parameters, runs forward and backward on them
    (every rank the same batch), updates the elements whose moments this rank
    holds, and gathers the updated regions back into its own shards."""

    def __init__(self, strategy, rank, shards):
        self.s, self.rank = strategy, rank
        self.shards = shards  # name -> numpy array (this rank's box)
        self.step = 0

    def box(self, name):
        return self.s.box(name, self.rank)

    def gather(self, pieces):
        full = {p: np.zeros(s, np.float32) for p, s in SHAPES.items()}
        out = [None] * dist.get_world_size()
        dist.all_gather_object(out, pieces)
        for theirs in out:
            for name, (box, a) in theirs.items():
                region(full[name], box)[...] = a
        return full

    def train_step(self, x, y):
        full = self.gather({p: (self.box(p), self.shards[p]) for p in SHAPES})
        params = {p: torch.tensor(a, requires_grad=True) for p, a in full.items()}
        loss = loss_of(params, x, y)
        loss.backward()
        self.step += 1
        b1, b2 = BETAS
        updated = {}
        for p in SHAPES:
            mb = self.box(moment_names(p)[0])
            g = region(params[p].grad, mb)
            w = region(params[p].detach(), mb).clone()
            m = torch.from_numpy(self.shards[moment_names(p)[0]])
            v = torch.from_numpy(self.shards[moment_names(p)[1]])
            # torch.optim.Adam's single-tensor update, on this rank's elements.
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            step_size = LR / (1 - b1 ** self.step)
            denom = (v.sqrt() / ((1 - b2 ** self.step) ** 0.5)).add_(EPS)
            w.addcdiv_(m, denom, value=-step_size)
            updated[p] = (mb, w.numpy())
        full = self.gather(updated)
        for p in SHAPES:
            self.shards[p] = np.ascontiguousarray(region(full[p], self.box(p)))
        return float(loss)


def init(rank, world, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)


def train2(rank, out_dir):
    s = strategy_rows()
    model = Mlp()
    full = {n: t.detach().numpy().copy() for n, t in model.state_dict().items()}
    shards = {}
    for p in SHAPES:
        shards[p] = np.ascontiguousarray(region(full[p], s.box(p, rank)))
        for m in moment_names(p):
            shards[m] = np.zeros([hi - lo for lo, hi in s.box(m, rank)], np.float32)
    tr = Sharded(s, rank, shards)
    x, y = batch()
    losses, handle, polls = [], None, 0
    for _ in range(STEPS):
        losses.append(tr.train_step(x, y))
        if handle is not None and not handle.done():
            polls += 1
        if tr.step == SAVE_AT:
            np.savez(os.path.join(out_dir, f"rank{rank}.saved.npz"), **tr.shards)
            handle = tessera.save_shards(os.path.join(out_dir, "ck"), tr.step, s, rank,
                                         dict(tr.shards), tt.TorchComm(), async_=True,
                                         metadata={"trainer": "workers.py"})
            # The arrays were copied: training may change them right away
            # (scribbled over here, then put back, outside the save's view).
            kept = {k: a.copy() for k, a in tr.shards.items()}
            for a in tr.shards.values():
                a.fill(np.nan)
            for k, a in tr.shards.items():
                a[...] = kept[k]
    handle.wait()
    assert handle.done()
    json.dump({"losses": losses, "polls": polls},
              open(os.path.join(out_dir, f"rank{rank}.train2.json"), "w"))


def resume4(rank, out_dir):
    s = strategy_cols()
    shards = tessera.load_shards(os.path.join(out_dir, "ck"), s, rank)
    np.savez(os.path.join(out_dir, f"rank{rank}.loaded.npz"), **shards)
    step = tessera.open(os.path.join(out_dir, "ck")).step
    tr = Sharded(s, rank, shards)
    tr.step = step
    x, y = batch()
    losses = [tr.train_step(x, y) for _ in range(STEPS - step)]
    json.dump({"losses": losses, "boxes": {n: s.box(n, rank) for n in s.names}},
              open(os.path.join(out_dir, f"rank{rank}.resume4.json"), "w"))


def errors(rank, out_dir):
    """Each bad call must raise on every rank (never hang), naming the fault."""
    s = strategy_rows()
    good = {n: np.zeros([hi - lo for lo, hi in s.box(n, rank)], np.float32) for n in s.names}
    comm = tt.TorchComm()
    seen = {}
    cases = {
        # rank 1 gives a float64 array
        "dtype": {**good, "fc1.weight": good["fc1.weight"].astype(np.float64)} if rank == 1 else good,
        # rank 0 gives a box the strategy does not give it
        "box": {**good, "fc2.weight": ([(4, 8), (0, 32)], good["fc2.weight"])} if rank == 0 else good,
        # rank 1 forgets a tensor
        "missing": {k: v for k, v in good.items() if k != "fc2.bias"} if rank == 1 else good,
        # a tensor the strategy lacks
        "unknown": {**good, "nope": np.zeros(3, np.float32)},
    }
    for case, tensors in cases.items():
        try:
            tessera.save_shards(os.path.join(out_dir, case), 1, s, rank, tensors, comm)
            seen[case] = "no error"
        except tessera.Error as e:
            seen[case] = f"{type(e).__name__}: {e}"
        seen[case + ".exists"] = os.path.exists(os.path.join(out_dir, case))
    # The same checkpoint again without overwrite: refused on every rank.
    tessera.save_shards(os.path.join(out_dir, "twice"), 1, s, rank, good, comm)
    try:
        tessera.save_shards(os.path.join(out_dir, "twice"), 1, s, rank, good, comm)
        seen["twice"] = "no error"
    except tessera.Error as e:
        seen["twice"] = f"{type(e).__name__}: {e}"
    json.dump(seen, open(os.path.join(out_dir, f"rank{rank}.errors.json"), "w"))


def replicas(rank, out_dir):
    """A tensor replicated on both ranks is written once (by one rank); with
    redundancy, verify and repair work from what was written. Also: the GIL is
    released while a rank loads, so another thread keeps running."""
    n = 1024
    s = tessera.strategy(mesh={"r": 2}, tensors={
        "shared": {"shape": [n, n]},
        "split": {"shape": [n, n], "split": ["r", None]},
    })
    shared = np.arange(n * n, dtype=np.float32).reshape(n, n)
    mine = np.full((n // 2, n), rank, np.float32)
    comm = tt.TorchComm()
    tessera.save_shards(os.path.join(out_dir, "rep"), 5, s, rank,
                        {"shared": shared, "split": mine}, comm, redundancy="rs:1+1",
                        hosts=["h0", "h1"])
    ticks = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0)

    t = threading.Thread(target=spin)
    t.start()
    before = ticks[0]
    t0 = time.perf_counter()
    loads = 0
    # Half a second of loads at least, so that the ticks per load are an
    # average over many calls, however busy the machine.
    while loads < 5 or time.perf_counter() - t0 < 0.5:
        got = tessera.load_shards(os.path.join(out_dir, "rep"), None, rank)
        loads += 1
    elapsed = time.perf_counter() - t0
    during = ticks[0] - before
    stop.set()
    t.join()
    ok = bool(np.array_equal(got["shared"], shared) and np.array_equal(got["split"], mine))
    json.dump({"ok": ok, "ticks_during_load": during, "load_seconds": elapsed, "loads": loads},
              open(os.path.join(out_dir, f"rank{rank}.replicas.json"), "w"))


def main():
    mode, rank, world, port, out_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
        int(sys.argv[4]), sys.argv[5]
    torch.set_num_threads(1)
    init(rank, world, port)
    {"train2": train2, "resume4": resume4, "errors": errors, "replicas": replicas}[mode](
        rank, out_dir)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
