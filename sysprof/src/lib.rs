//! sysprof: an eBPF profiler that answers "where does the time go, and what should I change
//! first?" without modifying, restarting or injecting anything into the target.
//!
//! One `sysprof trace` runs these stages, each in its own module:
//!
//! 1. preflight: [`privileges`], [`target`] (the target exists), [`output`] (the directory is
//!    writable), [`btf`] (kernel layouts the programs need);
//! 2. load/attach: [`probes`] (the embedded BPF object, the generic loader), then every family
//!    in the one list ([`families`]) through one interface ([`family::Family`]): [`cpu`],
//!    [`sched`], [`signals`], [`syscalls`], [`memory`], [`gpu`], [`funcs`], each a folder;
//!    [`launch`] (`-- CMD` held at a gate);
//! 3. collect: [`collect`] (events, status line, the end of the trace), [`procs`] and
//!    [`procmaps`] (memory maps kept for symbolization);
//! 4. read out and detach: [`results`], [`readout`] (every map read, live or replayed),
//!    [`recording`] (what the analysis reads);
//! 5. analyze: [`analysis`] (each family's analysis into its report section, in turn),
//!    [`profile`] (stacks), [`symbolize`], [`latency`] (histograms);
//! 6. write: [`report`] (the model) and [`output`] (folded, SVG, Markdown, JSON).
//!
//! [`trace::trace`] runs stages 1 to 3 and hands over to [`results`]; the CLI ([`cli`]) only
//! builds a [`config::TraceConfig`].

pub(crate) mod analysis;
pub(crate) mod btf;
pub(crate) mod callsites;
pub mod check;
pub mod cli;
pub(crate) mod collect;
pub mod config;
pub mod cpu;
pub(crate) mod cpustat;
pub mod error;
pub(crate) mod family;
pub(crate) mod finish;
pub(crate) mod funcs;
#[doc(hidden)]
pub mod fuzzing;
pub mod gpu;
pub mod input;
pub mod kernel_memory;
pub(crate) mod ksyms;
pub mod latency;
pub(crate) mod launch;
pub mod limits;
pub(crate) mod loader_gate;
pub(crate) mod mapped;
pub mod memory;
pub mod merge;
pub mod output;
pub(crate) mod plt;
mod priority;
pub(crate) mod privileges;
pub mod probes;
pub(crate) mod procmaps;
pub(crate) mod procs;
pub(crate) mod profile;
pub(crate) mod push;
pub mod python;
pub(crate) mod record;
pub mod report;
pub mod sched;
pub(crate) mod selfcost;
pub(crate) mod signals;
pub(crate) mod symbolize;
pub mod syscalls;
pub mod target;
pub(crate) mod target_bits;
pub mod terminal;
mod timeline;
pub mod trace;
pub mod unwind;
pub(crate) mod uprobes;

pub use analysis::replay;
pub use finish::Finished;
pub use finish::rerender;
pub use trace::trace;
