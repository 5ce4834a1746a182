//! Uprobes on library and program functions, through the `call_enter`/`call_return` program
//! pair (sysprof-ebpf `calls.rs`): where each function starts, which libraries already have
//! them, and which user functions (`--func BIN:SYMBOL`) were asked for.

mod binary;
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

pub use self::binary::{Binary, Named};
pub use crate::config::FuncSpec;

/// The files and functions already probed, so rediscovery attaches each once.
#[derive(Debug, Default)]
pub struct CallProbes {
    /// (device, inode) of every file with probes.
    files: HashSet<(u64, u64)>,
    /// Exports of each file read so far, by (device, inode).
    exports: HashMap<(u64, u64), elf::Exports>,
    /// How many functions each attached file got, for the summary.
    pub attached: Vec<(PathBuf, usize)>,
}

impl CallProbes {
    /// Whether `file` already has sysprof's probes (the same file under another name counts).
    pub fn has(&self, file: &Binary) -> bool {
        file.id().is_some_and(|id| self.files.contains(&id))
    }

    /// The exports of `file`, read once.
    pub fn exports(&mut self, file: &Binary) -> anyhow::Result<&elf::Exports> {
        let id = file.id().with_context(|| format!("no file at {}", file.shown().display()))?;
        match self.exports.entry(id) {
            std::collections::hash_map::Entry::Occupied(known) => Ok(known.into_mut()),
            std::collections::hash_map::Entry::Vacant(slot) => {
                let opened = file.reopen().with_context(|| format!("opening {}", file.shown().display()))?;
                Ok(slot.insert(elf::exports_of(opened, file.shown())?))
            }
        }
    }

    /// Attaches `(name, id, flags)` functions found in `file`; returns how many it found.
    pub fn attach_functions(
        &mut self,
        probes: &mut Probes,
        file: &Binary,
        functions: &[(&str, u32, u64)],
        label: &str,
    ) -> anyhow::Result<usize> {
        let id = file.id().with_context(|| format!("no file at {}", file.shown().display()))?;
        let exports = self.exports(file)?;
        let points: Vec<(u64, u64)> = functions
            .iter()
            .filter_map(|&(name, function_id, flags)| {
                let entry = |offset: u64| entry_point(file.path(), offset, exports.size_at(offset), false);
                exports.get(name).map(|&offset| (entry(offset).offset, u64::from(function_id) | flags))
            })
            .collect();
        let count = points.len();
        let shown = file.shown().display();
        let links = probes
            .attach_calls(file, &points)
            .with_context(|| format!("probing {label} functions in {shown}"))?;
        self.files.insert(id);
        if count > 0 {
            let functions = crate::report::format::count(count as u64, "function", "functions");
            probes.note_call_probes(&format!("{label} {shown} ({functions})"), links);
            self.attached.push((file.shown().to_path_buf(), count));
        }
        Ok(count)
    }

    /// Attaches one user function (`--func`), with a negative return counted as an error.
    pub fn attach_user_function(
        &mut self,
        probes: &mut Probes,
        file: &Binary,
        symbol: &str,
        id: u32,
    ) -> anyhow::Result<Option<bool>> {
        let shown = file.shown().display();
        let exports = self.exports(file)?;
        let offset = *exports.get(symbol).with_context(|| format!("{shown} has no function {symbol}"))?;
        let entry = entry_point(file.path(), offset, exports.size_at(offset), false);
        let links = probes.attach_calls(file, &[(entry.offset, u64::from(id) | call::ERROR_IF_NEGATIVE)])?;
        let past = entry.past.map_or(String::new(), |past| format!(" ({})", past.describe()));
        probes.note_call_probes(&format!("function {symbol} in {shown}{past}"), links);
        Ok(entry.emulated)
    }
}

/// Where a function's entry probe goes, and whether the kernel emulates the instruction there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryPoint {
    /// File offset of the probe: the function's first instruction, or one after it (see
    /// [`entry_point`]).
    pub offset: u64,
    /// Whether the kernel emulates the probed instruction rather than stepping it out of line
    /// (a second trap): what a probe hit costs depends on it (see
    /// `calibrate::sysprof_probe_calibration`). `None` where it cannot tell.
    pub emulated: Option<bool>,
    /// What the probe was moved past, when it was.
    pub past: Option<Past>,
}

/// The first instructions an entry probe goes past, to one the kernel emulates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub enum Past {
    /// A CET build's `endbr64`, to the push after it.
    Endbr64,
    /// A test or comparison of registers (and an `endbr64` before it, if any), to the
    /// conditional jump after it: glibc's free begins `test rdi, rdi; je`.
    Test,
}

impl Past {
    /// Where the probe is, for Part B.
    pub fn describe(self) -> &'static str {
        match self {
            Past::Endbr64 => "past its endbr64, at the push the kernel emulates",
            Past::Test => "past its first test, at the conditional jump the kernel emulates",
        }
    }
}

/// The most of a function read to place its probe (its branches are checked, `x86::place`).
#[cfg(target_arch = "x86_64")]
const MAX_FUNCTION_BYTES: u64 = 64 << 10;

/// The entry probe's place for the function at `offset` of `path` (`size` bytes long, when its
/// symbol says). The kernel steps most probed instructions out of line, a second trap each
/// call: 5.3-7.3 us a call on a 2-CPU VM against 0.85-1.04 us for a push, which it emulates, as
/// it does a nop, a jump or a call. Two beginnings are common and need not be probed where
/// they start:
/// - a CET build's function (Ubuntu's and Fedora's default, their glibc among them) begins with
///   an `endbr64`. When a push follows, the probe goes on the push: the `endbr64` does nothing
///   there (it marks where an indirect branch may land, and no branch changes), and a prologue
///   is no loop's head (nor is it where a branch of the function lands, when all of it is read);
/// - a function that first tests an argument (glibc's free: `test rdi, rdi; je`). With
///   `past_test`, the probe goes on the conditional jump when no branch of the function lands
///   on it or on the test (`x86::place`). Only the function's own branches are checked: code
///   elsewhere (hand-written assembly sharing labels, a compiler's `.cold` part) could jump in,
///   so only the allocators' functions, which compilers write, are probed so.
///
/// Either way what the probe reads is as it was at the start: the arguments (neither
/// instruction writes a register but the flags), the stack pointer, and the return address
/// there, which a return probe replaces; and every call passes the probed instruction once.
pub fn entry_point(path: &Path, offset: u64, size: Option<u64>, past_test: bool) -> EntryPoint {
    let unknown = EntryPoint { offset, emulated: None, past: None };
    #[cfg(target_arch = "x86_64")]
    {
        use std::os::unix::fs::FileExt as _;
        // Without blocking: a FIFO put in a library's place would block an open for good.
        let Ok(file) = crate::input::open_regular(path, crate::input::Links::Follow) else { return unknown };
        let read = |len: u64| {
            let mut code = vec![0u8; len as usize];
            let mut read = 0;
            while read < code.len() {
                match file.read_at(&mut code[read..], offset + read as u64) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => read += n,
                }
            }
            code.truncate(read);
            code
        };
        entry_point_in(read, offset, size, past_test)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (path, size, past_test);
        unknown
    }
}

/// [`entry_point`], with `read(len)` the function's first `len` bytes (or fewer, at the end of
/// its file): a file's, or the fuzz target's (`fuzzing::uprobe_exports`).
#[cfg(target_arch = "x86_64")]
pub fn entry_point_in(
    read: impl Fn(u64) -> Vec<u8>,
    offset: u64,
    size: Option<u64>,
    past_test: bool,
) -> EntryPoint {
    let code = read(16);
    if code.len() < 2 {
        return EntryPoint { offset, emulated: None, past: None };
    }
    // The whole function (when its size is known and not too large) only where the probe
    // may move: a library's hundred functions are not each read whole at attach.
    let may_move = code.starts_with(&[0xf3, 0x0f, 0x1e, 0xfa]) || past_test;
    let size = size.filter(|size| may_move && (2..=MAX_FUNCTION_BYTES).contains(size));
    let (code, whole) = match size.map(read) {
        Some(function) if function.len() as u64 == size.unwrap_or(0) => (function, true),
        _ => (code, false),
    };
    let placed = x86::place(&code, whole, past_test);
    EntryPoint { offset: offset + placed.skip, emulated: Some(placed.emulated), past: placed.past }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind};

    use super::{Past, emulated_on_x86_64, is_push_x86_64};

    pub struct Placed {
        /// Bytes from the function's start to the probed instruction.
        pub skip: u64,
        pub emulated: bool,
        pub past: Option<Past>,
    }

    /// Where to probe the function whose code is `code`, all of it when `whole` (else its
    /// first bytes: then only an `endbr64` and a push are gone past, the push being a
    /// prologue's); past a test only with `past_test` (see `entry_point`).
    pub fn place(code: &[u8], whole: bool, past_test: bool) -> Placed {
        let at = |ip: usize| -> Option<Instruction> {
            let instruction = Decoder::with_ip(64, code.get(ip..)?, ip as u64, DecoderOptions::NONE).decode();
            (!instruction.is_invalid()).then_some(instruction)
        };
        let start = Placed { skip: 0, emulated: emulated_on_x86_64([code[0], code[1]]), past: None };
        let Some(first) = at(0) else { return start };
        let (endbr64, next) = match first.mnemonic() {
            Mnemonic::Endbr64 => (true, first.len()),
            _ => (false, 0),
        };
        let Some(second) = at(next) else { return start };
        // Moving to `to` is sound when no branch of the function lands after its start and up
        // to `to`: such a branch would pass the probe again, in the same call.
        let unlanded = |to: usize| !whole || !landed_in(code, 1..=to as u64);
        let pushes = code.get(next..next + 2).is_some_and(|bytes| is_push_x86_64([bytes[0], bytes[1]]));
        if endbr64 && pushes && unlanded(next) {
            return Placed { skip: next as u64, emulated: true, past: Some(Past::Endbr64) };
        }
        let flags_only = matches!(second.mnemonic(), Mnemonic::Test | Mnemonic::Cmp)
            && (0..second.op_count()).all(|operand| {
                matches!(
                    second.op_kind(operand),
                    OpKind::Register
                        | OpKind::Immediate8
                        | OpKind::Immediate32
                        | OpKind::Immediate8to32
                        | OpKind::Immediate8to64
                        | OpKind::Immediate32to64
                )
            });
        let jump = next + second.len();
        match at(jump) {
            Some(third)
                if past_test && whole && flags_only && third.is_jcc_short_or_near() && unlanded(jump) =>
            {
                Placed { skip: jump as u64, emulated: true, past: Some(Past::Test) }
            }
            _ => start,
        }
    }

    /// Whether a branch of the function (`code`, the whole of it) may land in `range`: a direct
    /// one there, any indirect jump (a jump table's targets are not known here), or code that
    /// does not decode (data, or a misread: nothing is sure then).
    fn landed_in(code: &[u8], range: std::ops::RangeInclusive<u64>) -> bool {
        let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
        let mut instruction = Instruction::default();
        while decoder.can_decode() {
            decoder.decode_out(&mut instruction);
            if instruction.is_invalid() {
                return true;
            }
            // Any near branch (a jump, a conditional one, a call, a loop) there.
            let direct = matches!(
                instruction.op0_kind(),
                OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
            );
            if (direct && range.contains(&instruction.near_branch_target()))
                || instruction.is_jmp_near_indirect()
            {
                return true;
            }
        }
        false
    }
}

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
    fn entry_probes_go_past_an_endbr64_or_a_test_to_what_the_kernel_emulates() {
        let dir = tempfile::tempdir().unwrap();
        let place = |name: &str, code: &[u8], size: Option<u64>| {
            let path = dir.path().join(name);
            std::fs::write(&path, code).unwrap();
            let entry = entry_point(&path, 0, size, true);
            (entry.offset, entry.emulated, entry.past)
        };
        let whole = |name: &str, code: &[u8]| place(name, code, Some(code.len() as u64));
        // test rdi, rdi; je 0xb; lea rax, [rdi + 1]; ret; nop; xor eax, eax; ret
        let test_first: &[u8] =
            &[0x48, 0x85, 0xff, 0x74, 0x06, 0x48, 0x8d, 0x47, 0x01, 0xc3, 0x90, 0x31, 0xc0, 0xc3];
        if cfg!(target_arch = "x86_64") {
            // endbr64; push rbp; mov rbp, rsp; pop rbp; ret
            let cet = [0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3];
            assert_eq!(whole("cet", &cet), (4, Some(true), Some(Past::Endbr64)));
            // Its first bytes suffice.
            assert_eq!(place("cet", &cet, None), (4, Some(true), Some(Past::Endbr64)));
            // endbr64; lea rax, [rdi + 1]; ret: a leaf's work may be a loop's head.
            assert_eq!(
                whole("leaf", &[0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x8d, 0x47, 0x01, 0xc3]),
                (0, Some(false), None)
            );
            // push rbx; ...: emulated where it starts.
            assert_eq!(whole("push", &[0x53, 0x48, 0x8d, 0x47, 0x01, 0x5b, 0xc3]), (0, Some(true), None));
            assert_eq!(whole("test", test_first), (3, Some(true), Some(Past::Test)));
            // Not without the whole function to check.
            assert_eq!(place("test", test_first, None), (0, Some(false), None));
            // The same with a jump back to the je (jmp 3 in place of xor eax, eax; ret).
            let looped = [&test_first[..11], &[0xeb, 0xf6]].concat();
            assert_eq!(whole("looped", &looped), (0, Some(false), None));
            // ... or with an indirect jump (jmp rax), which may land anywhere.
            let indirect = [&test_first[..11], &[0xff, 0xe0]].concat();
            assert_eq!(whole("indirect", &indirect), (0, Some(false), None));
            // endbr64; test rdi, rdi; je 0xa; ret; xor eax, eax; ret (a CET build's free).
            let cet_test = [0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x85, 0xff, 0x74, 0x01, 0xc3, 0x31, 0xc0, 0xc3];
            assert_eq!(whole("cet_test", &cet_test), (7, Some(true), Some(Past::Test)));
            // ... but not when a jump comes back to its test (a tail call made a loop: jmp 4 in
            // place of xor eax, eax; ret), which would pass the probe again.
            let cet_loop = [&cet_test[..10], &[0xeb, 0xf8]].concat();
            assert_eq!(whole("cet_loop", &cet_loop), (0, Some(false), None));
            // Nor the push when the function jumps back to it (jmp 4 after pop rbp).
            let push_loop = [&cet[..9], &[0xeb, 0xf9]].concat();
            assert_eq!(whole("push_loop", &push_loop), (0, Some(false), None));
            // Only the allocators' functions are probed past a test (`entry_point`).
            let path = dir.path().join("test");
            let entry = entry_point(&path, 0, Some(test_first.len() as u64), false);
            assert_eq!((entry.offset, entry.past), (0, None));
        }
        // A function past the file's end: placed where asked, its kind unknown.
        assert_eq!(place("short", &[0x90], None), (0, None, None));
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
