#!/usr/bin/env bash
# W9 for 1, 2 and 4 ranks (or the counts given), one thread per rank, and the strong-scaling
# efficiency t1 / (k * tk). On a 2-core machine only 1 and 2 ranks say anything about speed.
set -euo pipefail
cd "$(dirname "$0")/../.."
ranks=("${@:-1 2 4}")
ranks=(${ranks[*]})
cargo build --release -q -p tapir-dist --features mpi --example bench_w9
# OpenMPI picks the shared-memory single-copy mechanism (CMA where ptrace allows it);
# the tests force `none` for containers, the benchmark does not.
mpirun=(mpirun --oversubscribe --bind-to none)
if [ "$(id -u)" = 0 ]; then mpirun+=(--allow-run-as-root); fi
echo "W9 on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
export OMP_NUM_THREADS=1 RAYON_NUM_THREADS=1
t1=""
for k in "${ranks[@]}"; do
    line=$(timeout 600 "${mpirun[@]}" -np "$k" target/release/examples/bench_w9 | grep '^W9')
    ms=$(sed -n 's/.*| \([0-9.]*\) ms\/step.*/\1/p' <<<"$line")
    if [ -z "$t1" ] && [ "$k" = 1 ]; then t1=$ms; fi
    eff=""
    if [ -n "$t1" ]; then eff=$(awk -v a="$t1" -v b="$ms" -v k="$k" 'BEGIN { printf " | efficiency %.0f%%", 100 * a / (k * b) }'); fi
    echo "$line$eff"
done
