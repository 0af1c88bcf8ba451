#!/usr/bin/env bash
# train_gpt with multi-copy parallelism (--micro-batch-interleave N,
# MindSpore's MicroBatchInterleaved): every configuration gives the
# single-process loss curve within 1e-5 relative per step, as threads,
# under mpirun and over Gloo (tessera-run); the strategy file's
# "micro_batch_interleave" pairs with the flag; the timeline shows the
# copies' collectives in flight (IAllReduce, IReduceScatter, IAllGather);
# checkpoints saved with V = 2 and N = 2 resume with V = 1 and N = 1, on
# another mesh; bad settings are refused saying what would work.
# ckpt auto-parallel --why prices copies, and a plan with copies written
# by it trains.
# Usage: train_gpt_multicopy_test.sh TRAIN_GPT CORPUS MPIRUN TESSERA_RUN CKPT
set -uo pipefail
BIN=$1
CORPUS=$2
MPIRUN=("$3" --allow-run-as-root --oversubscribe)
RUN=$4
CKPT=$5
PROFILE="$(dirname "$0")/../../samples/gpt/profiles/debian-vm-2core.json"
WORK=$(mktemp -d)
trap 'pkill -9 -P $$ 2>/dev/null; rm -rf "$WORK"' EXIT
source "$(dirname "$0")/../lib.sh"
SMALL=(--data "$CORPUS" --layers 4 --heads 2 --embed 32 --context 32 --batch 8 --lr 1e-3 --max-norm 0.5)
train() {  # train LOG [mpi|gloo] FLAGS...
  local log=$1 launch=()
  shift
  if [ "${1:-}" = mpi ]; then launch=("${MPIRUN[@]}" -np 2); shift; fi
  if [ "${1:-}" = gloo ]; then launch=(timeout 300 "$RUN" --nproc-per-node 2 --); shift; fi
  "${launch[@]}" "$BIN" "${SMALL[@]}" "$@" >"$log" 2>&1
}

train "$WORK/one.log" --steps 20
check "single-process reference" test $? -eq 0
for setting in "--ranks 2 --tp 2 --micro-batch-interleave 2" \
  "--ranks 2 --tp 2 --sequence-parallel --micro-batch-interleave 2" \
  "--ranks 4 --dp 2 --tp 2 --zero 1 --micro-batch-interleave 2" \
  "--ranks 4 --pp 2 --tp 2 --micro-batches 2 --micro-batch-interleave 2" \
  "--ranks 2 --tp 2 --micro-batch-interleave 4" \
  "mpi --tp 2 --micro-batch-interleave 2" \
  "mpi --tp 2 --sequence-parallel --micro-batch-interleave 2"; do
  # shellcheck disable=SC2086
  train "$WORK/par.log" $setting --steps 20
  check "$setting: the single-process losses" close "$WORK/par.log" "$WORK/one.log" 20
done
train "$WORK/gloo.out" gloo --tp 2 --sequence-parallel --micro-batch-interleave 2 --steps 20 \
  --trace "$WORK/gtr"
rank0 "$WORK/gloo.out" >"$WORK/gloo.log"
check "tessera-run (gloo) --tp 2 --sequence-parallel --micro-batch-interleave 2: the single-process losses" \
  close "$WORK/gloo.log" "$WORK/one.log" 20
check "... and says it runs copies" \
  grep -q "multi-copy: 2 copies per micro-batch" "$WORK/gloo.log"
check "... and each Gloo rank writes its timeline (--trace)" /usr/bin/python3 \
  "$(dirname "$0")/check_trace.py" "$WORK/gtr" 2 step forward backward comm optimizer

# The strategy file's key pairs with the flag.
printf '{"format": "tessera.op_strategy", "mesh": {"tp": 2}, "micro_batch_interleave": 2, "operators": {}}' \
  >"$WORK/n2.json"
train "$WORK/file.log" --ranks 2 --tp 2 --op-strategy "$WORK/n2.json" --steps 20
check "\"micro_batch_interleave\": 2 in the strategy file: the single-process losses" \
  close "$WORK/file.log" "$WORK/one.log" 20
check "... and runs copies" grep -q "multi-copy: 2 copies per micro-batch" "$WORK/file.log"
out=$("$BIN" "${SMALL[@]}" --steps 1 --ranks 2 --tp 2 --op-strategy "$WORK/n2.json" --micro-batch-interleave 1 2>&1)
check "... a flag that disagrees with it is named" \
  grep -q "sets micro-batch-interleave 2 but --micro-batch-interleave is 1" <<<"$out"

# The timeline: each copy's collectives from issue to completion, on the
# copies' own threads.
train "$WORK/tr.log" --ranks 2 --tp 2 --sequence-parallel --micro-batch-interleave 2 --steps 3 \
  --trace "$WORK/tr"
check "--trace with copies" /usr/bin/python3 "$(dirname "$0")/check_trace.py" "$WORK/tr" 2 \
  step forward backward comm
check "... holds the copies' non-blocking collectives" \
  /usr/bin/python3 -c "
import json, sys
ev = json.load(open('$WORK/tr.rank1.json'))['traceEvents']
names = {e['name'].split(' ')[0] for e in ev if e['ph'] == 'X' and e['cat'] == 'comm'}
tids = {e['tid'] for e in ev if e['ph'] == 'X' and e['cat'] == 'forward'}
assert {'IReduceScatter', 'IAllGather'} <= names, names
assert len(tids) >= 2, tids
"

# Resume across V and N: saved with V = 2 and N = 2, resumed with V = 1
# and N = 1 on one rank, and on dp2 x tp2.
VN="--ranks 4 --pp 2 --tp 2 --virtual-stages 2 --micro-batches 2 --micro-batch-interleave 2"
resumed "saved under pp2 x 2 chunks x tp2 with 2 copies (sliced), resumed on one rank" r1 \
  "$VN --save-mode sliced" ""
resumed "saved under pp2 x 2 chunks x tp2 with 2 copies, resumed under dp2 x tp2 (V = 1, N = 1)" r2 \
  "$VN" "--ranks 4 --dp 2 --tp 2"
resumed "saved on one rank, resumed under tp2 with 2 copies" r3 "" \
  "--ranks 2 --tp 2 --micro-batch-interleave 2"

# The cost model: --why prices copies beside the plan found, and says how
# much tp communication they leave exposed.
"$CKPT" auto-parallel --profile "$PROFILE" --devices 2 --mode fast --layers 4 --heads 2 --embed 32 \
  --context 32 --vocab 256 --batch 8 --why "pp=1,dp=1,tp=2,micro_batch_interleave=2" \
  >"$WORK/why.log" 2>&1
check "ckpt auto-parallel --why micro_batch_interleave=2: priced" \
  grep -q "^why not pp=1,dp=1,tp=2,micro_batch_interleave=2: predicted step" "$WORK/why.log"
"$CKPT" auto-parallel --profile "$PROFILE" --devices 2 --mode fast --layers 4 --heads 2 --embed 32 \
  --context 32 --vocab 256 --batch 8 --why "pp=1,dp=1,tp=2,micro_batch_interleave=3" \
  >"$WORK/why3.log" 2>&1
check "... 3 copies of 8 sequences: cannot run, saying why" \
  grep -q "does not cut into 3 copies" "$WORK/why3.log"

# Bad settings: named, with what would work.
out=$("$BIN" "${SMALL[@]}" --steps 1 --ranks 2 --dp 2 --micro-batch-interleave 2 2>&1)
check "copies without tp are refused" grep -q "with tp 1 there are none" <<<"$out"
out=$("$BIN" "${SMALL[@]}" --steps 1 --ranks 2 --tp 2 --micro-batch-interleave 3 2>&1)
check "micro-batches that do not cut into copies are refused" \
  grep -q "a micro-batch of 8 sequences per dp rank does not cut into 3 copies of whole sequences" \
  <<<"$out"
test $fails -eq 0
