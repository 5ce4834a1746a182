//! Per-CPU counters: no atomics needed, userspace sums the CPUs.

use sysprof_common::Counter;

use crate::maps::COUNTERS;

#[inline(always)]
pub fn add(counter: Counter, n: u64) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: a per-CPU slot is only touched by programs on this CPU, which do not nest
        // with each other for the same counter.
        unsafe { *slot += n };
    }
}
