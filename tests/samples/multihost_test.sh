#!/usr/bin/env bash
# Several hosts without a second machine: network namespaces, each with its
# own hostname (UTS namespace) and address, joined by veth pairs on a
# bridge, stand in for hosts; the checkpoint directory is shared, as on a
# cluster file system. The whole topology lives inside an outer
# `unshare --net --mount --uts`, so a killed test leaves nothing behind,
# and uses only the addresses it creates (10.77.0.0/24).
#  - mpirun reaches the namespaces through --mca plm_rsh_agent (a script
#    that runs the command in the namespace instead of over ssh), TCP BTL
#    and OOB on the bridge's subnet;
#  - tessera-run (Gloo) joins across them: 2 and 4 hosts, tp across hosts,
#    dp across hosts, each giving the single-process losses;
#  - host-aware redundancy (rs:2+2 over 2 hosts) records every data file's
#    host and places no more than 2 files of a group on a host;
#  - parameter servers on host1 and their workers on host2 give the
#    single-process losses;
#  - one host killed mid-run (its launcher and workers) and its ranks'
#    data files deleted, as if they had been on its local disk: the job
#    restarts on the other host from the newest checkpoint, rebuilding the
#    lost files from parity, resharded, and continues the loss curve.
# Not root, or no namespaces: says so and exits 77 (skipped).
# Usage: multihost_test.sh TESSERA_RUN TRAIN_GPT CORPUS MPIRUN CKPT
set -uo pipefail
RUN=$(realpath "$1")
BIN=$(realpath "$2")
CORPUS=$(realpath "$3")
MPIRUN=$4
CKPT=$(realpath "$5")
source "$(dirname "$0")/../netns.sh"
netns_reexec "$0" "$@" || {
  echo "SKIP: network namespaces need root, iproute2 and unshare (not available here)"
  exit 77
}
WORK=$(mktemp -d)
trap 'pkill -9 -P $$ 2>/dev/null; netns_cleanup; rm -rf "$WORK"' EXIT
source "$(dirname "$0")/../lib.sh"
netns_hosts 4 "$WORK"
INHOST=$WORK/inhost
# A closed port on host2 refuses at once when the bridge carries the packet.
check "host1 reaches host2 across the bridge" "$INHOST" host1 bash -c \
  'timeout 3 bash -c "</dev/tcp/host2/7" 2>&1 | grep -q refused'

check "each host has its own hostname" test "$("$INHOST" host3 hostname)" = host3

SMALL=(--data "$CORPUS" --layers 2 --heads 2 --embed 32 --context 32 --batch 8 --lr 1e-3 --max-norm 0.5)
"$BIN" "${SMALL[@]}" --steps 30 >"$WORK/one.log" 2>&1
check "single-process reference" test $? -eq 0

# gloo_job NHOSTS NPROC LOGPREFIX TESSERA_RUN_FLAGS... -- TRAIN_FLAGS...: one
# tessera-run per host, node 0 on host1; waits for all.
port=29400
gloo_job() {
  local nh=$1 np=$2 log=$3
  shift 3
  local flags=() job=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do flags+=("$1"); shift; done
  shift
  job=("$@")
  port=$((port + 10))
  local pids=()
  for k in $(seq 0 $((nh - 1))); do
    "$INHOST" "host$((k + 1))" timeout 300 "$RUN" --nnodes "$nh" --node-rank "$k" \
      --master "host1:$port" --nproc-per-node "$np" "${flags[@]}" -- "$BIN" "${SMALL[@]}" \
      "${job[@]}" >"$log.$k" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}
for setting in "2 1 --tp 2" "2 1 --zero 1" "4 1 --dp 2 --tp 2 --zero 1" "2 2 --dp 2 --tp 2"; do
  read -r nh np flags <<<"$setting"
  # shellcheck disable=SC2086
  gloo_job "$nh" "$np" "$WORK/g" -- --steps 30 $flags
  rank0 "$WORK/g.0" >"$WORK/g.log"
  check "gloo over $nh hosts x $np, train_gpt $flags: the single-process losses" \
    close "$WORK/g.log" "$WORK/one.log"
done
check "... the ranks ran on their hosts" grep -q "ranks: 4 (gloo)" "$WORK/g.log"

# mpirun across the namespaces: ranks alternate hosts (--map-by node), so
# tp pairs (0,1) and (2,3) cross hosts, dp too.
MPI=("$MPIRUN" --allow-run-as-root --oversubscribe --mca plm_rsh_agent "$WORK/agent"
     --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24)
printf "host1 slots=2\nhost2 slots=2\n" >"$WORK/hostfile"
"$INHOST" host1 timeout 300 "${MPI[@]}" -np 4 --hostfile "$WORK/hostfile" --map-by node \
  "$BIN" "${SMALL[@]}" --steps 30 --dp 2 --tp 2 >"$WORK/mpi.log" 2>&1
check "mpirun over 2 hosts (plm_rsh_agent), dp2 x tp2 across hosts: the single-process losses" \
  close "$WORK/mpi.log" "$WORK/one.log"
"$INHOST" host1 timeout 300 "${MPI[@]}" -np 2 --hostfile "$WORK/hostfile" --map-by node \
  hostname >"$WORK/mpihosts.log" 2>&1
check "... its processes ran on host1 and host2" \
  bash -c "grep -qx host1 '$WORK/mpihosts.log' && grep -qx host2 '$WORK/mpihosts.log'"

# Host-aware redundancy: rs:2+2 over 2 hosts x 2 ranks.
gloo_job 2 2 "$WORK/r" -- --steps 4 --dp 2 --tp 2 --save "$WORK/rs" --save-mode sliced \
  --redundancy rs:2+2 --save-every 4
"$CKPT" inspect --files "$WORK/rs/step-4" >"$WORK/files.txt" 2>&1
check "the manifest records each data file's host" \
  bash -c "grep -q '^data-00000.tsr .* host1 ' '$WORK/files.txt' && grep -q '^data-00003.tsr .* host2 ' '$WORK/files.txt'"
check "no host holds more than 2 files of an rs:2+2 group" awk '
  $1 ~ /\.tsr$/ && $5 == "rs:2+2" { n[$4 " " $7]++ }
  END { for (k in n) if (n[k] > 2) bad = 1; exit bad || length(n) == 0 }' "$WORK/files.txt"
"$CKPT" verify "$WORK/rs/step-4" >"$WORK/verify.txt" 2>&1
check "... so verify sees no host whose loss loses data" bash -c "! grep -q 'loses data' '$WORK/verify.txt'"

# One host killed at step 14 (rank 2 holds the job there; first attempt
# only), its data files deleted: host1 goes on alone.
JOB=(--steps 30 --tp 2 --save "$WORK/ck" --save-mode sliced --redundancy rs:2+2
     --save-every 4 --resume --fault-hang step:14:2)
port=$((port + 10))
"$INHOST" host2 setsid "$RUN" --nnodes 2 --node-rank 1 --master "host1:$port" --nproc-per-node 2 \
  --min-nodes 1 --join-timeout 5 -- "$BIN" "${SMALL[@]}" "${JOB[@]}" >"$WORK/k.1" 2>&1 &
"$INHOST" host1 timeout 300 "$RUN" --nnodes 2 --node-rank 0 --master "host1:$port" \
  --nproc-per-node 2 --min-nodes 1 --join-timeout 5 -- "$BIN" "${SMALL[@]}" "${JOB[@]}" \
  >"$WORK/k.0" 2>&1 &
node0=$!
for _ in $(seq 600); do grep -q "^\[rank 0\] step    13/" "$WORK/k.0" && break; sleep 0.1; done
ip netns pids host2 | xargs -r kill -9  # the host dies: every process on it
lost=0
for d in "$WORK"/ck/step-*; do
  for f in $("$CKPT" inspect --files "$d" 2>/dev/null | awk '$4 == "host2" {print $1}'); do
    rm -f "$d/$f" && lost=$((lost + 1))
  done
done
wait "$node0"
rc=$?
check "a host killed and its files deleted ($lost): the other host goes on and finishes" test $rc -eq 0
check "... restarted on the 2 ranks of the host left, from a checkpoint" \
  grep -q "attempt 2: node 0 of 1, ranks 0-1 of 2, from $WORK/ck/step-" "$WORK/k.0"
check "... which rebuilt the lost files from parity on load" \
  grep -q "^\[rank 0\] repaired $WORK/ck/step-[0-9]*: rebuilt" "$WORK/k.0"
resumed_curve "$WORK/k.0" "$WORK/ck" >"$WORK/k.log"
check "... continuing the single-process curve (lost files rebuilt from parity)" \
  close "$WORK/k.log" "$WORK/one.log"

# Parameter servers on another host than the workers: ranks 0-1 (host1)
# serve every parameter, ranks 2-3 (host2) train; every push and pull
# crosses the bridge.
gloo_job 2 2 "$WORK/ps" --ps-servers 2 -- --steps 30
sed -n 's/^\[rank 2\] //p' "$WORK/ps.1" >"$WORK/ps.log"
check "parameter servers on host1, workers on host2 (gloo): the single-process losses" \
  close "$WORK/ps.log" "$WORK/one.log"
check "... rank 0 served from host1" grep -q "^\[rank 0\] parameter server 0: 30 steps served" \
  "$WORK/ps.0"

[ $fails -eq 0 ] || { echo "== host1's launcher"; grep -v "^\[rank [1-9]" "$WORK/k.0" | tail -30; }
echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
