//! A saved read-out: everything the stages after collection use, as data. A live run builds
//! one from the kernel's maps (`record::reader::MapReader`), its process table and what the uprobe
//! families gathered, and analyzes it; `--save-readout` also writes it to the output directory
//! as `readout.json`, with the symbol names the run resolved. [`crate::analysis::replay`] runs a
//! saved one through the same analysis, report and Markdown, without root and without the
//! traced binaries: the golden tests of `tests/replay.rs` are real runs replayed.

pub mod reader;

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sysprof_common::Counter;

use crate::{
    config::{Families, SampleEvent, Target, TraceConfig},
    funcs::ProbedFunction,
    gpu::{ProbedLibrary, nvml},
    memory::heap::ProbedAllocator,
    probes::{AttachedProbe, DetachReport, ProgramCost},
    procs::ProcessRecord,
    record::reader::MapSnapshot,
    symbolize::Symbols,
};

/// The format of `readout.json`; a replay refuses any other.
pub const FORMAT: u32 = 2;

/// The file name in the output directory.
pub const FILE_NAME: &str = "readout.json";

#[derive(Debug, Serialize, Deserialize)]
pub struct Recording {
    pub format: u32,
    pub props: RunProps,
    pub run: RunFacts,
    /// The kernel's maps as the families read them.
    pub maps: MapSnapshot,
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
pub(crate) struct RunProps {
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

impl RunProps {
    pub(crate) fn of(config: &TraceConfig) -> Self {
        let families = config.families();
        RunProps {
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
    pub events: Vec<crate::record::reader::Bytes>,
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
        let recording: Recording = serde_json::from_slice(bytes)?;
        recording
            .check()
            .map_err(|claim| anyhow::anyhow!("{claim}; the read-out is damaged: record it again"))?;
        Ok(recording)
    }

    /// What a read-out claims against what a run can have: the figures every stage divides by
    /// or multiplies with (CPUs, the sampling frequency, the run's length), shares, costs, and
    /// the kernel's counters (no CPU counts more than one event a nanosecond). The field and
    /// why, for the one line that refuses it.
    fn check(&self) -> Result<(), String> {
        let run = &self.run;
        let elapsed_ns = u64::try_from(run.elapsed.as_nanos()).unwrap_or(u64::MAX);
        if !(1..=MAX_CPUS).contains(&run.cpus) {
            return Err(format!("run.cpus is {}, where a machine has 1 to {MAX_CPUS}", run.cpus));
        }
        if !(1..=MAX_FREQUENCY_HZ).contains(&self.props.frequency_hz) {
            return Err(format!(
                "props.frequency_hz is {}, where sysprof samples at 1 to {MAX_FREQUENCY_HZ} Hz",
                self.props.frequency_hz
            ));
        }
        // CLOCK_MONOTONIC at the end counts from boot: the run fits in it.
        if run.end_ns > MAX_MONOTONIC_NS {
            return Err(format!("run.end_ns is {}, past 146 years of the monotonic clock", run.end_ns));
        }
        if elapsed_ns > run.end_ns {
            return Err(format!(
                "run.elapsed ({elapsed_ns} ns) is longer than the machine had been up at its end (run.end_ns {})",
                run.end_ns
            ));
        }
        let share = |field: &str, value: Option<f64>| match value {
            Some(value) if !(0.0..=1.0).contains(&value) => {
                Err(format!("{field} is {value:?}, where a share is 0 to 1"))
            }
            _ => Ok(()),
        };
        share("run.machine_busy_share", run.machine_busy_share)?;
        share("run.stats_coverage", Some(run.stats_coverage))?;
        let cost = |field: &str, value: Option<f64>| match value {
            Some(value) if !(0.0..=MAX_CALL_COST_NS).contains(&value) => {
                Err(format!("{field} is {value:?}, where a probed call costs 0 to {MAX_CALL_COST_NS} ns"))
            }
            _ => Ok(()),
        };
        cost("run.probe_cost_ns", run.probe_cost_ns)?;
        cost("run.heap_probe_cost_ns", run.heap_probe_cost_ns)?;
        cost("run.heap_free_probe_cost_ns", run.heap_free_probe_cost_ns)?;
        cost("run.probe_share.emulated_ns", run.probe_share.emulated_ns.map(|ns| ns as f64))?;
        cost("run.probe_share.stepped_ns", run.probe_share.stepped_ns.map(|ns| ns as f64))?;
        if let Some((cpu_s, _)) = run.own_usage
            && !(0.0..=MAX_MONOTONIC_NS as f64 / 1e9 * f64::from(MAX_CPUS)).contains(&cpu_s)
        {
            return Err(format!("run.own_usage's CPU seconds are {cpu_s:?}"));
        }
        if let Some(timeline) = &self.timeline
            && timeline.clocks.monotonic_ns > run.end_ns
        {
            return Err(format!(
                "timeline.clocks.monotonic_ns ({}) is after the run's end (run.end_ns {})",
                timeline.clocks.monotonic_ns, run.end_ns
            ));
        }
        // Counters count from the attach to the read-out, a little past the run's clock.
        let most = elapsed_ns.saturating_add(COUNTING_SLACK_NS);
        let counters = [sysprof_common::names::COUNTERS, sysprof_common::signals::SIGNALS_LOST];
        for (name, index, values) in self.maps.per_cpu_entries().filter(|(name, ..)| counters.contains(name))
        {
            for (cpu, value) in values.iter().enumerate() {
                let count: u64 = value.decode().map_err(|error| error.to_string())?;
                if count > most {
                    return Err(format!(
                        "maps.per_cpu.{name}[{index}] counts {} events on CPU {cpu} in a run of {:.1} s: more \
                         than one a nanosecond",
                        crate::report::format::thousands(count),
                        run.elapsed.as_secs_f64()
                    ));
                }
            }
        }
        // Each sample is counted, and then kept under its stack where the map has room: the
        // stacks' counts add up to the count, and the samples taken while the maps were read
        // (the counters first, with the probes still attached) at most. This bounds every sum
        // of the CPU profile.
        let counted: u128 = self
            .maps
            .per_cpu_entries()
            .filter(|(name, index, _)| {
                *name == sysprof_common::names::COUNTERS && *index == Counter::CpuSamples as u32
            })
            .flat_map(|(.., values)| values)
            .map(|value| value.decode::<u64>().map(u128::from).unwrap_or(0))
            .sum();
        let mut kept: u128 = 0;
        for value in self.maps.hash_values(sysprof_common::names::CPU_SAMPLES) {
            kept += u128::from(
                value.decode::<u64>().map_err(|error| format!("maps.hashes.CPU_SAMPLES: {error}"))?,
            );
        }
        let while_read = u128::from(self.props.frequency_hz) * u128::from(run.cpus) * READ_SLACK_S;
        if kept > counted + while_read {
            let thousands = crate::report::format::thousands;
            return Err(format!(
                "maps.hashes.CPU_SAMPLES holds {} samples, more than the {} maps.per_cpu.COUNTERS counted",
                u64::try_from(kept).map_or_else(|_| format!("over {}", thousands(u64::MAX)), thousands),
                thousands(u64::try_from(counted).unwrap_or(u64::MAX))
            ));
        }
        Ok(())
    }
}

/// The most CPUs a machine has (the kernel's NR_CPUS is at most 8,192).
const MAX_CPUS: u32 = 1 << 16;
/// Above what sysprof samples at (perf_event_max_sample_rate's default is 100 kHz).
const MAX_FREQUENCY_HZ: u64 = 1_000_000;
/// 146 years of CLOCK_MONOTONIC.
const MAX_MONOTONIC_NS: u64 = 1 << 62;
/// A probed call's cost, at most: a second.
const MAX_CALL_COST_NS: f64 = 1e9;
/// How long the maps take to read, at most, in seconds: generously.
const READ_SLACK_S: u128 = 60;
/// How long the kernel's counters may count past the run's clock (the attach before it, the
/// read-out after it): a minute, generously.
const COUNTING_SLACK_NS: u64 = 60_000_000_000;

#[cfg(test)]
mod tests {
    use super::*;

    fn real() -> serde_json::Value {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/cpu-two-threads/readout.json");
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    type Patch = fn(&mut serde_json::Value);

    fn refused(readout: &serde_json::Value) -> String {
        Recording::from_json(readout.to_string().as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn a_real_read_out_passes_and_impossible_claims_are_named() {
        assert!(Recording::from_json(real().to_string().as_bytes()).is_ok());
        let cases: [(&str, Patch); 7] = [
            ("run.cpus is 0", |r| r["run"]["cpus"] = 0.into()),
            ("props.frequency_hz is 0", |r| r["props"]["frequency_hz"] = 0.into()),
            ("run.elapsed (", |r| r["run"]["end_ns"] = 5.into()),
            ("run.machine_busy_share is 1.5", |r| r["run"]["machine_busy_share"] = 1.5.into()),
            ("run.stats_coverage is -0.1", |r| r["run"]["stats_coverage"] = (-0.1).into()),
            ("run.probe_cost_ns is 1e300", |r| r["run"]["probe_cost_ns"] = 1e300.into()),
            ("maps.per_cpu.COUNTERS[0] counts", |r| {
                r["maps"]["per_cpu"]["COUNTERS"]["0"][1] = "0000000000000080".into()
            }),
        ];
        for (field, patch) in cases {
            let mut readout = real();
            patch(&mut readout);
            let error = refused(&readout);
            assert!(error.starts_with(field), "{field}: {error}");
            assert!(error.ends_with("; the read-out is damaged: record it again"), "{error}");
        }
    }
}
