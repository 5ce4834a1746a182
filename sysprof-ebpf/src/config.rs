//! The read-only configuration userspace writes into the object before loading it.

use sysprof_common::Config;

/// Overridden by the loader (`EbpfLoader::override_global`); the verifier sees it as constant
/// data, so branches on it cost nothing at run time.
#[unsafe(no_mangle)]
static CONFIG: Config = Config {
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
    _pad: 0,
};

/// The configuration, read through a volatile load so the compiler does not fold the
/// placeholder values above into the programs.
#[inline(always)]
pub fn config() -> &'static Config {
    // SAFETY: CONFIG is a valid static; the volatile read only stops constant folding.
    unsafe { &*core::ptr::read_volatile(&&raw const CONFIG) }
}
