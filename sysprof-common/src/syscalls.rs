//! The syscall family's shared types: per-syscall statistics, errors, and the per-CPU state of
//! the call in flight.

use core::mem::size_of;

use crate::histogram::LatencyHistogram;

/// Key of the syscall statistics: one syscall of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SyscallKey {
    pub tgid: u32,
    /// Syscall number of the running architecture.
    pub nr: u32,
}
shared!(SyscallKey, 8);

/// Calls, failures and latency of one syscall of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyscallStats {
    /// Every call (exact).
    pub calls: u64,
    /// Calls that returned an error, -4095..-1 (exact).
    pub errors: u64,
    /// Calls timed from entry; in bursts one stands for `syscall_sample_every`.
    pub timed: u64,
    /// Calls not sampled that then blocked (left the CPU): timed from the moment they blocked.
    pub timed_from_block: u64,
    /// Latency, weighted: its count and total estimate all calls when latency was sampled.
    pub latency: LatencyHistogram,
}
shared!(SyscallStats, size_of::<LatencyHistogram>() + 4 * 8);

/// Calls of one syscall counted on one CPU and not yet added to the shared statistics, how
/// many of them failed, and failures of one errno not yet added to `SYSCALL_ERRORS` (of timed
/// calls too): a loop failing the same way, as a compiler's readlinks and stats do, touches
/// neither shared map until the entry is evicted.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingCount {
    pub tgid: u32,
    pub nr: u32,
    /// Untimed calls, and how many of them failed (timed ones are in the shared statistics).
    pub count: u32,
    pub errors: u32,
    /// Failures with `errno`, of timed and untimed calls alike.
    pub errno: u32,
    pub errno_count: u32,
}
const _: () = assert!(size_of::<PendingCount>() == 24);

impl PendingCount {
    /// Its process and syscall as one number, `key_of`'s: aligned on 8 bytes, the two fields
    /// are one load and one comparison on the syscall programs' hot path, not two of each.
    #[inline(always)]
    pub fn key(&self) -> u64 {
        key_of(self.tgid, self.nr)
    }

    #[inline(always)]
    pub fn set_key(&mut self, key: u64) {
        (self.tgid, self.nr) = (key as u32, (key >> 32) as u32);
    }
}

/// Process `tgid`'s syscall `nr` as one number.
#[inline(always)]
pub fn key_of(tgid: u32, nr: u32) -> u64 {
    u64::from(nr) << 32 | u64::from(tgid)
}

/// Entries of the per-CPU pending-count cache (a power of two): enough that a process's
/// common syscalls seldom share one, and so evict each other.
pub const PENDING_COUNTS: usize = 16;

/// One syscall in progress.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InFlight {
    pub tgid: u32,
    pub nr: u32,
    /// Start, or 0 when this call was not sampled (yet: it is timed if it blocks).
    pub start_ns: u64,
    /// How many calls this timing stands for.
    pub weight: u32,
    /// 1 while the call is in progress.
    pub active: u32,
    /// 1 when timed from the moment it blocked rather than from entry.
    pub from_block: u32,
    pub _pad: u32,
    /// The first three arguments, for the address-space syscalls only (else zero).
    pub args: [u64; 3],
}
const _: () = assert!(size_of::<InFlight>() == 56);

/// The syscall programs' per-CPU state: the call in flight on this CPU, the stretch of calls
/// of the thread on it, and counts not yet moved to the shared map (userspace adds those at
/// the end).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallSlot {
    pub tid: u32,
    /// Calls the thread made since it last got this CPU.
    pub stretch_calls: u32,
    /// In a burst, the calls left to go untimed before the next timed one: drawn at random
    /// after each timed call.
    pub untimed_left: u32,
    pub _pad: u32,
    pub call: InFlight,
    pub pending: [PendingCount; PENDING_COUNTS],
}
shared!(SyscallSlot, 16 + 56 + 24 * PENDING_COUNTS);

/// Each CPU's state, kept by its programs in one per-CPU map (`names::CPU_STATE`): the note of
/// the task on it (see the BPF side's `target.rs`) and the syscall programs' slot. One value, so
/// that a syscall's two programs find both with one lookup each: a per-CPU map's lookup costs
/// a program about 2 ns (kernel statistics on a getppid loop).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuState {
    /// The current task's `pid_tgid`, with the marks of the verdict on it.
    pub note: u64,
    /// The notes' epoch (`names::NOTES_EPOCH`) the note was made in.
    pub note_epoch: u32,
    pub _pad: u32,
    pub syscall: SyscallSlot,
}
shared!(CpuState, 16 + size_of::<SyscallSlot>());

/// Key of the failed-call counts: one errno of one syscall of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SyscallErrorKey {
    pub tgid: u32,
    pub nr: u32,
    pub errno: u32,
    pub _pad: u32,
}
shared!(SyscallErrorKey, 16);
