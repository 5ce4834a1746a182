//! The syscall family's kernel side: the enter/exit programs, and the read-out of their exact
//! counts, errors and latency histograms.

use aya::maps::{MapData, PerCpuArray};
use sysprof_common::{SyscallErrorKey, SyscallKey, SyscallSlot, SyscallStats, names};

use crate::probes::Probes;

/// Syscall statistics as the kernel aggregated them.
#[derive(Debug, Default)]
pub struct SyscallDump {
    pub stats: Vec<(SyscallKey, SyscallStats)>,
    pub errors: Vec<(SyscallErrorKey, u64)>,
    /// Calls still counted in the per-CPU caches, not yet in `stats`.
    pub pending: Vec<(SyscallKey, u64)>,
}

impl Probes {
    /// Attaches the syscall enter/exit programs.
    pub fn attach_syscalls(&mut self) -> anyhow::Result<()> {
        self.attach_btf_tracepoint("syscall_enter", "sys_enter")?;
        self.attach_btf_tracepoint("syscall_exit", "sys_exit")
    }

    /// Reads the syscall statistics.
    pub fn syscalls(&self) -> anyhow::Result<SyscallDump> {
        let slots: PerCpuArray<&MapData, SyscallSlot> =
            PerCpuArray::try_from(self.map(names::SYSCALL_SLOT)?)?;
        let pending = slots
            .get(&0, 0)?
            .iter()
            .flat_map(|slot| slot.pending)
            .filter(|p| p.count != 0)
            .map(|p| (SyscallKey { tgid: p.tgid, nr: p.nr }, u64::from(p.count)))
            .collect();
        Ok(SyscallDump {
            stats: self.entries(names::SYSCALLS)?,
            errors: self.entries(names::SYSCALL_ERRORS)?,
            pending,
        })
    }
}
