#!/usr/bin/env bash
# Real MindSpore files (../shared/fixtures/mindspore): what MindSpore 2.5's
# transform_checkpoints writes is what `ckpt reshard --format mindspore`
# writes, byte for byte; MindFormers' real pipeline strategies (the word
# embedding and its optimizer states on both stages) go full -> 8 -> 4 ->
# full bit-exact; a rank directory storing the embedding on both stages is
# read from stage 0; MindSpore-written .ckpt files rewrite byte for byte.
# Usage: mindspore_fixtures_test.sh CKPT PROTO_DIR FIXTURES_DIR
# Exits 77 (skipped) when the fixtures are not there.
set -u
ckpt=$(realpath "$1")
protos=$(realpath "$2")
fixtures=$3
if [ ! -d "$fixtures/transform_cases" ]; then
  echo "SKIP: no MindSpore fixtures at $fixtures"
  exit 77
fi
fixtures=$(realpath "$fixtures")
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../lib.sh"
cd "$work"
cases=$fixtures/transform_cases
s8=$fixtures/mindformers_test_ckpt_transform/strategy_8_npus.ckpt
s4=$fixtures/mindformers_test_ckpt_transform/strategy_4_npus.ckpt
embedding=backbone.embedding.word_embedding.embedding_table

same_tree() {  # same_tree EXPECTED OUT: every file of EXPECTED identical in OUT, and no more
  local f n=0
  for f in $(cd "$1" && find . -type f | sort); do
    cmp -s "$1/$f" "$2/$f" || { echo "  differs: $f"; return 1; }
    n=$((n + 1))
  done
  [ "$n" -gt 0 ] && [ "$(cd "$2" && find . -type f | wc -l)" -eq "$n" ]
}

for dir in "$cases"/*/; do
  c=$(basename "$dir")
  src=() dst=$dir/dst_strategy.ckpt
  [ -f "$dir/src_strategy.ckpt" ] && src=(--src-strategy "$dir/src_strategy.ckpt")
  case $c in
    full_to_real_8npus) dst=$s8 ;;
    real_8npus_to_4npus) src=(--src-strategy "$s8") dst=$s4 ;;
  esac
  run "$ckpt" reshard "$dir/src" "${src[@]}" --dst-strategy "$dst" --format mindspore \
    --prefix checkpoint_ -o "$c" -q
  check "$c: reshard runs" test $rc -eq 0
  check "$c: every rank file byte-identical to MindSpore 2.5's" same_tree "$dir/expected" "$c"
done

full=$cases/full_to_real_8npus/src
run "$ckpt" split "$full" --strategy "$s8" --format mindspore --prefix checkpoint_ -o r8 -q
check "full -> strategy_8_npus" test $rc -eq 0
for r in 0 3 4 7; do
  check "strategy_8_npus: rank $r (stage $((r / 4))) holds the embedding and its 3 states" \
    test "$("$ckpt" inspect r8/rank_$r/checkpoint_$r.ckpt | grep -c "$embedding")" -eq 4
done
run "$ckpt" reshard r8 --src-strategy "$s8" --dst-strategy "$s4" --format mindspore \
  --prefix checkpoint_ -o r4 -q
check "strategy_8_npus -> strategy_4_npus" test $rc -eq 0
for r in 0 3; do
  check "strategy_4_npus: rank $r holds the embedding and its 3 states" \
    test "$("$ckpt" inspect r4/rank_$r/checkpoint_$r.ckpt | grep -c "$embedding")" -eq 4
done
run "$ckpt" merge r4 --src-strategy "$s4" --format mindspore -o back.ckpt -q
check "strategy_4_npus -> full" test $rc -eq 0
run "$ckpt" diff back.ckpt "$full/rank_0/checkpoint_0.ckpt"
check "full -> 8 -> 4 -> full is bit-exact" test $rc -eq 0
run "$ckpt" reshard r8 --src-strategy "$s8" --dst-strategy "$s4" -o native4 -q
run "$ckpt" diff native4 "$full/rank_0/checkpoint_0.ckpt"
check "strategy_8_npus -> native on strategy_4_npus: bit-exact" test $rc -eq 0
check "native keeps the embedding on both stages" \
  grep -q "$embedding.*stage pp=0,1" <("$ckpt" inspect native4)

# A rank directory whose stage-1 copy of the embedding differs: read from
# stage 0, as MindSpore's transform does.
cp -r r8 r8b
chmod -R u+w r8b
protoc --python_out=. -I"$protos" "$protos/mindspore_checkpoint.proto"
"$py" - r8b/rank_5/checkpoint_5.ckpt "$embedding" <<'EOF'
import sys
import mindspore_checkpoint_pb2 as pb
path, name = sys.argv[1], sys.argv[2]
m = pb.Checkpoint()
m.ParseFromString(open(path, "rb").read())
for v in m.value:
    if v.tag == name:
        v.tensor.tensor_content = bytes(b ^ 0x40 for b in v.tensor.tensor_content)
open(path, "wb").write(m.SerializeToString())
EOF
run "$ckpt" reshard r8b --src-strategy "$s8" --dst-strategy "$s4" --format mindspore \
  --prefix checkpoint_ -o r4b -q
check "a differing stage-1 copy is read from stage 0" same_tree r4 r4b
run "$ckpt" diff r8b r8 --a-strategy "$s8" --b-strategy "$s8"
check "diff: the values read are the same" test $rc -eq 0
check "diff: says that the stage copies differ" grep -q "note: r8b: tensor '$embedding'.*rank_5" out
run "$ckpt" verify r8b --src-strategy "$s8"
check "verify: says that the stage copies differ" grep -q "note: .*'$embedding'.*rank_5" out

for g in "$fixtures"/mindformers_golden/*.ckpt; do
  name=$(basename "$g")
  run "$ckpt" convert "$g" --format mindspore -o "$name" -q
  check "$name: read and rewritten byte for byte" cmp -s "$g" "$name"
done

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
