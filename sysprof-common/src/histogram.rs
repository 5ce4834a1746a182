//! Log-linear latency buckets: exact below 16 ns, then 8 buckets per power of two (at most
//! 12.5% wide), up to 2^42 ns (73 minutes); longer values share the last bucket. The kernel
//! side counts into them with [`bucket_of`]; userspace turns each bucket back into
//! its range with [`bucket_range`], so the conversion to an HDR histogram loses
//! nothing the kernel kept.

/// Sub-buckets per power of two, as a power of two.
pub const SUB_BITS: u32 = 3;
/// Number of buckets.
pub const BUCKETS: usize = 320;

/// The bucket of a value in nanoseconds.
#[inline(always)]
pub fn bucket_of(value: u64) -> usize {
    const LINEAR: u64 = 1 << (SUB_BITS + 1);
    if value < LINEAR {
        return value as usize;
    }
    let log = 63 - value.leading_zeros();
    let sub = (value >> (log - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    let index = (((log - SUB_BITS + 1) as u64) << SUB_BITS) + sub;
    if index >= BUCKETS as u64 { BUCKETS - 1 } else { index as usize }
}

/// The values `[low, high)` a bucket holds.
pub fn bucket_range(index: usize) -> (u64, u64) {
    const LINEAR: usize = 1 << (SUB_BITS + 1);
    if index < LINEAR {
        return (index as u64, index as u64 + 1);
    }
    let log = (index >> SUB_BITS) as u32 + SUB_BITS - 1;
    let sub = (index & ((1 << SUB_BITS) - 1)) as u64;
    let step = 1u64 << (log - SUB_BITS);
    let low = ((1 << SUB_BITS) + sub) << (log - SUB_BITS);
    (low, low + step)
}

/// A latency distribution aggregated in the kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyHistogram {
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    /// Counts per [`histogram`] bucket.
    pub buckets: [u32; BUCKETS],
}
shared!(LatencyHistogram, 3 * 8 + 4 * BUCKETS);
