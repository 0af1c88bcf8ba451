#!/usr/bin/env bash
# Checkpointing that survives faults, with real processes (mpirun) and
# in-process ranks:
#  - resume equality: 10 steps, save, resume for 10 on the same mesh gives
#    the uninterrupted losses bit for bit (dp2 x tp2 in-process, tp2 under
#    mpirun); `ckpt reshard` to mesh B then resuming equals resuming from
#    the original on B (offline = online);
#  - kill -9 of a rank (--fault-kill) while it writes its pieces, before
#    its copies and parity, at the commit, and on rank 0 just before the
#    rename, synchronous and async: the previous checkpoint stays latest,
#    and the job resumes from it bit for bit;
#  - a deleted or corrupt data file: resume reads around it from replicas
#    (replicas:2) or parity (ZeRO-1, parity:2), says which, rebuilds it bit
#    for bit, and the losses are unchanged; `ckpt verify --repair` does the
#    same offline; two lost files of one parity group are named;
#  - a lost host: rs:2+2 over 4 ranks on 2 fake hosts, every file of one
#    host deleted, the resume continues the loss curve (in-process and
#    mpirun, sync and async); M + 1 lost files are refused by name;
#  - tessera-run --np / --ranks: a rank killed with kill -9 from outside is restarted
#    from the newest checkpoint (mpirun and in-process), on fewer ranks
#    when the hostfile shrinks, and stops after --max-restarts and below
#    --min-ranks.
# Usage: resilience_test.sh TRAIN_GPT CORPUS MPIRUN CKPT TESSERA_RUN
set -uo pipefail
BIN=$1
CORPUS=$2
CKPT=$4
RUN=$5
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
MPIRUN=("$3")
WORK=$(mktemp -d)
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
source "$(dirname "$0")/../lib.sh"
SMALL=(--data "$CORPUS" --layers 2 --heads 2 --embed 32 --context 32 --batch 8 --lr 1e-3
  --max-norm 0.5)
# The losses of steps FROM..20 of log A equal those of log B, as printed
# (9 significant digits: bit for bit for a float).
same_tail() {  # same_tail A B FROM
  diff <(train_losses "$1" | awk -v f="$3" '$1 >= f') \
    <(train_losses "$2" | awk -v f="$3" '$1 >= f') >/dev/null &&
    [ "$(train_losses "$1" | awk -v f="$3" '$1 >= f' | wc -l)" -eq $((21 - $3)) ]
}
latest() { cat "$1/latest" 2>/dev/null; }

# --- resume equality ----------------------------------------------------
DPTP=(--ranks 4 --tp 2 --zero 1)
"$BIN" "${SMALL[@]}" "${DPTP[@]}" --steps 20 >"$WORK/ref.log" 2>&1
check "dp2 x tp2 + ZeRO reference run" test $? -eq 0
"$BIN" "${SMALL[@]}" "${DPTP[@]}" --steps 10 --save "$WORK/eq" --save-mode sliced >/dev/null 2>&1 &&
  "$BIN" "${SMALL[@]}" "${DPTP[@]}" --steps 20 --save "$WORK/eq" --save-mode sliced --resume \
    >"$WORK/eq.log" 2>&1
check "10 + resume 10 on the same mesh: losses equal bit for bit" same_tail "$WORK/eq.log" "$WORK/ref.log" 11
"${MPIRUN[@]}" -np 2 "$BIN" "${SMALL[@]}" --steps 20 --tp 2 >"$WORK/mref.log" 2>&1
"${MPIRUN[@]}" -np 2 "$BIN" "${SMALL[@]}" --tp 2 --steps 10 --save "$WORK/meq" --async-save \
  >/dev/null 2>&1 &&
  "${MPIRUN[@]}" -np 2 "$BIN" "${SMALL[@]}" --steps 20 --tp 2 --save "$WORK/meq" --async-save --resume \
    >"$WORK/meq.log" 2>&1
check "mpirun tp2, async save at 10, resume: bit for bit" same_tail "$WORK/meq.log" "$WORK/mref.log" 11

# Offline reshard to B (tp4 x pp1, no ZeRO -> dp1 x tp2 x pp2) then load =
# reshard on load.
B=(--ranks 4 --tp 2 --pp 2)
"$BIN" "${SMALL[@]}" "${B[@]}" --steps 0 --strategy-out "$WORK/b.json" >/dev/null 2>&1
check "train_gpt --strategy-out writes mesh B's strategy" test -s "$WORK/b.json"
"$CKPT" reshard "$WORK/eq/step-10" --strategy "$WORK/b.json" -o "$WORK/off/step-10" -q
echo step-10 >"$WORK/off/latest"
cp -r "$WORK/eq" "$WORK/on"  # the online run resumes from a copy (it will save)
rm -rf "$WORK/on/step-20" && echo step-10 >"$WORK/on/latest"
"$BIN" "${SMALL[@]}" "${B[@]}" --steps 20 --save "$WORK/off" --resume >"$WORK/off.log" 2>&1
"$BIN" "${SMALL[@]}" "${B[@]}" --steps 20 --save "$WORK/on" --resume >"$WORK/on.log" 2>&1
check "ckpt reshard to B then resume = resume on B from the original (bit for bit)" \
  same_tail "$WORK/off.log" "$WORK/on.log" 11
check "... and both follow the reference within 1e-5" awk '
  NR == FNR { ref[$1] = $2; next }
  { d = $2 - ref[$1]; if (d < 0) d = -d; if (d > 1e-5 * ref[$1]) bad = 1; n++ }
  END { exit bad || n != 10 }' <(train_losses "$WORK/ref.log") <(train_losses "$WORK/on.log" | awk '$1 > 10')

# --- kill -9 during a save ----------------------------------------------
# mpirun -np 4 dp2 x tp2, saves every 5: the step-10 save dies at POINT.
"${MPIRUN[@]}" -np 4 "$BIN" "${SMALL[@]}" --steps 20 --tp 2 --zero 1 >"$WORK/mref4.log" 2>&1
# At "committed" (rank 0, step-10 in place, `latest` not yet moved) step-10
# is abandoned: `latest` is the authority; the resume takes step-5 and its
# own step-10 replaces the abandoned one.
for fault in write:10:1 redundancy:10:2 commit:10:3 rename:10:0 committed:10:0 \
  async:write:10:1 async:committed:10:0; do
  extra=(--save-mode sliced --redundancy parity:2)
  point=$fault
  if [ "${fault%%:*}" = async ]; then extra=(--async-save); point=${fault#async:}; fi
  dir="$WORK/kill-${fault//:/-}"
  "${MPIRUN[@]}" -np 4 "$BIN" "${SMALL[@]}" --steps 20 --tp 2 --zero 1 --save "$dir" \
    --save-every 5 "${extra[@]}" --fault-kill "$point" >"$dir.log" 2>&1
  rc=$?
  check "kill -9 at $fault: the job fails" test $rc -ne 0
  check "... says which rank killed itself" grep -q "kills itself at ${point%%:*} of step 10" "$dir.log"
  if [ "${point%%:*}" = committed ]; then
    check "... step-5 stays the latest, step-10 is complete" \
      bash -c "[ \"\$(cat '$dir/latest')\" = step-5 ] && '$CKPT' verify -q '$dir/step-10'"
  else
    check "... step-5 stays the latest, no step-10" \
      bash -c "[ \"\$(cat '$dir/latest')\" = step-5 ] && [ ! -e '$dir/step-10' ]"
  fi
  "${MPIRUN[@]}" -np 4 "$BIN" "${SMALL[@]}" --steps 20 --tp 2 --zero 1 --save "$dir" \
    --save-every 5 "${extra[@]}" --resume >"$dir.resume.log" 2>&1
  check "... resumes from step-5" grep -q "resumed from step 5 " "$dir.resume.log"
  if [ "${point%%:*}" = committed ]; then
    check "... says step-10 is abandoned, replaces it, and ends on step-20" \
      bash -c "grep -q 'abandoned run, replaced when saved again: step-10\$' '$dir.resume.log' &&
        grep -q 'saved .*step-10' '$dir.resume.log' && [ \"\$(cat '$dir/latest')\" = step-20 ]"
  fi
  check "... and gives the uninterrupted losses bit for bit" \
    same_tail "$dir.resume.log" "$WORK/mref4.log" 6
  check "... and leaves no temporary behind after the next save" \
    bash -c "! ls -d '$dir'/*.tmp-* 2>/dev/null | grep -q ."
done

# --- lost and corrupt data files ----------------------------------------
# KIND DAMAGE FILE SOURCE: saved at step 10 with KIND redundancy, FILE
# deleted or corrupt, resumed; the loader reads it around from SOURCE.
for setup in "replicas delete data-00001.tsr copies" "replicas corrupt data-00002.tsr copies" \
  "parity delete data-00003.tsr parity" "parity corrupt data-00000.tsr parity"; do
  read -r kind damage file source <<<"$setup"
  dir="$WORK/lost-$kind-$damage"
  if [ "$kind" = replicas ]; then red=replicas:2; else red=parity:2; fi
  "$BIN" "${SMALL[@]}" "${DPTP[@]}" --steps 10 --save "$dir" --save-mode sliced \
    --redundancy "$red" >/dev/null 2>&1
  cp "$dir/step-10/$file" "$WORK/original.tsr"
  if [ "$damage" = delete ]; then
    rm "$dir/step-10/$file"
  else
    # Every piece in it (past the 4 KiB header): the loader reads some.
    size=$(stat -c %s "$dir/step-10/$file")
    head -c $((size - 4096)) /dev/zero | tr '\0' '\377' |
      dd of="$dir/step-10/$file" bs=4096 seek=1 conv=notrunc 2>/dev/null
  fi
  "$BIN" "${SMALL[@]}" "${DPTP[@]}" --steps 20 --save "$dir" --save-mode sliced \
    --redundancy "$red" --resume >"$dir.log" 2>&1
  check "$red, $file ${damage}d: resume reads around it ($source) and says so" \
    grep -q "loading .*$file (missing or corrupt): .*$source" "$dir.log"
  check "... rebuilds it" grep -q "repaired .*rebuilt $file: from" "$dir.log"
  check "... bit for bit" cmp -s "$dir/step-10/$file" "$WORK/original.tsr"
  check "... and the losses are the uninterrupted ones" same_tail "$dir.log" "$WORK/ref.log" 11
done
# Offline: ckpt verify --repair, and two lost files of one parity group.
dir="$WORK/lost-parity-delete"
cp "$dir/step-10/data-00001.tsr" "$WORK/original.tsr"
rm "$dir/step-10/data-00001.tsr"
run_out() { "$@" >"$WORK/out" 2>&1; }
run_out "$CKPT" verify "$dir/step-10"
check "ckpt verify finds the lost file" grep -q "data-00001.tsr.*missing" "$WORK/out"
run_out "$CKPT" verify --repair "$dir/step-10"
check "ckpt verify --repair rebuilds it from parity" grep -q "rebuilt data-00001.tsr: from parity" "$WORK/out"
check "... bit for bit, and verifies" bash -c "cmp -s '$dir/step-10/data-00001.tsr' '$WORK/original.tsr' && \
  '$CKPT' verify -q '$dir/step-10'"
# Groups of 2 over ranks ordered by host: data-00000 and data-00001 share one.
rm "$dir/step-10/data-00000.tsr" "$dir/step-10/data-00001.tsr"
run_out "$CKPT" verify --repair "$dir/step-10"
rc=$?
check "two lost files of one parity group: --repair fails" test $rc -ne 0
check "... naming both" grep -q "cannot rebuild data-00000.tsr: .*data-00001.tsr.*one file per group" "$WORK/out"
echo step-10 >"$dir/latest"
run_out "$BIN" "${SMALL[@]}" "${DPTP[@]}" --steps 20 --save "$dir" --save-mode sliced --resume
check "... and resuming fails naming the missing file" \
  bash -c "grep -q 'data-0000[01].tsr.* is missing' '$WORK/out' && ! grep -q '^step' '$WORK/out'"

# --- a lost host, Reed-Solomon ------------------------------------------
# 4 ranks on 2 "hosts" (a,a,b,b) save with rs:2+2; every file host b wrote
# (as the manifest records it) is deleted; the resume rebuilds them and
# continues the uninterrupted loss curve. In-process ranks with --hosts,
# then mpirun with TESSERA_HOSTS and async saves.
host_files() {  # host_files CKPT HOST: the files the manifest says HOST wrote
  "$CKPT" inspect --json "$1" | python3 -c "import json, sys
print(' '.join(f['name'] for f in json.load(sys.stdin)['files'] if f['host'] == sys.argv[1]))" "$2"
}
for mode in inproc mpirun; do
  dir="$WORK/rs-host-$mode"
  if [ $mode = inproc ]; then
    launch=("$BIN" --ranks 4 --hosts a,a,b,b); extra=(--save-mode sliced); ref="$WORK/ref.log"
  else
    launch=("${MPIRUN[@]}" -np 4 -x TESSERA_HOSTS=a,a,b,b "$BIN"); extra=(--async-save)
    ref="$WORK/mref4.log"
  fi
  "${launch[@]}" "${SMALL[@]}" --tp 2 --zero 1 --steps 10 --save "$dir" "${extra[@]}" \
    --redundancy rs:2+2 >"$dir.save.log" 2>&1
  check "rs:2+2 over 2 hosts ($mode): saved, the plan said" \
    grep -q "rs:2+2: 2 groups of up to 2 data files" "$dir.save.log"
  run_out "$CKPT" inspect --files "$dir/step-10"
  check "... inspect lists 8 files on 2 hosts, 4 of them parity" \
    grep -q "^files  *8 on 2 hosts, 4 of them parity" "$WORK/out"
  b_files=$(host_files "$dir/step-10" b)
  check "... host b wrote 4 of them (2 data, 2 parity)" \
    bash -c "[ \$(wc -w <<<'$b_files') -eq 4 ] && grep -q 'data-0000[23].tsr.*data-0000[23].tsr' <<<'$b_files'"
  mkdir -p "$dir.orig" && cp "$dir"/step-10/*.tsr "$dir.orig/"
  for f in $b_files; do rm "$dir/step-10/$f"; done
  "${launch[@]}" "${SMALL[@]}" --tp 2 --zero 1 --steps 20 --save "$dir" "${extra[@]}" \
    --redundancy rs:2+2 --resume >"$dir.log" 2>&1
  check "... host b's files deleted: the resume rebuilds them from the groups" \
    grep -q "loading .*data-00002.tsr (missing or corrupt): rebuilt from its rs:2+2 group" "$dir.log"
  check "... and continues the uninterrupted loss curve" same_tail "$dir.log" "$ref" 11
  check "... every lost file repaired bit for bit" bash -c "for f in $b_files; do
    cmp -s '$dir/step-10/'\$f '$dir.orig/'\$f || exit 1; done"
done
# XOR parity over the same 2 hosts cannot survive one: verify says which
# group a lost host would take down (from the hosts the manifest records).
dir="$WORK/xor-hosts"
"$BIN" --ranks 4 --hosts a,a,b,b "${SMALL[@]}" --tp 2 --zero 1 --steps 2 --save "$dir" \
  --save-mode sliced --redundancy parity:2 >/dev/null 2>&1
run_out "$CKPT" verify "$dir/step-2"
check "parity:2 over 2 hosts: verify passes and notes the groups a lost host would take down" \
  bash -c "grep -q \"^note: parity group 0: host '[ab]' holds 2 of its 3 files .*1 can be rebuilt: losing that host loses data\" '$WORK/out' &&
    grep -q ' 0 problems' '$WORK/out'"
run_out "$CKPT" verify "$WORK/rs-host-inproc/step-20"
check "... and none for rs:2+2 over the same hosts" \
  bash -c "grep -q ' 0 problems' '$WORK/out' && ! grep -q '^note:' '$WORK/out'"
# Offline: three files of one rs:2+2 group (M + 1) are refused, named.
dir="$WORK/rs-host-inproc/step-10"
rm "$dir/data-00000.tsr" "$dir/data-00002.tsr" "$dir/rs-0-0.tsr"
run_out "$CKPT" verify --repair "$dir"
rc=$?
check "three lost files of an rs:2+2 group: --repair fails" test $rc -ne 0
check "... naming the files that cannot be rebuilt" \
  grep -q "cannot rebuild data-00000.tsr: .*1 good file of its rs:2+2 group remains, 2 are needed (lost too: data-00002.tsr rs-0-0.tsr)" "$WORK/out"

# --- the supervisor ------------------------------------------------------
# kill_when DIR STEP PATTERN: once DIR/step-STEP is committed, kill -9 the
# newest process matching PATTERN (one rank).
kill_when() {
  for _ in $(seq 600); do
    [ -f "$1/step-$2/manifest.pb" ] && break
    sleep 0.1
  done
  pkill -9 -n -f "$3"
}
SLOW=(--layers 2 --heads 2 --embed 64 --context 64 --batch 16 --lr 1e-3 --max-norm 0.5)
"$BIN" --data "$CORPUS" "${SLOW[@]}" --steps 40 --ranks 4 --tp 2 >"$WORK/slow-ref.log" 2>&1
dir="$WORK/sup-mpi"
echo "localhost slots=4" >"$WORK/hosts"
(kill_when "$dir" 10 "^$BIN --data .*sup-mpi" && echo "localhost slots=2" >"$WORK/hosts") &
"$RUN" --np 4 --hostfile "$WORK/hosts" --min-ranks 2 --max-restarts 2 -- \
  "$BIN" --data "$CORPUS" "${SLOW[@]}" --steps 40 --tp 2 --save "$dir" --save-every 5 \
  --save-mode sliced --resume >"$WORK/sup-mpi.log" 2>&1
rc=$?
wait
check "tessera-run --np (mpirun): a rank killed with kill -9, the job restarted and finished" test $rc -eq 0
[ $rc -eq 0 ] || tail -n 40 "$WORK/sup-mpi.log"  # for the CI log
check "... it saw the death" grep -q "tessera-run: attempt 1 failed after .*: the job exited with status" "$WORK/sup-mpi.log"
check "... restarted on the 2 ranks the hostfile now lists, from a checkpoint" \
  grep -q "attempt 2 on 2 rank(s), from .*sup-mpi/step-" "$WORK/sup-mpi.log"
check "... which resumed resharded (dp2 x tp2 -> tp2)" grep -q "resumed from step" "$WORK/sup-mpi.log"
check "... and ended on the uninterrupted loss within 1e-5" awk '
  NR == FNR { if ($1 == 40) ref = $2; next }
  $1 == 40 { got = $2 }
  END { d = got - ref; if (d < 0) d = -d; exit !(ref > 0 && d <= 1e-5 * ref) }' \
  <(train_losses "$WORK/slow-ref.log") <(train_losses "$WORK/sup-mpi.log")
dir="$WORK/sup-inproc"
(kill_when "$dir" 10 "^$BIN --data .*sup-inproc") &
"$RUN" --ranks 4 -- "$BIN" --data "$CORPUS" "${SLOW[@]}" --steps 40 --ranks "{ranks}" --tp 2 \
  --save "$dir" --save-every 5 --async-save --redundancy replicas:2 --resume \
  >"$WORK/sup-inproc.log" 2>&1
rc=$?
wait
check "tessera-run --ranks (in-process ranks): killed with kill -9, restarted, finished" test $rc -eq 0
[ $rc -eq 0 ] || tail -n 40 "$WORK/sup-inproc.log"  # for the CI log
check "... it saw the SIGKILL" grep -q "was killed by signal 9" "$WORK/sup-inproc.log"
last_loss() { train_losses "$1" | awk '$1 == 40 { print $2 }' | tail -1; }
check "... and ended on the uninterrupted loss bit for bit" \
  test "$(last_loss "$WORK/sup-inproc.log")" = "$(last_loss "$WORK/slow-ref.log")" -a \
  -n "$(last_loss "$WORK/slow-ref.log")"
run_out "$RUN" --ranks 1 --max-restarts 2 -- "$BIN" --no-such-flag
check "a job that keeps failing: given up after --max-restarts" \
  bash -c "[ \$(grep -c 'tessera-run: attempt [0-9]* on' '$WORK/out') -eq 3 ] && grep -q 'giving up after 2 restart' '$WORK/out'"
echo "localhost slots=1" >"$WORK/hosts"
run_out "$RUN" --np 4 --hostfile "$WORK/hosts" --min-ranks 2 -- "$BIN" --data "$CORPUS"
check "fewer ranks than --min-ranks: not started" grep -q "1 rank(s) available, fewer than --min-ranks 2" "$WORK/out"

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
