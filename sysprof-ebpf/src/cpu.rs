//! On-CPU sampling: a perf_event program on cpu-clock (or cycles) on every CPU, counting
//! (thread, user stack, kernel stack) in the kernel, as BCC's `profile` does.

use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::{map, perf_event},
    maps::HashMap,
    programs::PerfEventContext,
};
use sysprof_common::{
    Counter, SampleKey, TASK_COMM_LEN, capacity, stack,
    timeline::{TimelineEvent, kind as timeline_kind},
};

use crate::{
    counters,
    maps::{add_count, cpu_stack_id, interrupted_user_mode},
    target, timeline, window,
};

/// Sample counts per key.
#[map]
static CPU_SAMPLES: HashMap<SampleKey, u64> = HashMap::with_max_entries(capacity::CPU_SAMPLES, 0);

#[perf_event]
pub fn cpu_sample(ctx: PerfEventContext) -> u32 {
    try_cpu_sample(&ctx);
    0
}

#[inline(always)]
fn try_cpu_sample(ctx: &PerfEventContext) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !target::is_current_target(tgid) || !window::open() {
        return;
    }
    let key = SampleKey {
        tgid,
        tid: pid_tgid as u32,
        user_stack_id: cpu_stack_id(ctx, BPF_F_USER_STACK as u64),
        kernel_stack_id: if interrupted_user_mode(ctx) { stack::NONE } else { cpu_stack_id(ctx, 0) },
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
        exec_id: crate::process::current_exec_id(),
    };
    counters::add(Counter::CpuSamples, 1);
    if !add_count(&CPU_SAMPLES, &key, 1) {
        counters::add(Counter::CpuSamplesLost, 1);
    }
    if timeline::on() {
        // SAFETY: plain helper calls.
        let (now, cpu) = unsafe { (bpf_ktime_get_ns(), bpf_get_smp_processor_id()) };
        timeline::record(TimelineEvent {
            kind: timeline_kind::SAMPLE,
            tgid,
            tid: key.tid,
            detail: cpu,
            start_ns: now,
            end_ns: now,
            mark_ns: 0,
            user_stack_id: key.user_stack_id,
            kernel_stack_id: key.kernel_stack_id,
        });
    }
}
