//! Which tasks are part of the target, decided in the kernel so that nothing else is copied out.

use aya_ebpf::helpers::{bpf_get_current_ancestor_cgroup_id, bpf_get_current_comm};
use sysprof_common::{Counter, filter};

use crate::{config::config, counters, maps::TARGETS};

/// Whether the current task belongs to the target.
#[inline(always)]
pub fn is_current_target(tgid: u32) -> bool {
    let config = config();
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
    }
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
