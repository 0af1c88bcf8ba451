#!/usr/bin/env bash
# How long the auto-parallel search takes, single-threaded (ckpt
# auto-parallel), and its peak memory: GPT-2 124M on 8 devices, and a GPT-3
# 175B-shaped graph (96 layers, C = 12288, 96 heads, batch 1536 x 2048) on
# 1,024, 1,536 and 4,096 devices of the DGX A100 profile; each mode (propagate
# completes a file fixing the MLP to Megatron's column/row pair). Goals: every
# mode <= 1 s on GPT-2 / 8; fast <= 1 s and the others <= 30 s on GPT-3; <= 1
# GiB.
# Usage: search_bench.sh CKPT PROFILE WORKDIR
set -euo pipefail
CKPT=$1 PROFILE=$2 WORK=$3
mkdir -p "$WORK"
cat >"$WORK/mlp.json" <<'EOF'
{"format": "tessera.op_strategy", "version": 1, "operators": {
  "h.*.mlp.c_fc": [["dp", null], [null, "tp"]], "h.*.mlp.c_proj": [["dp", "tp"], ["tp", null]]}}
EOF
printf "%-34s %-10s %10s %10s %12s  %s\n" "graph" "mode" "search" "peak RSS" "costed" "chosen"
run() {  # label devices mode model flags...
  local label=$1 devices=$2 mode=$3
  shift 3
  local extra=()
  [ "$mode" = propagate ] && extra=(--op-strategy "$WORK/mlp.json")
  /usr/bin/time -f "%M" -o "$WORK/rss" "$CKPT" auto-parallel --profile "$PROFILE" --devices "$devices" \
    --mode "$mode" "${extra[@]}" "$@" >"$WORK/out" 2>&1
  local took costed chosen
  took=$(sed -n 's/.*costed in \([0-9.]*\) ms/\1/p' "$WORK/out")
  costed=$(sed -n 's/.*, \([0-9]*\) configurations costed.*/\1/p' "$WORK/out")
  chosen=$(sed -n 's/^chosen: \([^[]*\).*/\1/p' "$WORK/out")
  printf "%-34s %-10s %8.0f ms %7.0f MiB %12s  %s\n" "$label" "$mode" "$took" \
    "$(awk '{print $1 / 1024}' "$WORK/rss")" "$costed" "$chosen"
}
for mode in fast propagate exact; do
  run "GPT-2 124M, 8 devices" 8 "$mode" --batch 8
done
GPT3=(--layers 96 --heads 96 --embed 12288 --context 2048 --vocab 51200 --batch 1536)
for devices in 1024 1536 4096; do
  for mode in fast propagate exact; do
    run "GPT-3 175B, $devices devices" "$devices" "$mode" "${GPT3[@]}"
  done
done
