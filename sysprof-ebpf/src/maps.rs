//! Maps shared by several program families. Names match `sysprof_common::names`.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf, StackTrace},
};
use sysprof_common::{Counter, capacity};

/// Stack id -> frame addresses, for kernel and user stacks alike.
#[map]
pub static STACKS: StackTrace = StackTrace::with_max_entries(capacity::STACKS, 0);

/// tgid -> 1 for the processes being profiled (filter::TARGETS).
#[map]
pub static TARGETS: HashMap<u32, u8> = HashMap::with_max_entries(capacity::TARGETS, 0);

/// Bumped on every change to `TARGETS` (by the programs and by userspace).
#[map]
pub static TARGETS_GENERATION: Array<u64> = Array::with_max_entries(1, 0);

/// What the programs saw and lost, per CPU, indexed by `Counter`.
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::SLOTS, 0);

/// Process life-cycle events for userspace.
#[map]
pub static PROCESS_EVENTS: RingBuf = RingBuf::with_byte_size(capacity::PROCESS_EVENTS, 0);
