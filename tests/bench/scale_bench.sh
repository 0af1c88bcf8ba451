#!/usr/bin/env bash
# How the offline reshard's cost grows with the number of ranks, not with
# bytes: one GPT-3-deep state (96 layers, Adam moments, about 880 MiB at
# width 256) written by make_checkpoint on 8, 1,024, 4,096 and 16,384 ranks
# (ZeRO), each resharded with `ckpt reshard` to half as many ranks (the destination
# strategies from make_checkpoint --strategy-out), beside the 8 -> 4 figure
# of the same bytes: seconds and peak RSS (GNU time), medians of 3. Goal
# (issues 21 and 40): 4,096 -> 2,048 and 16,384 -> 8,192 within 2x the time
# of 8 -> 4, peak RSS at most the memory budget (256 MiB) plus 4x the
# manifest (printed as "budget"). The peer: `cp -r` of
# the reshard's own output and `sync` (the same files created, the same
# bytes written and made durable; medians of 3), a floor no reshard of
# those files can go under on this file system. Nothing is deleted until
# the end: ext4 without a journal (this VM's root) does not reuse an inode
# freed in the last 60 s (360 s while its inode-table block is dirty) and
# steps past each one with a buffer-cache lookup, so creating 2,048 files
# right after deleting 2,048 spends about a second in find_inode_bit, in
# the reshard and in its peer alike: a cost of the benchmark's own
# clean-up, not of resharding. (On tmpfs, which has no such rule, each
# rank count's files go when it is done, to spare memory.)
# Usage: scale_bench.sh CKPT MAKE_CHECKPOINT WORK_DIR [RANKS...]
set -euo pipefail
CKPT=$1
MAKE=$2
work=$3/scale-bench
shift 3
if [ $# -eq 0 ]; then ranks=(8 1024 4096); else ranks=("$@"); fi
source "$(dirname "$0")/lib.sh"
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT  # kept outputs go however the run ends
MODEL=(--layers 96 --embed 256 --vocab 1024 --context 256 --optimizer --zero)
mesh_of() {  # the source mesh for N ranks, and its half
  case $1 in
    8) echo "pp=2,dp=2,tp=2 pp=1,dp=2,tp=2" ;;
    1024) echo "pp=8,dp=16,tp=8 pp=4,dp=8,tp=16" ;;
    4096) echo "pp=16,dp=32,tp=8 pp=8,dp=16,tp=16" ;;
    16384) echo "pp=16,dp=128,tp=8 pp=8,dp=64,tp=16" ;;
    *) echo "scale_bench: no mesh for $1 ranks" >&2; exit 2 ;;
  esac
}
printf "%-46s %8s %10s %10s %10s %9s %9s %10s %8s\n" "ranks (source -> destination)" "pieces" \
  "manifest" "seconds" "peak RSS" "budget" "vs 8->4" "cp+sync" "vs cp"
base=""
for n in "${ranks[@]}"; do
  read -r src dst <<<"$(mesh_of "$n")"
  "$MAKE" -o "$work/src-$n" --mesh "$src" "${MODEL[@]}" >/dev/null
  "$MAKE" --strategy-out "$work/dst-$n.json" --mesh "$dst" "${MODEL[@]}" >/dev/null
  pieces=$("$CKPT" inspect --json "$work/src-$n" | python3 -c "import json, sys
print(sum(t['pieces'] for t in json.load(sys.stdin)['tensors']))")
  manifest=$(stat -c %s "$work/src-$n/manifest.pb")
  secs=() rss=()
  for i in 1 2 3; do
    sync
    read -r t m < <(timed "$CKPT" reshard "$work/src-$n" --strategy "$work/dst-$n.json" \
      -o "$work/out-$n-$i" -q)
    secs+=("$t")
    rss+=("$m")
  done
  s=$(printf '%s\n' "${secs[@]}" | median)
  r=$(printf '%s\n' "${rss[@]}" | median)
  copies=()
  for i in 1 2 3; do
    sync
    read -r t _ < <(timed bash -c "cp -r '$work/out-$n-1' '$work/copy-$n-$i' && sync")
    copies+=("$t")
  done
  c=$(printf '%s\n' "${copies[@]}" | median)
  [ -z "$base" ] && base=$s
  printf "%-46s %8d %9.1fM %10.3f %9.0fM %8.0fM %8.2fx %10.3f %7.2fx\n" "$n ($src -> $dst)" \
    "$pieces" "$(awk "BEGIN {print $manifest / 1048576}")" "$s" "$(awk "BEGIN {print $r / 1024}")" \
    "$(awk "BEGIN {print 256 + 4 * $manifest / 1048576}")" \
    "$(awk "BEGIN {print $s / $base}")" "$c" "$(awk "BEGIN {print $s / $c}")"
  if [ "$(stat -f -c %T "$work")" = tmpfs ]; then
    rm -rf "$work/src-$n" "$work/out-$n"-* "$work/copy-$n"-*
  fi
done
rm -rf "$work"
