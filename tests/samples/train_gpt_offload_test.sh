#!/usr/bin/env bash
# Optimizer-state offload (train_gpt --offload optimizer --offload-dir DIR):
# Adam's moments stream from a file through the update; losses, final
# weights and both moments are bit for bit those of the same run in memory
# (dp1, dp2 + ZeRO-1, tp2, pp2, dp2 x tp2 + ZeRO-1); a run killed with
# SIGKILL and resumed from its latest checkpoint, with or without offload,
# ends bit for bit where the uninterrupted one does (the offload file is
# scratch, recreated by every job and removed at its end); the moments
# leave the rank's memory (the accounted optimizer bytes are the streaming
# buckets); an unwritable directory, a full one and --async-save are
# refused by name before any step, and the strategy file's offload keys
# pair with the flags.
# Usage: train_gpt_offload_test.sh TRAIN_GPT CORPUS CKPT
set -uo pipefail
BIN=$1
CORPUS=$2
CKPT=$3
WORK=$(mktemp -d)
trap 'umount "$WORK/full" 2>/dev/null; rm -rf "$WORK"' EXIT
source "$(dirname "$0")/../lib.sh"
SMALL=(--data "$CORPUS" --layers 2 --heads 4 --embed 32 --context 32 --batch 8 --lr 1e-3
  --max-norm 0.5 --steps 12 --bucket-mib 0.01 --offload-bucket-mib 0.01)
OFF=(--offload optimizer --offload-dir "$WORK")
same_run() { # same_run A_DIR A_LOG B_DIR B_LOG: bitwise losses and end state
  diff <(train_losses "$2") <(train_losses "$4") >/dev/null &&
    "$CKPT" diff "$1/step-12" "$3/step-12" >/dev/null
}

for setting in "" "--ranks 2 --zero 1" "--ranks 2 --tp 2" "--ranks 2 --pp 2" \
  "--ranks 4 --dp 2 --tp 2 --zero 1"; do
  # shellcheck disable=SC2086
  "$BIN" "${SMALL[@]}" $setting --save "$WORK/mem" >"$WORK/mem.log" 2>&1
  # shellcheck disable=SC2086
  "$BIN" "${SMALL[@]}" $setting "${OFF[@]}" --save "$WORK/off" >"$WORK/off.log" 2>&1
  check "${setting:-1 rank}: offloaded, losses, weights and moments bit for bit the in-memory run's" \
    same_run "$WORK/mem" "$WORK/mem.log" "$WORK/off" "$WORK/off.log"
  rm -rf "$WORK/off" "$WORK/mem"
done
check "... the offload files are gone after the runs" \
  bash -c "! ls '$WORK'/adam.rank*.bin 2>/dev/null | grep -q ."

# Killed (SIGKILL at step 9) and resumed from step 6's checkpoint, with
# offload, then without it, and an in-memory save resumed with offload.
for resume in "offload offload" "offload memory" "memory offload"; do
  read -r first second <<<"$resume"
  flags() { [ "$1" = offload ] && echo "--offload optimizer --offload-dir $WORK"; }
  rm -rf "$WORK/k"
  # shellcheck disable=SC2046
  ("$BIN" "${SMALL[@]}" --ranks 2 --zero 1 $(flags "$first") --save "$WORK/k" --save-every 6 \
    --fault-kill step:9:0 >"$WORK/k1.log" 2>&1) 2>/dev/null
  killed=$([ -e "$WORK/k/step-6" ] && [ ! -e "$WORK/k/step-12" ] && echo yes)
  # shellcheck disable=SC2046
  "$BIN" "${SMALL[@]}" --ranks 2 --zero 1 $(flags "$second") --save "$WORK/k" --save-every 6 \
    --resume >"$WORK/k2.log" 2>&1
  "$BIN" "${SMALL[@]}" --ranks 2 --zero 1 --save "$WORK/u" >"$WORK/u.log" 2>&1
  check "killed at step 9 ($first), resumed from step 6 ($second): the uninterrupted end state" \
    bash -c "[ '$killed' = yes ] && '$CKPT' diff '$WORK/k/step-12' '$WORK/u/step-12' >/dev/null"
  rm -rf "$WORK/u"
done

# The moments leave memory: 4 layers of C 128 hold 6.5 MiB of moments;
# offloaded, the optimizer's account is its three buckets (3 x 2 x 0.25 MiB).
BIG=(--data "$CORPUS" --layers 4 --heads 4 --embed 128 --context 32 --batch 8 --steps 3
  --offload-bucket-mib 0.25)
optimizer_mib() { sed -n 's/.*optimizer \([0-9.]*\) MiB.*/\1/p' "$1"; }
"$BIN" "${BIG[@]}" >"$WORK/bm.log" 2>&1
"$BIN" "${BIG[@]}" "${OFF[@]}" >"$WORK/bo.log" 2>&1
check "offloaded, the optimizer's resident bytes are its 3 buckets (1.5 MiB), not the moments" \
  awk -v m="$(optimizer_mib "$WORK/bm.log")" -v o="$(optimizer_mib "$WORK/bo.log")" \
  'BEGIN { exit !(m > 6 && o <= 1.51) }'

# The claim, in a memory cgroup (v1) below the in-memory run's peak and
# above the offloaded one's: 8 layers of C 512 hold 194 MiB of moments;
# within 340 MiB the plain run is killed by the kernel's OOM killer, the
# offloaded one (4 MiB buckets) trains to the unlimited run's losses.
CG=/sys/fs/cgroup/memory
if [ -w "$CG" ] && [ -f "$CG/memory.limit_in_bytes" ] && mkdir "$CG/tessera_offload_$$" 2>/dev/null
then
  G=$CG/tessera_offload_$$
  echo $((340 << 20)) >"$G/memory.limit_in_bytes"
  echo 0 >"$G/memory.swappiness" 2>/dev/null
  WIDE=(--data "$CORPUS" --layers 8 --heads 8 --embed 512 --context 32 --batch 2 --steps 3
    --lr 1e-4)
  capped() { # capped LOG FLAGS...: a run inside the cgroup
    local log=$1
    shift
    (bash -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$G" "$BIN" "${WIDE[@]}" "$@" \
      >"$log" 2>&1) 2>/dev/null
  }
  "$BIN" "${WIDE[@]}" >"$WORK/free.log" 2>&1
  capped "$WORK/capped.log"
  plain=$?
  capped "$WORK/capped_off.log" "${OFF[@]}"
  off=$?
  rmdir "$G"
  check "within 340 MiB (cgroup v1), the in-memory run is killed by the OOM killer" \
    test "$plain" -eq 137
  check "... the offloaded one finishes with the unlimited run's losses, bit for bit" \
    bash -c "[ $off -eq 0 ] && diff <(grep '^step' '$WORK/free.log' | awk '{print \$4}') \
      <(grep '^step' '$WORK/capped_off.log' | awk '{print \$4}') >/dev/null"
else
  echo "skip the memory-cgroup case: $CG is not a writable cgroup v1 memory hierarchy (root)"
fi

# Refusals, before any step.
refused() { # refused NAME PATTERN FLAGS...
  local name=$1 pattern=$2
  shift 2
  "$BIN" "${SMALL[@]}" "$@" >"$WORK/bad.log" 2>&1
  local rc=$?
  check "$name" bash -c "[ $rc -ne 0 ] && ! grep -q '^step' '$WORK/bad.log' &&
    grep -q -e \"$pattern\" '$WORK/bad.log'"
}
refused "an offload directory that does not exist is named" \
  "cannot create '$WORK/nowhere/adam.rank0.bin'" --offload optimizer --offload-dir "$WORK/nowhere"
refused "--offload optimizer without a directory is refused" "needs a directory" \
  --offload optimizer
refused "--async-save with offload is refused by name" "--async-save with --offload optimizer" \
  "${OFF[@]}" --save "$WORK/as" --async-save
printf '{"format": "tessera.op_strategy", "offload": "optimizer", "offload_dir": "%s"}\n' \
  "$WORK" >"$WORK/off.json"
"$BIN" "${SMALL[@]}" --op-strategy "$WORK/off.json" --save "$WORK/file" >"$WORK/file.log" 2>&1
"$BIN" "${SMALL[@]}" --save "$WORK/mem1" >"$WORK/mem1.log" 2>&1
check "the strategy file's offload keys: the same run, bit for bit" \
  same_run "$WORK/mem1" "$WORK/mem1.log" "$WORK/file" "$WORK/file.log"
refused "a file's offload disagreeing with --offload is named" \
  "sets offload optimizer but --offload is none" --op-strategy "$WORK/off.json" --offload none
if mkdir -p "$WORK/full" && mount -t tmpfs -o size=64k tmpfs "$WORK/full" 2>/dev/null; then
  refused "a full offload directory (64 KiB tmpfs) is refused naming the path and the bytes" \
    "adam.rank0.bin' needs .* the disk has no room" --offload optimizer --offload-dir "$WORK/full"
else
  echo "skip full-directory case: mounting a tmpfs needs root"
fi

echo "$passes passed, $fails failed"
test "$fails" -eq 0
