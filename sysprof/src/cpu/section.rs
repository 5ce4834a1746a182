//! The on-CPU family's section of the report: samples per process and the hotspots, built from
//! the symbolized profile, with the profile itself written as cpu.folded and cpu.svg.

use std::fmt::Write as _;

use serde::Serialize;

use super::{
    CpuSamples,
    hotspots::{Hotspot, ProcessShare, hotspots, process_shares},
    recommend::{CpuFacts, busy, cpu_recommendations, probe_samples},
};
use crate::{
    family::Analysis,
    output::markdown::{escape, table},
    profile,
    report::{
        Section,
        format::{percent, thousands},
    },
};

/// Number of hotspot rows in the report.
const HOTSPOTS: usize = 25;

/// On-CPU samples per process and the hottest functions.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CpuSection {
    /// On-CPU samples per process, largest first.
    pub processes: Vec<ProcessShare>,
    /// Functions by self share of on-CPU samples.
    pub hotspots: Vec<Hotspot>,
    /// Samples in sysprof's own probes (`[sysprof probes]` frames): sysprof's cost, left out of
    /// the advice.
    pub probe_samples: u64,
    /// CPU seconds of the target, from its samples (the idle loop left out).
    pub cpu_s: f64,
}

impl CpuSection {
    /// Samples with a stack, all processes together.
    pub fn samples(&self) -> u64 {
        self.processes.iter().map(|p| p.weight).sum()
    }
}

/// The section, its recommendations and (when the CPUs were sampled) the profile's files.
pub(crate) fn analyze(samples: &CpuSamples, sampled: bool, cx: &mut Analysis<'_>) -> CpuSection {
    let profile = profile::cpu_profile(samples, cx.processes, cx.symbolizer);
    // Python functions, not the interpreter's internals, are what a Python program can change.
    let functions = crate::python::by_function(&profile);
    let hotspots = hotspots(&functions, HOTSPOTS);
    let facts = CpuFacts {
        frequency_hz: cx.props.frequency_hz,
        wall_s: cx.wall_s(),
        syscalls_traced: cx.props.families.syscalls,
    };
    let busy = busy(&functions);
    let (recommendations, limitations) = cpu_recommendations(&busy, &facts);
    cx.recommendations.extend(recommendations);
    cx.limitations.extend(limitations);
    let cpu_s = busy.total() as f64 / cx.props.frequency_hz.max(1) as f64;
    let section = CpuSection {
        processes: process_shares(&profile),
        hotspots,
        probe_samples: probe_samples(&profile),
        cpu_s,
    };
    if sampled {
        cx.add_profile("cpu", "on-CPU", profile);
    }
    section
}

impl Section for CpuSection {
    fn json(&self) -> Vec<(&'static str, &dyn erased_serde::Serialize)> {
        vec![("processes", &self.processes), ("hotspots", &self.hotspots)]
    }

    fn markdown(&self, out: &mut String) {
        markdown(out, self);
    }

    fn busy_s(&self) -> Option<f64> {
        Some(self.cpu_s)
    }
}

fn markdown(out: &mut String, cpu: &CpuSection) {
    let _ = writeln!(out, "### CPU: processes\n");
    if cpu.processes.is_empty() {
        let _ = writeln!(out, "No on-CPU samples of the target: it did not run on a CPU while traced.\n");
        return;
    }
    let rows: Vec<Vec<String>> = cpu
        .processes
        .iter()
        .take(20)
        .map(|p| vec![escape(&p.name), p.pid.to_string(), thousands(p.weight), percent(p.share)])
        .collect();
    table(out, &["Process", "PID", "Samples", "Share"], &rows);

    let _ = writeln!(out, "### CPU: hotspots\n");
    let _ = writeln!(
        out,
        "Self: samples in the function's own code. Total: samples in it or in what it calls. \
         The flamegraph is cpu.svg.\n"
    );
    if cpu.probe_samples > 0 {
        let _ = writeln!(
            out,
            "{} ({}) {} in sysprof's own probes (`[sysprof probes]`: the syscall tracepoints, the page-fault \
             events, the uprobe traps): sysprof's cost, left out of the advice.\n",
            crate::report::format::count(cpu.probe_samples, "sample", "samples"),
            percent(cpu.probe_samples as f64 / cpu.samples().max(1) as f64),
            if cpu.probe_samples == 1 { "was" } else { "were" }
        );
    }
    let rows: Vec<Vec<String>> = cpu
        .hotspots
        .iter()
        .map(|h| {
            vec![
                format!("`{}`", escape(&h.function)),
                escape(&h.module),
                percent(h.self_share),
                thousands(h.self_weight),
                percent(h.total_share),
                thousands(h.total_weight),
            ]
        })
        .collect();
    table(out, &["Function", "Module", "Self %", "Self", "Total %", "Total"], &rows);
}
