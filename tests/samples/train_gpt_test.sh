#!/usr/bin/env bash
# train_gpt end to end: the loss falls, a run stopped and resumed from its
# checkpoint reproduces the uninterrupted run bit for bit, a token file
# written by numpy (llm.c's layout) trains exactly as the text it holds, a
# bf16 export is what ckpt reads, and bad input fails with the file or
# setting named.
# Usage: train_gpt_test.sh TRAIN_GPT CORPUS CKPT
set -uo pipefail
BIN=$1
CORPUS=$2
CKPT=$3
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/../lib.sh"
SMALL=(--data "$CORPUS" --layers 2 --heads 2 --embed 32 --context 32 --batch 4 --lr 1e-3)

"$BIN" "${SMALL[@]}" --steps 30 >"$WORK/full.log" 2>&1
check "uninterrupted run" test $? -eq 0
first=$(train_losses "$WORK/full.log" | head -1 | cut -d' ' -f2)
last=$(train_losses "$WORK/full.log" | tail -1 | cut -d' ' -f2)
check "loss falls ($first -> $last)" awk "BEGIN{exit !($last < $first - 0.5)}"

"$BIN" "${SMALL[@]}" --steps 12 --save "$WORK/ck" --save-every 5 >"$WORK/a.log" 2>&1
check "first part saves" test -f "$WORK/ck/step-12/manifest.pb" -a -f "$WORK/ck/step-10/manifest.pb"
check "latest names step-12" grep -qx "step-12" "$WORK/ck/latest"
"$BIN" "${SMALL[@]}" --steps 30 --save "$WORK/ck" --resume >"$WORK/b.log" 2>&1
check "resume runs" grep -q "resumed from step 12" "$WORK/b.log"
cat <(train_losses "$WORK/a.log") <(train_losses "$WORK/b.log") >"$WORK/resumed.txt"
check "resumed losses equal the uninterrupted run's bit for bit" \
  diff <(train_losses "$WORK/full.log") "$WORK/resumed.txt"

# The corpus as a uint16 token file, written independently of our code.
write_token_file "$CORPUS" "$WORK/corpus.bin"
"$BIN" "${SMALL[@]/$CORPUS/$WORK/corpus.bin}" --steps 30 --export "$WORK/export" \
  --export-dtype bf16 >"$WORK/tokens.log" 2>&1
check "a token file trains exactly as its text" diff <(train_losses "$WORK/full.log") <(train_losses "$WORK/tokens.log")
check "export written" grep -q "exported bf16 weights to $WORK/export/step-30" "$WORK/tokens.log"
info=$("$CKPT" inspect "$WORK/export/step-30" 2>&1)
check "the export holds bf16 weights and no optimizer state" \
  bash -c 'grep -q "bf16" <<<"$1" && ! grep -q "optimizer\." <<<"$1"' _ "$info"
check "the export verifies" "$CKPT" verify "$WORK/export/step-30" --quiet
head -c 1030 "$WORK/corpus.bin" >"$WORK/cut.bin"
out=$("$BIN" "${SMALL[@]/$CORPUS/$WORK/cut.bin}" --steps 1 2>&1)
check "a truncated token file is named with its sizes" \
  grep -q "cut.bin.*announces.*tokens.*has 1030 bytes" <<<"$out"

out=$("$BIN" --data "$CORPUS" --layers 3 --heads 2 --embed 32 --context 32 --batch 4 \
  --steps 14 --save "$WORK/ck" --resume 2>&1)
check "resume with another config is refused, naming both" \
  grep -q "was trained with 'layers=2.*not 'layers=3" <<<"$out"
out=$("$BIN" --data "$WORK/missing.txt" --steps 1 2>&1)
check "a missing data file is named" grep -q "missing.txt" <<<"$out"
head -c 20 "$CORPUS" >"$WORK/tiny.txt"
out=$("$BIN" "${SMALL[@]/$CORPUS/$WORK/tiny.txt}" --steps 1 2>&1)
check "too little data is named" grep -q "tiny.txt.*fewer than one batch" <<<"$out"
out=$("$BIN" --data "$CORPUS" --layers 1 --heads 3 --embed 32 --steps 1 2>&1)
check "embed not a multiple of heads is refused" grep -q "not a multiple of heads" <<<"$out"
test $fails -eq 0
