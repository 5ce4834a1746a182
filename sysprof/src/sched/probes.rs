//! The scheduler family's kernel side: the context-switch and wakeup programs, and the
//! read-out of what they aggregated.

use std::collections::{BTreeSet, HashMap};

use sysprof_common::{LatencyHistogram, OffCpuKey, OffCpuValue, ThreadSched, names};

use crate::probes::Probes;

/// Scheduler statistics as the kernel aggregated them, with the off-CPU stacks.
#[derive(Debug, Default)]
pub struct SchedDump {
    pub threads: Vec<(u32, ThreadSched)>,
    pub runq: Vec<(u32, LatencyHistogram)>,
    pub offcpu: Vec<(OffCpuKey, OffCpuValue)>,
    /// Stack id -> instruction pointers, innermost first.
    pub stacks: HashMap<u32, Vec<u64>>,
}

impl Probes {
    /// Attaches the context-switch program (scheduler statistics, off-CPU stacks, and parking of
    /// syscalls in flight).
    pub fn attach_sched_switch(&mut self) -> anyhow::Result<()> {
        self.attach_btf_tracepoint("sched_switch", "sched_switch")
    }

    /// Attaches the wakeup program (run-queue latency).
    pub fn attach_sched_wakeup(&mut self) -> anyhow::Result<()> {
        self.attach_btf_tracepoint("sched_wakeup", "sched_wakeup")
    }

    /// Reads the scheduler statistics and the off-CPU stacks.
    pub fn sched(&self) -> anyhow::Result<SchedDump> {
        let offcpu: Vec<(OffCpuKey, OffCpuValue)> = self.entries(names::OFFCPU)?;
        let ids: BTreeSet<u32> = offcpu
            .iter()
            .flat_map(|(key, _)| [key.user_stack_id, key.kernel_stack_id])
            .filter_map(|id| u32::try_from(id).ok())
            .collect();
        Ok(SchedDump {
            threads: self.entries(names::THREAD_SCHED)?,
            runq: self.entries(names::RUNQ_LATENCY)?,
            stacks: self.stacks(&ids)?,
            offcpu,
        })
    }
}
