//! The trace's window: userspace writes its start once every program is attached (at the
//! command's release) and its end when the trace stops, before the read-out. Nothing outside it
//! is counted, so a trace's figures cover exactly the time the report says it lasted: an attach
//! or a read-out that a saturated machine stretches to seconds adds no samples, switches or
//! calls (samples stay within frequency x CPUs x duration).

use aya_ebpf::{macros::map, maps::Array};

/// `[start, end]` in CLOCK_MONOTONIC ns, 0 until set (see `sysprof_common::names::TRACE_WINDOW`).
#[map]
pub static TRACE_WINDOW: Array<u64> = Array::with_max_entries(2, 0);

const START: u32 = 0;
const END: u32 = 1;

/// When the trace started; 0 before.
#[inline(always)]
pub fn start() -> u64 {
    TRACE_WINDOW.get(START).copied().unwrap_or(0)
}

/// Whether the trace has ended (its read-out may be under way).
#[inline(always)]
pub fn closed() -> bool {
    TRACE_WINDOW.get(END).is_some_and(|end| *end != 0)
}

/// Whether an event now is inside the trace: it started and has not ended.
#[inline(always)]
pub fn open() -> bool {
    open_since().is_some()
}

/// The trace's start while it is open.
#[inline(always)]
pub fn open_since() -> Option<u64> {
    let start = start();
    (start != 0 && !closed()).then_some(start)
}

/// `open`, for the call and heap probes, which sysprof's own probe-cost calibration also runs
/// after the trace's end, the only time sysprof is its own target (see `target.rs`): its
/// calls are timed as a target's are, and read by no figure (the read-out is done by then).
#[inline(always)]
pub fn open_or_calibrating(tgid: u32) -> bool {
    open() || tgid == crate::config::config().self_tgid
}
