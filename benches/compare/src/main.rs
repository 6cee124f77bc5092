//! `just compare`: W1–W7, W8 (W8C: W8 checkpointed), W10 and W11 on Tapir, on faer called directly, on candle, on burn and (when
//! `import torch` and `import jax` work in the Python it finds) on PyTorch eager,
//! `torch.compile` and `jax.jit`, one after another with alternating repetitions, as one
//! table. The Python is `$TAPIR_COMPARE_PYTHON`, else the virtual environment that `just
//! compare-setup` makes (`benches/compare/.venv`), else `python3`; the peers' scripts are
//! found in `$TAPIR_COMPARE_DIR`, else in `benches/compare` as built (`scaling.sh` runs a
//! copied, stripped runner on a machine with more cores).
//!
//! Every measurement runs in a child process of its own (`tapir-compare child SYSTEM
//! WORKLOAD`), so peak RSS belongs to one system and one workload, and every system gets the
//! same thread settings through the environment: `RAYON_NUM_THREADS`, `MATMUL_NUM_THREADS`
//! (burn-ndarray's matrixmultiply), `CANDLE_NUM_THREADS`, `OMP_NUM_THREADS`/`MKL_NUM_THREADS`
//! (PyTorch) and Tapir's `Graph::set_threads`. The children run on a thread with a large
//! stack because candle both sorts and drops its graph recursively; that thread builds
//! rayon's pool with itself in it (`tapir::init_threads`), as PyTorch's calling thread is
//! one of its OpenMP team, so every in-process system splits its work over exactly
//! `--threads` threads.

mod alloc_count;
mod burn_peer;
mod candle_peer;
mod peer;
mod tapir_peer;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use peer::{median, Peer};

#[global_allocator]
static ALLOC: alloc_count::Counting = alloc_count::Counting;

/// `torch-compile` is PyTorch with `torch.compile` on W1, W2 and W10; `jax` is `jax.jit` on W1
/// and W2. Both report their compile time beside the step time, which excludes it.
const SYSTEMS: [&str; 8] =
    ["tapir", "faer-direct", "candle", "burn-ndarray", "burn-flex", "torch", "torch-compile", "jax"];
const WORKLOADS: [&str; 11] = ["W1", "W2", "W3", "W4", "W6", "W5", "W7", "W10", "W8", "W8C", "W11"];
/// A child that runs longer than this is killed and its cell reads "timeout".
const CHILD_LIMIT: Duration = Duration::from_secs(600);

struct Options {
    threads: usize,
    reps: usize,
    w5_steps: usize,
    w10_steps: usize,
    workloads: Vec<String>,
    systems: Vec<String>,
}

fn usage() -> String {
    format!(
        "usage: tapir-compare [--threads N] [--reps R] [--w5-steps S] [--w10-steps S] [--workloads W1,W2,...] [--systems a,b,...]\n\
         workloads: {}\nsystems: {}",
        WORKLOADS.join(","),
        SYSTEMS.join(",")
    )
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        reps: 3,
        w5_steps: 2000,
        w10_steps: 500,
        workloads: WORKLOADS.iter().map(|s| s.to_string()).collect(),
        systems: SYSTEMS.iter().map(|s| s.to_string()).collect(),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().cloned().ok_or_else(|| format!("{flag} needs a value\n{}", usage()));
        let number = |v: String| v.parse::<usize>().map_err(|_| format!("{flag}: {v} is not a number"));
        match flag.as_str() {
            "--threads" => o.threads = number(value()?)?.max(1),
            "--reps" => o.reps = number(value()?)?.max(1),
            "--w5-steps" => o.w5_steps = number(value()?)?.max(100),
            "--w10-steps" => o.w10_steps = number(value()?)?.max(10),
            "--workloads" => o.workloads = value()?.split(',').map(|s| s.trim().to_uppercase()).collect(),
            "--systems" => o.systems = value()?.split(',').map(|s| s.trim().to_lowercase()).collect(),
            "-h" | "--help" => return Err(usage()),
            other => return Err(format!("unknown flag {other}\n{}", usage())),
        }
    }
    for w in &o.workloads {
        if !WORKLOADS.contains(&w.as_str()) {
            return Err(format!("unknown workload {w}\n{}", usage()));
        }
    }
    for s in &o.systems {
        if !SYSTEMS.contains(&s.as_str()) {
            return Err(format!("unknown system {s}\n{}", usage()));
        }
    }
    Ok(o)
}

fn make_peer(system: &str, threads: usize) -> Box<dyn Peer> {
    match system {
        "tapir" => Box::new(tapir_peer::Tapir::new(threads)),
        "faer-direct" => Box::new(tapir_peer::FaerDirect::new(threads)),
        "candle" => Box::new(candle_peer::Candle::new()),
        "burn-ndarray" => Box::new(burn_peer::Burn::ndarray()),
        "burn-flex" => Box::new(burn_peer::Burn::flex()),
        other => panic!("no in-process peer named {other}"),
    }
}

/// `child SYSTEM WORKLOAD THREADS W5_STEPS`: one measurement, printed as `RESULT` lines.
fn child(args: &[String]) {
    let [system, workload, threads, w5] = args else {
        eprintln!("child needs SYSTEM WORKLOAD THREADS W5_STEPS");
        std::process::exit(2);
    };
    let threads: usize = threads.parse().expect("THREADS is a number");
    let w5: usize = w5.parse().expect("W5_STEPS is a number");
    let (system, workload) = (system.clone(), workload.clone());
    let worker = std::thread::Builder::new().stack_size(4 << 30).spawn(move || {
        // This thread is one of the pool's, as a program's `main` is after
        // `tapir::init_threads`: it takes its share of each split instead of waiting.
        tapir::init_threads(threads).expect("the first parallel work of this process");
        let mut p = make_peer(&system, threads);
        println!("INFO threads {}", p.threads());
        println!("INFO version {}", p.version());
        peer::run(p.as_mut(), &workload, w5);
    });
    worker.expect("a thread with a 4 GiB stack").join().expect("the workload ran to the end");
}

#[derive(Default)]
struct Results {
    /// (metric, system) → one value per repetition.
    values: BTreeMap<(String, String), Vec<f64>>,
    /// Metrics in the order they first appeared.
    order: Vec<String>,
    threads: BTreeMap<String, String>,
    versions: BTreeMap<String, String>,
    failures: Vec<String>,
}

fn run_child(o: &Options, system: &str, workload: &str, r: &mut Results) {
    let threads = o.threads.to_string();
    let mut cmd = if system.starts_with("torch") {
        let mut c = Command::new(python());
        c.arg(peer_script("torch_peer.py"));
        if system == "torch-compile" {
            c.env("TORCH_PEER_COMPILE", "1");
        }
        c
    } else if system == "jax" {
        let mut c = Command::new(python());
        c.arg(peer_script("jax_peer.py"));
        c
    } else {
        let mut c = Command::new(std::env::current_exe().expect("the runner's own path"));
        c.args(["child", system]);
        c
    };
    let steps = if workload == "W10" { o.w10_steps } else { o.w5_steps };
    cmd.args([workload, &threads, &steps.to_string()]);
    for var in ["RAYON_NUM_THREADS", "MATMUL_NUM_THREADS", "CANDLE_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"] {
        cmd.env(var, &threads);
    }
    cmd.env("TAPIR_THREADS", &threads).stdout(Stdio::piped()).stderr(Stdio::inherit());
    let started = Instant::now();
    let mut proc = match cmd.spawn() {
        Ok(p) => p,
        Err(e) => {
            r.failures.push(format!("{system} {workload}: could not start: {e}"));
            return;
        }
    };
    let stdout = proc.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || BufReader::new(stdout).lines().map_while(Result::ok).collect::<Vec<_>>());
    let status = loop {
        if let Some(s) = proc.try_wait().expect("waiting on a child") {
            break Some(s);
        }
        if started.elapsed() > CHILD_LIMIT {
            let _ = proc.kill();
            let _ = proc.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let lines = reader.join().unwrap_or_default();
    for line in lines {
        let mut f = line.split_whitespace();
        match (f.next(), f.next(), f.next()) {
            (Some("RESULT"), Some(metric), Some(v)) => {
                let v: f64 = v.parse().unwrap_or(f64::NAN);
                if !r.order.iter().any(|m| m == metric) {
                    r.order.push(metric.to_string());
                }
                r.values.entry((metric.to_string(), system.to_string())).or_default().push(v);
            }
            (Some("INFO"), Some("threads"), Some(t)) => {
                r.threads.insert(system.to_string(), t.to_string());
            }
            (Some("INFO"), Some("version"), Some(_)) => {
                let v = line.splitn(3, ' ').nth(2).unwrap_or("?").to_string();
                r.versions.insert(system.to_string(), v);
            }
            _ => {}
        }
    }
    match status {
        Some(s) if s.success() => {}
        Some(s) => r.failures.push(format!("{system} {workload}: exited with {s}")),
        None => r.failures.push(format!("{system} {workload}: killed after {CHILD_LIMIT:?}")),
    }
    eprintln!("  {workload} {system}: {:.1} s", started.elapsed().as_secs_f64());
}

/// The path of a Python peer's script: in `$TAPIR_COMPARE_DIR` if set (a copy of
/// `benches/compare` on another machine, see `scaling.sh`), else beside the runner's
/// sources.
fn peer_script(name: &str) -> String {
    let dir = std::env::var("TAPIR_COMPARE_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    format!("{dir}/{name}")
}

/// The Python that runs the PyTorch and JAX peers (see the module doc).
fn python() -> String {
    if let Ok(p) = std::env::var("TAPIR_COMPARE_PYTHON") {
        return p;
    }
    let venv = concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/python3");
    if std::path::Path::new(venv).exists() {
        venv.to_string()
    } else {
        "python3".to_string()
    }
}

/// Whether `import MODULE` works in [`python`]; the last line of the error if not.
fn importable(module: &str) -> Result<(), String> {
    let out = Command::new(python())
        .args(["-c", &format!("import {module}")])
        .output()
        .map_err(|e| format!("python3 did not start: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        Err(err.lines().last().unwrap_or("import failed").to_string())
    }
}

fn sh(cmd: &str) -> String {
    Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// What each metric means, with its unit, in table order.
fn label(metric: &str) -> String {
    let fixed = match metric {
        "w1_ms" => "W1 seed loop, ms/iter",
        "w1_peak_mib" => "W1 peak RSS, MiB",
        "w1_growth_mib" => "W1 RSS growth iter 10→20, MiB",
        "w2_ms" => "W2 MLP step, ms",
        "w1_compile_s" => "W1 compile time (excluded from the step), s",
        "w2_compile_s" => "W2 compile time (excluded from the step), s",
        "w2_peak_mib" => "W2 peak RSS, MiB",
        "w5_growth_mib" => "W5 RSS growth step 100→last, MiB",
        "w6_heap_bytes_per_node" => "W6 heap bytes/node while recording (cold)",
        "w6_tapir_tape_bytes_per_node" => "W6 Tapir tape bytes/node (GraphStats)",
        "w6_tapir_arena_bytes_per_node" => "W6 Tapir arena bytes/node (values)",
        "w7_grad_ms" => "W7 W2 loss gradient (no update), ms",
        "w7_hvp_ms" => "W7 Hessian-vector product, ms",
        "w7_hvp_over_grad" => "W7 time(HVP) / time(gradient)",
        "w7_peak_mib" => "W7 peak RSS, MiB",
        "w10_ms" => "W10 char-transformer step, ms",
        "w10_tokens_per_s" => "W10 tokens/s",
        "w10_peak_mib" => "W10 peak RSS, MiB",
        "w10_growth_mib" => "W10 RSS growth step 10→last, MiB",
        "w10_import_mib" => "W10 RSS after `import torch`, MiB",
        "w8_ms" => "W8 deep MLP step, ms",
        "w8_peak_mib" => "W8 peak RSS, MiB",
        "w8_arena_mib" => "W8 arena high-water mark, MiB",
        "w8_import_mib" => "W8 RSS after `import torch`, MiB",
        "w8c_ms" => "W8C deep MLP step checkpointed every 4 layers, ms",
        "w8c_peak_mib" => "W8C peak RSS, MiB",
        "w8c_arena_mib" => "W8C arena high-water mark (main + scratch), MiB",
        "w8c_import_mib" => "W8C RSS after `import torch`, MiB",
        "w11_ms" => "W11 digits CNN step (batch 256), ms",
        "w11_peak_mib" => "W11 peak RSS, MiB",
        "w11_import_mib" => "W11 RSS after `import torch`, MiB",
        _ => "",
    };
    if !fixed.is_empty() {
        return fixed.to_string();
    }
    let parts: Vec<&str> = metric.split('_').collect();
    match parts.as_slice() {
        ["w3", op, numel, phase, "ns"] => format!("W3 {phase} ns/op, {op}, {numel} elem"),
        ["w4", n, "teardown", "us"] => format!("W4 teardown µs, {n} nodes"),
        ["w4", n, "total", "ms"] => format!("W4 build+backward+teardown ms, {n} nodes"),
        ["w5", "rss", step, "mib"] => format!("W5 RSS at step {step}, MiB"),
        _ => metric.to_string(),
    }
}

fn fmt(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn report(o: &Options, r: &Results, systems: &[String], elapsed: Duration) {
    let peers: Vec<&String> = systems.iter().filter(|s| *s != "tapir").collect();
    println!();
    println!(
        "Machine: {} cores, {}; {}; threads requested {}; {} repetitions (median of medians); {:.0} s",
        sh("nproc"),
        sh("lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1"),
        sh("date -u '+%Y-%m-%d %H:%M UTC'"),
        o.threads,
        o.reps,
        elapsed.as_secs_f64()
    );
    for s in systems {
        println!(
            "  {s}: version {}, threads {}",
            r.versions.get(s).map_or("?", String::as_str),
            r.threads.get(s).map_or("?", String::as_str)
        );
    }
    println!("Ratios are Tapir / peer: below 1 Tapir is faster or smaller.\n");
    let mut head = format!("| workload | {} |", systems.join(" | "));
    let mut rule = format!("|---|{}", "---:|".repeat(systems.len()));
    for p in &peers {
        head.push_str(&format!(" tapir/{p} |"));
        rule.push_str("---:|");
    }
    println!("{head}\n{rule}");
    for metric in &r.order {
        let med = |s: &str| r.values.get(&(metric.clone(), s.to_string())).map_or(f64::NAN, |v| median(&mut v.clone()));
        let mut line = format!("| {} |", label(metric));
        for s in systems {
            line.push_str(&format!(" {} |", fmt(med(s))));
        }
        let t = med("tapir");
        for p in &peers {
            let v = med(p);
            let ratio = if t.is_nan() || v.is_nan() || v == 0.0 { "-".to_string() } else { format!("{:.2}", t / v) };
            line.push_str(&format!(" {ratio} |"));
        }
        println!("{line}");
    }
    println!("\nEvery repetition's value (the table shows their median):");
    for metric in r.order.iter().filter(|m| m.ends_with("_ms") || m.ends_with("_ns")) {
        let cells: Vec<String> = systems
            .iter()
            .filter_map(|s| r.values.get(&(metric.clone(), s.clone())).map(|v| (s, v)))
            .map(|(s, v)| format!("{s} {}", v.iter().map(|x| fmt(*x)).collect::<Vec<_>>().join("/")))
            .collect();
        println!("  {}: {}", label(metric), cells.join(", "));
    }
    for f in &r.failures {
        println!("failed: {f}");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("child") {
        child(&args[1..]);
        return;
    }
    let o = match parse(&args) {
        Ok(o) => o,
        Err(msg) => {
            eprintln!("{msg}");
            std::process::exit(2);
        }
    };
    let mut systems = o.systems.clone();
    if systems.iter().any(|s| s.starts_with("torch")) {
        if let Err(why) = importable("torch") {
            println!(
                "PyTorch: skipped, `import torch` failed in {} ({why}); `just compare-setup` installs it.",
                python()
            );
            systems.retain(|s| !s.starts_with("torch"));
        }
    }
    if systems.iter().any(|s| s == "jax") {
        if let Err(why) = importable("jax") {
            println!("JAX: skipped, `import jax` failed in {} ({why}); `just compare-setup` installs it.", python());
            systems.retain(|s| s != "jax");
        }
    }
    // torch.compile runs W1, W2 and W10, jax W1 and W2: leave them out when none is asked for.
    let has = |ws: &[&str]| o.workloads.iter().any(|w| ws.contains(&w.as_str()));
    if !has(&["W1", "W2", "W10"]) {
        systems.retain(|s| s != "torch-compile");
    }
    if !has(&["W1", "W2"]) {
        systems.retain(|s| s != "jax");
    }
    let started = Instant::now();
    let mut r = Results::default();
    for w in &o.workloads {
        // W5 and W6 measure memory, not time: one run each is the measurement.
        let reps = if w == "W5" || w == "W6" || w == "W10" { 1 } else { o.reps };
        for rep in 0..reps {
            eprintln!("{w}, repetition {}/{reps}", rep + 1);
            // Rotate the order every repetition, so that no system always runs first or last.
            let n = systems.len();
            for i in 0..n {
                run_child(&o, &systems[(i + rep) % n], w, &mut r);
            }
        }
    }
    report(&o, &r, &systems, started.elapsed());
}
