//! The memory family's kernel side: the page-fault programs, and the read-out of faults,
//! address-space changes and the heap.

use std::collections::{BTreeSet, HashMap};

use anyhow::Context as _;
use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData},
    programs::{
        PerfEvent,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
};
use sysprof_common::{
    AddressSpace, AllocKey, AllocStats, Config, FaultKey, LiveAlloc, LiveKey, ProcessAllocs, names,
};

use crate::{
    family::{Analysis, Family},
    probes::{
        AttachedProbe, Preload, Probes, cpu_ranges, fault_event_error, online_cpus, program_mut, rejected,
    },
    record::reader::MapReader,
    report::Section,
    sched::probes::SCHED_SWITCH,
    syscalls::probes::{SYSCALL_ENTER, SYSCALL_EXIT},
};

/// Memory statistics as the kernel aggregated them, with the stacks they reference.
#[derive(Debug, Default)]
pub struct MemoryDump {
    pub address_space: Vec<(u32, AddressSpace)>,
    /// (tgid, major) -> page faults, exact.
    pub faults: HashMap<(u32, bool), u64>,
    /// Sampled fault stacks, weighted to stand for every fault.
    pub fault_stacks: Vec<(FaultKey, u64)>,
    /// Heap (`--malloc`): allocations by call site, per-process totals, blocks still live.
    pub alloc_sites: Vec<(AllocKey, AllocStats)>,
    pub heaps: Vec<(u32, ProcessAllocs)>,
    pub live: Vec<(LiveKey, LiveAlloc)>,
    /// Stack id -> instruction pointers, innermost first: the heap's (in `STACKS`).
    pub stacks: HashMap<u32, Vec<u64>>,
    /// The same for the fault stacks (in `FAULT_TRACES`).
    pub fault_traces: HashMap<u32, Vec<u64>>,
}

/// The memory family's kernel side: page faults, and the address-space syscalls' sizes (read
/// by the syscall programs, which park calls in flight through the switch program).
pub(crate) struct MemoryFamily {
    /// `--malloc`: the heap probes' maps are read too.
    heap: bool,
    dump: MemoryDump,
}

impl MemoryFamily {
    pub(crate) fn new(heap: bool) -> Self {
        MemoryFamily { heap, dump: MemoryDump::default() }
    }
}

impl Family for MemoryFamily {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn configure(&self, kernel: &mut Config) {
        super::configure_kernel(kernel);
    }

    fn programs(&self) -> &'static [Preload] {
        &[
            SCHED_SWITCH,
            SYSCALL_ENTER,
            SYSCALL_EXIT,
            Preload::Plain("fault_minor"),
            Preload::Plain("fault_major"),
        ]
    }

    fn attach(&self, probes: &mut Probes) -> anyhow::Result<()> {
        probes.attach_sched_switch()?;
        probes.attach_syscalls()?;
        probes.attach_page_faults()
    }

    fn read(&mut self, maps: &mut MapReader<'_>) -> anyhow::Result<()> {
        self.dump = MemoryDump::read(maps, self.heap)?;
        Ok(())
    }

    fn processes(&self) -> Vec<u32> {
        let faults = self.dump.fault_stacks.iter().map(|(key, _)| key.tgid);
        faults.chain(self.dump.alloc_sites.iter().map(|(key, _)| key.tgid)).collect()
    }

    fn analyzed_after(&self) -> &'static [&'static str] {
        &["cpu", "gpu", "nvml"]
    }

    fn analyze(&mut self, cx: &mut Analysis<'_>) -> anyhow::Result<Option<Box<dyn Section>>> {
        Ok(Some(Box::new(super::section::analyze(&mut self.dump, cx))))
    }
}

/// The page-fault programs and the software events they run on.
const FAULT_EVENTS: [(&str, SoftwareEvent, &str); 2] = [
    ("fault_minor", SoftwareEvent::PageFaultsMin, "page-faults-minor"),
    ("fault_major", SoftwareEvent::PageFaultsMaj, "page-faults-major"),
];

impl Probes {
    /// Attaches the page-fault programs to the kernel's minor and major fault software events,
    /// on every online CPU. When the target is a set of processes and what they start (`--pid`,
    /// a command), the kernel's per-task counters count the targets' faults (see
    /// `start_fault_counts`), and the minor events run their program for 1 fault in
    /// `FAULT_STACK_EVERY` of the CPU's, whoever takes it, for a stack when it is a target's:
    /// any other process's fault costs the event's count, and 1 in 256 a program that returns
    /// at once. Otherwise (`--all`, `--comm`, a cgroup) the programs run on every fault and
    /// count the target's.
    ///
    /// Events of the targets' own threads (one per thread, inherited, as these were) would
    /// spare the other processes even that, but a process with perf events of its own costs
    /// the kernel more at each of its context switches, whoever opened them (`perf stat -e
    /// page-faults` too): a pipe round trip between two of its threads on two CPUs took 4.2
    /// and 5.5 us more with them than with these under the default families (`sysload
    /// pingpong 100000`, 12 and 10 paired runs, 10 of 12 and 10 of 10 slower; 20-40 us a round
    /// trip), for a saving of some 25 ns on each other process's fault.
    pub fn attach_page_faults(&mut self) -> anyhow::Result<()> {
        let by_task = self.lineage && self.fault_counters_known;
        let cpus = online_cpus()?;
        for (name, event, what) in FAULT_EVENTS {
            let program: &mut PerfEvent = program_mut(&mut self.ebpf, name)?.try_into()?;
            if program.fd().is_err() {
                program.load().map_err(|e| rejected(name, e))?;
            }
            let period = event_period(event, by_task);
            for &cpu in &cpus {
                program
                    .attach(
                        PerfEventConfig::Software(event),
                        PerfEventScope::AllProcessesOneCpu { cpu },
                        SamplePolicy::Period(period),
                        false,
                    )
                    .map_err(|e| fault_event_error(what, e))?;
            }
            let which = if period == 1 { "every fault".to_string() } else { format!("1 fault in {period}") };
            let attached_to = format!("software event {what}, {which}, on CPUs {}", cpu_ranges(&cpus));
            let links = cpus.len() as u32;
            let program_id = program.info()?.id();
            self.attached.push(AttachedProbe {
                program: name.into(),
                kind: "perf_event".into(),
                attached_to,
                links,
                program_id,
            });
        }
        if by_task {
            let mut on: Array<&mut MapData, u32> =
                Array::try_from(self.map_mut(names::FAULT_TASK_COUNTERS)?)?;
            on.set(0, &1, 0)?;
            self.fault_baselines = Some(HashMap::new());
        }
        Ok(())
    }

    /// At the trace's start, when the kernel's per-task counters count the targets' faults:
    /// what each target thread and process counted so far, which the trace leaves out. Threads
    /// started from here begin at 0.
    pub fn start_fault_counts(&mut self) -> anyhow::Result<()> {
        if self.fault_baselines.is_none() {
            return Ok(());
        }
        let targets: Vec<u32> =
            self.entries::<u32, u8>(names::TARGETS)?.into_iter().map(|(pid, _)| pid).collect();
        let mut baselines: BpfHashMap<&mut MapData, u32, [u64; 2]> =
            BpfHashMap::try_from(self.map_mut(names::FAULT_BASELINES)?)?;
        let mut processes = HashMap::new();
        for pid in targets {
            let Ok(process) = procfs::process::Process::new(pid as i32) else { continue };
            let Ok(stat) = process.stat() else { continue };
            processes.insert(pid, [stat.minflt, stat.majflt]);
            for task in process.tasks().into_iter().flatten().flatten() {
                if let Ok(stat) = task.stat() {
                    // A full map leaves the thread's earlier faults in: counted, not lost.
                    let _ = baselines.insert(&(task.tid as u32), &[stat.minflt, stat.majflt], 0);
                }
            }
        }
        // The initial targets' entries, made now: their own exits come last, when a command
        // that started thousands of processes may have filled the map, and their faults would
        // then be no process's.
        let mut counts: BpfHashMap<&mut MapData, u64, u64> =
            BpfHashMap::try_from(self.map_mut(names::FAULT_COUNTS)?)?;
        for pid in processes.keys() {
            for kind in 0..2 {
                // bpf(2)'s BPF_NOEXIST (1): never over a count already there.
                let _ = counts.insert(&(u64::from(*pid) << 1 | kind), &0, 1);
            }
        }
        self.fault_baselines = Some(processes);
        Ok(())
    }

    /// At the trace's end (its window closed), when the kernel's per-task counters count the
    /// targets' faults: each target process still there gets its faults from /proc, which adds
    /// up its live threads and the ones that ended (exactly, under the kernel's lock), less
    /// what it had at the start. The exit program has counted the processes that are gone.
    pub fn settle_fault_counts(&mut self) -> anyhow::Result<()> {
        let Some(baselines) = &self.fault_baselines else { return Ok(()) };
        let mut settled = Vec::new();
        for (pid, _) in self.entries::<u32, u8>(names::TARGETS)? {
            let Ok(stat) = procfs::process::Process::new(pid as i32).and_then(|p| p.stat()) else { continue };
            let [minor, major] = baselines.get(&pid).copied().unwrap_or_default();
            settled.push((pid, [stat.minflt.saturating_sub(minor), stat.majflt.saturating_sub(major)]));
        }
        let mut counts: BpfHashMap<&mut MapData, u64, u64> =
            BpfHashMap::try_from(self.map_mut(names::FAULT_COUNTS)?)?;
        // What the map has no room for joins the faults of the other processes it had none for.
        let mut unattributed = [0u64; 2];
        for (pid, faults) in settled {
            for (kind, count) in faults.into_iter().enumerate() {
                let key = u64::from(pid) << 1 | kind as u64;
                if count == 0 {
                    let _ = counts.remove(&key);
                } else if counts.insert(&key, &count, 0).is_err() {
                    unattributed[kind] += count;
                }
            }
        }
        let mut by_kind: Array<&mut MapData, u64> = Array::try_from(self.map_mut(names::FAULTS_BY_KIND)?)?;
        for (kind, count) in (0u32..).zip(unattributed).filter(|(_, count)| *count != 0) {
            // The window is closed: no program adds to it any more.
            let total = by_kind.get(&kind, 0).context("reading the faults by kind")? + count;
            by_kind.set(kind, &total, 0).context("counting a target's faults")?;
        }
        Ok(())
    }
}

/// How many of a CPU's faults run the program once: when the kernel's per-task counters count
/// (`by_task`), 1 minor fault in `FAULT_STACK_EVERY`, for its stack, and every major one (each
/// read the disk); otherwise every fault, which the program counts.
fn event_period(event: SoftwareEvent, by_task: bool) -> u64 {
    match event {
        SoftwareEvent::PageFaultsMin if by_task => u64::from(super::FAULT_STACK_EVERY),
        _ => 1,
    }
}

impl MemoryDump {
    /// Reads the memory statistics; the heap's too when `heap`.
    pub(crate) fn read(maps: &mut MapReader<'_>, heap: bool) -> anyhow::Result<Self> {
        let mut faults: HashMap<(u32, bool), u64> = maps
            .entries::<u64, u64>(names::FAULT_COUNTS)?
            .into_iter()
            .map(|(key, count)| (((key >> 1) as u32, key & 1 == 1), count))
            .collect();
        // The faults of the processes the map had no room for, under no process.
        maps.for_each_array_entry(
            names::FAULTS_BY_KIND,
            |count: &u64| *count != 0,
            |kind, count| {
                faults.insert((super::UNATTRIBUTED, kind == 1), count);
            },
        )?;
        let mut address_space: Vec<(u32, AddressSpace)> = maps.entries(names::ADDRESS_SPACE)?;
        // The changes of the processes the map had no room for, under no process.
        maps.for_each_array_entry(
            names::ADDR_SPACE_REST,
            |a: &AddressSpace| a.mmap_calls + a.munmap_calls + a.brk_calls + a.mremap_calls != 0,
            |_, a| address_space.push((super::UNATTRIBUTED, a)),
        )?;
        let fault_stacks: Vec<(FaultKey, u64)> = maps.entries(names::FAULT_STACKS)?;
        let (alloc_sites, heaps, live) = if heap {
            (
                maps.entries(names::ALLOC_STACKS)?,
                maps.entries(names::PROCESS_ALLOCS)?,
                maps.entries::<LiveKey, LiveAlloc>(names::LIVE_ALLOCS)?,
            )
        } else {
            Default::default()
        };
        let fault_ids: BTreeSet<u32> = fault_stacks
            .iter()
            .flat_map(|(key, _)| [key.user_stack_id, key.kernel_stack_id])
            .filter_map(|id| u32::try_from(id).ok())
            .collect();
        let ids: BTreeSet<u32> = alloc_sites
            .iter()
            .map(|(key, _): &(AllocKey, AllocStats)| key.user_stack_id)
            .chain(live.iter().map(|(_, block)| block.user_stack_id))
            .filter_map(|id| u32::try_from(id).ok())
            .collect();
        Ok(MemoryDump {
            address_space,
            faults,
            fault_stacks,
            alloc_sites,
            heaps,
            live,
            stacks: maps.stacks(names::STACKS, &ids)?,
            fault_traces: maps.stacks(names::FAULT_TRACES, &fault_ids)?,
        })
    }
}
