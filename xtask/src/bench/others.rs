//! What tracing one process costs every other process on the machine: `sysprof trace --pid`
//! of a sleeping process (all default families) beside bpftrace doing the same job with a pid
//! filter, while workloads that are not the target make system calls, switch and fault.
//!
//! The syscall and switch workloads spread their work over every CPU in turn (bpftrace's
//! tracepoints cost more on CPU 0, where its perf event lives, than elsewhere).
//! Each round starts the tool, waits until it says it is attached, runs every workload
//! `REPEATS` times and stops the tool; the tools take turns, in alternating order, like the
//! other benchmarks' configurations. Empty programs on the tracepoints sysprof shares with
//! every process, and on every CPU's page-fault events at sysprof's periods (`floor.rs`), are
//! measured the same
//! way: the kernel's part of the cost, which no program there goes under.

use std::{
    io::{BufRead as _, BufReader, Read},
    process::{Child, Command, Stdio},
};

use anyhow::{Context as _, bail};

use super::{
    Runner, build_workload,
    floor::{EmptyPrograms, SHARED_TRACEPOINTS},
    median, paired_median, tool_works,
};

/// The workloads that are not the target: name, what the figure is, the command.
struct Workload {
    row: &'static str,
    unit: &'static str,
    argv: Vec<String>,
}

/// How a tool is run and how it says it is attached.
struct Tool {
    name: &'static str,
    how: How,
}

enum How {
    /// Nothing attached: the bare runs.
    Bare,
    /// A process that prints `ready` (on stderr for sysprof, stdout for bpftrace) once
    /// everything is attached.
    Process { argv: Vec<String>, ready: &'static str, on_stderr: bool },
    /// Empty programs on sysprof's shared tracepoints: the floor (see `floor.rs`).
    EmptyPrograms,
}

/// What a tool leaves attached while the workloads run.
enum Attached {
    Nothing,
    Process(Child),
    Programs(EmptyPrograms),
}

/// Runs of each workload per tool per round, the fastest kept: the noise of a shared machine
/// only ever adds time, and a page fault's (some 10% of a 2.5 us fault from run to run) is as
/// large as what the tools add to it.
const REPEATS: usize = 3;

impl Runner<'_> {
    pub(super) fn others(&self) -> anyhow::Result<()> {
        let sysload = build_workload(self.root, self.out, "sysload")?.display().to_string();
        let memload = build_workload(self.root, self.out, "memload")?.display().to_string();
        let workloads = [
            Workload {
                row: "other processes: ns added per getppid",
                unit: "ns per syscall",
                argv: vec![sysload.clone(), "getppid".into(), "2000000".into(), "spread".into()],
            },
            Workload {
                row: "other processes: ns added per round trip (2 switches)",
                unit: "ns per round trip",
                argv: vec![sysload.clone(), "pingpong".into(), "50000".into(), "spread".into()],
            },
            Workload {
                row: "other processes: ns added per page fault",
                unit: "ns per fault",
                argv: vec![memload, "touch".into(), "200000".into()],
            },
        ];
        // The target: a process that sleeps through every round.
        let mut target = Command::new(&sysload).args(["stamps", "3600000"]).stdout(Stdio::null()).spawn()?;
        let pid = target.id();
        let result = self.measure_others(&workloads, pid);
        let _ = target.kill();
        let _ = target.wait();
        result
    }

    fn measure_others(&self, workloads: &[Workload], pid: u32) -> anyhow::Result<()> {
        let mut tools = vec![
            Tool { name: "bare", how: How::Bare },
            Tool { name: "empty programs", how: How::EmptyPrograms },
            Tool {
                name: "sysprof --pid",
                how: How::Process {
                    argv: vec![
                        self.sysprof.display().to_string(),
                        "trace".into(),
                        "--pid".into(),
                        pid.to_string(),
                        "-o".into(),
                        self.out.join("others").display().to_string(),
                    ],
                    ready: "tracing",
                    on_stderr: true,
                },
            },
        ];
        if tool_works("bpftrace", &["--version"]) {
            let script = self.out.join("others.bt");
            std::fs::write(&script, bpftrace_script(pid))?;
            self.mount_tracefs()?;
            tools.push(Tool {
                name: "bpftrace /pid == N/",
                how: How::Process {
                    argv: vec!["bpftrace".into(), script.display().to_string()],
                    ready: "attached",
                    on_stderr: false,
                },
            });
        } else {
            eprintln!("bench: bpftrace is not installed (apt-get install bpftrace): no bpftrace comparison");
        }
        println!(
            "\nother processes: sysprof trace --pid {pid} (a sleeping process, default families) and bpftrace \
             with /pid == {pid}/, while other processes work; {} rounds, medians",
            self.runs
        );
        // values[tool][workload]
        let mut values = vec![vec![Vec::new(); workloads.len()]; tools.len()];
        for round in 0..self.runs {
            let mut order: Vec<usize> = (0..tools.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for index in order {
                let tool = &tools[index];
                let attached = start_tool(tool)?;
                for (w, workload) in workloads.iter().enumerate() {
                    let mut fastest = f64::INFINITY;
                    for _ in 0..REPEATS {
                        fastest = fastest.min(run_workload(&workload.argv)?);
                    }
                    values[index][w].push(fastest);
                }
                match attached {
                    Attached::Nothing => {}
                    Attached::Process(child) => stop_tool(tool.name, child)?,
                    // Detached and unloaded as their fds close.
                    Attached::Programs(programs) => drop(programs),
                }
            }
            eprint!("\rbench: round {}/{}", round + 1, self.runs);
        }
        eprintln!();
        let (empty, sysprof, bpftrace) = (1, 2, 3);
        // Round by round, before the medians sort the values: sysprof and the empty programs
        // ran next to each other in every round.
        let above_floor: Vec<f64> =
            (0..workloads.len()).map(|w| paired_median(&values[sysprof][w], &values[empty][w])).collect();
        let medians: Vec<Vec<f64>> =
            values.iter_mut().map(|per_tool| per_tool.iter_mut().map(|v| median(v)).collect()).collect();
        for (w, (workload, above_floor)) in workloads.iter().zip(above_floor).enumerate() {
            let bare = medians[0][w];
            let added = |tool: usize| medians.get(tool).map(|m| m[w] - bare);
            let shown = |tool: usize| added(tool).map_or("-".into(), |a| format!("{a:.1}"));
            println!(
                "{}: bare {bare:.1} {}; empty programs add {}; sysprof adds {} \
                 ({:+.1} over the empty programs, round by round); bpftrace adds {}",
                workload.row,
                workload.unit,
                shown(empty),
                shown(sysprof),
                above_floor,
                shown(bpftrace)
            );
            self.added_row_of(
                workload.row,
                bare,
                added(sysprof).unwrap_or(f64::NAN),
                added(bpftrace),
                0.25,
                Some(added(empty).unwrap_or(f64::NAN)),
            );
            self.floor_row_of(
                workload.row,
                bare,
                added(empty).unwrap_or(f64::NAN),
                added(bpftrace),
                above_floor,
            );
        }
        Ok(())
    }
}

/// bpftrace doing sysprof's job for process `pid` alone: syscall latency by syscall, off-CPU
/// switches by kernel and user stack, page faults by user stack, each filtered by `pid`.
fn bpftrace_script(pid: u32) -> String {
    format!(
        "BEGIN {{ printf(\"attached\\n\"); }}\n\
         tracepoint:raw_syscalls:sys_enter /pid == {pid}/ {{ @start[tid] = nsecs; }}\n\
         tracepoint:raw_syscalls:sys_exit /pid == {pid}/ {{ @lat[args->id] = hist(nsecs - @start[tid]); \
         delete(@start[tid]); }}\n\
         tracepoint:sched:sched_switch /pid == {pid}/ {{ @switches[kstack, ustack] = count(); }}\n\
         software:page-faults:1 /pid == {pid}/ {{ @faults[ustack] = count(); }}\n"
    )
}

/// Attaches `tool`: starts it and waits for its line saying it is attached, or loads the empty
/// programs.
fn start_tool(tool: &Tool) -> anyhow::Result<Attached> {
    match &tool.how {
        How::Bare => Ok(Attached::Nothing),
        How::EmptyPrograms => Ok(Attached::Programs(EmptyPrograms::attach(&SHARED_TRACEPOINTS)?)),
        How::Process { argv, ready, on_stderr } => {
            Ok(Attached::Process(start_process(tool.name, argv, ready, *on_stderr)?))
        }
    }
}

fn start_process(name: &str, argv: &[String], ready: &str, on_stderr: bool) -> anyhow::Result<Child> {
    let mut command = Command::new(&argv[0]);
    for variable in crate::SUDO_VARIABLES {
        command.env_remove(variable);
    }
    command.args(&argv[1..]).stdin(Stdio::null());
    if on_stderr {
        command.stdout(Stdio::null()).stderr(Stdio::piped());
    } else {
        command.stdout(Stdio::piped()).stderr(Stdio::null());
    }
    let mut child = command.spawn().with_context(|| format!("starting {name}"))?;
    let stream: Box<dyn Read + Send> = if on_stderr {
        Box::new(child.stderr.take().context("the tool's stderr")?)
    } else {
        Box::new(child.stdout.take().context("the tool's stdout")?)
    };
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{name} ended before it said {ready:?}");
        }
        if line.contains(ready) {
            break;
        }
    }
    // The rest of its output is drained, so that it never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
    Ok(child)
}

/// Ends a tool as Ctrl-C would, so it writes its results, and waits for it.
fn stop_tool(name: &str, mut child: Child) -> anyhow::Result<()> {
    // SAFETY: kill has no memory preconditions; the pid is our child's, not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait()?;
    if !status.success() && status.code() != Some(130) {
        bail!("{name} ended with {status}");
    }
    Ok(())
}

/// Runs a workload to its end and returns its `ns_per_call`.
fn run_workload(argv: &[String]) -> anyhow::Result<f64> {
    let output = Command::new(&argv[0]).args(&argv[1..]).stdin(Stdio::null()).output()?;
    if !output.status.success() {
        bail!("{} failed: {}", argv.join(" "), String::from_utf8_lossy(&output.stderr));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .find_map(|line| line.strip_prefix("ns_per_call=")?.trim().parse().ok())
        .with_context(|| format!("{} printed no ns_per_call: {stdout}", argv.join(" ")))
}
