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
# close A B [N]: two train_gpt logs have the same N (default 30) steps and
# every loss of A within 1e-5 relative of B's.
close() {
  paste -d' ' <(train_losses "$1") <(train_losses "$2") | awk '
    { n++; if ($1 != $3) bad = 1; d = $2 - $4; if (d < 0) d = -d;
      if (d > 1e-5 * $4) { bad = 1; print "step " $1 ": " $2 " vs " $4 } }
    END { exit bad || n != '"${3:-30}"' }'
}
# The rank-0 lines of tessera-run's output, without the prefix.
rank0() { sed -n 's/^\[rank 0\] //p' "$1"; }
# resumed_curve OUT CKPT_DIR: the rank-0 loss curve of a job tessera-run
# restarted once: attempt 1's steps up to the checkpoint attempt 2 resumed
# from (CKPT_DIR/step-N), then the steps after it, each step once.
resumed_curve() {
  local last
  last=$(grep -o "attempt 2: .*from $2/step-[0-9]*" "$1" | grep -o '[0-9]*$')
  rank0 "$1" | awk -v last="$last" '/^step/ {split($2, s, "/"); n = s[1] + 0;
    if (!resumed && n <= last) print; if (n == last + 1) resumed = 1; if (resumed) print}' |
    awk '!seen[$2]++'
}
# resumed NAME DIR SAVE_FLAGS RESUME_FLAGS: $RESUME_AT (default 8) steps
# saved to $WORK/DIR, resumed there to step $RESUME_TO (default 20) with
# other flags (through the calling script's `train LOG FLAGS...`), the
# joined curve checked against $WORK/one.log.
resumed() {
  local dir="$WORK/$2" at=${RESUME_AT:-8} to=${RESUME_TO:-20}
  # shellcheck disable=SC2086
  train "$dir.save.log" $3 --steps "$at" --save "$dir"
  # shellcheck disable=SC2086
  train "$dir.resume.log" $4 --steps "$to" --save "$dir" --resume
  cat "$dir.save.log" "$dir.resume.log" >"$dir.both.log"
  check "$1" close "$dir.both.log" "$WORK/one.log" "$to"
}
# write_token_file TEXT OUT: TEXT's bytes as an llm.c uint16 token file
# (magic 20240520, version 1), written independently of our code.
write_token_file() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import sys, numpy as np
tokens = np.frombuffer(open(sys.argv[1], "rb").read(), dtype=np.uint8).astype(np.uint16)
header = np.zeros(256, dtype=np.int32)
header[:3] = [20240520, 1, len(tokens)]
with open(sys.argv[2], "wb") as f:
    f.write(header.tobytes())
    f.write(tokens.tobytes())
PY
}
