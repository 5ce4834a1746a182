//! The one list of probe families: which run, in the order they configure, attach and appear
//! in the report (the analysis takes them in this order too, except where a family is
//! analyzed after those it reads: see `Family::analyzed_after`). A new family is a folder that
//! implements `family::Family`, plus one line here.

use crate::{
    cpu::probes::CpuFamily,
    family::Family,
    funcs::section::FuncsFamily,
    gpu::{nvml::section::NvmlFamily, section::GpuFamily},
    memory::probes::MemoryFamily,
    record::RunProps,
    sched::probes::SchedFamily,
    signals::SignalFamily,
    syscalls::probes::SyscallFamily,
};

/// The families of this run, in report order.
pub(crate) fn enabled(props: &RunProps) -> Vec<Box<dyn Family>> {
    let on = props.families;
    // The CPU section is always there: a run that did not sample says so.
    let mut families: Vec<Box<dyn Family>> =
        vec![Box::new(CpuFamily::new(props.event, props.frequency_hz, on.cpu))];
    if on.sched {
        families.push(Box::new(SchedFamily::default()));
        families.push(Box::new(SignalFamily::default()));
    }
    if on.syscalls {
        families.push(Box::new(SyscallFamily::default()));
    }
    if on.memory {
        families.push(Box::new(MemoryFamily::new(on.heap)));
    }
    if on.gpu {
        families.push(Box::new(GpuFamily));
        families.push(Box::new(NvmlFamily));
    }
    families.push(Box::new(FuncsFamily));
    families
}
