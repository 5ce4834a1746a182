//! The symbolize stage: instruction addresses to function names, with blazesym.
//!
//! Kernel addresses resolve through kallsyms. User addresses resolve through the process's
//! mapping snapshot (see `procmaps`): each address becomes a file offset in an ELF file, so a
//! process that exited during the trace symbolizes like a live one. Anonymous executable memory
//! resolves through the runtime's perf map (/tmp/perf-PID.map: `python -X perf`, node
//! `--perf-basic-prof`, the JVM with perf-map-agent). What cannot be resolved keeps its module
//! and offset, so no frame vanishes.
//!
//! Every answer is kept ([`Symbols`]), so that a saved read-out replays with the names the run
//! had, on a machine without its binaries.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::Arc,
};

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer as Blazesym,
    source::{Elf, Kernel, Source},
};
use serde::{Deserialize, Serialize};

use crate::{
    plt::PltNames,
    procmaps::{Backing, Mapping, ProcessMaps},
};

/// One frame of a symbolized stack: a pointer to its names, which are shared, not owned. Every
/// stack through an address holds the one frame it resolved to, and a busy host's trace has
/// tens of thousands of stacks over a few thousand functions: a 10 s `--all` trace beside
/// `make -j2` held 19 MB of frames at its peak with a copy of both names in each, and its
/// profiles' frame lists were most of its peak with the names shared but two pointers to them
/// in each frame. Compared by its names (an equal frame resolved twice is equal).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Frame(Arc<FrameNames>);

/// What a [`Frame`] names.
#[derive(Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FrameNames {
    /// Demangled function name, or `[unknown] module+0xoffset`.
    pub function: Arc<str>,
    /// File name of the binary or library, `[kernel]` for kernel frames.
    pub module: Arc<str>,
}

impl std::ops::Deref for Frame {
    type Target = FrameNames;

    fn deref(&self) -> &FrameNames {
        &self.0
    }
}

impl Frame {
    pub const KERNEL_MODULE: &'static str = "[kernel]";

    pub fn new(function: Arc<str>, module: Arc<str>) -> Self {
        Frame(Arc::new(FrameNames { function, module }))
    }

    pub(crate) fn unknown(module: &str, offset: u64) -> Self {
        Frame::new(format!("{} {module}+{offset:#x}", Self::UNNAMED).into(), module.into())
    }

    /// Whether no symbol names it (see [`Frame::unknown`]).
    pub fn is_unnamed(&self) -> bool {
        self.function.starts_with(Self::UNNAMED)
    }

    /// What an unnamed frame's function reads as, before its module and offset.
    const UNNAMED: &'static str = "[unknown]";
    /// The module of an address in a process whose maps sysprof never read (it ended first).
    pub const UNREAD_MODULE: &'static str = "[unknown]";
    /// The module of an address outside every mapping of the process's last read.
    pub const UNMAPPED_MODULE: &'static str = "[unmapped]";
    /// The function of a leaf in code unmapped before the process's maps were read (the
    /// program before its exec), in place of the frames its addresses would give now.
    pub const UNMAPPED_CODE: &'static str = "[unmapped code]";

    pub fn is_kernel(&self) -> bool {
        *self.module == *Self::KERNEL_MODULE
    }

    /// A Python function's frame (see `crate::python::merge`): its module is a Python file
    /// (`train.py`, `<frozen importlib._bootstrap>`), never an ELF file's name.
    pub fn is_python(&self) -> bool {
        self.module.ends_with(".py") || self.module.starts_with('<') || *self.module == *Self::PYTHON_UNKNOWN
    }

    /// The module of a Python frame whose code object could not be read.
    pub const PYTHON_UNKNOWN: &'static str = "[python]";
}

/// Frames for one address: the function, then the functions inlined into it at that address,
/// outermost first.
pub type Frames = Vec<Frame>;

/// The frames each address resolved to: kernel addresses, and user addresses per process.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Symbols {
    kernel: BTreeMap<u64, Frames>,
    user: BTreeMap<u32, BTreeMap<u64, Frames>>,
}

/// Resolves addresses to frames, caching per file and per kernel address.
pub struct Symbolizer {
    /// None when replaying: every answer comes from `known`.
    blazesym: Option<Blazesym>,
    known: Symbols,
    perf_maps: HashMap<u32, Option<PerfMap>>,
    /// Each file's PLT stubs (see `plt.rs`), read once.
    plt: HashMap<PathBuf, PltNames>,
    /// Where each file's names are read from, decided once.
    names: HashMap<PathBuf, NameSource>,
    /// What each file's offsets resolved to, for every process that maps the file: a build's
    /// hundreds of compilers are one file, resolved once, whose names are held once.
    by_file: HashMap<FileId, HashMap<u64, Frames>>,
    /// Whether each process's answers are kept (`answers`), for a saved read-out to replay:
    /// otherwise a file's are enough, and a busy host's copies of them for each of its hundreds
    /// of processes are not kept (31,000 addresses against 6,500 in a 10 s `--all` trace beside
    /// a build).
    keep_answers: bool,
}

/// A file as it was when its offsets were resolved: `uprobes::file_id`'s identity with the
/// modification time, so that a path naming another file later (a program rebuilt during the
/// trace) is another file, and the path, which names the frames' module.
#[derive(Debug, PartialEq, Eq, Hash)]
struct FileId {
    path: PathBuf,
    device: u64,
    inode: u64,
    modified_ns: i128,
}

impl FileId {
    fn of(path: &Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(path).ok()?;
        Some(FileId {
            path: path.to_path_buf(),
            device: meta.dev(),
            inode: meta.ino(),
            modified_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        })
    }
}

/// Where a file's function names come from. Its own DWARF names inlined functions too, and is
/// read when the file has it (a program built with -g: the user's own code). A system
/// library's DWARF sits in a separate debug file (a -dbg or -debuginfo package), compressed:
/// reading it would take more memory than the rest of sysprof (libc's: 11 MB), so only that
/// file's symbol table is read, which names every function, static ones included. An
/// interpreter's frames under a Python function are replaced by the function's
/// (`python::merge`), so its DWARF (tens of MB in a pyenv build) would only name C functions
/// inlined into its evaluation loop: its symbol table is read instead.
#[derive(Debug)]
enum NameSource {
    Dwarf(PathBuf),
    Symbols(PathBuf),
    /// A separate debug file's symbols, asked by virtual address: the file's loadable segments
    /// (file offset, size, address) turn its offsets into addresses.
    DebugFile(PathBuf, Vec<(u64, u64, u64)>),
}

impl NameSource {
    fn of(path: &Path) -> Self {
        use object::{Object as _, ObjectSection as _, ObjectSegment as _};
        let Some(file) = std::fs::File::open(path).ok() else { return NameSource::Symbols(path.into()) };
        let cache = object::ReadCache::new(file);
        let Ok(elf) = object::File::parse(&cache) else { return NameSource::Symbols(path.into()) };
        if crate::python::is_interpreter_file(path) {
            return NameSource::Symbols(path.into());
        }
        if elf.section_by_name(".debug_info").is_some_and(|section| section.size() > 0) {
            return NameSource::Dwarf(path.into());
        }
        let separate = elf.build_id().ok().flatten().filter(|id| id.len() > 1).and_then(|id| {
            let hex = hex::encode(id);
            let debug = PathBuf::from(format!("/usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..]));
            debug.is_file().then_some(debug)
        });
        match separate {
            Some(debug) => {
                let segments = elf
                    .segments()
                    .map(|segment| {
                        let (offset, size) = segment.file_range();
                        (offset, size, segment.address())
                    })
                    .collect();
                NameSource::DebugFile(debug, segments)
            }
            None => NameSource::Symbols(path.into()),
        }
    }

    /// The file blazesym reads, and whether it reads its DWARF.
    fn elf(&self) -> Elf {
        let (NameSource::Dwarf(path) | NameSource::Symbols(path) | NameSource::DebugFile(path, _)) = self;
        let mut elf = Elf::new(path.clone());
        elf.debug_syms = matches!(self, NameSource::Dwarf(_));
        elf
    }

    /// What blazesym is asked for the file offsets `offsets`.
    fn input(&self, offsets: &[u64]) -> Vec<u64> {
        match self {
            NameSource::DebugFile(_, segments) => offsets
                .iter()
                .map(|&offset| {
                    segments
                        .iter()
                        .find(|(start, size, _)| (*start..start + size).contains(&offset))
                        .map_or(0, |(start, _, address)| offset - start + address)
                })
                .collect(),
            _ => offsets.to_vec(),
        }
    }
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    pub fn new() -> Self {
        let blazesym = Blazesym::builder()
            .enable_demangling(true)
            .enable_inlined_fns(true)
            .enable_code_info(false)
            .build();
        Symbolizer {
            blazesym: Some(blazesym),
            known: Symbols::default(),
            perf_maps: HashMap::new(),
            plt: HashMap::new(),
            names: HashMap::new(),
            by_file: HashMap::new(),
            keep_answers: false,
        }
    }

    /// Keeps every answer given, for `answers` (`--save-readout`).
    pub fn keeping_answers(mut self) -> Self {
        self.keep_answers = true;
        self
    }

    /// Whether answers come from the files themselves (a live run), not from a saved read-out:
    /// a replay reads no file the read-out names.
    pub fn reads_files(&self) -> bool {
        self.blazesym.is_some()
    }

    /// Answers from what an earlier run resolved (a saved read-out); what it did not resolve
    /// stays unknown.
    pub fn replay(known: Symbols) -> Self {
        Symbolizer {
            blazesym: None,
            known,
            perf_maps: HashMap::new(),
            plt: HashMap::new(),
            names: HashMap::new(),
            by_file: HashMap::new(),
            keep_answers: true,
        }
    }

    /// Every answer given so far (only the kernel's unless `keeping_answers`).
    pub fn answers(&self) -> &Symbols {
        &self.known
    }

    /// Kernel addresses already named (by the kernel itself, see `ksyms.rs`): no kallsyms to
    /// read for them.
    pub fn know_kernel(&mut self, frames: HashMap<u64, Frames>) {
        self.known.kernel.extend(frames);
    }

    /// Kernel addresses to frames.
    pub fn kernel(&mut self, addrs: &[u64]) -> HashMap<u64, Frames> {
        // Only kernel addresses: kallsyms names no other, and one alone had blazesym read and
        // index all of it (6 MB) for nothing.
        let missing: Vec<u64> = addrs
            .iter()
            .copied()
            .filter(|&a| crate::ksyms::is_kernel(a) && !self.known.kernel.contains_key(&a))
            .collect();
        if let Some(blazesym) = self.blazesym.as_ref().filter(|_| !missing.is_empty()) {
            let source = Source::Kernel(Kernel {
                // A vmlinux with DWARF is rarely installed and slow to parse; kallsyms names
                // every function.
                vmlinux: blazesym::MaybeDefault::None,
                ..Kernel::default()
            });
            let resolved = blazesym.symbolize(&source, Input::AbsAddr(&missing));
            let kernel_module: Arc<str> = Frame::KERNEL_MODULE.into();
            for (index, &addr) in missing.iter().enumerate() {
                let frames = match &resolved {
                    Ok(symbols) => frames_of(&symbols[index], &kernel_module)
                        .unwrap_or_else(|| vec![Frame::unknown(Frame::KERNEL_MODULE, addr)]),
                    Err(_) => vec![Frame::unknown(Frame::KERNEL_MODULE, addr)],
                };
                self.known.kernel.insert(addr, frames);
            }
        }
        addrs
            .iter()
            .map(|addr| {
                let frames = self.known.kernel.get(addr).cloned();
                (*addr, frames.unwrap_or_else(|| vec![Frame::unknown(Frame::KERNEL_MODULE, *addr)]))
            })
            .collect()
    }

    /// User addresses of process `pid` to frames, through its mapping snapshot.
    pub fn user(&mut self, pid: u32, maps: Option<&ProcessMaps>, addrs: &[u64]) -> HashMap<u64, Frames> {
        if !self.keep_answers {
            return self.resolve_user(pid, maps, addrs);
        }
        let known = self.known.user.entry(pid).or_default();
        let missing: Vec<u64> = addrs.iter().copied().filter(|a| !known.contains_key(a)).collect();
        if !missing.is_empty() {
            let fresh = match self.blazesym {
                Some(_) => self.resolve_user(pid, maps, &missing),
                None => missing
                    .iter()
                    .map(|&addr| (addr, vec![Frame::unknown(Frame::UNREAD_MODULE, addr)]))
                    .collect(),
            };
            self.known.user.entry(pid).or_default().extend(fresh);
        }
        let known = &self.known.user[&pid];
        addrs.iter().map(|addr| (*addr, known[addr].clone())).collect()
    }

    fn resolve_user(&mut self, pid: u32, maps: Option<&ProcessMaps>, addrs: &[u64]) -> HashMap<u64, Frames> {
        let mut result = HashMap::with_capacity(addrs.len());
        let Some(maps) = maps else {
            for &addr in addrs {
                result.insert(addr, vec![Frame::unknown(Frame::UNREAD_MODULE, addr)]);
            }
            return result;
        };
        // Batch by mapping: one blazesym call per file.
        let mut by_mapping: HashMap<u64, (&Mapping, Vec<u64>)> = HashMap::new();
        for &addr in addrs {
            match maps.find(addr) {
                Some(mapping) => {
                    by_mapping.entry(mapping.start).or_insert((mapping, Vec::new())).1.push(addr)
                }
                None => {
                    result.insert(addr, vec![Frame::unknown(Frame::UNMAPPED_MODULE, addr)]);
                }
            }
        }
        for (mapping, addrs) in by_mapping.into_values() {
            let module = mapping.module_name();
            match &mapping.backing {
                Backing::File { open, .. } => {
                    self.symbolize_file(open.to_path_buf(), mapping, &module, &addrs, &mut result)
                }
                Backing::Anonymous => {
                    let perf_map =
                        self.perf_maps.entry(pid).or_insert_with(|| PerfMap::read(pid, maps.owner()));
                    for &addr in &addrs {
                        let frame = perf_map
                            .as_ref()
                            .and_then(|map| map.find(addr))
                            .map(|name| Frame::new(name.into(), "[jit]".into()))
                            .unwrap_or_else(|| Frame::unknown(&module, mapping.file_offset_of(addr)));
                        result.insert(addr, vec![frame]);
                    }
                }
                Backing::Vdso | Backing::Other(_) => {
                    for &addr in &addrs {
                        result.insert(addr, vec![Frame::unknown(&module, addr - mapping.start)]);
                    }
                }
            }
        }
        result
    }

    fn symbolize_file(
        &mut self,
        path: PathBuf,
        mapping: &Mapping,
        module: &str,
        addrs: &[u64],
        result: &mut HashMap<u64, Frames>,
    ) {
        let file = FileId::of(&path);
        let known = file.as_ref().and_then(|file| self.by_file.get(file));
        // Keyed by offset: another process maps the file at another address.
        let (mut missing, mut offsets) = (Vec::new(), Vec::new());
        for &addr in addrs {
            let offset = mapping.file_offset_of(addr);
            match known.and_then(|known| known.get(&offset)) {
                Some(frames) => {
                    result.insert(addr, frames.clone());
                }
                None => {
                    missing.push(addr);
                    offsets.push(offset);
                }
            }
        }
        if missing.is_empty() {
            return;
        }
        let fresh = self.resolve_file(path, module, &offsets);
        let mut known = file.map(|file| self.by_file.entry(file).or_default());
        for ((&addr, &offset), frames) in missing.iter().zip(&offsets).zip(fresh) {
            if let Some(known) = known.as_mut() {
                known.insert(offset, frames.clone());
            }
            result.insert(addr, frames);
        }
    }

    /// The frames at each of `offsets` in the file at `path`.
    fn resolve_file(&mut self, path: PathBuf, module: &str, offsets: &[u64]) -> Vec<Frames> {
        let plt = self.plt.entry(path.clone()).or_insert_with(|| PltNames::read(&path));
        let stubs: Vec<Option<String>> = offsets.iter().map(|&offset| plt.name(offset)).collect();
        let names = self.names.entry(path).or_insert_with_key(|path| NameSource::of(path));
        let source = Source::Elf(names.elf());
        let Some(blazesym) = &self.blazesym else { return Vec::new() };
        let resolved = match names {
            NameSource::DebugFile(..) => {
                blazesym.symbolize(&source, Input::VirtOffset(&names.input(offsets)))
            }
            _ => blazesym.symbolize(&source, Input::FileOffset(offsets)),
        };
        // One copy of the file's name for all its frames.
        let shared_module: Arc<str> = module.into();
        (0..offsets.len())
            .map(|index| {
                // A PLT stub is its function's, `puts@plt`, not the symbol before it.
                let frames = match (&stubs[index], &resolved) {
                    (Some(stub), _) => Some(vec![Frame::new(stub.as_str().into(), shared_module.clone())]),
                    (None, Ok(symbols)) => frames_of(&symbols[index], &shared_module),
                    (None, Err(_)) => None,
                };
                frames.unwrap_or_else(|| vec![Frame::unknown(module, offsets[index])])
            })
            .collect()
    }
}

/// The function and its inlined callees for one resolved symbol, outermost first.
fn frames_of(symbolized: &Symbolized<'_>, module: &Arc<str>) -> Option<Frames> {
    let Symbolized::Sym(sym) = symbolized else {
        return None;
    };
    let module: Arc<str> = if **module == *Frame::KERNEL_MODULE {
        // Kernel module symbols carry their module name ("[nf_tables]" style in kallsyms).
        sym.module
            .as_ref()
            .map(|m| m.to_string_lossy().into_owned())
            .filter(|m| !m.is_empty() && !m.contains('/'))
            .map(|m| format!("[{m}]").into())
            .unwrap_or_else(|| module.clone())
    } else {
        module.clone()
    };
    let mut frames = vec![Frame::new(sym.name.as_ref().into(), module.clone())];
    frames.extend(sym.inlined.iter().map(|inlined| Frame::new(inlined.name.as_ref().into(), module.clone())));
    Some(frames)
}

/// A JIT's symbol file: `START SIZE NAME` per line, hexadecimal.
pub(crate) struct PerfMap {
    /// (start, end, name), sorted by start.
    symbols: Vec<(u64, u64, String)>,
}

impl PerfMap {
    /// The runtime's perf map, read only when the process itself (or root) wrote it: /tmp is
    /// anyone's, and sysprof reads as root. So no symlink (`O_NOFOLLOW`), a regular file, owned
    /// by the process's user or root, writable by no one else (as perf checks it).
    fn read(pid: u32, owner: Option<u32>) -> Option<Self> {
        use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
        let owner = owner.unwrap_or(0);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(format!("/tmp/perf-{pid}.map"))
            .ok()?;
        let meta = file.metadata().ok()?;
        if !meta.is_file() || (meta.uid() != owner && meta.uid() != 0) || meta.mode() & 0o022 != 0 {
            return None;
        }
        let text = std::io::read_to_string(file).ok()?;
        Some(Self::parse(&text))
    }

    pub(crate) fn parse(text: &str) -> Self {
        let mut symbols: Vec<(u64, u64, String)> = text
            .lines()
            .filter_map(|line| {
                let mut parts = line.splitn(3, ' ');
                let start = u64::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
                let size = u64::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
                let name = parts.next()?.trim().to_string();
                Some((start, start.checked_add(size)?, name))
            })
            .collect();
        symbols.sort_by_key(|(start, ..)| *start);
        PerfMap { symbols }
    }

    pub(crate) fn find(&self, addr: u64) -> Option<&str> {
        let index = self.symbols.partition_point(|(start, ..)| *start <= addr);
        let (_, end, name) = self.symbols.get(index.checked_sub(1)?)?;
        (addr < *end).then_some(name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    #[unsafe(no_mangle)]
    extern "C" fn sysprof_symbolize_test_marker() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn symbolizes_a_function_of_this_process_by_file_offset() {
        let pid = std::process::id();
        let maps = ProcessMaps::read(pid).unwrap();
        let addr = sysprof_symbolize_test_marker as *const () as u64;
        let frames = Symbolizer::new().user(pid, Some(&maps), &[addr]);
        let frame = &frames[&addr][0];
        assert_eq!(&*frame.function, "sysprof_symbolize_test_marker");
        assert!(frame.module.starts_with("sysprof-"), "module {}", frame.module);
    }

    #[test]
    fn frames_of_one_file_share_its_name() {
        #[inline(never)]
        #[unsafe(no_mangle)]
        extern "C" fn sysprof_symbolize_test_other() -> u64 {
            std::hint::black_box(7)
        }
        let pid = std::process::id();
        let maps = ProcessMaps::read(pid).unwrap();
        let (a, b) = (
            sysprof_symbolize_test_marker as *const () as u64,
            sysprof_symbolize_test_other as *const () as u64,
        );
        let frames = Symbolizer::new().user(pid, Some(&maps), &[a, b]);
        let (first, second) = (&frames[&a][0], &frames[&b][0]);
        assert_eq!(&*second.function, "sysprof_symbolize_test_other");
        // One copy of the module's name for the file, not one per frame: a busy host's trace
        // holds tens of thousands of stacks through a few files.
        assert!(Arc::ptr_eq(&first.module, &second.module));
    }

    #[test]
    fn processes_mapping_one_file_share_its_answers() {
        let pid = std::process::id();
        let maps = ProcessMaps::read(pid).unwrap();
        // The same files mapped elsewhere, as another process would have them.
        const SHIFT: u64 = 0x1000_0000;
        let moved = ProcessMaps::from_mappings(
            maps.mappings()
                .iter()
                // The files' mappings: [vsyscall] sits at the top of the address space.
                .filter(|m| matches!(m.backing, Backing::File { .. }))
                .map(|m| Mapping { start: m.start + SHIFT, end: m.end + SHIFT, ..m.clone() })
                .collect(),
        );
        let addr = sysprof_symbolize_test_marker as *const () as u64;
        for keeping in [false, true] {
            let mut symbolizer =
                if keeping { Symbolizer::new().keeping_answers() } else { Symbolizer::new() };
            let own = symbolizer.user(pid, Some(&maps), &[addr]);
            let other = symbolizer.user(pid + 1, Some(&moved), &[addr + SHIFT]);
            let (own, other) = (&own[&addr][0], &other[&(addr + SHIFT)][0]);
            assert_eq!(&*other.function, "sysprof_symbolize_test_marker");
            // Resolved once for the file: the second process's frame is the first one's.
            assert!(Arc::ptr_eq(&own.function, &other.function));
            // Each process's answers are kept for a read-out only.
            assert_eq!(symbolizer.answers().user.len(), if keeping { 2 } else { 0 });
        }
    }

    #[test]
    fn a_file_changed_in_place_is_another_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prog");
        std::fs::write(&path, b"one").unwrap();
        let before = FileId::of(&path).unwrap();
        let file = std::fs::File::options().write(true).open(&path).unwrap();
        file.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5)).unwrap();
        assert_ne!(FileId::of(&path).unwrap(), before);
        assert_eq!(FileId::of(&path).unwrap(), FileId::of(&path).unwrap());
    }

    #[test]
    fn unknown_addresses_keep_their_module() {
        let maps = ProcessMaps::from_mappings(vec![Mapping {
            start: 0x1000,
            end: 0x2000,
            file_offset: 0,
            backing: Backing::File {
                path: std::path::Path::new("/nonexistent/libfoo.so").into(),
                open: std::path::Path::new("/nonexistent/libfoo.so").into(),
            },
        }]);
        let frames = Symbolizer::new().user(1, Some(&maps), &[0x1234, 0x9000]);
        assert_eq!(&*frames[&0x1234][0].function, "[unknown] libfoo.so+0x234");
        assert_eq!(&*frames[&0x9000][0].function, "[unknown] [unmapped]+0x9000");
    }

    #[test]
    fn perf_maps_are_read_only_from_their_process_user_and_never_through_a_link() {
        use std::os::unix::fs::PermissionsExt as _;
        // A pid no process has, so the file is this test's alone.
        let pid = 4_000_000 + std::process::id() % 100_000;
        let path = PathBuf::from(format!("/tmp/perf-{pid}.map"));
        let me = nix::unistd::geteuid().as_raw();
        let _ = std::fs::remove_file(&path);
        let real = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(real.path(), "1000 10 planted\n").unwrap();
        std::os::unix::fs::symlink(real.path(), &path).unwrap();
        assert!(PerfMap::read(pid, Some(me)).is_none(), "followed a symlink");
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "1000 10 jitted\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            PerfMap::read(pid, Some(me)).and_then(|m| m.find(0x1004).map(String::from)).as_deref(),
            Some("jitted")
        );
        // Planted by another user than the process's: as root, give it away; else ask for it
        // as the map of someone else's process.
        let planted = if me == 0 {
            std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
            let read = PerfMap::read(pid, Some(0)).is_none();
            std::os::unix::fs::chown(&path, Some(0), Some(0)).unwrap();
            read
        } else {
            PerfMap::read(pid, Some(me + 1)).is_none()
        };
        assert!(planted, "a map of another user than the process's was read");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let writable = PerfMap::read(pid, Some(me)).is_none();
        std::fs::remove_file(&path).unwrap();
        assert!(writable, "a map anyone can write was read");
    }

    #[test]
    fn perf_maps_name_jit_code() {
        let map = PerfMap::parse("7f0000001000 40 py::busy:/app/x.py\n7f0000002000 0x10 other\n");
        assert_eq!(map.find(0x7f0000001000), Some("py::busy:/app/x.py"));
        assert_eq!(map.find(0x7f000000103f), Some("py::busy:/app/x.py"));
        assert_eq!(map.find(0x7f0000001040), None);
        assert_eq!(map.find(0x7f000000200f), Some("other"));
    }

    #[test]
    fn kernel_addresses_resolve_through_kallsyms() {
        let kallsyms = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
        // Addresses read as zero without root (kptr_restrict): nothing to check then.
        let Some(addr) = kallsyms.lines().find_map(|line| {
            let mut parts = line.split_whitespace();
            let addr = u64::from_str_radix(parts.next()?, 16).ok()?;
            let _kind = parts.next()?;
            (parts.next()? == "schedule" && addr != 0).then_some(addr)
        }) else {
            assert!(
                std::env::var_os("CI").is_none(),
                "kallsyms hides addresses from non-root: CI runs as root"
            );
            eprintln!("skipped: kallsyms addresses need root");
            return;
        };
        let frames = Symbolizer::new().kernel(&[addr]);
        assert_eq!(&*frames[&addr][0].function, "schedule");
        assert!(frames[&addr][0].is_kernel());
    }
}
