//! The process-event ring buffer, and the one way into it: rare events (life cycle, a library
//! mapped, a stack with new Python code objects) that userspace must hear of while the
//! process is still there. A leaf module, so the walkers and the life-cycle programs can both
//! send events without depending on each other.

use aya_ebpf::{
    bindings::{BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_get_current_comm, bpf_ktime_get_ns},
    macros::map,
    maps::{Array, RingBuf},
};
use sysprof_common::{
    Counter, ProcessEvent, TASK_COMM_LEN, capacity,
    process_event::{self, EXEC_WAKEUP_GAP_NS},
};

use crate::counters;

/// Process events for userspace.
#[map]
pub static PROCESS_EVENTS: RingBuf = RingBuf::with_byte_size(capacity::PROCESS_EVENTS, 0);

/// When an exec last woke userspace (`bpf_ktime_get_ns`), machine-wide.
#[map]
static EXEC_WOKE: Array<u64> = Array::with_max_entries(1, 0);

/// Non-zero while userspace rests (`sysprof_common::names::USERSPACE_RESTING`): nothing
/// happened for a while, and it drains its rings every quarter of a second instead of every
/// 20 ms. The first event that would have waited for its tick wakes it instead, and takes the
/// flag, so that the events after it wait again. A global read at a fixed address, as the
/// window (see `window.rs`), and written here too.
#[unsafe(no_mangle)]
#[unsafe(link_section = ".data.resting")]
static mut USERSPACE_RESTING: u32 = 0;

/// Whether userspace rests.
#[inline(always)]
pub fn resting() -> bool {
    // SAFETY: a plain read of the global.
    unsafe { *(&raw const USERSPACE_RESTING) != 0 }
}

/// Whether userspace rests; if so, it will not from now on (the caller wakes it).
#[inline(always)]
pub fn take_resting() -> bool {
    if !resting() {
        return false;
    }
    // SAFETY: a plain write of the global; two CPUs that both take it both wake userspace,
    // which is harmless.
    unsafe { *(&raw mut USERSPACE_RESTING) = 0 };
    true
}

/// Sends one event (see `sysprof_common::process_event`); a full ring counts a loss.
#[inline(always)]
pub fn emit(kind: u32, pid: u32, parent_pid: u32, detail: u32, started_ns: u64) {
    let Some(mut entry) = PROCESS_EVENTS.reserve::<ProcessEvent>(0) else {
        counters::add(Counter::ProcessEventsLost, 1);
        return;
    };
    // SAFETY: plain helper call.
    let time_ns = unsafe { bpf_ktime_get_ns() };
    entry.write(ProcessEvent {
        kind,
        pid,
        parent_pid,
        detail,
        time_ns,
        started_ns,
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
    });
    entry.submit(wakeup(kind, time_ns));
}

/// Whether an event wakes userspace. A wakeup is an interrupt the kernel raises on this CPU
/// (irq_work), and in a VM that interrupt is an exit to the hypervisor: 20-30 us of the
/// event's program here (`process_fork` 22 us a run with it, 2 without), most of a `make
/// -j2`'s process-event cost. Two kinds are urgent: an exec (the new program's maps and unwind
/// tables, read before a short-lived process is gone) and a stack with new Python code (its
/// names, read while the code objects exist). Forks, exits and mapped libraries wait, in order,
/// for the next urgent event or userspace's next drain (its tick, 20 ms), unless userspace
/// rests (see `USERSPACE_RESTING`): the first of them then wakes it; a new process's
/// libraries are read by its early rescans anyway. The urgent ones force their wakeup: the
/// kernel's own choice skips it while earlier records are still unread. Execs wake userspace
/// at most once per `EXEC_WAKEUP_GAP_NS`: a shell script execs hundreds of programs a second
/// (`process_exec` took 35 us a run with a wakeup each, 1 us without), and userspace, woken
/// for one, drains again that long after for those that came meanwhile.
#[inline(always)]
fn wakeup(kind: u32, now: u64) -> u64 {
    match kind {
        process_event::PYTHON_STACK => BPF_RB_FORCE_WAKEUP as u64,
        process_event::EXEC => {
            let Some(woke) = EXEC_WOKE.get_ptr_mut(0) else { return BPF_RB_FORCE_WAKEUP as u64 };
            // SAFETY: the map's one value, valid for the program's run. Two CPUs may both wake
            // userspace at once: harmless.
            unsafe {
                if now.wrapping_sub(*woke) < EXEC_WAKEUP_GAP_NS {
                    return BPF_RB_NO_WAKEUP as u64;
                }
                *woke = now;
            }
            BPF_RB_FORCE_WAKEUP as u64
        }
        _ if take_resting() => BPF_RB_FORCE_WAKEUP as u64,
        _ => BPF_RB_NO_WAKEUP as u64,
    }
}
