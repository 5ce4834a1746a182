//! Python frames: what userspace tells the BPF side about each process running CPython (where
//! its interpreter state is, and the layout of the structs it walks), and how a Python frame is
//! recorded among a stack's native frames.
//!
//! A walked user stack (`unwind::UnwoundStack`) holds both kinds: a native frame is a user
//! address, which never has bit 47 set on x86_64; a Python frame has it set, with its code
//! object's address below it and its instruction offset and "entry" mark above.

/// Bit 47: a Python frame, not a native address.
pub const FRAME_PYTHON: u64 = 1 << 47;
/// Bit 63: the outermost Python frame one call of the interpreter's C evaluation function ran
/// (the frames up to it stand for that call's native frame).
pub const FRAME_ENTRY: u64 = 1 << 63;
/// The code object's address: the low 47 bits.
pub const FRAME_CODE_MASK: u64 = FRAME_PYTHON - 1;
/// The instruction offset, in code units (2 bytes), in bits 48..63: capped at its largest.
pub const FRAME_OFFSET_SHIFT: u32 = 48;
pub const FRAME_OFFSET_MAX: u64 = (1 << 15) - 1;

/// Python frames a stack keeps, innermost first; the rest of `MAX_FRAMES` is native.
pub const MAX_PYTHON_FRAMES: usize = 64;

/// How the frames of one call of the evaluation function are told apart.
pub mod entry {
    /// 3.10: each frame is evaluated by a call of its own.
    pub const EVERY_FRAME: u32 = 0;
    /// 3.11: a byte flag in the frame (`_PyInterpreterFrame.is_entry`).
    pub const FLAG: u32 = 1;
    /// 3.12+: a shim frame owned by the C stack (`owner == FRAME_OWNED_BY_CSTACK`) sits below
    /// the frames of each call.
    pub const SHIM: u32 = 2;
}

/// `_PyInterpreterFrame.owner` of the C stack's shim frames (3.12+).
pub const OWNED_BY_CSTACK: u8 = 3;

/// Where a thread's state is matched to the thread being sampled.
pub mod thread_match {
    /// `PyThreadState.native_thread_id` (3.11+) is the kernel's thread id.
    pub const NATIVE_ID: u32 = 0;
    /// `PyThreadState.thread_id` is `pthread_self()`, which on x86_64 glibc is the thread's
    /// fs base (3.10 has nothing else).
    pub const PTHREAD_SELF: u32 = 1;
}

/// One CPython process, written by userspace: the struct offsets are its version's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PythonProcess {
    /// `PY_VERSION_HEX >> 16`: 0x030a for 3.10.
    pub version: u32,
    pub _pad: u32,
    /// Address of `_PyRuntime.interpreters.head` in the process.
    pub interpreters_head: u64,
    /// `PyInterpreterState.threads.head`.
    pub interp_threads: u32,
    /// `PyThreadState.next`.
    pub thread_next: u32,
    /// The thread id `thread_match` compares, in `PyThreadState`.
    pub thread_id: u32,
    /// One of `thread_match`.
    pub thread_match: u32,
    /// `PyThreadState.frame` (3.10), `.cframe` (3.11, 3.12) or `.current_frame` (3.13+).
    pub thread_frame: u32,
    /// `_PyCFrame.current_frame` where `thread_frame` points at a `_PyCFrame`; `u32::MAX`
    /// where it points at the frame.
    pub cframe_frame: u32,
    /// The frame's caller: `f_back` (3.10), `previous` (3.11+).
    pub frame_previous: u32,
    /// The frame's code object: `f_code` (3.10-3.12), `f_executable` (3.13+).
    pub frame_code: u32,
    /// 3.10: `f_lasti` (an int: the instruction index); 3.11+: `prev_instr`/`instr_ptr` (a
    /// pointer into the code object's instructions).
    pub frame_instruction: u32,
    /// `is_entry` (3.11) or `owner` (3.12+), per `entry`.
    pub frame_entry: u32,
    /// One of `entry`.
    pub entry: u32,
    /// `PyCodeObject.co_code_adaptive`: where the instructions start in a code object
    /// (3.11+); 0 with `f_lasti`.
    pub code_instructions: u32,
}
shared!(PythonProcess, 8 + 8 + 12 * 4);

pub const PROCESSES: &str = "PYTHON_PROCESSES";
pub const MAX_PROCESSES: u32 = 256;
/// Array of one u32, 1 once userspace has written an entry in [`PROCESSES`]: until then no
/// process can have Python frames, and the programs skip the lookup.
pub const ANY_PROCESS: &str = "PYTHON_ANY_PROCESS";
