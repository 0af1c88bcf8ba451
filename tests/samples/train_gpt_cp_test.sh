#!/usr/bin/env bash
# Context parallelism end to end (train_gpt --cp, --cp-algo ring|ulysses):
# every configuration gives the single-process losses within 1e-5 relative
# per step over 20 steps (T = 48, not a power of two; T = 24 on 3 ranks):
# cp2 and cp4 with each algorithm, cp2 x tp2 (+SP), dp2 x cp2 with ZeRO-1,
# pp2 x cp2, cp2 with full and selective recompute, in-process, under
# mpirun and over Gloo (tessera-run); the shipped ulysses.json strategy;
# --dataset-strategy sequence reads only each rank's positions of the token
# file (counted) with losses bitwise equal to reading whole rows; checkpoints
# saved under cp resume without it and the reverse, and across algorithms;
# the search chooses cp where a long sequence does not fit otherwise; what
# cannot run is refused by name before a step runs.
# Usage: train_gpt_cp_test.sh TRAIN_GPT CORPUS MPIRUN TESSERA_RUN
set -uo pipefail
BIN=$1
CORPUS=$2
MPIRUN=("$3" --allow-run-as-root --oversubscribe)
RUN=$4
WORK=$(mktemp -d)
trap 'pkill -9 -P $$ 2>/dev/null; rm -rf "$WORK"' EXIT
source "$(dirname "$0")/../lib.sh"
STRATEGIES="$(dirname "$0")/../../samples/gpt/strategies"
SMALL=(--data "$CORPUS" --layers 2 --heads 4 --embed 32 --context 48 --seq 48 --batch 4 --lr 1e-3
  --max-norm 0.5)
train() { # train LOG FLAGS...
  local log=$1
  shift
  "$BIN" "${SMALL[@]}" "$@" >"$log" 2>&1
}

train "$WORK/one.log" --steps 20
check "single-process reference" test $? -eq 0
for setting in "--ranks 2 --cp 2" "--ranks 2 --cp 2 --cp-algo ulysses" "--ranks 4 --cp 4" \
  "--ranks 4 --cp 4 --cp-algo ulysses" "--ranks 4 --cp 2 --tp 2" \
  "--ranks 4 --cp 2 --tp 2 --sequence-parallel" "--ranks 4 --cp 2 --tp 2 --cp-algo ulysses" \
  "--ranks 4 --dp 2 --cp 2 --zero 1" "--ranks 4 --dp 2 --cp 2 --zero 1 --cp-algo ulysses" \
  "--ranks 4 --pp 2 --cp 2" "--ranks 4 --pp 2 --cp 2 --cp-algo ulysses --micro-batches 4" \
  "--ranks 2 --cp 2 --recompute full" "--ranks 2 --cp 2 --recompute selective" \
  "--ranks 2 --cp 2 --cp-algo ulysses --recompute selective"; do
  # shellcheck disable=SC2086
  train "$WORK/cp.log" --steps 20 $setting
  check "$setting: the single-process losses" close "$WORK/cp.log" "$WORK/one.log" 20
done
# Three ranks: T = 24 cut into 6 zigzag chunks.
"$BIN" "${SMALL[@]/48/24}" --steps 20 >"$WORK/one24.log" 2>&1
"$BIN" "${SMALL[@]/48/24}" --steps 20 --ranks 3 --cp 3 >"$WORK/cp3.log" 2>&1
check "--ranks 3 --cp 3 --seq 24: the single-process losses" close "$WORK/cp3.log" "$WORK/one24.log" 20

"${MPIRUN[@]}" -np 2 "$BIN" "${SMALL[@]}" --steps 20 --cp 2 >"$WORK/mpi.log" 2>&1
check "mpirun -np 2 --cp 2 (ring): the single-process losses" close "$WORK/mpi.log" "$WORK/one.log" 20
"${MPIRUN[@]}" -np 4 "$BIN" "${SMALL[@]}" --steps 20 --cp 2 --tp 2 --cp-algo ulysses \
  >"$WORK/mpi.log" 2>&1
check "mpirun -np 4 --cp 2 --tp 2 --cp-algo ulysses: the single-process losses" \
  close "$WORK/mpi.log" "$WORK/one.log" 20
timeout 300 "$RUN" --nproc-per-node 2 -- "$BIN" "${SMALL[@]}" --steps 20 --cp 2 >"$WORK/g.out" 2>&1
rank0 "$WORK/g.out" >"$WORK/gloo.log"
check "tessera-run over Gloo, --cp 2 (ring): the single-process losses" \
  close "$WORK/gloo.log" "$WORK/one.log" 20
check "... over gloo" grep -q "ranks: 2 (gloo)" "$WORK/gloo.log"

train "$WORK/ul.log" --steps 20 --ranks 4 --cp 2 --tp 2 --op-strategy "$STRATEGIES/ulysses.json"
check "the shipped ulysses.json (cp2 x tp2): the single-process losses" \
  close "$WORK/ul.log" "$WORK/one.log" 20

# The search finds the sequence cut where memory is tight: one sequence
# of 1,024 tokens on 2 ranks of this VM's profile within 16 MiB a rank
# gives cp 2 with ring attention, which trains to the single-process losses.
LONG=(--data "$CORPUS" --layers 2 --heads 4 --embed 32 --context 1024 --seq 1024 --batch 1
  --lr 1e-3 --max-norm 0.5 --steps 10)
"$BIN" "${LONG[@]}" >"$WORK/long1.log" 2>&1
"$BIN" "${LONG[@]}" --ranks 2 --auto-parallel exact --rank-memory 16MiB \
  --profile "$(dirname "$0")/../../samples/gpt/profiles/debian-vm-2core.json" >"$WORK/auto.log" 2>&1
check "--auto-parallel exact, T 1024 in 16 MiB a rank: chooses cp 2 with ring attention" \
  grep -q "auto-parallel (exact.*: pp=1,dp=1,cp=2,tp=1 .*cp_algo=ring" "$WORK/auto.log"
check "... and trains to the single-process losses" close "$WORK/auto.log" "$WORK/long1.log" 10

# The input cut at the source: a uint16 token file, each rank reading its
# rows' positions only.
write_token_file "$CORPUS" "$WORK/corpus.bin"
TOKENS=("${SMALL[@]/$CORPUS/$WORK/corpus.bin}")
for algo in ring ulysses; do
  for ds in data_parallel sequence; do
    "$BIN" "${TOKENS[@]}" --steps 20 --ranks 4 --dp 2 --cp 2 --cp-algo $algo \
      --dataset-strategy $ds >"$WORK/$ds.log" 2>&1
  done
  check "$algo, --dataset-strategy sequence: losses bitwise equal to whole rows sliced" \
    diff <(train_losses "$WORK/sequence.log") <(train_losses "$WORK/data_parallel.log")
  check "... and the single-process losses" close "$WORK/sequence.log" "$WORK/one.log" 20
  # Per step a rank reads its 2 rows x 24 positions (+ 1 target token per
  # run: 2 runs for ring's zigzag, 1 for Ulysses), 2 bytes a token.
  runs=$([ $algo = ring ] && echo 2 || echo 1)
  share=$((20 * 2 * (24 + runs) * 2))
  check "... each rank read its share of the token file, $share bytes" \
    grep -q "token file bytes read per rank: $share $share $share $share$" "$WORK/sequence.log"
  check "... reading whole rows reads twice as much" \
    grep -q "token file bytes read per rank: 3920 3920 3920 3920$" "$WORK/data_parallel.log"
done
"$BIN" "${TOKENS[@]}" --steps 20 --ranks 4 --cp 2 --tp 2 \
  --op-strategy "$STRATEGIES/ulysses.json" >"$WORK/file.log" 2>&1
check "ulysses.json's dataset_strategy [[dp, cp], [dp, cp]]: each rank reads its share" \
  grep -q "token file bytes read per rank: 4000 4000 4000 4000$" "$WORK/file.log"

# Checkpoints record no cp split of parameters: they resume across cp.
resumed "cp2 x dp2 ZeRO-1 sliced save -> 1 rank" a \
  "--ranks 4 --dp 2 --cp 2 --zero 1 --save-mode sliced" ""
resumed "1 rank -> cp2 ulysses" b "" "--ranks 2 --cp 2 --cp-algo ulysses"
resumed "cp2 ring -> cp4 ulysses" c "--ranks 2 --cp 2" "--ranks 4 --cp 4 --cp-algo ulysses"
resumed "dp2 x cp2 ZeRO-1 sliced -> cp2 x tp2 ZeRO-1" d \
  "--ranks 4 --dp 2 --cp 2 --zero 1 --save-mode sliced" "--ranks 4 --cp 2 --tp 2 --zero 1"

# Refusals, by name, before any step.
refused() { # refused NAME PATTERN FLAGS...
  local name=$1 pattern=$2
  shift 2
  train "$WORK/bad.log" --steps 2 "$@"
  check "$name" bash -c "! grep -q '^step' '$WORK/bad.log' && grep -q \"$pattern\" '$WORK/bad.log'"
}
"$BIN" "${SMALL[@]/48/36}" --steps 2 --ranks 4 --cp 4 >"$WORK/bad.log" 2>&1
check "ring with T not a multiple of 2 cp is refused, naming the operator and sizes" \
  bash -c "! grep -q '^step' '$WORK/bad.log' &&
    grep -q \"'h.\*.attn.attention': cp 4 with cp_algo ring .* T is 36\" '$WORK/bad.log'"
refused "Ulysses with heads not a multiple of tp x cp is refused" \
  "ulysses cuts the 4 heads over tp 1 x cp 3" --ranks 3 --cp 3 --cp-algo ulysses
refused "multi-copy with cp is refused" "multi-copy does not compose with context parallelism" \
  --ranks 4 --cp 2 --tp 2 --micro-batch-interleave 2
refused "a file whose cp_algo disagrees with --cp-algo is refused" \
  "sets cp_algo ulysses but --cp-algo is ring" --ranks 2 --cp 2 --cp-algo ring \
  --op-strategy "$STRATEGIES/ulysses.json"
refused "a strategy whose rows are not cut over cp is refused, naming the operator" \
  "operator 'embedding'.*rows are not cut over cp" --ranks 2 --cp 2 \
  --op-strategy "$STRATEGIES/megatron.json"

echo "$passes passed, $fails failed"
test "$fails" -eq 0
