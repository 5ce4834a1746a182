//! Command-line types (clap) and their conversion into a plain [`TraceConfig`].

use std::{ffi::OsString, fmt, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

use crate::{
    config::{Focus, SampleEvent, Target, TraceConfig},
    privileges::InvokingUser,
};

/// eBPF profiler: where does the time go, and what should I change first?
#[derive(Debug, Parser)]
#[command(name = "sysprof", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Profile processes, a command or the whole machine; writes flamegraphs and a report
    Trace(Box<TraceArgs>),
    /// Render a saved run again (traced with --save-readout): report.md, report.json, the
    /// flamegraphs and profiles, with this sysprof's analysis and the families you keep
    Report(ReportArgs),
    /// Merge the output directories of one job's hosts or ranks into one report: their figures
    /// side by side, the straggler, one timeline with a machine per host
    Merge(MergeArgs),
    /// Show what this machine supports and what sysprof can do here
    Check(CheckArgs),
    /// Show the GPUs, how each pair is connected, and each link's peak bandwidth (NVML)
    Topo(TopoArgs),
    /// Build the unwind tables of ELF files as a trace would: their rows, size, and the time to
    /// build them and to read them from the cache; --verify checks the cached ones
    Tables(TablesArgs),
}

/// `sysprof tables` options.
#[derive(Debug, Args)]
pub struct TablesArgs {
    /// ELF files (executables, shared libraries)
    #[arg(value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,
    /// Print the figures as JSON
    #[arg(long)]
    pub json: bool,
    /// Check each file's cached table against the one built from the file now: say whether it
    /// matches, and remove it where it does not (exit 1)
    #[arg(long)]
    pub verify: bool,
}

/// `sysprof report` options.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The output directory of a `sysprof trace --save-readout` run (its readout.json)
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Where the rendered files go (default: DIR itself)
    #[arg(short, long, value_name = "OUT")]
    pub output: Option<PathBuf>,
    /// Keep only these families' sections and profiles (of those the run traced)
    #[arg(long, value_enum, value_delimiter = ',')]
    pub focus: Vec<Focus>,
}

/// `sysprof merge` options.
#[derive(Debug, Args)]
pub struct MergeArgs {
    /// The output directories of `sysprof trace`, one per host or rank (copied to one place)
    #[arg(value_name = "DIR", required = true, num_args = 2..)]
    pub dirs: Vec<PathBuf>,
    /// Where merged.md, merged.json and timeline.pftrace go
    #[arg(short, long, value_name = "OUT", default_value = "merged_output")]
    pub output: PathBuf,
}

/// `sysprof topo` options.
#[derive(Debug, Args)]
pub struct TopoArgs {
    /// NVML library to use (default: the driver's libnvidia-ml.so.1)
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// Print the topology as JSON
    #[arg(long)]
    pub json: bool,
}

const TRACE_EXAMPLES: &str = "\
Examples:
  sudo sysprof trace --pid 1234 --duration 30s     profile a running process and its children
  sudo sysprof trace -- ./train.py --epochs 1      launch a command and profile it to the end
  sudo sysprof trace --all --duration 10s          profile the whole machine
  sudo sysprof trace --unit nginx.service          profile a systemd service
  sudo sysprof trace --comm python3 -o out/        every process named python3, now or later

  sudo sysprof trace --malloc -- ./server          heap profiling too (allocator probes)

Results go to ./profile_output/: cpu.svg, offcpu.svg, faults.svg (alloc.svg with --malloc),
their .folded stacks and .pb.gz pprof profiles, report.md, report.json. Ctrl-C, SIGTERM or a lost terminal (SIGHUP) ends the
trace early and still writes everything; -- CMD and what it started are then ended too.

Through sudo, sysprof acts for you, not as root: -- CMD runs as you; the results are created as
you, in a directory that is yours (or root's) and that you can write; files you name (--func BIN,
--cuda-lib, --nccl-lib) are opened only if you can read them; --nvml-lib loads only a library
that root owns and no one else can change; --as-root is refused.";

/// `sysprof trace` options.
#[derive(Debug, Args)]
#[command(after_help = TRACE_EXAMPLES)]
pub struct TraceArgs {
    /// Running processes to profile, with the child processes they start
    #[arg(short, long, value_name = "PID", value_delimiter = ',', conflicts_with = "command")]
    pub pid: Vec<u32>,

    /// Profile every process on the machine, kernel threads and idle included
    #[arg(short, long, conflicts_with_all = ["pid", "comm", "cgroup", "unit", "command"])]
    pub all: bool,

    /// Processes whose command name (/proc/PID/comm) is NAME, including ones that start later
    #[arg(long, value_name = "NAME", conflicts_with_all = ["cgroup", "unit", "command"],
          value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub comm: Option<String>,

    /// Tasks in a cgroup v2 (a path under its mount, or absolute), filtered in the kernel
    #[arg(long, value_name = "PATH", conflicts_with_all = ["pid", "unit", "command"])]
    pub cgroup: Option<PathBuf>,

    /// A systemd unit (NAME.service): profiles the tasks in its cgroup
    #[arg(long, value_name = "NAME", conflicts_with_all = ["pid", "command"])]
    pub unit: Option<String>,

    /// Stop after this long (e.g. 10s, 2m); default: until Ctrl-C or until CMD exits
    #[arg(short, long, value_name = "DURATION", value_parser = parse_positive_duration)]
    pub duration: Option<Duration>,

    /// On-CPU samples per second, per CPU
    #[arg(short = 'F', long, value_name = "HZ", default_value_t = 99,
          value_parser = clap::value_parser!(u64).range(1..=20_000))]
    pub freq: u64,

    /// Event that drives sampling: cpu-clock works everywhere, cycles needs a hardware PMU
    #[arg(long, value_enum, default_value_t = SampleEvent::CpuClock)]
    pub event: SampleEvent,

    /// Probe families to attach (comma-separated); default: all that apply
    #[arg(long, value_enum, value_delimiter = ',', value_name = "FAMILY")]
    pub focus: Vec<Focus>,

    /// Distinct stacks the kernel can hold, in each of its stack maps (on-CPU samples, page
    /// faults, the rest, and those walked with unwind tables); stacks beyond it are counted as
    /// lost (each takes about 1 KiB of kernel memory in each map the trace uses, for the run)
    #[arg(long, value_name = "N", default_value_t = sysprof_common::capacity::STACKS,
          value_parser = clap::value_parser!(u32).range(1..=MAX_STACK_STORAGE))]
    pub stack_storage_size: u32,

    /// Kernel memory for the unwind tables, in MiB: user stacks are walked with each file's
    /// .eh_frame, so code built without frame pointers (libc, python, CUDA) unwinds whole; a
    /// file whose table does not fit is walked by frame pointers, and the report says which. 0:
    /// frame pointers only
    #[arg(long, value_name = "MIB", default_value_t = 12, value_parser = clap::value_parser!(u32).range(0..=1024))]
    pub unwind_memory: u32,

    /// Time every syscall; by default, past 32 calls in one stretch on a CPU, a thread has 1
    /// call in 16 timed (and any call that blocks), which keeps the cost per call low; counts
    /// and errors are always exact
    #[arg(long)]
    pub time_every_syscall: bool,

    /// CUDA runtime or driver library to probe (libcudart.so*, libcuda.so*), besides those the
    /// target maps
    #[arg(long, value_name = "PATH")]
    pub cuda_lib: Vec<PathBuf>,

    /// NCCL library to probe (libnccl.so*), besides the one the target maps
    #[arg(long, value_name = "PATH")]
    pub nccl_lib: Vec<PathBuf>,

    /// How often GPU metrics are read from NVML (at least 10ms); past 2,048 polls of a GPU the
    /// interval doubles, so that a long trace keeps its whole run in bounded memory
    #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = parse_interval)]
    pub gpu_interval: Duration,

    /// NVML library to use (default: the driver's libnvidia-ml.so.1)
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,

    /// Profile the heap: probe the allocator the target uses (glibc malloc/calloc/realloc/free,
    /// jemalloc, tcmalloc, mimalloc) for allocation rate, sizes, live and peak bytes and the
    /// stacks that allocate most; off by default: every allocator call then costs a few
    /// microseconds (measured and reported)
    #[arg(long)]
    pub malloc: bool,

    /// How often each target's memory (RSS by kind, swap) is read (at least 10ms)
    #[arg(long, value_name = "DURATION", default_value = "250ms", value_parser = parse_interval)]
    pub memory_interval: Duration,

    /// Events timeline.pftrace keeps at most (samples, waits off the CPU and system calls of
    /// 100 µs or more, probed calls): past it the shortest waits and calls go first, then samples
    /// are thinned, and the report says so. 0: no timeline
    #[arg(long, value_name = "N", default_value_t = crate::config::DEFAULT_TIMELINE_EVENTS)]
    pub timeline_events: usize,

    /// Time a function of the target: BIN is a path, or the name of a binary or library the
    /// target maps (repeatable)
    #[arg(long = "func", value_name = "BIN:SYMBOL")]
    pub funcs: Vec<crate::config::FuncSpec>,

    /// Directory for the results
    #[arg(short, long, value_name = "DIR", default_value = "profile_output")]
    pub output: PathBuf,

    /// No live status line and no summary
    #[arg(short, long)]
    pub quiet: bool,

    /// Also send the pprof profiles to a Pyroscope server's ingest API (http://host:4040),
    /// labelled with host, service, pid and the job's rank; the local files are kept either way
    #[arg(long, value_name = "URL")]
    pub push: Option<String>,

    /// Also keep readout.json (the run's maps, process snapshots and symbol names), from which
    /// `sysprof report DIR` renders the run again without tracing
    #[arg(long)]
    pub save_readout: bool,

    /// Run CMD as root: refused through sudo, where CMD always runs as the invoking user (a
    /// sudo rule for sysprof must not run anything else as root); without sudo CMD runs as
    /// whoever runs sysprof
    #[arg(long)]
    pub as_root: bool,

    /// Command to launch and profile until it exits
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// `sysprof check` options.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Print the findings as JSON
    #[arg(long)]
    pub json: bool,
    /// NVML library to check (default: the driver's libnvidia-ml.so.1)
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
}

/// The arguments parsed but do not describe a trace; the message says what is needed.
#[derive(Debug)]
pub struct UsageError(String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

impl TraceArgs {
    /// The trace these arguments ask for.
    pub fn into_config(self) -> Result<TraceConfig, UsageError> {
        let target = self.target()?;
        if self.malloc && !self.focus.is_empty() && !self.focus.contains(&Focus::Memory) {
            return Err(UsageError("error: --malloc needs the memory family: add memory to --focus".into()));
        }
        Ok(TraceConfig {
            target,
            duration: self.duration,
            frequency_hz: self.freq,
            event: self.event,
            stack_storage_size: self.stack_storage_size,
            unwind_memory_mib: self.unwind_memory,
            time_every_syscall: self.time_every_syscall,
            timeline_events: self.timeline_events,
            gpu_libraries: self.cuda_lib.iter().chain(&self.nccl_lib).cloned().collect(),
            functions: self.funcs.clone(),
            gpu_interval: self.gpu_interval,
            nvml_library: self.nvml_lib.clone(),
            malloc: self.malloc,
            memory_interval: self.memory_interval,
            focus: self.focus,
            output_dir: self.output,
            quiet: self.quiet,
            save_readout: self.save_readout,
            push: self.push.clone(),
            command_as_root: self.as_root,
            invoking_user: InvokingUser::from_sudo_env(),
        })
    }

    fn target(&self) -> Result<Target, UsageError> {
        if self.all {
            return Ok(Target::All);
        }
        if !self.command.is_empty() {
            return Ok(Target::Command(self.command.clone()));
        }
        if let Some(path) = &self.cgroup {
            return Ok(Target::Cgroup(path.clone()));
        }
        if let Some(unit) = &self.unit {
            return Ok(Target::Unit(unit.clone()));
        }
        match (&self.comm, self.pid.is_empty()) {
            (Some(_), false) => Err(UsageError(
                "error: --comm and --pid cannot be combined: profile by name or by pid".into(),
            )),
            (Some(name), true) => Ok(Target::Comm(name.clone())),
            (None, false) => Ok(Target::Pids(self.pid.clone())),
            (None, true) => Err(UsageError(format!(
                "sysprof trace needs a target: --pid PID, --all, --comm NAME, --cgroup PATH, \
                 --unit NAME.service, or -- CMD ARGS...\n\n{TRACE_EXAMPLES}"
            ))),
        }
    }
}

/// The largest `--stack-storage-size`: 256 MiB of kernel memory.
const MAX_STACK_STORAGE: i64 = 262_144;

/// The longest duration an option takes: a year (humantime's `1y`, 365.25 days). The trace's
/// deadline is the start plus `--duration`, and `Instant + Duration` panics past the clock's
/// range (`-d 300000000000y` did, after the command was launched); an interval is multiplied
/// by the memory reads' stretch. A year keeps all of it far inside the range, and no trace
/// needs more.
const MAX_DURATION: Duration = Duration::from_secs(31_557_600);

/// The shortest interval of a periodic read (`--memory-interval`, `--gpu-interval`): each read
/// costs sysprof some time (a /proc file per process, an NVML call per GPU and metric), and
/// its samples, however many, are thinned to a bounded series.
const MIN_INTERVAL: Duration = Duration::from_millis(10);

fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    parse_duration(text).and_then(|d| if d.is_zero() { Err("must be more than 0".into()) } else { Ok(d) })
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    parse_duration(text).and_then(|d| {
        if d < MIN_INTERVAL {
            Err(format!("must be at least {}", humantime::format_duration(MIN_INTERVAL)))
        } else {
            Ok(d)
        }
    })
}

/// A duration with units (`1m30s`, `250ms`) or a bare number of seconds, at most
/// [`MAX_DURATION`].
fn parse_duration(text: &str) -> Result<Duration, String> {
    // A bare number means seconds, as in `perf record -- sleep 10` habits.
    let duration = match text.parse::<f64>() {
        Ok(seconds) if seconds >= 0.0 => Duration::try_from_secs_f64(seconds).ok(),
        Ok(_) => return Err(format!("invalid duration {text:?}")),
        Err(_) => Some(humantime::parse_duration(text).map_err(|error| {
            format!(
                "invalid duration {text:?}: {error}; the longest is {}",
                humantime::format_duration(MAX_DURATION)
            )
        })?),
    };
    match duration {
        Some(duration) if duration <= MAX_DURATION => Ok(duration),
        _ => Err(format!("must be at most {}", humantime::format_duration(MAX_DURATION))),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    fn parse(args: &[&str]) -> Result<TraceConfig, String> {
        let cli = Cli::try_parse_from(args).map_err(|e| e.to_string())?;
        match cli.command {
            Command::Trace(args) => args.into_config().map_err(|e| e.to_string()),
            Command::Report(_)
            | Command::Merge(_)
            | Command::Check(_)
            | Command::Topo(_)
            | Command::Tables(_) => Err("not trace".into()),
        }
    }

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn pids_accept_lists_and_repeats() {
        let config = parse(&["sysprof", "trace", "--pid", "1,2", "-p", "3"]).unwrap();
        assert_eq!(config.target, Target::Pids(vec![1, 2, 3]));
        assert_eq!(config.frequency_hz, 99);
        assert_eq!(config.event, SampleEvent::CpuClock);
        assert_eq!(config.output_dir, PathBuf::from("profile_output"));
        assert!(config.duration.is_none());
    }

    #[test]
    fn command_after_double_dash_keeps_its_own_flags() {
        let config = parse(&["sysprof", "trace", "-F", "999", "--", "ls", "-l", "--all"]).unwrap();
        assert_eq!(config.target, Target::Command(vec!["ls".into(), "-l".into(), "--all".into()]));
        assert_eq!(config.frequency_hz, 999);
    }

    #[test]
    fn durations_take_units_or_seconds() {
        let config = parse(&["sysprof", "trace", "--all", "--duration", "1m30s"]).unwrap();
        assert_eq!(config.duration, Some(Duration::from_secs(90)));
        let config = parse(&["sysprof", "trace", "--all", "-d", "2.5"]).unwrap();
        assert_eq!(config.duration, Some(Duration::from_millis(2500)));
        let zero = parse(&["sysprof", "trace", "--all", "-d", "0s"]).unwrap_err();
        assert!(zero.starts_with("error: invalid value '0s' for '--duration"), "{zero}");
        let interval = parse(&["sysprof", "trace", "--all", "--memory-interval", "1ms"]).unwrap_err();
        assert!(interval.starts_with("error: invalid value '1ms' for '--memory-interval"), "{interval}");
        assert!(parse(&["sysprof", "trace", "--all", "-d", "soon"]).is_err());
    }

    #[test]
    fn durations_past_a_year_are_refused_before_anything_runs() {
        // Each became the trace's deadline (start + duration), which panicked past the clock's
        // range after the command was launched.
        for huge in ["300000000000y", "3000000000000000y", "1e300", "1e20", "366d"] {
            let error = parse(&["sysprof", "trace", "-d", huge, "--", "true"]).unwrap_err();
            let first = error.lines().next().unwrap();
            assert!(first.starts_with(&format!("error: invalid value '{huge}' for '--duration")), "{error}");
            assert!(first.contains("1year"), "{error}");
        }
        let config = parse(&["sysprof", "trace", "--all", "-d", "1y"]).unwrap();
        assert_eq!(config.duration, Some(MAX_DURATION));
        for option in ["--memory-interval", "--gpu-interval"] {
            let error = parse(&["sysprof", "trace", "--all", option, "300000000000y"]).unwrap_err();
            assert!(error.contains("must be at most 1year"), "{option}: {error}");
        }
    }

    #[test]
    fn intervals_have_a_floor() {
        for option in ["--gpu-interval", "--memory-interval"] {
            for short in ["0", "0s", "1ns", "9ms"] {
                let error = parse(&["sysprof", "trace", "--all", option, short]).unwrap_err();
                assert!(
                    error.starts_with(&format!(
                        "error: invalid value '{short}' for '{option} <DURATION>': must be at least 10ms"
                    )),
                    "{option} {short}: {error}"
                );
            }
        }
        let config = parse(&["sysprof", "trace", "--all", "--gpu-interval", "10ms"]).unwrap();
        assert_eq!(config.gpu_interval, MIN_INTERVAL);
    }

    #[test]
    fn no_target_explains_what_is_needed() {
        let error = parse(&["sysprof", "trace"]).unwrap_err();
        assert!(error.contains("needs a target"), "{error}");
        assert!(error.contains("sudo sysprof trace --pid 1234"), "{error}");
    }

    #[test]
    fn conflicting_targets_are_refused() {
        assert!(parse(&["sysprof", "trace", "--all", "--pid", "1"]).is_err());
        assert!(parse(&["sysprof", "trace", "--comm", "x", "--pid", "1"]).is_err());
        assert!(parse(&["sysprof", "trace", "--cgroup", "a", "--unit", "b"]).is_err());
        assert!(parse(&["sysprof", "trace", "--pid", "1", "--", "ls"]).is_err());
    }

    #[test]
    fn focus_takes_a_list() {
        let config = parse(&["sysprof", "trace", "--all", "--focus", "cpu"]).unwrap();
        assert_eq!(config.focus, vec![Focus::Cpu]);
        assert!(config.wants(Focus::Cpu));
        assert!(parse(&["sysprof", "trace", "--all", "--focus", "bogus"]).is_err());
    }

    #[test]
    fn malloc_needs_the_memory_family() {
        let config = parse(&["sysprof", "trace", "--all", "--malloc"]).unwrap();
        assert!(config.malloc && config.wants(Focus::Memory));
        assert!(parse(&["sysprof", "trace", "--all", "--malloc", "--focus", "memory"]).is_ok());
        let error = parse(&["sysprof", "trace", "--all", "--malloc", "--focus", "cpu"]).unwrap_err();
        assert!(error.contains("add memory to --focus"), "{error}");
    }

    #[test]
    fn empty_names_and_huge_stack_maps_are_refused() {
        assert!(parse(&["sysprof", "trace", "--comm", ""]).unwrap_err().starts_with("error: "));
        assert!(parse(&["sysprof", "trace", "--all", "--stack-storage-size", "1048576"]).is_err());
        assert!(parse(&["sysprof", "trace", "--all", "--stack-storage-size", "262144"]).is_ok());
    }

    #[test]
    fn frequency_is_bounded() {
        assert!(parse(&["sysprof", "trace", "--all", "-F", "0"]).is_err());
        assert!(parse(&["sysprof", "trace", "--all", "-F", "100000"]).is_err());
    }
}
