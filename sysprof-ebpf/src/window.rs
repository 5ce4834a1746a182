//! The trace's window: userspace writes its start once every program is attached (at the
//! command's release) and its end when the trace stops, before the read-out. Nothing outside it
//! is counted, so a trace's figures cover exactly the time the report says it lasted: an attach
//! or a read-out that a saturated machine stretches to seconds adds no samples, switches or
//! calls (samples stay within frequency x CPUs x duration).

use sysprof_common::TraceWindow;

/// The window, 0s until set (see `sysprof_common::names::TRACE_WINDOW`). A global in a
/// writable data section of its own, which aya loads as a one-entry array map: the programs
/// read it at a constant address, where a map's lookup costs its call sequence and a bounds
/// test (ten instructions; a syscall's exit reads it on every call). `mut`, exported: to the
/// compiler it may change behind the program's back, so every read is a load (see config.rs).
#[unsafe(no_mangle)]
#[unsafe(link_section = ".data.window")]
static mut TRACE_WINDOW: TraceWindow = TraceWindow { start_ns: 0, end_ns: 0 };

/// When the trace started (0 before), unless it has ended (its read-out may be under way).
#[inline(always)]
pub fn start_unless_closed() -> Option<u64> {
    // SAFETY: a plain read of the global; userspace writes it whole, and a program that sees
    // one half of a write sees the window opening or closing as it happens.
    let window = unsafe { &*(&raw const TRACE_WINDOW) };
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
