#!/usr/bin/env bash
# The interop formats (issue 4), in one run:
#  1. `ckpt merge --format safetensors` of a GPT-shaped fp32 checkpoint sliced
#     over 8 ranks (tp=8) into one safetensors file, beside `cp -r` of the
#     same bytes (with and without the fsync we do) and beside the PyTorch
#     merge (torch.load of the 8 rank files, torch.cat, torch.save);
#  2. write throughput of every output format (native, safetensors, HDF5,
#     MindSpore) from the same source, merged and sliced, beside native.
# Medians of 3, hot page cache, peak RSS from GNU time.
# Usage: formats_bench.sh CKPT MAKE_CHECKPOINT WORKDIR SIZE   (SIZE: 1GiB)
set -eu
ckpt=$(realpath "$1"); make=$(realpath "$2"); work=$3; size=$4
here=$(dirname "$(realpath "$0")")
py=/usr/bin/python3
mkdir -p "$work"
work=$(realpath "$work")
rm -rf "${work:?}"/*
source "$here/lib.sh"
src="$work/src"
"$make" -o "$src" --size "$size" --mesh tp=8 >/dev/null
"$ckpt" inspect "$src" --json >"$work/layout.json"
bytes=$(du -sb "$src" | cut -f1)
mib=$((bytes >> 20))

echo "merge of a tp=8 checkpoint, $size ($mib MiB on disk), into one file:"
race 5 ours "$work/m.safetensors" "$ckpt" merge "$src" -o "$work/m.safetensors" --format safetensors -q \
  -- cpsync "$work/cps" sh -c 'cp -r "$0" "$1" && sync "$1"/*' "$src" "$work/cps" \
  -- cp "$work/cp" cp -r "$src" "$work/cp"
"$ckpt" merge "$src" -o "$work/m.safetensors" --format safetensors -q
"$ckpt" verify "$work/m.safetensors" -q
rm -rf "$work/m.safetensors"
o=${MED[ours]}
# cp + sync has the durability of ours: the copies fsynced before returning.
awk -v o="$o" -v c="${MED[cp]}" -v cs="${MED[cpsync]}" -v r="${RSS[ours]}" -v b="$bytes" 'BEGIN {
  printf "  tessera merge --format safetensors %6.2f s %6.0f MiB/s  peak RSS %4.0f MiB  (fsynced, committed)\n", o, b/1048576/o, r/1024;
  printf "  cp -r + sync                       %6.2f s %6.0f MiB/s                    ratio tessera/cp = %.2fx (target <= 1.2x)\n", cs, b/1048576/cs, o/cs;
  printf "  cp -r (no fsync)                   %6.2f s %6.0f MiB/s                    ratio tessera/cp = %.2fx\n", c, b/1048576/c, o/c }'
if [ -z "${TESSERA_BENCH_NO_TORCH:-}" ] && $py -c "import torch" 2>/dev/null; then
  $py "$here/torch_reshard.py" setup "$work/layout.json" "$work/torch-src" 8
  # Merging is resharding to one rank: rank_0.pt holds every full tensor.
  race 3 torch "$work/torch-out" $py "$here/torch_reshard.py" reshard \
    "$work/torch-src" "$work/torch-out" 8 1 "$work/layout.json"
  rm -rf "$work/torch-src" "$work/torch-out"
  awk -v o="$o" -v t="${MED[torch]}" -v r="${RSS[torch]}" -v b="$bytes" 'BEGIN {
    printf "  torch.load/cat/save (one .pt)      %6.2f s %6.0f MiB/s  peak RSS %4.0f MiB  speedup tessera = %.1fx\n", t, b/1048576/t, r/1024, t/o }'
else
  echo "  (python3-torch missing: no PyTorch figure)"
fi
echo "  runs (s): tessera ${RUNS[ours]}; cp+sync ${RUNS[cpsync]}; cp ${RUNS[cp]}; torch ${RUNS[torch]:-}"

# Write throughput: `ckpt convert` into each format, from the merged native
# checkpoint (every tensor whole) and from the sliced one (8 ranks' slices:
# native and MindSpore write one file per rank, safetensors and HDF5 one file).
"$ckpt" merge "$src" -o "$work/merged" -q
echo
echo "write throughput, $mib MiB (ckpt convert, output fsynced and committed):"
printf "  %-12s %-8s %8s %9s %9s %10s\n" format source time MiB/s "vs native" "peak RSS"
for from in merged src; do
  label=$from; [ "$from" = src ] && label=tp=8
  ms=("$work/out.ckpt" --save-mindspore-strategy "$work/ms.strategy")
  [ "$from" = src ] && ms=("$work/out.ms" --save-mindspore-strategy "$work/ms.strategy")
  race 3 native "$work/out.native" "$ckpt" convert "$work/$from" -o "$work/out.native" -q \
    -- safetensors "$work/out.safetensors" "$ckpt" convert "$work/$from" -o "$work/out.safetensors" --format safetensors -q \
    -- hdf5 "$work/out.h5" "$ckpt" convert "$work/$from" -o "$work/out.h5" --format hdf5 -q \
    -- mindspore "${ms[0]}" "$ckpt" convert "$work/$from" -o "${ms[@]}" --format mindspore -q
  for fmt in native safetensors hdf5 mindspore; do
    awk -v f="$fmt" -v s="$label" -v t="${MED[$fmt]}" -v n="${MED[native]}" -v m="${RSS[$fmt]}" -v b="$bytes" -v runs="${RUNS[$fmt]}" 'BEGIN {
      printf "  %-12s %-8s %7.2fs %9.0f %8.2fx %7.0f MiB   runs %s\n", f, s, t, b/1048576/t, n/t, m/1024, runs }'
  done
done
# The outputs are well formed: each format's own structure checks and
# every byte read back.
rm -rf "$work"/out.* "$work/ms.strategy"
for fmt in native safetensors hdf5; do
  out="$work/out.$fmt"; [ "$fmt" = hdf5 ] && out="$work/out.h5"
  "$ckpt" convert "$src" -o "$out" --format "$fmt" -q && "$ckpt" verify "$out" -q
done
"$ckpt" convert "$src" -o "$work/out.ms" --format mindspore --save-mindspore-strategy "$work/ms.strategy" -q
"$ckpt" verify "$work/out.ms" --src-strategy "$work/ms.strategy" -q
rm -rf "${work:?}"
