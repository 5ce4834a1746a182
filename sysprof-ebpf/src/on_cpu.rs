//! Each CPU's state (`sysprof_common::CpuState`): the note of the task on it, which `target.rs`
//! keeps, and the syscall programs' slot (`syscalls.rs`), in one per-CPU value. A syscall's two
//! programs need both on every call of every process, and a per-CPU map's lookup costs a
//! program about 2 ns (kernel statistics on a getppid loop): in two maps, the note and the slot
//! took two lookups a program.

use aya_ebpf::{macros::map, maps::PerCpuArray};
use sysprof_common::CpuState;

#[map]
static CPU_STATE: PerCpuArray<CpuState> = PerCpuArray::with_max_entries(1, 0);

/// The notes' epoch (`sysprof_common::names::NOTES_EPOCH`): a note made in an earlier one is
/// no note. Userspace moves it on when the target set changes (`Probes::forget_switch_notes`),
/// instead of zeroing the notes, which would write over the syscall slots' counts. A global in
/// a data section of its own, read at a fixed address (see `window.rs`).
#[unsafe(no_mangle)]
#[unsafe(link_section = ".data.notes")]
static mut NOTES_EPOCH: u32 = 0;

/// This CPU's state: valid for the program's run, and used by one program at a time on this
/// CPU for what it writes (the switch and syscall programs do not nest; the others only read
/// the note).
#[inline(always)]
pub fn state() -> Option<*mut CpuState> {
    CPU_STATE.get_ptr_mut(0)
}

/// The epoch a note made now belongs to.
#[inline(always)]
pub fn notes_epoch() -> u32 {
    // SAFETY: a plain read of the global, which userspace writes whole.
    unsafe { *(&raw const NOTES_EPOCH) }
}
