//! Process life-cycle events, which userspace follows to keep each target's memory map.

use crate::TASK_COMM_LEN;

/// Which program image a process ran: every key that holds a user stack holds the image it was
/// taken in, since an exec puts other code at the addresses the stack holds (or the same file
/// at others). The kernel's own count, `task_struct::self_exec_id`, which each exec moves on
/// and a fork copies: within one process, one value is one image. Its low 32 bits, read from
/// the task by an offset from BTF; the exec event carries the new image's
/// ([`ProcessEvent::detail`]).
pub mod exec_id {
    /// Not known (the offset was not, or the read-out was saved before images were kept):
    /// userspace takes the process's last image. No user process has it: each has exec'd at
    /// least once since the kernel's first task.
    pub const UNKNOWN: u32 = 0;
}

/// Kinds of [`ProcessEvent`].
pub mod process_event {
    /// A target process created a child process (not a thread).
    pub const FORK: u32 = 1;
    /// A target process replaced its program image.
    pub const EXEC: u32 = 2;
    /// A target process's main thread exited.
    pub const EXIT: u32 = 3;
    /// A target process mapped executable memory (mmap with PROT_EXEC succeeded): a library
    /// loaded, whose symbols and unwind table userspace reads at its next drain (it does not
    /// wake userspace: see the programs' `events::wakeup`).
    pub const MAPPED: u32 = 4;
    /// The unwinder stored a new stack with Python frames for a target process: userspace
    /// reads their code objects now, while the process (and they) still exist.
    pub const PYTHON_STACK: u32 = 5;
    /// The least time between two execs' wakeups of userspace, which drains again this long
    /// after an exec it was woken for: no exec waits longer to be read.
    pub const EXEC_WAKEUP_GAP_NS: u64 = 5_000_000;
}

/// Life-cycle event of a target process: rare, so shipped through a ring buffer, which lets
/// userspace read the process's memory map while it is still there.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessEvent {
    /// One of the [`process_event`] constants.
    pub kind: u32,
    /// The process the event is about (tgid).
    pub pid: u32,
    /// For [`process_event::FORK`], the parent; otherwise 0.
    pub parent_pid: u32,
    /// For [`process_event::EXIT`], the exit code as `wait` reports it; for
    /// [`process_event::PYTHON_STACK`], the stack's id; for [`process_event::EXEC`], the new
    /// image's [`exec_id`]; otherwise 0.
    pub detail: u32,
    /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC) at the event.
    pub time_ns: u64,
    /// For [`process_event::FORK`], when the child started: `task_struct::start_boottime`
    /// (CLOCK_BOOTTIME ns), which /proc/PID/stat's starttime counts in clock ticks. It tells
    /// the process apart from a later one with its pid without reading /proc at every fork. 0
    /// when unknown, and for the other kinds.
    pub started_ns: u64,
    /// Process name after the event.
    pub comm: [u8; TASK_COMM_LEN],
}
shared!(ProcessEvent, 4 * 4 + 8 + 8 + TASK_COMM_LEN);
