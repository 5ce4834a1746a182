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
    ) -> anyhow::Result<Option<bool>> {
        let offset = *self
            .exports(path)?
            .get(symbol)
            .with_context(|| format!("{} has no function {symbol}", path.display()))?;
        let links = probes.attach_calls(path, &[(offset, u64::from(id) | call::ERROR_IF_NEGATIVE)])?;
        probes.note_call_probes(&format!("function {symbol} in {}", path.display()), links);
        Ok(entry_emulated(path, offset))
    }
}

/// Whether the kernel emulates the instruction a uprobe at `offset` of `path` replaces, rather
/// than stepping it out of line (a second trap): what a probe hit costs depends on it (see
/// `calibrate::sysprof_probe_calibration`). `None` where it cannot tell.
pub fn entry_emulated(path: &Path, offset: u64) -> Option<bool> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::os::unix::fs::FileExt as _;
        let mut bytes = [0u8; 2];
        std::fs::File::open(path).ok()?.read_exact_at(&mut bytes, offset).ok()?;
        Some(emulated_on_x86_64(bytes))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (path, offset);
        None
    }
}

/// The first instructions x86-64's uprobes emulate, by their first two bytes: a push of a
/// register, a nop, a call, a jump (as measured: `calibrate::sysprof_probe_calibration`). Any
/// other, `endbr64` among them, is stepped out of line.
#[cfg(any(target_arch = "x86_64", test))]
fn emulated_on_x86_64(bytes: [u8; 2]) -> bool {
    matches!(
        bytes,
        [0x50..=0x57, _] // push r64
            | [0x41, 0x50..=0x57] // push r8-r15
            | [0x90, _] // nop
            | [0x0f, 0x1f] // nop r/m
            | [0xe8 | 0xe9 | 0xeb, _] // call, jmp
            | [0x70..=0x7f, _] // jcc rel8
            | [0x0f, 0x80..=0x8f] // jcc rel32
    )
}

/// (device, inode): the identity of a file whatever path reaches it.
pub fn file_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|meta| (meta.dev(), meta.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushes_nops_and_branches_are_emulated_the_rest_stepped() {
        assert!(emulated_on_x86_64([0x55, 0x48])); // push rbp
        assert!(emulated_on_x86_64([0x41, 0x57])); // push r15
        assert!(emulated_on_x86_64([0x0f, 0x1f])); // nopl 0(rax,rax)
        assert!(emulated_on_x86_64([0xe9, 0x00])); // jmp
        assert!(!emulated_on_x86_64([0xf3, 0x0f])); // endbr64
        assert!(!emulated_on_x86_64([0x48, 0x8d])); // lea
        assert!(!emulated_on_x86_64([0x48, 0x85])); // test
    }

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
