//! The timeline's ring buffer, and the one way into it (see `sysprof_common::timeline`). A leaf
//! module: the sampler, the scheduler, the syscall and the call programs each record their own
//! events here when the timeline is on (`Config::timeline_min_us`), after their own filters.
//!
//! Submitted without a wakeup: userspace drains the ring on its tick, so a busy target costs
//! no wakeup of sysprof per event. While userspace rests (`events::take_resting`: its tick is
//! a quarter of a second), the event that finds the ring a quarter full wakes it: a target
//! that goes from idle to busy fills the ring in less than that.

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    macros::map,
    maps::RingBuf,
};
use sysprof_common::{Counter, timeline::TimelineEvent};

use crate::{config::config, counters};

#[map]
static TIMELINE: RingBuf = RingBuf::with_byte_size(sysprof_common::timeline::CAPACITY, 0);

/// Whether the timeline is on.
#[inline(always)]
pub fn on() -> bool {
    config().timeline_min_us != 0
}

/// The shortest wait, system call or call userspace still keeps, once the timeline's bound
/// has raised it past `Config::timeline_min_us` (ns; 0 until then). Userspace writes it as it
/// raises it (`sysprof_common::names::TIMELINE_RAISED_MIN`): what falls under it would be
/// dropped on arrival, so it is not sent. A probed call's return spent a fifth of its run
/// time on its timeline event (a `--func` loop, kernel statistics).
#[unsafe(no_mangle)]
#[unsafe(link_section = ".data.timeline_min")]
static mut TIMELINE_RAISED_MIN_NS: u64 = 0;

/// Whether a wait or a system call of `ns` is long enough to be recorded.
#[inline(always)]
pub fn long_enough(ns: u64) -> bool {
    let min_us = config().timeline_min_us;
    min_us != 0 && ns >= u64::from(min_us) * 1000 && not_under_raised(ns)
}

/// Whether a probed call of `ns` is recorded: any, until the bound raised the minimum.
#[inline(always)]
pub fn call_kept(ns: u64) -> bool {
    not_under_raised(ns)
}

/// Whether `ns` is at least the raised minimum; what is not, userspace counts as thinned.
#[inline(always)]
fn not_under_raised(ns: u64) -> bool {
    // SAFETY: a plain read of the global.
    let raised = unsafe { *(&raw const TIMELINE_RAISED_MIN_NS) };
    if ns < raised {
        counters::add(Counter::TimelineThinned, 1);
        return false;
    }
    true
}

/// Records one event; a full ring counts a loss. One helper call that copies the event in
/// (`bpf_ringbuf_output`), not a reserve then a submit: two calls cost more than the copy of
/// 48 bytes (a probed call's return took 5 ns less, kernel statistics on).
#[inline(always)]
pub fn record(event: TimelineEvent) {
    if TIMELINE.output::<TimelineEvent>(&event, wakeup()).is_err() {
        counters::add(Counter::TimelineLost, 1);
    }
}

/// No wakeup, but for the event that finds the ring a quarter full while userspace rests.
#[inline(always)]
fn wakeup() -> u64 {
    if crate::events::resting()
        && TIMELINE.query(BPF_RB_AVAIL_DATA as u64) >= u64::from(sysprof_common::timeline::CAPACITY / 4)
        && crate::events::take_resting()
    {
        return BPF_RB_FORCE_WAKEUP as u64;
    }
    BPF_RB_NO_WAKEUP as u64
}
