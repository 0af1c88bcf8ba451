# Sourced by the shell tests.
# check NAME COMMAND...: runs the command, prints "ok   NAME" or
# "FAIL NAME", and counts into $passes and $fails.
passes=0
fails=0
check() {
  local name=$1
  shift
  if "$@"; then
    echo "ok   $name"
    passes=$((passes + 1))
  else
    echo "FAIL $name"
    fails=$((fails + 1))
  fi
}
# run CMD...: output in $work/out, exit status in $rc (scripts set $work).
run() {
  "$@" >"$work/out" 2>&1
  rc=$?
}
# The "step loss" pairs of a train_gpt log.
train_losses() { grep '^step' "$1" | awk '{split($2, s, "/"); print s[1], $4}'; }
