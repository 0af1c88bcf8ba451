#!/usr/bin/env bash
# The layering of docs/DESIGN.md, checked with grep: each folder includes only
# the folders below it, and the wrapped libraries' headers appear only in
# the one file that wraps each.
# Usage: layering_test.sh SOURCE_ROOT
set -u
cd "$1" || exit 1
source tests/lib.sh

# includes FILES...: the project headers they include, one per line.
includes() { grep -ho '^#include "[^"]*"' "$@" 2>/dev/null | sed 's/#include "//;s/"//' | sort -u; }
# only DIR ALLOWED_REGEX: every project header DIR's files include matches.
only() {
  local dir=$1 allowed=$2 bad
  bad=$(includes $(find "$dir" -maxdepth 1 -name '*.h' -o -maxdepth 1 -name '*.cc') |
        grep -Ev "$allowed" | grep -v '\.pb\.h$')
  [ -z "$bad" ] || { echo "  $dir includes: $bad"; return 1; }
}

check "core/ includes only core/" only core '^core/'
check "transform/ includes core/ and itself" only transform '^(core|transform)/'
check "formats/ includes core/, transform/ and itself" only formats '^(core|transform|formats)/'
check "ckpt/ includes core/, transform/, formats/ and itself" only ckpt '^(core|transform|formats|ckpt)/'
check "runtime/comm/ includes core/, transform/ and itself" only runtime/comm '^(core|transform|runtime/comm)/'
below='core|transform|formats|ckpt|runtime/comm'
check "runtime/ (tensor, kernels) includes nothing of parallel/, train/, model/" \
  only runtime "^(($below)/|runtime/[a-z_]+\.h$)"
check "runtime/parallel/ includes nothing of train/, model/" \
  only runtime/parallel "^(($below)/|runtime/[a-z_]+\.h$|runtime/parallel/)"
check "runtime/train/ includes nothing of model/" \
  only runtime/train "^(($below)/|runtime/[a-z_]+\.h$|runtime/(parallel|train)/)"
check "runtime/cost/ (the cost model, model-agnostic) includes nothing of model/" \
  only runtime/cost "^(($below)/|runtime/[a-z_]+\.h$|runtime/(parallel|train|cost)/)"
check "runtime/model/ includes the runtime and what is below it (no cli/, samples/, tests/)" \
  only runtime/model "^(($below)/|runtime/)"
check "python/src/ includes the library (no cli/, samples/, tests/)" \
  only python/src "^(($below)/|runtime/|python/src/)"
nothing_includes_python() {
  local bad
  bad=$(grep -rl '^#include "python/' core transform formats ckpt runtime cli samples)
  [ -z "$bad" ] || { echo "  $bad"; return 1; }
}
check "nothing in C++ includes python/" nothing_includes_python
pybind_only_in_python() {
  local bad
  bad=$(grep -rlE '^#include <(pybind11|Python\.h)' core transform formats ckpt runtime cli samples)
  [ -z "$bad" ] || { echo "  $bad"; return 1; }
}
check "pybind11 only in python/" pybind_only_in_python

# The wrapped libraries: one file each.
wrapped() {  # wrapped HEADER_REGEX ALLOWED_FILES_REGEX
  local bad
  bad=$(grep -rlE --include='*.cc' --include='*.h' "^#include <($1)" core transform formats ckpt runtime cli samples |
        grep -Ev "$2")
  [ -z "$bad" ] || { echo "  $bad"; return 1; }
}
check "zstd.h only in formats/codec.cc" wrapped 'zstd\.h' '^formats/codec\.cc$'
check "hdf5.h only in formats/hdf5_file.cc" wrapped 'hdf5\.h|H5' '^formats/hdf5_file\.cc$'
check "mpi.h only in runtime/comm/mpi.cc" wrapped 'mpi\.h' '^runtime/comm/mpi\.cc$'
check "nccl.h only in runtime/comm/nccl.cc" wrapped 'nccl\.h|cuda' '^runtime/comm/nccl\.cc$'
check "Gloo's headers only in runtime/comm/gloo.cc" wrapped 'gloo/' '^runtime/comm/gloo\.cc$'
check "xxhash.h only in core/checksum.cc" wrapped 'xxhash\.h|xxh_x86dispatch\.h' '^core/checksum\.cc$'
check "ISA-L only in formats/erasure.cc (erasure codes) and core/checksum.cc (CRC-32)" wrapped 'isa-l' \
  '^(formats/erasure|core/checksum)\.cc$'
pb=$(grep -rl '\.pb\.h"' core transform formats ckpt runtime cli samples | sort | tr '\n' ' ')
check "generated .pb.h only in manifest.cc and the strategy file's wrapper" \
  test "$pb" = "formats/manifest.cc formats/mindspore_strategy.cc "

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
