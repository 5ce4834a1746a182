//! Which tasks are part of the target, decided in the kernel so that nothing else is copied out.

use aya_ebpf::{
    bindings::task_struct,
    helpers::{bpf_get_current_ancestor_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::map,
    maps::{Array, PerCpuArray},
};
use sysprof_common::{Config, Counter, CpuState, filter};

use crate::{
    atomic,
    config::config,
    counters,
    maps::{TARGET_BITS, TARGETS},
    on_cpu,
    task_state::{NOT_TARGET, TARGET, TaskState},
};

/// Whether the current task belongs to the target.
#[inline(always)]
pub fn is_current_target(tgid: u32) -> bool {
    let config = config();
    if tgid == config.self_tgid {
        // sysprof is its own target only while it put itself in TARGETS (probe calibration).
        return is_target_process(tgid);
    }
    match config.filter {
        filter::ALL => true,
        filter::CGROUP => {
            // SAFETY: plain helper call; the level comes from userspace's reading of the
            // cgroup path.
            let ancestor = unsafe { bpf_get_current_ancestor_cgroup_id(config.cgroup_level as i32) };
            ancestor == config.cgroup_id
        }
        _ => is_target_process(tgid),
    }
}

/// Whether `tgid` is in the target set (filter::TARGETS): one bit of `TARGET_BITS`, an array
/// load the verifier inlines. Every process's syscalls and switches pass here in `--pid` mode,
/// so this is most of what tracing one process costs the others.
#[inline(always)]
pub fn is_target_process(tgid: u32) -> bool {
    TARGET_BITS.get(tgid / 64).is_some_and(|word| *word & (1 << (tgid % 64)) != 0)
}

/// Adds a process to the target set, counting the ones that do not fit.
#[inline(always)]
pub fn add_target_process(tgid: u32) {
    if TARGETS.insert(tgid, 1, 0).is_err() {
        counters::add(Counter::TargetsFull, 1);
        return;
    }
    if let Some(word) = TARGET_BITS.get_ptr_mut(tgid / 64) {
        atomic::or(word, 1 << (tgid % 64));
    }
}

/// Whether `task` may belong to the target, from its process id alone, before anything is
/// looked up for it: exact for filter::TARGETS, and yes for the filters that need the task's
/// own storage to remember their verdict (the cgroup's is a helper call, on the current task
/// only). Read straight from the BTF task pointer: no helper call.
#[inline(always)]
pub fn task_may_be_target(task: *const task_struct) -> bool {
    let config = config();
    config.task_tgid_offset == 0 || tgid_may_be_target(config, task_field(task, config.task_tgid_offset))
}

/// `task_may_be_target` for a task whose process id is known.
#[inline(always)]
fn tgid_may_be_target(config: &Config, tgid: u32) -> bool {
    config.filter != filter::TARGETS || is_target_process(tgid)
}

/// The field of type `T` at `offset` in `task`: a tp_btf argument (a trusted task pointer), and
/// the offset one of `Config`'s, from kernel BTF: a constant the verifier checks the load
/// against the task's type with, so no helper call is needed.
#[inline(always)]
pub fn task_field<T: Copy>(task: *const task_struct, offset: u32) -> T {
    // SAFETY: as above; the verifier rejects the program if the offset is not a field of
    // `T`'s size.
    unsafe { core::ptr::read_volatile(task.cast::<u8>().add(offset as usize).cast::<T>()) }
}

// Each CPU's note (`CpuState::note`, in `on_cpu.rs`): the `pid_tgid` of the task running on
// it, as the switch program saw it arrive (0 until then, and for the idle task; marked for a
// task whose leaving the kernel may not show: see `HIDDEN`), with the switch's verdict on it
// under `--pid` (`OUTSIDE`). The syscall programs, which every process on the machine runs
// twice per call, read it with an inlined per-CPU load instead of calling a helper, which on
// this kind of host (a VM, return thunks against speculation) costs more than the rest of the
// test, and another process's call ends there. `current` changes only at a switch, with
// interrupts off from the tracepoint to the switch itself, so no event runs in between. A note
// is only as new as the switch that made it: userspace moves the notes' epoch on when it
// changes the target set (`Probes::forget_switch_notes`), and a note of an earlier epoch reads
// as none. Read only when the switch program runs (`Config::switch_notes`): without it, the
// note an exec writes (`renote_current`) would stay on its CPU for whatever task ran there next.

/// This CPU's note in `state`, 0 (none) when it was made in an earlier epoch.
#[inline(always)]
fn note_in(state: *const CpuState) -> u64 {
    // SAFETY: this CPU's state, valid for the program's run.
    let state = unsafe { &*state };
    if state.note_epoch == on_cpu::notes_epoch() { state.note } else { 0 }
}

/// Writes this CPU's note in `state`, of `epoch` (read before the verdict in it was made: a
/// change of the target set after that read moves the epoch on, and the note reads as none).
#[inline(always)]
fn write_note(state: *mut CpuState, note: u64, epoch: u32) {
    // SAFETY: this CPU's state; only the switch and exec programs write the note, and they do
    // not nest.
    let state = unsafe { &mut *state };
    state.note = note;
    state.note_epoch = epoch;
}

/// Processes whose own events the kernel hides from tracing, learned from the switches that
/// showed one arriving and never leaving (0: empty). Sandboxes do this to their agent: in a
/// Firecracker guest, init's threads get the CPU in a switch that fires (another task is
/// current), and leave it in one that does not, so a note naming them would outlive them and
/// the next task's calls would be taken for theirs (a target's exact counts came out 112 calls
/// short). Such a process's arrival is noted marked (`HIDDEN_NOTE`): the helper answers for the
/// task that runs next, and the switch after counts what was not seen when the process is traced.
#[map]
static HIDDEN: Array<u32> = Array::with_max_entries(HIDDEN_SLOTS, 0);

const HIDDEN_SLOTS: u32 = 4;

/// Init: the process sandboxes hide (see `HIDDEN`), known before its first switch is missed.
/// Anywhere else its switches are few, and the helper costs it nothing measurable.
const INIT: u32 = 1;

/// Marks the note of a task of a hidden process: kept to count its unseen leaving, never taken
/// for the current task (none of the programs runs for it).
const HIDDEN_NOTE: u64 = 1 << 63;

/// Marks a note whose task was outside the target set when it arrived (filter::TARGETS only):
/// its events end at the one load of the note, with no test of the set. Pids are below 2^22,
/// so the bit is never part of a tgid.
const OUTSIDE: u64 = 1 << 62;

/// The current task's `pid_tgid` (tid in the low half, tgid in the high half), or `None` when
/// the switch that brought it here found it outside the target set; `state` is this CPU's.
#[inline(always)]
pub fn current_unless_outside(state: *const CpuState) -> Option<u64> {
    if config().switch_notes == 0 {
        return Some(bpf_get_current_pid_tgid());
    }
    match note_in(state) {
        // Neither empty (0) nor a hidden task's (the sign bit): one signed comparison.
        known if (known as i64) > 0 => (known & OUTSIDE == 0).then_some(known),
        _ => Some(bpf_get_current_pid_tgid()),
    }
}

/// The current task's `pid_tgid` when it belongs to the target. Under `--pid` the note's
/// verdict is the set's own (the switch tested it, and userspace forgets the notes whenever
/// the set changes), so a target's events read the note alone, not the set too.
#[inline(always)]
pub fn current_target() -> Option<u64> {
    if config().switch_notes == 0 {
        let pid_tgid = bpf_get_current_pid_tgid();
        return is_current_target_cached((pid_tgid >> 32) as u32).then_some(pid_tgid);
    }
    current_target_in(on_cpu::state()?)
}

/// `current_target`, for a program that has this CPU's state already.
#[inline(always)]
pub fn current_target_in(state: *const CpuState) -> Option<u64> {
    if config().switch_notes != 0 && config().filter == filter::TARGETS {
        let known = note_in(state);
        if (known as i64) > 0 {
            return (known & OUTSIDE == 0).then_some(known);
        }
    }
    let pid_tgid = current_unless_outside(state)?;
    is_current_target_cached((pid_tgid >> 32) as u32).then_some(pid_tgid)
}

/// A context switch, as `note_switch` saw it.
pub struct Switch {
    /// The leaving thread's `pid_tgid`, read from its task.
    pub prev_id: u64,
    /// Whether each thread may belong to the target (`task_may_be_target`).
    pub prev_may_be_target: bool,
    pub next_may_be_target: bool,
}

/// Notes a switch from `prev` (current until it happens) to `next` (the switch program's
/// first step), with the verdict on `next`; `prev`'s is the one noted at its arrival, when
/// nothing changed the target set since (see `note_in`): a switch between two other processes
/// tests the set once, not twice. `state` is this CPU's (`on_cpu::state`).
#[inline(always)]
pub fn note_switch(
    state: Option<*mut CpuState>,
    prev: *const task_struct,
    next: *const task_struct,
) -> Switch {
    let config = config();
    if config.task_pid_offset == 0 || config.task_tgid_offset == 0 {
        return Switch {
            prev_id: bpf_get_current_pid_tgid(),
            prev_may_be_target: true,
            next_may_be_target: true,
        };
    }
    // Before the verdicts: see `write_note`.
    let epoch = on_cpu::notes_epoch();
    let prev_id = task_pid_tgid(config, prev);
    let next_id = task_pid_tgid(config, next);
    let next_tgid = (next_id >> 32) as u32;
    let next_may_be_target = tgid_may_be_target(config, next_tgid);
    let prev_may_be_target = || tgid_may_be_target(config, (prev_id >> 32) as u32);
    let Some(state) = state else {
        return Switch { prev_id, prev_may_be_target: prev_may_be_target(), next_may_be_target };
    };
    let noted = note_in(state);
    let prev_may_be_target = noted != prev_id | OUTSIDE && prev_may_be_target();
    let noted = noted & !(HIDDEN_NOTE | OUTSIDE);
    if noted != 0 && noted != prev_id {
        // The task noted last left without a switch the kernel showed.
        let tgid = (noted >> 32) as u32;
        learn_hidden(tgid);
        if may_be_target(tgid) {
            counters::add(Counter::SwitchesUnseen, 1);
        }
    }
    // The idle task's note stays 0, unknown: a task that gets the CPU from it in a switch the
    // kernel does not show (`sched.rs::account_switch_out`) must reach the helper, not the
    // verdict on the idle task.
    write_note(state, note(next_id, next_may_be_target), epoch);
    Switch { prev_id, prev_may_be_target, next_may_be_target }
}

/// The note of task `id` arriving on a CPU, with the verdict on it (`task_may_be_target`).
#[inline(always)]
fn note(id: u64, may_be_target: bool) -> u64 {
    if is_hidden((id >> 32) as u32) {
        id | HIDDEN_NOTE
    } else if may_be_target || id == 0 {
        id
    } else {
        id | OUTSIDE
    }
}

/// `task`'s `pid_tgid`, from its BTF fields (the offsets are known).
#[inline(always)]
fn task_pid_tgid(config: &Config, task: *const task_struct) -> u64 {
    u64::from(task_field::<u32>(task, config.task_tgid_offset)) << 32
        | u64::from(task_field::<u32>(task, config.task_pid_offset))
}

/// Whether process `tgid`'s events may be hidden from the programs. Run at every switch on the
/// machine: `learn_hidden` fills the slots in order, so the search ends at the first empty one
/// (one load while nothing was learned).
#[inline(always)]
fn is_hidden(tgid: u32) -> bool {
    tgid == INIT
        || (0..HIDDEN_SLOTS)
            .map_while(|i| HIDDEN.get(i).copied().filter(|&hidden| hidden != 0))
            .any(|hidden| hidden == tgid)
}

/// Whether process `tgid` may be traced, for a task that is not current: a target under
/// `--all` and `--pid`; under `--cgroup`, unknown without the task, and taken as not (a
/// sandbox's agent lives outside the cgroups traced).
#[inline(always)]
fn may_be_target(tgid: u32) -> bool {
    match config().filter {
        filter::ALL => true,
        filter::CGROUP => false,
        _ => is_target_process(tgid),
    }
}

/// Adds `tgid` to `HIDDEN` (init, whose arrivals are noted as hidden from the start, only
/// repeats itself). Two CPUs learning at once may both take a slot: a duplicate wastes one.
#[inline(always)]
fn learn_hidden(tgid: u32) {
    if tgid == INIT {
        return;
    }
    for i in 0..HIDDEN_SLOTS {
        let Some(slot) = HIDDEN.get_ptr_mut(i) else { return };
        // SAFETY: a map value, valid for this run.
        let hidden = unsafe { &mut *slot };
        if *hidden == tgid {
            return;
        }
        if *hidden == 0 {
            *hidden = tgid;
            return;
        }
    }
}

/// Notes the current task again, after an exec that may have changed its thread id (a thread
/// other than the leader that execs takes the leader's id), with the verdict a switch would
/// give it: a note without it would pass another process's calls for a target's
/// (`current_target`) until the task next left the CPU. Only where the switch program runs
/// (`Config::switch_notes`): nothing reads the notes otherwise.
#[inline(always)]
pub fn renote_current() {
    if config().switch_notes == 0 {
        return;
    }
    if let Some(state) = on_cpu::state() {
        let epoch = on_cpu::notes_epoch();
        let id = bpf_get_current_pid_tgid();
        write_note(state, note(id, tgid_may_be_target(config(), (id >> 32) as u32)), epoch);
    }
}

/// The last verdict of the cgroup filter on this CPU.
#[repr(C)]
pub struct TargetCache {
    tgid: u32,
    /// 1 not a target, 2 a target; 0 means empty.
    verdict: u32,
}

#[map]
static TARGET_CACHE: PerCpuArray<TargetCache> = PerCpuArray::with_max_entries(1, 0);

/// `is_current_target`, with the cgroup filter's verdict remembered per CPU for the last
/// process: a thread making syscalls in a loop pays for its helper call once, not per call.
/// The other filters cost an array load at most, less than the cache.
#[inline(always)]
pub fn is_current_target_cached(tgid: u32) -> bool {
    if config().filter != filter::CGROUP || tgid == config().self_tgid {
        return is_current_target(tgid);
    }
    let Some(cache) = TARGET_CACHE.get_ptr_mut(0) else {
        return is_current_target(tgid);
    };
    // SAFETY: a per-CPU slot, used by one program at a time on this CPU.
    let cache = unsafe { &mut *cache };
    if cache.tgid == tgid && cache.verdict != 0 {
        return cache.verdict == 2;
    }
    let verdict = is_current_target(tgid);
    cache.tgid = tgid;
    cache.verdict = if verdict { 2 } else { 1 };
    verdict
}

/// Whether the current task's name is the one `--comm` asked for.
#[inline(always)]
pub fn current_comm_matches() -> bool {
    let wanted = &config().comm;
    if wanted[0] == 0 {
        return false;
    }
    match bpf_get_current_comm() {
        Ok(comm) => comm == *wanted,
        Err(_) => false,
    }
}

/// Whether the current task, whose state this is, belongs to the target: decided on first use
/// and remembered in the task's storage, so the filter runs once per task, not per event.
#[inline(always)]
pub fn decide_current(state: &mut TaskState) -> bool {
    match state.target {
        TARGET => true,
        NOT_TARGET => false,
        _ => {
            let pid_tgid = aya_ebpf::helpers::bpf_get_current_pid_tgid();
            let tgid = (pid_tgid >> 32) as u32;
            // The idle task (pid 0) is never a scheduling target: it is what runs when nothing is.
            let yes = pid_tgid as u32 != 0 && is_current_target(tgid);
            state.target = if yes { TARGET } else { NOT_TARGET };
            state.tgid = tgid;
            state.tid = pid_tgid as u32;
            yes
        }
    }
}
