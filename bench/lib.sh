# Shared prologue of the benchmarks that take a work directory; sourced, not run:
#   . "$(dirname "$0")/lib.sh"; bench_setup "${1:-}"
# bench_setup [WORKDIR]: move to the repository root, build the release binary, set
# TLIO to it and WORK to WORKDIR (created if missing), or to a fresh temporary
# directory removed when the script exits.
bench_setup() {
    cd "$(dirname "${BASH_SOURCE[0]}")/.."
    cargo build --release --quiet
    TLIO="$PWD/target/release/tlio"
    WORK="${1:-}"
    if [ -z "$WORK" ]; then
        WORK="$(mktemp -d)"
        trap 'rm -rf "$WORK"' EXIT
    else
        mkdir -p "$WORK"
    fi
}
