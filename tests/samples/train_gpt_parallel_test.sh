#!/usr/bin/env bash
# train_gpt on several ranks: data, tensor and pipeline parallel (with and
# without ZeRO-1) as threads (--ranks) and as processes (mpirun) gives the
# single-process loss curve within 1e-5 relative per step; a checkpoint
# saved on one layout resumes on another (2 ranks with ZeRO-1 -> 1 rank,
# 1 rank -> 2 MPI processes, pp2 -> 1 rank, 1 rank -> pp2 under mpirun,
# dp2 x tp2 with ZeRO-1 -> tp2 under mpirun, tp2 x pp2 -> 1 rank; sliced
# saves, where every rank writes its own pieces: dp2 x tp2 x pp2 with
# ZeRO-1 -> 1 rank, tp2 under mpirun -> dp2 x pp2; async saves under
# mpirun -> 1 rank) and continues the curve; a sliced save verifies and
# equals the merged one, an async save the sliced one; --trace writes each
# rank's timeline and changes no number; bad settings are named.
# Usage: train_gpt_parallel_test.sh TRAIN_GPT CORPUS MPIRUN CKPT
set -uo pipefail
BIN=$1
CORPUS=$2
CKPT=$4
MPIRUN=("$3" --allow-run-as-root --oversubscribe)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/../lib.sh"
SMALL=(--data "$CORPUS" --layers 2 --heads 2 --embed 32 --context 32 --batch 8 --lr 1e-3 --max-norm 0.5)

"$BIN" "${SMALL[@]}" --steps 30 >"$WORK/one.log" 2>&1
check "single-process reference" test $? -eq 0
for setting in "--ranks 2" "--ranks 2 --zero 1" "--ranks 4 --zero 1 --bucket-mib 0.01" \
  "--ranks 2 --pp 2" "--ranks 4 --pp 2 --zero 1 --micro-batches 4" "--ranks 2 --tp 2" \
  "--ranks 4 --tp 2 --pp 2 --zero 1"; do
  # shellcheck disable=SC2086
  "$BIN" "${SMALL[@]}" --steps 30 $setting >"$WORK/par.log" 2>&1
  check "$setting: the single-process losses" close "$WORK/par.log" "$WORK/one.log"
done
# --auto-parallel: the search's choice on this machine's shipped profile
# (deterministic: the same file, the same choice), trained, reproduces the
# single-process losses; a budget nothing fits is refused with nothing run.
PROFILE="$(dirname "$0")/../../samples/gpt/profiles/debian-vm-2core.json"
for budget in "400KiB:pp=2,dp=1,tp=2 micro_batches=8 zero=0 recompute=none [ln_1 whole, c_attn col" \
  "2MiB:pp=2,dp=2,tp=1 micro_batches=1 zero=1 recompute=none [data parallel]"; do
  "$BIN" "${SMALL[@]}" --steps 30 --ranks 4 --auto-parallel fast --profile "$PROFILE" \
    --rank-memory "${budget%%:*}" >"$WORK/auto.log" 2>&1
  check "--auto-parallel fast --rank-memory ${budget%%:*}: chooses ${budget#*:}" \
    grep -qF "): ${budget#*:}" "$WORK/auto.log"
  check "... and reproduces the single-process losses" close "$WORK/auto.log" "$WORK/one.log"
done
"$BIN" "${SMALL[@]}" --steps 30 --ranks 4 --auto-parallel fast --profile "$PROFILE" \
  --rank-memory 300KiB >"$WORK/auto.log" 2>&1
check "--auto-parallel under a budget nothing fits: refused" test $? -ne 0
check "... saying the least any configuration needs" \
  grep -q "fits 300.0 KiB per rank; the least memory any needs is" "$WORK/auto.log"
check "... with nothing run" test "$(grep -c "^step" "$WORK/auto.log")" = 0
# ckpt auto-parallel searches on paper (exact), writes the operator
# strategy train_gpt then runs (the single-process losses again), the
# checkpoint layouts train_gpt's --strategy-out writes for that run, and
# answers "why not" with the alternative's predicted cost.
"$CKPT" auto-parallel --profile "$PROFILE" --devices 4 --mode exact --layers 2 --heads 2 --embed 32 \
  --context 32 --vocab 256 --batch 8 --rank-memory 400KiB --write-op-strategy "$WORK/auto.json" \
  --write-strategy "$WORK/auto.layouts.json" --why "pp=1,dp=4,tp=1,zero=1" >"$WORK/search.log" 2>&1
check "ckpt auto-parallel --mode exact: a plan within the budget" grep -q "^chosen: pp=" "$WORK/search.log"
check "... answers why not pp=1,dp=4 (over the budget)" grep -q "over the 400.0 KiB budget" "$WORK/search.log"
check "... and says where a micro-batch's time goes, operator by operator" grep -q "^  h.0.mlp.c_fc " "$WORK/search.log"
"$BIN" "${SMALL[@]}" --steps 30 --ranks 4 --op-strategy "$WORK/auto.json" \
  --strategy-out "$WORK/run.layouts.json" >"$WORK/auto.log" 2>&1
check "... its strategy file trains with the single-process losses" close "$WORK/auto.log" "$WORK/one.log"
check "... and its checkpoint layouts are the run's" cmp -s "$WORK/auto.layouts.json" "$WORK/run.layouts.json"
"$BIN" "${SMALL[@]}" --ranks 4 --auto-parallel fast --tp 2 >"$WORK/auto.log" 2>&1
check "--auto-parallel with --tp: refused" grep -q "auto-parallel chooses tp: drop --tp" "$WORK/auto.log"
"$BIN" --ranks 2 --calibrate "$WORK/profile.json" --quiet >"$WORK/cal.log" 2>&1
check "--calibrate writes a profile" grep -q '"format": "tessera.machine_profile"' "$WORK/profile.json"
check "... with every kernel measured" test "$(python3 -c 'import json, sys
print(len(json.load(open(sys.argv[1]))["kernels"]))' "$WORK/profile.json")" = 15
check "... and the pipeline transfer's table" grep -q '"kind": "SendRecv"' "$WORK/profile.json"
"$BIN" "${SMALL[@]}" --steps 0 --ranks 2 --auto-parallel fast --profile "$WORK/profile.json" \
  >"$WORK/auto.log" 2>&1
check "... that --auto-parallel reads" grep -q "profile calibrated" "$WORK/auto.log"
"${MPIRUN[@]}" -np 2 "$BIN" "${SMALL[@]}" --steps 30 --zero 1 >"$WORK/mpi.log" 2>&1
check "mpirun -np 2 --zero 1: the single-process losses" close "$WORK/mpi.log" "$WORK/one.log"
check "mpirun run says its ranks" grep -q "ranks: 2 (mpi), dp=2 zero=1" "$WORK/mpi.log"
"${MPIRUN[@]}" -np 4 "$BIN" "${SMALL[@]}" --steps 30 --pp 2 --zero 1 >"$WORK/mpipp.log" 2>&1
check "mpirun -np 4 --pp 2 --zero 1 (dp2 x pp2): the single-process losses" \
  close "$WORK/mpipp.log" "$WORK/one.log"
check "... and says its pipeline" grep -q "pipeline: pp=2 stages, 2 micro-batches" "$WORK/mpipp.log"
"${MPIRUN[@]}" -np 4 "$BIN" "${SMALL[@]}" --steps 30 --dp 2 --tp 2 --pp 1 --zero 1 \
  >"$WORK/mpitp.log" 2>&1
check "mpirun -np 4 --dp 2 --tp 2 --pp 1 --zero 1: the single-process losses" \
  close "$WORK/mpitp.log" "$WORK/one.log"
check "... and says its tensor parallelism" grep -q "tensor parallel: tp=2" "$WORK/mpitp.log"

# Operator strategies: Megatron with sequence parallelism, the shipped
# files (in-process ranks and mpirun).
STRATEGIES=$(cd "$(dirname "$0")/../../samples/gpt/strategies" && pwd)
for setting in "--ranks 2 --tp 2 --sequence-parallel" \
  "--ranks 4 --tp 2 --pp 2 --zero 1 --sequence-parallel" \
  "--ranks 4 --op-strategy $STRATEGIES/mlp_batch_split.json" \
  "--ranks 2 --tp 2 --sequence-parallel --recompute selective" \
  "--ranks 4 --dp 2 --tp 2 --recompute full --dataset-strategy full_batch" \
  "--ranks 2 --dataset-strategy full_batch"; do
  # shellcheck disable=SC2086
  "$BIN" "${SMALL[@]}" --steps 30 $setting >"$WORK/par.log" 2>&1
  check "$setting: the single-process losses" close "$WORK/par.log" "$WORK/one.log"
done
"${MPIRUN[@]}" -np 4 "$BIN" "${SMALL[@]}" --steps 30 --op-strategy "$STRATEGIES/megatron_sp.json" \
  --dp 2 --tp 2 --zero 1 >"$WORK/mpisp.log" 2>&1
check "mpirun -np 4, megatron_sp.json on dp2 x tp2 with ZeRO-1: the single-process losses" \
  close "$WORK/mpisp.log" "$WORK/one.log"
check "... and says its strategy" grep -q "tensor parallel: tp=2 (operator strategy .*megatron_sp.json)" \
  "$WORK/mpisp.log"
check "... and what each rank holds" \
  grep -q "memory per rank (largest): parameters .* activations .* (peak of a step), .* peak RSS" \
  "$WORK/mpisp.log"
"${MPIRUN[@]}" -np 2 "$BIN" "${SMALL[@]}" --steps 30 --tp 2 --sequence-parallel --recompute full \
  >"$WORK/mpirc.log" 2>&1
check "mpirun -np 2, tp2 sequence parallel with full recompute: the single-process losses" \
  close "$WORK/mpirc.log" "$WORK/one.log"
printf '{"format": "tessera.op_strategy", "dataset_strategy": [[2, 1], [2, 1]], "operators": {}}' \
  >"$WORK/data.json"
"$BIN" "${SMALL[@]}" --steps 30 --ranks 4 --tp 2 --op-strategy "$WORK/data.json" >"$WORK/data.log" 2>&1
check "a dataset_strategy [[2, 1], [2, 1]] file on dp2 x tp2: the single-process losses" \
  close "$WORK/data.log" "$WORK/one.log"
out=$("$BIN" "${SMALL[@]}" --steps 1 --op-strategy "$WORK/data.json" 2>&1)
check "... refused where dp is not 2" grep -q "dataset_strategy cuts the batch 2 ways, but dp is 1" <<<"$out"
"$BIN" "${SMALL[@]}" --steps 0 --ranks 4 --op-strategy "$STRATEGIES/mlp_batch_split.json" \
  --print-op-strategy >"$WORK/print.log" 2>&1
check "the file's mesh and zero apply" grep -q "ranks: 4 (inprocess), dp=2 zero=1" "$WORK/print.log"
check "--print-op-strategy shows each operator's strategy" \
  grep -q "h.1.mlp.c_fc \[linear\] ((dp\*tp, -), (-, -))" "$WORK/print.log"
check "... the redistributions inserted, with their collectives and bytes" \
  grep -q "forward  h.0.mlp.c_proj -> h.0.add_2 input 1: AllGather, 8.0 KiB (rows/tp -> replicated)" \
  "$WORK/print.log"
check "... their duals in backward" \
  grep -q "backward h.0.ln_2 -> h.0.mlp.c_fc: AllGather" "$WORK/print.log"
check "... and the parameters' layouts" \
  grep -q "h.0.mlp.c_fc.weight: shape \[32, 128\] f32$" "$WORK/print.log"
# A bad file: named, nothing run, nothing saved.
printf '{"format": "tessera.op_strategy", "operators": {"h.*.mlp.c_fx": [["dp", null], [null, "tp"]]}}' \
  >"$WORK/bad.json"
"$BIN" "${SMALL[@]}" --steps 5 --ranks 2 --tp 2 --op-strategy "$WORK/bad.json" --save "$WORK/bad" \
  >"$WORK/bad.log" 2>&1
check "a bad strategy file fails" test $? -ne 0
check "... naming the file and the operator" \
  grep -q "$WORK/bad.json: 'h.\*.mlp.c_fx' names no operator of the model" "$WORK/bad.log"
check "... with nothing trained or saved" test ! -e "$WORK/bad" -a "$(grep -c '^step' "$WORK/bad.log")" = 0
printf '{"format": "tessera.strategy", "tensors": {}}' >"$WORK/layout.json"
out=$("$BIN" "${SMALL[@]}" --steps 1 --op-strategy "$WORK/layout.json" 2>&1)
check "a layout strategy file is refused by name" grep -q "this is a layout strategy file" <<<"$out"
out=$("$BIN" "${SMALL[@]}" --steps 1 --ranks 4 --tp 4 --op-strategy "$STRATEGIES/mlp_batch_split.json" 2>&1)
check "a file's mesh that is not the job's is named" \
  grep -q "mlp_batch_split.json sets tp 2 but --tp is 4" <<<"$out"

# resumed NAME DIR "SAVE FLAGS" "RESUME FLAGS": one run saves at step 12,
# another resumes from it to 30; together they must give the
# single-process curve. A flag list starting with "mpi" runs under
# mpirun -np 2.
train() {  # train LOG [mpi] FLAGS...
  local log=$1 launch=()
  shift
  if [ "${1:-}" = mpi ]; then launch=("${MPIRUN[@]}" -np 2); shift; fi
  "${launch[@]}" "$BIN" "${SMALL[@]}" "$@" >"$log" 2>&1
}
RESUME_AT=12 RESUME_TO=30  # resumed (tests/lib.sh)
# 2 ranks with ZeRO-1 save; one rank resumes.
resumed "resume on 1 rank from a 2-rank ZeRO checkpoint continues the loss curve" ck \
  "--ranks 2 --zero 1" ""
check "... and says where it resumed" grep -q "resumed from step 12" "$WORK/ck.resume.log"
# One rank saves; two MPI processes with ZeRO-1 resume.
resumed "resume on 2 MPI ranks with ZeRO-1 from a 1-rank checkpoint" ck2 "" "mpi --zero 1"
# Pipeline: 2 stages save (rank 0 gathers both stages); one rank resumes.
# And back: one rank's checkpoint resumed on 2 MPI stages.
resumed "resume on 1 rank from a pp2 checkpoint continues the curve" ck3 "--ranks 2 --pp 2" ""
resumed "resume on 2 MPI pipeline stages from a 1-rank checkpoint" ck4 "" "mpi --pp 2"
# Tensor parallel: rank 0 gathers the slices; each resuming rank reads its own.
resumed "resume on 2 MPI tp ranks from a dp2 x tp2 ZeRO-1 checkpoint" ck5 \
  "--ranks 4 --dp 2 --tp 2 --zero 1" "mpi --tp 2"
resumed "resume on 1 rank from a tp2 x pp2 checkpoint" ck6 "--ranks 4 --tp 2 --pp 2" ""
# Sliced saves: every rank writes its own pieces; any mesh resumes.
resumed "resume on 1 rank from a sliced dp2 x tp2 x pp2 ZeRO-1 checkpoint" ck7 \
  "--ranks 8 --dp 2 --tp 2 --pp 2 --zero 1 --save-mode sliced" ""
check "... whose 8 data files are there" test "$(ls "$WORK"/ck7/step-12/data-*.tsr | wc -l)" -eq 8
resumed "resume on dp2 x pp2 from a sliced save of 2 MPI tp ranks" ck8 \
  "mpi --tp 2 --save-mode sliced" "--ranks 4 --pp 2 --zero 1 --save-mode sliced"
# Across strategies: tp2 with sequence parallelism <-> data parallel only,
# and on to another strategy file.
resumed "resume data parallel from a tp2 sequence-parallel checkpoint" ck10 \
  "--ranks 2 --tp 2 --sequence-parallel" "--ranks 2"
resumed "resume tp2 sequence-parallel from a data-parallel checkpoint" ck11 \
  "--ranks 2 --save-mode sliced" "--ranks 2 --tp 2 --sequence-parallel"
resumed "resume under mlp_batch_split.json from a tp2 sequence-parallel checkpoint" ck12 \
  "--ranks 2 --tp 2 --sequence-parallel --save-mode sliced" \
  "--ranks 4 --op-strategy $STRATEGIES/mlp_batch_split.json"
# --keep 2: only the two newest saves stay, latest on the newest.
train "$WORK/keep.log" --ranks 2 --tp 2 --steps 12 --save-every 3 --keep 2 --save-mode sliced \
  --save "$WORK/keep"
check "--keep 2 leaves step-9 and step-12" test "$(cd "$WORK/keep" && echo step-*)" = "step-12 step-9"
check "... with latest on step-12" grep -qx step-12 "$WORK/keep/latest"
# The sliced and the merged save of the same state hold the same numbers.
train "$WORK/m.log" --ranks 4 --dp 2 --tp 2 --zero 1 --steps 6 --save "$WORK/merged"
train "$WORK/s.log" --ranks 4 --dp 2 --tp 2 --zero 1 --steps 6 --save "$WORK/sliced" --save-mode sliced
"$CKPT" verify "$WORK/sliced" >"$WORK/verify.log" 2>&1
check "ckpt verify passes on a sliced save" test $? -eq 0
"$CKPT" diff "$WORK/merged/step-6" "$WORK/sliced/step-6" >"$WORK/diff.log" 2>&1
check "a sliced save equals the merged save of the same run (ckpt diff)" test $? -eq 0
# Async saves: written in the background, committed at a later step.
train "$WORK/a.log" --ranks 4 --dp 2 --tp 2 --zero 1 --steps 6 --save "$WORK/async" --async-save \
  --save-every 2
"$CKPT" diff "$WORK/sliced/step-6" "$WORK/async/step-6" >"$WORK/adiff.log" 2>&1
check "an async save equals the synchronous sliced save (ckpt diff)" test $? -eq 0
check "... and reports its stall and background time" \
  grep -q "saved .*/step-2 (async: training stalled .* ms, written in the background in" "$WORK/a.log"
check "... every save committed, latest on the last" grep -qx step-6 "$WORK/async/latest"
resumed "resume on 1 rank from async saves of 2 MPI tp ranks" ck9 \
  "mpi --tp 2 --async-save --save-every 4" ""
# Merged saves: every rank writes its pieces into the one data file (no
# gather); whole tensors on one rank in the manifest; async too, and by
# several processes into one file under mpirun.
check "a merged save is one data file" test "$(ls "$WORK"/merged/step-6/data-*.tsr | wc -l)" -eq 1
"$CKPT" inspect "$WORK/merged/step-6" >"$WORK/inspect.log" 2>&1
check "... whose manifest holds whole tensors on one rank" grep -q "^mesh *\[r=1\] (1 ranks)" "$WORK/inspect.log"
"$CKPT" verify "$WORK/merged" >"$WORK/verify.log" 2>&1
check "ckpt verify passes on a merged save" test $? -eq 0
for format in safetensors mindspore; do
  "$CKPT" merge "$WORK/merged/step-6" -o "$WORK/m.$format" --format "$format" --quiet &&
    "$CKPT" merge "$WORK/sliced/step-6" -o "$WORK/s.$format" --format "$format" --quiet
  check "ckpt merge --format $format of it: the file the sliced save gives, byte for byte" \
    diff -r "$WORK/m.$format" "$WORK/s.$format"
done
train "$WORK/am.log" --ranks 4 --dp 2 --tp 2 --zero 1 --steps 6 --save "$WORK/amerged" \
  --async-save --save-mode merged --save-every 3
"$CKPT" diff "$WORK/merged/step-6" "$WORK/amerged/step-6" >"$WORK/amdiff.log" 2>&1
check "an async merged save equals the synchronous one (ckpt diff)" test $? -eq 0
resumed "resume on 1 rank from async merged saves of 2 MPI tp ranks (one file, two processes)" \
  ck13 "mpi --tp 2 --pp 1 --async-save --save-mode merged --save-every 4" ""
out=$("$BIN" "${SMALL[@]}" --steps 1 --save-mode merged --redundancy replicas:2 --save "$WORK/x" 2>&1)
check "--redundancy with a merged save is refused" grep -q "needs --save-mode sliced" <<<"$out"

out=$("$BIN" --data "$CORPUS" --layers 1 --heads 2 --embed 32 --context 32 --batch 3 --steps 1 \
  --ranks 2 2>&1)
check "a batch that dp does not divide is named" grep -q "batch 3 is not a multiple of dp 2" <<<"$out"
out=$("$BIN" "${SMALL[@]}" --steps 1 --ranks 2 --dp 4 2>&1)
check "dp that is not the rank count is named" grep -q "is not the 2 ranks started" <<<"$out"
out=$("$BIN" "${SMALL[@]}" --steps 1 --ranks 4 --pp 4 2>&1)
check "more stages than layers are named" grep -q "pp 4 stages need at least 4 layers" <<<"$out"
out=$("$BIN" "${SMALL[@]}" --steps 1 --ranks 2 --pp 2 --micro-batches 3 2>&1)
check "micro-batches that do not divide the rows are named" \
  grep -q "8 rows of a dp rank are not a multiple of the 3 micro-batches" <<<"$out"
out=$("$BIN" "${SMALL[@]}" --steps 1 --ranks 4 --tp 4 2>&1)
check "tp that does not divide the heads is named" \
  grep -q "operator 'h.0.attn.attention': input 0 (qkv \[rows, heads\]) dimension 1 of size 2 is not divisible by tp = 4" <<<"$out"
# --trace: every rank's timeline, as threads and under mpirun; tracing
# changes no number.
CHECK_TRACE=(/usr/bin/python3 "$(dirname "$0")/check_trace.py")
"$BIN" "${SMALL[@]}" --steps 30 --ranks 4 --tp 2 --pp 2 --zero 1 --save "$WORK/tr-ck" --save-every 15 \
  --async-save --trace "$WORK/tr" >"$WORK/tr.log" 2>&1
check "--trace, tp2 x pp2 ZeRO-1 as threads: the single-process losses" close "$WORK/tr.log" "$WORK/one.log"
check "... and a timeline per rank: compute, collectives, pipeline, optimizer, checkpoint" \
  "${CHECK_TRACE[@]}" "$WORK/tr" 4 step forward backward comm pipeline optimizer checkpoint
"${MPIRUN[@]}" -np 2 "$BIN" "${SMALL[@]}" --steps 30 --pp 2 --trace "$WORK/trm" >"$WORK/trm.log" 2>&1
check "--trace under mpirun -np 2 --pp 2: the single-process losses" close "$WORK/trm.log" "$WORK/one.log"
check "... and both ranks' timelines" "${CHECK_TRACE[@]}" "$WORK/trm" 2 step forward backward pipeline optimizer
out=$("$BIN" "${SMALL[@]}" --steps 1 --ranks 2 --threads 2 2>&1)
check "threads per in-process rank are refused" grep -q "one rank per process" <<<"$out"
test $fails -eq 0
