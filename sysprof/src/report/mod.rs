//! The report model: one structure that every dimension adds its tables and recommendations
//! to, rendered as report.md and serialized as report.json.

pub mod format;
pub mod recommendation;
pub mod section;

use serde::{Serialize, ser::SerializeMap as _};

pub use self::{
    recommendation::Recommendation,
    section::{Section, Sections},
};
use crate::{
    config::SampleEvent,
    probes::{AttachedProbe, DetachReport, ProgramCost},
};

/// Everything a run found, in the order the report presents it.
#[derive(Debug)]
pub struct Report {
    pub sysprof_version: String,
    pub run: RunSummary,
    /// The sections of the families that ran (CPU, scheduling, syscalls, memory, GPU, NVML,
    /// `--func`), each under its own keys in report.json.
    pub sections: Sections,
    /// Ranked by expected impact, largest first.
    pub recommendations: Vec<Recommendation>,
    pub overhead: Overhead,
    /// What sysprof could not see, and why.
    pub limitations: Vec<String>,
    /// Part B: what was instrumented, and proof it was removed.
    pub instrumentation: Instrumentation,
}

impl Serialize for Report {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("sysprof_version", &self.sysprof_version)?;
        map.serialize_entry("run", &self.run)?;
        for section in self.sections.iter() {
            for (key, value) in section.json() {
                map.serialize_entry(key, value)?;
            }
        }
        map.serialize_entry("recommendations", &self.recommendations)?;
        map.serialize_entry("overhead", &self.overhead)?;
        map.serialize_entry("limitations", &self.limitations)?;
        map.serialize_entry("instrumentation", &self.instrumentation)?;
        map.end()
    }
}

/// What was traced, for how long, and what was collected and lost.
#[derive(Clone, Debug, Serialize)]
pub struct RunSummary {
    pub target: String,
    /// The machine's node name, and the job's rank (RANK, SLURM_PROCID, ...) when set.
    pub host: String,
    pub rank: Option<String>,
    pub command: Option<Vec<String>>,
    /// Wall-clock start, RFC 3339.
    pub started_at: String,
    pub duration_s: f64,
    /// Why the trace ended: "duration", "interrupted", "command exited", ...
    pub ended_by: String,
    /// How `-- CMD` ended, when there was one ("exit status 0", "killed by SIGSEGV").
    pub command_status: Option<String>,
    pub event: SampleEvent,
    pub frequency_hz: u64,
    pub cpus: u32,
    /// Share of all CPUs' time that was busy during the trace, machine-wide (/proc/stat).
    pub machine_busy_share: Option<f64>,
    /// The target's time every recommendation's seconds are a share of: the command's wall
    /// time, or for a pid or a system-wide trace the seconds its threads were busy.
    pub target_time_s: f64,
    /// What `target_time_s` is, in words.
    pub target_time: String,
    pub samples: u64,
    pub lost: Lost,
    /// Files written, relative to the output directory.
    pub outputs: Vec<String>,
    /// How user stacks were walked: with unwind tables (what they covered), or `None` by
    /// frame pointers only.
    pub unwind: Option<crate::unwind::UnwindSummary>,
}

/// Events the kernel side could not keep.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Lost {
    /// Samples dropped because the sample map was full.
    pub samples: u64,
    /// Samples whose user stack was dropped (stack map full or collision).
    pub user_stacks: u64,
    /// Samples whose kernel stack was dropped.
    pub kernel_stacks: u64,
    /// Page-fault stacks dropped (their own map full or collided): the fault counts are exact,
    /// the fault profile is of the stacks kept.
    #[serde(default)]
    pub fault_stacks: u64,
    /// Process events dropped because the ring buffer was full.
    pub process_events: u64,
    /// Child processes not followed because the target set was full.
    pub processes_not_followed: u64,
    /// Syscalls not counted: the syscall map was full, and their number past the by-number
    /// table's.
    pub syscalls: u64,
    /// Failed syscalls whose errno was not kept (the errno map was full): in the failure
    /// counts, not in the failures by errno.
    #[serde(default)]
    pub syscall_errnos: u64,
    /// Scheduler events not counted (map full or no task storage).
    pub sched_events: u64,
    /// Off-CPU intervals not counted because the off-CPU map was full.
    pub offcpu_intervals: u64,
    /// Waits left out of the who-woke-whom table (its map was full); their off-CPU time counts.
    #[serde(default)]
    pub wakes: u64,
    /// Probed calls not counted (call map full).
    pub calls: u64,
    /// Call events dropped (ring buffer full): their arguments are missing from the GPU tables.
    pub call_events: u64,
    /// Page faults not counted (fault map full).
    pub faults: u64,
    /// Allocations not counted or not tracked (heap maps full).
    pub allocations: u64,
}

impl Lost {
    pub fn total(&self) -> u64 {
        self.samples
            + self.user_stacks
            + self.kernel_stacks
            + self.fault_stacks
            + self.process_events
            + self.processes_not_followed
            + self.syscalls
            + self.syscall_errnos
            + self.sched_events
            + self.offcpu_intervals
            + self.wakes
            + self.calls
            + self.call_events
            + self.faults
            + self.allocations
    }
}

/// sysprof's own cost during the run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Overhead {
    /// Per program: runs and run time, estimated for the whole run from the sampled windows.
    pub programs: Vec<ProgramCost>,
    /// Time spent in sysprof's BPF programs, all CPUs together.
    pub bpf_time_ns: u64,
    /// That time as a share of the CPU time available during the run (duration x CPUs).
    pub bpf_cpu_share: f64,
    /// CPU time of the sysprof process itself (user + system).
    pub sysprof_cpu_s: f64,
    pub sysprof_peak_rss_kib: u64,
    /// The kernel memory its BPF maps and programs held: memory of the machine's (charged to
    /// sysprof's memory cgroup) that RSS does not show. None for recordings from before it
    /// was kept.
    pub kernel_memory: Option<crate::kernel_memory::KernelMemory>,
    /// False where the kernel refused to keep BPF run-time statistics.
    pub bpf_stats_available: bool,
    /// Share of the run the statistics were on for; runs and times above are scaled up from it.
    pub bpf_stats_coverage: f64,
}

/// Part B: the changelog of what sysprof did to the system.
#[derive(Clone, Debug, Serialize)]
pub struct Instrumentation {
    /// Probed files (libraries and programs with uprobes) that changed during the trace, each
    /// with what changed: sysprof opens them read-only, so any change is someone else's; checked
    /// at the end, not assumed.
    pub files_modified: Vec<String>,
    pub probes: Vec<AttachedProbe>,
    pub detach: DetachReport,
}
