//! The stages after collection: read the kernel's maps out and detach (proving nothing is
//! left), aggregate, symbolize, build the report model, and write every output.

use std::{
    collections::{BTreeSet, HashMap},
    path::PathBuf,
    time::{Duration, SystemTime},
};

use sysprof_common::{CallKey, CallStats, Counter};

use crate::{
    callsites::CallNames,
    collect::{CallTracing, EndReason},
    config::{Families, SampleEvent, Target, TraceConfig},
    cpu::{self, CpuSamples},
    gpu::{
        self,
        nvml::{self, report::GpuMetricsReport},
        report::GpuReport,
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
    probes::{AttachedProbe, Counters, Detaching, Probes, ProgramCost},
    procs::ProcessTable,
    profile::{self, ResolvedStacks, StackProfile},
    report::{self, Instrumentation, Lost, Recommendation, Report, RunSummary, format::thousands},
    sched,
    sched::SchedDump,
    selfcost,
    symbolize::Symbolizer,
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

/// When and how the trace ran.
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

/// Everything read out of the kernel before detaching.
struct KernelData {
    counters: Counters,
    cpu: CpuSamples,
    sched: Option<SchedDump>,
    syscalls: Option<SyscallDump>,
    memory: Option<MemoryDump>,
    /// Probed calls (GPU APIs, --func) and the stacks they and the GPU state refer to.
    calls: Vec<(CallKey, CallStats)>,
    call_stacks: HashMap<u32, Vec<u64>>,
    costs: Vec<ProgramCost>,
    stats_available: bool,
    attached: Vec<AttachedProbe>,
    /// Probed files that changed during the trace (Part B).
    files_changed: Vec<String>,
    detach: Detaching,
}

/// What the stages after collection need of the configuration, decided once by the pipeline.
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
}

impl FinishProps {
    pub(crate) fn of(config: &TraceConfig) -> Self {
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
            families: config.families(),
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
        let kernel = read_out(props.families, probes, &calls)?;
        processes.final_scan();

        // Aggregate and symbolize.
        let mut symbolizer = Symbolizer::new();
        let profiles = Profiles::build(&kernel, &mut processes, &mut symbolizer);
        let names = CallNames::new(
            &kernel.calls,
            calls.gpu.as_ref().map(|gpu| &gpu.state),
            &kernel.call_stacks,
            &mut processes,
            &mut symbolizer,
        );
        let wall_s = window.elapsed.as_secs_f64();
        let gpu = calls.gpu.as_ref().map(|tracer| {
            let gpu_calls: Vec<_> = kernel
                .calls
                .iter()
                .filter(|(key, _)| gpu::functions::by_id(key.func).is_some())
                .copied()
                .collect();
            gpu::report::build(
                tracer.libraries.clone(),
                &tracer.state,
                &gpu_calls,
                &names,
                wall_s,
                probe_cost_ns,
            )
        });
        limitations.extend(tracer_limitations(props.quiet, &calls));
        let functions = calls.funcs.rows(&kernel.calls, &names);
        let gpu_metrics = nvml_samples.map(|(samples, topology)| {
            let targets: BTreeSet<u32> = processes.iter().map(|(pid, _)| pid).collect();
            nvml::report::build(samples, topology, props.gpu_interval_ms, gpu.as_ref(), &targets)
        });
        let memory = kernel.memory.as_ref().map(|dump| {
            let live = calls.heap.is_some().then(|| LiveBlocks::new(&dump.live));
            let copied_ranges = calls
                .gpu
                .as_ref()
                .map(|tracer| redundancy::copied_ranges(&tracer.state, live.as_ref(), &names))
                .unwrap_or_default();
            memory::report::build(memory::report::Inputs {
                processes: &processes,
                dump,
                fault_sites: profiles.faults.as_ref().map(memory::profiles::fault_sites).unwrap_or_default(),
                heap: calls.heap.as_ref().map(|tracer| {
                    (tracer.allocators.clone(), profiles.alloc_sites.clone(), heap_probe_cost_ns)
                }),
                gpu: calls.gpu.as_ref().map(|tracer| &tracer.state),
                gpu_metrics: gpu_metrics.as_ref(),
                copied_ranges,
                wall_s,
            })
        });

        if let Some(memory) = &memory {
            limitations.extend(memory::report::limitations(memory, &processes));
        }

        // Rendered in memory, written after the report (see below).
        let profile_files = profiles.render(&props)?;
        let mut files: Vec<String> = profile_files.iter().map(|f| f.name.clone()).collect();
        files.extend(["report.md".to_string(), "report.json".to_string()]);

        let lost = lost(&kernel.counters);
        if lost.total() > 0 {
            limitations.push(format!(
                "{} events were lost in the kernel (see Lost above): the figures are computed from what was kept",
                thousands(lost.total())
            ));
        }
        let (command_status, exit_code) = match &window.command {
            Some(end) => {
                let (text, code) = describe_end(end, &window.ended_by);
                (Some(text), code)
            }
            None => (None, 0),
        };
        let cpus = aya::util::online_cpus().map(|cpus| cpus.len() as u32).unwrap_or(1);
        let sched =
            kernel.sched.as_ref().zip(profiles.offcpu.as_ref()).map(|(dump, offcpu)| {
                sched::analyze(dump, offcpu, &processes, window.elapsed, window.end_ns)
            });
        let syscalls = kernel
            .syscalls
            .as_ref()
            .filter(|_| props.families.syscalls)
            .map(|dump| syscalls::analyze(dump, &processes, window.elapsed));
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
        let report = Report {
            sysprof_version: env!("CARGO_PKG_VERSION").into(),
            run: RunSummary {
                target: props.target.clone(),
                command: props.command.clone(),
                started_at: humantime::format_rfc3339_seconds(window.started_at).to_string(),
                duration_s: window.elapsed.as_secs_f64(),
                ended_by: window.ended_by.describe(),
                command_status,
                event: props.event,
                frequency_hz: props.frequency_hz,
                cpus,
                machine_busy_share: window.machine_busy_share,
                samples: kernel.counters.get(Counter::CpuSamples),
                lost: lost.clone(),
                outputs: files.clone(),
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
            overhead: selfcost::overhead(
                kernel.costs,
                kernel.stats_available,
                window.stats_coverage,
                window.elapsed,
                cpus,
            ),
            limitations,
            instrumentation: Instrumentation {
                files_modified: kernel.files_changed,
                probes: kernel.attached,
                detach: kernel.detach.wait(),
            },
        };
        let (report, written) = write_all(&mut output, report, profile_files)?;
        let removed = output.remove_stale(&written.written);

        if !props.quiet {
            print_summary(&output, &written, &removed, &report, &profiles.cpu);
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
            lost: lost.total(),
        })
    }
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
    fn build(kernel: &KernelData, processes: &mut ProcessTable, symbolizer: &mut Symbolizer) -> Self {
        let cpu = profile::cpu_profile(&kernel.cpu, processes, symbolizer);
        let offcpu = kernel.sched.as_ref().map(|dump| offcpu_profile(dump, processes, symbolizer));
        let faults =
            kernel.memory.as_ref().map(|dump| memory::profiles::fault_profile(dump, processes, symbolizer));
        let (alloc, alloc_sites) = match kernel.memory.as_ref().filter(|dump| !dump.heaps.is_empty()) {
            Some(dump) => {
                let (profile, sites) = memory::profiles::heap_profile(dump, processes, symbolizer);
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

/// Reads every map the run filled, then starts detaching everything: the probes go before the
/// slow stages (symbolization), and the detach is verified before the report is written.
fn read_out(families: Families, probes: Probes, tracing: &CallTracing) -> anyhow::Result<KernelData> {
    let counters = probes.counters()?;
    let cpu = probes.cpu_samples()?;
    let sched = families.sched.then(|| probes.sched()).transpose()?;
    let syscalls = families.syscalls.then(|| probes.syscalls()).transpose()?;
    let memory = families.memory.then(|| probes.memory(tracing.heap.is_some())).transpose()?;
    let probed = tracing.gpu.is_some() || !tracing.funcs.is_empty();
    let calls = if probed { probes.calls()? } else { Vec::new() };
    let mut stack_ids: BTreeSet<u32> =
        calls.iter().filter_map(|(key, _)| u32::try_from(key.user_stack_id).ok()).collect();
    if let Some(gpu) = &tracing.gpu {
        stack_ids.extend(gpu.state.live().filter_map(|(_, a)| u32::try_from(a.user_stack_id).ok()));
        stack_ids.extend(gpu.state.h2d.iter().filter_map(|c| u32::try_from(c.user_stack_id).ok()));
    }
    let call_stacks = probes.stacks(&stack_ids)?;
    let costs = probes.costs();
    let stats_available = probes.stats_available();
    let attached = probes.attached().to_vec();
    let files_changed = probes.probed_files_changed();
    let detach = probes.detach();
    Ok(KernelData {
        counters,
        cpu,
        sched,
        syscalls,
        memory,
        calls,
        call_stacks,
        costs,
        stats_available,
        attached,
        files_changed,
        detach,
    })
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
    cpu: &StackProfile,
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
    if cpu.total() > 0 {
        stderr_line(format_args!(
            "Open {dir}/cpu.svg in a browser; read {dir}/report.md for the hotspots and what to change first."
        ));
    } else {
        stderr_line(format_args!(
            "No on-CPU samples of the target: it did not run on a CPU while traced. See {dir}/report.md."
        ));
    }
}
