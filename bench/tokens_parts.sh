#!/usr/bin/env bash
# tokens pack --part x4 + tokens merge against one tokens pack of the same corpus, and
# the merge's copy against `cat` of the same bytes.
#
#   bench/tokens_parts.sh [MB]     (default 500: a JSONL corpus of about MB megabytes)
#
# 1. One `tokens pack --tokenizer gpt2 --from jsonl --val-tokens ... ` of the corpus
#    (split into 8 files), wall time.
# 2. The same as 4 parts run at once (`--threads 1` each on this 2-core machine is
#    oversubscribed x2, as a scheduler packing 4 tasks on 2 cores would be), then the
#    merge; checks the shards are cmp-equal to 1.
# 3. The merge alone against `cat` of the part ids into one file plus `sync`, the
#    same bytes: the goal is merge <= 1.5x cat.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
tlio="$root/target/release/tlio"
mb="${1:-500}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

python3 - "$work" "$mb" <<'EOF'
import json, random, sys
work, mb = sys.argv[1], int(sys.argv[2])
rng = random.Random(1)
vocab = ("the of and to in a is that for it as was with be by on not he this are or his from at which "
         "but have an they you were her she there been one all we their has would when if so no what "
         "tokens shard merge part cluster training data corpus model stream window batch epoch").split()
target = mb * 1_000_000 // 8
for f in range(8):
    with open(f"{work}/c{f}.jsonl", "w") as out:
        n = 0
        while n < target:
            doc = " ".join(rng.choice(vocab) for _ in range(rng.randint(50, 800)))
            line = json.dumps({"text": doc}) + "\n"
            out.write(line)
            n += len(line)
EOF
inputs=("$work"/c*.jsonl)
flags=(--tokenizer gpt2 --from jsonl --val-tokens 10000000 --shard-tokens 50000000)
secs() { python3 -c 'import time; print(time.monotonic())'; }

mkdir "$work/one" "$work/many"
t0=$(secs)
"$tlio" -q tokens pack "${inputs[@]}" "${flags[@]}" -o "$work/one/fw"
t1=$(secs)
for k in 0 1 2 3; do
    "$tlio" -q tokens pack "${inputs[@]}" "${flags[@]}" --threads 1 -o "$work/many/fw" --part "$k/4" &
done
wait
t2=$(secs)
"$tlio" -q tokens merge "$work/many/fw"
t3=$(secs)
for f in "$work"/one/fw_*.bin; do cmp "$f" "$work/many/$(basename "$f")"; done
bytes=$(cat "$work"/many/fw.parts/*/ids.bin | wc -c)
# The merge again (its output replaced atomically) and cat of the same bytes, each
# with the data in the page cache and its output synced.
rm -f "$work"/many/fw_*.bin
sync
t4=$(secs)
"$tlio" -q tokens merge "$work/many/fw"
t5=$(secs)
cat "$work"/many/fw.parts/*/ids.bin > "$work/cat.bin"
sync "$work/cat.bin"
t6=$(secs)
python3 - "$t0" "$t1" "$t2" "$t3" "$t4" "$t5" "$t6" "$bytes" "$mb" <<'EOF'
import sys
t0, t1, t2, t3, t4, t5, t6, b, mb = map(float, sys.argv[1:])
print(f"corpus: {mb:.0f} MB of JSONL in 8 files, {b/1e6:.0f} MB of ids")
print(f"one tokens pack (2 threads):          {t1-t0:7.2f} s")
print(f"4 parts at once (1 thread each):      {t2-t1:7.2f} s")
print(f"merge:                                {t3-t2:7.2f} s")
print(f"4 parts + merge:                      {t3-t1:7.2f} s ({(t3-t1)/(t1-t0):.2f}x one pack); shards cmp-equal")
print(f"merge again vs cat + sync, same bytes: {t5-t4:.2f} s vs {t6-t5:.2f} s = {(t5-t4)/max(t6-t5,1e-9):.2f}x ({b/1e6/max(t5-t4,1e-9):.0f} MB/s vs {b/1e6/max(t6-t5,1e-9):.0f} MB/s)")
EOF
