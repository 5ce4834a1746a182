//! Memory: how much each target holds over the run ([`usage`]), where it page-faults and how
//! its address space changes (kernel side: the fault events and the mmap/munmap/brk/mremap
//! syscalls' arguments), its heap with `--malloc` ([`heap`]), the data it holds on both the
//! CPU and a GPU ([`redundancy`]), and the report section built from them ([`report`]).

pub mod heap;
pub(crate) mod probes;
pub mod profiles;
pub mod redundancy;
pub mod report;
pub(crate) mod section;
pub mod usage;

pub use self::probes::MemoryDump;
use syscalls::Sysno;
use sysprof_common::Config;

pub use crate::procs::UNATTRIBUTED;

/// How the report names the processes the fault map had no room for (`names::FAULTS_BY_KIND`),
/// whose faults are under `UNATTRIBUTED`.
pub const UNATTRIBUTED_NAME: &str = "(processes the fault map had no room for)";

/// How the report names those processes' address-space changes.
pub const UNATTRIBUTED_SPACE_NAME: &str = "(processes the address-space map had no room for)";

/// Past a process's first `sysprof_common::FAULT_STACKS_ALL` minor faults, their stacks are
/// taken for 1 fault in this many, at random, each standing for as many: a stack walk costs
/// many times a minor fault (a compiler's, walked with its unwind tables: 10 us against 1 us),
/// and a sample of the stacks shows where faults come from as well as all of them. 1 in 256:
/// a `make -j2` of a small project faults 70,000 times, and its 520 walks at 1 in 128 were 7
/// of its 60 ms of BPF time, the line of 1% of its CPU time (`cargo xtask bench realistic`);
/// 270 stacks still place a tenth of the faults to within two points. A program that faults
/// a million times a second pays 4,000 walks a second for them, about 5% of a CPU.
pub const FAULT_STACK_EVERY: u32 = 256;

/// Sets the kernel side's memory options: address-space accounting on, and this architecture's
/// numbers of the syscalls it reads.
pub fn configure_kernel(config: &mut Config) {
    config.address_space = 1;
    config.nr_mmap = Sysno::mmap as u32;
    config.nr_munmap = Sysno::munmap as u32;
    config.nr_brk = Sysno::brk as u32;
    config.nr_mremap = Sysno::mremap as u32;
    config.fault_stack_every = FAULT_STACK_EVERY;
}
