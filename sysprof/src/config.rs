//! What one `sysprof trace` was asked to do, as plain data: the CLI builds it, tests build it
//! directly, and the pipeline reads it.

use std::{ffi::OsString, fmt, path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

use crate::privileges::InvokingUser;

/// Who is profiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Running processes, and the child processes they start during the trace.
    Pids(Vec<u32>),
    /// Every task on the machine, kernel threads and idle included.
    All,
    /// Processes with this command name, running now or started during the trace.
    Comm(String),
    /// Tasks in this cgroup v2 directory and below (also what `--unit` resolves to).
    Cgroup(PathBuf),
    /// A systemd unit, resolved to its cgroup at start.
    Unit(String),
    /// A command sysprof launches and profiles until it exits.
    Command(Vec<OsString>),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Pids(pids) => {
                let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
                write!(f, "pid {}", pids.join(","))
            }
            Target::All => f.write_str("all processes"),
            Target::Comm(name) => write!(f, "processes named {name}"),
            Target::Cgroup(path) => write!(f, "cgroup {}", path.display()),
            Target::Unit(unit) => write!(f, "unit {unit}"),
            Target::Command(argv) => {
                let argv: Vec<String> = argv.iter().map(|a| a.to_string_lossy().into_owned()).collect();
                write!(f, "command `{}`", argv.join(" "))
            }
        }
    }
}

/// The perf event that drives on-CPU sampling.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum SampleEvent {
    /// Software timer: works everywhere, VMs included.
    #[default]
    CpuClock,
    /// Hardware CPU cycles: needs a PMU, which most VMs lack.
    Cycles,
}

impl fmt::Display for SampleEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SampleEvent::CpuClock => "cpu-clock",
            SampleEvent::Cycles => "cycles",
        })
    }
}

/// A family of probes, chosen with `--focus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Focus {
    /// On-CPU stack sampling (perf_event).
    Cpu,
    /// Context switches, run-queue latency, off-CPU time and stacks (sched_switch, sched_waking).
    Sched,
    /// Syscall counts, errors and latency (sys_enter, sys_exit).
    Syscalls,
    /// CUDA runtime/driver and NCCL calls (uprobes on the libraries the target maps), and GPU
    /// metrics from NVML.
    Gpu,
    /// Process memory over the run, page faults with stacks, address-space changes
    /// (mmap/munmap/brk/mremap), data on both CPU and GPU; the heap too with `--malloc`.
    Memory,
}

impl Focus {
    /// Every family, in report order.
    pub const ALL: [Focus; 5] = [Focus::Cpu, Focus::Sched, Focus::Syscalls, Focus::Gpu, Focus::Memory];
}

/// Everything `sysprof trace` needs to run.
#[derive(Clone, Debug)]
pub struct TraceConfig {
    pub target: Target,
    /// Stop after this long; `None` runs until Ctrl-C or until the command exits.
    pub duration: Option<Duration>,
    /// Samples per second per CPU.
    pub frequency_hz: u64,
    pub event: SampleEvent,
    /// Entries of the in-kernel stack map.
    pub stack_storage_size: u32,
    /// Kernel memory for the unwind tables (`--unwind-memory`); 0: frame pointers only.
    pub unwind_memory_mib: u32,
    /// Time every syscall with the precise clock, even in bursts (more overhead).
    pub time_every_syscall: bool,
    /// CUDA and NCCL libraries to probe besides (or instead of) the ones found in the target.
    pub gpu_libraries: Vec<PathBuf>,
    /// Functions to time (`--func BIN:SYMBOL`).
    pub functions: Vec<FuncSpec>,
    /// How often NVML is polled.
    pub gpu_interval: Duration,
    /// The NVML library (default: the driver's libnvidia-ml.so.1).
    pub nvml_library: Option<PathBuf>,
    /// Probe the allocator (malloc, free, ...): heap profiling, at a cost per call.
    pub malloc: bool,
    /// How often each target's memory (RSS, swap) is read.
    pub memory_interval: Duration,
    /// Events the timeline keeps (`--timeline-events`); 0: no timeline.
    pub timeline_events: usize,
    /// Probe families to attach; empty means all that apply.
    pub focus: Vec<Focus>,
    pub output_dir: PathBuf,
    /// No live status line and no summary on stderr.
    pub quiet: bool,
    /// Also write `readout.json`: the raw read-out, which `finish::replay` analyzes again.
    pub save_readout: bool,
    /// `--push URL`: a Pyroscope server the pprof profiles are sent to.
    pub push: Option<String>,
    /// Run `-- CMD` as root even when sysprof was started through sudo.
    pub command_as_root: bool,
    /// The user behind sudo: owns the output and runs `-- CMD`.
    pub invoking_user: Option<InvokingUser>,
}

/// Events kept by default (`--timeline-events`): about 10 MB of `.pftrace` (some 50 bytes an
/// event) and 10 MB of sysprof's memory (48 bytes an event) at most.
pub const DEFAULT_TIMELINE_EVENTS: usize = 200_000;

impl TraceConfig {
    /// A configuration with the CLI's defaults for `target`.
    pub fn new(target: Target) -> Self {
        TraceConfig {
            target,
            duration: None,
            frequency_hz: 99,
            event: SampleEvent::CpuClock,
            stack_storage_size: sysprof_common::capacity::STACKS,
            unwind_memory_mib: 12,
            time_every_syscall: false,
            gpu_libraries: Vec::new(),
            functions: Vec::new(),
            gpu_interval: Duration::from_millis(100),
            nvml_library: None,
            malloc: false,
            memory_interval: Duration::from_millis(250),
            timeline_events: DEFAULT_TIMELINE_EVENTS,
            focus: Vec::new(),
            output_dir: PathBuf::from("profile_output"),
            quiet: false,
            save_readout: false,
            push: None,
            command_as_root: false,
            invoking_user: None,
        }
    }

    /// Whether a probe family is on for this run.
    pub fn wants(&self, family: Focus) -> bool {
        self.focus.is_empty() || self.focus.contains(&family)
    }

    /// The families this run traces, decided once: the stages read this, not `--focus`.
    pub fn families(&self) -> Families {
        Families {
            cpu: self.wants(Focus::Cpu),
            sched: self.wants(Focus::Sched),
            syscalls: self.wants(Focus::Syscalls),
            gpu: self.wants(Focus::Gpu),
            memory: self.wants(Focus::Memory),
            heap: self.malloc && self.wants(Focus::Memory),
        }
    }
}

/// The probe families of one run (see [`TraceConfig::families`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Families {
    pub cpu: bool,
    pub sched: bool,
    pub syscalls: bool,
    pub gpu: bool,
    pub memory: bool,
    /// The heap probes (`--malloc`, within memory).
    pub heap: bool,
}

impl Families {
    /// Turns off every family not in `focus` (the heap goes with memory).
    pub fn keep_only(&mut self, focus: &[Focus]) {
        let keep = |family| focus.contains(&family);
        self.cpu &= keep(Focus::Cpu);
        self.sched &= keep(Focus::Sched);
        self.syscalls &= keep(Focus::Syscalls);
        self.gpu &= keep(Focus::Gpu);
        self.memory &= keep(Focus::Memory);
        self.heap &= self.memory;
    }
}

/// A `--func BIN:SYMBOL` request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuncSpec {
    /// A path, or a file name looked up in the target's memory map.
    pub binary: String,
    pub symbol: String,
}

impl FuncSpec {
    /// The binary as a path, when it is one (not a name looked up in the target's maps).
    pub fn path(&self) -> Option<&std::path::Path> {
        self.binary.contains('/').then(|| std::path::Path::new(&self.binary))
    }
}

impl std::str::FromStr for FuncSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (binary, symbol) = text
            .rsplit_once(':')
            .filter(|(binary, symbol)| !binary.is_empty() && !symbol.is_empty())
            .ok_or_else(|| {
                format!("expected BIN:SYMBOL (a path or library name, then a function), got {text:?}")
            })?;
        Ok(FuncSpec { binary: binary.to_string(), symbol: symbol.to_string() })
    }
}
