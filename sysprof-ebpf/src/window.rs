//! The trace's window: userspace writes its start once every program is attached (at the
//! command's release) and its end when the trace stops, before the read-out. Nothing outside it
//! is counted, so a trace's figures cover exactly the time the report says it lasted: an attach
//! or a read-out that a saturated machine stretches to seconds adds no samples, switches or
//! calls (samples stay within frequency x CPUs x duration).

use aya_ebpf::{macros::map, maps::Array};
use sysprof_common::TraceWindow;

/// The window, 0s until set (see `sysprof_common::names::TRACE_WINDOW`).
#[map]
pub static TRACE_WINDOW: Array<TraceWindow> = Array::with_max_entries(1, 0);

/// When the trace started (0 before), unless it has ended (its read-out may be under way).
#[inline(always)]
pub fn start_unless_closed() -> Option<u64> {
    let window = TRACE_WINDOW.get(0)?;
    (window.end_ns == 0).then_some(window.start_ns)
}

/// Whether an event now is inside the trace: it started and has not ended.
#[inline(always)]
pub fn open() -> bool {
    open_since().is_some()
}

/// The trace's start while it is open.
#[inline(always)]
pub fn open_since() -> Option<u64> {
    start_unless_closed().filter(|&start| start != 0)
}

/// `open`, for the call and heap probes, which sysprof's own probe-cost calibration also runs
/// after the trace's end, the only time sysprof is its own target (see `target.rs`): its
/// calls are timed as a target's are, and read by no figure (the read-out is done by then).
#[inline(always)]
pub fn open_or_calibrating(tgid: u32) -> bool {
    open() || tgid == crate::config::config().self_tgid
}
