//! Per-task state in task local storage: the kernel keeps it with the task and frees it when
//! the task goes, so the hot paths (every syscall, every context switch) touch no hash map to
//! find it and nothing has to be deleted.
//!
//! aya-ebpf 0.2 has no task-storage map type; this is the same BTF map definition aya uses for
//! its other local-storage maps (inode, cgroup), which the loader reads from the `.maps` section.

use aya_ebpf::{
    bindings::{
        BPF_F_NO_PREALLOC, BPF_F_USER_STACK, BPF_LOCAL_STORAGE_GET_F_CREATE,
        bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE, task_struct,
    },
    helpers::{
        bpf_get_prandom_u32,
        generated::{bpf_get_current_task_btf, bpf_task_storage_get},
    },
    macros::btf_map,
    programs::tracing::StackIdContext,
};

use crate::{maps::stack_id, unwind::UserEntry};

/// What sysprof remembers about one task.
#[repr(C)]
pub struct TaskState {
    /// Whether the task belongs to the target: 0 not decided yet, 1 yes, 2 no. Decided once,
    /// when the task is current (the filter reads the current task); exec updates it.
    pub target: u32,
    /// A syscall in progress, parked here when its thread left the CPU (see syscalls.rs).
    pub syscall: sysprof_common::InFlight,
    /// When the task last left the CPU (0: not since the trace started).
    pub switched_out_ns: u64,
    /// When the task last got a CPU (0: not since the trace started).
    pub switched_in_ns: u64,
    /// Its time on a CPU as the scheduler counted it (`se.sum_exec_runtime`) when it last left
    /// one (0: not seen leaving).
    pub runtime_out_ns: u64,
    /// When the task last left a CPU, kept through its next stretch on one (0: not seen
    /// leaving): the most it can have run when it leaves again.
    pub left_ns: u64,
    /// When the task became runnable and started waiting for a CPU (0: not waiting).
    pub runnable_since_ns: u64,
    /// Where and why it left the CPU last.
    pub offcpu_user_stack: i32,
    pub offcpu_kernel_stack: i32,
    pub offcpu_state: u32,
    /// The image its stacks were taken in (see `sysprof_common::exec_id`).
    pub offcpu_exec_id: u32,
    /// Process and thread ids, recorded when `target` is decided.
    pub tgid: u32,
    pub tid: u32,
    /// Who woke it from its last wait (see `sysprof_common::WakeKey`), valid while
    /// `waker_seen` is 1: set at the wakeup, cleared when it leaves the CPU again.
    pub waker_seen: u32,
    pub waker_tgid: u32,
    pub waker_tid: u32,
    pub waker_user_stack: i32,
    pub waker_exec_id: u32,
    /// Its user and kernel stacks as last walked where it went to sleep (`[0]`), where it was
    /// last preempted in a system call or on its way back from one (`[1]`) and in its own code
    /// (`[2]`), and its user stack where it last woke another thread (see [`StackCache`] and
    /// [`KernelStackCache`]).
    pub blocked: [StackCache; 3],
    pub blocked_kernel: [KernelStackCache; 3],
    /// Which of them the switch-out in progress uses (see `sched.rs`).
    pub stack_slot: u32,
    pub waking: StackCache,
}

/// A user stack walked at one place, kept for the next time the thread is at that very place:
/// where it entered the kernel from user space (`unwind::user_entry`) and its process's unwind
/// tables then (`unwind::tables_digest`). A loop's read, a worker's wait, a producer's wakeup
/// are at the same place each time, and walking the stack is the costly part of a switch.
#[repr(C)]
pub struct StackCache {
    pub at: [u64; 5],
    pub tables: u32,
    /// Its id, or a `stack::` marker (never reused); 0 until one is kept (see [`kept`]).
    pub stack: i32,
    /// The program image it was walked in (`sysprof_common::exec_id`), where a caller that
    /// reuses it without comparing places keeps it (see `sched.rs`).
    pub exec_id: u32,
    pub _pad: u32,
}

/// A kernel stack walked where a thread went to sleep, kept for the next time it sleeps at the
/// same place: from the same instruction and stack of its code (`UserEntry::at`), in the same
/// system call on the same first argument (`UserEntry::call`: the same descriptor, futex word
/// or timer), in the same state. The kernel walk is most of what a switch costs (about 1.7 us
/// of 2.4 here), and a thread that blocks in a loop blocks in the same kernel function each
/// time. What this key cannot tell apart (the same call on the same object blocking at two
/// places inside the kernel) is made right in the aggregate by walking anyway, at random, once
/// in `KERNEL_STACK_REFRESH`.
#[repr(C)]
pub struct KernelStackCache {
    pub at: [u64; 5],
    pub call: [u64; 2],
    pub state: u32,
    /// Its id, or a `stack::` marker (never reused); 0 until one is kept (see [`kept`]).
    pub stack: i32,
}

impl StackCache {
    /// The current thread's user stack: the one kept when the thread is where it was when it
    /// was kept (or when `reuse`), else walked (and kept). Not kept for Python, whose frames
    /// the registers do not show, nor when the process's unwind tables changed since (the
    /// libraries a new process maps come in during its first milliseconds).
    #[inline(always)]
    pub fn user_stack<C: StackIdContext>(&mut self, ctx: &C, entry: &UserEntry, reuse: bool) -> i32 {
        if reuse && kept(self.stack) {
            return self.stack;
        }
        let (at, tables) = (entry.at, crate::unwind::tables_digest(entry.tgid));
        if entry.known()
            && same_words(&at, &self.at)
            && tables == self.tables
            && kept(self.stack)
            && crate::python::process_of(entry.tgid).is_none()
        {
            return self.stack;
        }
        let stack = stack_id(ctx, BPF_F_USER_STACK as u64);
        (self.at, self.tables, self.stack) = (at, tables, stack);
        stack
    }
}

/// Whether a cache holds a stack: an id, not a marker (negative), nor 0, which is what every
/// cache of a new task's storage holds, zeroed by the kernel. Taken for a kept id, it passed a
/// new thread's first preemptions in its own code (which reuse the last stacks, see
/// `sched.rs`) for whatever stack bucket 0 of the map held: another process's, or none (56%
/// of the preempted time of 40 short processes came out with no stack). A stack that lands in
/// bucket 0 is walked each time instead of kept: 1 bucket of the map's thousands.
#[inline(always)]
fn kept(stack: i32) -> bool {
    stack > 0
}

/// Whether two arrays of words are equal, without a call. LLVM compiles `==` on arrays (and a
/// chain of word comparisons) into a call of memcmp, which the BPF target links as a function
/// comparing byte by byte: on every stack-cache hit, 40 bytes one at a time in a subprogram
/// call, about 10 ns of a probed call's entry (155-160 ns a run -> 144-150, kernel statistics
/// on). The differences ORed together are no comparison chain, so they stay inline.
#[inline(always)]
fn same_words<const N: usize>(a: &[u64; N], b: &[u64; N]) -> bool {
    let mut differ = 0;
    for i in 0..N {
        differ |= a[i] ^ b[i];
    }
    differ == 0
}

/// 1 in this many kernel stacks at a place already seen is walked anyway (see
/// [`KernelStackCache`]).
const KERNEL_STACK_REFRESH: u32 = 16;

impl KernelStackCache {
    /// The current thread's kernel stack as it leaves the CPU in `state`: the one kept when it
    /// leaves from where it left when it was kept, in the same state (or when `reuse`), else
    /// walked (and kept). Where it was in user mode does not matter when it was preempted
    /// there (`!in_call`): the kernel's path is then the interrupt's way back to user mode,
    /// whatever the instruction.
    #[inline(always)]
    pub fn kernel_stack<C: StackIdContext>(
        &mut self,
        ctx: &C,
        entry: &UserEntry,
        in_call: bool,
        state: u32,
        reuse: bool,
    ) -> i32 {
        if reuse && kept(self.stack) {
            return self.stack;
        }
        if entry.known()
            && (!in_call || (same_words(&entry.at, &self.at) && same_words(&entry.call, &self.call)))
            && state == self.state
            && kept(self.stack)
            // SAFETY: plain helper call.
            && unsafe { bpf_get_prandom_u32() } % KERNEL_STACK_REFRESH != 0
        {
            return self.stack;
        }
        let stack = stack_id(ctx, 0);
        (self.at, self.call, self.state, self.stack) = (entry.at, entry.call, state, stack);
        stack
    }
}

pub const UNDECIDED: u32 = 0;
pub const TARGET: u32 = 1;
pub const NOT_TARGET: u32 = 2;

/// A BPF_MAP_TYPE_TASK_STORAGE map, described to the loader through BTF.
#[repr(C)]
pub struct TaskStorage<T> {
    r#type: *const [i32; BPF_MAP_TYPE_TASK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
}

// SAFETY: the fields are placeholders the loader reads from BTF; they are never dereferenced.
unsafe impl<T> Sync for TaskStorage<T> {}

impl<T> TaskStorage<T> {
    pub const fn new() -> Self {
        TaskStorage {
            r#type: core::ptr::null(),
            key: core::ptr::null(),
            value: core::ptr::null(),
            max_entries: core::ptr::null(),
            map_flags: core::ptr::null(),
        }
    }

    /// The task's value, created zeroed when `create` and missing.
    #[expect(clippy::mut_from_ref, reason = "the value belongs to the task, not to the map handle")]
    #[inline(always)]
    pub fn get(&self, task: *mut task_struct, create: bool) -> Option<&mut T> {
        let flags = if create { BPF_LOCAL_STORAGE_GET_F_CREATE as u64 } else { 0 };
        // SAFETY: `task` is a BTF task pointer (a tp_btf argument or the current task); the
        // helper returns a pointer to the task's value or null.
        let value = unsafe {
            bpf_task_storage_get(
                core::ptr::from_ref(self).cast_mut().cast(),
                task,
                core::ptr::null_mut(),
                flags,
            )
        };
        // SAFETY: non-null values live as long as the task, beyond this program's run.
        unsafe { value.cast::<T>().as_mut() }
    }

    /// The current task's value.
    #[expect(clippy::mut_from_ref, reason = "the value belongs to the task, not to the map handle")]
    #[inline(always)]
    pub fn current(&self, create: bool) -> Option<&mut T> {
        // SAFETY: plain helper call.
        self.get(unsafe { bpf_get_current_task_btf() }, create)
    }
}

#[btf_map]
pub static TASK_STATE: TaskStorage<TaskState> = TaskStorage::new();
