//! The stages after collection: read the kernel's maps out and detach (proving nothing is
//! left), aggregate, symbolize, build the report model, and write every output.

use std::{
    collections::{BTreeSet, HashMap},
    path::PathBuf,
    time::{Duration, SystemTime},
};

use serde::{Deserialize, Serialize};
use sysprof_common::{CallKey, CallStats, Counter, names};

use crate::{
    callsites::CallNames,
    collect::{CallTracing, EndReason},
    config::{Families, SampleEvent, Target, TraceConfig},
    cpu::{self, CpuSamples},
    funcs,
    gpu::{
        self,
        nvml::{self, report::GpuMetricsReport},
        report::GpuReport,
        state::GpuState,
    },
    launch,
    launch::CommandEnd,
    memory::MemoryDump,
    memory::{
        self,
        profiles::AllocSite,
        redundancy::{self, LiveBlocks},
        report::MemoryReport,
    },
    output::{self, Artifact, OutputDir, Rendered},
    probes::{Counters, DetachReport, Probes},
    procs::ProcessTable,
    profile::{self, ResolvedStacks, StackProfile},
    readout::MapReader,
    recording::{self, Recording, RunFacts},
    report::{self, Instrumentation, Lost, Recommendation, Report, RunSummary, format::thousands},
    sched,
    sched::SchedDump,
    selfcost,
    symbolize::{Symbolizer, Symbols},
    syscalls,
    syscalls::SyscallDump,
    terminal::{say, stderr_line},
};

/// How a trace ended, for the caller and the exit code.
#[derive(Clone, Debug)]
pub struct TraceOutcome {
    /// 0, or the command's exit code for `-- CMD` (128 + signal when it was killed).
    pub exit_code: u8,
    pub output_dir: PathBuf,
    /// Files written, relative to `output_dir`.
    pub files: Vec<String>,
    pub samples: u64,
    pub lost: u64,
}

/// Number of hotspot rows in the report.
const HOTSPOTS: usize = 25;

/// When and how the trace ran, as the collect stage ends it.
pub(crate) struct Window {
    pub started_at: SystemTime,
    pub elapsed: Duration,
    /// CLOCK_MONOTONIC at the end, for threads still on a CPU then.
    pub end_ns: u64,
    pub ended_by: EndReason,
    /// How `-- CMD` ended, when there is one.
    pub command: Option<CommandEnd>,
    pub machine_busy_share: Option<f64>,
    /// Share of the run the kernel's BPF statistics were on.
    pub stats_coverage: f64,
}

/// Everything the kernel's maps held, decoded.
struct KernelData {
    counters: Counters,
    cpu: CpuSamples,
    sched: Option<SchedDump>,
    syscalls: Option<SyscallDump>,
    memory: Option<MemoryDump>,
    /// Probed calls (GPU APIs, --func) and the stacks they and the GPU state refer to.
    calls: Vec<(CallKey, CallStats)>,
    call_stacks: HashMap<u32, Vec<u64>>,
}

impl KernelData {
    /// Reads every map the run filled (the same reads, live or replayed).
    fn read(maps: &mut MapReader<'_>, props: &FinishProps, gpu: Option<&GpuState>) -> anyhow::Result<Self> {
        let families = props.families;
        let counters = Counters::read(maps)?;
        let cpu = CpuSamples::read(maps)?;
        let sched = families.sched.then(|| SchedDump::read(maps)).transpose()?;
        let syscalls = families.syscalls.then(|| SyscallDump::read(maps)).transpose()?;
        let memory = families.memory.then(|| MemoryDump::read(maps, families.heap)).transpose()?;
        let calls = if props.calls_probed { maps.entries(names::CALLS)? } else { Vec::new() };
        let mut stack_ids: BTreeSet<u32> = calls
            .iter()
            .filter_map(|(key, _): &(CallKey, CallStats)| u32::try_from(key.user_stack_id).ok())
            .collect();
        if let Some(gpu) = gpu {
            stack_ids.extend(gpu.live().filter_map(|(_, a)| u32::try_from(a.user_stack_id).ok()));
            stack_ids.extend(gpu.h2d.iter().filter_map(|c| u32::try_from(c.user_stack_id).ok()));
        }
        let call_stacks = maps.stacks(names::STACKS, &stack_ids)?;
        Ok(KernelData { counters, cpu, sched, syscalls, memory, calls, call_stacks })
    }

    /// Every process the samples name, for the process table to know them all before the
    /// analysis (which reads nothing from /proc, so that a replay analyzes alike).
    fn processes(&self) -> BTreeSet<u32> {
        let mut pids: BTreeSet<u32> = self.cpu.counts.iter().map(|(key, _)| key.tgid).collect();
        if let Some(sched) = &self.sched {
            pids.extend(sched.offcpu.iter().map(|(key, _)| key.tgid));
        }
        if let Some(memory) = &self.memory {
            pids.extend(memory.fault_stacks.iter().map(|(key, _)| key.tgid));
            pids.extend(memory.alloc_sites.iter().map(|(key, _)| key.tgid));
        }
        pids.remove(&0);
        pids
    }
}

/// What the stages after collection need of the configuration, decided once by the pipeline.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct FinishProps {
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
}

impl FinishProps {
    pub(crate) fn of(config: &TraceConfig) -> Self {
        let families = config.families();
        FinishProps {
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
        }
    }
}

/// The stages after collection: read out, detach, aggregate, symbolize, write.
pub(crate) struct Finish {
    pub props: FinishProps,
    pub probes: Probes,
    pub processes: ProcessTable,
    pub output: OutputDir,
    pub limitations: Vec<String>,
    pub window: Window,
    pub calls: CallTracing,
    /// Measured cost of one probed call, when calls were probed.
    pub probe_cost_ns: Option<f64>,
    /// Measured cost of one allocator call under the heap probes (`--malloc`).
    pub heap_probe_cost_ns: Option<f64>,
    /// NVML polls and the topology, when NVML was there.
    pub nvml_samples: Option<(Vec<nvml::Sample>, nvml::topology::Topology)>,
}

impl Finish {
    pub(crate) fn run(self) -> anyhow::Result<TraceOutcome> {
        let Finish {
            props,
            probes,
            mut processes,
            mut output,
            mut limitations,
            window,
            calls,
            probe_cost_ns,
            heap_probe_cost_ns,
            nvml_samples,
        } = self;
        // Read everything, then start detaching: the probes go before the slow stages
        // (symbolization), and the detach is verified before the report is written.
        let mut maps = MapReader::live(&probes, props.save_readout);
        let kernel = KernelData::read(&mut maps, &props, calls.gpu.as_ref().map(|gpu| &gpu.state))?;
        let maps = maps.into_contents();
        let costs = probes.costs();
        let stats_available = probes.stats_available();
        let attached = probes.attached().to_vec();
        let files_changed = probes.probed_files_changed();
        let detach = probes.detach();
        processes.final_scan();
        for pid in kernel.processes() {
            processes.ensure(pid);
        }

        limitations.extend(tracer_limitations(props.quiet, &calls));
        let (command_status, exit_code) = match &window.command {
            Some(end) => {
                let (text, code) = describe_end(end, &window.ended_by);
                (Some(text), code)
            }
            None => (None, 0),
        };
        let (gpu_state, outcome) = calls.into_outcome();
        // Before the analysis, which adds processes it symbolizes (sysprof's own, for one).
        let snapshot: Vec<_> = match props.save_readout {
            true => processes.iter().map(|(pid, record)| (pid, record.clone())).collect(),
            false => Vec::new(),
        };
        let mut recording = Recording {
            format: recording::FORMAT,
            run: RunFacts {
                started_at: humantime::format_rfc3339_seconds(window.started_at).to_string(),
                elapsed: window.elapsed,
                end_ns: window.end_ns,
                ended_by: window.ended_by.describe(),
                command_status,
                exit_code,
                sysprof_pid: std::process::id(),
                cpus: aya::util::online_cpus().map(|cpus| cpus.len() as u32).unwrap_or(1),
                machine_busy_share: window.machine_busy_share,
                stats_coverage: window.stats_coverage,
                probe_cost_ns,
                heap_probe_cost_ns,
                own_usage: None,
            },
            props,
            maps,
            processes: snapshot,
            memory_interval: processes.memory_interval(),
            symbols: Symbols::default(),
            calls: outcome,
            nvml: nvml_samples,
            costs,
            stats_available,
            attached,
            files_changed,
            detach: None,
            limitations,
        };

        let mut symbolizer = Symbolizer::new();
        let Analyzed { mut report, mut files, cpu_samples } =
            analyze(&recording, kernel, &mut processes, gpu_state.as_ref(), &mut symbolizer)?;
        let detach = detach.wait();
        report.instrumentation.detach = detach.clone();
        let props = &recording.props;
        if props.save_readout {
            recording.detach = Some(detach);
            recording.run.own_usage =
                Some((report.overhead.sysprof_cpu_s, report.overhead.sysprof_peak_rss_kib));
            recording.symbols = symbolizer.answers().clone();
            files.push(Rendered { name: recording::FILE_NAME.into(), bytes: recording.to_json()? });
        }
        let quiet = props.quiet;
        let exit_code = recording.run.exit_code;
        let (report, written) = write_all(&mut output, report, files)?;
        let removed = output.remove_stale(&written.written);

        if !quiet {
            print_summary(&output, &written, &removed, &report, cpu_samples);
        }
        // Said even with --quiet: results that are missing are never a quiet matter.
        let mut reasons: Vec<&str> = written.failed.iter().map(|(_, reason)| reason.as_str()).collect();
        reasons.sort_unstable();
        reasons.dedup();
        for reason in reasons {
            let names: Vec<&str> =
                written.failed.iter().filter(|(_, r)| r == reason).map(|(name, _)| name.as_str()).collect();
            stderr_line(format_args!(
                "error: could not write {} in {}: {reason}; free space there or choose another directory with -o DIR",
                names.join(", "),
                output.path().display()
            ));
        }
        let exit_code = if written.failed.is_empty() || exit_code != 0 { exit_code } else { 1 };
        Ok(TraceOutcome {
            exit_code,
            output_dir: output.path().to_path_buf(),
            files: written.written,
            samples: report.run.samples,
            lost: report.run.lost.total(),
        })
    }
}

/// A saved read-out (`readout.json`) through the analysis a live run does: its report, and the
/// folded stacks and flamegraphs that go with it.
pub fn replay(readout: &[u8]) -> anyhow::Result<(Report, Vec<Rendered>)> {
    let recording = Recording::from_json(readout)?;
    let gpu_state = recording.calls.gpu.as_ref().map(|gpu| GpuState::replay(&gpu.events)).transpose()?;
    let mut maps = MapReader::replay(&recording.maps);
    let kernel = KernelData::read(&mut maps, &recording.props, gpu_state.as_ref())?;
    let mut processes =
        ProcessTable::from_records(recording.processes.iter().cloned(), recording.memory_interval);
    let mut symbolizer = Symbolizer::replay(recording.symbols.clone());
    let Analyzed { report, files, .. } =
        analyze(&recording, kernel, &mut processes, gpu_state.as_ref(), &mut symbolizer)?;
    Ok((report, files))
}

struct Analyzed {
    report: Report,
    /// Folded stacks and flamegraphs, rendered.
    files: Vec<Rendered>,
    /// On-CPU samples with a stack, for the closing line.
    cpu_samples: u64,
}

/// Aggregates, symbolizes and builds the report model; the detach proof is the caller's.
fn analyze(
    recording: &Recording,
    kernel: KernelData,
    processes: &mut ProcessTable,
    gpu_state: Option<&GpuState>,
    symbolizer: &mut Symbolizer,
) -> anyhow::Result<Analyzed> {
    let props = &recording.props;
    let run = &recording.run;
    let outcome = &recording.calls;
    let mut limitations = recording.limitations.clone();
    let profiles = Profiles::build(&kernel, processes, symbolizer, run.sysprof_pid);
    let names = CallNames::new(&kernel.calls, gpu_state, &kernel.call_stacks, processes, symbolizer);
    let wall_s = run.elapsed.as_secs_f64();
    let gpu = outcome.gpu.as_ref().zip(gpu_state).map(|(gpu, state)| {
        let gpu_calls: Vec<_> = kernel
            .calls
            .iter()
            .filter(|(key, _)| gpu::functions::by_id(key.func).is_some())
            .copied()
            .collect();
        gpu::report::build(gpu.libraries.clone(), state, &gpu_calls, &names, wall_s, run.probe_cost_ns)
    });
    let functions = funcs::rows(&outcome.functions, &kernel.calls, &names);
    let gpu_metrics = recording.nvml.clone().map(|(samples, topology)| {
        let targets: BTreeSet<u32> = processes.iter().map(|(pid, _)| pid).collect();
        nvml::report::build(samples, topology, props.gpu_interval_ms, gpu.as_ref(), &targets)
    });
    let memory = kernel.memory.as_ref().map(|dump| {
        let live = outcome.heap.is_some().then(|| LiveBlocks::new(&dump.live));
        let copied_ranges = gpu_state
            .map(|state| redundancy::copied_ranges(state, live.as_ref(), &names))
            .unwrap_or_default();
        memory::report::build(memory::report::Inputs {
            processes,
            dump,
            fault_sites: profiles.faults.as_ref().map(memory::profiles::fault_sites).unwrap_or_default(),
            heap: outcome
                .heap
                .as_ref()
                .map(|heap| (heap.allocators.clone(), profiles.alloc_sites.clone(), run.heap_probe_cost_ns)),
            gpu: gpu_state,
            gpu_metrics: gpu_metrics.as_ref(),
            copied_ranges,
            wall_s,
            sysprof_pid: run.sysprof_pid,
        })
    });

    if let Some(memory) = &memory {
        limitations.extend(memory::report::limitations(memory, processes));
    }

    // Rendered in memory, written after the report (see write_all).
    let files = profiles.render(props)?;
    let mut outputs: Vec<String> = files.iter().map(|f| f.name.clone()).collect();
    outputs.extend(["report.md".to_string(), "report.json".to_string()]);
    if props.save_readout {
        outputs.push(recording::FILE_NAME.into());
    }

    let lost = lost(&kernel.counters);
    if lost.total() > 0 {
        limitations.push(format!(
            "{} events were lost in the kernel (see Lost above): the figures are computed from what was kept",
            thousands(lost.total())
        ));
    }
    let cpus = run.cpus;
    let sched = kernel
        .sched
        .as_ref()
        .zip(profiles.offcpu.as_ref())
        .map(|(dump, offcpu)| sched::analyze(dump, offcpu, processes, run.elapsed, run.end_ns));
    let syscalls = kernel
        .syscalls
        .as_ref()
        .filter(|_| props.families.syscalls)
        .map(|dump| syscalls::analyze(dump, processes, run.elapsed));
    let hotspots = cpu::hotspots(&profiles.cpu, HOTSPOTS);
    let recommendations = Ranked {
        cpu: &profiles.cpu,
        hotspots: &hotspots,
        sched: sched.as_ref(),
        syscalls: syscalls.as_ref(),
        gpu: gpu.as_ref(),
        gpu_metrics: gpu_metrics.as_ref(),
        memory: memory.as_ref(),
        cpus,
        wall_s,
    }
    .recommendations();
    let mut overhead = selfcost::overhead(
        recording.costs.clone(),
        recording.stats_available,
        run.stats_coverage,
        run.elapsed,
        cpus,
    );
    if let Some((cpu_s, peak_rss_kib)) = run.own_usage {
        (overhead.sysprof_cpu_s, overhead.sysprof_peak_rss_kib) = (cpu_s, peak_rss_kib);
    }
    let report = Report {
        sysprof_version: env!("CARGO_PKG_VERSION").into(),
        run: RunSummary {
            target: props.target.clone(),
            command: props.command.clone(),
            started_at: run.started_at.clone(),
            duration_s: wall_s,
            ended_by: run.ended_by.clone(),
            command_status: run.command_status.clone(),
            event: props.event,
            frequency_hz: props.frequency_hz,
            cpus,
            machine_busy_share: run.machine_busy_share,
            samples: kernel.counters.get(Counter::CpuSamples),
            lost,
            outputs,
        },
        processes: cpu::process_shares(&profiles.cpu),
        hotspots,
        sched,
        syscalls,
        gpu,
        gpu_metrics,
        memory,
        functions,
        recommendations,
        overhead,
        limitations,
        instrumentation: Instrumentation {
            files_modified: recording.files_changed.clone(),
            probes: recording.attached.clone(),
            // A live run's proof comes after the analysis (see Finish::run).
            detach: recording
                .detach
                .clone()
                .unwrap_or(DetachReport { programs: 0, still_loaded: Vec::new() }),
        },
    };
    Ok(Analyzed { report, files, cpu_samples: profiles.cpu.total() })
}

/// Writes the report first (on a full disk it is what must survive), then the folded stacks,
/// then the flamegraphs. Files that will not fit in the room the disk has are left out before
/// anything is written, so the report, written first, already says which; a write that fails
/// anyway gets the report written again, as far as the disk allows (each file is replaced
/// whole or not at all, so the first report stays intact).
fn write_all(
    output: &mut OutputDir,
    mut report: Report,
    mut profiles: Vec<Rendered>,
) -> anyhow::Result<(Report, output::Written)> {
    profiles.sort_by_key(|file| file.name.ends_with(".svg"));
    // (file, why it was not written), as `Written::failed` has them.
    let mut skipped: Vec<(String, String)> = Vec::new();
    if let Some((free, block)) = output.room() {
        let on_disk = |bytes: usize| (bytes as u64).div_ceil(block).max(1) * block;
        // The report as it is now, and room for the lines this adds to it.
        let reports: u64 =
            output::render(&Artifact::Report(&report))?.iter().map(|f| on_disk(f.bytes.len()) + block).sum();
        let mut left = free.saturating_sub(reports);
        profiles.retain(|file| {
            let needs = on_disk(file.bytes.len());
            let fits = needs <= left;
            if fits {
                left -= needs;
            } else {
                let reason = format!(
                    "it needs {} and {} had {} free",
                    report::format::bytes(needs),
                    output.path().display(),
                    report::format::bytes(free)
                );
                skipped.push((file.name.clone(), reason));
            }
            fits
        });
    }
    let planned: Vec<&str> = profiles.iter().map(|f| f.name.as_str()).collect();
    report.run.outputs.retain(|name| name.starts_with("report.") || planned.contains(&name.as_str()));
    report
        .limitations
        .extend(skipped.iter().map(|(name, reason)| format!("{name} could not be written: {reason}")));
    let mut files = output::render(&Artifact::Report(&report))?;
    files.extend(profiles);
    let mut written = output.write(&files);
    if !written.failed.is_empty() || !written.notes.is_empty() {
        report.limitations.extend(written.notes.iter().cloned());
        for (name, reason) in &written.failed {
            report.limitations.push(format!("{name} could not be written: {reason}"));
        }
        report.run.outputs.retain(|name| written.written.contains(name));
        let again = output.write(&output::render(&Artifact::Report(&report))?);
        for name in again.written {
            if !written.written.contains(&name) {
                written.written.push(name.clone());
                written.failed.retain(|(failed, _)| *failed != name);
            }
        }
    }
    written.failed.extend(skipped);
    Ok((report, written))
}

/// Every stack profile of the run, symbolized.
struct Profiles {
    cpu: StackProfile,
    offcpu: Option<StackProfile>,
    faults: Option<StackProfile>,
    alloc: Option<StackProfile>,
    alloc_sites: Vec<AllocSite>,
}

impl Profiles {
    fn build(
        kernel: &KernelData,
        processes: &mut ProcessTable,
        symbolizer: &mut Symbolizer,
        sysprof_pid: u32,
    ) -> Self {
        let cpu = profile::cpu_profile(&kernel.cpu, processes, symbolizer);
        let offcpu = kernel.sched.as_ref().map(|dump| offcpu_profile(dump, processes, symbolizer));
        let faults =
            kernel.memory.as_ref().map(|dump| memory::profiles::fault_profile(dump, processes, symbolizer));
        let (alloc, alloc_sites) = match kernel.memory.as_ref().filter(|dump| !dump.heaps.is_empty()) {
            Some(dump) => {
                let (profile, sites) =
                    memory::profiles::heap_profile(dump, processes, symbolizer, sysprof_pid);
                (Some(profile), sites)
            }
            None => (None, Vec::new()),
        };
        Profiles { cpu, offcpu, faults, alloc, alloc_sites }
    }

    /// Each profile as folded stacks and a flamegraph.
    fn render(&self, props: &FinishProps) -> anyhow::Result<Vec<Rendered>> {
        let target = &props.target;
        let cpu = props.families.cpu.then_some(&self.cpu);
        let stacks = [
            ("cpu", format!("sysprof on-CPU: {target}"), cpu),
            ("offcpu", format!("sysprof off-CPU (microseconds blocked): {target}"), self.offcpu.as_ref()),
            ("faults", format!("sysprof page faults: {target}"), self.faults.as_ref()),
            ("alloc", format!("sysprof heap allocations (bytes): {target}"), self.alloc.as_ref()),
        ];
        let mut files = Vec::new();
        for (name, title, profile) in stacks {
            if let Some(profile) = profile {
                files.extend(output::render(&Artifact::Stacks { name, title: &title, profile })?);
            }
        }
        Ok(files)
    }
}

/// The inputs of the recommendations, ranked together by expected impact.
struct Ranked<'a> {
    cpu: &'a StackProfile,
    hotspots: &'a [cpu::Hotspot],
    sched: Option<&'a sched::SchedReport>,
    syscalls: Option<&'a syscalls::SyscallReport>,
    gpu: Option<&'a GpuReport>,
    gpu_metrics: Option<&'a GpuMetricsReport>,
    memory: Option<&'a MemoryReport>,
    cpus: u32,
    wall_s: f64,
}

impl Ranked<'_> {
    fn recommendations(&self) -> Vec<Recommendation> {
        let mut out = cpu::cpu_recommendations(self.cpu, self.hotspots);
        if let Some(sched) = self.sched {
            out.extend(sched::sched_recommendations(sched, self.cpus));
        }
        if let Some(syscalls) = self.syscalls {
            out.extend(syscalls::syscall_recommendations(syscalls));
        }
        if let Some(gpu) = self.gpu {
            out.extend(gpu::report::recommendations(gpu, self.wall_s));
        }
        if let Some(metrics) = self.gpu_metrics {
            out.extend(nvml::report::recommendations(metrics, self.gpu));
        }
        if let Some(memory) = self.memory {
            let h2d_gb_s = self
                .gpu
                .and_then(|gpu| gpu.interconnect.iter().find(|t| t.kind == "H2D"))
                .and_then(|t| t.bandwidth_gb_s);
            out.extend(memory::report::recommendations(memory, h2d_gb_s, self.wall_s));
        }
        out.sort_by(|a, b| b.impact.total_cmp(&a.impact));
        out
    }
}

/// How `-- CMD` ended, in words, and the exit code of sysprof's run: the command's own when it
/// exited by itself; 128 + the signal when a signal to sysprof interrupted the run and sysprof
/// ended the command; 0 when `--duration` ran out first.
fn describe_end(end: &CommandEnd, ended_by: &EndReason) -> (String, u8) {
    let own = end.status.map(launch::describe_exit);
    let Some((signal, count)) = end.ended_by_sysprof else {
        return own.unwrap_or_else(|| ("still running when the trace ended".into(), 0));
    };
    let code = match ended_by {
        EndReason::Signal(interrupt) => interrupt.exit_code(),
        _ => own.as_ref().filter(|_| !end.command_was_running).map_or(0, |(_, code)| *code),
    };
    let others = count - usize::from(end.command_was_running);
    let why = match ended_by {
        EndReason::Signal(signal) => signal.name().to_string(),
        EndReason::Duration => "--duration".to_string(),
        other => other.describe(),
    };
    let plural = |n: usize| if n == 1 { "process" } else { "processes" };
    let text = if end.command_was_running {
        let what = match others {
            0 => "it".to_string(),
            n => format!("it and the {n} {} it started", plural(n)),
        };
        format!(
            "still running when the trace ended ({why}): sysprof ended {what} with {signal}; the command {}",
            own.map_or("did not report its status".to_string(), |(text, _)| {
                match text.strip_prefix("exit status ") {
                    Some(code) => format!("exited with status {code}"),
                    None => format!("was {text}"),
                }
            }),
        )
    } else {
        format!(
            "{}; sysprof ended the {others} {} it left running with {signal} when the trace ended ({why})",
            own.map_or_else(String::new, |(text, _)| text),
            plural(others),
        )
    };
    (text, code)
}

/// What the uprobe tracers could not do, one line each, also said on the terminal: a probe
/// that did not attach must not pass for a function that was never called.
fn tracer_limitations(quiet: bool, calls: &CallTracing) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(tracer) = &calls.gpu {
        lines.extend(tracer.problems.iter().cloned());
        if tracer.libraries.is_empty() {
            lines.push(
                "no CUDA runtime, driver or NCCL library was mapped by the target: no GPU calls traced"
                    .into(),
            );
        }
    }
    if let Some(heap) = &calls.heap {
        lines.extend(heap.problems.iter().cloned());
        if heap.allocators.is_empty() {
            lines.push(
                "--malloc: no allocator (libc, jemalloc, tcmalloc, mimalloc) was mapped by the target".into(),
            );
        }
    }
    lines.extend(calls.funcs.problems.iter().cloned());
    lines.extend(calls.funcs.unresolved());
    if !quiet {
        for line in &lines {
            say!("{line}");
        }
    }
    lines
}

/// Off-CPU time by stack, weighted in microseconds, with why the thread was off CPU as the
/// first frame under the process.
fn offcpu_profile(
    dump: &SchedDump,
    processes: &mut ProcessTable,
    symbolizer: &mut Symbolizer,
) -> StackProfile {
    let samples = sched::offcpu_samples(dump);
    let resolved = ResolvedStacks::resolve(&samples, &dump.stacks, processes, symbolizer);
    profile::build(&samples, &resolved, processes, "us", |sample, kernel| {
        Some(format!("[{}]", sched::offcpu_reason(sample.tag, kernel)))
    })
}

fn lost(counters: &Counters) -> Lost {
    Lost {
        samples: counters.get(Counter::CpuSamplesLost),
        user_stacks: counters.get(Counter::UserStacksLost),
        kernel_stacks: counters.get(Counter::KernelStacksLost),
        process_events: counters.get(Counter::ProcessEventsLost),
        processes_not_followed: counters.get(Counter::TargetsFull),
        syscalls: counters.get(Counter::SyscallsLost),
        sched_events: counters.get(Counter::SchedLost),
        offcpu_intervals: counters.get(Counter::OffCpuLost),
        calls: counters.get(Counter::CallsLost),
        call_events: counters.get(Counter::CallEventsLost),
        faults: counters.get(Counter::FaultsLost),
        allocations: counters.get(Counter::AllocsLost),
    }
}

fn print_summary(
    output: &OutputDir,
    written: &output::Written,
    removed: &[String],
    report: &Report,
    cpu_samples: u64,
) {
    let dir = output.path().display();
    if let Some(status) = &report.run.command_status {
        say!("command: {status}");
    }
    for note in &written.notes {
        say!("{note}");
    }
    if !removed.is_empty() {
        say!("removed the files of an earlier run that this one did not write: {}", removed.join(", "));
    }
    if !written.written.is_empty() {
        let paths: Vec<String> = written.written.iter().map(|f| format!("{dir}/{f}")).collect();
        stderr_line(format_args!(
            "Wrote {} ({} samples, {} lost).",
            paths.join(", "),
            thousands(report.run.samples),
            thousands(report.run.lost.total())
        ));
    }
    if !written.failed.is_empty() {
        return;
    }
    if cpu_samples > 0 {
        stderr_line(format_args!(
            "Open {dir}/cpu.svg in a browser; read {dir}/report.md for the hotspots and what to change first."
        ));
    } else {
        stderr_line(format_args!(
            "No on-CPU samples of the target: it did not run on a CPU while traced. See {dir}/report.md."
        ));
    }
}
