//! The process-event ring buffer, and the one way into it: rare events (life cycle, a library
//! mapped, a stack with new Python code objects) that userspace must hear of while the
//! process is still there. A leaf module, so the walkers and the life-cycle programs can both
//! send events without depending on each other.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_ktime_get_ns},
    macros::map,
    maps::RingBuf,
};
use sysprof_common::{Counter, ProcessEvent, TASK_COMM_LEN, capacity};

use crate::counters;

/// Process events for userspace.
#[map]
pub static PROCESS_EVENTS: RingBuf = RingBuf::with_byte_size(capacity::PROCESS_EVENTS, 0);

/// Sends one event (see `sysprof_common::process_event`); a full ring counts a loss.
#[inline(always)]
pub fn emit(kind: u32, pid: u32, parent_pid: u32, detail: u32) {
    let Some(mut entry) = PROCESS_EVENTS.reserve::<ProcessEvent>(0) else {
        counters::add(Counter::ProcessEventsLost, 1);
        return;
    };
    entry.write(ProcessEvent {
        kind,
        pid,
        parent_pid,
        detail,
        // SAFETY: plain helper call.
        time_ns: unsafe { bpf_ktime_get_ns() },
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
    });
    entry.submit(0);
}
