"""The Python binding (`import tessera`) beside the C++ library it wraps and
beside plain numpy (python_bench.sh runs it; the state is dcp_bench's: N
tensors "t00".."tNN" of S x S float32, t[i][r, c] = i + r * 1e-3 + c * 1e-7).

  python_bench.py load CKPT WORLD [N S] [--no-hugepages]
      Reshard on load from WORLD Python processes (spawned, as a trainer's
      ranks are; not threads): each calls tessera.load_shards(CKPT, strategy,
      rank, out=...) with a strategy splitting every tensor by columns, into
      arrays allocated and touched before the clock, as dcp_bench's C++ load
      and DCP do. Timed from a barrier before to a barrier after (rank 0's
      clock); every element checked after each round, outside the clock.
      Prints "seconds <median of 3>". With --no-hugepages numpy does not ask
      for transparent huge pages for its arrays (it does by default, where
      the kernel's THP mode is "madvise"), as the C++ bench's std::vector
      buffers do not: the like-for-like figure for the binding's overhead.

  python_bench.py read MERGED RAW [N S]
      One process reads every tensor of the merged native checkpoint MERGED
      and sums it (np.sum), beside numpy reading the same values from RAW, a
      plain file of the N tensors back to back (written here with tofile):
        zero_copy  tessera reader.read(name) (a read-only view of the mapped
                   file, checksums verified) vs np.memmap;
        copy       reader.read(name, copy=True) vs np.fromfile (new arrays);
        into       reader.read_into(name, box, out) vs f.readinto(out)
                   (arrays allocated and touched before the clock);
        view_only  the zero-copy read alone, no sum, vs np.memmap alone.
      Each timing opens the checkpoint (tessera.open) or the file inside the
      clock. Page cache warm on both sides (a read of everything first).
      Prints "<case> <ours seconds> <peer seconds>", medians of 3.
"""
import multiprocessing as mp
import os
import queue
import statistics
import sys
import time

import numpy as np

import tessera

ROUNDS = 3


def names(n):
    return ["t%02d" % i for i in range(n)]


def expected(i, rows, cols):
    """t[i] over rows x cols (ranges), as float32: the same doubles as
    dcp_bench.cc's Expected ((i + r * 1e-3) + c * 1e-7, rounded once)."""
    r = np.arange(rows.start, rows.stop, dtype=np.float64)[:, None]
    c = np.arange(cols.start, cols.stop, dtype=np.float64)[None, :]
    return (i + r * 1e-3 + c * 1e-7).astype(np.float32)


# ---- load: reshard on load from WORLD processes ------------------------------


def column_strategy(world, n, s):
    return tessera.strategy(
        mesh={"r": world},
        tensors={t: {"shape": [s, s], "dtype": "f32", "split": [None, "r"]} for t in names(n)})


def load_worker(rank, world, path, n, s, hugepages, barrier, results):
    try:
        if not hugepages:
            np.core.multiarray._set_madvise_hugepage(False)
        strategy = column_strategy(world, n, s)
        (r0, r1), (c0, c1) = strategy.box("t00", rank)
        want = [expected(i, range(r0, r1), range(c0, c1)) for i in range(n)]
        out = {t: np.full((r1 - r0, c1 - c0), -1.0, dtype=np.float32) for t in names(n)}
        times = []
        for _ in range(ROUNDS):
            for a in out.values():
                a.fill(-1.0)  # touched, not the answer
            barrier.wait()
            t0 = time.perf_counter()
            got = tessera.load_shards(path, strategy, rank, out=out)
            barrier.wait()
            times.append(time.perf_counter() - t0)
            for i, t in enumerate(names(n)):
                if got[t] is not out[t]:
                    raise SystemExit("rank %d: load_shards returned a new array for %s, not out=" % (rank, t))
                if not np.array_equal(out[t], want[i]):
                    bad = np.argwhere(out[t] != want[i])[0]
                    raise SystemExit("rank %d: %s read wrong at %s: %r, want %r" % (
                        rank, t, tuple(bad), out[t][tuple(bad)], want[i][tuple(bad)]))
        results.put((rank, times, None))
    except BaseException as e:  # noqa: BLE001  (reported by the parent)
        barrier.abort()
        results.put((rank, None, "%s: %s" % (type(e).__name__, e)))


def load(path, world, n, s, hugepages):
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(world)
    results = ctx.Queue()
    procs = [ctx.Process(target=load_worker,
                         args=(r, world, path, n, s, hugepages, barrier, results))
             for r in range(world)]
    for p in procs:
        p.start()
    got = []
    while len(got) < world:
        try:
            got.append(results.get(timeout=1))
        except queue.Empty:
            dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                for p in procs:
                    p.kill()
                raise SystemExit("python_bench load: " + "; ".join(
                    "rank %d died (exit code %d)" % d for d in dead))
    for p in procs:
        p.join()
    errors = sorted((r, e) for r, _, e in got if e is not None)
    if errors:
        raise SystemExit("python_bench load: " + "; ".join("rank %d: %s" % re for re in errors))
    times = dict((r, t) for r, t, _ in got)[0]
    print("seconds %.4f" % statistics.median(times))


# ---- read: zero-copy and copying reads beside numpy --------------------------


def median_time(fn):
    fn()  # page cache warm, mappings and allocator primed
    times = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def read(merged, raw, n, s):
    tensor_bytes = s * s * 4
    whole = [(0, s), (0, s)]
    with open(raw, "wb") as f:
        for i in range(n):
            expected(i, range(s), range(s)).tofile(f)

    # Outside any clock: the checkpoint is merged (one piece per tensor, so
    # zero-copy applies), the views are what the docs say, and the values
    # and sums agree with numpy's on the raw file.
    r = tessera.open(merged)
    sums = []
    for i, t in enumerate(names(n)):
        info = r.info(t)
        if info.shape != (s, s) or info.dtype != "f32":
            raise SystemExit("python_bench read: %s is %r" % (t, info))
        a = r.read(t)
        if a.flags.owndata or a.flags.writeable or not isinstance(a.base, tessera.FileMapping):
            raise SystemExit("python_bench read: %s: reader.read is not a read-only view of the "
                             "mapping (owndata %s, writeable %s, base %r)" % (
                                 t, a.flags.owndata, a.flags.writeable, type(a.base)))
        try:
            a[0, 0] = 0
            raise SystemExit("python_bench read: %s: wrote into a read-only view" % t)
        except ValueError:
            pass
        peer = np.fromfile(raw, dtype=np.float32, count=s * s, offset=i * tensor_bytes).reshape(s, s)
        if a.shape != (s, s) or a.dtype != np.float32 or not np.array_equal(a, peer):
            raise SystemExit("python_bench read: %s read wrong" % t)
        c = r.read(t, copy=True)
        if not c.flags.owndata or not c.flags.writeable or not np.array_equal(c, peer):
            raise SystemExit("python_bench read: %s: read(copy=True) wrong or not a copy" % t)
        sums.append(peer.sum())
    r.close()

    sink = []

    def check_sums(got):
        if got != sums:
            raise SystemExit("python_bench read: sums differ from numpy's: %r vs %r" % (got, sums))

    def ours_view(do_sum):
        def run():
            rd = tessera.open(merged)
            got = [rd.read(t) for t in names(n)] if not do_sum else [rd.read(t).sum() for t in names(n)]
            if do_sum:
                check_sums(got)
            sink.append(got)
            sink.clear()
        return run

    def peer_memmap(do_sum):
        def run():
            got = []
            for i in range(n):
                a = np.memmap(raw, dtype=np.float32, mode="r", offset=i * tensor_bytes, shape=(s, s))
                got.append(a.sum() if do_sum else a)
            if do_sum:
                check_sums(got)
            sink.append(got)
            sink.clear()
        return run

    def ours_copy():
        rd = tessera.open(merged)
        check_sums([rd.read(t, copy=True).sum() for t in names(n)])

    def peer_fromfile():
        check_sums([np.fromfile(raw, dtype=np.float32, count=s * s, offset=i * tensor_bytes)
                    .reshape(s, s).sum() for i in range(n)])

    outs = [np.full((s, s), -1.0, dtype=np.float32) for _ in range(n)]

    def ours_into():
        rd = tessera.open(merged)
        got = []
        for t, o in zip(names(n), outs):
            rd.read_into(t, whole, o)
            got.append(o.sum())
        check_sums(got)

    def peer_readinto():
        got = []
        with open(raw, "rb", buffering=0) as f:
            for i, o in enumerate(outs):
                f.seek(i * tensor_bytes)
                view = memoryview(o).cast("B")
                done = 0
                while done < tensor_bytes:
                    done += f.readinto(view[done:])
                got.append(o.sum())
        check_sums(got)

    cases = [
        ("zero_copy", ours_view(True), peer_memmap(True)),
        ("copy", ours_copy, peer_fromfile),
        ("into", ours_into, peer_readinto),
        ("view_only", ours_view(False), peer_memmap(False)),
    ]
    for name, ours, peer in cases:
        print("%s %.4f %.4f" % (name, median_time(ours), median_time(peer)))
    os.remove(raw)


def main():
    args = [a for a in sys.argv[1:] if a != "--no-hugepages"]
    hugepages = len(args) == len(sys.argv) - 1
    if len(args) < 3 or args[0] not in ("load", "read"):
        raise SystemExit("usage: python_bench.py load CKPT WORLD [N S] [--no-hugepages] | "
                         "read MERGED RAW [N S]")
    n, s = (int(args[3]), int(args[4])) if len(args) > 4 else (16, 4096)
    if args[0] == "load":
        load(args[1], int(args[2]), n, s, hugepages)
    else:
        read(args[1], args[2], n, s)


if __name__ == "__main__":
    main()
