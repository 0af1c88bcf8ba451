#!/usr/bin/env bash
# Ring attention's overlap where the key/value blocks cross a wire: two
# hosts as network namespaces (tests/netns.sh), their link rate-limited
# with `tc qdisc tbf` both ways (1 Gbit/s and 400 Mbit/s), train_gpt over
# Gloo (tessera-run, one rank per host) with --cp 2 across the hosts, ring
# attention and Ulysses run interleaved REPEATS times, each with --trace.
# Per run and rank, from the traces (overlap.py, group cp): the share of
# the cp exchanges' time in flight that compute overlapped, the exposed cp
# communication per step and the step time; tokens/s from the log. Prints
# the medians, ring beside Ulysses (the peer: the same job whose exchanges
# are blocking all-to-alls) and the ratio; then the same in-process.
# Root only (namespaces): otherwise says so and exits 0.
# Usage: ring_bench.sh TESSERA_RUN TRAIN_GPT CORPUS WORKDIR [REPEATS]
set -uo pipefail
RUN=$(realpath "$1")
BIN=$(realpath "$2")
CORPUS=$(realpath "$3")
OUT=$(realpath -m "$4")
REPEATS=${5:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../netns.sh"
netns_reexec "$0" "$@" || {
  echo "SKIP: network namespaces need root, iproute2 and unshare"
  exit 0
}
WORK=$(mktemp -d)
trap 'pkill -9 -P $$ 2>/dev/null; netns_cleanup; rm -rf "$WORK"' EXIT
mkdir -p "$OUT"
netns_hosts 2 "$WORK"
INHOST=$WORK/inhost
MODEL=(--data "$CORPUS" --layers 2 --heads 8 --embed 256 --context 2048 --seq 2048 --batch 1
  --lr 1e-3 --steps 6 --cp 2)
echo "model: ${MODEL[*]:2}; Gloo, one rank per host; medians of $REPEATS interleaved runs"
port=29700
run() { # run TAG ALGO REPEAT: one job over the two hosts
  local tag=$1 algo=$2 r=$3 pids=() k
  port=$((port + 10))
  for k in 0 1; do
    "$INHOST" "host$((k + 1))" timeout 600 "$RUN" --nnodes 2 --node-rank "$k" \
      --master "host1:$port" --nproc-per-node 1 -- "$BIN" "${MODEL[@]}" --cp-algo "$algo" \
      --trace "$OUT/$tag.$algo.r$r.node$k" >"$OUT/$tag.$algo.r$r.log.$k" 2>&1 &
    pids+=($!)
  done
  for k in "${pids[@]}"; do wait "$k" || { cat "$OUT/$tag.$algo.r$r.log.0"; exit 1; }; done
  mv "$OUT/$tag.$algo.r$r.node0.rank0.json" "$OUT/$tag.$algo.r$r.rank0.json"
  mv "$OUT/$tag.$algo.r$r.node1.rank1.json" "$OUT/$tag.$algo.r$r.rank1.json"
  mv "$OUT/$tag.$algo.r$r.log.0" "$OUT/$tag.$algo.r$r.log"
}
inprocess() { # inprocess TAG ALGO REPEAT: two threads, no wire
  local tag=$1 algo=$2 r=$3
  "$BIN" "${MODEL[@]}" --ranks 2 --cp-algo "$algo" --trace "$OUT/$tag.$algo.r$r" \
    >"$OUT/$tag.$algo.r$r.log" 2>&1 || { cat "$OUT/$tag.$algo.r$r.log"; exit 1; }
}
report() { # report TAG LABEL
  /usr/bin/python3 - "$OUT" "$REPEATS" "$HERE" "$1" "$2" <<'PY'
import re, statistics, sys
out, repeats, here, tag, label = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
sys.path.insert(0, here)
from overlap import rank_figures
fig = {}
for algo in ("ring", "ulysses"):
    rows = []
    for r in range(1, repeats + 1):
        ranks = [rank_figures(f"{out}/{tag}.{algo}.r{r}.rank{k}.json", 2, "cp") for k in (0, 1)]
        log = open(f"{out}/{tag}.{algo}.r{r}.log").read()
        tok = float(re.search(r"done: .*?([0-9.]+) tokens/s", log).group(1))
        rows.append((statistics.mean(x["overlap"] for x in ranks),
                     statistics.mean(x["exposed_ms_per_step"] for x in ranks),
                     statistics.mean(x["step_ms"] for x in ranks), tok))
    fig[algo] = [statistics.median(c) for c in zip(*rows)]
(o1, e1, s1, t1), (o2, e2, s2, t2) = fig["ring"], fig["ulysses"]
print(f"-- {label}")
print(f"   cp exchanges hidden by compute: ring {o1:.1%}   Ulysses {o2:.1%}")
print(f"   exposed cp communication per step: ring {e1:.1f} ms   Ulysses {e2:.1f} ms   "
      f"ratio {e1 / e2 if e2 else float('nan'):.2f}")
print(f"   step: ring {s1:.1f} ms   Ulysses {s2:.1f} ms   ratio {s1 / s2:.2f}")
print(f"   tokens/s: ring {t1:.0f}   Ulysses {t2:.0f}   ratio {t1 / t2:.2f}")
PY
}
for rate in 1gbit 400mbit; do
  netns_shape "$rate"
  for r in $(seq 1 "$REPEATS"); do
    for algo in ring ulysses; do run "$rate" "$algo" "$r"; done
  done
  report "$rate" "cp2 across two hosts, Gloo over a $rate link (tc tbf, each way)"
done
for r in $(seq 1 "$REPEATS"); do
  for algo in ring ulysses; do inprocess inproc "$algo" "$r"; done
done
report inproc "cp2 in-process (two threads, exchanges are memcpys)"
