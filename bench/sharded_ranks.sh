#!/usr/bin/env bash
# The rank simulator: rank 0's pre-commit work of a sharded save (writers, tensor list,
# chunk table with coverage, shards.json and manifest bytes) and one resharded rank's
# read plan, for R simulated ranks x T tensors of a 70B-class model under FSDP,
# FSDP x TP and HSDP. No torch, no process, no data file (src/core/examples/rank_sim).
#
# Usage (from the repository root): bench/sharded_ranks.sh [--tensors T] [--max-gib G] [R...]
#   (default: R = 64 512 4096 16384, T = 1000; a run predicted above G GiB, default 6,
#   is skipped and says so)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet -p tlio-core --example rank_sim
exec target/release/examples/rank_sim "$@"
