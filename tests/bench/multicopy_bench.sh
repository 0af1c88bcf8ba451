#!/usr/bin/env bash
# Multi-copy's overlap where communication waits on a wire: two hosts as
# network namespaces (tests/netns.sh), their link rate-limited with
# `tc qdisc tbf` both ways (400 Mbit/s and 2 Gbit/s for tp2, 1 Gbit/s for
# tp2 + SP), train_gpt over Gloo (tessera-run, one rank per host) with tp2
# across the hosts, --micro-batch-interleave 1 and 2 run
# interleaved REPEATS times, each with --trace. Per run and rank, from the
# traces (overlap.py): the share of the tensor-parallel collectives' time
# in flight that compute overlapped, the exposed communication per step
# and the step time; and tokens/s from the run's log. Prints the medians,
# N=2 beside N=1 (the peer: the same job without copies) and the ratio;
# then tp2 under mpirun across the two hosts (Open MPI's own non-blocking
# collectives), and the same two in-process (no wire: collectives are
# memcpys).
# Root only (namespaces): otherwise says so and exits 0.
# Usage: multicopy_bench.sh TESSERA_RUN TRAIN_GPT CORPUS WORKDIR [REPEATS]
set -uo pipefail
RUN=$(realpath "$1")
BIN=$(realpath "$2")
CORPUS=$(realpath "$3")
OUT=$(realpath -m "$4")
REPEATS=${5:-5}
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
MODEL=(--data "$CORPUS" --layers 2 --heads 8 --embed 512 --context 128 --batch 8 --lr 1e-3
       --steps 8 --tp 2)
echo "model: ${MODEL[*]:2}; Gloo, one rank per host; medians of $REPEATS interleaved runs"
port=29600
run() {  # run TAG N REPEAT FLAGS...: one job over the two hosts
  local tag=$1 n=$2 r=$3 pids=() k
  shift 3
  port=$((port + 10))
  for k in 0 1; do
    "$INHOST" "host$((k + 1))" timeout 600 "$RUN" --nnodes 2 --node-rank "$k" \
      --master "host1:$port" --nproc-per-node 1 -- "$BIN" "${MODEL[@]}" "$@" \
      --micro-batch-interleave "$n" --trace "$OUT/$tag.n$n.r$r.node$k" >"$OUT/$tag.n$n.r$r.log.$k" 2>&1 &
    pids+=($!)
  done
  for k in "${pids[@]}"; do wait "$k" || { cat "$OUT/$tag.n$n.r$r.log.0"; exit 1; }; done
  # Node k's trace is rank k's.
  mv "$OUT/$tag.n$n.r$r.node0.rank0.json" "$OUT/$tag.n$n.r$r.rank0.json"
  mv "$OUT/$tag.n$n.r$r.node1.rank1.json" "$OUT/$tag.n$n.r$r.rank1.json"
  mv "$OUT/$tag.n$n.r$r.log.0" "$OUT/$tag.n$n.r$r.log"
}
printf "host1 slots=1\nhost2 slots=1\n" >"$WORK/hostfile"
MPI=(mpirun --allow-run-as-root --oversubscribe --mca plm_rsh_agent "$WORK/agent"
     --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24
     -np 2 --hostfile "$WORK/hostfile" --map-by node)
mpi() {  # mpi TAG N REPEAT FLAGS...: the same job under mpirun, one rank per host
  local tag=$1 n=$2 r=$3
  shift 3
  "$INHOST" host1 timeout 600 "${MPI[@]}" "$BIN" "${MODEL[@]}" "$@" --micro-batch-interleave "$n" \
    --trace "$OUT/$tag.n$n.r$r" >"$OUT/$tag.n$n.r$r.log" 2>&1 || { cat "$OUT/$tag.n$n.r$r.log"; exit 1; }
}
inprocess() {  # inprocess TAG N REPEAT FLAGS...: the same as two threads, no wire
  local tag=$1 n=$2 r=$3
  shift 3
  "$BIN" "${MODEL[@]}" "$@" --ranks 2 --micro-batch-interleave "$n" \
    --trace "$OUT/$tag.n$n.r$r" >"$OUT/$tag.n$n.r$r.log" 2>&1 || { cat "$OUT/$tag.n$n.r$r.log"; exit 1; }
}
report() {  # report TAG LABEL
  /usr/bin/python3 - "$OUT" "$REPEATS" "$HERE" "$1" "$2" <<'PY'
import re, statistics, sys
out, repeats, here, tag, label = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
sys.path.insert(0, here)
from overlap import rank_figures
fig = {}
for n in (1, 2):
    rows = []
    for r in range(1, repeats + 1):
        ranks = [rank_figures(f"{out}/{tag}.n{n}.r{r}.rank{k}.json", 2) for k in (0, 1)]
        log = open(f"{out}/{tag}.n{n}.r{r}.log").read()
        tok = float(re.search(r"done: .*?([0-9.]+) tokens/s", log).group(1))
        rows.append((statistics.mean(x["overlap"] for x in ranks),
                     statistics.mean(x["exposed_ms_per_step"] for x in ranks),
                     statistics.mean(x["step_ms"] for x in ranks), tok))
    fig[n] = [statistics.median(c) for c in zip(*rows)]
(o1, e1, s1, t1), (o2, e2, s2, t2) = fig[1], fig[2]
print(f"-- {label}")
print(f"   tp communication hidden by compute: N=2 {o2:.1%}   N=1 {o1:.1%}")
print(f"   exposed tp communication per step: N=2 {e2:.1f} ms   N=1 {e1:.1f} ms   ratio {e2 / e1:.2f}")
print(f"   step: N=2 {s2:.1f} ms   N=1 {s1:.1f} ms   ratio {s2 / s1:.2f}")
print(f"   tokens/s: N=2 {t2:.0f}   N=1 {t1:.0f}   ratio {t2 / t1:.2f}")
PY
}
for config in "1gbit run tp2" "2gbit run tp2" "1gbit run tp2 --sequence-parallel" "1gbit mpi tp2"; do
  read -r rate how label flags <<<"$config"
  netns_shape "$rate"
  tag=$rate-$how${flags:+-sp}
  for r in $(seq 1 "$REPEATS"); do
    # shellcheck disable=SC2086
    for n in 1 2; do "$how" "$tag" "$n" "$r" $flags; done
  done
  backend=Gloo
  [ "$how" = mpi ] && backend="Open MPI (its non-blocking collectives)"
  report "$tag" "$label${flags:+ + SP}, $backend over a $rate link (tc tbf, each way)"
done
for r in $(seq 1 "$REPEATS"); do
  for n in 1 2; do inprocess inproc "$n" "$r"; done
done
report inproc "tp2 in-process (two threads, collectives are memcpys)"
