#!/usr/bin/env bash
# Parameter servers end to end (train_gpt --ps-servers S [--ps-params P]):
# ranks [0, S) serve, the rest are data-parallel workers. Synchronous mode
# gives the single-process losses within 1e-5 relative per step over 20
# steps, and bit for bit the losses and final weights of data parallelism
# over the same two workers (its fold, a + b): S = 1 and 2 with every
# parameter on the servers, the embedding alone, the embedding cut by rows
# over two servers (1e-5: its norm is summed in two parts), the MLP's
# first matrices by pattern; in-process, under mpirun and over Gloo
# (tessera-run --ps-servers, which passes TESSERA_PS_SERVERS), the file's
# ps_servers/ps_params keys; Gloo processes started by hand with the roles
# in another order train the same, a rank that never comes is named with
# the roles, and processes given different server counts refuse by name;
# checkpoints are written by the whole world (servers their pieces and
# moments) with the servers' cut in the strategy, bit for bit data
# parallelism's where the fold matches, merged or sliced, and resume on
# another number of servers, without servers, and from a data-parallel
# checkpoint; a server killed with SIGKILL under tessera-run: the job
# restarts from the newest checkpoint and ends on the uninterrupted losses;
# a worker killed in asynchronous mode under tessera-run
# --ps-replace-workers: replaced alone, the others training on;
# bad configurations are refused before any step.
# Usage: train_gpt_ps_test.sh TRAIN_GPT CORPUS MPIRUN TESSERA_RUN CKPT
set -uo pipefail
BIN=$1
CORPUS=$2
MPIRUN=("$3" --allow-run-as-root --oversubscribe)
RUN=$4
CKPT=$5
WORK=$(mktemp -d)
work=$WORK
trap 'pkill -9 -P $$ 2>/dev/null; rm -rf "$WORK"' EXIT
source "$(dirname "$0")/../lib.sh"
SMALL=(--data "$CORPUS" --layers 2 --heads 4 --embed 32 --context 32 --batch 8 --lr 1e-3
  --max-norm 0.5 --steps 20)
train() { # train LOG FLAGS...
  local log=$1
  shift
  "$BIN" "${SMALL[@]}" "$@" >"$log" 2>&1
}
same_losses() { diff <(train_losses "$1") <(train_losses "$2") >/dev/null; }

train "$WORK/one.log"
check "single-process reference" test $? -eq 0
train "$WORK/dp.log" --ranks 2 --export "$WORK/dp"
check "data parallel over 2 ranks" test $? -eq 0

for setting in "--ranks 3 --ps-servers 1" "--ranks 4 --ps-servers 2" \
  "--ranks 3 --ps-servers 1 --ps-params wte" "--ranks 4 --ps-servers 2 --ps-params h.*.mlp.c_fc.*" \
  "--ranks 4 --ps-servers 2 --ps-params wte,wpe"; do
  rm -rf "$WORK/ps"
  # shellcheck disable=SC2086
  train "$WORK/ps.log" $setting --export "$WORK/ps"
  check "$setting: the single-process losses" close "$WORK/ps.log" "$WORK/one.log" 20
  if [[ $setting != *wte,wpe* ]]; then
    check "... bit for bit data parallelism's losses" same_losses "$WORK/ps.log" "$WORK/dp.log"
    check "... and final weights" "$CKPT" diff -q "$WORK/dp/step-20" "$WORK/ps/step-20"
  else
    check "... wte cut by rows over the two servers" grep -q "wte\[0:128)" "$WORK/ps.log"
    check "... final weights within 1e-5 of data parallelism's" \
      "$CKPT" diff -q --rtol 1e-5 --atol 1e-7 "$WORK/dp/step-20" "$WORK/ps/step-20"
  fi
done
check "... the placement is said" grep -q "^server 1: " "$WORK/ps.log"
check "... a worker holds no optimizer state for served parameters" \
  grep -q "optimizer 0.00 MiB" <(train "/dev/stdout" --ranks 3 --ps-servers 1)

"${MPIRUN[@]}" -np 4 "$BIN" "${SMALL[@]}" --ps-servers 2 >"$WORK/mpi.log" 2>&1
check "mpirun -np 4 --ps-servers 2: data parallelism's losses bit for bit" \
  same_losses "$WORK/mpi.log" "$WORK/dp.log"
"$RUN" --nproc-per-node 3 --ps-servers 1 -- "$BIN" "${SMALL[@]}" >"$WORK/gloo.out" 2>&1
sed -n 's/^\[rank 1\] //p' "$WORK/gloo.out" >"$WORK/gloo.log"
check "tessera-run --nproc-per-node 3 --ps-servers 1 (Gloo): data parallelism's losses" \
  same_losses "$WORK/gloo.log" "$WORK/dp.log"
check "... rank 0 served" grep -q "^\[rank 0\] parameter server 0: 20 steps served" "$WORK/gloo.out"

# Checkpoints: the world writes them (servers their pieces and moments,
# one worker the workers' own), the strategy records the servers' cut.
train "$WORK/dpsave.log" --ranks 2 --save "$WORK/dpck" --save-every 10
train "$WORK/pssave.log" --ranks 3 --ps-servers 1 --save "$WORK/psck" --save-every 10 \
  --save-mode sliced
check "a sliced save by a server and two workers: bit for bit data parallelism's checkpoint \
(weights, both moments, step)" "$CKPT" diff -q "$WORK/dpck/step-20" "$WORK/psck/step-20"
train "$WORK/pssave2.log" --ranks 4 --ps-servers 2 --ps-params wte,wpe --save "$WORK/ps2" \
  --save-every 10 --save-mode sliced
"$CKPT" inspect "$WORK/ps2/step-10" >"$WORK/inspect" 2>&1
check "... the strategy records the servers' cut (wte by rows, wpe on server 0, the rest on \
the workers)" bash -c "grep -q '^wte .*split \[server, -\]' '$WORK/inspect' &&
  grep -q '^wpe .*stage server=0' '$WORK/inspect' &&
  grep -q '^h.0.ln_1.weight .*stage rank=2,3' '$WORK/inspect' &&
  grep -q '^optimizer.wte.exp_avg .*split \[server, -\]' '$WORK/inspect'"
train "$WORK/merged.log" --ranks 4 --ps-servers 2 --ps-params wte,wpe --save "$WORK/ps2m" \
  --save-every 10
check "... a merged save of the same run holds the same tensors" \
  "$CKPT" diff -q "$WORK/ps2/step-20" "$WORK/ps2m/step-20"
"$CKPT" merge -q "$WORK/ps2/step-20" -o "$WORK/ps2merged" >/dev/null 2>&1
check "... and ckpt merge of the sliced one gives them too" \
  "$CKPT" diff -q "$WORK/ps2merged" "$WORK/ps2m/step-20"
"$CKPT" verify "$WORK/ps2/step-20" >"$WORK/verify" 2>&1
check "... ckpt verify checks every byte of it" grep -q ", 0 problems" "$WORK/verify"
# Step 10 of that run resumed on other configurations: the curve goes on.
for setting in "--ranks 4 --ps-servers 2 --ps-params wte,wpe" "--ranks 3 --ps-servers 1" \
  "--ranks 5 --ps-servers 3" "--ranks 2" "--ranks 1"; do
  rm -rf "$WORK/r"
  cp -r "$WORK/ps2" "$WORK/r"
  rm -rf "$WORK/r/step-20"
  echo step-10 >"$WORK/r/latest"
  # shellcheck disable=SC2086
  train "$WORK/r.log" $setting --save "$WORK/r" --resume
  head -n 10 <(grep ^step "$WORK/pssave2.log") | cat - "$WORK/r.log" >"$WORK/joined.log"
  check "PS checkpoint (2 servers) resumed with $setting: the single-process curve" \
    close "$WORK/joined.log" "$WORK/one.log" 20
done
rm -rf "$WORK/r"
cp -r "$WORK/dpck" "$WORK/r"
rm -rf "$WORK/r/step-20"
echo step-10 >"$WORK/r/latest"
train "$WORK/r.log" --ranks 3 --ps-servers 1 --save "$WORK/r" --resume
head -n 10 <(grep ^step "$WORK/dp.log") | cat - "$WORK/r.log" >"$WORK/joined.log"
check "a data-parallel checkpoint resumed by a server and two workers: bit for bit" \
  same_losses "$WORK/joined.log" "$WORK/dp.log"

# A server killed (SIGKILL) at step 8 under tessera-run: the job restarts
# from step 5's checkpoint and ends on the uninterrupted losses.
"$RUN" --nproc-per-node 3 --ps-servers 1 -- "$BIN" "${SMALL[@]}" --save "$WORK/kill" \
  --save-every 5 --resume --fault-kill step:8:0 >"$WORK/kill.out" 2>&1
check "a server killed by SIGKILL under tessera-run: the job restarted from step 5" \
  grep -q "attempt 2: .*from $WORK/kill/step-5" "$WORK/kill.out"
sed -n 's/^\[rank 1\] //p' "$WORK/kill.out" | awk '/^step/ && !seen[$2]++' >"$WORK/kill.log"
check "... and ends on the uninterrupted run's losses, bit for bit" \
  same_losses "$WORK/kill.log" "$WORK/dp.log"

# The embedding served by rows (--untied-head, wte on the servers): each
# worker fetches its batch's rows and pushes their gradients; the servers
# update the whole table. Data parallelism's bits, cut over two servers,
# exported whole, saved and resumed.
train "$WORK/udp.log" --untied-head --ranks 2 --export "$WORK/udp" --save "$WORK/udpck" \
  --save-every 10
train "$WORK/uone.log" --untied-head
check "untied head: data parallelism gives the single-process losses" \
  close "$WORK/udp.log" "$WORK/uone.log" 20
for setting in "--ranks 3 --ps-servers 1" "--ranks 4 --ps-servers 2 --ps-params wte"; do
  rm -rf "$WORK/u" "$WORK/uck"
  # shellcheck disable=SC2086
  train "$WORK/u.log" --untied-head $setting --export "$WORK/u" --save "$WORK/uck" \
    --save-every 10
  check "$setting, wte served by rows: bit for bit data parallelism's losses" \
    same_losses "$WORK/u.log" "$WORK/udp.log"
  check "... the placement says so" grep -q "^wte served by rows" "$WORK/u.log"
  check "... the export holds the whole table, data parallelism's" \
    "$CKPT" diff -q "$WORK/udp/step-20" "$WORK/u/step-20"
  check "... the checkpoint is data parallelism's (moments of unused rows decayed too)" \
    "$CKPT" diff -q "$WORK/udpck/step-20" "$WORK/uck/step-20"
done
check "... a worker accounts no table (parameters: the model less wte)" \
  grep -q "^memory per rank (largest): parameters 0.13 MiB" "$WORK/u.log"
rm -rf "$WORK/r"
cp -r "$WORK/uck" "$WORK/r"
rm -rf "$WORK/r/step-20"
echo step-10 >"$WORK/r/latest"
train "$WORK/r.log" --untied-head --ranks 3 --ps-servers 1 --save "$WORK/r" --resume
head -n 10 <(grep ^step "$WORK/udp.log") | cat - "$WORK/r.log" >"$WORK/joined.log"
check "... resumed from step 10 on one server: bit for bit" same_losses "$WORK/joined.log" \
  "$WORK/udp.log"

cat >"$WORK/ps.json" <<'EOF'
{"format": "tessera.op_strategy", "version": 1, "ps_servers": 2, "ps_params": "wte",
 "operators": {}}
EOF
train "$WORK/file.log" --ranks 4 --op-strategy "$WORK/ps.json"
check "the strategy file's ps_servers and ps_params: data parallelism's losses" \
  same_losses "$WORK/file.log" "$WORK/dp.log"
check "... wte on the two servers" grep -q '^server 1: wte\[' "$WORK/file.log"
run "$BIN" "${SMALL[@]}" --ranks 4 --op-strategy "$WORK/ps.json" --ps-servers 1
check "... a flag that contradicts it is refused" grep -q "sets ps_servers 2 but --ps-servers is 1" \
  "$WORK/out"

# Processes started by hand (a scheduler's rank table): the workers first,
# the server two seconds later.
gloo_rank() { # gloo_rank RANK SERVERS LOG FLAGS...
  local rank=$1 servers=$2 log=$3
  shift 3
  TESSERA_RANK=$rank TESSERA_WORLD_SIZE=3 TESSERA_MASTER=127.0.0.1:$port \
    TESSERA_PS_SERVERS=$servers timeout 120 "$BIN" "${SMALL[@]}" "$@" >"$log" 2>&1
}
port=$((29700 + RANDOM % 200))
gloo_rank 2 1 "$WORK/h2.log" &
gloo_rank 1 1 "$WORK/h1.log" &
sleep 2
gloo_rank 0 1 "$WORK/h0.log"
wait
check "roles started in another order (workers first): data parallelism's losses" \
  same_losses "$WORK/h1.log" "$WORK/dp.log"
port=$((port + 1))
gloo_rank 0 1 "$WORK/m0.log" --comm-timeout 3 &
gloo_rank 1 1 "$WORK/m1.log" --comm-timeout 3
wait
check "a rank that never comes is named, with the roles" \
  grep -q "rank(s) 2 did not join.*rank 0 is the parameter server, the others workers" \
  "$WORK/m1.log"
port=$((port + 1))
gloo_rank 0 1 "$WORK/d0.log" &
gloo_rank 1 1 "$WORK/d1.log" &
gloo_rank 2 2 "$WORK/d2.log"
wait
check "processes given different server counts refuse by name" \
  grep -q "rank 0 was given 1 servers, rank 2 2 (TESSERA_PS_SERVERS differs" "$WORK/d2.log"

# MindSpore's form: MS_ROLE / MS_SERVER_NUM / MS_WORKER_NUM / MS_SCHED_HOST
# / MS_SCHED_PORT, no ranks; workers first, then the server, then the
# scheduler.
ms_role() { # ms_role ROLE LOG FLAGS...
  local role=$1 log=$2
  shift 2
  MS_ROLE=$role MS_SERVER_NUM=1 MS_WORKER_NUM=2 MS_SCHED_HOST=127.0.0.1 MS_SCHED_PORT=$port \
    timeout 120 "$BIN" "${SMALL[@]}" "$@" >"$log" 2>&1
}
port=$((port + 1))
ms_role MS_WORKER "$WORK/ms1.log" &
ms_role MS_WORKER "$WORK/ms2.log" &
sleep 1
ms_role MS_PSERVER "$WORK/ms0.log" &
sleep 1
ms_role MS_SCHED "$WORK/mss.log"
wait
cat "$WORK/ms1.log" "$WORK/ms2.log" >"$WORK/msw.log"
check "MS_ROLE processes (workers, server, then scheduler): data parallelism's losses" \
  same_losses "$WORK/msw.log" "$WORK/dp.log"
check "... the scheduler numbered them" grep -q "rank 0: MS_PSERVER, ranks 1-2: MS_WORKER" \
  "$WORK/mss.log"
check "... the server served" grep -q "parameter server 0: 20 steps served" "$WORK/ms0.log"
port=$((port + 1))
ms_role MS_WORKER "$WORK/mw.log" --comm-timeout 3 &
ms_role MS_SCHED "$WORK/mss.log" --comm-timeout 3
wait
check "a role that never comes is named by the scheduler" \
  grep -q "0 of 1 MS_PSERVER and 1 of 2 MS_WORKER processes came within 3 s" "$WORK/mss.log"
ms_refused() { # ms_refused PATTERN FLAGS...: an MS_WORKER exits 1 at once saying PATTERN
  local pattern=$1 rc=0
  shift
  ms_role MS_WORKER "$WORK/msa.log" --comm-timeout 30 "$@" || rc=$?
  [ "$rc" -eq 1 ] && grep -q -- "$pattern" "$WORK/msa.log"
}
check "MS_ROLE with --async-save: refused before joining, as --ps-servers is" \
  ms_refused "--ps-servers with --async-save" --async-save --save "$WORK/msa"

refused() { # refused PATTERN FLAGS...: train_gpt exits 1 before step 1 saying PATTERN
  local pattern=$1
  shift
  run "$BIN" "${SMALL[@]}" "$@"
  [ "$rc" -eq 1 ] && grep -q -- "$pattern" "$WORK/out" && ! grep -q "^step" "$WORK/out"
}
check "refused: every rank a server" refused "--ps-servers 2 of 2 ranks leaves no worker" \
  --ranks 2 --ps-servers 2
check "refused: a pattern naming nothing" refused "pattern 'h.\*.mlp.nothing' names no parameter" \
  --ranks 3 --ps-servers 1 --ps-params 'wte,h.*.mlp.nothing'
check "refused: more servers than pieces" refused "server 1 would hold nothing" \
  --ranks 4 --ps-servers 2 --ps-params h.0.ln_1.bias
check "refused: --ps-params without servers" refused "--ps-params 'wte' without parameter servers" \
  --ranks 2 --ps-params wte
check "refused: servers with tensor parallelism" refused "--ps-servers 1 with tp 2" \
  --ranks 3 --ps-servers 1 --tp 2
check "refused: servers with ZeRO" refused "--ps-servers 1 with zero 1" \
  --ranks 3 --ps-servers 1 --zero 1
check "refused: servers with --async-save" refused "--ps-servers with --async-save" \
  --ranks 3 --ps-servers 1 --save "$WORK/async" --async-save
check "refused: --ps-staleness without servers" refused \
  "--ps-staleness 1 without parameter servers" --ranks 2 --ps-staleness 1
check "refused: --ps-staleness with worker-held parameters" refused \
  "asynchronous workers keep no parameter of their own" --ranks 3 --ps-servers 1 \
  --ps-params wte --ps-staleness 1
check "refused: --ps-staleness with the embedding served by rows" refused \
  "--ps-staleness with --untied-head" --ranks 3 --ps-servers 1 --untied-head --ps-staleness 1

# Asynchronous mode (--ps-staleness K): each worker's push its own AdamW
# update in a fixed round of the workers, so a run is deterministic and
# compares bit for bit.
drop() { # drop LOG: the first step's loss minus the mean of the last five
  grep ^step "$1" | awk '{l[NR] = $4} END {m = 0; for (i = NR - 4; i <= NR; ++i) m += l[i];
    print l[1] - m / 5}'
}
trains_as_sync() { # trains_as_sync LOG: its loss falls at least half as far as dp's
  awk -v a="$(drop "$1")" -v s="$(drop "$WORK/dp.log")" 'BEGIN {exit !(a > 0.5 * s)}'
}
for setting in "--ranks 2 --ps-servers 1" "--ranks 3 --ps-servers 2"; do
  # shellcheck disable=SC2086
  train "$WORK/a1w.log" $setting --ps-staleness 0
  check "async K=0 with one worker ($setting): single-process training bit for bit" \
    same_losses "$WORK/a1w.log" "$WORK/one.log"
done
train "$WORK/a0.log" --ranks 3 --ps-servers 1 --ps-staleness 0
train "$WORK/a2.log" --ranks 3 --ps-servers 1 --ps-staleness 2
check "async K=0 trains (the loss falls at least half as far as synchronous)" \
  trains_as_sync "$WORK/a0.log"
check "async K=2 trains" trains_as_sync "$WORK/a2.log"
check "... and says what it runs" grep -q "asynchronous: each worker's push is its own update" \
  "$WORK/a2.log"
train "$WORK/astall.log" --ranks 3 --ps-servers 1 --ps-staleness 2 --fault-hang step:3:2 \
  --fault-stall 3
check "async K=2, worker 1 stalled 3 s at step 3: the same losses, no hang" \
  same_losses "$WORK/astall.log" "$WORK/a2.log"
ahead() { # worker 0 finished steps 3-5 while worker 1 stalled, and not step 6
  local said
  said=$(grep -n "goes on after" "$WORK/astall.log" | cut -d: -f1)
  [ -n "$said" ] && [ "$(grep -n "^step  *5/" "$WORK/astall.log" | cut -d: -f1)" -lt "$said" ] &&
    [ "$(grep -n "^step  *6/" "$WORK/astall.log" | cut -d: -f1)" -gt "$said" ]
}
check "... worker 0 ran K = 2 steps ahead of the stalled worker, and no further" ahead
train "$WORK/a4.log" --ranks 4 --ps-servers 2 --ps-staleness 1
"$RUN" --nproc-per-node 4 --ps-servers 2 -- "$BIN" "${SMALL[@]}" --ps-staleness 1 \
  >"$WORK/agloo.out" 2>&1
sed -n 's/^\[rank 2\] //p' "$WORK/agloo.out" >"$WORK/agloo.log"
check "async K=1 over Gloo processes (tessera-run): the in-process losses bit for bit" \
  same_losses "$WORK/agloo.log" "$WORK/a4.log"
"${MPIRUN[@]}" -np 4 "$BIN" "${SMALL[@]}" --ps-servers 2 --ps-staleness 1 >"$WORK/ampi.log" 2>&1
check "async K=1 under mpirun: the same" same_losses "$WORK/ampi.log" "$WORK/a4.log"
train "$WORK/asave.log" --ranks 3 --ps-servers 1 --ps-staleness 1 --save "$WORK/ack" \
  --save-every 10 --save-mode sliced
rm -rf "$WORK/ack/step-20"
echo step-10 >"$WORK/ack/latest"
train "$WORK/ar.log" --ranks 3 --ps-servers 1 --ps-staleness 1 --save "$WORK/ack" --resume
head -n 10 <(grep ^step "$WORK/asave.log") | cat - "$WORK/ar.log" >"$WORK/joined.log"
check "async K=1 saved at step 10 and resumed: the uninterrupted losses bit for bit" \
  same_losses "$WORK/joined.log" "$WORK/asave.log"

# A worker killed (SIGKILL at step 6) in asynchronous mode under
# tessera-run --ps-replace-workers: the launcher starts that one process
# again while the others go on; the servers drop the dead worker, send
# the replacement their current weights (rounds after the kill) and take
# its pushes; nothing restarts. The servers save alone (a sliced
# checkpoint over the 2 servers), which plain data parallelism and a
# parameter-server job resume.
timeout 240 "$RUN" --nproc-per-node 4 --ps-servers 2 --ps-replace-workers -- "$BIN" \
  "${SMALL[@]}" --ps-staleness 1 --fault-kill step:6:3 --save "$WORK/rep" --save-every 5 \
  --resume >"$WORK/rep.out" 2>&1
check "a worker killed in async mode (--ps-replace-workers): the job finished, no restart" \
  grep -q "the job finished after 0 restart(s)" "$WORK/rep.out"
check "... the launcher started that rank alone again" \
  grep -q "rank 3 was killed by signal 9 (Killed): starting its replacement 1" "$WORK/rep.out"
sed -n 's/^\[rank 2\] //p' "$WORK/rep.out" >"$WORK/rep.log"
check "... worker 0 trained all 20 steps meanwhile" [ "$(grep -c ^step "$WORK/rep.log")" = 20 ]
current() { # the replacement got each server's weights of a round after worker 1's last reply
  local rounds
  rounds=$(sed -n 's/.*replacement 1 of worker 1 (rank 3): joined the servers (their weights of rounds \(.*\)), training from step.*/\1/p' "$WORK/rep.out")
  [ -n "$rounds" ] && awk -v r="$rounds" 'BEGIN {n = split(r, a, ", "); for (i = 1; i <= n; ++i)
    if (a[i] < 4 || a[i] > 20) exit 1; exit n != 2}'
}
check "... the replacement joined with the servers' current weights" current
check "... and trained to the end" \
  grep -q "replacement 1 of worker 1 (rank 3): done at step 20" "$WORK/rep.out"
check "... both servers dropped one worker and took one back" \
  [ "$(grep -c "1 worker(s) dropped, 1 replacement(s) taken back" "$WORK/rep.out")" = 2 ]
check "... the loss fell as asynchronous training's does" trains_as_sync "$WORK/rep.log"
check "... the servers saved alone, over 2 ranks" \
  grep -q "saved $WORK/rep/step-20 (sliced over the 2 servers)" "$WORK/rep.out"
run "$CKPT" verify "$WORK/rep/step-10"
check "... their checkpoint verifies" [ "$rc" = 0 ]
for setting in "--ranks 2" "--ranks 3 --ps-servers 1 --ps-staleness 1"; do
  rm -rf "$WORK/r"
  cp -r "$WORK/rep" "$WORK/r"
  rm -rf "$WORK/r/step-15" "$WORK/r/step-20"
  echo step-10 >"$WORK/r/latest"
  # shellcheck disable=SC2086
  train "$WORK/r.log" $setting --save "$WORK/r" --resume
  check "... resumed from step 10 with $setting" grep -q "resumed from step 10" "$WORK/r.log"
  check "... and trained steps 11-20" [ "$(grep -c ^step "$WORK/r.log")" = 10 ]
done
# Killed near the end (step 19 of 20): the replacement comes as the servers
# finish, or after; either way the job ends without a restart.
timeout 240 "$RUN" --nproc-per-node 4 --ps-servers 2 --ps-replace-workers -- "$BIN" \
  "${SMALL[@]}" --ps-staleness 1 --fault-kill step:19:3 >"$WORK/late.out" 2>&1
check "a worker killed at step 19 of 20: the job finished, no restart" \
  grep -q "the job finished after 0 restart(s)" "$WORK/late.out"
check "... worker 0 trained all 20 steps" [ "$(grep -c "^\[rank 2\] step" "$WORK/late.out")" = 20 ]
TESSERA_PS_REPLACEABLE=1 run "$BIN" "${SMALL[@]}" --ranks 3 --ps-servers 1
check "refused: replaceable workers in synchronous mode" \
  grep -q "workers are replaced in asynchronous mode only" "$WORK/out"
TESSERA_PS_REPLACEABLE=1 run "$BIN" "${SMALL[@]}" --ranks 3 --ps-servers 1 --ps-staleness 1
check "refused: replaceable workers on in-process ranks" \
  grep -q "a replacement joins over Gloo" "$WORK/out"

# The strategy file's ps_staleness key: the flags' asynchronous run bit for
# bit; a flag that contradicts it is refused.
cat >"$WORK/aps.json" <<'EOF'
{"format": "tessera.op_strategy", "version": 1, "ps_servers": 1, "ps_params": "all",
 "ps_staleness": 2, "operators": {}}
EOF
train "$WORK/afile.log" --ranks 3 --op-strategy "$WORK/aps.json"
check "the strategy file's ps_staleness: --ps-staleness 2's losses bit for bit" \
  same_losses "$WORK/afile.log" "$WORK/a2.log"
run "$BIN" "${SMALL[@]}" --ranks 3 --op-strategy "$WORK/aps.json" --ps-staleness 1
check "... a flag that contradicts it is refused" \
  grep -q "sets ps_staleness 2 but --ps-staleness is 1" "$WORK/out"

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
