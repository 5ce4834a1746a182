//! A saved read-out: everything the stages after collection use, as data. A live run builds
//! one from the kernel's maps (`readout::MapReader`), its process table and what the uprobe
//! families gathered, and analyzes it; `--save-readout` also writes it to the output directory
//! as `readout.json`, with the symbol names the run resolved. [`crate::analysis::replay`] runs a
//! saved one through the same analysis, report and Markdown, without root and without the
//! traced binaries: the golden tests of `tests/replay.rs` are real runs replayed.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{
    config::{Families, SampleEvent, Target, TraceConfig},
    funcs::ProbedFunction,
    gpu::{ProbedLibrary, nvml},
    memory::heap::ProbedAllocator,
    probes::{AttachedProbe, DetachReport, ProgramCost},
    procs::ProcessRecord,
    readout::MapContents,
    symbolize::Symbols,
};

/// The format of `readout.json`; a replay refuses any other.
pub const FORMAT: u32 = 2;

/// The file name in the output directory.
pub const FILE_NAME: &str = "readout.json";

#[derive(Debug, Serialize, Deserialize)]
pub struct Recording {
    pub format: u32,
    pub props: ReportProps,
    pub run: RunFacts,
    /// The kernel's maps as the families read them.
    pub maps: MapContents,
    /// The targets' processes with their memory-map snapshots.
    pub processes: Vec<(u32, ProcessRecord)>,
    /// How often the processes' memory was read, when it was.
    pub memory_interval: Option<Duration>,
    /// What each address resolved to (empty until the analysis symbolized them).
    pub symbols: Symbols,
    /// The build ids of the files the profiles name (path -> id), read by the live analysis, so
    /// that a replay, which reads no file, writes them too.
    #[serde(default)]
    pub build_ids: std::collections::BTreeMap<String, String>,
    pub calls: CallOutcome,
    /// The timeline's events, when it was on.
    #[serde(default)]
    pub timeline: Option<crate::timeline::Timeline>,
    /// NVML polls and the topology, when NVML was there.
    pub nvml: Option<(Vec<nvml::Sample>, nvml::topology::Topology)>,
    /// The programs' run-time statistics (measured in windows), and whether the kernel kept any.
    pub costs: Vec<ProgramCost>,
    pub stats_available: bool,
    pub attached: Vec<AttachedProbe>,
    /// Probed files that changed during the trace (Part B).
    pub files_changed: Vec<String>,
    /// The detach proof; known once the detach finished (after the analysis of a live run).
    pub detach: Option<DetachReport>,
    pub limitations: Vec<String>,
}

/// What the stages after collection (read-out, analysis, write) need of the configuration,
/// decided once by the pipeline: the finish stage never asks the configuration again.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ReportProps {
    /// The target, as the report names it.
    pub target: String,
    /// `-- CMD`'s arguments.
    pub command: Option<Vec<String>>,
    pub event: SampleEvent,
    pub frequency_hz: u64,
    pub gpu_interval_ms: u64,
    pub quiet: bool,
    pub families: Families,
    /// Whether calls were probed (GPU libraries or `--func`): the call map is read.
    pub calls_probed: bool,
    /// Whether `readout.json` is written beside the report.
    pub save_readout: bool,
    /// Entries of each stack map (`--stack-storage-size`).
    #[serde(default = "default_stack_storage")]
    pub stack_storage_size: u32,
    /// `--push URL`, with the labels only the trace knows; never part of a saved run (a
    /// re-rendered run pushes nothing).
    #[serde(skip)]
    pub push: Option<PushProps>,
}

/// Where the profiles are pushed, and the target's service name and pid for their labels.
#[derive(Clone, Debug)]
pub(crate) struct PushProps {
    pub url: String,
    pub service: String,
    pub pid: Option<u32>,
}

fn default_stack_storage() -> u32 {
    sysprof_common::capacity::STACKS
}

impl ReportProps {
    pub(crate) fn of(config: &TraceConfig) -> Self {
        let families = config.families();
        ReportProps {
            target: config.target.to_string(),
            command: match &config.target {
                Target::Command(argv) => {
                    Some(argv.iter().map(|a| a.to_string_lossy().into_owned()).collect())
                }
                _ => None,
            },
            event: config.event,
            frequency_hz: config.frequency_hz,
            gpu_interval_ms: config.gpu_interval.as_millis() as u64,
            quiet: config.quiet,
            families,
            calls_probed: families.gpu || !config.functions.is_empty(),
            save_readout: config.save_readout,
            stack_storage_size: config.stack_storage_size,
            // Set by the trace once the target is known (see `trace::run`).
            push: None,
        }
    }
}

/// How much of a probed call's time, as the call programs time it, is the probes' own, by
/// the kind of the function's first instruction (`uprobes::entry_point`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbeShare {
    /// Where the kernel emulates it (a push, a nop, a jump or a call).
    pub emulated_ns: Option<u64>,
    /// Where it steps it out of line (any other, endbr64 among them: probed past it where a
    /// push follows).
    pub stepped_ns: Option<u64>,
}

impl ProbeShare {
    /// The share for a function whose first instruction is `emulated` (unknown: the lower).
    pub fn of(&self, emulated: Option<bool>) -> Option<u64> {
        match emulated {
            Some(false) => self.stepped_ns.or(self.emulated_ns),
            _ => self.emulated_ns,
        }
    }
}

/// When and how the trace ran.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunFacts {
    /// The machine (its node name) and the job's rank as the launcher set it, which `sysprof
    /// merge` tells the runs of one job apart by.
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub rank: Option<String>,
    /// Wall-clock start, RFC 3339.
    pub started_at: String,
    pub elapsed: Duration,
    /// CLOCK_MONOTONIC at the end, for threads still on a CPU then.
    pub end_ns: u64,
    /// Why the trace ended, in words.
    pub ended_by: String,
    /// How `-- CMD` ended, in words, and the exit code of the run.
    pub command_status: Option<String>,
    pub exit_code: u8,
    pub cpus: u32,
    /// sysprof's own process id: its calibrations are never the target's figures.
    pub sysprof_pid: u32,
    pub machine_busy_share: Option<f64>,
    /// Share of the run the kernel's BPF statistics were on.
    pub stats_coverage: f64,
    /// Measured cost of one probed call, when calls were probed.
    pub probe_cost_ns: Option<f64>,
    /// How much of a probed call's time, as the call programs time it, is the probes' own
    /// (`uprobes::calibrate::timed_share_ns`).
    #[serde(default)]
    pub probe_share: ProbeShare,
    /// Measured cost of one allocation under the heap probes (`--malloc`); of a free too in
    /// recordings older than `heap_free_probe_cost_ns`.
    pub heap_probe_cost_ns: Option<f64>,
    /// Measured cost of one free under the heap probes (its entry only, and probed at another
    /// kind of instruction than malloc, most often: not an allocation's).
    #[serde(default)]
    pub heap_free_probe_cost_ns: Option<f64>,
    /// sysprof's own CPU seconds and peak RSS (KiB) when the report was built; None until then.
    pub own_usage: Option<(f64, u64)>,
    /// What the unwinder did, when it ran.
    #[serde(default)]
    pub unwind: Option<crate::unwind::UnwindSummary>,
    /// The kernel memory sysprof's BPF maps and programs held (None in older recordings).
    #[serde(default)]
    pub kernel_memory: Option<crate::kernel_memory::KernelMemory>,
    /// The NVML polls' interval at the end, when it was doubled to bound their series.
    #[serde(default)]
    pub gpu_interval_end_ms: Option<u64>,
}

/// What the uprobe families found while the trace ran.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct CallOutcome {
    pub gpu: Option<GpuOutcome>,
    pub heap: Option<HeapOutcome>,
    /// `--func` functions that were probed.
    pub functions: Vec<ProbedFunction>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct GpuOutcome {
    pub libraries: Vec<ProbedLibrary>,
    pub problems: Vec<String>,
    /// Every call event, in order (kept only when the read-out is saved): a replay rebuilds the
    /// GPU state from them.
    pub events: Vec<crate::readout::Bytes>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct HeapOutcome {
    pub allocators: Vec<ProbedAllocator>,
    pub problems: Vec<String>,
}

impl Recording {
    pub fn to_json(&self) -> anyhow::Result<Vec<u8>> {
        Ok(serde_json::to_vec(self)?)
    }

    pub fn from_json(bytes: &[u8]) -> anyhow::Result<Self> {
        #[derive(Deserialize)]
        struct Format {
            format: u32,
        }
        let format: Format = serde_json::from_slice(bytes)?;
        anyhow::ensure!(
            format.format == FORMAT,
            "a read-out in format {} (this sysprof reads format {FORMAT}): record it again",
            format.format
        );
        Ok(serde_json::from_slice(bytes)?)
    }
}
