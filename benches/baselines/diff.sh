#!/usr/bin/env bash
# Builds this tree's W3 and W2 profiling binaries, measures them with measure.sh and prints
# each figure's change against the checked-in baseline (w3.tsv, w2.tsv beside this script).
# A figure more than BUDGET percent (default 3) above its baseline is flagged and the exit
# status is 1: the budget is for all work after the baseline's commit together, not per change.
#
#   benches/baselines/diff.sh            # what `just baseline-diff` runs
#   benches/baselines/diff.sh NEW.tsv    # compare a measure.sh output instead of building
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
budget=${BUDGET:-3}

if [[ $# -ge 1 ]]; then
    new=$1
else
    cd "$here/../.."
    cargo build --release -p benches --example w3_profile --example w2_profile
    target=$(cargo metadata --no-deps --format-version 1 |
        sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    # Copy the binaries out first: a shared target directory may be rebuilt meanwhile.
    bin=$(mktemp -d)
    trap 'rm -rf "$bin"' EXIT
    cp "$target/release/examples/w3_profile" "$target/release/examples/w2_profile" "$bin/"
    new=$bin/new.tsv
    "$here/measure.sh" "$bin" all >"$new"
fi

awk -F'\t' -v budget="$budget" '
    FNR == 1 { next }                                  # header lines
    FILENAME != ARGV[ARGC - 1] { base[$1] = $2; basec[$1] = $3; order[n++] = $1; next }
    { now[$1] = $2; nowc = $3 }
    END {
        printf "%-24s %16s %16s %8s\n", "figure", "baseline", "now", "change"
        bad = 0
        for (i = 0; i < n; i++) {
            f = order[i]
            if (!(f in now)) { printf "%-24s %16s %16s %8s\n", f, base[f], "-", "missing"; bad = 1; continue }
            pct = (now[f] - base[f]) / base[f] * 100
            flag = pct > budget ? "  OVER BUDGET (+" budget "%)" : ""
            if (flag != "") bad = 1
            printf "%-24s %16s %16s %+7.2f%%%s\n", f, base[f], now[f], pct, flag
        }
        printf "baseline %s, now %s; budget +%s%% for all work since the baseline\n", basec[order[0]], nowc, budget
        exit bad
    }' "$here/w3.tsv" "$here/w2.tsv" "$new"
