#!/usr/bin/env bash
# Thread scaling (issue 33): the seven throughput workloads on Tapir, faer-direct (W1, W2)
# and PyTorch eager at 1, 2, 4, 8 and 16 threads (those the machine has). W1 and W2 take 3
# alternated repetitions, W7, W8, W8C, W10 (30 steps) and W11 one each: about 6 minutes
# on a 16-core machine, so that it fits one 15-minute device lease with room for a rerun.
# Meant for a machine with more cores and no network: build and strip the runner here,
# copy the working tree with it, run this there.
#
#   cd benches/compare && cargo build --release && strip -o target/tapir-compare.stripped target/release/tapir-compare
#   bash benches/compare/scaling.sh benches/compare/target/tapir-compare.stripped OUTDIR
#
# Each thread count writes OUTDIR/tN.log and OUTDIR/tN-rest.log (the runner's tables and
# every repetition); the Python is `$TAPIR_COMPARE_PYTHON`, else `python3`. A run that
# fails or passes its time limit (`SCALING_LIMIT_S`, default 150 s per log) leaves its log
# and a line saying so, and the rest still run.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
runner=${1:-$here/target/release/tapir-compare}
out=${2:-${OUT:-/tmp/tapir-scaling}}
limit=${SCALING_LIMIT_S:-150}
mkdir -p "$out"
export TAPIR_COMPARE_DIR=$here
cores=$(nproc)
{ date -u; nproc; lscpu | grep -E "Model name|^CPU\(s\)|L3"; } > "$out/machine.txt" 2>&1
run() { # LOG ARGS...: one runner invocation under the time limit
    local log=$1
    shift
    timeout "$limit" "$runner" "$@" > "$log" 2>&1
    local rc=$?
    [ "$rc" -eq 0 ] || echo "exit status $rc (124: past ${limit} s)" >> "$log"
}
for t in 1 2 4 8 16; do
    if [ "$t" -gt "$cores" ]; then
        echo "skipped: $t threads on $cores cores" > "$out/t$t.log"
        continue
    fi
    run "$out/t$t.log" --threads "$t" --reps 3 --workloads W1,W2 --systems tapir,faer-direct,torch
    run "$out/t$t-rest.log" --threads "$t" --reps 1 --w10-steps 30 --workloads W7,W8,W8C,W10,W11 --systems tapir,torch
    grep -hE "^\| W(1|2|7|8|8C|10|11) " "$out/t$t.log" "$out/t$t-rest.log" | grep -E "ms" | sed "s/^/threads $t: /"
done
