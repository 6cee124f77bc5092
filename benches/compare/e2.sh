#!/usr/bin/env bash
# Two-thread speedup efficiency E2 = T1 / (2·T2) of each workload (issue 33): for each
# repetition, `step_time W 1` and `step_time W 2` run back to back (the order alternates
# between repetitions), their ratio is one paired E2; the median and the interquartile
# range over repetitions are printed. Wall-clock step times, never CPU time (idle rayon
# workers spin). On a 2-core machine, nothing else should run meanwhile. Every run is
# pinned to CPUs 0 and 1 (`taskset`), so on a larger machine it measures two cores too.
#
#   cargo build --release -p benches --example step_time
#   bash benches/compare/e2.sh [REPS] [WORKLOADS]        # defaults: 7, W1,W2,W7,W8,W8C,W10,W11
#   STEP_TIME=path/to/step_time bash benches/compare/e2.sh 7 W2,W11
#   CAPACITY=1 bash benches/compare/e2.sh 7 W11           # also each core's own speed
#
# Prints one line per workload: median T1 and T2 (ms), E2 median, E2 quartiles.
#
# With CAPACITY=1 each repetition also times `step_time W 1` pinned to CPU 0 and to CPU 1
# (T1@0, T1@1). A virtual machine's two CPUs are not always equally fast (on the 2-core
# development guest one ran W11 1.3x slower than the other over 7 alternated runs), and no
# split of the work can beat the two cores' combined speed: 2 threads at best take
# T2* = 1 / (1/T1@0 + 1/T1@1). The extra columns are both medians and C2 = T2* / T2, the
# share of that capacity a 2-thread step reaches; with equal cores C2 = E2.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${STEP_TIME:-$here/../../target/release/examples/step_time}
reps=${1:-7}
workloads=${2:-W1,W2,W7,W8,W8C,W10,W11}
[[ -x $bin ]] || { echo "e2.sh: $bin not built (cargo build --release -p benches --example step_time)" >&2; exit 2; }

# ms CPUS WORKLOAD THREADS: the median step time of one run on CPUS.
ms() { taskset -c "$1" "$bin" "$2" "$3" | sed -n 's/.*: \([0-9.]*\) ms\/step.*/\1/p'; }
capacity=${CAPACITY:-0}

printf '# %s, %s, %s reps, %s\n' "$(date -u '+%F %H:%M UTC')" "$(nproc) cores" "$reps" "$(git -C "$here" describe --always --dirty 2>/dev/null || echo unknown)"
if [[ $capacity == 1 ]]; then
    printf '%-5s %10s %10s %8s %17s %8s %8s %8s %17s\n' workload "T1 ms" "T2 ms" E2 "E2 IQR" "T1@0" "T1@1" C2 "C2 IQR"
else
    printf '%-5s %10s %10s %8s %17s\n' workload "T1 ms" "T2 ms" E2 "E2 IQR"
fi
for w in ${workloads//,/ }; do
    rows=()
    for ((r = 0; r < reps; r++)); do
        p0=0 p1=0
        if ((r % 2 == 0)); then
            t1=$(ms 0,1 "$w" 1); t2=$(ms 0,1 "$w" 2)
            if [[ $capacity == 1 ]]; then p0=$(ms 0 "$w" 1); p1=$(ms 1 "$w" 1); fi
        else
            if [[ $capacity == 1 ]]; then p1=$(ms 1 "$w" 1); p0=$(ms 0 "$w" 1); fi
            t2=$(ms 0,1 "$w" 2); t1=$(ms 0,1 "$w" 1)
        fi
        rows+=("$t1 $t2 $p0 $p1")
    done
    printf '%s\n' "${rows[@]}" | python3 -c '
import statistics, sys
w, capacity = sys.argv[1], sys.argv[2] == "1"
rows = [tuple(map(float, l.split())) for l in sys.stdin if l.strip()]
def spread(v):
    v = sorted(v)
    q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
    return f"{statistics.median(v):>8.3f} {q[0]:>8.3f}-{q[2]:.3f}"
t1 = statistics.median(r[0] for r in rows)
t2 = statistics.median(r[1] for r in rows)
line = f"{w:<5} {t1:>10.3f} {t2:>10.3f} " + spread([a / (2 * b) for a, b, _, _ in rows])
if capacity:
    p0 = statistics.median(r[2] for r in rows)
    p1 = statistics.median(r[3] for r in rows)
    c2 = [1 / (b * (1 / c + 1 / d)) for _, b, c, d in rows]
    line += f" {p0:>8.3f} {p1:>8.3f} " + spread(c2)
print(line)
' "$w" "$capacity"
done
