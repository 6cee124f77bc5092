#!/usr/bin/env bash
# Thread scaling of W1 and W2 (issue 12): Tapir, faer-direct and PyTorch eager at 1, 2, 4,
# 8 and 16 threads (those the machine has), 3 alternated repetitions each. Meant for a
# machine with more cores and no network: build and strip the runner here, copy the
# working tree with it, run this there.
#
#   cd benches/compare && cargo build --release && strip -o target/tapir-compare.stripped target/release/tapir-compare
#   bash benches/compare/scaling.sh benches/compare/target/tapir-compare.stripped OUTDIR
#
# Each thread count writes OUTDIR/tN.log (the runner's table and every repetition); the
# Python is `$TAPIR_COMPARE_PYTHON`, else `python3`. A thread count that fails or runs past
# its time limit leaves its log and a line saying so, and the rest still run.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
runner=${1:-$here/target/release/tapir-compare}
out=${2:-${OUT:-/tmp/tapir-scaling}}
limit=${SCALING_LIMIT_S:-150}
mkdir -p "$out"
export TAPIR_COMPARE_DIR=$here
cores=$(nproc)
{ date -u; nproc; lscpu | grep -E "Model name|^CPU\(s\)|L3"; } > "$out/machine.txt" 2>&1
for t in 1 2 4 8 16; do
    if [ "$t" -gt "$cores" ]; then
        echo "skipped: $t threads on $cores cores" > "$out/t$t.log"
        continue
    fi
    timeout "$limit" "$runner" --threads "$t" --reps 3 --workloads W1,W2 --systems tapir,faer-direct,torch \
        > "$out/t$t.log" 2>&1
    rc=$?
    [ "$rc" -eq 0 ] || echo "exit status $rc (124: past ${limit} s)" >> "$out/t$t.log"
    grep -E "^\| W[12] (seed|MLP)" "$out/t$t.log" | sed "s/^/threads $t: /"
done
