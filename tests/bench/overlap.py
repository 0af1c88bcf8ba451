#!/usr/bin/env python3
"""Communication hidden by compute, from train_gpt --trace timelines.

For each rank's trace PREFIX.rank<R>.json, over the steps after the first
SKIP: every tensor-parallel collective's interval from issue to completion
("AllReduce tp", "IReduceScatter tp", ...: category comm, name ending in
" tp"; not the "wait ..." spans) against the union of the rank's compute
(forward and backward spans of every thread). The overlap is
sum |collective ∩ compute| / sum |collective|: a collective waited for at
once, or a blocking one, overlaps nothing. Also the rank's step time
(median) and the time collectives exposed (in flight with no compute).

Usage: overlap.py PREFIX RANKS [SKIP]   prints one JSON object per rank
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


def rank_figures(path, skip):
    events = [e for e in json.load(open(path))["traceEvents"] if e["ph"] == "X"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "step")[skip:]
    if not steps:
        raise SystemExit(f"{path}: no steps after the first {skip}")
    begin = steps[0][0]
    inside = [e for e in events if e["ts"] >= begin]
    compute = union((e["ts"], e["ts"] + e["dur"]) for e in inside
                    if e["cat"] in ("forward", "backward"))
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in inside
            if e["cat"] == "comm" and e["name"].endswith(" tp") and not e["name"].startswith("wait ")]
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
    for r in range(ranks):
        print(json.dumps(rank_figures(f"{prefix}.rank{r}.json", skip)))
