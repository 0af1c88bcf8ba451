#!/usr/bin/env bash
# Loading from training's checkpoints and repairing them (load_bench.cc):
# GPT-2 124M's weights and Adam moments saved sliced on 4 in-process ranks
# (dp2 x tp2, ZeRO-1), loaded on tp4 (4 ranks) and on 1 rank, each rank
# reading only its byte ranges, beside the PyTorch peer without DCP
# (torch_load_reshard.py: per-rank torch.save files, every destination
# rank torch.loads them and keeps its chunk); the sliced save with
# replicas:2 and parity:2 beside none; the repair of one deleted data file
# from replicas and from parity beside cp of the same bytes. Medians of 3,
# files in the page cache on both sides.
# Usage: load_bench.sh LOAD_BENCH CKPT WORK_DIR
set -euo pipefail
BIN=$1
CKPT=$2
work=$3/load-bench
rm -rf "$work"
mkdir -p "$work"
source "$(dirname "$0")/lib.sh"
peer="$(dirname "$0")/torch_load_reshard.py"
out=$("$BIN" "$work")
get() { awk -v k="$1" '$1 == k {print $2}' <<<"$out"; }
"$CKPT" inspect --json "$work/none" >"$work/layout.json"
/usr/bin/python3 "$peer" setup "$work/layout.json" "$work/torch" 2
peer_tp4=$(for _ in 1 2 3; do /usr/bin/python3 "$peer" load "$work/torch" 2 4 "$work/layout.json"; done | median)
peer_one=$(for _ in 1 2 3; do /usr/bin/python3 "$peer" load "$work/torch" 2 1 "$work/layout.json"; done | median)
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
printf "%-58s %9s %9s %8s\n" "GPT-2 124M ($mib MiB), saved on dp2 x tp2 ZeRO-1" "ours (s)" "peer (s)" "speedup"
row() { printf "%-58s %9.3f %9.3f %7.1fx\n" "$1" "$2" "$3" "$(awk "BEGIN {print $3 / $2}")"; }
row "load on tp4, 4 ranks (peer: torch.load + cat + chunk)" "$(get load_tp4)" "$peer_tp4"
row "load on 1 rank (peer: torch.load + cat)" "$(get load_one)" "$peer_one"
printf "%-58s %9s %9s %8s\n" "" "ours (s)" "base (s)" "cost"
cost() { printf "%-58s %9.3f %9.3f %7.2fx\n" "$1" "$2" "$3" "$(awk "BEGIN {print $2 / $3}")"; }
cost "sliced save, replicas:2 (base: no redundancy)" "$(get save_replicas)" "$(get save_none)"
cost "sliced save, parity:2 (base: no redundancy)" "$(get save_parity)" "$(get save_none)"
cost "repair one lost data file from replicas (base: cp + sync)" "$(get repair_replicas)" "$cp_s"
cost "repair one lost data file from parity (base: cp + sync)" "$(get repair_parity)" "$cp_s"
echo "(the lost data file: $((lost >> 20)) MiB; repair verifies the whole checkpoint first)"
rm -rf "$work"
