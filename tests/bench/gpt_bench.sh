#!/usr/bin/env bash
# Tokens/s of the GPT training step (forward, backward, AdamW with
# clipping): train_gpt beside PyTorch on the same model, batch, sequence and
# cores, plus each GEMM library's sgemm ceiling measured in the same run.
# Ours uses the matrix-product library train_gpt --calibrate chooses at
# the start of the run (runtime/matmul.h); the small model's tokens/s on
# each library and its model work as a share of the chosen library's
# 1-thread peak are printed too.
# PyTorch is capped to the same cores as ours: OPENBLAS_NUM_THREADS and
# OMP_NUM_THREADS set before torch is imported, beside torch's own
# set_num_threads (which does not cap Debian's OpenBLAS: uncapped, a "1
# thread" PyTorch does its matrix products on every core). Each side's
# CPU time / wall time is printed (1.0 per core it was given). PyTorch's
# best configuration on all the machine's cores (torch threads x BLAS
# threads, the fastest of those tried) is reported beside ours on them.
# OPENBLAS_CORETYPE is unset for both sides (it can force slower kernels;
# see runtime/kernels.h), and the forced-Haswell figure is printed too for
# the small model.
# Usage: gpt_bench.sh TRAIN_GPT SGEMM_PEAK TORCH_SCRIPT CORPUS
set -euo pipefail
TRAIN=$1 PEAK=$2 TORCH=$3 CORPUS=$4
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/lib.sh"
cores=$(nproc)
# cpu_timed OUT CMD...: runs CMD (stdout to OUT), then prints "CPU/wall".
cpu_timed() {
  local out=$1
  shift
  /usr/bin/time -f "%e %U %S" -o "$WORK/time" "$@" >"$out"
  cpu_per_wall "$WORK/time"
}
ours() { # OUT threads steps layers heads embed seq batch vocab [train_gpt flags]
  local out=$1
  shift
  cpu_timed "$out" env -u OPENBLAS_CORETYPE "$TRAIN" --data "$CORPUS" --quiet --threads "$1" \
    --profile "$WORK/profile.json" "${@:9}" \
    --steps "$2" --layers "$3" --heads "$4" --embed "$5" --context "$6" --seq "$6" --batch "$7" \
    --vocab "$8"
}
# theirs OUT TORCH_THREADS BLAS_THREADS steps layers heads embed seq batch vocab
theirs() {
  local out=$1 tt=$2 bt=$3 steps=$4
  shift 4
  cpu_timed "$out" env -u OPENBLAS_CORETYPE OPENBLAS_NUM_THREADS="$bt" OMP_NUM_THREADS="$tt" \
    /usr/bin/python3 "$TORCH" "$@" "$tt" "$steps"
}
toks_ours() { awk '/^done/ {print $6}' "$1"; }
toks_theirs() { awk '{print $2}' "$1"; }
host_line
env -u OPENBLAS_CORETYPE "$TRAIN" --threads 1 --quiet --calibrate "$WORK/profile.json"
library=$(/usr/bin/python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))["device"]
print(d["matmul_library"], " ".join("%s %.1f" % (k, v / 1e9) for k, v in d["matmul_libraries"].items()))' \
  "$WORK/profile.json")
echo "matrix products: ${library%% *}, chosen by train_gpt --calibrate (GFLOP/s of a training step," \
  "1 thread: ${library#* })"
library=${library%% *}
env -u OPENBLAS_CORETYPE "$PEAK" 1 | tee "$WORK/peak"
env -u OPENBLAS_CORETYPE "$PEAK" 2 "$library"
# The chosen library's products at both models' shapes (the ceiling it
# puts on model work there), beside its square peak in the same run.
env -u OPENBLAS_CORETYPE "$PEAK" 1 --model 4,256,256,8,4096 --model 12,768,256,4,50257 "$library"
for lib in openblas onednn blis; do
  ours "$WORK/a" 1 6 4 4 256 256 8 4096 --matmul-library "$lib" >/dev/null
  echo "  L4 C256, 1 thread, on $lib: $(toks_ours "$WORK/a") t/s, model work $(awk '/^done/ {print $8}' "$WORK/a") GFLOP/s"
  if [ "$lib" = "$library" ]; then
    work=$(awk '/^done/ {print $8}' "$WORK/a")
    peak=$(awk -v l="$lib" '$3 == l {print $6}' "$WORK/peak")
    share=$(awk "BEGIN{printf \"%.0f\", 100 * $work / $peak}")
  fi
done
echo "  model work on $library, 1 thread: $work GFLOP/s = $share% of its sgemm peak ($peak GFLOP/s)"
printf "%-34s %5s %22s %22s %7s\n" model cores "tessera (CPU/wall)" "PyTorch (CPU/wall)" ratio
run() { # label steps layers heads embed seq batch vocab
  local label=$1 steps=$2
  shift 2
  local a b ca cb w1
  for t in 1 2; do
    ca=$(ours "$WORK/a" "$t" "$steps" "$@")
    cb=$(theirs "$WORK/b" "$t" "$t" "$steps" "$@")
    a=$(toks_ours "$WORK/a")
    b=$(toks_theirs "$WORK/b")
    printf "%-34s %5s %11s t/s (%s) %11s t/s (%s) %6.2fx\n" "$label" "$t" "$a" "$ca" "$b" "$cb" \
      "$(awk "BEGIN{print $a / $b}")"
    if [ "$t" = 1 ]; then w1=$(awk '/^done/ {print $8}' "$WORK/a"); fi
  done
  echo "  (ours, 1 thread: model work $w1 GFLOP/s = $(awk "BEGIN{printf \"%.0f\", 100 * $w1 / $peak}")%" \
    "of $library's 1-thread sgemm peak, $peak GFLOP/s)"
  # PyTorch's best on every core: torch's threads x OpenBLAS's, each way.
  local best=0 how="" bt tt
  for tt in 1 "$cores"; do
    bt=$((cores / tt))
    cb=$(theirs "$WORK/b" "$tt" "$bt" "$steps" "$@")
    b=$(toks_theirs "$WORK/b")
    if awk "BEGIN{exit !($b > $best)}"; then
      best=$b
      how="torch threads $tt x BLAS threads $bt, CPU/wall $cb"
    fi
  done
  ca=$(ours "$WORK/a" "$cores" "$steps" "$@")
  a=$(toks_ours "$WORK/a")
  printf "%-34s %5s %11s t/s (%s) %11s t/s best %6.2fx  (PyTorch: %s)\n" "" "$cores" "$a" "$ca" \
    "$best" "$(awk "BEGIN{print $a / $best}")" "$how"
}
run "L4 C256 H4 T256 B8 V4096" 6 4 4 256 256 8 4096
haswell=$(OPENBLAS_CORETYPE=Haswell "$TRAIN" --data "$CORPUS" --quiet --threads 2 --steps 6 \
  --layers 4 --heads 4 --embed 256 --context 256 --batch 8 --vocab 4096 2>/dev/null |
  awk '/^done/ {print $6}')
echo "  (same, 2 threads, OPENBLAS_CORETYPE=Haswell forced: $haswell t/s)"
run "GPT-2 124M (L12 C768 H12) T256 B4" 3 12 12 768 256 4 50257
