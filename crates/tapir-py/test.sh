#!/usr/bin/env bash
# The Python package from a fresh clone, in one command: a virtual environment in
# crates/tapir-py/.venv (installing Debian's python3-venv first if it is missing and we
# are root), the pinned tools of requirements-dev.txt, the extension built by maturin into
# that environment, then pytest on tests/. Arguments go to pytest.
# Needs Python >= 3.10 with venv and pip, and Rust.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
py="${PYTHON:-python3}"
if ! "$py" -c 'import ensurepip, venv' 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    else
        echo "test.sh: Python's venv module is missing; install python3-venv" >&2
        exit 1
    fi
fi
venv="$here/.venv"
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/requirements-dev.txt"
# The root workspace's build folder: the dependencies `cargo test --workspace` built
# (faer first of all) are reused rather than built again.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
(cd "$here" && VIRTUAL_ENV="$venv" "$venv/bin/maturin" develop --quiet)
cd "$here"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
