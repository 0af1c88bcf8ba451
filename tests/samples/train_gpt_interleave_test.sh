#!/usr/bin/env bash
# train_gpt with an interleaved pipeline (--virtual-stages, Megatron's
# virtual pipeline stages): every configuration gives the single-process
# loss curve within 1e-5 relative per step (threads, mpirun), micro-batches
# that pp does not divide run, the strategy file's "virtual_stages" pairs
# with the flag, checkpoints saved under V = 2 resume under V = 1, without
# a pipeline and on another pp (and the reverse), and bad interleavings are
# refused saying what would work.
# Usage: train_gpt_interleave_test.sh TRAIN_GPT CORPUS MPIRUN
set -uo pipefail
BIN=$1
CORPUS=$2
MPIRUN=("$3" --allow-run-as-root --oversubscribe)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/../lib.sh"
# Four layers: pp2 x 2 chunks of one (stage 0 holds h.0 and h.2).
SMALL=(--data "$CORPUS" --layers 4 --heads 2 --embed 32 --context 32 --batch 8 --lr 1e-3 --max-norm 0.5)
train() {  # train LOG [mpi] FLAGS...
  local log=$1 launch=()
  shift
  if [ "${1:-}" = mpi ]; then launch=("${MPIRUN[@]}" -np 2); shift; fi
  "${launch[@]}" "$BIN" "${SMALL[@]}" "$@" >"$log" 2>&1
}

train "$WORK/one.log" --steps 20
check "single-process reference" test $? -eq 0
for setting in "--ranks 2 --pp 2 --virtual-stages 2 --micro-batches 2" \
  "--ranks 2 --pp 2 --virtual-stages 2 --micro-batches 4" \
  "--ranks 2 --pp 2 --virtual-stages 2 --micro-batches 8" \
  "--ranks 4 --pp 2 --tp 2 --virtual-stages 2 --micro-batches 4" \
  "--ranks 4 --pp 2 --tp 2 --sequence-parallel --virtual-stages 2 --micro-batches 2" \
  "--ranks 4 --dp 2 --pp 2 --zero 1 --virtual-stages 2 --micro-batches 4" \
  "mpi --pp 2 --virtual-stages 2 --micro-batches 4"; do
  # shellcheck disable=SC2086
  train "$WORK/par.log" $setting --steps 20
  check "$setting: the single-process losses" close "$WORK/par.log" "$WORK/one.log" 20
done
check "... and says its schedule" \
  grep -q "pipeline: pp=2 stages x 2 chunks, 4 micro-batches per dp rank (interleaved 1F1B)" \
  "$WORK/par.log"
# Micro-batches that pp does not divide: groups of at least pp micro-batches.
SMALL[11]=6  # --batch 6
train "$WORK/one6.log" --steps 20
train "$WORK/m3.log" --ranks 2 --pp 2 --virtual-stages 2 --micro-batches 3 --steps 20
check "3 micro-batches on pp2 x 2 chunks: the single-process losses" \
  close "$WORK/m3.log" "$WORK/one6.log" 20
SMALL[11]=8
# Eight layers on pp4 x 2 chunks, 6 micro-batches (not a multiple of 4).
SMALL[3]=8  # --layers 8
train "$WORK/one8.log" --steps 20
train "$WORK/pp4.log" --ranks 4 --pp 4 --virtual-stages 2 --micro-batches 8 --steps 20
check "pp4 x 2 chunks, 8 layers: the single-process losses" close "$WORK/pp4.log" "$WORK/one8.log" 20
SMALL[11]=12
train "$WORK/one12.log" --steps 20
train "$WORK/pp4m6.log" --ranks 4 --pp 4 --virtual-stages 2 --micro-batches 6 --steps 20
check "pp4 x 2 chunks, 6 micro-batches: the single-process losses" \
  close "$WORK/pp4m6.log" "$WORK/one12.log" 20
SMALL[3]=4
SMALL[11]=8

# The strategy file's key pairs with the flag.
printf '{"format": "tessera.op_strategy", "mesh": {"pp": 2}, "virtual_stages": 2, "micro_batches": 4, "operators": {}}' \
  >"$WORK/v2.json"
train "$WORK/file.log" --ranks 2 --op-strategy "$WORK/v2.json" --steps 20 --print-op-strategy
check "\"virtual_stages\": 2 in the strategy file: the single-process losses" \
  close "$WORK/file.log" "$WORK/one.log" 20
check "... and --print-op-strategy shows each chunk's layers" \
  grep -q "^stage 0 chunk 1 (layers 2 to 2):" "$WORK/file.log"
out=$("$BIN" "${SMALL[@]}" --steps 1 --ranks 2 --op-strategy "$WORK/v2.json" --virtual-stages 1 2>&1)
check "... a flag that disagrees with it is named" \
  grep -q "sets virtual-stages 2 but --virtual-stages is 1" <<<"$out"

# Resume across V: saved with V = 2, resumed with V = 1, without a
# pipeline, on pp4; and the reverse.
V2="--ranks 2 --pp 2 --virtual-stages 2 --micro-batches 4"
resumed "saved under pp2 x 2 chunks, resumed under pp2 (V = 1)" r1 "$V2" "--ranks 2 --pp 2"
resumed "saved under pp2 x 2 chunks (sliced), resumed on one rank" r2 "$V2 --save-mode sliced" ""
resumed "saved under pp2 x 2 chunks (sliced), resumed on pp4" r3 "$V2 --save-mode sliced" \
  "--ranks 4 --pp 4 --micro-batches 4"
resumed "saved on one rank, resumed under pp2 x 2 chunks with tp2" r4 "" \
  "--ranks 4 --pp 2 --tp 2 --virtual-stages 2 --micro-batches 4"
resumed "saved under tp2 x pp2 (sliced), resumed under mpirun pp2 x 2 chunks" r5 \
  "--ranks 4 --tp 2 --pp 2 --save-mode sliced" "mpi --pp 2 --virtual-stages 2 --micro-batches 2"

# Bad interleavings: named, with what would work.
out=$("$BIN" "${SMALL[@]}" --steps 1 --ranks 2 --pp 2 --virtual-stages 2 --micro-batches 1 2>&1)
check "fewer micro-batches than stages are refused" \
  grep -q "1 micro-batches are fewer than the 2 stages; use at least 2 micro-batches" <<<"$out"
SMALL[3]=6
out=$("$BIN" "${SMALL[@]}" --steps 1 --ranks 2 --pp 2 --virtual-stages 2 2>&1)
SMALL[3]=4
check "layers that do not cut into pp x V chunks are refused" \
  grep -q "6 layers do not cut into pp 2 x virtual_stages 2 = 4 equal chunks: use virtual_stages 1, 3" \
  <<<"$out"
out=$("$BIN" "${SMALL[@]}" --steps 1 --virtual-stages 2 2>&1)
check "virtual stages without a pipeline are refused" grep -q "it needs pp > 1" <<<"$out"
test $fails -eq 0
