#!/usr/bin/env bash
# The Python binding (`import tessera`, python/) beside the C++ it wraps and
# beside the peers, on dcp_bench's state: 16 tensors of 4096 x 4096 float32
# (1 GiB), t[i][r, c] = i + r * 1e-3 + c * 1e-7, files in the page cache.
#   reshard on load: saved by rows over 2 ranks (dcp_bench save for us,
#     dcp_peer.py save for DCP), loaded by columns on 2 ranks:
#     tessera.load_shards from 2 spawned Python processes (python_bench.py
#     load) beside dcp_bench load (the C++ library, 2 in-process ranks) and
#     PyTorch DCP (dcp_peer.py load, 2 gloo processes); destination arrays
#     allocated and touched before the clock on every side; values checked
#     after each round. The binding's overhead is python / C++ - 1 (goal:
#     under 10%), given twice: with numpy's defaults, and with numpy's
#     transparent huge pages off, as the C++ bench's buffers are (numpy
#     madvises its large arrays into huge pages, which speeds the copy).
#   reads of a merged checkpoint: every tensor read and summed (np.sum) in
#     one process (python_bench.py read): reader.read's zero-copy view,
#     read(copy=True) and read_into beside numpy reading the same values
#     from a plain file (np.memmap, np.fromfile, f.readinto). Tessera's
#     reads verify the XXH3 checksum of every byte they read; numpy's have
#     none to verify: the XXH3 line is that cost's floor.
# Medians of 3.
# Usage: python_bench.sh DCP_BENCH CKPT BUILD_PYTHON_DIR WORK_DIR [N S]
set -euo pipefail
BIN=$1
CKPT=$2
export PYTHONPATH=$3${PYTHONPATH:+:$PYTHONPATH}
work=$4/python-bench
n=${5:-16}
s=${6:-4096}
here="$(dirname "$0")"
peer="$here/dcp_peer.py"
py=/usr/bin/python3
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
secs() { awk '$1 == "seconds" {print $2}'; }

# Reshard on load.
"$BIN" save "$work/ours" 2 "$n" "$s" >/dev/null
$py "$peer" save "$work/dcp" 2 "$n" "$s" >/dev/null
cxx=$("$BIN" load "$work/ours/ckpt" 2 "$n" "$s" | secs)
python=$($py "$here/python_bench.py" load "$work/ours/ckpt" 2 "$n" "$s" | secs)
python_4k=$($py "$here/python_bench.py" load "$work/ours/ckpt" 2 "$n" "$s" --no-hugepages | secs)
dcp=$($py "$peer" load "$work/dcp/ckpt" 2 "$n" "$s" | secs)
rm -rf "$work/dcp"

# A merged checkpoint storing each tensor as one piece: `ckpt merge` of the
# 2-rank checkpoint keeps each tensor in the 2 pieces it was saved in (and
# cuts pieces to its memory budget), and reader.read lends a view only of a
# region inside one stored piece; merging the merged checkpoint again on one
# thread under a budget of 3 tensors writes one piece per tensor.
"$CKPT" merge "$work/ours/ckpt" -o "$work/merged2" -q
rm -rf "$work/ours"
"$CKPT" merge "$work/merged2" -o "$work/merged" -j 1 --memory-budget "$((3 * s * s * 4 / 1048576 + 1))MiB" -q
rm -rf "$work/merged2"
reads=$($py "$here/python_bench.py" read "$work/merged" "$work/raw" "$n" "$s")
total=$((n * s * s * 4))
xxh3=$("$BIN" floor $((total / 4)) 1 | awk '$1 == "xxh3_gbs" {print $2}')

mib=$((total >> 20))
pct() { awk "BEGIN {printf \"%+.0f%%\", 100 * ($1 / $2 - 1)}"; }
printf "%-52s %10s %9s %9s %9s %8s\n" "$n x ${s}^2 f32 ($mib MiB), 2 ranks" "python (s)" "C++ (s)" \
  "DCP (s)" "overhead" "vs DCP"
printf "%-52s %10.3f %9.3f %9.3f %9s %7.1fx\n" "reshard on load: rows -> columns (load_shards)" \
  "$python" "$cxx" "$dcp" "$(pct "$python" "$cxx")" "$(awk "BEGIN {print $dcp / $python}")"
printf "%-52s %10.3f %9.3f %9s %9s %7.1fx\n" "  numpy's huge pages off, as the C++ buffers" \
  "$python_4k" "$cxx" "-" "$(pct "$python_4k" "$cxx")" "$(awk "BEGIN {print $dcp / $python_4k}")"
echo
printf "%-52s %11s %9s %9s\n" "read + np.sum of every tensor, merged, 1 process" "tessera (s)" \
  "numpy (s)" "ours/np"
row() {
  awk -v k="$1" -v label="$2" '$1 == k {printf "%-52s %11.3f %9.3f %8.1fx\n", label, $2, $3, $2 / ($3 > 0 ? $3 : 1e-9)}' <<<"$reads"
}
row zero_copy "zero-copy: reader.read(name) vs np.memmap"
row copy "copying: read(name, copy=True) vs np.fromfile"
row into "into buffers: read_into vs f.readinto"
row view_only "  the view alone, no sum: reader.read vs np.memmap"
printf "%-52s %11.3f  (XXH3 of %d MiB at %.1f GB/s, 1 thread)\n" "floor of verifying every byte read" \
  "$(awk "BEGIN {print $total / ($xxh3 * 1e9)}")" "$mib" "$xxh3"
