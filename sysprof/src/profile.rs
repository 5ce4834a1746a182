//! The aggregate stage: the kernel's (thread, stack ids) -> weight maps become symbolized,
//! weighted stacks per process, the shape every stack output (folded, SVG, hotspots) reads.
//! On-CPU samples and off-CPU time go through the same path.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;
use sysprof_common::{SampleKey, stack};

use crate::{
    cpu::CpuSamples,
    procmaps::ProcessMaps,
    procs::{ImageOf, Images, ProcessTable, comm_to_string},
    symbolize::{Frame, Symbolizer},
};

/// One distinct stack of one process and how much of the measure it carries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WeightedStack {
    pub pid: u32,
    /// Root frame of the flamegraph: the process name, or a label for idle and kernel threads.
    pub process: String,
    /// Outermost first: an optional label (why the thread was off CPU), user frames, then
    /// kernel frames.
    pub frames: Vec<Frame>,
    pub weight: u64,
    /// The weight by thread (id, name), where the kernel kept the thread (on-CPU samples):
    /// the pprof files' thread labels. Empty otherwise.
    #[serde(skip)]
    pub threads: Vec<(u32, String, u64)>,
}

/// Stacks with weights in one unit (samples, microseconds, bytes, ...).
#[derive(Clone, Debug, Default, Serialize)]
pub struct StackProfile {
    pub unit: String,
    pub stacks: Vec<WeightedStack>,
}

impl StackProfile {
    pub fn total(&self) -> u64 {
        self.stacks.iter().fold(0, |total, s| total.saturating_add(s.weight))
    }
}

/// One weighted observation as the kernel keyed it.
#[derive(Clone, Copy, Debug)]
pub struct StackSample {
    pub tgid: u32,
    /// 0 for the idle task.
    pub tid: u32,
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
    /// Thread name at the time, when the kernel recorded it.
    pub comm: Option<[u8; 16]>,
    pub weight: u64,
    /// What the caller keyed besides the stacks (the scheduler state of off-CPU samples).
    pub tag: u32,
    /// The program image of its process the user stack was taken in.
    pub image: ImageOf,
}

/// Marker frames for stacks the kernel could not keep.
const LOST_USER_STACK: &str = "[user stack lost]";
const LOST_KERNEL_STACK: &str = "[kernel stack lost]";

/// Stacks resolved to frames: kernel stacks by id, user stacks by (process, image, id) since
/// the same addresses mean different code in different processes, and in the programs one
/// process ran before and after an exec.
#[derive(Debug, Default)]
pub struct ResolvedStacks {
    kernel: HashMap<u32, Vec<Frame>>,
    user: HashMap<(u32, u32, u32), Vec<Frame>>,
    /// Which image a sample's stack is of.
    images: Images,
}

impl ResolvedStacks {
    /// Symbolizes every stack the samples reference, in batches.
    pub fn resolve(
        samples: &[StackSample],
        stacks: &HashMap<u32, Vec<u64>>,
        processes: &mut ProcessTable,
        symbolizer: &mut Symbolizer,
    ) -> Self {
        let mut resolved = Self::kernel_only(samples.iter().copied(), stacks, processes, symbolizer);
        for ((pid, image), ids) in resolved.user_ids(samples) {
            resolved.add_user(pid, image, ids, stacks, processes, symbolizer);
        }
        resolved
    }

    /// The user stacks `samples` reference, by process and image.
    fn user_ids(&self, samples: &[StackSample]) -> BTreeMap<(u32, u32), BTreeSet<u32>> {
        let mut user_ids: BTreeMap<(u32, u32), BTreeSet<u32>> = BTreeMap::new();
        for sample in samples {
            if let Ok(id) = u32::try_from(sample.user_stack_id) {
                user_ids.entry((sample.tgid, self.image_of(sample))).or_default().insert(id);
            }
        }
        user_ids
    }

    /// The index of the image `sample`'s user stack was taken in, among its process's.
    pub fn image_of(&self, sample: &StackSample) -> u32 {
        self.images.index(sample.tgid, sample.image)
    }

    /// Which image each process's stacks are of.
    pub fn images(&self) -> &Images {
        &self.images
    }

    /// The kernel stacks the samples reference, with their processes known to `processes`:
    /// the user stacks are added process by process ([`Self::add_user`]).
    fn kernel_only(
        samples: impl IntoIterator<Item = StackSample>,
        stacks: &HashMap<u32, Vec<u64>>,
        processes: &mut ProcessTable,
        symbolizer: &mut Symbolizer,
    ) -> Self {
        let mut kernel_ids = BTreeSet::new();
        for sample in samples {
            if sample.tgid != 0 {
                processes.ensure(sample.tgid);
            }
            kernel_ids.extend(u32::try_from(sample.kernel_stack_id));
        }
        let kernel_addrs: BTreeSet<u64> =
            kernel_ids.iter().filter_map(|id| stacks.get(id)).flatten().copied().collect();
        let kernel_frames = symbolizer.kernel(&kernel_addrs.into_iter().collect::<Vec<_>>());
        let kernel = kernel_ids
            .iter()
            .filter_map(|&id| {
                let ips = stacks.get(&id)?;
                let mut frames: Vec<Frame> =
                    ips.iter().rev().flat_map(|addr| kernel_frames[addr].iter().cloned()).collect();
                without_tracing_glue(&mut frames);
                // Kept until every profile is built: without the room collecting left.
                frames.shrink_to_fit();
                Some((id, frames))
            })
            .collect();
        // After `ensure`: the images of every process the samples name.
        ResolvedStacks { kernel, user: HashMap::new(), images: processes.images() }
    }

    /// Resolves the user stacks `ids` of process `pid`'s image `image`, in one batch.
    fn add_user(
        &mut self,
        pid: u32,
        image: u32,
        ids: BTreeSet<u32>,
        stacks: &HashMap<u32, Vec<u64>>,
        processes: &ProcessTable,
        symbolizer: &mut Symbolizer,
    ) {
        let of = processes.get(pid).map(|p| p.image(image as usize));
        if of.is_some_and(|image| image.launcher) {
            static LAUNCHER: std::sync::OnceLock<Frame> = std::sync::OnceLock::new();
            let launcher = LAUNCHER.get_or_init(|| Frame::new(SYSPROF_LAUNCHER.into(), "sysprof".into()));
            self.user.extend(ids.into_iter().map(|id| ((pid, image, id), vec![launcher.clone()])));
            return;
        }
        let maps = of.and_then(|image| image.maps);
        let python_code = of.and_then(|image| image.python);
        let addrs: BTreeSet<u64> = ids
            .iter()
            .filter_map(|id| stacks.get(id))
            .flat_map(|ips| lookup_addresses(walked_part(split_python(ips).1, maps)))
            .collect();
        let frames = symbolizer.user(pid, image, maps, &addrs.into_iter().collect::<Vec<_>>());
        let mut python_frames = crate::python::PythonFrames::default();
        for id in ids {
            let Some(ips) = stacks.get(&id) else { continue };
            let (python, native) = split_python(ips);
            let walked = walked_part(native, maps);
            let addrs: Vec<u64> = lookup_addresses(walked).collect();
            let mut resolved: Vec<Frame> =
                addrs.iter().rev().flat_map(|addr| frames[addr].iter().cloned()).collect();
            // A leaf outside every mapping of its image ran code unmapped since (a library
            // closed): no address of it means anything now.
            if maps.is_some_and(|maps| walked.first().is_some_and(|leaf| maps.find(*leaf).is_none())) {
                let leaf = resolved.len() - frames[&addrs[0]].len();
                resolved.truncate(leaf);
                // One frame for every such stack: a busy host's short processes have thousands.
                static UNMAPPED: std::sync::OnceLock<Frame> = std::sync::OnceLock::new();
                resolved.push(UNMAPPED.get_or_init(|| marker(Frame::UNMAPPED_CODE)).clone());
            }
            let mut merged = crate::python::merge(resolved, python, python_code, id, &mut python_frames);
            // As the kernel's: a busy machine's fault profile resolves thousands of stacks.
            merged.shrink_to_fit();
            self.user.insert((pid, image, id), merged);
        }
    }

    /// The frames of a sample, outermost first: user stack, then kernel stack.
    pub fn frames(&self, sample: &StackSample) -> Vec<Frame> {
        self.frames_under(None, sample)
    }

    /// [`Self::frames`] under `label` when there is one, in a vector of exactly their length:
    /// a profile keeps every distinct stack's, tens of thousands on a busy machine.
    pub fn frames_under(&self, label: Option<Frame>, sample: &StackSample) -> Vec<Frame> {
        static LOST: std::sync::OnceLock<Frame> = std::sync::OnceLock::new();
        let lost = (sample.user_stack_id == stack::LOST)
            .then(|| LOST.get_or_init(|| marker(LOST_USER_STACK)).clone());
        let (user, kernel) = (self.user_frames(sample), self.kernel_frames(sample));
        let length = usize::from(label.is_some()) + usize::from(lost.is_some()) + user.len() + kernel.len();
        let mut frames = Vec::with_capacity(length);
        frames.extend(label);
        frames.extend(lost);
        frames.extend_from_slice(user);
        frames.extend_from_slice(kernel);
        frames
    }

    /// Only the user part of a sample's stack, outermost first (empty when there is none).
    pub fn user_frames(&self, sample: &StackSample) -> &[Frame] {
        u32::try_from(sample.user_stack_id)
            .ok()
            .and_then(|id| self.user.get(&(sample.tgid, self.image_of(sample), id)))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Only the kernel part of a sample's stack.
    pub fn kernel_frames(&self, sample: &StackSample) -> &[Frame] {
        static LOST: std::sync::OnceLock<[Frame; 1]> = std::sync::OnceLock::new();
        match sample.kernel_stack_id {
            stack::NONE => &[],
            stack::LOST => LOST.get_or_init(|| [marker(LOST_KERNEL_STACK)]),
            id => self.kernel.get(&(id as u32)).map(Vec::as_slice).unwrap_or(&[]),
        }
    }
}

/// Merges samples with the same process and frames into a profile. `label` may add a frame
/// right under the process (for example why a thread was off CPU).
pub fn build(
    samples: &[StackSample],
    resolved: &ResolvedStacks,
    processes: &ProcessTable,
    unit: &str,
    label: impl Fn(&StackSample, &[Frame]) -> Option<String>,
) -> StackProfile {
    merge(samples, resolved, processes, label).into_profile(unit)
}

/// Samples merged by (process id, root label, frames): [`build`] in two steps, so that a caller
/// can free the samples and their resolved stacks before the profile is laid out (a busy
/// host's fault profile holds tens of thousands of each).
#[derive(Default)]
pub struct Merged {
    stacks: HashMap<(u32, String, Vec<Frame>), u64>,
    /// A few labels over thousands of stacks: one frame each, shared.
    labels: HashMap<String, Frame>,
}

/// [`build`]'s first step.
pub fn merge(
    samples: &[StackSample],
    resolved: &ResolvedStacks,
    processes: &ProcessTable,
    label: impl Fn(&StackSample, &[Frame]) -> Option<String>,
) -> Merged {
    let mut merged = Merged::default();
    merged.add(samples, resolved, processes, &label);
    merged
}

/// [`merge`] of samples whose stacks are not resolved yet, one process at a time: each
/// process's user stacks are resolved, merged and freed before the next's. The merge keeps
/// processes apart, so the profile is the same as [`ResolvedStacks::resolve`] then [`merge`]
/// would give, without every process's resolved stacks alive at once (a busy host's fault
/// profile resolves tens of thousands, for thousands of short processes). The samples are
/// made from the read-out's `entries` (`sample_of`) a process at a time too: as a vector of
/// their own beside it, they were 1.6 MB of that profile's peak.
pub fn merge_by_process<E>(
    mut entries: Vec<E>,
    sample_of: impl Fn(&E) -> StackSample,
    stacks: &HashMap<u32, Vec<u64>>,
    processes: &mut ProcessTable,
    symbolizer: &mut Symbolizer,
    label: impl Fn(&StackSample, &[Frame]) -> Option<String>,
) -> Merged {
    let mut resolved =
        ResolvedStacks::kernel_only(entries.iter().map(&sample_of), stacks, processes, symbolizer);
    entries.sort_unstable_by_key(|entry| sample_of(entry).tgid);
    let mut merged = Merged::default();
    for process in entries.chunk_by(|a, b| sample_of(a).tgid == sample_of(b).tgid) {
        let samples: Vec<StackSample> = process.iter().map(&sample_of).collect();
        for ((pid, image), ids) in resolved.user_ids(&samples) {
            resolved.add_user(pid, image, ids, stacks, processes, symbolizer);
        }
        merged.add(&samples, &resolved, processes, &label);
        resolved.user.clear();
    }
    merged
}

impl Merged {
    /// Adds `samples`, their stacks in `resolved`.
    fn add(
        &mut self,
        samples: &[StackSample],
        resolved: &ResolvedStacks,
        processes: &ProcessTable,
        label: &impl Fn(&StackSample, &[Frame]) -> Option<String>,
    ) {
        for sample in samples {
            let label = label(sample, resolved.kernel_frames(sample))
                .map(|label| self.labels.entry(label).or_insert_with_key(|label| marker(label)).clone());
            let frames = resolved.frames_under(label, sample);
            let root = root_label(sample, resolved.image_of(sample), processes);
            let weight = self.stacks.entry((sample.tgid, root, frames)).or_default();
            *weight = weight.saturating_add(sample.weight);
        }
    }

    /// The profile, heaviest first, weighed in `unit`.
    pub fn into_profile(self, unit: &str) -> StackProfile {
        let mut stacks: Vec<WeightedStack> = self
            .stacks
            .into_iter()
            .map(|((pid, process, frames), weight)| WeightedStack {
                pid,
                process,
                frames,
                weight,
                threads: Vec::new(),
            })
            .collect();
        heaviest_first(&mut stacks);
        StackProfile { unit: unit.into(), stacks }
    }
}

/// Heaviest first; equal weights in frame order, then by process, so every output is the same
/// run after run (short-lived processes of one program share their stacks, each under its own
/// pid, and came out in the order of a hash map's). The stacks were merged by all of these, so
/// no two compare equal: an unstable sort orders them alike, without a stable one's scratch copy.
fn heaviest_first(stacks: &mut [WeightedStack]) {
    stacks.sort_unstable_by(|a, b| {
        b.weight
            .cmp(&a.weight)
            .then_with(|| a.frames.cmp(&b.frames))
            .then_with(|| a.process.cmp(&b.process))
            .then(a.pid.cmp(&b.pid))
    });
}

/// Builds the on-CPU profile from the raw samples, each stack with its weight by thread.
pub fn cpu_profile(
    samples: &CpuSamples,
    processes: &mut ProcessTable,
    symbolizer: &mut Symbolizer,
) -> StackProfile {
    let stack_samples: Vec<StackSample> =
        samples.counts.iter().map(|(key, count)| sample_of(key, *count)).collect();
    let resolved = ResolvedStacks::resolve(&stack_samples, &samples.stacks, processes, symbolizer);
    type Threads = BTreeMap<(u32, String), u64>;
    let mut merged: HashMap<(u32, String, Vec<Frame>), (u64, Threads)> = HashMap::new();
    for sample in &stack_samples {
        let mut frames = resolved.frames(sample);
        // Samples in sysprof's probes, merged into one `[sysprof probes]` frame where they start.
        label_probe_frames(&mut frames);
        let root = root_label(sample, resolved.image_of(sample), processes);
        let (weight, threads) = merged.entry((sample.tgid, root, frames)).or_default();
        *weight = weight.saturating_add(sample.weight);
        let thread = sample.comm.map(|comm| comm_to_string(&comm)).unwrap_or_default();
        let on_thread = threads.entry((sample.tid, thread)).or_default();
        *on_thread = on_thread.saturating_add(sample.weight);
    }
    let mut stacks: Vec<WeightedStack> = merged
        .into_iter()
        .map(|((pid, process, frames), (weight, threads))| WeightedStack {
            pid,
            process,
            frames,
            weight,
            threads: threads.into_iter().map(|((tid, name), weight)| (tid, name, weight)).collect(),
        })
        .collect();
    heaviest_first(&mut stacks);
    StackProfile { unit: "samples".into(), stacks }
}

/// The frame that stands for the kernel code that runs only because sysprof's probes are
/// attached: its cost, never the target's.
pub const SYSPROF_PROBES: &str = "[sysprof probes]";

/// The frame that stands for the user part of a launched command's stacks before its exec:
/// sysprof's launcher, forked, waiting at its gate or calling execve (see
/// `procs::Image::launcher`). The kernel frames under it are the command's start.
pub const SYSPROF_LAUNCHER: &str = "[sysprof launcher]";

/// Kernel functions that run only for attached probes: the syscall tracepoints' slow path, the
/// software perf events (page faults), the uprobe traps (the breakpoint, the single step of the
/// displaced instruction) and return trampoline, BPF itself. A target under a debugger also
/// takes breakpoint traps; sysprof does not tell those apart.
const PROBE_ENTRIES: [&str; 14] = [
    "asm_exc_int3",
    "asm_exc_debug",
    "syscall_trace_enter",
    "syscall_exit_work",
    "trace_call_bpf",
    "perf_swevent_event",
    "___perf_sw_event",
    "__perf_sw_event",
    "perf_tp_event",
    "uprobe_notify_resume",
    "handle_swbp",
    "__x64_sys_uretprobe",
    "uprobe_handle_trampoline",
    "__bpf_prog_run",
];

/// Kernel work that goes through the same entry points for someone else (seccomp filters, the
/// audit subsystem): left as it is.
const NOT_PROBES: [&str; 2] = ["secure_computing", "audit"];

/// Replaces the frames from the first probe frame inward (outermost first: a kernel probe entry
/// point, or the uprobes' out-of-line area in user memory, `[uprobes]`) with one
/// [`SYSPROF_PROBES`] frame: an on-CPU sample there is sysprof's cost.
fn label_probe_frames(frames: &mut Vec<Frame>) {
    let is_probe = |f: &Frame| {
        (f.is_kernel() && PROBE_ENTRIES.iter().any(|p| f.function.starts_with(p)))
            || (!f.is_kernel() && f.function.contains("\"uprobes\")"))
    };
    let Some(entry) = frames.iter().position(is_probe) else {
        return;
    };
    if frames[entry..].iter().any(|f| NOT_PROBES.iter().any(|n| f.function.contains(n))) {
        return;
    }
    frames.truncate(entry);
    frames.push(Frame::new(SYSPROF_PROBES.into(), "sysprof".into()));
}

fn sample_of(key: &SampleKey, count: u64) -> StackSample {
    StackSample {
        tgid: key.tgid,
        tid: key.tid,
        user_stack_id: key.user_stack_id,
        kernel_stack_id: key.kernel_stack_id,
        comm: Some(key.comm),
        weight: count,
        tag: 0,
        image: ImageOf::Generation(key.exec_id),
    }
}

/// Stacks taken inside a tracepoint program end in the tracing machinery (`bpf_trace_run4`,
/// then the JIT-compiled program itself, which resolves to whatever symbol precedes it): cut
/// them off, so a stack ends where the traced code was (`__schedule` for a context switch).
fn without_tracing_glue(frames: &mut Vec<Frame>) {
    if let Some(glue) = frames.iter().rposition(|f| f.function.starts_with("bpf_trace_run")) {
        frames.truncate(glue);
        while frames
            .last()
            .is_some_and(|f| f.function.starts_with("__bpf_trace_") || f.function.starts_with("__traceiter_"))
        {
            frames.pop();
        }
    }
}

/// The part of a user stack the walk got right: the leaf, then each return address inside an
/// executable mapping of the process. A frame-pointer walk through code built without them
/// reads any value as the next frame (ASCII of a file name, a counter): it ends at the first
/// that is no code, and so does the stack. (The unwinder, with tables, stops there itself.)
fn walked_part<'a>(ips: &'a [u64], maps: Option<&ProcessMaps>) -> &'a [u64] {
    let Some(maps) = maps else { return ips };
    let code = ips.iter().skip(1).take_while(|&&ip| maps.find(ip.saturating_sub(1)).is_some()).count();
    &ips[..ips.len().min(1 + code)]
}

/// A walked stack's Python frames (recorded first) and its native ones.
fn split_python(ips: &[u64]) -> (&[u64], &[u64]) {
    ips.split_at(ips.iter().take_while(|&&ip| crate::python::is_python_frame(ip)).count())
}

/// The addresses to symbolize for a stack, innermost first. Every frame but the innermost holds
/// a return address, which points after the call: one byte back lands inside the call
/// instruction, so a call at the end of a function is not blamed on the next one.
fn lookup_addresses(ips: &[u64]) -> impl Iterator<Item = u64> + '_ {
    ips.iter().enumerate().map(|(depth, &ip)| if depth == 0 { ip } else { ip.saturating_sub(1) })
}

fn marker(label: &str) -> Frame {
    Frame::new(label.into(), "".into())
}

/// The flamegraph root for a sample: the name of the process's image `image` (the program it
/// ran then), with idle and kernel threads labelled.
fn root_label(sample: &StackSample, image: u32, processes: &ProcessTable) -> String {
    if sample.tid == 0 && sample.tgid == 0 {
        return "[idle]".into();
    }
    let record = processes.get(sample.tgid);
    let name = record
        .map(|p| p.image(image as usize).name.to_string())
        .filter(|n| !n.is_empty())
        .or_else(|| sample.comm.map(|comm| comm_to_string(&comm)))
        .unwrap_or_else(|| format!("pid {}", sample.tgid));
    let kernel_thread = sample.user_stack_id == stack::NONE
        && record.is_some_and(|p| p.images().all(|image| image.maps.is_none()));
    if kernel_thread { format!("[kernel thread] {name}") } else { name }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_addresses_step_back_into_the_call() {
        let ips = [0x1000, 0x2005, 0x3010];
        assert_eq!(lookup_addresses(&ips).collect::<Vec<_>>(), [0x1000, 0x2004, 0x300f]);
    }

    #[test]
    fn idle_and_lost_stacks_are_labelled() {
        let samples = CpuSamples {
            counts: vec![
                (
                    SampleKey {
                        tgid: 0,
                        tid: 0,
                        user_stack_id: stack::NONE,
                        kernel_stack_id: stack::LOST,
                        comm: [0; 16],
                        exec_id: 0,
                    },
                    5,
                ),
                (
                    SampleKey {
                        tgid: 0,
                        tid: 0,
                        user_stack_id: stack::NONE,
                        kernel_stack_id: stack::LOST,
                        comm: [1; 16],
                        exec_id: 0,
                    },
                    2,
                ),
            ],
            stacks: HashMap::new(),
        };
        let profile = cpu_profile(&samples, &mut ProcessTable::new(), &mut Symbolizer::new());
        assert_eq!(profile.stacks.len(), 1, "same process and frames merge");
        assert_eq!(profile.stacks[0].process, "[idle]");
        assert_eq!(profile.stacks[0].frames, vec![marker(LOST_KERNEL_STACK)]);
        assert_eq!(profile.total(), 7);
    }

    /// Kernel frames with these names, outermost first.
    fn kernel(names: &[&str]) -> Vec<Frame> {
        names.iter().map(|n| Frame::new((*n).into(), Frame::KERNEL_MODULE.into())).collect()
    }

    #[test]
    fn probe_frames_are_sysprofs() {
        let mut frames =
            kernel(&["entry_SYSCALL_64", "do_syscall_64", "syscall_exit_work", "__bpf_prog_run"]);
        label_probe_frames(&mut frames);
        assert_eq!(frames[..2], kernel(&["entry_SYSCALL_64", "do_syscall_64"])[..]);
        assert_eq!(&*frames[2].function, SYSPROF_PROBES);
        assert_eq!(frames.len(), 3);
        let mut seccomp = kernel(&["do_syscall_64", "syscall_trace_enter", "__secure_computing"]);
        label_probe_frames(&mut seccomp);
        assert_eq!(seccomp.len(), 3, "seccomp's filter is not sysprof's");
    }

    #[test]
    fn tracing_glue_is_cut_from_kernel_stacks() {
        let mut frames =
            kernel(&["do_nanosleep", "schedule", "__schedule", "bpf_trace_run4", "__stop_runtime_ptr"]);
        without_tracing_glue(&mut frames);
        assert_eq!(frames, kernel(&["do_nanosleep", "schedule", "__schedule"]));
        let mut sampled = kernel(&["asm_sysvec_apic_timer_interrupt", "irqentry_exit"]);
        without_tracing_glue(&mut sampled);
        assert_eq!(sampled.len(), 2, "stacks without glue stay whole");
    }

    #[test]
    fn labels_go_under_the_process() {
        let samples = [StackSample {
            tgid: 42,
            tid: 42,
            user_stack_id: stack::LOST,
            kernel_stack_id: stack::NONE,
            comm: Some(*b"app\0\0\0\0\0\0\0\0\0\0\0\0\0"),
            weight: 3,
            tag: 0,
            image: ImageOf::default(),
        }];
        let resolved = ResolvedStacks::default();
        let profile = build(&samples, &resolved, &ProcessTable::new(), "us", |_, _| Some("[sleep]".into()));
        assert_eq!(profile.stacks[0].process, "app");
        assert_eq!(profile.stacks[0].frames, vec![marker("[sleep]"), marker(LOST_USER_STACK)]);
    }
}
