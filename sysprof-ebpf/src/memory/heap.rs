//! The heap, with `--malloc`: every malloc/calloc/realloc/free of the allocator the target
//! uses, aggregated in the kernel by call site, with live and peak bytes per process.

use aya_ebpf::{
    EbpfContext as _,
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    helpers::{bpf_probe_read_user, generated::bpf_get_attach_cookie},
    macros::{map, uprobe, uretprobe},
    maps::{Array, HashMap},
    programs::{ProbeContext, RetProbeContext},
};
use sysprof_common::{AllocKey, AllocStats, Counter, LiveAlloc, LiveKey, ProcessAllocs, alloc, capacity};

use crate::{
    atomic, counters,
    histogram::record,
    nesting::Nesting,
    target,
    task_state::{StackCache, TaskStorage},
};

#[map]
static ALLOC_STACKS: HashMap<AllocKey, AllocStats> = HashMap::with_max_entries(capacity::ALLOC_STACKS, 0);

#[map]
static PROCESS_ALLOCS: HashMap<u32, ProcessAllocs> =
    HashMap::with_max_entries(capacity::PROCESS_ALLOCS, BPF_F_NO_PREALLOC);

#[map]
static ZERO_PROCESS_ALLOCS: Array<ProcessAllocs> = Array::with_max_entries(1, 0);

/// The blocks live now. A plain preallocated hash, not an LRU one: an LRU insert took 180 ns
/// a malloc here against 50 (kernel statistics, `memload mallocs`), and when the table is full
/// an LRU forgets the blocks not touched for longest, which are the leaks this table is for.
/// Full, a new block is counted everywhere but the live bytes (`AllocsUntracked`).
#[map]
static LIVE_ALLOCS: HashMap<LiveKey, LiveAlloc> = HashMap::with_max_entries(capacity::LIVE_ALLOCS, 0);

/// The allocation in progress on a thread.
#[repr(C)]
pub struct AllocInFlight {
    kind: u64,
    size: u64,
    /// realloc's old pointer, posix_memalign's out pointer.
    pointer: u64,
    caller: u64,
    nesting: Nesting,
    user_stack_id: i32,
    /// Its process, for the return (a helper call less there).
    tgid: u32,
    /// The thread's stack where it last allocated: a loop allocating from one place takes it
    /// once, not once per call.
    stack: StackCache,
}

#[aya_ebpf::macros::btf_map]
static ALLOC_STATE: TaskStorage<AllocInFlight> = TaskStorage::new();

/// An allocator's entry, attached one function at a time (a perf-event uprobe each).
#[uprobe]
pub fn alloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx)
}

/// `alloc_enter` for a multi-uprobe link (Linux 6.6+): an allocator's functions in one link,
/// which detaches in one kernel grace period, not one per function (see `calls.rs`).
#[uprobe(multi)]
pub fn alloc_enter_multi(ctx: ProbeContext) -> u32 {
    enter(&ctx)
}

#[inline(always)]
fn enter(ctx: &ProbeContext) -> u32 {
    let Some(pid_tgid) = target::current_target() else { return 0 };
    let tgid = (pid_tgid >> 32) as u32;
    if !crate::window::open_or_calibrating(tgid) {
        return 0;
    }
    let Some(state) = ALLOC_STATE.current(true) else { return 0 };
    if !state.nesting.enter(crate::calls::stack_pointer(ctx)) {
        // realloc calling malloc inside the allocator: counted once.
        return 0;
    }
    // SAFETY: plain helper call on this program's context.
    let kind = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let arg = |n: usize| ctx.arg::<u64>(n).unwrap_or(0);
    let (size, pointer) = match kind {
        alloc::CALLOC => (calloc_bytes(arg(0), arg(1)), 0),
        alloc::REALLOC => (arg(1), arg(0)),
        alloc::ALIGNED => (arg(1), 0),
        alloc::POSIX_MEMALIGN => (arg(2), arg(0)),
        _ => (arg(0), 0),
    };
    state.kind = kind;
    state.tgid = tgid;
    state.size = size;
    state.pointer = pointer;
    let entry = crate::unwind::probe_entry(ctx, tgid);
    state.caller = crate::calls::caller(ctx, &entry);
    state.user_stack_id = state.stack.user_stack(ctx, &entry, false);
    0
}

/// calloc's `count * size`, u64::MAX when it overflows (the allocator fails such a request).
/// Done in 32-bit halves: LLVM turns the obvious overflow checks into 128-bit arithmetic,
/// which BPF does not have.
#[inline(always)]
fn calloc_bytes(count: u64, size: u64) -> u64 {
    let (small, big) = if count < size { (count, size) } else { (size, count) };
    if small >> 32 != 0 {
        return u64::MAX;
    }
    let high = (big >> 32) * small;
    if high >> 32 != 0 {
        return u64::MAX;
    }
    let low = (big & 0xffff_ffff) * small;
    let bytes = (high << 32).wrapping_add(low);
    if bytes < low { u64::MAX } else { bytes }
}

/// An allocator's return (see `alloc_enter`).
#[uretprobe]
pub fn alloc_return(ctx: RetProbeContext) -> u32 {
    leave(&ctx)
}

/// `alloc_return` for a multi-uprobe link (see `alloc_enter_multi`).
#[uretprobe(multi)]
pub fn alloc_return_multi(ctx: RetProbeContext) -> u32 {
    leave(&ctx)
}

#[inline(always)]
fn leave(ctx: &RetProbeContext) -> u32 {
    let Some(state) = ALLOC_STATE.current(false) else { return 0 };
    if !state.nesting.leave() {
        return 0;
    }
    let tgid = state.tgid;
    let ptr = returned_block(state, ctx.ret());
    // realloc moved (or freed) the old block.
    if state.kind == alloc::REALLOC && state.pointer != 0 && (ptr != 0 || state.size == 0) {
        forget(tgid, state.pointer);
    }
    if ptr == 0 {
        return 0;
    }
    // The process first: a block of a process without totals (the map full) is not tracked
    // either, as its free could not take its bytes back.
    let Some(process) = process_allocs(tgid) else {
        counters::add(Counter::AllocsLost, 1);
        return 0;
    };
    // The image of the entry's stack: a call returns in the image it began in.
    let exec_id = crate::process::current_exec_id();
    let live = LiveAlloc { size: state.size, caller: state.caller, user_stack_id: state.user_stack_id, exec_id };
    let tracked = LIVE_ALLOCS.insert(LiveKey { tgid, _pad: 0, ptr }, live, 0).is_ok();
    if !tracked {
        counters::add(Counter::AllocsUntracked, 1);
    }
    // SAFETY: map value pointer valid for this run.
    add_to_process(unsafe { &mut *process }, state.size, tracked);
    add_to_site(
        AllocKey { tgid, user_stack_id: state.user_stack_id, caller: state.caller, exec_id, _pad: 0 },
        state.size,
    );
    0
}

/// The block the call returned (posix_memalign writes it through its first argument), or 0.
#[inline(always)]
fn returned_block(state: &AllocInFlight, ret: u64) -> u64 {
    match state.kind {
        // SAFETY: the helper checks the user address.
        alloc::POSIX_MEMALIGN if ret as u32 == 0 => {
            unsafe { bpf_probe_read_user(state.pointer as *const u64) }.unwrap_or(0)
        }
        alloc::POSIX_MEMALIGN => 0,
        _ => ret,
    }
}

/// Adds an allocation of `size` bytes to the process's totals, and to its live bytes when the
/// block is `tracked` (its free will find it).
#[inline(always)]
fn add_to_process(process: &mut ProcessAllocs, size: u64, tracked: bool) {
    atomic::add(&raw mut process.allocs, 1);
    atomic::add(&raw mut process.bytes, size);
    if tracked {
        atomic::add(&raw mut process.live, size);
        if process.live > process.peak_live {
            process.peak_live = process.live;
        }
    }
    record(&mut process.sizes, size);
}

/// Adds an allocation of `size` bytes to its call site's statistics.
#[inline(always)]
fn add_to_site(key: AllocKey, size: u64) {
    match ALLOC_STACKS.get_ptr_mut(key) {
        // SAFETY: map value pointer valid for this run.
        Some(stats) => unsafe {
            atomic::add(&raw mut (*stats).count, 1);
            atomic::add(&raw mut (*stats).bytes, size);
        },
        None => {
            if ALLOC_STACKS.insert(key, AllocStats { count: 1, bytes: size }, BPF_NOEXIST as u64).is_err() {
                counters::add(Counter::AllocsLost, 1);
            }
        }
    }
}

#[uprobe]
pub fn free_enter(ctx: ProbeContext) -> u32 {
    free(&ctx)
}

/// `free_enter` for a multi-uprobe link (see `alloc_enter_multi`).
#[uprobe(multi)]
pub fn free_enter_multi(ctx: ProbeContext) -> u32 {
    free(&ctx)
}

#[inline(always)]
fn free(ctx: &ProbeContext) -> u32 {
    let ptr = ctx.arg::<u64>(0).unwrap_or(0);
    if ptr == 0 {
        return 0;
    }
    let Some(pid_tgid) = target::current_target() else { return 0 };
    let tgid = (pid_tgid >> 32) as u32;
    // A free inside realloc is realloc's business (accounted at its return).
    if ALLOC_STATE.current(false).is_some_and(|state| state.nesting.inside()) {
        return 0;
    }
    forget(tgid, ptr);
    0
}

/// A block is gone: out of the live set, out of the live bytes.
#[inline(always)]
fn forget(tgid: u32, ptr: u64) {
    let key = LiveKey { tgid, _pad: 0, ptr };
    // SAFETY: the value is copied out before the entry is removed.
    let size = unsafe { LIVE_ALLOCS.get(key) }.map(|live| live.size);
    let Some(process) = process_allocs(tgid) else { return };
    // SAFETY: map value pointer valid for this run.
    let process = unsafe { &mut *process };
    match size {
        Some(size) => {
            let _ = LIVE_ALLOCS.remove(key);
            atomic::add(&raw mut process.frees, 1);
            atomic::add(&raw mut process.live, size.wrapping_neg());
        }
        None => atomic::add(&raw mut process.untracked_frees, 1),
    }
}

/// Process `tgid` replaced its program (an exec): its blocks went with its address space, and
/// none is live from now on. Their entries stay in `LIVE_ALLOCS` (a block of the new program
/// at one of their addresses takes its place), and userspace leaves out those of programs that
/// ended (see `memory/profiles.rs::heap_profile`).
#[inline(always)]
pub fn exec_ended(tgid: u32) {
    if let Some(process) = PROCESS_ALLOCS.get_ptr_mut(tgid) {
        // SAFETY: map value pointer valid for this run; the exec'ing thread is its process's
        // only one now, so no allocation of it races the write.
        unsafe { (*process).live = 0 };
    }
}

#[inline(always)]
fn process_allocs(tgid: u32) -> Option<*mut ProcessAllocs> {
    if let Some(process) = PROCESS_ALLOCS.get_ptr_mut(tgid) {
        return Some(process);
    }
    let zero = ZERO_PROCESS_ALLOCS.get(0)?;
    let _ = PROCESS_ALLOCS.insert(tgid, zero, BPF_NOEXIST as u64);
    PROCESS_ALLOCS.get_ptr_mut(tgid)
}
