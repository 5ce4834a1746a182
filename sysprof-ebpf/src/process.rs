//! Process life cycle: follows the target's new child processes into the target set, applies
//! `--comm` at exec, and tells userspace about forks, execs and exits so that it can read each
//! process's memory map (for symbolization) while the process still exists.
//!
//! Raw tracepoints: no tracefs needed, and cheaper than classic tracepoints.

use aya_ebpf::{
    bindings::task_struct,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel, generated::bpf_get_current_task_btf},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use sysprof_common::{exec_id, filter, process_event};

use crate::{
    config::config,
    events::emit,
    target,
    task_state::{TASK_STATE, UNDECIDED},
};

/// `sched_process_fork(struct task_struct *parent, struct task_struct *child)`, run by the parent.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn process_fork(ctx: RawTracePointContext) -> i32 {
    try_process_fork(&ctx);
    0
}

#[inline(always)]
fn try_process_fork(ctx: &RawTracePointContext) {
    let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !target::is_current_target(parent) {
        return;
    }
    let config = config();
    if config.task_tgid_offset == 0 {
        return;
    }
    let child: *const u8 = ctx.arg(1);
    // SAFETY: `child` is the tracepoint's task_struct; the offset comes from kernel BTF and the
    // read is checked by the helper.
    let Ok(child_tgid) =
        (unsafe { bpf_probe_read_kernel(child.add(config.task_tgid_offset as usize) as *const i32) })
    else {
        return;
    };
    let child_tgid = child_tgid as u32;
    if child_tgid == parent {
        // A new thread: already covered by its process.
        return;
    }
    if config.filter == filter::TARGETS {
        target::add_target_process(child_tgid);
    }
    // When it started, for userspace to know it by (see `ProcessEvent::started_ns`).
    let started_ns = match config.task_start_boottime_offset {
        0 => 0,
        // SAFETY: as above.
        offset => unsafe { bpf_probe_read_kernel(child.add(offset as usize) as *const u64) }.unwrap_or(0),
    };
    emit(process_event::FORK, child_tgid, parent, 0, started_ns);
}

/// `sched_process_exec(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)`,
/// run by the process after its new image is in place.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn process_exec(_ctx: RawTracePointContext) -> i32 {
    try_process_exec();
    0
}

#[inline(always)]
fn try_process_exec() {
    // A new program may change whether the task is a target (--comm, or `-- CMD` released
    // from its gate): decide again on its next event.
    if let Some(state) = TASK_STATE.current(false) {
        state.target = UNDECIDED;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let known = target::is_current_target(tgid);
    let joins = !known && config().filter == filter::TARGETS && target::current_comm_matches();
    if joins {
        target::add_target_process(tgid);
    }
    // After the set's verdict on the new program: a note made before a --comm match added it
    // would say it is outside until its next switch.
    target::renote_current();
    if !known && !joins {
        return;
    }
    // The old program's mappings are gone: frame pointers until userspace writes the new ones.
    crate::unwind::forget(tgid);
    // And its heap blocks.
    crate::memory::heap::exec_ended(tgid);
    // The new image's generation: what the stacks taken in it are keyed by from now on.
    emit(process_event::EXEC, tgid, 0, current_exec_id(), 0);
}

/// The program image `task` runs (see `sysprof_common::exec_id`): its `self_exec_id`, read
/// straight from the BTF task pointer (a load the verifier checks against the task's type, no
/// helper call). Every stack's key holds it, so it costs one load where the task is at hand.
#[inline(always)]
pub fn exec_id_of(task: *const task_struct) -> u32 {
    match config().task_exec_id_offset {
        0 => exec_id::UNKNOWN,
        // The low half of a u64 (a u32 before 5.7): little-endian, at the field's own offset.
        offset => target::task_field::<u32>(task, offset),
    }
}

/// The image the current task runs (see [`exec_id_of`]).
#[inline(always)]
pub fn current_exec_id() -> u32 {
    // SAFETY: plain helper call: the current task, a trusted BTF pointer.
    exec_id_of(unsafe { bpf_get_current_task_btf() })
}

/// `sched_process_exit(struct task_struct *p)`, run by each exiting thread.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn process_exit(ctx: RawTracePointContext) -> i32 {
    try_process_exit(&ctx);
    0
}

#[inline(always)]
fn try_process_exit(ctx: &RawTracePointContext) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !target::is_current_target(tgid) {
        return;
    }
    crate::memory::faults::count_exiting_thread(tgid, pid_tgid as u32);
    if !process_ends(ctx, pid_tgid) {
        return;
    }
    // Its pid may be reused by a process with other mappings.
    crate::unwind::forget(tgid);
    emit(process_event::EXIT, tgid, 0, 0, 0);
}

/// Whether the exiting thread is its process's last: the kernel has counted it out of
/// `signal->live` before this tracepoint, so none is left running when that is 0. A leader
/// may end before its other threads (`pthread_exit` in main): its exit was once taken for the
/// process's, whose other threads then went on unseen by userspace, unwound by frame pointers
/// only, and `--pid` ended its trace. Where the offsets are unknown, the leader's exit stands
/// for the process's.
#[inline(always)]
fn process_ends(ctx: &RawTracePointContext, pid_tgid: u64) -> bool {
    let config = config();
    let leader = pid_tgid as u32 == (pid_tgid >> 32) as u32;
    if config.task_signal_offset == 0 || config.signal_live_offset == 0 {
        return leader;
    }
    let task: *const u8 = ctx.arg(0);
    // SAFETY: `task` is the tracepoint's task_struct and the offsets come from kernel BTF;
    // the helper checks each read.
    let live = unsafe {
        bpf_probe_read_kernel(task.add(config.task_signal_offset as usize) as *const *const u8).and_then(
            |signal| bpf_probe_read_kernel(signal.add(config.signal_live_offset as usize) as *const i32),
        )
    };
    match live {
        Ok(live) => live == 0,
        Err(_) => leader,
    }
}

/// Tells userspace that a target process mapped executable memory (see
/// `process_event::MAPPED`); called by the syscall exit program. Not inlined: its event needs
/// stack, which would put that program on a private stack for every call.
#[inline(never)]
pub fn executable_mapped(tgid: u32) {
    emit(process_event::MAPPED, tgid, 0, 0, 0);
}
