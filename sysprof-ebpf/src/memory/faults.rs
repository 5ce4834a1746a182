//! Page faults, minor and major: every fault counted per process, exactly; stacks for every
//! major fault and each process's first minor ones, then for a sample, weighted to stand for
//! all.

use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::{bpf_get_current_pid_tgid, bpf_get_prandom_u32},
    macros::{map, perf_event},
    maps::HashMap,
    programs::PerfEventContext,
};
use sysprof_common::{Counter, FAULT_STACKS_ALL, FaultKey, capacity};

use crate::{
    config::config,
    counters,
    atomic,
    maps::{FAULT_TRACES, FAULT_TRACES_OVERFLOW, add_count, stack_id_counted},
    target, window,
};

#[map]
static FAULT_COUNTS: HashMap<u64, u64> = HashMap::with_max_entries(capacity::FAULT_COUNTS, 0);

#[map]
static FAULT_STACKS: HashMap<FaultKey, u64> = HashMap::with_max_entries(capacity::FAULT_STACKS, 0);

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
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !target::is_current_target_cached(tgid) || !window::open() {
        return;
    }
    let Some(faults) = count(&((u64::from(tgid) << 1) | u64::from(major))) else {
        counters::add(Counter::FaultsLost, 1);
        return;
    };
    // Past a process's first minor faults, stacks for 1 fault in `fault_stack_every`, weighted:
    // a walk costs several times a minor fault.
    let every = if major != 0 || faults <= FAULT_STACKS_ALL { 1 } else { config().fault_stack_every.max(1) };
    // SAFETY: plain helper call.
    if every > 1 && unsafe { bpf_get_prandom_u32() } % every != 0 {
        return;
    }
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
        kernel_stack_id: stack_id_counted(
            &FAULT_TRACES,
            &FAULT_TRACES_OVERFLOW,
            ctx,
            0,
            Counter::FaultStacksLost,
        ),
    };
    if !add_count(&FAULT_STACKS, &key, u64::from(every)) {
        counters::add(Counter::FaultsLost, 1);
    }
}

/// Adds one fault to the count under `key`; the count with it (`None`: the map is full). The
/// count is read back after the atomic add: another CPU's fault of the process may come in
/// between, which only moves the cut-over to sampling by one.
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
    let count = FAULT_COUNTS.get_ptr_mut(key)?;
    atomic::add(count, 1);
    // SAFETY: as above.
    Some(unsafe { *count })
}
