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
    input::{InputError, Links},
    mapped::{self, Bounded, FileKey, MappedError, Need, Stable},
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
    /// The function of a leaf in code unmapped before its image's maps were read (a library
    /// closed, an exec sysprof did not hear of), in place of the frames its addresses would
    /// give now.
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

/// The frames each address resolved to: kernel addresses, and user addresses per process and
/// program image (`procs::ImageOf`); and what could not be read, for the report's limitations.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Symbols {
    kernel: BTreeMap<u64, Frames>,
    /// Each process's first image's (its only one in read-outs saved before images were kept).
    user: BTreeMap<u32, BTreeMap<u64, Frames>>,
    /// What could not be read (a file's debug info, a perf map), each said once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
    /// Those of the images after, by process and image.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    later_images: BTreeMap<u32, BTreeMap<u32, BTreeMap<u64, Frames>>>,
}

impl Symbols {
    /// The answers for image `image` of process `pid`.
    fn user_mut(&mut self, pid: u32, image: u32) -> &mut BTreeMap<u64, Frames> {
        match image {
            0 => self.user.entry(pid).or_default(),
            _ => self.later_images.entry(pid).or_default().entry(image).or_default(),
        }
    }
}

/// Resolves addresses to frames, caching per file and per kernel address.
pub struct Symbolizer {
    /// None when replaying: every answer comes from `known`.
    blazesym: Option<Blazesym>,
    known: Symbols,
    perf_maps: HashMap<u32, Option<PerfMap>>,
    /// Each file the processes mapped, by what they mapped and where sysprof opens it: opened
    /// once, and kept open while the symbolizer lives (blazesym reads it by a path to the
    /// descriptor), or `None` where it could not be read. Every process that maps the file
    /// shares it: a build's hundreds of compilers are one file, resolved once, whose names are
    /// held once.
    files: HashMap<(FileKey, Arc<Path>), Option<MappedFile>>,
    /// Whether each process's answers are kept (`answers`), for a saved read-out to replay:
    /// otherwise a file's are enough, and a busy host's copies of them for each of its hundreds
    /// of processes are not kept (31,000 addresses against 6,500 in a 10 s `--all` trace beside
    /// a build).
    keep_answers: bool,
}

/// A mapped file as the symbolizer reads it.
struct MappedFile {
    names: NameSource,
    /// Its PLT stubs (see `plt.rs`).
    plt: PltNames,
    /// What its offsets resolved to, for every process that maps it (keyed by offset: another
    /// process maps the file at another address).
    answers: HashMap<u64, Frames>,
}

/// Where a file's function names come from. Its own DWARF names inlined functions too, and is
/// read when the file has it (a program built with -g: the user's own code), and when
/// `mapped::debug_info` finds it safe to read. A system library's DWARF sits in a separate
/// debug file (a -dbg or -debuginfo package), compressed: reading it would take more memory
/// than the rest of sysprof (libc's: 11 MB), so only that file's symbol table is read, which
/// names every function, static ones included. An interpreter's frames under a Python function
/// are replaced by the function's (`python::merge`), so its DWARF (tens of MB in a pyenv build)
/// would only name C functions inlined into its evaluation loop: its symbol table is read
/// instead.
struct NameSource {
    /// What blazesym reads (the file or its separate debug file), as it stays while read.
    file: Stable,
    /// Whether blazesym reads its DWARF, else its symbol tables.
    dwarf: bool,
    /// Where `file` is a separate debug file, which is asked by virtual address: the mapped
    /// file's loadable segments (file offset, size, address) turn its offsets into addresses.
    segments: Option<Vec<(u64, u64, u64)>>,
}

/// Which of a file's names are read, before they are.
enum Choice {
    Dwarf,
    Symbols,
    DebugFile(PathBuf, Vec<(u64, u64, u64)>),
}

impl MappedFile {
    /// The file a process mapped, opened from `open` while it is the file `key` names, and a
    /// line for the report where its DWARF could not be read (`shown`: the mapped path).
    fn open(open: &Path, key: FileKey, shown: &Path) -> Result<(Self, Option<String>), MappedError> {
        use object::{Object as _, ObjectSection as _, ObjectSegment as _};
        let file = mapped::open(open, Some(key))?;
        let io = |source| MappedError::Input(InputError::Io { path: open.to_path_buf(), source });
        let root_owned = std::os::unix::fs::MetadataExt::uid(&file.metadata().map_err(io)?) == 0;
        let (plt, choice) = {
            let data = Bounded::new(&file, mapped::READ_LIMIT);
            match object::File::parse(&data) {
                Ok(elf) => {
                    let choice = if crate::python::is_interpreter_file(shown) {
                        Choice::Symbols
                    } else if elf.section_by_name(".debug_info").is_some_and(|section| section.size() > 0) {
                        Choice::Dwarf
                    } else {
                        match separate_debug_file(&elf, root_owned) {
                            Some(debug) => {
                                let segments = elf
                                    .segments()
                                    .map(|segment| {
                                        let (offset, size) = segment.file_range();
                                        (offset, size, segment.address())
                                    })
                                    .collect();
                                Choice::DebugFile(debug, segments)
                            }
                            None => Choice::Symbols,
                        }
                    };
                    (PltNames::of(&elf), choice)
                }
                Err(_) => (PltNames::default(), Choice::Symbols),
            }
        };
        let mut note = None;
        let names = match choice {
            Choice::Symbols => {
                NameSource { file: Stable::of(file, open, Need::Symbols)?, dwarf: false, segments: None }
            }
            Choice::DebugFile(debug, segments) => {
                match mapped::open(&debug, None)
                    .and_then(|debug_file| Stable::of(debug_file, &debug, Need::Symbols))
                {
                    Ok(stable) => NameSource { file: stable, dwarf: false, segments: Some(segments) },
                    // Its own symbol table, then.
                    Err(_) => NameSource {
                        file: Stable::of(file, open, Need::Symbols)?,
                        dwarf: false,
                        segments: None,
                    },
                }
            }
            Choice::Dwarf => {
                let refused = |why: String| {
                    format!(
                        "could not read the debug info of {}: {why}; its functions are named from its symbol table",
                        shown.display()
                    )
                };
                match Stable::of(file.try_clone().map_err(io)?, open, Need::Dwarf) {
                    Ok(stable) => {
                        let checked = stable
                            .map()
                            .map_err(|error| error.to_string())
                            .and_then(|map| mapped::debug_info(&map));
                        note = checked.err().map(refused);
                        // Its symbol tables are in the copy too.
                        NameSource { dwarf: note.is_none(), file: stable, segments: None }
                    }
                    Err(MappedError::TooLarge { what, limit, .. }) => {
                        note = Some(refused(format!(
                            "{what} is over the {} sysprof copies from a file another user can change",
                            crate::report::format::bytes(limit)
                        )));
                        NameSource {
                            file: Stable::of(file, open, Need::Symbols)?,
                            dwarf: false,
                            segments: None,
                        }
                    }
                    Err(error) => return Err(error),
                }
            }
        };
        Ok((MappedFile { names, plt, answers: HashMap::new() }, note))
    }
}

/// The separate debug file of an ELF file (by its build id, where a -dbg package puts it), when
/// there is one that may name its functions: any, for a file of root's; for anyone else's, one
/// every user may read (else a user's program that claims the build id of a file only root may
/// read would have that file's names in its profile).
fn separate_debug_file<'data, R: object::ReadRef<'data>>(
    elf: &object::File<'data, R>,
    root_owned: bool,
) -> Option<PathBuf> {
    use object::Object as _;
    use std::os::unix::fs::MetadataExt as _;
    let id = elf.build_id().ok().flatten().filter(|id| id.len() > 1)?;
    let hex = hex::encode(id);
    let debug = PathBuf::from(format!("/usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..]));
    let meta = std::fs::metadata(&debug).ok()?;
    (meta.is_file() && (root_owned || meta.mode() & 0o004 != 0)).then_some(debug)
}

impl NameSource {
    /// The file blazesym reads, and whether it reads its DWARF.
    fn elf(&self) -> Elf {
        let mut elf = Elf::new(self.file.fd_path());
        elf.debug_syms = self.dwarf;
        elf
    }

    /// What blazesym is asked for the file offsets `offsets`.
    fn input(&self, offsets: &[u64]) -> Vec<u64> {
        match &self.segments {
            Some(segments) => offsets
                .iter()
                .map(|&offset| {
                    segments
                        .iter()
                        .find(|(start, size, _)| (*start..start + size).contains(&offset))
                        .map_or(0, |(start, _, address)| offset - start + address)
                })
                .collect(),
            None => offsets.to_vec(),
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
        // Every file read is held open, twice (here and by blazesym).
        mapped::allow_open_files();
        Symbolizer {
            blazesym: Some(blazesym),
            known: Symbols::default(),
            perf_maps: HashMap::new(),
            files: HashMap::new(),
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
            files: HashMap::new(),
            keep_answers: true,
        }
    }

    /// Every answer given so far (only the kernel's unless `keeping_answers`).
    pub fn answers(&self) -> &Symbols {
        &self.known
    }

    /// What could not be read, each said once: for the report's limitations (and the terminal,
    /// in a live run).
    pub fn notes(&self) -> &[String] {
        &self.known.notes
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

    /// User addresses of process `pid`'s program image `image` (see `procs::ProcessRecord::image`)
    /// to frames, through its mapping snapshot `maps`.
    pub fn user(
        &mut self,
        pid: u32,
        image: u32,
        maps: Option<&ProcessMaps>,
        addrs: &[u64],
    ) -> HashMap<u64, Frames> {
        if !self.keep_answers {
            return self.resolve_user(pid, maps, addrs);
        }
        let known = self.known.user_mut(pid, image);
        let missing: Vec<u64> = addrs.iter().copied().filter(|a| !known.contains_key(a)).collect();
        if !missing.is_empty() {
            let fresh = match self.blazesym {
                Some(_) => self.resolve_user(pid, maps, &missing),
                None => missing
                    .iter()
                    .map(|&addr| (addr, vec![Frame::unknown(Frame::UNREAD_MODULE, addr)]))
                    .collect(),
            };
            self.known.user_mut(pid, image).extend(fresh);
        }
        let known = self.known.user_mut(pid, image);
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
                Backing::File { path, open, key } => {
                    self.symbolize_file((*key, open.clone()), path, mapping, &module, &addrs, &mut result)
                }
                Backing::Anonymous => {
                    let notes = &mut self.known.notes;
                    let perf_map = self.perf_maps.entry(pid).or_insert_with(|| {
                        PerfMap::read(pid, maps.owner()).unwrap_or_else(|why| {
                            note(
                                notes,
                                format!(
                                    "{why}; the JIT code of process {pid} shows as [unknown] {module}+offset"
                                ),
                            );
                            None
                        })
                    });
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
        file: (FileKey, Arc<Path>),
        shown: &Path,
        mapping: &Mapping,
        module: &str,
        addrs: &[u64],
        result: &mut HashMap<u64, Frames>,
    ) {
        let Some(blazesym) = &self.blazesym else { return };
        let notes = &mut self.known.notes;
        let opened = self.files.entry(file).or_insert_with_key(|(key, open)| {
            match MappedFile::open(open, *key, shown) {
                Ok((file, refused)) => {
                    refused.into_iter().for_each(|line| note(notes, line));
                    Some(file)
                }
                Err(error) => {
                    if let Some(line) = unread(&error, shown, module) {
                        note(notes, line);
                    }
                    None
                }
            }
        });
        let Some(opened) = opened else {
            for &addr in addrs {
                result.insert(addr, vec![Frame::unknown(module, mapping.file_offset_of(addr))]);
            }
            return;
        };
        let (mut missing, mut offsets) = (Vec::new(), Vec::new());
        for &addr in addrs {
            let offset = mapping.file_offset_of(addr);
            match opened.answers.get(&offset) {
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
        let fresh = resolve_file(blazesym, opened, module, &offsets);
        for ((&addr, &offset), frames) in missing.iter().zip(&offsets).zip(fresh) {
            opened.answers.insert(offset, frames.clone());
            result.insert(addr, frames);
        }
    }
}

/// The frames at each of `offsets` in `file`.
fn resolve_file(blazesym: &Blazesym, file: &MappedFile, module: &str, offsets: &[u64]) -> Vec<Frames> {
    let names = &file.names;
    let source = Source::Elf(names.elf());
    let resolved = match names.segments {
        Some(_) => blazesym.symbolize(&source, Input::VirtOffset(&names.input(offsets))),
        None => blazesym.symbolize(&source, Input::FileOffset(offsets)),
    };
    // One copy of the file's name for all its frames.
    let shared_module: Arc<str> = module.into();
    offsets
        .iter()
        .enumerate()
        .map(|(index, &offset)| {
            // A PLT stub is its function's, `puts@plt`, not the symbol before it.
            let frames = match (file.plt.name(offset), &resolved) {
                (Some(stub), _) => Some(vec![Frame::new(stub.into(), shared_module.clone())]),
                (None, Ok(symbols)) => frames_of(&symbols[index], &shared_module),
                (None, Err(_)) => None,
            };
            frames.unwrap_or_else(|| vec![Frame::unknown(module, offset)])
        })
        .collect()
}

/// Adds `line` to `notes` unless it is there.
fn note(notes: &mut Vec<String>, line: String) {
    if !notes.contains(&line) {
        notes.push(line);
    }
}

/// What the report says of a mapped file that was not read (`shown`: its path as the process
/// mapped it), where that is news: a file gone with its process, or one that is no ELF file,
/// keeps its frames unnamed as always.
fn unread(error: &MappedError, shown: &Path, module: &str) -> Option<String> {
    let frames = format!("its frames show as [unknown] {module}+offset");
    match error {
        MappedError::Changed { then, now, .. } => Some(format!(
            "{} changed during the trace: another file is there now than the one the process mapped \
             ({then} then, {now} now), so it was not read and {frames}",
            shown.display()
        )),
        MappedError::CutShort { .. } | MappedError::TooLarge { .. } => Some(format!("{error}; {frames}")),
        MappedError::NotElf { .. } | MappedError::Input(_) => None,
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

/// What sysprof reads of a perf map at most: a JIT's names for a day's run take a few MB (node
/// with `--perf-basic-prof` appends to it for as long as it runs).
const PERF_MAP_LIMIT: u64 = 64 << 20;

impl PerfMap {
    /// The runtime's perf map, read only when the process itself (or root) wrote it: /tmp is
    /// anyone's, and sysprof reads as root. So no symlink (`O_NOFOLLOW`), a regular file (a FIFO
    /// would block the read for good), opened without blocking, owned by the process's user or
    /// root, writable by no one else (as perf checks it), and not over [`PERF_MAP_LIMIT`]. `Ok(None)`
    /// where there is none; `Err` says why one is not read.
    fn read(pid: u32, owner: Option<u32>) -> Result<Option<Self>, String> {
        use std::os::unix::fs::MetadataExt as _;
        let owner = owner.unwrap_or(0);
        let path = PathBuf::from(format!("/tmp/perf-{pid}.map"));
        let file = match crate::input::open_regular(&path, Links::Refuse) {
            Ok(file) => file,
            Err(InputError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Ok(None);
            }
            Err(error) => return Err(error.to_string()),
        };
        let meta = file.metadata().map_err(|error| format!("{}: {error}", path.display()))?;
        if meta.uid() != owner && meta.uid() != 0 {
            return Err(format!("{}: not written by process {pid}'s user, so not read", path.display()));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(format!("{}: others can write it, so it is not read", path.display()));
        }
        let bytes =
            crate::input::read_bounded(file, &path, PERF_MAP_LIMIT).map_err(|error| error.to_string())?;
        Ok(Some(Self::parse(&String::from_utf8_lossy(&bytes))))
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
        let frames = Symbolizer::new().user(pid, 0, Some(&maps), &[addr]);
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
        let frames = Symbolizer::new().user(pid, 0, Some(&maps), &[a, b]);
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
            let own = symbolizer.user(pid, 0, Some(&maps), &[addr]);
            let other = symbolizer.user(pid + 1, 0, Some(&moved), &[addr + SHIFT]);
            let (own, other) = (&own[&addr][0], &other[&(addr + SHIFT)][0]);
            assert_eq!(&*other.function, "sysprof_symbolize_test_marker");
            // Resolved once for the file: the second process's frame is the first one's.
            assert!(Arc::ptr_eq(&own.function, &other.function));
            // Each process's answers are kept for a read-out only.
            assert_eq!(symbolizer.answers().user.len(), if keeping { 2 } else { 0 });
        }
    }

    /// A program with compressed DWARF (`-gz=zlib`) as a file's mapping, and the address of
    /// function `name` in it; with `lie`, its `.debug_info` header claims 1 TiB.
    fn compressed_dwarf_program(dir: &Path, lie: bool, name: &str) -> (ProcessMaps, u64) {
        use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
        let source = dir.join("prog.c");
        std::fs::write(
            &source,
            "__attribute__((noinline)) int compressed_dwarf_fn(int x) { return x * 3; }\n\
                                 int main(int c, char **v) { return compressed_dwarf_fn(c); }\n",
        )
        .unwrap();
        let path = dir.join("prog");
        let built = std::process::Command::new("cc")
            .args(["-O1", "-g", "-gz=zlib", "-o"])
            .arg(&path)
            .arg(&source)
            .status()
            .unwrap();
        assert!(built.success());
        let mut bytes = std::fs::read(&path).unwrap();
        let (offset, address) = {
            let elf = object::File::parse(&*bytes).unwrap();
            let info = elf.section_by_name(".debug_info").unwrap().file_range().unwrap().0 as usize;
            let symbol = elf.symbols().find(|s| s.name() == Ok(name)).unwrap();
            (info, crate::uprobes::elf::file_offset(&elf, &symbol).unwrap())
        };
        if lie {
            bytes[offset + 8..offset + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
            std::fs::write(&path, &bytes).unwrap();
        }
        let key = FileKey::of(&std::fs::metadata(&path).unwrap());
        let mapping = Mapping {
            start: 0x10000,
            end: 0x10000 + bytes.len() as u64,
            file_offset: 0,
            backing: Backing::File { path: path.as_path().into(), open: path.as_path().into(), key },
        };
        (ProcessMaps::from_mappings(vec![mapping]), 0x10000 + address)
    }

    #[test]
    fn a_file_whose_compressed_debug_info_lies_is_named_from_its_symbol_table() {
        let dir = tempfile::tempdir().unwrap();
        // Its DWARF read: the inlined-function names come with it, and no note.
        let (maps, address) = compressed_dwarf_program(dir.path(), false, "compressed_dwarf_fn");
        let mut symbolizer = Symbolizer::new();
        let frames = symbolizer.user(1, 0, Some(&maps), &[address]);
        assert_eq!(&*frames[&address][0].function, "compressed_dwarf_fn");
        assert_eq!(symbolizer.notes(), &[] as &[String]);
        // Claiming 1 TiB: read from its symbol table, said once.
        let (maps, address) = compressed_dwarf_program(dir.path(), true, "compressed_dwarf_fn");
        let mut symbolizer = Symbolizer::new();
        for _ in 0..2 {
            let frames = symbolizer.user(1, 0, Some(&maps), &[address, address + 1]);
            assert_eq!(&*frames[&address][0].function, "compressed_dwarf_fn");
        }
        let path = dir.path().join("prog");
        assert_eq!(symbolizer.notes().len(), 1, "{:?}", symbolizer.notes());
        let note = &symbolizer.notes()[0];
        assert!(
            note.starts_with(&format!(
                "could not read the debug info of {}: its .debug_info claims 1.0 TiB",
                path.display()
            )),
            "{note}"
        );
        assert!(note.ends_with("; its functions are named from its symbol table"), "{note}");
    }

    #[test]
    fn a_file_that_is_not_the_one_mapped_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let (maps, address) = compressed_dwarf_program(dir.path(), false, "compressed_dwarf_fn");
        // Another file at the path, the same bytes; the one mapped is elsewhere (its process
        // holds it, so its inode is not reused).
        let path = dir.path().join("prog");
        std::fs::rename(&path, dir.path().join("prog.mapped")).unwrap();
        std::fs::copy(dir.path().join("prog.mapped"), &path).unwrap();
        let mut symbolizer = Symbolizer::new();
        let frames = symbolizer.user(1, 0, Some(&maps), &[address]);
        assert_eq!(*frames[&address][0].function, *format!("[unknown] prog+{:#x}", address - 0x10000));
        let note = &symbolizer.notes()[0];
        assert!(
            note.starts_with(&format!(
                "{} changed during the trace: another file is there now",
                path.display()
            )),
            "{note}"
        );
        assert!(note.ends_with("so it was not read and its frames show as [unknown] prog+offset"), "{note}");
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
                key: FileKey::default(),
            },
        }]);
        let frames = Symbolizer::new().user(1, 0, Some(&maps), &[0x1234, 0x9000]);
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
        let linked = PerfMap::read(pid, Some(me)).map(|map| map.is_none()).unwrap_err();
        assert!(linked.ends_with("a symbolic link, which sysprof does not follow here"), "{linked}");
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "1000 10 jitted\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            PerfMap::read(pid, Some(me)).unwrap().and_then(|m| m.find(0x1004).map(String::from)).as_deref(),
            Some("jitted")
        );
        // Planted by another user than the process's: as root, give it away; else ask for it
        // as the map of someone else's process.
        let planted = if me == 0 {
            std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
            let read = PerfMap::read(pid, Some(0)).is_err();
            std::os::unix::fs::chown(&path, Some(0), Some(0)).unwrap();
            read
        } else {
            PerfMap::read(pid, Some(me + 1)).is_err()
        };
        assert!(planted, "a map of another user than the process's was read");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let writable = PerfMap::read(pid, Some(me)).is_err();
        std::fs::remove_file(&path).unwrap();
        assert!(writable, "a map anyone can write was read");
    }

    #[test]
    fn a_perf_map_that_is_a_fifo_or_too_large_is_refused_at_once() {
        use std::os::unix::fs::PermissionsExt as _;
        let pid = 4_100_000 + std::process::id() % 100_000;
        let path = PathBuf::from(format!("/tmp/perf-{pid}.map"));
        let me = nix::unistd::geteuid().as_raw();
        let _ = std::fs::remove_file(&path);
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let started = std::time::Instant::now();
        let fifo = PerfMap::read(pid, Some(me)).map(|map| map.is_some());
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "the open of a FIFO blocked");
        std::fs::remove_file(&path).unwrap();
        let fifo = fifo.unwrap_err();
        assert!(
            fifo.ends_with("not a regular file (a FIFO); sysprof reads only regular files here"),
            "{fifo}"
        );
        // Sparse: claims 4 GiB, holds nothing.
        std::fs::File::create(&path).unwrap().set_len(4 << 30).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let large = PerfMap::read(pid, Some(me)).map(|map| map.is_some());
        std::fs::remove_file(&path).unwrap();
        let large = large.unwrap_err();
        assert!(large.ends_with("larger than the 64.0 MiB sysprof reads from such a file"), "{large}");
        assert!(matches!(PerfMap::read(pid, Some(me)), Ok(None)), "no map is no error");
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
