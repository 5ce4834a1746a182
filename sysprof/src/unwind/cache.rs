//! Unwind tables kept on disk by build id, so a library's table is built once per machine, not
//! once per run: `/var/cache/sysprof/unwind` for root, `$XDG_CACHE_HOME/sysprof/unwind` (or
//! `~/.cache/...`) for a user with capabilities. A cached table is used only from a directory
//! and a file that belong to the user sysprof runs as and that no one else can write: a table
//! someone else wrote is never loaded.

use std::{
    fs::{DirBuilder, OpenOptions},
    io::Write as _,
    os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use object::Object as _;
use sysprof_common::unwind::UnwindRow;

use super::tables::Table;
use crate::mapped::{self, FileKey, Need, Stable};

/// The name sysprof gives the kernel's vDSO among the files it builds tables for: the vDSO is
/// the same image in every process, so sysprof reads its own.
pub const VDSO: &str = "[vdso]";

/// Bumped whenever the table format or the rules change: older files are not read.
const MAGIC: &[u8; 16] = b"SYSPROF-UNWIND-3";

/// The bytes of a file to build a table from, and what names it in the cache.
pub struct Source {
    bytes: Bytes,
    /// GNU build id and size: `None` when the file has no build id (then it is not cached).
    key: Option<String>,
}

enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Source {
    /// Maps the file read-only (a 500 MB library costs only the pages its tables live in), or a
    /// copy of its call frame information where others can change it (see `mapped::Stable`);
    /// with `key`, only the file a process mapped (see `mapped::open`).
    pub fn open(path: &Path, key: Option<FileKey>) -> anyhow::Result<Self> {
        let bytes = if path == Path::new(VDSO) {
            Bytes::Owned(own_vdso().context("reading the vDSO")?)
        } else {
            let stable = Stable::of(mapped::open(path, key)?, path, Need::Unwind)?;
            Bytes::Mapped(stable.map().with_context(|| format!("mapping {}", path.display()))?)
        };
        let data: &[u8] = match &bytes {
            Bytes::Mapped(map) => map,
            Bytes::Owned(vec) => vec,
        };
        let key = object::File::parse(data)
            .ok()
            .and_then(|file| file.build_id().ok().flatten().map(hex::encode))
            .map(|id| format!("{id}-{}", data.len()));
        Ok(Source { bytes, key })
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped(map) => map,
            Bytes::Owned(vec) => vec,
        }
    }
}

/// The vDSO this process has, which is every process's on this kernel.
fn own_vdso() -> anyhow::Result<Vec<u8>> {
    let maps = crate::procmaps::ProcessMaps::read(std::process::id())?;
    let mapping = maps
        .mappings()
        .iter()
        .find(|m| m.backing == crate::procmaps::Backing::Vdso)
        .context("no [vdso] in sysprof's own maps")?;
    // SAFETY: the vDSO is mapped readable for the process's life; its bounds come from the
    // process's own maps.
    let bytes = unsafe {
        std::slice::from_raw_parts(mapping.start as *const u8, (mapping.end - mapping.start) as usize)
    };
    Ok(bytes.to_vec())
}

/// The cache directory, checked.
pub struct Cache {
    dir: PathBuf,
    uid: u32,
}

impl Cache {
    /// The cache for the user sysprof runs as, created if missing; `None` when it cannot be
    /// made safe (then tables are built every run).
    pub fn open() -> Option<Self> {
        let uid = nix::unistd::geteuid().as_raw();
        let base = if uid == 0 {
            PathBuf::from("/var/cache")
        } else {
            std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .filter(|path| path.is_absolute())
                .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))?
        };
        // The base must be the user's or root's and writable by no one else, or someone else
        // could swap what sysprof creates under it.
        if !safe_dir(&base, uid, uid == 0) {
            return None;
        }
        let mut dir = base;
        for part in ["sysprof", "unwind"] {
            dir.push(part);
            let _ = DirBuilder::new().mode(0o700).create(&dir);
            if !safe_dir(&dir, uid, false) {
                return None;
            }
        }
        Some(Cache { dir, uid })
    }

    /// The cached table of `source`, if there is one that is safe to read.
    pub fn get(&self, source: &Source) -> Option<Table> {
        let path = self.dir.join(format!("{}.rows", source.key.as_ref()?));
        let file = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&path).ok()?;
        let meta = file.metadata().ok()?;
        if !meta.is_file() || meta.uid() != self.uid || meta.mode() & 0o022 != 0 {
            return None;
        }
        decode(std::io::BufReader::new(file), meta.len())
    }

    /// Keeps `table` for `source`; a failure costs only the next run's build.
    pub fn put(&self, source: &Source, table: &Table) {
        let Some(key) = &source.key else { return };
        let path = self.dir.join(format!("{key}.rows"));
        let temporary = self.dir.join(format!("{key}.{}.partial", std::process::id()));
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temporary)
            .and_then(|mut file| file.write_all(&encode(table)));
        match written {
            Ok(()) => {
                let _ = std::fs::rename(&temporary, &path);
            }
            Err(_) => {
                let _ = std::fs::remove_file(&temporary);
            }
        }
    }
}

/// A directory that is one (not a link), belongs to `uid` (or root, when `root_ok`), and that
/// no one else can write.
fn safe_dir(path: &Path, uid: u32, root_ok: bool) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|meta| {
        meta.is_dir() && (meta.uid() == uid || (root_ok && meta.uid() == 0)) && meta.mode() & 0o022 == 0
    })
}

fn encode(table: &Table) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + table.segments.len() * 16 + table.rows.len() * 12);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(table.segments.len() as u64).to_le_bytes());
    for &(offset, vaddr) in &table.segments {
        for value in [offset, vaddr] {
            out.extend_from_slice(&value.to_le_bytes());
        }
    }
    out.extend_from_slice(&(table.rows.len() as u64).to_le_bytes());
    for row in &table.rows {
        out.extend_from_slice(&row.pc.to_le_bytes());
        out.extend_from_slice(&row.cfa_offset.to_le_bytes());
        out.extend_from_slice(&row.rbp_offset.to_le_bytes());
        out.extend_from_slice(&[row.cfa, row.rbp]);
    }
    out
}

/// Reads a table written by `encode` from `input`, `len` bytes long. The rows are read straight
/// into the table's memory: they are `UnwindRow`'s fields in order, little-endian, which is its
/// layout on the machines sysprof runs on. A compiler's 480,000 rows took 4.2 ms read whole and
/// then converted row by row, and most of that was the conversion and the second copy.
fn decode(mut input: impl std::io::Read, len: u64) -> Option<Table> {
    let mut magic = [0; MAGIC.len()];
    input.read_exact(&mut magic).ok()?;
    if magic != *MAGIC {
        return None;
    }
    let mut u64_of = || {
        let mut bytes = [0; 8];
        input.read_exact(&mut bytes).ok().map(|()| u64::from_le_bytes(bytes))
    };
    let segments = u64_of()? as usize;
    let mut table = Table::default();
    for _ in 0..segments.min(1024) {
        table.segments.push((u64_of()?, u64_of()?));
    }
    let rows = usize::try_from(u64_of()?).ok()?;
    let size = rows.checked_mul(size_of::<UnwindRow>())?;
    // A count the file cannot hold is a damaged file, not a reason to allocate it.
    if size as u64 > len {
        return None;
    }
    table.rows = vec![UnwindRow::default(); rows];
    // SAFETY: `UnwindRow` is `#[repr(C)]`, of integers with no padding (`shared!` pins its 12
    // bytes), so every byte pattern is a valid row; the slice covers the vector's `rows` rows.
    let bytes = unsafe { std::slice::from_raw_parts_mut(table.rows.as_mut_ptr().cast::<u8>(), size) };
    input.read_exact(bytes).ok()?;
    if cfg!(target_endian = "big") {
        for row in &mut table.rows {
            row.pc = u32::from_le(row.pc);
            row.cfa_offset = i32::from_le(row.cfa_offset);
            row.rbp_offset = i16::from_le(row.rbp_offset);
        }
    }
    Some(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_reads_back_as_written() {
        let table = Table {
            rows: vec![
                UnwindRow { pc: 0x1000, cfa_offset: 8, rbp_offset: 0, cfa: 1, rbp: 0 },
                UnwindRow { pc: 0x1004, cfa_offset: -16, rbp_offset: -16, cfa: 2, rbp: 1 },
            ],
            segments: vec![(0, 0), (0x2000, 0x3000)],
        };
        let bytes = encode(&table);
        assert_eq!(decode(&bytes[..], bytes.len() as u64), Some(table));
        assert_eq!(decode(&b"SYSPROF-UNWIND-0"[..], 16), None, "another format is not read");
        // A row count the file cannot hold, or rows cut short, read as no table.
        let mut huge = bytes.clone();
        let count = huge.len() - 2 * 12 - 8;
        huge[count..count + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(decode(&huge[..], huge.len() as u64), None);
        assert_eq!(decode(&bytes[..bytes.len() - 1], bytes.len() as u64 - 1), None);
    }

    #[test]
    fn the_vdso_has_a_table() {
        let source = Source::open(Path::new(VDSO), None).unwrap();
        let table = super::super::tables::build(source.bytes()).unwrap();
        assert!(!table.rows.is_empty());
    }
}
