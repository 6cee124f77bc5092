#!/usr/bin/env bash
# Builds tapir-dist's MPI test binaries and runs each under mpirun with 1, 2 and 4 ranks
# (4 oversubscribes a 2-core machine: correctness only). Every run is under `timeout`, so
# a hang is a failure, not a stalled CI. Needs OpenMPI (`.ci/install-mpi`).
# Usage: crates/tapir-dist/tests/run-mpi.sh [RANKS...]   (default: 1 2 4)
set -euo pipefail
cd "$(dirname "$0")/../../.."
ranks=("${@:-1 2 4}")
ranks=(${ranks[*]})

# `--oversubscribe`: more ranks than cores; vader's single-copy mechanism (CMA) needs
# ptrace rights that containers often lack, so use plain shared-memory copies.
mpirun=(mpirun --oversubscribe --mca btl_vader_single_copy_mechanism none)
if [ "$(id -u)" = 0 ]; then mpirun+=(--allow-run-as-root); fi

# `cargo test --no-run` prints "Executable tests/NAME.rs (PATH)" for each test binary.
build_log=$(cargo test -p tapir-dist --features mpi --tests --no-run 2>&1) || { echo "$build_log"; exit 1; }
bin() { echo "$build_log" | sed -n "s|.*Executable tests/$1.rs (\(.*\))|\1|p"; }

failed=0
run() { # EXPECT NAME NP [ARGS...]: EXPECT is "ok" (exit 0) or "dies:PATTERN" (non-zero exit,
        # no hang, PATTERN in the output)
    local expect=${1%%:*} pattern=${1#*:} name=$2 np=$3; shift 3
    local start=$SECONDS status=0 log
    log=$(timeout 120 "${mpirun[@]}" -np "$np" "$(bin "$name")" "$@" 2>&1) || status=$?
    local took=$((SECONDS - start)) verdict=FAIL
    if [ "$status" = 124 ]; then
        verdict="FAIL (hung: killed by timeout after 120 s)"
    elif { [ "$expect" = ok ] && [ "$status" = 0 ]; } || { [ "$expect" = dies ] && [ "$status" != 0 ] && grep -q -- "$pattern" <<<"$log"; }; then
        verdict=ok
    fi
    printf '%-4s np=%s %-16s %-14s exit %3s, %3d s\n' "$verdict" "$np" "$name" "$*" "$status" "$took"
    echo "$log" | grep -E '^\[[0-9]+ ranks\] ok:|panicked outside a step|exited on signal|aborting the job: error' | sed 's/^ *//; s/^/       /' || true
    if [ "$verdict" != ok ]; then failed=1; echo "$log" | tail -30; fi
}

for np in "${ranks[@]}"; do
    run ok mpi_equivalence "$np"
    run ok mpi_startup "$np"
    run ok mpi_checkpoint "$np"
    run ok mpi_alloc "$np"
    run ok mpi_faults "$np" error
    run ok mpi_faults "$np" panic
    run 'dies:panicked outside a step; aborting the job' mpi_faults "$np" panic-outside
    run 'dies:exited on signal 9' mpi_faults "$np" kill
    run 'dies:cannot open its next shard' mpi_faults "$np" return
done
exit $failed
