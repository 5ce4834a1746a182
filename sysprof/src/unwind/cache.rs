//! Unwind tables kept on disk, so a library's table is built once per machine, not once per
//! run: `/var/cache/sysprof/unwind` for root, `$XDG_CACHE_HOME/sysprof/unwind` (or
//! `~/.cache/...`) for a user with capabilities. A cached table is used only from a directory
//! and a file that belong to the user sysprof runs as and that no one else can write: a table
//! someone else wrote is never loaded.
//!
//! A table is named by its content: the SHA-256 of everything the builder reads of the file
//! (`tables::Inputs`, copied out of the file before they are hashed and built from), never by
//! what the file says of itself (a build id and a size are a user's to copy onto any file). A
//! table is then a function of the bytes its name is the hash of, so one built from a file a
//! user owns (`sudo sysprof tables ~/lib.so`, or their program under `--all`) serves exactly
//! the files with the same bytes, whoever owns those: no rule about owners is needed. Each
//! entry also carries its name and a CRC-32 of itself, checked on every read (a damaged entry
//! is a miss, rebuilt); `sysprof tables --verify` rebuilds and compares.

use std::{
    fs::{DirBuilder, File, OpenOptions},
    io::Write as _,
    os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use sysprof_common::unwind::{UnwindRow, cfa, rbp};

use super::tables::Table;
use crate::mapped::{self, FileKey, Need, Stable};

/// The name sysprof gives the kernel's vDSO among the files it builds tables for: the vDSO is
/// the same image in every process, so sysprof reads its own.
pub const VDSO: &str = "[vdso]";

/// Bumped whenever the table format or the rules change: older files are not read.
const MAGIC: &[u8; 16] = b"SYSPROF-UNWIND-4";

/// What names a table in the cache: the SHA-256 of its `tables::Inputs`.
pub type Key = [u8; 32];

/// The bytes of a file to build a table from.
pub struct Source {
    bytes: Bytes,
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
        Ok(Source { bytes })
    }

    /// The bytes of `file`, opened from `path` by the caller (see `describe_tables`), read as
    /// `open` reads a mapped file: through a sealed copy where anyone but root can write it.
    pub fn stable(file: File, path: &Path) -> anyhow::Result<Self> {
        let stable = Stable::of(file, path, Need::Unwind)?;
        Ok(Source {
            bytes: Bytes::Mapped(stable.map().with_context(|| format!("mapping {}", path.display()))?),
        })
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

    /// Where the table named `key` is kept.
    pub fn path(&self, key: &Key) -> PathBuf {
        self.dir.join(format!("{}.rows", hex::encode(key)))
    }

    /// The cached table named `key`, if there is one that is safe to read and whole.
    pub fn get(&self, key: &Key) -> Option<Table> {
        match self.lookup(key) {
            Lookup::Found(table) => Some(table),
            Lookup::Missing | Lookup::Unusable(_) => None,
        }
    }

    /// The cached table named `key`, or why there is none to use.
    pub fn lookup(&self, key: &Key) -> Lookup {
        let path = self.path(key);
        let file =
            match OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(&path)
            {
                Ok(file) => file,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Lookup::Missing,
                Err(error) => return Lookup::Unusable(error.to_string()),
            };
        let Ok(meta) = file.metadata() else { return Lookup::Unusable("unreadable".into()) };
        if !meta.is_file() {
            return Lookup::Unusable("not a regular file".into());
        }
        if meta.uid() != self.uid || meta.mode() & 0o022 != 0 {
            return Lookup::Unusable(format!(
                "owned by uid {} with mode {:o}, not written by sysprof",
                meta.uid(),
                meta.mode() & 0o7777
            ));
        }
        match decode(std::io::BufReader::new(file), meta.len(), key) {
            Some(table) => Lookup::Found(table),
            None => Lookup::Unusable("damaged (its format, name, size or checksum is wrong)".into()),
        }
    }

    /// Keeps `table` as the table named `key`; a failure costs only the next run's build.
    pub fn put(&self, key: &Key, table: &Table) {
        let path = self.path(key);
        let temporary = self.dir.join(format!("{}.{}.partial", hex::encode(key), std::process::id()));
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temporary)
            .and_then(|mut file| file.write_all(&encode(key, table)));
        match written {
            Ok(()) => {
                let _ = std::fs::rename(&temporary, &path);
            }
            Err(_) => {
                let _ = std::fs::remove_file(&temporary);
            }
        }
    }

    /// Removes the table named `key`.
    pub fn remove(&self, key: &Key) -> std::io::Result<()> {
        std::fs::remove_file(self.path(key))
    }
}

/// What the cache holds under a name.
pub enum Lookup {
    Missing,
    Found(Table),
    /// An entry that is not read: why.
    Unusable(String),
}

/// A directory that is one (not a link), belongs to `uid` (or root, when `root_ok`), and that
/// no one else can write.
fn safe_dir(path: &Path, uid: u32, root_ok: bool) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|meta| {
        meta.is_dir() && (meta.uid() == uid || (root_ok && meta.uid() == 0)) && meta.mode() & 0o022 == 0
    })
}

/// An entry: the magic, the table's name, its segments and rows (counts first), and a CRC-32
/// of all that.
pub(crate) fn encode(key: &Key, table: &Table) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + table.segments.len() * 16 + table.rows.len() * 12);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(key);
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
    let checksum = crc32fast::hash(&out);
    out.extend_from_slice(&checksum.to_le_bytes());
    out
}

/// The most segments an entry may list: an ELF file has a handful of executable ones.
const MAX_SEGMENTS: u64 = 1024;

/// Reads the table named `key` from an entry `encode` wrote, `len` bytes long; `None` for
/// another format, another name, a size or checksum that is wrong, or rows no build makes
/// (unsorted, of unknown kinds). The rows are read straight into the table's memory: they are
/// `UnwindRow`'s fields in order, little-endian, which is its layout on the machines sysprof
/// runs on. A compiler's 480,000 rows took 4.2 ms read whole and then converted row by row,
/// and most of that was the conversion and the second copy.
pub(crate) fn decode(input: impl std::io::Read, len: u64, key: &Key) -> Option<Table> {
    let mut input = Checked { input, crc: crc32fast::Hasher::new() };
    let mut magic = [0; MAGIC.len()];
    input.read_exact(&mut magic).ok()?;
    let mut name = [0; 32];
    input.read_exact(&mut name).ok()?;
    if magic != *MAGIC || name != *key {
        return None;
    }
    let segments = input.u64()?;
    if segments > MAX_SEGMENTS {
        return None;
    }
    let mut table = Table::default();
    for _ in 0..segments {
        table.segments.push((input.u64()?, input.u64()?));
    }
    let rows = usize::try_from(input.u64()?).ok()?;
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
    let computed = input.crc.clone().finalize();
    let mut stored = [0; 4];
    input.input.read_exact(&mut stored).ok()?;
    // Nothing may follow the checksum.
    if u32::from_le_bytes(stored) != computed || input.input.read(&mut [0]).ok()? != 0 {
        return None;
    }
    if cfg!(target_endian = "big") {
        for row in &mut table.rows {
            row.pc = u32::from_le(row.pc);
            row.cfa_offset = i32::from_le(row.cfa_offset);
            row.rbp_offset = i16::from_le(row.rbp_offset);
        }
    }
    let known = |row: &UnwindRow| row.cfa <= cfa::FRAME_POINTER && row.rbp <= rbp::SAVED;
    if !table.rows.iter().all(known) || !table.rows.windows(2).all(|pair| pair[0].pc < pair[1].pc) {
        return None;
    }
    Some(table)
}

/// A reader that keeps the CRC-32 of what was read through it.
struct Checked<R> {
    input: R,
    crc: crc32fast::Hasher,
}

impl<R: std::io::Read> Checked<R> {
    fn read_exact(&mut self, bytes: &mut [u8]) -> std::io::Result<()> {
        self.input.read_exact(bytes)?;
        self.crc.update(bytes);
        Ok(())
    }

    fn u64(&mut self) -> Option<u64> {
        let mut bytes = [0; 8];
        self.read_exact(&mut bytes).ok().map(|()| u64::from_le_bytes(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Table {
        Table {
            rows: vec![
                UnwindRow { pc: 0x1000, cfa_offset: 8, rbp_offset: 0, cfa: 1, rbp: 0 },
                UnwindRow { pc: 0x1004, cfa_offset: -16, rbp_offset: -16, cfa: 2, rbp: 1 },
            ],
            segments: vec![(0, 0), (0x2000, 0x3000)],
        }
    }

    #[test]
    fn a_table_reads_back_as_written_under_its_own_name_only() {
        let key = [7; 32];
        let bytes = encode(&key, &table());
        assert_eq!(decode(&bytes[..], bytes.len() as u64, &key), Some(table()));
        assert_eq!(decode(&bytes[..], bytes.len() as u64, &[8; 32]), None, "an entry renamed is not read");
        let mut old = bytes.clone();
        old[..16].copy_from_slice(b"SYSPROF-UNWIND-3");
        assert_eq!(decode(&old[..], old.len() as u64, &key), None, "another format is not read");
    }

    #[test]
    fn a_damaged_entry_reads_as_none() {
        let key = [7; 32];
        let bytes = encode(&key, &table());
        let rows_at = 16 + 32 + 8 + 2 * 16 + 8;
        // A row count the file cannot hold, rows cut short, a byte more, a byte changed.
        let mut huge = bytes.clone();
        huge[rows_at - 8..rows_at].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(decode(&huge[..], huge.len() as u64, &key), None);
        assert_eq!(decode(&bytes[..bytes.len() - 1], bytes.len() as u64 - 1, &key), None);
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(decode(&longer[..], longer.len() as u64, &key), None);
        let mut changed = bytes.clone();
        changed[rows_at + 4] ^= 1;
        assert_eq!(decode(&changed[..], changed.len() as u64, &key), None, "the checksum is checked");
    }

    #[test]
    fn rows_no_build_makes_are_refused_even_with_a_right_checksum() {
        let key = [7; 32];
        let mut unsorted = table();
        unsorted.rows.swap(0, 1);
        let bytes = encode(&key, &unsorted);
        assert_eq!(decode(&bytes[..], bytes.len() as u64, &key), None);
        let mut unknown = table();
        unknown.rows[1].cfa = 99;
        let bytes = encode(&key, &unknown);
        assert_eq!(decode(&bytes[..], bytes.len() as u64, &key), None);
    }

    #[test]
    fn the_vdso_has_a_table() {
        let source = Source::open(Path::new(VDSO), None).unwrap();
        let table = super::super::tables::build(source.bytes()).unwrap();
        assert!(!table.rows.is_empty());
    }
}
