//! Whether a CPU is running an interrupt's work (a timer's callback, a device's handler, a
//! softirq): `sched_waking` runs on whatever task such work interrupted, which is then no
//! waker. The kernel's own `in_interrupt()` reads a per-CPU variable that aya's programs cannot
//! name, so the depth is kept here, from the tracepoints around that work.

use aya_ebpf::{
    macros::{map, raw_tracepoint},
    maps::PerCpuArray,
    programs::RawTracePointContext,
};

/// This CPU's nesting of interrupt work.
#[map]
static INTERRUPT_DEPTH: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// `hrtimer_expire_entry`, `irq_handler_entry`, `softirq_entry`.
#[raw_tracepoint]
pub fn interrupt_enter(_ctx: RawTracePointContext) -> i32 {
    if let Some(depth) = INTERRUPT_DEPTH.get_ptr_mut(0) {
        // SAFETY: a per-CPU slot; interrupt work on this CPU nests, it does not race.
        unsafe { *depth += 1 };
    }
    0
}

/// `hrtimer_expire_exit`, `irq_handler_exit`, `softirq_exit`.
#[raw_tracepoint]
pub fn interrupt_exit(_ctx: RawTracePointContext) -> i32 {
    if let Some(depth) = INTERRUPT_DEPTH.get_ptr_mut(0) {
        // SAFETY: as above. An exit whose entry came before the attach stays at 0.
        unsafe { *depth = (*depth).saturating_sub(1) };
    }
    0
}

/// Whether this CPU is inside interrupt work now.
#[inline(always)]
pub fn active() -> bool {
    INTERRUPT_DEPTH.get(0).is_some_and(|depth| *depth != 0)
}
