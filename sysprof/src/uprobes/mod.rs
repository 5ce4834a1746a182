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
                exports
                    .get(name)
                    .map(|&offset| (entry_point(path, offset).offset, u64::from(function_id) | flags))
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
        let entry = entry_point(path, offset);
        let links = probes.attach_calls(path, &[(entry.offset, u64::from(id) | call::ERROR_IF_NEGATIVE)])?;
        let past =
            if entry.past_endbr64 { " (past its endbr64, at the push the kernel emulates)" } else { "" };
        probes.note_call_probes(&format!("function {symbol} in {}{past}", path.display()), links);
        Ok(entry.emulated)
    }
}

/// Where a function's entry probe goes, and whether the kernel emulates the instruction there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryPoint {
    /// File offset of the probe: the function's first instruction, or the push after its
    /// `endbr64` (see [`entry_point`]).
    pub offset: u64,
    /// Whether the kernel emulates the probed instruction rather than stepping it out of line
    /// (a second trap): what a probe hit costs depends on it (see
    /// `calibrate::sysprof_probe_calibration`). `None` where it cannot tell.
    pub emulated: Option<bool>,
    /// Probed past an `endbr64`.
    pub past_endbr64: bool,
}

/// The entry probe's place for the function at `offset` of `path`. Every function of a build
/// for CET (Ubuntu's and Fedora's default, their glibc's malloc among them) begins with an
/// `endbr64`, which the kernel steps out of line: 5.5-6.9 us a call on a 2-CPU VM, against
/// 0.85-1.04 for a push, which it emulates. When a push follows it, the probe goes on the push:
/// `endbr64` does nothing there (it marks where an indirect branch may land, and the probe
/// changes no branch), the stack pointer still points at the return address (what a return
/// probe replaces), every call passes the push, and no branch comes back to it (a prologue is
/// no loop's head, unlike a leaf's first instruction, which is why nothing else is skipped).
pub fn entry_point(path: &Path, offset: u64) -> EntryPoint {
    #[cfg(target_arch = "x86_64")]
    {
        use std::os::unix::fs::FileExt as _;
        let mut bytes = [0u8; 6];
        let read = std::fs::File::open(path).and_then(|file| file.read_exact_at(&mut bytes, offset));
        if read.is_err() {
            return EntryPoint { offset, emulated: None, past_endbr64: false };
        }
        if bytes[..4] == ENDBR64 && is_push_x86_64([bytes[4], bytes[5]]) {
            return EntryPoint { offset: offset + 4, emulated: Some(true), past_endbr64: true };
        }
        EntryPoint { offset, emulated: Some(emulated_on_x86_64([bytes[0], bytes[1]])), past_endbr64: false }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = path;
        EntryPoint { offset, emulated: None, past_endbr64: false }
    }
}

/// `endbr64`'s encoding.
#[cfg(any(target_arch = "x86_64", test))]
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// A push of a 64-bit register, by its first two bytes.
#[cfg(any(target_arch = "x86_64", test))]
fn is_push_x86_64(bytes: [u8; 2]) -> bool {
    matches!(bytes, [0x50..=0x57, _] | [0x41, 0x50..=0x57])
}

/// The first instructions x86-64's uprobes emulate, by their first two bytes: a push of a
/// register, a nop, a call, a jump (as measured: `calibrate::sysprof_probe_calibration`). Any
/// other, `endbr64` among them, is stepped out of line.
#[cfg(any(target_arch = "x86_64", test))]
fn emulated_on_x86_64(bytes: [u8; 2]) -> bool {
    is_push_x86_64(bytes)
        || matches!(
            bytes,
            [0x90, _] // nop
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
    fn a_function_of_a_cet_build_is_probed_at_the_push_after_its_endbr64() {
        let dir = tempfile::tempdir().unwrap();
        let code = dir.path().join("code");
        // endbr64; push rbp | endbr64; lea (a leaf) | push rbx | lea
        let functions: [&[u8]; 4] = [
            &[0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48],
            &[0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x8d],
            &[0x53, 0x48, 0x8d, 0x47, 0x01, 0x5b],
            &[0x48, 0x8d, 0x47, 0x01, 0xc3, 0x90],
        ];
        std::fs::write(&code, functions.concat()).unwrap();
        let at = |offset| entry_point(&code, offset);
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(at(0), EntryPoint { offset: 4, emulated: Some(true), past_endbr64: true });
            assert_eq!(at(6), EntryPoint { offset: 6, emulated: Some(false), past_endbr64: false });
            assert_eq!(at(12), EntryPoint { offset: 12, emulated: Some(true), past_endbr64: false });
            assert_eq!(at(18), EntryPoint { offset: 18, emulated: Some(false), past_endbr64: false });
        }
        // Past the file's end: placed where asked, its kind unknown.
        assert_eq!(at(22), EntryPoint { offset: 22, emulated: None, past_endbr64: false });
    }

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
