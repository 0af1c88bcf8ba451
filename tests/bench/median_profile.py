"""Calibrates this machine several times and writes the median of each figure.

What the shipped profiles of this VM (samples/gpt/profiles/debian-vm-2core*.json)
are made with: a single calibration moves with the VM's state (its matrix
products have measured 96 to 180 GFLOP/s on different hours), the median
of several, taken a few seconds apart, less.

Usage: median_profile.py TRAIN_GPT BACKEND OUT NAME [RUNS]
BACKEND: inprocess, mpi or gloo (2 ranks). Every figure of the profile (the
device's, the link's, each entry of the collectives' tables, each kernel's)
is the median of RUNS calibrations (3 by default).
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

TRAIN, BACKEND, OUT, NAME = sys.argv[1:5]
RUNS = int(sys.argv[5]) if len(sys.argv) > 5 else 3
RUN = os.path.join(os.path.dirname(os.path.abspath(TRAIN)), "tessera-run")
ENV = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}


def calibrate(path):
    cmd = {"inprocess": [TRAIN, "--ranks", "2"],
           "mpi": ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", TRAIN],
           "gloo": [RUN, "--nproc-per-node", "2", "-q", "--", TRAIN]}[BACKEND]
    subprocess.run(cmd + ["--quiet", "--calibrate", path], check=True, env=ENV, capture_output=True)
    with open(path) as f:
        return json.load(f)


def median_of(values):
    """The median of numbers, or of equally shaped lists and objects, entry by entry."""
    first = values[0]
    if isinstance(first, dict):
        return {k: median_of([v[k] for v in values]) if k not in ("kind", "group") else first[k]
                for k in first}
    if isinstance(first, list):
        return [median_of([v[i] for v in values]) for i in range(len(first))]
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        return statistics.median(values)
    return first


with tempfile.TemporaryDirectory() as tmp:
    runs = [calibrate(os.path.join(tmp, "profile-%d.json" % i)) for i in range(RUNS)]
out = median_of(runs)
out["name"] = NAME
out["source"] = ("train_gpt --calibrate on 2 %s ranks of this machine: each figure (each entry of the "
                 "collectives' tables, each kernel's) the median of %d calibrations "
                 "(tests/bench/median_profile.py)" % (BACKEND, RUNS))
with open(OUT + ".tmp", "w") as f:
    json.dump(out, f, indent=2)
    f.write("\n")
os.replace(OUT + ".tmp", OUT)
print("wrote %s: matmul %.3g FLOP/s, memory %.3g B/s, %d kernels" % (
    OUT, out["device"]["matmul_flops"], out["device"]["memory_bandwidth"], len(out.get("kernels", {}))))
