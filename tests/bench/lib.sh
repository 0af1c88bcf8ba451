# Shared by the shell benchmarks; source it after setting $work (a scratch
# directory).
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# The host's CPU model and core count, heading a training benchmark.
host_line() {
  echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
}
# cpu_per_wall FILE: (user + system) / wall of a GNU time -f "%e %U %S"
# record (1.00 per core kept busy).
cpu_per_wall() { awk '{printf "%.2f", ($2 + $3) / $1}' "$1"; }
timed() {  # timed CMD...: wall seconds and peak RSS (KiB) of one run
  /usr/bin/time -f "%e %M" -o "$work/time.txt" "$@" >/dev/null
  cat "$work/time.txt"
}
# race N NAME OUT CMD... [-- NAME OUT CMD...]...: N rounds; in each round
# every contender runs once, in turn, after its output is removed and the
# dirty pages flushed, so that all of them meet the same page-cache state
# (this VM's page allocation cost depends on what was freed just before).
# Sets MED[NAME] (median seconds), RSS[NAME] (median peak KiB), RUNS[NAME].
declare -A MED RSS RUNS
race() {
  local n=$1 names=() outs=() cmds=() i k; shift
  while [ $# -gt 0 ]; do
    names+=("$1"); outs+=("$2"); shift 2
    local cmd=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do cmd+=("$(printf '%q' "$1")"); shift; done
    [ $# -gt 0 ] && shift
    cmds+=("${cmd[*]}")
  done
  local -A ts ms
  for ((i = 0; i < n; i++)); do
    for k in "${!names[@]}"; do
      rm -rf "${outs[@]}"; sync
      read -r t m < <(eval timed "${cmds[$k]}")
      ts[$k]+="$t "; ms[$k]+="$m "
    done
  done
  for k in "${!names[@]}"; do
    MED[${names[$k]}]=$(printf '%s\n' ${ts[$k]} | median)
    RSS[${names[$k]}]=$(printf '%s\n' ${ms[$k]} | median)
    RUNS[${names[$k]}]=${ts[$k]}
  done
}
