#!/usr/bin/env bash
# Offload (train_gpt --offload optimizer, and optimizer,params): GPT-2 124M
# (L12 H12 C768 V50257) with Adam, batch 4 x 64, on 1 rank and on 2 ranks
# (mpirun, dp2 + ZeRO-1): in memory (the peer), with the moments offloaded
# (4 MiB buckets) and with the weights offloaded too, all to WORKDIR with
# direct I/O (O_DIRECT: no page cache, every step reads the disk, the mode
# of the cgroup test; a cold disk is the only kind it sees). REPS runs of
# each, interleaved (default 3). Per setting: the median step time (each
# run's mean of the steps after the first), the resident bytes of the
# parameters and the optimizer and rank 0's peak RSS, the disk bytes moved
# per step beside 2 x (m + v) and the weights', and from the --trace
# timeline of the last run the share of the moments' I/O that ran while a
# bucket updated and the time a step waited for a unit of weights; the
# sliced save after the last step (from the offload files when offloaded,
# within their memory: the peak RSS includes it), from the timeline. Then
# the disk's own direct-I/O bandwidth (dd) in the same run.
# Usage: offload_bench.sh TRAIN_GPT CORPUS WORKDIR [REPS]
set -uo pipefail
BIN=$(realpath "$1")
CORPUS=$(realpath "$2")
OUT=$(realpath -m "$3")
REPS=${4:-3}
mkdir -p "$OUT"
MODEL=(--data "$CORPUS" --layers 12 --heads 12 --embed 768 --vocab 50257 --context 64 --batch 4
  --steps 4 --lr 1e-4)
MPI=(mpirun --allow-run-as-root --oversubscribe)
run() { # run TAG NP FLAGS...
  local tag=$1 np=$2
  shift 2
  "${MPI[@]}" -np "$np" "$BIN" "${MODEL[@]}" "$@" --trace "$OUT/$tag" \
    --save "$OUT/ck.$tag" --save-every 4 >"$OUT/$tag.log" 2>&1 ||
    { tail -5 "$OUT/$tag.log"; exit 1; }
  rm -rf "$OUT/ck.$tag"
}
report() { # report PEER_PREFIX PREFIX: the last run's figures, the median step over REPS
  /usr/bin/python3 - "$OUT/$1" "$OUT/$2" "$REPS" <<'PY'
import json, re, statistics, sys
peer, prefix, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def step_ms(p):
    ms = []
    for k in range(reps):
        log = open(f"{p}.{k}.log").read()
        ms.append(1e3 * 4 * 64 / float(re.search(r"done: .*?([0-9.]+) tokens/s", log).group(1)))
    return statistics.median(ms), ms
med, all_ms = step_ms(prefix)
log = open(f"{prefix}.{reps - 1}.log").read()
par = re.search(r"parameters ([0-9.]+) MiB", log).group(1)
opt = re.search(r"optimizer ([0-9.]+) MiB", log).group(1)
rss = re.search(r"peak RSS ([0-9.]+) MiB", log).group(1)
line = f"   step {med:.0f} ms (runs {', '.join(f'{m:.0f}' for m in all_ms)})"
if peer != prefix:
    line += f", {med / step_ms(peer)[0]:.2f}x in memory"
line += f"; resident: parameters {par} MiB, optimizer {opt} MiB; peak RSS {rss} MiB"
def save_s(p):
    ev = json.load(open(f"{p}.{reps - 1}.rank0.json"))["traceEvents"]
    return sum(e["dur"] for e in ev if e.get("ph") == "X" and e.get("cat") == "checkpoint") / 1e6
line += f"; the step-4 save {save_s(prefix):.2f} s"
if peer != prefix:
    line += f" (in memory {save_s(peer):.2f} s)"
print(line)
off = re.search(r"offload: ([0-9.]+) MiB read and ([0-9.]+) MiB written in ([0-9]+) steps.*m \+ v: ([0-9.]+) MiB", log)
if not off:
    sys.exit(0)
r, w, n, mv = float(off[1]), float(off[2]), int(off[3]), float(off[4])
# The first step reads no moments (they start at zero).
io = (f"   disk per step: moments read {r / (n - 1):.0f} (the save's stream of them included), "
      f"written {w / n:.0f} MiB (m + v {mv:.0f} MiB)")
wo = re.search(r"weights offload: ([0-9.]+) MiB read and ([0-9.]+) MiB written.*weights: ([0-9.]+) MiB in ([0-9]+) units, the largest ([0-9.]+) MiB\), at most ([0-9.]+) MiB", log)
if wo:
    io += (f"; weights read {float(wo[1]) / n:.0f}, written {float(wo[2]) / n:.0f} MiB "
           f"(weights {wo[3]} MiB in {wo[4]} units, the largest {wo[5]} MiB; at most {wo[6]} MiB resident)")
print(io)
events = [e for e in json.load(open(f"{prefix}.{reps - 1}.rank0.json"))["traceEvents"] if e["ph"] == "X"]
steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "step")[1:]
ev = [e for e in events if e["ts"] >= steps[0][0]]
upd = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"] == "update bucket")
ios = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"] in ("read bucket", "write bucket")]
cov = lambda a, b: sum(max(0, min(b, y) - max(a, x)) for x, y in upd)
hidden = sum(cov(a, b) for a, b in ios) / max(1, sum(b - a for a, b in ios))
waited = sum(e["dur"] for e in ev if e["name"] == "read weights (waited)") / len(steps) / 1e3
ahead = sum(e["dur"] for e in ev if e["name"] in ("read weights", "write weights")) / len(steps) / 1e3
t = f"   moments' I/O under updates {hidden:.1%}"
if wo:
    t += f"; weights: {ahead:.0f} ms of reads ahead and write-backs a step, {waited:.0f} ms a step waiting for a unit"
print(t)
PY
}
for np in 1 2; do
  flags=()
  [ "$np" = 2 ] && flags=(--zero 1)
  for k in $(seq 0 $((REPS - 1))); do
    run "mem$np.$k" "$np" "${flags[@]}"
    run "opt$np.$k" "$np" "${flags[@]}" --offload optimizer --offload-dir "$OUT"
    run "par$np.$k" "$np" "${flags[@]}" --offload optimizer,params --offload-dir "$OUT"
  done
  echo "-- $np rank(s)${flags[*]:+ ${flags[*]}}, medians of $REPS interleaved runs"
  echo "   in memory (the peer):"
  report "mem$np" "mem$np"
  echo "   --offload optimizer:"
  report "mem$np" "opt$np"
  echo "   --offload optimizer,params:"
  report "mem$np" "par$np"
done
dd if=/dev/zero of="$OUT/dd.bin" bs=4M count=256 oflag=direct conv=fsync 2>&1 | tail -1 |
  sed 's/^/disk write (dd oflag=direct, 1 GiB): /'
dd if="$OUT/dd.bin" of=/dev/null bs=4M iflag=direct 2>&1 | tail -1 |
  sed 's/^/disk read (dd iflag=direct, 1 GiB): /'
rm -f "$OUT/dd.bin"
