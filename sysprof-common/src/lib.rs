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
    /// Hash: [`crate::SyscallKey`] -> [`crate::SyscallStats`].
    pub const SYSCALLS: &str = "SYSCALLS";
    /// Per-CPU array of one [`crate::SyscallSlot`].
    pub const SYSCALL_SLOT: &str = "SYSCALL_SLOT";
    /// Hash: [`crate::SyscallErrorKey`] -> count of failed calls.
    pub const SYSCALL_ERRORS: &str = "SYSCALL_ERRORS";
    /// Hash: thread id -> [`crate::ThreadSched`].
    pub const THREAD_SCHED: &str = "THREAD_SCHED";
    /// Hash: tgid -> [`crate::LatencyHistogram`] of run-queue latency.
    pub const RUNQ_LATENCY: &str = "RUNQ_LATENCY";
    /// Hash: [`crate::OffCpuKey`] -> [`crate::OffCpuValue`].
    pub const OFFCPU: &str = "OFFCPU";
    /// Task local storage of the scheduler and syscall programs (kernel side only).
    pub const TASK_STATE: &str = "TASK_STATE";
    /// Hash: [`crate::CallKey`] -> [`crate::CallStats`] for probed library and user functions.
    pub const CALLS: &str = "CALLS";
    /// Ring buffer of [`crate::CallEvent`]s (calls whose arguments matter).
    pub const CALL_EVENTS: &str = "CALL_EVENTS";
    /// Hash: tgid -> [`crate::AddressSpace`].
    pub const ADDRESS_SPACE: &str = "ADDRESS_SPACE";
    /// Hash: tgid << 1 | major -> page faults (exact).
    pub const FAULT_COUNTS: &str = "FAULT_COUNTS";
    /// Hash: [`crate::FaultKey`] -> sampled faults (weighted).
    pub const FAULT_STACKS: &str = "FAULT_STACKS";
    /// Hash: [`crate::AllocKey`] -> [`crate::AllocStats`] (bytes allocated by call site).
    pub const ALLOC_STACKS: &str = "ALLOC_STACKS";
    /// Hash: tgid -> [`crate::ProcessAllocs`].
    pub const PROCESS_ALLOCS: &str = "PROCESS_ALLOCS";
    /// LRU hash: [`crate::LiveKey`] -> [`crate::LiveAlloc`]: allocations not freed yet.
    pub const LIVE_ALLOCS: &str = "LIVE_ALLOCS";
    /// Array with one u64: bumped whenever the target set changes, so per-CPU caches of
    /// "is this process a target" know to decide again.
    pub const TARGETS_GENERATION: &str = "TARGETS_GENERATION";
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
    /// Distinct (process, syscall) pairs.
    pub const SYSCALLS: u32 = 16 * 1024;
    /// Distinct (process, syscall, errno) triples.
    pub const SYSCALL_ERRORS: u32 = 16 * 1024;
    /// Threads with scheduler statistics.
    pub const THREAD_SCHED: u32 = 32 * 1024;
    /// Processes with a run-queue latency histogram.
    pub const RUNQ_LATENCY: u32 = 4 * 1024;
    /// Distinct (process, off-CPU stacks, state) keys.
    pub const OFFCPU: u32 = 32 * 1024;
    /// Distinct (process, function, call site, detail) keys of probed calls.
    pub const CALLS: u32 = 16 * 1024;
    /// Bytes of the call-event ring buffer.
    pub const CALL_EVENTS: u32 = 4 * 1024 * 1024;
    pub const ADDRESS_SPACE: u32 = 4 * 1024;
    pub const FAULT_COUNTS: u32 = 8 * 1024;
    pub const FAULT_STACKS: u32 = 32 * 1024;
    pub const ALLOC_STACKS: u32 = 32 * 1024;
    pub const PROCESS_ALLOCS: u32 = 4 * 1024;
    /// Live allocations tracked at once with --malloc (least recently used ones are forgotten
    /// beyond it). The map is preallocated: about 25 MiB of kernel memory.
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
    /// `bpf_ktime_get_ns` when the programs were loaded: on-CPU time of a thread already
    /// running then is counted from here.
    pub start_ns: u64,
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
    /// Page-fault stacks are taken for 1 fault in this many (counts stay exact).
    pub fault_stack_every: u32,
    /// sysprof's own process: never a target, whatever the filter says (a `--cgroup` or
    /// `--comm` it falls in, `--all`, a `--pid` it descends from), except while it measures its
    /// own probe cost with itself in `TARGETS`.
    pub self_tgid: u32,
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

/// Log-linear latency buckets: exact below 16 ns, then 8 buckets per power of two (at most
/// 12.5% wide), up to 2^42 ns (73 minutes); longer values share the last bucket. The kernel
/// side counts into them with [`histogram::bucket_of`]; userspace turns each bucket back into
/// its range with [`histogram::bucket_range`], so the conversion to an HDR histogram loses
/// nothing the kernel kept.
pub mod histogram {
    /// Sub-buckets per power of two, as a power of two.
    pub const SUB_BITS: u32 = 3;
    /// Number of buckets.
    pub const BUCKETS: usize = 320;

    /// The bucket of a value in nanoseconds.
    #[inline(always)]
    pub fn bucket_of(value: u64) -> usize {
        const LINEAR: u64 = 1 << (SUB_BITS + 1);
        if value < LINEAR {
            return value as usize;
        }
        let log = 63 - value.leading_zeros();
        let sub = (value >> (log - SUB_BITS)) & ((1 << SUB_BITS) - 1);
        let index = (((log - SUB_BITS + 1) as u64) << SUB_BITS) + sub;
        if index >= BUCKETS as u64 { BUCKETS - 1 } else { index as usize }
    }

    /// The values `[low, high)` a bucket holds.
    pub fn bucket_range(index: usize) -> (u64, u64) {
        const LINEAR: usize = 1 << (SUB_BITS + 1);
        if index < LINEAR {
            return (index as u64, index as u64 + 1);
        }
        let log = (index >> SUB_BITS) as u32 + SUB_BITS - 1;
        let sub = (index & ((1 << SUB_BITS) - 1)) as u64;
        let step = 1u64 << (log - SUB_BITS);
        let low = ((1 << SUB_BITS) + sub) << (log - SUB_BITS);
        (low, low + step)
    }
}

/// A latency distribution aggregated in the kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyHistogram {
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    /// Counts per [`histogram`] bucket.
    pub buckets: [u32; histogram::BUCKETS],
}

/// Key of the syscall statistics: one syscall of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SyscallKey {
    pub tgid: u32,
    /// Syscall number of the running architecture.
    pub nr: u32,
}

/// Calls, failures and latency of one syscall of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyscallStats {
    /// Every call (exact).
    pub calls: u64,
    /// Calls that returned an error, -4095..-1 (exact).
    pub errors: u64,
    /// Calls timed from entry; in bursts one stands for `syscall_sample_every`.
    pub timed: u64,
    /// Calls not sampled that then blocked (left the CPU): timed from the moment they blocked.
    pub timed_from_block: u64,
    /// Latency, weighted: its count and total estimate all calls when latency was sampled.
    pub latency: LatencyHistogram,
}

/// Calls of one syscall counted on one CPU and not yet added to the shared statistics.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingCount {
    pub tgid: u32,
    pub nr: u32,
    pub count: u32,
    pub _pad: u32,
}

/// Entries of the per-CPU pending-count cache (a power of two).
pub const PENDING_COUNTS: usize = 4;

/// One syscall in progress.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InFlight {
    pub tgid: u32,
    pub nr: u32,
    /// Start, or 0 when this call was not sampled (yet: it is timed if it blocks).
    pub start_ns: u64,
    /// How many calls this timing stands for.
    pub weight: u32,
    /// 1 while the call is in progress.
    pub active: u32,
    /// 1 when timed from the moment it blocked rather than from entry.
    pub from_block: u32,
    pub _pad: u32,
    /// The first three arguments, for the address-space syscalls only (else zero).
    pub args: [u64; 3],
}

/// The syscall programs' per-CPU state: the call in flight on this CPU, the stretch of calls
/// of the thread on it, and counts not yet moved to the shared map (userspace adds those at
/// the end).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallSlot {
    pub tid: u32,
    /// Calls the thread made since it last got this CPU.
    pub stretch_calls: u32,
    pub call: InFlight,
    pub pending: [PendingCount; PENDING_COUNTS],
}

/// Key of the failed-call counts: one errno of one syscall of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SyscallErrorKey {
    pub tgid: u32,
    pub nr: u32,
    pub errno: u32,
    pub _pad: u32,
}

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
    pub oncpu_ns: u64,
    pub offcpu_ns: u64,
    pub last_switch_in_ns: u64,
    pub comm: [u8; TASK_COMM_LEN],
}

/// Key of off-CPU time: where a thread was (its stacks) and why (its state) when it left the CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OffCpuKey {
    pub tgid: u32,
    /// `sched_switch` prev_state: 0 or [`TASK_REPORT_MAX`] preempted, else the sleep state.
    pub state: u32,
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
}

/// `prev_state` of a task preempted inside the kernel (`TASK_REPORT_MAX`).
pub const TASK_REPORT_MAX: u32 = 0x100;

/// Time spent off CPU under one [`OffCpuKey`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuValue {
    pub total_ns: u64,
    pub count: u64,
}

/// Probed calls (uprobes on libcudart, libcuda, libnccl and `--func` functions). Each
/// attachment carries a cookie: the function's id in the low 16 bits, [`call`] flags above.
pub mod call {
    /// Mask of the function id in a cookie.
    pub const ID_MASK: u64 = 0xffff;
    /// Send a [`crate::CallEvent`] with the arguments (transfers, allocations, NCCL, ...);
    /// otherwise the call is only counted and timed in `CALLS`.
    pub const EVENT: u64 = 1 << 16;
    /// Argument 0 points to where the function writes its result (an allocation's address, a
    /// communicator): read it at return.
    pub const OUT_ARG0: u64 = 1 << 17;
    /// Argument 0 is a `cudaMemcpy3DParms*`: the kernel side copies what the transfer needs
    /// into the event's arguments (see [`MEMCPY3D`]).
    pub const MEMCPY3D_PARAMS: u64 = 1 << 18;
    /// A negative return is an error (user functions); otherwise any non-zero return is
    /// (cudaError_t, CUresult, ncclResult_t).
    pub const ERROR_IF_NEGATIVE: u64 = 1 << 19;
    /// Key the statistics by argument 0 (the kernel launched), or by argument 1.
    pub const DETAIL_ARG0: u64 = 1 << 20;
    pub const DETAIL_ARG1: u64 = 1 << 21;

    /// Where `cudaMemcpy3DParms` fields land in a [`crate::CallEvent`]'s `args` (argument 0 stays
    /// the pointer): source pointer, width in bytes, height, depth, kind, destination pointer.
    pub mod memcpy3d {
        pub const SRC: usize = 1;
        pub const WIDTH: usize = 2;
        pub const HEIGHT: usize = 3;
        pub const DEPTH: usize = 4;
        pub const KIND: usize = 5;
        pub const DST: usize = 6;
    }

    /// Byte offsets in `struct cudaMemcpy3DParms` (CUDA 11 and 12, 64-bit).
    pub mod memcpy3d_offsets {
        pub const SRC_PTR: u64 = 32;
        pub const DST_PTR: u64 = 96;
        pub const EXTENT: u64 = 128;
        pub const KIND: u64 = 152;
    }
}

/// Key of probed-call statistics: one function, one call site, one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CallKey {
    pub tgid: u32,
    /// Function id (the cookie's low bits).
    pub func: u32,
    pub user_stack_id: i32,
    pub _pad: u32,
    /// What [`call::DETAIL_ARG0`]/[`call::DETAIL_ARG1`] chose (the kernel launched), else 0.
    pub detail: u64,
    /// The return address: the exact instruction after the call. A frame-pointer walk from a
    /// function's first instruction skips the immediate caller; this does not.
    pub caller: u64,
}

/// Count, errors and latency of one [`CallKey`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallStats {
    pub errors: u64,
    pub latency: LatencyHistogram,
}

/// One completed call whose arguments matter.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallEvent {
    pub func: u32,
    pub tgid: u32,
    pub tid: u32,
    pub user_stack_id: i32,
    /// `bpf_ktime_get_ns` at entry.
    pub start_ns: u64,
    pub duration_ns: u64,
    /// The return value, as the function's ABI returns it (read the low 32 bits for an `int`).
    pub ret: i64,
    /// The first eight arguments (registers, then the stack).
    pub args: [u64; 8],
    /// The value read through argument 0 at return ([`call::OUT_ARG0`]), else 0.
    pub out: u64,
    /// The return address (see [`CallKey::caller`]).
    pub caller: u64,
}

/// Address-space changes of one process, from the syscalls' arguments.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddressSpace {
    pub mmap_calls: u64,
    pub mmap_bytes: u64,
    pub munmap_calls: u64,
    pub munmap_bytes: u64,
    pub brk_calls: u64,
    pub brk_grow_bytes: u64,
    pub brk_shrink_bytes: u64,
    pub mremap_calls: u64,
    pub mremap_grow_bytes: u64,
    pub mremap_shrink_bytes: u64,
    /// The break after the last brk (to measure the next one's change).
    pub last_brk: u64,
}

/// Key of sampled page-fault stacks.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FaultKey {
    pub tgid: u32,
    /// 1 for a major fault (it read from disk), 0 for a minor one.
    pub major: u32,
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
}

/// The allocator functions `--malloc` probes; the uprobe cookie says which.
pub mod alloc {
    pub const MALLOC: u64 = 1;
    pub const CALLOC: u64 = 2;
    pub const REALLOC: u64 = 3;
    /// aligned_alloc(alignment, size), memalign(alignment, size).
    pub const ALIGNED: u64 = 4;
    /// posix_memalign(void **out, alignment, size).
    pub const POSIX_MEMALIGN: u64 = 5;
}

/// Allocations of one call site of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AllocKey {
    pub tgid: u32,
    pub user_stack_id: i32,
    /// Return address of the allocator call: the caller, which a frame-pointer walk started
    /// at the allocator's first instruction skips.
    pub caller: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocStats {
    pub count: u64,
    pub bytes: u64,
}

/// Heap activity of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessAllocs {
    pub allocs: u64,
    pub frees: u64,
    pub bytes: u64,
    /// Bytes allocated and not freed (of the allocations sysprof saw).
    pub live: u64,
    pub peak_live: u64,
    /// Frees of memory allocated before the trace (or forgotten beyond LIVE_ALLOCS).
    pub untracked_frees: u64,
    /// Allocation sizes, in the latency histogram's log-linear buckets (bytes, not ns).
    pub sizes: LatencyHistogram,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LiveKey {
    pub tgid: u32,
    pub _pad: u32,
    pub ptr: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveAlloc {
    pub size: u64,
    pub caller: u64,
    pub user_stack_id: i32,
    pub _pad: u32,
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
    /// Syscall statistics dropped because `SYSCALLS` was full.
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
}

impl Counter {
    /// Number of slots in the `COUNTERS` array (room for counters later programs add).
    pub const SLOTS: u32 = 32;
    /// Every counter, in slot order.
    pub const ALL: [Counter; 13] = [
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
    ];
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: each type is #[repr(C)], made only of integers and integer arrays, with no padding
    // (sizes are checked in the tests below), so every bit pattern is a valid value.
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::SampleKey {}
    unsafe impl aya::Pod for super::ProcessEvent {}
    unsafe impl aya::Pod for super::LatencyHistogram {}
    unsafe impl aya::Pod for super::SyscallKey {}
    unsafe impl aya::Pod for super::SyscallStats {}
    unsafe impl aya::Pod for super::SyscallErrorKey {}
    unsafe impl aya::Pod for super::SyscallSlot {}
    unsafe impl aya::Pod for super::CallKey {}
    unsafe impl aya::Pod for super::CallStats {}
    unsafe impl aya::Pod for super::CallEvent {}
    unsafe impl aya::Pod for super::AddressSpace {}
    unsafe impl aya::Pod for super::FaultKey {}
    unsafe impl aya::Pod for super::AllocKey {}
    unsafe impl aya::Pod for super::AllocStats {}
    unsafe impl aya::Pod for super::ProcessAllocs {}
    unsafe impl aya::Pod for super::LiveKey {}
    unsafe impl aya::Pod for super::LiveAlloc {}
    unsafe impl aya::Pod for super::ThreadSched {}
    unsafe impl aya::Pod for super::OffCpuKey {}
    unsafe impl aya::Pod for super::OffCpuValue {}
}

/// Every shared type is exactly its fields, with no padding the two sides could disagree on
/// (checked at compile time, on both sides).
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<Config>() == 4 + 4 + 8 + 4 + 4 + TASK_COMM_LEN + 8 + 10 * 4);
    assert!(size_of::<SampleKey>() == 4 * 4 + TASK_COMM_LEN);
    assert!(size_of::<ProcessEvent>() == 4 * 4 + 8 + TASK_COMM_LEN);
    assert!(size_of::<LatencyHistogram>() == 3 * 8 + 4 * histogram::BUCKETS);
    assert!(size_of::<SyscallStats>() == size_of::<LatencyHistogram>() + 4 * 8);
    assert!(size_of::<SyscallErrorKey>() == 16);
    assert!(size_of::<InFlight>() == 56);
    assert!(size_of::<CallKey>() == 32);
    assert!(size_of::<AddressSpace>() == 11 * 8);
    assert!(size_of::<FaultKey>() == 16);
    assert!(size_of::<ProcessAllocs>() == 6 * 8 + size_of::<LatencyHistogram>());
    assert!(size_of::<LiveKey>() == 16);
    assert!(size_of::<AllocKey>() == 16);
    assert!(size_of::<LiveAlloc>() == 24);
    assert!(size_of::<CallStats>() == 8 + size_of::<LatencyHistogram>());
    assert!(size_of::<CallEvent>() == 4 * 4 + 3 * 8 + 8 * 8 + 2 * 8);
    assert!(size_of::<SyscallSlot>() == 8 + 56 + 16 * PENDING_COUNTS);
    assert!(size_of::<ThreadSched>() == 2 * 4 + 5 * 8 + TASK_COMM_LEN);
    assert!(size_of::<OffCpuKey>() == 16);
};

#[cfg(test)]
mod tests {
    use super::*;

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
