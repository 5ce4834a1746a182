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

/// Whether a wait or a system call of `ns` is long enough to be recorded.
#[inline(always)]
pub fn long_enough(ns: u64) -> bool {
    let min_us = config().timeline_min_us;
    min_us != 0 && ns >= u64::from(min_us) * 1000
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
