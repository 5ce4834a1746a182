//! The scheduler family's kernel side: the context-switch and wakeup programs, and the
//! read-out of what they aggregated.

use std::collections::{BTreeSet, HashMap};

use sysprof_common::{Config, LatencyHistogram, OffCpuKey, OffCpuValue, ThreadSched, WakeKey, names};

use crate::{
    family::{Analysis, Family},
    probes::{Preload, Probes},
    record::reader::MapReader,
    report::Section,
};

/// Scheduler statistics as the kernel aggregated them, with the off-CPU stacks.
#[derive(Debug, Default)]
pub struct SchedDump {
    pub threads: Vec<(u32, ThreadSched)>,
    pub runq: Vec<(u32, LatencyHistogram)>,
    pub offcpu: Vec<(OffCpuKey, OffCpuValue)>,
    /// The waits and who ended them (the wakeup relation).
    pub wakes: Vec<(WakeKey, OffCpuValue)>,
    /// Stack id -> instruction pointers, innermost first.
    pub stacks: HashMap<u32, Vec<u64>>,
}

/// The scheduler family: context switches (statistics, off-CPU stacks) and wakeups (run-queue
/// latency).
#[derive(Default)]
pub(crate) struct SchedFamily {
    dump: SchedDump,
}

impl Family for SchedFamily {
    fn name(&self) -> &'static str {
        "sched"
    }

    fn configure(&self, kernel: &mut Config) {
        kernel.sched_stats = 1;
    }

    fn programs(&self) -> &'static [Preload] {
        &[
            SCHED_SWITCH,
            SCHED_SWITCH_IN,
            Preload::Plain("interrupt_exit"),
            Preload::Plain("interrupt_enter"),
            Preload::BtfTracePoint("sched_waking", "sched_waking"),
        ]
    }

    fn attach(&self, probes: &mut Probes) -> anyhow::Result<()> {
        // Its tail call's target first: no switch then runs one half without the other.
        probes.chain_btf_tracepoint("sched_switch_in", "sched_switch", names::SWITCH_IN, 0)?;
        probes.attach_sched_switch()?;
        // Before the wakeup program: it asks them whether a wakeup is an interrupt's.
        probes.attach_interrupt_tracking()?;
        probes.attach_sched_waking()
    }

    fn read(&mut self, maps: &mut MapReader<'_>) -> anyhow::Result<()> {
        self.dump = SchedDump::read(maps)?;
        Ok(())
    }

    fn processes(&self) -> Vec<u32> {
        let wakers = self.dump.wakes.iter().map(|(key, _)| key.waker_tgid).filter(|&pid| pid != 0);
        self.dump.offcpu.iter().map(|(key, _)| key.tgid).chain(wakers).collect()
    }

    fn analyze(&mut self, cx: &mut Analysis<'_>) -> anyhow::Result<Option<Box<dyn Section>>> {
        Ok(Some(Box::new(super::section::analyze(&self.dump, cx))))
    }
}

/// The context-switch program, which the syscall and memory families attach too.
pub(crate) const SCHED_SWITCH: Preload = Preload::BtfTracePoint("sched_switch", "sched_switch");

/// Its other half, for the thread getting the CPU (see `sysprof-ebpf/src/sched.rs`).
const SCHED_SWITCH_IN: Preload = Preload::BtfTracePoint("sched_switch_in", "sched_switch");

impl Probes {
    /// Attaches the context-switch program (scheduler statistics, off-CPU stacks, and parking of
    /// syscalls in flight).
    pub fn attach_sched_switch(&mut self) -> anyhow::Result<()> {
        self.attach_btf_tracepoint("sched_switch", "sched_switch")
    }

    /// Attaches the programs that keep each CPU's depth of interrupt work (timer callbacks,
    /// device handlers, softirqs), exits first, so that an interrupt under way at the attach
    /// never leaves the depth above zero.
    pub fn attach_interrupt_tracking(&mut self) -> anyhow::Result<()> {
        self.attach_raw_tracepoints(
            "interrupt_exit",
            &[("timer", "hrtimer_expire_exit"), ("irq", "irq_handler_exit"), ("irq", "softirq_exit")],
        )?;
        self.attach_raw_tracepoints(
            "interrupt_enter",
            &[("timer", "hrtimer_expire_entry"), ("irq", "irq_handler_entry"), ("irq", "softirq_entry")],
        )
    }

    /// Attaches the wakeup program (run-queue latency, the wakeup relation).
    pub fn attach_sched_waking(&mut self) -> anyhow::Result<()> {
        self.attach_btf_tracepoint("sched_waking", "sched_waking")
    }
}

impl SchedDump {
    /// Reads the scheduler statistics and the off-CPU stacks.
    pub(crate) fn read(maps: &mut MapReader<'_>) -> anyhow::Result<Self> {
        let offcpu: Vec<(OffCpuKey, OffCpuValue)> = maps.entries(names::OFFCPU)?;
        let wakes: Vec<(WakeKey, OffCpuValue)> = maps.entries(names::WAKES)?;
        let ids: BTreeSet<u32> = offcpu
            .iter()
            .flat_map(|(key, _)| [key.user_stack_id, key.kernel_stack_id])
            .chain(
                wakes
                    .iter()
                    .flat_map(|(key, _)| [key.user_stack_id, key.kernel_stack_id, key.waker_user_stack_id]),
            )
            .filter_map(|id| u32::try_from(id).ok())
            .collect();
        Ok(SchedDump {
            threads: maps.entries(names::THREAD_SCHED)?,
            runq: maps.entries(names::RUNQ_LATENCY)?,
            stacks: maps.stacks(names::STACKS, &ids)?,
            offcpu,
            wakes,
        })
    }
}
