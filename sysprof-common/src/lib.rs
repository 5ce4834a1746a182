//! Types shared by sysprof's BPF programs (`sysprof-ebpf`) and its userspace (`sysprof`).
//!
//! Every struct here crosses the kernel boundary through a map, a ring buffer or a global, so
//! each is `#[repr(C)]` with explicit integer fields and no hidden padding: both sides must agree
//! on every byte. Map names live here too, so the loader looks maps up by the same names the BPF
//! side declares them with.
#![no_std]

/// Length of `task_struct::comm`, the kernel's thread name.
pub const TASK_COMM_LEN: usize = 16;

/// Names of the maps and globals in the BPF object.
pub mod names {
    /// Global [`crate::Config`], overridden at load time.
    pub const CONFIG: &str = "CONFIG";
    /// `STACK_TRACE` map: stack id -> frame addresses.
    pub const STACKS: &str = "STACKS";
    /// Hash: [`crate::SampleKey`] -> on-CPU sample count.
    pub const CPU_SAMPLES: &str = "CPU_SAMPLES";
    /// Hash: tgid -> 1 for every process that is part of the target.
    pub const TARGETS: &str = "TARGETS";
    /// Per-CPU array of `u64` indexed by [`crate::Counter`].
    pub const COUNTERS: &str = "COUNTERS";
    /// Ring buffer of [`crate::ProcessEvent`]s.
    pub const PROCESS_EVENTS: &str = "PROCESS_EVENTS";
}

/// Capacity of the maps, sized for a busy 64-CPU host profiled for minutes. Userspace may raise
/// them at load time; these are what the object declares.
pub mod capacity {
    /// Distinct stacks (kernel and user each take one entry).
    pub const STACKS: u32 = 16 * 1024;
    /// Distinct (thread, user stack, kernel stack) sample keys.
    pub const CPU_SAMPLES: u32 = 64 * 1024;
    /// Processes in the target set at once.
    pub const TARGETS: u32 = 16 * 1024;
    /// Bytes of the process-event ring buffer (a power of two, a multiple of the page size).
    pub const PROCESS_EVENTS: u32 = 256 * 1024;
}

/// Which tasks the programs count.
pub mod filter {
    /// Every task on the machine (`--all`).
    pub const ALL: u32 = 0;
    /// Processes whose tgid is in the `TARGETS` map (`--pid`, `-- CMD`, `--comm`).
    pub const TARGETS: u32 = 1;
    /// Tasks in a cgroup v2 subtree (`--cgroup`, `--unit`).
    pub const CGROUP: u32 = 2;
}

/// Read-only configuration of the BPF programs, written into the object before it is loaded.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// One of the [`filter`] constants.
    pub filter: u32,
    /// Depth of `cgroup_id` in the cgroup v2 hierarchy (the root is level 0).
    pub cgroup_level: u32,
    /// Cgroup v2 id (the inode number of its directory) that [`filter::CGROUP`] keeps.
    pub cgroup_id: u64,
    /// Byte offset of `task_struct::pid`, read from kernel BTF; 0 when unknown, which turns
    /// off following new child processes.
    pub task_pid_offset: u32,
    /// Byte offset of `task_struct::tgid`, read from kernel BTF; 0 when unknown.
    pub task_tgid_offset: u32,
    /// Process name that makes a process part of the target when it execs (`--comm`);
    /// all zero when unused.
    pub comm: [u8; TASK_COMM_LEN],
}

/// Result recorded for a stack that could not be stored in the `STACKS` map.
pub mod stack {
    /// The sample has no stack of this kind (user-mode sample: no kernel stack; kernel thread:
    /// no user stack). Not an error.
    pub const NONE: i32 = -1;
    /// The stack existed but was dropped: the stack map was full or the id collided.
    pub const LOST: i32 = -2;
}

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
}

/// Kinds of [`ProcessEvent`].
pub mod process_event {
    /// A target process created a child process (not a thread).
    pub const FORK: u32 = 1;
    /// A target process replaced its program image.
    pub const EXEC: u32 = 2;
    /// A target process's main thread exited.
    pub const EXIT: u32 = 3;
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
    /// For [`process_event::EXIT`], the exit code as `wait` reports it; otherwise 0.
    pub exit_code: u32,
    /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC) at the event.
    pub time_ns: u64,
    /// Process name after the event.
    pub comm: [u8; TASK_COMM_LEN],
}

/// In-kernel counters, summed over CPUs by userspace. Each names something sysprof saw or lost.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// On-CPU samples of target tasks.
    CpuSamples = 0,
    /// Samples lost because `CPU_SAMPLES` was full.
    CpuSamplesLost = 1,
    /// User stacks lost (stack map full or id collision).
    UserStacksLost = 2,
    /// Kernel stacks lost (stack map full or id collision).
    KernelStacksLost = 3,
    /// Process events lost because the ring buffer was full.
    ProcessEventsLost = 4,
    /// New target processes not followed because `TARGETS` was full.
    TargetsFull = 5,
}

impl Counter {
    /// Number of slots in the `COUNTERS` array (room for counters later programs add).
    pub const SLOTS: u32 = 32;
    /// Every counter, in slot order.
    pub const ALL: [Counter; 6] = [
        Counter::CpuSamples,
        Counter::CpuSamplesLost,
        Counter::UserStacksLost,
        Counter::KernelStacksLost,
        Counter::ProcessEventsLost,
        Counter::TargetsFull,
    ];
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: each type is #[repr(C)], made only of integers and integer arrays, with no padding
    // (sizes are checked in the tests below), so every bit pattern is a valid value.
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::SampleKey {}
    unsafe impl aya::Pod for super::ProcessEvent {}
}

#[cfg(test)]
mod tests {
    use core::mem::size_of;

    use super::*;

    #[test]
    fn shared_types_have_no_padding() {
        assert_eq!(size_of::<Config>(), 4 + 4 + 8 + 4 + 4 + TASK_COMM_LEN);
        assert_eq!(size_of::<SampleKey>(), 4 * 4 + TASK_COMM_LEN);
        assert_eq!(size_of::<ProcessEvent>(), 4 * 4 + 8 + TASK_COMM_LEN);
    }

    #[test]
    fn counters_fit_their_array() {
        for (slot, counter) in Counter::ALL.iter().enumerate() {
            assert_eq!(*counter as usize, slot);
        }
        assert!((Counter::ALL.len() as u32) <= Counter::SLOTS);
    }
}
