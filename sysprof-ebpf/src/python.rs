//! Python frames for the stacks of processes running CPython: at each user stack the unwinder
//! takes, the interpreter's frames of the sampled thread are recorded before its native ones
//! (code object and instruction offset per frame; names are resolved in userspace, see
//! `sysprof/src/python/`).
//!
//! Userspace writes each CPython process's entry in `PYTHON_PROCESSES`: where the interpreter
//! list is and its version's struct layout. The thread's `PyThreadState` is found once by
//! walking the interpreter's thread list and then kept per thread (checked on every use, since
//! a thread state is freed when its thread ends). Every walk is one `bpf_loop` step per item,
//! with its state in a per-CPU map value, for the same reason as the unwinder's (see
//! `unwind::SCRATCH`).

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel, bpf_probe_read_user},
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
};
use sysprof_common::{
    python::{
        FRAME_CODE_MASK, FRAME_ENTRY, FRAME_OFFSET_MAX, FRAME_OFFSET_SHIFT, FRAME_PYTHON, MAX_PROCESSES,
        MAX_PYTHON_FRAMES, OWNED_BY_CSTACK, PythonProcess, entry, thread_match,
    },
    unwind::MAX_FRAMES,
};

use crate::config::config;

/// tgid -> its interpreter's location and layout.
#[map]
static PYTHON_PROCESSES: HashMap<u32, PythonProcess> = HashMap::with_max_entries(MAX_PROCESSES, 0);

/// 1 once userspace has described a process (see `sysprof_common::python::ANY_PROCESS`): the
/// stack caches and walks of a trace with no Python skip a hash lookup each (250 ns here).
#[map]
static PYTHON_ANY_PROCESS: Array<u32> = Array::with_max_entries(1, 0);

/// tid -> its `PyThreadState`, as last found.
#[map]
static PYTHON_THREADS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(8192, 0);

#[map]
static PYTHON_SCRATCH: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);

/// The sets of code objects seen, per process (a hash of the process and the code objects'
/// addresses, without the lines): a stack with a new set is reported to userspace, which reads
/// its code objects. Most samples repeat a set, so the report is rare.
#[map]
static PYTHON_CODE_SETS: LruHashMap<u64, u8> = LruHashMap::with_max_entries(16 * 1024, 0);

/// Threads of one interpreter looked through for the sampled one.
const MAX_THREADS: u32 = 256;

#[repr(C)]
struct Walk {
    /// The thread state or frame being looked at.
    at: u64,
    /// Thread search: the id wanted, and the thread state found.
    want: u64,
    found: u64,
    /// Frame walk: frames recorded, and the last one, held back until it is known whether it
    /// is an entry frame (3.12+: the next frame is a shim).
    count: u64,
    pending: u64,
    hash: u64,
    /// The hash of the code objects alone (see `PYTHON_CODE_SETS`).
    code_hash: u64,
}

#[repr(C)]
struct Context {
    process: *const PythonProcess,
    walk: *mut Walk,
    frames: *mut [u64; MAX_FRAMES],
}

/// Whether the current process runs CPython that userspace has described.
#[inline(always)]
pub fn process() -> Option<*const PythonProcess> {
    process_of((bpf_get_current_pid_tgid() >> 32) as u32)
}

/// Whether process `tgid` runs CPython that userspace has described.
#[inline(always)]
pub fn process_of(tgid: u32) -> Option<*const PythonProcess> {
    if PYTHON_ANY_PROCESS.get(0).is_none_or(|any| *any == 0) {
        return None;
    }
    PYTHON_PROCESSES.get_ptr(tgid)
}

/// Drops a process's entry (it exec'd or exited).
#[inline(always)]
pub fn forget(tgid: u32) {
    let _ = PYTHON_PROCESSES.remove(tgid);
}

/// Records the current thread's Python frames, innermost first, at the start of `frames`;
/// returns how many, and whether their code objects are a set not seen before in this process;
/// folds them into `hash`.
#[inline(always)]
pub fn walk(process: *const PythonProcess, frames: *mut [u64; MAX_FRAMES], hash: &mut u64) -> (u64, bool) {
    let Some(walk) = PYTHON_SCRATCH.get_ptr_mut(0) else { return (0, false) };
    // SAFETY: map values (the process entry, this CPU's scratch) stay valid for the run.
    let (info, state) = unsafe { (&*process, &mut *walk) };
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(thread) = thread_state(process, walk, info, tid) else { return (0, false) };
    let Some(mut frame) = read(thread + info.thread_frame as u64) else { return (0, false) };
    if info.cframe_frame != u32::MAX {
        match read(frame + info.cframe_frame as u64) {
            Some(current) => frame = current,
            None => return (0, false),
        }
    }
    let tgid = bpf_get_current_pid_tgid() >> 32;
    (state.at, state.count, state.pending, state.hash) = (frame, 0, 0, *hash);
    state.code_hash = (FNV_OFFSET ^ tgid).wrapping_mul(FNV_PRIME);
    let mut context = Context { process, walk, frames };
    // SAFETY: `frame_step` has the signature bpf_loop calls; `context` outlives the call.
    unsafe {
        aya_ebpf::helpers::generated::bpf_loop(
            // Shim frames take steps too.
            2 * MAX_PYTHON_FRAMES as u32,
            frame_step as *mut core::ffi::c_void,
            (&mut context as *mut Context).cast(),
            0,
        );
    }
    // The outermost frame recorded began its evaluation call (or the walk was cut there).
    settle(state, frames, FRAME_ENTRY);
    *hash = state.hash;
    if state.count == 0 {
        return (0, false);
    }
    // SAFETY: the value is only tested.
    let new = unsafe { PYTHON_CODE_SETS.get(state.code_hash) }.is_none();
    if new {
        let _ = PYTHON_CODE_SETS.insert(state.code_hash, 1, 0);
    }
    (state.count, new)
}

/// The thread state of thread `tid`: the one kept for it if it is still its, else the one
/// found in the interpreter's list.
#[inline(always)]
fn thread_state(
    process: *const PythonProcess,
    walk: *mut Walk,
    info: &PythonProcess,
    tid: u32,
) -> Option<u64> {
    let want = match info.thread_match {
        thread_match::NATIVE_ID => tid as u64,
        thread_match::PTHREAD_SELF => fs_base()?,
        _ => return None,
    };
    // SAFETY: the value is copied out at once.
    if let Some(&kept) = unsafe { PYTHON_THREADS.get(tid) }
        && read(kept + info.thread_id as u64) == Some(want)
    {
        return Some(kept);
    }
    let interpreter = read(info.interpreters_head)?;
    let first = read(interpreter + info.interp_threads as u64)?;
    // SAFETY: as in `walk`.
    let state = unsafe { &mut *walk };
    (state.at, state.want, state.found) = (first, want, 0);
    let mut context = Context { process, walk, frames: core::ptr::null_mut() };
    // SAFETY: as in `walk`.
    unsafe {
        aya_ebpf::helpers::generated::bpf_loop(
            MAX_THREADS,
            thread_step as *mut core::ffi::c_void,
            (&mut context as *mut Context).cast(),
            0,
        );
    }
    let found = state.found;
    if found == 0 {
        return None;
    }
    let _ = PYTHON_THREADS.insert(tid, found, 0);
    Some(found)
}

#[inline(never)]
unsafe extern "C" fn thread_step(_index: u64, context: *mut core::ffi::c_void) -> i64 {
    // SAFETY: bpf_loop passes back the `Context` it was given; its pointers are map values.
    let (info, walk) = unsafe {
        let context = &*context.cast::<Context>();
        (&*context.process, &mut *context.walk)
    };
    if walk.at == 0 {
        return 1;
    }
    if read(walk.at + info.thread_id as u64) == Some(walk.want) {
        walk.found = walk.at;
        return 1;
    }
    match read(walk.at + info.thread_next as u64) {
        Some(next) => {
            walk.at = next;
            0
        }
        None => 1,
    }
}

#[inline(never)]
unsafe extern "C" fn frame_step(_index: u64, context: *mut core::ffi::c_void) -> i64 {
    // SAFETY: as in `thread_step`; `frames` is the unwinder's scratch stack, a map value.
    let (info, walk, frames) = unsafe {
        let context = &*context.cast::<Context>();
        (&*context.process, &mut *context.walk, context.frames)
    };
    let frame = walk.at;
    if frame == 0 || walk.count >= MAX_PYTHON_FRAMES as u64 {
        return 1;
    }
    let mut entry_flag = 0;
    match info.entry {
        entry::EVERY_FRAME => entry_flag = FRAME_ENTRY,
        entry::FLAG => {
            if read_byte(frame + info.frame_entry as u64).is_some_and(|flag| flag != 0) {
                entry_flag = FRAME_ENTRY;
            }
        }
        _ => {
            if read_byte(frame + info.frame_entry as u64) == Some(OWNED_BY_CSTACK) {
                // The C stack's shim: the frame before it began this evaluation call.
                settle(walk, frames, FRAME_ENTRY);
                return advance(walk, info, frame);
            }
        }
    }
    let Some(code) = read(frame + info.frame_code as u64) else { return 1 };
    let offset = if info.code_instructions == 0 {
        // f_lasti: an int, -1 before the first instruction.
        let lasti = read(frame + info.frame_instruction as u64).unwrap_or(0) as u32 as i32;
        lasti.max(0) as u64
    } else {
        let start = code + info.code_instructions as u64;
        match read(frame + info.frame_instruction as u64) {
            Some(instruction) if instruction >= start => (instruction - start) / 2,
            _ => 0,
        }
    };
    settle(walk, frames, 0);
    walk.pending = (code & FRAME_CODE_MASK)
        | FRAME_PYTHON
        | (offset.min(FRAME_OFFSET_MAX) << FRAME_OFFSET_SHIFT)
        | entry_flag;
    advance(walk, info, frame)
}

/// Moves to the frame's caller.
#[inline(always)]
fn advance(walk: &mut Walk, info: &PythonProcess, frame: u64) -> i64 {
    match read(frame + info.frame_previous as u64) {
        Some(previous) => {
            walk.at = previous;
            0
        }
        None => {
            walk.at = 0;
            1
        }
    }
}

/// Writes the frame held back, with `flags` added.
#[inline(always)]
fn settle(walk: &mut Walk, frames: *mut [u64; MAX_FRAMES], flags: u64) {
    if walk.pending == 0 {
        return;
    }
    let value = walk.pending | flags;
    walk.pending = 0;
    let index = walk.count as usize;
    if index >= MAX_PYTHON_FRAMES {
        return;
    }
    // SAFETY: the unwinder's scratch stack, a map value; the index is checked above.
    unsafe { (*frames)[index] = value };
    walk.count += 1;
    walk.hash = (walk.hash ^ value).wrapping_mul(FNV_PRIME);
    walk.code_hash = (walk.code_hash ^ (value & FRAME_CODE_MASK)).wrapping_mul(FNV_PRIME);
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The current thread's fs base: `pthread_self()` on x86_64 glibc.
#[inline(always)]
fn fs_base() -> Option<u64> {
    let offset = config().task_fsbase_offset;
    if offset == 0 {
        return None;
    }
    // SAFETY: plain helper calls; a failed read is "none".
    unsafe {
        let task = aya_ebpf::helpers::generated::bpf_get_current_task() as *const u8;
        bpf_probe_read_kernel(task.add(offset as usize) as *const u64).ok()
    }
}

#[inline(always)]
fn read(address: u64) -> Option<u64> {
    // SAFETY: the helper checks the address; a fault is an error, not a crash.
    unsafe { bpf_probe_read_user(address as *const u64).ok() }
}

#[inline(always)]
fn read_byte(address: u64) -> Option<u8> {
    // SAFETY: as in `read`.
    unsafe { bpf_probe_read_user(address as *const u8).ok() }
}
