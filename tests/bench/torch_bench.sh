#!/usr/bin/env bash
# torch.save -> safetensors: `ckpt convert` of a 1 GiB state dict written by
# Debian's PyTorch 1.13 (GPT-shaped f32 tensors, zip format), beside
# `cp -r` + `sync` of the same file and beside what PyTorch users run
# (torch.load, then a safetensors file written by hand from the tensors'
# bytes: the safetensors package is not in Debian). Medians of 5 runs
# interleaved (lib.sh's race), hot page cache, peak RSS from GNU time.
# Usage: torch_bench.sh CKPT WORKDIR [MIB]
set -eu
ckpt=$(realpath "$1"); work=$2; mib=${3:-1024}
here=$(dirname "$(realpath "$0")")
py=/usr/bin/python3
mkdir -p "$work"
work=$(realpath "$work")
rm -rf "${work:?}"/*
source "$here/lib.sh"
declare -A MED RSS RUNS

"$py" - "$work/model.pt" "$mib" <<'PY'
import sys, torch
mib = int(sys.argv[2])
torch.manual_seed(0)
state, total, i = {}, 0, 0
while total < mib << 20:  # 768 x 3072 f32 blocks (9 MiB each), GPT-2-shaped
    state[f"h.{i}.mlp.c_fc.weight"] = torch.randn(768, 3072)
    total += 768 * 3072 * 4
    i += 1
torch.save(state, sys.argv[1])
PY
cat >"$work/peer.py" <<'PY'
import json, struct, sys, torch
state = torch.load(sys.argv[1])
header, offset, blobs = {}, 0, []
for name, t in state.items():
    b = t.contiguous().numpy().tobytes()
    header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
    offset += len(b)
    blobs.append(b)
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[2], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for b in blobs:
        f.write(b)
    f.flush()
    import os
    os.fsync(f.fileno())
PY
bytes=$(stat -c %s "$work/model.pt")
echo "torch.save (zip) of $((bytes >> 20)) MiB -> one safetensors file:"
race 5 ours "$work/o.safetensors" "$ckpt" convert "$work/model.pt" -o "$work/o.safetensors" \
  --format safetensors -q \
  -- cpsync "$work/cp.pt" sh -c 'cp -r "$0" "$1" && sync "$1"' "$work/model.pt" "$work/cp.pt" \
  -- torch "$work/t.safetensors" "$py" "$work/peer.py" "$work/model.pt" "$work/t.safetensors"
"$ckpt" convert "$work/model.pt" -o "$work/o.safetensors" --format safetensors -q
"$ckpt" diff "$work/model.pt" "$work/o.safetensors" >/dev/null
printf "%-34s %9s %10s %s\n" "" "seconds" "peak RSS" "runs"
for k in ours cpsync torch; do
  printf "%-34s %9.2f %7d MiB  %s\n" "$k" "${MED[$k]}" $((RSS[$k] >> 10)) "${RUNS[$k]}"
done
awk -v o="${MED[ours]}" -v c="${MED[cpsync]}" -v t="${MED[torch]}" \
  'BEGIN {printf "ours / (cp -r + sync) %.2fx; torch.load + write / ours %.2fx\n", o / c, t / o}'
rm -rf "${work:?}"/*
