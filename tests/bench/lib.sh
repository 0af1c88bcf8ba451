# Shared by the shell benchmarks; source it after setting $work (a scratch
# directory).
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
timed() {  # timed CMD...: wall seconds and peak RSS (KiB) of one run
  /usr/bin/time -f "%e %M" -o "$work/time.txt" "$@" >/dev/null
  cat "$work/time.txt"
}
