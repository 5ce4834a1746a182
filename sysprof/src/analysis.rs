//! The analysis stage: the kernel's maps read out through every family, and a recording (live
//! or replayed from `readout.json`) analyzed family by family into the report model and its
//! stack files. Nothing here reads the machine, so that a replay analyzes alike.

use std::collections::{BTreeSet, HashMap};

use sysprof_common::{CallKey, CallStats, Counter, names};

use crate::{
    callsites::CallNames,
    family::list,
    family::{Analysis, Family, StackFile},
    gpu::state::GpuState,
    output::{
        Profiles, Rendered,
        pprof::{self, ProfileFacts},
    },
    probes::DetachReport,
    procs::ProcessTable,
    record::reader::{Counters, MapReader},
    record::{self, Recording, RunProps},
    report::{
        Instrumentation, Lost, Report, RunSummary, Section, Sections, format::thousands, recommendation,
    },
    selfcost,
    symbolize::Symbolizer,
    timeline::{
        Timeline,
        render::{self as timeline, TimelineStacks},
    },
};

/// What the pipeline itself reads of the maps, beside the families: the counters, and the
/// probed calls with the stacks they and the GPU state refer to (the GPU and `--func` families
/// and memory's copied ranges share them).
pub(crate) struct Shared {
    counters: Counters,
    calls: Vec<(CallKey, CallStats)>,
    call_stacks: HashMap<u32, Vec<u64>>,
    /// The timeline's stacks: its samples' (`CPU_STACKS`) and its waits' (`STACKS`).
    timeline_stacks: Option<TimelineStacks>,
}

/// Reads every map the run filled: each family's, then the shared ones (the same reads, live
/// or replayed).
pub(crate) fn read(
    maps: &mut MapReader<'_>,
    props: &RunProps,
    families: &mut [Box<dyn Family>],
    gpu: Option<&GpuState>,
    timeline: Option<&Timeline>,
) -> anyhow::Result<Shared> {
    let counters = Counters::read(maps)?;
    for family in families.iter_mut() {
        family.read(maps)?;
    }
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
    let timeline_stacks = match timeline {
        Some(timeline) => {
            let (samples, waits) = timeline::stack_ids(timeline);
            Some(TimelineStacks {
                samples: maps.stacks(names::CPU_STACKS, &samples)?,
                waits: maps.stacks(names::STACKS, &waits)?,
            })
        }
        None => None,
    };
    Ok(Shared { counters, calls, call_stacks, timeline_stacks })
}

/// Every process the families' read-outs name, for the process table to know them all before
/// its snapshot.
pub(crate) fn processes(families: &[Box<dyn Family>]) -> BTreeSet<u32> {
    let mut pids: BTreeSet<u32> = families.iter().flat_map(|family| family.processes()).collect();
    pids.remove(&0);
    pids
}

/// A saved read-out (`readout.json`) through the analysis a live run does: its report, and the
/// folded stacks and flamegraphs that go with it.
pub fn replay(readout: &[u8]) -> anyhow::Result<(Report, Vec<Rendered>)> {
    let (report, profiles, files) = replay_keeping(readout, &[])?;
    Ok((report, profiles.render_all()?.into_iter().chain(files).collect()))
}

/// [`replay`], keeping only the `focus` families of those the run traced (all when empty),
/// with the profiles still to render.
pub(crate) fn replay_keeping(
    readout: &[u8],
    focus: &[crate::config::Focus],
) -> anyhow::Result<(Report, Profiles, Vec<Rendered>)> {
    let mut recording = Recording::from_json(readout)?;
    if !focus.is_empty() {
        recording.props.families.keep_only(focus);
    }
    let gpu_state = recording.calls.gpu.as_ref().map(|gpu| GpuState::replay(&gpu.events)).transpose()?;
    let mut families = list::enabled(&recording.props);
    let mut maps = MapReader::replay(&recording.maps);
    let shared =
        read(&mut maps, &recording.props, &mut families, gpu_state.as_ref(), recording.timeline.as_ref())?;
    let mut processes =
        ProcessTable::from_records(recording.processes.iter().cloned(), recording.memory_interval);
    let mut symbolizer = Symbolizer::replay(recording.symbols.clone());
    let analyzed =
        analyze(&recording, families, shared, &mut processes, gpu_state.as_ref(), &mut symbolizer)?;
    Ok((analyzed.report, analyzed.profiles, analyzed.files))
}

pub(crate) struct Analyzed {
    pub report: Report,
    /// The stack profiles, rendered as they are written.
    pub profiles: Profiles,
    /// The other files, rendered (the timeline).
    pub files: Vec<Rendered>,
    /// On-CPU samples with a stack, for the closing line.
    pub cpu_samples: u64,
    /// The build ids the pprof files carry (path -> id), for a saved read-out.
    pub build_ids: std::collections::BTreeMap<String, String>,
}

/// Analyzes every family in turn and builds the report model; the detach proof is the
/// caller's.
pub(crate) fn analyze(
    recording: &Recording,
    families: Vec<Box<dyn Family>>,
    mut shared: Shared,
    processes: &mut ProcessTable,
    gpu_state: Option<&GpuState>,
    symbolizer: &mut Symbolizer,
) -> anyhow::Result<Analyzed> {
    let props = &recording.props;
    let run = &recording.run;
    let names = CallNames::new(&shared.calls, gpu_state, &shared.call_stacks, processes, symbolizer);
    // The timeline first, and its stacks freed: rendering it resolves its own stacks and builds
    // the file, megabytes on a busy host, which beside the profiles the families build next
    // were the peak of the analysis.
    let (timeline_file, timeline_notes) = match (&recording.timeline, shared.timeline_stacks.take()) {
        (Some(timeline), Some(stacks)) => {
            let (file, notes) = timeline::write(
                timeline,
                &stacks,
                &names,
                recording,
                gpu_state,
                processes,
                symbolizer,
                &shared.counters,
            );
            (Some(file), notes)
        }
        _ => (None, Vec::new()),
    };
    let mut cx = Analysis {
        props,
        run,
        outcome: &recording.calls,
        nvml: recording.nvml.as_ref(),
        processes,
        symbolizer,
        calls: &shared.calls,
        counters: &shared.counters,
        names: &names,
        gpu_state,
        sections: Sections::default(),
        recommendations: Vec::new(),
        profiles: Vec::new(),
        limitations: recording.limitations.clone(),
    };
    // Each section with its family's place in the list, to be put back in report order.
    let mut places = Vec::new();
    let order = analysis_order(&families);
    let mut families: Vec<Option<Box<dyn Family>>> = families.into_iter().map(Some).collect();
    for index in order {
        // Dropped once analyzed: what a family read of the maps is in its section and
        // profiles now, and on a machine running thousands of processes it is megabytes that
        // the next family's analysis and the rendering would otherwise hold beside their own.
        let Some(mut family) = families[index].take() else { continue };
        if let Some(section) = family.analyze(&mut cx)? {
            cx.sections.push(section);
            places.push(index);
        }
    }
    let Analysis { sections, recommendations, profiles, mut limitations, .. } = cx;
    let mut placed: Vec<(usize, Box<dyn Section>)> = places.into_iter().zip(sections.into_vec()).collect();
    placed.sort_by_key(|(index, _)| *index);
    let sections = Sections::new(placed.into_iter().map(|(_, section)| section).collect());
    let (target_time_s, target_time) = target_time(recording, &sections);
    let recommendations = recommendation::rank(recommendations, target_time_s);

    // The profiles are rendered as they are written, after the report (see
    // finish::write_all); the timeline was rendered first, and its notes go to the report.
    let facts = profile_facts(recording, &profiles, processes, symbolizer.reads_files());
    let profiles = Profiles { stacks: profiles, facts };
    let files: Vec<Rendered> = timeline_file.into_iter().collect();
    limitations.extend(timeline_notes);
    let mut outputs: Vec<String> =
        profiles.file_names().chain(files.iter().map(|f| f.name.clone())).collect();
    outputs.extend(["report.md".to_string(), "report.json".to_string()]);
    if props.save_readout {
        outputs.push(record::FILE_NAME.into());
    }

    let lost = lost(&shared.counters);
    let stacks_lost = lost.user_stacks + lost.kernel_stacks + lost.fault_stacks;
    if stacks_lost > 0 {
        let size = props.stack_storage_size;
        limitations.push(format!(
            "{} user and {} kernel stacks (on-CPU, off-CPU, heap and call stacks) and {} page-fault stacks \
             could not be kept: the stack maps ({} entries each) were full or their entries collided, and \
             those samples show a [user stack lost] or [kernel stack lost] frame, never advised on; \
             --stack-storage-size {} would lose fewer (each doubling about halves the collisions)",
            thousands(lost.user_stacks),
            thousands(lost.kernel_stacks),
            thousands(lost.fault_stacks),
            thousands(u64::from(size)),
            size.saturating_mul(4).next_power_of_two()
        ));
    }
    if let Some(unwind) = &run.unwind {
        limitations.extend(
            unwind.without_table.iter().map(|line| format!("user stacks walked by frame pointers in {line}")),
        );
        limitations.extend(unwind.python.limitations());
    }
    if lost.total() > 0 {
        limitations.push(format!(
            "{} lost in the kernel (see Lost above): the figures are computed from what was kept",
            crate::report::format::count(lost.total(), "event was", "events were")
        ));
    }
    // The files the symbolizer could not read, or read less of, after every frame was named.
    limitations.extend(symbolizer.notes().iter().cloned());
    let unseen = shared.counters.get(Counter::SwitchesUnseen);
    if unseen > 0 {
        limitations.push(format!(
            "{} a task of a traced process got a CPU and the kernel did not show it leaving: the kernel \
             hides that process's own events (sandboxes hide their agent so: init, in a Firecracker guest), \
             and its samples, calls and switches are missing from this report",
            if unseen == 1 { "Once".to_string() } else { format!("{} times", thousands(unseen)) }
        ));
    }
    let mut overhead = selfcost::overhead(
        recording.costs.clone(),
        recording.stats_available,
        run.stats_coverage,
        run.elapsed,
        run.cpus,
        props.frequency_hz,
    );
    if let Some((cpu_s, peak_rss_kib)) = run.own_usage {
        (overhead.sysprof_cpu_s, overhead.sysprof_peak_rss_kib) = (cpu_s, peak_rss_kib);
    }
    overhead.kernel_memory = run.kernel_memory.clone();
    let cpu_samples = sections.get::<crate::cpu::CpuSection>().map_or(0, |cpu| cpu.samples());
    let report = Report {
        sysprof_version: env!("CARGO_PKG_VERSION").into(),
        run: RunSummary {
            target: props.target.clone(),
            host: run.host.clone(),
            rank: run.rank.clone(),
            command: props.command.clone(),
            started_at: run.started_at.clone(),
            duration_s: run.elapsed.as_secs_f64(),
            ended_by: run.ended_by.clone(),
            command_status: run.command_status.clone(),
            event: props.event,
            frequency_hz: props.frequency_hz,
            cpus: run.cpus,
            machine_busy_share: run.machine_busy_share,
            target_time_s,
            target_time,
            samples: shared.counters.get(Counter::CpuSamples),
            lost,
            outputs,
            unwind: run.unwind.clone(),
        },
        sections,
        recommendations,
        overhead,
        limitations,
        instrumentation: Instrumentation {
            files_modified: recording.files_changed.clone(),
            probes: recording.attached.clone(),
            // A live run's proof comes after the analysis (see finish::Results::deliver).
            detach: recording
                .detach
                .clone()
                .unwrap_or(DetachReport { programs: 0, still_attached: Vec::new() }),
        },
    };
    let build_ids = profiles
        .facts
        .modules
        .values()
        .filter_map(|file| Some((file.path.clone(), file.build_id.clone()?)))
        .collect();
    Ok(Analyzed { report, profiles, files, cpu_samples, build_ids })
}

/// The target's time, which every recommendation is a share of: a launched command's wall time;
/// for a pid or a system-wide trace, the seconds its threads were busy (on a CPU or held up),
/// since an idle daemon's wall time would make every cost look small.
fn target_time(recording: &Recording, sections: &Sections) -> (f64, String) {
    let wall_s = recording.run.elapsed.as_secs_f64();
    if recording.props.command.is_some() {
        return (wall_s, "the command's wall time".into());
    }
    let busy = sections.iter().filter_map(|section| section.busy_s()).fold(0.0, f64::max);
    (
        busy.min(wall_s * f64::from(recording.run.cpus.max(1))),
        "the seconds the target's threads were busy".into(),
    )
}

/// The families' indices in the order they are analyzed: the list's, except that a family
/// waits for those it is analyzed after (a name that is not in the list is not waited for).
fn analysis_order(families: &[Box<dyn Family>]) -> Vec<usize> {
    let present: Vec<&str> = families.iter().map(|family| family.name()).collect();
    let mut done: Vec<usize> = Vec::with_capacity(families.len());
    while done.len() < families.len() {
        let ready = (0..families.len()).find(|index| {
            !done.contains(index)
                && families[*index]
                    .analyzed_after()
                    .iter()
                    .all(|name| !present.contains(name) || done.iter().any(|&d| families[d].name() == *name))
        });
        // A cycle of "after"s: the rest in list order rather than never.
        let next = ready.unwrap_or_else(|| (0..families.len()).find(|i| !done.contains(i)).unwrap_or(0));
        done.push(next);
    }
    done
}

/// The run's facts the pprof files carry, and the files behind the modules the profiles name,
/// with their build ids when `read_files` (a live run: a replay reads no file its read-out
/// names, which may be anyone's).
fn profile_facts(
    recording: &Recording,
    profiles: &[StackFile],
    processes: &ProcessTable,
    read_files: bool,
) -> ProfileFacts {
    let run = &recording.run;
    let time_nanos = humantime::parse_rfc3339(&run.started_at)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as i64);
    let props = &recording.props;
    let cpu_period_ns = (props.event == crate::config::SampleEvent::CpuClock)
        .then(|| 1_000_000_000 / props.frequency_hz.max(1) as i64);
    // Inserted one by one: collected, a set is first a vector of every frame's module, sorted
    // (megabytes for a busy host's profiles), for a few hundred names.
    let mut named: BTreeSet<&str> = BTreeSet::new();
    for frame in profiles.iter().flat_map(|p| p.profile.stacks.iter().flat_map(|s| s.frames.iter())) {
        named.insert(&frame.module);
    }
    ProfileFacts {
        time_nanos,
        duration_nanos: run.elapsed.as_nanos() as i64,
        cpu_period_ns,
        modules: pprof::module_files(&named, processes, read_files, &recording.build_ids),
    }
}

fn lost(counters: &Counters) -> Lost {
    Lost {
        samples: counters.get(Counter::CpuSamplesLost),
        user_stacks: counters.get(Counter::UserStacksLost),
        kernel_stacks: counters.get(Counter::KernelStacksLost),
        fault_stacks: counters.get(Counter::FaultStacksLost),
        process_events: counters.get(Counter::ProcessEventsLost),
        processes_not_followed: counters.get(Counter::TargetsFull),
        syscalls: counters.get(Counter::SyscallsLost),
        syscall_errnos: counters.get(Counter::ErrnosLost),
        sched_events: counters.get(Counter::SchedLost),
        offcpu_intervals: counters.get(Counter::OffCpuLost),
        wakes: counters.get(Counter::WakesLost),
        calls: counters.get(Counter::CallsLost),
        call_events: counters.get(Counter::CallEventsLost),
        faults: counters.get(Counter::FaultsLost),
        allocations: counters.get(Counter::AllocsLost),
    }
}
