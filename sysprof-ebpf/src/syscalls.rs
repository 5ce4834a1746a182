//! Syscalls: exact counts and errors by errno, and latency histograms, per process and syscall,
//! aggregated in the kernel (nothing per call goes to userspace).
//!
//! The hot path is built around what a call costs here, not what is convenient:
//! - the call in flight lives in a per-CPU slot (an inlined array access), not in a per-thread
//!   map; a thread that leaves the CPU mid-call has it parked in its task local storage by the
//!   context-switch program, so blocking calls are timed like any other;
//! - the current task's ids come from a per-CPU note the switch program writes, and whether its
//!   process is a target from one bit of an array (`target.rs`): no helper call, no hash map,
//!   for the calls of every other process on the machine. The note and the slot are one
//!   per-CPU value (`on_cpu.rs`), found with one lookup;
//! - counts of untimed calls and of their failures, and failures by errno, add up in a small
//!   per-CPU cache (`PendingCount`, 16 entries keyed by syscall number) and reach the shared
//!   maps when an entry is evicted; userspace adds what is still pending at the end. A loop of
//!   the same few syscalls, failing or not, touches no hash map (a shared map's lookup is the
//!   dearest step of a call: 250 ns in a VM, 130 for the errno counts');
//! - the clock is the most expensive thing left (about 45 ns a read in a VM), so a thread making
//!   more than `syscall_burst` calls in one stretch on a CPU (without leaving it) has 1 call in
//!   `syscall_sample_every` timed (at random gaps, weighted accordingly). Counts and errors
//!   stay exact, and a call that was not sampled but then blocks is timed from the moment it
//!   left the CPU, so slow calls are never missed.
//!
//! tp_btf on the raw syscall tracepoints: no tracefs, no perf-event indirection.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map},
    maps::{Array, HashMap},
    programs::BtfTracePointContext,
};
use sysprof_common::{
    Counter, CpuState, InFlight, PENDING_COUNTS, PendingCount, SyscallErrorKey, SyscallKey,
    SyscallSlot as Slot, SyscallStats, capacity, stack,
    timeline::{TimelineEvent, kind as timeline_kind},
};

use crate::{
    atomic, config::config, counters, histogram::record_weighted, memory, on_cpu, target,
    task_state::TASK_STATE, timeline, window,
};

/// Preallocated (22 MB of kernel memory for 16,384 entries): a map that allocates at insert
/// takes its elements from a per-CPU cache that the kernel refills with an interrupt to this
/// CPU (irq_work) every few elements, and in a VM that interrupt is an exit to the hypervisor.
/// Each process's first call of each syscall inserts: in a `make -j2` (1,500 of them) a timed
/// call's lookup took 640 ns on average with allocation at insert, 300 preallocated.
#[map]
static SYSCALLS: HashMap<SyscallKey, SyscallStats> = HashMap::with_max_entries(capacity::SYSCALLS, 0);

#[map]
static SYSCALL_ERRORS: HashMap<SyscallErrorKey, u64> = HashMap::with_max_entries(capacity::SYSCALL_ERRORS, 0);

/// The calls of the processes `SYSCALLS` had no room for, by syscall number alone: an array,
/// which cannot fill. A build fills `SYSCALLS` (each compiler process adds a few dozen
/// (process, syscall) pairs, and ended ones stay), and its later processes' calls were lost;
/// here they stay exact, with no process to them.
#[map]
static SYSCALLS_BY_NR: Array<SyscallStats> = Array::with_max_entries(capacity::SYSCALL_NUMBERS, 0);

/// A zeroed value to insert from: too big for the BPF stack.
#[map]
static ZERO_SYSCALL_STATS: Array<SyscallStats> = Array::with_max_entries(1, 0);

/// Highest errno a syscall returns (-4095..-1 are errors).
const MAX_ERRNO: i64 = 4095;

/// `sys_enter(struct pt_regs *regs, long id)`
///
/// The call is written into the CPU's slot field by field, with no copy on the stack, and
/// what needs stack (the shared maps' keys, the helpers' buffers) is in functions of its own:
/// a program whose frame reaches 64 bytes runs on a per-CPU private stack the kernel sets up
/// on every run. The window is not tested here: `syscall_exit` counts only calls that end
/// inside it. With the target's verdict read from the switch's note, these took the two
/// programs from 52 to 38 ns a getppid over empty ones (`cargo xtask bench syscalls`).
#[btf_tracepoint(function = "sys_enter")]
pub fn syscall_enter(ctx: BtfTracePointContext) -> i32 {
    // The CPU's note and slot with one lookup (see `on_cpu.rs`).
    let Some(state) = on_cpu::state() else { return 0 };
    let Some(pid_tgid) = target::current_target_in(state) else { return 0 };
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: the per-CPU slot is only used by programs on this CPU, which do not nest.
    let slot = unsafe { &mut (*state).syscall };
    let nr = ctx.arg::<i64>(1) as u32;
    if nr == config().nr_exit || nr == config().nr_exit_group {
        // It never returns: counted now, with no latency.
        if window::open() {
            pending_entry(slot, tgid, nr).count += 1;
        }
        return 0;
    }
    let (timed, weight) = timing(slot, pid_tgid as u32);
    // SAFETY: plain helper call.
    let start_ns = if timed { unsafe { bpf_ktime_get_ns() } } else { 0 };
    let call = &mut slot.call;
    call.tgid = tgid;
    call.nr = nr;
    call.start_ns = start_ns;
    call.weight = weight;
    call.active = 1;
    call.from_block = 0;
    // mmap's arguments also tell an executable mapping (a library loaded) from the others.
    if nr == config().nr_mmap
        || (config().address_space != 0 && memory::address_space::is_address_space_call(nr))
    {
        memory::address_space::syscall_args(ctx.arg(0), &mut call.args);
    }
    0
}

/// Whether thread `tid`'s call is timed, and how many calls its time stands for: every call,
/// until the thread's stretch on this CPU passes `syscall_burst` calls; then 1 in
/// `syscall_sample_every` on average, weighted by it.
///
/// In a burst, a countdown drawn at random after each timed call (uniform on 0..2n-1 calls
/// left untimed, n = `syscall_sample_every`: a mean gap of n) picks the next one, so an untimed
/// call costs a decrement, and the random number is drawn on the timed calls only, beside
/// their two clock reads. It drew one for every call before (a per-CPU xorshift state in a map
/// of its own), and that lookup and its shifts were a quarter of what `syscall_enter` adds to
/// an empty program (kernel statistics on a getppid loop: 36.9 -> 35.1 ns a run, 30.5 empty).
/// Random gaps, not a fixed 1 in n, so that a loop of calls in a fixed order does not have the
/// same one timed every time.
#[inline(always)]
fn timing(slot: &mut Slot, tid: u32) -> (bool, u32) {
    if slot.tid != tid {
        slot.tid = tid;
        slot.stretch_calls = 0;
    }
    slot.stretch_calls += 1;
    let burst = config().syscall_burst;
    if burst == 0 || slot.stretch_calls <= burst {
        return (true, 1);
    }
    let every = config().syscall_sample_every.max(1);
    let untimed_left = &mut slot.untimed_left;
    if *untimed_left != 0 {
        *untimed_left -= 1;
        return (false, every);
    }
    // SAFETY: plain helper call.
    *untimed_left = unsafe { bpf_get_prandom_u32() } % (2 * every - 1);
    (true, every)
}

/// `sys_exit(struct pt_regs *regs, long ret)`
#[btf_tracepoint(function = "sys_exit")]
pub fn syscall_exit(ctx: BtfTracePointContext) -> i32 {
    let Some(state) = on_cpu::state() else { return 0 };
    let Some(pid_tgid) = target::current_unless_outside(state) else { return 0 };
    let tid = pid_tgid as u32;
    // SAFETY: as in syscall_enter.
    let slot = unsafe { &mut (*state).syscall };
    let call: *mut InFlight = if slot.call.active != 0 && slot.tid == tid {
        &raw mut slot.call
    } else {
        // Every other process's calls end here: the cached filter costs less than the task
        // storage lookup, which only a target's thread can need.
        if !target::is_current_target_cached((pid_tgid >> 32) as u32) {
            return 0;
        }
        // The thread left the CPU during the call: the switch program parked it.
        let Some(state) = TASK_STATE.current(false) else {
            return 0;
        };
        if state.syscall.active == 0 {
            return 0;
        }
        &raw mut state.syscall
    };
    // SAFETY: the CPU's slot or the thread's storage, both valid for this run; read in place,
    // not copied (see syscall_enter on the stack).
    let call = unsafe { &mut *call };
    call.active = 0;
    // Only a target's call gets here. One still in flight when the trace ends is not counted,
    // as strace -c counts none; one that began before the trace is timed from its start.
    let Some(window_start) = window::open_since() else {
        return 0;
    };
    let ret: i64 = ctx.arg(1);
    // Tested here, not in the callee: a call to a function that is not inlined, and its
    // return, on every call a target makes cost more than the test (see `account_address_space`).
    if config().address_space != 0 && memory::address_space::is_address_space_call(call.nr) {
        memory::address_space::account_address_space(call, ret);
    }
    if call.nr == config().nr_mmap && !(-4095..0).contains(&ret) && call.args[2] & PROT_EXEC != 0 {
        crate::process::executable_mapped(call.tgid);
    }
    if call.start_ns == 0 {
        count_untimed(slot, call.tgid, call.nr, ret);
    } else {
        record_timed(slot, call, call.start_ns.max(window_start), tid, ret);
    }
    0
}

/// mmap's `prot` bit for executable memory.
const PROT_EXEC: u64 = 4;

/// Called by the context-switch program for the thread leaving the CPU: ends its stretch, and
/// moves its call in flight, if any, from the CPU's slot to the thread's own storage. A call
/// that was not sampled is timed from here: it blocked, so it is slow. `state` is this CPU's.
#[inline(always)]
pub fn park_in_flight(state: *mut CpuState, tid: u32, prev: *mut aya_ebpf::bindings::task_struct) {
    // SAFETY: as in syscall_enter.
    let slot = unsafe { &mut (*state).syscall };
    if slot.tid != tid {
        return;
    }
    slot.stretch_calls = 0;
    if slot.call.active == 0 {
        return;
    }
    let mut call = slot.call;
    slot.call.active = 0;
    if call.start_ns == 0 {
        // SAFETY: plain helper call.
        call.start_ns = unsafe { bpf_ktime_get_ns() };
        call.weight = 1;
        call.from_block = 1;
    }
    match TASK_STATE.get(prev, true) {
        Some(state) => state.syscall = call,
        None => counters::add(Counter::SyscallsLost, 1),
    }
}

/// Counts an untimed call: it needs nothing of the shared statistics (a hash lookup of 250 ns
/// here), so it goes into the cache, failed or not, and so does its errno.
#[inline(always)]
fn count_untimed(slot: &mut Slot, tgid: u32, nr: u32, ret: i64) {
    let entry = pending_entry(slot, tgid, nr);
    entry.count += 1;
    if (-MAX_ERRNO..0).contains(&ret) {
        entry.errors += 1;
        note_errno(entry, (-ret) as u32);
    }
}

/// Adds a timed call, begun at `start_ns`, to the shared statistics. A function of its own,
/// not inlined: its keys and its timeline event need stack, which would push the calling
/// program onto a private stack (see `syscall_enter`) for every call, timed or not.
#[inline(never)]
fn record_timed(slot: &mut Slot, call: *const InFlight, start_ns: u64, tid: u32, ret: i64) {
    // SAFETY: the caller's call, in the CPU's slot or the thread's storage, valid for this run
    // and only read.
    let (tgid, nr, weight, from_block) =
        unsafe { ((*call).tgid, (*call).nr, (*call).weight, (*call).from_block) };
    let key = SyscallKey { tgid, nr };
    let Some(stats) = stats_for(&key) else {
        counters::add(Counter::SyscallsLost, 1);
        return;
    };
    // SAFETY: `stats` points into a map value, valid for this run.
    let stats = unsafe { &mut *stats };
    atomic::add(&raw mut stats.calls, 1);
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let latency = now.saturating_sub(start_ns);
    let timed = if from_block != 0 { &raw mut stats.timed_from_block } else { &raw mut stats.timed };
    atomic::add(timed, 1);
    record_weighted(&mut stats.latency, latency, weight);
    if timeline::long_enough(latency) {
        timeline::record(TimelineEvent {
            kind: timeline_kind::SYSCALL,
            tgid,
            tid,
            detail: nr,
            start_ns,
            end_ns: now,
            mark_ns: ret as u64,
            user_stack_id: stack::NONE,
            kernel_stack_id: stack::NONE,
        });
    }
    if (-MAX_ERRNO..0).contains(&ret) {
        atomic::add(&raw mut stats.errors, 1);
        note_errno(pending_entry(slot, tgid, nr), (-ret) as u32);
    }
}

/// Adds `count` failures under `key` to the shared errno counts.
#[inline(always)]
fn add_errors(key: SyscallErrorKey, count: u32) {
    let count = u64::from(count);
    if let Some(total) = SYSCALL_ERRORS.get_ptr_mut(key) {
        atomic::add(total, count);
        return;
    }
    if SYSCALL_ERRORS.insert(key, count, BPF_NOEXIST as u64).is_err() {
        match SYSCALL_ERRORS.get_ptr_mut(key) {
            Some(total) => atomic::add(total, count),
            // The failures are in their syscall's counts all the same: only their errno goes.
            None => counters::add(Counter::ErrnosLost, count),
        }
    }
}

/// Counts a failure with `errno` in `entry`, moving the failures it held with another errno
/// to the shared counts.
#[inline(always)]
fn note_errno(entry: &mut PendingCount, errno: u32) {
    if entry.errno != errno {
        flush_errno(entry);
    }
    entry.errno = errno;
    entry.errno_count += 1;
}

/// Moves an entry's failures by errno to the shared counts. Not inlined, as `record_timed`.
#[inline(never)]
fn flush_errno(entry: &mut PendingCount) {
    if entry.errno_count != 0 {
        add_errors(
            SyscallErrorKey { tgid: entry.tgid, nr: entry.nr, errno: entry.errno, _pad: 0 },
            entry.errno_count,
        );
        entry.errno_count = 0;
    }
}

/// The CPU's pending entry for `nr` of process `tgid`, emptied into the shared maps first when
/// it holds another syscall's counts.
#[inline(always)]
fn pending_entry(slot: &mut Slot, tgid: u32, nr: u32) -> &mut PendingCount {
    // Spread by a multiplicative hash: the numbers of a process's common calls share low bits
    // (openat 257 and write 1, readlink 89 and mmap 9).
    let index = (nr.wrapping_mul(0x9e37_79b1) >> (32 - PENDING_COUNTS.trailing_zeros())) as usize;
    let entry = &mut slot.pending[index & (PENDING_COUNTS - 1)];
    let key = sysprof_common::syscall_key_of(tgid, nr);
    if entry.key() != key {
        if entry.count != 0 || entry.errno_count != 0 {
            flush_pending(entry);
        }
        entry.set_key(key);
    }
    entry
}

/// Moves an entry's counts to the shared maps. Not inlined, as `record_timed`.
#[inline(never)]
fn flush_pending(entry: &mut PendingCount) {
    if entry.count != 0 {
        match stats_for(&SyscallKey { tgid: entry.tgid, nr: entry.nr }) {
            // SAFETY: map value pointer valid for this run.
            Some(stats) => unsafe {
                atomic::add(&raw mut (*stats).calls, u64::from(entry.count));
                if entry.errors != 0 {
                    atomic::add(&raw mut (*stats).errors, u64::from(entry.errors));
                }
            },
            None => counters::add(Counter::SyscallsLost, u64::from(entry.count)),
        }
    }
    flush_errno(entry);
    *entry = PendingCount::default();
}

/// The statistics of `key`, inserted zeroed when new; those of its syscall number in
/// `SYSCALLS_BY_NR` when the map has no room for it.
#[inline(always)]
fn stats_for(key: &SyscallKey) -> Option<*mut SyscallStats> {
    if let Some(stats) = SYSCALLS.get_ptr_mut(key) {
        return Some(stats);
    }
    let zero = ZERO_SYSCALL_STATS.get(0)?;
    // Another CPU may insert the same key first (BPF_NOEXIST fails): use theirs.
    let _ = SYSCALLS.insert(key, zero, BPF_NOEXIST as u64);
    SYSCALLS.get_ptr_mut(key).or_else(|| SYSCALLS_BY_NR.get_ptr_mut(key.nr))
}
