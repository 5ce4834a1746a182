//! Probed calls (CUDA, NCCL, `--func`): the cookie layout, per-call-site statistics and the
//! events of the calls whose arguments matter.

use core::mem::size_of;

use crate::histogram::LatencyHistogram;

/// Probed calls (uprobes on libcudart, libcuda, libnccl and `--func` functions). Each
/// attachment carries a cookie: the function's id in the low 16 bits, [`call`] flags above.
pub mod call {
    /// Mask of the function id in a cookie.
    pub const ID_MASK: u64 = 0xffff;
    /// Send a [`crate::CallEvent`] with the arguments (transfers, allocations, NCCL, ...);
    /// otherwise the call is only counted and timed in `CALLS`.
    pub const EVENT: u64 = 1 << 16;
    /// Argument 0 points to where the function writes its result (an allocation's address, a
    /// communicator): read it at return.
    pub const OUT_ARG0: u64 = 1 << 17;
    /// Argument 0 is a `cudaMemcpy3DParms*`: the kernel side copies what the transfer needs
    /// into the event's arguments (see [`MEMCPY3D`]).
    pub const MEMCPY3D_PARAMS: u64 = 1 << 18;
    /// A negative return is an error (user functions); otherwise any non-zero return is
    /// (cudaError_t, CUresult, ncclResult_t).
    pub const ERROR_IF_NEGATIVE: u64 = 1 << 19;
    /// Key the statistics by argument 0 (the kernel launched), or by argument 1.
    pub const DETAIL_ARG0: u64 = 1 << 20;
    pub const DETAIL_ARG1: u64 = 1 << 21;
    /// An argument read is past the sixth (on the stack, above the return address, on
    /// x86-64): without this flag the entry reads the six in registers only. Two reads of user
    /// memory were a seventh to an eighth of a cudaMemcpy entry's run time (kernel statistics),
    /// and only the 2D copies and ncclReduce read so far.
    pub const STACK_ARGS: u64 = 1 << 22;
    /// The flags whose handling reads the call's arguments; a call with none of them is counted
    /// and timed by its site alone, and its entry reads no argument (each is a user read).
    pub const READS_ARGS: u64 = EVENT | OUT_ARG0 | MEMCPY3D_PARAMS | DETAIL_ARG0 | DETAIL_ARG1;

    /// Where `cudaMemcpy3DParms` fields land in a [`crate::CallEvent`]'s `args` (argument 0 stays
    /// the pointer): source pointer, width in bytes, height, depth, kind, destination pointer.
    pub mod memcpy3d {
        pub const SRC: usize = 1;
        pub const WIDTH: usize = 2;
        pub const HEIGHT: usize = 3;
        pub const DEPTH: usize = 4;
        pub const KIND: usize = 5;
        pub const DST: usize = 6;
    }

    /// Byte offsets in `struct cudaMemcpy3DParms` (CUDA 11 and 12, 64-bit).
    pub mod memcpy3d_offsets {
        pub const SRC_PTR: u64 = 32;
        pub const DST_PTR: u64 = 96;
        pub const EXTENT: u64 = 128;
        pub const KIND: u64 = 152;
    }
}

/// Key of probed-call statistics: one function, one call site, one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CallKey {
    pub tgid: u32,
    /// Function id (the cookie's low bits).
    pub func: u32,
    pub user_stack_id: i32,
    /// The image the stack and the caller were taken in (see [`crate::exec_id`]); 0 in a
    /// read-out saved before it was kept, where this was padding.
    pub exec_id: u32,
    /// What [`call::DETAIL_ARG0`]/[`call::DETAIL_ARG1`] chose (the kernel launched), else 0.
    pub detail: u64,
    /// The return address: the exact instruction after the call. A frame-pointer walk from a
    /// function's first instruction skips the immediate caller; this does not.
    pub caller: u64,
}
shared!(CallKey, 32);

/// Count, errors and latency of one [`CallKey`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallStats {
    pub errors: u64,
    pub latency: LatencyHistogram,
}
shared!(CallStats, 8 + size_of::<LatencyHistogram>());

/// One completed call whose arguments matter.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallEvent {
    pub func: u32,
    pub tgid: u32,
    pub tid: u32,
    pub user_stack_id: i32,
    /// `bpf_ktime_get_ns` at entry.
    pub start_ns: u64,
    pub duration_ns: u64,
    /// The return value, as the function's ABI returns it (read the low 32 bits for an `int`).
    pub ret: i64,
    /// The first eight arguments (registers, then the stack).
    pub args: [u64; 8],
    /// The value read through argument 0 at return ([`call::OUT_ARG0`]), else 0.
    pub out: u64,
    /// The return address (see [`CallKey::caller`]).
    pub caller: u64,
}
shared!(CallEvent, 4 * 4 + 3 * 8 + 8 * 8 + 2 * 8);
