//! Holds a launched command at its dynamic loader until userspace knows where its libraries
//! are. A program's stacks are unwound from tables that userspace writes once it has read the
//! process's maps, and until then a stack through code without frame pointers stops at its
//! first such frame: a program that calls into its libraries within milliseconds of its exec
//! (a CUDA program's first API calls) would have those calls' stacks cut short. The loader
//! calls `_dl_debug_state` when its list of objects changes and again once that list is
//! consistent; at the second call every library the program starts with is mapped and none of
//! the program's code has run, so this program stops the process there, once.

use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user, generated::bpf_get_attach_cookie},
    macros::{map, uprobe},
    maps::Array,
    programs::ProbeContext,
};
use sysprof_common::loader::{HELD, RT_CONSISTENT, SIGSTOP, TO_STOP};

/// `[to stop, held]`: the process to stop, 0 once stopped; the process stopped, until
/// userspace continues it (see `sysprof_common::names::LOADER_GATE`).
#[map]
pub static LOADER_GATE: Array<u32> = Array::with_max_entries(2, 0);

/// Whether `tgid` is the command held at its loader now.
#[inline(always)]
pub fn held(tgid: u32) -> bool {
    LOADER_GATE.get(HELD).is_some_and(|held| *held == tgid)
}

/// At `_dl_debug_state`, attached for the launched command only; the attachment's cookie is
/// where the loader's `_r_debug.r_state` lies, relative to the function.
#[uprobe]
pub fn loader_ready(ctx: ProbeContext) -> u32 {
    ready(&ctx)
}

/// `loader_ready` for a multi-uprobe link (Linux 6.10+ for one process's), which needs no
/// CAP_SYS_ADMIN (see `calls.rs`).
#[uprobe(multi)]
pub fn loader_ready_multi(ctx: ProbeContext) -> u32 {
    ready(&ctx)
}

#[inline(always)]
fn ready(ctx: &ProbeContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let Some(gate) = LOADER_GATE.get_ptr_mut(TO_STOP) else { return 0 };
    // SAFETY: the map's one entry, a u32 this program and userspace only read and overwrite.
    if unsafe { *gate } != tgid {
        return 0;
    }
    // SAFETY: plain helper call on this program's context.
    let offset = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let state_at = crate::calls::instruction_pointer(ctx).wrapping_add(offset);
    // SAFETY: a checked read of the process's memory.
    if unsafe { bpf_probe_read_user(state_at as *const i32) } != Ok(RT_CONSISTENT) {
        return 0;
    }
    // SAFETY: as above; the gate closes before the signal, so it is sent once.
    unsafe { *gate = 0 };
    if let Some(held) = LOADER_GATE.get_ptr_mut(HELD) {
        // SAFETY: as above.
        unsafe { *held = tgid };
    }
    // SAFETY: plain helper call: SIGSTOP to the current process, delivered on its return to
    // user mode, before the loader's next instruction.
    unsafe { aya_ebpf::helpers::generated::bpf_send_signal(SIGSTOP) };
    0
}
