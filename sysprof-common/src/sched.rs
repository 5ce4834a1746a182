//! The scheduler family's shared types: per-thread statistics and off-CPU time by stack.

use crate::TASK_COMM_LEN;

/// Scheduler statistics of one thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadSched {
    pub tgid: u32,
    /// 1 while the thread is on a CPU (its on-CPU time since `last_switch_in_ns` is not yet
    /// counted).
    pub on_cpu: u32,
    /// Switches out while blocked (sleep, I/O, lock).
    pub voluntary: u64,
    /// Switches out while runnable (preempted).
    pub involuntary: u64,
    /// Time on a CPU, by the thread's own CPU clock (steal left out).
    pub oncpu_ns: u64,
    pub offcpu_ns: u64,
    /// What the hypervisor took from the vCPU while the thread was on it (steal; and interrupt
    /// time, where the kernel accounts it apart): the clock between its switches ran, the
    /// thread did not. With `oncpu_ns` and `offcpu_ns`, the
    /// thread's whole time since its first switch.
    pub stolen_ns: u64,
    pub last_switch_in_ns: u64,
    pub comm: [u8; TASK_COMM_LEN],
}
shared!(ThreadSched, 2 * 4 + 6 * 8 + TASK_COMM_LEN);

/// Key of off-CPU time: where a thread was (its stacks) and why (its state) when it left the CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OffCpuKey {
    pub tgid: u32,
    /// `sched_switch` prev_state: 0 or [`TASK_REPORT_MAX`] preempted, else the sleep state.
    pub state: u32,
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
    /// The image the stacks were taken in (see [`crate::exec_id`]); last, as in
    /// [`crate::SampleKey`].
    pub exec_id: u32,
}
shared!(OffCpuKey, 20);

/// `prev_state` of a task preempted inside the kernel (`TASK_REPORT_MAX`).
pub const TASK_REPORT_MAX: u32 = 0x100;

/// Time spent off CPU under one [`OffCpuKey`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuValue {
    pub total_ns: u64,
    pub count: u64,
}
shared!(OffCpuValue, 16);

/// Key of the wakeup relation: a target thread's wait (where and why it blocked) and who ended
/// it, from `sched_waking`, which runs in the waker's context.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WakeKey {
    pub tgid: u32,
    pub tid: u32,
    /// The thread that woke it from a system call (a futex wake, a write, an exit); 0 and 0
    /// for an interrupt (a timer, a device).
    pub waker_tgid: u32,
    pub waker_tid: u32,
    /// The waiter's `sched_switch` prev_state.
    pub state: u32,
    /// The waiter's stacks as it blocked.
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
    /// The waker's user stack, taken when the waker is a target thread (the unlock, the
    /// signal, the exit that ended the wait); `stack::NONE` otherwise.
    pub waker_user_stack_id: i32,
    /// The images the waiter's and the waker's stacks were taken in (see [`crate::exec_id`]);
    /// last, as in [`crate::SampleKey`].
    pub exec_id: u32,
    pub waker_exec_id: u32,
}
shared!(WakeKey, 40);
