//! What the tool itself takes for a 10 s trace of the whole machine: its peak resident memory
//! and its CPU time (user + system, from the kernel's accounting of the finished process),
//! sysprof with every default family beside `perf record -a -g` at the same rate followed by
//! `perf script` (perf's way to the stacks sysprof writes).
//!
//! The machine is not idle meanwhile: a Python program (the interpreter most users profile,
//! whose symbols and unwind tables sysprof reads) and a process of threads that wake every
//! 10 ms run under both tools.

use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};

use super::{Background, Row, Runner, build_workload, median, python_interpreter, tool_works};

/// What the kernel accounted to a finished process.
#[derive(Clone, Copy, Default)]
struct Usage {
    cpu_s: f64,
    peak_rss_kib: u64,
}

impl Usage {
    /// Two processes run one after the other: CPU adds up, memory is the larger peak.
    fn then(self, other: Usage) -> Usage {
        Usage { cpu_s: self.cpu_s + other.cpu_s, peak_rss_kib: self.peak_rss_kib.max(other.peak_rss_kib) }
    }
}

const SECONDS: u32 = 10;

impl Runner<'_> {
    pub(super) fn footprint(&self) -> anyhow::Result<()> {
        let seconds = SECONDS.to_string();
        let sysprof_path = self.sysprof.display().to_string();
        let footprint_out = self.out.join("footprint").display().to_string();
        let sysprof = [
            sysprof_path.as_str(),
            "trace",
            "-q",
            "--all",
            "-d",
            &format!("{seconds}s"),
            "-o",
            &footprint_out,
        ];
        let accountant = build_workload(self.root, self.out, "accounted")?;
        let run_accounted = |argv: &[&str]| run_accounted(&accountant, argv);
        let have_perf = tool_works("perf", &["--version"]);
        let data = self.out.join("perf-footprint.data").display().to_string();
        let rounds = self.runs.clamp(1, 3);
        println!(
            "\nfootprint: a {SECONDS} s trace of the whole machine (a Python program and 8 threads waking every \
             10 ms running), {rounds} rounds, medians"
        );
        let (mut ours, mut perf) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let load = Load::start(self, SECONDS + 2)?;
            // Alternating which tool goes first, as the other benchmarks do.
            let sysprof_first = round % 2 == 0;
            if sysprof_first {
                ours.push(run_accounted(&sysprof)?);
            }
            if have_perf {
                let record = run_accounted(&[
                    "perf",
                    "record",
                    "-q",
                    "-a",
                    "-g",
                    "-F",
                    "99",
                    "-e",
                    "cpu-clock",
                    "-o",
                    &data,
                    "--",
                    "sleep",
                    &seconds,
                ])?;
                perf.push(record.then(run_accounted(&["perf", "script", "-i", &data])?));
            }
            if !sysprof_first {
                ours.push(run_accounted(&sysprof)?);
            }
            drop(load);
            eprint!("\rbench: round {}/{rounds}", round + 1);
        }
        eprintln!();
        let medians = |usages: &[Usage]| {
            let mut cpu: Vec<f64> = usages.iter().map(|u| u.cpu_s).collect();
            let mut rss: Vec<f64> = usages.iter().map(|u| u.peak_rss_kib as f64 / 1024.0).collect();
            (median(&mut cpu), median(&mut rss))
        };
        let (our_cpu, our_rss) = medians(&ours);
        let theirs = (!perf.is_empty()).then(|| medians(&perf));
        println!("{:<40} {:>12} {:>14}", "tool", "CPU time", "peak RSS");
        println!("{:<40} {:>10.3} s {:>11.1} MB", "sysprof trace --all (default families)", our_cpu, our_rss);
        if let Some((cpu, rss)) = theirs {
            println!("{:<40} {:>10.3} s {:>11.1} MB", "perf record -a -g -F 99 + perf script", cpu, rss);
        }
        let peer_s =
            |value: Option<f64>| value.map_or("-".into(), |v| format!("perf record + perf script {v:.3} s"));
        let peer_mb =
            |value: Option<f64>| value.map_or("-".into(), |v| format!("perf record + perf script {v:.1} MB"));
        self.rows.borrow_mut().push(Row {
            row: format!("peak RSS of a {SECONDS} s --all trace"),
            bare: "-".into(),
            sysprof: format!("{our_rss:.1} MB"),
            peer: peer_mb(theirs.map(|t| t.1)),
            ratio: theirs.map(|t| our_rss / t.1),
            goal: "< 40 MB".into(),
            holds: Some(our_rss < 40.0).into(),
        });
        self.rows.borrow_mut().push(Row {
            row: format!("tool CPU of a {SECONDS} s --all trace"),
            bare: "-".into(),
            sysprof: format!("{our_cpu:.3} s"),
            peer: peer_s(theirs.map(|t| t.0)),
            ratio: theirs.map(|t| our_cpu / t.0),
            goal: "<= the peer's".into(),
            holds: theirs.map(|t| our_cpu <= t.0).into(),
        });
        Ok(())
    }
}

/// The machine's work while the tools trace it, ended when dropped.
struct Load {
    _children: Vec<Background>,
}

impl Load {
    fn start(runner: &Runner<'_>, seconds: u32) -> anyhow::Result<Load> {
        let sysload = build_workload(runner.root, runner.out, "sysload")?;
        let mut children =
            vec![Background::spawn(Command::new(sysload).args(["tickers", "8", &seconds.to_string()]))?];
        if let Some(python) = python_interpreter() {
            let script = runner.root.join("tests/workloads/python_app.py");
            let timing = runner.out.join("footprint-phases.json");
            children.push(Background::spawn(
                Command::new(python).arg(script).args(["phases", &seconds.to_string()]).arg(timing),
            )?);
        }
        Ok(Load { _children: children })
    }
}

/// Runs a command to its end (its output thrown away) and returns what the kernel accounted
/// to it: CPU time and peak RSS, with the children it waited for. Through `accountant`
/// (tests/workloads/accounted.c), a small process of its own: a child's peak RSS starts at its
/// parent's (exec records the memory the process had before), and the bench's own would be
/// charged to the tool.
fn run_accounted(accountant: &std::path::Path, argv: &[&str]) -> anyhow::Result<Usage> {
    let mut command = Command::new(accountant);
    for variable in crate::SUDO_VARIABLES {
        command.env_remove(variable);
    }
    let output = command
        .args(argv)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("starting {:?}", argv[0]))?;
    if !output.status.success() {
        bail!("{:?} failed ({})", argv[0], output.status);
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let value = |name: &str| {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix('=')?.trim().parse::<f64>().ok())
            .with_context(|| format!("the accountant printed no {name}: {stdout}"))
    };
    Ok(Usage { cpu_s: value("cpu_s")?, peak_rss_kib: value("peak_rss_kib")? as u64 })
}
