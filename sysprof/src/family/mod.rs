//! The probe families as the pipeline sees them: one interface that every family implements and
//! the pipeline calls for each in turn, in the order of the one list (`family/list.rs`):
//! configure -> attach before the trace, read -> analyze after it. A family keeps what it read
//! until it analyzes it, and its analysis adds its section, recommendations, stack profiles
//! and limitations to one [`Analysis`], which also holds what every family may read: the run's
//! facts, the process table, the symbolizer, the probed calls and the sections of the families
//! analyzed before it.
//!
//! Still by hand: the uprobe families' work during collection (attaching to libraries as the
//! target maps them, draining call events), in `collect::UprobeTracers`.

pub(crate) mod list;

use sysprof_common::{CallKey, CallStats, Config};

use crate::{
    callsites::CallNames,
    gpu::{nvml, state::GpuState},
    probes::{Preload, Probes},
    procs::ProcessTable,
    profile::StackProfile,
    record::reader::{Counters, MapReader},
    record::{CallOutcome, RunFacts, RunProps},
    report::{Recommendation, Section, Sections},
    symbolize::Symbolizer,
};

/// One probe family, from its kernel configuration to its section of the report.
pub(crate) trait Family: Send {
    /// Its name, as other families name it in [`Family::analyzed_after`].
    fn name(&self) -> &'static str;

    /// Its part of the kernel's configuration, before the object is loaded.
    fn configure(&self, _kernel: &mut Config) {}

    /// Attaches its programs (a program another family attached already is not attached
    /// again). The uprobe families attach during collection instead.
    fn attach(&self, _probes: &mut Probes) -> anyhow::Result<()> {
        Ok(())
    }

    /// The programs its `attach` loads, verified side by side before any family attaches
    /// (`Probes::preload`).
    fn programs(&self) -> &'static [Preload] {
        &[]
    }

    /// Reads its maps once the trace ended (the same reads live and replayed) and keeps them
    /// for [`Family::analyze`].
    fn read(&mut self, _maps: &mut MapReader<'_>) -> anyhow::Result<()> {
        Ok(())
    }

    /// The processes its read-out names: the process table looks them up before its snapshot,
    /// so that the analysis (which reads nothing from /proc) knows them all.
    fn processes(&self) -> Vec<u32> {
        Vec::new()
    }

    /// The families whose sections its analysis reads: they are analyzed first.
    fn analyzed_after(&self) -> &'static [&'static str] {
        &[]
    }

    /// Analyzes what it read into its section of the report (None when it has none), adding
    /// its recommendations, stack profiles and limitations to `cx`.
    fn analyze(&mut self, cx: &mut Analysis<'_>) -> anyhow::Result<Option<Box<dyn Section>>>;
}

/// What a family's analysis reads, and what it adds to.
pub(crate) struct Analysis<'a> {
    pub props: &'a RunProps,
    pub run: &'a RunFacts,
    /// What the uprobe families found while the trace ran.
    pub outcome: &'a CallOutcome,
    /// NVML polls and the topology, when NVML was there.
    pub nvml: Option<&'a (Vec<nvml::Sample>, nvml::topology::Topology)>,
    pub processes: &'a mut ProcessTable,
    pub symbolizer: &'a mut Symbolizer,
    /// Probed calls (GPU APIs, `--func`), and their call sites and launched kernels by name.
    pub calls: &'a [(CallKey, CallStats)],
    /// The kernel's counters (samples, and what each family lost).
    pub counters: &'a Counters,
    pub names: &'a CallNames,
    /// The GPU calls' state (transfers, allocations), when the GPU family ran.
    pub gpu_state: Option<&'a GpuState>,
    /// The sections of the families analyzed so far.
    pub sections: Sections,
    pub recommendations: Vec<Recommendation>,
    /// Stack profiles to write as folded stacks and a flamegraph, in report order.
    pub profiles: Vec<StackFile>,
    pub limitations: Vec<String>,
}

/// A stack profile and the files it becomes (`name`.folded, `name`.svg).
pub(crate) struct StackFile {
    pub name: &'static str,
    pub title: String,
    pub profile: StackProfile,
}

impl Analysis<'_> {
    /// The trace's wall time in seconds.
    pub fn wall_s(&self) -> f64 {
        self.run.elapsed.as_secs_f64()
    }

    /// Adds a profile under `name`, titled "sysprof `what`: the target".
    pub fn add_profile(&mut self, name: &'static str, what: &str, profile: StackProfile) {
        let title = format!("sysprof {what}: {}", self.props.target);
        self.profiles.push(StackFile { name, title, profile });
    }
}
