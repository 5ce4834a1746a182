//! `cargo xtask`: developer tasks.
//!
//! - `build-ebpf`: installs what the BPF build needs (nightly's rust-src, a bpf-linker built
//!   against nightly's own LLVM) when missing, then builds the BPF object.
//! - `build`: the BPF object and a release sysprof.
//! - `run -- ARGS`: builds, then runs sysprof with ARGS (through sudo when not root).
//! - `test`: builds, fetches NVIDIA's CUDA runtime and NCCL (PyPI wheels, cached outside the
//!   repository) for the GPU tests, then runs every test.
//! - `bench`: overhead of sysprof beside perf and bpftrace, measured in one run.
//! - `fuzz`: every fuzz target (`fuzz/`) for a bounded time from the committed corpus.

mod bench;
mod fuzz;
mod nvidia;
mod toolchain;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build the BPF object, installing rust-src and bpf-linker first when missing
    BuildEbpf,
    /// Build the BPF object and a release sysprof
    Build,
    /// Build, then run sysprof with the given arguments (through sudo when not root)
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build, then run all tests
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Measure sysprof's overhead beside perf (and bpftrace) on the same workload, in one run
    Bench(bench::BenchArgs),
    /// Run every fuzz target (or those named) for a bounded time from the committed corpus,
    /// installing cargo-fuzz first when missing; fails on a crash, which it saves
    Fuzz(fuzz::FuzzArgs),
    /// Run a command with empty programs on uprobes, tracepoints and sampling events (the
    /// bench's floor for probed calls, the target's syscalls and sampling)
    #[command(hide = true)]
    EmptyPrograms {
        /// PATH:SYMBOL whose entry is probed (repeatable)
        #[arg(long = "entry")]
        entries: Vec<String>,
        /// PATH:SYMBOL whose return is probed (repeatable)
        #[arg(long = "return")]
        returns: Vec<String>,
        /// A BTF tracepoint (as in `btf_trace_NAME`: sys_enter) to attach to (repeatable)
        #[arg(long = "tracepoint")]
        tracepoints: Vec<String>,
        /// A CPU-clock event sampling at this frequency on every CPU, as sysprof's
        #[arg(long = "sample-hz")]
        sample_hz: Option<u64>,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let root = workspace_root();
    match cli.task {
        Task::BuildEbpf => {
            let object = toolchain::build_ebpf(&root)?;
            let size = std::fs::metadata(&object).map(|m| m.len()).unwrap_or(0);
            println!("BPF object: {} ({} KiB)", object.display(), size / 1024);
            Ok(())
        }
        Task::Build => build_release(&root).map(|binary| println!("sysprof: {}", binary.display())),
        Task::Run { args } => {
            let binary = build_release(&root)?;
            run_sysprof(&binary, &args)
        }
        Task::Test { args } => test(&root, &args),
        Task::Bench(args) => {
            let binary = build_release(&root)?;
            bench::run(&root, &binary, &args)
        }
        Task::Fuzz(args) => fuzz::run_targets(&root, &args),
        Task::EmptyPrograms { entries, returns, tracepoints, sample_hz, command } => {
            bench::run_with_empty_programs(&entries, &returns, &tracepoints, sample_hz, &command)
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// The BPF toolchain, then `cargo build --release -p sysprof` (whose build script embeds the
/// object).
fn build_release(root: &Path) -> anyhow::Result<PathBuf> {
    toolchain::build_ebpf(root)?;
    run(Command::new(cargo()).current_dir(root).args(["build", "--release", "--package", "sysprof"]))?;
    Ok(root.join("target/release/sysprof"))
}

fn run_sysprof(binary: &Path, args: &[String]) -> anyhow::Result<()> {
    let mut command = if is_root() {
        Command::new(binary)
    } else {
        eprintln!("xtask: sysprof needs root: running it through sudo");
        let mut sudo = Command::new("sudo");
        sudo.arg(binary);
        sudo
    };
    let status = command.args(args).status().with_context(|| format!("running {}", binary.display()))?;
    std::process::exit(status.code().unwrap_or(1));
}

fn test(root: &Path, args: &[String]) -> anyhow::Result<()> {
    toolchain::build_ebpf(root)?;
    let mut cargo_test = Command::new(cargo());
    match nvidia::ensure() {
        Ok(dir) => {
            cargo_test.env("SYSPROF_NVIDIA_LIBS", dir);
        }
        Err(error) if std::env::var_os("CI").is_some() => return Err(error),
        Err(error) => eprintln!("xtask: {error:#}: the tests on NVIDIA's real libraries will skip"),
    }
    cargo_test.current_dir(root).args(["test", "--workspace"]).args(args);
    // Under `sudo -E cargo xtask test` the tests are root's runs, into root's temporary
    // directories: sysprof must not take them for a sudo user's (it would write as that user).
    // The sudo tests set these variables themselves.
    for variable in SUDO_VARIABLES {
        cargo_test.env_remove(variable);
    }
    if is_root() {
        // The tests that load BPF programs are #[ignore]d ("needs root"), so that a run
        // without root shows them as ignored rather than passed: as root, run them too.
        if !args.iter().any(|a| a == "--") {
            cargo_test.arg("--");
        }
        cargo_test.arg("--include-ignored");
    } else {
        eprintln!(
            "xtask: not root: the tests that load BPF programs are ignored (run `sudo -E env PATH=$PATH cargo \
             xtask test` to run them)"
        );
    }
    run(&mut cargo_test)
}

/// What sudo sets for the command it runs, which sysprof reads to act for the invoking user.
const SUDO_VARIABLES: [&str; 3] = ["SUDO_UID", "SUDO_GID", "SUDO_USER"];

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The cargo that runs xtask, so nested builds use the same toolchain.
fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// Runs a command, failing with its command line when it fails.
fn run(command: &mut Command) -> anyhow::Result<()> {
    let status = command.status().with_context(|| format!("starting {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed: {status}");
    }
    Ok(())
}
