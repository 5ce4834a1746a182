//! The scheduler: per thread, voluntary and involuntary switches and on/off-CPU time; per
//! process, run-queue latency (runnable to running); off-CPU time by the stacks and state a
//! thread left the CPU with (offcputime, aggregated in the kernel).
//!
//! tp_btf gives typed task pointers, which task local storage needs: the per-task state is found
//! without any hash lookup, and tasks that are not targets cost one storage lookup per switch.
//!
//! The same program parks a thread's syscall in flight when it leaves the CPU (syscalls.rs), so
//! it is attached whenever syscalls are traced; `Config::sched_stats` turns the rest on.

use aya_ebpf::{
    bindings::{BPF_F_USER_STACK, BPF_NOEXIST, task_struct},
    helpers::{bpf_get_current_comm, bpf_get_prandom_u32, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map},
    maps::{Array, HashMap, PerCpuArray, ProgramArray},
    programs::BtfTracePointContext,
};
use sysprof_common::{
    Counter, LatencyHistogram, OffCpuKey, OffCpuValue, TASK_COMM_LEN, TASK_REPORT_MAX, ThreadSched, WakeKey,
    capacity, stack,
    timeline::{TimelineEvent, kind as timeline_kind},
};

use crate::{
    atomic,
    config::config,
    counters,
    histogram::record,
    maps::stack_id,
    on_cpu, syscalls, target,
    task_state::{NOT_TARGET, TARGET, TASK_STATE, TaskState},
    timeline, window,
};

#[map]
static THREAD_SCHED: HashMap<u32, ThreadSched> = HashMap::with_max_entries(capacity::THREAD_SCHED, 0);

#[map]
static RUNQ_LATENCY: HashMap<u32, LatencyHistogram> =
    HashMap::with_max_entries(capacity::RUNQ_LATENCY, aya_ebpf::bindings::BPF_F_NO_PREALLOC);

#[map]
static OFFCPU: HashMap<OffCpuKey, OffCpuValue> = HashMap::with_max_entries(capacity::OFFCPU, 0);

#[map]
static WAKES: HashMap<WakeKey, OffCpuValue> = HashMap::with_max_entries(capacity::WAKES, 0);

/// `task_struct::__state` of a task switching out for the last time.
const TASK_DEAD: u32 = 0x80;

/// A zeroed histogram to insert from: too big for the BPF stack.
#[map]
static ZERO_HISTOGRAM: Array<LatencyHistogram> = Array::with_max_entries(1, 0);

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
/// unsigned int prev_state)`, run by `prev` (still current): the thread leaving the CPU.
///
/// The thread getting the CPU is `sched_switch_in`'s, a program of its own that this one ends
/// with a tail call to: the two touch different tasks' state, and verified as one program they
/// cost the verifier far more than apart (each of the leaving side's ways out is a new state
/// for the arriving side: 96 ms against 40 and 13 here), on the start's critical path. Apart,
/// they are verified side by side; chained by a tail call (a patched jump), not attached twice,
/// every switch on the machine pays one program call, not two.
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> i32 {
    let prev: *mut task_struct = ctx.arg(1);
    let prev_state = ctx.arg::<u64>(3) as u32;
    let next: *mut task_struct = ctx.arg(2);
    // The CPU's note and syscall slot, with one lookup for both (see `on_cpu.rs`).
    let state = on_cpu::state();
    let switch = target::note_switch(state, prev, next);
    // Only a target's thread has a call in the CPU's slot.
    if switch.prev_may_be_target
        && let Some(state) = state
    {
        syscalls::park_in_flight(state, switch.prev_id as u32, prev);
    }
    if config().sched_stats == 0 {
        return 0;
    }
    // Every other process's switches end at the target test, before any storage lookup.
    let (leaving, arriving) = (switch.prev_may_be_target, switch.next_may_be_target);
    if !leaving && !arriving {
        return 0;
    }
    // One clock for both threads, read first: the kernel charges this whole path to the
    // arriving thread, and its CPU clock is what a thread's on-CPU time is checked against
    // (read after the leaving thread's stack walks, it came out 13% short for 1,000 threads
    // switching 75,000 times a second; read here, 2% over).
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    if leaving {
        switch_out(&ctx, prev, prev_state, now);
    }
    if arriving && let Some(slot) = SWITCH_STARTED.get_ptr_mut(0) {
        // SAFETY: this CPU's slot, read by the tail call below before anything else runs here.
        unsafe { *slot = now };
    }
    // SAFETY: the array's one entry is `sched_switch_in`, a program of this tracepoint (the
    // same context); while it is empty, this program simply ends here.
    unsafe { SWITCH_IN.tail_call(&ctx, 0) };
    0
}

/// When the switch in progress on each CPU started, for `sched_switch_in` (0: not read).
#[map]
static SWITCH_STARTED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// `sched_switch_in`, which `sched_switch` ends with (see there).
#[map]
static SWITCH_IN: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// `sched_switch`, for `next`: the thread getting the CPU (loaded only for the scheduler's
/// statistics, and run by `sched_switch`'s tail call).
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch_in(ctx: BtfTracePointContext) -> i32 {
    let next: *mut task_struct = ctx.arg(2);
    let started = match SWITCH_STARTED.get_ptr_mut(0) {
        // SAFETY: this CPU's slot, written by the switch program just before its tail call.
        Some(slot) => unsafe { core::mem::replace(&mut *slot, 0) },
        None => 0,
    };
    if started != 0 {
        switch_in(next, started);
    }
    0
}

#[inline(always)]
fn switch_out(ctx: &BtfTracePointContext, prev: *mut task_struct, prev_state: u32, now: u64) {
    let Some(state) = TASK_STATE.get(prev, true) else {
        counters::add(Counter::SchedLost, 1);
        return;
    };
    // Targets first; then the window, which is closed only while the results are read.
    if !target::decide_current(state) {
        return;
    }
    // Before the trace starts (0) only where the thread is is kept (so a wait that began
    // during the attach is timed from the start); nothing is counted.
    let Some(start) = window::start_unless_closed() else { return };
    // Preempted while runnable (0), or inside the kernel (TASK_REPORT_MAX): involuntary.
    let involuntary = prev_state == 0 || prev_state == TASK_REPORT_MAX;
    let runtime = exec_runtime(prev);
    if start != 0 {
        account_switch_out(state, involuntary, prev_state, start, now, runtime);
    }
    state.switched_out_ns = now;
    state.runtime_out_ns = runtime.unwrap_or(0);
    state.left_ns = now;
    state.waker_seen = 0;
    state.offcpu_state = prev_state;
    state.runnable_since_ns = if involuntary { now } else { 0 };
    // An exiting thread's last switch is no wait (see `account_switch_out`): no stacks to walk.
    if prev_state & TASK_DEAD != 0 {
        return;
    }
    let entry = crate::unwind::user_entry(state.tgid);
    // A thread that sleeps at one place is often preempted at another (on its way back to user
    // mode from the call that woke a thread), and preempted in its own code by a timer's
    // interrupt too (`orig_ax` is negative outside a system call): each has caches of its own,
    // or they would evict each other at every switch.
    let in_own_code = involuntary && (entry.call[0] as i64) < 0;
    state.stack_slot = u32::from(involuntary) + u32::from(in_own_code);
    // Read back from the task's storage, the slot is a number in 0..=2 to the verifier, not one
    // of three constants: what follows is verified once, not once per slot.
    // SAFETY: a plain read of the task's own value.
    let slot = (unsafe { core::ptr::read_volatile(&raw const state.stack_slot) } as usize).min(2);
    // Preempted in its own code, a thread is at a new place each time, where no cache matches:
    // its stacks are walked 1 time in PREEMPTED_WALK_EVERY, at random, and the other times the
    // wait counts under the stacks walked last. Where a timer preempts a thread is independent
    // of the wait that follows, so the stacks come out in their right proportions, and a
    // compiler's stack walk (several us) is not paid at every tick of a busy machine.
    // Never a stack walked before an exec, though: it is of the program before, and its
    // addresses mean nothing in this one.
    let exec_id = crate::process::exec_id_of(prev);
    // SAFETY: plain helper call.
    let reuse = in_own_code
        && state.blocked[slot].exec_id == exec_id
        && unsafe { bpf_get_prandom_u32() } % PREEMPTED_WALK_EVERY != 0;
    // The kernel's first: its cache's branches before the user stack's walk, not after, are
    // verified once rather than for every way out of the walk (209 ms of verification).
    state.offcpu_kernel_stack =
        state.blocked_kernel[slot].kernel_stack(ctx, &entry, !in_own_code, prev_state, reuse);
    state.offcpu_user_stack = state.blocked[slot].user_stack(ctx, &entry, reuse);
    state.blocked[slot].exec_id = exec_id;
    state.offcpu_exec_id = exec_id;
}

/// A thread preempted in its own code has its stacks walked 1 time in this many.
const PREEMPTED_WALK_EVERY: u32 = 8;

/// The thread's time on a CPU so far as the scheduler counts it (`se.sum_exec_runtime`, brought
/// up to date for the leaving thread before the tracepoint fires), where its offset is known.
#[inline(always)]
fn exec_runtime(task: *const task_struct) -> Option<u64> {
    let offset = config().task_exec_runtime_offset;
    if offset == 0 {
        return None;
    }
    Some(target::task_field::<u64>(task, offset))
}

/// The on-CPU stretch the thread ends now (and the wait before it, when its arrival was not
/// seen), counted from the trace's `start` at the earliest.
#[inline(always)]
fn account_switch_out(
    state: &TaskState,
    involuntary: bool,
    prev_state: u32,
    start: u64,
    now: u64,
    runtime: Option<u64>,
) {
    let since = if state.switched_out_ns != 0 {
        // Leaving a CPU again without having been seen to arrive: the switch that brought it
        // did not fire. In a Firecracker guest, each one measured was init's thread leaving
        // the CPU (see `target.rs`'s `HIDDEN`): 3 in 300 traces of sysload's sleeps beside an
        // `--all` trace, each matched by the hidden leaving `note_switch` finds. It came on
        // after its wakeup, or, with none seen, just now; the time off the CPU until then is
        // off-CPU time.
        let came_on = match state.runnable_since_ns {
            0 => now,
            // max/min, not clamp: clamp's panic path is one the verifier rejects.
            woken => woken.max(state.switched_out_ns).min(now),
        };
        let from = state.switched_out_ns.max(start);
        let off = came_on.saturating_sub(from);
        add_offcpu(state, state.offcpu_state, off);
        // On the timeline too, or a wait the tables count is missing from it (one of a
        // process's three 100 ms sleeps, now and then, on a loaded machine).
        record_wait(state, from, came_on, 0);
        // And who woke it, as its switch in would have said: a main thread's 1.5 s join, woken
        // by a worker's exit, came back unseen once and was missing from the wakeup relation.
        if state.waker_seen != 0 && off > 0 {
            add_wake(state, off);
        }
        if let Some(thread) = thread_sched(state, false) {
            thread.offcpu_ns += off;
        }
        came_on
    } else if state.switched_in_ns != 0 {
        state.switched_in_ns
    } else {
        // First seen leaving a CPU: on it since the trace started, as far as the trace goes.
        start
    };
    let Some(thread) = thread_sched(state, true) else { return };
    let stretch = now.saturating_sub(since.max(start));
    // The scheduler's count since the thread last left a CPU is its time on one, without what
    // the hypervisor took from the CPU meanwhile (steal: a loaded host's vCPU stops
    // mid-stretch, and a busy thread's clock stretch came out 9-19% over its CPU clock). It
    // also starts before the stretch does: the kernel charges the arriving thread from its
    // pick, before this program's clock reads, and bounded by the stretch at every switch,
    // 1,000 threads waking 100,000 times a second came out 22% under their CPU clock. So the
    // count is taken as it is, bounded only by the time since the thread last left a CPU (it
    // cannot have run longer), or by the stretch where it was not seen leaving (its count
    // then covers its whole life). What the stretch holds beyond the count is kept apart as
    // stolen; what the count holds beyond the stretch was put in the wait before it, which
    // gives it back, so that the thread's times still add up to its lifetime.
    let ran = match runtime {
        Some(total) => {
            let from = if state.left_ns != 0 { state.left_ns } else { since };
            total.saturating_sub(state.runtime_out_ns).min(now.saturating_sub(from.max(start)))
        }
        None => stretch,
    };
    thread.oncpu_ns += ran;
    thread.stolen_ns += stretch.saturating_sub(ran);
    thread.offcpu_ns = thread.offcpu_ns.saturating_sub(ran.saturating_sub(stretch));
    // A thread's last switch, as it exits (TASK_DEAD), is no wait: getrusage counts none.
    if involuntary {
        thread.involuntary += 1;
    } else if prev_state & TASK_DEAD == 0 {
        thread.voluntary += 1;
    }
    thread.on_cpu = 0;
    // Named once, at its first switch-out (it is current then).
    if thread.comm[0] == 0
        && let Ok(comm) = bpf_get_current_comm()
    {
        thread.comm = comm;
    }
}

#[inline(always)]
fn switch_in(next: *mut task_struct, now: u64) {
    let Some(state) = TASK_STATE.get(next, true) else {
        counters::add(Counter::SchedLost, 1);
        return;
    };
    // A task not decided yet may be a target: when it leaves the CPU, its time on it counts
    // from here.
    if state.target == NOT_TARGET {
        return;
    }
    state.switched_in_ns = now;
    if state.target != TARGET {
        return;
    }
    let Some(start) = window::start_unless_closed() else { return };
    let off_since = state.switched_out_ns;
    let runnable_since = state.runnable_since_ns;
    state.switched_out_ns = 0;
    state.runnable_since_ns = 0;
    if start == 0 {
        return;
    }
    // Created here if this is the first the trace sees of the thread, so that its off-CPU
    // time and its reasons agree.
    let mut thread = thread_sched(state, true);
    if off_since != 0 {
        let from = off_since.max(start);
        // A wait ends at its wakeup; from there to now the thread was runnable, waiting for a
        // CPU (state 0, as a preemption is), so the time model's reasons add up.
        let woken = if runnable_since > from { runnable_since.min(now) } else { now };
        // saturating: a switch racing the start's write may read a clock just before it.
        let waited = woken.saturating_sub(from);
        add_offcpu(state, state.offcpu_state, waited);
        if state.waker_seen != 0 && waited > 0 {
            add_wake(state, waited);
        }
        if woken < now {
            add_offcpu(state, 0, now - woken);
        }
        if let Some(thread) = thread.as_deref_mut() {
            thread.offcpu_ns += now.saturating_sub(from);
        }
        record_wait(state, from, now, if woken < now { woken } else { 0 });
    }
    if runnable_since != 0 {
        record_runq(state.tgid, now.saturating_sub(runnable_since.max(start)));
    }
    if let Some(thread) = thread {
        thread.on_cpu = 1;
        thread.last_switch_in_ns = now;
    }
}

/// `sched_waking(struct task_struct *p)`, run by the waker as it starts to wake `p`: a
/// sleeping target becomes runnable (run-queue latency counts from here), and who woke it is
/// kept with it (the wakeup relation, see `WakeKey`).
#[btf_tracepoint(function = "sched_waking")]
pub fn sched_waking(ctx: BtfTracePointContext) -> i32 {
    let task: *mut task_struct = ctx.arg(0);
    if target::task_may_be_target(task)
        && let Some(state) = TASK_STATE.get(task, false)
        && state.target == TARGET
        && state.runnable_since_ns == 0
    {
        // SAFETY: plain helper call.
        state.runnable_since_ns = unsafe { bpf_ktime_get_ns() };
        if config().sched_stats != 0 {
            note_waker(&ctx, state);
        }
    }
    0
}

/// Records the current task as `state`'s waker when it wakes it from a system call; interrupt
/// work (a timer, a device, a softirq: `interrupts.rs`) runs on whatever task it interrupted,
/// which is no waker.
#[inline(always)]
fn note_waker(ctx: &BtfTracePointContext, state: &mut TaskState) {
    let pid_tgid = aya_ebpf::helpers::bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    state.waker_seen = 1;
    if tid == 0 || tid == state.tid || crate::interrupts::active() || !in_syscall() {
        state.waker_tgid = 0;
        state.waker_tid = 0;
        state.waker_user_stack = stack::NONE;
        state.waker_exec_id = sysprof_common::exec_id::UNKNOWN;
        return;
    }
    state.waker_tgid = tgid;
    state.waker_tid = tid;
    (state.waker_user_stack, state.waker_exec_id) = if target::is_current_target_cached(tgid) {
        let stack = match TASK_STATE.current(false) {
            Some(waker) => waker.waking.user_stack(ctx, &crate::unwind::user_entry(tgid), false),
            None => stack_id(ctx, BPF_F_USER_STACK as u64),
        };
        (stack, crate::process::current_exec_id())
    } else {
        (stack::NONE, sysprof_common::exec_id::UNKNOWN)
    };
}

/// Offset of the system call number in `struct pt_regs`: `orig_ax` (a long) on x86-64,
/// `syscallno` (an int) on arm64; -1 there outside a system call (an interrupt from user mode).
/// Its low 32 bits are read, which is the whole number on both (little-endian).
#[cfg(bpf_target_arch = "x86_64")]
const SYSCALL_NR_OFFSET: usize = 15 * 8;
#[cfg(bpf_target_arch = "aarch64")]
const SYSCALL_NR_OFFSET: usize = 34 * 8 + 8;
#[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
const SYSCALL_NR_OFFSET: usize = 0;

/// Whether the current task is in a system call, from the registers it entered the kernel with.
#[inline(always)]
fn in_syscall() -> bool {
    // SAFETY: plain helper calls; the registers sit at the top of the task's kernel stack.
    // The helper's result is a BTF pointer: the verifier checks the load against `pt_regs`
    // and makes it fault-safe (see `unwind::user_registers`).
    unsafe {
        let regs = aya_ebpf::helpers::generated::bpf_task_pt_regs(
            aya_ebpf::helpers::generated::bpf_get_current_task_btf(),
        ) as *const u8;
        if regs.is_null() || SYSCALL_NR_OFFSET == 0 {
            return false;
        }
        core::ptr::read_volatile(regs.add(SYSCALL_NR_OFFSET).cast::<i32>()) >= 0
    }
}

/// The thread's statistics, created (when `create`) with its process id.
#[inline(always)]
fn thread_sched(state: &TaskState, create: bool) -> Option<&'static mut ThreadSched> {
    if let Some(thread) = THREAD_SCHED.get_ptr_mut(state.tid) {
        // SAFETY: map values stay valid for the program's run; only the CPU switching this
        // thread touches its entry, so plain updates suffice.
        return Some(unsafe { &mut *thread });
    }
    if !create {
        return None;
    }
    let fresh = ThreadSched {
        tgid: state.tgid,
        on_cpu: 0,
        voluntary: 0,
        involuntary: 0,
        oncpu_ns: 0,
        offcpu_ns: 0,
        stolen_ns: 0,
        last_switch_in_ns: 0,
        comm: [0; TASK_COMM_LEN],
    };
    if THREAD_SCHED.insert(state.tid, fresh, BPF_NOEXIST as u64).is_err() {
        counters::add(Counter::SchedLost, 1);
        return None;
    }
    // SAFETY: as above.
    THREAD_SCHED.get_ptr_mut(state.tid).map(|thread| unsafe { &mut *thread })
}

/// Records the thread's wait off the CPU from `from` to `to` on the timeline, when it is long
/// enough for it; `woken` is when its wakeup came, where it waited for a CPU after it (else 0).
#[inline(always)]
fn record_wait(state: &TaskState, from: u64, to: u64, woken: u64) {
    if timeline::long_enough(to.saturating_sub(from)) {
        timeline::record(TimelineEvent {
            kind: timeline_kind::OFF_CPU,
            tgid: state.tgid,
            tid: state.tid,
            detail: state.offcpu_state,
            start_ns: from,
            end_ns: to,
            mark_ns: woken,
            user_stack_id: state.offcpu_user_stack,
            kernel_stack_id: state.offcpu_kernel_stack,
        });
    }
}

/// Adds `off` ns to the thread's off-CPU time at the stacks it left the CPU with, under
/// `offcpu_state` (the state it left with, or 0 for the wait for a CPU after a wakeup).
#[inline(always)]
fn add_offcpu(state: &TaskState, offcpu_state: u32, off: u64) {
    let key = OffCpuKey {
        tgid: state.tgid,
        state: offcpu_state,
        user_stack_id: state.offcpu_user_stack,
        kernel_stack_id: state.offcpu_kernel_stack,
        exec_id: state.offcpu_exec_id,
    };
    add_time(&OFFCPU, &key, off, Counter::OffCpuLost);
}

/// Adds a wait that ended at its wakeup to the wakeup relation.
#[inline(always)]
fn add_wake(state: &TaskState, waited: u64) {
    let key = WakeKey {
        tgid: state.tgid,
        tid: state.tid,
        waker_tgid: state.waker_tgid,
        waker_tid: state.waker_tid,
        state: state.offcpu_state,
        user_stack_id: state.offcpu_user_stack,
        kernel_stack_id: state.offcpu_kernel_stack,
        waker_user_stack_id: state.waker_user_stack,
        exec_id: state.offcpu_exec_id,
        waker_exec_id: state.waker_exec_id,
    };
    add_time(&WAKES, &key, waited, Counter::WakesLost);
}

/// Adds one interval of `ns` under `key`, counting it under `lost` when the map is full.
#[inline(always)]
fn add_time<K>(map: &HashMap<K, OffCpuValue>, key: &K, ns: u64, lost: Counter) {
    if let Some(value) = map.get_ptr_mut(key) {
        // SAFETY: map value pointers are valid and 8-byte aligned for the program's run.
        unsafe {
            atomic::add(&raw mut (*value).total_ns, ns);
            atomic::add(&raw mut (*value).count, 1);
        }
        return;
    }
    if map.insert(key, OffCpuValue { total_ns: ns, count: 1 }, BPF_NOEXIST as u64).is_err() {
        match map.get_ptr_mut(key) {
            // SAFETY: as above.
            Some(value) => unsafe {
                atomic::add(&raw mut (*value).total_ns, ns);
                atomic::add(&raw mut (*value).count, 1);
            },
            None => counters::add(lost, 1),
        }
    }
}

#[inline(always)]
fn record_runq(tgid: u32, latency: u64) {
    let hist = match RUNQ_LATENCY.get_ptr_mut(tgid) {
        Some(hist) => hist,
        None => {
            let Some(zero) = ZERO_HISTOGRAM.get(0) else { return };
            let _ = RUNQ_LATENCY.insert(tgid, zero, BPF_NOEXIST as u64);
            match RUNQ_LATENCY.get_ptr_mut(tgid) {
                Some(hist) => hist,
                None => {
                    counters::add(Counter::SchedLost, 1);
                    return;
                }
            }
        }
    };
    // SAFETY: map value pointer valid for the program's run.
    record(unsafe { &mut *hist }, latency);
}
