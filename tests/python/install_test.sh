#!/usr/bin/env bash
# The package as its users install it, with pip and no package index:
# 1. pip install --no-build-isolation --no-index <repo> into a virtualenv that
#    sees Debian's packages: imported from outside the repository, it declares
#    numpy, saves a checkpoint and reads it back, also as safetensors;
# 2. scripts/install-python VENV (which makes the virtualenv), and a
#    system-wide install's layout (pip --root, as /usr/local would be);
# 3. a virtualenv without Debian's packages has no numpy: pip refuses the
#    install naming numpy, with and without the build tools in it, and
#    `import tessera` there (from the build tree) names numpy too.
# setup.py builds in BUILD_DIR (TESSERA_CMAKE_BUILD_DIR), where CTest's build
# has made the extension already, instead of compiling the libraries again.
# Usage: install_test.sh SOURCE_DIR BUILD_DIR PYTHON
set -euo pipefail
src=$1
build=$2
py=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
# pip as on a machine without an index, its configuration or its cache.
unset PYTHONPATH PIP_FIND_LINKS PIP_INDEX_URL PIP_EXTRA_INDEX_URL
export PIP_CONFIG_FILE=/dev/null PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
  PIP_ROOT_USER_ACTION=ignore TESSERA_CMAKE_BUILD_DIR=$build
fail() { echo "install_test: $*" >&2; exit 1; }

cat >roundtrip.py <<'EOF'
import importlib.metadata as md
import os
import sys

import numpy as np
import tessera

where = os.path.dirname(tessera.__file__)
assert where.startswith(sys.argv[1] + "/"), f"imported from {where}, not {sys.argv[1]}"
assert md.version("tessera") == tessera.__version__, (md.version("tessera"), tessera.__version__)
assert "numpy" in md.requires("tessera"), md.requires("tessera")


class OneRank:
    def barrier(self):
        pass

    def allgather_object(self, obj):
        return [obj]


s = tessera.strategy(mesh={"dp": 1}, tensors={"w": {"shape": [8, 16], "dtype": "f32"}})
w = np.arange(128, dtype=np.float32).reshape(8, 16)
tessera.save_shards("ck", 3, s, 0, {"w": w}, OneRank())
r = tessera.open("ck")
assert r.format == "native" and r.step == 3 and np.array_equal(r.read("w"), w)
tessera.transform("ck", "w.safetensors", format="safetensors")
assert np.array_equal(tessera.open("w.safetensors").read("w", [(2, 4), (0, 16)]), w[2:4])
print(where)
EOF
roundtrip() {  # PYTHON WHERE: the round trip in a fresh folder outside the repository
  rm -rf rt && mkdir rt
  (cd rt && "$1" ../roundtrip.py "$2") >/dev/null
}

# 1. pip into a virtualenv with Debian's site packages.
"$py" -m venv --system-site-packages venv
venv/bin/python -m pip install -q --no-build-isolation --no-index "$src" ||
  fail "pip install into a --system-site-packages virtualenv failed"
roundtrip "$work/venv/bin/python" "$work/venv"
# The pure-Python modules pip installs are those CMake lists for the build tree.
[ "$(cd "$src/python/tessera" && ls ./*.py)" = "$(cd "$build/python/tessera" && ls ./*.py)" ] ||
  fail "python/CMakeLists.txt's TESSERA_PY_SOURCES differ from python/tessera/*.py"

# 2. scripts/install-python, and a system-wide layout under a root.
where=$(TESSERA_BUILD_DIR=$build bash "$src/scripts/install-python" "$work/wrapped" -q \
  2>wrapped.log) || { cat wrapped.log; fail "scripts/install-python failed"; }
[ -f wrapped/pyvenv.cfg ] && grep -q "include-system-site-packages = true" wrapped/pyvenv.cfg ||
  fail "scripts/install-python made no --system-site-packages virtualenv"
case "$where" in "$work/wrapped/"*) ;; *) fail "install-python printed '$where'" ;; esac
roundtrip "$work/wrapped/bin/python" "$work/wrapped"
"$py" -m pip install -q --no-build-isolation --no-index --root "$work/root" "$src" ||
  fail "pip install --root failed"
site=$(dirname "$(find "$work/root" -path '*-packages/tessera/__init__.py')")
site=$(dirname "$site")
PYTHONPATH=$site roundtrip "$py" "$site"

# 3. Without Debian's site packages there is no numpy.
"$py" -m venv bare
if bare/bin/python -m pip install --no-build-isolation --no-index "$src" >bare.log 2>&1; then
  fail "pip installed tessera where numpy is missing"
fi
# (setup.py's message: the build tools are missing too.)
grep -q "lacks wheel.*numpy" bare.log || { cat bare.log; fail "pip's refusal names no numpy"; }
# With the build tools (Debian's wheel and pybind11, not numpy) it is pip's
# resolver that refuses: numpy is declared.
mkdir tools
for m in wheel pybind11; do
  pkg=$("$py" -c 'import importlib as i, os, sys
print(os.path.dirname(i.import_module(sys.argv[1]).__file__))' $m)
  ln -s "$pkg" "$(dirname "$pkg")/$m"-*-info tools/
done
purelib=$(bare/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$work/tools" >"$purelib/tools.pth"
if bare/bin/python -m pip install --no-build-isolation --no-index "$src" >bare.log 2>&1; then
  fail "pip installed tessera where numpy is missing"
fi
grep -q "requirement numpy (from tessera)" bare.log ||
  { cat bare.log; fail "pip's resolver did not refuse for numpy"; }
bare/bin/python -c 'import tessera' 2>/dev/null && fail "tessera is importable in the bare virtualenv"
msg=$(PYTHONPATH=$build/python bare/bin/python -c 'import tessera' 2>&1) &&
  fail "import tessera without numpy succeeded"
case "$msg" in
  *"tessera needs numpy"*"pip install numpy"*) ;;
  *) fail "import tessera without numpy: $msg" ;;
esac
echo "install: pip into virtualenvs and a root, install-python; refused without numpy"
