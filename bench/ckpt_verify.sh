#!/usr/bin/env bash
# Verify speed of a checkpoint (sha256 of every byte, sha2's hardware path where the CPU
# has SHA extensions) beside coreutils' sha256sum on the same file.
#
# Usage (from the repository root): bench/ckpt_verify.sh [MB]   (default 1000 = 1 GB)
set -euo pipefail

MB=${1:-1000}
cargo build --release --quiet
BIN=$PWD/target/release/tlio
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
cd "$DIR"

# A valid single-tensor U8 safetensors file of MB megabytes: header, then random data.
python_free_header() {
    local n=$1
    local json="{\"w\":{\"dtype\":\"U8\",\"shape\":[$n],\"data_offsets\":[0,$n]}}"
    while [ $(( ${#json} % 8 )) -ne 0 ]; do json="$json "; done
    printf '%016x' "${#json}" | sed 's/../& /g' | awk '{ for (i = NF; i >= 1; i--) printf "\\x%s", $i }' | xargs -0 printf
    printf '%s' "$json"
}
bytes=$((MB * 1000 * 1000))
{ python_free_header "$bytes"; head -c "$bytes" /dev/urandom; } > model.safetensors
"$BIN" -q ckpt save ckpt --step 1 --model model.safetensors > /dev/null
cat ckpt/step-000001/model.safetensors > /dev/null # warm the page cache for both tools

t() { local s e; s=$(date +%s.%N); "$@" > /dev/null; e=$(date +%s.%N); awk -v s="$s" -v e="$e" -v mb="$MB" 'BEGIN { printf "%.2f s, %.0f MB/s\n", e - s, mb / (e - s) }'; }
echo "tlio ckpt verify: $(t "$BIN" -q ckpt verify ckpt/step-000001)"
echo "sha256sum:        $(t sha256sum ckpt/step-000001/model.safetensors)"
