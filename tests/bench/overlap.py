#!/usr/bin/env python3
"""Communication hidden by compute, from train_gpt --trace timelines.

For each rank's trace PREFIX.rank<R>.json, over the steps after the first
SKIP: every communication interval of one group from issue to completion
(GROUP "tp": "AllReduce tp", "IReduceScatter tp", ...; "cp": ring
attention's "ISend to 1 cp", "IRecv from 1 cp" and Ulysses' "AllToAll cp":
categories comm and pipeline, the name ending in " GROUP"; not the
"wait ..." spans) against the union of the rank's compute (forward and
backward spans of every thread, less the thread's own "wait ..." spans
and blocking collectives: ring attention waits, and Ulysses all-to-alls,
inside their operator's span). The overlap is
sum |collective ∩ compute| / sum |collective|: a collective waited for at
once, or a blocking one, overlaps nothing. Also the rank's step time
(median) and the time collectives exposed (in flight with no compute).

Usage: overlap.py PREFIX RANKS [SKIP] [GROUP]   prints one JSON object per rank
"""
import json
import statistics
import sys


def union(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def covered(a, b, merged):
    """Length of [a, b) inside the merged (sorted, disjoint) intervals."""
    total = 0.0
    for x, y in merged:
        if y <= a:
            continue
        if x >= b:
            break
        total += min(b, y) - max(a, x)
    return total


def minus(merged, holes):
    """The merged intervals less the merged holes."""
    out = []
    for a, b in merged:
        at = a
        for x, y in holes:
            if y <= at or x >= b:
                continue
            if x > at:
                out.append([at, x])
            at = max(at, y)
        if at < b:
            out.append([at, b])
    return out


def rank_figures(path, skip, group="tp"):
    events = [e for e in json.load(open(path))["traceEvents"] if e["ph"] == "X"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "step")[skip:]
    if not steps:
        raise SystemExit(f"{path}: no steps after the first {skip}")
    begin = steps[0][0]
    inside = [e for e in events if e["ts"] >= begin]
    parts = []
    for tid in {e["tid"] for e in inside}:
        mine = [e for e in inside if e["tid"] == tid]
        work = union((e["ts"], e["ts"] + e["dur"]) for e in mine
                     if e["cat"] in ("forward", "backward"))
        # Not compute: waits, and blocking collectives (not the "I..."
        # non-blocking ones, whose spans run from issue to completion).
        waits = union((e["ts"], e["ts"] + e["dur"]) for e in mine
                      if e["name"].startswith("wait ")
                      or (e["cat"] == "comm" and not e["name"].startswith("I")))
        parts += minus(work, waits)
    compute = union(parts)
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in inside
            if e["cat"] in ("comm", "pipeline") and e["name"].endswith(" " + group)
            and not e["name"].startswith("wait ")]
    flight = sum(b - a for a, b in comm)
    hidden = sum(covered(a, b, compute) for a, b in comm)
    exposed = union(comm)
    exposed_us = sum(b - a - covered(a, b, compute) for a, b in exposed)
    return {
        "collectives": len(comm),
        "in_flight_ms": flight / 1e3,
        "overlap": hidden / flight if flight else 0.0,
        "exposed_ms_per_step": exposed_us / 1e3 / len(steps),
        "step_ms": statistics.median(b - a for a, b in steps) / 1e3,
    }


if __name__ == "__main__":
    prefix, ranks = sys.argv[1], int(sys.argv[2])
    skip = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    group = sys.argv[4] if len(sys.argv) > 4 else "tp"
    for r in range(ranks):
        print(json.dumps(rank_figures(f"{prefix}.rank{r}.json", skip, group)))
