#!/usr/bin/env bash
# Optimizer-state offload (train_gpt --offload optimizer --offload-dir DIR):
# Adam's moments stream from a file through the update; with
# --offload optimizer,params the weights too, a unit (the embeddings, a
# block) at a time. Losses, final weights and both moments are bit for bit
# those of the same run in memory (dp1, dp2 + ZeRO-1, tp2, pp2, dp2 x tp2 +
# ZeRO-1, and pp2 with full recompute for the weights); a run killed with
# SIGKILL and resumed from its latest checkpoint, with or without offload,
# ends bit for bit where the uninterrupted one does (the offload file is
# scratch, recreated by every job and removed at its end); the moments
# leave the rank's memory (the accounted optimizer bytes are the streaming
# buckets), the weights hold at most three units; in a memory cgroup the
# in-memory run is OOM-killed where the offloaded ones train, and optimizer
# offload alone is where optimizer and parameter offload train; an
# unwritable directory, a full one, --async-save and parameter offload
# without the optimizer's or with virtual stages are refused by name before
# any step, and the strategy file's offload keys pair with the flags.
# Usage: train_gpt_offload_test.sh TRAIN_GPT CORPUS CKPT
set -uo pipefail
BIN=$1
CORPUS=$2
CKPT=$3
WORK=$(mktemp -d)
trap 'umount "$WORK/full" "$WORK/tmpfs" 2>/dev/null; rm -rf "$WORK"' EXIT
source "$(dirname "$0")/../lib.sh"
SMALL=(--data "$CORPUS" --layers 2 --heads 4 --embed 32 --context 32 --batch 8 --lr 1e-3
  --max-norm 0.5 --steps 12 --bucket-mib 0.01 --offload-bucket-mib 0.01)
OFF=(--offload optimizer --offload-dir "$WORK")
same_run() { # same_run A_DIR A_LOG B_DIR B_LOG: bitwise losses and end state
  diff <(train_losses "$2") <(train_losses "$4") >/dev/null &&
    "$CKPT" diff "$1/step-12" "$3/step-12" >/dev/null
}

for setting in "" "--ranks 2 --zero 1" "--ranks 2 --tp 2" "--ranks 2 --pp 2" \
  "--ranks 4 --dp 2 --tp 2 --zero 1" "--ranks 2 --pp 2 --recompute full"; do
  # shellcheck disable=SC2086
  "$BIN" "${SMALL[@]}" $setting --save "$WORK/mem" >"$WORK/mem.log" 2>&1
  for kinds in optimizer optimizer,params; do
    [ "$kinds" = optimizer ] && [[ $setting == *recompute* ]] && continue
    # shellcheck disable=SC2086
    "$BIN" "${SMALL[@]}" $setting --offload $kinds --offload-dir "$WORK" --save "$WORK/off" \
      >"$WORK/off.log" 2>&1
    check "${setting:-1 rank}, --offload $kinds: losses, weights and moments bit for bit the \
in-memory run's" same_run "$WORK/mem" "$WORK/mem.log" "$WORK/off" "$WORK/off.log"
    rm -rf "$WORK/off"
  done
  rm -rf "$WORK/mem"
done
check "... the weights were offloaded: units read from their file step after step" \
  awk '/weights offload:/ && $3 > 0 { found = 1 } END { exit !found }' "$WORK/off.log"
check "... the offload files are gone after the runs" \
  bash -c "! ls '$WORK'/adam.rank*.bin '$WORK'/weights.rank*.bin 2>/dev/null | grep -q ."

# Killed (SIGKILL at step 9) and resumed from step 6's checkpoint, with
# offload, then without it, and an in-memory save resumed with offload.
for resume in "offload offload" "offload memory" "memory offload" "params params" \
  "params memory"; do
  read -r first second <<<"$resume"
  flags() {
    [ "$1" = offload ] && echo "--offload optimizer --offload-dir $WORK"
    [ "$1" = params ] && echo "--offload optimizer,params --offload-dir $WORK"
  }
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
optimizer_mib() { sed -n 's/.*gradients [0-9.]* MiB, optimizer \([0-9.]*\) MiB.*/\1/p' "$1"; }
"$BIN" "${BIG[@]}" >"$WORK/bm.log" 2>&1
"$BIN" "${BIG[@]}" "${OFF[@]}" >"$WORK/bo.log" 2>&1
check "offloaded, the optimizer's resident bytes are its 3 buckets (1.5 MiB), not the moments" \
  awk -v m="$(optimizer_mib "$WORK/bm.log")" -v o="$(optimizer_mib "$WORK/bo.log")" \
  'BEGIN { exit !(m > 6 && o <= 1.51) }'
# The weights too: 4 blocks of 0.75 MiB and the embeddings; at most the
# unit in use, the one read ahead and one written back are in memory.
"$BIN" "${BIG[@]}" --offload optimizer,params --offload-dir "$WORK" >"$WORK/bp.log" 2>&1
check "parameter offload: at most three units of the weights resident, well under all of them" \
  awk '/weights offload:/ { for (i = 1; i <= NF; i++) {
      if ($i == "(weights:") all = $(i + 1); if ($i == "largest") big = $(i + 1)
      if ($i == "most") res = $(i + 1) }
      found = 1 }
    END { exit !(found && res <= 3 * big + 0.01 && res < all) }' \
  "$WORK/bp.log"

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
  # finished_same RC LOG: the run exited 0 with the unlimited run's losses.
  finished_same() { [ "$1" -eq 0 ] && diff <(train_losses "$WORK/free.log") \
    <(train_losses "$2") >/dev/null; }
  "$BIN" "${WIDE[@]}" --save "$WORK/free_ck" --save-every 2 >"$WORK/free.log" 2>&1
  capped "$WORK/capped.log"
  plain=$?
  capped "$WORK/capped_off.log" "${OFF[@]}"
  off=$?
  # Within 230 MiB, optimizer offload alone (~265 MiB: the weights and
  # their gradients, 97 MiB each) is killed; with the weights offloaded too
  # (~205 MiB: three blocks of them) it trains.
  echo $((230 << 20)) >"$G/memory.limit_in_bytes"
  capped "$WORK/tight_off.log" "${OFF[@]}"
  tight_off=$?
  # ... saving too: the checkpoint streams from the offload files (the
  # moments, 194 MiB, never whole in memory).
  capped "$WORK/tight_params.log" --offload optimizer,params --offload-dir "$WORK" \
    --offload-bucket-mib 1 --save "$WORK/tight_ck" --save-every 2
  tight_params=$?
  # ... and killed at step 3, resumed from step 2's checkpoint within the
  # cap: the load streams the moments into the offload file too.
  capped "$WORK/tight_kill.log" --offload optimizer,params --offload-dir "$WORK" \
    --offload-bucket-mib 1 --save "$WORK/tight_k" --save-every 2 --fault-kill step:3:0
  capped "$WORK/tight_resume.log" --offload optimizer,params --offload-dir "$WORK" \
    --offload-bucket-mib 1 --save "$WORK/tight_k" --save-every 2 --resume
  tight_resume=$?
  rmdir "$G"
  check "within 340 MiB (cgroup v1), the in-memory run is killed by the OOM killer" \
    test "$plain" -eq 137
  check "... the offloaded one finishes with the unlimited run's losses, bit for bit" \
    finished_same "$off" "$WORK/capped_off.log"
  check "within 230 MiB, optimizer offload alone is killed by the OOM killer" \
    test "$tight_off" -eq 137
  check "... optimizer and parameter offload finish with the unlimited run's losses, bit for bit" \
    finished_same "$tight_params" "$WORK/tight_params.log"
  check "... and its checkpoint, saved within the cap, is the unlimited run's bit for bit" \
    "$CKPT" diff "$WORK/free_ck/step-2" "$WORK/tight_ck/step-2"
  # resumed_same RC LOG: resumed from step 2, step 3's loss the unlimited run's.
  resumed_same() { [ "$1" -eq 0 ] && grep -q 'resumed from step 2' "$2" &&
    [ "$(train_losses "$2")" = "$(train_losses "$WORK/free.log" | tail -1)" ]; }
  check "... killed at step 3 and resumed within the cap: step 3's loss is the unlimited run's" \
    resumed_same "$tight_resume" "$WORK/tight_resume.log"
else
  echo "skip the memory-cgroup case: $CG is not a writable cgroup v1 memory hierarchy (root)"
fi

# --rank-memory on its own: a job whose accounted peak exceeds it does not
# start, and says what offload would bring it to; offloaded it trains. With
# --auto-parallel and an offload directory the search offloads where
# nothing else fits, and says so.
WIDE=(--data "$CORPUS" --layers 8 --heads 8 --embed 512 --context 32 --batch 2 --steps 2
  --lr 1e-4)
"$BIN" "${WIDE[@]}" --rank-memory 230MiB >"$WORK/rm.log" 2>&1
rc=$?
check "--rank-memory below the accounted peak: refused before any step, naming the categories" \
  bash -c "[ $rc -ne 0 ] && ! grep -q '^step' '$WORK/rm.log' &&
    grep -q 'rank-memory 230.0 MiB: the accounted peak .* optimizer 193.5 MiB' '$WORK/rm.log' &&
    grep -q 'with --offload optimizer,params: 185.7 MiB' '$WORK/rm.log'"
"$BIN" "${WIDE[@]}" --rank-memory 230MiB --offload optimizer,params --offload-dir "$WORK" \
  --offload-bucket-mib 1 >"$WORK/rm_off.log" 2>&1
check "... offloaded, the same budget trains (the account on disk: 96.8 MiB of weights)" \
  bash -c "grep -q '^step     2/2' '$WORK/rm_off.log' &&
    grep -q 'on disk: parameters 96.8 MiB, optimizer 193.5 MiB' '$WORK/rm_off.log'"
PROFILE=$(dirname "$0")/../../samples/gpt/profiles/debian-vm-2core.json
"$BIN" "${WIDE[@]}" --auto-parallel exact --profile "$PROFILE" --rank-memory 230MiB \
  --offload-dir "$WORK" >"$WORK/auto.log" 2>&1
check "--auto-parallel within 230 MiB offloads (chosen and run), nothing else fits" \
  bash -c "grep -q '^auto-parallel .* offload=optimizer' '$WORK/auto.log' &&
    grep -q '^offload: ' '$WORK/auto.log' && grep -q '^step     2/2' '$WORK/auto.log'"

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
refused "parameter offload without the optimizer's is refused" \
  "parameter offload needs optimizer offload too" --offload params --offload-dir "$WORK"
refused "parameter offload with virtual stages is refused by name" \
  "parameter offload with virtual_stages 2" --offload optimizer,params --offload-dir "$WORK" \
  --ranks 2 --pp 2 --virtual-stages 2
printf '{"format": "tessera.op_strategy", "offload": "optimizer", "offload_dir": "%s"}\n' \
  "$WORK" >"$WORK/off.json"
"$BIN" "${SMALL[@]}" --op-strategy "$WORK/off.json" --save "$WORK/file" >"$WORK/file.log" 2>&1
"$BIN" "${SMALL[@]}" --save "$WORK/mem1" >"$WORK/mem1.log" 2>&1
check "the strategy file's offload keys: the same run, bit for bit" \
  same_run "$WORK/mem1" "$WORK/mem1.log" "$WORK/file" "$WORK/file.log"
refused "a file's offload disagreeing with --offload is named" \
  "sets offload optimizer but --offload is none" --op-strategy "$WORK/off.json" --offload none
refused "... and optimizer,params against optimizer" \
  "sets offload optimizer but --offload is optimizer,params" --op-strategy "$WORK/off.json" \
  --offload optimizer,params
if mkdir -p "$WORK/full" && mount -t tmpfs -o size=64k tmpfs "$WORK/full" 2>/dev/null; then
  refused "a full offload directory (64 KiB tmpfs) is refused naming the path and the bytes" \
    "adam.rank0.bin' needs .* the disk has no room" --offload optimizer --offload-dir "$WORK/full"
  # tmpfs has no direct I/O: the files go through the page cache there.
  mkdir -p "$WORK/tmpfs" && mount -t tmpfs -o size=64m tmpfs "$WORK/tmpfs" &&
    "$BIN" "${SMALL[@]}" --offload optimizer,params --offload-dir "$WORK/tmpfs" \
      --save "$WORK/tm" >"$WORK/tm.log" 2>&1
  "$BIN" "${SMALL[@]}" --save "$WORK/mem2" >"$WORK/mem2.log" 2>&1
  check "on tmpfs (no O_DIRECT: through the page cache), the same run bit for bit" \
    same_run "$WORK/mem2" "$WORK/mem2.log" "$WORK/tm" "$WORK/tm.log"
  umount "$WORK/tmpfs" 2>/dev/null
else
  echo "skip full-directory case: mounting a tmpfs needs root"
fi

echo "$passes passed, $fails failed"
test "$fails" -eq 0
