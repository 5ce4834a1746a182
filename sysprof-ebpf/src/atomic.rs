//! Atomic adds on map values shared by all CPUs.

use core::intrinsics::{AtomicOrdering, atomic_xadd};

/// Adds `n` to the `u64` at `value`, atomically with respect to other CPUs.
#[inline(always)]
pub fn add(value: *mut u64, n: u64) {
    // SAFETY: callers pass pointers to map values, which are 8-byte aligned and stay valid for
    // the program's run.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(value, n) };
}

/// Adds `n` to the `u32` at `value`, atomically with respect to other CPUs.
#[inline(always)]
pub fn add32(value: *mut u32, n: u32) {
    // SAFETY: as for `add`, with 4-byte alignment.
    unsafe { atomic_xadd::<u32, u32, { AtomicOrdering::Relaxed }>(value, n) };
}

/// Sets the bits of `bits` in the `u64` at `value`, atomically with respect to other CPUs
/// (and to userspace, for a memory-mapped map).
#[inline(always)]
pub fn or(value: *mut u64, bits: u64) {
    // SAFETY: as for `add`.
    unsafe { core::intrinsics::atomic_or::<u64, u64, { AtomicOrdering::Relaxed }>(value, bits) };
}
