#!/usr/bin/env bash
# Worst-case safetensors headers: every command must cost O(header size) with a small
# constant and peak memory a small multiple of the header.
#   - one F32 tensor with 200,000 dimensions (and one whose header is ~100 MB of dims);
#   - 80,000 tensors (st diff f f looks every name up in both files);
#   - a ~100 MB header of 1,000,000 tensors, inspected as a table and as JSON.
# Prints wall time, peak RSS and its multiple of the header size of each command (output
# not to a terminal, as a script reads it). Usage: bench/worst_header.sh [WORKDIR]
# (needs ~300 MB free, python3 and GNU time at /usr/bin/time).
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_setup "${1:-}"

# make PATH TENSORS DIMS NAME_BYTES: TENSORS F32 tensors of shape [1]*DIMS, one element
# each, names padded to NAME_BYTES; the header padded with spaces to a multiple of 8.
make() {
    python3 - "$@" <<'PY'
import json, struct, sys
path, tensors, dims, name_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
shape = "[" + ",".join(["1"] * dims) + "]"
parts = []
for i in range(tensors):
    name = f"t{i:0{max(1, name_bytes - 1)}d}"
    parts.append(f'"{name}":{{"dtype":"F32","shape":{shape},"data_offsets":[{4 * i},{4 * i + 4}]}}')
header = ("{" + ",".join(parts) + "}").encode()
header += b" " * ((8 - len(header) % 8) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(header)))
    f.write(header)
    f.write(bytes(4 * tensors))
PY
}

# run LABEL CMD...: wall seconds, peak RSS and RSS / $HDR (the header length of the
# file at hand) of one command (exit 0 or 1 accepted).
run() {
    local label=$1
    shift
    /usr/bin/time -f '%e %M' -o "$WORK/time.txt" "$@" >/dev/null 2>&1 || [ $? -eq 1 ]
    read -r secs kb <"$WORK/time.txt"
    printf '%-48s %8.2f s %8d MiB %6.1fx\n' "$label" "$secs" $((kb / 1024)) \
        "$(awk -v kb="$kb" -v n="$HDR" 'BEGIN { print kb * 1024 / n }')"
}

header_mb() { awk -v n="$(stat -c %s "$1")" 'BEGIN { printf "%.1f", n / 1e6 }'; }
# header_len FILE: N, the little-endian u64 at the start of a safetensors file.
header_len() { od -An -tu8 -N8 "$1" | tr -d ' '; }

make "$WORK/dims.safetensors" 1 200000 8
HDR=$(header_len "$WORK/dims.safetensors")
echo "200,000 dimensions (file $(header_mb "$WORK/dims.safetensors") MB):"
run "  st inspect" "$TLIO" st inspect "$WORK/dims.safetensors"
run "  --json st inspect" "$TLIO" --json st inspect "$WORK/dims.safetensors"
run "  st verify" "$TLIO" st verify "$WORK/dims.safetensors"

make "$WORK/many.safetensors" 80000 1 16
HDR=$(header_len "$WORK/many.safetensors")
echo "80,000 tensors (file $(header_mb "$WORK/many.safetensors") MB):"
run "  st diff f f" "$TLIO" st diff "$WORK/many.safetensors" "$WORK/many.safetensors"
run "  st inspect" "$TLIO" st inspect "$WORK/many.safetensors"

make "$WORK/huge.safetensors" 1000000 1 32
HDR=$(header_len "$WORK/huge.safetensors")
echo "1,000,000 tensors, a $(header_mb "$WORK/huge.safetensors") MB header:"
run "  st inspect" "$TLIO" st inspect "$WORK/huge.safetensors"
run "  --json st inspect" "$TLIO" --json st inspect "$WORK/huge.safetensors"
run "  st verify" "$TLIO" st verify "$WORK/huge.safetensors"
run "  st diff f f" "$TLIO" st diff "$WORK/huge.safetensors" "$WORK/huge.safetensors"
run "  --json st diff f f" "$TLIO" --json st diff "$WORK/huge.safetensors" "$WORK/huge.safetensors"
rm -f "$WORK/huge.safetensors"

make "$WORK/hugedims.safetensors" 1 45000000 8
HDR=$(header_len "$WORK/hugedims.safetensors")
echo "one tensor, 45,000,000 dimensions ($(header_mb "$WORK/hugedims.safetensors") MB header):"
run "  st inspect" "$TLIO" st inspect "$WORK/hugedims.safetensors"
run "  --json st inspect" "$TLIO" --json st inspect "$WORK/hugedims.safetensors"
