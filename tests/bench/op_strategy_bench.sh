#!/usr/bin/env bash
# Operator strategies on 2 and 4 processes (mpirun): Megatron tp2, with
# sequence parallelism, dp2 x tp2, and a non-Megatron strategy file, each
# beside PyTorch DDP (gloo, 2 processes) on the same model and global batch;
# medians of ROUNDS runs, with the median CPU time / wall time of each
# (2.00: both cores busy). DDP's processes are capped to one core each
# (OPENBLAS_NUM_THREADS=1 and OMP_NUM_THREADS=1 before torch is imported;
# its set_num_threads(1) alone leaves Debian's OpenBLAS on every core). The
# host's CPU and the sgemm peak (SGEMM_PEAK, optional) head the table.
# Usage: op_strategy_bench.sh TRAIN_GPT CORPUS MPIRUN DDP_SCRIPT STRATEGIES_DIR [ROUNDS [SGEMM_PEAK]]
set -euo pipefail
TRAIN=$1 CORPUS=$2 MPIRUN=$3 DDP=$4 STRATEGIES=$5 ROUNDS=${6:-5} PEAK=${7:-}
MODEL=(--layers 4 --heads 4 --embed 256 --context 256 --seq 256 --batch 8 --vocab 4096)
STEPS=8
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/lib.sh"
cpu() { cpu_per_wall "$WORK/time"; }  # of the last timed run
run() {  # np flags... -> tokens/s CPU/wall
  local np=$1
  shift
  local t
  t=$(env -u OPENBLAS_CORETYPE /usr/bin/time -f "%e %U %S" -o "$WORK/time" "$MPIRUN" \
    --allow-run-as-root --oversubscribe -np "$np" "$TRAIN" \
    --data "$CORPUS" --quiet --steps $STEPS "${MODEL[@]}" "$@" 2>&1 | awk '/^done/ {print $6}')
  echo "$t $(cpu)"
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
host_line
[ -n "$PEAK" ] && env -u OPENBLAS_CORETYPE "$PEAK" 1 openblas
ddp="" ddp_cpu=""
for _ in $(seq "$ROUNDS"); do
  ddp+=" $(env -u OPENBLAS_CORETYPE OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 \
    /usr/bin/time -f "%e %U %S" -o "$WORK/time" \
    /usr/bin/python3 "$DDP" 4 4 256 256 8 4096 2 $STEPS | awk '{print $2}')"
  ddp_cpu+=" $(cpu)"
done
ddp=$(median <<<"$ddp")
printf "%-52s %10s %8s %9s\n" "L4 C256 H4 T256 B8 V4096, 2 cores, tokens/s" "tessera" "CPU/wall" "vs DDP"
row() {  # label np flags...
  local label=$1 np=$2 all="" cpus="" t c
  shift 2
  for _ in $(seq "$ROUNDS"); do
    read -r t c < <(run "$np" "$@")
    all+=" $t" cpus+=" $c"
  done
  local m
  m=$(median <<<"$all")
  printf "%-52s %10s %8s %8.2fx   (runs:%s)\n" "$label" "$m" "$(median <<<"$cpus")" \
    "$(awk "BEGIN{print $m / $ddp}")" "$all"
}
row "tp2 (Megatron strategy), -np 2" 2 --tp 2
row "tp2 + sequence parallel, -np 2" 2 --tp 2 --sequence-parallel
row "dp2 x tp2 (Megatron), -np 4" 4 --dp 2 --tp 2
row "dp2 x tp2 mlp_batch_split.json, -np 4" 4 --op-strategy "$STRATEGIES/mlp_batch_split.json"
printf "%-52s %10s %8s\n" "PyTorch DDP, gloo, 2 processes of 1 core (peer)" "$ddp" "$(median <<<"$ddp_cpu")"

# Memory per rank with sequence parallelism and recompute (the runtime's own
# accounting: activations at the step's peak; and each process's peak RSS),
# with the time each costs. Deterministic bytes; tokens/s median of ROUNDS.
echo
printf "%-40s %14s %12s %10s %9s\n" "per rank, mpirun" "activations" "peak RSS" "tokens/s" "vs none"
for tp in 2 4; do
  base=""
  for sp in "" "--sequence-parallel"; do
    for rc in none selective full; do
      all="" act="" rss=""
      for _ in $(seq "$ROUNDS"); do
        out=$(env -u OPENBLAS_CORETYPE "$MPIRUN" --allow-run-as-root --oversubscribe -np "$tp" "$TRAIN" \
          --data "$CORPUS" --steps $STEPS "${MODEL[@]}" --tp "$tp" $sp --recompute "$rc" 2>&1)
        all+=" $(awk '/^done/ {print $6}' <<<"$out")"
        act=$(sed -n 's/.*activations \([0-9.]*\) MiB.*/\1/p' <<<"$out")
        rss=$(sed -n 's/.*peak RSS \([0-9.]*\) MiB.*/\1/p' <<<"$out")
      done
      m=$(median <<<"$all")
      [ "$rc" = none ] && base=$m
      printf "%-40s %10s MiB %8s MiB %10s %8.3fx\n" "tp$tp ${sp:+sp }recompute $rc" "$act" "$rss" "$m" \
        "$(awk "BEGIN{print $m / $base}")"
    done
  done
done
