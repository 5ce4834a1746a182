//! GPU API tracing: uprobes on the CUDA runtime (libcudart, or an executable linking it
//! statically), the CUDA driver (libcuda) and NCCL (libnccl), found in the target's memory maps
//! (libraries under Python's `nvidia/*/lib` included) and picked up when loaded later (dlopen).
//! Nothing is injected into the target and nothing restarts: the probes attach to the library
//! files and filter the target in the kernel.

pub(crate) mod functions;
pub mod nvml;
pub mod report;
pub mod section;
pub(crate) mod state;

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
};

use self::{
    functions::{FUNCTIONS, Library, VARIANT_SUFFIXES},
    state::GpuState,
};
use crate::{
    privileges::InvokingUser,
    probes::Probes,
    procmaps::Backing,
    procs::ProcessTable,
    uprobes::{self, Binary, CallProbes, Named, elf},
};

/// Where CUDA and NCCL usually live, searched in system-wide traces.
const INSTALL_DIRS: &[&str] = &[
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/targets/x86_64-linux/lib",
    "/usr/local/cuda/targets/sbsa-linux/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
];

/// One library file with probes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProbedLibrary {
    pub library: Library,
    pub path: PathBuf,
    pub functions: usize,
}

/// Finds the CUDA and NCCL libraries the target uses and keeps them probed; accumulates what
/// their calls say.
#[derive(Debug)]
pub struct GpuTracer {
    probes: CallProbes,
    /// Libraries named on the command line (--cuda-lib, --nccl-lib), opened at the start.
    overrides: Vec<Named>,
    system_wide: bool,
    /// Files already looked at (probed, or not a GPU library).
    seen: HashSet<PathBuf>,
    pub libraries: Vec<ProbedLibrary>,
    /// Attach failures, one line each, for the report.
    pub problems: Vec<String>,
    pub state: GpuState,
    /// Every call event, kept only when the read-out is saved (`--save-readout`).
    pub kept_events: Option<Vec<crate::record::reader::Bytes>>,
}

impl GpuTracer {
    pub fn new(overrides: Vec<Named>, system_wide: bool) -> Self {
        GpuTracer {
            probes: CallProbes::default(),
            overrides,
            system_wide,
            seen: HashSet::new(),
            libraries: Vec::new(),
            problems: Vec::new(),
            state: GpuState::default(),
            kept_events: None,
        }
    }

    /// Probes the libraries named on the command line, the usual install locations for
    /// system-wide traces, and whatever the target has mapped so far.
    pub fn attach_initial(&mut self, probes: &mut Probes, processes: &ProcessTable) {
        for named in self.overrides.clone() {
            let path = match &named {
                Ok(file) => file.shown().to_path_buf(),
                Err((path, _)) => path.clone(),
            };
            match (library_of(&path), named) {
                (Some(library), Ok(file)) => self.attach(probes, library, &file),
                (Some(library), Err((_, error))) => {
                    self.problems.push(format!("{} {error}", library.label()))
                }
                (None, _) => self.problems.push(format!(
                    "{} is not named like libcudart.so*, libcuda.so* or libnccl.so*: not probed",
                    path.display()
                )),
            }
        }
        if self.system_wide {
            for path in installed_libraries() {
                if let Some(library) = library_of(&path)
                    && let Ok(file) = Binary::open(&path, None)
                {
                    self.attach(probes, library, &file);
                }
            }
        }
        self.attach_new(probes, processes, 0);
    }

    /// Probes the GPU libraries a program will load at start, before it runs (a launched
    /// command is still at its gate): found and opened as `user`, whom the command runs as.
    pub fn attach_needed(&mut self, probes: &mut Probes, program: &Path, user: Option<&InvokingUser>) {
        for path in uprobes::needed::needed_libraries(program, user) {
            if let Some(library) = library_of(&path)
                && let Ok(file) = Binary::open(&path, user)
            {
                self.attach(probes, library, &file);
            }
        }
        if let Ok(file) = Binary::open(program, user)
            && links_cudart_statically(&file)
        {
            self.attach(probes, Library::Runtime, &file);
        }
    }

    /// Probes GPU libraries that appeared in the target's memory maps since `version` (see
    /// `ProcessTable::changed_since`).
    pub fn attach_new(&mut self, probes: &mut Probes, processes: &ProcessTable, version: u64) {
        let mut found: Vec<(Library, Binary)> = Vec::new();
        for (_, record) in processes.changed_since(version) {
            let Some(maps) = &record.maps else { continue };
            for mapping in maps.mappings() {
                let Backing::File { open, key, .. } = &mapping.backing else { continue };
                if self.seen.contains(&**open) {
                    continue;
                }
                self.seen.insert(open.to_path_buf());
                let library = library_of(open);
                let candidate = library.is_some() || (mapping.file_offset == 0 && !is_shared_library(open));
                let Some(file) = candidate.then(|| Binary::mapped(open, *key).ok()).flatten() else {
                    continue;
                };
                match library {
                    Some(library) => found.push((library, file)),
                    // An executable that links the runtime statically exports its API.
                    None if links_cudart_statically(&file) => found.push((Library::Runtime, file)),
                    None => {}
                }
            }
        }
        for (library, file) in found {
            self.attach(probes, library, &file);
        }
    }

    fn attach(&mut self, probes: &mut Probes, library: Library, file: &Binary) {
        if self.probes.has(file) {
            return;
        }
        let names: Vec<(String, u32, u64)> = FUNCTIONS
            .iter()
            .enumerate()
            .filter(|(_, f)| f.library == library)
            .flat_map(|(index, f)| {
                let id = functions::id_of(index);
                std::iter::once(f.name.to_string())
                    .chain(VARIANT_SUFFIXES.iter().map(move |suffix| format!("{}{suffix}", f.name)))
                    .map(move |name| (name, id, f.flags()))
            })
            .collect();
        let borrowed: Vec<(&str, u32, u64)> =
            names.iter().map(|(n, id, flags)| (n.as_str(), *id, *flags)).collect();
        let label = library.label();
        match self.probes.attach_functions(probes, file, &borrowed, label) {
            Ok(0) => {}
            Ok(functions) => {
                self.libraries.push(ProbedLibrary { library, path: file.shown().to_path_buf(), functions })
            }
            Err(error) => self.problems.push(format!("{label} {}: {error:#}", file.shown().display())),
        }
    }
}

/// Which GPU library a file is, by its name.
pub fn library_of(path: &Path) -> Option<Library> {
    let name = path.file_name()?.to_str()?;
    [Library::Runtime, Library::Driver, Library::Nccl].into_iter().find(|library| {
        let prefix = library.file_prefix();
        // libcuda.so must not match libcudart.so.
        name.strip_prefix(prefix).is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    })
}

fn is_shared_library(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.contains(".so"))
}

/// Whether an executable exports the CUDA runtime API (static cudart).
fn links_cudart_statically(file: &Binary) -> bool {
    file.reopen()
        .ok()
        .and_then(|opened| elf::exports_of(opened, file.shown()).ok())
        .is_some_and(|exports| exports.contains_key("cudaMalloc"))
}

/// CUDA and NCCL libraries in the usual install locations.
fn installed_libraries() -> Vec<PathBuf> {
    let mut found = Vec::new();
    for dir in INSTALL_DIRS {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if library_of(&path).is_some() && path.is_file() {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_are_known_by_name() {
        assert_eq!(library_of(Path::new("/x/libcudart.so.12")), Some(Library::Runtime));
        assert_eq!(library_of(Path::new("/x/libcudart.so")), Some(Library::Runtime));
        assert_eq!(library_of(Path::new("/usr/lib/libcuda.so.1")), Some(Library::Driver));
        assert_eq!(library_of(Path::new("nvidia/nccl/lib/libnccl.so.2")), Some(Library::Nccl));
        assert_eq!(library_of(Path::new("/x/libcudnn.so.9")), None);
        assert_eq!(library_of(Path::new("/x/libcudart_static.a")), None);
    }
}
