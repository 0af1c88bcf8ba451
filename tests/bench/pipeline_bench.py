#!/usr/bin/env python3
"""The pipeline's bubble with and without virtual stages, from the traces.

train_gpt --ranks 2 --pp 2 with the same micro-batches, one chunk per stage
(1F1B) and two (interleaved 1F1B, --virtual-stages 2), runs interleaved
REPEATS times; each run writes its per-rank timeline (--trace). Per step and
rank: the pipeline's window (the first compute of any rank in the step to
the last) and the rank's idle time in it (before its first compute, after
its last, and blocked in pipeline receives and send-buffer waits); the
bubble is idle / (window - idle), the mean of the ranks. Beside each:
the ideal (pp - 1) / (V x M), and the bubble the schedule gives with the
measured per-chunk forward and backward times (the runtime's order,
replayed without transfers). Step times are rank 0's step spans, medians.

Usage: pipeline_bench.py TRAIN_GPT CORPUS WORKDIR [REPEATS]
"""
import json
import os
import re
import statistics
import subprocess
import sys

TRAIN, CORPUS, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
REPEATS = int(sys.argv[4]) if len(sys.argv) > 4 else 5
STEPS, SKIP = 8, 2  # the first steps allocate
MODELS = {
    # gpt_dp_bench's model (its last stage carries a large head).
    "L4 C256 V4096": ["--layers", "4", "--heads", "4", "--embed", "256", "--context", "256",
                      "--seq", "256", "--batch", "8", "--vocab", "4096"],
    # Eight layers and a byte vocabulary: chunks of nearly equal work.
    "L8 C256 V256": ["--layers", "8", "--heads", "4", "--embed", "256", "--context", "128",
                     "--seq", "128", "--batch", "16", "--vocab", "256"],
}


def schedule(pp, s, m, v):
    """runtime/parallel/pipeline.h's task order: (backward, micro-batch, chunk)."""
    if v == 1:
        warm = min(pp - s - 1, m)
        fw = [(False, i, 0) for i in range(m)]
        bw = [(True, i, 0) for i in range(m)]
    else:
        groups = max(1, m // pp)
        first = m // groups + (1 if m % groups else 0)
        warm = min((pp - s - 1) * 2 + (v - 1) * first, m * v)
        fw, bw, begin = [], [], 0
        for g in range(groups):
            end = begin + m // groups + (1 if g < m % groups else 0)
            for c in range(v):
                fw += [(False, i, c) for i in range(begin, end)]
                bw += [(True, i, v - 1 - c) for i in range(begin, end)]
            begin = end
    tasks = fw[:warm]
    f, b = warm, 0
    while f < len(fw):
        tasks += [fw[f], bw[b]]
        f, b = f + 1, b + 1
    return tasks + bw[b:]


def replay(pp, m, v, dur):
    """The schedule's makespan with dur[(stage, chunk, backward)] per task."""
    tasks = [schedule(pp, s, m, v) for s in range(pp)]
    done = {}  # (virtual stage, micro-batch, backward) -> end time
    free = [0.0] * pp
    k = [0] * pp
    while any(k[s] < len(tasks[s]) for s in range(pp)):
        moved = False
        for s in range(pp):
            if k[s] == len(tasks[s]):
                continue
            bwd, i, c = tasks[s][k[s]]
            vs = c * pp + s
            dep = (vs + 1, i, True) if bwd else (vs - 1, i, False)
            if bwd and vs == pp * v - 1:
                dep = (vs, i, False)
            if not bwd and vs == 0:
                dep = None
            if dep is not None and dep not in done:
                continue
            start = max(free[s], done[dep] if dep else 0.0)
            free[s] = start + dur[(s, c, bwd)]
            done[(vs, i, bwd)] = free[s]
            k[s] += 1
            moved = True
        if not moved:
            raise RuntimeError("the replayed schedule does not finish")
    return max(free)


def union(intervals):
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def chunk_of(name, layers, pp, v):
    m = re.match(r"h\.(\d+)", name)
    if m:
        group = int(m.group(1)) * pp * v // layers
        return group // pp
    return 0 if name in ("embedding", "wte+wpe") else v - 1


def run(model, m, v, tag):
    prefix = os.path.join(WORK, tag)
    args = [TRAIN, "--data", CORPUS, "--quiet", "--ranks", "2", "--pp", "2", "--micro-batches",
            str(m), "--steps", str(STEPS), "--trace", prefix] + MODELS[model]
    if v > 1:
        args += ["--virtual-stages", str(v)]
    subprocess.run(args, check=True, capture_output=True, env={
        k: x for k, x in os.environ.items() if k != "OPENBLAS_CORETYPE"})
    layers = int(MODELS[model][1])
    ms = []
    bubbles, dur_sum = [], {}
    traces = []
    for rank in range(2):  # in-process ranks: one clock
        with open(f"{prefix}.rank{rank}.json") as f:
            events = json.load(f)["traceEvents"]
        steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                       if e.get("cat") == "step" and e.get("ph") == "X")
        compute = [e for e in events if e.get("cat") in ("forward", "backward")]
        # Blocking pipeline waits: receives, and waits for a buffer's send.
        waits = [e for e in events if e.get("cat") == "pipeline" and e.get("ph") == "X"
                 and (e["name"].startswith("Recv") or e["name"].startswith("wait"))]
        traces.append((steps, compute, waits))
    steps_counted = 0
    for k in range(SKIP, len(traces[0][0])):
        inside, blocked = [], []
        for rank, (steps, compute, waits) in enumerate(traces):
            a, b = steps[k]
            inside.append([e for e in compute if a <= e["ts"] and e["ts"] + e["dur"] <= b])
            blocked.append([(e["ts"], e["ts"] + e["dur"]) for e in waits
                            if a <= e["ts"] and e["ts"] + e["dur"] <= b])
            if rank == 0:
                ms.append((b - a) / 1e3)
        # The pipeline's window: every rank's first compute to the last.
        start = min(e["ts"] for x in inside for e in x)
        end = max(e["ts"] + e["dur"] for x in inside for e in x)
        for rank, x in enumerate(inside):
            first = min(e["ts"] for e in x)
            last = max(e["ts"] + e["dur"] for e in x)
            idle = (first - start) + (end - last) + union(
                (max(p, first), min(q, last)) for p, q in blocked[rank] if q > first and p < last)
            bubbles.append(idle / (end - start - idle))
            for e in x:
                key = (rank, chunk_of(e["name"], layers, 2, v), e["cat"] == "backward")
                dur_sum[key] = dur_sum.get(key, 0.0) + e["dur"]
        steps_counted += 1
    dur = {key: t / (steps_counted * m) for key, t in dur_sum.items()}
    for s in range(2):  # a chunk with no operator of its own direction
        for c in range(v):
            for bwd in (False, True):
                dur.setdefault((s, c, bwd), 0.0)
    span = replay(2, m, v, dur)
    own = [sum(t for (s, _, _), t in dur.items() if s == r) * m for r in range(2)]
    replayed = statistics.mean((span - o) / o for o in own)
    return statistics.median(ms), statistics.mean(bubbles), replayed


def main():
    os.makedirs(WORK, exist_ok=True)
    print(f"{'model':16} {'M':>2} {'V':>2} {'step ms':>9} {'bubble':>8} {'replayed':>9} "
          f"{'ideal':>7} {'V2/V1 step':>11}")
    for model in MODELS:
        for m in (4, 8):
            runs = {1: [], 2: []}
            for r in range(REPEATS):
                for v in (1, 2):
                    runs[v].append(run(model, m, v, f"p{v}m{m}r{r}"))
            med = {v: [statistics.median(x[i] for x in runs[v]) for i in range(3)] for v in runs}
            for v in (1, 2):
                step, bubble, replayed = med[v]
                ratio = f"{med[2][0] / med[1][0]:.2f}x" if v == 2 else ""
                print(f"{model:16} {m:2d} {v:2d} {step:9.1f} {bubble:8.1%} {replayed:9.1%} "
                      f"{1 / (v * m):7.1%} {ratio:>11}")


if __name__ == "__main__":
    main()
