//! The probe families as the pipeline sees them: each one that runs sets its part of the
//! kernel's configuration and attaches its programs through one interface, called in turn in
//! the order of [`enabled`], the one list of families. Their maps are read through
//! `readout::MapReader` (each dump's `read`), so that a saved read-out replays.
//!
//! Still by hand for now: what a family reads and how its figures reach the report
//! (`finish.rs`, `report::Report`, `output/markdown/`), and the uprobe families' work during
//! collection (`collect::CallTracing`).

use sysprof_common::Config;

use crate::{
    config::TraceConfig, cpu::CpuFamily, memory::MemoryFamily, probes::Probes, sched::SchedFamily,
    syscalls::SyscallFamily,
};

/// One probe family's kernel side.
pub(crate) trait Family {
    /// Its part of the kernel's configuration, before the object is loaded.
    fn configure(&self, _kernel: &mut Config) {}

    /// Attaches its programs (a program another family attached already is not attached
    /// again).
    fn attach(&self, probes: &mut Probes) -> anyhow::Result<()>;
}

/// The families this run traces, in the order they configure and attach.
pub(crate) fn enabled(config: &TraceConfig) -> Vec<Box<dyn Family>> {
    let on = config.families();
    let mut families: Vec<Box<dyn Family>> = Vec::new();
    if on.cpu {
        families.push(Box::new(CpuFamily { event: config.event, frequency_hz: config.frequency_hz }));
    }
    if on.sched {
        families.push(Box::new(SchedFamily));
    }
    if on.syscalls {
        families.push(Box::new(SyscallFamily));
    }
    if on.memory {
        families.push(Box::new(MemoryFamily));
    }
    families
}
