# Shared by scripts/test, scripts/demo and scripts/bench: install what is
# missing (Debian packages only), configure and build.
set -euo pipefail

TESSERA_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${TESSERA_BUILD_DIR:-$TESSERA_ROOT/build}

# Build tools and libraries, all from Debian.
TESSERA_PACKAGES=(
  g++ cmake make pkg-config ccache clang-format
  libprotobuf-dev protobuf-compiler
  libhdf5-dev libzstd-dev libcli11-dev
  libopenmpi-dev openmpi-bin libgloo-dev iproute2
  catch2 libopenblas-dev libdnnl-dev ocl-icd-opencl-dev libblis-dev
  libxxhash-dev nlohmann-json3-dev libisal-dev
  python3 python3-torch python3-numpy python3-h5py python3-protobuf
  python3-dev python3-pybind11 python3-pytest python3-venv
  python3-pip python3-setuptools python3-wheel
)
# libdnnl-dev and libblis-dev: the GEMM libraries calibration measures
# beside OpenBLAS (runtime/matmul.h); ocl-icd-opencl-dev because oneDNN's
# CMake package requires OpenCL (its GPU runtime), which we do not use.
# clang-format: scripts/test checks the C++ sources are formatted
# (.clang-format).
# python3-dev and pybind11: the `tessera` Python package (python/); pytest
# runs its tests; python3-venv: scripts/install-python into a virtualenv.
# pip, setuptools and wheel: `pip install --no-build-isolation .` builds the
# package (pyproject.toml) with Debian's build tools, with no package index.
# python3-torch and numpy: the numerical reference of the parity tests.
# The benchmarks' peers (scripts/bench only).
TESSERA_BENCH_PACKAGES=(time)

tessera_install() {
  local missing=()
  for p in "${TESSERA_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

# Optimized, with line tables (-g1: enough for perf, backtraces and ASan's
# reports; full -g makes the builds 30-50% slower for variables we never
# inspect in CI).
TESSERA_RELEASE_FLAGS=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG")

tessera_build() {
  local launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S "$TESSERA_ROOT" -B "$BUILD_DIR" "${TESSERA_RELEASE_FLAGS[@]}" \
    "${launcher[@]}" "$@" >/dev/null
  cmake --build "$BUILD_DIR" -j "$(nproc)"
}

# The NCCL backend, built where CUDA and NCCL are installed
# (/usr/local/cuda): the communication layer and its NCCL test only.
NCCL_DIR=${TESSERA_NCCL_DIR:-$TESSERA_ROOT/build-nccl}
tessera_has_nccl() { [ -f "${CUDA_HOME:-/usr/local/cuda}/include/nccl.h" ]; }
tessera_build_nccl() {
  local launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S "$TESSERA_ROOT" -B "$NCCL_DIR" "${TESSERA_RELEASE_FLAGS[@]}" \
    -DTESSERA_WITH_NCCL=ON "${launcher[@]}" >/dev/null
  cmake --build "$NCCL_DIR" -j "$(nproc)" --target comm_nccl_test
}

# The code that parses untrusted bytes (formats/, ckpt/) and its tests,
# built again with ASan + UBSan (any finding fails the run).
SANITIZE_DIR=${TESSERA_SANITIZE_DIR:-$TESSERA_ROOT/build-asan}
tessera_build_sanitized() {
  local launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # -O0: this build is compiled once per run and its tests are short, so
  # compile time rules: -O0 compiles the sanitized sources in about 70% of
  # -O1's time (gpt_search.cc 19 s -> 14 s, native.cc 16 s -> 10 s), which
  # outweighs its slower tests. -g1 keeps the reports' line numbers.
  cmake -S "$TESSERA_ROOT" -B "$SANITIZE_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O0 -g1 -DNDEBUG" -DTESSERA_SANITIZE=ON "${launcher[@]}" >/dev/null
  cmake --build "$SANITIZE_DIR" -j "$(nproc)" --target "$@"
}

# The C++ sources of the project (a git checkout's, new files not yet
# added included; else the tree's outside the build folders).
tessera_cxx_sources() {
  if git -C "$TESSERA_ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$TESSERA_ROOT" ls-files --cached --others --exclude-standard '*.cc' '*.h'
  else
    (cd "$TESSERA_ROOT" && find . -path './build*' -prune -o \( -name '*.cc' -o -name '*.h' \) -print)
  fi
}
