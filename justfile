# Tapir: every command humans and CI run. `just --list` prints these comments as help.

# Run the README demo: the leak-prone Python loop, with flat memory (ITERS=0: default).
demo ITERS="0":
    cargo run --release --example demo -- {{ if ITERS == "0" { "" } else { "--iters " + ITERS } }}

# Unit, property, compile-fail and doc tests: exactly what CI runs.
test:
    cargo test --workspace

# The Python binding's cost beside Rust and PyTorch eager: W3 per op, W2 per step, 1 and 2 threads
# (needs `just compare-setup` for torch; builds the extension in release into that venv).
compare-py:
    cargo build --release -p benches --example w3_profile --example w2_time
    benches/compare/.venv/bin/pip install -q maturin==1.16.0
    cd crates/tapir-py && VIRTUAL_ENV=../../benches/compare/.venv ../../benches/compare/.venv/bin/maturin develop --release
    for t in 1 2; do benches/compare/.venv/bin/python crates/tapir-py/bench/compare_py.py $t 5; done

# The Python package: a venv in crates/tapir-py/.venv, the extension built by maturin, pytest.
test-py *ARGS:
    crates/tapir-py/test.sh {{ARGS}}

# Per-example gradients on the W2 MLP beside torch.func.vmap(grad), alternated in one run:
# DP-SGD at batch 256 against the ordinary step, materialised gradients at batch 32
# (needs `just compare-setup` for torch; PY overrides the interpreter).
bench-per-example THREADS="1" REPS="5" PY="benches/compare/.venv/bin/python":
    cargo build --release -p benches --example per_example
    for i in 1 2; do target/release/examples/per_example {{THREADS}} {{REPS}}; CUDA_VISIBLE_DEVICES= {{PY}} benches/compare/per_example_torch.py {{THREADS}} {{REPS}}; done

# tapir-dist under mpirun with 1, 2 and 4 ranks (installs OpenMPI from Debian's packages if missing).
test-mpi *RANKS:
    .ci/install-mpi
    crates/tapir-dist/tests/run-mpi.sh {{RANKS}}

# W9: the W2 step data-parallel over 1, 2 and 4 MPI ranks (1 thread each): ms/step, all-reduce share, efficiency.
bench-mpi *RANKS:
    .ci/install-mpi
    crates/tapir-dist/bench-w9.sh {{RANKS}}

# Kernel accuracy: every f32 bit pattern in each function's useful range against f64, and the
# f64 kernels against mpmath; prints the max ulp per function (release, about 25 minutes on 2 cores).
accuracy:
    TAPIR_ULP_STRIDE=1 cargo test --release -p tapir --lib kernels::accuracy -- --nocapture --test-threads 1

# Format, clippy and docs, with warnings as errors.
# The Python package (its own workspace, crates/tapir-py) explicitly: its clippy needs python3.
lint:
    cargo fmt --all --check
    cargo fmt --manifest-path crates/tapir-py/Cargo.toml --check
    cargo clippy --workspace --all-targets -- -D warnings
    cargo clippy --manifest-path crates/tapir-py/Cargo.toml --all-targets -- -D warnings
    RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps

# Criterion benchmarks (under 10 minutes on 2 cores).
bench:
    cargo bench -p benches

# Save a criterion baseline named BASE.
bench-save BASE="main":
    cargo bench -p benches -- --save-baseline {{BASE}}

# Compare with a baseline saved by `just bench-save`.
bench-compare BASE="main":
    cargo bench -p benches -- --baseline {{BASE}}

# W3 and W2 instruction counts (callgrind, 1 thread) against benches/baselines/*.tsv; flags any over +3%.
baseline-diff:
    benches/baselines/diff.sh

# W1-W8 and W10 on Tapir, faer direct, candle, burn, PyTorch eager and torch.compile, jax.jit (if importable), one table (~25 min on 2 cores). ARGS: --help.
compare *ARGS:
    cd benches/compare && cargo run --release -- {{ARGS}}

# PyPI's Linux torch wheel also pulls the CUDA libraries (several GB); TORCH_INDEX=
# https://download.pytorch.org/whl/cpu, where that index is reachable, gets the CPU-only wheel.
# Make benches/compare/.venv (which `just compare` then uses) with pinned PyTorch and JAX, and
# safetensors and numpy for the checkpoint check of train_chars (examples/chars/gpt_torch.py).
compare-setup TORCH_INDEX="":
    python3 -m venv benches/compare/.venv
    benches/compare/.venv/bin/pip install {{ if TORCH_INDEX == "" { "" } else { "--index-url " + TORCH_INDEX } }} torch==2.15.0
    benches/compare/.venv/bin/pip install jax==0.10.2 jaxlib==0.10.2
    benches/compare/.venv/bin/pip install safetensors==0.8.0 numpy==2.4.6

# Crashes go to fuzz/artifacts/TARGET; the checked-in seeds in fuzz/corpus/TARGET (if any) are only read.
# Fuzz TARGET for SECONDS (nightly, `cargo install --locked cargo-fuzz`); prints executions and coverage.
# The bodies are in crates/tapir-testing; fuzz/TARGET.dict, if present, is passed as a dictionary.
fuzz TARGET="tape_program" SECONDS="60":
    mkdir -p target/fuzz-corpus/{{TARGET}}
    cd fuzz && cargo +nightly fuzz run {{TARGET}} ../target/fuzz-corpus/{{TARGET}} $(test -d corpus/{{TARGET}} && echo corpus/{{TARGET}}) -- -max_total_time={{SECONDS}} -timeout=10 -print_final_stats=1 $(test -f {{TARGET}}.dict && echo -dict={{TARGET}}.dict)

# Valgrind (demo at size 128: GEMM under valgrind is slow) and the 10,000-step memory test: no lost byte.
leakcheck:
    cargo build --release --example demo
    {{valgrind}} target/release/examples/demo --iters 5 --size 128
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="{{valgrind}}" cargo test --release -p tapir --test memory

valgrind := "valgrind --error-exitcode=1 --leak-check=full --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect"

# The tests under AddressSanitizer and LeakSanitizer (nightly; std itself is not instrumented).
asan:
    ASAN_OPTIONS=allocator_may_return_null=1 RUSTFLAGS="-Zsanitizer=address" RUSTDOCFLAGS="-Zsanitizer=address" cargo +nightly test -p tapir -p tapir-nn -p tapir-dist -p tapir-testing --lib --tests --target x86_64-unknown-linux-gnu

# Public API of tapir, tapir-nn and tapir-dist (nightly rustdoc JSON, tools/public_api.py) diffed against docs/public-api/CRATE.txt; a difference fails.
public-api:
    #!/usr/bin/env bash
    set -euo pipefail
    target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
    mkdir -p "$target/public-api"
    externs=() status=0
    for crate in tapir tapir-nn tapir-dist; do
        cargo +nightly rustdoc -q -p $crate --lib -- -Z unstable-options --output-format json --document-hidden-items
        json="$target/doc/${crate//-/_}.json"
        python3 tools/public_api.py "$json" "${externs[@]}" > "$target/public-api/$crate.txt"
        externs+=(--extern "$json")
        if ! diff -u "docs/public-api/$crate.txt" "$target/public-api/$crate.txt"; then
            echo "public-api: $crate differs; if intended: cp $target/public-api/$crate.txt docs/public-api/" >&2
            status=1
        fi
    done
    exit $status

# Everything CI and a reviewer would run.
ci: lint test
    cd fuzz && cargo check
