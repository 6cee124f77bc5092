#!/usr/bin/env bash
# Two-thread speedup efficiency E2 = T1 / (2·T2) of each workload (issue 33): for each
# repetition, `step_time W 1` and `step_time W 2` run back to back (the order alternates
# between repetitions), their ratio is one paired E2; the median and the interquartile
# range over repetitions are printed. Wall-clock step times, never CPU time (idle rayon
# workers spin). On a 2-core machine, nothing else should run meanwhile.
#
#   cargo build --release -p benches --example step_time
#   bash benches/compare/e2.sh [REPS] [WORKLOADS]        # defaults: 7, W1,W2,W7,W8,W8C,W10,W11
#   STEP_TIME=path/to/step_time bash benches/compare/e2.sh 7 W2,W11
#
# Prints one line per workload: median T1 and T2 (ms), E2 median, E2 quartiles.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${STEP_TIME:-$here/../../target/release/examples/step_time}
reps=${1:-7}
workloads=${2:-W1,W2,W7,W8,W8C,W10,W11}
[[ -x $bin ]] || { echo "e2.sh: $bin not built (cargo build --release -p benches --example step_time)" >&2; exit 2; }

ms() { "$bin" "$1" "$2" | sed -n 's/.*: \([0-9.]*\) ms\/step.*/\1/p'; }

printf '# %s, %s, %s reps, %s\n' "$(date -u '+%F %H:%M UTC')" "$(nproc) cores" "$reps" "$(git -C "$here" describe --always --dirty 2>/dev/null || echo unknown)"
printf '%-5s %10s %10s %8s %17s\n' workload "T1 ms" "T2 ms" E2 "E2 IQR"
for w in ${workloads//,/ }; do
    rows=()
    for ((r = 0; r < reps; r++)); do
        if ((r % 2 == 0)); then t1=$(ms "$w" 1); t2=$(ms "$w" 2); else t2=$(ms "$w" 2); t1=$(ms "$w" 1); fi
        rows+=("$t1 $t2")
    done
    printf '%s\n' "${rows[@]}" | python3 -c '
import statistics, sys
w = sys.argv[1]
pairs = [tuple(map(float, l.split())) for l in sys.stdin if l.strip()]
e2 = sorted(a / (2 * b) for a, b in pairs)
q = statistics.quantiles(e2, n=4) if len(e2) > 1 else [e2[0]] * 3
t1 = statistics.median(a for a, _ in pairs)
t2 = statistics.median(b for _, b in pairs)
print(f"{w:<5} {t1:>10.3f} {t2:>10.3f} {statistics.median(e2):>8.3f} {q[0]:>8.3f}-{q[2]:.3f}")
' "$w"
done
