#!/usr/bin/env bash
# Tessera beside PyTorch's distributed checkpoint (DCP, torch 1.13's
# torch.distributed._shard.checkpoint, dcp_peer.py) on the same state: 16
# tensors of 4096 x 4096 float32 (1 GiB) split by rows over 2 ranks
# (in-process ranks for us, gloo processes for DCP), files in the page
# cache on both sides:
#   save:            each rank writes its rows (our sliced save; DCP's
#                    save_state_dict + FileSystemWriter);
#   reshard on load: saved by rows, loaded by columns on 2 ranks (DCP needs
#                    the same world size within one job), and ours on 4;
#   merge-load:      one process reads whole tensors.
# Tessera's side goes through the library API a trainer calls
# (OpenCheckpoint + ReadRegion, checksums verified) into buffers allocated
# and touched before the clock, as DCP's state dict is. The floor: memcpy
# of the bytes each rank keeps (512 MiB) and XXH3 of the bytes it must
# verify, at the throughputs measured with 2 threads at once: since format
# 3 the rows' pieces carry tile checksums (formats/native.md), so a rank
# verifies its half of the columns (512 MiB), where format 2's 1 MiB row
# blocks made it hash all 1 GiB (that floor is printed too).
# Medians of 3.
# Usage: dcp_bench.sh DCP_BENCH WORK_DIR [N S]
set -euo pipefail
BIN=$1
work=$2/dcp-bench
n=${3:-16}
s=${4:-4096}
peer="$(dirname "$0")/dcp_peer.py"
rm -rf "$work"
mkdir -p "$work"
secs() { awk '$1 == "seconds" {print $2}'; }
# Memory the file system's pages will use, touched once before either side
# is timed: in this VM a page the guest touches for the first time costs
# the host a fault, which makes whichever save runs first (ours) 4-5x
# slower on a fresh machine (1.55 s against DCP's 0.34 s on tmpfs;
# 0.29-0.31 s once warm).
head -c $((n * s * s * 4 * 2)) /dev/zero >"$work/warm-up"
rm -f "$work/warm-up"
ours_save=$("$BIN" save "$work/ours" 2 "$n" "$s" | secs)
dcp_save=$(/usr/bin/python3 "$peer" save "$work/dcp" 2 "$n" "$s" | secs)
ours_load=$("$BIN" load "$work/ours/ckpt" 2 "$n" "$s" | secs)
ours_load4=$("$BIN" load "$work/ours/ckpt" 4 "$n" "$s" | secs)
dcp_load=$(/usr/bin/python3 "$peer" load "$work/dcp/ckpt" 2 "$n" "$s" | secs)
ours_merge=$("$BIN" merge "$work/ours/ckpt" "$n" "$s" | secs)
dcp_merge=$(/usr/bin/python3 "$peer" merge "$work/dcp/ckpt" "$n" "$s" | secs)
per_rank=$((n * s * s * 4 / 2))
total=$((n * s * s * 4))
floor=$("$BIN" floor "$per_rank" 2)
memcpy=$(awk '$1 == "memcpy_gbs" {print $2}' <<<"$floor")
xxh3=$(awk '$1 == "xxh3_gbs" {print $2}' <<<"$floor")
xxh3_plain=$(awk '$1 == "xxh3_plain_gbs" {print $2}' <<<"$floor")
floor_s=$(awk "BEGIN {print $per_rank / ($memcpy * 1e9) + $per_rank / ($xxh3 * 1e9)}")
floor_rows=$(awk "BEGIN {print $per_rank / ($memcpy * 1e9) + $total / ($xxh3 * 1e9)}")
# Merge-load's floor: one thread copies (the kernel's copy into the
# destination) and hashes every byte.
floor1=$("$BIN" floor "$total" 1)
memcpy1=$(awk '$1 == "memcpy_gbs" {print $2}' <<<"$floor1")
xxh31=$(awk '$1 == "xxh3_gbs" {print $2}' <<<"$floor1")
floor_merge=$(awk "BEGIN {print $total / ($memcpy1 * 1e9) + $total / ($xxh31 * 1e9)}")
mib=$((n * s * s * 4 >> 20))
printf "%-52s %9s %9s %8s\n" "$n x ${s}^2 f32 ($mib MiB), 2 ranks" "ours (s)" "DCP (s)" "speedup"
row() { printf "%-52s %9.3f %9.3f %7.1fx\n" "$1" "$2" "$3" "$(awk "BEGIN {print $3 / $2}")"; }
row "save (rows, each rank its own)" "$ours_save" "$dcp_save"
row "reshard on load: rows -> columns, 2 ranks" "$ours_load" "$dcp_load"
printf "%-52s %9.3f %9s\n" "  ours on 4 ranks (another world size)" "$ours_load4" "-"
row "merge-load into one process" "$ours_merge" "$dcp_merge"
printf "%-52s %9.3f  (memcpy %.1f GB/s + XXH3 %.1f GB/s per rank; ours at %.0f%% of it)\n" \
  "floor of the reshard on load (copy half, verify half)" "$floor_s" "$memcpy" "$xxh3" \
  "$(awk "BEGIN {print 100 * $floor_s / $ours_load}")"
printf "%-52s %9.3f  (format 2's row blocks: every rank hashes all 1 GiB)\n" \
  "  the same verifying all the rows it touches" "$floor_rows"
printf "%-52s %9.3f  (memcpy %.1f GB/s + XXH3 %.1f GB/s, one thread; ours at %.2fx of it)\n" \
  "floor of the merge-load (copy all, verify all)" "$floor_merge" "$memcpy1" "$xxh31" \
  "$(awk "BEGIN {print $ours_merge / $floor_merge}")"
printf "%-52s %9s  (XXH3 through libxxhash's plain, SSE2 entry point: %.1f GB/s per rank)\n" \
  "" "" "$xxh3_plain"

# Cold storage (root only): the page cache dropped before each timed load
# on both sides, beside the disk's own sequential read bandwidth (dd with
# O_DIRECT, 16 MiB blocks, over our checkpoint's files, two at once as our
# two ranks read: the best of 1 or 2 streams, 4 or 16 MiB on this VM);
# medians of 5 interleaved runs.
if [ "$(id -u)" -eq 0 ] && [ -w /proc/sys/vm/drop_caches ]; then
  median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
  disk() { # seconds to read every file of the checkpoint with O_DIRECT
    local t0
    sync
    echo 3 >/proc/sys/vm/drop_caches
    t0=$(date +%s.%N)
    find "$work/ours/ckpt" -type f -size +1M -print0 |
      xargs -0 -P 2 -I{} dd if={} of=/dev/null bs=16M iflag=direct status=none
    awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {print b - a}'
  }
  bytes=$(find "$work/ours/ckpt" -type f -size +1M -printf "%s\n" | awk '{s += $1} END {print s}')
  : >"$work/cd"
  : >"$work/co"
  : >"$work/cp"
  : >"$work/cm"
  : >"$work/cq"
  for _ in 1 2 3 4 5; do
    disk >>"$work/cd"
    TESSERA_BENCH_COLD=1 "$BIN" load "$work/ours/ckpt" 2 "$n" "$s" | secs >>"$work/co"
    TESSERA_BENCH_COLD=1 /usr/bin/python3 "$peer" load "$work/dcp/ckpt" 2 "$n" "$s" | secs \
      >>"$work/cp"
    TESSERA_BENCH_COLD=1 "$BIN" merge "$work/ours/ckpt" "$n" "$s" | secs >>"$work/cm"
    TESSERA_BENCH_COLD=1 /usr/bin/python3 "$peer" merge "$work/dcp/ckpt" "$n" "$s" | secs \
      >>"$work/cq"
  done
  d=$(median <"$work/cd")
  echo "cold (page cache dropped before each load; disk: dd iflag=direct, $(awk \
    "BEGIN {printf \"%.2f\", $bytes / $d / 1e9}") GB/s over our $((bytes >> 20)) MiB of files)"
  cold() { # cold LABEL OURS DCP
    printf "%-52s %9.3f %9.3f %7.1fx  (%.0f%% of the disk's bandwidth)\n" "$1" "$2" "$3" \
      "$(awk "BEGIN {print $3 / $2}")" "$(awk "BEGIN {print 100 * $d / $2}")"
  }
  cold "reshard on load, cold: rows -> columns, 2 ranks" "$(median <"$work/co")" \
    "$(median <"$work/cp")"
  cold "merge-load, cold" "$(median <"$work/cm")" "$(median <"$work/cq")"
else
  echo "cold storage: not measured (dropping the page cache needs root)"
fi
rm -rf "$work"
