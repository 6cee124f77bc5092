#!/usr/bin/env bash
# Instruction counts of W3 and W2 under callgrind, 1 thread, printed as TSV
# (figure, instructions, commit, date) on stdout; the instructions column depends only on
# the binaries (two runs print the same figures).
#
#   benches/baselines/measure.sh BINDIR [w3|w2|all]
#
# BINDIR holds `w3_profile` and `w2_profile` from
# `cargo build --release -p benches --example w3_profile --example w2_profile`.
# COMMIT (default: `git describe --always --dirty` of this tree) and DATE (default: today,
# UTC) fill the last two columns; only they vary between runs of the same binaries.
#
# Method (docs/benchmarks.md, §5 "How to read the figures"): W3 per op = (total at 4 repetitions − total
# at 2) / 20,000, so start-up cancels; backward = the backward run's figure minus the
# record run's; W2 per step = (total of `w2_profile 3` − total of `w2_profile 1`) / 2.
# Both examples build their graph with `graph(1)`, so they run on one thread; the
# variables below only keep rayon and faer from starting pools of their own.
set -euo pipefail

bindir=${1:?usage: measure.sh BINDIR [w3|w2|all]}
which=${2:-all}
commit=${COMMIT:-$(git -C "$(dirname "$0")" describe --always --dirty 2>/dev/null || echo unknown)}
date=${DATE:-$(date -u +%F)}
export TAPIR_THREADS=1 RAYON_NUM_THREADS=1

command -v valgrind >/dev/null || { echo "measure.sh: valgrind not found" >&2; exit 2; }

# Total instructions (callgrind's "Collected") of one run, leaving out `println!`: the
# examples print timings, and formatting a float costs a value-dependent few dozen
# instructions, which made totals differ by up to ~200 between runs of the same binary.
# (The option order matters: `--collect-atstart=yes` after `--toggle-collect`.)
total() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        --toggle-collect='std::io::stdio::_print*' --collect-atstart=yes "$@" 2>&1 >/dev/null |
        sed -n 's/^==[0-9]*== Collected : \([0-9]*\)$/\1/p'
}

row() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$commit" "$date"; }

printf 'figure\tinstructions\tcommit\tdate\n'

if [[ $which == w3 || $which == all ]]; then
    for n in 1 1024; do
        for op in affine tanh; do
            name=$op
            [[ $op == affine ]] && name='x*c+d'
            r2=$(total "$bindir/w3_profile" "$op" record 2 "$n")
            r4=$(total "$bindir/w3_profile" "$op" record 4 "$n")
            b2=$(total "$bindir/w3_profile" "$op" backward 2 "$n")
            b4=$(total "$bindir/w3_profile" "$op" backward 4 "$n")
            row "$name [$n] record" "$(awk -v a="$r4" -v b="$r2" 'BEGIN { printf "%.2f", (a - b) / 20000 }')"
            row "$name [$n] backward" "$(awk -v a="$b4" -v b="$b2" -v c="$r4" -v d="$r2" \
                'BEGIN { printf "%.2f", ((a - b) - (c - d)) / 20000 }')"
        done
    done
fi

if [[ $which == w2 || $which == all ]]; then
    s1=$(total "$bindir/w2_profile" 1)
    s3=$(total "$bindir/w2_profile" 3)
    row "W2 step" "$(awk -v a="$s3" -v b="$s1" 'BEGIN { printf "%.1f", (a - b) / 2 }')"
fi
