//! Types shared by sysprof's BPF programs (`sysprof-ebpf`) and its userspace (`sysprof`).
//!
//! Every struct here crosses the kernel boundary through a map, a ring buffer or a global, so
//! each is `#[repr(C)]` with explicit integer fields and no hidden padding: both sides must agree
//! on every byte. Map names live here too, so the loader looks maps up by the same names the BPF
//! side declares them with. One module per probe family, as in the BPF crate (`cpu`, `sched`,
//! `signals` (with its own map names), `syscalls`, `memory`, `calls`, `process`, `unwind`, `python`, and `histogram` which several share), each type with
//! its size check and `Pod` impl beside it (`shared!`); everything is re-exported here.
#![no_std]

/// Declares a type that crosses the kernel boundary: exactly `$size` bytes, so no padding the two
/// sides could disagree on (checked at compile time, on both sides), and in userspace plain old
/// data that aya copies in and out of maps.
macro_rules! shared {
    ($ty:ty, $size:expr) => {
        const _: () = assert!(core::mem::size_of::<$ty>() == $size);
        // SAFETY: #[repr(C)], made only of integers and integer arrays, with no padding (the
        // size above), so every bit pattern is a valid value.
        #[cfg(feature = "user")]
        unsafe impl aya::Pod for $ty {}
    };
}

mod calls;
mod cpu;
pub mod histogram;
pub mod ksyms;
pub mod loader;
mod memory;
mod process;
pub mod python;
mod sched;
pub mod signals;
mod syscalls;
pub mod timeline;
pub mod unwind;

pub use self::{
    calls::{CallEvent, CallKey, CallStats, call},
    cpu::SampleKey,
    histogram::LatencyHistogram,
    memory::{
        AddressSpace, AllocKey, AllocStats, FAULT_STACKS_ALL, FaultKey, LiveAlloc, LiveKey, ProcessAllocs,
        alloc,
    },
    process::{ProcessEvent, exec_id, process_event},
    sched::{OffCpuKey, OffCpuValue, TASK_REPORT_MAX, ThreadSched, WakeKey},
    syscalls::{
        CpuState, InFlight, PENDING_COUNTS, PendingCount, SyscallErrorKey, SyscallKey, SyscallSlot,
        SyscallStats, key_of as syscall_key_of,
    },
};

/// Length of `task_struct::comm`, the kernel's thread name.
pub const TASK_COMM_LEN: usize = 16;

/// Names of the maps and globals in the BPF object.
pub mod names {
    /// Global [`crate::Config`], overridden at load time.
    pub const CONFIG: &str = "CONFIG";
    /// `STACK_TRACE` map: stack id -> frame addresses (off-CPU, faults, heap, calls).
    pub const STACKS: &str = "STACKS";
    /// `STACK_TRACE` map of the on-CPU samples' stacks, apart: the stack map is a direct-mapped
    /// table whose colliding entries are lost, and the hottest stacks of a profile must not be
    /// lost to a page-fault stack that took their bucket first.
    pub const CPU_STACKS: &str = "CPU_STACKS";
    /// Hash: [`crate::SampleKey`] -> on-CPU sample count.
    pub const CPU_SAMPLES: &str = "CPU_SAMPLES";
    /// Hash: tgid -> 1 for every process that is part of the target.
    pub const TARGETS: &str = "TARGETS";
    /// Per-CPU array of `u64` indexed by [`crate::Counter`].
    pub const COUNTERS: &str = "COUNTERS";
    /// Ring buffer of [`crate::ProcessEvent`]s.
    pub const PROCESS_EVENTS: &str = "PROCESS_EVENTS";
    /// Hash: [`crate::SyscallKey`] -> [`crate::SyscallStats`].
    pub const SYSCALLS: &str = "SYSCALLS";
    /// Per-CPU array of one [`crate::CpuState`]: the note of the task on the CPU (its
    /// `pid_tgid` as the switch program saw it arrive, with the verdict on it) and the syscall
    /// programs' slot.
    pub const CPU_STATE: &str = "CPU_STATE";
    /// Global `u32`: the notes' epoch. A note made in an earlier one is no note: userspace
    /// moves it on when the target set changes, as a verdict is only as new as the switch that
    /// made it.
    pub const NOTES_EPOCH: &str = ".data.notes";
    /// Global `u32`: non-zero while userspace rests (drains its rings every quarter of a
    /// second, nothing having happened for a while). The first process event, or the timeline
    /// event that finds its ring a quarter full, wakes it and sets it back to 0.
    pub const USERSPACE_RESTING: &str = ".data.resting";
    /// The shortest slice the timeline keeps once its bound raised it (a u64 of ns, 0 until
    /// then), written by userspace as it raises it: the programs send nothing under it.
    pub const TIMELINE_RAISED_MIN: &str = ".data.timeline_min";
    /// Hash: [`crate::SyscallErrorKey`] -> count of failed calls.
    pub const SYSCALL_ERRORS: &str = "SYSCALL_ERRORS";
    /// Array: syscall number -> [`crate::SyscallStats`] of the calls of every process
    /// `SYSCALLS` had no room for.
    pub const SYSCALLS_BY_NR: &str = "SYSCALLS_BY_NR";
    /// Hash: thread id -> [`crate::ThreadSched`].
    pub const THREAD_SCHED: &str = "THREAD_SCHED";
    /// Hash: tgid -> [`crate::LatencyHistogram`] of run-queue latency.
    pub const RUNQ_LATENCY: &str = "RUNQ_LATENCY";
    /// Array of one [`crate::TraceWindow`]: when the trace started (the command's release, or
    /// the end of the attach) and when it ended (before the read-out), each set by userspace
    /// then. The programs count only between them, so the figures cover the trace's elapsed
    /// time and no more. A global of the programs' (aya names its map by its section).
    pub const TRACE_WINDOW: &str = ".data.window";
    /// Array of two u32s: the launched command's pid while it is to be held at its loader,
    /// and while it is held there (see [`crate::loader`]).
    pub const LOADER_GATE: &str = "LOADER_GATE";
    /// Hash: [`crate::OffCpuKey`] -> [`crate::OffCpuValue`].
    pub const OFFCPU: &str = "OFFCPU";
    /// Program array: `sched_switch_in`, which the context-switch program tail-calls.
    pub const SWITCH_IN: &str = "SWITCH_IN";
    /// Hash: [`crate::WakeKey`] -> [`crate::OffCpuValue`]: the waits and who ended them.
    pub const WAKES: &str = "WAKES";
    /// Task local storage of the scheduler and syscall programs (kernel side only).
    pub const TASK_STATE: &str = "TASK_STATE";
    /// Hash: [`crate::CallKey`] -> [`crate::CallStats`] for probed library and user functions.
    pub const CALLS: &str = "CALLS";
    /// Ring buffer of [`crate::CallEvent`]s (calls whose arguments matter).
    pub const CALL_EVENTS: &str = "CALL_EVENTS";
    /// Hash: tgid -> [`crate::AddressSpace`].
    pub const ADDRESS_SPACE: &str = "ADDRESS_SPACE";
    /// Array of one [`crate::AddressSpace`]: the processes `ADDRESS_SPACE` had no room for,
    /// together (their brk calls, not their breaks' moves).
    pub const ADDR_SPACE_REST: &str = "ADDR_SPACE_REST";
    /// Hash: tgid << 1 | major -> page faults (exact). On the system-wide fault events the
    /// fault programs count every fault here; on the targets' own events (see
    /// [`FAULT_TASK_COUNTERS`]) the exit program adds each exiting thread's own counters.
    pub const FAULT_COUNTS: &str = "FAULT_COUNTS";
    /// Array: [minor, major] faults of the processes `FAULT_COUNTS` had no room for.
    pub const FAULTS_BY_KIND: &str = "FAULTS_BY_KIND";
    /// Array, one u32: 1 when the targets' faults are counted by the kernel's per-task
    /// counters (`min_flt`, `maj_flt`, what getrusage and /proc read), the fault events being
    /// the targets' own and sampled; 0 when the fault programs count every fault.
    pub const FAULT_TASK_COUNTERS: &str = "FAULT_TASK_COUNTERS";
    /// Hash: tid -> [minor, major] faults of a target thread that existed when the trace
    /// started, at its start: what its exit does not count.
    pub const FAULT_BASELINES: &str = "FAULT_BASELINES";
    /// Hash: [`crate::FaultKey`] -> sampled faults (weighted).
    pub const FAULT_STACKS: &str = "FAULT_STACKS";
    /// `STACK_TRACE` map of the page faults' stacks, apart: an exec-heavy program faults in
    /// thousands of distinct stacks, which must not collide with the off-CPU, heap and call
    /// stacks in [`STACKS`].
    pub const FAULT_TRACES: &str = "FAULT_TRACES";
    /// Each stack map's overflow: a stack whose bucket in its map holds another stack (the
    /// maps are direct-mapped by hash) is stored here, its id marked with
    /// [`crate::stack::OVERFLOW`]. Two places for each stack make a lost one rare at a quarter
    /// of the memory a map twice as big would take.
    pub const STACKS_OVERFLOW: &str = "STACKS_OVERFLOW";
    pub const CPU_STACKS_OVERFLOW: &str = "CPU_STACKS_OVERFLOW";
    pub const FAULT_TRACES_OVERFLOW: &str = "FAULT_TRACES_OVERFLOW";

    /// The overflow map of stack map `name`.
    pub fn overflow_of(name: &str) -> Option<&'static str> {
        match name {
            STACKS => Some(STACKS_OVERFLOW),
            CPU_STACKS => Some(CPU_STACKS_OVERFLOW),
            FAULT_TRACES => Some(FAULT_TRACES_OVERFLOW),
            _ => None,
        }
    }
    /// Hash: [`crate::AllocKey`] -> [`crate::AllocStats`] (bytes allocated by call site).
    pub const ALLOC_STACKS: &str = "ALLOC_STACKS";
    /// Hash: tgid -> [`crate::ProcessAllocs`].
    pub const PROCESS_ALLOCS: &str = "PROCESS_ALLOCS";
    /// LRU hash: [`crate::LiveKey`] -> [`crate::LiveAlloc`]: allocations not freed yet.
    pub const LIVE_ALLOCS: &str = "LIVE_ALLOCS";
    /// Array of u64 words, one bit per process id, set for the processes in `TARGETS`: what
    /// the programs test (an inlined array load), while `TARGETS` is what userspace lists.
    /// Memory-mapped (`BPF_F_MMAPABLE`), so userspace sets and clears bits atomically beside
    /// the programs' own atomic updates.
    pub const TARGET_BITS: &str = "TARGET_BITS";
}

/// Capacity of the maps, sized for a busy 64-CPU host profiled for minutes. Userspace may raise
/// them at load time; these are what the object declares.
pub mod capacity {
    /// Distinct stacks (kernel and user each take one entry), in each of `STACKS` and
    /// `CPU_STACKS`.
    pub const STACKS: u32 = 16 * 1024;
    /// Distinct (thread, user stack, kernel stack) sample keys.
    pub const CPU_SAMPLES: u32 = 64 * 1024;
    /// Processes in the target set at once.
    pub const TARGETS: u32 = 16 * 1024;
    /// Words of `TARGET_BITS`: a bit for every process id the kernel can hand out
    /// (`PID_MAX_LIMIT`, 4,194,304 on 64-bit), 512 KiB, so a `pid_max` raised during the trace
    /// is still covered.
    pub const TARGET_BITS_WORDS: u32 = 4 * 1024 * 1024 / 64;
    /// Bytes of the process-event ring buffer (a power of two, a multiple of the page size).
    pub const PROCESS_EVENTS: u32 = 256 * 1024;
    /// Distinct (process, syscall) pairs.
    pub const SYSCALLS: u32 = 16 * 1024;
    /// Syscall numbers `SYSCALLS_BY_NR` holds (the highest of x86-64's and arm64's tables is
    /// under 470); a higher one's calls are lost when `SYSCALLS` is full.
    pub const SYSCALL_NUMBERS: u32 = 512;
    /// Distinct (process, syscall, errno) triples.
    pub const SYSCALL_ERRORS: u32 = 16 * 1024;
    /// Threads with scheduler statistics.
    pub const THREAD_SCHED: u32 = 32 * 1024;
    /// Processes with a run-queue latency histogram.
    pub const RUNQ_LATENCY: u32 = 4 * 1024;
    /// Distinct (process, off-CPU stacks, state) keys.
    pub const OFFCPU: u32 = 32 * 1024;
    pub const WAKES: u32 = 32 * 1024;
    /// Distinct (process, function, call site, detail) keys of probed calls.
    pub const CALLS: u32 = 16 * 1024;
    /// Bytes of the call-event ring buffer.
    pub const CALL_EVENTS: u32 = 4 * 1024 * 1024;
    pub const ADDRESS_SPACE: u32 = 4 * 1024;
    pub const FAULT_COUNTS: u32 = 8 * 1024;
    /// Target threads alive when the trace starts whose faults so far are left out; per-task
    /// fault events are used up to 256 target threads (more run out of descriptors).
    pub const FAULT_BASELINES: u32 = 1024;
    pub const FAULT_STACKS: u32 = 32 * 1024;
    pub const ALLOC_STACKS: u32 = 32 * 1024;
    pub const PROCESS_ALLOCS: u32 = 4 * 1024;
    /// Live allocations tracked at once with --malloc (beyond it, new blocks are counted but
    /// not tracked: `Counter::AllocsUntracked`). The map is preallocated: about 25 MiB of
    /// kernel memory.
    pub const LIVE_ALLOCS: u32 = 256 * 1024;
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

/// The trace's window (`names::TRACE_WINDOW`), in CLOCK_MONOTONIC ns, each 0 until set.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceWindow {
    pub start_ns: u64,
    pub end_ns: u64,
}
shared!(TraceWindow, 16);

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
    /// Scheduler statistics and off-CPU stacks (`--focus sched`); when 0 the switch program
    /// only parks in-flight syscalls (see `syscall_burst`).
    pub sched_stats: u32,
    /// Syscalls a thread may make in one stretch on a CPU before their latency is sampled
    /// (1 in `syscall_sample_every`, weighted) instead of timed one by one; 0 times every call.
    /// Counts and errors are always exact.
    pub syscall_burst: u32,
    pub syscall_sample_every: u32,
    /// Count address-space syscalls (mmap, munmap, brk, mremap) per process: 1 on, 0 off.
    pub address_space: u32,
    /// This architecture's numbers of mmap, munmap, brk and mremap.
    pub nr_mmap: u32,
    pub nr_munmap: u32,
    pub nr_brk: u32,
    pub nr_mremap: u32,
    /// Minor-fault stacks past each process's first `FAULT_STACKS_ALL` are taken for 1 fault
    /// in this many (counts stay exact): by the fault program on system-wide events, as the
    /// sample period of the targets' own events.
    pub fault_stack_every: u32,
    /// sysprof's own process: never a target, whatever the filter says (a `--cgroup` or
    /// `--comm` it falls in, `--all`, a `--pid` it descends from), except while it measures its
    /// own probe cost with itself in `TARGETS`.
    pub self_tgid: u32,
    /// This architecture's numbers of exit and exit_group, which never return: counted at entry.
    pub nr_exit: u32,
    pub nr_exit_group: u32,
    /// Offset of `thread.fsbase` in `task_struct` (x86_64), from BTF: where the Python
    /// walker finds `pthread_self()` of 3.10's threads. 0 when unknown.
    pub task_fsbase_offset: u32,
    /// The timeline (`timeline.rs`): 0 off; else the shortest wait off the CPU and system call
    /// it records, in microseconds (samples and probed calls are recorded whatever their length).
    pub timeline_min_us: u32,
    /// Offsets of `task_struct::min_flt` and `maj_flt` (each an unsigned long), from BTF: the
    /// kernel's own count of a thread's faults. 0 when unknown, which keeps the fault programs
    /// counting every fault.
    pub task_min_flt_offset: u32,
    pub task_maj_flt_offset: u32,
    /// Byte offset of `task_struct::se.sum_exec_runtime`: the kernel's count of a thread's time
    /// on a CPU, which the switch program takes its on-CPU time from (0 when unknown: the
    /// clock between its switches).
    pub task_exec_runtime_offset: u32,
    /// Byte offset of `task_struct::start_boottime`, which the fork program sends with a new
    /// process (`ProcessEvent::started_ns`); 0 when unknown (userspace then reads /proc).
    pub task_start_boottime_offset: u32,
    /// 1 when the switch program runs, which keeps each CPU's note of its current task (the
    /// syscall, sched and memory families load it): the other programs read the note only
    /// then, for without it a note written at an exec would outlive its task.
    pub switch_notes: u32,
    /// Byte offsets of `task_struct::signal` and of `signal_struct::live` (the threads of a
    /// process still running): the exit program tells a process's end from its leader's by
    /// them. 0 when unknown (the leader's exit then stands for the process's).
    pub task_signal_offset: u32,
    pub signal_live_offset: u32,
    /// Byte offsets of `task_struct::mm` and of `mm_struct::context.vdso` (where the vDSO's
    /// code is mapped, chosen anew at each exec): the unwinder takes a process's tables only
    /// for the address space they were read from (`unwind::ProcessMappings::vdso`). 0 when
    /// unknown (the tables are then taken as they are).
    pub task_mm_offset: u32,
    pub mm_vdso_offset: u32,
    /// Byte offset of `task_struct::self_exec_id`: the image a stack was taken in (see
    /// [`exec_id`]). 0 when unknown (every stack is then taken for its process's last image).
    pub task_exec_id_offset: u32,
}
shared!(Config, 4 + 4 + 8 + 4 + 4 + TASK_COMM_LEN + 24 * 4);

/// Result recorded for a stack that could not be stored in the `STACKS` map.
pub mod stack {
    /// The sample has no stack of this kind (user-mode sample: no kernel stack; kernel thread:
    /// no user stack). Not an error.
    pub const NONE: i32 = -1;
    /// The stack existed but was dropped: its bucket was taken in both its map and the
    /// overflow.
    pub const LOST: i32 = -2;
    /// Marks an id in a stack map's overflow map (see `names::STACKS_OVERFLOW`); below the
    /// ids userspace gives the stacks it rebuilds (1 << 30).
    pub const OVERFLOW: i32 = 1 << 29;
    /// Marks an id in the unwinder's stack map (`unwind::STACKS`): a user stack walked with
    /// the unwind tables rather than by frame pointers.
    pub const UNWOUND: i32 = 1 << 28;
    /// The bits of an unwound stack's id below the mark.
    pub const UNWOUND_ID_MASK: u32 = (1 << 28) - 1;
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
    /// Syscalls not counted: `SYSCALLS` was full and their number past `SYSCALLS_BY_NR`'s.
    SyscallsLost = 6,
    /// Scheduler events dropped (a map was full, or task storage was unavailable).
    SchedLost = 7,
    /// Off-CPU intervals dropped because `OFFCPU` was full.
    OffCpuLost = 8,
    /// Probed calls not counted because `CALLS` was full.
    CallsLost = 9,
    /// Call events dropped because the ring buffer was full.
    CallEventsLost = 10,
    /// Page faults not counted (a map was full).
    FaultsLost = 11,
    /// Allocations not counted (a map was full).
    AllocsLost = 12,
    /// Page-fault stacks lost, user or kernel (`FAULT_TRACES` full or id collision), or their
    /// count (`FAULT_STACKS` full): the fault counts stay exact, the fault profile is computed
    /// from the stacks kept.
    FaultStacksLost = 13,
    /// Waits whose waker was not kept (`WAKES` full): the who-woke-whom table is of the rest.
    WakesLost = 14,
    /// Timeline events dropped because its ring buffer was full (the timeline only: every
    /// figure comes from the aggregated maps).
    TimelineLost = 15,
    /// Switches that showed a traced task arriving on a CPU and none its leaving: the kernel
    /// hides that process's own events (a sandbox's agent), so it is not profiled.
    SwitchesUnseen = 16,
    /// Allocations counted but not tracked as live blocks (`LIVE_ALLOCS` full): in the totals
    /// and their call sites, not in the live bytes nor the in-use profile.
    AllocsUntracked = 17,
    /// Failed syscalls whose errno was not kept (`SYSCALL_ERRORS` full): in their syscall's
    /// failures, not in its failures by errno.
    ErrnosLost = 18,
    /// Waits, system calls and probed calls not sent to the timeline because they were shorter
    /// than the minimum its bound had raised (`names::TIMELINE_RAISED_MIN`): userspace would
    /// have dropped them, and counts them with what it dropped.
    TimelineThinned = 19,
}

impl Counter {
    /// Number of slots in the `COUNTERS` array (room for counters later programs add).
    pub const SLOTS: u32 = 32;

    /// Whether it counts what was lost (a map or ring full), as the live status sums them: not
    /// the samples, nor switches the kernel hid, nor blocks counted but not tracked as live.
    pub const fn is_loss(self) -> bool {
        !matches!(
            self,
            Counter::CpuSamples
                | Counter::SwitchesUnseen
                | Counter::AllocsUntracked
                | Counter::TimelineThinned
        )
    }

    /// Every counter, in slot order.
    pub const ALL: [Counter; 20] = [
        Counter::CpuSamples,
        Counter::CpuSamplesLost,
        Counter::UserStacksLost,
        Counter::KernelStacksLost,
        Counter::ProcessEventsLost,
        Counter::TargetsFull,
        Counter::SyscallsLost,
        Counter::SchedLost,
        Counter::OffCpuLost,
        Counter::CallsLost,
        Counter::CallEventsLost,
        Counter::FaultsLost,
        Counter::AllocsLost,
        Counter::FaultStacksLost,
        Counter::WakesLost,
        Counter::TimelineLost,
        Counter::SwitchesUnseen,
        Counter::AllocsUntracked,
        Counter::ErrnosLost,
        Counter::TimelineThinned,
    ];
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;

    #[test]
    fn the_losses_are_the_counters_named_so() {
        // A counter added later lands on the right side of the live status's "lost" by its name.
        for counter in Counter::ALL {
            let name = std::format!("{counter:?}");
            assert_eq!(counter.is_loss(), name.ends_with("Lost") || name.ends_with("Full"), "{name}");
        }
    }

    #[test]
    fn histogram_buckets_tile_the_values() {
        use histogram::*;
        // Every value falls in the range of its bucket, and consecutive buckets touch.
        for value in (0..5000u64).chain([1 << 20, 999_999, 1_000_000, 123_456_789, 1 << 41]) {
            let (low, high) = bucket_range(bucket_of(value));
            assert!(low <= value && value < high, "{value} outside bucket {}", bucket_of(value));
        }
        for index in 1..BUCKETS {
            assert_eq!(bucket_range(index - 1).1, bucket_range(index).0, "gap before bucket {index}");
        }
        // Exact below 16, then at most 12.5% wide.
        assert_eq!(bucket_range(bucket_of(15)), (15, 16));
        for index in 16..BUCKETS {
            let (low, high) = bucket_range(index);
            assert!((high - low) * 8 <= low, "bucket {index} is {low}..{high}");
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert!(bucket_range(BUCKETS - 1).0 >= 1 << 41);
    }

    #[test]
    fn counters_fit_their_array() {
        for (slot, counter) in Counter::ALL.iter().enumerate() {
            assert_eq!(*counter as usize, slot);
        }
        assert!((Counter::ALL.len() as u32) <= Counter::SLOTS);
    }
}
