//! The on-CPU family's shared types: what one sample is counted under.

use crate::TASK_COMM_LEN;

/// Key of an on-CPU sample count: one thread, one pair of stacks.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleKey {
    /// Process id (the kernel's tgid).
    pub tgid: u32,
    /// Thread id (the kernel's pid); 0 for the idle task.
    pub tid: u32,
    /// Id in `STACKS`, or one of the [`stack`] constants.
    pub user_stack_id: i32,
    /// Id in `STACKS`, or one of the [`stack`] constants.
    pub kernel_stack_id: i32,
    /// Thread name at the time of the sample.
    pub comm: [u8; TASK_COMM_LEN],
    /// The program image the sample was taken in (see [`crate::exec_id`]). Last, so
    /// that a read-out saved before it was kept reads it as 0.
    pub exec_id: u32,
}
shared!(SampleKey, 4 * 4 + TASK_COMM_LEN + 4);
