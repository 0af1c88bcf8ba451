#!/usr/bin/env bash
# Optimizer-state offload (train_gpt --offload optimizer): GPT-2 124M
# (L12 H12 C768 V50257) with Adam, batch 4 x 64, on 1 rank and on 2 ranks
# (mpirun, dp2 + ZeRO-1), in memory (the peer) and offloaded with 4 MiB
# buckets to WORKDIR (pages synced and dropped after every pass: each step
# reads the disk, the mode of the cgroup test). Per setting: the step time
# (mean of the steps after the first), the optimizer's resident bytes and
# rank 0's peak RSS, the disk bytes moved per step beside 2 x (m + v), and
# from the --trace timeline the share of the offload I/O that ran while a
# bucket updated. Then the disk's own direct-I/O bandwidth (dd) and what
# that makes the least I/O time a step can take.
# Usage: offload_bench.sh TRAIN_GPT CORPUS WORKDIR
set -uo pipefail
BIN=$(realpath "$1")
CORPUS=$(realpath "$2")
OUT=$(realpath -m "$3")
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
MODEL=(--data "$CORPUS" --layers 12 --heads 12 --embed 768 --vocab 50257 --context 64 --batch 4
  --steps 4 --lr 1e-4)
MPI=(mpirun --allow-run-as-root --oversubscribe)
run() { # run TAG NP FLAGS...
  local tag=$1 np=$2
  shift 2
  "${MPI[@]}" -np "$np" "$BIN" "${MODEL[@]}" "$@" --trace "$OUT/$tag" >"$OUT/$tag.log" 2>&1 ||
    { tail -5 "$OUT/$tag.log"; exit 1; }
}
report() { # report TAG
  /usr/bin/python3 - "$OUT/$1" <<'PY'
import json, re, sys
prefix = sys.argv[1]
log = open(prefix + ".log").read()
ms = 1e3 * 4 / float(re.search(r"done: .*?([0-9.]+) tokens/s", log).group(1)) * 64
opt = re.search(r"optimizer ([0-9.]+) MiB", log).group(1)
rss = re.search(r"peak RSS ([0-9.]+) MiB", log).group(1)
off = re.search(r"offload: ([0-9.]+) MiB read and ([0-9.]+) MiB written in ([0-9]+) steps.*m \+ v: ([0-9.]+) MiB", log)
io = ""
if off:
    r, w, n, mv = float(off[1]), float(off[2]), int(off[3]), float(off[4])
    # The first step reads nothing (the moments start at zero).
    io = f"; disk per step: read {r / (n - 1):.0f} MiB, written {w / n:.0f} MiB (m + v {mv:.0f} MiB)"
    events = [e for e in json.load(open(prefix + ".rank0.json"))["traceEvents"] if e["ph"] == "X"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "step")[1:]
    begin = steps[0][0]
    ev = [e for e in events if e["ts"] >= begin]
    upd = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"] == "update bucket")
    ios = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["cat"] == "offload" and e["name"] != "sync and drop pages"]
    sync = sum(e["dur"] for e in ev if e["name"] == "sync and drop pages") / len(steps) / 1e3
    def cov(a, b):
        return sum(max(0, min(b, y) - max(a, x)) for x, y in upd)
    total = sum(b - a for a, b in ios)
    hidden = sum(cov(a, b) for a, b in ios)
    io += f"; I/O under updates {hidden / total:.1%}; sync + page drop {sync:.0f} ms a step"
print(f"   step {ms:.0f} ms; optimizer resident {opt} MiB; peak RSS {rss} MiB{io}")
PY
}
for np in 1 2; do
  flags=()
  [ "$np" = 2 ] && flags=(--zero 1)
  echo "-- $np rank(s)${flags[*]:+ ${flags[*]}}"
  run "mem$np" "$np" "${flags[@]}"
  echo "   in memory (the peer):"
  report "mem$np"
  run "off$np" "$np" "${flags[@]}" --offload optimizer --offload-dir "$OUT"
  echo "   offloaded:"
  report "off$np"
  /usr/bin/python3 - "$OUT/mem$np.log" "$OUT/off$np.log" <<'PY'
import re, sys
t = [float(re.search(r"done: .*?([0-9.]+) tokens/s", open(f).read()).group(1)) for f in sys.argv[1:]]
print(f"   offloaded step / in-memory step: {t[0] / t[1]:.2f}x")
PY
done
dd if=/dev/zero of="$OUT/dd.bin" bs=4M count=256 oflag=direct conv=fsync 2>&1 | tail -1 |
  sed 's/^/disk write (dd oflag=direct, 1 GiB): /'
dd if="$OUT/dd.bin" of=/dev/null bs=4M iflag=direct 2>&1 | tail -1 |
  sed 's/^/disk read (dd iflag=direct, 1 GiB): /'
rm -f "$OUT/dd.bin"
