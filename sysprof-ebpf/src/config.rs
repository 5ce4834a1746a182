//! The read-only configuration userspace writes into the object before loading it.

use sysprof_common::Config;

/// Overridden by the loader (`EbpfLoader::override_global`); the verifier sees it as constant
/// data, so branches on it cost nothing at run time. `mut`, in a `.rodata` section all the same
/// (aya loads it as a frozen read-only map): to the compiler an exported mutable static may
/// change, so it neither folds the placeholder values below into the programs nor needs the
/// volatile read of its address it had, which went through the stack on every use (a getppid's
/// two programs took 2.5 ns less without it, kernel statistics on). A section of its own: aya
/// names maps by section, and `.rodata` holds other constants.
#[unsafe(no_mangle)]
#[unsafe(link_section = ".rodata.config")]
static mut CONFIG: Config = Config {
    filter: 0,
    cgroup_level: 0,
    cgroup_id: 0,
    task_pid_offset: 0,
    task_tgid_offset: 0,
    comm: [0; 16],
    sched_stats: 0,
    syscall_burst: 0,
    syscall_sample_every: 1,
    address_space: 0,
    nr_mmap: u32::MAX,
    nr_munmap: u32::MAX,
    nr_brk: u32::MAX,
    nr_mremap: u32::MAX,
    fault_stack_every: 8,
    // No process has this id; the loader writes sysprof's own.
    self_tgid: u32::MAX,
    nr_exit: u32::MAX,
    nr_exit_group: u32::MAX,
    task_fsbase_offset: 0,
    timeline_min_us: 0,
    task_min_flt_offset: 0,
    task_maj_flt_offset: 0,
    task_exec_runtime_offset: 0,
    task_start_boottime_offset: 0,
    switch_notes: 0,
    task_signal_offset: 0,
    signal_live_offset: 0,
    task_mm_offset: 0,
    mm_vdso_offset: 0,
    task_exec_id_offset: 0,
};

/// The configuration.
#[inline(always)]
#[expect(clippy::deref_addrof, reason = "a reference to a `static mut` is made from its raw address")]
pub fn config() -> &'static Config {
    // SAFETY: nothing writes CONFIG once the program is loaded (the kernel refuses it).
    unsafe { &*&raw const CONFIG }
}
