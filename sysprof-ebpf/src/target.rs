//! Which tasks are part of the target, decided in the kernel so that nothing else is copied out.

use aya_ebpf::{
    helpers::{bpf_get_current_ancestor_cgroup_id, bpf_get_current_comm},
    macros::map,
    maps::PerCpuArray,
};
use sysprof_common::{Counter, filter};

use crate::{
    atomic,
    config::config,
    counters,
    maps::{TARGETS, TARGETS_GENERATION},
    task_state::{NOT_TARGET, TARGET, TaskState},
};

/// Whether the current task belongs to the target.
#[inline(always)]
pub fn is_current_target(tgid: u32) -> bool {
    let config = config();
    if tgid == config.self_tgid {
        // sysprof is its own target only while it put itself in TARGETS (probe calibration).
        return is_target_process(tgid);
    }
    match config.filter {
        filter::ALL => true,
        filter::CGROUP => {
            // SAFETY: plain helper call; the level comes from userspace's reading of the
            // cgroup path.
            let ancestor = unsafe { bpf_get_current_ancestor_cgroup_id(config.cgroup_level as i32) };
            ancestor == config.cgroup_id
        }
        _ => is_target_process(tgid),
    }
}

/// Whether `tgid` is in the target set (filter::TARGETS).
#[inline(always)]
pub fn is_target_process(tgid: u32) -> bool {
    // SAFETY: the value is only tested for presence.
    unsafe { TARGETS.get(tgid).is_some() }
}

/// Adds a process to the target set, counting the ones that do not fit.
#[inline(always)]
pub fn add_target_process(tgid: u32) {
    if TARGETS.insert(tgid, 1, 0).is_err() {
        counters::add(Counter::TargetsFull, 1);
        return;
    }
    if let Some(generation) = TARGETS_GENERATION.get_ptr_mut(0) {
        atomic::add(generation, 1);
    }
}

/// The last verdict of `is_current_target` on this CPU.
#[repr(C)]
pub struct TargetCache {
    tgid: u32,
    verdict: u32,
    /// `TARGETS_GENERATION` + 1 when the verdict was reached; 0 means empty.
    generation: u64,
}

#[map]
static TARGET_CACHE: PerCpuArray<TargetCache> = PerCpuArray::with_max_entries(1, 0);

/// `is_current_target`, remembered per CPU for the last process: a thread making syscalls in a
/// loop pays for the target lookup once, not per call.
#[inline(always)]
pub fn is_current_target_cached(tgid: u32) -> bool {
    if config().filter == filter::ALL && tgid != config().self_tgid {
        return true;
    }
    let (Some(cache), Some(generation)) = (TARGET_CACHE.get_ptr_mut(0), TARGETS_GENERATION.get(0)) else {
        return is_current_target(tgid);
    };
    // SAFETY: a per-CPU slot, used by one program at a time on this CPU.
    let cache = unsafe { &mut *cache };
    let generation = *generation + 1;
    if cache.tgid == tgid && cache.generation == generation {
        return cache.verdict != 0;
    }
    let verdict = is_current_target(tgid);
    cache.tgid = tgid;
    cache.verdict = u32::from(verdict);
    cache.generation = generation;
    verdict
}

/// Whether the current task's name is the one `--comm` asked for.
#[inline(always)]
pub fn current_comm_matches() -> bool {
    let wanted = &config().comm;
    if wanted[0] == 0 {
        return false;
    }
    match bpf_get_current_comm() {
        Ok(comm) => comm == *wanted,
        Err(_) => false,
    }
}

/// Whether the current task, whose state this is, belongs to the target: decided on first use
/// and remembered in the task's storage, so the filter runs once per task, not per event.
#[inline(always)]
pub fn decide_current(state: &mut TaskState) -> bool {
    match state.target {
        TARGET => true,
        NOT_TARGET => false,
        _ => {
            let pid_tgid = aya_ebpf::helpers::bpf_get_current_pid_tgid();
            let tgid = (pid_tgid >> 32) as u32;
            // The idle task (pid 0) is never a scheduling target: it is what runs when nothing is.
            let yes = pid_tgid as u32 != 0 && is_current_target(tgid);
            state.target = if yes { TARGET } else { NOT_TARGET };
            state.tgid = tgid;
            state.tid = pid_tgid as u32;
            yes
        }
    }
}
