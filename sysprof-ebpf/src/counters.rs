//! Per-CPU counters: no atomics needed, userspace sums the CPUs.

use aya_ebpf::{macros::map, maps::PerCpuArray};
use sysprof_common::Counter;

/// What the programs saw and lost, per CPU, indexed by `Counter`.
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::SLOTS, 0);

#[inline(always)]
pub fn add(counter: Counter, n: u64) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: a per-CPU slot is only touched by programs on this CPU, which do not nest
        // with each other for the same counter.
        unsafe { *slot += n };
    }
}
