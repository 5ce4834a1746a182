//! What tracing one process costs every other process on the machine: `sysprof trace --pid`
//! of a sleeping process (all default families) beside bpftrace doing the same job with a pid
//! filter, while workloads that are not the target make system calls, switch and fault.
//!
//! The syscall and switch workloads spread their work over every CPU in turn (bpftrace's
//! tracepoints cost more on CPU 0, where its perf event lives, than elsewhere).
//! Each round runs a bare block, then each tool in turn (alternating order), then a bare block
//! again: a tool's block starts it, waits until it says it is attached, runs every workload
//! `REPEATS` times and stops it. A tool's figure in a round is its block's less the bare figure
//! drawn between the round's two bare blocks at the block's place, and its row the median of
//! those. The rows are tens of nanoseconds on a 3 us round trip, and on a shared VM the bare
//! round trip moves by half over seconds (2,197 to 4,395 ns within one 10 s round here): short
//! blocks, each between bare ones, keep most of that out. Rounds of 12 s, one tool each and
//! compared by their medians, once put sysprof's round trip at +1,538 ns, 1.15x bpftrace's,
//! with the kernel's statistics putting its programs some 105 ns over empty ones.
//! Empty programs on the tracepoints sysprof shares with every process, and on every CPU's
//! page-fault events at sysprof's periods (`floor.rs`), are measured the same way: the
//! kernel's part of the cost, which no program there goes under.

use std::{
    io::{BufRead as _, BufReader, Read},
    process::{Child, Command, Stdio},
};

use anyhow::{Context as _, bail};

use super::{
    Background, Runner, build_workload,
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
/// large as what the tools add to it. Each run is short (25-40 ms): a block takes about 0.5 s.
const REPEATS: usize = 5;

/// A pause after a tool attaches and after it is gone, for the kernel's own work on its
/// programs and maps (their freeing, deferred to workers) to end before anything is timed.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(250);

/// The fewest rounds: each takes about 6.5 s with the tools' starts and the pauses.
const MIN_ROUNDS: usize = 15;

impl Runner<'_> {
    pub(super) fn others(&self) -> anyhow::Result<()> {
        let sysload = build_workload(self.root, self.out, "sysload")?.display().to_string();
        let memload = build_workload(self.root, self.out, "memload")?.display().to_string();
        let workloads = [
            Workload {
                row: "other processes: ns added per getppid",
                unit: "ns per syscall",
                argv: vec![sysload.clone(), "getppid".into(), "200000".into(), "spread".into()],
            },
            Workload {
                row: "other processes: ns added per round trip (2 switches)",
                unit: "ns per round trip",
                argv: vec![sysload.clone(), "pingpong".into(), "10000".into(), "spread".into()],
            },
            Workload {
                row: "other processes: ns added per page fault",
                unit: "ns per fault",
                argv: vec![memload, "touch".into(), "20000".into()],
            },
        ];
        // The target: a process that sleeps through every round.
        let target = Background::spawn(Command::new(&sysload).args(["stamps", "3600000"]))?;
        self.measure_others(&workloads, target.id())
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
        let rounds = self.runs.max(MIN_ROUNDS);
        println!(
            "\nother processes: sysprof trace --pid {pid} (a sleeping process, default families) and bpftrace \
             with /pid == {pid}/, while other processes work; {rounds} rounds, each tool between two bare \
             blocks, medians of the differences"
        );
        let (empty, sysprof, bpftrace) = (1, 2, 3);
        // values[tool][workload]: each round's figure, bare's its two blocks' mean; added[tool]
        // [workload]: each round's figure less the bare one at its place in the round.
        let mut values = vec![vec![Vec::new(); workloads.len()]; tools.len()];
        let mut added = vec![vec![Vec::new(); workloads.len()]; tools.len()];
        for round in 0..rounds {
            let mut order: Vec<usize> = (1..tools.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            let before = run_block(&tools[0], workloads)?;
            let mut traced = Vec::new();
            for &index in &order {
                traced.push((index, run_block(&tools[index], workloads)?));
            }
            let after = run_block(&tools[0], workloads)?;
            // The bare blocks are places 0 and n + 1 of the round, the tools 1..=n between them:
            // a drift of the machine that is steady over the round cancels.
            let places = (traced.len() + 1) as f64;
            for (place, (index, figures)) in traced.into_iter().enumerate() {
                let share = (place + 1) as f64 / places;
                for (w, figure) in figures.into_iter().enumerate() {
                    let bare = before[w] + (after[w] - before[w]) * share;
                    added[index][w].push(figure - bare);
                    values[index][w].push(figure);
                }
            }
            for w in 0..workloads.len() {
                values[0][w].push((before[w] + after[w]) / 2.0);
            }
            eprint!("\rbench: round {}/{rounds}", round + 1);
        }
        eprintln!();
        // Round by round, before the medians sort the values: sysprof and the empty programs
        // ran next to each other in every round.
        let above_floor: Vec<f64> =
            (0..workloads.len()).map(|w| paired_median(&values[sysprof][w], &values[empty][w])).collect();
        let bares: Vec<f64> = values[0].iter_mut().map(|v| median(v)).collect();
        // Bare's own list is empty: nothing is taken from it.
        let added: Vec<Vec<f64>> = added
            .iter_mut()
            .map(|per_tool| per_tool.iter_mut().map(|v| if v.is_empty() { 0.0 } else { median(v) }).collect())
            .collect();
        for (w, (workload, above_floor)) in workloads.iter().zip(above_floor).enumerate() {
            let bare = bares[w];
            let added = |tool: usize| (tool < tools.len()).then(|| added[tool][w]);
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

/// Ends a tool as Ctrl-C would, so it writes its results, and waits for it. The signal is sent
/// again each second it lives on: bpftrace (0.17) can miss one that comes just after its BEGIN
/// probe ran, before it waits on its buffers, and would then run on forever.
fn stop_tool(name: &str, mut child: Child) -> anyhow::Result<()> {
    for _ in 0..10 {
        // SAFETY: kill has no memory preconditions; the pid is our child's, not yet reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        for _ in 0..20 {
            if let Some(status) = child.try_wait()? {
                if !status.success() && status.code() != Some(130) {
                    bail!("{name} ended with {status}");
                }
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    bail!("{name} did not end within 10 s of Ctrl-C")
}

/// Attaches `tool`, runs each workload `REPEATS` times, keeping the fastest, and detaches it.
fn run_block(tool: &Tool, workloads: &[Workload]) -> anyhow::Result<Vec<f64>> {
    let attached = start_tool(tool)?;
    std::thread::sleep(SETTLE);
    let mut fastest = vec![f64::INFINITY; workloads.len()];
    for (w, workload) in workloads.iter().enumerate() {
        for _ in 0..REPEATS {
            fastest[w] = fastest[w].min(run_workload(&workload.argv)?);
        }
    }
    match attached {
        Attached::Nothing => {}
        Attached::Process(child) => stop_tool(tool.name, child)?,
        // Detached and unloaded as their fds close.
        Attached::Programs(programs) => drop(programs),
    }
    std::thread::sleep(SETTLE);
    Ok(fastest)
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
