#!/usr/bin/env bash
# Saving from training (runtime/train/sliced_checkpoint.h): a sliced save (every
# rank writes its pieces to its own file) and a merged save (every rank
# writes its pieces into the one file; goal: at most 1.5x the sliced save;
# beside it, once, the baseline of rank 0 gathering everything and writing) of
# GPT-2 124M's weights and Adam moments from 4 in-process ranks (dp2 x tp2,
# ZeRO-1), and an async sliced save (its stall and its time to the commit),
# beside cp -r + sync of the same checkpoint (the floor for moving
# those bytes through the page cache to disk), and the sliced and async
# saves with --redundancy rs:4+2 beside them (1.5x the bytes; goals: at
# most 1.6x the sliced save's time, a stall no higher), and the async
# merged save. Medians of 5.
# Usage: save_bench.sh SAVE_BENCH WORK_DIR
set -euo pipefail
BIN=$1
work=$2/save-bench
rm -rf "$work"
mkdir -p "$work"
source "$(dirname "$0")/lib.sh"
out=$("$BIN" "$work")
sliced=$(awk '/^sliced / {print $2}' <<<"$out")
merged=$(awk '/^merged / {print $2}' <<<"$out")
merged_gather=$(awk '/^merged_gather/ {print $2}' <<<"$out")
stall_merged=$(awk '/^stall_merged/ {print $2}' <<<"$out")
async_merged=$(awk '/^async_merged/ {print $2}' <<<"$out")
stall=$(awk '/^stall / {print $2}' <<<"$out")
stall_first=$(awk '/^stall_first/ {print $2}' <<<"$out")
async=$(awk '/^async / {print $2}' <<<"$out")
sliced_rs=$(awk '/^sliced_rs/ {print $2}' <<<"$out")
stall_rs=$(awk '/^stall_rs/ {print $2}' <<<"$out")
async_rs=$(awk '/^async_rs/ {print $2}' <<<"$out")
prepare=$(awk '/^prepare/ {print $2}' <<<"$out")
bytes=$(du -sb "$work/sliced" | cut -f1)
cps=()
for _ in 1 2 3; do
  rm -rf "$work/copy"
  sync
  start=$(date +%s.%N)
  cp -r "$work/sliced" "$work/copy"
  sync
  cps+=("$(awk "BEGIN {print $(date +%s.%N) - $start}")")
done
cp_s=$(printf '%s\n' "${cps[@]}" | median)
mib=$(awk "BEGIN {printf \"%.0f\", $bytes / 1048576}")
printf "%-48s %9s %10s %8s\n" "GPT-2 124M, 4 ranks dp2 x tp2 ZeRO-1" "seconds" "MiB/s" "vs cp"
row() { printf "%-48s %9.3f %10.0f %7.2fx\n" "$1" "$2" "$(awk "BEGIN {print $mib / $2}")" \
  "$(awk "BEGIN {print $2 / $cp_s}")"; }
row "sliced save ($mib MiB, 4 data files)" "$sliced"
row "merged save (every rank writes into one file)" "$merged"
row "merged save as before (gather, rank 0 writes)" "$merged_gather"
row "async save: training stalled" "$stall"
row "async save: stall of the first" "$stall_first"
row "async save: start to commit" "$async"
gib=$(awk "BEGIN {print $bytes / 1073741824}")
printf "%-48s %9.4f  s/GiB (goal <= 0.15); first/steady %s (goal <= 2x)\n" \
  "async save: stall per GiB" "$(awk "BEGIN {print $stall / $gib}")" \
  "$(awk "BEGIN {printf \"%.2fx\", $stall_first / $stall}")"
printf "%-48s %9.3f  (once, at start-up; faulted in beside training)\n" "async save: snapshot arena prepared" "$prepare"
row "cp -r + sync of the sliced checkpoint" "$cp_s"
ratio() { awk "BEGIN {printf \"%.2fx\", $1 / $2}"; }
printf "%-48s %9.3f  %s the sliced save (goal <= 1.6x)\n" "sliced save, rs:4+2 (1.5x the bytes)" \
  "$sliced_rs" "$(ratio "$sliced_rs" "$sliced")"
printf "%-48s %9.4f  %s the stall without (goal <= 1x)\n" "async save, rs:4+2: training stalled" \
  "$stall_rs" "$(ratio "$stall_rs" "$stall")"
printf "%-48s %9.3f  %s the async save without\n" "async save, rs:4+2: start to commit" \
  "$async_rs" "$(ratio "$async_rs" "$async")"
printf "%-48s %9.3f  %s the sliced save (goal <= 1.5x); the gathering one: %s\n" \
  "merged save" "$merged" "$(ratio "$merged" "$sliced")" "$(ratio "$merged_gather" "$sliced")"
printf "%-48s %9.4f  %s the sliced async stall\n" "async merged save: training stalled" \
  "$stall_merged" "$(ratio "$stall_merged" "$stall")"
printf "%-48s %9.3f  %s the sliced async save\n" "async merged save: start to commit" \
  "$async_merged" "$(ratio "$async_merged" "$async")"
rm -rf "$work"
