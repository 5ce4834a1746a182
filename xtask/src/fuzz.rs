//! `cargo xtask fuzz`: every fuzz target of `fuzz/` (cargo-fuzz, libFuzzer) for a bounded
//! time, from the committed seed corpus, as CI runs them.
//!
//! Each target reads the committed corpus (`fuzz/corpus/TARGET`) and writes what it finds into
//! a scratch folder under `fuzz/target/`, which libFuzzer is given first (the folder it adds
//! to): the committed corpus never grows by itself. A crash, a timeout or an allocation past
//! the memory limit is saved under `fuzz/artifacts/TARGET/`, with the command that reproduces
//! it; once fixed, it goes (minimized) into `fuzz/regressions/TARGET/`, which `cargo test
//! --test fuzz` replays.
//!
//! The targets run on the host toolchain (rust-toolchain.toml's stable); libFuzzer's flags
//! need `RUSTC_BOOTSTRAP`. No sanitizer by default: sysprof's parsers are safe Rust but for a
//! cast of read bytes in the unwind cache, and overflow checks and debug assertions, which
//! cargo-fuzz builds in, are what catch their bugs; `--sanitizer address` adds ASan.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::run;

/// The cargo-fuzz release the targets are built with.
const CARGO_FUZZ_VERSION: &str = "0.13.2";

#[derive(clap::Args)]
pub struct FuzzArgs {
    /// Seconds each target runs (10: with the build, about 6 minutes on 2 CPUs)
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// The sanitizer the targets are built with (`address`: ASan, about twice as slow)
    #[arg(long, default_value = "none", value_parser = ["none", "address"])]
    sanitizer: String,
    /// Targets run at once (default: the machine's CPUs)
    #[arg(long)]
    jobs: Option<usize>,
    /// The targets to run (default: all of them)
    targets: Vec<String>,
}

/// What one target's run came to.
struct Outcome {
    target: String,
    /// libFuzzer's count of inputs run, its rate, the inputs it kept for new coverage, and
    /// its peak memory.
    inputs: Option<u64>,
    per_second: Option<u64>,
    new_units: Option<u64>,
    peak_rss_mb: Option<u64>,
    /// The artifact a failure left, and why it failed, when it did.
    failure: Option<(Option<PathBuf>, String)>,
}

pub fn run_targets(root: &Path, args: &FuzzArgs) -> anyhow::Result<()> {
    let fuzz = root.join("fuzz");
    ensure_cargo_fuzz()?;
    let all = targets(&fuzz)?;
    let chosen: Vec<String> = if args.targets.is_empty() { all.clone() } else { args.targets.clone() };
    if let Some(unknown) = chosen.iter().find(|target| !all.contains(target)) {
        bail!("no fuzz target {unknown}: the targets are {}", all.join(", "));
    }
    let started = Instant::now();
    // The workspace's lock, so that the targets are built from the crates sysprof ships with
    // (cargo adds libFuzzer's to it).
    std::fs::copy(root.join("Cargo.lock"), fuzz.join("Cargo.lock"))
        .context("copying Cargo.lock into fuzz/")?;
    let mut build = fuzz_command(&fuzz);
    build.args(["build", "--sanitizer", &args.sanitizer]);
    run(&mut build).context("building the fuzz targets")?;
    let built = started.elapsed();
    eprintln!("xtask: fuzz targets built in {:.0} s", built.as_secs_f64());

    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
        .clamp(1, chosen.len().max(1));
    let binaries = fuzz.join("target/x86_64-unknown-linux-gnu/release");
    let mut outcomes = Vec::new();
    // A few at a time: each libFuzzer process is one thread.
    for batch in chosen.chunks(jobs) {
        let running: Vec<_> = batch
            .iter()
            .map(|target| spawn_target(&fuzz, &binaries, target, args.seconds))
            .collect::<anyhow::Result<_>>()?;
        for (target, child, log) in running {
            outcomes.push(finish_target(target, child, &log, args.seconds)?);
        }
    }

    println!(
        "\n{:<18} {:>14} {:>8} {:>10} {:>8}  result",
        "target", "inputs tried", "exec/s", "new units", "RSS MB"
    );
    let mut total = 0;
    for outcome in &outcomes {
        total += outcome.inputs.unwrap_or(0);
        let number = |value: Option<u64>| value.map_or("?".into(), |v| v.to_string());
        let result = match &outcome.failure {
            None => "ok".to_string(),
            Some((_, why)) => format!("FAILED: {why}"),
        };
        println!(
            "{:<18} {:>14} {:>8} {:>10} {:>8}  {result}",
            outcome.target,
            number(outcome.inputs),
            number(outcome.per_second),
            number(outcome.new_units),
            number(outcome.peak_rss_mb),
        );
    }
    println!(
        "{} targets, {total} inputs, {} s each; built in {:.0} s, {:.0} s in all",
        outcomes.len(),
        args.seconds,
        built.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| o.failure.is_some()).collect();
    for outcome in &failed {
        let Some((artifact, why)) = &outcome.failure else { continue };
        eprintln!("\n{}: {why}", outcome.target);
        if let Some(artifact) = artifact {
            let shown = artifact.strip_prefix(root).unwrap_or(artifact).display();
            eprintln!("  saved: {shown}");
            eprintln!(
                "  reproduce: (cd fuzz && SYSPROF_BPF_SKIP=1 RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer {} {} ../{shown})",
                args.sanitizer, outcome.target
            );
            eprintln!(
                "  once fixed: minimize it (`cargo fuzz tmin` the same way) into fuzz/regressions/{}/, which `cargo test --test fuzz` replays",
                outcome.target
            );
        }
    }
    if !failed.is_empty() {
        bail!("{} of {} fuzz targets failed", failed.len(), outcomes.len());
    }
    Ok(())
}

/// `cargo fuzz` in `fuzz/`, as the targets are built: libFuzzer's flags need
/// `RUSTC_BOOTSTRAP` on a stable toolchain, and sysprof's build script embeds no BPF object.
fn fuzz_command(fuzz: &Path) -> Command {
    let mut command = Command::new(crate::cargo());
    command.current_dir(fuzz).arg("fuzz").env("RUSTC_BOOTSTRAP", "1").env("SYSPROF_BPF_SKIP", "1");
    command
}

/// Installs cargo-fuzz at the pinned version when it is missing or another.
fn ensure_cargo_fuzz() -> anyhow::Result<()> {
    let version = Command::new(crate::cargo()).args(["fuzz", "--version"]).output();
    let installed = version.ok().filter(|out| out.status.success());
    let wanted = format!("cargo-fuzz {CARGO_FUZZ_VERSION}");
    if installed.is_some_and(|out| String::from_utf8_lossy(&out.stdout).trim() == wanted) {
        return Ok(());
    }
    eprintln!("xtask: installing cargo-fuzz {CARGO_FUZZ_VERSION}");
    run(Command::new(crate::cargo()).args([
        "install",
        "cargo-fuzz",
        "--version",
        CARGO_FUZZ_VERSION,
        "--locked",
    ]))
    .context("installing cargo-fuzz")
}

/// The targets `fuzz/fuzz_targets` holds, by name.
fn targets(fuzz: &Path) -> anyhow::Result<Vec<String>> {
    let dir = fuzz.join("fuzz_targets");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.strip_suffix(".rs").map(str::to_string))
        .collect();
    names.sort();
    Ok(names)
}

/// Starts one target for `seconds`, its output into a log under `fuzz/target/`.
fn spawn_target(
    fuzz: &Path,
    binaries: &Path,
    target: &str,
    seconds: u64,
) -> anyhow::Result<(String, std::process::Child, PathBuf)> {
    let scratch = fuzz.join("target/fuzz-run").join(target);
    // What an earlier run found is not kept: each run starts from the committed corpus.
    let _ = std::fs::remove_dir_all(&scratch);
    let found = scratch.join("found");
    std::fs::create_dir_all(&found).with_context(|| format!("creating {}", found.display()))?;
    let artifacts = fuzz.join("artifacts").join(target);
    std::fs::create_dir_all(&artifacts).with_context(|| format!("creating {}", artifacts.display()))?;
    let log = scratch.join("log");
    let mut command = Command::new(binaries.join(target));
    command
        .arg(&found)
        .arg(fuzz.join("corpus").join(target))
        .arg(format!("-max_total_time={seconds}"))
        .arg("-print_final_stats=1")
        // A slow input is a finding too (a parser that hangs on a file), but the CI machine
        // is slow and shared: 10 s, where the slowest seed takes well under one.
        .arg("-timeout=10")
        .arg(format!("-artifact_prefix={}/", artifacts.display()));
    let dict = fuzz.join("dict").join(format!("{target}.dict"));
    if dict.exists() {
        command.arg(format!("-dict={}", dict.display()));
    }
    let file = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    command.stdout(Stdio::from(file.try_clone()?)).stderr(Stdio::from(file));
    eprintln!("xtask: fuzzing {target} for {seconds} s");
    let child = command.spawn().with_context(|| format!("starting {}", binaries.join(target).display()))?;
    Ok((target.to_string(), child, log))
}

/// Waits for a target (its time and a margin for the input it is on: one that does not end
/// then is a failure) and reads its log.
fn finish_target(
    target: String,
    mut child: std::process::Child,
    log: &Path,
    seconds: u64,
) -> anyhow::Result<Outcome> {
    let status = wait(&mut child, Duration::from_secs(seconds + 60))?;
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let stat = |name: &str| {
        text.lines().find_map(|line| line.strip_prefix(&format!("stat::{name}:"))?.trim().parse::<u64>().ok())
    };
    let inputs = stat("number_of_executed_units");
    let per_second = stat("average_exec_per_sec");
    let new_units = stat("new_units_added");
    let peak_rss_mb = stat("peak_rss_mb");
    let failure = match status {
        Some(status) if status.success() => None,
        Some(status) => {
            let artifact = text.lines().find_map(|line| {
                let (_, path) = line.split_once("Test unit written to ")?;
                Some(PathBuf::from(path.trim()))
            });
            // A panic's place and its message (the line after), or libFuzzer's word for it.
            let lines: Vec<&str> = text.lines().collect();
            let why = match lines.iter().position(|line| line.contains("panicked at")) {
                Some(at) => lines[at..lines.len().min(at + 2)].join(" "),
                None => {
                    let error = lines.iter().find(|line| line.contains("==ERROR: libFuzzer"));
                    error.map_or("it exited with an error".into(), |line| line.to_string())
                }
            }
            .trim()
            .to_string();
            eprintln!("xtask: {target} failed ({status}); its log: {}\n{}", log.display(), tail(&text, 40));
            Some((artifact, why))
        }
        None => Some((None, format!("it did not end; its log: {}", log.display()))),
    };
    Ok(Outcome { target, inputs, per_second, new_units, peak_rss_mb, failure })
}

/// The child's status, or `None` (after killing it) when it runs past `limit`.
fn wait(
    child: &mut std::process::Child,
    limit: Duration,
) -> anyhow::Result<Option<std::process::ExitStatus>> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
