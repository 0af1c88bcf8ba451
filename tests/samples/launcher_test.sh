#!/usr/bin/env bash
# Jobs started without MPI: train_gpt over the Gloo backend, started by
# tessera-run and by a plain shell loop with torchrun's variables, gives
# the single-process loss curve in every parallel configuration; the
# launcher prefixes and keeps each worker's output, forwards SIGTERM,
# restarts the job from its newest checkpoint when a worker is killed or
# hangs (heartbeat), and, with two "nodes" (two launchers on this machine),
# goes on on one node when the other is killed, resharding on load.
# Usage: launcher_test.sh TESSERA_RUN TRAIN_GPT CORPUS
set -uo pipefail
RUN=$1
BIN=$2
CORPUS=$3
WORK=$(mktemp -d)
trap 'pkill -9 -P $$ 2>/dev/null; rm -rf "$WORK"' EXIT
source "$(dirname "$0")/../lib.sh"
SMALL=(--data "$CORPUS" --layers 2 --heads 2 --embed 32 --context 32 --batch 8 --lr 1e-3 --max-norm 0.5)

"$BIN" "${SMALL[@]}" --steps 30 >"$WORK/one.log" 2>&1
check "single-process reference" test $? -eq 0

for setting in "2 --zero 1" "2 --tp 2" "2 --pp 2" "4 --dp 2 --tp 2 --zero 1" "4 --tp 2 --pp 2"; do
  read -r n flags <<<"$setting"
  # shellcheck disable=SC2086
  timeout 300 "$RUN" --nproc-per-node "$n" -- "$BIN" "${SMALL[@]}" --steps 30 $flags \
    >"$WORK/l.out" 2>&1
  rank0 "$WORK/l.out" >"$WORK/l.log"
  check "tessera-run --nproc-per-node $n, train_gpt $flags over gloo: the single-process losses" \
    close "$WORK/l.log" "$WORK/one.log"
done
check "... the workers say they run over gloo" grep -q "ranks: 4 (gloo)" "$WORK/l.log"

# A plain shell loop with torchrun's variables (no launcher). Fixed ports
# are drawn below Linux's ephemeral range (32768-60999), where no
# connection's local port can hold them.
port=$((10000 + RANDOM % 20000))
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout 300 "$BIN" "${SMALL[@]}" --steps 30 --tp 2 >"$WORK/env$r.log" 2>&1 &
done
wait
check "RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from a shell loop: the single-process losses" \
  close "$WORK/env0.log" "$WORK/one.log"
"$BIN" "${SMALL[@]}" --steps 5 --backend gloo --rank 0 --world-size 2 --master 127.0.0.1:$((port + 1)) \
  >"$WORK/flags0.log" 2>&1 &
"$BIN" "${SMALL[@]}" --steps 5 --backend gloo --rank 1 --world-size 2 --master 127.0.0.1:$((port + 1)) \
  >"$WORK/flags1.log" 2>&1
wait
check "--rank/--world-size/--master flags start a gloo job" grep -q "ranks: 2 (gloo)" "$WORK/flags0.log"

# Heartbeat files left by launchers killed outright (SIGKILL) are swept by
# the next launcher: those of processes that no longer run, only.
sleep 0 &
dead=$!
wait "$dead"
touch "/tmp/tessera-run-$dead-heartbeat-0" "/tmp/tessera-run-$$-heartbeat-7"
timeout 60 "$RUN" --nproc-per-node 1 -q -- /bin/true >"$WORK/sweep.out" 2>&1
check "a dead launcher's heartbeat file is removed, a live one's kept" \
  bash -c "test ! -e /tmp/tessera-run-$dead-heartbeat-0 && test -e /tmp/tessera-run-$$-heartbeat-7"
rm -f "/tmp/tessera-run-$$-heartbeat-7"

# Output: prefixed on the terminal, one log per worker.
timeout 300 "$RUN" --nproc-per-node 2 --log-dir "$WORK/logs" -- "$BIN" "${SMALL[@]}" --steps 3 --tp 2 \
  >"$WORK/p.out" 2>&1
check "worker lines carry their rank" grep -q "^\[rank 0\] step     3/3" "$WORK/p.out"
check "each worker's log is kept" bash -c "grep -q 'step     3/3' '$WORK/logs/rank-0.log' && \
  grep -q 'ranks: 2 (gloo)' '$WORK/logs/rank-0.log' && test -s '$WORK/logs/rank-1.log'"

# A worker killed (SIGKILL) at step 14: the job restarts from step 12's
# checkpoint and finishes; together the attempts give the reference curve.
resume_run() {  # resume_run LOG LAUNCHER_FLAGS... -- TRAIN_FLAGS...
  local log=$1
  shift
  timeout 300 "$RUN" "$@" >"$log" 2>&1
}
SAVE=(--save "$WORK/ck" --save-every 4 --save-mode sliced --resume)
resume_run "$WORK/k.out" --nproc-per-node 2 --max-restarts 2 -- "$BIN" "${SMALL[@]}" --steps 30 \
  --tp 2 "${SAVE[@]}" --fault-kill step:14:1
check "a killed worker: the job is restarted and finishes" grep -q "finished after 1 restart" "$WORK/k.out"
check "... the launcher names it" grep -q "rank 1 was killed by signal 9" "$WORK/k.out"
check "... and resumes from the newest checkpoint" grep -q "attempt 2: .*from $WORK/ck/step-12" "$WORK/k.out"
resumed_curve "$WORK/k.out" "$WORK/ck" >"$WORK/k.log"
check "... continuing the single-process curve" close "$WORK/k.log" "$WORK/one.log"

# A hung worker (no heartbeat) is noticed and the job restarted.
rm -rf "$WORK/ck"
resume_run "$WORK/h.out" --nproc-per-node 2 --heartbeat-timeout 3 -- "$BIN" "${SMALL[@]}" --steps 20 \
  --tp 2 "${SAVE[@]}" --fault-hang step:10:1
check "a hung worker: noticed by its heartbeat, the job restarted and finished" \
  bash -c "grep -q 'hung: rank 1 ' '$WORK/h.out' && grep -q 'finished after 1 restart' '$WORK/h.out'"
grep -q 'finished after 1 restart' "$WORK/h.out" || tail -20 "$WORK/h.out" | sed 's/^/    /'

# SIGTERM to the launcher reaches every worker; nothing is left running.
"$RUN" --nproc-per-node 2 -- "$BIN" "${SMALL[@]}" --steps 100000 --tp 2 >"$WORK/s.out" 2>&1 &
launcher=$!
for _ in $(seq 100); do grep -q "^\[rank 0\] step" "$WORK/s.out" && break; sleep 0.1; done
kill -TERM "$launcher"
wait "$launcher"
rc=$?
sleep 0.5
check "SIGTERM: the launcher exits 143 and no worker is left" \
  bash -c "[ $rc -eq 143 ] && ! pgrep -f -- '--steps 10000[0]' >/dev/null"

# Two nodes (two launchers here), 2 workers each, dp2 x tp2; node 1 (its
# launcher and its workers) is killed at step 14 (its rank 2 holds the job
# there: --fault-hang, first attempt only); node 0 restarts the job alone
# (--min-nodes 1), tp2 on 2 ranks, from step 12, resharded. Another
# process holds the first attempt's rendezvous port (PORT + 1): node 0
# announces the next free one.
rm -rf "$WORK/ck"
mport=$((10000 + RANDOM % 20000))
python3 -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
open(sys.argv[2], "w").close(); time.sleep(600)' $((mport + 1)) "$WORK/held" &
holder=$!
for _ in $(seq 100); do [ -f "$WORK/held" ] && break; sleep 0.1; done  # listening before node 0 looks
NODE=(--nnodes 2 --master "127.0.0.1:$mport" --nproc-per-node 2 --min-nodes 1 --join-timeout 5)
JOB=("$BIN" "${SMALL[@]}" --steps 30 --tp 2 "${SAVE[@]}" --fault-hang step:14:2)
setsid "$RUN" "${NODE[@]}" --node-rank 1 -- "${JOB[@]}" >"$WORK/n1.out" 2>&1 &
node1=$!
"$RUN" "${NODE[@]}" --node-rank 0 -- "${JOB[@]}" >"$WORK/n0.out" 2>&1 &
node0=$!
for _ in $(seq 600); do grep -q "^\[rank 0\] step    13/" "$WORK/n0.out" && break; sleep 0.1; done
kill -9 -- -"$node1"  # the whole node: its launcher and its workers
wait "$node0"
rc=$?
kill "$holder"
[ $rc -eq 0 ] && grep -q "^tessera-run: attempt 2: node 0 of 1" "$WORK/n0.out" ||
  grep "^tessera-run\|train_gpt:" "$WORK/n0.out"  # for the CI log
check "two nodes, one killed: node 0 goes on alone and finishes" test $rc -eq 0
check "... the first attempt's rendezvous port taken: the workers met on the next free one" \
  grep -q "^tessera-run: the workers' rendezvous is on port [0-9]* ($((mport + 1)) was taken on node 0)" \
  "$WORK/n0.out"
check "... on 2 ranks of 1 node, from the newest checkpoint" \
  grep -q "attempt 2: node 0 of 1, ranks 0-1 of 2, from $WORK/ck/step-" "$WORK/n0.out"
resumed_curve "$WORK/n0.out" "$WORK/ck" >"$WORK/n.log"
check "... continuing the single-process curve" close "$WORK/n.log" "$WORK/one.log"

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
