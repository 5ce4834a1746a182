//! The user-stack unwinder's shared types: unwind tables built in userspace from each mapped
//! file's `.eh_frame` (or `.debug_frame`), the executable mappings of each traced process, and
//! the stacks the BPF unwinder walks with them (x86_64).
//!
//! A table is a sorted run of [`UnwindRow`]s in [`ROWS`], one run per file, shared by every
//! process that maps the file. Each row covers the addresses from its `pc` to the next row's
//! and says how to find the caller's frame there: the canonical frame address (CFA) from the
//! stack or frame pointer, and where the frame pointer was saved. The return address is always
//! at CFA - 8 on x86_64.

/// How a row finds the CFA.
pub mod cfa {
    /// No caller: the outermost frame, a signal frame, or an address no entry covers.
    pub const END: u8 = 0;
    /// CFA = rsp + offset.
    pub const RSP: u8 = 1;
    /// CFA = rbp + offset.
    pub const RBP: u8 = 2;
    /// A PLT stub: CFA = rsp + offset, plus 8 once the stub has pushed its argument (pc & 15 at
    /// or past the threshold kept in `rbp_offset`), as the linker's standard PLT expression
    /// says.
    pub const PLT: u8 = 3;
    /// A realigned stack (gcc's DRAP): CFA = *(rbp + offset).
    pub const RBP_DEREF: u8 = 4;
    /// An expression sysprof does not evaluate: walk by the frame pointer here.
    pub const FRAME_POINTER: u8 = 5;
}

/// Where a row finds the caller's frame pointer.
pub mod rbp {
    /// Not saved: the caller's rbp is the current one.
    pub const UNCHANGED: u8 = 0;
    /// Saved at CFA + `rbp_offset`.
    pub const SAVED: u8 = 1;
}

/// One row of an unwind table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    /// First address the row covers, in the file's own addresses (ELF virtual addresses).
    pub pc: u32,
    pub cfa_offset: i32,
    pub rbp_offset: i16,
    /// One of [`cfa`].
    pub cfa: u8,
    /// One of [`rbp`].
    pub rbp: u8,
}
shared!(UnwindRow, 12);

/// Rows per entry of [`ROWS`]. Userspace writes a table's rows through a shared mapping of the
/// array (created memory-mappable), all its chunks at once.
pub const ROWS_PER_CHUNK: usize = 256;

/// One entry of [`ROWS`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RowChunk {
    pub rows: [UnwindRow; ROWS_PER_CHUNK],
}
shared!(RowChunk, 12 * ROWS_PER_CHUNK);

/// One executable mapping of a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecMapping {
    pub start: u64,
    pub end: u64,
    /// Subtracted from an address to get the file's own address.
    pub bias: u64,
    /// The file's table: its first row's index in [`ROWS`] and its number of rows; 0 rows
    /// walks the mapping by frame pointers (no table, JIT code).
    pub first_row: u32,
    pub rows: u32,
}
shared!(ExecMapping, 32);

/// Mappings kept per process (a PyTorch process maps a few hundred libraries).
pub const MAPPINGS_PER_PROCESS: usize = 512;

/// The executable mappings of one process, sorted by `start`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessMappings {
    pub count: u32,
    /// A digest of the entry (its mappings and their tables), which changes whenever a table
    /// comes in: a stack walked before is then walked again (see `sched.rs`).
    pub digest: u32,
    /// Where the vDSO's code was mapped when the mappings were read, which a new program
    /// gets anew (at random): an entry is walked with only by the address space it was read
    /// from. Userspace may write an entry after the process exec'd, from mappings it read
    /// before (a child's inherited from its parent at the fork, an exec's read before the
    /// next exec of `env CMD`), and such an entry would unwind the new program with the old
    /// one's tables until the exec's event is read. 0 when unknown: taken as it is.
    pub vdso: u64,
    pub mappings: [ExecMapping; MAPPINGS_PER_PROCESS],
}
shared!(ProcessMappings, 16 + 32 * MAPPINGS_PER_PROCESS);

/// Frames kept per stack, as the kernel's stack maps keep (`perf_event_max_stack`).
pub const MAX_FRAMES: usize = 127;

/// A stack the unwinder walked.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UnwoundStack {
    /// Its hash (FNV-1a of the frames), which chose its id.
    pub hash: u64,
    pub len: u32,
    pub _pad: u32,
    pub frames: [u64; MAX_FRAMES],
}
shared!(UnwoundStack, 16 + 8 * MAX_FRAMES);

/// Array of [`RowChunk`]: every table, sized by userspace at load time.
pub const ROWS: &str = "UNWIND_ROWS";
/// Hash: tgid -> [`ProcessMappings`], for the processes whose tables are ready; the stacks of
/// other processes are taken by frame pointers as before.
pub const PROCESS_MAPPINGS: &str = "PROCESS_MAPPINGS";
/// Array of two u64 counters of changes to [`PROCESS_MAPPINGS`], one per writer so that each
/// only ever grows: [`GENERATION_USERSPACE`] counts userspace's passes that wrote or dropped
/// entries, [`GENERATION_KERNEL`] the kernel side's drops (a process exec'd or exited, added
/// atomically). Each CPU's note of the last process's digest holds while their sum is the one
/// it was taken under.
pub const TABLES_GENERATION: &str = "TABLES_GENERATION";
pub const GENERATION_USERSPACE: u32 = 0;
pub const GENERATION_KERNEL: u32 = 1;
/// Hash: stack id (marked [`crate::stack::UNWOUND`]) -> [`UnwoundStack`].
pub const STACKS: &str = "UNWOUND_STACKS";
/// Array: the rows found lately, [`ROW_CACHE_SLOTS`] per CPU; sized by userspace at load time
/// (`ROW_CACHE_SLOTS` x the possible CPUs).
pub const ROW_CACHE: &str = "ROW_CACHE";
/// Slots of [`ROW_CACHE`] per CPU (a power of two).
pub const ROW_CACHE_SLOTS: u32 = 4096;

/// Processes with tables at once.
pub const PROCESSES: u32 = 256;
/// Chunks of [`ROWS`] by default: 1 Mi rows, 12 MiB of kernel memory.
pub const DEFAULT_CHUNKS: u32 = 4096;
