//! sysprof's own scheduling priority.
//!
//! On a saturated machine a profiler at its target's priority waits behind every runnable
//! target thread at each step of its start, its timer and its read-out: a 3 s trace of a
//! process with 2,000 threads waking every 10 ms on 2 CPUs lasted 20 s, 11 s of them traced.
//! With the privilege to (CAP_SYS_NICE, which root has), sysprof runs at nice -10, the weight of
//! about nine ordinary threads: its short steps are not delayed, and it stays below real-time
//! work. What it launches runs at the priority sysprof was started with.

use std::sync::atomic::{AtomicI32, Ordering};

/// The nice value sysprof should raise itself to.
const RAISED: i32 = -10;

/// The nice value sysprof was started with, for the command it launches; [`UNSET`] until the
/// first [`raise`] (a second trace in the same process must not take the raised value for it).
static STARTED_WITH: AtomicI32 = AtomicI32::new(UNSET);
const UNSET: i32 = i32::MIN;

/// Raises the calling thread (and the threads it starts afterwards) to [`RAISED`], when that is
/// higher than now and allowed; otherwise leaves it.
pub fn raise() {
    let now = current();
    let _ = STARTED_WITH.compare_exchange(UNSET, now, Ordering::Relaxed, Ordering::Relaxed);
    if now > RAISED {
        // SAFETY: plain system call; on Linux it changes the calling thread only. Failing
        // (no CAP_SYS_NICE) leaves the priority as it was, which is only slower.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, RAISED) };
    }
}

/// Puts the calling thread back to the priority sysprof was started with. Async-signal-safe:
/// for the launched command's child between fork and exec.
pub fn restore_in_child() {
    let nice = match STARTED_WITH.load(Ordering::Relaxed) {
        UNSET => return,
        nice => nice,
    };
    // SAFETY: plain system call; lowering one's own priority is always allowed.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
}

/// The calling thread's nice value.
fn current() -> i32 {
    // getpriority returns -1 both for nice -1 and for an error: errno tells them apart.
    // SAFETY: errno is thread-local; plain system call.
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
        if nice == -1 && *libc::__errno_location() != 0 { 0 } else { nice }
    }
}
