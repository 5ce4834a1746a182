//! Reading the files the traced processes map: programs and libraries that any user may own,
//! read by root after the fact (the symbolizer at the end of the trace; the unwinder and the
//! Python reader during it). Every such read holds three ways:
//!
//! - **The file the process mapped, and no other.** A path names whatever is there when it is
//!   opened: a user who swaps their library for a link to a file only root can read would have
//!   that file's names in their flamegraph. A mapping's device and inode are recorded when its
//!   process's maps are read (`procmaps`), and [`open`] checks them on the descriptor it opened;
//!   another file is not read ([`MappedError::Changed`]).
//! - **Bytes that cannot change while they are read.** A reader of a mapped file (blazesym maps
//!   the files it reads) gets SIGBUS, which ends sysprof, where the file was cut short since it
//!   was mapped, and a user can truncate what they own whenever they like. A file that anyone
//!   but root can write is read through a sealed copy of the parts the reader needs
//!   ([`Stable`]); a file only root can change is read as it is.
//! - **Bounds.** Headers claim sizes the file need not hold: a sparse file claims gigabytes it
//!   never wrote, a compressed section claims whatever size it likes and `object::ReadCache`
//!   and blazesym allocate what is claimed before they read. [`Bounded`] caps what one parse
//!   reads, [`Stable`] what one copy holds, and [`debug_info`] what decompressing a file's
//!   DWARF may produce.

use std::{
    cell::{Cell, RefCell},
    collections::HashSet,
    fs::File,
    io,
    ops::Range,
    os::{
        fd::{AsRawFd as _, FromRawFd as _},
        unix::fs::{FileExt as _, MetadataExt as _},
    },
    path::{Path, PathBuf},
};

use object::{
    Endian as _, Endianness, FileKind, ReadCache, ReadCacheOps, ReadRef,
    elf::{self, FileHeader32, FileHeader64},
    read::elf::{FileHeader, SectionHeader as _},
};
use serde::{Deserialize, Serialize};

use crate::{
    input::{InputError, Links},
    report::format::bytes,
};

/// What one parse of a file's headers and tables may read (see [`Bounded`]): ten times the
/// symbol tables of a large library (librustc_driver's 150 MB file has 23 MB of them).
pub const READ_LIMIT: u64 = 256 << 20;
/// What one copy of a file that others can write may hold (see [`Stable`]).
pub const COPY_LIMIT: u64 = 512 << 20;
/// What decompressing one file's DWARF may produce in all (see [`debug_info`]).
pub const DEBUG_LIMIT: u64 = 512 << 20;
/// The most deflate expands: every 258-byte match costs at least 2 bits, so 1032 to 1 (zlib's
/// own figure). A compressed section that claims more than this is lying.
const DEFLATE_RATIO: u64 = 1032;

/// A mapped file's identity: its device and inode as the kernel listed the mapping. Zero in a
/// read-out saved before it was recorded, which no file matches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FileKey {
    pub device: u64,
    pub inode: u64,
}

impl FileKey {
    pub fn of(meta: &std::fs::Metadata) -> Self {
        FileKey { device: meta.dev(), inode: meta.ino() }
    }
}

impl std::fmt::Display for FileKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "device {}:{} inode {}", libc::major(self.device), libc::minor(self.device), self.inode)
    }
}

/// Why a mapped file was not read.
#[derive(Debug, thiserror::Error)]
pub enum MappedError {
    /// Another file is at the path the process mapped its file from.
    #[error("{}: another file is there now than the one the process mapped ({then} then, {now} now)", path.display())]
    Changed { path: PathBuf, then: FileKey, now: FileKey },
    /// The file got shorter while sysprof copied it.
    #[error("{}: cut short while sysprof read it", path.display())]
    CutShort { path: PathBuf },
    /// What a copy would hold is more than the bound.
    #[error("{}: {what} is over the {} sysprof copies from a file another user can change", path.display(), bytes(*limit))]
    TooLarge { path: PathBuf, what: String, limit: u64 },
    /// Not an ELF file whose headers `object` can read.
    #[error("{}: not an ELF file sysprof can read", path.display())]
    NotElf { path: PathBuf },
    /// Opening or reading failed, or it is not a regular file.
    #[error(transparent)]
    Input(#[from] InputError),
}

impl MappedError {
    fn io(path: &Path, source: io::Error) -> Self {
        MappedError::Input(InputError::Io { path: path.to_path_buf(), source })
    }
}

/// Opens the file a process mapped from `path`, without blocking (a FIFO put there since) and
/// only a regular file; with `key`, only the very file the process mapped (checked before the
/// open, which has effects of its own on a device, and on the descriptor after it).
pub fn open(path: &Path, key: Option<FileKey>) -> Result<File, MappedError> {
    let changed = |now| MappedError::Changed { path: path.to_path_buf(), then: key.unwrap_or_default(), now };
    if let Some(key) = key
        && let Ok(meta) = std::fs::metadata(path)
        && FileKey::of(&meta) != key
    {
        return Err(changed(FileKey::of(&meta)));
    }
    let file = crate::input::open_regular(path, Links::Follow)?;
    if let Some(key) = key {
        let now = FileKey::of(&file.metadata().map_err(|source| MappedError::io(path, source))?);
        if now != key {
            return Err(changed(now));
        }
    }
    Ok(file)
}

/// Raises the soft limit on open files to the hard one, once: the symbolizer holds every file
/// it reads open while it lives, and blazesym another descriptor of each, and a busy host's
/// `--all` maps hundreds of files against a soft limit of 1,024.
pub fn allow_open_files() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    static RAISED: std::sync::Once = std::sync::Once::new();
    RAISED.call_once(|| {
        if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
            && soft < hard
        {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    });
}

/// An `object` reader over a file that reads `limit` bytes at most, whatever its headers claim:
/// `object::ReadCache` allocates what each read asks for before it reads, so a section header
/// that claims 60 GB of a sparse file is 60 GB of sysprof's memory. A read asked again is
/// counted once (the cache keeps it).
pub struct Bounded<R: ReadCacheOps> {
    cache: ReadCache<R>,
    left: Cell<u64>,
    asked: RefCell<HashSet<(u64, u64)>>,
}

impl<R: ReadCacheOps> Bounded<R> {
    pub fn new(read: R, limit: u64) -> Self {
        Bounded { cache: ReadCache::new(read), left: Cell::new(limit), asked: RefCell::default() }
    }

    /// Counts a read of `size` bytes at `offset` against the bound; whether it is within it.
    fn charge(&self, offset: u64, size: u64) -> bool {
        let mut asked = self.asked.borrow_mut();
        if size == 0 || asked.contains(&(offset, size)) {
            return true;
        }
        let Some(left) = self.left.get().checked_sub(size) else { return false };
        self.left.set(left);
        asked.insert((offset, size));
        true
    }
}

impl<'a, R: ReadCacheOps> ReadRef<'a> for &'a Bounded<R> {
    fn len(self) -> Result<u64, ()> {
        (&self.cache).len()
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        if !self.charge(offset, size) {
            return Err(());
        }
        (&self.cache).read_bytes_at(offset, size)
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        // The cache reads a string 4 KiB at most; counted as such, before it is read.
        let most = (range.end.saturating_sub(range.start)).min(4096);
        if !self.charge(range.start, most) {
            return Err(());
        }
        (&self.cache).read_bytes_at_until(range, delimiter)
    }
}

/// The parts of a file a reader needs, when it reads a copy (see [`Stable`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Its symbol tables: blazesym naming functions from them.
    Symbols,
    /// Those and every section the loader does not load (DWARF): blazesym reading its DWARF.
    Dwarf,
    /// Its call frame information and notes (the build id): the unwinder's table.
    Unwind,
}

impl Need {
    /// Whether a reader with this need reads section `name` of type `kind` and flags `flags`.
    fn wants(self, name: &[u8], kind: u32, flags: u64) -> bool {
        let table = matches!(kind, elf::SHT_SYMTAB | elf::SHT_DYNSYM | elf::SHT_STRTAB | elf::SHT_NOTE);
        match self {
            Need::Symbols => table,
            Need::Dwarf => table || flags & u64::from(elf::SHF_ALLOC) == 0,
            Need::Unwind => {
                kind == elf::SHT_NOTE
                    || kind == elf::SHT_X86_64_UNWIND
                    || matches!(name, b".eh_frame" | b".eh_frame_hdr" | b".debug_frame")
            }
        }
    }
}

/// A mapped file's bytes as they will stay while sysprof reads them: the file itself where only
/// root can change it, else a sealed copy (a memfd that can neither shrink nor be written) of
/// the parts a reader needs, at the file's offsets, the rest left as holes that cost nothing.
/// Kept open while it is read: blazesym opens it by [`Stable::fd_path`].
pub struct Stable {
    file: File,
}

impl Stable {
    /// `file` (opened from `path`) as it will stay, for a reader that needs `need` of it.
    pub fn of(file: File, path: &Path, need: Need) -> Result<Stable, MappedError> {
        let meta = file.metadata().map_err(|source| MappedError::io(path, source))?;
        if !others_can_write(&meta) {
            return Ok(Stable { file });
        }
        let ranges = needed_ranges(&file, path, need, meta.len())?;
        let total: u64 = ranges.iter().map(|range| range.end - range.start).sum();
        if total > COPY_LIMIT {
            let what = format!("the {} of it that sysprof needs", bytes(total));
            return Err(MappedError::TooLarge { path: path.to_path_buf(), what, limit: COPY_LIMIT });
        }
        let copy = sealed_copy(&file, path, meta.len(), &ranges)?;
        Ok(Stable { file: copy })
    }

    /// A path that opens this very file (what blazesym takes): valid while `self` lives.
    pub fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }

    /// Its bytes, mapped.
    pub fn map(&self) -> io::Result<memmap2::Mmap> {
        // SAFETY: read-only and private, of a file that cannot get shorter while mapped: one
        // only root can write (and a root that truncates a library under a running program
        // breaks the program too), or a memfd sealed against shrinking and writing.
        unsafe { memmap2::Mmap::map(&self.file) }
    }
}

/// `file` mapped, where only root can change it (see [`Stable::map`]); `None` where anyone else
/// can, and it is to be read instead.
pub fn map_if_only_root_writes(file: &File) -> io::Result<Option<memmap2::Mmap>> {
    if others_can_write(&file.metadata()?) {
        return Ok(None);
    }
    // SAFETY: read-only and private, of a file only root can write (see `Stable::map`).
    unsafe { memmap2::Mmap::map(file) }.map(Some)
}

/// Whether anyone but root can change the file: its owner is not root, or its group or everyone
/// may write it (an ACL that lets a user write shows in the group bits).
fn others_can_write(meta: &std::fs::Metadata) -> bool {
    meta.uid() != 0 || meta.mode() & 0o022 != 0
}

/// The byte ranges of a file of `len` bytes that a reader with `need` reads: the ELF header,
/// the program and section headers, the section names, and the sections it wants; sorted,
/// merged, and within the file.
fn needed_ranges(file: &File, path: &Path, need: Need, len: u64) -> Result<Vec<Range<u64>>, MappedError> {
    let data = Bounded::new(file, READ_LIMIT);
    let ranges = match FileKind::parse(&data) {
        Ok(FileKind::Elf32) => elf_ranges::<FileHeader32<Endianness>, _>(&data, need),
        Ok(FileKind::Elf64) => elf_ranges::<FileHeader64<Endianness>, _>(&data, need),
        _ => Err(()),
    };
    let mut ranges = ranges.map_err(|()| MappedError::NotElf { path: path.to_path_buf() })?;
    for range in &mut ranges {
        *range = range.start.min(len)..range.end.min(len);
    }
    ranges.retain(|range| range.start < range.end);
    ranges.sort_by_key(|range| range.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match merged.last_mut() {
            Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
            _ => merged.push(range),
        }
    }
    Ok(merged)
}

fn elf_ranges<'a, Elf: FileHeader<Endian = Endianness>, R: ReadRef<'a>>(
    data: R,
    need: Need,
) -> Result<Vec<Range<u64>>, ()> {
    let header = Elf::parse(data).map_err(drop)?;
    let endian = header.endian().map_err(drop)?;
    let span = |offset: u64, size: u64| offset..offset.saturating_add(size);
    let program_headers: u64 = header.e_phoff(endian).into();
    let section_headers: u64 = header.e_shoff(endian).into();
    let mut ranges = vec![
        0..size_of::<Elf>() as u64,
        span(program_headers, u64::from(header.e_phnum(endian)) * u64::from(header.e_phentsize(endian))),
        span(
            section_headers,
            header.shnum(endian, data).map_err(drop)? as u64 * u64::from(header.e_shentsize(endian)),
        ),
    ];
    let sections = header.sections(endian, data).map_err(drop)?;
    let names = header.shstrndx(endian, data).map_err(drop)?;
    for (index, section) in sections.iter().enumerate() {
        let name = sections.section_name(endian, section).unwrap_or_default();
        let (kind, flags) = (section.sh_type(endian), section.sh_flags(endian).into());
        if index == names as usize || need.wants(name, kind, flags) {
            ranges.extend(section.file_range(endian).map(|(offset, size)| span(offset, size)));
        }
    }
    Ok(ranges)
}

/// A memfd the size of `file` (`len` bytes) holding its `ranges`, sealed.
fn sealed_copy(file: &File, path: &Path, len: u64, ranges: &[Range<u64>]) -> Result<File, MappedError> {
    let io = |source| MappedError::io(path, source);
    // SAFETY: memfd_create with a NUL-terminated name; the descriptor it returns is owned here.
    let copy = unsafe {
        let fd = libc::memfd_create(c"sysprof-copy".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
        if fd < 0 {
            return Err(io(io::Error::last_os_error()));
        }
        File::from_raw_fd(fd)
    };
    copy.set_len(len).map_err(io)?;
    let mut buffer = vec![0u8; 1 << 20];
    for range in ranges {
        let mut at = range.start;
        while at < range.end {
            let chunk = &mut buffer[..(range.end - at).min(1 << 20) as usize];
            file.read_exact_at(chunk, at).map_err(|error| match error.kind() {
                io::ErrorKind::UnexpectedEof => MappedError::CutShort { path: path.to_path_buf() },
                _ => io(error),
            })?;
            copy.write_all_at(chunk, at).map_err(io)?;
            at += chunk.len() as u64;
        }
    }
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl on the descriptor owned above.
    if unsafe { libc::fcntl(copy.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(io(io::Error::last_os_error()));
    }
    Ok(copy)
}

/// Whether blazesym may read the DWARF of the ELF file `data`: `Err` says why not. blazesym
/// decompresses a compressed section into a buffer of the size its header claims and then
/// reads the stream to its end, whatever that is (and a debug build of it asserts the two
/// agree), and it follows a file's links to other files of DWARF (`.gnu_debuglink` by a
/// checksum anyone can forge, `.gnu_debugaltlink` and `.debug_sup` by build id), which it then
/// decompresses unchecked, in directories a user may own. So a file's DWARF is read only when
/// every compressed section is zlib, claims no more than zlib can expand its bytes to, all of
/// them together no more than [`DEBUG_LIMIT`], and decompresses to exactly what it claims (each
/// is decompressed here once, into nothing); and when it links to no other file.
pub fn debug_info(data: &[u8]) -> Result<(), String> {
    match FileKind::parse(data) {
        Ok(FileKind::Elf32) => elf_debug_info::<FileHeader32<Endianness>>(data),
        Ok(FileKind::Elf64) => elf_debug_info::<FileHeader64<Endianness>>(data),
        _ => Err("it is not an ELF file".into()),
    }
}

fn elf_debug_info<Elf: FileHeader<Endian = Endianness>>(data: &[u8]) -> Result<(), String> {
    let unreadable = |_| "its section headers are not readable".to_string();
    let header = Elf::parse(data).map_err(unreadable)?;
    let endian = header.endian().map_err(unreadable)?;
    let sections = header.sections(endian, data).map_err(unreadable)?;
    let mut left = DEBUG_LIMIT;
    for section in sections.iter() {
        let name = sections.section_name(endian, section).unwrap_or_default();
        let shown = String::from_utf8_lossy(name);
        if matches!(name, b".gnu_debuglink" | b".gnu_debugaltlink" | b".debug_sup") {
            return Err(format!(
                "it links to DWARF in another file ({shown}), which sysprof does not follow"
            ));
        }
        let flagged = section.sh_flags(endian).into() & u64::from(elf::SHF_COMPRESSED) != 0;
        if section.sh_type(endian) == elf::SHT_NOBITS || !(flagged || name.starts_with(b".zdebug")) {
            continue;
        }
        let bytes = section.data(endian, data).map_err(|_| format!("its {shown} is outside the file"))?;
        let Some(compressed) = compression(name, flagged, header.is_class_64(), endian, bytes)? else {
            continue;
        };
        let claimed = compressed.check(&shown, bytes, left)?;
        left -= claimed;
    }
    Ok(())
}

/// How a section is compressed: where its zlib stream starts and the size it claims.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Compressed {
    stream: usize,
    claimed: u64,
}

/// The compression header of section `name` (`data` its bytes): the ELF `Elf32_Chdr` or
/// `Elf64_Chdr` of a section `flagged` `SHF_COMPRESSED`, or GNU's "ZLIB" and a big-endian
/// 64-bit size in front of a `.zdebug_*` one that is not (older toolchains: `-gz=zlib-gnu`).
/// `None` for a `.zdebug_*` section without that header, which is not compressed.
pub(crate) fn compression(
    name: &[u8],
    flagged: bool,
    class_64: bool,
    endian: Endianness,
    data: &[u8],
) -> Result<Option<Compressed>, String> {
    let shown = String::from_utf8_lossy(name);
    let little = endian.is_little_endian();
    let word = |at: usize| {
        let bytes: [u8; 4] = data.get(at..at + 4)?.try_into().ok()?;
        Some(if little { u32::from_le_bytes(bytes) } else { u32::from_be_bytes(bytes) })
    };
    let double = |at: usize| {
        let bytes: [u8; 8] = data.get(at..at + 8)?.try_into().ok()?;
        Some(if little { u64::from_le_bytes(bytes) } else { u64::from_be_bytes(bytes) })
    };
    if flagged {
        let short = || format!("its {shown} is shorter than its compression header");
        // Elf64_Chdr: type, reserved, size, alignment; Elf32_Chdr: type, size, alignment.
        let (kind, claimed, stream) = match class_64 {
            true => (word(0), double(8), 24),
            false => (word(0), word(4).map(u64::from), 12),
        };
        let (Some(kind), Some(claimed), true) = (kind, claimed, data.len() >= stream) else {
            return Err(short());
        };
        return match kind {
            elf::ELFCOMPRESS_ZLIB => Ok(Some(Compressed { stream, claimed })),
            elf::ELFCOMPRESS_ZSTD => {
                Err(format!("its {shown} is compressed with zstd, which sysprof does not read"))
            }
            other => Err(format!("its {shown} is compressed in an unknown way ({other})")),
        };
    }
    match data.strip_prefix(b"ZLIB").and_then(|rest| rest.get(..8)) {
        Some(size) => Ok(Some(Compressed {
            stream: 12,
            claimed: u64::from_be_bytes(size.try_into().unwrap_or_default()),
        })),
        None => Ok(None),
    }
}

impl Compressed {
    /// The size section `name` (`data` its bytes, header and all) decompresses to, when it is
    /// within `left` and what zlib can expand its stream to, and when it is what the stream
    /// actually gives.
    fn check(&self, name: &str, data: &[u8], left: u64) -> Result<u64, String> {
        use std::io::Read as _;
        let stream = data.get(self.stream..).unwrap_or_default();
        let most = (stream.len() as u64).saturating_mul(DEFLATE_RATIO);
        if self.claimed > most {
            return Err(format!(
                "its {name} claims {} decompressed from {} compressed, more than zlib expands to",
                bytes(self.claimed),
                bytes(stream.len() as u64)
            ));
        }
        if self.claimed > left {
            return Err(format!(
                "its debug info claims more than the {} sysprof decompresses from one file ({name}: {})",
                bytes(DEBUG_LIMIT),
                bytes(self.claimed)
            ));
        }
        let mut decoder = flate2::bufread::ZlibDecoder::new(stream).take(self.claimed + 1);
        let produced = io::copy(&mut decoder, &mut io::sink())
            .map_err(|error| format!("its {name} is not a zlib stream sysprof can read ({error})"))?;
        if produced > self.claimed {
            return Err(format!(
                "its {name} decompresses to more than the {} bytes its header claims",
                self.claimed
            ));
        }
        if produced < self.claimed {
            return Err(format!(
                "its {name} decompresses to {produced} bytes, not the {} its header claims",
                self.claimed
            ));
        }
        Ok(self.claimed)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn zlib(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    /// An `Elf64_Chdr` (little-endian) in front of `stream`.
    fn chdr64(kind: u32, claimed: u64, stream: &[u8]) -> Vec<u8> {
        let mut data = Vec::new();
        data.extend_from_slice(&kind.to_le_bytes());
        data.extend_from_slice(&0u32.to_le_bytes());
        data.extend_from_slice(&claimed.to_le_bytes());
        data.extend_from_slice(&1u64.to_le_bytes());
        data.extend_from_slice(stream);
        data
    }

    fn check(name: &[u8], flagged: bool, class_64: bool, data: &[u8]) -> Result<Option<u64>, String> {
        let Some(compressed) = compression(name, flagged, class_64, Endianness::Little, data)? else {
            return Ok(None);
        };
        compressed.check(&String::from_utf8_lossy(name), data, DEBUG_LIMIT).map(Some)
    }

    #[test]
    fn an_elf_compression_header_is_held_to_its_stream() {
        let text = b"debug info ".repeat(1000);
        let stream = zlib(&text);
        let len = text.len() as u64;
        assert_eq!(check(b".debug_info", true, true, &chdr64(1, len, &stream)), Ok(Some(len)));
        // The case that ended sysprof: 1 TiB claimed, allocated before a byte was read.
        let error = check(b".debug_info", true, true, &chdr64(1, 1 << 40, &stream)).unwrap_err();
        assert!(
            error.contains("claims 1.0 TiB decompressed") && error.contains("more than zlib expands to"),
            "{error}"
        );
        // Within what zlib can do, but not what the stream gives, either way.
        let error = check(b".debug_info", true, true, &chdr64(1, len + 1, &stream)).unwrap_err();
        assert_eq!(
            error,
            format!("its .debug_info decompresses to {len} bytes, not the {} its header claims", len + 1)
        );
        let error = check(b".debug_info", true, true, &chdr64(1, len - 1, &stream)).unwrap_err();
        assert!(error.contains("decompresses to more than"), "{error}");
        // Over what is left of what sysprof decompresses from a file, though zlib could.
        let compressed =
            compression(b".debug_info", true, true, Endianness::Little, &chdr64(1, len, &stream));
        let error =
            compressed.unwrap().unwrap().check(".debug_info", &chdr64(1, len, &stream), len - 1).unwrap_err();
        assert!(error.starts_with("its debug info claims more than the 512.0 MiB"), "{error}");
        // zstd and unknown kinds, a header cut short, a stream that is not zlib.
        assert!(check(b".debug_info", true, true, &chdr64(2, 10, &stream)).unwrap_err().contains("zstd"));
        assert!(
            check(b".debug_info", true, true, &chdr64(9, 10, &stream))
                .unwrap_err()
                .contains("unknown way (9)")
        );
        assert!(
            check(b".debug_info", true, true, &chdr64(1, 10, &stream)[..20]).unwrap_err().contains("shorter")
        );
        assert!(
            check(b".debug_info", true, true, &chdr64(1, 10, b"not zlib at all"))
                .unwrap_err()
                .contains("zlib")
        );
    }

    #[test]
    fn a_32_bit_compression_header_is_read_as_such() {
        let stream = zlib(b"abc");
        let mut data = Vec::new();
        for word in [1u32, 3, 1] {
            data.extend_from_slice(&word.to_le_bytes());
        }
        data.extend_from_slice(&stream);
        assert_eq!(check(b".debug_str", true, false, &data), Ok(Some(3)));
        data[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(check(b".debug_str", true, false, &data).unwrap_err().contains("more than zlib expands to"));
    }

    #[test]
    fn a_gnu_zdebug_header_is_held_to_its_stream() {
        let text = b"gnu style ".repeat(500);
        let with_size = |size: u64, stream: &[u8]| {
            let mut data = b"ZLIB".to_vec();
            data.extend_from_slice(&size.to_be_bytes());
            data.extend_from_slice(stream);
            data
        };
        let stream = zlib(&text);
        let len = text.len() as u64;
        assert_eq!(check(b".zdebug_info", false, true, &with_size(len, &stream)), Ok(Some(len)));
        let error = check(b".zdebug_info", false, true, &with_size(1 << 40, &stream)).unwrap_err();
        assert!(error.contains(".zdebug_info claims 1.0 TiB"), "{error}");
        assert!(check(b".zdebug_info", false, true, &with_size(len * 2, &stream)).is_err());
        // A .zdebug section without the header is not compressed.
        assert_eq!(check(b".zdebug_info", false, true, b"plain bytes"), Ok(None));
    }

    #[test]
    fn a_bounded_reader_refuses_what_a_header_claims_past_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse");
        let file = File::create(&path).unwrap();
        file.set_len(8 << 30).unwrap();
        let file = File::open(&path).unwrap();
        let data = Bounded::new(&file, 1 << 20);
        assert_eq!(data.len(), Ok(8 << 30));
        assert!(data.read_bytes_at(0, 4 << 30).is_err(), "4 GiB of a sparse file read");
        assert_eq!(data.read_bytes_at(100, 1 << 19).map(<[u8]>::len), Ok(1 << 19));
        // Asked again: cached, not counted twice.
        assert!(data.read_bytes_at(100, 1 << 19).is_ok());
        assert!(data.read_bytes_at(200, 1 << 19).is_ok());
        assert!(data.read_bytes_at(300, 1).is_err(), "past the bound");
    }

    #[test]
    fn a_copy_holds_what_is_needed_and_cannot_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prog");
        let source = dir.path().join("prog.c");
        std::fs::write(&source, "int main(void) { return 0; }\n").unwrap();
        let built =
            std::process::Command::new("cc").args(["-g", "-o"]).arg(&path).arg(&source).status().unwrap();
        assert!(built.success());
        let original = std::fs::read(&path).unwrap();
        let file = File::open(&path).unwrap();
        let meta = file.metadata().unwrap();
        // As root the test's file is root's: copied only when others can write it.
        if !others_can_write(&meta) {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        }
        let stable = Stable::of(File::open(&path).unwrap(), &path, Need::Symbols).unwrap();
        let copy = stable.map().unwrap();
        assert_eq!(copy.len(), original.len());
        let elf = object::File::parse(&*copy).unwrap();
        use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
        assert!(elf.symbols().any(|symbol| symbol.name() == Ok("main")), "the symbol table is copied");
        // The code is not: a hole.
        let text = elf.section_by_name(".text").unwrap();
        assert!(text.data().unwrap().iter().all(|&b| b == 0));
        // Sealed: it can be neither cut short nor written.
        let writable = std::fs::OpenOptions::new().write(true).open(stable.fd_path()).unwrap();
        assert!(writable.set_len(10).is_err());
        assert!(writable.write_all_at(b"x", 0).is_err());
        // The original cut short while mapped changes nothing in the copy.
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(100).unwrap();
        assert!(copy[copy.len() - 64..].iter().any(|&b| b != 0), "the section headers are still there");
        let error = Stable::of(File::open(&path).unwrap(), &path, Need::Symbols).err().unwrap();
        assert!(matches!(error, MappedError::NotElf { .. } | MappedError::CutShort { .. }), "{error}");
    }

    #[test]
    fn only_the_file_the_process_mapped_is_opened() {
        let dir = tempfile::tempdir().unwrap();
        let (path, other) = (dir.path().join("lib.so"), dir.path().join("secret.so"));
        std::fs::write(&path, b"mine").unwrap();
        std::fs::write(&other, b"secret").unwrap();
        let key = FileKey::of(&std::fs::metadata(&path).unwrap());
        assert!(open(&path, Some(key)).is_ok());
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&other, &path).unwrap();
        let error = open(&path, Some(key)).unwrap_err();
        assert!(matches!(error, MappedError::Changed { .. }), "{error}");
        assert!(
            error.to_string().contains("another file is there now than the one the process mapped"),
            "{error}"
        );
        // A FIFO there now is not opened, so nothing blocks.
        std::fs::remove_file(&path).unwrap();
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        assert!(open(&path, Some(key)).is_err());
        assert!(open(&path, None).is_err());
    }
}
