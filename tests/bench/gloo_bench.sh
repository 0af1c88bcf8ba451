#!/usr/bin/env bash
# train_gpt over Gloo (tessera-run, no MPI) beside Open MPI (mpirun), dp2
# and tp2 on 2 processes: on one host, and across two hosts stood in for by
# network namespaces joined by a bridge (root only; skipped otherwise).
# The two launchers alternate (A B A B ...); medians of 3 tokens/s each.
# Usage: gloo_bench.sh TESSERA_RUN TRAIN_GPT CORPUS MPIRUN
set -euo pipefail
RUN=$(realpath "$1")
TRAIN=$(realpath "$2")
CORPUS=$(realpath "$3")
MPIRUN=$4
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../netns.sh"
netns_reexec "$here/gloo_bench.sh" "$@" || true  # not root: one host only
MODEL=(--layers 4 --heads 4 --embed 256 --context 256 --seq 256 --batch 8 --vocab 4096 --steps 8 --quiet)
WORK=$(mktemp -d)
trap 'netns_cleanup 2>/dev/null; rm -rf "$WORK"' EXIT
toks() { awk '/done:/ {for (i = 1; i <= NF; i++) if ($(i + 1) ~ /^tokens\/s/) print $i}' | head -1; }
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
MPI=("$MPIRUN" --allow-run-as-root --oversubscribe)
printf "%-44s %12s %12s %10s\n" "L4 C256 H4 T256 B8 V4096, 2 processes" "MPI tok/s" "Gloo tok/s" "Gloo/MPI"
row() { printf "%-44s %12.0f %12.0f %9.2fx\n" "$1" "$2" "$3" "$(awk "BEGIN {print $3 / $2}")"; }
for flags in "--zero 1" "--tp 2"; do
  : >"$WORK/m"; : >"$WORK/g"
  for _ in 1 2 3; do
    # shellcheck disable=SC2086
    "${MPI[@]}" -np 2 "$TRAIN" --data "$CORPUS" "${MODEL[@]}" $flags 2>&1 | toks >>"$WORK/m"
    # shellcheck disable=SC2086
    "$RUN" --nproc-per-node 2 -q --log-dir "$WORK/logs" -- "$TRAIN" --data "$CORPUS" "${MODEL[@]}" \
      $flags >/dev/null 2>&1
    toks <"$WORK/logs/rank-0.log" | tail -1 >>"$WORK/g"
    rm -rf "$WORK/logs"
  done
  row "one host, $( [ "$flags" = "--tp 2" ] && echo tp2 || echo "dp2 zero1")" \
    "$(median <"$WORK/m")" "$(median <"$WORK/g")"
done
if [ -z "${TESSERA_NETNS_INNER:-}" ]; then
  echo "two hosts (network namespaces): skipped, needs root"
  exit 0
fi
netns_hosts 2 "$WORK"
printf "host1 slots=1\nhost2 slots=1\n" >"$WORK/hostfile"
MPI2=("${MPI[@]}" --mca plm_rsh_agent "$WORK/agent" --mca btl tcp,self
      --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24)
port=29300
for flags in "--zero 1" "--tp 2"; do
  : >"$WORK/m"; : >"$WORK/g"
  for _ in 1 2 3; do
    # shellcheck disable=SC2086
    "$WORK/inhost" host1 "${MPI2[@]}" -np 2 --hostfile "$WORK/hostfile" --map-by node "$TRAIN" \
      --data "$CORPUS" "${MODEL[@]}" $flags 2>&1 | toks >>"$WORK/m"
    port=$((port + 10))
    for k in 1 0; do
      # shellcheck disable=SC2086
      "$WORK/inhost" "host$((k + 1))" "$RUN" --nnodes 2 --node-rank "$k" --master "host1:$port" \
        --nproc-per-node 1 -q --log-dir "$WORK/logs$k" -- "$TRAIN" --data "$CORPUS" "${MODEL[@]}" \
        $flags >/dev/null 2>&1 &
    done
    wait
    toks <"$WORK/logs0/rank-0.log" | tail -1 >>"$WORK/g"
    rm -rf "$WORK/logs0" "$WORK/logs1"
  done
  row "two hosts (netns, TCP over a bridge), $( [ "$flags" = "--tp 2" ] && echo tp2 || echo "dp2 zero1")" \
    "$(median <"$WORK/m")" "$(median <"$WORK/g")"
done
