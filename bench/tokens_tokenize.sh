#!/usr/bin/env bash
# `tlio tokens pack --tokenizer gpt2` against llm.c's dev/data/fineweb.py logic on the
# same JSONL corpus and the same cores, side by side: wall time, tokens/s, peak memory.
# Then single-thread tiktoken encode_ordinary against `--threads 1`, and the plain byte
# pack of 512 MiB against an llm.c-style numpy script and `cp` of the 1 GiB it writes.
#
# Usage (from the repository root): bench/tokens_tokenize.sh [MB]   (default 100)
# Needs: python3 with the versions in fixtures/requirements-tokenizers.txt
# (PYTHON=... to pick an interpreter), GNU time (/usr/bin/time -v).
set -euo pipefail

MB=${1:-100}
PY=${PYTHON:-python3}
cargo build --release --quiet
BIN=$PWD/target/release/tlio
ASSETS=$(cargo metadata --format-version 1 | "$PY" -c '
import json, sys, pathlib
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "tiktoken-rs":
        print(pathlib.Path(p["manifest_path"]).parent / "assets")')
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
cd "$DIR"
CORES=$(nproc)

# tiktoken's GPT-2 encoding from the rank files tiktoken-rs ships (tiktoken cannot
# download here); its hash checks make sure they are the real ones.
cat > gpt2.py <<EOF
import tiktoken, tiktoken.load
from tiktoken_ext import openai_public
def enc():
    real = tiktoken.load.data_gym_to_mergeable_bpe_ranks
    # Called with keyword arguments. vocab.bpe is checked against tiktoken's hash; the
    # crate's encoder.json is the same mapping serialized differently (another hash),
    # and tiktoken asserts that it equals the ranks built from vocab.bpe.
    def gym(vocab_bpe_file, encoder_json_file, vocab_bpe_hash=None, **kw):
        return real("$ASSETS/vocab.bpe", "$ASSETS/encoder.json", vocab_bpe_hash, None)
    openai_public.data_gym_to_mergeable_bpe_ranks = gym
    return tiktoken.Encoding(**openai_public.gpt2())
EOF

echo "generating a ${MB} MB JSONL corpus..."
"$PY" - "$MB" <<'EOF'
# Documents of English-like text: words drawn (Zipf) from GPT-2's own word tokens,
# sentences, paragraphs, numbers, some code and non-Latin lines; deterministic.
import json, random, sys
from gpt2 import enc
e = enc()
words = sorted({e.decode([i]).strip() for i in range(50000)} - {""})
words = [w for w in words if w.isalpha()][:20000]
rng = random.Random(1234)
weights = [1.0 / (r + 10) for r in range(len(words))]
extra = ["Привет мир, как дела?", "你好，世界。今天天气很好。", "def f(x):\n    return x * 2\n",
         "مرحبا بالعالم", "Ça coûte 12,50 € — d'accord?", "😀 🎉 👍🏽"]
target = int(sys.argv[1]) * 1_000_000
size = 0
with open("corpus.jsonl", "w", encoding="utf-8") as f:
    while size < target:
        paras = []
        for _ in range(rng.randint(1, 8)):
            sents = []
            for _ in range(rng.randint(2, 9)):
                ws = rng.choices(words, weights, k=rng.randint(4, 28))
                if rng.random() < 0.2:
                    ws.insert(rng.randrange(len(ws)), str(rng.randint(0, 99999)))
                s = " ".join(ws)
                sents.append(s[0].upper() + s[1:] + rng.choice([".", ".", ".", "?", "!", ";"]))
            if rng.random() < 0.1:
                sents.append(rng.choice(extra))
            paras.append(" ".join(sents))
        line = json.dumps({"text": "\n\n".join(paras), "id": size}, ensure_ascii=False) + "\n"
        f.write(line)
        size += len(line.encode())
EOF
ls -l corpus.jsonl | awk '{ printf "corpus: %d bytes, ", $5 }'
wc -l < corpus.jsonl | awk '{ print $1 " documents" }'

# fineweb.py's logic, in our words: a Pool of as many processes as cores, each document
# [eot] + encode_ordinary as uint16, filled into 100M-token shards (first val, then
# train) written by a write_datafile with llm.c's header.
cat > fineweb_logic.py <<'EOF'
import json, os, sys
import multiprocessing as mp
import numpy as np
from gpt2 import enc

SHARD = 10**8
_enc = None

def tokenize(text):
    global _enc
    if _enc is None:
        _enc = enc()
    toks = [_enc._special_tokens["<|endoftext|>"]] + _enc.encode_ordinary(text)
    return np.array(toks).astype(np.uint16)

def write_datafile(name, toks):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(toks)
    with open(name, "wb") as f:
        f.write(header.tobytes())
        f.write(toks.tobytes())

def docs(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]

def main():
    procs, out = int(sys.argv[2]), sys.argv[3]
    buf = np.empty((SHARD,), dtype=np.uint16)
    count, index = 0, 0
    with mp.Pool(procs) as pool:
        for toks in pool.imap(tokenize, docs(sys.argv[1]), chunksize=16):
            if count + len(toks) < SHARD:
                buf[count:count + len(toks)] = toks
                count += len(toks)
            else:
                rest = SHARD - count
                buf[count:] = toks[:rest]
                write_datafile(f"{out}_{'val' if index == 0 else 'train'}_{index:06d}.bin", buf)
                index += 1
                buf[:len(toks) - rest] = toks[rest:]
                count = len(toks) - rest
    if count:
        write_datafile(f"{out}_{'val' if index == 0 else 'train'}_{index:06d}.bin", buf[:count])

if __name__ == "__main__":
    main()
EOF

cat > single.py <<'EOF'
import json, sys, time
from gpt2 import enc
e = enc()
texts = [json.loads(l)["text"] for l in open(sys.argv[1], encoding="utf-8")]
t = time.perf_counter()
n = sum(len(e.encode_ordinary(x)) + 1 for x in texts)
s = time.perf_counter() - t
print(f"tiktoken encode_ordinary, 1 thread: {n} tokens in {s:.2f} s = {n / s / 1e6:.2f} M tokens/s (encoding only, JSON parsed before)")
EOF

measure() {
    # $1: label, $2: token count (0: none), the rest: the command (through bash -c)
    local label=$1 tokens=$2
    shift 2
    /usr/bin/time -v -o time.txt bash -c "$*"
    local wall rss secs
    wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' time.txt)
    rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' time.txt)
    secs=$(echo "$wall" | awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; print s }')
    if [ "$tokens" -gt 0 ]; then
        awk -v l="$label" -v w="$secs" -v r="$rss" -v t="$tokens" \
            'BEGIN { printf "%-44s %7.2f s  %6.2f M tokens/s  peak RSS %4d MiB\n", l, w, t / w / 1e6, r / 1024 }'
    else
        awk -v l="$label" -v w="$secs" -v r="$rss" \
            'BEGIN { printf "%-44s %7.2f s  peak RSS %4d MiB\n", l, w, r / 1024 }'
    fi
}

cat corpus.jsonl > /dev/null
echo "--- ${CORES} cores"
mkdir -p py tl
measure "fineweb.py logic (Pool of $CORES)" 0 "'$PY' fineweb_logic.py corpus.jsonl $CORES py/fw"
TOKENS=$("$BIN" tokens header --json py/fw_*.bin | "$PY" -c 'import json,sys; print(sum(json.loads(l)["n"] for l in sys.stdin))')
echo "tokens: $TOKENS"
measure "fineweb.py logic (Pool of $CORES)" "$TOKENS" "'$PY' fineweb_logic.py corpus.jsonl $CORES py/fw"
measure "tlio tokens pack (--threads $CORES)" "$TOKENS" \
    "'$BIN' -q tokens pack --tokenizer gpt2 --from jsonl corpus.jsonl --val-tokens 100000000 -o tl/fw"
for f in py/fw_*.bin; do
    # Same shards, header word 3 (V, which llm.c leaves 0) aside.
    cmp -s <(head -c 12 "$f"; tail -c +17 "$f") <(head -c 12 "tl/${f#py/}"; tail -c +17 "tl/${f#py/}") \
        && echo "same ids and header: ${f#py/}" || { echo "DIFFERENT: $f"; exit 1; }
done
echo "--- 1 thread"
"$PY" single.py corpus.jsonl
measure "tlio tokens pack --threads 1" "$TOKENS" \
    "'$BIN' -q tokens pack --tokenizer gpt2 --from jsonl corpus.jsonl --threads 1 -o tl/one.bin"
rm -rf py tl

echo "--- plain byte pack of 512 MiB (1 GiB of uint16 out)"
head -c $((512 << 20)) /dev/urandom > bytes.in
cat > numpy_pack.py <<'EOF'
import sys
import numpy as np
ids = np.fromfile(sys.argv[1], dtype=np.uint8).astype(np.uint16)
header = np.zeros(256, dtype=np.int32)
header[0], header[1], header[2], header[3] = 20240520, 1, len(ids), 256
with open(sys.argv[2], "wb") as f:
    f.write(header.tobytes())
    f.write(ids.tobytes())
EOF
measure "numpy (llm.c style)" 0 "'$PY' numpy_pack.py bytes.in np.bin"
rm -f np.bin
measure "tlio tokens pack --from bytes" 0 "'$BIN' -q tokens pack bytes.in -o tl.bin"
head -c $((1 << 30)) /dev/urandom > one.gib
measure "cp of 1 GiB" 0 "cp one.gib copy.gib"
rm -f one.gib copy.gib tl.bin bytes.in
