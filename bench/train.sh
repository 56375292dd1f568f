#!/usr/bin/env bash
# Throughput and peak memory of `tlio train bigram` at B=32, T=256, V=256 (byte-level
# text), for AdamW and SGD, without checkpoints in the timed part; then the cost of a
# checkpoint every 100 steps.
#
# Usage (from the repository root): bench/train.sh [STEPS]   (default 2000)
# Needs GNU time (/usr/bin/time -v) for the peak resident set size.
set -euo pipefail

STEPS=${1:-2000}
cargo build --release --quiet
BIN=$PWD/target/release/tlio
ROOT=$PWD
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
cd "$DIR"

# About 1 MB of text: the repository's own prose, repeated.
for _ in $(seq 1 20); do cat "$ROOT"/README.md "$ROOT"/docs/*.md "$ROOT"/assets/demo_corpus.txt; done > corpus.txt
"$BIN" -q tokens pack corpus.txt -o corpus.bin > /dev/null

run() {
    # $1: label; the rest: extra flags
    local label=$1
    shift
    rm -rf out
    /usr/bin/time -v -o time.txt "$BIN" -q train bigram --data corpus.bin --out out \
        --max-steps "$STEPS" --batch 32 --seq-len 256 "$@" > final.json
    local wall secs rss
    wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' time.txt)
    secs=$(awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, p, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + p[i]; print s}' time.txt)
    rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' time.txt)
    awk -v l="$label" -v w="$wall" -v s="$secs" -v r="$rss" -v n="$STEPS" \
        'BEGIN { printf "%s: %d steps in %s, %.2f M tokens/s, peak RSS %d KB\n", l, n, w, n * 32 * 256 / s / 1e6, r }'
}

run "adamw, no checkpoints" --ckpt-every 1000000
run "sgd momentum 0.9, no checkpoints" --ckpt-every 1000000 --optimizer sgd --lr 0.1
run "adamw, checkpoint every 100 steps" --ckpt-every 100 --keep 2
