"""Checks train_gpt's --trace output: PREFIX.rank<R>.json for each of RANKS
ranks, Chrome trace-event JSON (what Perfetto and chrome://tracing load):
the rank as pid, complete events with non-negative durations, the
categories a run of this kind records, and every operator's compute inside
a step. Usage: check_trace.py PREFIX RANKS CATEGORY..."""
import json
import sys

prefix, ranks, wanted = sys.argv[1], int(sys.argv[2]), set(sys.argv[3:])
for r in range(ranks):
    path = f"{prefix}.rank{r}.json"
    events = json.load(open(path))["traceEvents"]
    names = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert names and names[0]["args"]["name"] == f"rank {r}", path
    spans = [e for e in events if e["ph"] == "X"]
    assert all(e["pid"] == r and e["dur"] >= 0 and e["ts"] > 0 for e in spans), path
    cats = {e["cat"] for e in spans}
    assert wanted <= cats, f"{path}: {sorted(wanted - cats)} missing from {sorted(cats)}"
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in spans if e["cat"] == "step"]
    for e in spans:
        if e["cat"] in ("forward", "backward", "optimizer"):
            assert any(a <= e["ts"] and e["ts"] + e["dur"] <= b + 1e-3 for a, b in steps), (path, e)
print(f"{ranks} traces: ok")
