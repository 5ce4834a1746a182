//! The memory family's kernel side: the page-fault programs, and the read-out of faults,
//! address-space changes and the heap.

use std::collections::{BTreeSet, HashMap};

use aya::programs::{
    PerfEvent,
    perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
};
use sysprof_common::{
    AddressSpace, AllocKey, AllocStats, Config, FaultKey, LiveAlloc, LiveKey, ProcessAllocs, names,
};

use crate::{
    family::{Analysis, Family},
    probes::{
        AttachedProbe, Preload, Probes, cpu_ranges, fault_event_error, online_cpus, program_mut, rejected,
    },
    readout::MapReader,
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
        Ok(Some(Box::new(super::section::analyze(&self.dump, cx))))
    }
}

impl Probes {
    /// Attaches the page-fault programs: the kernel's minor and major fault software events,
    /// every fault, on every online CPU (the programs keep the target's).
    pub fn attach_page_faults(&mut self) -> anyhow::Result<()> {
        let cpus = online_cpus()?;
        for (name, event, what) in [
            ("fault_minor", SoftwareEvent::PageFaultsMin, "page-faults-minor"),
            ("fault_major", SoftwareEvent::PageFaultsMaj, "page-faults-major"),
        ] {
            let program: &mut PerfEvent = program_mut(&mut self.ebpf, name)?.try_into()?;
            if program.fd().is_err() {
                program.load().map_err(|e| rejected(name, e))?;
            }
            for &cpu in &cpus {
                program
                    .attach(
                        PerfEventConfig::Software(event),
                        PerfEventScope::AllProcessesOneCpu { cpu },
                        SamplePolicy::Period(1),
                        false,
                    )
                    .map_err(|e| fault_event_error(what, e))?;
            }
            let program_id = program.info()?.id();
            self.attached.push(AttachedProbe {
                program: name.into(),
                kind: "perf_event".into(),
                attached_to: format!("software event {what}, every fault, on CPUs {}", cpu_ranges(&cpus)),
                links: cpus.len() as u32,
                program_id,
            });
        }
        Ok(())
    }
}

impl MemoryDump {
    /// Reads the memory statistics; the heap's too when `heap`.
    pub(crate) fn read(maps: &mut MapReader<'_>, heap: bool) -> anyhow::Result<Self> {
        let faults = maps
            .entries::<u64, u64>(names::FAULT_COUNTS)?
            .into_iter()
            .map(|(key, count)| (((key >> 1) as u32, key & 1 == 1), count))
            .collect();
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
            address_space: maps.entries(names::ADDRESS_SPACE)?,
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
