//! `--func BIN:SYMBOL`: time any function the user names, with no change to the target: calls,
//! latency, negative returns, and the call sites, through the same uprobe programs as the GPU
//! APIs. BIN is a path, or the file name of a binary or library the target maps (resolved when
//! the target maps it, so `-- CMD` works too).

pub mod section;

use std::path::{Path, PathBuf};

use serde::Serialize;
use sysprof_common::{CallKey, CallStats};

use crate::{
    callsites::Names,
    latency::{self, Percentiles},
    mapped::FileKey,
    privileges::InvokingUser,
    probes::Probes,
    procmaps::Backing,
    procs::ProcessTable,
    record::ProbeShare,
    uprobes::{Binary, CallProbes, FuncSpec, Named, USER_FUNCTION_BASE},
};

/// Attaches the requested functions when their binaries are known.
#[derive(Debug, Default)]
pub struct FuncTracer {
    specs: Vec<FuncSpec>,
    /// The file of each spec that names a path, opened at the start as the user who named it
    /// (`None` for a name, found later).
    named: Vec<Option<Named>>,
    /// The file each spec resolved to, once attached.
    attached: Vec<Option<PathBuf>>,
    /// Whether the kernel emulates each attached function's first instruction
    /// (`uprobes::entry_point`).
    entry_emulated: Vec<Option<bool>>,
    probes: CallProbes,
    pub problems: Vec<String>,
}

/// A `--func` function that was probed, under its call id.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct ProbedFunction {
    pub id: u32,
    pub symbol: String,
    pub binary: String,
    /// Whether the kernel emulates its first instruction (`uprobes::entry_point`).
    #[serde(default)]
    pub entry_emulated: Option<bool>,
}

/// One probed function in the report.
#[derive(Clone, Debug, Serialize)]
pub struct FuncRow {
    pub function: String,
    pub binary: String,
    pub calls: u64,
    /// Calls that returned a negative value.
    pub negative_returns: u64,
    pub latency: Percentiles,
    /// Where it was called from, most calls first.
    pub callers: Vec<(String, u64)>,
    /// How much of each call's time is the probes' own, as measured on this machine for a
    /// function that begins as this one does (`uprobes::calibrate::timed_share_ns`; where that
    /// kind was not measured, the emulated one's, at least).
    pub probe_time_per_call_ns: Option<u64>,
    /// Whether the kernel steps its first instruction out of line (`uprobes::entry_point`).
    pub entry_stepped: bool,
}

impl FuncRow {
    /// Whether the probes' own time is at least half of this function's typical call.
    pub fn mostly_probes(&self) -> bool {
        self.probe_time_per_call_ns.is_some_and(|probes| self.latency.p50_ns < 2 * probes)
    }
}

impl FuncTracer {
    /// `named` holds, for each spec, its file when the spec names a path (see `Named`).
    pub fn new(specs: Vec<FuncSpec>, named: Vec<Option<Named>>) -> Self {
        let attached = vec![None; specs.len()];
        let entry_emulated = vec![None; specs.len()];
        FuncTracer {
            specs,
            named,
            attached,
            entry_emulated,
            probes: CallProbes::default(),
            problems: Vec::new(),
        }
    }

    /// Attaches the specs whose binary can be found now: paths at once, names once the target
    /// maps a file of that name.
    pub fn attach_ready(&mut self, probes: &mut Probes, processes: &ProcessTable, version: u64) {
        self.attach_found(probes, |name| {
            let (path, open, key) = find_mapped(processes, version, name)?;
            Some(Binary::mapped(&open, key).map_err(|error| (path, error.to_string())))
        });
    }

    /// Attaches the specs that name a launched program or a library it needs, before it runs:
    /// found and opened as `user`, whom the command runs as (the files its loader would load).
    pub fn attach_for_program(&mut self, probes: &mut Probes, program: &Path, user: Option<&InvokingUser>) {
        let mut files = vec![program.to_path_buf()];
        if self.specs.iter().any(|spec| !spec.binary.contains('/')) {
            files.extend(crate::uprobes::needed::needed_libraries(program, user));
        }
        self.attach_found(probes, |name| {
            let path = files.iter().find(|file| file_matches(file, name))?;
            Some(Binary::open(path, user).map_err(|error| (path.clone(), error.to_string())))
        });
    }

    fn attach_found(&mut self, probes: &mut Probes, find: impl Fn(&str) -> Option<Named>) {
        for index in 0..self.specs.len() {
            if self.attached[index].is_some() {
                continue;
            }
            let spec = self.specs[index].clone();
            let file = match self.named.get(index).cloned().flatten() {
                Some(named) => named,
                None if spec.binary.contains('/') => continue,
                None => match find(&spec.binary) {
                    Some(found) => found,
                    None => continue,
                },
            };
            let id = USER_FUNCTION_BASE + index as u32;
            let attached = file.map_err(|(_, error)| anyhow::anyhow!(error)).and_then(|file| {
                Ok((self.probes.attach_user_function(probes, &file, &spec.symbol, id)?, file))
            });
            match attached {
                Ok((emulated, file)) => {
                    self.attached[index] = Some(file.shown().to_path_buf());
                    self.entry_emulated[index] = emulated;
                }
                Err(error) => {
                    self.problems.push(format!("--func {}:{}: {error:#}", spec.binary, spec.symbol));
                    // Do not try again every tick.
                    self.attached[index] = Some(PathBuf::new());
                }
            }
        }
    }

    /// Specs whose binary never showed up.
    pub fn unresolved(&self) -> Vec<String> {
        self.specs
            .iter()
            .zip(&self.attached)
            .filter(|(_, attached)| attached.is_none())
            .map(|(spec, _)| {
                format!(
                    "--func {}:{}: no binary named {} was mapped by the target",
                    spec.binary, spec.symbol, spec.binary
                )
            })
            .collect()
    }

    /// The functions that were probed.
    pub fn probed(&self) -> Vec<ProbedFunction> {
        self.specs
            .iter()
            .enumerate()
            .filter(|(index, _)| self.attached[*index].as_ref().is_some_and(|p| !p.as_os_str().is_empty()))
            .map(|(index, spec)| ProbedFunction {
                id: USER_FUNCTION_BASE + index as u32,
                symbol: spec.symbol.clone(),
                binary: spec.binary.clone(),
                entry_emulated: self.entry_emulated[index],
            })
            .collect()
    }
}

/// The report rows of the probed functions, from the kernel-side statistics; `probe_share` is
/// the probes' own time in each call, when it was measured.
pub fn rows(
    functions: &[ProbedFunction],
    calls: &[(CallKey, CallStats)],
    names: &dyn Names,
    probe_share: &ProbeShare,
) -> Vec<FuncRow> {
    functions
        .iter()
        .map(|probed| {
            let id = probed.id;
            let mut hist = latency::empty();
            let mut negative = 0;
            let mut callers: Vec<(String, u64)> = Vec::new();
            for (key, stats) in calls.iter().filter(|(key, _)| key.func == id) {
                latency::merge(&mut hist, &stats.latency);
                negative += stats.errors;
                let image = crate::procs::ImageOf::Generation(key.exec_id);
                let site = names.call_site(key.tgid, image, key.user_stack_id, key.caller);
                match callers.iter_mut().find(|(s, _)| *s == site) {
                    Some((_, count)) => *count += stats.latency.count,
                    None => callers.push((site, stats.latency.count)),
                }
            }
            callers.sort_by_key(|(_, calls)| std::cmp::Reverse(*calls));
            callers.truncate(5);
            FuncRow {
                function: probed.symbol.clone(),
                binary: probed.binary.clone(),
                calls: hist.count,
                negative_returns: negative,
                latency: latency::percentiles(&hist),
                callers,
                probe_time_per_call_ns: probe_share.of(probed.entry_emulated),
                entry_stepped: probed.entry_emulated == Some(false),
            }
        })
        .collect()
}

/// A file the target maps whose name is `name` (or starts with it: `libc.so` finds libc.so.6):
/// its path as the target saw it, where sysprof opens it, and the file's identity.
fn find_mapped(processes: &ProcessTable, version: u64, name: &str) -> Option<(PathBuf, PathBuf, FileKey)> {
    processes.changed_since(version).find_map(|(_, record)| {
        record.maps.as_ref()?.mappings().iter().find_map(|mapping| match &mapping.backing {
            Backing::File { path, open, key } if file_matches(path, name) => {
                Some((path.to_path_buf(), open.to_path_buf(), *key))
            }
            _ => None,
        })
    })
}

fn file_matches(path: &Path, name: &str) -> bool {
    path.file_name()
        .and_then(|file| file.to_str())
        .is_some_and(|file| file == name || file.starts_with(&format!("{name}.")))
}
