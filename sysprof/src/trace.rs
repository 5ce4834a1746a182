//! One `sysprof trace`, start to report: preflight -> load/attach -> collect -> aggregate ->
//! symbolize -> write. Whatever ends the trace (duration, Ctrl-C, SIGTERM, the command's or the
//! targets' exit), the probes are detached and everything collected is written.

use std::{
    path::Path,
    time::{Duration, SystemTime},
};

use anyhow::Context as _;
use sysprof_common::{Config, filter};

use crate::{
    btf::{self, TaskOffsets, TracepointIds},
    collect::{self, EndReason, StatusLine, Stop, StopPlan, TraceEnd, UprobeTracers},
    config::{Target, TraceConfig},
    cpustat::CpuTicks,
    error::Error,
    family::list,
    finish::{Finished, Results},
    funcs::FuncTracer,
    gpu::{GpuTracer, nvml},
    input::InputError,
    launch::GatedChild,
    loader_gate::LoaderGate,
    memory::{self, heap::HeapTracer},
    output::OutputDir,
    privileges,
    probes::{MapSizes, PROCESS_TRACKING, Preload, Probes, monotonic_ns},
    procs::{self, ProcessTable},
    record::RunProps,
    target::{self, ResolvedTarget},
    terminal::say,
    timeline,
    unwind::Unwinder,
    uprobes::{Binary, Named},
};

/// Syscalls a thread makes in one stretch on a CPU beyond which latency is sampled.
const SYSCALL_BURST: u32 = 32;
/// A timed call costs a shared-map lookup and two clock reads (80 ns more than an untimed one
/// here, `cargo xtask bench syscalls`' `--time-every-syscall` row): 1 in 16 put 7 ns on every
/// call of a getppid loop, 1 in 64 under 2, and a loop of a second still has 100,000 timed.
const SYSCALL_SAMPLE_EVERY: u32 = 64;
/// How long the start waits for the launched command's exec to read its program's maps.
const EXEC_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// Runs one trace as configured and writes its results.
pub fn trace(config: TraceConfig) -> anyhow::Result<Finished> {
    // Before any thread or mapping that such a limit could refuse.
    crate::limits::check_address_space()?;
    // Before the runtime's threads start: they inherit it.
    crate::priority::raise();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async {
        // First of all: from here on Ctrl-C, SIGTERM and SIGHUP end the trace instead of
        // killing sysprof, even one that arrives while the probes are being attached.
        let stop = Stop::register()?;
        // On a worker, not this thread: the worker that reads an event (a new program, a
        // timer) then runs the loop itself, where block_on's thread would be woken for each
        // one (two threads woken per event: a fifth of sysprof's CPU under a shell script).
        // The other worker answers signals while this one is busy.
        tokio::spawn(preflight_and_run(config, stop)).await.context("the trace's task")?
    })
}

async fn preflight_and_run(config: TraceConfig, stop: Stop) -> anyhow::Result<Finished> {
    // Preflight: everything that can be wrong is found before any probe is attached.
    if !privileges::can_trace() {
        return Err(Error::NotPrivileged.into());
    }
    let named = open_named_files(&config)?;
    let resolved = target::resolve(&config.target)?;
    let output = OutputDir::prepare(&config.output_dir, config.invoking_user.clone())?;
    let say = |line: &str| {
        if !config.quiet {
            say!("{line}");
        }
    };
    for note in resolved.notes.iter().chain(output.notes()) {
        say(note);
    }
    if config.stack_storage_size > sysprof_common::capacity::STACKS {
        let sizes = MapSizes::for_config(&config, resolved.filter == filter::TARGETS);
        say(&format!(
            "--stack-storage-size {}: this trace's BPF maps pin about {} MiB of kernel memory for the run",
            config.stack_storage_size,
            crate::kernel_memory::mib(crate::kernel_memory::estimate(&sizes))
        ));
    }
    let mut limitations = Vec::new();
    let (offsets, tracepoint_ids) = match btf::read_kernel_types(&btf::vmlinux_btf_path()) {
        Ok((offsets, ids)) => (Some(offsets), Some(ids)),
        Err(error) => {
            let line = format!(
                "kernel BTF not available ({error:#}): child processes started during the trace are not \
                 followed; a kernel with CONFIG_DEBUG_INFO_BTF=y fixes this"
            );
            say(&line);
            limitations.push(line);
            (None, None)
        }
    };
    // What the later stages need of the configuration, decided once.
    let props = RunProps::of(&config);
    let bpf_config = kernel_config(&config, &props, &resolved, offsets);
    let preflight = Preflight { props, resolved, bpf_config, output, limitations, tracepoint_ids, named };
    run(config, preflight, stop).await
}

/// The files named on the command line, each opened once, with the rights of the user who
/// named them through sudo: what is read and probed later is the file opened here, whatever
/// its path names by then (`uprobes::Binary`). Through sudo a file they cannot open is refused
/// at once; as root, its problem is said where it would have been probed. And, as root, a
/// library sysprof loads into itself only if no one but root can change it.
fn open_named_files(config: &TraceConfig) -> Result<NamedFiles, Error> {
    let user = config.invoking_user.as_ref();
    if let Some(user) = user
        && config.command_as_root
    {
        return Err(Error::AsRootUnderSudo { user: user.name.clone() });
    }
    let open = |path: &Path| -> Result<Named, Error> {
        match (Binary::open(path, user), user) {
            (Ok(file), _) => Ok(Ok(file)),
            (Err(InputError::Io { .. }), Some(user)) => {
                Err(Error::NotReadableByUser { path: path.to_path_buf(), user: user.name.clone() })
            }
            (Err(error), Some(_)) => Err(Error::Unreadable(error)),
            (Err(error), None) => Ok(Err((path.to_path_buf(), error.to_string()))),
        }
    };
    let gpu = config.gpu_libraries.iter().map(|path| open(path)).collect::<Result<_, _>>()?;
    let functions =
        config.functions.iter().map(|spec| spec.path().map(open).transpose()).collect::<Result<_, _>>()?;
    // A missing one is NVML's one line later, like any library that is not there.
    if let Some(library) = &config.nvml_library {
        match nvml::locate(Some(library), user) {
            Err(nvml::Unloadable::Unreadable { path, user }) => {
                return Err(Error::NotReadableByUser { path, user });
            }
            Err(nvml::Unloadable::Untrusted(reason)) => return Err(Error::UntrustedLibrary { reason }),
            Ok(_) | Err(nvml::Unloadable::Missing(_)) => {}
        }
    }
    Ok(NamedFiles { gpu, functions })
}

/// The files named on the command line, opened (see `open_named_files`).
struct NamedFiles {
    /// `--cuda-lib`, `--nccl-lib`.
    gpu: Vec<Named>,
    /// Each `--func`'s file, where it names a path.
    functions: Vec<Option<Named>>,
}

/// The configuration baked into the BPF object.
fn kernel_config(
    config: &TraceConfig,
    props: &RunProps,
    resolved: &ResolvedTarget,
    offsets: Option<TaskOffsets>,
) -> Config {
    let offsets = offsets.unwrap_or_default();
    let (cgroup_id, cgroup_level) = resolved.cgroup.unwrap_or((0, 0));
    let mut kernel = Config {
        filter: resolved.filter,
        cgroup_level,
        cgroup_id,
        task_pid_offset: offsets.pid,
        task_tgid_offset: offsets.tgid,
        comm: resolved.comm,
        // Each family sets its own options below.
        sched_stats: 0,
        syscall_burst: if config.time_every_syscall { 0 } else { SYSCALL_BURST },
        syscall_sample_every: SYSCALL_SAMPLE_EVERY,
        address_space: 0,
        // Always: a successful executable mmap tells userspace a library was loaded (its
        // symbols and unwind table are read then); the memory family counts the others.
        nr_mmap: syscalls::Sysno::mmap as u32,
        nr_munmap: u32::MAX,
        nr_brk: u32::MAX,
        nr_mremap: u32::MAX,
        fault_stack_every: memory::FAULT_STACK_EVERY,
        self_tgid: std::process::id(),
        nr_exit: u32::MAX,
        nr_exit_group: u32::MAX,
        task_fsbase_offset: offsets.fsbase,
        timeline_min_us: if config.timeline_events > 0 { crate::timeline::MIN_SLICE_US } else { 0 },
        task_min_flt_offset: offsets.min_flt,
        task_maj_flt_offset: offsets.maj_flt,
        task_exec_runtime_offset: offsets.exec_runtime,
        task_start_boottime_offset: offsets.start_boottime,
        switch_notes: 0,
        task_signal_offset: offsets.signal,
        signal_live_offset: offsets.signal_live,
        task_mm_offset: offsets.mm,
        mm_vdso_offset: offsets.mm_vdso,
        task_exec_id_offset: offsets.exec_id,
    };
    for family in list::enabled(props) {
        family.configure(&mut kernel);
        kernel.switch_notes |= u32::from(
            family
                .programs()
                .iter()
                .any(|program| program.program() == crate::sched::probes::SCHED_SWITCH.program()),
        );
    }
    kernel
}

/// What the preflight found and decided, for the stages after it.
struct Preflight {
    props: RunProps,
    resolved: ResolvedTarget,
    bpf_config: Config,
    output: OutputDir,
    limitations: Vec<String>,
    /// Where the kernel's BTF has the tracepoints (`None` without kernel BTF).
    tracepoint_ids: Option<TracepointIds>,
    named: NamedFiles,
}

async fn run(config: TraceConfig, preflight: Preflight, stop: Stop) -> anyhow::Result<Finished> {
    let Preflight { mut props, mut resolved, bpf_config, output, mut limitations, tracepoint_ids, named } =
        preflight;
    // Whom a launched command runs as, and so whose rights find and open its files.
    let user = config.invoking_user.as_ref();
    let started_at = SystemTime::now();

    // The targets' memory maps first, before anything is attached: a target that exits while
    // the probes attach (a second, on a loaded machine) is still symbolized from them.
    let on = props.families;
    let heap = on.heap;
    let mut processes = ProcessTable::new();
    // A library a target loads is heard of from the syscall exit program, within milliseconds
    // (`process_event::MAPPED`): the fast rescans are for runs that trace no syscalls (they
    // read every process's maps five times a second, most of sysprof's CPU in a `--all`).
    if on.syscalls || on.memory {
        processes.announces_mappings();
    } else if on.gpu || !config.functions.is_empty() || heap {
        processes.set_rescan_interval(procs::FAST_RESCAN_INTERVAL);
    }
    if on.memory {
        processes.sample_memory_every(config.memory_interval);
    }
    for &pid in &resolved.pids {
        processes.observe_existing(pid);
    }
    // A set of processes followed through their children: the ended ones leave it.
    if resolved.filter == filter::TARGETS {
        processes.keep_exited();
    }

    // Load/attach.
    let sizes = MapSizes::for_config(&config, resolved.filter == filter::TARGETS);
    let mut probes = Probes::load(&bpf_config, sizes)?;
    match tracepoint_ids {
        Some(ids) => probes.use_tracepoint_ids(ids),
        None if on.sched || on.syscalls => probes.parse_kernel_btf_ahead(),
        None => {}
    }
    // The running targets' tables first: cached ones are written before the trace starts.
    let mut unwinder = (sizes.unwind_chunks > 0).then(|| Unwinder::new(sizes.unwind_chunks));
    if let Some(unwinder) = &mut unwinder {
        unwinder.settle(&mut probes, &mut processes, UNWIND_SETTLE);
    }
    let mut tracers = UprobeTracers {
        gpu: on.gpu.then(|| GpuTracer::new(named.gpu, resolved.filter == filter::ALL)),
        funcs: FuncTracer::new(config.functions.clone(), named.functions),
        heap: heap.then(|| HeapTracer::new(resolved.filter == filter::ALL)),
        seen_maps: 0,
    };
    if let Some(gpu) = tracers.gpu.as_mut().filter(|_| config.save_readout) {
        gpu.kept_events = Some(Vec::new());
    }
    let mut limitation = |line: String| {
        if !config.quiet {
            say!("{line}");
        }
        limitations.push(line);
    };
    let mut timeline = match config.timeline_events {
        0 => None,
        events => Some(
            timeline::Collector::new(probes.take_ring(sysprof_common::timeline::EVENTS)?, events)
                .context("polling the timeline's ring")?,
        ),
    };
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
            if let Some(unwinder) = &mut unwinder {
                unwinder.prepare(gated.program(), user);
            }
            Some(gated)
        }
        _ => None,
    };
    if let Some(url) = &config.push {
        props.push = Some(push_props(url, &config.target, gated.as_ref(), &resolved, &processes));
    }
    probes.lineage = matches!(config.target, Target::Pids(_)) || gated.is_some();
    let families = list::enabled(&props);
    let programs: Vec<Preload> =
        families.iter().flat_map(|family| family.programs()).chain(&PROCESS_TRACKING).copied().collect();
    probes.preload(&programs);
    for family in families {
        family.attach(&mut probes)?;
    }
    probes.attach_process_tracking()?;
    probes.forget_kernel_btf();
    let events = probes.take_process_events()?;
    for pid in target::late_joiners(&resolved) {
        probes.add_target_process(pid)?;
        resolved.pids.push(pid);
        processes.observe_existing(pid);
    }

    if let Some(gpu) = &mut tracers.gpu {
        gpu.attach_initial(&mut probes, &processes);
        if let Some(gated) = &gated {
            gpu.attach_needed(&mut probes, gated.program(), user);
        }
    }
    if let Some(heap) = &mut tracers.heap {
        if let Some(gated) = &gated {
            heap.attach_needed(&mut probes, gated.pid(), gated.program(), user);
        }
        heap.attach_new(&mut probes, &processes, 0);
    }
    if let Some(gated) = &gated {
        tracers.funcs.attach_for_program(&mut probes, gated.program(), user);
    }
    tracers.funcs.attach_ready(&mut probes, &processes, 0);
    // Everything is loaded and every ring is still open: what the trace pins from here.
    let kernel_memory = crate::kernel_memory::Snapshot::take();
    let ticks_at_start = CpuTicks::now();
    let started = std::time::Instant::now();
    // The kernel side's start of the trace too: the programs count from here (a thread on a
    // CPU now is counted from here).
    probes.open_window(monotonic_ns())?;
    // Again, now that the set is complete: a switch that read the set before a late joiner
    // was added may have written its note after that addition's.
    probes.forget_switch_notes()?;
    probes.start_fault_counts()?;
    let command = match gated {
        // Interrupted while the probes were attached: the command never starts (dropping the
        // gate ends the child before it runs anything), and nothing was traced.
        Some(_) if let Some(signal) = stop.requested() => {
            return Err(Error::InterruptedAtStart { signal: signal.name(), code: signal.exit_code() }.into());
        }
        Some(gated) => {
            // The command's tables (asked for at its spawn) are in before it runs: cached ones
            // take milliseconds.
            if let Some(unwinder) = &mut unwinder {
                unwinder.settle(&mut probes, &mut processes, UNWIND_SETTLE);
            }
            processes.observe_existing(gated.pid());
            stop.launched(&[gated.pid()]);
            let pid = gated.pid();
            // Stacks through code without frame pointers need the unwinder's entries for the
            // command's libraries, written once its loader has mapped them: it waits there.
            let hold =
                unwinder.as_ref().and_then(|_| LoaderGate::arm(&mut probes, pid, gated.program(), user));
            let watch = gated.release()?;
            processes.await_exec(pid, EXEC_WAIT);
            if let Some(hold) = hold {
                let held = hold.wait(&processes);
                if held.is_some()
                    && let Some(unwinder) = &mut unwinder
                {
                    processes.observe_existing(pid);
                    unwinder.settle(&mut probes, &mut processes, UNWIND_SETTLE);
                }
                hold.open(&mut probes, held);
            }
            Some(watch)
        }
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
        say!(
            "tracing {} ({} Hz{}); Ctrl-C to stop",
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
    if on.gpu {
        match nvml::open(config.nvml_library.as_deref(), user) {
            Ok(nvml) => {
                let topology = nvml::topology::read(&nvml);
                nvml_run = Some((nvml::Poller::start(nvml, config.gpu_interval), topology));
            }
            Err(line) => limitation(line),
        }
    }
    let status = StatusLine::new(config.quiet);
    let plan = StopPlan {
        started,
        duration: config.duration,
        command,
        stop_when_targets_exit: matches!(config.target, Target::Pids(_)),
    };
    let collect::Collected { ended_by, elapsed, end_ns, stats_coverage, costs, command } = collect::collect(
        &mut probes,
        events,
        &mut tracers,
        timeline.as_mut(),
        &mut processes,
        unwinder.as_mut(),
        plan,
        &stop,
        &status,
        config.quiet,
    )
    .await?;
    status.finish();
    // What sysprof launched does not outlive the trace (see CommandWatch::end).
    let command = match command {
        Some(command) => Some(command.end(&processes).await),
        None => None,
    };
    let (nvml_samples, gpu_interval) = match nvml_run {
        Some((poller, topology)) => {
            let (samples, interval) = poller.finish().await;
            (Some((samples, topology)), Some(interval))
        }
        None => (None, None),
    };
    let machine_busy_share =
        ticks_at_start.zip(CpuTicks::now()).and_then(|(start, end)| start.busy_share_until(&end));
    if !config.quiet {
        let line = match &ended_by {
            EndReason::Signal(signal) => Some(format!("{}: ending the trace", signal.name())),
            EndReason::TargetsExited => Some("every target process exited: ending the trace".into()),
            _ => None,
        };
        if let Some(line) = line {
            say!("{line} after {:.1} s; writing what was collected", elapsed.as_secs_f64());
        }
    }
    // From here a second signal leaves at once (collect::Stop); the kernel drops the probes
    // with the process.

    let end = TraceEnd {
        unwind: unwinder.map(Unwinder::finish),
        started_at,
        elapsed,
        end_ns,
        ended_by,
        command,
        machine_busy_share,
        stats_coverage,
        costs,
        kernel_memory,
        gpu_interval,
    };
    let timeline = timeline.map(timeline::Collector::finish);
    let results =
        Results { props, probes, processes, output, limitations, end, tracers, timeline, nvml_samples };
    tokio::task::spawn_blocking(move || results.deliver()).await.context("writing the results")?
}

/// The labels only the trace knows: the service (the command's program, else the first target
/// process's name) and the target's pid.
fn push_props(
    url: &str,
    target: &Target,
    gated: Option<&GatedChild>,
    resolved: &ResolvedTarget,
    processes: &ProcessTable,
) -> crate::record::PushProps {
    let pid = gated.map(GatedChild::pid).or_else(|| resolved.pids.first().copied());
    let service = match target {
        Target::Command(argv) => argv
            .first()
            .and_then(|program| std::path::Path::new(program).file_name())
            .map(|name| name.to_string_lossy().into_owned()),
        _ => pid.and_then(|pid| processes.get(pid)).map(|p| p.name.clone()).filter(|n| !n.is_empty()),
    }
    .unwrap_or_else(|| if matches!(target, Target::All) { "all".into() } else { target.to_string() });
    crate::record::PushProps { url: url.to_string(), service, pid }
}

/// How long the start waits for the running targets' unwind tables: long enough for cached
/// ones and small files; larger ones are written when ready, during the trace.
const UNWIND_SETTLE: Duration = Duration::from_millis(400);

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok()).collect()
        })
        .unwrap_or_default()
}
