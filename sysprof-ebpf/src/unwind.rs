//! User stacks walked with unwind tables (`.eh_frame`), for code built without frame pointers
//! (Debian's libc and python3, release builds, CUDA): the tables are built in userspace per
//! mapped file (`sysprof/src/unwind/`), the walk happens here, from the registers the thread
//! entered the kernel with.
//!
//! A process has tables once userspace has written its mappings into `PROCESS_MAPPINGS`; until
//! then (and on other architectures) its stacks are taken by frame pointers, by the kernel.
//! Each frame is one iteration of `bpf_loop`, so the verifier checks the step once, whatever
//! the depth. A mapping without a table is walked by its frame pointers; an address outside
//! every mapping, a signal frame, or a frame with no caller ends the walk.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user},
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use sysprof_common::{
    stack,
    unwind::{
        DEFAULT_CHUNKS, ExecMapping, GENERATION_KERNEL, GENERATION_USERSPACE, MAPPINGS_PER_PROCESS,
        MAX_FRAMES, PROCESSES, ProcessMappings, ROW_CACHE_SLOTS, ROWS_PER_CHUNK, RowChunk, UnwindRow,
        UnwoundStack, cfa, rbp,
    },
};

/// Every file's unwind table (see `sysprof_common::unwind::ROWS`); the loader sizes it, and
/// userspace writes it through a shared mapping.
#[map]
static UNWIND_ROWS: Array<RowChunk> =
    Array::with_max_entries(DEFAULT_CHUNKS, aya_ebpf::bindings::BPF_F_MMAPABLE);

/// tgid -> its executable mappings and their tables.
#[map]
static PROCESS_MAPPINGS: HashMap<u32, ProcessMappings> = HashMap::with_max_entries(PROCESSES, 0);

/// Counts the changes to `PROCESS_MAPPINGS`, by userspace and by the kernel side (see
/// `sysprof_common::unwind::TABLES_GENERATION`).
#[map]
static TABLES_GENERATION: Array<u64> = Array::with_max_entries(2, 0);

/// Each CPU's last answer of `tables_digest`, good while the generation is the same.
#[repr(C)]
struct DigestNote {
    generation: u64,
    tgid: u32,
    digest: u32,
}

#[map]
static DIGEST_NOTES: PerCpuArray<DigestNote> = PerCpuArray::with_max_entries(1, 0);

/// The stacks walked, by id; the loader sizes it like the kernel's stack maps.
#[map]
static UNWOUND_STACKS: HashMap<u32, UnwoundStack> = HashMap::with_max_entries(16 * 1024, 0);

/// The walk in progress on this CPU: too big for the BPF stack, and kept in a map value for the
/// verifier's sake too. A counter or search bound held on the stack would be tracked exactly,
/// so each `bpf_loop` iteration would be verified anew (127 frames times each search's steps:
/// seconds per program); read from a map value it is just a number, and the step is verified
/// once.
#[map]
static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

#[repr(C)]
struct Scratch {
    pc: u64,
    sp: u64,
    bp: u64,
    hash: u64,
    frames: u64,
    /// Where the native frames start: after the Python frames (see `crate::python`).
    first_native: u64,
    /// The binary search in progress: the answer is the last entry at or below `target`, in
    /// [low, high).
    low: u64,
    high: u64,
    target: u64,
    /// The mapping the last frame was in, as its index + 1 (0: none yet): a stack's frames
    /// are mostly in one file, whose mapping is then found without a search.
    mapping: u64,
    stack: UnwoundStack,
}

/// A row found for a file address (see `ROW_CACHE`).
#[repr(C)]
struct CachedRow {
    /// The table's first row + 1 (0: an empty slot).
    table: u32,
    address: u32,
    row: UnwindRow,
}

/// Rows found, per CPU, by table and file address: the same return addresses come back stack
/// after stack, and a search is a loop of up to 24 steps (17 in a compiler's table). Tables are
/// only ever added to `UNWIND_ROWS` during a trace, so an entry never goes stale.
///
/// `ROW_CACHE_SLOTS` per CPU, CPU after CPU, in a plain array: a per-CPU array is allocated
/// entry by entry when the map is made (4,096 entries took 4.5 ms of the start), this one at
/// once.
#[map]
static ROW_CACHE: Array<CachedRow> = Array::with_max_entries(ROW_CACHE_SLOTS, 0);

/// Steps of the row search: tables of up to 2^24 rows.
const ROW_SEARCH_STEPS: usize = 24;
/// Steps of the mapping search: `MAPPINGS_PER_PROCESS` is 2^9.
const MAPPING_SEARCH_STEPS: usize = 10;
/// Steps of a search taken in one call of its `bpf_loop` callback: a call and its return cost
/// more than a step (the return goes through the CPU's return-thunk mitigation), and a step's
/// two ways write the same map memory, so the verifier's paths merge after each one. Measured
/// on a `make -j2` (cargo xtask bench realistic): 1,425 -> 1,265 ns a row search.
const SEARCH_STEPS_PER_CALL: usize = 4;

/// What each `bpf_loop` step is given: only pointers, which stay the same from one step to the
/// next (see `SCRATCH`).
#[repr(C)]
struct Walk {
    mappings: *const ProcessMappings,
    scratch: *mut Scratch,
}

/// The current thread's user stack walked with its process's tables, as an id in
/// `UNWOUND_STACKS` (or a `stack::` marker); `None` when its process has no tables, for the
/// caller to take the stack by frame pointers.
#[inline(always)]
pub fn user_stack_id() -> Option<i32> {
    #[cfg(bpf_target_arch = "x86_64")]
    {
        let id = sysprof_walk_user_stack();
        (id != NO_TABLES).then_some(id)
    }
    #[cfg(not(bpf_target_arch = "x86_64"))]
    {
        None
    }
}

/// `walk_current`'s `None`: no stack id or marker is this.
const NO_TABLES: i32 = i32::MIN;

/// `walk_current` as a global function: the verifier checks it once per program, on its own,
/// instead of once for every state its callers reach it in.
#[cfg(bpf_target_arch = "x86_64")]
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn sysprof_walk_user_stack() -> i32 {
    walk_current().unwrap_or(NO_TABLES)
}

#[cfg(bpf_target_arch = "x86_64")]
#[inline(always)]
fn walk_current() -> Option<i32> {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let mappings = PROCESS_MAPPINGS.get_ptr(tgid)?;
    // SAFETY: plain helper call.
    let task = unsafe { aya_ebpf::helpers::generated::bpf_get_current_task_btf() };
    // SAFETY: a map value, valid for the program's run.
    if !in_address_space_of(task, unsafe { (*mappings).vdso }) {
        return None;
    }
    let Some(regs) = registers_of(task) else { return Some(stack::NONE) };
    let scratch = SCRATCH.get_ptr_mut(0)?;
    let (mut python, mut new_code) = (0, false);
    {
        // SAFETY: a per-CPU map value, used by this CPU's program alone.
        let scratch = unsafe { &mut *scratch };
        (scratch.pc, scratch.sp, scratch.bp) = (regs.ip, regs.sp, regs.bp);
        scratch.hash = FNV_OFFSET;
        if let Some(process) = crate::python::process() {
            (python, new_code) =
                crate::python::walk(process, &raw mut scratch.stack.frames, &mut scratch.hash);
        }
        (scratch.frames, scratch.first_native) = (python, python);
        scratch.mapping = 0;
    }
    let mut walk = Walk { mappings, scratch };
    // SAFETY: `step` has the signature bpf_loop calls, and `walk` outlives the call.
    unsafe {
        aya_ebpf::helpers::generated::bpf_loop(
            MAX_FRAMES as u32,
            step as *mut core::ffi::c_void,
            (&mut walk as *mut Walk).cast(),
            0,
        );
    }
    // SAFETY: as above.
    let scratch = unsafe { &mut *scratch };
    if scratch.frames == 0 {
        return Some(stack::NONE);
    }
    scratch.stack.len = scratch.frames as u32;
    scratch.stack.hash = scratch.hash;
    let id = store(&scratch.stack);
    if new_code && id >= 0 {
        // Its code objects are named while the process still has them.
        crate::events::emit(sysprof_common::process_event::PYTHON_STACK, tgid, 0, id as u32, 0);
    }
    Some(id)
}

/// Whether the current task runs in the address space whose vDSO is at `vdso` (see
/// `ProcessMappings::vdso`): an entry read from another (the parent's, or the program's
/// before an exec) is no entry, and the stack is the kernel's by frame pointers, as it is
/// until userspace writes the new program's. The current task's `mm->context.vdso`: two loads
/// the verifier checks against the kernel's BTF types (the offsets are constants to it), no
/// bpf_probe_read_kernel.
#[cfg(bpf_target_arch = "x86_64")]
#[inline(always)]
fn in_address_space_of(task: *mut aya_ebpf::bindings::task_struct, vdso: u64) -> bool {
    let config = crate::config::config();
    if vdso == 0 || config.task_mm_offset == 0 || config.mm_vdso_offset == 0 {
        return true;
    }
    // SAFETY: a BTF pointer to the current task, whose `mm` field and that struct's
    // `context.vdso` are at these offsets (kernel BTF); the loads are made fault-safe.
    unsafe {
        let mm: *const u8 = crate::target::task_field(task.cast(), config.task_mm_offset);
        !mm.is_null()
            && core::ptr::read_volatile(mm.add(config.mm_vdso_offset as usize).cast::<u64>()) == vdso
    }
}

/// Drops a process's mappings (it exec'd or exited): its stacks are taken by frame pointers
/// until userspace writes its new ones.
#[inline(always)]
pub fn forget(tgid: u32) {
    if PROCESS_MAPPINGS.remove(tgid).is_ok()
        && let Some(generation) = TABLES_GENERATION.get_ptr_mut(GENERATION_KERNEL)
    {
        crate::atomic::add(generation, 1);
    }
    crate::python::forget(tgid);
}

/// The stack's id in `UNWOUND_STACKS`: from its hash, or from the hash's other half when the
/// first id holds another stack; `stack::LOST` when both do.
#[inline(always)]
fn store(stack: &UnwoundStack) -> i32 {
    let mut bits = stack.hash;
    for _ in 0..2 {
        let id = (bits as u32 & stack::UNWOUND_ID_MASK) | stack::UNWOUND as u32;
        bits >>= 32;
        // SAFETY: map values stay valid for the program's run; the hash is only read.
        if let Some(existing) = UNWOUND_STACKS.get_ptr(id) {
            if unsafe { (*existing).hash } == stack.hash {
                return id as i32;
            }
            continue;
        }
        if UNWOUND_STACKS.insert(id, stack, BPF_NOEXIST as u64).is_ok() {
            return id as i32;
        }
        // Another CPU stored a stack under it first: the same one, or not.
        if let Some(existing) = UNWOUND_STACKS.get_ptr(id)
            && unsafe { (*existing).hash } == stack.hash
        {
            return id as i32;
        }
    }
    stack::LOST
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The registers a walk starts from, and the system call the thread entered the kernel with.
struct Registers {
    ip: u64,
    sp: u64,
    bp: u64,
    orig_ax: u64,
    di: u64,
}

/// The digest of process `tgid`'s entry (`ProcessMappings::digest`), 0 when it has none.
/// Asked by every stack cache on every hit (each probed call, each switch-out of a thread
/// blocking where it blocked before), so the CPU's last answer is kept and used again while no
/// entry changed: two inlined array loads instead of a hash lookup (a probed call's entry took
/// some 10 ns less).
#[inline(always)]
pub fn tables_digest(tgid: u32) -> u32 {
    // SAFETY: a map value, valid for the program's run.
    let lookup = |tgid: u32| PROCESS_MAPPINGS.get_ptr(tgid).map_or(0, |entry| unsafe { (*entry).digest });
    let (Some(by_userspace), Some(by_kernel), Some(note)) = (
        TABLES_GENERATION.get(GENERATION_USERSPACE),
        TABLES_GENERATION.get(GENERATION_KERNEL),
        DIGEST_NOTES.get_ptr_mut(0),
    ) else {
        return lookup(tgid);
    };
    // Both counters only grow, so their sum changes with every change to the entries.
    let generation = by_userspace.wrapping_add(*by_kernel);
    // SAFETY: this CPU's slot, valid for the program's run.
    let note = unsafe { &mut *note };
    if note.generation == generation && note.tgid == tgid {
        return note.digest;
    }
    // The generation read before the lookup: an entry written since is looked up again next
    // time.
    let digest = lookup(tgid);
    // In this order, the generation invalid while the rest is written: a program preempted
    // here (a uprobe's may be) by another on this CPU leaves a note that matches nothing, or
    // the other's, never one process's id with a digest it no longer has.
    // SAFETY: writes to the note above; volatile only keeps their order.
    unsafe {
        core::ptr::write_volatile(&raw mut note.generation, u64::MAX);
        core::ptr::write_volatile(&raw mut note.tgid, tgid);
        core::ptr::write_volatile(&raw mut note.digest, digest);
        core::ptr::write_volatile(&raw mut note.generation, generation);
    }
    digest
}

/// Where the current thread entered the kernel from user mode (see [`user_entry`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UserEntry {
    /// Its instruction, stack and frame pointers and the two return addresses nearest them (at
    /// the stack pointer, and above the frame pointer): where in its code it is.
    pub at: [u64; 5],
    /// The system call it made (`orig_ax`: -1 outside one) and that call's first argument (a
    /// descriptor, a futex word, a timespec): what it asked the kernel to do there.
    pub call: [u64; 2],
    /// Its process, which the caller knows already: the stack cache looks its tables up by it.
    pub tgid: u32,
}

impl UserEntry {
    const NONE: UserEntry = UserEntry { at: [0; 5], call: [0; 2], tgid: 0 };

    /// Whether the thread entered from user mode at all (kernel threads never do).
    pub fn known(&self) -> bool {
        self.at[0] != 0
    }
}

/// Where the current thread (of process `tgid`) entered the kernel from user mode: all zero
/// when it was not in user mode.
#[inline(always)]
pub fn user_entry(tgid: u32) -> UserEntry {
    #[cfg(bpf_target_arch = "x86_64")]
    if let Some(regs) = user_registers() {
        return entry_at(&regs, tgid);
    }
    let _ = tgid;
    UserEntry::NONE
}

/// `user_entry`, from the registers a uprobe hands its program, which are the thread's user
/// registers: two helper calls less on every probed call.
#[inline(always)]
pub fn probe_entry(ctx: &aya_ebpf::programs::ProbeContext, tgid: u32) -> UserEntry {
    #[cfg(bpf_target_arch = "x86_64")]
    {
        // SAFETY: `regs` is the program's context, which the verifier lets it read.
        let regs = unsafe { &*ctx.regs };
        let regs =
            Registers { ip: regs.rip, sp: regs.rsp, bp: regs.rbp, orig_ax: regs.orig_rax, di: regs.rdi };
        entry_at(&regs, tgid)
    }
    #[cfg(not(bpf_target_arch = "x86_64"))]
    {
        let _ = ctx;
        user_entry(tgid)
    }
}

#[cfg(bpf_target_arch = "x86_64")]
#[inline(always)]
fn entry_at(regs: &Registers, tgid: u32) -> UserEntry {
    // SAFETY: the helper checks the user addresses; a failed read is 0.
    let read = |at: u64| unsafe { aya_ebpf::helpers::bpf_probe_read_user(at as *const u64) }.unwrap_or(0);
    // Code built without frame pointers keeps anything in rbp, often no address at all: a read
    // there faults, and a faulting read costs a microsecond (the kernel's exception fixup). A
    // frame pointer lies above the stack pointer, within the stack.
    let frame_return =
        if regs.bp.wrapping_sub(regs.sp) < FRAME_POINTER_REACH { read(regs.bp.wrapping_add(8)) } else { 0 };
    UserEntry {
        at: [regs.ip, regs.sp, regs.bp, read(regs.sp), frame_return],
        call: [regs.orig_ax, regs.di],
        tgid,
    }
}

/// How far above the stack pointer a frame pointer may be for `entry_at` to read through it.
const FRAME_POINTER_REACH: u64 = 1 << 20;

/// x86_64 `struct pt_regs`, in u64 slots (the kernel's ABI for ptrace).
const REG_BP: usize = 4;
const REG_DI: usize = 14;
const REG_ORIG_AX: usize = 15;
const REG_IP: usize = 16;
const REG_CS: usize = 17;
const REG_SP: usize = 19;

/// The registers the current thread entered the kernel with (a sample in user mode, a system
/// call, a fault, a uprobe), or `None` for a kernel thread.
#[inline(always)]
fn user_registers() -> Option<Registers> {
    // SAFETY: plain helper call.
    registers_of(unsafe { aya_ebpf::helpers::generated::bpf_get_current_task_btf() })
}

/// [`user_registers`] of `task`, the current task's BTF pointer (a caller that has it already
/// asks the helper once).
#[inline(always)]
fn registers_of(task: *mut aya_ebpf::bindings::task_struct) -> Option<Registers> {
    // SAFETY: plain helper call. Its result is a BTF pointer to the `pt_regs` at the top of
    // the task's kernel stack: the verifier checks each load against that struct's fields and
    // makes it fault-safe, so no copy through bpf_probe_read_kernel is needed (one helper call
    // less on every switch and sample).
    let slot = |regs: *const u64, index: usize| unsafe { core::ptr::read_volatile(regs.add(index)) };
    let regs = unsafe { aya_ebpf::helpers::generated::bpf_task_pt_regs(task) as *const u64 };
    if regs.is_null() {
        return None;
    }
    // Ring 3 in the saved code segment: the thread was in user mode.
    if slot(regs, REG_CS) & 3 != 3 {
        return None;
    }
    Some(Registers {
        ip: slot(regs, REG_IP),
        sp: slot(regs, REG_SP),
        bp: slot(regs, REG_BP),
        orig_ax: slot(regs, REG_ORIG_AX),
        di: slot(regs, REG_DI),
    })
}

/// One frame: records the pc, then finds the caller's pc, sp and bp. Returns 1 to stop.
#[inline(never)]
unsafe extern "C" fn step(_index: u64, context: *mut core::ffi::c_void) -> i64 {
    // SAFETY: bpf_loop passes back the `Walk` it was given, which lives on the caller's stack;
    // its pointers are map values that stay valid for the program's run.
    let (mappings, walk) = unsafe {
        let walk = &*context.cast::<Walk>();
        (&*walk.mappings, &mut *walk.scratch)
    };
    let leaf = walk.frames == walk.first_native;
    let pc = walk.pc;
    // A return address points after its call, which may be the function's last instruction.
    let lookup = if leaf { pc } else { pc.wrapping_sub(1) };
    let mapping = find_mapping(mappings, walk, lookup);
    // The leaf is where the CPU was, so it is code even in a mapping not seen yet; any other
    // address outside every mapping is not a return address.
    if mapping.end == 0 && !leaf {
        return 1;
    }
    let Some(slot) = walk.stack.frames.get_mut(walk.frames as usize) else { return 1 };
    *slot = pc;
    walk.frames += 1;
    walk.hash = (walk.hash ^ pc).wrapping_mul(FNV_PRIME);

    // No mapping (a leaf's) has no rows either.
    let row = if mapping.rows > 0 {
        match find_row(&mapping, walk, lookup.wrapping_sub(mapping.bias)) {
            Some(row) => row,
            // An address no entry covers.
            None => return 1,
        }
    } else {
        UnwindRow { cfa: cfa::FRAME_POINTER, ..UnwindRow::default() }
    };
    let offset = row.cfa_offset as i64 as u64;
    let frame = match row.cfa {
        cfa::RSP => walk.sp.wrapping_add(offset),
        cfa::RBP => walk.bp.wrapping_add(offset),
        cfa::PLT => {
            let pushed = if (pc & 15) as i64 >= row.rbp_offset as i64 { 8 } else { 0 };
            walk.sp.wrapping_add(offset).wrapping_add(pushed)
        }
        cfa::RBP_DEREF => match read_user(walk.bp.wrapping_add(offset)) {
            Some(frame) => frame,
            None => return 1,
        },
        cfa::FRAME_POINTER => {
            if walk.bp == 0 {
                return 1;
            }
            walk.bp.wrapping_add(16)
        }
        _ => return 1,
    };
    // The caller's frame is above this one: anything else is a corrupt or foreign stack.
    if frame <= walk.sp {
        return 1;
    }
    // A frame pointer, and rbp pushed first thing in a function, sit just below the return
    // address: both in one read (a read is a helper call of 100 ns here, 1.6 a frame before).
    let saved_below = row.cfa == cfa::FRAME_POINTER || (row.rbp == rbp::SAVED && row.rbp_offset == -16);
    let (return_address, bp) = if saved_below {
        // SAFETY: the helper checks the address; a fault is an error, not a crash.
        match unsafe { bpf_probe_read_user((frame - 16) as *const [u64; 2]) } {
            Ok([bp, return_address]) => (return_address, bp),
            Err(_) => return 1,
        }
    } else {
        let Some(return_address) = read_user(frame - 8) else { return 1 };
        let bp = if row.rbp == rbp::SAVED {
            match read_user(frame.wrapping_add(row.rbp_offset as i64 as u64)) {
                Some(bp) => bp,
                None => return 1,
            }
        } else {
            walk.bp
        };
        (return_address, bp)
    };
    if return_address == 0 {
        return 1;
    }
    walk.pc = return_address;
    walk.sp = frame;
    walk.bp = bp;
    0
}

#[inline(always)]
fn read_user(address: u64) -> Option<u64> {
    // SAFETY: the helper checks the address; a fault is an error, not a crash.
    unsafe { bpf_probe_read_user(address as *const u64).ok() }
}

/// What each step of a binary search is given (see `Walk`); its bounds are in the scratch.
/// A search is a loop of its own because the verifier would follow every path through an
/// unrolled one (2^steps).
#[repr(C)]
struct Search {
    mappings: *const ProcessMappings,
    scratch: *mut Scratch,
}

/// The process's mapping that holds `pc`, or a zeroed one (`end` 0, no rows) when none does.
/// Not an `Option`: its payload is undefined where it is `None`, and LLVM, building for BPF v3,
/// then spills registers that one path into the spill never wrote, which the verifier refuses
/// (`R5 !read_ok` in `step`).
#[inline(always)]
fn find_mapping(mappings: &ProcessMappings, scratch: &mut Scratch, pc: u64) -> ExecMapping {
    let count = mappings.count as u64;
    if count == 0 || count > MAPPINGS_PER_PROCESS as u64 || mapping_at(mappings, 0).start > pc {
        return ExecMapping::default();
    }
    if scratch.mapping != 0 {
        let last = mapping_at(mappings, scratch.mapping - 1);
        if last.start <= pc && pc < last.end {
            return last;
        }
    }
    (scratch.low, scratch.high, scratch.target) = (0, count, pc);
    let mut search = Search { mappings, scratch };
    // SAFETY: as in `walk_current`.
    unsafe {
        aya_ebpf::helpers::generated::bpf_loop(
            MAPPING_SEARCH_STEPS.div_ceil(SEARCH_STEPS_PER_CALL) as u32,
            mapping_search_step as *mut core::ffi::c_void,
            (&mut search as *mut Search).cast(),
            0,
        );
    }
    let mapping = mapping_at(mappings, scratch.low);
    let found = scratch.high == scratch.low + 1 && pc < mapping.end;
    if !found {
        return ExecMapping::default();
    }
    scratch.mapping = scratch.low + 1;
    mapping
}

#[inline(always)]
fn mapping_at(mappings: &ProcessMappings, index: u64) -> ExecMapping {
    mappings.mappings[index as usize & (MAPPINGS_PER_PROCESS - 1)]
}

#[inline(never)]
unsafe extern "C" fn mapping_search_step(_index: u64, context: *mut core::ffi::c_void) -> i64 {
    // SAFETY: bpf_loop passes back the `Search` it was given; its pointers are map values.
    let (mappings, search) = unsafe {
        let search = &*context.cast::<Search>();
        (&*search.mappings, &mut *search.scratch)
    };
    for _ in 0..SEARCH_STEPS_PER_CALL {
        if search.high <= search.low + 1 {
            return 1;
        }
        let middle = search.low + (search.high - search.low) / 2;
        if mapping_at(mappings, middle).start <= search.target {
            search.low = middle;
        } else {
            search.high = middle;
        }
    }
    0
}

/// The row of `mapping`'s table that covers the file address `address`.
#[inline(always)]
fn find_row(mapping: &ExecMapping, scratch: &mut Scratch, address: u64) -> Option<UnwindRow> {
    if address > u32::MAX as u64 {
        return None;
    }
    let first = mapping.first_row as u64;
    let slot = (address as u32).wrapping_mul(0x9e37_79b1).wrapping_add(mapping.first_row) >> 20;
    // SAFETY: plain helper call.
    let cpu = unsafe { aya_ebpf::helpers::bpf_get_smp_processor_id() };
    let cached = ROW_CACHE.get_ptr_mut(cpu * ROW_CACHE_SLOTS + (slot & (ROW_CACHE_SLOTS - 1)));
    if let Some(cached) = cached {
        // SAFETY: this CPU's slot, used by one program at a time on this CPU.
        let cached = unsafe { &*cached };
        if cached.table == mapping.first_row.wrapping_add(1) && cached.address == address as u32 {
            return Some(cached.row);
        }
    }
    if row_at(first)?.pc as u64 > address {
        return None;
    }
    (scratch.low, scratch.high, scratch.target) = (first, first + mapping.rows as u64, address);
    let mut search = Search { mappings: core::ptr::null(), scratch };
    // SAFETY: as in `walk_current`.
    unsafe {
        aya_ebpf::helpers::generated::bpf_loop(
            ROW_SEARCH_STEPS.div_ceil(SEARCH_STEPS_PER_CALL) as u32,
            row_search_step as *mut core::ffi::c_void,
            (&mut search as *mut Search).cast(),
            0,
        );
    }
    if scratch.high != scratch.low + 1 {
        return None;
    }
    let row = row_at(scratch.low)?;
    if let Some(cached) = cached {
        // SAFETY: as above.
        let cached = unsafe { &mut *cached };
        (cached.table, cached.address, cached.row) = (mapping.first_row.wrapping_add(1), address as u32, row);
    }
    Some(row)
}

#[inline(never)]
unsafe extern "C" fn row_search_step(_index: u64, context: *mut core::ffi::c_void) -> i64 {
    // SAFETY: bpf_loop passes back the `Search` it was given; its scratch is a map value.
    let search = unsafe { &mut *(*context.cast::<Search>()).scratch };
    for _ in 0..SEARCH_STEPS_PER_CALL {
        if search.high <= search.low + 1 {
            return 1;
        }
        let middle = search.low + (search.high - search.low) / 2;
        match row_at(middle) {
            Some(row) if row.pc as u64 <= search.target => search.low = middle,
            Some(_) => search.high = middle,
            // Outside the rows: a table userspace has not finished writing. Fail the search.
            None => {
                search.high = 0;
                return 1;
            }
        }
    }
    0
}

#[inline(always)]
fn row_at(index: u64) -> Option<UnwindRow> {
    let chunk = UNWIND_ROWS.get((index / ROWS_PER_CHUNK as u64) as u32)?;
    Some(chunk.rows[index as usize % ROWS_PER_CHUNK])
}
