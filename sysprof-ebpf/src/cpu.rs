//! On-CPU sampling: a perf_event program on cpu-clock (or cycles) on every CPU, counting
//! (thread, user stack, kernel stack) in the kernel, as BCC's `profile` does.

use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{map, perf_event},
    maps::HashMap,
    programs::{PerfEventContext, tracing::StackIdContext as _},
};
use sysprof_common::{Counter, SampleKey, TASK_COMM_LEN, capacity, stack};

use crate::{atomic, counters, maps::STACKS, target};

/// Sample counts per key.
#[map]
static CPU_SAMPLES: HashMap<SampleKey, u64> = HashMap::with_max_entries(capacity::CPU_SAMPLES, 0);

/// -EFAULT: `bpf_get_stackid` found no stack of the asked kind.
const EFAULT: i32 = -14;

#[perf_event]
pub fn cpu_sample(ctx: PerfEventContext) -> u32 {
    try_cpu_sample(&ctx);
    0
}

#[inline(always)]
fn try_cpu_sample(ctx: &PerfEventContext) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !target::is_current_target(tgid) {
        return;
    }
    let key = SampleKey {
        tgid,
        tid: pid_tgid as u32,
        user_stack_id: stack_id(ctx, BPF_F_USER_STACK as u64, Counter::UserStacksLost),
        kernel_stack_id: stack_id(ctx, 0, Counter::KernelStacksLost),
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
    };
    counters::add(Counter::CpuSamples, 1);
    if !increment(&key) {
        counters::add(Counter::CpuSamplesLost, 1);
    }
}

/// The stack's id in `STACKS`, or a `stack::` marker saying why there is none.
#[inline(always)]
fn stack_id(ctx: &PerfEventContext, flags: u64, lost: Counter) -> i32 {
    match ctx.get_stackid(&STACKS, flags) {
        Ok(id) => id as i32,
        Err(EFAULT) => stack::NONE,
        Err(_) => {
            counters::add(lost, 1);
            stack::LOST
        }
    }
}

/// Adds one to the key's count; false when the map is full.
#[inline(always)]
fn increment(key: &SampleKey) -> bool {
    if let Some(count) = CPU_SAMPLES.get_ptr_mut(key) {
        atomic::add(count, 1);
        return true;
    }
    // BPF_NOEXIST: another CPU may have inserted the key since the lookup; then add to it.
    if CPU_SAMPLES.insert(key, 1, aya_ebpf::bindings::BPF_NOEXIST as u64).is_ok() {
        return true;
    }
    match CPU_SAMPLES.get_ptr_mut(key) {
        Some(count) => {
            atomic::add(count, 1);
            true
        }
        None => false,
    }
}
