//! The processes of a trace: their names, parents and memory-map snapshots, kept up to date
//! from the kernel's process events so that processes that exit mid-trace still symbolize;
//! and, when memory is traced, how much memory each uses over the run.
//!
//! A process that execs during the trace ran two programs (images) under one pid: each keeps
//! its own name and snapshot, and every stack is resolved against the image it was taken in
//! (`ImageOf`: the generation the kernel keyed it with, or the time it was taken). The old
//! image's snapshot is the one read before the exec (at the attach, at its own exec, by the
//! rescans since); the exec event comes after its address space is gone.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use sysprof_common::{ProcessEvent, exec_id, process_event};

use crate::{
    memory::usage::{MemorySample, Schedule, Series},
    procmaps::ProcessMaps,
};

/// Re-read a new process's maps at these ages: its dynamic loader maps libraries in the first
/// milliseconds after exec. Only the first when the kernel announces executable mappings
/// (`ProcessTable::announces_mappings`).
const NEW_PROCESS_RESCANS: [Duration; 5] = [
    Duration::from_millis(2),
    Duration::from_millis(10),
    Duration::from_millis(30),
    Duration::from_millis(200),
    Duration::from_secs(1),
];
/// The least time between two reads of a process's maps prompted by its executable mmaps.
const MAPPED_RESCAN: Duration = Duration::from_millis(5);
/// Then re-read live processes this often, for libraries loaded later (dlopen).
const RESCAN_INTERVAL: Duration = Duration::from_secs(2);
/// How often when libraries loaded later must be probed soon (GPU tracing, --func).
pub const FAST_RESCAN_INTERVAL: Duration = Duration::from_millis(200);
/// Beyond this many live processes (--all on a big host), periodic rescans stop: new processes
/// and the end of the trace still get theirs.
const MAX_PERIODIC_RESCANS: usize = 128;

/// What sysprof knows about one process.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ProcessRecord {
    pub name: String,
    pub parent: Option<u32>,
    pub maps: Option<ProcessMaps>,
    /// Started (forked or exec'd) while sysprof was tracing.
    pub started_during_trace: bool,
    pub exited: bool,
    /// Its start time (clock ticks after boot, /proc/PID/stat), which tells it apart from a
    /// later process that reuses its pid.
    pub start_ticks: Option<u64>,
    /// Its memory over the run (when memory is traced).
    pub memory: Series,
    /// The code objects of its Python frames, when it runs CPython (see `crate::python`).
    #[serde(default)]
    pub python: Option<crate::python::code::ProcessCode>,
    /// Where its current image (`name`, `maps`, `python`) began; unknown for the first.
    #[serde(default, skip_serializing_if = "ImageStart::is_unknown")]
    pub start: ImageStart,
    /// The images it ran before the current one, oldest first: each exec during the trace
    /// ends one. None in read-outs saved before images were kept: one image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier: Vec<Image>,
    /// How many times it exec'd during the trace.
    #[serde(skip)]
    pub execs: u32,
    /// The current image was found by a read of the maps (an address space new to them)
    /// before its exec event came, which then tells where it began instead of ending it.
    #[serde(skip)]
    unclaimed: bool,
    /// A kernel thread: no maps or memory to read, ever (`--all` sees dozens of them, and
    /// reading each one's maps and status every few hundred ms was most of sysprof's CPU).
    #[serde(skip)]
    kernel_thread: bool,
    /// The digest of its executable mappings when last read (see `ProcessMaps::read_if_changed`).
    #[serde(skip)]
    maps_digest: Option<u64>,
    /// When its maps were last read (the read began), on the kernel's monotonic clock (the
    /// events' clock): what a process mapped before then is in them.
    #[serde(skip)]
    last_scan_ns: u64,
    /// When its maps were last read, and how many early rescans it has had.
    #[serde(skip)]
    last_scan: Option<Instant>,
    #[serde(skip)]
    early_scans: usize,
    /// It mapped executable memory since its maps were last read.
    #[serde(skip)]
    mapped_since_scan: bool,
    /// The table's `maps_version` when this record last changed for the stages that keep
    /// per-process state (its maps, its fork, its exit): they look again at these records
    /// only (`ProcessTable::changed_since`), not at every process seen on every tick.
    #[serde(skip)]
    maps_stamp: u64,
}

/// Where a program image began: the exec that started it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImageStart {
    /// Its generation (see `sysprof_common::exec_id`); `exec_id::UNKNOWN` when not known.
    pub exec_id: u32,
    /// When its exec event was sent, on the kernel's monotonic clock (the timeline's and the
    /// call events'); 0 when not known.
    pub time_ns: u64,
}

impl ImageStart {
    fn is_unknown(&self) -> bool {
        *self == ImageStart::default()
    }
}

/// A program a process ran before its current one.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Image {
    /// Its name (the process's, as it was then).
    pub name: String,
    /// Its last snapshot.
    pub maps: Option<ProcessMaps>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<crate::python::code::ProcessCode>,
    #[serde(default, skip_serializing_if = "ImageStart::is_unknown")]
    pub start: ImageStart,
    /// sysprof's launcher, forked, until the command's exec: its code is sysprof's, not the
    /// user's (see `profile::SYSPROF_LAUNCHER`), and its snapshot is not kept.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub launcher: bool,
}

/// Which of its process's images a stack was taken in (see `ProcessRecord::image_index`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ImageOf {
    /// The generation its key holds (`sysprof_common::exec_id`).
    Generation(u32),
    /// When it was taken, on the kernel's monotonic clock: an event's time (the timeline's, a
    /// call event's), which the kernel keys no image for.
    At(u64),
}

impl Default for ImageOf {
    /// Unknown: the last image.
    fn default() -> Self {
        ImageOf::Generation(exec_id::UNKNOWN)
    }
}

/// Which of the images that began at `starts` (every image's, first to last) `of` names: the
/// last that began at or before it, or the first, which began before the trace knew of it; the
/// last for an unknown generation (one image in a read-out saved before images were kept).
fn image_index(starts: &[ImageStart], of: ImageOf) -> usize {
    let began = |start: &ImageStart| match of {
        ImageOf::Generation(generation) => start.exec_id != exec_id::UNKNOWN && start.exec_id <= generation,
        ImageOf::At(time_ns) => start.time_ns != 0 && start.time_ns <= time_ns,
    };
    match of {
        ImageOf::Generation(exec_id::UNKNOWN) => starts.len().saturating_sub(1),
        _ => starts.iter().rposition(began).unwrap_or(0),
    }
}

/// One image of a process: the current one, or an earlier one.
#[derive(Clone, Copy, Debug)]
pub struct ImageRef<'a> {
    pub name: &'a str,
    pub maps: Option<&'a ProcessMaps>,
    pub python: Option<&'a crate::python::code::ProcessCode>,
    /// sysprof's launcher (see `Image::launcher`).
    pub launcher: bool,
}

impl ProcessRecord {
    /// Its images, first to last (the current one).
    pub fn images(&self) -> impl Iterator<Item = ImageRef<'_>> {
        (0..=self.earlier.len()).map(|index| self.image(index))
    }

    /// Its image `index` (see `image_index`); the current one past the last.
    pub fn image(&self, index: usize) -> ImageRef<'_> {
        match self.earlier.get(index) {
            Some(image) => ImageRef {
                name: &image.name,
                maps: image.maps.as_ref(),
                python: image.python.as_ref(),
                launcher: image.launcher,
            },
            None => ImageRef {
                name: &self.name,
                maps: self.maps.as_ref(),
                python: self.python.as_ref(),
                launcher: false,
            },
        }
    }

    /// The index of the image a stack was taken in, among `images`.
    pub fn image_index(&self, of: ImageOf) -> usize {
        if self.earlier.is_empty() {
            return 0;
        }
        image_index(&self.image_starts(), of)
    }

    /// Where each of its images began, first to last.
    fn image_starts(&self) -> Vec<ImageStart> {
        self.earlier.iter().map(|image| image.start).chain([self.start]).collect()
    }

    /// Ends the current image, which is kept as it was, and begins one at `start`, with
    /// nothing known of it yet.
    fn begin_image(&mut self, start: ImageStart) {
        let ended = Image {
            name: self.name.clone(),
            maps: self.maps.take(),
            python: self.python.take(),
            start: std::mem::replace(&mut self.start, start),
            launcher: false,
        };
        self.earlier.push(ended);
        self.maps_digest = None;
        self.unclaimed = false;
    }
}

/// Where each image began of the processes that ran more than one: what tells a stack's image
/// (see `ImageOf`) once the table is gone, or borrowed elsewhere.
#[derive(Clone, Debug, Default)]
pub struct Images(HashMap<u32, Vec<ImageStart>>);

impl Images {
    /// The index of the image of process `pid` that `of` names (0 for a process with one).
    pub fn index(&self, pid: u32, of: ImageOf) -> u32 {
        self.0.get(&pid).map_or(0, |starts| image_index(starts, of) as u32)
    }
}

/// The process id under which the report counts what a per-process map had no room for (the
/// syscall, fault and address-space maps' overflow, `names::SYSCALLS_BY_NR` and the like): no
/// process has it, pid 0 being the idle task, which makes no syscalls and no faults of its own.
pub const UNATTRIBUTED: u32 = 0;

/// Every process seen during the trace, by pid.
#[derive(Debug)]
pub struct ProcessTable {
    processes: HashMap<u32, ProcessRecord>,
    rescan_interval: Duration,
    /// Bumped whenever a process's known maps change (a library loaded, a process forked or
    /// exited); the record's `maps_stamp` takes the new value.
    maps_version: u64,
    /// When memory is read, if it is.
    memory: Option<Schedule>,
    /// Built from a saved read-out: nothing is read from /proc.
    replayed: bool,
    /// The kernel announces each executable mapping (`process_event::MAPPED`).
    mappings_announced: bool,
    /// New stacks with Python frames the kernel reported, (pid, stack id), for the Python
    /// stage to read the code objects of.
    python_stacks: Vec<(u32, u32)>,
    /// Processes whose exit the kernel reported since the last `take_exited`, when asked for
    /// (`keep_exited`): the collect stage takes them out of the kernel's target set.
    exited: Option<Vec<u32>>,
}

impl Default for ProcessTable {
    fn default() -> Self {
        ProcessTable {
            processes: HashMap::new(),
            rescan_interval: RESCAN_INTERVAL,
            maps_version: 0,
            memory: None,
            replayed: false,
            mappings_announced: false,
            python_stacks: Vec::new(),
            exited: None,
        }
    }
}

impl ProcessTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// A table of processes seen before (a saved read-out), whose memory was read every
    /// `memory_interval`; nothing is read from /proc.
    pub fn from_records(
        records: impl IntoIterator<Item = (u32, ProcessRecord)>,
        memory_interval: Option<Duration>,
    ) -> Self {
        let mut table = ProcessTable {
            processes: records.into_iter().collect(),
            memory: memory_interval.map(Schedule::new),
            replayed: true,
            ..Self::default()
        };
        // All new to whoever looks first.
        for record in table.processes.values_mut() {
            stamp(&mut table.maps_version, record);
        }
        table
    }

    /// The kernel will announce each executable mapping (the syscall exit program's `MAPPED`
    /// events): a new process's maps are then read again 2 ms after its exec (the libraries
    /// its loader maps first, before a short-lived one is gone), and on those events after, not
    /// also at 10, 30 and 200 ms and 1 s. Those reads were most of sysprof's CPU under `make`
    /// (five reads of each compiler's maps, which the kernel walks mapping by mapping).
    pub fn announces_mappings(&mut self) {
        self.mappings_announced = true;
    }

    /// Keeps the processes whose exit the kernel reports, for `take_exited`.
    pub fn keep_exited(&mut self) {
        self.exited = Some(Vec::new());
    }

    /// The processes whose exit was reported since the last call (see `keep_exited`).
    pub fn take_exited(&mut self) -> Vec<u32> {
        self.exited.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The early rescans a new process gets (see `NEW_PROCESS_RESCANS`).
    fn early_rescans(&self) -> &'static [Duration] {
        if self.mappings_announced { &NEW_PROCESS_RESCANS[..1] } else { &NEW_PROCESS_RESCANS }
    }

    /// Re-reads live processes' maps this often (libraries loaded with dlopen show up then).
    pub fn set_rescan_interval(&mut self, interval: Duration) {
        self.rescan_interval = interval;
    }

    /// How often live processes' maps are re-read.
    pub fn rescan_interval(&self) -> Duration {
        self.rescan_interval
    }

    /// Reads every live process's memory this often (see [`Schedule`]).
    pub fn sample_memory_every(&mut self, interval: Duration) {
        self.memory = Some(Schedule::new(interval));
    }

    /// The base interval of the memory reads, when memory is read.
    pub fn memory_interval(&self) -> Option<Duration> {
        self.memory.as_ref().map(Schedule::interval)
    }

    /// The live processes that have memory of their own (not kernel threads).
    fn user_processes(&self) -> impl Iterator<Item = &ProcessRecord> {
        self.processes.values().filter(|p| !p.exited && !p.kernel_thread)
    }

    /// Reads the memory of live processes when due.
    pub fn sample_memory_due(&mut self) {
        let live = self.user_processes().count();
        let Some(t_ms) = self.memory.as_mut().and_then(|schedule| schedule.due(live)) else { return };
        for (&pid, record) in self.processes.iter_mut().filter(|(_, p)| !p.exited && !p.kernel_thread) {
            if let Some(sample) = MemorySample::read(pid, t_ms) {
                record.memory.push(sample);
            }
        }
    }

    /// Records a process that was running when the trace started, reading its maps (and its
    /// memory) now.
    pub fn observe_existing(&mut self, pid: u32) {
        let record = self.processes.entry(pid).or_default();
        if record.name.is_empty() {
            record.name = read_comm(pid).unwrap_or_default();
        }
        if record.start_ticks.is_none()
            && let Some(stat) = crate::target::proc_stat(pid)
        {
            record.start_ticks = Some(stat.start_ticks);
            record.kernel_thread = stat.kernel_thread;
        }
        if record.kernel_thread {
            return;
        }
        scan_and_stamp(&mut self.maps_version, pid, record, Instant::now());
        if record.memory.is_empty() {
            read_memory(self.memory.as_ref(), pid, record);
        }
    }

    /// Applies one event from the kernel.
    pub fn on_event(&mut self, event: &ProcessEvent) {
        let now = Instant::now();
        let comm = comm_to_string(&event.comm);
        match event.kind {
            process_event::FORK => {
                // A pid that came back since its exit was noted is someone else's now.
                if let Some(exited) = &mut self.exited {
                    exited.retain(|&pid| pid != event.pid);
                }
                // Until it execs, a child runs its parent's code at the parent's addresses.
                let inherited = self
                    .processes
                    .get(&event.parent_pid)
                    .and_then(|p| Some((p.maps.clone()?, p.maps_digest)));
                let record = self.processes.entry(event.pid).or_default();
                record.name = comm;
                record.parent = Some(event.parent_pid);
                record.started_during_trace = true;
                // A pid that came back is a new process: none of the images before were its.
                (record.earlier, record.start, record.unclaimed) = (Vec::new(), ImageStart::default(), false);
                (record.start_ticks, record.kernel_thread) = match clock_ticks(event.started_ns) {
                    // kthreadd's children are kernel threads.
                    Some(ticks) => (Some(ticks), event.parent_pid == KTHREADD),
                    // A kernel without the field: its /proc entry says, when it is still there.
                    None => crate::target::proc_stat(event.pid)
                        .map_or((None, false), |stat| (Some(stat.start_ticks), stat.kernel_thread)),
                };
                record.early_scans = 0;
                match inherited {
                    // Not read: most children exec at once (and the exec reads them), and a
                    // shell script forks hundreds a second. Maps as of the fork, which its
                    // early rescans correct if its parent's were behind.
                    Some((maps, digest)) => {
                        (record.maps, record.maps_digest) = (Some(maps), digest);
                        record.last_scan = Some(now);
                        record.last_scan_ns = event.time_ns;
                    }
                    None => {
                        (record.maps, record.maps_digest) = (None, None);
                        scan(event.pid, record, now);
                    }
                }
                // A new process maps what its parent did: a change for whoever probes per process.
                stamp(&mut self.maps_version, record);
                // No memory read: a child's memory at its fork is its parent's; its own is read
                // on the schedule and at its exit.
            }
            process_event::EXEC => {
                let known = self.processes.contains_key(&event.pid);
                let record = self.processes.entry(event.pid).or_default();
                let start = ImageStart { exec_id: event.detail, time_ns: event.time_ns };
                record.started_during_trace = true;
                record.execs += 1;
                record.early_scans = 0;
                if record.unclaimed {
                    // Maps read after the exec already (`await_exec`, or a read that found a
                    // new address space) are the new program's: a short-lived one may have
                    // exited by now, and reading again would lose them.
                    (record.start, record.unclaimed, record.name) = (start, false, comm);
                    return;
                }
                // The program before keeps what was read of it, for the stacks taken in it.
                let read_after = record.maps.is_some() && record.last_scan_ns > event.time_ns;
                if known {
                    record.begin_image(start);
                } else {
                    record.start = start;
                }
                record.name = comm;
                if !scan(event.pid, record, now) && read_after {
                    // Gone already, and the read after its exec (in an address space the
                    // reads could not tell from the one before: the same vDSO) is all there is.
                    record.maps = record.earlier.last().and_then(|image| image.maps.clone());
                }
                stamp(&mut self.maps_version, record);
            }
            process_event::PYTHON_STACK => self.python_stacks.push((event.pid, event.detail)),
            process_event::MAPPED => {
                // A library loaded: read the maps now, or as soon as the last read is
                // MAPPED_RESCAN old (a JIT maps code often).
                let record = self.processes.entry(event.pid).or_default();
                match record.last_scan {
                    // A read that began after the mapping was made has it: the libraries a new
                    // program's loader maps in its first millisecond are in the read at its
                    // exec or its early rescan, and reading again would find nothing new.
                    _ if record.maps.is_some() && record.last_scan_ns > event.time_ns => {}
                    Some(last) if now < last + MAPPED_RESCAN => record.mapped_since_scan = true,
                    _ => scan_and_stamp(&mut self.maps_version, event.pid, record, now),
                }
            }
            process_event::EXIT => {
                let record = self.processes.entry(event.pid).or_default();
                if record.name.is_empty() {
                    record.name = comm;
                }
                // Its last memory reading (its peak RSS, mostly), if the status still has it.
                read_memory(self.memory.as_ref(), event.pid, record);
                // Usually too late (the address space is gone), but costs nothing to try.
                scan(event.pid, record, now);
                record.exited = true;
                // Whoever wrote an entry for it drops it.
                stamp(&mut self.maps_version, record);
                if let Some(exited) = &mut self.exited {
                    exited.push(event.pid);
                }
            }
            _ => {}
        }
    }

    /// Re-reads the maps of processes that are due: new ones several times in their first
    /// second, the others every few seconds while there are not too many.
    pub fn rescan_due(&mut self) {
        let now = Instant::now();
        let live = self.user_processes().count();
        let early = self.early_rescans();
        for (&pid, record) in self.processes.iter_mut().filter(|(_, p)| !p.exited && !p.kernel_thread) {
            let Some(last) = record.last_scan else { continue };
            let due = match early.get(record.early_scans) {
                _ if record.mapped_since_scan => now >= last + MAPPED_RESCAN,
                Some(&delay) if record.started_during_trace => now >= last + delay.min(self.rescan_interval),
                _ => live <= MAX_PERIODIC_RESCANS && now >= last + self.rescan_interval,
            };
            if due {
                if !record.mapped_since_scan {
                    record.early_scans += 1;
                }
                record.mapped_since_scan = false;
                scan_and_stamp(&mut self.maps_version, pid, record, now);
            }
        }
    }

    /// When the next early rescan is due: of a new process (see `NEW_PROCESS_RESCANS`), or of
    /// one that mapped a library since its last. The collect loop wakes for it rather than at
    /// its next tick, so libraries are known (and their code unwound) within milliseconds.
    pub fn next_early_rescan(&self) -> Option<Instant> {
        self.user_processes()
            .filter_map(|p| {
                let last = p.last_scan?;
                if p.mapped_since_scan {
                    return Some(last + MAPPED_RESCAN);
                }
                let delay = self.early_rescans().get(p.early_scans).filter(|_| p.started_during_trace)?;
                Some(last + (*delay).min(self.rescan_interval))
            })
            .min()
    }

    /// Reads the maps of `pid`, a launched command just released from its gate, once they are
    /// its program's (they were sysprof's until its exec), waiting `within` at most: a command
    /// that runs for a few milliseconds may be gone before its exec event is read, and with it
    /// the only chance to know where its code was.
    pub fn await_exec(&mut self, pid: u32, within: Duration) {
        let record = self.processes.entry(pid).or_default();
        let before = record.maps_digest;
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            // When the read began: what was mapped after it may be missing from it.
            let began = crate::probes::monotonic_ns();
            match ProcessMaps::read_if_changed(pid, before) {
                Ok(Some((maps, digest))) if !maps.is_empty() => {
                    // The gate's image (sysprof's launcher, forked) ends here, and the command's
                    // begins, its exec event still to come. The gate's stacks are the command's
                    // start (its wait at the gate, its execve): named as the command, sysprof's
                    // code in them one frame (its thread's name is no program the user ran, and
                    // a debug build's DWARF, read to name those frames, took 20-50 MB).
                    let name = read_comm(pid).unwrap_or_default();
                    if record.maps.is_some() {
                        record.begin_image(ImageStart::default());
                        for gate in &mut record.earlier {
                            (gate.name, gate.maps, gate.launcher) = (name.clone(), None, true);
                        }
                    }
                    (record.name, record.unclaimed) = (name, true);
                    (record.maps, record.maps_digest) = (Some(maps), Some(digest));
                    record.last_scan = Some(Instant::now());
                    record.last_scan_ns = began;
                    stamp(&mut self.maps_version, record);
                    return;
                }
                // Not exec'd yet.
                Ok(_) => std::thread::sleep(Duration::from_micros(200)),
                // Gone already.
                Err(_) => return,
            }
        }
    }

    /// Reads the maps of `pid` if it was never seen: a process that only shows up in samples.
    pub fn ensure(&mut self, pid: u32) {
        if !self.replayed && !self.processes.contains_key(&pid) {
            self.observe_existing(pid);
        }
    }

    /// A last read of every live process's maps (and memory), at the end of the trace.
    pub fn final_scan(&mut self) {
        let now = Instant::now();
        if let Some(schedule) = &mut self.memory {
            // Forced: the end of the run is a sample whatever the interval.
            *schedule = schedule.restarted_for_final_read();
        }
        self.sample_memory_due();
        for (&pid, record) in self.processes.iter_mut().filter(|(_, p)| !p.exited) {
            scan_and_stamp(&mut self.maps_version, pid, record, now);
        }
    }

    /// Changes whenever some process's known maps change, or a process forks or exits.
    pub fn maps_version(&self) -> u64 {
        self.maps_version
    }

    /// The processes whose maps changed, or that forked or exited, since `version` (a
    /// `maps_version` read earlier): all a stage that keeps per-process state must look at
    /// again. A build or a shell script starts thousands of processes, and looking at every
    /// one's mappings on every tick was most of sysprof's CPU under one.
    pub fn changed_since(&self, version: u64) -> impl Iterator<Item = (u32, &ProcessRecord)> {
        self.iter().filter(move |(_, record)| record.maps_stamp > version)
    }

    /// `changed_since(version)` and the processes of `retry` (those a stage could not finish
    /// with before: it tries them again on each pass), each once, by pid.
    pub fn changed_since_or(
        &self,
        version: u64,
        retry: impl IntoIterator<Item = u32>,
    ) -> Vec<(u32, &ProcessRecord)> {
        let pids: std::collections::BTreeSet<u32> =
            self.changed_since(version).map(|(pid, _)| pid).chain(retry).collect();
        pids.into_iter().filter_map(|pid| Some((pid, self.get(pid)?))).collect()
    }

    /// Where each image began of the processes that ran more than one (see [`Images`]).
    pub fn images(&self) -> Images {
        Images(
            self.processes
                .iter()
                .filter(|(_, record)| !record.earlier.is_empty())
                .map(|(pid, record)| (*pid, record.image_starts()))
                .collect(),
        )
    }

    /// Every process seen, by pid.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &ProcessRecord)> {
        self.processes.iter().map(|(pid, record)| (*pid, record))
    }

    pub fn get(&self, pid: u32) -> Option<&ProcessRecord> {
        self.processes.get(&pid)
    }

    /// The name to show for thread `tid` of process `tgid`, whose own name as first seen is
    /// `own`. A main thread is named as its process is: that name follows an exec, while the
    /// thread's own may have been taken before it (a launched command is sysprof's fork until
    /// then, a shell's child a shell). Other threads keep their own name (a worker pool's), or
    /// take the process's where theirs is not known.
    pub fn thread_name(&self, tid: u32, tgid: u32, own: &str) -> String {
        match self.get(tgid).map(|p| p.name.as_str()).filter(|name| !name.is_empty()) {
            Some(process) if tid == tgid || own.is_empty() => process.to_string(),
            _ => own.to_string(),
        }
    }

    /// The new Python stacks reported since the last call.
    pub fn take_python_stacks(&mut self) -> Vec<(u32, u32)> {
        std::mem::take(&mut self.python_stacks)
    }

    /// Records that a process runs CPython, with the code objects read so far.
    pub fn set_python(&mut self, pid: u32, code: crate::python::code::ProcessCode) {
        if let Some(record) = self.processes.get_mut(&pid) {
            record.python = Some(code);
        }
    }

    pub fn python_mut(&mut self, pid: u32) -> Option<&mut crate::python::code::ProcessCode> {
        self.processes.get_mut(&pid)?.python.as_mut()
    }

    /// Processes that have not exited.
    pub fn live_pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.processes.iter().filter(|(_, p)| !p.exited).map(|(pid, _)| *pid)
    }

    pub fn is_empty(&self) -> bool {
        self.processes.is_empty()
    }

    /// Processes that still run and are provably the ones seen (same start time: not a
    /// later process that reuses an exited one's pid), so that signalling them is safe.
    pub fn running(&self) -> Vec<u32> {
        self.processes
            .iter()
            .filter(|(pid, p)| !p.exited && p.start_ticks.is_some() && **pid != std::process::id())
            .filter(|(pid, p)| {
                crate::target::proc_stat(**pid)
                    .is_some_and(|now| now.alive() && Some(now.start_ticks) == p.start_ticks)
            })
            .map(|(pid, _)| *pid)
            .collect()
    }
}

/// The process id of kthreadd, whose children are the kernel threads.
const KTHREADD: u32 = 2;

/// A start time in CLOCK_BOOTTIME ns as /proc/PID/stat gives it: in clock ticks, rounded down
/// as the kernel's `nsec_to_clock_t` does. `None` for 0 (unknown).
fn clock_ticks(boottime_ns: u64) -> Option<u64> {
    static NS_PER_TICK: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let ns_per_tick = *NS_PER_TICK.get_or_init(|| {
        // SAFETY: sysconf has no memory preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        1_000_000_000 / u64::try_from(hz).ok().filter(|hz| *hz > 0).unwrap_or(100)
    });
    (boottime_ns != 0).then(|| boottime_ns / ns_per_tick)
}

/// When `pid` started, in clock ticks after boot (see [`crate::target::ProcStat`]).
pub fn start_ticks(pid: u32) -> Option<u64> {
    crate::target::proc_stat(pid).map(|stat| stat.start_ticks)
}

/// Reads the maps of `pid`, merging them into what is known (a failed read keeps the old
/// snapshot: the process may be exiting).
/// Returns whether the known maps changed.
fn scan(pid: u32, record: &mut ProcessRecord, now: Instant) -> bool {
    record.last_scan = Some(now);
    record.last_scan_ns = crate::probes::monotonic_ns();
    match ProcessMaps::read_if_changed(pid, record.maps_digest) {
        Ok(Some((maps, digest))) if !maps.is_empty() => {
            if record.maps.as_ref().is_some_and(|known| another_address_space(known, &maps)) {
                // It exec'd since the last read, and its event is not read yet: these are the
                // new program's maps, not more of the old one's.
                record.begin_image(ImageStart::default());
                record.unclaimed = true;
                record.name = read_comm(pid).unwrap_or_default();
            }
            record.maps_digest = Some(digest);
            match &mut record.maps {
                Some(known) => {
                    let before = known.clone();
                    known.merge_later(maps);
                    *known != before
                }
                None => {
                    record.maps = Some(maps);
                    true
                }
            }
        }
        _ => false,
    }
}

/// Whether `later` was read from another address space than `known`: the vDSO, placed anew
/// at every exec (at random, unless the process runs without address-space randomization,
/// when the two cannot be told apart this way and the exec event's time does).
fn another_address_space(known: &ProcessMaps, later: &ProcessMaps) -> bool {
    known.vdso() != 0 && later.vdso() != 0 && known.vdso() != later.vdso()
}

/// Reads the maps of `pid` (see `scan`), and stamps `record` when they changed.
fn scan_and_stamp(version: &mut u64, pid: u32, record: &mut ProcessRecord, now: Instant) {
    if scan(pid, record, now) {
        stamp(version, record);
    }
}

/// Marks `record` changed: the table's next version is its stamp.
fn stamp(version: &mut u64, record: &mut ProcessRecord) {
    *version += 1;
    record.maps_stamp = *version;
}

/// Reads the memory of `pid` now, when memory is traced.
fn read_memory(schedule: Option<&Schedule>, pid: u32, record: &mut ProcessRecord) {
    if let Some(sample) = schedule.and_then(|schedule| MemorySample::read(pid, schedule.elapsed_ms())) {
        record.memory.push(sample);
    }
}

fn read_comm(pid: u32) -> Option<String> {
    let comm = crate::target::read_proc_text(&format!("/proc/{pid}/comm")).ok()?;
    Some(comm.trim_end_matches('\n').to_string())
}

/// A kernel task name (NUL padded) as text.
pub fn comm_to_string(comm: &[u8]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: u32, pid: u32, parent_pid: u32, comm: &str) -> ProcessEvent {
        let mut name = [0u8; 16];
        name[..comm.len()].copy_from_slice(comm.as_bytes());
        ProcessEvent { kind, pid, parent_pid, detail: 0, time_ns: 0, started_ns: 0, comm: name }
    }

    #[test]
    fn a_forked_child_inherits_its_parents_maps_until_it_has_its_own() {
        let mut table = ProcessTable::new();
        let me = std::process::id();
        table.observe_existing(me);
        assert!(table.get(me).unwrap().maps.is_some());
        // A pid that does not exist: its own maps cannot be read, the parent's stand in.
        let child = u32::MAX - 7;
        table.on_event(&event(process_event::FORK, child, me, "worker"));
        let record = table.get(child).unwrap();
        assert_eq!(record.name, "worker");
        assert_eq!(record.parent, Some(me));
        assert_eq!(record.maps, table.get(me).unwrap().maps);
        table.on_event(&event(process_event::EXIT, child, 0, "worker"));
        assert!(table.get(child).unwrap().exited);
        assert!(!table.live_pids().any(|pid| pid == child));
    }

    #[test]
    fn exits_are_kept_for_the_target_set_only_when_asked_and_until_the_pid_comes_back() {
        let (gone, back) = (u32::MAX - 11, u32::MAX - 12);
        let mut table = ProcessTable::new();
        table.on_event(&event(process_event::EXIT, gone, 0, "worker"));
        assert!(table.take_exited().is_empty(), "not asked for");
        table.keep_exited();
        table.on_event(&event(process_event::EXIT, gone, 0, "worker"));
        table.on_event(&event(process_event::EXIT, back, 0, "worker"));
        // The pid given to a new child before the exits were taken: the set keeps it.
        table.on_event(&event(process_event::FORK, back, gone, "worker"));
        assert_eq!(table.take_exited(), vec![gone]);
        assert!(table.take_exited().is_empty(), "each exit is taken once");
    }

    #[test]
    fn a_library_mapped_before_the_last_read_is_not_read_again() {
        let mut table = ProcessTable::new();
        let me = std::process::id();
        table.observe_existing(me);
        let read_at = table.get(me).unwrap().last_scan;
        let mapped = |time_ns| ProcessEvent { time_ns, ..event(process_event::MAPPED, me, 0, "") };
        // Mapped before the read began: the read has it.
        table.on_event(&mapped(1));
        let record = table.get(me).unwrap();
        assert!(!record.mapped_since_scan);
        assert_eq!(record.last_scan, read_at);
        // Mapped after it: read again (at once, or MAPPED_RESCAN after the last read).
        table.on_event(&mapped(u64::MAX));
        let record = table.get(me).unwrap();
        assert!(record.mapped_since_scan || record.last_scan != read_at);
    }

    #[test]
    fn a_main_thread_named_before_its_exec_takes_the_new_program_s_name() {
        let mut table = ProcessTable::new();
        // Pids that do not exist: nothing is read from /proc for them.
        let (sysload, unnamed) = (u32::MAX - 9, u32::MAX - 11);
        table.on_event(&event(process_event::EXEC, sysload, 0, "sysload"));
        table.on_event(&event(process_event::EXEC, unnamed, 0, ""));
        assert_eq!(table.thread_name(sysload, sysload, "sh"), "sysload");
        assert_eq!(table.thread_name(sysload + 1, sysload, "worker"), "worker");
        assert_eq!(table.thread_name(sysload + 1, sysload, ""), "sysload");
        assert_eq!(table.thread_name(unnamed, unnamed, "sh"), "sh");
        assert_eq!(table.thread_name(7, u32::MAX - 13, "sh"), "sh");
    }

    /// A child forked from this process execs: the image it ran until then (its parent's code,
    /// under the name it had) is kept beside the new one, and each stack goes to its own.
    #[test]
    fn an_exec_keeps_the_image_before_it_for_the_stacks_taken_there() {
        let mut table = ProcessTable::new();
        let me = std::process::id();
        table.observe_existing(me);
        // A pid that does not exist: the new program's maps cannot be read.
        let child = u32::MAX - 21;
        table.on_event(&event(process_event::FORK, child, me, "shell"));
        let exec =
            ProcessEvent { detail: 8, time_ns: 5_000, ..event(process_event::EXEC, child, 0, "compiler") };
        table.on_event(&exec);
        let record = table.get(child).unwrap();
        assert_eq!(record.name, "compiler");
        assert_eq!(record.maps, None);
        assert_eq!(record.earlier.len(), 1);
        let before = record.image(0);
        assert_eq!((before.name, before.maps), ("shell", table.get(me).unwrap().maps.as_ref()));
        assert_eq!(record.image(1).name, "compiler");
        // By the generation its key holds: 7 is the fork's (its parent's), 8 the exec's.
        assert_eq!(record.image_index(ImageOf::Generation(7)), 0);
        assert_eq!(record.image_index(ImageOf::Generation(8)), 1);
        assert_eq!(record.image_index(ImageOf::Generation(9)), 1, "an exec not heard of: the last known");
        assert_eq!(record.image_index(ImageOf::default()), 1, "unknown: the last");
        // By time, against the exec event's.
        assert_eq!(record.image_index(ImageOf::At(4_999)), 0);
        assert_eq!(record.image_index(ImageOf::At(5_000)), 1);
        let images = table.images();
        assert_eq!(
            (images.index(child, ImageOf::Generation(7)), images.index(child, ImageOf::At(6_000))),
            (0, 1)
        );
        assert_eq!(images.index(me, ImageOf::Generation(7)), 0, "one image");
        // Its pid given to a new process: none of those images are its.
        table.on_event(&event(process_event::FORK, child, me, "other"));
        assert!(table.get(child).unwrap().earlier.is_empty());
    }

    /// Images in the order they ran: the first began before the trace knew (unknown), an
    /// unclaimed one (found by a read, its exec event lost) is never chosen by its start.
    #[test]
    fn a_stack_goes_to_the_last_image_that_began_at_or_before_it() {
        let start = |exec_id, time_ns| ImageStart { exec_id, time_ns };
        let starts = [start(0, 0), start(11, 100), start(0, 0), start(13, 300)];
        let of = |image| image_index(&starts, image);
        assert_eq!(of(ImageOf::Generation(10)), 0);
        assert_eq!(of(ImageOf::Generation(11)), 1);
        assert_eq!(of(ImageOf::Generation(12)), 1);
        assert_eq!(of(ImageOf::Generation(13)), 3);
        assert_eq!(of(ImageOf::Generation(exec_id::UNKNOWN)), 3);
        assert_eq!(of(ImageOf::At(99)), 0);
        assert_eq!(of(ImageOf::At(200)), 1);
        assert_eq!(of(ImageOf::At(300)), 3);
        assert_eq!(image_index(&[ImageStart::default()], ImageOf::Generation(12)), 0);
    }

    /// The vDSO is placed anew at each exec: a read that finds it elsewhere is of a new
    /// program. Without one on either side, nothing can be told.
    #[test]
    fn a_moved_vdso_is_another_address_space() {
        use crate::procmaps::{Backing, Mapping};
        let maps = |vdso: Option<u64>| {
            let vdso = vdso.map(|start| Mapping {
                start,
                end: start + 0x2000,
                file_offset: 0,
                backing: Backing::Vdso,
            });
            ProcessMaps::from_mappings(vdso.into_iter().collect())
        };
        assert!(another_address_space(&maps(Some(0x7000)), &maps(Some(0x9000))));
        assert!(!another_address_space(&maps(Some(0x7000)), &maps(Some(0x7000))));
        assert!(!another_address_space(&maps(None), &maps(Some(0x7000))));
    }

    #[test]
    fn comm_stops_at_the_first_nul() {
        assert_eq!(comm_to_string(b"bash\0\0\0garbage"), "bash");
        assert_eq!(comm_to_string(b"exactly16chars!!"), "exactly16chars!!");
    }
}
