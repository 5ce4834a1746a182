//! One `sysprof trace`, start to report: preflight -> load/attach -> collect -> aggregate ->
//! symbolize -> write. Whatever ends the trace (duration, Ctrl-C, SIGTERM, the command's or the
//! targets' exit), the probes are detached and everything collected is written.

use std::{
    collections::{BTreeSet, HashMap},
    path::PathBuf,
    time::{Duration, SystemTime},
};

use anyhow::Context as _;
use sysprof_common::{CallKey, CallStats, Config, Counter, filter};

use crate::{
    btf::{self, TaskOffsets},
    callsites::CallNames,
    collect::{self, CallTracing, EndReason, Signals, StatusLine, StopPlan},
    config::{Family, Target, TraceConfig},
    cpustat::CpuTicks,
    error::Error,
    funcs::FuncTracer,
    gpu::{self, GpuTracer},
    launch::{self, GatedChild},
    nvml,
    output::{Artifact, OutputDir, thousands},
    privileges,
    probes::{
        AttachedProbe, Counters, CpuSamples, DetachReport, Probes, ProgramCost, SchedDump, SyscallDump,
    },
    procs::{self, ProcessTable},
    profile::{self, ResolvedStacks, StackProfile},
    report::{self, Instrumentation, Lost, Report, RunSummary},
    sched, selfcost,
    symbolize::Symbolizer,
    syscalls,
    target::{self, ResolvedTarget},
    uprobes::calibrate,
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
/// Syscalls a thread makes in one stretch on a CPU beyond which latency is sampled, and the
/// sampling ratio then.
const SYSCALL_BURST: u32 = 32;
const SYSCALL_SAMPLE_EVERY: u32 = 16;

/// Runs one trace as configured and writes its results.
pub fn trace(config: TraceConfig) -> anyhow::Result<TraceOutcome> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async {
        // First of all: from here on Ctrl-C and SIGTERM end the trace instead of killing
        // sysprof, even one that arrives while the probes are being attached.
        let signals = Signals::register()?;
        preflight_and_run(config, signals).await
    })
}

async fn preflight_and_run(config: TraceConfig, signals: Signals) -> anyhow::Result<TraceOutcome> {
    // Preflight: everything that can be wrong is found before any probe is attached.
    if !privileges::can_trace() {
        return Err(Error::NotPrivileged.into());
    }
    let output = OutputDir::prepare(&config.output_dir, config.invoking_user.clone())?;
    let resolved = target::resolve(&config.target)?;
    let say = |line: &str| {
        if !config.quiet {
            eprintln!("sysprof: {line}");
        }
    };
    for note in &resolved.notes {
        say(note);
    }
    let mut limitations = Vec::new();
    let offsets = match TaskOffsets::from_btf(&btf::vmlinux_btf_path()) {
        Ok(offsets) => Some(offsets),
        Err(error) => {
            let line = format!(
                "kernel BTF not available ({error:#}): child processes started during the trace are not \
                 followed; a kernel with CONFIG_DEBUG_INFO_BTF=y fixes this"
            );
            say(&line);
            limitations.push(line);
            None
        }
    };
    let bpf_config = kernel_config(&config, &resolved, offsets);
    run(config, resolved, bpf_config, output, limitations, signals).await
}

/// The configuration baked into the BPF object.
fn kernel_config(config: &TraceConfig, resolved: &ResolvedTarget, offsets: Option<TaskOffsets>) -> Config {
    let offsets = offsets.unwrap_or_default();
    let (cgroup_id, cgroup_level) = resolved.cgroup.unwrap_or((0, 0));
    Config {
        filter: resolved.filter,
        cgroup_level,
        cgroup_id,
        task_pid_offset: offsets.pid,
        task_tgid_offset: offsets.tgid,
        comm: resolved.comm,
        start_ns: monotonic_ns(),
        sched_stats: u32::from(config.wants(Family::Sched)),
        syscall_burst: if config.time_every_syscall { 0 } else { SYSCALL_BURST },
        syscall_sample_every: SYSCALL_SAMPLE_EVERY,
        _pad: 0,
    }
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of `bpf_ktime_get_ns`.
fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

async fn run(
    config: TraceConfig,
    mut resolved: ResolvedTarget,
    bpf_config: Config,
    output: OutputDir,
    mut limitations: Vec<String>,
    mut signals: Signals,
) -> anyhow::Result<TraceOutcome> {
    let started_at = SystemTime::now();

    // Load/attach.
    let mut probes = Probes::load(&bpf_config, config.stack_storage_size)?;
    let mut calls = CallTracing {
        gpu: config
            .wants(Family::Gpu)
            .then(|| GpuTracer::new(config.gpu_libraries.clone(), resolved.filter == filter::ALL)),
        funcs: FuncTracer::new(config.functions.clone()),
        events: None,
        seen_maps: 0,
    };
    let mut probe_cost_ns = None;
    if calls.gpu.is_some() || !calls.funcs.is_empty() {
        calls.events = Some(probes.take_call_events()?);
        // Before the other programs attach: sysprof is briefly its own target here.
        match calibrate::measure_probe_cost(&mut probes) {
            Ok(ns) => probe_cost_ns = Some(ns),
            Err(error) => {
                limitations.push(format!("the cost of a probe hit could not be measured: {error:#}"))
            }
        }
    }
    if resolved.filter == filter::TARGETS {
        for &pid in &resolved.pids {
            probes.add_target_process(pid)?;
        }
    }
    let gated = match &config.target {
        Target::Command(argv) => {
            let run_as = config.invoking_user.as_ref().filter(|_| !config.command_as_root);
            let gated = GatedChild::spawn(argv, run_as)?;
            probes.add_target_process(gated.pid())?;
            Some(gated)
        }
        _ => None,
    };
    if config.wants(Family::Cpu) {
        probes.attach_cpu_sampling(config.event, config.frequency_hz)?;
    }
    // The switch program serves both: scheduler statistics, and parking syscalls in flight.
    if config.wants(Family::Sched) || config.wants(Family::Syscalls) {
        probes.attach_sched_switch()?;
    }
    if config.wants(Family::Sched) {
        probes.attach_sched_wakeup()?;
    }
    if config.wants(Family::Syscalls) {
        probes.attach_syscalls()?;
    }
    probes.attach_process_tracking()?;
    let events = probes.take_process_events()?;
    for pid in target::late_joiners(&resolved) {
        probes.add_target_process(pid)?;
        resolved.pids.push(pid);
    }

    let mut processes = ProcessTable::new();
    if calls.events.is_some() {
        processes.set_rescan_interval(procs::FAST_RESCAN_INTERVAL);
    }
    for &pid in &resolved.pids {
        processes.observe_existing(pid);
    }
    if let Some(gpu) = &mut calls.gpu {
        gpu.attach_initial(&mut probes, &processes);
        if let Some(gated) = &gated {
            gpu.attach_needed(&mut probes, gated.program());
        }
    }
    if let Some(gated) = &gated {
        calls.funcs.attach_for_program(&mut probes, gated.program());
    }
    calls.funcs.attach_ready(&mut probes, &processes);
    let ticks_at_start = CpuTicks::now();
    let command_exit = match gated {
        Some(gated) => Some(collect::watch_child(gated.release()?)),
        None => None,
    };
    if resolved.filter == filter::ALL {
        // Processes that exit during a system-wide trace are symbolized from these.
        for pid in all_pids() {
            processes.observe_existing(pid);
        }
    }

    // Collect.
    if !config.quiet {
        eprintln!(
            "sysprof: tracing {} ({} Hz{}); Ctrl-C to stop",
            config.target,
            config.frequency_hz,
            match config.duration {
                Some(duration) => format!(", for {}", humantime::format_duration(duration)),
                None => String::new(),
            }
        );
    }
    // GPU metrics: polled beside the trace when NVML is there.
    let mut nvml_run = None;
    if config.wants(Family::Gpu) {
        match nvml::open(config.nvml_library.as_deref()) {
            Ok(nvml) => {
                let topology = nvml::topology::read(&nvml);
                nvml_run = Some((nvml::Poller::start(nvml, config.gpu_interval), topology));
            }
            Err(line) => {
                if !config.quiet {
                    eprintln!("sysprof: {line}");
                }
                limitations.push(line);
            }
        }
    }
    let status = StatusLine::new(config.quiet);
    let plan = StopPlan {
        duration: config.duration,
        command_exit,
        stop_when_targets_exit: matches!(config.target, Target::Pids(_)),
    };
    let is_command = plan.command_exit.is_some();
    let collect::Collected { ended_by, elapsed, stats_coverage } =
        collect::collect(&mut probes, events, &mut calls, &mut processes, plan, &mut signals, &status)
            .await?;
    status.finish();
    let nvml_samples = match nvml_run {
        Some((poller, topology)) => Some((poller.finish().await, topology)),
        None => None,
    };
    let machine_busy_share =
        ticks_at_start.zip(CpuTicks::now()).and_then(|(start, end)| start.busy_share_until(&end));
    if !config.quiet {
        let line = match &ended_by {
            EndReason::Signal(name) => Some(format!("{name}: ending the trace")),
            EndReason::TargetsExited => Some("every target process exited: ending the trace".into()),
            _ => None,
        };
        if let Some(line) = line {
            eprintln!("sysprof: {line} after {:.1} s; writing what was collected", elapsed.as_secs_f64());
        }
    }

    // A second Ctrl-C (or SIGTERM) leaves at once; the kernel drops the probes with the process.
    tokio::spawn(async move {
        tokio::select! {
            _ = signals.interrupt.recv() => {}
            _ = signals.terminate.recv() => {}
        }
        eprintln!("sysprof: interrupted again: exiting without writing the results");
        std::process::exit(130);
    });

    let window = Window {
        started_at,
        elapsed,
        end_ns: monotonic_ns(),
        ended_by,
        is_command,
        machine_busy_share,
        stats_coverage,
    };
    let finish =
        Finish { config, probes, processes, output, limitations, window, calls, probe_cost_ns, nvml_samples };
    tokio::task::spawn_blocking(move || finish.run()).await.context("writing the results")?
}

/// When and how the trace ran.
struct Window {
    started_at: SystemTime,
    elapsed: Duration,
    /// CLOCK_MONOTONIC at the end, for threads still on a CPU then.
    end_ns: u64,
    ended_by: EndReason,
    is_command: bool,
    machine_busy_share: Option<f64>,
    /// Share of the run the kernel's BPF statistics were on.
    stats_coverage: f64,
}

/// Everything read out of the kernel before detaching.
struct KernelData {
    counters: Counters,
    cpu: CpuSamples,
    sched: Option<SchedDump>,
    syscalls: Option<SyscallDump>,
    /// Probed calls (GPU APIs, --func) and the stacks they and the GPU state refer to.
    calls: Vec<(CallKey, CallStats)>,
    call_stacks: HashMap<u32, Vec<u64>>,
    costs: Vec<ProgramCost>,
    stats_available: bool,
    attached: Vec<AttachedProbe>,
    detach: DetachReport,
}

/// The stages after collection: read out, detach, aggregate, symbolize, write.
struct Finish {
    config: TraceConfig,
    probes: Probes,
    processes: ProcessTable,
    output: OutputDir,
    limitations: Vec<String>,
    window: Window,
    calls: CallTracing,
    /// Measured cost of one probed call, when calls were probed.
    probe_cost_ns: Option<f64>,
    /// NVML polls and the topology, when NVML was there.
    nvml_samples: Option<(Vec<nvml::Sample>, nvml::topology::Topology)>,
}

impl Finish {
    fn run(self) -> anyhow::Result<TraceOutcome> {
        let Finish {
            config,
            probes,
            mut processes,
            output,
            mut limitations,
            window,
            calls,
            probe_cost_ns,
            nvml_samples,
        } = self;
        let kernel = read_out(&config, probes, &calls)?;
        processes.final_scan();

        // Aggregate and symbolize.
        let mut symbolizer = Symbolizer::new();
        let cpu = profile::cpu_profile(&kernel.cpu, &mut processes, &mut symbolizer);
        let offcpu = kernel.sched.as_ref().map(|dump| offcpu_profile(dump, &mut processes, &mut symbolizer));
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
        if let Some(tracer) = &calls.gpu {
            limitations.extend(tracer.problems.iter().cloned());
            if tracer.libraries.is_empty() {
                let line =
                    "no CUDA runtime, driver or NCCL library was mapped by the target: no GPU calls traced";
                if !config.quiet {
                    eprintln!("sysprof: {line}");
                }
                limitations.push(line.to_string());
            }
        }
        limitations.extend(calls.funcs.problems.iter().cloned());
        limitations.extend(calls.funcs.unresolved());
        let functions = calls.funcs.rows(&kernel.calls, &names);

        // Write.
        let mut files = Vec::new();
        if config.wants(Family::Cpu) {
            let title = format!("sysprof on-CPU: {}", config.target);
            files.extend(output.write(&Artifact::Stacks { name: "cpu", title: &title, profile: &cpu })?);
        }
        if let Some(offcpu) = &offcpu {
            let title = format!("sysprof off-CPU (microseconds blocked): {}", config.target);
            files.extend(output.write(&Artifact::Stacks {
                name: "offcpu",
                title: &title,
                profile: offcpu,
            })?);
        }
        files.extend(["report.md".to_string(), "report.json".to_string()]);

        let lost = lost(&kernel.counters);
        if lost.total() > 0 {
            limitations.push(format!(
                "{} events were lost in the kernel (see Lost above): the figures are computed from what was kept",
                thousands(lost.total())
            ));
        }
        let (command_status, exit_code) = match &window.ended_by {
            EndReason::CommandExited(status) => {
                let (text, code) = launch::describe_exit(*status);
                (Some(text), code)
            }
            _ if window.is_command => (Some("still running when the trace ended".to_string()), 0),
            _ => (None, 0),
        };
        let cpus = aya::util::online_cpus().map(|cpus| cpus.len() as u32).unwrap_or(1);
        let sched =
            kernel.sched.as_ref().zip(offcpu.as_ref()).map(|(dump, offcpu)| {
                sched::analyze(dump, offcpu, &processes, window.elapsed, window.end_ns)
            });
        let syscalls =
            kernel.syscalls.as_ref().map(|dump| syscalls::analyze(dump, &processes, window.elapsed));
        let hotspots = report::hotspots(&cpu, HOTSPOTS);
        let mut recommendations = report::cpu_recommendations(&cpu, &hotspots);
        if let Some(sched) = &sched {
            recommendations.extend(report::sched_recommendations(sched, cpus));
        }
        if let Some(syscalls) = &syscalls {
            recommendations.extend(report::syscall_recommendations(syscalls));
        }
        if let Some(gpu) = &gpu {
            recommendations.extend(gpu::report::recommendations(gpu, wall_s));
        }
        let gpu_metrics = nvml_samples.map(|(samples, topology)| {
            let targets: BTreeSet<u32> = processes.iter().map(|(pid, _)| pid).collect();
            nvml::report::build(
                samples,
                topology,
                config.gpu_interval.as_millis() as u64,
                gpu.as_ref(),
                &targets,
            )
        });
        if let Some(metrics) = &gpu_metrics {
            recommendations.extend(nvml::report::recommendations(metrics, gpu.as_ref()));
        }
        recommendations.sort_by(|a, b| b.impact.total_cmp(&a.impact));
        let report = Report {
            sysprof_version: env!("CARGO_PKG_VERSION").into(),
            run: RunSummary {
                target: config.target.to_string(),
                command: match &config.target {
                    Target::Command(argv) => {
                        Some(argv.iter().map(|a| a.to_string_lossy().into_owned()).collect())
                    }
                    _ => None,
                },
                started_at: humantime::format_rfc3339_seconds(window.started_at).to_string(),
                duration_s: window.elapsed.as_secs_f64(),
                ended_by: window.ended_by.describe(),
                command_status,
                event: config.event,
                frequency_hz: config.frequency_hz,
                cpus,
                machine_busy_share: window.machine_busy_share,
                samples: kernel.counters.get(Counter::CpuSamples),
                lost: lost.clone(),
                outputs: files.clone(),
            },
            processes: report::process_shares(&cpu),
            hotspots,
            sched,
            syscalls,
            gpu,
            gpu_metrics,
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
                files_modified: Vec::new(),
                probes: kernel.attached,
                detach: kernel.detach,
            },
        };
        output.write(&Artifact::Report(&report))?;

        if !config.quiet {
            print_summary(&output, &files, &report, &cpu);
        }
        Ok(TraceOutcome {
            exit_code,
            output_dir: output.path().to_path_buf(),
            files,
            samples: report.run.samples,
            lost: lost.total(),
        })
    }
}

/// Reads every map the run filled, then detaches everything: the probes go before the slow
/// stages (symbolization), and the detach is verified.
fn read_out(config: &TraceConfig, probes: Probes, tracing: &CallTracing) -> anyhow::Result<KernelData> {
    let counters = probes.counters()?;
    let cpu = probes.cpu_samples()?;
    let sched = config.wants(Family::Sched).then(|| probes.sched()).transpose()?;
    let syscalls = config.wants(Family::Syscalls).then(|| probes.syscalls()).transpose()?;
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
    let detach = probes.detach();
    Ok(KernelData {
        counters,
        cpu,
        sched,
        syscalls,
        calls,
        call_stacks,
        costs,
        stats_available,
        attached,
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
    }
}

fn print_summary(output: &OutputDir, files: &[String], report: &Report, cpu: &StackProfile) {
    let dir = output.path().display();
    if let Some(status) = &report.run.command_status {
        eprintln!("sysprof: command: {status}");
    }
    let paths: Vec<String> = files.iter().map(|f| format!("{dir}/{f}")).collect();
    eprintln!(
        "Wrote {} ({} samples, {} lost).",
        paths.join(", "),
        thousands(report.run.samples),
        thousands(report.run.lost.total())
    );
    if cpu.total() > 0 {
        eprintln!(
            "Open {dir}/cpu.svg in a browser; read {dir}/report.md for the hotspots and what to change first."
        );
    } else {
        eprintln!(
            "No on-CPU samples of the target: it did not run on a CPU while traced. See {dir}/report.md."
        );
    }
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok()).collect()
        })
        .unwrap_or_default()
}
