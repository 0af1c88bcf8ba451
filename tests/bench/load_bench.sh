#!/usr/bin/env bash
# Loading from training's checkpoints and repairing them (load_bench.cc):
# GPT-2 124M's weights and Adam moments saved sliced on 4 in-process ranks
# (dp2 x tp2, ZeRO-1), loaded on tp4 (4 ranks) and on 1 rank, each rank
# reading only its byte ranges (PyTorch's DCP does the same job beside us
# in dcp_bench.sh, on a state both sides can hold); the sliced save with
# replicas:2 and parity:2 beside none; the repair of one deleted data file
# from replicas and from parity beside cp of the same bytes. Medians of 3,
# files in the page cache on both sides.
# Usage: load_bench.sh LOAD_BENCH WORK_DIR
set -euo pipefail
BIN=$1
work=$2/load-bench
rm -rf "$work"
mkdir -p "$work"
source "$(dirname "$0")/lib.sh"
out=$("$BIN" "$work")
get() { awk -v k="$1" '$1 == k {print $2}' <<<"$out"; }
lost=$(get lost_bytes)
head -c "$lost" /dev/urandom >"$work/lost.tsr"
cps=()
for _ in 1 2 3; do
  rm -f "$work/lost-copy.tsr"
  sync
  start=$(date +%s.%N)
  cp "$work/lost.tsr" "$work/lost-copy.tsr"
  sync
  cps+=("$(awk "BEGIN {print $(date +%s.%N) - $start}")")
done
cp_s=$(printf '%s\n' "${cps[@]}" | median)
mib=$(du -sm "$work/none" | cut -f1)
printf "%-58s %9s\n" "GPT-2 124M ($mib MiB), saved on dp2 x tp2 ZeRO-1" "ours (s)"
printf "%-58s %9.3f\n" "load on tp4, 4 ranks (reshard on load)" "$(get load_tp4)"
printf "%-58s %9.3f\n" "load on 1 rank (everything)" "$(get load_one)"
printf "%-58s %9s %9s %8s\n" "" "ours (s)" "base (s)" "cost"
cost() { printf "%-58s %9.3f %9.3f %7.2fx\n" "$1" "$2" "$3" "$(awk "BEGIN {print $2 / $3}")"; }
cost "sliced save, replicas:2 (base: no redundancy)" "$(get save_replicas)" "$(get save_none)"
cost "sliced save, parity:2 (base: no redundancy)" "$(get save_parity)" "$(get save_none)"
cost "repair one lost data file from replicas (base: cp + sync)" "$(get repair_replicas)" "$cp_s"
cost "repair one lost data file from parity (base: cp + sync)" "$(get repair_parity)" "$cp_s"
echo "(the lost data file: $((lost >> 20)) MiB; repair verifies the whole checkpoint first)"
rm -rf "$work"
