#!/usr/bin/env bash
# Reproduce the figures of `tlio st convert` and `tlio st inspect` on large files:
#   - convert a 1 GiB single-tensor F32 file to BF16: peak RSS and throughput;
#   - inspect a sparse file whose header claims 20 GB of data: wall time.
# Usage: bench/st_convert.sh [WORKDIR]   (WORKDIR needs ~1.6 GB free; default: a
# fresh temporary directory, removed at the end). Needs GNU time at /usr/bin/time.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_setup "${1:-}"

# Write a safetensors file holding one F32 tensor of ELEMS elements whose header is
# canonical; the data is appended by the caller (or left sparse).
header() { # name elems path
    local json pad n
    json="{\"$1\":{\"dtype\":\"F32\",\"shape\":[$2],\"data_offsets\":[0,$(($2 * 4))]}}"
    pad=$(( (8 - ${#json} % 8) % 8 ))
    json="$json$(printf '%*s' "$pad" '')"
    n=${#json}
    # N as a little-endian u64 (headers here are far below 2^16 bytes).
    printf "$(printf '\\x%02x\\x%02x\\x00\\x00\\x00\\x00\\x00\\x00' $((n & 255)) $((n >> 8)))" >"$3"
    printf '%s' "$json" >>"$3"
}

ELEMS=$((1 << 28)) # 2^28 f32 = 1 GiB
IN="$WORK/f32_1gib.safetensors"
OUT="$WORK/bf16.safetensors"
header w "$ELEMS" "$IN"
head -c $((ELEMS * 4)) /dev/urandom >>"$IN"
"$TLIO" st verify "$IN" >/dev/null

/usr/bin/time -v "$TLIO" -q st convert "$IN" "$OUT" --dtype BF16 2>"$WORK/time.txt"
rss_kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$WORK/time.txt")
wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$WORK/time.txt")
secs=$(awk -v w="$wall" 'BEGIN { n = split(w, p, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + p[i]; print s }')
echo "convert 1 GiB F32 -> BF16: peak RSS $((rss_kb / 1024)) MiB, wall ${secs} s, $(awk -v s="$secs" 'BEGIN { printf "%.0f", 1024 / s }') MiB/s of input"
"$TLIO" st verify --canonical "$OUT" >/dev/null
rm -f "$IN" "$OUT"

SPARSE="$WORK/sparse_20gb.safetensors"
header huge 5000000000 "$SPARSE"
truncate -s $(( $(stat -c %s "$SPARSE") + 20000000000 )) "$SPARSE"
/usr/bin/time -v "$TLIO" st inspect "$SPARSE" >/dev/null 2>"$WORK/time.txt"
rss_kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$WORK/time.txt")
wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$WORK/time.txt")
echo "inspect of a sparse file claiming 20 GB: wall $wall, peak RSS $((rss_kb / 1024)) MiB"
rm -f "$SPARSE"
