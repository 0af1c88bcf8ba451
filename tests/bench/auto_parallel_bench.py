"""The auto-parallel cost model against measurement.

A reduced GPT under a fixed list of hand-written configurations, run with
train_gpt on 2 ranks in-process, 2 MPI processes, 2 Gloo processes
(tessera-run, beside train_gpt), and 4 in-process ranks (ranks sharing the
2 cores: the profile says so), interleaved, ROUNDS runs
each (a run's step time: the median of its steps after the first, rank
0's clock); beside each the step time and per-rank memory ckpt auto-parallel
predicts (--why) from a profile calibrated on this machine in the same run.
Prints both, Spearman's rank correlation, the searched plan (exact) measured
beside the best hand-written one, the memory error, and whether a plan
chosen under a budget stays in it. Every run's figures go to
WORKDIR/results.json, to recompute from.

Usage: auto_parallel_bench.py TRAIN_GPT CKPT CORPUS WORKDIR [ROUNDS [SETTINGS]]
SETTINGS: a comma-separated subset of inprocess2,mpi2,gloo2,inprocess4 (all
by default).
       auto_parallel_bench.py TRAIN_GPT CKPT CORPUS WORKDIR --rescore
predicts WORKDIR/results.json's configurations again with this CKPT (the
profiles calibrated in that run) and prints each setting's rho against that
run's measurements: a change to the model scored on past runs, nothing run.
"""
import json
import os
import re
import statistics
import subprocess
import sys

TRAIN, CKPT, CORPUS, WORK = sys.argv[1:5]
RESCORE = len(sys.argv) > 5 and sys.argv[5] == "--rescore"
ROUNDS = int(sys.argv[5]) if len(sys.argv) > 5 and not RESCORE else 5
SETTINGS = (sys.argv[6] if len(sys.argv) > 6 else "inprocess2,mpi2,gloo2,inprocess4").split(",")
RUN = os.path.join(os.path.dirname(os.path.abspath(TRAIN)), "tessera-run")  # built beside train_gpt
MODEL = ["--layers", "4", "--heads", "4", "--embed", "128", "--context", "128", "--vocab", "256"]
B, T, STEPS = 8, 128, 20
os.makedirs(WORK, exist_ok=True)
ENV = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]


def op_file(name, mesh, operators):
    path = os.path.join(WORK, name + ".json")
    with open(path, "w") as f:
        json.dump({"format": "tessera.op_strategy", "version": 1, "mesh": mesh, "operators": operators}, f)
    return path


DP = None  # the empty file: every operator data parallel (the operator path, as the search runs)


def configs(n):
    """(label, train_gpt flags, --why spec) of the hand-written list on n ranks."""
    empty = op_file("empty", {}, {})
    rows = op_file("rows_tp%d" % n, {"pp": 1, "dp": 1, "tp": n}, {})  # every operator's rows over dp x tp
    mlp = op_file("mlp_rows_tp%d" % n, {"pp": 1, "dp": 1, "tp": n}, {
        "embedding": [["tp", None], ["dp"]],
        "h.*.attn.c_attn": [["dp", None], [None, "tp"]], "h.*.attn.attention": [["dp", "tp"]],
        "h.*.attn.c_proj": [["dp", "tp"], ["tp", None]],
        "h.*.ln_1": [["dp", None]], "h.*.add_1": [["dp", None], ["dp", None]],
        "h.*.ln_2": [["dp", None]], "h.*.add_2": [["dp", None], ["dp", None]],
        "lm_head": [["dp", None], ["tp", None]], "loss": [["dp", "tp"], ["dp"]]})
    c = [
        ("dp%d" % n, ["--dp", str(n), "--op-strategy", empty], "dp=%d,strategy=%s" % (n, empty)),
        ("dp%d zero1" % n, ["--dp", str(n), "--zero", "1", "--op-strategy", empty],
         "dp=%d,zero=1,strategy=%s" % (n, empty)),
        ("tp%d megatron" % n, ["--tp", str(n)], "dp=1,tp=%d" % n),
        ("tp%d megatron-sp" % n, ["--tp", str(n), "--sequence-parallel"], "dp=1,tp=%d,strategy=megatron_sp" % n),
        ("tp%d megatron selective" % n, ["--tp", str(n), "--recompute", "selective"],
         "dp=1,tp=%d,recompute=selective" % n),
        ("tp%d megatron full" % n, ["--tp", str(n), "--recompute", "full"], "dp=1,tp=%d,recompute=full" % n),
        ("tp%d rows (data parallel over tp)" % n, ["--op-strategy", rows], "dp=1,tp=%d,strategy=%s" % (n, rows)),
        ("tp%d attention Megatron, MLP rows" % n, ["--op-strategy", mlp], "dp=1,tp=%d,strategy=%s" % (n, mlp)),
        ("pp%d mb%d" % (n, n), ["--pp", str(n), "--micro-batches", str(n), "--op-strategy", empty],
         "pp=%d,dp=1,micro_batches=%d,strategy=%s" % (n, n, empty)),
        ("pp%d mb8" % n, ["--pp", str(n), "--micro-batches", "8", "--op-strategy", empty],
         "pp=%d,dp=1,micro_batches=8,strategy=%s" % (n, empty)),
        ("pp2 x tp%d megatron mb4" % (n // 2), ["--pp", "2", "--tp", str(n // 2), "--micro-batches", "4"],
         "pp=2,dp=1,tp=%d,micro_batches=4" % (n // 2)),
        ("dp2 x pp%d mb2" % (n // 2), ["--dp", "2", "--pp", str(n // 2), "--micro-batches", "2", "--op-strategy", empty],
         "pp=%d,dp=2,micro_batches=2,strategy=%s" % (n // 2, empty)),
        # Interleaved: two chunks of one layer per stage.
        ("pp2 x tp%d x 2 chunks mb4" % (n // 2),
         ["--pp", "2", "--tp", str(n // 2), "--virtual-stages", "2", "--micro-batches", "4"]
         + (["--op-strategy", empty] if n == 2 else []),
         "pp=2,dp=1,tp=%d,micro_batches=4,virtual_stages=2" % (n // 2)
         + (",strategy=%s" % empty if n == 2 else "")),
        ("pp2 x tp%d x 2 chunks mb8" % (n // 2),
         ["--pp", "2", "--tp", str(n // 2), "--virtual-stages", "2", "--micro-batches", "8"]
         + (["--op-strategy", empty] if n == 2 else []),
         "pp=2,dp=1,tp=%d,micro_batches=8,virtual_stages=2" % (n // 2)
         + (",strategy=%s" % empty if n == 2 else "")),
        # Multi-copy: two copies of each micro-batch (8 sequences).
        ("tp%d megatron x 2 copies" % n, ["--tp", str(n), "--micro-batch-interleave", "2"],
         "dp=1,tp=%d,micro_batch_interleave=2" % n),
        ("tp%d megatron-sp x 2 copies" % n,
         ["--tp", str(n), "--sequence-parallel", "--micro-batch-interleave", "2"],
         "dp=1,tp=%d,strategy=megatron_sp,micro_batch_interleave=2" % n),
    ]
    # pp2 x tp1 and dp2 x pp1 repeat others on 2 ranks.
    return [x for x in c if not (n == 2 and x[0] in ("pp2 x tp1 megatron mb4", "dp2 x pp1 mb2"))]


def bytes_of(text):
    num, unit = text.split()
    return float(num) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}[unit]


def seconds_of(num, unit):
    return float(num) * (1e-3 if unit == "ms" else 1.0)


def predict(profile, n, spec):
    out = subprocess.run([CKPT, "auto-parallel", "--profile", profile, "--devices", str(n), "--mode", "fast",
                          "--batch", str(B), "--seq", str(T)] + MODEL + ["--why", spec],
                         capture_output=True, text=True, env=ENV).stdout
    m = re.search(r"why not .*?: predicted step ([0-9.]+) (ms|s) .*?largest rank \(stage \d+\): ([0-9.]+ \w+) ", out)
    if not m:
        raise SystemExit("no prediction for %s:\n%s" % (spec, out))
    return seconds_of(m.group(1), m.group(2)), bytes_of(m.group(3))


def launch(mode, n, flags):
    base = ["--data", CORPUS, "--steps", str(STEPS), "--batch", str(B), "--seq", str(T)] + MODEL + flags
    if mode == "mpi":
        cmd = MPIRUN + ["-np", str(n), TRAIN] + base
    elif mode == "gloo":
        logs = os.path.join(WORK, "gloo-logs")
        cmd = [RUN, "--nproc-per-node", str(n), "-q", "--log-dir", logs, "--", TRAIN] + base
    else:
        cmd = [TRAIN, "--ranks", str(n)] + base
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV).stdout
    if mode == "gloo":  # rank 0's own output
        with open(os.path.join(logs, "rank-0.log")) as f:
            out = f.read().split("== attempt")[-1]
    # The median step after the first (rank 0's clock): a step that another
    # process on these 2 cores interrupted moves a mean, not a median.
    steps = [float(ms) for k, ms in re.findall(r"^step +(\d+)/\d+ .* ([0-9.]+) ms$", out, re.M) if int(k) > 1]
    mem = re.search(r"memory per rank \(largest\):.* total ([0-9.]+) MiB", out)
    if len(steps) != STEPS - 1 or not mem:
        raise SystemExit("train_gpt %s failed:\n%s" % (" ".join(cmd), out[-2000:]))
    return statistics.median(steps) * 1e-3, float(mem.group(1)) * 2**20


def spearman(a, b):
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2.0
            i = j + 1
        return r
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    return cov / (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5


if RESCORE:
    with open(os.path.join(WORK, "results.json")) as f:
        past = json.load(f)
    print("%-46s %10s %10s" % ("setting (predicted again)", "rho then", "rho now"))
    for r in past:
        n = int(r["setting"].split()[0])
        by_label = {label: spec for label, _, spec in configs(n)}
        hand = [c for c in r["configurations"] if c in by_label]
        k = len(hand)
        measured = [statistics.median(x) for x in r["measured_s"][:k]]
        profile = os.path.join(WORK, os.path.basename(r["profile"]))
        now = [predict(profile, n, by_label[c])[0] for c in hand]
        print("%-46s %10.3f %10.3f" % (r["setting"], spearman(r["predicted_s"][:k], measured),
                                       spearman(now, measured)))
        for c, p0, p1, m in zip(hand, r["predicted_s"], now, measured):
            print("  %-42s then %6.1f  now %6.1f  measured %6.1f ms" % (c, p0 * 1e3, p1 * 1e3, m * 1e3))
    sys.exit(0)

# The machine, measured in this run: in-process ranks, MPI and Gloo
# processes. The 4-rank setting uses the 2-rank in-process profile (told
# that 4 ranks share the 2 cores): collectives timed on 4 ranks sharing
# the cores come out bimodal, whether the peers are running or not
# (BENCHMARKS.md, "Automatic parallelism").
profiles = {m: os.path.join(WORK, "profile-%s.json" % m) for m in ("inprocess", "mpi", "gloo")}
subprocess.run([TRAIN, "--ranks", "2", "--quiet", "--calibrate", profiles["inprocess"]], check=True, env=ENV,
               capture_output=True)
subprocess.run(MPIRUN + ["-np", "2", TRAIN, "--quiet", "--calibrate", profiles["mpi"]], check=True, env=ENV,
               capture_output=True)
subprocess.run([RUN, "--nproc-per-node", "2", "-q", "--", TRAIN, "--quiet", "--calibrate", profiles["gloo"]],
               check=True, env=ENV, capture_output=True)

print("model: layers 4, heads 4, C 128, T 128, batch 8, vocabulary 256; %d steps a run, %d rounds interleaved"
      % (STEPS, ROUNDS))
summary = []
results = []
for mode, n in [(m, n) for m, n in (("inprocess", 2), ("mpi", 2), ("gloo", 2), ("inprocess", 4))
                if "%s%d" % (m, n) in SETTINGS]:
    profile = profiles[mode]
    cs = configs(n)
    preds = [predict(profile, n, spec) for _, _, spec in cs]
    # The search's plans: the fastest, and one under a budget (the median
    # predicted memory of the list).
    budget = int(statistics.median(p[1] for p in preds))
    searched = []
    for name, extra in (("searched (exact)", []), ("searched (exact, --rank-memory %.0f KiB)" % (budget / 1024),
                                                     ["--rank-memory", "%dKiB" % (budget // 1024)])):
        path = os.path.join(WORK, "searched-%s-%d-%d.json" % (mode, n, len(searched)))
        out = subprocess.run([CKPT, "auto-parallel", "--profile", profile, "--devices", str(n), "--mode", "exact",
                              "--batch", str(B), "--seq", str(T), "--write-op-strategy", path] + MODEL + extra,
                             capture_output=True, text=True, env=ENV).stdout
        m = re.search(r"predicted step ([0-9.]+) (ms|s) .*?largest rank \(stage \d+\): ([0-9.]+ \w+) ", out)
        chosen = re.search(r"^chosen: (.*)$", out, re.M).group(1)
        searched.append((name, ["--op-strategy", path], (seconds_of(m.group(1), m.group(2)), bytes_of(m.group(3))),
                         chosen))
    runs = {i: [] for i in range(len(cs) + len(searched))}
    mems = {}
    for _ in range(ROUNDS):
        for i, (_, flags, _) in enumerate(cs):
            t, mem = launch(mode, n, flags)
            runs[i].append(t)
            mems[i] = mem
        for j, (_, flags, _, _) in enumerate(searched):
            t, mem = launch(mode, n, flags)
            runs[len(cs) + j].append(t)
            mems[len(cs) + j] = mem
    measured = [statistics.median(runs[i]) for i in range(len(cs))]
    title = "%d ranks, %s%s" % (n, mode, " (ranks share the 2 cores)" if n > 2 else "")
    print("\n== %s, profile %s" % (title, os.path.basename(profile)))
    print("%-44s %12s %12s %10s %10s" % ("configuration", "predicted ms", "measured ms", "pred. MiB", "meas. MiB"))
    for i, (label, _, _) in enumerate(cs):
        print("%-44s %12.1f %12.1f %10.2f %10.2f" % (label, preds[i][0] * 1e3, measured[i] * 1e3,
                                                       preds[i][1] / 2**20, mems[i] / 2**20))
    rho = spearman([p[0] for p in preds], measured)
    best = min(range(len(cs)), key=lambda i: measured[i])
    mem_err = max(abs(preds[i][1] / mems[i] - 1) for i in range(len(cs)))
    print("Spearman rho (predicted vs measured step time): %.3f (goal >= 0.9)" % rho)
    print("memory: predicted within %.1f%% of the runtime's accounting (goal 10%%)" % (100 * mem_err))
    for j, (name, _, pred, chosen) in enumerate(searched):
        t = statistics.median(runs[len(cs) + j])
        print("%s: %s\n  predicted %.1f ms, measured %.1f ms = %.3fx the best hand-written (%s, %.1f ms); "
              "memory %.2f MiB predicted, %.2f MiB measured" % (name, chosen, pred[0] * 1e3, t * 1e3,
                                                               t / measured[best], cs[best][0],
                                                               measured[best] * 1e3, pred[1] / 2**20,
                                                               mems[len(cs) + j] / 2**20))
        if j == 1:
            print("  budget %.0f KiB: predicted %s, measured %s" % (
                budget / 1024, "within" if pred[1] <= budget else "OVER", "within" if mems[len(cs) + j] <= budget
                else "OVER"))
    summary.append((title, rho, statistics.median(runs[len(cs)]) / measured[best], mem_err))
    results.append({"setting": title, "profile": profile,
                    "configurations": [label for label, _, _ in cs] + [x[3] for x in searched],
                    "predicted_s": [p[0] for p in preds] + [x[2][0] for x in searched],
                    "predicted_bytes": [p[1] for p in preds] + [x[2][1] for x in searched],
                    "measured_s": [runs[i] for i in range(len(cs) + len(searched))],
                    "measured_bytes": [mems[i] for i in range(len(cs) + len(searched))]})
    with open(os.path.join(WORK, "results.json"), "w") as f:
        json.dump(results, f, indent=1)

print("\n%-46s %8s %18s %12s" % ("summary", "rho", "searched/best", "memory err"))
for title, rho, ratio, err in summary:
    print("%-46s %8.3f %17.3fx %11.1f%%" % (title, rho, ratio, 100 * err))
