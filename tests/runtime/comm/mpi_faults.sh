#!/usr/bin/env bash
# MPI failure cases that end the job: each must end it quickly, non-zero,
# with the rank at fault named. Usage: mpi_faults.sh MPIEXEC TEST_BINARY
set -uo pipefail
MPIEXEC=$1
BIN=$2
fail=0
run() {  # mode, expected text
  local start=$SECONDS out rc
  out=$(timeout 60 "$MPIEXEC" --allow-run-as-root --oversubscribe -np 2 "$BIN" "$1" 2>&1)
  rc=$?
  local took=$((SECONDS - start))
  if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -q -- "$2" <<<"$out" || [ $took -gt 45 ]; then
    echo "FAIL $1: exit $rc after ${took}s; expected '$2' in:"
    echo "$out"
    fail=1
  else
    echo "ok   $1: exit $rc after ${took}s: $(grep -m1 -- "$2" <<<"$out")"
  fi
}
run deadpeer "rank 1"
run timeout "rank 0 of 'world' (mpi, 2 ranks): allreduce of 1024 f32 sum did not complete within 2 s"
exit $fail
