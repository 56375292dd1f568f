#!/usr/bin/env bash
# Throughput and peak memory of `tlio tokens pack`: a byte stream from a pipe on
# standard input into 100M-token shards; then `tlio tokens header` on huge sparse shards
# (header only, so it is instant whatever the size).
#
# Usage (from the repository root): bench/tokens_pack.sh [MB]   (default 1000 = 1 GB)
# Needs GNU time (/usr/bin/time -v) for the peak resident set size.
set -euo pipefail

MB=${1:-1000}
cargo build --release --quiet
BIN=$PWD/target/release/tlio
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
cd "$DIR"

echo "generating $MB MB of input..."
head -c "$((MB * 1000 * 1000))" /dev/urandom > input.bytes

measure() {
    # $1: label; the rest: the command (run through bash -c)
    local label=$1
    shift
    /usr/bin/time -v -o time.txt bash -c "$*"
    local wall rss
    wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' time.txt)
    rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' time.txt)
    echo "$label: wall $wall, peak RSS ${rss} KB"
}

cat input.bytes > /dev/null # warm the page cache so the pipe, not the disk, feeds tlio
start=$(date +%s.%N)
measure "pack ${MB} MB from a pipe" "cat input.bytes | '$BIN' -q tokens pack - -o train --shard-tokens 100000000 > /dev/null"
end=$(date +%s.%N)
awk -v mb="$MB" -v s="$start" -v e="$end" 'BEGIN { printf "throughput: %.0f MB/s of input (%.0f M tokens/s)\n", mb / (e - s), mb / (e - s) }'
ls -l train_*.bin | awk '{ n++; total += $5 } END { printf "%d shards, %d bytes\n", n, total }'
rm -f input.bytes train_*.bin

# A valid shard of the largest count a header records (2^31 - 1 uint32 ids, 8.6 GB) and
# a 10 GB file with the same header (size mismatch): both sparse, both header-only.
printf '\210\330\064\001\002\000\000\000\377\377\377\177\240\206\001\000' > huge.bin
truncate -s 1024 huge.bin
cp huge.bin ten.bin
truncate -s "$((1024 + 4 * 2147483647))" huge.bin
truncate -s 10G ten.bin
measure "header of an 8.6 GB sparse shard" "'$BIN' tokens header huge.bin"
measure "header of a 10 GB sparse file" "'$BIN' tokens header ten.bin || true"
