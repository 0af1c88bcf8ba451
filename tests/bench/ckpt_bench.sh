#!/usr/bin/env bash
# Offline reshard of a GPT-shaped fp32 checkpoint from 8 ranks (tp=8) to 4
# (tp=4): `ckpt reshard` beside `cp -r` of the same bytes and beside the
# PyTorch per-rank torch.save/torch.load route (tests/bench/torch_reshard.py),
# in one run. Medians of 3, hot page cache, peak RSS from GNU time.
# Usage: ckpt_bench.sh CKPT MAKE_CHECKPOINT WORKDIR SIZE...   (SIZE: 1GiB, 4GiB)
set -eu
ckpt=$(realpath "$1"); make=$(realpath "$2"); work=$3; shift 3
here=$(dirname "$(realpath "$0")")
py=/usr/bin/python3
mkdir -p "$work"
source "$here/lib.sh"
for size in "$@"; do
  src="$work/src-$size"
  rm -rf "$work"/*
  "$make" -o "$src" --size "$size" --mesh tp=8 >/dev/null
  "$ckpt" inspect "$src" --json >"$work/layout.json"
  bytes=$(du -sb "$src" | cut -f1)
  ours=() oursrss=() cps=() cpsyncs=() torchs=() torchrss=()
  for i in 1 2 3; do
    rm -rf "$work/out" "$work/cp" "$work/cps"; sync
    read -r t m < <(timed "$ckpt" reshard "$src" -o "$work/out" --mesh tp=4 -q)
    ours+=("$t"); oursrss+=("$m"); sync
    read -r t m < <(timed cp -r "$src" "$work/cp")
    cps+=("$t"); sync
    # The same durability as ours: the copies fsynced before returning.
    read -r t m < <(timed sh -c 'cp -r "$0" "$1" && sync "$1"/*' "$src" "$work/cps")
    cpsyncs+=("$t")
  done
  "$ckpt" verify "$work/out" -q
  if [ -z "${TESSERA_BENCH_NO_TORCH:-}" ] && $py -c "import torch" 2>/dev/null; then
    $py "$here/torch_reshard.py" setup "$work/layout.json" "$work/torch-src" 8
    for i in 1 2 3; do
      rm -rf "$work/torch-out"
      read -r t m < <(timed $py "$here/torch_reshard.py" reshard "$work/torch-src" "$work/torch-out" 8 4 "$work/layout.json")
      torchs+=("$t"); torchrss+=("$m")
    done
  fi
  o=$(printf '%s\n' "${ours[@]}" | median); orss=$(printf '%s\n' "${oursrss[@]}" | median)
  c=$(printf '%s\n' "${cps[@]}" | median); cs=$(printf '%s\n' "${cpsyncs[@]}" | median)
  echo "reshard tp=8 -> tp=4, $size ($((bytes >> 20)) MiB on disk):"
  awk -v o="$o" -v c="$c" -v cs="$cs" -v r="$orss" -v b="$bytes" 'BEGIN {
    printf "  tessera ckpt reshard   %6.2f s  %7.0f MiB/s  peak RSS %4.0f MiB   (output fsynced, committed)\n", o, b/1048576/o, r/1024;
    printf "  cp -r + sync           %6.2f s  %7.0f MiB/s                     ratio tessera/cp = %.2fx (target <= 1.2x)\n", cs, b/1048576/cs, o/cs;
    printf "  cp -r (no fsync)       %6.2f s  %7.0f MiB/s                     ratio tessera/cp = %.2fx\n", c, b/1048576/c, o/c }'
  if [ ${#torchs[@]} -gt 0 ]; then
    t=$(printf '%s\n' "${torchs[@]}" | median); trss=$(printf '%s\n' "${torchrss[@]}" | median)
    awk -v o="$o" -v t="$t" -v r="$trss" -v b="$bytes" 'BEGIN {
      printf "  torch.load/cat/save    %6.2f s  %7.0f MiB/s  peak RSS %4.0f MiB   speedup tessera = %.1fx (target >= 6x)\n", t, b/1048576/t, r/1024, t/o }'
  else
    echo "  (python3-torch missing: no PyTorch figure)"
  fi
  echo "  runs (s): tessera ${ours[*]}; cp+sync ${cpsyncs[*]}; cp ${cps[*]}; torch ${torchs[*]:-}"
done
rm -rf "$work"
