#!/usr/bin/env bash
# Interop formats end to end through the ckpt binary: every format pair
# round-trips bit-exact, sliced layouts survive MindSpore's per-rank files
# and safetensors/HDF5 metadata, independent readers (h5py, Python protobuf
# with MindSpore's .proto, a safetensors reader written from the spec) see
# the same arrays, and hostile files are named errors, never crashes.
# Usage: formats_cli_test.sh CKPT MAKE_CHECKPOINT PROTO_DIR
set -u
ckpt=$(realpath "$1")
make=$(realpath "$2")
protos=$(realpath "$3")
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../lib.sh"
cd "$work"
fails_naming() {  # fails_naming WHAT TEXT CMD...: exit 1, TEXT in the message
  local what=$1 text=$2
  shift 2
  run "$@"
  check "$what" test $rc -eq 1
  check "$what: names '$text'" grep -qF -- "$text" out
}
small="--layers 2 --embed 64 --vocab 1000 --context 64"

run "$make" -o zero $small --mesh dp=2,tp=4 --zero --optimizer
run "$make" -o nz $small --mesh dp=2,tp=2 --optimizer
check "sliced sources" test $rc -eq 0
"$ckpt" merge zero -o full -q
"$ckpt" merge nz -o nzfull -q

# --- every format pair, bit-exact -------------------------------------------
"$ckpt" convert zero -o z.safetensors --format safetensors -q
"$ckpt" convert zero -o z.h5 --format hdf5 -q
"$ckpt" merge zero -o z.ckpt --format mindspore -q
for f in z.safetensors z.h5 z.ckpt; do
  run "$ckpt" diff "$f" full
  check "$f equals the merged native checkpoint" test $rc -eq 0
  for g in safetensors hdf5 mindspore native; do
    out="$f.to.$g"
    [ $g = mindspore ] && out="$out.ckpt"
    run "$ckpt" merge "$f" -o "$out" --format $g -q
    run "$ckpt" diff "$out" full
    check "$f -> $g is bit-exact" test $rc -eq 0
  done
done

# --- layouts survive ----------------------------------------------------------
"$ckpt" inspect zero --json >a.json
"$ckpt" inspect z.safetensors --json >b.json
"$ckpt" inspect z.h5 --json >c.json
same_layouts() {  # same_layouts A.json B.json: same mesh, step and per-tensor layouts
  $py -c "import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:]); k=lambda j:(j['mesh'],j['step'],[(t['name'],t['shape'],t['dtype'],t['layout']) for t in j['tensors']]); assert k(a)==k(b), (k(a)[:2], k(b)[:2])" "$@"
}
check "safetensors __metadata__ keeps the sliced strategy" same_layouts a.json b.json
run "$ckpt" convert z.safetensors -o back -q
"$ckpt" inspect back --json >d.json
check "native -> safetensors -> native keeps mesh and layouts" same_layouts a.json d.json
check "HDF5 attributes keep the strategy" same_layouts a.json c.json

# --- MindSpore distributed directories ----------------------------------------
run "$ckpt" convert nz -o ms --format mindspore --save-mindspore-strategy ms.strategy -q
check "sliced -> rank_<r>/checkpoint_<r>.ckpt" test $rc -eq 0 -a -f ms/rank_3/checkpoint_3.ckpt
fails_naming "a several-rank directory needs its strategy" "--src-strategy" "$ckpt" merge ms -o x
run "$ckpt" merge ms --src-strategy ms.strategy -o ms.merged -q
run "$ckpt" diff ms.merged nzfull
check "MindSpore slices merge to the original" test $rc -eq 0
run "$ckpt" diff ms nz --a-strategy ms.strategy -q
check "diff reads a MindSpore directory with --a-strategy" test $rc -eq 0
fails_naming "diff of a several-rank directory without its strategy names the flag" \
  "(--a-strategy)" "$ckpt" diff ms nz
run "$ckpt" reshard nzfull -o ms2 --format mindspore --dst-strategy ms.strategy --prefix net_ -q
check "split by a MindSpore strategy writes the same rank files" cmp ms2/rank_2/net_2.ckpt ms/rank_2/checkpoint_2.ckpt
run "$ckpt" reshard ms --src-strategy ms.strategy -o ms.tp4 --mesh m0=4,m1=1 --format mindspore \
  --save-mindspore-strategy ms.tp4.strategy -q
check "MindSpore reshard to 4-way splits" test $rc -eq 0 -a -f ms.tp4/rank_3/checkpoint_3.ckpt
# ModelCheckpoint keeps several files per rank; transform_checkpoints takes
# the last in lexicographic order, and so do we.
cp -r ms ms.keep
for r in 0 1 2 3; do cp z.ckpt ms.keep/rank_$r/a-older.ckpt; done
run "$ckpt" diff ms.keep nz --a-strategy ms.strategy -q
check "of several .ckpt files per rank, the last by name is read" test $rc -eq 0
cp z.ckpt ms.keep/rank_2/zz-newer.ckpt
fails_naming "... and is the one whose errors are named" "rank_2/zz-newer.ckpt" \
  "$ckpt" diff ms.keep nz --a-strategy ms.strategy
fails_naming "ZeRO over dp outermost is not MindSpore's rank order" "MindSpore's rank order" \
  "$ckpt" convert zero -o bad --format mindspore
check "no output after a refused write" test ! -e bad

# --- Hugging Face shards --------------------------------------------------------
run "$ckpt" merge zero -o hf --format safetensors --max-shard-size 300KB -q
check "sharded into model-0000i-of-0000N files" test -f hf/model.safetensors.index.json -a -f hf/model-00001-of-00009.safetensors -a -f hf/model-00009-of-00009.safetensors
run "$ckpt" diff hf full
check "the index reads back bit-exact" test $rc -eq 0
check "index total_size and weight_map" $py - <<'PY'
import json, os
j = json.load(open("hf/model.safetensors.index.json"))
assert j["metadata"]["total_size"] == sum(4 * __import__("math").prod(t["shape"]) for t in json.load(open("a.json"))["tensors"])
assert len(j["weight_map"]) == 84 and all(os.path.exists("hf/" + f) for f in j["weight_map"].values())
for f in set(j["weight_map"].values()):
    assert os.path.getsize("hf/" + f) <= 300000 + 65536, f
PY

# --- independent readers ---------------------------------------------------------
protoc --python_out=. -I"$protos" "$protos/mindspore_checkpoint.proto"
check "h5py, Python protobuf and a spec reader agree" $py - <<'PY'
import json, struct, h5py, numpy as np
import mindspore_checkpoint_pb2 as pb
# safetensors, from the spec: u64 header length, JSON header, packed data.
raw = open("z.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
assert (8 + n) % 8 == 0
st = {}
for name, v in header.items():
    if name == "__metadata__":
        assert v["format"] == "pt" and "tessera.strategy" in v
        continue
    b, e = v["data_offsets"]
    st[name] = np.frombuffer(raw[8 + n + b:8 + n + e], dtype=np.float32).reshape(v["shape"])
# MindSpore .ckpt with MindSpore's .proto
c = pb.Checkpoint()
c.ParseFromString(open("z.ckpt", "rb").read())
ms, strings = {}, {}
for v in c.value:
    if v.tensor.tensor_type == "str":  # decoded as load_checkpoint does
        assert list(v.tensor.dims) == [0]
        data = v.tensor.tensor_content
        strings[v.tag] = str(np.frombuffer(data, "U" + str(len(data) // 4))[0])
        continue
    assert v.tensor.tensor_type == "Float32"
    dims = list(v.tensor.dims)
    ms[v.tag] = np.frombuffer(v.tensor.tensor_content, dtype=np.float32).reshape(dims if dims != [0] else [])
# The step and metadata follow the tensors as append_dict strings.
assert strings == {"tessera.step": "1000", "synthetic_seed": header["__metadata__"]["tessera.meta.synthetic_seed"]}, strings
assert [v.tag for v in c.value][-2:] == sorted(strings, key=lambda t: t != "tessera.step")
with h5py.File("z.h5", "r") as h:
    assert len(st) == len(ms) == 84
    for name, a in st.items():
        assert np.array_equal(a, ms[name], equal_nan=True), name
        assert np.array_equal(a, h[name][()], equal_nan=True), name
# One rank file of the distributed directory: rank 1 holds its slices.
c = pb.Checkpoint()
c.ParseFromString(open("ms/rank_1/checkpoint_1.ckpt", "rb").read())
assert len(c.value) == 84
PY
# Every rank file holds exactly the slices MindSpore's layout rules give
# (_get_tensor_slice_index: the rank's coordinates in dev_matrix, last
# dimension fastest; tensor dim d cut dev_matrix[-1 - tensor_map[d]] ways,
# taking the coordinate of that device dimension), computed here from the
# strategy file alone and compared with the merged tensors.
protoc --python_out=. -I"$protos" "$protos/mindspore_strategy.proto"
"$ckpt" convert nzfull -o nzfull.safetensors --format safetensors -q
cat >slices.py <<'PY'
# slices.py DIR STRATEGY FULL.safetensors RANKS: every rank_<r>/checkpoint_<r>.ckpt
# of DIR holds exactly the slices of its pipeline stage's tensors.
import json, struct, sys, numpy as np
import mindspore_checkpoint_pb2 as ckpb, mindspore_strategy_pb2 as stpb
d, strategy, merged, world = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
raw = open(merged, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
full = {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], np.float32).reshape(v["shape"])
        for k, v in json.loads(raw[8:8 + n]).items() if k != "__metadata__"}
m = stpb.ParallelStrategyMap()
m.ParseFromString(open(strategy, "rb").read())
layouts = {}  # name -> (stage, layout); a merged pipeline file names "<stage>-<name>"
for i in m.parallel_layout_item:
    stage, name = i.param_name.split("-", 1) if m.current_stage == 1 and "-" in i.param_name else (0, i.param_name)
    layouts[name] = (int(stage), i.parallel_layouts)
per_stage = int(np.prod(list(next(iter(layouts.values()))[1].dev_matrix[0].dim)))
checked = 0
for rank in range(world):
    stage, local = divmod(rank, per_stage)
    c = ckpb.Checkpoint()
    c.ParseFromString(open(f"{d}/rank_{rank}/checkpoint_{rank}.ckpt", "rb").read())
    def owner(tag):
        return tag if tag in layouts else tag.split(".", 1)[-1]
    want_tags = sorted(t for t in full if owner(t) not in layouts or layouts[owner(t)][0] == stage)
    assert sorted(v.tag for v in c.value) == want_tags, (d, rank)
    for v in c.value:
        want = full[v.tag]
        if owner(v.tag) in layouts:
            lay = layouts[owner(v.tag)][1]
            assert not lay.opt_weight_shard_size or lay.opt_weight_shard_size == 1
            dev, tmap = list(lay.dev_matrix[0].dim), list(lay.tensor_map[0].dim)
            coord, r = [], local
            for size in reversed(dev):
                coord.insert(0, r % size); r //= size
            for dim, k in enumerate(tmap):
                if k == -1:
                    continue
                step = want.shape[dim] // dev[len(dev) - 1 - k]
                idx = coord[len(dev) - 1 - k]
                want = np.take(want, range(idx * step, (idx + 1) * step), axis=dim)
                checked += 1
        got = np.frombuffer(v.tensor.tensor_content, np.float32).reshape(list(v.tensor.dims))
        assert np.array_equal(got, want), (d, rank, v.tag)
assert checked > 0, d
PY
check "rank files hold the slices MindSpore's dev_matrix/tensor_map rules give" \
  $py slices.py ms ms.strategy nzfull.safetensors 4
check "... also after a reshard to 4-way splits" $py slices.py ms.tp4 ms.tp4.strategy nzfull.safetensors 4
# append_dict strings, as save_checkpoint writes them on every rank (a
# record of type "str", dims [0], numpy's '<U' bytes), are the metadata;
# a merge to one .ckpt keeps them, as strings MindSpore's loader decodes.
check "MindSpore append_dict strings are read as metadata and written back" env CKPT="$ckpt" $py - <<'PY'
import glob, json, os, shutil, subprocess, numpy as np
CKPT = os.environ["CKPT"]
import mindspore_checkpoint_pb2 as pb
strings = {"note": "héllo wörld ✓ 𝄞", "empty": "", "epoch": "3"}
def record(tag, text):
    c = pb.Checkpoint(); v = c.value.add(); v.tag = tag
    v.tensor.dims.append(0); v.tensor.tensor_type = "str"
    v.tensor.tensor_content = np.array(text).tobytes()
    return c.SerializeToString()
shutil.copytree("ms", "msstr")
for f in glob.glob("msstr/rank_*/*.ckpt"):
    with open(f, "ab") as out:
        for k, t in strings.items():
            out.write(record(k, t))
got = json.loads(subprocess.run([CKPT, "inspect", "msstr", "--src-strategy", "ms.strategy", "--json"],
                                check=True, capture_output=True, text=True).stdout)
assert {m["key"]: m["text"] for m in got["metadata"]} == strings, got["metadata"]
subprocess.run([CKPT, "merge", "msstr", "--src-strategy", "ms.strategy", "-o", "msstr.ckpt",
                "--format", "mindspore", "-q"], check=True)
c = pb.Checkpoint(); c.ParseFromString(open("msstr.ckpt", "rb").read())
back = {}
for v in c.value:
    if v.tensor.tensor_type == "str":
        data = v.tensor.tensor_content
        back[v.tag] = str(np.frombuffer(data, "U" + str(len(data) // 4))[0])
assert back == strings, back
# A string record MindSpore cannot have written is a named error.
with open("badstr.ckpt", "wb") as out:
    out.write(open("z.ckpt", "rb").read())
    c = pb.Checkpoint(); v = c.value.add(); v.tag = "odd"
    v.tensor.dims.append(0); v.tensor.tensor_type = "str"; v.tensor.tensor_content = b"abcde"
    out.write(c.SerializeToString())
PY
fails_naming "a string record of 5 bytes" "string 'odd': a string of 5 bytes" "$ckpt" inspect badstr.ckpt
# A MapParameter, as _write_mapparameter writes it (a MapTensorProto of
# keys, values and status typed by numpy names; a map exported in slices is
# several records), is read as three tensors <name>.__map_{keys,values,
# status}__ and written back as one map record that MindSpore's loader
# (_load_map_parameter) reads as the same arrays.
check "a MapParameter reads as three tensors and is written back as a map" env CKPT="$ckpt" $py - <<'PY'
import os, subprocess, numpy as np
import mindspore_checkpoint_pb2 as pb
CKPT = os.environ["CKPT"]
rng = np.random.default_rng(7)
parts = []
out = open("z.ckpt", "rb").read()
for n in (3, 2):
    arrays = (rng.integers(0, 1 << 30, n, dtype=np.int32), rng.standard_normal((n, 4)).astype(np.float16),
              rng.integers(0, 3, n, dtype=np.int32))
    parts.append(arrays)
    c = pb.Checkpoint(); v = c.value.add(); v.tag = "user_emb.table"
    for a in arrays:
        t = v.maptensor.tensor.add(); t.dims.extend(a.shape); t.tensor_type = str(a.dtype)
        t.tensor_content = a.reshape(-1).tobytes()
    out += c.SerializeToString()
open("map-records", "wb").write(out[len(open("z.ckpt", "rb").read()):])
# int64 keys, which MindSpore's map loader cannot decode (np_type_convert).
c = pb.Checkpoint(); v = c.value.add(); v.tag = "wide"
for a in (np.arange(3, dtype=np.int64), np.ones((3, 2), np.float32), np.zeros(3, np.int32)):
    t = v.maptensor.tensor.add(); t.dims.extend(a.shape); t.tensor_type = str(a.dtype)
    t.tensor_content = a.reshape(-1).tobytes()
out += c.SerializeToString()
open("map.ckpt", "wb").write(out)
whole = [np.concatenate([p[i] for p in parts]) for i in range(3)]
subprocess.run([CKPT, "convert", "map.ckpt", "-o", "map.safetensors", "--format", "safetensors", "-q"], check=True)
subprocess.run([CKPT, "convert", "map.safetensors", "-o", "map2.ckpt", "--format", "mindspore", "-q"], check=True)
c = pb.Checkpoint(); c.ParseFromString(open("map2.ckpt", "rb").read())
maps = [v for v in c.value if v.HasField("maptensor")]
assert len(maps) == 1 and maps[0].tag == "user_emb.table"
# ... and a map MindSpore could not load back is written as plain tensors.
plain = {v.tag: v.tensor.tensor_type for v in c.value if v.tag.startswith("wide.")}
assert plain == {"wide.__map_keys__": "Int64", "wide.__map_values__": "Float32",
                 "wide.__map_status__": "Int32"}, plain
# MindSpore's np_type_convert, all its map loader decodes.
np_types = {"int32": np.int32, "float32": np.float32, "float16": np.float16, "float64": np.float64}
for t, want in zip(maps[0].maptensor.tensor, whole):
    got = np.frombuffer(t.tensor_content, np_types[t.tensor_type]).reshape(list(t.dims))
    assert got.dtype == want.dtype and np.array_equal(got, want), t.tensor_type
PY
run "$ckpt" diff map.ckpt map2.ckpt
check "... and the trip is bit-exact" test $rc -eq 0
fails_naming "a map tensor cannot go to rank directories" "user_emb.table.__map_keys__" \
  "$ckpt" convert map.safetensors -o mapdir --format mindspore
cp -r ms ms.map && cat map-records >>ms.map/rank_1/checkpoint_1.ckpt
fails_naming "a map tensor in a rank directory is refused by name" "map tensor 'user_emb.table'" \
  "$ckpt" merge ms.map --src-strategy ms.strategy -o x
# Pipeline stages: the strategy is written as merge_pipeline_strategys
# writes it ("<stage>-<name>", current_stage 1, strategy items carrying the
# stage); it is also read as the per-rank files MindSpore saves (one per
# rank, several of a stage), which merge_pipeline_strategys would merge.
run "$make" -o pp --layers 2 --embed 64 --vocab 1000 --context 64 --mesh pp=2,dp=1,tp=2 --optimizer
run "$ckpt" convert pp -o mspp --format mindspore --save-mindspore-strategy pp.strategy -q
check "a pipeline checkpoint is written as MindSpore rank directories" test $rc -eq 0 -a -d mspp/rank_3
run "$ckpt" merge mspp --src-strategy pp.strategy -o pp.back -q
run "$ckpt" merge pp -o pp.full -q
run "$ckpt" diff pp.back pp.full -q
check "... and merges back with the merged pipeline strategy" test $rc -eq 0
"$ckpt" convert pp.full -o pp.full.safetensors --format safetensors -q
check "each stage's rank files hold its tensors' slices, by MindSpore's rules" \
  $py slices.py mspp pp.strategy pp.full.safetensors 4
check "the merged pipeline strategy has MindSpore's form; per-rank stage files are made" $py - <<'PY'
import copy, os
import mindspore_strategy_pb2 as pb
m = pb.ParallelStrategyMap()
m.ParseFromString(open("pp.strategy", "rb").read())
assert m.current_stage == 1
names = [i.param_name for i in m.parallel_layout_item]
assert "0-wte" in names and "1-ln_f.weight" in names and "0-h.0.ln_1.weight" in names, names[:4]
stages = {i.node_name: i.parallel_strategys.stage for i in m.parallel_strategy_item}
assert stages["wte"] == 0 and stages["ln_f.weight"] == 1
# What each rank of a 2-stage run saves: its stage's parameters, unprefixed.
os.makedirs("ppdir", exist_ok=True)
for rank in range(4):
    stage = rank // 2
    f = pb.ParallelStrategyMap()
    f.current_stage = stage
    for s, l in zip(m.parallel_strategy_item, m.parallel_layout_item):
        if s.parallel_strategys.stage != stage:
            continue
        f.parallel_strategy_item.add().CopyFrom(s)
        item = f.parallel_layout_item.add()
        item.CopyFrom(l)
        item.param_name = l.param_name.split("-", 1)[1]
    open("ppdir/strategy%d.ckpt" % rank, "wb").write(f.SerializeToString())
PY
run "$ckpt" merge mspp --src-strategy ppdir -o pp.back2 -q
run "$ckpt" diff pp.back2 pp.full -q
check "per-rank stage strategy files (two per stage) read as one strategy" test $rc -eq 0
rm ppdir/strategy0.ckpt ppdir/strategy1.ckpt
fails_naming "a stage missing from the strategy directory is named" "not every stage 0..1" \
  "$ckpt" merge mspp --src-strategy ppdir -o x
fails_naming "one stage's strategy for 4 rank directories is refused" "describes 2" \
  "$ckpt" merge mspp --src-strategy ppdir/strategy2.ckpt -o x

# Every dtype, written by a safetensors writer made from the spec.
$py - <<'PY'
import json, struct, numpy as np
rng = np.random.default_rng(1)
t = {
    "f16": rng.standard_normal((3, 5)).astype(np.float16),
    "f64": rng.standard_normal((4,)),
    "i8": rng.integers(-100, 100, (2, 3), dtype=np.int8),
    "u16": rng.integers(0, 60000, (7,), dtype=np.uint16),
    "i64": rng.integers(-2**40, 2**40, (2, 2), dtype=np.int64),
    "bool": rng.integers(0, 2, (5,)).astype(np.bool_),
    "scalar": np.array(3.5, dtype=np.float32),
}
bf16 = (rng.standard_normal((6, 4)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
names = {"f16": "F16", "f64": "F64", "i8": "I8", "u16": "U16", "i64": "I64", "bool": "BOOL", "scalar": "F32"}
header, blobs, off = {}, [], 0
for k, a in list(t.items()) + [("bf16", bf16)]:
    b = a.tobytes()
    header[k] = {"dtype": names.get(k, "BF16"), "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b); off += len(b)
h = json.dumps(header).encode(); h += b" " * ((8 - len(h) % 8) % 8)
open("mixed.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
np.save("bf16.npy", bf16)
PY
for g in hdf5 mindspore native safetensors; do
  out="mixed.$g"; [ $g = mindspore ] && out="mixed.ckpt"
  run "$ckpt" convert mixed.safetensors -o "$out" --format $g -q
  run "$ckpt" diff "$out" mixed.safetensors
  check "every dtype through $g is bit-exact" test $rc -eq 0
done
check "h5py reads f16, f64, ints, bool, scalars, and bf16 as its exact f32" $py - <<'PY'
import h5py, json, struct, numpy as np
raw = open("mixed.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
np_types = {"F16": np.float16, "F64": np.float64, "I8": np.int8, "U16": np.uint16, "I64": np.int64, "BOOL": np.bool_, "F32": np.float32}
with h5py.File("mixed.hdf5", "r") as h:
    for k, v in hdr.items():
        b, e = v["data_offsets"]
        if v["dtype"] == "BF16":
            bits = np.frombuffer(raw[8 + n + b:8 + n + e], dtype=np.uint16).reshape(v["shape"])
            assert h[k].attrs["tessera.dtype"] == b"bf16"
            assert np.array_equal(h[k][()], (bits.astype(np.uint32) << 16).view(np.float32)), k
            continue
        a = np.frombuffer(raw[8 + n + b:8 + n + e], dtype=np_types[v["dtype"]]).reshape(v["shape"])
        got = h[k][()]
        assert got.dtype == a.dtype and np.array_equal(got, a), (k, got.dtype, a.dtype)
PY

# --- hostile and damaged inputs: named errors, no crash -------------------------------
$py - <<'PY'
import struct
raw = open("z.safetensors", "rb").read()
open("trunc.safetensors", "wb").write(raw[:len(raw) // 2])
open("huge.safetensors", "wb").write(struct.pack("<Q", 2**62) + b"{}")
n = struct.unpack("<Q", raw[:8])[0]
open("overlap.safetensors", "wb").write(struct.pack("<Q", 96) + b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}'.ljust(96) + bytes(24))
ck = open("z.ckpt", "rb").read()
open("trunc.ckpt", "wb").write(ck[:len(ck) - 1000])
open("badlen.ckpt", "wb").write(b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\x7f\x0a\x01a")
import binascii
crc = binascii.crc32(ck)
open("crc.ckpt", "wb").write(ck + b"crc_num" + crc.to_bytes(10, "big"))
bad = bytearray(ck); bad[len(bad) // 2] ^= 0xff
open("badcrc.ckpt", "wb").write(bytes(bad) + b"crc_num" + crc.to_bytes(10, "big"))
h5 = open("z.h5", "rb").read()
open("trunc.h5", "wb").write(h5[:4096])
PY
fails_naming "truncated safetensors" "trunc.safetensors" "$ckpt" verify trunc.safetensors
fails_naming "a 2^62-byte safetensors header" "exceeds the limit" "$ckpt" inspect huge.safetensors
fails_naming "overlapping safetensors tensors" "overlap" "$ckpt" inspect overlap.safetensors
fails_naming "truncated .ckpt" "trunc.ckpt" "$ckpt" verify trunc.ckpt
fails_naming "a .ckpt record longer than the file" "runs past" "$ckpt" inspect badlen.ckpt
run "$ckpt" diff crc.ckpt full
check "a .ckpt with MindSpore's CRC trailer reads" test $rc -eq 0
fails_naming "a .ckpt whose CRC does not match" "CRC-32" "$ckpt" verify badcrc.ckpt
fails_naming "truncated HDF5" "trunc.h5" "$ckpt" verify trunc.h5
mkdir evil && cp z.safetensors evil/model-1.safetensors
echo '{"metadata":{},"weight_map":{"wte":"../z.safetensors"}}' >evil/model.safetensors.index.json
fails_naming "an index naming a file outside its directory" "not a plain file name" "$ckpt" inspect evil
echo '{"metadata":{},"weight_map":{"nope":"model-1.safetensors"}}' >evil/model.safetensors.index.json
fails_naming "an index naming a tensor its file lacks" "nope" "$ckpt" inspect evil
rm -rf ms.cut && cp -r ms ms.cut && rm -rf ms.cut/rank_2
fails_naming "a distributed MindSpore checkpoint missing a rank" "rank_2" \
  "$ckpt" merge ms.cut --src-strategy ms.strategy -o x
fails_naming "--max-shard-size with another format" "safetensors and torch output only" \
  "$ckpt" merge zero -o x --format hdf5 --max-shard-size 1MB
check "no output after refused writes" test ! -e x

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
