#!/usr/bin/env bash
# Context parallelism's memory: activations per rank at T = 1024 and 4096
# (batch 1, 2 layers, 4 heads of 16) for cp 1 (the peer: the same job on
# one rank) and cp 4 with ring attention and with Ulysses, as the runtime
# accounts them (the peak of a step) and as the kernel sees them (peak
# RSS of rank 0's process under mpirun -np 4); the ratio of cp 4's to a
# quarter of cp 1's (the goal: within 1.3x), the RSS also above each
# job's own at T = 64 (the process: libraries, MPI, buffers; about 30 MiB,
# which dwarfs a quarter of cp 1's at T = 1024). Then the longest T (doubling
# from 512) whose accounted total per rank stays under 256 MiB, without
# and with cp 4.
# Usage: cp_bench.sh TRAIN_GPT CORPUS
set -uo pipefail
BIN=$1
CORPUS=$2
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)
MODEL=(--data "$CORPUS" --layers 2 --heads 4 --embed 64 --batch 1 --steps 2 --lr 1e-3)
# figures T FLAGS...: "activations total rss" (MiB) of a 2-step run.
figures() {
  local T=$1
  shift
  local np=1
  [[ " $* " == *" --cp 4 "* ]] && np=4
  "${MPIRUN[@]}" -np "$np" "$BIN" "${MODEL[@]}" --context "$T" --seq "$T" "$@" 2>&1 |
    sed -n 's/.*activations \([0-9.]*\) MiB.*total \([0-9.]*\) MiB; peak RSS \([0-9.]*\) MiB.*/\1 \2 \3/p'
}
read -r _ _ base1 <<<"$(figures 64)"
read -r _ _ base4 <<<"$(figures 64 --cp 4)"
printf "%-6s %-16s %14s %12s %12s %34s\n" T setting "activations" "total" "peak RSS" \
  "cp4 / (cp1 / 4): act, RSS, RSS-base"
for T in 1024 4096; do
  read -r a1 t1 r1 <<<"$(figures "$T")"
  printf "%-6s %-16s %10s MiB %8s MiB %8s MiB\n" "$T" "cp 1 (peer)" "$a1" "$t1" "$r1"
  for algo in ring ulysses; do
    read -r a t r <<<"$(figures "$T" --cp 4 --cp-algo $algo)"
    printf "%-6s %-16s %10s MiB %8s MiB %8s MiB %15s %9s %9s\n" "$T" "cp 4 $algo" "$a" "$t" "$r" \
      "$(awk -v a="$a" -v b="$a1" 'BEGIN { printf "%.2fx", a / (b / 4) }')" \
      "$(awk -v a="$r" -v b="$r1" 'BEGIN { printf "%.2fx", a / (b / 4) }')" \
      "$(awk -v a="$r" -v b="$r1" -v x="$base4" -v y="$base1" \
        'BEGIN { printf "%.2fx", (a - x) / ((b - y) / 4) }')"
  done
done
echo "peak RSS at T = 64 (the base): cp 1 $base1 MiB, cp 4 $base4 MiB"
echo "longest T with the accounted total per rank under 256 MiB (doubling from 512):"
for setting in "" "--cp 4 --cp-algo ring" "--cp 4 --cp-algo ulysses"; do
  best=none
  for T in 512 1024 2048 4096 8192 16384; do
    # shellcheck disable=SC2086
    read -r a t r <<<"$(figures "$T" $setting)"
    [ -n "$t" ] && awk -v t="$t" 'BEGIN { exit !(t < 256) }' || break
    best=$T
  done
  printf "  %-24s T = %s\n" "${setting:-cp 1}" "$best"
done
