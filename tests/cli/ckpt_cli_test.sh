#!/usr/bin/env bash
# End-to-end tests of the ckpt verbs through the real binary, real files and
# real processes: round trips, exit codes, named errors, no half-written
# output, and a reshard killed with SIGKILL at random moments.
# Usage: ckpt_cli_test.sh CKPT MAKE_CHECKPOINT
set -u
ckpt=$(realpath "$1")
make=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../lib.sh"
v1=$(realpath "$(dirname "$0")/../data/native-v1")  # a format 1 checkpoint
v2=$(realpath "$(dirname "$0")/../data/native-v2")  # a format 2 checkpoint
v2src=$(realpath "$(dirname "$0")/../data/native-v2-source")  # its values and strategy
v3=$(realpath "$(dirname "$0")/../data/native-v3")  # a format 3 checkpoint
v3src=$(realpath "$(dirname "$0")/../data/native-v3-source")  # its values and strategy
cd "$work"
no_output() {  # nothing named $1 or $1.tmp-* is left
  ! ls -d "$1" "$1".tmp-* >/dev/null 2>&1
}
small="--layers 2 --embed 64 --vocab 1000 --context 64"

# --- round trips -------------------------------------------------------------
run "$make" -o a $small --mesh dp=2,tp=4 --zero --optimizer
check "make a sliced dp=2,tp=4 checkpoint" test $rc -eq 0
run "$ckpt" merge a -o full --quiet
check "merge exits 0 and is quiet" test $rc -eq 0 -a ! -s out
run "$make" -o direct $small --mesh dp=2,tp=4 --zero --optimizer --merged
run "$ckpt" diff full direct
check "merge equals the model written whole" test $rc -eq 0
check "diff reports the count" grep -q "^84 tensors compared, 0 differ" out

run "$ckpt" reshard a -o b --mesh dp=1,tp=2 --compress zstd:5 --threads 3 --memory-budget 64KiB
check "reshard to tp=2 with zstd and a tiny budget" test $rc -eq 0
check "reshard prints a summary" grep -q "^reshard: wrote b: 84 tensors" out
run "$ckpt" inspect b
check "inspect shows the new mesh" grep -q "mesh        \[dp=1, tp=2\] (2 ranks)" out
check "inspect shows a layout row" grep -Eq "^h.1.mlp.c_fc.weight +f32 +\[64, 256\] +split \[-, tp\]" out
run "$ckpt" inspect b --json
check "inspect --json is JSON" /usr/bin/python3 -c "import json,sys; j=json.load(open('out')); assert len(j['tensors'])==84 and j['mesh']=={'dp':1,'tp':2}"
"$ckpt" inspect a --json >a.json
/usr/bin/python3 - a.json >strategy.json <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
# The destination strategy: everything split on its last dimension over 4 ranks.
t = {x["name"]: {"shape": x["shape"], "dtype": x["dtype"],
                 "split": [None] * (len(x["shape"]) - 1) + ["tp"] if x["shape"] else []}
     for x in j["tensors"]}
print(json.dumps({"mesh": {"axes": ["tp"], "shape": [4]}, "tensors": t}))
PY
run "$ckpt" split full -o s --strategy strategy.json
check "split by a strategy file" test $rc -eq 0
run "$ckpt" inspect s --json
check "split records the strategy's layouts" /usr/bin/python3 -c "import json; j=json.load(open('out')); assert all(x['dim_axes'][-1]==['tp'] for x in j['tensors'] if x['shape'])"
ln -s "$ckpt" ckpt-merge; ln -s "$ckpt" ckpt-reshard; ln -s "$ckpt" ckpt-split
run ./ckpt-reshard b -o c --strategy strategy.json -q
check "ckpt-reshard alias" test $rc -eq 0
run ./ckpt-merge c -o cm -q
run "$ckpt" diff cm full
check "a -> b -> c -> merge equals the merge of a" test $rc -eq 0
run ./ckpt-split full -o s2 --dst-strategy strategy.json -q
run "$ckpt" diff s s2 --quiet
check "ckpt-split alias, same contents" test $rc -eq 0
run "$ckpt" convert b -o bz --compress zstd -q
run "$ckpt" diff b bz
check "convert keeps contents" test $rc -eq 0
check "convert keeps layouts" /usr/bin/python3 -c "
import json, subprocess
def layouts(p):
    j = json.loads(subprocess.check_output(['$ckpt', 'inspect', p, '--json']))
    return [(t['name'], t['dtype'], t['shape'], t['dim_axes'], t['opt_axes']) for t in j['tensors']], j['mesh']
assert layouts('b') == layouts('bz')"
run "$ckpt" verify b
check "verify a good checkpoint exits 0" test $rc -eq 0
check "verify reports what it checked" grep -q "0 problems" out

# --- differences and bad input ----------------------------------------------
run "$make" -o other $small --mesh dp=2,tp=4 --zero --optimizer --merged --seed 2
run "$ckpt" diff full other
check "diff of different values exits 1" test $rc -eq 1
check "diff names a differing tensor" grep -q "^wte: 64000 of 64000 elements differ" out
run "$ckpt" diff full other --atol 1
check "diff within --atol exits 0" test $rc -eq 0

cp -r b bad && f=$(ls bad/data-*.tsr | head -1)
/usr/bin/python3 -c "
import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[4096+100]^=1; open(p,'wb').write(b)" "$f"
run "$ckpt" verify bad
check "flipped byte: verify exits 1" test $rc -eq 1
check "flipped byte: file and tensor named" grep -q "$f': tensor '.*checksum mismatch" out
run "$ckpt" merge bad -o bad-out
check "flipped byte: merge exits 1 naming the file" grep -q "ckpt: .*$f" out
check "flipped byte: no output left" no_output bad-out

cp -r b trunc && f=$(ls trunc/data-*.tsr | tail -1) && truncate -s -5000 "$f"
run "$ckpt" reshard trunc -o trunc-out --mesh dp=1,tp=1
check "truncated data file exits 1" test $rc -eq 1
check "truncated data file is named" grep -q "$f.*truncated" out
check "truncated: no output left" no_output trunc-out
run "$ckpt" verify trunc
check "verify names the truncated file" grep -q "$f" out

cp -r b gone && rm gone/data-00001.tsr
run "$ckpt" merge gone -o gone-out
check "missing data file is named" grep -q "gone/data-00001.tsr' is missing" out
check "missing data file: no output left" no_output gone-out

mkdir incomplete && cp b/data-* incomplete/
run "$ckpt" inspect incomplete
check "a directory without manifest is refused" grep -q "incomplete (no manifest.pb)" out

cat >unknown.json <<'JSON'
{"mesh": {"axes": ["tp"], "shape": [2]},
 "tensors": {"h.9.attn.c_attn.weight": {"shape": [64, 192], "split": [null, "tp"]}}}
JSON
run "$ckpt" reshard a -o u --strategy unknown.json
check "strategy naming an unknown tensor exits 1" test $rc -eq 1
check "the unknown tensor is named" grep -q "h.9.attn.c_attn.weight" out
check "unknown tensor: no output left" no_output u
cat >shape.json <<'JSON'
{"mesh": {"axes": ["tp"], "shape": [2]},
 "tensors": {"h.0.attn.c_attn.weight": {"shape": [64, 96], "split": [null, "tp"]}}}
JSON
run "$ckpt" reshard a -o u --strategy shape.json
check "a shape mismatch names the tensor" grep -q "h.0.attn.c_attn.weight" out
check "shape mismatch: no output left" no_output u
cat >shape2.json <<'JSON'
{"mesh": {"axes": ["tp"], "shape": [2]},
 "tensors": {"h.0.attn.c_attn.weight": {"shape": [64, 192], "split": [null, "tp"]}}}
JSON
cat >view.json <<'JSON'
{"mesh": {"axes": ["tp"], "shape": [2]},
 "tensors": {"h.0.attn.c_attn.weight": {"shape": [64, 192], "view": [64, 3, 64],
                                        "split": [null, null, "tp"]}}}
JSON
# The fused qkv split by heads: a layout over the view [C, 3, C], stored by
# the native format, read back over any other layout.
run "$ckpt" reshard a -o u --strategy view.json
check "tp=4 columns of the fused qkv (cut inside q, k, v) cannot become heads: named" \
  grep -q "h.0.attn.c_attn.weight.*cut inside the view's blocks of 64" out
run "$ckpt" reshard full -o v --strategy view.json -q
check "reshard to the fused qkv split by heads (a view)" test $rc -eq 0
"$ckpt" inspect v >inspect-v.txt
check "inspect shows the view" grep -q "c_attn.weight .*view \[64, 3, 64\] split \[-, -, tp\]" inspect-v.txt
run "$ckpt" verify v -q
check "the view checkpoint verifies" test $rc -eq 0
run "$ckpt" diff v full -q
check "... and holds the same tensors" test $rc -eq 0
run "$ckpt" reshard v -o v4 --mesh tp=4 -q
run "$ckpt" diff v4 full -q
check "heads over tp=2 -> tp=4" test $rc -eq 0
cat >cols3.json <<'JSON'
{"mesh": {"axes": ["tp"], "shape": [3]},
 "tensors": {"h.0.attn.c_attn.weight": {"shape": [64, 192], "split": [null, "tp"]}}}
JSON
run "$ckpt" reshard v -o v3 --strategy cols3.json -q
run "$ckpt" diff v3 full -q
check "heads -> q | k | v one per rank (cuts on the view's blocks)" test $rc -eq 0
run "$ckpt" merge v -o vm --format safetensors -q
run "$ckpt" diff vm full -q
check "heads -> merged safetensors" test $rc -eq 0
run "$ckpt" reshard v -o u --strategy shape2.json
check "a split cutting inside q, k or v is refused, naming the tensor" \
  grep -q "h.0.attn.c_attn.weight.*blocks of 64" out
check "... with no output left" no_output u
run "$ckpt" convert v -o u.safetensors --format safetensors
check "a view cannot go into safetensors' recorded layouts: named" \
  grep -q "tensor 'h.0.attn.c_attn.weight' is laid out over view \[64, 3, 64\]" out
check "... with no output left" no_output u.safetensors
run "$ckpt" reshard a -o b --mesh dp=1,tp=2
check "an existing output is refused" grep -q "'b' already exists" out
run "$ckpt" reshard a -o b --mesh dp=2,tp=1 --overwrite -q
check "--overwrite replaces it" bash -c "'$ckpt' inspect b | grep -q 'dp=2, tp=1'"
run "$ckpt" reshard a -o x --mesh dp=2,tp=2 --memory-budget lots
check "a bad --memory-budget exits 1" grep -q "'lots' is not a size" out
run "$ckpt" reshard a -o x --mesh dp=2,tp=2 --compress lz4
check "a bad --compress is named" grep -q "lz4" out
run "$ckpt" reshard a
check "missing -o is a usage error (exit 2)" test $rc -eq 2

# --- more data files than descriptors ------------------------------------------
# The reader keeps at most a quarter of the descriptor limit open (the least
# recently used closed first): 512 source files reshard, verify and diff
# under a limit of 256 (keeping every file open, a reshard of 16,384 ranks
# runs out of descriptors).
run "$make" -o many --layers 1 --embed 64 --vocab 512 --context 64 --mesh dp=64,tp=8 --zero --optimizer
check "make a 512-rank checkpoint" test $rc -eq 0
run bash -c "ulimit -n 256 && exec '$ckpt' reshard many -o few --mesh dp=8,tp=8 --quiet"
check "reshard 512 data files under a limit of 256 descriptors" test $rc -eq 0
run bash -c "ulimit -n 256 && exec '$ckpt' verify many"
check "verify 512 data files under a limit of 256 descriptors" test $rc -eq 0
run bash -c "ulimit -n 256 && exec '$ckpt' diff many few"
check "diff of 512 and 64 data files under a limit of 256: equal" test $rc -eq 0
# And the other way: the writer keeps at most half the limit open, parking
# the files it is done with and reopening them to sync at commit.
run bash -c "ulimit -n 256 && exec '$ckpt' reshard few -o many-again --mesh dp=32,tp=16 --quiet"
check "reshard 64 data files to 512 under a limit of 256 descriptors" test $rc -eq 0
run "$ckpt" verify many-again -q
check "... its 512 data files verify (sizes and whole-file checksums)" test $rc -eq 0
run "$ckpt" diff many-again many -q
check "... and hold the same tensors" test $rc -eq 0

# --- SIGKILL at random moments -------------------------------------------------
run "$make" -o big --size 160MiB --mesh dp=2,tp=4 --zero --embed 512 --vocab 8192
run "$ckpt" merge big -o big-full -q
interrupted=0
for delay in 0.02 0.05 0.08 0.12 0.16 0.2 0.3 0.4 0.7 1.5; do
  rm -rf k k.tmp-*
  "$ckpt" reshard big -o k --mesh dp=1,tp=2 --threads 1 -q &
  pid=$!
  sleep $delay
  kill -9 $pid 2>/dev/null
  wait $pid 2>/dev/null
  if ls -d k.tmp-* >/dev/null 2>&1; then interrupted=$((interrupted + 1)); fi
  if [ -e k ]; then
    # Whatever looks complete must be complete.
    "$ckpt" verify k -q && "$ckpt" diff k big-full -q || { echo "killed after $delay s: k is broken"; fails=$((fails + 1)); }
  fi
done
check "some kills landed mid-write ($interrupted of 10), the others left a complete k" test $interrupted -gt 0
rm -rf k; run "$ckpt" reshard big -o k --mesh dp=1,tp=2 -q
check "a rerun after kills succeeds" test $rc -eq 0
run "$ckpt" diff k big-full -q
check "the rerun's output is right" test $rc -eq 0
check "the rerun removed the killed runs' temporaries" bash -c '! ls -d k.tmp-* 2>/dev/null'

# fixture_reads V DIR SOURCE COUNTS: the format V fixture in DIR says
# format V, verifies (COUNTS: verify's summary) and reads the values
# SOURCE/make_fixture.py writes (into vV-values.safetensors).
fixture_reads() {
  local v=$1 dir=$2 src=$3 counts=$4
  check "the format $v fixture's manifest says format $v" \
    bash -c "head -c 12 '$dir/manifest.pb' | tail -c 4 | od -An -tu4 | grep -qw $v"
  /usr/bin/python3 "$src/make_fixture.py" "v$v-values.safetensors"
  run "$ckpt" verify "$dir"
  check "a format $v checkpoint verifies" test $rc -eq 0
  check "  every file and piece" grep -q "$counts" out
  run "$ckpt" diff "$dir" "v$v-values.safetensors"
  check "a format $v checkpoint reads the values it was written with" test $rc -eq 0
}
# cut_over_tp3 STRATEGY rows|columns: STRATEGY on a dp 2 x tp 3 mesh, every
# tensor cut by its first (rows) or last (columns) dimension over tp, no
# stages and no optimizer sharding.
cut_over_tp3() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["mesh"] = {"axes": ["dp", "tp"], "shape": [2, 3]}
for t in s["tensors"].values():
    t.pop("stage", None), t.pop("opt_shard", None)
    rest = [None] * (len(t["shape"]) - 1)
    t["split"] = ([] if not t["shape"] else
                  ["tp"] + rest if sys.argv[2] == "rows" else rest + ["tp"])
print(json.dumps(s))
PY
}

# Format 1 (tests/data/native-v1, a make_checkpoint model in format 1: a
# bare protobuf manifest, no copy) still opens, verifies and merges to the
# same values as the same model written in the current format.
run "$ckpt" verify "$v1"
check "a format 1 checkpoint verifies" test $rc -eq 0
run "$make" -o v1-now --merged --layers 1 --embed 8 --vocab 16 --context 4
run "$ckpt" diff "$v1" v1-now
check "a format 1 checkpoint reads the values it was written with" test $rc -eq 0
run "$ckpt" merge "$v1" -o v1-merged -q
check "a format 1 checkpoint merges into format 2" \
  bash -c "head -c 8 v1-merged/manifest.pb | grep -q TSRMNFST && cmp -s v1-merged/manifest.pb v1-merged/manifest-copy.pb"

# Format 2 (tests/data/native-v2, written before any later format: block
# checksums, stages and a copy stage, ZeRO, f16/bf16/i64, parity groups)
# keeps verifying and reading its values whole, resharded, and with a data
# file rebuilt from parity, whatever the current format.
fixture_reads 2 "$v2" "$v2src" "12 files, 28 pieces, 2.1 MiB verified, 0 problems"
cut_over_tp3 "$v2src/strategy.json" rows >v2-other.json
run "$ckpt" reshard "$v2" --strategy v2-other.json -o v2-resharded -q
check "a format 2 checkpoint reshards (partial reads across its block checksums)" test $rc -eq 0
run "$ckpt" diff v2-resharded v2-values.safetensors
check "  to its values" test $rc -eq 0
cp -r "$v2" v2-lost && rm v2-lost/data-00000.tsr
run "$ckpt" diff v2-lost v2-values.safetensors
check "a format 2 checkpoint without its largest data file reads (from parity)" test $rc -eq 0
run "$ckpt" verify --repair v2-lost
check "  and verify --repair rebuilds it byte for byte" cmp -s v2-lost/data-00000.tsr "$v2/data-00000.tsr"

# Format 3 (tests/data/native-v3, written before any later format: tile
# checksums on pieces of rows of 4 KiB to 32 KiB, 2-D and 3-D, beside row
# blocks and untiled pieces, parity groups) keeps verifying and reading its
# values whole, resharded by columns (reads that check only the tiles they
# touch), and with a file rebuilt from parity, whatever the current format.
fixture_reads 3 "$v3" "$v3src" "12 files, 20 pieces, 13.0 MiB verified, 0 problems"
cut_over_tp3 "$v3src/strategy.json" columns >v3-other.json
run "$ckpt" reshard "$v3" --strategy v3-other.json -o v3-resharded -q
check "a format 3 checkpoint reshards by columns (reads of parts of its tiles)" test $rc -eq 0
run "$ckpt" diff v3-resharded v3-values.safetensors
check "  to its values" test $rc -eq 0
# A byte of big's last tile (its second band, right column tile) damaged:
# verify names the tile; reads fall back to parity; --repair restores it.
cp -r "$v3" v3-bad
big_end=$(($(stat -c %s "$v3/data-00000.tsr") - 4096))  # big's last byte + 1
printf '\x5a' | dd of=v3-bad/data-00000.tsr bs=1 seek=$((big_end - 10)) conv=notrunc status=none
run "$ckpt" verify v3-bad
check "a damaged tile of a format 3 checkpoint fails verify" test $rc -eq 1
check "  naming the tile" grep -q "tensor 'big' piece \[0:1030, 0:1024\]: checksum mismatch in tile (rows 1024:1030, columns 512:1024 of the piece)" out
run "$ckpt" diff v3-bad v3-values.safetensors
check "  and reads right (the file rebuilt from parity)" test $rc -eq 0
run "$ckpt" verify --repair v3-bad
check "  and verify --repair restores it byte for byte" cmp -s v3-bad/data-00000.tsr "$v3/data-00000.tsr"
cp -r "$v3" v3-lost && rm v3-lost/data-00004.tsr
run "$ckpt" diff v3-lost v3-values.safetensors
check "a format 3 checkpoint without a data file reads (from parity)" test $rc -eq 0
run "$ckpt" verify --repair v3-lost
check "  and verify --repair rebuilds it byte for byte" cmp -s v3-lost/data-00004.tsr "$v3/data-00004.tsr"

# Format 2 keeps the manifest twice: either one lost or damaged, the
# checkpoint still opens, verify names the damage and --repair restores it.
for damaged in manifest.pb manifest-copy.pb; do
  rm -rf mc && cp -r v1-merged mc
  printf '\xff' | dd of=mc/$damaged bs=1 seek=100 conv=notrunc status=none
  run "$ckpt" diff mc v1-now
  check "$damaged damaged: the checkpoint still reads right" test $rc -eq 0
  run "$ckpt" verify mc
  check "$damaged damaged: verify fails" test $rc -eq 1
  check "$damaged damaged: verify names it" grep -q "$damaged" out
  run "$ckpt" verify --repair mc
  check "$damaged damaged: --repair restores it" test $rc -eq 0
  check "$damaged damaged: restored byte for byte" cmp -s mc/$damaged v1-merged/$damaged
done
rm -rf mc && cp -r v1-merged mc && rm mc/manifest.pb
run "$ckpt" inspect mc
check "manifest.pb deleted: read from its copy" test $rc -eq 0
rm mc/manifest-copy.pb
run "$ckpt" inspect mc
check "both manifests gone: an incomplete checkpoint" grep -q "incomplete (no manifest.pb)" out

# Reed-Solomon over a converted checkpoint's data files (ISA-L).
run "$make" -o rs-src --mesh tp=8 --layers 2 --embed 64 --vocab 1000 --context 64 --optimizer
run "$ckpt" convert rs-src -o rs --redundancy rs:4+2 -q
check "convert --redundancy rs:4+2" test $rc -eq 0
check "two groups of 4 data files and 2 parity files" \
  test "$(ls rs/data-*.tsr | wc -l)" -eq 8 -a "$(ls rs/rs-*.tsr | wc -l)" -eq 4
rm rs/data-00001.tsr rs/rs-0-1.tsr
run "$ckpt" diff rs rs-src
check "two lost files of a group: the checkpoint still reads right" test $rc -eq 0
run "$ckpt" verify --repair rs
check "two lost files of a group: --repair rebuilds them" test $rc -eq 0
check "both rebuilt from the group" test "$(grep -c "from its rs:4+2 group" out)" -eq 2
rm rs/data-00000.tsr rs/data-00002.tsr rs/rs-0-0.tsr
run "$ckpt" verify --repair rs
check "three lost files of a 4+2 group: refused" test $rc -eq 1
check "three lost files of a 4+2 group: named" grep -q "data-00000.tsr.*cannot be rebuilt" out
run "$ckpt" convert rs-src -o rs-bad --redundancy rs:4+2 --format safetensors
check "redundancy in a format without parity: refused" grep -q "redundancy is a native-format option" out
run "$ckpt" convert rs-src -o rs-bad --redundancy replicas:2
check "replicas offline: refused, naming where they apply" \
  grep -q "replicas:K is for training's sliced saves" out
run "$ckpt" inspect --files rs
check "inspect --files: each file's group and role" \
  grep -q "^rs-1-1.tsr .* rs:4+2 group 1  parity" out
check "inspect: the redundancy in a line" grep -q "^files  *12, 4 of them parity (.*) in 2 groups" out

echo "$passes passed, $fails failed"
test $fails -eq 0
