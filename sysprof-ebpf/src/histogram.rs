//! Recording into the log-linear latency histograms shared with userspace.

use sysprof_common::{LatencyHistogram, histogram};

use crate::atomic;

/// Adds one value (ns) to a histogram in a map shared by all CPUs.
#[inline(always)]
pub fn record(hist: &mut LatencyHistogram, value: u64) {
    record_weighted(hist, value, 1);
}

/// Adds a value (ns) that stands for `weight` events (sampled measurements).
#[inline(always)]
pub fn record_weighted(hist: &mut LatencyHistogram, value: u64, weight: u32) {
    atomic::add(&raw mut hist.count, u64::from(weight));
    atomic::add(&raw mut hist.total_ns, value * u64::from(weight));
    // A race between CPUs may keep the smaller of two maxima arriving together: rare, and off
    // by at most one event.
    if value > hist.max_ns {
        hist.max_ns = value;
    }
    // LLVM proves the index in range and drops the check; the verifier cannot prove it. The
    // volatile read hides the proof from LLVM so the check the verifier needs stays.
    let index = histogram::bucket_of(value);
    // SAFETY: reading a local.
    let index = unsafe { core::ptr::read_volatile(&index) };
    if index < histogram::BUCKETS {
        atomic::add32(&raw mut hist.buckets[index], weight);
    }
}
