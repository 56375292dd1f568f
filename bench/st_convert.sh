#!/usr/bin/env bash
# `tlio st convert` / `st quantize` against the machine and against Python, side by side
# in one run: medians of alternating runs (every round runs each job once, so drift on a
# shared machine hits all of them), page cache warm, each figure with the load average.
#
#   1. a 1 GiB F32 file of random normals (one 256 x 1M tensor) -> BF16:
#      durable (on WORKDIR's disk, tlio fsyncs)   vs  dd if=in of=out bs=1M conv=fsync
#      onto tmpfs (TMPFS, no disk)                 vs  cat in > TMPFS/x
#      safetensors + ml_dtypes in Python (onto tmpfs)
#   2. `st quantize --int4` of a 1 GiB BF16 file (16 x [4096, 8192] `_proj.weight`s),
#      durable and onto tmpfs, against dd / cat of its input and the rule in numpy;
#   3. a 4-shard F32 model directory (the file of 1 split in four) -> BF16, durable
#      and onto tmpfs, against dd / cat of its shards and safetensors + ml_dtypes
#      shard by shard (then the index and config.json).
#   Then the inspect of a sparse file whose header claims 20 GB (wall time).
#
# Usage: PYTHON=python-with-numpy-safetensors-ml_dtypes bench/st_convert.sh [WORKDIR]
#   RUNS (default 5) rounds; TMPFS (default /dev/shm); TLIO_BEFORE=path of another
#   tlio binary adds its rows (and a cmp of its outputs against this build's).
# WORKDIR needs ~3.5 GB free, TMPFS ~1 GB; default WORKDIR: a fresh temporary
# directory, removed at the end. Needs GNU time at /usr/bin/time.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_setup "${1:-}"
PY="${PYTHON:-python3}"
RUNS="${RUNS:-5}"
SHM="$(mktemp -d "${TMPFS:-/dev/shm}/st_convert.XXXXXX")"
trap 'rm -rf "$SHM"; [ -n "${1:-}" ] || rm -rf "$WORK"' EXIT

IN="$WORK/f32_1gib.safetensors"
Q_IN="$WORK/bf16_1gib.safetensors"
DIR="$WORK/f32_4shards"
"$PY" - "$IN" "$Q_IN" "$DIR" <<'EOF'
import json, os, sys
import numpy as np
from safetensors.numpy import save_file
import ml_dtypes
f32, bf16, d = sys.argv[1:4]
rng = np.random.default_rng(23)
w = rng.standard_normal((256, 1 << 20), dtype=np.float32)
save_file({"w": w}, f32)
save_file({f"model.layers.{i}.mlp.up_proj.weight":
           rng.standard_normal((4096, 8192), dtype=np.float32).astype(ml_dtypes.bfloat16)
           for i in range(16)}, bf16)
os.makedirs(d, exist_ok=True)
weight_map = {}
for s in range(4):
    name = f"model-{s + 1:05d}-of-00004.safetensors"
    part = {f"layer{s}.weight": w[s * 64:(s + 1) * 64]}
    save_file(part, os.path.join(d, name))
    weight_map[f"layer{s}.weight"] = name
json.dump({"metadata": {"total_size": w.nbytes}, "weight_map": weight_map},
          open(os.path.join(d, "model.safetensors.index.json"), "w"))
json.dump({"torch_dtype": "float32"}, open(os.path.join(d, "config.json"), "w"))
EOF
cat "$IN" "$Q_IN" "$DIR"/*.safetensors >/dev/null # warm the page cache

PY_CONVERT='import sys, ml_dtypes
from safetensors.numpy import load_file, save_file
save_file({k: v.astype(ml_dtypes.bfloat16) for k, v in load_file(sys.argv[1]).items()}, sys.argv[2])'

# What a Python user writes for int4-g32-sym: the rule in numpy, a tensor at a time
# (its tensors equal tlio's; checked below).
PY_QUANTIZE='import sys, ml_dtypes, numpy as np
from safetensors.numpy import load_file, save_file
out = {}
for k, v in load_file(sys.argv[1]).items():
    w = v.astype(np.float32).reshape(v.shape[0], -1, 32)
    s = (np.abs(w).max(axis=2) / np.float32(7)).astype(np.float16)
    sf = s.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(sf == 0, 0, np.clip(np.rint(w / sf), -8, 7)).astype(np.int8)
    q = q.reshape(v.shape[0], -1).view(np.uint8) & 0x0F
    out[k + ".qweight"] = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    out[k + ".scales"] = s
save_file(out, sys.argv[2], metadata={"quant": "int4-g32-sym"})'

# A model directory the same way: every shard, then the index and config.json.
PY_DIR='import json, os, sys, ml_dtypes
from safetensors.numpy import load_file, save_file
src, dst = sys.argv[1:3]
os.makedirs(dst)
index = json.load(open(os.path.join(src, "model.safetensors.index.json")))
total = 0
for name in sorted(set(index["weight_map"].values())):
    t = {k: v.astype(ml_dtypes.bfloat16) for k, v in load_file(os.path.join(src, name)).items()}
    total += sum(v.nbytes for v in t.values())
    save_file(t, os.path.join(dst, name))
index["metadata"]["total_size"] = total
json.dump(index, open(os.path.join(dst, "model.safetensors.index.json"), "w"))
config = json.load(open(os.path.join(src, "config.json")))
config["torch_dtype"] = "bfloat16"
json.dump(config, open(os.path.join(dst, "config.json"), "w"))'

# The jobs: NAME and a command run by bash -c (outputs removed after each run).
JOBS=(
    "convert_disk|$TLIO -q st convert $IN -o $WORK/o.st --dtype BF16"
    "dd_fsync|dd if=$IN of=$WORK/o.dd bs=1M conv=fsync status=none"
    "convert_tmpfs|$TLIO -q st convert $IN -o $SHM/o.st --dtype BF16"
    "cat_tmpfs|cat $IN > $SHM/o.cat"
    "python_tmpfs|$PY -c '$PY_CONVERT' $IN $SHM/o.py"
    "quantize_disk|$TLIO -q st quantize $Q_IN -o $WORK/q.st --int4"
    "q_dd_fsync|dd if=$Q_IN of=$WORK/q.dd bs=1M conv=fsync status=none"
    "quantize_tmpfs|$TLIO -q st quantize $Q_IN -o $SHM/q.st --int4"
    "q_cat_tmpfs|cat $Q_IN > $SHM/q.cat"
    "q_python_tmpfs|$PY -c '$PY_QUANTIZE' $Q_IN $SHM/q.py"
    "dir_disk|$TLIO -q st convert $DIR -o $WORK/d.out --dtype BF16"
    "dir_dd_fsync|for f in $DIR/*.safetensors; do dd if=\$f of=$WORK/d.dd.\$(basename \$f) bs=1M conv=fsync status=none; done"
    "dir_tmpfs|$TLIO -q st convert $DIR -o $SHM/d.out --dtype BF16"
    "dir_cat_tmpfs|cat $DIR/*.safetensors > $SHM/d.cat"
    "dir_python_tmpfs|$PY -c '$PY_DIR' $DIR $SHM/d.py"
)
if [ -n "${TLIO_BEFORE:-}" ]; then
    JOBS+=(
        "before_convert_disk|$TLIO_BEFORE -q st convert $IN -o $WORK/o.st --dtype BF16"
        "before_convert_tmpfs|$TLIO_BEFORE -q st convert $IN -o $SHM/o.st --dtype BF16"
        "before_quantize_tmpfs|$TLIO_BEFORE -q st quantize $Q_IN -o $SHM/q.st --int4"
        "before_dir_tmpfs|$TLIO_BEFORE -q st convert $DIR -o $SHM/d.out --dtype BF16"
    )
fi

RES="$WORK/results.txt"
: >"$RES"
for round in $(seq "$RUNS"); do
    for job in "${JOBS[@]}"; do
        name=${job%%|*}
        # Warm again before every job, untimed: a kernel that reclaims cold page
        # cache proactively (DAMON) drops pages of the inputs between rounds, and a
        # job that met a half-cold input would be timed against the disk.
        cat "$IN" "$Q_IN" "$DIR"/*.safetensors >/dev/null
        load=$(cut -d' ' -f1 /proc/loadavg)
        /usr/bin/time -f "%e %U %S %M" -o "$WORK/t.txt" bash -c "${job#*|}"
        echo "$name $(cat "$WORK/t.txt") $load" >>"$RES"
        rm -rf "$WORK"/o.* "$WORK"/q.* "$WORK"/d.* "$SHM"/*
    done
    echo "round $round done" >&2
done

# name wall user sys rss_kb load -> medians per job, and the ratios the goals name.
awk '
function med(s,   n, a, i, j, t) {
    n = split(s, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ w[$1] = w[$1] " " $2; u[$1] = u[$1] " " $3; s[$1] = s[$1] " " $4; m[$1] = m[$1] " " $5; l[$1] = l[$1] " " $6
  if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
END {
    printf "%-22s %8s %8s %8s %9s %6s\n", "job (medians)", "wall s", "user s", "sys s", "peak MiB", "load"
    for (i = 1; i <= n; i++) { k = order[i]; W[k] = med(w[k])
        printf "%-22s %8.2f %8.2f %8.2f %9.0f %6.2f\n", k, W[k], med(u[k]), med(s[k]), med(m[k]) / 1024, med(l[k]) }
    printf "\nratios (goal): convert_disk/dd_fsync %.2f (<= 0.6), convert_tmpfs/cat_tmpfs %.2f (<= 0.5), convert_tmpfs/python_tmpfs %.2f (<= 0.5)\n", W["convert_disk"] / W["dd_fsync"], W["convert_tmpfs"] / W["cat_tmpfs"], W["convert_tmpfs"] / W["python_tmpfs"]
    printf "quantize_disk/q_dd_fsync %.2f, quantize_tmpfs/q_cat_tmpfs %.2f, quantize_tmpfs/q_python_tmpfs %.2f\n", W["quantize_disk"] / W["q_dd_fsync"], W["quantize_tmpfs"] / W["q_cat_tmpfs"], W["quantize_tmpfs"] / W["q_python_tmpfs"]
    printf "dir_disk/dir_dd_fsync %.2f, dir_tmpfs/dir_cat_tmpfs %.2f, dir_tmpfs/dir_python_tmpfs %.2f\n", W["dir_disk"] / W["dir_dd_fsync"], W["dir_tmpfs"] / W["dir_cat_tmpfs"], W["dir_tmpfs"] / W["dir_python_tmpfs"]
}' "$RES"

# Output bytes: this build against TLIO_BEFORE on the benchmark files.
if [ -n "${TLIO_BEFORE:-}" ]; then
    for b in "$TLIO" "$TLIO_BEFORE"; do
        tag=$([ "$b" = "$TLIO" ] && echo new || echo old)
        "$b" -q st convert "$IN" -o "$WORK/$tag.bf16" --dtype BF16
        "$b" -q st quantize "$Q_IN" -o "$WORK/$tag.int4" --int4
        "$b" -q st convert "$DIR" -o "$WORK/$tag.dir" --dtype BF16
    done
    cmp "$WORK/new.bf16" "$WORK/old.bf16" && cmp "$WORK/new.int4" "$WORK/old.int4" &&
        diff -r "$WORK/new.dir" "$WORK/old.dir" &&
        echo "outputs identical to TLIO_BEFORE's (BF16 convert, int4 quantize, the directory)"
    rm -rf "$WORK"/new.* "$WORK"/old.*
fi
"$TLIO" st verify "$IN" >/dev/null
"$TLIO" -q st quantize "$Q_IN" -o "$WORK/q.tlio" --int4
"$PY" -c "$PY_QUANTIZE" "$Q_IN" "$WORK/q.py"
"$PY" - "$WORK/q.tlio" "$WORK/q.py" <<'EOF'
import sys
import numpy as np
from safetensors.numpy import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
same = sorted(a) == sorted(b) and all(np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)) for k in a)
print("int4 tensors equal to the numpy rule's:", same)
EOF
rm -f "$WORK/q.tlio" "$WORK/q.py"

# Inspect reads the header only: a sparse file claiming 20 GB of data.
SPARSE="$WORK/sparse_20gb.safetensors"
json='{"huge":{"dtype":"F32","shape":[5000000000],"data_offsets":[0,20000000000]}}'
json="$json$(printf '%*s' $(( (8 - ${#json} % 8) % 8 )) '')"
printf "$(printf '\\x%02x\\x%02x\\x00\\x00\\x00\\x00\\x00\\x00' $((${#json} & 255)) $((${#json} >> 8)))" >"$SPARSE"
printf '%s' "$json" >>"$SPARSE"
truncate -s $(( $(stat -c %s "$SPARSE") + 20000000000 )) "$SPARSE"
/usr/bin/time -f "%e s wall, %M KB peak" "$TLIO" st inspect "$SPARSE" 2>&1 >/dev/null |
    sed 's/^/inspect of a sparse file claiming 20 GB: /'
rm -f "$SPARSE"
