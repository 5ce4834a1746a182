//! Probed calls: one uprobe/uretprobe pair serves every function sysprof times (the CUDA
//! runtime and driver, NCCL, `--func` functions). The attachment's cookie says which function
//! it is and how to read it (see `sysprof_common::call`).
//!
//! Every call is counted and timed in the kernel by (process, function, call site); calls whose
//! arguments matter (transfers, allocations, NCCL collectives) also go to userspace as one
//! event each: rare and rich, the case a ring buffer is for. A call made inside another probed
//! call on the same thread (the runtime calling the driver) is not counted again.

use aya_ebpf::{
    EbpfContext as _,
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_ktime_get_ns, bpf_probe_read_user, generated::bpf_get_attach_cookie},
    macros::{map, uprobe, uretprobe},
    maps::{Array, HashMap, RingBuf},
    programs::{ProbeContext, RetProbeContext},
};
use sysprof_common::{
    CallEvent, CallKey, CallStats, Counter, call,
    call::memcpy3d,
    call::memcpy3d_offsets,
    capacity,
    timeline::{TimelineEvent, kind as timeline_kind},
};

use crate::{
    counters,
    histogram::record,
    nesting::Nesting,
    target,
    task_state::{StackCache, TaskStorage},
    timeline, window,
};

#[map]
static CALLS: HashMap<CallKey, CallStats> = HashMap::with_max_entries(capacity::CALLS, BPF_F_NO_PREALLOC);

#[map]
static CALL_EVENTS: RingBuf = RingBuf::with_byte_size(capacity::CALL_EVENTS, 0);

/// A zeroed value to insert from: too big for the BPF stack.
#[map]
static ZERO_CALL_STATS: Array<CallStats> = Array::with_max_entries(1, 0);

/// The outermost probed call in progress on a thread.
#[repr(C)]
pub struct CallInFlight {
    cookie: u64,
    start_ns: u64,
    args: [u64; 8],
    caller: u64,
    /// The thread's ids, for the return (a helper call less there).
    pid_tgid: u64,
    nesting: Nesting,
    user_stack_id: i32,
    _pad: u32,
    /// The thread's stack where it last made a probed call: a loop calling a function from
    /// one place takes it once, not once per call.
    stack: StackCache,
}

#[aya_ebpf::macros::btf_map]
static CALL_STATE: TaskStorage<CallInFlight> = TaskStorage::new();

/// The entry of a probed call, attached one function at a time (a perf-event uprobe each).
#[uprobe]
pub fn call_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx)
}

/// `call_enter` for a multi-uprobe link (Linux 6.6+): every function of a library in one link,
/// which detaches in one kernel grace period instead of one per function (122 uprobes of the
/// CUDA runtime and NCCL took 13 s to detach, one after the other).
#[uprobe(multi)]
pub fn call_enter_multi(ctx: ProbeContext) -> u32 {
    enter(&ctx)
}

#[inline(always)]
fn enter(ctx: &ProbeContext) -> u32 {
    // The switch's note on the CPU, not a helper call (see `target::current_target`).
    let Some(pid_tgid) = target::current_target() else { return 0 };
    let tgid = (pid_tgid >> 32) as u32;
    if !window::open_or_calibrating(tgid) {
        return 0;
    }
    let Some(state) = CALL_STATE.current(true) else {
        return 0;
    };
    if !state.nesting.enter(stack_pointer(ctx)) {
        // Inside another probed call (cudaMemcpy calling cuMemcpyHtoD): counted once, outside.
        return 0;
    }
    // SAFETY: plain helper call on this program's context.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    state.cookie = cookie;
    state.pid_tgid = pid_tgid;
    let entry = crate::unwind::probe_entry(ctx, tgid);
    state.user_stack_id = state.stack.user_stack(ctx, &entry, false);
    // The arguments only where something reads them (a `--func` call reads none).
    if cookie & call::READS_ARGS != 0 {
        let read = if cookie & call::STACK_ARGS != 0 { state.args.len() } else { REGISTER_ARGS };
        for (index, arg) in state.args.iter_mut().enumerate() {
            *arg = if index < read { argument(ctx, index) } else { 0 };
        }
    }
    state.caller = caller(ctx, &entry);
    if cookie & call::MEMCPY3D_PARAMS != 0 {
        read_memcpy3d(&mut state.args);
    }
    // Last, so the time measured is the function's, not ours.
    // SAFETY: plain helper call.
    state.start_ns = unsafe { bpf_ktime_get_ns() };
    0
}

/// The return of a probed call (see `call_enter`).
#[uretprobe]
pub fn call_return(ctx: RetProbeContext) -> u32 {
    leave(&ctx)
}

/// `call_return` for a multi-uprobe link (see `call_enter_multi`).
#[uretprobe(multi)]
pub fn call_return_multi(ctx: RetProbeContext) -> u32 {
    leave(&ctx)
}

#[inline(always)]
fn leave(ctx: &RetProbeContext) -> u32 {
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(state) = CALL_STATE.current(false) else {
        return 0;
    };
    if !state.nesting.leave() {
        return 0;
    }
    let pid_tgid = state.pid_tgid;
    let ret: u64 = ctx.ret();
    let failed = call_failed(state.cookie, ret);
    let duration = now.saturating_sub(state.start_ns);
    let key = CallKey {
        tgid: (pid_tgid >> 32) as u32,
        func: (state.cookie & call::ID_MASK) as u32,
        user_stack_id: state.user_stack_id,
        // The image of the entry's stack: a call returns in the image it began in.
        exec_id: crate::process::current_exec_id(),
        detail: detail(state),
        caller: state.caller,
    };
    count_call(&key, duration, failed);
    if state.cookie & call::EVENT != 0 {
        send_event(state, &key, pid_tgid as u32, ret, duration, failed);
    } else if timeline::on() && timeline::call_kept(duration) {
        // A call with an event of its own is on the timeline through it.
        timeline::record(TimelineEvent {
            kind: timeline_kind::CALL,
            tgid: key.tgid,
            tid: pid_tgid as u32,
            detail: key.func,
            start_ns: state.start_ns,
            end_ns: now,
            mark_ns: key.detail,
            user_stack_id: state.user_stack_id,
            kernel_stack_id: sysprof_common::stack::NONE,
        });
    }
    0
}

/// Whether the call failed, by the convention its cookie names.
#[inline(always)]
fn call_failed(cookie: u64, ret: u64) -> bool {
    if cookie & call::ERROR_IF_NEGATIVE != 0 {
        // A negative long, or a negative int (the upper half of the register is then zero).
        (ret as i64) < 0 || (ret >> 32 == 0 && (ret as i32) < 0)
    } else {
        ret as u32 != 0
    }
}

/// The argument the call is keyed by beside its site (a copy's kind, a kernel launched), or 0.
#[inline(always)]
fn detail(state: &CallInFlight) -> u64 {
    if state.cookie & call::DETAIL_ARG0 != 0 {
        state.args[0]
    } else if state.cookie & call::DETAIL_ARG1 != 0 {
        state.args[1]
    } else {
        0
    }
}

/// Adds the call to its statistics in `CALLS`.
#[inline(always)]
fn count_call(key: &CallKey, duration: u64, failed: bool) {
    match stats_for(key) {
        Some(stats) => {
            // SAFETY: map value pointer valid for this run.
            let stats = unsafe { &mut *stats };
            record(&mut stats.latency, duration);
            if failed {
                crate::atomic::add(&raw mut stats.errors, 1);
            }
        }
        None => counters::add(Counter::CallsLost, 1),
    }
}

/// Sends the call with its arguments (and the pointer it wrote, for the calls that return one
/// through their first argument) to userspace.
#[inline(always)]
fn send_event(state: &CallInFlight, key: &CallKey, tid: u32, ret: u64, duration: u64, failed: bool) {
    let out = if state.cookie & call::OUT_ARG0 != 0 && !failed {
        // SAFETY: the helper checks the user address.
        unsafe { bpf_probe_read_user(state.args[0] as *const u64) }.unwrap_or(0)
    } else {
        0
    };
    match CALL_EVENTS.reserve::<CallEvent>(0) {
        Some(mut entry) => {
            entry.write(CallEvent {
                func: key.func,
                tgid: key.tgid,
                tid,
                user_stack_id: state.user_stack_id,
                start_ns: state.start_ns,
                duration_ns: duration,
                ret: ret as i64,
                args: state.args,
                out,
                caller: state.caller,
            });
            entry.submit(event_wakeup());
        }
        None => counters::add(Counter::CallEventsLost, 1),
    }
}

/// No wakeup: userspace drains the ring on its tick (20 ms). The kernel's default, a wakeup
/// whenever userspace has caught up, woke sysprof once for nearly every event: 61,506 times a
/// second for a loop of `cudaMemcpy`, each an interrupt raised in the target's call (in a VM,
/// an exit to the hypervisor). Only the first event while userspace rests (see
/// `events::take_resting`), or one that finds the ring a quarter full, wakes it.
#[inline(always)]
fn event_wakeup() -> u64 {
    if crate::events::take_resting()
        || CALL_EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= u64::from(capacity::CALL_EVENTS / 4)
    {
        return BPF_RB_FORCE_WAKEUP as u64;
    }
    BPF_RB_NO_WAKEUP as u64
}

/// The arguments every entry that reads any reads: the six x86-64 passes in registers. Those
/// past them are on the stack there, read only for a function flagged `call::STACK_ARGS`.
const REGISTER_ARGS: usize = 6;

/// Argument `index` (0..8) of the probed function, by the platform's calling convention.
#[inline(always)]
fn argument(ctx: &ProbeContext, index: usize) -> u64 {
    #[cfg(bpf_target_arch = "x86_64")]
    {
        if index < REGISTER_ARGS {
            return ctx.arg::<u64>(index).unwrap_or(0);
        }
        // The seventh argument onwards is on the stack, above the return address.
        // SAFETY: `regs` is the probe's register frame; the read of user memory is checked.
        let sp = unsafe { (*ctx.regs).rsp };
        unsafe { bpf_probe_read_user((sp + 8 * (index as u64 - 5)) as *const u64) }.unwrap_or(0)
    }
    #[cfg(not(bpf_target_arch = "x86_64"))]
    {
        ctx.arg::<u64>(index).unwrap_or(0)
    }
}

/// Where the probe is: the probed instruction (the kernel points the saved registers at the
/// breakpoint's address while the probe's programs run).
#[inline(always)]
pub fn instruction_pointer(ctx: &ProbeContext) -> u64 {
    // SAFETY: `regs` is the probe's register frame.
    #[cfg(bpf_target_arch = "x86_64")]
    return unsafe { (*ctx.regs).rip };
    // SAFETY: as above.
    #[cfg(bpf_target_arch = "aarch64")]
    return unsafe { (*ctx.regs).pc };
    #[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
    return 0;
}

/// The stack pointer at the probe.
#[inline(always)]
pub fn stack_pointer(ctx: &ProbeContext) -> u64 {
    // SAFETY: `regs` is the probe's register frame.
    #[cfg(bpf_target_arch = "x86_64")]
    return unsafe { (*ctx.regs).rsp };
    // SAFETY: as above.
    #[cfg(bpf_target_arch = "aarch64")]
    return unsafe { (*ctx.regs).sp };
    #[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
    return 0;
}

/// Where the probed function returns to, at its first instruction.
#[inline(always)]
pub fn caller(ctx: &ProbeContext, entry: &crate::unwind::UserEntry) -> u64 {
    // At a function's first instruction the word at the stack pointer is the return address,
    // which the entry already read (x86-64).
    #[cfg(bpf_target_arch = "x86_64")]
    if entry.known() {
        return entry.at[3];
    }
    let _ = entry;
    return_address(ctx)
}

/// The return address of the function probed at its entry.
#[inline(always)]
pub fn return_address(ctx: &ProbeContext) -> u64 {
    #[cfg(bpf_target_arch = "x86_64")]
    {
        // The call instruction just pushed it.
        // SAFETY: `regs` is the probe's register frame; the read of user memory is checked.
        let sp = unsafe { (*ctx.regs).rsp };
        unsafe { bpf_probe_read_user(sp as *const u64) }.unwrap_or(0)
    }
    #[cfg(bpf_target_arch = "aarch64")]
    {
        // The link register.
        // SAFETY: `regs` is the probe's register frame.
        unsafe { (*ctx.regs).regs[30] }
    }
    #[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
    {
        0
    }
}

/// Copies what a 3D copy moves out of its `cudaMemcpy3DParms` (argument 0).
#[inline(always)]
fn read_memcpy3d(args: &mut [u64; 8]) {
    let params = args[0];
    let read = |offset: u64| {
        // SAFETY: the helper checks the user address.
        unsafe { bpf_probe_read_user((params + offset) as *const u64) }.unwrap_or(0)
    };
    args[memcpy3d::SRC] = read(memcpy3d_offsets::SRC_PTR);
    args[memcpy3d::DST] = read(memcpy3d_offsets::DST_PTR);
    args[memcpy3d::WIDTH] = read(memcpy3d_offsets::EXTENT);
    args[memcpy3d::HEIGHT] = read(memcpy3d_offsets::EXTENT + 8);
    args[memcpy3d::DEPTH] = read(memcpy3d_offsets::EXTENT + 16);
    args[memcpy3d::KIND] = read(memcpy3d_offsets::KIND) & 0xffff_ffff;
}

/// The statistics of `key`, inserted zeroed when new.
#[inline(always)]
fn stats_for(key: &CallKey) -> Option<*mut CallStats> {
    if let Some(stats) = CALLS.get_ptr_mut(key) {
        return Some(stats);
    }
    let zero = ZERO_CALL_STATS.get(0)?;
    let _ = CALLS.insert(key, zero, BPF_NOEXIST as u64);
    CALLS.get_ptr_mut(key)
}
