//! Latency distributions: the kernel's log-linear buckets turned into an HDR histogram
//! (hdrhistogram), and the percentiles reports quote.

use hdrhistogram::Histogram;
use serde::Serialize;
use sysprof_common::{LatencyHistogram, histogram};

/// Percentiles of a latency distribution, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub total_ns: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    /// Exact: the kernel keeps the maximum itself.
    pub max_ns: u64,
}

/// An HDR histogram holding the kernel's counts. Each bucket's count is recorded at the
/// bucket's midpoint, so a percentile is off by at most half a bucket (6.25%).
pub fn to_hdr(kernel: &LatencyHistogram) -> Histogram<u64> {
    let mut hdr = Histogram::<u64>::new(3).expect("3 significant figures is a valid precision");
    for (index, &count) in kernel.buckets.iter().enumerate() {
        if count == 0 {
            continue;
        }
        let (low, high) = histogram::bucket_range(index);
        let midpoint = low + (high - low) / 2;
        // Never report more than the true maximum.
        let value = if kernel.max_ns > 0 { midpoint.min(kernel.max_ns) } else { midpoint };
        hdr.record_n(value.max(1), u64::from(count)).expect("auto-resizing histograms take any value");
    }
    hdr
}

/// Percentiles of a kernel histogram.
pub fn percentiles(kernel: &LatencyHistogram) -> Percentiles {
    let hdr = to_hdr(kernel);
    Percentiles {
        count: kernel.count,
        total_ns: kernel.total_ns,
        p50_ns: hdr.value_at_quantile(0.50),
        p90_ns: hdr.value_at_quantile(0.90),
        p99_ns: hdr.value_at_quantile(0.99),
        max_ns: kernel.max_ns,
    }
}

/// Adds `other` into `into` (bucket by bucket; the counts stay exact).
pub fn merge(into: &mut LatencyHistogram, other: &LatencyHistogram) {
    into.count += other.count;
    into.total_ns += other.total_ns;
    into.max_ns = into.max_ns.max(other.max_ns);
    for (a, b) in into.buckets.iter_mut().zip(other.buckets.iter()) {
        *a = a.saturating_add(*b);
    }
}

/// An empty kernel histogram.
pub fn empty() -> LatencyHistogram {
    LatencyHistogram { count: 0, total_ns: 0, max_ns: 0, buckets: [0; histogram::BUCKETS] }
}

/// "1.23 ms", "456 ns", "2.0 s".
pub fn format_ns(ns: u64) -> String {
    match ns {
        0..1_000 => format!("{ns} ns"),
        1_000..1_000_000 => format!("{:.1} µs", ns as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2} ms", ns as f64 / 1e6),
        _ => format!("{:.2} s", ns as f64 / 1e9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel side's recording, done here on plain values.
    fn kernel_histogram(values: &[u64]) -> LatencyHistogram {
        let mut hist = empty();
        for &value in values {
            hist.count += 1;
            hist.total_ns += value;
            hist.max_ns = hist.max_ns.max(value);
            hist.buckets[histogram::bucket_of(value)] += 1;
        }
        hist
    }

    #[test]
    fn percentiles_are_within_half_a_bucket() {
        // 90 calls of 1 ms and 10 of 20 ms.
        let mut values = vec![1_000_000u64; 90];
        values.extend([20_000_000u64; 10]);
        let p = percentiles(&kernel_histogram(&values));
        assert_eq!(p.count, 100);
        assert_eq!(p.total_ns, 290_000_000);
        assert_eq!(p.max_ns, 20_000_000);
        let close = |got: u64, want: u64| (got as f64 - want as f64).abs() / want as f64 <= 0.0625;
        assert!(close(p.p50_ns, 1_000_000), "p50 {}", p.p50_ns);
        assert!(close(p.p90_ns, 1_000_000), "p90 {}", p.p90_ns);
        assert!(close(p.p99_ns, 20_000_000), "p99 {}", p.p99_ns);
    }

    #[test]
    fn merging_adds_counts() {
        let mut a = kernel_histogram(&[100, 200]);
        merge(&mut a, &kernel_histogram(&[300]));
        assert_eq!((a.count, a.total_ns, a.max_ns), (3, 600, 300));
        assert_eq!(a.buckets.iter().map(|&c| u64::from(c)).sum::<u64>(), 3);
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(format_ns(999), "999 ns");
        assert_eq!(format_ns(1_500), "1.5 µs");
        assert_eq!(format_ns(2_345_678), "2.35 ms");
        assert_eq!(format_ns(3_000_000_000), "3.00 s");
    }
}
