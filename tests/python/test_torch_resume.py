"""A real PyTorch 1.13 training loop saves through save_shards from 2
processes (gloo) and resumes through load_shards on 1 process (a plain
nn.Module + torch.optim.Adam, through tessera.torch) and on 4 (another
strategy): the loaded state is bit-identical to what was saved, and the
resumed losses stay within 1e-5 of the uninterrupted run's."""
import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import tessera  # noqa: E402
import tessera.torch as tt  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import workers  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(mode, world, out_dir):
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(HERE / "workers.py"), mode, str(r), str(world),
                               str(port), str(out_dir)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(world)]
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append(out)
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"{mode} rank {r} exited {p.returncode}:\n{outs[r]}"
    return [json.load(open(out_dir / f"rank{r}.{mode}.json")) for r in range(world)]


def reference_losses():
    """The uninterrupted single-process run: nn.Module + torch.optim.Adam."""
    model = workers.Mlp()
    opt = torch.optim.Adam(model.parameters(), lr=workers.LR, betas=workers.BETAS,
                           eps=workers.EPS)
    x, y = workers.batch()
    losses = []
    for _ in range(workers.STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def close(a, b):
    return all(abs(p - q) <= 1e-5 * abs(q) for p, q in zip(a, b)) and len(a) == len(b)


def test_save_on_2_resume_on_1_and_4(tmp_path):
    torch.set_num_threads(1)
    ref = reference_losses()
    train = launch("train2", 2, tmp_path)
    for r in train:
        assert close(r["losses"], ref), (r["losses"], ref)
    ck = tmp_path / "ck"
    subprocess.run([str(pathlib.Path(os.environ["TESSERA_BUILD_DIR"]) / "cli" / "ckpt"), "verify",
                    str(ck)], check=True, stdout=subprocess.DEVNULL)
    reader = tessera.open(ck)
    assert reader.step == workers.SAVE_AT and reader.metadata["trainer"] == b"workers.py"

    # What was saved, whole: the two ranks' shards put together.
    saved = {}
    s2 = workers.strategy_rows()
    for n in s2.names:
        saved[n] = np.zeros(workers.SHAPES[n.split(".exp_")[0].removeprefix("optimizer.")],
                            np.float32)
    for r in range(2):
        shards = np.load(tmp_path / f"rank{r}.saved.npz")
        for n in s2.names:
            workers.region(saved[n], s2.box(n, r))[...] = shards[n]

    # Resume on 1 process: everything whole, into a plain model and Adam.
    whole = tessera.load_shards(ck, tessera.strategy(tensors={
        n: {"shape": list(a.shape)} for n, a in saved.items()}), 0)
    for n in saved:
        assert whole[n].tobytes() == saved[n].tobytes(), n
    model = workers.Mlp()
    opt = torch.optim.Adam(model.parameters(), lr=workers.LR, betas=workers.BETAS,
                           eps=workers.EPS)
    tt.load_named(model, whole, opt, step=reader.step)
    x, y = workers.batch()
    losses = []
    for _ in range(workers.STEPS - workers.SAVE_AT):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert close(losses, ref[workers.SAVE_AT:]), (losses, ref)
    # And back: the model's and optimizer's named tensors are what was loaded.
    back = tt.named_tensors(workers.Mlp(), None)
    assert set(back) == set(workers.SHAPES)

    # Resume on 4 processes under another strategy.
    resumed = launch("resume4", 4, tmp_path)
    s4 = workers.strategy_cols()
    for r, res in enumerate(resumed):
        assert close(res["losses"], ref[workers.SAVE_AT:]), (r, res["losses"], ref)
        loaded = np.load(tmp_path / f"rank{r}.loaded.npz")
        for n in s4.names:
            assert loaded[n].tobytes() == workers.region(saved[n], s4.box(n, r)).tobytes(), (r, n)
