#!/usr/bin/env bash
# The libraries' layering, enforced by the linker and checked here: the
# ckpt program (its auto-parallel verb plans with tessera_plan) and the
# Python module (tessera_train) link neither the CPU kernels nor a GEMM
# library (OpenBLAS, oneDNN, BLIS).
# Usage: links_test.sh CKPT PYTHON_MODULE TRAIN_GPT
set -u
source "$(dirname "$0")/lib.sh"
no_kernels() {  # BINARY
  ! ldd "$1" | grep -qiE "openblas|dnnl|blis" && ! nm -C "$1" | grep -q " tessera::kernels::"
}
check "ckpt links no kernels and no GEMM library" no_kernels "$1"
check "the Python module links no kernels and no GEMM library" no_kernels "$2"
# The check can fail: train_gpt, which computes, has both.
for lib in openblas dnnl blis; do
  check "... (train_gpt does link them: $lib)" bash -c "ldd '$3' | grep -qi $lib"
done
echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
