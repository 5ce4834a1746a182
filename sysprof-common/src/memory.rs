//! The memory families' shared types: address-space changes, page-fault stacks, and the heap.

use core::mem::size_of;

use crate::histogram::LatencyHistogram;

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
shared!(AddressSpace, 11 * 8);

/// Key of sampled page-fault stacks.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FaultKey {
    pub tgid: u32,
    /// 1 for a major fault (it read from disk), 0 for a minor one.
    pub major: u32,
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
    /// The image the stacks were taken in (see [`crate::exec_id`]); last, as in
    /// [`crate::SampleKey`].
    pub exec_id: u32,
}
shared!(FaultKey, 20);

/// On every CPU's fault events (`--all`, `--comm`, a cgroup), where a program runs for every
/// fault anyway: the minor faults of each process whose stacks are all taken; past them, 1 in
/// `Config::fault_stack_every`, each standing for as many. On the targets' own events, the
/// event's period picks 1 in `fault_stack_every` from the first (no program runs for the
/// others, which is what makes them cheap). Every major fault's stack is taken.
pub const FAULT_STACKS_ALL: u64 = 16;

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
    /// The image the stack and the caller were taken in (see [`crate::exec_id`]); last, as in
    /// [`crate::SampleKey`].
    pub exec_id: u32,
    pub _pad: u32,
}
shared!(AllocKey, 24);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocStats {
    pub count: u64,
    pub bytes: u64,
}
shared!(AllocStats, 16);

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
shared!(ProcessAllocs, 6 * 8 + size_of::<LatencyHistogram>());

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LiveKey {
    pub tgid: u32,
    pub _pad: u32,
    pub ptr: u64,
}
shared!(LiveKey, 16);

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveAlloc {
    pub size: u64,
    pub caller: u64,
    pub user_stack_id: i32,
    /// The image the stack and the caller were taken in (see [`crate::exec_id`]).
    pub exec_id: u32,
}
shared!(LiveAlloc, 24);
