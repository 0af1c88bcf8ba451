#!/usr/bin/env bash
# Tensor parallelism through operator strategies (OpGpt) beside the
# hand-written Megatron path it replaces (--legacy-tp), on the same model,
# batch and processes: tp2 (mpirun -np 2) and dp2 x tp2 (mpirun -np 4),
# the two alternating A B A B ... ROUNDS times each; medians of tokens/s.
# Then Megatron with sequence parallelism beside it.
# Usage: op_strategy_bench.sh TRAIN_GPT CORPUS MPIRUN [ROUNDS]
set -euo pipefail
TRAIN=$1 CORPUS=$2 MPIRUN=$3 ROUNDS=${4:-5}
MODEL=(--layers 4 --heads 4 --embed 256 --context 256 --seq 256 --batch 8 --vocab 4096)
STEPS=8
run() {  # np flags... -> tokens/s
  local np=$1
  shift
  env -u OPENBLAS_CORETYPE "$MPIRUN" --allow-run-as-root --oversubscribe -np "$np" "$TRAIN" \
    --data "$CORPUS" --quiet --steps $STEPS "${MODEL[@]}" "$@" 2>&1 | awk '/^done/ {print $6}'
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
printf "%-44s %12s %12s %8s\n" "L4 C256 H4 T256 B8 V4096, 2 cores" "operators" "hand-written" "ratio"
compare() {  # label np flags...
  local label=$1 np=$2 a="" b=""
  shift 2
  for _ in $(seq "$ROUNDS"); do
    a+=" $(run "$np" "$@")"
    b+=" $(run "$np" "$@" --legacy-tp)"
  done
  local ma mb
  ma=$(median <<<"$a")
  mb=$(median <<<"$b")
  printf "%-44s %12s %12s %7.3fx\n" "$label" "$ma" "$mb" "$(awk "BEGIN{print $ma / $mb}")"
  echo "  tokens/s, operators:$a"
  echo "  tokens/s, hand-written:$b"
}
compare "tp2, mpirun -np 2 (median of $ROUNDS)" 2 --tp 2
compare "dp2 x tp2, mpirun -np 4 (median of $ROUNDS)" 4 --dp 2 --tp 2
sp=""
plain=""
for _ in $(seq "$ROUNDS"); do
  sp+=" $(run 2 --tp 2 --sequence-parallel)"
  plain+=" $(run 2 --tp 2)"
done
printf "%-44s %12s %12s %7.3fx\n" "tp2 sequence parallel vs not (operators)" "$(median <<<"$sp")" \
  "$(median <<<"$plain")" "$(awk "BEGIN{print $(median <<<"$sp") / $(median <<<"$plain")}")"
