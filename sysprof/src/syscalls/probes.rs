//! The syscall family's kernel side: the enter/exit programs, and the read-out of their exact
//! counts, errors and latency histograms.

use sysprof_common::{Config, CpuState, PendingCount, SyscallErrorKey, SyscallKey, SyscallStats, names};

use crate::{
    family::{Analysis, Family},
    latency::{self, Percentiles},
    probes::{Preload, Probes},
    record::reader::MapReader,
    report::Section,
    sched::probes::SCHED_SWITCH,
};

/// Syscall statistics as the kernel aggregated them.
#[derive(Debug, Default)]
pub struct SyscallDump {
    pub stats: Vec<(SyscallKey, SyscallSummary)>,
    pub errors: Vec<(SyscallErrorKey, u64)>,
    /// What the per-CPU caches still held, in neither map yet (see `PendingCount`).
    pub pending: Vec<PendingCount>,
}

/// One process's statistics for one syscall, its latency histogram read into percentiles as
/// it comes out of the map: a machine-wide trace of a build holds some 12,000 of them, which
/// in the kernel's form (1.3 KB, 320 buckets) took 16 MB, and twice that while the vector
/// grew (`sysprof trace --all -d 10` beside `make -j2` loops: peak RSS 93 MB).
#[derive(Clone, Copy, Debug, Default)]
pub struct SyscallSummary {
    pub calls: u64,
    pub errors: u64,
    pub timed: u64,
    pub timed_from_block: u64,
    pub latency: Percentiles,
}

impl SyscallSummary {
    pub fn of(stats: &SyscallStats) -> Self {
        SyscallSummary {
            calls: stats.calls,
            errors: stats.errors,
            timed: stats.timed,
            timed_from_block: stats.timed_from_block,
            latency: latency::percentiles(&stats.latency),
        }
    }
}

/// The syscall family: exact counts, errors and latency.
#[derive(Default)]
pub(crate) struct SyscallFamily {
    dump: SyscallDump,
}

impl Family for SyscallFamily {
    fn name(&self) -> &'static str {
        "syscalls"
    }

    fn configure(&self, kernel: &mut Config) {
        kernel.nr_exit = syscalls::Sysno::exit as u32;
        kernel.nr_exit_group = syscalls::Sysno::exit_group as u32;
    }

    fn programs(&self) -> &'static [Preload] {
        &[SCHED_SWITCH, SYSCALL_ENTER, SYSCALL_EXIT]
    }

    fn attach(&self, probes: &mut Probes) -> anyhow::Result<()> {
        // The switch program parks a syscall in flight when its thread leaves the CPU.
        probes.attach_sched_switch()?;
        probes.attach_syscalls()
    }

    fn read(&mut self, maps: &mut MapReader<'_>) -> anyhow::Result<()> {
        self.dump = SyscallDump::read(maps)?;
        Ok(())
    }

    fn analyze(&mut self, cx: &mut Analysis<'_>) -> anyhow::Result<Option<Box<dyn Section>>> {
        Ok(Some(Box::new(super::section::analyze(&self.dump, cx))))
    }
}

/// The syscall programs, which the memory family attaches too (mmap and brk arguments).
pub(crate) const SYSCALL_ENTER: Preload = Preload::BtfTracePoint("syscall_enter", "sys_enter");
pub(crate) const SYSCALL_EXIT: Preload = Preload::BtfTracePoint("syscall_exit", "sys_exit");

impl Probes {
    /// Attaches the syscall enter/exit programs.
    pub fn attach_syscalls(&mut self) -> anyhow::Result<()> {
        self.attach_btf_tracepoint("syscall_enter", "sys_enter")?;
        self.attach_btf_tracepoint("syscall_exit", "sys_exit")
    }
}

impl SyscallDump {
    /// Reads the syscall statistics.
    pub(crate) fn read(maps: &mut MapReader<'_>) -> anyhow::Result<Self> {
        let pending = maps
            .per_cpu::<CpuState>(names::CPU_STATE, 0)?
            .iter()
            .flat_map(|state| state.syscall.pending)
            .filter(|p| p.count != 0 || p.errno_count != 0)
            .collect();
        let mut stats = Vec::new();
        maps.for_each_entry(names::SYSCALLS, |key: SyscallKey, value: SyscallStats| {
            stats.push((key, SyscallSummary::of(&value)));
        })?;
        // The calls of the processes the map had no room for, under no process.
        maps.for_each_array_entry(
            names::SYSCALLS_BY_NR,
            |value: &SyscallStats| value.calls != 0,
            |nr, value| {
                stats.push((SyscallKey { tgid: super::UNATTRIBUTED, nr }, SyscallSummary::of(&value)))
            },
        )?;
        // As `MapReader::entries` does: held until the family is analyzed.
        stats.shrink_to_fit();
        Ok(SyscallDump { stats, errors: maps.entries(names::SYSCALL_ERRORS)?, pending })
    }
}
