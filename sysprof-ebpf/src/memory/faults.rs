//! Page faults, minor and major: every fault counted per process, exactly; stacks for a sample
//! of them, weighted to stand for all.

use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::{bpf_get_current_pid_tgid, bpf_get_prandom_u32},
    macros::{map, perf_event},
    maps::HashMap,
    programs::PerfEventContext,
};
use sysprof_common::{Counter, FaultKey, capacity};

use crate::{
    config::config,
    counters,
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
    if !add_count(&FAULT_COUNTS, &((u64::from(tgid) << 1) | u64::from(major)), 1) {
        counters::add(Counter::FaultsLost, 1);
    }
    // Stacks for 1 fault in `fault_stack_every`, weighted: a walk costs more than the fault.
    let every = config().fault_stack_every.max(1);
    // SAFETY: plain helper call.
    if unsafe { bpf_get_prandom_u32() } % every != 0 {
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
