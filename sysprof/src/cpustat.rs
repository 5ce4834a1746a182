//! Machine-wide CPU utilization from /proc/stat, over the trace.
//!
//! Sampling programs do not run while a CPU is idle (the kernel skips BPF overflow handlers for
//! the idle task's timer ticks), so the samples say how busy time splits, and this says how
//! much of the machine's time was busy at all.

use procfs::{CurrentSI as _, KernelStats};

/// Cumulative busy and total CPU ticks of all CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTicks {
    busy: u64,
    total: u64,
}

impl CpuTicks {
    /// The counters now; `None` where /proc/stat cannot be read.
    pub fn now() -> Option<Self> {
        let total = KernelStats::current().ok()?.total;
        let idle = total.idle + total.iowait.unwrap_or(0);
        let busy = total.user
            + total.nice
            + total.system
            + total.irq.unwrap_or(0)
            + total.softirq.unwrap_or(0)
            + total.steal.unwrap_or(0);
        Some(CpuTicks { busy, total: busy + idle })
    }

    /// Share of CPU time that was busy between `self` and `later` (0 to 1).
    pub fn busy_share_until(&self, later: &CpuTicks) -> Option<f64> {
        let total = later.total.checked_sub(self.total)?;
        let busy = later.busy.checked_sub(self.busy)?;
        (total > 0).then(|| busy as f64 / total as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_share_is_the_busy_part_of_elapsed_ticks() {
        let start = CpuTicks { busy: 100, total: 1000 };
        let end = CpuTicks { busy: 175, total: 1100 };
        assert_eq!(start.busy_share_until(&end), Some(0.75));
        assert_eq!(end.busy_share_until(&start), None);
        assert_eq!(start.busy_share_until(&start), None);
        assert!(CpuTicks::now().is_some());
    }
}
