//! Which CPython a file is, and the layout of the structs the BPF walker and the code reader
//! need: from `_Py_DebugOffsets` at the start of `_PyRuntime` on 3.13+ (CPython publishes it
//! for out-of-process tools), from per-version tables on 3.10-3.12 (read from the DWARF of
//! pyenv's 3.10.13, 3.11.7 and 3.12.1 builds with gdb's `ptype /o`, and checked against those
//! and Debian's 3.11 by the tests in `tests/python.rs`).

use std::path::Path;

use anyhow::{Context as _, bail};
use object::{Object as _, ObjectSection as _, ObjectSegment as _, ObjectSymbol as _};
use sysprof_common::python::{PythonProcess, entry, thread_match};

use crate::mapped::{self, Bounded, FileKey, MappedError};

/// Offsets in `PyCodeObject` and the string objects it points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CodeLayout {
    pub name: u64,
    /// `co_qualname` (3.11+).
    pub qualname: Option<u64>,
    pub filename: u64,
    pub first_line: u64,
    pub line_table: u64,
    /// Size of `PyASCIIObject` and `PyCompactUnicodeObject`: where a compact string's
    /// characters start.
    pub ascii_header: u64,
    pub compact_header: u64,
}

/// A CPython interpreter found in a file: its version and where its runtime state is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interpreter {
    pub version: (u8, u8),
    /// File address of `_PyRuntime`, and of `PyCode_Type` (which tells a code object).
    pub runtime: u64,
    pub code_type: u64,
    /// The walker's layout, with `interpreters_head` as an offset in `_PyRuntime`.
    pub walker: PythonProcess,
    pub code: CodeLayout,
    /// The file's loadable segments: (file offset, address).
    segments: Vec<(u64, u64)>,
}

impl Interpreter {
    /// The CPython in the ELF file at `path` (with `key`, only the file a process mapped: see
    /// `mapped::open`): `Ok(None)` when the file holds none, an error when it holds one sysprof
    /// cannot read.
    pub fn find(path: &Path, key: Option<FileKey>) -> anyhow::Result<Option<Interpreter>> {
        let opened = mapped::open(path, key).map_err(|error| match error {
            MappedError::Changed { .. } => anyhow::anyhow!("it is not the file the process mapped any more"),
            error => error.into(),
        })?;
        // Mapped where only root can change the file (0.2 ms for libpython3.12, whose debug info
        // makes it 30 MB, and this runs in the collect loop); read within a bound where anyone
        // else can (2 ms: `object` reads its symbol table whole), who could cut it short under
        // a mapping (SIGBUS).
        match mapped::map_if_only_root_writes(&opened)
            .with_context(|| format!("mapping {}", path.display()))?
        {
            Some(map) => Self::find_in(path, &object::File::parse(&*map).context("not an ELF file")?),
            None => {
                let data = Bounded::new(&opened, mapped::READ_LIMIT);
                Self::find_in(path, &object::File::parse(&data).context("not an ELF file")?)
            }
        }
    }

    /// [`Interpreter::find`] on a file's bytes (the fuzz target's door, `fuzzing::python_layout`).
    pub fn parse(data: &[u8], path: &Path) -> anyhow::Result<Option<Interpreter>> {
        Self::find_in(path, &object::File::parse(data).context("not an ELF file")?)
    }

    /// The CPython in `file`, read from `path`.
    fn find_in<'a, R: object::ReadRef<'a>>(
        path: &Path,
        file: &object::File<'a, R>,
    ) -> anyhow::Result<Option<Interpreter>> {
        // The symbols needed are exported (extension modules link against them), so the dynamic
        // table, which is small, has them: the full one (libtorch_python's is huge) is not read.
        let defined = |name: &str| {
            file.dynamic_symbols()
                .find(|symbol| symbol.name() == Ok(name) && !symbol.is_undefined())
                .map(|symbol| symbol.address())
        };
        let Some(runtime) = defined("_PyRuntime") else { return Ok(None) };
        let code_type = defined("PyCode_Type").context("no PyCode_Type")?;
        let version = match defined("Py_Version") {
            Some(address) => {
                let bytes = bytes_at(file, address, 4).context("reading Py_Version")?;
                let hex = u32::from_le_bytes(bytes.try_into().unwrap_or_default());
                ((hex >> 24) as u8, (hex >> 16) as u8)
            }
            // 3.10 has no Py_Version; its file names carry the version.
            None => version_in_name(path).context("no Py_Version, and no version in the file name")?,
        };
        let (walker, code) = match version {
            (3, 10) => (v3_10(), code_3_10()),
            (3, 11) => (v3_11(), code_3_11()),
            (3, 12) => (v3_12(), code_3_12()),
            (3, 13) => {
                let offsets = bytes_at(file, runtime, DEBUG_OFFSETS_SIZE)
                    .context("reading _Py_DebugOffsets at the start of _PyRuntime")?;
                debug_offsets(offsets)?
            }
            (major, minor) => bail!("CPython {major}.{minor} is not supported (3.10 to 3.13 are)"),
        };
        let segments = file.segments().map(|segment| (segment.file_range().0, segment.address())).collect();
        Ok(Some(Interpreter { version, runtime, code_type, walker, code, segments }))
    }

    /// The walker's entry for a process that maps this file at `start` from `file_offset`, and
    /// where `PyCode_Type` is in it; `None` when no segment of the file is mapped there.
    pub fn process_entry(&self, start: u64, file_offset: u64) -> Option<(PythonProcess, u64)> {
        let runtime = self.relocate(self.runtime, start, file_offset)?;
        let code_type = self.relocate(self.code_type, start, file_offset)?;
        let mut entry = self.walker;
        // Checked: the file says where `_PyRuntime` is, and the process where the file is.
        entry.interpreters_head = entry.interpreters_head.checked_add(runtime)?;
        Some((entry, code_type))
    }

    /// The process's address for this file's address `address`, given one of its mappings
    /// (start, file offset); `None` when no segment of the file is mapped there.
    pub fn relocate(&self, address: u64, start: u64, file_offset: u64) -> Option<u64> {
        const PAGE: u64 = 4096;
        let &(_, vaddr) = self.segments.iter().find(|(offset, _)| offset & !(PAGE - 1) == file_offset)?;
        Some(address.wrapping_add(start.wrapping_sub(vaddr & !(PAGE - 1))))
    }
}

/// Whether a file is a CPython interpreter by its name (`python3.12`, `libpython3.12.so.1.0`).
pub fn is_interpreter_file(path: &Path) -> bool {
    version_in_name(path).is_some()
}

/// "3.12" out of `python3.12`, `libpython3.12.so.1.0`, `libpython3.12d.so`.
fn version_in_name(path: &Path) -> Option<(u8, u8)> {
    let name = path.file_name()?.to_str()?;
    let rest = &name[name.find("python")? + "python".len()..];
    let (major, rest) = rest.split_once('.')?;
    let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// `len` bytes of initialized data at file address `address`.
fn bytes_at<'a, R: object::ReadRef<'a>>(
    file: &object::File<'a, R>,
    address: u64,
    len: u64,
) -> Option<&'a [u8]> {
    // Checked: the addresses are the file's word.
    let end = address.checked_add(len)?;
    file.sections()
        .find(|section| {
            section.address() <= address
                && section.address().checked_add(section.size()).is_some_and(|section_end| end <= section_end)
        })
        .and_then(|section| section.data_range(address, len).ok().flatten())
}

fn v3_10() -> PythonProcess {
    PythonProcess {
        version: 0x030a,
        interpreters_head: 32,
        // `tstate_head`
        interp_threads: 8,
        thread_next: 8,
        thread_id: 176,
        thread_match: thread_match::PTHREAD_SELF,
        thread_frame: 24,
        cframe_frame: u32::MAX,
        frame_previous: 24,
        frame_code: 32,
        frame_instruction: 96,
        frame_entry: 0,
        entry: entry::EVERY_FRAME,
        code_instructions: 0,
        _pad: 0,
    }
}

fn v3_11() -> PythonProcess {
    PythonProcess {
        version: 0x030b,
        interpreters_head: 40,
        interp_threads: 16,
        thread_next: 8,
        thread_id: 160,
        thread_match: thread_match::NATIVE_ID,
        thread_frame: 56,
        cframe_frame: 8,
        frame_previous: 48,
        frame_code: 32,
        frame_instruction: 56,
        frame_entry: 68,
        entry: entry::FLAG,
        code_instructions: 184,
        _pad: 0,
    }
}

fn v3_12() -> PythonProcess {
    PythonProcess {
        version: 0x030c,
        interpreters_head: 40,
        interp_threads: 72,
        thread_next: 8,
        thread_id: 144,
        thread_match: thread_match::NATIVE_ID,
        thread_frame: 56,
        cframe_frame: 0,
        frame_previous: 8,
        frame_code: 0,
        frame_instruction: 56,
        frame_entry: 70,
        entry: entry::SHIM,
        code_instructions: 192,
        _pad: 0,
    }
}

pub(crate) fn code_3_10() -> CodeLayout {
    CodeLayout {
        name: 112,
        qualname: None,
        filename: 104,
        first_line: 40,
        line_table: 120,
        ascii_header: 48,
        compact_header: 72,
    }
}

pub(crate) fn code_3_11() -> CodeLayout {
    CodeLayout {
        name: 120,
        qualname: Some(128),
        filename: 112,
        first_line: 72,
        line_table: 136,
        ascii_header: 48,
        compact_header: 72,
    }
}

pub(crate) fn code_3_12() -> CodeLayout {
    CodeLayout { first_line: 68, ascii_header: 40, compact_header: 56, ..code_3_11() }
}

/// `_Py_DebugOffsets` of 3.13 (Include/internal/pycore_runtime.h): the fields read here, at
/// their byte offsets in the struct.
pub(crate) const DEBUG_OFFSETS_SIZE: u64 = 568;
pub(crate) const COOKIE: &[u8; 8] = b"xdebugpy";

pub(crate) fn debug_offsets(bytes: &[u8]) -> anyhow::Result<(PythonProcess, CodeLayout)> {
    if bytes.get(..8) != Some(COOKIE) {
        bail!("_PyRuntime does not start with _Py_DebugOffsets");
    }
    let field = |at: usize| -> anyhow::Result<u32> {
        let value = u64::from_le_bytes(bytes[at..at + 8].try_into()?);
        u32::try_from(value).context("an offset beyond 4 GiB")
    };
    let version = u64::from_le_bytes(bytes[8..16].try_into()?);
    if (version >> 24, (version >> 16) & 0xff) != (3, 13) {
        bail!("_Py_DebugOffsets of version {version:#x}, read with 3.13's layout");
    }
    if field(16)? != 0 {
        bail!("a free-threaded build (3.13t), whose frames sysprof does not read yet");
    }
    let walker = PythonProcess {
        version: 0x030d,
        interpreters_head: u64::from(field(40)?),
        interp_threads: field(72)?,
        thread_next: field(168)?,
        thread_id: field(200)?,
        thread_match: thread_match::NATIVE_ID,
        thread_frame: field(184)?,
        cframe_frame: u32::MAX,
        frame_previous: field(232)?,
        frame_code: field(240)?,
        frame_instruction: field(248)?,
        frame_entry: field(264)?,
        entry: entry::SHIM,
        code_instructions: field(344)?,
        _pad: 0,
    };
    // A code object's fields and a string's header: past the object's header (its reference
    // count and type), and within a page, as in every CPython. Each is read from every code
    // object of every stack: the file must not choose how much is read.
    let small = |at: usize| -> anyhow::Result<u64> {
        let value = field(at)?;
        if !(16..4096).contains(&value) {
            bail!("_Py_DebugOffsets puts a code object's or string's field at byte {value}, where none is");
        }
        Ok(u64::from(value))
    };
    let code = CodeLayout {
        filename: small(280)?,
        name: small(288)?,
        qualname: Some(small(296)?),
        line_table: small(304)?,
        first_line: small(312)?,
        ascii_header: small(560)?,
        compact_header: small(560)? + 16,
    };
    Ok((walker, code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_file_names() {
        assert_eq!(version_in_name(Path::new("/usr/lib/libpython3.10.so.1.0")), Some((3, 10)));
        assert_eq!(version_in_name(Path::new("/usr/bin/python3.12")), Some((3, 12)));
        assert_eq!(version_in_name(Path::new("/x/libpython3.13d.so")), Some((3, 13)));
        assert_eq!(version_in_name(Path::new("/usr/bin/python3")), None);
    }
}
