//! Page faults, minor and major: every fault counted per process, exactly; stacks for every
//! major fault and for a sample of minor ones, weighted to stand for all.
//!
//! The events are every CPU's. Two ways to count, chosen by userspace at attach
//! (`FAULT_TASK_COUNTERS`):
//! - when the target is a set of processes and what they start (`--pid`, a command), the
//!   kernel already counts each thread's faults (`min_flt`, `maj_flt`: what getrusage reads),
//!   so no program runs per fault to count them. The exit program adds an exiting thread's
//!   counters here, userspace reads live processes' from /proc at the end, and the minor
//!   events run this program for 1 fault in `fault_stack_every` of the CPU's (their sample
//!   period), for the stack only, when the fault is a target's. A compiler's build faults some
//!   70,000 times: at 600 ns a fault, the largest BPF cost of it;
//! - otherwise (`--all`, `--comm`, a cgroup: the set is not known from the start), the program
//!   runs on every fault, counts the target's, and takes the stacks of each process's first
//!   minor faults, then of 1 in `fault_stack_every` at random.

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_F_USER_STACK},
    helpers::{bpf_get_current_task, bpf_get_prandom_u32, bpf_probe_read_kernel},
    macros::{map, perf_event},
    maps::{Array, HashMap},
    programs::PerfEventContext,
};
use sysprof_common::{Counter, FAULT_STACKS_ALL, FaultKey, capacity, stack};

use crate::{
    atomic,
    config::config,
    counters,
    maps::{FAULT_TRACES, FAULT_TRACES_OVERFLOW, add_count, interrupted_user_mode, stack_id_counted},
    target, window,
};

#[map]
static FAULT_COUNTS: HashMap<u64, u64> = HashMap::with_max_entries(capacity::FAULT_COUNTS, 0);

/// [minor, major] faults of the processes `FAULT_COUNTS` had no room for: an array, which
/// cannot fill. A build's thousands of processes fill `FAULT_COUNTS` (ended ones stay), and
/// the later ones' faults were lost; here they stay exact, with no process to them.
#[map]
static FAULTS_BY_KIND: Array<u64> = Array::with_max_entries(2, 0);

#[map]
static FAULT_STACKS: HashMap<FaultKey, u64> = HashMap::with_max_entries(capacity::FAULT_STACKS, 0);

/// 1: the targets' own counters count, the programs only take stacks (see the module's notes).
#[map]
static FAULT_TASK_COUNTERS: Array<u32> = Array::with_max_entries(1, 0);

/// tid -> [minor, major] at the trace's start, for target threads that existed then. Not
/// preallocated: most traces launch their target, and have none.
#[map]
static FAULT_BASELINES: HashMap<u32, [u64; 2]> =
    HashMap::with_max_entries(capacity::FAULT_BASELINES, BPF_F_NO_PREALLOC);

/// A minor fault (perf software event, one run per fault).
#[perf_event]
pub fn fault_minor(ctx: PerfEventContext) -> u32 {
    fault(&ctx, 0);
    0
}

/// A major fault (it waited for the disk).
#[perf_event]
pub fn fault_major(ctx: PerfEventContext) -> u32 {
    fault(&ctx, 1);
    0
}

#[inline(always)]
fn fault(ctx: &PerfEventContext, major: u32) {
    let Some(pid_tgid) = target::current_target() else { return };
    let tgid = (pid_tgid >> 32) as u32;
    if !window::open() {
        return;
    }
    let every = if task_counters() {
        // The event's own period chose this fault; the thread's counter counted it.
        if major != 0 { 1 } else { config().fault_stack_every.max(1) }
    } else {
        let Some(faults) = count(&((u64::from(tgid) << 1) | u64::from(major))) else {
            counters::add(Counter::FaultsLost, 1);
            return;
        };
        // Past a process's first minor faults, stacks for 1 fault in `fault_stack_every`,
        // weighted: a walk costs several times a minor fault.
        let every =
            if major != 0 || faults <= FAULT_STACKS_ALL { 1 } else { config().fault_stack_every.max(1) };
        // SAFETY: plain helper call.
        if every > 1 && unsafe { bpf_get_prandom_u32() } % every != 0 {
            return;
        }
        every
    };
    let key = FaultKey {
        tgid,
        major,
        user_stack_id: stack_id_counted(
            &FAULT_TRACES,
            &FAULT_TRACES_OVERFLOW,
            ctx,
            BPF_F_USER_STACK as u64,
            Counter::FaultStacksLost,
        ),
        kernel_stack_id: if interrupted_user_mode(ctx) {
            stack::NONE
        } else {
            stack_id_counted(&FAULT_TRACES, &FAULT_TRACES_OVERFLOW, ctx, 0, Counter::FaultStacksLost)
        },
        exec_id: crate::process::current_exec_id(),
    };
    // The fault is counted all the same: only the profile loses its stack.
    if !add_count(&FAULT_STACKS, &key, u64::from(every)) {
        counters::add(Counter::FaultStacksLost, 1);
    }
}

/// Adds one fault to the count under `key`, or, once the map has no room for it, to its kind's
/// in `FAULTS_BY_KIND`; the count with it (`None`: neither could be read). The count is read
/// back after the atomic add: another CPU's fault of the process may come in between, which
/// only moves the cut-over to sampling by one.
#[inline(always)]
fn count(key: &u64) -> Option<u64> {
    if let Some(count) = FAULT_COUNTS.get_ptr_mut(key) {
        atomic::add(count, 1);
        // SAFETY: a map value pointer, valid for the program's run.
        return Some(unsafe { *count });
    }
    if FAULT_COUNTS.insert(key, 1, aya_ebpf::bindings::BPF_NOEXIST as u64).is_ok() {
        return Some(1);
    }
    // Another CPU inserted it first, or the map is full.
    let count = FAULT_COUNTS.get_ptr_mut(key).or_else(|| FAULTS_BY_KIND.get_ptr_mut((*key & 1) as u32))?;
    atomic::add(count, 1);
    // SAFETY: as above.
    Some(unsafe { *count })
}

/// Whether the targets' own counters count their faults (see the module's notes).
#[inline(always)]
fn task_counters() -> bool {
    FAULT_TASK_COUNTERS.get(0).is_some_and(|on| *on != 0)
}

/// Called by the exit program for each exiting thread of a target: adds the faults the kernel
/// counted for it (past its count at the trace's start, for a thread that existed then) to its
/// process. Its mm is gone by now, so the counts are final.
#[inline(always)]
pub fn count_exiting_thread(tgid: u32, tid: u32) {
    let config = config();
    // Once the window closes, userspace reads what is left from /proc (see
    // `settle_fault_counts`): an exit from then on must not add its faults again.
    if !task_counters() || !window::open() || config.task_min_flt_offset == 0 {
        return;
    }
    // SAFETY: plain helper call; the task is the current one, alive for the program's run.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    // SAFETY: offsets from the running kernel's BTF; the helper checks the reads.
    let (Ok(minor), Ok(major)) = (unsafe {
        (
            bpf_probe_read_kernel(task.add(config.task_min_flt_offset as usize) as *const u64),
            bpf_probe_read_kernel(task.add(config.task_maj_flt_offset as usize) as *const u64),
        )
    }) else {
        return;
    };
    let (minor, major) = match FAULT_BASELINES.get_ptr(tid) {
        // SAFETY: a map value pointer, valid for the program's run.
        Some(base) => unsafe { (minor.saturating_sub((*base)[0]), major.saturating_sub((*base)[1])) },
        None => (minor, major),
    };
    for (kind, faults) in [(0, minor), (1, major)] {
        if faults != 0 && !add_count(&FAULT_COUNTS, &((u64::from(tgid) << 1) | kind), faults) {
            match FAULTS_BY_KIND.get_ptr_mut(kind as u32) {
                Some(count) => atomic::add(count, faults),
                None => counters::add(Counter::FaultsLost, faults),
            }
        }
    }
}
