//! Maps shared by several program families. Names match `sysprof_common::names`.

use aya_ebpf::{
    bindings::{BPF_F_USER_STACK, BPF_NOEXIST},
    macros::map,
    maps::{Array, HashMap, StackTrace},
    programs::{PerfEventContext, tracing::StackIdContext},
};
use sysprof_common::{Counter, capacity, stack};

use crate::{atomic, counters};

/// Stack id -> frame addresses, for kernel and user stacks alike.
#[map]
pub static STACKS: StackTrace = StackTrace::with_max_entries(capacity::STACKS, 0);

/// The same for the on-CPU samples, apart (see `sysprof_common::names::CPU_STACKS`).
#[map]
pub static CPU_STACKS: StackTrace = StackTrace::with_max_entries(capacity::STACKS, 0);

/// The page faults' stacks, apart (see `sysprof_common::names::FAULT_TRACES`).
#[map]
pub static FAULT_TRACES: StackTrace = StackTrace::with_max_entries(capacity::STACKS, 0);

/// Each stack map's overflow (see `sysprof_common::names::STACKS_OVERFLOW`); the loader sizes
/// them.
#[map]
pub static STACKS_OVERFLOW: StackTrace = StackTrace::with_max_entries(capacity::STACKS / 4, 0);
#[map]
pub static CPU_STACKS_OVERFLOW: StackTrace = StackTrace::with_max_entries(capacity::STACKS / 4, 0);
#[map]
pub static FAULT_TRACES_OVERFLOW: StackTrace = StackTrace::with_max_entries(capacity::STACKS / 4, 0);

/// tgid -> 1 for the processes being profiled (filter::TARGETS): the list userspace reads.
#[map]
pub static TARGETS: HashMap<u32, u8> = HashMap::with_max_entries(capacity::TARGETS, 0);

/// The same set as bits by process id, which the programs test (see
/// `sysprof_common::names::TARGET_BITS`).
#[map]
pub static TARGET_BITS: Array<u64> =
    Array::with_max_entries(capacity::TARGET_BITS_WORDS, aya_ebpf::bindings::BPF_F_MMAPABLE);

/// Adds `n` to the count under `key`, creating it at `n`; false when the map is full (the
/// caller counts the loss its own way).
#[inline(always)]
pub fn add_count<K>(map: &HashMap<K, u64>, key: &K, n: u64) -> bool {
    if let Some(count) = map.get_ptr_mut(key) {
        atomic::add(count, n);
        return true;
    }
    if map.insert(key, n, BPF_NOEXIST as u64).is_ok() {
        return true;
    }
    // Another CPU inserted it first, or the map is full.
    match map.get_ptr_mut(key) {
        Some(count) => {
            atomic::add(count, n);
            true
        }
        None => false,
    }
}

/// Whether a perf event (a sample, a page fault) interrupted user mode. Its kernel stack is
/// then empty: `bpf_get_stackid` would find nothing and answer -EFAULT (`stack::NONE`), yet
/// the asking cost a sample about 2.7 us here (kernel BPF statistics), so the callers do not.
#[inline(always)]
pub fn interrupted_user_mode(ctx: &PerfEventContext) -> bool {
    // SAFETY: the context is the event's `bpf_perf_event_data`, whose registers the verifier
    // lets the program read.
    #[cfg(bpf_target_arch = "x86_64")]
    return unsafe { (*ctx.ctx).regs.cs } & 3 == 3;
    // SAFETY: as above; EL0 in the saved PSTATE's mode bits.
    #[cfg(bpf_target_arch = "aarch64")]
    return unsafe { (*ctx.ctx).regs.pstate } & 0xf == 0;
    #[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
    {
        let _ = ctx;
        false
    }
}

/// -EFAULT: `bpf_get_stackid` found no stack of the asked kind.
const EFAULT: i32 = -14;
/// -EEXIST: the stack's bucket holds another stack.
const EEXIST: i32 = -17;

/// The id in `STACKS` of the current stack (`flags`: 0 for the kernel's, `BPF_F_USER_STACK`
/// for the user's), or a `stack::` marker saying why there is none. A stack the map could not
/// keep is counted as lost.
#[inline(always)]
pub fn stack_id<C: StackIdContext>(ctx: &C, flags: u64) -> i32 {
    stack_id_counted(&STACKS, &STACKS_OVERFLOW, ctx, flags, lost_counter(flags))
}

/// [`stack_id`] in the on-CPU samples' stack maps.
#[inline(always)]
pub fn cpu_stack_id<C: StackIdContext>(ctx: &C, flags: u64) -> i32 {
    stack_id_counted(&CPU_STACKS, &CPU_STACKS_OVERFLOW, ctx, flags, lost_counter(flags))
}

#[inline(always)]
fn lost_counter(flags: u64) -> Counter {
    if flags & u64::from(BPF_F_USER_STACK) != 0 { Counter::UserStacksLost } else { Counter::KernelStacksLost }
}

/// The id of the current stack in `map`, or in `overflow` (marked `stack::OVERFLOW`) when its
/// bucket in `map` holds another stack; a stack neither could keep is counted under `lost`. A
/// user stack of a process with unwind tables is walked with them instead (`unwind.rs`).
#[inline(always)]
pub fn stack_id_counted<C: StackIdContext>(
    map: &StackTrace,
    overflow: &StackTrace,
    ctx: &C,
    flags: u64,
    lost: Counter,
) -> i32 {
    if flags & u64::from(BPF_F_USER_STACK) != 0
        && let Some(id) = crate::unwind::user_stack_id()
    {
        if id == stack::LOST {
            counters::add(lost, 1);
        }
        return id;
    }
    let id = match ctx.get_stackid(map, flags) {
        Err(EEXIST) => ctx.get_stackid(overflow, flags).map(|id| id as i32 | stack::OVERFLOW),
        other => other.map(|id| id as i32),
    };
    match id {
        Ok(id) => id,
        Err(EFAULT) => stack::NONE,
        Err(_) => {
            counters::add(lost, 1);
            stack::LOST
        }
    }
}
