#!/usr/bin/env bash
# The matrix products' library (runtime/matmul.h) end to end: train_gpt
# with OpenBLAS (the default), oneDNN and BLIS gives the same losses within
# 1e-5 relative per step, and says which it uses; --calibrate measures them
# and records the fastest in the profile, which --profile then uses (the
# flag overriding it); a job whose ranks disagree (mpirun with two
# programs) refuses to start, naming the rank; processes under tessera-run
# (Gloo) take the profile's library alike; a bad name in a profile is
# refused naming the file and the key.
# Usage: train_gpt_matmul_test.sh TRAIN_GPT CORPUS MPIRUN TESSERA_RUN
set -uo pipefail
BIN=$1
CORPUS=$2
MPIRUN=("$3" --allow-run-as-root --oversubscribe)
RUN=$4
WORK=$(mktemp -d)
trap 'pkill -9 -P $$ 2>/dev/null; rm -rf "$WORK"' EXIT
source "$(dirname "$0")/../lib.sh"
PROFILES="$(dirname "$0")/../../samples/gpt/profiles"
SMALL=(--data "$CORPUS" --layers 2 --heads 4 --embed 64 --context 64 --seq 64 --batch 4 --lr 1e-3
  --max-norm 0.5 --threads 1)
train() { # train LOG FLAGS...
  local log=$1
  shift
  "$BIN" "${SMALL[@]}" "$@" >"$log" 2>&1
}
uses() { grep -q "parameters (matrix products: $2" "$1"; } # uses LOG NAME

train "$WORK/openblas.log" --steps 20
check "default: OpenBLAS, and the log says so" uses "$WORK/openblas.log" "OpenBLAS 0\."
for lib in onednn:oneDNN blis:BLIS; do
  train "$WORK/${lib%%:*}.log" --steps 20 --matmul-library "${lib%%:*}"
  check "--matmul-library ${lib%%:*}: the log names ${lib##*:}" uses "$WORK/${lib%%:*}.log" "${lib##*:} "
  check "--matmul-library ${lib%%:*}: OpenBLAS's losses within 1e-5" \
    close "$WORK/${lib%%:*}.log" "$WORK/openblas.log" 20
done
train "$WORK/dp.log" --steps 20 --ranks 2 --matmul-library blis
check "2 in-process ranks on BLIS: the single process's losses" close "$WORK/dp.log" "$WORK/blis.log" 20

# A profile naming a library: --profile uses it; the flag overrides it.
/usr/bin/python3 - "$PROFILES/debian-vm-2core.json" "$WORK/blis.json" "$WORK/bad.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["device"]["matmul_library"] = "blis"
json.dump(p, open(sys.argv[2], "w"))
p["device"]["matmul_library"] = "mkl"
json.dump(p, open(sys.argv[3], "w"))
PY
train "$WORK/profile.log" --steps 3 --profile "$WORK/blis.json"
check "--profile with matmul_library blis: BLIS" uses "$WORK/profile.log" "BLIS "
train "$WORK/flag.log" --steps 3 --profile "$WORK/blis.json" --matmul-library onednn
check "--matmul-library overrides the profile's" uses "$WORK/flag.log" "oneDNN "
train "$WORK/bad.log" --steps 3 --profile "$WORK/bad.json"
check "a profile's unknown library: refused" test $? -ne 0
check "  naming the file and the key" grep -q "bad.json: device.matmul_library.*mkl" "$WORK/bad.log"

# Processes under tessera-run (Gloo) read the same profile.
timeout 300 "$RUN" --nproc-per-node 2 -- "$BIN" "${SMALL[@]}" --steps 20 --profile "$WORK/blis.json" \
  >"$WORK/gloo.log" 2>&1
check "tessera-run, 2 processes: trains" test $? -eq 0
rank0 "$WORK/gloo.log" >"$WORK/gloo0.log"
check "  on the profile's library" uses "$WORK/gloo0.log" "BLIS "
check "  with the single process's losses" close "$WORK/gloo0.log" "$WORK/blis.log" 20

# Ranks that disagree: refused before a step, naming the rank.
"${MPIRUN[@]}" -np 1 "$BIN" "${SMALL[@]}" --steps 3 : -np 1 "$BIN" "${SMALL[@]}" --steps 3 \
  --matmul-library blis >"$WORK/mixed.log" 2>&1
check "mpirun, rank 1 on BLIS and rank 0 on OpenBLAS: refused" test $? -ne 0
check "  naming rank 1 and both libraries" \
  grep -q "rank 1 does its matrix products with blis and rank 0 with openblas" "$WORK/mixed.log"
check "  before a step" bash -c "! grep -q '^step' '$WORK/mixed.log'"

# --calibrate measures the three and records the fastest; --profile uses it.
"$BIN" --threads 1 --quiet --calibrate "$WORK/calibrated.json" >"$WORK/cal.log" 2>&1
check "--calibrate: measured" test $? -eq 0
chosen=$(/usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))["device"]
figures = d["matmul_libraries"]
assert sorted(figures) == ["blis", "onednn", "openblas"], figures
assert all(v > 0 for v in figures.values()), figures
assert d["matmul_library"] == max(figures, key=figures.get), d
print({"openblas": "OpenBLAS", "onednn": "oneDNN", "blis": "BLIS"}[d["matmul_library"]])
' "$WORK/calibrated.json")
check "  every library's figure, the fastest chosen ($chosen)" test -n "$chosen"
train "$WORK/calibrated.log" --steps 3 --profile "$WORK/calibrated.json"
check "  --profile of it trains on $chosen" uses "$WORK/calibrated.log" "$chosen"

echo "$passes passed, $fails failed"
test "$fails" -eq 0
