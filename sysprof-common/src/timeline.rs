//! The timeline's shared types: one record per event that has a place in time (a sample, a
//! wait, a slow system call, a probed call), for `timeline.pftrace`. Everything else sysprof
//! measures is aggregated in the kernel; these are what a timeline cannot do without.

/// The timeline's ring buffer.
pub const EVENTS: &str = "TIMELINE";
/// Its size in bytes: at 48 bytes an event, 10,922 events between two drains. Userspace drains
/// it every 20 ms tick: room for half a million events a second. Its pages are mapped into
/// sysprof and count in its resident memory, so it is no bigger than that needs.
pub const CAPACITY: u32 = 512 * 1024;

/// What a [`TimelineEvent`] records.
pub mod kind {
    /// An on-CPU sample: `detail` is the CPU, `end_ns` equals `start_ns`.
    pub const SAMPLE: u32 = 1;
    /// A wait off the CPU, from its switch-out to its switch-in: `detail` is the state it left
    /// with (`task_struct::__state`), `mark_ns` its wakeup (0 when none was seen), the stacks
    /// where it blocked.
    pub const OFF_CPU: u32 = 2;
    /// A system call at least the minimum long: `detail` its number, `mark_ns` its return value.
    pub const SYSCALL: u32 = 3;
    /// A probed call (GPU library, `--func`) that sends no call event of its own: `detail` its
    /// function id (`call::ID_MASK` of its cookie), `mark_ns` the argument it is keyed by.
    pub const CALL: u32 = 4;
}

/// One event on a thread's timeline.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimelineEvent {
    /// One of the [`kind`] constants.
    pub kind: u32,
    pub tgid: u32,
    pub tid: u32,
    /// Per kind (see [`kind`]).
    pub detail: u32,
    /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC) at the start.
    pub start_ns: u64,
    pub end_ns: u64,
    /// Per kind (see [`kind`]).
    pub mark_ns: u64,
    /// Ids in the stack maps (`CPU_STACKS` for samples, `STACKS` otherwise), or `stack::`
    /// markers.
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
}
shared!(TimelineEvent, 4 * 4 + 3 * 8 + 2 * 4);
