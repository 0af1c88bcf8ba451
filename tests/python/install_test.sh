#!/usr/bin/env bash
# scripts/install-python into a fresh virtualenv and into a prefix: the
# package imports from there (not from the build tree) and reads a checkpoint.
# Usage: install_test.sh SOURCE_DIR BUILD_DIR PYTHON
set -euo pipefail
src=$1
build=$2
py=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/samples/make_checkpoint" -o "$work/ck" --mesh tp=2 --layers 1 --embed 32 --vocab 64 \
  --context 16 >/dev/null
check='import sys, tessera; r = tessera.open(sys.argv[1]); assert r.read("wte").shape == (64, 32); print(tessera.__file__)'
"$py" -m venv --without-pip --system-site-packages "$work/venv"
TESSERA_BUILD_DIR=$build bash "$src/scripts/install-python" --no-build "$work/venv" >/dev/null
where=$(cd "$work" && env -u PYTHONPATH "$work/venv/bin/python" -c "$check" "$work/ck")
case "$where" in "$work/venv/"*) ;; *) echo "imported from $where, not the venv"; exit 1 ;; esac
site=$(TESSERA_BUILD_DIR=$build bash "$src/scripts/install-python" --no-build --prefix "$work/prefix")
where=$(cd "$work" && PYTHONPATH=$site "$py" -c "$check" "$work/ck")
case "$where" in "$work/prefix/"*) ;; *) echo "imported from $where, not the prefix"; exit 1 ;; esac
echo "install-python: venv and prefix installs import and read"
