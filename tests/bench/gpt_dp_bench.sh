#!/usr/bin/env bash
# Data-, tensor- and pipeline-parallel training on 2 ranks: train_gpt
# --ranks 2 (threads) and under mpirun -np 2 (processes), dp2 with and
# without ZeRO-1, tp2 (Megatron) and pp2 (1F1B, 2 and 8 micro-batches),
# beside the
# single-process figure (2 compute threads) and beside PyTorch DDP (gloo, 2
# processes of 1 thread) on the same model and global batch, with the
# share of the step our ranks spend in communication, and every row's CPU
# time / wall time (2.00: both cores busy for the whole run). PyTorch is
# capped to the cores it is given: OPENBLAS_NUM_THREADS and OMP_NUM_THREADS
# set before torch is imported (torch.set_num_threads alone leaves Debian's
# OpenBLAS on every core, so DDP's "1 thread" processes would each run two);
# its best configuration on 2 cores is printed beside the capped one. The
# host's CPU and the sgemm peak (SGEMM_PEAK, optional) head the table.
# Usage: gpt_dp_bench.sh TRAIN_GPT TORCH_DDP_SCRIPT TORCH_SCRIPT CORPUS MPIRUN [SGEMM_PEAK]
set -euo pipefail
TRAIN=$1 DDP=$2 TORCH=$3 CORPUS=$4 MPIRUN=$5 PEAK=${6:-}
MODEL=(--layers 4 --heads 4 --embed 256 --context 256 --seq 256 --batch 8 --vocab 4096)
STEPS=8
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/lib.sh"
cpu() { cpu_per_wall "$WORK/time"; }  # of the last timed run
ours() {  # launcher words... -- extra train_gpt flags...
  local out
  out=$(env -u OPENBLAS_CORETYPE /usr/bin/time -f "%e %U %S" -o "$WORK/time" "$@" 2>&1)
  echo "$(awk '/^done/ {print $6}' <<<"$out") $(cpu) $(awk '/^communication/ {print $2}' <<<"$out")"
}
theirs() {  # TORCH_THREADS BLAS_THREADS SCRIPT ARGS...: tokens/s and CPU/wall
  local tt=$1 bt=$2
  shift 2
  local t
  t=$(env -u OPENBLAS_CORETYPE OPENBLAS_NUM_THREADS="$bt" OMP_NUM_THREADS="$tt" \
    /usr/bin/time -f "%e %U %S" -o "$WORK/time" /usr/bin/python3 "$@" | awk '{print $2}')
  echo "$t $(cpu)"
}
host_line
[ -n "$PEAK" ] && env -u OPENBLAS_CORETYPE "$PEAK" 2 openblas
single=$(ours "$TRAIN" --data "$CORPUS" --quiet --threads 2 --steps $STEPS "${MODEL[@]}")
threads=$(ours "$TRAIN" --data "$CORPUS" --quiet --ranks 2 --steps $STEPS "${MODEL[@]}")
threads_zero=$(ours "$TRAIN" --data "$CORPUS" --quiet --ranks 2 --zero 1 --steps $STEPS "${MODEL[@]}")
mpi=$(ours "$MPIRUN" --allow-run-as-root --oversubscribe -np 2 "$TRAIN" --data "$CORPUS" \
  --quiet --steps $STEPS "${MODEL[@]}")
pp=$(ours "$TRAIN" --data "$CORPUS" --quiet --ranks 2 --pp 2 --steps $STEPS "${MODEL[@]}")
pp8=$(ours "$TRAIN" --data "$CORPUS" --quiet --ranks 2 --pp 2 --micro-batches 8 --steps $STEPS "${MODEL[@]}")
mpipp=$(ours "$MPIRUN" --allow-run-as-root --oversubscribe -np 2 "$TRAIN" --data "$CORPUS" \
  --quiet --pp 2 --micro-batches 8 --steps $STEPS "${MODEL[@]}")
tp=$(ours "$TRAIN" --data "$CORPUS" --quiet --ranks 2 --tp 2 --steps $STEPS "${MODEL[@]}")
mpitp=$(ours "$MPIRUN" --allow-run-as-root --oversubscribe -np 2 "$TRAIN" --data "$CORPUS" \
  --quiet --tp 2 --steps $STEPS "${MODEL[@]}")
torch1=$(theirs 2 2 "$TORCH" 4 4 256 256 8 4096 2 $STEPS)
torch21=$(theirs 2 1 "$TORCH" 4 4 256 256 8 4096 2 $STEPS)
torch12=$(theirs 1 2 "$TORCH" 4 4 256 256 8 4096 1 $STEPS)
ddp=$(theirs 1 1 "$DDP" 4 4 256 256 8 4096 2 $STEPS)
printf "%-46s %10s %8s %8s %9s\n" "L4 C256 H4 T256 B8 V4096, 2 cores" "tokens/s" "CPU/wall" "comm" "vs DDP"
ddp_toks=${ddp%% *}
row() { printf "%-46s %10s %8s %8s %8.2fx\n" "$1" "$2" "$3" "${4:--}" "$(awk "BEGIN{print $2 / $ddp_toks}")"; }
row "tessera, 1 rank, 2 threads" ${single}
row "tessera dp2, --ranks 2 (threads)" ${threads}
row "tessera dp2 zero1, --ranks 2 (threads)" ${threads_zero}
row "tessera dp2, mpirun -np 2" ${mpi}
row "tessera pp2, 2 micro-batches, --ranks 2" ${pp}
row "tessera pp2, 8 micro-batches, --ranks 2" ${pp8}
row "tessera pp2, 8 micro-batches, mpirun -np 2" ${mpipp}
row "tessera tp2, --ranks 2 (threads)" ${tp}
row "tessera tp2, mpirun -np 2" ${mpitp}
row "PyTorch, 1 process, 2 threads (capped: 2 x 2)" ${torch1}
row "PyTorch, 1 process, torch 2 x BLAS 1 threads" ${torch21}
row "PyTorch, 1 process, torch 1 x BLAS 2 threads" ${torch12}
row "PyTorch DDP, gloo, 2 processes of 1 thread" ${ddp}
