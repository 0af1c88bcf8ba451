#!/usr/bin/env bash
# Parameter servers beside all-reduce data parallelism at the same number
# of workers W, the same model and batch, over Gloo processes (tessera-run):
#  1. one host: dp over W processes against S servers + W workers (W + S
#     processes), tokens/s (medians of 5, the two interleaved) and the
#     bytes a step each design moves each way through its busiest rank's
#     link: a ring all-reduce rank 2 P (W - 1) / W, a server W P / S (in:
#     every worker's gradients; out: the new values to every worker);
#  2. two hosts (network namespaces, root only) joined by a link shaped
#     with tc tbf: the servers on host1 and the workers on host2 against dp
#     with one worker per host, so both designs' traffic crosses the link;
#  3. the embedding served by rows: a vocabulary of 1M x 256 (1 GiB of f32;
#     the untied head as much again): a worker's peak RSS with every
#     parameter on one server against plain data parallelism of the same
#     model, which holds both tables, their gradients and moments.
# Usage: ps_bench.sh TESSERA_RUN TRAIN_GPT CORPUS [--no-vocab]
set -euo pipefail
RUN=$(realpath "$1")
TRAIN=$(realpath "$2")
CORPUS=$(realpath "$3")
VOCAB=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../netns.sh"
netns_reexec "$here/ps_bench.sh" "$@" || true  # not root: one host only
WORK=$(mktemp -d)
trap 'netns_cleanup 2>/dev/null; rm -rf "$WORK"' EXIT
MODEL=(--data "$CORPUS" --layers 4 --heads 4 --embed 256 --context 128 --seq 128 --batch 8
  --vocab 4096 --quiet)
STEPS=(--steps 8)  # the asynchronous section runs 12
# P: the model's parameters in bytes (f32).
P=$(awk 'BEGIN {C = 256; V = 4096; L = 4; T = 128;
  print 4 * (V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C)}')
toks() { awk '/done:/ {for (i = 1; i <= NF; i++) if ($(i + 1) ~ /^tokens\/s/) print $i}' "$1" | tail -1; }
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
mib() { awk "BEGIN {printf \"%.1f\", $1 / 1048576}"; }
# run_job LOG NPROC [TESSERA_RUN FLAGS...] -- TRAIN FLAGS...: one job on this host.
run_job() {
  local log=$1 nproc=$2
  shift 2
  local flags=()
  while [ "$1" != -- ]; do flags+=("$1"); shift; done
  shift
  "$RUN" --nproc-per-node "$nproc" "${flags[@]}" -q --log-dir "$WORK/logs" -- "$TRAIN" \
    "${MODEL[@]}" "${STEPS[@]}" "$@" >/dev/null 2>&1
  cat "$WORK"/logs/rank-*.log >"$log"
  rm -rf "$WORK/logs"
}

echo "model: L4 C256 H4 T128 B8 V4096, $(mib "$P") MiB of parameters (P); Gloo processes"
printf "%-34s %11s %11s %8s %16s %16s\n" "one host" "dp tok/s" "PS tok/s" "PS/dp" \
  "dp each way" "PS each way"
for setting in "2 1" "2 2" "4 1"; do
  read -r W S <<<"$setting"
  : >"$WORK/d"
  : >"$WORK/p"
  for _ in 1 2 3 4 5; do
    run_job "$WORK/dp.log" "$W" -- --dp "$W"
    toks "$WORK/dp.log" >>"$WORK/d"
    run_job "$WORK/ps.log" $((W + S)) --ps-servers "$S" --
    toks "$WORK/ps.log" >>"$WORK/p"
  done
  d=$(median <"$WORK/d")
  p=$(median <"$WORK/p")
  printf "%-34s %11.0f %11.0f %7.2fx %16s %16s\n" "W=$W workers, S=$S server(s)" "$d" "$p" \
    "$(awk "BEGIN {print $p / $d}")" "$(mib "2 * $P * ($W - 1) / $W") MiB" \
    "$(mib "$W * $P / $S") MiB"
done
echo "(each way: what the busiest rank sends a step, and receives as much; the"
echo " servers share the two cores with the workers here)"

# Asynchronous mode: W = 2 workers, S = 1, synchronous against --ps-staleness
# K, plain and with a straggler (worker 1 stalls 1 s at step 4 of 12): the
# whole job's wall time (start-up, every worker's last step and the stop
# included: a worker ahead of the others does not count as done).
printf "%-34s %11s %11s %8s\n" "asynchronous (W=2, S=1, 12 steps)" "sync s" "async s" \
  "speed-up"
timed() { # timed LOG FLAGS...: run_job's wall seconds
  local t0
  t0=$(date +%s.%N)
  run_job "$@"
  awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {print b - a}'
}
STEPS=(--steps 12)
for case in "K=0" "K=2" "K=4, a 1 s straggler" "K=8, a 1 s straggler"; do
  K=${case#K=}
  K=${K%%,*}
  stall=()
  [[ "$case" == *straggler* ]] && stall=(--fault-hang step:4:2 --fault-stall 1)
  : >"$WORK/d"
  : >"$WORK/p"
  for _ in 1 2 3 4 5; do
    timed "$WORK/sync.log" 3 --ps-servers 1 -- "${stall[@]}" >>"$WORK/d"
    timed "$WORK/async.log" 3 --ps-servers 1 -- --ps-staleness "$K" "${stall[@]}" >>"$WORK/p"
  done
  d=$(median <"$WORK/d")
  p=$(median <"$WORK/p")
  printf "%-34s %11.2f %11.2f %7.2fx\n" "$case" "$d" "$p" "$(awk "BEGIN {print $d / $p}")"
done

# A worker killed (SIGKILL at step 6 of 20; W=2, S=1, --ps-staleness 2,
# a checkpoint every 5 steps): replaced alone (--ps-replace-workers: the
# launcher starts that one process again, the other worker trains on, the
# replacement joins with the servers' current weights) against the whole
# job restarted from its newest checkpoint (tessera-run's default on any
# death, what a synchronous job must do), beside the same job
# uninterrupted; the whole job's wall time (start-up, restarts and the
# stop included).
printf "%-34s %11s %11s %11s %8s\n" "a worker killed (W=2, S=1, 20 steps)" "none s" \
  "replaced s" "restart s" "restart/replaced"
STEPS=(--steps 20 --ps-staleness 2 --save-every 5 --resume)
: >"$WORK/n"
: >"$WORK/r"
: >"$WORK/w"
for i in 1 2 3 4 5; do
  timed "$WORK/none.log" 3 --ps-servers 1 --ps-replace-workers -- --save "$WORK/c$i-n" >>"$WORK/n"
  timed "$WORK/rep.log" 3 --ps-servers 1 --ps-replace-workers -- --save "$WORK/c$i-r" \
    --fault-kill step:6:2 >>"$WORK/r"
  grep -q "1 replacement(s) taken back" "$WORK/rep.log" || { echo "no replacement" >&2; exit 1; }
  timed "$WORK/restart.log" 3 --ps-servers 1 --max-restarts 1 -- --save "$WORK/c$i-w" \
    --fault-kill step:6:2 >>"$WORK/w"
  grep -q "== attempt 2" "$WORK/restart.log" || { echo "no restart" >&2; exit 1; }
  rm -rf "$WORK/c$i-"*
done
n=$(median <"$WORK/n")
r=$(median <"$WORK/r")
w=$(median <"$WORK/w")
printf "%-34s %11.2f %11.2f %11.2f %7.2fx\n" "killed at step 6" "$n" "$r" "$w" \
  "$(awk "BEGIN {print $w / $r}")"
echo "(the replaced run's slowest of 5: $(sort -g "$WORK/r" | tail -1) s)"
STEPS=(--steps 8)

if [ -n "${TESSERA_NETNS_INNER:-}" ]; then
  netns_hosts 2 "$WORK"
  port=29500
  # job2 LOG NPROC FLAGS... -- TRAIN FLAGS...: node 0 on host1, node 1 on host2.
  job2() {
    local log=$1 nproc=$2
    shift 2
    local flags=()
    while [ "$1" != -- ]; do flags+=("$1"); shift; done
    shift
    port=$((port + 10))
    for k in 1 0; do
      "$WORK/inhost" "host$((k + 1))" "$RUN" --nnodes 2 --node-rank "$k" --master "host1:$port" \
        --nproc-per-node "$nproc" "${flags[@]}" -q --log-dir "$WORK/logs$k" -- "$TRAIN" \
        "${MODEL[@]}" "${STEPS[@]}" "$@" >/dev/null 2>&1 &
    done
    wait
    cat "$WORK"/logs0/rank-*.log "$WORK"/logs1/rank-*.log >"$log"
    rm -rf "$WORK/logs0" "$WORK/logs1"
  }
  for rate in 1gbit 200mbit; do
    netns_shape "$rate"
    : >"$WORK/d"
    : >"$WORK/p"
    for _ in 1 2 3; do
      job2 "$WORK/dp.log" 1 -- --dp 2
      toks "$WORK/dp.log" >>"$WORK/d"
      job2 "$WORK/ps.log" 2 --ps-servers 2 --
      toks "$WORK/ps.log" >>"$WORK/p"
    done
    d=$(median <"$WORK/d")
    p=$(median <"$WORK/p")
    printf "%-34s %11.0f %11.0f %7.2fx %16s %16s\n" "two hosts, $rate, W=2 S=2" "$d" "$p" \
      "$(awk "BEGIN {print $p / $d}")" "$(mib "$P") MiB" "$(mib "2 * $P") MiB"
  done
  echo "(dp: one worker per host; PS: both servers on host1, both workers on host2: the"
  echo " link carries W P each way, the ring P)"
else
  echo "two hosts (network namespaces): skipped, needs root"
fi

[ "$VOCAB" = --no-vocab ] && exit 0
echo
echo "the embedding served by rows: V = 1,048,576 x C 256 (1 GiB of f32), untied head,"
echo "L2 T32 B2, 2 workers; peak RSS of a worker process"
BIG=(--data "$CORPUS" --layers 2 --heads 4 --embed 256 --context 32 --seq 32 --batch 2
  --vocab 1048576 --untied-head --steps 3 --quiet)
"$RUN" --nproc-per-node 2 -q --log-dir "$WORK/big" -- "$TRAIN" "${BIG[@]}" >/dev/null 2>&1
dp_rss=$(awk '/peak RSS/ {for (i = 1; i <= NF; i++) if ($i == "RSS") print $(i + 1)}' \
  "$WORK/big/rank-0.log")
rm -rf "$WORK/big"
"$RUN" --nproc-per-node 3 --ps-servers 1 -q --log-dir "$WORK/big" -- "$TRAIN" "${BIG[@]}" \
  >/dev/null 2>&1
ps_rss=$(awk '/peak RSS/ {for (i = 1; i <= NF; i++) if ($i == "RSS") print $(i + 1)}' \
  "$WORK/big/rank-1.log")
server=$(grep -o "holds [0-9.]* [GM]iB" "$WORK/big/rank-0.log" | head -1)
printf "%-44s %10s MiB\n" "data parallelism (2 ranks), a rank" "$dp_rss"
printf "%-44s %10s MiB  (%.2fx)\n" "1 server + 2 workers, a worker" "$ps_rss" \
  "$(awk "BEGIN {print $ps_rss / $dp_rss}")"
echo "the server $server (both tables, their gradients and moments)"
