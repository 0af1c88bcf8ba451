#!/usr/bin/env bash
# End-to-end test of `ckpt plan` through the real binary and real files:
# exit codes, output, and errors that name the file and tensor at fault.
# Usage: plan_cli_test.sh CKPT RESHARD_DEMO
set -u
ckpt=$(realpath "$1")
demo=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../lib.sh"

"$demo" "$work" --src dp=2,tp=4 --dst pp=2,dp=1,tp=2 >"$work/demo.out" 2>&1
check "reshard_demo verifies every shard" grep -q "equal the model bit for bit" "$work/demo.out"

"$ckpt" plan "$work/src_strategy.json" "$work/dst_strategy.json" >"$work/out" 2>&1
rc=$?
check "plan exits 0" test $rc -eq 0
check "plan reports tensors and shards" grep -q "^76 tensors, 152 destination shards" "$work/out"
check "plan names both meshes" grep -q "source \[dp=2, tp=4\] (8 ranks) -> destination \[pp=2, dp=1, tp=2\] (4 ranks)" "$work/out"

"$ckpt" plan "$work/src_strategy.json" --mesh dp=1,tp=8 -v >"$work/out" 2>&1
check "--mesh resizes the source's axes" grep -q "destination \[dp=1, tp=8\] (8 ranks)" "$work/out"
check "--verbose lists copies" grep -q "^  rank 7 " "$work/out"

# The ckpt-<verb> alias dispatches on argv[0].
ln -s "$ckpt" "$work/ckpt-plan"
"$work/ckpt-plan" "$work/src_strategy.json" --mesh dp=2,tp=2 >"$work/out" 2>&1
check "ckpt-plan alias works" grep -q "destination \[dp=2, tp=2\]" "$work/out"

"$ckpt" plan "$work/missing.json" --mesh dp=2 >"$work/out" 2>&1
rc=$?
check "missing file exits 1" test $rc -eq 1
check "missing file is named" grep -q "missing.json" "$work/out"

cat >"$work/bad.json" <<'JSON'
{"mesh": {"axes": ["dp"], "shape": [2]},
 "tensors": {"h.3.mlp.c_fc.weight": {"shape": [8, 32], "split": [null, "tp"]}}}
JSON
"$ckpt" plan "$work/bad.json" --mesh dp=2 >"$work/out" 2>&1
rc=$?
check "bad strategy exits 1" test $rc -eq 1
check "bad strategy names file, tensor and axis" grep -q "bad.json': tensor 'h.3.mlp.c_fc.weight': axis 'tp'" "$work/out"

"$ckpt" plan "$work/src_strategy.json" --mesh dp=2 >"$work/out" 2>&1
rc=$?
check "mesh lacking an axis exits 1" test $rc -eq 1
check "mesh lacking an axis names the tensor" grep -q "tensor 'wte'" "$work/out"

"$ckpt" plan >"$work/out" 2>&1
rc=$?
check "usage error exits 2" test $rc -eq 2

echo "$passes passed, $fails failed"
test $fails -eq 0
