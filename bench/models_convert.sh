#!/usr/bin/env bash
# Reproduce the model-directory figures of docs/models.md: convert a ~1 GiB sharded F32
# llama directory (written by transformers' save_pretrained) to BF16, and quantize it
# to int4, with tlio and with the Python way, side by side (wall time, peak RSS).
#
#   Python convert:  from_pretrained(dtype=float32) -> .to(bfloat16) -> save_pretrained
#   Python quantize: safetensors' safe_open per shard, the int4-gG-sym rule in torch
#                    (F16 scale = RNE(amax/7), q = clamp(rint(w/scale), -8, 7) in f32),
#                    save_file per shard
#   tlio:            st convert / st quantize, default --jobs and --jobs 1
#
# Usage: PYTHON=/path/to/python bench/models_convert.sh [WORKDIR]
# PYTHON must have the packages of fixtures/requirements-models.txt (default: python3).
# WORKDIR needs ~3 GB free; default: a fresh temporary directory, removed at the end.
# Needs GNU time at /usr/bin/time.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_setup "${1:-}"
PY="${PYTHON:-python3}"
SRC="$WORK/llama-f32"

# ~252M parameters in F32 (1.0 GB), five shards of at most 250 MB as save_pretrained
# writes them. Fixed seed; generating it is not timed.
"$PY" - "$SRC" <<'EOF'
import sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                     num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=8,
                     tie_word_embeddings=False, torch_dtype="float32")
model = LlamaForCausalLM(config).to(torch.float32)
model.save_pretrained(sys.argv[1], max_shard_size="250MB")
EOF
echo "input: $(du -sh --apparent-size "$SRC" | cut -f1), $(ls "$SRC"/*.safetensors | wc -l) shards"

# run NAME CMD...: time CMD, print one row, keep going.
run() {
    local name=$1
    shift
    sync
    /usr/bin/time -v "$@" >/dev/null 2>"$WORK/time.txt"
    local rss_kb wall secs
    rss_kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$WORK/time.txt")
    wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$WORK/time.txt")
    secs=$(awk -v w="$wall" 'BEGIN { n = split(w, p, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + p[i]; print s }')
    printf '%-34s %8.2f s %8d MiB\n' "$name" "$secs" $((rss_kb / 1024))
}

printf '%-34s %10s %12s\n' "job" "wall" "peak RSS"

# Read the input once so every contender starts from a warm page cache.
cat "$SRC"/*.safetensors >/dev/null

run "python convert (transformers)" "$PY" - "$SRC" "$WORK/py-bf16" <<'EOF'
import sys
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
model = model.to(torch.bfloat16)
model.save_pretrained(sys.argv[2], max_shard_size="125MB")
EOF
run "tlio st convert --dtype BF16" "$TLIO" -q st convert "$SRC" -o "$WORK/tlio-bf16" --dtype BF16
run "tlio st convert --jobs 1" "$TLIO" -q st convert "$SRC" -o "$WORK/tlio-bf16-j1" --dtype BF16 --jobs 1

# The two BF16 models must hold the same tensors (torch and tlio both round to nearest even).
"$TLIO" st diff "$WORK/py-bf16" "$WORK/tlio-bf16" >/dev/null
cmp -s "$WORK/tlio-bf16/model.safetensors.index.json" "$WORK/tlio-bf16-j1/model.safetensors.index.json"
rm -rf "$WORK/py-bf16" "$WORK/tlio-bf16-j1"

run "python quantize (safetensors+torch)" "$PY" - "$SRC" "$WORK/py-int4" <<'EOF'
import json, os, shutil, sys
import torch
from safetensors import safe_open
from safetensors.torch import save_file
src, out, G = sys.argv[1], sys.argv[2], 32
os.makedirs(out)
weight_map, total = {}, 0
for name in sorted(os.listdir(src)):
    if not name.endswith(".safetensors"):
        if not name.endswith(".index.json"):
            shutil.copy(os.path.join(src, name), out)
        continue
    tensors = {}
    with safe_open(os.path.join(src, name), "pt") as f:
        for key in f.keys():
            w = f.get_tensor(key)
            if not key.endswith("_proj.weight"):
                tensors[key] = w
                continue
            rows, cols = w.shape
            g = w.to(torch.float32).reshape(rows, cols // G, G)
            scale = (g.abs().amax(dim=2) / 7).to(torch.float16)
            s32 = scale.to(torch.float32).unsqueeze(2)
            q = torch.where(s32 == 0, torch.zeros_like(g), torch.round(g / s32)).clamp(-8, 7)
            q = (q.to(torch.int16) & 0xF).to(torch.uint8).reshape(rows, cols)
            tensors[key + ".qweight"] = (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()
            tensors[key + ".scales"] = scale.contiguous()
    save_file(tensors, os.path.join(out, name), metadata={"format": "pt", "quant": f"int4-g{G}-sym"})
    for key, t in tensors.items():
        weight_map[key] = name
        total += t.numel() * t.element_size()
with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
EOF
run "tlio st quantize --int4" "$TLIO" -q st quantize "$SRC" -o "$WORK/tlio-int4" --int4
run "tlio st quantize --jobs 1" "$TLIO" -q st quantize "$SRC" -o "$WORK/tlio-int4-j1" --int4 --jobs 1
"$TLIO" st verify "$WORK/tlio-int4" >/dev/null
# The Python and tlio int4 models must hold identical logical tensors.
"$TLIO" st diff "$WORK/py-int4" "$WORK/tlio-int4" >/dev/null
rm -rf "$WORK/py-int4" "$WORK/tlio-int4" "$WORK/tlio-int4-j1" "$WORK/tlio-bf16"
