//! The timeline as a Perfetto trace (`timeline.pftrace`, opened in ui.perfetto.dev): per
//! process a track, per thread a track with its probed calls (GPU libraries, `--func`) and two
//! tracks under it, its waits off the CPU (the reason, and the stack it blocked at) with the
//! time runnable after each wakeup, and its slow system calls; its on-CPU samples as perf
//! samples with interned call stacks; processes' memory and the GPUs' NVML metrics as counter
//! tracks. Timestamps are CLOCK_MONOTONIC (the kernel's `bpf_ktime_get_ns`), with a clock
//! snapshot that places them in boot and wall-clock time.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use sysprof_common::{
    Counter,
    timeline::{TimelineEvent, kind},
};

use super::{
    FILE_NAME, Timeline,
    perfetto::{
        Callstack, Clock, ClockSnapshot, CounterDescriptor, Data, DebugAnnotation, EventName, Frame,
        InternedData, InternedString, Mapping, PerfSample, ProcessDescriptor, ProcessTree,
        ProcessTreeProcess, ProcessTreeThread, SEQ_INCREMENTAL_STATE_CLEARED, ThreadDescriptor, TracePacket,
        TracePacketDefaults, TrackDescriptor, TrackEvent, Value, clock, event_type, unit,
    },
};
use crate::{
    callsites::{CallNames, Names as _},
    funcs::ProbedFunction,
    gpu::{functions, nvml, state::GpuState},
    output::Rendered,
    procs::{ImageOf, ProcessTable},
    profile::{ResolvedStacks, StackSample},
    record::Recording,
    record::reader::Counters,
    sched::offcpu_reason,
    symbolize::Frame as SymbolFrame,
    symbolize::Symbolizer,
};

/// The stack ids the timeline's events refer to: its samples' (in `CPU_STACKS`) and its
/// waits' (in `STACKS`; the calls' are the call table's, read with it).
pub(crate) fn stack_ids(timeline: &Timeline) -> (BTreeSet<u32>, BTreeSet<u32>) {
    let mut samples = BTreeSet::new();
    let mut waits = BTreeSet::new();
    for event in &timeline.events {
        let ids = match event.kind {
            kind::SAMPLE => &mut samples,
            kind::OFF_CPU => &mut waits,
            _ => continue,
        };
        ids.extend(
            [event.user_stack_id, event.kernel_stack_id].into_iter().filter_map(|id| u32::try_from(id).ok()),
        );
    }
    (samples, waits)
}

/// The stacks the timeline's events refer to, as read from the maps.
pub(crate) struct TimelineStacks {
    /// Ids in `CPU_STACKS`.
    pub samples: HashMap<u32, Vec<u64>>,
    /// Ids in `STACKS`.
    pub waits: HashMap<u32, Vec<u64>>,
}

/// `timeline.pftrace`, and the lines the report says of what it could not show.
#[expect(clippy::too_many_arguments, reason = "what the timeline draws on, each owned by the analysis")]
pub(crate) fn write(
    timeline: &Timeline,
    stacks: &TimelineStacks,
    names: &CallNames,
    recording: &Recording,
    gpu: Option<&GpuState>,
    processes: &mut ProcessTable,
    symbolizer: &mut Symbolizer,
    counters: &Counters,
) -> (Rendered, Vec<String>) {
    let of_kind = |wanted: u32| timeline.events.iter().filter(move |e| e.kind == wanted).map(stack_sample);
    let samples: Vec<_> = of_kind(kind::SAMPLE).collect();
    let waits: Vec<_> = of_kind(kind::OFF_CPU).collect();
    let sample_stacks = ResolvedStacks::resolve(&samples, &stacks.samples, processes, symbolizer);
    let wait_stacks = ResolvedStacks::resolve(&waits, &stacks.waits, processes, symbolizer);
    let mut notes: Vec<String> =
        timeline.thinning_note(counters.get(Counter::TimelineThinned)).into_iter().collect();
    let lost = counters.get(Counter::TimelineLost);
    if lost > 0 {
        notes.push(format!(
            "{} lost in the kernel (its ring was full between two drains): the timeline has gaps, every other output is whole",
            crate::report::format::count(lost, "timeline event was", "timeline events were")
        ));
    }
    if let Some(gpu) = gpu.filter(|gpu| gpu.slices_dropped > 0) {
        notes.push(format!(
            "the timeline shows the first {} GPU calls with arguments; {} later ones are only in the tables",
            crate::report::format::thousands(gpu.slices.len() as u64),
            crate::report::format::thousands(gpu.slices_dropped)
        ));
    }
    let sources = Sources {
        timeline,
        sample_stacks: &sample_stacks,
        wait_stacks: &wait_stacks,
        names,
        functions: &recording.calls.functions,
        gpu,
        processes,
        nvml: recording.nvml.as_ref().map(|(samples, _)| samples.as_slice()),
        notes: notes.clone(),
    };
    (Rendered { name: FILE_NAME.into(), bytes: render(&sources) }, notes)
}

/// What the trace is made of: the timeline's events, and what the analysis resolved.
pub(crate) struct Sources<'a> {
    pub timeline: &'a Timeline,
    /// The samples' stacks (ids in `CPU_STACKS`).
    pub sample_stacks: &'a ResolvedStacks,
    /// The waits' stacks (ids in `STACKS`).
    pub wait_stacks: &'a ResolvedStacks,
    /// Call sites, calls' stacks and launched kernels.
    pub names: &'a CallNames,
    pub functions: &'a [ProbedFunction],
    pub gpu: Option<&'a GpuState>,
    pub processes: &'a ProcessTable,
    pub nvml: Option<&'a [nvml::Sample]>,
    /// Lines the trace carries on its `sysprof` track: what it could not show.
    pub notes: Vec<String>,
}

/// A GPU metric's track name, unit and value in one NVML sample.
type Metric = (&'static str, i32, fn(&nvml::Sample) -> Option<f64>);

/// The one packet sequence sysprof writes.
const SEQUENCE: u32 = 1;

/// Track uuids: the kind above the id (a pid or tid, below 2^22; a GPU metric's device and
/// index), small enough that each event's track id takes four bytes.
fn uuid(kind: u64, id: u64) -> u64 {
    kind << 23 | id
}
const PROCESS_TRACK: u64 = 1;
const THREAD_TRACK: u64 = 2;
const STATE_TRACK: u64 = 3;
const SYSCALL_TRACK: u64 = 4;
const MEMORY_TRACK: u64 = 5;
const GPU_TRACK: u64 = 6;
const NOTES_TRACK: u64 = 7;

/// The trace, encoded.
pub(crate) fn render(sources: &Sources<'_>) -> Vec<u8> {
    let mut writer = Writer::default();
    let timeline = sources.timeline;
    let start = timeline.clocks.monotonic_ns;
    writer.clock_snapshot(timeline);
    writer.tracks(sources);
    for event in &timeline.events {
        writer.event(sources, event);
    }
    if let Some(gpu) = sources.gpu {
        for slice in &gpu.slices {
            let name = functions::by_id(slice.func).map_or("[unknown call]", |f| f.name);
            let image = ImageOf::At(slice.start_ns);
            let site = sources.names.call_site(slice.tgid, image, slice.user_stack_id, slice.caller);
            let mut args = vec![writer.annotation("call site", &site)];
            if let Some(bytes) = slice.bytes {
                args.push(writer.number("bytes", bytes));
            }
            if let Some(what) = slice.what {
                args.push(writer.annotation("direction", what));
            }
            if slice.failed {
                args.push(writer.annotation("result", "failed"));
            }
            let call = crate::callsites::sample(slice.tgid, image, slice.user_stack_id);
            let stack = writer.user_callstack(sources.names.stacks(), &call);
            let track = uuid(THREAD_TRACK, u64::from(slice.tid));
            writer.slice(track, slice.start_ns, slice.start_ns + slice.duration_ns, name, args, stack);
        }
    }
    writer.counters(sources, start);
    for note in &sources.notes {
        let event = TrackEvent {
            r#type: Some(event_type::INSTANT),
            track_uuid: Some(uuid(NOTES_TRACK, 0)),
            name_iid: Some(writer.event_name("sysprof: not in this timeline")),
            debug_annotations: vec![writer.annotation("note", note)],
            ..TrackEvent::default()
        };
        writer.timed(start, Data::TrackEvent(event));
    }
    writer.finish()
}

/// Packets, and the interning tables their call stacks and names refer to.
#[derive(Default)]
struct Writer {
    /// The trace so far: each packet is one field of the `Trace` message, encoded as it comes,
    /// so that a large timeline costs its bytes, not its messages.
    out: Vec<u8>,
    /// Whether a packet that needs the sequence's interned state was written yet.
    started: bool,
    /// Interned entries not yet written: they go with the next timed packet, the first to
    /// refer to them.
    interned: InternedData,
    names: HashMap<String, u64>,
    annotation_names: HashMap<String, u64>,
    annotation_values: HashMap<String, u64>,
    functions: HashMap<String, u64>,
    mappings: HashMap<String, u64>,
    mapping_paths: HashMap<String, u64>,
    frames: HashMap<(u64, u64), u64>,
    callstacks: HashMap<Vec<u64>, u64>,
}

impl Writer {
    fn clock_snapshot(&mut self, timeline: &Timeline) {
        let clocks = &timeline.clocks;
        let clock = |clock_id, timestamp| Clock { clock_id: Some(clock_id), timestamp: Some(timestamp) };
        self.untimed(TracePacket {
            trusted_packet_sequence_id: Some(SEQUENCE),
            data: Some(Data::ClockSnapshot(ClockSnapshot {
                clocks: vec![
                    clock(clock::BOOTTIME, clocks.boottime_ns),
                    clock(clock::MONOTONIC, clocks.monotonic_ns),
                    clock(clock::REALTIME, clocks.realtime_ns),
                ],
                primary_trace_clock: Some(clock::BOOTTIME),
            })),
            ..TracePacket::default()
        });
    }

    fn descriptor(&mut self, descriptor: TrackDescriptor) {
        self.untimed(TracePacket {
            trusted_packet_sequence_id: Some(SEQUENCE),
            data: Some(Data::TrackDescriptor(descriptor)),
            ..TracePacket::default()
        });
    }

    /// The processes, threads and counter tracks the events go on.
    fn tracks(&mut self, sources: &Sources<'_>) {
        let timeline = sources.timeline;
        let mut pids: BTreeSet<u32> = timeline.threads.values().map(|(pid, _)| *pid).collect();
        if let Some(gpu) = sources.gpu {
            pids.extend(gpu.slices.iter().map(|s| s.tgid));
        }
        pids.extend(sources.processes.iter().filter(|(_, p)| !p.memory.is_empty()).map(|(pid, _)| pid));
        pids.remove(&0);
        let mut tree = ProcessTree::default();
        for &pid in &pids {
            let record = sources.processes.get(pid);
            let name = record.map(|p| p.name.clone()).unwrap_or_default();
            tree.processes.push(ProcessTreeProcess {
                pid: Some(pid as i32),
                ppid: record.and_then(|p| p.parent).map(|p| p as i32),
                cmdline: vec![name.clone()],
            });
            self.descriptor(TrackDescriptor {
                uuid: Some(uuid(PROCESS_TRACK, u64::from(pid))),
                process: Some(ProcessDescriptor {
                    pid: Some(pid as i32),
                    process_name: Some(name),
                    ..ProcessDescriptor::default()
                }),
                ..TrackDescriptor::default()
            });
        }
        let mut threads: BTreeMap<u32, (u32, String)> = timeline.threads.clone();
        if let Some(gpu) = sources.gpu {
            for slice in &gpu.slices {
                threads.entry(slice.tid).or_insert_with(|| (slice.tgid, String::new()));
            }
        }
        for (&tid, (pid, name)) in &threads {
            if tid == 0 {
                continue;
            }
            let name = sources.processes.thread_name(tid, *pid, name);
            tree.threads.push(ProcessTreeThread {
                tid: Some(tid as i32),
                name: Some(name.clone()),
                tgid: Some(*pid as i32),
            });
            let thread = uuid(THREAD_TRACK, u64::from(tid));
            self.descriptor(TrackDescriptor {
                uuid: Some(thread),
                parent_uuid: Some(uuid(PROCESS_TRACK, u64::from(*pid))),
                thread: Some(ThreadDescriptor {
                    pid: Some(*pid as i32),
                    tid: Some(tid as i32),
                    thread_name: Some(name.clone()),
                }),
                ..TrackDescriptor::default()
            });
            for (kind, what) in [(STATE_TRACK, "off-CPU"), (SYSCALL_TRACK, "slow syscalls")] {
                self.descriptor(TrackDescriptor {
                    uuid: Some(uuid(kind, u64::from(tid))),
                    parent_uuid: Some(uuid(PROCESS_TRACK, u64::from(*pid))),
                    name: Some(format!("{name} {tid}: {what}")),
                    ..TrackDescriptor::default()
                });
            }
        }
        self.untimed(TracePacket {
            trusted_packet_sequence_id: Some(SEQUENCE),
            data: Some(Data::ProcessTree(tree)),
            ..TracePacket::default()
        });
        if !sources.notes.is_empty() {
            self.descriptor(TrackDescriptor {
                uuid: Some(uuid(NOTES_TRACK, 0)),
                name: Some("sysprof".into()),
                ..TrackDescriptor::default()
            });
        }
    }

    /// One timeline event as its packets.
    fn event(&mut self, sources: &Sources<'_>, event: &TimelineEvent) {
        let tid = u64::from(event.tid);
        match event.kind {
            kind::SAMPLE => {
                let sample = stack_sample(event);
                let frames = sources.sample_stacks.frames(&sample);
                let callstack = self.callstack(&frames);
                let data = Data::PerfSample(PerfSample {
                    cpu: Some(event.detail),
                    pid: Some(event.tgid),
                    tid: Some(event.tid),
                    callstack_iid: callstack,
                });
                self.timed(event.start_ns, data);
            }
            kind::OFF_CPU => {
                let sample = stack_sample(event);
                let kernel = sources.wait_stacks.kernel_frames(&sample);
                let user = sources.wait_stacks.user_frames(&sample);
                let reason = offcpu_reason(event.detail, kernel, user);
                let frames = sources.wait_stacks.frames(&sample);
                let callstack = self.callstack(&frames);
                let blocked_in = crate::callsites::own_frame(user).or(user.last());
                let mut args = Vec::new();
                if let Some(frame) = blocked_in {
                    args.push(self.annotation("blocked in", &crate::callsites::describe(frame)));
                }
                let woken = if event.mark_ns > event.start_ns {
                    event.mark_ns.min(event.end_ns)
                } else {
                    event.end_ns
                };
                let track = uuid(STATE_TRACK, tid);
                self.slice(track, event.start_ns, woken, &format!("off-CPU: {reason}"), args, callstack);
                if woken < event.end_ns {
                    self.slice(track, woken, event.end_ns, "runnable (waiting for a CPU)", Vec::new(), None);
                }
            }
            kind::SYSCALL => {
                let name = syscalls::Sysno::new(event.detail as usize).map_or("syscall", |s| s.name());
                let ret = event.mark_ns as i64;
                let result = if (-4095..0).contains(&ret) {
                    nix::errno::Errno::from_raw(-ret as i32).to_string()
                } else {
                    ret.to_string()
                };
                let args = vec![self.annotation("returned", &result)];
                self.slice(uuid(SYSCALL_TRACK, tid), event.start_ns, event.end_ns, name, args, None);
            }
            kind::CALL => {
                let library_call = functions::by_id(event.detail);
                let name = library_call
                    .map(|f| f.name.to_string())
                    .or_else(|| {
                        sources.functions.iter().find(|f| f.id == event.detail).map(|f| f.symbol.clone())
                    })
                    .unwrap_or_else(|| "[unknown call]".into());
                let image = ImageOf::At(event.start_ns);
                let site = match library_call {
                    Some(_) => sources.names.call_site(event.tgid, image, event.user_stack_id, 0),
                    // A `--func` function is the program's own code, the stack's leaf: its
                    // caller is the frame above it.
                    None => {
                        let sample = crate::callsites::sample(event.tgid, image, event.user_stack_id);
                        let frames = sources.names.stacks().user_frames(&sample);
                        let above = frames.iter().rev().find(|f| *f.function != *name);
                        above.map_or_else(|| "[no user stack]".into(), crate::callsites::describe)
                    }
                };
                let mut args = vec![self.annotation("call site", &site)];
                let launch =
                    functions::by_id(event.detail).is_some_and(|f| matches!(f.kind, functions::Kind::Launch));
                if launch && event.mark_ns != 0 {
                    let kernel = sources.names.symbol(event.tgid, image, event.mark_ns);
                    args.push(self.annotation("kernel", &kernel));
                }
                let stack = self.user_callstack(
                    sources.names.stacks(),
                    &crate::callsites::sample(event.tgid, image, event.user_stack_id),
                );
                self.slice(uuid(THREAD_TRACK, tid), event.start_ns, event.end_ns, &name, args, stack);
            }
            _ => {}
        }
    }

    /// Memory per process and the GPUs' metrics, as counter tracks.
    fn counters(&mut self, sources: &Sources<'_>, start: u64) {
        // In pid order: the table's own order differs between a trace and its replay.
        let mut measured: Vec<_> =
            sources.processes.iter().filter(|(_, record)| !record.memory.is_empty()).collect();
        measured.sort_unstable_by_key(|&(pid, _)| pid);
        for (pid, record) in measured {
            let track = uuid(MEMORY_TRACK, u64::from(pid));
            self.descriptor(TrackDescriptor {
                uuid: Some(track),
                parent_uuid: Some(uuid(PROCESS_TRACK, u64::from(pid))),
                name: Some("resident memory".into()),
                counter: Some(CounterDescriptor { unit: Some(unit::SIZE_BYTES), unit_name: None }),
                ..TrackDescriptor::default()
            });
            for sample in record.memory.samples() {
                self.counter(track, at_ms(start, sample.t_ms), sample.rss() as f64);
            }
        }
        let Some(samples) = sources.nvml else { return };
        let metrics: [Metric; 4] = [
            ("SM utilization (%)", unit::COUNT, |s| s.sm_util_pct.map(f64::from)),
            ("memory utilization (%)", unit::COUNT, |s| s.mem_util_pct.map(f64::from)),
            ("memory used", unit::SIZE_BYTES, |s| s.mem_used.map(|b| b as f64)),
            ("power (W)", unit::COUNT, |s| s.power_mw.map(|mw| f64::from(mw) / 1000.0)),
        ];
        let devices: BTreeSet<u32> = samples.iter().map(|s| s.device).collect();
        for device in devices {
            for (index, (name, unit, value)) in metrics.iter().enumerate() {
                let track = uuid(GPU_TRACK, u64::from(device) << 8 | index as u64);
                let values: Vec<(u64, f64)> = samples
                    .iter()
                    .filter(|s| s.device == device)
                    .filter_map(|s| Some((s.t_ms, value(s)?)))
                    .collect();
                if values.is_empty() {
                    continue;
                }
                self.descriptor(TrackDescriptor {
                    uuid: Some(track),
                    name: Some(format!("GPU {device} {name}")),
                    counter: Some(CounterDescriptor { unit: Some(*unit), unit_name: None }),
                    ..TrackDescriptor::default()
                });
                for (t_ms, value) in values {
                    self.counter(track, at_ms(start, t_ms), value);
                }
            }
        }
    }

    fn counter(&mut self, track: u64, at: u64, value: f64) {
        let event = TrackEvent {
            r#type: Some(event_type::COUNTER),
            track_uuid: Some(track),
            double_counter_value: Some(value),
            ..TrackEvent::default()
        };
        self.timed(at, Data::TrackEvent(event));
    }

    /// A slice from `begin` to `end` on `track`.
    fn slice(
        &mut self,
        track: u64,
        begin: u64,
        end: u64,
        name: &str,
        args: Vec<DebugAnnotation>,
        callstack: Option<u64>,
    ) {
        let name_iid = self.event_name(name);
        let begin_event = TrackEvent {
            r#type: Some(event_type::SLICE_BEGIN),
            track_uuid: Some(track),
            name_iid: Some(name_iid),
            debug_annotations: args,
            callstack_iid: callstack,
            ..TrackEvent::default()
        };
        self.timed(begin, Data::TrackEvent(begin_event));
        let end_event = TrackEvent {
            r#type: Some(event_type::SLICE_END),
            track_uuid: Some(track),
            ..TrackEvent::default()
        };
        // Right after its begin: a track's slices come in order (each family records its
        // thread's in turn), so each ends before the next begins, also at equal times.
        self.timed(end.max(begin), Data::TrackEvent(end_event));
    }

    /// A packet of the sequence that needs no interned state (descriptors, the clock).
    fn untimed(&mut self, packet: TracePacket) {
        prost::encoding::message::encode(1, &packet, &mut self.out);
    }

    /// A packet at `at`, with the interned entries it is the first to use. Trace processor
    /// sorts packets by time, so they are written as they come.
    fn timed(&mut self, at: u64, data: Data) {
        let interned = std::mem::take(&mut self.interned);
        let has_interned = !(interned.event_names.is_empty()
            && interned.debug_annotation_names.is_empty()
            && interned.debug_annotation_string_values.is_empty()
            && interned.function_names.is_empty()
            && interned.frames.is_empty()
            && interned.callstacks.is_empty()
            && interned.mappings.is_empty());
        // The first packet starts the sequence's state: its interned data, and its default
        // clock (the kernel's monotonic one), which every later packet then leaves out.
        let first = !self.started;
        self.started = true;
        let packet = TracePacket {
            timestamp: Some(at),
            trusted_packet_sequence_id: Some(SEQUENCE),
            sequence_flags: first.then_some(SEQ_INCREMENTAL_STATE_CLEARED),
            trace_packet_defaults: first
                .then_some(TracePacketDefaults { timestamp_clock_id: Some(clock::MONOTONIC) }),
            interned_data: has_interned.then_some(interned),
            data: Some(data),
            ..TracePacket::default()
        };
        prost::encoding::message::encode(1, &packet, &mut self.out);
    }

    /// An annotation of a string, name and value interned: a timeline repeats both.
    fn annotation(&mut self, name: &str, value: &str) -> DebugAnnotation {
        let name_iid = self.annotation_name(name);
        let value =
            intern(&mut self.annotation_values, &mut self.interned.debug_annotation_string_values, value);
        DebugAnnotation { name_iid: Some(name_iid), value: Some(Value::StringIid(value)) }
    }

    fn number(&mut self, name: &str, value: u64) -> DebugAnnotation {
        DebugAnnotation { name_iid: Some(self.annotation_name(name)), value: Some(Value::Uint(value)) }
    }

    fn annotation_name(&mut self, name: &str) -> u64 {
        intern_name(&mut self.annotation_names, &mut self.interned.debug_annotation_names, name)
    }

    fn event_name(&mut self, name: &str) -> u64 {
        intern_name(&mut self.names, &mut self.interned.event_names, name)
    }

    /// The user part of a call's stack, interned.
    fn user_callstack(&mut self, stacks: &ResolvedStacks, call: &StackSample) -> Option<u64> {
        let frames = stacks.user_frames(call).to_vec();
        self.callstack(&frames)
    }

    /// Frames (outermost first) as an interned call stack; `None` for no frames.
    fn callstack(&mut self, frames: &[SymbolFrame]) -> Option<u64> {
        if frames.is_empty() {
            return None;
        }
        let ids: Vec<u64> = frames.iter().map(|frame| self.frame(frame)).collect();
        if let Some(&iid) = self.callstacks.get(&ids) {
            return Some(iid);
        }
        let iid = self.callstacks.len() as u64 + 1;
        self.interned.callstacks.push(Callstack { iid: Some(iid), frame_ids: ids.clone() });
        self.callstacks.insert(ids, iid);
        Some(iid)
    }

    fn frame(&mut self, frame: &SymbolFrame) -> u64 {
        let function = intern(&mut self.functions, &mut self.interned.function_names, &frame.function);
        let mapping = match self.mappings.get(&*frame.module) {
            Some(&iid) => iid,
            None => {
                let path = intern(&mut self.mapping_paths, &mut self.interned.mapping_paths, &frame.module);
                let iid = self.mappings.len() as u64 + 1;
                self.interned.mappings.push(Mapping { iid: Some(iid), path_string_ids: vec![path] });
                self.mappings.insert(frame.module.to_string(), iid);
                iid
            }
        };
        let key = (function, mapping);
        if let Some(&iid) = self.frames.get(&key) {
            return iid;
        }
        let iid = self.frames.len() as u64 + 1;
        self.interned.frames.push(Frame {
            iid: Some(iid),
            function_name_id: Some(function),
            mapping_id: Some(mapping),
            rel_pc: Some(0),
        });
        self.frames.insert(key, iid);
        iid
    }

    /// The trace.
    fn finish(mut self) -> Vec<u8> {
        // Held until written, after the whole analysis: without the room its growth left.
        self.out.shrink_to_fit();
        self.out
    }
}

/// The interned id of a name (an event's, an annotation's) in `table`, as [`intern`] does.
fn intern_name(ids: &mut HashMap<String, u64>, table: &mut Vec<EventName>, name: &str) -> u64 {
    if let Some(&iid) = ids.get(name) {
        return iid;
    }
    let iid = ids.len() as u64 + 1;
    table.push(EventName { iid: Some(iid), name: Some(name.to_string()) });
    ids.insert(name.to_string(), iid);
    iid
}

/// The interned id of `text` in `table` (ids from 1), adding it when new.
fn intern(ids: &mut HashMap<String, u64>, table: &mut Vec<InternedString>, text: &str) -> u64 {
    if let Some(&iid) = ids.get(text) {
        return iid;
    }
    // From the map, which keeps every id given: the table holds only those not yet written.
    let iid = ids.len() as u64 + 1;
    table.push(InternedString { iid: Some(iid), str: Some(text.as_bytes().to_vec()) });
    ids.insert(text.to_string(), iid);
    iid
}

/// An event's stacks as the resolver takes them: of the image its process ran at its start.
pub(crate) fn stack_sample(event: &TimelineEvent) -> StackSample {
    StackSample {
        tgid: event.tgid,
        tid: event.tid,
        user_stack_id: event.user_stack_id,
        kernel_stack_id: event.kernel_stack_id,
        comm: None,
        weight: 1,
        tag: event.detail,
        image: ImageOf::At(event.start_ns),
    }
}

/// `t_ms` milliseconds after `start_ns`: a replayed read-out's times are its word, so this
/// saturates rather than wraps.
fn at_ms(start_ns: u64, t_ms: u64) -> u64 {
    start_ns.saturating_add(t_ms.saturating_mul(1_000_000))
}
