#!/usr/bin/env bash
# Tokens/s of the GPT training step (forward, backward, AdamW with
# clipping): train_gpt beside PyTorch on the same model, batch, sequence and
# threads, plus OpenBLAS's sgemm ceiling. OPENBLAS_CORETYPE is unset for
# both sides (it can force slower kernels; see runtime/kernels.h), and the
# forced-Haswell figure is printed too for the small model.
# Usage: gpt_bench.sh TRAIN_GPT SGEMM_PEAK TORCH_SCRIPT CORPUS
set -euo pipefail
TRAIN=$1 PEAK=$2 TORCH=$3 CORPUS=$4
ours() {  # threads steps layers heads embed seq batch vocab
  env -u OPENBLAS_CORETYPE "$TRAIN" --data "$CORPUS" --quiet --threads "$1" --steps "$2" \
    --layers "$3" --heads "$4" --embed "$5" --context "$6" --seq "$6" --batch "$7" --vocab "$8" |
    awk '/^done/ {print $6}'
}
theirs() {
  env -u OPENBLAS_CORETYPE /usr/bin/python3 "$TORCH" "$3" "$4" "$5" "$6" "$7" "$8" "$1" "$2" |
    awk '{print $2}'
}
for t in 1 2; do env -u OPENBLAS_CORETYPE "$PEAK" "$t" | tail -1; done
printf "%-34s %7s %12s %12s %7s\n" model threads "tessera" "PyTorch" ratio
run() {  # label steps layers heads embed seq batch vocab
  local label=$1 steps=$2
  shift 2
  for t in 1 2; do
    local a b
    a=$(ours "$t" "$steps" "$@")
    b=$(theirs "$t" "$steps" "$@")
    printf "%-34s %7s %9s t/s %9s t/s %6.2fx\n" "$label" "$t" "$a" "$b" "$(awk "BEGIN{print $a / $b}")"
  done
}
run "L4 C256 H4 T256 B8 V4096" 6 4 4 256 256 8 4096
haswell=$(OPENBLAS_CORETYPE=Haswell "$TRAIN" --data "$CORPUS" --quiet --threads 2 --steps 6 \
  --layers 4 --heads 4 --embed 256 --context 256 --batch 8 --vocab 4096 2>/dev/null |
  awk '/^done/ {print $6}')
echo "  (same, 2 threads, OPENBLAS_CORETYPE=Haswell forced: $haswell t/s)"
run "GPT-2 124M (L12 C768 H12) T256 B4" 3 12 12 768 256 4 50257
