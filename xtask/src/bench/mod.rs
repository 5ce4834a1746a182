//! `cargo xtask bench`: sysprof's cost on a workload, measured side by side with the peer tools
//! (perf, bpftrace) in one run. Configurations alternate round by round, so a noisy machine
//! slows all of them alike; figures are medians, compared as ratios.
//!
//! The workloads time themselves (`elapsed_ns=N` or `ns_per_call=X` on stdout), so a tool's
//! start-up and its writing of results are not counted as slowdown of the target; the whole
//! command's wall time is shown beside it.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, bail};

mod floor;
mod footprint;
mod others;
mod realistic;

pub(crate) use floor::run_with_empty_programs;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Which benchmark (all of them, and the summary table, by default)
    #[arg(value_enum, default_value_t = Bench::All)]
    bench: Bench,
    /// Rounds (each runs every configuration once)
    #[arg(long, default_value_t = 5)]
    runs: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Bench {
    /// A CPU-bound workload on every CPU: no tracing, sysprof and `perf record -g` at 99 and 999 Hz
    Cpu,
    /// A getppid loop: ns added per syscall by sysprof's syscall tracing and by the bpftrace
    /// equivalent (raw_syscalls enter/exit, latency histogram by syscall id)
    Syscalls,
    /// Pipe ping-pong between two processes on one CPU: ns added per round trip (two context
    /// switches) by sysprof's scheduler tracing and by bpftrace on sched_switch
    Sched,
    /// A function called in a loop: ns added per call by a sysprof probe (`--func`, the
    /// machinery of the CUDA/NCCL probes) and by bpftrace uprobe+uretprobe timing the calls
    /// by user stack (and, shown beside it, in one histogram)
    Uprobe,
    /// A malloc/free loop: ns added per pair by sysprof's heap probes (`--malloc`), by its memory
    /// family without them, and by bpftrace doing the same job (uprobe+uretprobe on malloc, size
    /// by stack, live blocks, uprobe on free)
    Malloc,
    /// A loop of cudaMemcpy (NVIDIA's real libcudart, no GPU: each call fails at once): ns
    /// added per call by sysprof's GPU probes (arguments, time and site of every call, each sent
    /// to userspace as an event) and by bpftrace timing the same calls by kind and user stack
    GpuCalls,
    /// Fresh pages touched one by one: ns added per page fault by sysprof's fault counting
    /// (exact counts, 1 stack in 8) and by bpftrace counting faults by user stack
    Faults,
    /// Code built without frame pointers: slowdown at 99 and 999 Hz with sysprof's unwinder,
    /// with frame pointers only, and with `perf record --call-graph dwarf`; the cost of one
    /// sample; the unwind tables of libc, python and libnccl (size, build and cached read
    /// time); start to attached for a running Python process
    Unwind,
    /// Start and end: from launching `TOOL -- CMD` to the command's first instruction, and
    /// from the command's exit to the tool's (results written), for a 10 s command, with
    /// sysprof's default families and with `perf record -g`; and `--pid` to attached
    Start,
    /// A CPU-bound pure-Python script (tests/workloads/python_app.py bench): slowdown at 99 and
    /// 999 Hz with sysprof (Python frames and native ones) and with py-spy at the same rate
    Python,
    /// What tracing one process (`--pid` of a sleeping one) adds to every other process's
    /// syscalls, context switches and page faults, beside bpftrace with a pid filter and beside
    /// the floor: empty programs and events where sysprof's are
    Others,
    /// Peak RSS and CPU time of the tool itself for a 10 s trace of the whole machine, beside
    /// `perf record -a -g` + `perf script`
    Footprint,
    /// `xz -9` and `make -j2` of a small C project, bare and under sysprof's default run:
    /// slowdown, and BPF time as a share of the CPU time available
    Realistic,
    /// All of the above
    All,
}

/// One way to run the workload.
struct Config {
    name: String,
    argv: Vec<String>,
}

/// Medians of one configuration.
struct Measured {
    name: String,
    /// What the workload reports of itself (ns in all, or ns per operation).
    metric: f64,
    /// The whole command, the tool's start-up and results included.
    wall_ns: f64,
    /// Every run's figure, in the order they ran.
    runs: Vec<f64>,
}

/// The configuration with empty programs where sysprof's are (`floor.rs`).
const EMPTY_PROGRAMS: &str = "empty programs";

/// `workload` run by `cargo xtask empty-programs` (this program), with empty programs on the
/// entries of `entries` and the returns of `returns` (`PATH:SYMBOL`) and on `tracepoints`.
fn empty_programs_config(
    entries: &[&str],
    returns: &[&str],
    tracepoints: &[&str],
    workload: &[String],
) -> anyhow::Result<Config> {
    let mut argv = vec![std::env::current_exe()?.display().to_string(), "empty-programs".into()];
    for entry in entries {
        argv.extend(["--entry".into(), entry.to_string()]);
    }
    for ret in returns {
        argv.extend(["--return".into(), ret.to_string()]);
    }
    for tracepoint in tracepoints {
        argv.extend(["--tracepoint".into(), tracepoint.to_string()]);
    }
    argv.push("--".into());
    argv.extend(workload.iter().cloned());
    Ok(Config { name: EMPTY_PROGRAMS.into(), argv })
}

/// The floor under sampling at `hz`: `workload` with an empty program on a CPU-clock event at
/// `hz` on every CPU, as sysprof samples (`floor.rs`).
fn sampling_floor_config(hz: &str, workload: &[String]) -> anyhow::Result<Config> {
    let mut argv = vec![std::env::current_exe()?.display().to_string(), "empty-programs".into()];
    argv.extend(["--sample-hz".into(), hz.to_string(), "--".into()]);
    argv.extend(workload.iter().cloned());
    Ok(Config { name: sampling_floor_name(hz), argv })
}

fn sampling_floor_name(hz: &str) -> String {
    format!("{EMPTY_PROGRAMS} {hz} Hz")
}

/// Rounds of the kernel-timed runs beside a row (`Runner::program_time_row`): the kernel's
/// statistics are exact sums, so a few runs settle them.
const PROGRAM_TIME_RUNS: usize = 3;

/// bpftrace doing less than sysprof's job where a row shows it beside the peer that does the
/// job: timing calls in one histogram, where sysprof keeps them by call site and stack.
const BPFTRACE_NO_STACKS: &str = "bpftrace, no stacks";

/// bpftrace's equivalent of sysprof's syscall tracing: latency histogram per syscall id.
const BPFTRACE_SYSCALLS: &str = "\
tracepoint:raw_syscalls:sys_enter /pid == cpid/ { @start[tid] = nsecs; }
tracepoint:raw_syscalls:sys_exit /@start[tid]/ { @lat[args->id] = hist(nsecs - @start[tid]); delete(@start[tid]); }
";

/// bpftrace on sched_switch doing sysprof's job for the ping-pong: switches by thread and by
/// kernel and user stack at switch-out, off-CPU time per thread.
const BPFTRACE_SCHED: &str = "\
tracepoint:sched:sched_switch {
  if (args->prev_comm == \"sysload\") { @switches[args->prev_pid, kstack, ustack] = count(); @start[args->prev_pid] = nsecs; }
  if (args->next_comm == \"sysload\" && @start[args->next_pid]) {
    @offcpu[args->next_pid] = sum(nsecs - @start[args->next_pid]); delete(@start[args->next_pid]);
  }
}
";

/// bpftrace on `function` (`PATH:cudaMemcpy`) doing the part of sysprof's job it can keep in
/// maps: each copy's time by kind and user stack, bytes by kind, failures. sysprof also sends
/// every call, with its arguments, to userspace (the timeline, the copies' analysis): the
/// bpftrace script that does that too (a printf a call) cost more here, 4.1-5.2 us a call
/// against 2.3-3.3.
fn bpftrace_gpu_calls(function: &str) -> String {
    format!(
        "uprobe:{function} /pid == cpid/ {{ @start[tid] = nsecs; @bytes[tid] = arg2; @kind[tid] = arg3; }}\n\
         uretprobe:{function} /@start[tid]/ {{\n\
         \x20 @time[@kind[tid], ustack] = hist(nsecs - @start[tid]); @moved[@kind[tid]] = sum(@bytes[tid]);\n\
         \x20 if (retval != 0) {{ @failed = count(); }}\n\
         \x20 delete(@start[tid]); delete(@bytes[tid]); delete(@kind[tid]);\n\
         }}\n"
    )
}

pub fn run(root: &Path, sysprof: &Path, args: &BenchArgs) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the benchmark loads BPF programs: run it as root (sudo -E env PATH=$PATH cargo xtask bench)");
    }
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out)?;
    // The kernel's run-time statistics put two clock reads on every program run, bpftrace's
    // and the floors' as much as sysprof's: off for the timed runs (a run with them on read
    // 55-65 ns more per getppid for every tool, and floors 2.5x as high).
    let stats = BpfStats::set(false)?;
    if stats.was_on() {
        eprintln!("bench: kernel.bpf_stats_enabled was 1: off while the bench runs, then back on");
    }
    let runner = Runner { root, sysprof, out: &out, runs: args.runs, rows: Default::default() };
    // A part runs on this runner (its lifetime, which `Part<'_>` infers).
    type Part<'r> = fn(&Runner<'r>) -> anyhow::Result<()>;
    let sections: [(Bench, Part<'_>); 13] = [
        (Bench::Cpu, Runner::cpu),
        (Bench::Syscalls, Runner::syscalls),
        (Bench::Sched, Runner::sched),
        (Bench::Uprobe, Runner::uprobe),
        (Bench::Malloc, Runner::malloc),
        (Bench::GpuCalls, Runner::gpu_calls),
        (Bench::Faults, Runner::faults),
        (Bench::Unwind, Runner::unwind),
        (Bench::Start, Runner::start_end),
        (Bench::Python, Runner::python),
        (Bench::Others, Runner::others),
        (Bench::Footprint, Runner::footprint),
        (Bench::Realistic, Runner::realistic),
    ];
    // What each part took: the whole bench's time is one of the issue's figures.
    let started = Instant::now();
    let mut took = Vec::new();
    for (bench, section) in sections {
        if args.bench == Bench::All || args.bench == bench {
            let start = Instant::now();
            section(&runner)?;
            // The part's name as the command line spells it.
            let name = clap::ValueEnum::to_possible_value(&bench).map(|value| value.get_name().to_string());
            took.push(format!("{} {:.0} s", name.unwrap_or_default(), start.elapsed().as_secs_f64()));
        }
    }
    print_summary(&runner.rows.borrow());
    let total = started.elapsed().as_secs_f64();
    println!("\nbench: {:.0} min {:.0} s in all ({})", (total / 60.0).floor(), total % 60.0, took.join(", "));
    Ok(())
}

/// A process the bench runs beside its workloads (a target that sleeps, the machine's load),
/// ended when dropped: on an error or a panic too, so that none outlives the bench.
pub(super) struct Background(std::process::Child);

impl Background {
    pub(super) fn spawn(command: &mut Command) -> anyhow::Result<Self> {
        Ok(Background(command.stdout(Stdio::null()).spawn()?))
    }

    pub(super) fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `kernel.bpf_stats_enabled` set while held, then back to what it was.
pub(super) struct BpfStats(String);

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    pub(super) fn set(on: bool) -> anyhow::Result<Self> {
        let before = std::fs::read_to_string(BPF_STATS).with_context(|| format!("reading {BPF_STATS}"))?;
        std::fs::write(BPF_STATS, if on { "1" } else { "0" })
            .with_context(|| format!("writing {BPF_STATS}"))?;
        Ok(BpfStats(before.trim().to_string()))
    }

    fn was_on(&self) -> bool {
        self.0 == "1"
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(BPF_STATS, &self.0);
    }
}

/// One line of the summary: a measure, sysprof's figure beside the peer's, and the goal.
struct Row {
    row: String,
    bare: String,
    sysprof: String,
    peer: String,
    /// sysprof's figure over the peer's.
    ratio: Option<f64>,
    goal: String,
    holds: Holds,
}

/// `cost` over the peer's added cost `theirs`, when the peer ran and added some.
fn ratio_to(cost: f64, theirs: Option<f64>) -> Option<f64> {
    theirs.filter(|t| *t > 0.0).map(|theirs| cost.max(0.0) / theirs)
}

/// The median over rounds of `ours` minus `floor` in the same round (both in the order the
/// rounds ran): what sysprof adds over the floor, with less of the noise between rounds in it.
fn paired_median(ours: &[f64], floor: &[f64]) -> f64 {
    let mut differences: Vec<f64> = ours.iter().zip(floor).map(|(o, f)| o - f).collect();
    median(&mut differences)
}

/// The verdict on an added cost (`Runner::added_row_of`): the ratios of sysprof's figure and,
/// where there is one, of the floor's to the peer's.
fn over_floor(ratio: Option<f64>, floor_ratio: Option<f64>, goal: f64) -> Holds {
    match (ratio, floor_ratio) {
        (None, _) => Holds::Unjudged,
        (Some(r), _) if r <= goal => Holds::Yes,
        (_, Some(floor)) if floor > goal => Holds::FloorOver,
        _ => Holds::No,
    }
}

/// Whether a row's goal holds.
enum Holds {
    Yes,
    No,
    /// The goal's ratio is missed, and empty programs where sysprof's run (the floor,
    /// `floor.rs`) missed it too: in this run no program there could have met it.
    FloorOver,
    /// Nothing to judge against (the peer did not run).
    Unjudged,
}

impl From<Option<bool>> for Holds {
    fn from(holds: Option<bool>) -> Self {
        match holds {
            Some(true) => Holds::Yes,
            Some(false) => Holds::No,
            None => Holds::Unjudged,
        }
    }
}

fn print_summary(rows: &[Row]) {
    if rows.is_empty() {
        return;
    }
    println!("\nsummary (medians; ratio = sysprof / peer)");
    println!("| row | bare | sysprof | peer | ratio | goal | holds |");
    println!("|---|---|---|---|---|---|---|");
    for row in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            row.row,
            row.bare,
            row.sysprof,
            row.peer,
            row.ratio.map_or("-".into(), |r| format!("{r:.3}")),
            row.goal,
            match row.holds {
                Holds::Yes => "yes",
                Holds::No => "NO",
                Holds::FloorOver => "NO, nor the floor",
                Holds::Unjudged => "-",
            }
        );
    }
}

struct Runner<'a> {
    root: &'a Path,
    sysprof: &'a Path,
    out: &'a Path,
    runs: usize,
    rows: std::cell::RefCell<Vec<Row>>,
}

impl Runner<'_> {
    fn cpu(&self) -> anyhow::Result<()> {
        let busy = build_workload(self.root, self.out, "busy")?;
        let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).to_string();
        let workload = vec![busy.display().to_string(), "--work".into(), "5000".into(), threads.clone()];
        let have_perf = tool_works("perf", &["--version"]);
        let mut configs = vec![Config { name: "bare".into(), argv: workload.clone() }];
        for hz in ["99", "999"] {
            configs.push(self.sysprof_config(
                &format!("sysprof {hz} Hz"),
                &["--focus", "cpu", "-F", hz],
                &workload,
            ));
            configs.push(sampling_floor_config(hz, &workload)?);
            if have_perf {
                let data = self.out.join(format!("perf-{hz}.data")).display().to_string();
                let mut perf: Vec<String> =
                    ["perf", "record", "-q", "-g", "-e", "cpu-clock", "-F", hz, "-o", &data, "--"]
                        .map(String::from)
                        .into();
                perf.extend(workload.iter().cloned());
                configs.push(Config { name: format!("perf record -g {hz} Hz"), argv: perf });
            }
        }
        if !have_perf {
            eprintln!(
                "bench: perf is not installed (apt-get install linux-perf): comparing with no tracing only"
            );
        }
        println!("\ncpu: busy --work 5000 on {threads} threads (every CPU), {} rounds, medians", self.runs);
        let measured = measure(&configs, self.runs, "elapsed_ns")?;
        print_table(&measured, "workload", |m| format!("{:.3} s", m / 1e9));
        let bare = measured[0].metric;
        for hz in ["99", "999"] {
            if let (Some(ours), Some(perf)) = (
                find(&measured, &format!("sysprof {hz} Hz")),
                find(&measured, &format!("perf record -g {hz} Hz")),
            ) {
                println!(
                    "{hz} Hz: sysprof {:.4}x no tracing, perf record -g {:.4}x; sysprof/perf {:.4}",
                    ours / bare,
                    perf / bare,
                    ours / perf
                );
                self.slowdown_row(
                    &format!("on-CPU sampling at {hz} Hz, CPU-bound"),
                    &measured,
                    ours,
                    "perf record -g",
                    perf,
                    Some(&sampling_floor_name(hz)),
                );
            }
        }
        Ok(())
    }

    fn syscalls(&self) -> anyhow::Result<()> {
        let sysload = build_workload(self.root, self.out, "sysload")?;
        // Spread over every CPU in turn: bpftrace's tracepoints cost more on CPU 0, where its
        // perf event lives, than elsewhere.
        let workload =
            vec![sysload.display().to_string(), "getppid".into(), "2000000".into(), "spread".into()];
        let mut configs = vec![
            Config { name: "bare".into(), argv: workload.clone() },
            self.sysprof_config("sysprof", &["--focus", "syscalls"], &workload),
            self.sysprof_config(
                "sysprof --time-every-syscall",
                &["--focus", "syscalls", "--time-every-syscall"],
                &workload,
            ),
            // The slow path every syscall takes once the syscall tracepoints have programs,
            // whatever they do: bpftrace's are on the same tracepoints.
            empty_programs_config(&[], &[], &["sys_enter", "sys_exit"], &workload)?,
        ];
        configs.extend(self.bpftrace_config(BPFTRACE_SYSCALLS, &workload)?);
        println!("\nsyscalls: getppid x 2,000,000 (spread over the CPUs), {} rounds, medians", self.runs);
        let measured = measure(&configs, self.runs, "ns_per_call")?;
        print_added(&measured, "ns per syscall");
        self.added_row(&measured, "sysprof", "syscalls: ns added per getppid", 0.2);
        self.floor_row(&measured, "sysprof", "syscalls: ns added per getppid");
        self.program_time_row(&configs, "sysprof", "syscalls: ns added per getppid", 0.2)
    }

    fn sched(&self) -> anyhow::Result<()> {
        let sysload = build_workload(self.root, self.out, "sysload")?;
        // Both processes on one CPU, each CPU in turn: a cross-CPU wakeup costs tens of
        // microseconds in a VM, which would drown what the tools add to a switch, and bpftrace's
        // tracepoint costs more on CPU 0 than elsewhere.
        let workload =
            vec![sysload.display().to_string(), "pingpong".into(), "100000".into(), "spread".into()];
        let mut configs = vec![
            Config { name: "bare".into(), argv: workload.clone() },
            self.sysprof_config("sysprof --focus sched", &["--focus", "sched"], &workload),
        ];
        configs.extend(self.bpftrace_config(BPFTRACE_SCHED, &workload)?);
        println!(
            "\nsched: pipe ping-pong on one CPU (each in turn) x 100,000 round trips (2 switches each), {} rounds, \
             medians",
            self.runs
        );
        let measured = measure(&configs, self.runs, "ns_per_call")?;
        print_added(&measured, "ns per round trip");
        self.added_row(&measured, "sysprof --focus sched", "context switches: ns added per round trip", 0.5);
        Ok(())
    }

    fn uprobe(&self) -> anyhow::Result<()> {
        let sysload = build_workload(self.root, self.out, "sysload")?;
        let binary = sysload.display().to_string();
        let workload = vec![binary.clone(), "probecall".into(), "100000".into()];
        let func = format!("{binary}:probed_function");
        let mut configs = vec![
            Config { name: "bare".into(), argv: workload.clone() },
            self.sysprof_config("sysprof --func", &["--focus", "gpu", "--func", &func], &workload),
            empty_programs_config(&[&func], &[&func], &[], &workload)?,
        ];
        // sysprof's job: each call's time by where it was called from (its user stack), as
        // the heap and GPU rows' bpftrace keeps it.
        let script = format!(
            "uprobe:{binary}:probed_function {{ @start[tid] = nsecs; }}\n\
             uretprobe:{binary}:probed_function /@start[tid]/ {{ @lat[ustack] = hist(nsecs - @start[tid]); delete(@start[tid]); }}\n"
        );
        configs.extend(self.bpftrace_config(&script, &workload)?);
        // Less than sysprof's job, shown beside it: one histogram of every call's time.
        let one_histogram = format!(
            "uprobe:{binary}:probed_function {{ @start[tid] = nsecs; }}\n\
             uretprobe:{binary}:probed_function /@start[tid]/ {{ @lat = hist(nsecs - @start[tid]); delete(@start[tid]); }}\n"
        );
        configs.extend(
            self.bpftrace_config(&one_histogram, &workload)?
                .map(|config| Config { name: BPFTRACE_NO_STACKS.into(), ..config }),
        );
        println!("\nuprobe: probed_function x 100,000, {} rounds, medians", self.runs);
        let measured = measure(&configs, self.runs, "ns_per_call")?;
        print_added(&measured, "ns per call");
        let row = "uprobe: ns added per probed call";
        self.added_row(&measured, "sysprof --func", row, 1.0);
        self.floor_row(&measured, "sysprof --func", row);
        self.lesser_peer_row(&measured, "sysprof --func", row);
        self.program_time_row(&configs, "sysprof --func", row, 1.0)
    }

    fn malloc(&self) -> anyhow::Result<()> {
        let memload = build_workload(self.root, self.out, "memload")?;
        let workload = vec![memload.display().to_string(), "mallocs".into(), "200000".into()];
        let libc = own_libc().context("finding libc.so.6 in xtask's own memory map")?;
        let mut configs = vec![
            Config { name: "bare".into(), argv: workload.clone() },
            self.sysprof_config("sysprof --focus memory", &["--focus", "memory"], &workload),
            self.sysprof_config("sysprof --malloc", &["--focus", "memory", "--malloc"], &workload),
            // At the functions' first instructions, where bpftrace's are. sysprof probes free at
            // the conditional jump after its test, which the kernel emulates (the test it would
            // step out of line: uprobes::entry_point), so it can go under this floor.
            empty_programs_config(
                &[&format!("{libc}:malloc"), &format!("{libc}:free")],
                &[&format!("{libc}:malloc")],
                &[],
                &workload,
            )?,
        ];
        let script = format!(
            "uprobe:{libc}:malloc /pid == cpid/ {{ @size[tid] = arg0; }}\n\
             uretprobe:{libc}:malloc /@size[tid]/ {{ @bytes[ustack] = sum(@size[tid]); @live[retval] = @size[tid]; \
             delete(@size[tid]); }}\n\
             uprobe:{libc}:free /pid == cpid/ {{ delete(@live[arg0]); }}\n"
        );
        configs.extend(self.bpftrace_config(&script, &workload)?);
        println!("\nmalloc: malloc(64)/free pairs x 200,000, {} rounds, medians", self.runs);
        let measured = measure(&configs, self.runs, "ns_per_call")?;
        print_added(&measured, "ns per malloc/free pair");
        self.added_row(&measured, "sysprof --malloc", "heap: ns added per malloc/free", 1.0);
        self.floor_row(&measured, "sysprof --malloc", "heap: ns added per malloc/free");
        self.program_time_row(&configs, "sysprof --malloc", "heap: ns added per malloc/free", 1.0)
    }

    fn gpu_calls(&self) -> anyhow::Result<()> {
        let libs = match crate::nvidia::ensure() {
            Ok(libs) => libs,
            Err(error) => {
                eprintln!("bench: NVIDIA's libraries are not here ({error:#}): no GPU calls row");
                return Ok(());
            }
        };
        let gpu_app = build_gpu_app(self.root, self.out, &libs)?;
        let workload = vec![gpu_app.display().to_string(), "pageable".into(), "300000".into()];
        let memcpy = format!("{}:cudaMemcpy", libs.join("libcudart.so.12").display());
        let mut configs = vec![
            Config { name: "bare".into(), argv: workload.clone() },
            self.sysprof_config("sysprof --focus gpu", &["--focus", "gpu"], &workload),
            empty_programs_config(&[&memcpy], &[&memcpy], &[], &workload)?,
        ];
        configs.extend(self.bpftrace_config(&bpftrace_gpu_calls(&memcpy), &workload)?);
        println!(
            "\ngpu calls: cudaMemcpy x 300,000 (NVIDIA's libcudart, no GPU), {} rounds, medians",
            self.runs
        );
        let measured = measure(&configs, self.runs, "ns_per_call")?;
        print_added(&measured, "ns per call");
        let row = "GPU calls: ns added per cudaMemcpy";
        self.added_row(&measured, "sysprof --focus gpu", row, 1.0);
        self.floor_row(&measured, "sysprof --focus gpu", row);
        self.program_time_row(&configs, "sysprof --focus gpu", row, 1.0)
    }

    fn faults(&self) -> anyhow::Result<()> {
        let memload = build_workload(self.root, self.out, "memload")?;
        let workload = vec![memload.display().to_string(), "touch".into(), "200000".into()];
        let mut configs = vec![
            Config { name: "bare".into(), argv: workload.clone() },
            self.sysprof_config("sysprof --focus memory", &["--focus", "memory"], &workload),
        ];
        configs.extend(
            self.bpftrace_config(
                "software:page-faults:1 /pid == cpid/ { @[ustack] = count(); }\n",
                &workload,
            )?,
        );
        println!(
            "\nfaults: 200,000 fresh pages touched (one minor fault each), {} rounds, medians",
            self.runs
        );
        let measured = measure(&configs, self.runs, "ns_per_call")?;
        print_added(&measured, "ns per page fault");
        self.added_row(&measured, "sysprof --focus memory", "page faults: ns added per fault", 1.0);
        Ok(())
    }

    fn unwind(&self) -> anyhow::Result<()> {
        let program = build_workload_with(self.root, self.out, "unwind", &["-O2", "-fomit-frame-pointer"])?;
        // 500 rounds: 2.9 s bare here. At 1500 (9.1 s) this part took 7 of the bench's 20 minutes
        // for bare runs that strayed 2.03% at most.
        let workload = vec![program.display().to_string(), "work".into(), "500".into()];
        let have_perf = tool_works("perf", &["--version"]);
        let mut configs = vec![Config { name: "bare".into(), argv: workload.clone() }];
        for hz in ["99", "999"] {
            configs.push(self.sysprof_config(
                &format!("sysprof {hz} Hz"),
                &["--focus", "cpu", "-F", hz],
                &workload,
            ));
            configs.push(self.sysprof_config(
                &format!("sysprof frame pointers {hz} Hz"),
                &["--focus", "cpu", "-F", hz, "--unwind-memory", "0"],
                &workload,
            ));
            configs.push(sampling_floor_config(hz, &workload)?);
            if have_perf {
                let data = self.out.join(format!("perf-dwarf-{hz}.data")).display().to_string();
                let mut perf: Vec<String> = [
                    "perf",
                    "record",
                    "-q",
                    "--call-graph",
                    "dwarf",
                    "-e",
                    "cpu-clock",
                    "-F",
                    hz,
                    "-o",
                    &data,
                    "--",
                ]
                .map(String::from)
                .into();
                perf.extend(workload.iter().cloned());
                configs.push(Config { name: format!("perf --call-graph dwarf {hz} Hz"), argv: perf });
            }
        }
        println!(
            "\nunwind: main -> level1 -> level2 -> level3 -> leaf_spin x 500, built -O2 -fomit-frame-pointer, \
             {} rounds, medians",
            self.runs
        );
        let measured = measure(&configs, self.runs, "elapsed_ns")?;
        print_table(&measured, "workload", |m| format!("{:.3} s", m / 1e9));
        let bare = measured[0].metric;
        for hz in ["99", "999"] {
            let ratio = |name: &str| find(&measured, name).map(|m| m / bare);
            let cost = |name: &str| sample_cost_ns(&self.out.join(name.replace([' ', '-'], "_")));
            let ours = format!("sysprof {hz} Hz");
            let fp = format!("sysprof frame pointers {hz} Hz");
            println!(
                "{hz} Hz: sysprof (tables) {}x no tracing, {} ns per sample; frame pointers only {}x, {} ns per \
                 sample; perf --call-graph dwarf {}x; empty programs on the same sampling events {}x",
                show(ratio(&ours)),
                show(cost(&ours)),
                show(ratio(&fp)),
                show(cost(&fp)),
                show(ratio(&format!("perf --call-graph dwarf {hz} Hz"))),
                show(ratio(&sampling_floor_name(hz))),
            );
            if let (Some(ours), Some(perf)) =
                (find(&measured, &ours), find(&measured, &format!("perf --call-graph dwarf {hz} Hz")))
            {
                let row = format!("unwinding without frame pointers at {hz} Hz");
                self.slowdown_row(
                    &row,
                    &measured,
                    ours,
                    "perf --call-graph dwarf",
                    perf,
                    Some(&sampling_floor_name(hz)),
                );
            }
        }

        // The tables of the libraries users unwind through.
        let mut files: Vec<String> = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/python3.11"]
            .into_iter()
            .filter(|f| Path::new(f).exists())
            .map(String::from)
            .collect();
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| "/root".into());
        let nccl = home.join(".cache/sysprof/nvidia/lib/libnccl.so.2");
        if nccl.exists() {
            files.push(nccl.display().to_string());
        }
        println!("\nunwind tables (sysprof tables):");
        let mut tables = Command::new(self.sysprof);
        crate::run(tables.arg("tables").args(&files))?;

        // Start to attached for a running Python process, its tables cached by a first run.
        if tool_works("python3", &["--version"]) {
            let python = Background::spawn(
                Command::new("python3").args(["-c", "import json, re, time; time.sleep(120)"]),
            )?;
            let pid = python.id().to_string();
            let starts = |options: &[&str]| -> anyhow::Result<f64> {
                let mut seconds = Vec::new();
                for _ in 0..self.runs.max(3) {
                    seconds.push(time_to_tracing(self.sysprof, &pid, options, self.out)?);
                }
                Ok(median(&mut seconds))
            };
            let (tables, fp) = (starts(&[])?, starts(&["--unwind-memory", "0"]));
            drop(python);
            println!(
                "start to attached, --pid of a running python3: {:.3} s with its tables cached, {:.3} s by frame \
                 pointers only",
                tables, fp?
            );
            self.seconds_row("--pid of python3 to attached, tables cached", tables, None, 0.5);
        }
        Ok(())
    }

    fn start_end(&self) -> anyhow::Result<()> {
        let sysload = build_workload(self.root, self.out, "sysload")?;
        let workload = vec![sysload.display().to_string(), "stamps".into(), "10000".into()];
        let mut configs = vec![self.sysprof_config("sysprof", &[], &workload)];
        if tool_works("perf", &["--version"]) {
            let data = self.out.join("perf-start.data").display().to_string();
            let mut perf: Vec<String> =
                ["perf", "record", "-q", "-g", "-o", &data, "--"].map(String::from).into();
            perf.extend(workload.iter().cloned());
            configs.push(Config { name: "perf record -g".into(), argv: perf });
        }
        // Each round is a 10 s command: three of them give a median.
        let rounds = self.runs.clamp(1, 3);
        println!("\nstart and end: sysload stamps 10000 (sleeps 10 s), {rounds} rounds, medians");
        let mut starts = vec![Vec::new(); configs.len()];
        let mut ends = vec![Vec::new(); configs.len()];
        for round in 0..rounds {
            let mut order: Vec<usize> = (0..configs.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for index in order {
                let (start, end) = start_and_end(&configs[index])?;
                starts[index].push(start);
                ends[index].push(end);
            }
            eprint!("\rbench: round {}/{rounds}", round + 1);
        }
        eprintln!();
        println!("{:<30} {:>22} {:>26}", "configuration", "start to command", "command exit to tool exit");
        let mut medians = Vec::new();
        for (i, config) in configs.iter().enumerate() {
            let (start, end) = (median(&mut starts[i]), median(&mut ends[i]));
            println!("{:<30} {:>20.3} s {:>24.3} s", config.name, start, end);
            medians.push((start, end));
        }
        for (row, goal, pick) in [
            ("start: launch to the command running", 0.2, 0),
            ("end: the command's exit to results written", 0.3, 1),
        ] {
            let of = |(start, end): (f64, f64)| if pick == 0 { start } else { end };
            let perf = medians.get(1).copied().map(|m| ("perf record -g", of(m)));
            self.seconds_row(row, of(medians[0]), perf, goal);
        }
        let sleeper = Background::spawn(Command::new(&sysload).args(["stamps", "120000"]))?;
        let pid = sleeper.id().to_string();
        let mut attached = Vec::new();
        for _ in 0..self.runs.max(3) {
            attached.push(time_to_tracing(self.sysprof, &pid, &[], self.out)?);
        }
        drop(sleeper);
        let attached = median(&mut attached);
        println!("sysprof --pid of a running process, start to attached: {attached:.3} s");
        self.seconds_row("start: --pid to attached", attached, None, 0.25);
        Ok(())
    }

    fn python(&self) -> anyhow::Result<()> {
        let python = python_interpreter().context("no python3.12 or python3 to run the workload")?;
        let script = self.root.join("tests/workloads/python_app.py");
        let workload = vec![python.clone(), script.display().to_string(), "bench".into(), "10000000".into()];
        let py_spy = tool_works("py-spy", &["--version"]);
        if !py_spy {
            eprintln!("bench: py-spy is not installed (python3 -m pip install py-spy): no py-spy comparison");
        }
        let mut configs = vec![Config { name: "bare".into(), argv: workload.clone() }];
        for hz in ["99", "999"] {
            configs.push(self.sysprof_config(
                &format!("sysprof {hz} Hz"),
                &["--focus", "cpu", "-F", hz],
                &workload,
            ));
            if py_spy {
                let raw = self.out.join(format!("py-spy-{hz}.txt")).display().to_string();
                let mut argv: Vec<String> =
                    ["py-spy", "record", "-r", hz, "-f", "raw", "-o", &raw, "--"].map(String::from).into();
                argv.extend(workload.iter().cloned());
                configs.push(Config { name: format!("py-spy {hz} Hz"), argv });
            }
        }
        println!("\npython: {python} pure-Python calls and arithmetic, {} rounds, medians", self.runs);
        let measured = measure(&configs, self.runs, "elapsed_ns")?;
        print_table(&measured, "workload", |m| format!("{:.3} s", m / 1e9));
        let bare = measured[0].metric;
        for hz in ["99", "999"] {
            let ratio = |name: &str| find(&measured, name).map(|m| m / bare);
            let ours = format!("sysprof {hz} Hz");
            println!(
                "{hz} Hz: sysprof {}x no tracing, {} ns per sample; py-spy {}x",
                show(ratio(&ours)),
                show(sample_cost_ns(&self.out.join(ours.replace([' ', '-'], "_")))),
                show(ratio(&format!("py-spy {hz} Hz"))),
            );
            if let (Some(ours), Some(peer)) =
                (find(&measured, &ours), find(&measured, &format!("py-spy {hz} Hz")))
            {
                self.slowdown_row(
                    &format!("Python stacks at {hz} Hz"),
                    &measured,
                    ours,
                    "py-spy",
                    peer,
                    None,
                );
            }
        }
        Ok(())
    }

    /// A summary row of a time sysprof takes (its start, its end), beside the peer's when there
    /// is one; the goal: under `limit` seconds.
    fn seconds_row(&self, row: &str, seconds: f64, peer: Option<(&str, f64)>, limit: f64) {
        self.rows.borrow_mut().push(Row {
            row: row.into(),
            bare: "-".into(),
            sysprof: format!("{seconds:.3} s"),
            peer: peer.map_or("-".into(), |(name, p)| format!("{name} {p:.3} s")),
            ratio: peer.map(|(_, p)| seconds / p),
            goal: format!("< {limit} s"),
            holds: Some(seconds < limit).into(),
        });
    }

    /// A summary row of what the workload took: bare (`measured[0]`), under sysprof and under
    /// the peer. The goal: sysprof slows it no more than the peer does, or no more than the
    /// bare runs stray from their median (then neither slowdown can be told from the noise, and
    /// which of two noises is larger says nothing). With `floor`, the name of the config of
    /// empty programs on the events sysprof samples with (`sampling_floor_config`), the goal
    /// also shows what the samples' interrupts alone cost, and a missed goal says whether the
    /// floor missed it too.
    fn slowdown_row(
        &self,
        row: &str,
        measured: &[Measured],
        ours: f64,
        peer_name: &str,
        peer: f64,
        floor: Option<&str>,
    ) {
        let bare = measured[0].metric;
        let slowest = measured[0].runs.iter().copied().fold(bare, f64::max);
        let holds = |time: f64| time <= peer || time <= slowest;
        let floor = floor.and_then(|name| find(measured, name));
        let noise = format!(
            "added time <= the peer's, or within the bare runs' noise (+{:.2}%)",
            (slowest / bare - 1.0) * 100.0
        );
        self.rows.borrow_mut().push(Row {
            row: row.into(),
            bare: format!("{:.3} s", bare / 1e9),
            sysprof: format!("{:.4}x", ours / bare),
            peer: format!("{peer_name} {:.4}x", peer / bare),
            // A ratio of added times only means something when the peer added some: on a
            // noisy machine a traced run can beat the bare one.
            ratio: (peer > bare && ours >= bare).then(|| (ours - bare) / (peer - bare)),
            goal: match floor {
                Some(floor) => format!("{noise} (the floor: {:.4}x)", floor / bare),
                None => noise,
            },
            holds: match floor {
                _ if holds(ours) => Holds::Yes,
                Some(floor) if !holds(floor) => Holds::FloorOver,
                _ => Holds::No,
            },
        });
    }

    /// A summary row of what `name` adds per operation next to bpftrace; the goal is at most
    /// `goal` times bpftrace's.
    fn added_row(&self, measured: &[Measured], name: &str, row: &str, goal: f64) {
        let bare = measured[0].metric;
        let Some(ours) = find(measured, name) else { return };
        let theirs = find(measured, "bpftrace").map(|theirs| theirs - bare);
        let floor = find(measured, EMPTY_PROGRAMS).map(|floor| floor - bare);
        self.added_row_of(row, bare, ours - bare, theirs, goal, floor);
    }

    /// A summary row of `ours` ns added per operation (to `bare` ns) next to bpftrace's
    /// `theirs`, when it ran; the goal is at most `goal` times bpftrace's. With a `floor` under
    /// it (`floor_row_of`, what empty programs there add), a missed goal says whether the floor
    /// missed it too, which no program there could have gone under in this run.
    fn added_row_of(
        &self,
        row: &str,
        bare: f64,
        ours: f64,
        theirs: Option<f64>,
        goal: f64,
        floor: Option<f64>,
    ) {
        let ratio = ratio_to(ours, theirs);
        let floor_ratio = floor.and_then(|floor| ratio_to(floor, theirs));
        self.rows.borrow_mut().push(Row {
            row: row.into(),
            bare: format!("{bare:.1} ns"),
            sysprof: format!("{ours:+.1} ns"),
            peer: theirs.map_or("-".into(), |theirs| format!("bpftrace {theirs:+.1} ns")),
            ratio,
            goal: match floor {
                Some(_) => format!(
                    "<= {goal}x bpftrace (the floor: {})",
                    floor_ratio.map_or("-".into(), |r| format!("{r:.3}x"))
                ),
                None => format!("<= {goal}x bpftrace"),
            },
            holds: over_floor(ratio, floor_ratio, goal),
        });
    }

    /// The floor under an `added_row_of`: what empty programs on the same tracepoints (and on
    /// every CPU's fault events) add, and the lowest ratio to bpftrace that any program there
    /// could reach (`floor.rs`); `ours_above` is sysprof's figure minus the floor's, paired
    /// round by round.
    fn floor_row_of(&self, row: &str, bare: f64, floor: f64, theirs: Option<f64>, ours_above: f64) {
        let ratio = ratio_to(floor, theirs);
        self.rows.borrow_mut().push(Row {
            row: format!("{row}: empty programs and events where sysprof's are (the floor)"),
            bare: format!("{bare:.1} ns"),
            sysprof: format!("{floor:+.1} ns"),
            peer: theirs.map_or("-".into(), |theirs| format!("bpftrace {theirs:+.1} ns")),
            ratio,
            goal: format!(
                "- (the kernel's cost of any program or event there; sysprof {ours_above:+.1} ns over it, \
                 paired round by round)"
            ),
            holds: Holds::Unjudged,
        });
    }

    /// The floor under `row`: what empty programs where sysprof's are add (the traps every
    /// uprobe tool pays, the slow path of a syscall with tracepoints on), when they ran, and
    /// `ours`'s figure over it, paired round by round (`floor_row_of`).
    fn floor_row(&self, measured: &[Measured], ours: &str, row: &str) {
        let by_name = |name: &str| measured.iter().find(|m| m.name == name);
        let (Some(ours), Some(empty)) = (by_name(ours), by_name(EMPTY_PROGRAMS)) else { return };
        let bare = measured[0].metric;
        let theirs = find(measured, "bpftrace").map(|theirs| theirs - bare);
        self.floor_row_of(row, bare, empty.metric - bare, theirs, paired_median(&ours.runs, &empty.runs));
    }

    /// The row beside `row` that the kernel times: each tool's BPF programs' run time per
    /// operation, from runs of their own (`runs` rounds, after the timed ones) with
    /// kernel.bpf_stats_enabled on, read by the workload from its tracer's program descriptors
    /// (`tests/workloads/parent_bpf.h`). Less the empty programs' (the kernel's dispatch, and
    /// the two clock reads the statistics put around every program run, the same for every
    /// tool), it is what each tool's own code costs per operation: the part of the row a tool
    /// chooses, without the noise of the trap or the slow path it shares with the others.
    fn program_time_row(&self, configs: &[Config], ours: &str, row: &str, goal: f64) -> anyhow::Result<()> {
        let timed: Vec<Config> = configs
            .iter()
            .filter(|config| {
                config.name == ours
                    || config.name == EMPTY_PROGRAMS
                    || config.name == "bpftrace"
                    || config.name == BPFTRACE_NO_STACKS
            })
            .map(|config| Config {
                name: config.name.clone(),
                // `env` execs the tool, which stays the workload's parent.
                argv: ["env".into(), "WORKLOAD_BPF_TIME=1".into()]
                    .into_iter()
                    .chain(config.argv.clone())
                    .collect(),
            })
            .collect();
        if timed.len() < 3 {
            return Ok(());
        }
        let measured = {
            let _stats = BpfStats::set(true)?;
            measure(&timed, PROGRAM_TIME_RUNS, "bpf_ns_per_call")?
        };
        let by_name = |name: &str| find(&measured, name);
        let (Some(sysprof), Some(empty), Some(bpftrace)) =
            (by_name(ours), by_name(EMPTY_PROGRAMS), by_name("bpftrace"))
        else {
            return Ok(());
        };
        println!(
            "BPF run time per operation (kernel statistics on): {ours} {sysprof:.1} ns, bpftrace {bpftrace:.1} ns, \
             empty programs {empty:.1} ns"
        );
        let (ours_own, theirs_own) = (sysprof - empty, bpftrace - empty);
        let ratio = ratio_to(ours_own, Some(theirs_own));
        self.rows.borrow_mut().push(Row {
            row: format!("{row}: the programs' own run time (kernel statistics), over empty programs'"),
            bare: format!("{empty:.1} ns"),
            sysprof: format!("{ours_own:+.1} ns"),
            peer: format!("bpftrace {theirs_own:+.1} ns"),
            ratio,
            // What explains the row above, not a goal of its own: the row's verdict is on
            // the whole cost, the kernel's part included.
            goal: format!("- (the row above's goal: <= {goal}x bpftrace)"),
            holds: Holds::Unjudged,
        });
        if let Some(lesser) = by_name(BPFTRACE_NO_STACKS) {
            println!("BPF run time per operation of {BPFTRACE_NO_STACKS}: {lesser:.1} ns");
            self.rows.borrow_mut().push(Row {
                row: format!("{row}: the programs' own run time, against {BPFTRACE_NO_STACKS}"),
                bare: format!("{empty:.1} ns"),
                sysprof: format!("{ours_own:+.1} ns"),
                peer: format!("{BPFTRACE_NO_STACKS} {:+.1} ns", lesser - empty),
                ratio: ratio_to(ours_own, Some(lesser - empty)),
                goal: "- (less than sysprof's job: no stacks)".into(),
                holds: Holds::Unjudged,
            });
        }
        Ok(())
    }

    /// Beside `row`: `ours` against bpftrace doing less than sysprof's job
    /// (`BPFTRACE_NO_STACKS`), when it ran; not judged.
    fn lesser_peer_row(&self, measured: &[Measured], ours: &str, row: &str) {
        let bare = measured[0].metric;
        let (Some(ours), Some(lesser)) = (find(measured, ours), find(measured, BPFTRACE_NO_STACKS)) else {
            return;
        };
        let theirs = lesser - bare;
        self.rows.borrow_mut().push(Row {
            row: format!("{row}: against {BPFTRACE_NO_STACKS}"),
            bare: format!("{bare:.1} ns"),
            sysprof: format!("{:+.1} ns", ours - bare),
            peer: format!("{BPFTRACE_NO_STACKS} {theirs:+.1} ns"),
            ratio: ratio_to(ours - bare, Some(theirs)),
            goal: "- (less than sysprof's job: no stacks)".into(),
            holds: Holds::Unjudged,
        });
    }

    fn sysprof_config(&self, name: &str, options: &[&str], workload: &[String]) -> Config {
        let results = self.out.join(name.replace([' ', '-'], "_")).display().to_string();
        let mut argv =
            vec![self.sysprof.display().to_string(), "trace".into(), "-q".into(), "-o".into(), results];
        argv.extend(options.iter().map(|o| o.to_string()));
        argv.push("--".into());
        argv.extend(workload.iter().cloned());
        Config { name: name.into(), argv }
    }

    /// bpftrace's tracepoints need tracefs, mounted here when missing (the bench runs as root).
    fn mount_tracefs(&self) -> anyhow::Result<()> {
        if !Path::new("/sys/kernel/tracing/events").exists() {
            eprintln!("bench: mounting tracefs at /sys/kernel/tracing for bpftrace's tracepoints");
            crate::run(Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]))?;
        }
        Ok(())
    }

    /// bpftrace running `script` around the workload, when bpftrace is installed. Its
    /// tracepoints need tracefs, which is mounted here when missing (the bench runs as root).
    fn bpftrace_config(&self, script: &str, workload: &[String]) -> anyhow::Result<Option<Config>> {
        if !tool_works("bpftrace", &["--version"]) {
            eprintln!("bench: bpftrace is not installed (apt-get install bpftrace): no bpftrace comparison");
            return Ok(None);
        }
        self.mount_tracefs()?;
        let path = self.out.join(format!("script-{}.bt", script.len()));
        std::fs::write(&path, script)?;
        Ok(Some(Config {
            name: "bpftrace".into(),
            argv: vec![
                "bpftrace".into(),
                "-q".into(),
                "-c".into(),
                workload.join(" "),
                path.display().to_string(),
            ],
        }))
    }
}

/// The Python the Python bench runs: pyenv's 3.12 when it is there (the version most users
/// run), else python3.
fn python_interpreter() -> Option<String> {
    let root = Command::new("pyenv").arg("root").output().ok().filter(|out| out.status.success());
    let pyenv = root.map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("versions"));
    let pinned =
        pyenv.and_then(|versions| std::fs::read_dir(versions).ok()).into_iter().flatten().flatten().find_map(
            |entry| {
                let python = entry.path().join("bin/python3.12");
                python.is_file().then(|| python.display().to_string())
            },
        );
    pinned.or_else(|| tool_works("python3", &["--version"]).then(|| "python3".into()))
}

/// The libc this process uses, from its memory map: the one the workloads use too.
fn own_libc() -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| path.rsplit('/').next().is_some_and(|name| name.starts_with("libc.so")))
        .map(String::from)
}

fn find(measured: &[Measured], name: &str) -> Option<f64> {
    measured.iter().find(|m| m.name == name).map(|m| m.metric)
}

fn print_table(measured: &[Measured], metric: &str, format: impl Fn(f64) -> String) {
    let bare = measured[0].metric;
    println!("{:<30} {:>14} {:>10} {:>12}", "configuration", metric, "vs bare", "whole cmd");
    for m in measured {
        println!(
            "{:<30} {:>14} {:>10.4} {:>10.3} s",
            m.name,
            format(m.metric),
            m.metric / bare,
            m.wall_ns / 1e9
        );
    }
}

/// The per-operation table, with what each tool adds and sysprof's share of bpftrace's.
fn print_added(measured: &[Measured], unit: &str) {
    print_table(measured, unit, |m| format!("{m:.1}"));
    let bare = measured[0].metric;
    let added = |name: &str| find(measured, name).map(|m| m - bare);
    let bpftrace = added("bpftrace");
    for m in &measured[1..] {
        if m.name == "bpftrace" {
            continue;
        }
        let ours = m.metric - bare;
        match bpftrace {
            Some(theirs) if theirs > 0.0 => println!(
                "{}: adds {ours:.1} {unit}; bpftrace adds {theirs:.1}; ratio {:.3}",
                m.name,
                ours / theirs
            ),
            _ => println!("{}: adds {ours:.1} {unit}", m.name),
        }
    }
}

/// Runs every configuration `runs` times, alternating the order each round.
fn measure(configs: &[Config], runs: usize, metric: &str) -> anyhow::Result<Vec<Measured>> {
    let mut values: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let mut wall: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for round in 0..runs {
        let mut order: Vec<usize> = (0..configs.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for index in order {
            let (value, wall_ns) = run_once(&configs[index], metric)?;
            values[index].push(value);
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
            runs: values[i].clone(),
            metric: median(&mut values[i]),
            wall_ns: median(&mut wall[i]),
        })
        .collect())
}

/// Runs one configuration; returns the workload's own figure and the command's wall time.
fn run_once(config: &Config, metric: &str) -> anyhow::Result<(f64, f64)> {
    let started = Instant::now();
    let mut command = Command::new(&config.argv[0]);
    // Root's runs into root's target/bench, also under `sudo -E cargo xtask bench`.
    for variable in crate::SUDO_VARIABLES {
        command.env_remove(variable);
    }
    let output = command
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
    let prefix = format!("{metric}=");
    let value = stdout
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .with_context(|| format!("{} printed no {metric}: {stdout}", config.name))?;
    Ok((value, wall))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 }
}

/// Builds `tests/workloads/NAME.c` the way the tests do (frame pointers, debug info).
fn build_workload(root: &Path, out: &Path, name: &str) -> anyhow::Result<PathBuf> {
    build_workload_with(root, out, name, &["-O1", "-fno-omit-frame-pointer"])
}

/// `gpu_app` linked against the CUDA runtime and NCCL in `libs`, which it also finds there
/// when it runs (its run path).
fn build_gpu_app(root: &Path, out: &Path, libs: &Path) -> anyhow::Result<PathBuf> {
    let binary = out.join("gpu_app");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    crate::run(
        Command::new(&cc)
            .args(["-O1", "-fno-omit-frame-pointer", "-g", "-o"])
            .arg(&binary)
            .arg(root.join("tests/workloads/gpu_app.c"))
            .arg("-L")
            .arg(libs)
            .arg(format!("-Wl,-rpath,{}", libs.display()))
            .args(["-l:libcudart.so.12", "-l:libnccl.so.2"]),
    )?;
    Ok(binary)
}

/// Builds `tests/workloads/NAME.c` with `flags` (and debug info).
fn build_workload_with(root: &Path, out: &Path, name: &str, flags: &[&str]) -> anyhow::Result<PathBuf> {
    let binary = out.join(name);
    let source = root.join(format!("tests/workloads/{name}.c"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    crate::run(
        Command::new(&cc).args(flags).args(["-g", "-pthread", "-o"]).arg(&binary).arg(&source).arg("-ldl"),
    )?;
    Ok(binary)
}

/// The mean cost of one on-CPU sample in a run's report.json (its BPF run-time statistics).
fn sample_cost_ns(dir: &Path) -> Option<f64> {
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).ok()?).ok()?;
    let program = report["overhead"]["programs"].as_array()?.iter().find(|p| p["program"] == "cpu_sample")?;
    let runs = program["run_count"].as_f64()?;
    (runs > 0.0).then(|| program["run_time_ns"].as_f64().unwrap_or(0.0) / runs)
}

fn show(value: Option<f64>) -> String {
    match value {
        Some(v) if v >= 10.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.4}"),
        None => "-".into(),
    }
}

/// Seconds from launching `config` to its command's first stamp, and from the command's last
/// stamp to the tool's exit.
fn start_and_end(config: &Config) -> anyhow::Result<(f64, f64)> {
    let realtime_ns = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_nanos() as f64)
    };
    let launched = realtime_ns();
    let mut command = Command::new(&config.argv[0]);
    for variable in crate::SUDO_VARIABLES {
        command.env_remove(variable);
    }
    let output = command
        .args(&config.argv[1..])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running {}", config.argv.join(" ")))?;
    let exited = realtime_ns();
    if !output.status.success() {
        bail!("{} failed: {}", config.name, String::from_utf8_lossy(&output.stderr));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stamp = |name: &str| {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix('=')?.trim().parse::<f64>().ok())
            .with_context(|| format!("{} printed no {name}: {stdout}", config.name))
    };
    Ok(((stamp("start_realtime_ns")? - launched) / 1e9, (exited - stamp("end_realtime_ns")?) / 1e9))
}

/// Seconds from starting `sysprof trace --pid PID` to its "tracing" line (everything attached).
fn time_to_tracing(sysprof: &Path, pid: &str, options: &[&str], out: &Path) -> anyhow::Result<f64> {
    use std::io::BufRead as _;
    let started = Instant::now();
    let mut child = Command::new(sysprof)
        .args(["trace", "--pid", pid, "-d", "1s", "-o"])
        .arg(out.join("start"))
        .args(options)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut stderr = std::io::BufReader::new(child.stderr.take().context("sysprof's stderr")?);
    let mut line = String::new();
    let mut seconds = None;
    while stderr.read_line(&mut line)? > 0 {
        if line.contains("tracing") {
            seconds = Some(started.elapsed().as_secs_f64());
            break;
        }
        line.clear();
    }
    std::io::copy(&mut stderr, &mut std::io::sink())?;
    child.wait()?;
    seconds.context("sysprof never said it was tracing")
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
    fn a_missed_goal_is_the_floors_only_when_empty_programs_missed_it_too() {
        // Under the goal: holds, whatever the floor.
        assert!(matches!(over_floor(Some(0.2), Some(0.3), 0.25), Holds::Yes));
        // Over it, and so were empty programs: no program there could have met it.
        assert!(matches!(over_floor(Some(0.3), Some(0.26), 0.25), Holds::FloorOver));
        // Over it where empty programs were under it: sysprof's own code shows.
        assert!(matches!(over_floor(Some(0.3), Some(0.2), 0.25), Holds::No));
        assert!(matches!(over_floor(Some(0.3), None, 0.25), Holds::No));
        // No peer, no verdict.
        assert!(matches!(over_floor(None, Some(0.3), 0.25), Holds::Unjudged));
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
