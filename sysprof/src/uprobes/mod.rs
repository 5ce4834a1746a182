//! Uprobes on library and program functions, through the `call_enter`/`call_return` program
//! pair (sysprof-ebpf `calls.rs`): where each function starts, which libraries already have
//! them, and which user functions (`--func BIN:SYMBOL`) were asked for.

pub mod calibrate;
pub mod elf;
pub mod needed;

use std::{
    collections::{HashMap, HashSet},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use sysprof_common::call;

use crate::probes::Probes;

/// Ids of `--func` functions start here (GPU functions use the ids below).
pub const USER_FUNCTION_BASE: u32 = 1000;

pub use crate::config::FuncSpec;

/// The files and functions already probed, so rediscovery attaches each once.
#[derive(Debug, Default)]
pub struct CallProbes {
    /// (device, inode) of every file with probes.
    files: HashSet<(u64, u64)>,
    /// Exports of each file read so far.
    exports: HashMap<PathBuf, elf::Exports>,
    /// How many functions each attached file got, for the summary.
    pub attached: Vec<(PathBuf, usize)>,
}

impl CallProbes {
    /// Whether `path` already has sysprof's probes (the same file under another name counts).
    pub fn has(&self, path: &Path) -> bool {
        file_id(path).is_some_and(|id| self.files.contains(&id))
    }

    /// The exports of `path`, read once.
    pub fn exports(&mut self, path: &Path) -> anyhow::Result<&elf::Exports> {
        if !self.exports.contains_key(path) {
            let exports = elf::exported_functions(path)?;
            self.exports.insert(path.to_path_buf(), exports);
        }
        Ok(&self.exports[path])
    }

    /// Attaches `(name, id, flags)` functions found in `path`; returns how many it found.
    pub fn attach_functions(
        &mut self,
        probes: &mut Probes,
        path: &Path,
        functions: &[(&str, u32, u64)],
        label: &str,
    ) -> anyhow::Result<usize> {
        let id = file_id(path).with_context(|| format!("no file at {}", path.display()))?;
        let exports = self.exports(path)?.clone();
        let points: Vec<(u64, u64)> = functions
            .iter()
            .filter_map(|&(name, function_id, flags)| {
                exports.get(name).map(|&offset| (offset, u64::from(function_id) | flags))
            })
            .collect();
        let count = points.len();
        let links = probes
            .attach_calls(path, &points)
            .with_context(|| format!("probing {label} functions in {}", path.display()))?;
        self.files.insert(id);
        if count > 0 {
            probes.note_call_probes(&format!("{label} {} ({count} functions)", path.display()), links);
            self.attached.push((path.to_path_buf(), count));
        }
        Ok(count)
    }

    /// Attaches one user function (`--func`), with a negative return counted as an error.
    pub fn attach_user_function(
        &mut self,
        probes: &mut Probes,
        path: &Path,
        symbol: &str,
        id: u32,
    ) -> anyhow::Result<()> {
        let offset = *self
            .exports(path)?
            .get(symbol)
            .with_context(|| format!("{} has no function {symbol}", path.display()))?;
        let links = probes.attach_calls(path, &[(offset, u64::from(id) | call::ERROR_IF_NEGATIVE)])?;
        probes.note_call_probes(&format!("function {symbol} in {}", path.display()), links);
        Ok(())
    }
}

/// (device, inode): the identity of a file whatever path reaches it.
pub fn file_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|meta| (meta.dev(), meta.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn func_specs_split_at_the_last_colon() {
        let spec: FuncSpec = "/opt/app/bin/server:handle_request".parse().unwrap();
        assert_eq!(spec, FuncSpec { binary: "/opt/app/bin/server".into(), symbol: "handle_request".into() });
        let spec: FuncSpec = "libc.so.6:malloc".parse().unwrap();
        assert_eq!(spec.binary, "libc.so.6");
        assert!("malloc".parse::<FuncSpec>().is_err());
        assert!(":malloc".parse::<FuncSpec>().is_err());
    }
}
