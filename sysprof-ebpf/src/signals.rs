//! Signals delivered to the target: counted per process, signal, sender and disposition, in
//! the kernel. `signal_deliver` runs in the receiving thread as it takes the signal off its
//! queue (get_signal), so the target filter is the current task's and nothing else is read.

use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    macros::{btf_tracepoint, map},
    maps::{HashMap, PerCpuArray},
    programs::BtfTracePointContext,
};
use sysprof_common::signals::{self, SignalKey, action, origin};

use crate::{maps::add_count, target, window};

#[map]
static SIGNALS: HashMap<SignalKey, u64> = HashMap::with_max_entries(signals::CAPACITY, 0);

#[map]
static SIGNALS_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// `si_code` values of signals a process sent (include/uapi/asm-generic/siginfo.h).
const SI_USER: i32 = 0;
const SI_QUEUE: i32 = -1;
const SI_TIMER: i32 = -2;
const SI_TKILL: i32 = -6;

use sysprof_common::loader::SIGSTOP;

/// `signal_deliver(int sig, struct kernel_siginfo *info, struct k_sigaction *ka)`.
#[btf_tracepoint(function = "signal_deliver")]
pub fn signal_deliver(ctx: BtfTracePointContext) -> i32 {
    let Some(pid_tgid) = target::current_target() else { return 0 };
    let tgid = (pid_tgid >> 32) as u32;
    if !window::open() {
        return 0;
    }
    let key = key_of(&ctx, tgid);
    // sysprof's own stop of a launched command at its loader is its instrument, not a signal
    // the target got from anyone (Part B says how long it held the command).
    if key.signal == SIGSTOP && crate::loader::held(tgid) {
        return 0;
    }
    if !add_count(&SIGNALS, &key, 1)
        && let Some(lost) = SIGNALS_LOST.get_ptr_mut(0)
    {
        // SAFETY: a per-CPU slot, used by one program at a time on this CPU.
        unsafe { *lost += 1 };
    }
    0
}

/// The signal, who sent it and the disposition it meets.
#[inline(always)]
fn key_of(ctx: &BtfTracePointContext, tgid: u32) -> SignalKey {
    let signal = ctx.arg::<u64>(0) as u32;
    let info: *const i32 = ctx.arg(1);
    let sigaction: *const u64 = ctx.arg(2);
    // SAFETY: kernel pointers the tracepoint passes; a failed read is a zero. si_code is the
    // third int of kernel_siginfo (after si_signo and si_errno), sa_handler the first word of
    // k_sigaction.
    let code = unsafe { bpf_probe_read_kernel(info.wrapping_add(2)) }.unwrap_or(SI_USER);
    // SAFETY: as above.
    let handler = unsafe { bpf_probe_read_kernel(sigaction) }.unwrap_or(0);
    SignalKey {
        tgid,
        signal,
        origin: match code {
            SI_USER | SI_QUEUE | SI_TKILL => origin::PROCESS,
            SI_TIMER => origin::TIMER,
            _ => origin::KERNEL,
        },
        action: match handler {
            0 => action::DEFAULT,
            1 => action::IGNORED,
            _ => action::HANDLER,
        },
    }
}
