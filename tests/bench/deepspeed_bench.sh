#!/usr/bin/env bash
# DeepSpeed ZeRO-3 -> safetensors: `ckpt convert` (memory budget 256 MiB) of
# a GPT-2 124M checkpoint with Adam on 4 data-parallel ranks (fp32 weights
# and both moments, 1.5 GB of optimizer files; synthesized by
# tests/python/deepspeed_fixtures.py: DeepSpeed is not installable here),
# and of one SCALE times wider (default 2: every matrix's columns doubled,
# 3 GB), beside what DeepSpeed users run today: zero_to_fp32's arithmetic
# in PyTorch (torch.load of every file, each parameter and moment
# reassembled, a safetensors file written tensor by tensor). Medians of 3
# runs interleaved (lib.sh's race), peak RSS from GNU time.
# Usage: deepspeed_bench.sh CKPT WORKDIR [SCALE]
set -eu
ckpt=$(realpath "$1"); work=$2; scale=${3:-2}
here=$(dirname "$(realpath "$0")")
py=/usr/bin/python3
mkdir -p "$work"
work=$(realpath "$work")
rm -rf "${work:?}"/*
source "$here/lib.sh"

cat >"$work/peer.py" <<'PY'
# zero_to_fp32.py's stage-3 reconstruction (and the same for the moments),
# then a safetensors file written by hand (the package is not in Debian).
import glob, json, math, os, struct, sys, torch
sys.path.insert(0, sys.argv[3])
import deepspeed_fixtures  # DeepSpeed's classes, which the pickles name (users have deepspeed)
tag = sys.argv[1]
files = sorted(glob.glob(os.path.join(tag, "*_optim_states.pt")),
               key=lambda f: int(f.split("zero_pp_rank_")[1].split("_")[0]))
sds = [torch.load(f)["optimizer_state_dict"] for f in files]
world = len(sds)
shapes = {}
for g in torch.load(os.path.join(tag, "zero_pp_rank_0_mp_rank_00_model_states.pt"))["param_shapes"]:
    shapes.update(g)
flats = {"": [torch.cat(sd["fp32_flat_groups"]) for sd in sds]}
for k in ("exp_avg", "exp_avg_sq"):
    flats[k] = [torch.cat([sd["optimizer_state_dict"]["state"][g][k]
                           for g in range(len(sd["fp32_flat_groups"]))]) for sd in sds]
state, offset = {}, 0
for name, shape in shapes.items():
    n = shape.numel()
    part = math.ceil(n / world)
    for k, ranks in flats.items():
        state[name if not k else f"optimizer.{name}.{k}"] = \
            torch.cat([f.narrow(0, offset, part) for f in ranks])[:n].view(shape)
    offset += part
header, at = {}, 0
for name, t in state.items():
    header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [at, at + 4 * t.numel()]}
    at += 4 * t.numel()
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[2], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for t in state.values():
        f.write(memoryview(t.contiguous().numpy()).cast("B"))
    f.flush()
    os.fsync(f.fileno())
PY

make_ds() {  # make_ds DIR WIDTH: GPT-2 124M's shapes, columns times WIDTH
  "$py" - "$1" "$2" "$TESSERA_SOURCE/tests/python" <<'PY'
import collections, sys, torch
sys.path.insert(0, sys.argv[3])
import deepspeed_fixtures as dsf
w = int(sys.argv[2])
e = 768
shapes = [("wte.weight", (50257, e * w)), ("wpe.weight", (1024, e * w))]
for i in range(12):
    p = f"h.{i}."
    shapes += [(p + "ln_1.weight", (e * w,)), (p + "ln_1.bias", (e * w,)),
               (p + "attn.c_attn.weight", (e, 3 * e * w)), (p + "attn.c_attn.bias", (3 * e * w,)),
               (p + "attn.c_proj.weight", (e, e * w)), (p + "attn.c_proj.bias", (e * w,)),
               (p + "ln_2.weight", (e * w,)), (p + "ln_2.bias", (e * w,)),
               (p + "mlp.c_fc.weight", (e, 4 * e * w)), (p + "mlp.c_fc.bias", (4 * e * w,)),
               (p + "mlp.c_proj.weight", (4 * e, e * w)), (p + "mlp.c_proj.bias", (e * w,))]
shapes += [("ln_f.weight", (e * w,)), ("ln_f.bias", (e * w,))]
torch.manual_seed(0)
params = collections.OrderedDict((n, torch.randn(*s)) for n, s in shapes)
names = list(params)
dsf.write(sys.argv[1], 3, 4, params, [names[: len(names) // 2], names[len(names) // 2:]])
PY
}
TESSERA_SOURCE=$(realpath "$here/../..")

for width in 1 "$scale"; do
  ds="$work/ds$width"
  make_ds "$ds" "$width"
  bytes=$(du -sb "$ds" | cut -f1)
  echo "DeepSpeed ZeRO-3, 4 dp ranks, GPT-2 124M shapes x$width with Adam ($((bytes >> 20)) MiB) -> safetensors:"
  race 3 ours "$work/o.safetensors" "$ckpt" convert "$ds" -o "$work/o.safetensors" \
    --format safetensors --memory-budget 256MiB -q \
    -- torch "$work/t.safetensors" "$py" "$work/peer.py" "$ds/global_step7" "$work/t.safetensors" \
    "$TESSERA_SOURCE/tests/python"
  "$ckpt" convert "$ds" -o "$work/o.safetensors" --format safetensors -q
  "$py" "$work/peer.py" "$ds/global_step7" "$work/t.safetensors" "$TESSERA_SOURCE/tests/python"
  "$ckpt" diff "$work/o.safetensors" "$work/t.safetensors" >/dev/null
  printf "%-34s %9s %10s %s\n" "" "seconds" "peak RSS" "runs"
  for k in ours torch; do
    printf "%-34s %9.2f %7d MiB  %s\n" "$k" "${MED[$k]}" $((RSS[$k] >> 10)) "${RUNS[$k]}"
  done
  awk -v o="${MED[ours]}" -v t="${MED[torch]}" -v ro="${RSS[ours]}" -v rt="${RSS[torch]}" \
    'BEGIN {printf "torch / ours: %.2fx the time, %.1fx the memory\n", t / o, rt / ro}'
  rm -rf "$ds" "$work"/*.safetensors
done
rm -rf "${work:?}"/*
