//! `cargo xtask bench`: sysprof's cost on a workload, measured side by side with the peer tools
//! (perf, bpftrace) in one run. Configurations alternate round by round, so a noisy machine
//! slows all of them alike; figures are medians, compared as ratios.
//!
//! The workloads time themselves (they print `elapsed_ns=N`), so a profiler's start-up and its
//! writing of results are not counted as slowdown of the target; the whole command's wall time
//! is shown beside it.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, bail};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Which benchmark
    #[arg(value_enum, default_value_t = Bench::Cpu)]
    bench: Bench,
    /// Rounds (each runs every configuration once)
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Work per thread for the cpu benchmark (rounds of the busy loop, ~0.36 ms each)
    #[arg(long, default_value_t = 5000)]
    work: u64,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Bench {
    /// A CPU-bound workload on every CPU: no tracing, sysprof and `perf record -g` at 99 and
    /// 999 Hz
    Cpu,
}

/// One way to run the workload.
struct Config {
    name: String,
    argv: Vec<String>,
}

/// Medians of one configuration.
struct Measured {
    name: String,
    /// The workload's own time, as it reports it.
    elapsed_ns: f64,
    /// The whole command, profiler start-up and results included.
    wall_ns: f64,
}

pub fn run(root: &Path, sysprof: &Path, args: &BenchArgs) -> anyhow::Result<()> {
    if unsafe { libc::geteuid() } != 0 {
        bail!("the benchmark loads BPF programs: run it as root (sudo -E env PATH=$PATH cargo xtask bench)");
    }
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out)?;
    match args.bench {
        Bench::Cpu => cpu(root, sysprof, &out, args),
    }
}

fn cpu(root: &Path, sysprof: &Path, out: &Path, args: &BenchArgs) -> anyhow::Result<()> {
    let busy = build_workload(root, out, "busy")?;
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).to_string();
    let workload = vec![busy.display().to_string(), "--work".into(), args.work.to_string(), threads.clone()];
    let have_perf = tool_works("perf", &["--version"]);
    let mut configs = vec![Config { name: "bare".into(), argv: workload.clone() }];
    for hz in ["99", "999"] {
        let results = out.join(format!("sysprof-{hz}"));
        let mut sysprof_argv =
            vec![sysprof.display().to_string(), "trace".into(), "-q".into(), "-F".into(), hz.into()];
        sysprof_argv.extend(["-o".into(), results.display().to_string(), "--".into()]);
        sysprof_argv.extend(workload.iter().cloned());
        configs.push(Config { name: format!("sysprof {hz} Hz"), argv: sysprof_argv });
        if have_perf {
            let data = out.join(format!("perf-{hz}.data"));
            let mut perf = vec![
                "perf".into(),
                "record".into(),
                "-q".into(),
                "-g".into(),
                "-e".into(),
                "cpu-clock".into(),
            ];
            perf.extend(["-F".into(), hz.into(), "-o".into(), data.display().to_string(), "--".into()]);
            perf.extend(workload.iter().cloned());
            configs.push(Config { name: format!("perf record -g {hz} Hz"), argv: perf });
        }
    }
    if !have_perf {
        eprintln!(
            "bench: perf is not installed (apt-get install linux-perf): comparing with no tracing only"
        );
    }
    println!(
        "cpu: busy --work {} on {threads} threads (every CPU), {} rounds, medians",
        args.work, args.runs
    );
    let measured = measure(&configs, args.runs)?;
    let bare = measured[0].elapsed_ns;
    println!("{:<22} {:>12} {:>10} {:>12}", "configuration", "workload", "vs bare", "whole cmd");
    for m in &measured {
        println!(
            "{:<22} {:>10.3} s {:>10.4} {:>10.3} s",
            m.name,
            m.elapsed_ns / 1e9,
            m.elapsed_ns / bare,
            m.wall_ns / 1e9
        );
    }
    for hz in ["99", "999"] {
        let find = |name: &str| measured.iter().find(|m| m.name == name).map(|m| m.elapsed_ns);
        if let (Some(ours), Some(perf)) =
            (find(&format!("sysprof {hz} Hz")), find(&format!("perf record -g {hz} Hz")))
        {
            println!(
                "{hz} Hz: sysprof adds {:+.2}% to the workload, perf record -g {:+.2}%; sysprof/perf time ratio {:.4}",
                (ours / bare - 1.0) * 100.0,
                (perf / bare - 1.0) * 100.0,
                ours / perf
            );
        }
    }
    Ok(())
}

/// Runs every configuration `runs` times, alternating the order each round.
fn measure(configs: &[Config], runs: usize) -> anyhow::Result<Vec<Measured>> {
    let mut elapsed: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let mut wall: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for round in 0..runs {
        let mut order: Vec<usize> = (0..configs.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for index in order {
            let (workload_ns, wall_ns) = run_once(&configs[index])?;
            elapsed[index].push(workload_ns);
            wall[index].push(wall_ns);
        }
        eprint!("\rbench: round {}/{runs}", round + 1);
    }
    eprintln!();
    Ok(configs
        .iter()
        .enumerate()
        .map(|(i, config)| Measured {
            name: config.name.clone(),
            elapsed_ns: median(&mut elapsed[i]),
            wall_ns: median(&mut wall[i]),
        })
        .collect())
}

/// Runs one configuration; returns the workload's own `elapsed_ns` and the command's wall time.
fn run_once(config: &Config) -> anyhow::Result<(f64, f64)> {
    let started = Instant::now();
    let output = Command::new(&config.argv[0])
        .args(&config.argv[1..])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running {}", config.argv.join(" ")))?;
    let wall = started.elapsed().as_nanos() as f64;
    if !output.status.success() {
        bail!("{} failed: {}", config.name, String::from_utf8_lossy(&output.stderr));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let elapsed = stdout
        .lines()
        .find_map(|line| line.strip_prefix("elapsed_ns="))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .with_context(|| format!("{} printed no elapsed_ns: {stdout}", config.name))?;
    Ok((elapsed, wall))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 }
}

/// Builds `tests/workloads/NAME.c` the way the tests do (frame pointers, debug info).
fn build_workload(root: &Path, out: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let binary = out.join(name);
    let source = root.join(format!("tests/workloads/{name}.c"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    crate::run(
        Command::new(&cc)
            .args(["-O1", "-g", "-fno-omit-frame-pointer", "-pthread", "-o"])
            .arg(&binary)
            .arg(&source),
    )?;
    Ok(binary)
}

fn tool_works(tool: &str, args: &[&str]) -> bool {
    Command::new(tool)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
