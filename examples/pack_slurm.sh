#!/usr/bin/env bash
# Pack a corpus on a Slurm cluster: one array task per part (`tlio tokens pack --part`),
# then one merge job (`tlio tokens merge`) whose shards are byte-identical to a single
# `tlio tokens pack` of the same inputs and flags.
#
#   PARTS=64 OUT=/shared/fw examples/pack_slurm.sh submit data/*.jsonl -- --from jsonl --tokenizer gpt2 --val-tokens 100000000
#
# `submit` launches an array of the parts that are not complete yet (every part on a
# first run; after a failure, a second `submit` relaunches only the missing ones) and a
# merge job that runs once the array has succeeded. The array task's id is the part
# number itself (`--part $SLURM_ARRAY_TASK_ID/$PARTS`), so a rerun's array of a few ids
# (`--array=3,17`) packs exactly those parts.
#
# Environment: PARTS (N), OUT (the -o of the pack, on storage every node sees), TLIO
# (the binary, default `tlio` on the PATH), SBATCH_ARGS (extra sbatch options such as
# a partition or account), CPUS (cores per part, default 8).
set -euo pipefail

usage() {
    echo "usage: PARTS=N OUT=PREFIX $0 submit INPUT... -- PACK_FLAGS..." >&2
    exit 2
}

: "${TLIO:=tlio}"
: "${CPUS:=8}"
: "${SBATCH_ARGS:=}"

# The inputs and the pack flags, split at `--`.
split_args() {
    INPUTS=()
    FLAGS=()
    local seen=0
    for a in "$@"; do
        if [ "$seen" = 0 ] && [ "$a" = "--" ]; then
            seen=1
        elif [ "$seen" = 0 ]; then
            INPUTS+=("$a")
        else
            FLAGS+=("$a")
        fi
    done
    [ "${#INPUTS[@]}" -gt 0 ] || usage
}

# The parts without a completion marker, comma-separated (empty when all are done).
missing_parts() {
    local list=() k
    for ((k = 0; k < PARTS; k++)); do
        [ -f "$OUT.parts/$k-of-$PARTS/complete.json" ] || list+=("$k")
    done
    local IFS=,
    echo "${list[*]}"
}

cmd="${1:-}"
[ -n "$cmd" ] || usage
shift
[ -n "${PARTS:-}" ] && [ -n "${OUT:-}" ] || usage

case "$cmd" in
submit)
    split_args "$@"
    missing="$(missing_parts)"
    here="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
    merge_after=()
    if [ -n "$missing" ]; then
        echo "submitting parts $missing of $PARTS" >&2
        # shellcheck disable=SC2086  # SBATCH_ARGS is a list of options
        job=$(sbatch --parsable $SBATCH_ARGS --job-name=tlio-pack --array="$missing" \
            --cpus-per-task="$CPUS" --export=ALL,PARTS="$PARTS",OUT="$OUT",TLIO="$TLIO" \
            "$here" part "$@")
        merge_after=(--dependency="afterok:${job%%;*}")
    else
        echo "all $PARTS parts are complete: submitting the merge only" >&2
    fi
    # shellcheck disable=SC2086
    sbatch --parsable $SBATCH_ARGS --job-name=tlio-merge "${merge_after[@]}" \
        --export=ALL,PARTS="$PARTS",OUT="$OUT",TLIO="$TLIO" "$here" merge
    ;;
part)
    # Inside an array task: this task's part. A part that completed in an earlier
    # attempt is left as it is (tlio says so and exits 0).
    split_args "$@"
    : "${SLURM_ARRAY_TASK_ID:?part runs inside a Slurm array task}"
    exec "$TLIO" tokens pack "${INPUTS[@]}" "${FLAGS[@]}" -o "$OUT" \
        --threads "${SLURM_CPUS_PER_TASK:-$CPUS}" --part "$SLURM_ARRAY_TASK_ID/$PARTS"
    ;;
merge)
    exec "$TLIO" tokens merge "$OUT"
    ;;
missing)
    missing_parts
    ;;
*)
    usage
    ;;
esac
