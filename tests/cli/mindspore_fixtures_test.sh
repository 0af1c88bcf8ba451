#!/usr/bin/env bash
# Real MindSpore files (tests/data/mindspore): what MindSpore 2.5's
# transform_checkpoints writes is what `ckpt reshard --format mindspore`
# writes, byte for byte; MindFormers' real pipeline strategies (the word
# embedding and its optimizer states on both stages) go full -> 8 -> 4 ->
# full bit-exact; a rank directory storing the embedding on both stages is
# read from stage 0; MindSpore-written .ckpt files rewrite byte for byte.
# Usage: mindspore_fixtures_test.sh CKPT PROTO_DIR FIXTURES_DIR
set -u
ckpt=$(realpath "$1")
protos=$(realpath "$2")
fixtures=$3
if [ ! -d "$fixtures/transform_cases" ]; then
  echo "FAIL: no MindSpore fixtures at $fixtures"
  exit 1
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
run "$ckpt" merge r4 --src-strategy "$s4" --format mindspore --prefix checkpoint_ -o back-dir -q
check "a merged .ckpt has the bytes of rank_0 of a merged directory (transform_checkpoints' order)" \
  cmp -s back.ckpt back-dir/rank_0/checkpoint_0.ckpt
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

# MindSpore's safetensors flavour (format="safetensors", 2.3+): rank
# directories and unified_safetensors output, round trips and layout. No
# MindSpore-written safetensors file exists here; MindSpore writes them all
# through the safetensors library (safetensors.numpy.save_file), so every
# file is checked against a reference serializer written from that
# library's source (tensor.rs: dtype order, then name; compact JSON with
# dtype/shape/data_offsets; header padded with spaces to 8 bytes).
cat >st_reference.py <<'PY'
import json, struct, sys
ORDER = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32",
         "F32", "F64", "I64", "U64"]
def check(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = header.pop("__metadata__", None)
    tensors = {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
               for k, v in header.items()}
    # What safetensors' serialize writes for these tensors.
    names = sorted(tensors, key=lambda k: (-ORDER.index(tensors[k][0]), k.encode()))
    out, at = {}, 0
    for k in names:
        out[k] = {"dtype": tensors[k][0], "shape": tensors[k][1],
                  "data_offsets": [at, at + len(tensors[k][2])]}
        at += len(tensors[k][2])
    text = json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    want = struct.pack("<Q", len(text)) + text + b"".join(tensors[k][2] for k in names)
    assert meta is None, path + ": __metadata__ where MindSpore writes none"
    assert raw == want, path + ": not laid out as the safetensors library lays it out"
for p in sys.argv[1:]:
    check(p)
PY
st_names() {  # st_names FILE: the tensor names in a safetensors file's header
  "$py" -c "
import json, struct, sys
f = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', f.read(8))[0]
print('\n'.join(json.loads(f.read(n))))" "$1"
}
run "$ckpt" split "$full" --strategy "$s8" --format mindspore-safetensors --prefix checkpoint_ -o st8 -q
check "safetensors: full -> strategy_8_npus rank directories" test $rc -eq 0
check "safetensors: rank_<r>/checkpoint_<r>.safetensors for every rank" \
  test "$(ls st8/rank_*/checkpoint_*.safetensors | wc -l)" -eq 8
check "safetensors: rank files laid out as the safetensors library writes them" \
  "$py" st_reference.py st8/rank_*/*.safetensors
check "safetensors: rank 5 (stage 1) holds the embedding and its 3 states" \
  test "$(st_names st8/rank_5/checkpoint_5.safetensors | grep -c "$embedding")" -eq 4
run "$ckpt" reshard st8 --src-strategy "$s8" --dst-strategy "$s4" --format mindspore-safetensors -o st4 -q
check "safetensors: strategy_8_npus -> strategy_4_npus" test $rc -eq 0
run "$ckpt" merge st4 --src-strategy "$s4" --format mindspore-safetensors --max-shard-size 10KB \
  -o unified -q
check "safetensors: merged into unified_safetensors' layout" test $rc -eq 0
check "safetensors: several parts and param_name_map.json" \
  test -f unified/part2.safetensors -a -f unified/param_name_map.json
check "safetensors: parts laid out as the safetensors library writes them" \
  "$py" st_reference.py unified/part*.safetensors
check "safetensors: param_name_map.json as json.dumps(indent=4) writes it, each name in its part" \
  "$py" -c "
import json, struct
text = open('unified/param_name_map.json').read()
m = json.loads(text)
assert text == json.dumps(m, indent=4), 'formatting'
for name, part in m.items():
    f = open('unified/' + part, 'rb'); n = struct.unpack('<Q', f.read(8))[0]
    assert name in json.loads(f.read(n)), name
assert len(m) == 145, len(m)
"
run "$ckpt" diff unified "$full/rank_0/checkpoint_0.ckpt"
check "safetensors: full -> 8 -> 4 -> unified is bit-exact" test $rc -eq 0
run "$ckpt" reshard st8 --src-strategy "$s8" --dst-strategy "$s4" --format mindspore \
  --prefix checkpoint_ -o st4ckpt -q
run "$ckpt" diff st4ckpt r4 --a-strategy "$s4" --b-strategy "$s4"
check "safetensors rank files -> .ckpt rank files: the same tensors" test $rc -eq 0
run "$ckpt" merge st8 --src-strategy "$s8" --format mindspore-safetensors -o one.safetensors -q
check "safetensors: merged into one file, laid out as the library writes it" \
  "$py" st_reference.py one.safetensors
mixed=$cases/dp2mp4_opt_to_mp2pp2_opt
run "$ckpt" reshard "$mixed/src" --src-strategy "$mixed/src_strategy.ckpt" \
  --dst-strategy "$mixed/dst_strategy.ckpt" --format mindspore-safetensors -o stmixed -q
check "safetensors: bf16, f16, i32 and f32 rank files in the library's dtype order" \
  "$py" st_reference.py stmixed/rank_*/*.safetensors
run "$ckpt" diff stmixed "$mixed/expected" --a-strategy "$mixed/dst_strategy.ckpt" \
  --b-strategy "$mixed/dst_strategy.ckpt"
check "safetensors: the same tensors as MindSpore's .ckpt output" test $rc -eq 0
# The file MindSpore's transform takes of several in a rank directory: the
# largest last two numbers of its path.
cp -r st8 pick
mv pick/rank_0/checkpoint_0.safetensors pick/rank_0/net-3_200.safetensors
echo garbage >pick/rank_0/net-3_100.safetensors
echo garbage >pick/rank_0/net-2_900.safetensors
run "$ckpt" diff pick st8 --a-strategy "$s8" --b-strategy "$s8"
check "safetensors: of several files, net-3_200 is read (as MindSpore picks it)" test $rc -eq 0
cp r8/rank_1/checkpoint_1.ckpt pick/rank_1/
run "$ckpt" inspect pick --src-strategy "$s8"
check "a rank directory with both .ckpt and .safetensors is refused, named" \
  grep -q "rank_1' holds both .ckpt and .safetensors" out

for g in "$fixtures"/mindformers_golden/*.ckpt; do
  name=$(basename "$g")
  run "$ckpt" convert "$g" --format mindspore -o "$name" -q
  check "$name: read and rewritten byte for byte" cmp -s "$g" "$name"
done

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
