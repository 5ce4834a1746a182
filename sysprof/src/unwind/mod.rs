//! Unwind tables for the BPF unwinder (`sysprof-ebpf/src/unwind.rs`): for every executable
//! mapping of the traced processes, the table of its file (`tables.rs`), built by a worker
//! thread off the collect loop, reused across runs by build id (`cache.rs`), written once per
//! file into the kernel's `UNWIND_ROWS`; then each process's mappings into
//! `PROCESS_MAPPINGS`, from which point its user stacks are walked with them.
//!
//! A process's stacks are taken by frame pointers (by the kernel) until its mappings are
//! written, and a mapping whose table is not ready, did not fit or could not be built is
//! walked by frame pointers. The kernel memory for the tables is fixed at load time
//! (`--unwind-memory`); what did not fit is said in the report.

pub(crate) mod cache;
pub mod tables;

use std::{
    collections::{HashMap, hash_map::DefaultHasher},
    hash::{Hash as _, Hasher as _},
    os::fd::AsFd as _,
    path::PathBuf,
    sync::mpsc,
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use serde::{Deserialize, Serialize};
use sysprof_common::unwind::{
    self as shared, ExecMapping, MAPPINGS_PER_PROCESS, ProcessMappings, ROWS_PER_CHUNK, RowChunk, UnwindRow,
};

use crate::{
    mapped::{FileKey, MappedError},
    probes::Probes,
    procmaps::{Backing, ProcessMaps},
    procs::ProcessTable,
};

/// What the unwinder did, for the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UnwindSummary {
    /// Files whose tables were written into the kernel.
    pub files: usize,
    /// Of those, read from the cache rather than built.
    pub cached: usize,
    pub rows: u64,
    /// Kernel memory the tables took and had (bytes).
    pub bytes: u64,
    pub capacity_bytes: u64,
    /// CPU time spent building tables (not reading them from the cache).
    pub build_s: f64,
    /// Processes whose stacks were walked with tables.
    pub processes: usize,
    /// Files walked by frame pointers instead, each with why.
    pub without_table: Vec<String>,
    /// The Python frames in those stacks.
    #[serde(default)]
    pub python: crate::python::PythonSummary,
}

/// A file's table, once known.
#[derive(Clone, Debug)]
enum FileState {
    /// Asked of the worker.
    Pending,
    /// In the kernel: where its rows are, and what places its addresses (its segments; the
    /// rows themselves are not kept).
    Loaded { first_row: u32, rows: u32, table: std::sync::Arc<tables::Table> },
    /// Walked by frame pointers (no table, or it did not fit).
    Without,
}

/// A file to build a table of: where it is opened, and the file a process mapped there, when
/// one did (see `mapped::open`).
type Request = (PathBuf, Option<FileKey>);

/// A table the worker built or found in the cache.
struct Built {
    open: PathBuf,
    result: anyhow::Result<(tables::Table, bool, Duration)>,
}

/// How long a sync waits for the tables it just asked for (cached ones take a millisecond).
const CACHED_WAIT: Duration = Duration::from_millis(3);

pub struct Unwinder {
    files: HashMap<PathBuf, FileState>,
    /// What each process's entry in `PROCESS_MAPPINGS` was written from.
    written: HashMap<u32, u64>,
    next_chunk: u32,
    capacity_chunks: u32,
    requests: Option<mpsc::Sender<Request>>,
    replies: mpsc::Receiver<Built>,
    worker: Option<std::thread::JoinHandle<()>>,
    /// `ProcessTable::maps_version` at the last look.
    seen_maps: u64,
    summary: UnwindSummary,
    /// Processes left to frame pointers because `PROCESS_MAPPINGS` was full, at most at once.
    processes_full: usize,
    /// Those without an entry for that reason now: tried again on every pass, as exits make room.
    refused: std::collections::BTreeSet<u32>,
    /// sysprof's own executable, as processes' maps name it.
    own_exe: Option<PathBuf>,
    /// Processes with more executable mappings than an entry holds.
    crowded: std::collections::BTreeSet<u32>,
    sysprof_pid: u32,
    /// Passes that wrote or dropped entries (`shared::GENERATION_USERSPACE`).
    generation: u64,
    /// Python frames, walked with the native ones.
    python: crate::python::Python,
}

impl Unwinder {
    /// An unwinder with `capacity_chunks` chunks of rows in the kernel (see `Probes::load`).
    pub fn new(capacity_chunks: u32) -> Self {
        let (requests, inbox) = mpsc::channel::<Request>();
        let (outbox, replies) = mpsc::channel();
        let worker = std::thread::Builder::new()
            .name("sysprof-unwind".into())
            .spawn(move || {
                let cache = cache::Cache::open();
                for (open, key) in inbox {
                    let result = build_one(&open, key, cache.as_ref());
                    if outbox.send(Built { open, result }).is_err() {
                        break;
                    }
                }
            })
            .ok();
        Unwinder {
            files: HashMap::new(),
            written: HashMap::new(),
            next_chunk: 0,
            capacity_chunks,
            requests: Some(requests),
            replies,
            worker,
            seen_maps: 0,
            summary: UnwindSummary {
                capacity_bytes: u64::from(capacity_chunks) * size_of::<RowChunk>() as u64,
                ..UnwindSummary::default()
            },
            processes_full: 0,
            refused: Default::default(),
            crowded: Default::default(),
            own_exe: std::env::current_exe().ok().and_then(|exe| std::fs::canonicalize(exe).ok()),
            sysprof_pid: std::process::id(),
            generation: 0,
            python: crate::python::Python::new(),
        }
    }

    /// Whether this machine's stacks can be unwound with tables at all.
    pub fn supported() -> bool {
        cfg!(target_arch = "x86_64")
    }

    /// Installs the tables that are ready, asks for those of files mapped since the last call,
    /// and rewrites the entries of the processes whose mappings or tables changed. Cheap when
    /// nothing did: called on every tick of the collect loop.
    pub fn sync(&mut self, probes: &mut Probes, processes: &mut ProcessTable) {
        self.sync_native(probes, processes);
        // After the native entries: those are what a new program's first samples need.
        self.python.sync(probes, processes);
    }

    fn sync_native(&mut self, probes: &mut Probes, processes: &ProcessTable) {
        let installed = self.install_ready(probes);
        if !installed && processes.maps_version() == self.seen_maps {
            return;
        }
        // A new table can complete the entry of any process that maps its file (rare: once a
        // file): then every process is looked at again; otherwise the ones that changed.
        let since = if installed { 0 } else { self.seen_maps };
        self.seen_maps = processes.maps_version();
        if self.write_entries(probes, processes, since) > 0 {
            // A cached table comes back within a millisecond: written now, a new program's
            // first samples are whole, not a tick later.
            if self.wait_for_tables(probes, Instant::now() + CACHED_WAIT) {
                self.write_entries(probes, processes, 0);
            }
        }
    }

    /// Whether tables were asked for and are not installed yet: the collect loop keeps its
    /// short tick until they are (see `collect::Cadence`).
    pub fn waiting(&self) -> bool {
        self.files.values().any(|state| matches!(state, FileState::Pending))
    }

    /// Asks for the tables of a program about to be launched: itself, its dynamic loader and
    /// the libraries it needs (as the loader will find them), and the vDSO, so that they are
    /// ready when it execs (see `settle`) and its first milliseconds are unwound too. They are
    /// found as `user`, whom the command runs as: only files they can read.
    pub fn prepare(&mut self, program: &std::path::Path, user: Option<&crate::privileges::InvokingUser>) {
        let needed = crate::uprobes::needed::needed_libraries(program, user);
        let found = crate::privileges::as_user(user, || {
            let mut files = vec![program.to_path_buf()];
            files.extend(interpreter(program));
            files.extend(needed);
            // Named as the process's maps will name it; a script is no code of its own (its
            // interpreter is what will be mapped).
            files
                .into_iter()
                .filter_map(|file| std::fs::canonicalize(&file).ok())
                .filter(|open| is_elf(open))
                .collect()
        });
        for open in found.unwrap_or_else(|_| Vec::new()) {
            self.ask(open);
        }
        self.ask(PathBuf::from(cache::VDSO));
    }

    fn ask(&mut self, open: PathBuf) {
        if !self.files.contains_key(&open)
            && let Some(requests) = &self.requests
            && requests.send((open.clone(), None)).is_ok()
        {
            self.files.insert(open, FileState::Pending);
        }
    }

    /// Waits up to `limit` for the tables asked so far, installing them as they come: a trace
    /// of running processes starts with their stacks whole when the tables are cached.
    pub fn settle(&mut self, probes: &mut Probes, processes: &mut ProcessTable, limit: Duration) {
        let deadline = Instant::now() + limit;
        self.write_entries(probes, processes, 0);
        if self.wait_for_tables(probes, deadline) {
            self.write_entries(probes, processes, 0);
        }
        self.seen_maps = processes.maps_version();
        self.python.sync(probes, processes);
    }

    /// Installs tables as the worker finishes them until none is pending or `deadline`;
    /// whether any was.
    fn wait_for_tables(&mut self, probes: &mut Probes, deadline: Instant) -> bool {
        let mut any = false;
        while self.files.values().any(|state| matches!(state, FileState::Pending)) {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { break };
            match self.replies.recv_timeout(left) {
                Ok(built) => {
                    self.install(probes, built);
                    any = true;
                }
                Err(_) => break,
            }
        }
        any
    }

    /// Writes the entries of the live processes that changed since `version` (see
    /// `ProcessTable::changed_since`), and of those the table had no room for before, where
    /// their mappings or tables changed; drops those of processes that exited. Returns how many
    /// tables it asked the worker for.
    fn write_entries(&mut self, probes: &mut Probes, processes: &ProcessTable, version: u64) -> usize {
        let pending_before = self.files.len();
        if self.write_changed_entries(probes, processes, version) {
            // The kernel's notes of the entries' digests hold no longer (see
            // `shared::TABLES_GENERATION`). Only this counts at this index: a write, not a
            // read and a write.
            self.generation += 1;
            let _ = probes.set(shared::TABLES_GENERATION, shared::GENERATION_USERSPACE, self.generation);
        }
        self.processes_full = self.processes_full.max(self.refused.len());
        self.summary.processes = self.summary.processes.max(self.written.len());
        self.files.len() - pending_before
    }

    /// `write_entries`' writes and removals; whether it made any.
    fn write_changed_entries(&mut self, probes: &mut Probes, processes: &ProcessTable, version: u64) -> bool {
        let mut changed = false;
        let Ok(map) = probes.map_mut(shared::PROCESS_MAPPINGS) else { return false };
        let Ok(mut entries) = BpfHashMap::<&mut MapData, u32, ProcessMappings>::try_from(map) else {
            return false;
        };
        for (pid, record) in processes.changed_since_or(version, self.refused.clone()) {
            if pid == self.sysprof_pid {
                continue;
            }
            if record.exited {
                self.refused.remove(&pid);
                if self.written.remove(&pid).is_some() {
                    changed |= entries.remove(&pid).is_ok();
                }
                continue;
            }
            let Some(maps) = &record.maps else { continue };
            // A fork of sysprof's own (a command at its gate, before its exec) runs sysprof's
            // code for no sample's sake: an entry would have the table of sysprof's own binary
            // built, for nothing.
            if self.own_exe.as_ref().is_some_and(|own| {
                maps.mappings()
                    .iter()
                    .any(|m| matches!(&m.backing, Backing::File { path, .. } if **path == **own))
            }) {
                continue;
            }
            if maps.mappings().len() > MAPPINGS_PER_PROCESS {
                self.crowded.insert(pid);
            }
            let entry = entry_for(&mut self.files, self.requests.as_ref(), maps);
            let signature = signature(&entry);
            if self.written.get(&pid) == Some(&signature) {
                continue;
            }
            if entries.insert(&pid, entry.as_ref(), 0).is_ok() {
                self.written.insert(pid, signature);
                self.refused.remove(&pid);
                changed = true;
            } else {
                self.refused.insert(pid);
            }
        }
        changed
    }

    /// What the unwinder did; stops the worker.
    pub fn finish(mut self) -> UnwindSummary {
        self.requests = None;
        self.summary.python = std::mem::take(&mut self.python).finish();
        if let Some(worker) = self.worker.take() {
            // The worker ends after the file it is on: its queue is dropped.
            drop(worker);
        }
        if self.processes_full > 0 {
            self.summary.without_table.push(format!(
                "{} beyond the {} that the kernel's table holds",
                crate::report::format::count(self.processes_full as u64, "process", "processes"),
                shared::PROCESSES
            ));
        }
        if !self.crowded.is_empty() {
            self.summary.without_table.push(format!(
                "the executable mappings past the first {MAPPINGS_PER_PROCESS} of {} process{} (by address)",
                self.crowded.len(),
                if self.crowded.len() == 1 { "" } else { "es" }
            ));
        }
        self.summary
    }

    /// The tables the worker finished since the last look; whether any was.
    fn install_ready(&mut self, probes: &mut Probes) -> bool {
        let mut any = false;
        while let Ok(built) = self.replies.try_recv() {
            self.install(probes, built);
            any = true;
        }
        any
    }

    fn install(&mut self, probes: &mut Probes, built: Built) {
        let name = built.open.display().to_string();
        let state = match built.result {
            Ok((table, cached, took)) if !table.rows.is_empty() => {
                if !cached {
                    self.summary.build_s += took.as_secs_f64();
                }
                match self.write_rows(probes, &table.rows) {
                    Ok(first_row) => {
                        self.summary.files += 1;
                        self.summary.cached += usize::from(cached);
                        self.summary.rows += table.rows.len() as u64;
                        let rows = table.rows.len() as u32;
                        // The rows are in the kernel now; what places the file's addresses is all
                        // that is needed of them (`--all` builds megabytes of rows).
                        let placement = tables::Table { rows: Vec::new(), segments: table.segments };
                        FileState::Loaded { first_row, rows, table: placement.into() }
                    }
                    Err(why) => {
                        self.summary.without_table.push(format!("{name}: {why}"));
                        FileState::Without
                    }
                }
            }
            Ok(_) => FileState::Without,
            Err(error) => {
                self.summary.without_table.push(format!("{name}: {error:#}"));
                FileState::Without
            }
        };
        self.files.insert(built.open, state);
    }

    /// Writes a table's rows at the next free chunk; returns its first row's index.
    fn write_rows(&mut self, probes: &mut Probes, rows: &[UnwindRow]) -> Result<u32, String> {
        let chunks = rows.len().div_ceil(ROWS_PER_CHUNK) as u32;
        if self.next_chunk + chunks > self.capacity_chunks {
            return Err(format!(
                "its table ({}, {}) did not fit in what is left of --unwind-memory (raise it)",
                crate::report::format::count(rows.len() as u64, "row", "rows"),
                crate::report::format::bytes(size_of_val(rows) as u64)
            ));
        }
        let aya::maps::Map::Array(map) = probes.map_mut(shared::ROWS).map_err(|e| e.to_string())? else {
            return Err(format!("{} is not an array", shared::ROWS));
        };
        let first = self.next_chunk;
        // SAFETY: `UnwindRow` is plain data without padding (12 bytes of fields, checked in
        // common), so its bytes are initialized.
        let bytes = unsafe { std::slice::from_raw_parts(rows.as_ptr().cast::<u8>(), size_of_val(rows)) };
        // A table's chunks are contiguous in the array, and so are its rows: the last chunk's
        // tail stays as the map was made, zero.
        write_mapped(map.fd().as_fd(), first as usize * size_of::<RowChunk>(), bytes)
            .map_err(|e| format!("writing its table: {e}"))?;
        self.next_chunk += chunks;
        self.summary.bytes = u64::from(self.next_chunk) * size_of::<RowChunk>() as u64;
        Ok(first * ROWS_PER_CHUNK as u32)
    }
}

/// How much of `UNWIND_ROWS` is mapped at once: what writing a table adds to sysprof's
/// resident memory at most.
const WRITE_WINDOW: usize = 256 << 10;

/// Copies `bytes` to `offset` in a memory-mappable array's values, through a shared mapping of
/// it a window at a time: a few system calls a table, where a map update per chunk was one per
/// 256 rows (1,600 for a compiler's table), and every call sysprof makes during a trace also
/// runs its own syscall programs. Nothing reads the rows before the process entries that point
/// at them are written, by a system call, after.
fn write_mapped(fd: std::os::fd::BorrowedFd<'_>, offset: usize, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    for (index, part) in bytes.chunks(WRITE_WINDOW).enumerate() {
        // SAFETY: a fresh shared mapping of the map's own memory, within its size (the caller's
        // capacity check); nothing else in this process aliases it, and it is unmapped when
        // dropped, below. memmap2 aligns the offset down to a page itself.
        let mut window = unsafe {
            memmap2::MmapOptions::new()
                .offset((offset + index * WRITE_WINDOW) as u64)
                .len(part.len())
                .map_mut(fd.as_raw_fd())?
        };
        window.copy_from_slice(part);
    }
    Ok(())
}

/// A process's entry: each mapping with its file's table where it is loaded (asking the
/// worker for it where it was never asked), frame pointers elsewhere.
fn entry_for(
    files: &mut HashMap<PathBuf, FileState>,
    requests: Option<&mpsc::Sender<Request>>,
    maps: &ProcessMaps,
) -> Box<ProcessMappings> {
    let mappings = maps.mappings();
    let mut entry = Box::new(ProcessMappings {
        count: 0,
        digest: 0,
        // The address space the maps were read from, which the kernel side checks: a child's
        // inherited maps are its parent's until it execs, and an entry written from them after
        // it did is then no entry (the kernel's frame pointers), not the parent's tables
        // walking the new program.
        vdso: maps.vdso(),
        mappings: [ExecMapping::default(); MAPPINGS_PER_PROCESS],
    });
    for (slot, mapping) in entry.mappings.iter_mut().zip(mappings) {
        *slot = ExecMapping { start: mapping.start, end: mapping.end, ..ExecMapping::default() };
        let (open, key) = match &mapping.backing {
            Backing::File { open, key, .. } => (open.to_path_buf(), Some(*key)),
            Backing::Vdso => (PathBuf::from(cache::VDSO), None),
            _ => continue,
        };
        match files.get(&open) {
            Some(FileState::Loaded { first_row, rows, table }) => {
                if let Some(bias) = table.bias(mapping.start, mapping.file_offset) {
                    (slot.first_row, slot.rows, slot.bias) = (*first_row, *rows, bias);
                }
            }
            Some(_) => {}
            None => {
                if let Some(requests) = requests
                    && requests.send((open.clone(), key)).is_ok()
                {
                    files.insert(open, FileState::Pending);
                }
            }
        }
    }
    entry.count = mappings.len().min(MAPPINGS_PER_PROCESS) as u32;
    entry.digest = digest(&entry.mappings[..entry.count as usize]);
    entry
}

/// FNV-1a over the mappings' fields, never 0 (which the kernel side reads as "no entry").
fn digest(mappings: &[ExecMapping]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for mapping in mappings {
        for word in
            [mapping.start, mapping.end, u64::from(mapping.first_row), u64::from(mapping.rows), mapping.bias]
        {
            for byte in word.to_le_bytes() {
                hash = (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193);
            }
        }
    }
    hash.max(1)
}

/// Whether `path` is a regular file that starts as an ELF file does (opened without blocking:
/// a FIFO put in a library's place would block an open for good).
fn is_elf(path: &std::path::Path) -> bool {
    use std::io::Read as _;
    let mut magic = [0u8; 4];
    crate::input::open_regular(path, crate::input::Links::Follow)
        .is_ok_and(|mut file| file.read_exact(&mut magic).is_ok())
        && magic == *b"\x7fELF"
}

/// The dynamic loader a program names (PT_INTERP), if it is an ELF file that names one. Its
/// headers alone are read, not the whole program (which may be any size, or claim any size).
fn interpreter(program: &std::path::Path) -> Option<PathBuf> {
    use object::read::elf::{FileHeader as _, ProgramHeader as _};
    let file = crate::input::open_regular(program, crate::input::Links::Follow).ok()?;
    let data = crate::mapped::Bounded::new(&file, 1 << 20);
    let header = object::elf::FileHeader64::<object::Endianness>::parse(&data).ok()?;
    let endian = header.endian().ok()?;
    let headers = header.program_headers(endian, &data).ok()?;
    let interp = headers.iter().find(|h| h.p_type(endian) == object::elf::PT_INTERP)?;
    let bytes = interp.data(endian, &data).ok()?;
    let path = bytes.split(|&b| b == 0).next()?;
    Some(PathBuf::from(std::str::from_utf8(path).ok()?))
}

/// What an entry was written from: its mappings and their tables.
fn signature(entry: &ProcessMappings) -> u64 {
    let mut hasher = DefaultHasher::new();
    entry.vdso.hash(&mut hasher);
    for mapping in &entry.mappings[..entry.count as usize] {
        (mapping.start, mapping.end, mapping.bias, mapping.first_row, mapping.rows).hash(&mut hasher);
    }
    hasher.finish()
}

/// What `sysprof tables` prints for one file.
#[derive(Debug, Serialize)]
struct TableFigures {
    file: String,
    rows: usize,
    /// Kernel memory its rows take (whole chunks).
    bytes: u64,
    /// Reading the file's inputs, hashing them and building the table.
    build_ms: f64,
    /// Of which hashing the inputs (SHA-256), what a trace pays for a cached table too.
    hash_ms: f64,
    /// Reading the inputs and hashing them, then reading the table from the cache: what a
    /// trace pays for a cached table.
    cached_read_ms: f64,
    /// Of which reading the entry (its checksum and rows checked).
    entry_read_ms: f64,
    /// Where the cache keeps the table, when there is a cache.
    cache_entry: Option<String>,
    /// With --verify: what the cached table was ("matches", "missing", "differed: removed",
    /// "unusable (...): removed").
    #[serde(skip_serializing_if = "Option::is_none")]
    verified: Option<String>,
}

/// `sysprof tables [--verify] FILE...`: each file's table built (without the cache), then read
/// back from the cache (written first if it was not there); with `verify`, the cached table
/// compared with the one built, and removed where it differs. Through sudo each file is opened
/// as the user who ran it. Exits 1 when a cached table was wrong.
pub fn describe_tables(files: &[PathBuf], json: bool, verify: bool) -> anyhow::Result<u8> {
    use anyhow::Context as _;
    let user = crate::privileges::InvokingUser::from_sudo_env();
    let cache = cache::Cache::open();
    if verify && cache.is_none() {
        anyhow::bail!(
            "--verify: there is no unwind cache to verify (sysprof found none it could use safely: its \
             directory and those above it must be the user's and writable by no one else)"
        );
    }
    let mut figures = Vec::new();
    let mut wrong = 0;
    for file in files {
        let source = open_named(file, user.as_ref())?;
        let started = Instant::now();
        let inputs = tables::Inputs::read(source.bytes())
            .with_context(|| format!("building the table of {}", file.display()))?;
        let hashed = Instant::now();
        let key = inputs.key();
        let hash_ms = hashed.elapsed().as_secs_f64() * 1e3;
        let table = tables::build_from(&inputs)
            .with_context(|| format!("building the table of {}", file.display()))?;
        let build_ms = started.elapsed().as_secs_f64() * 1e3;
        drop(inputs);
        let mut verified = None;
        let mut entry_read_ms = f64::NAN;
        let cached_read_ms = match &cache {
            Some(cache) => {
                if verify {
                    let (said, bad) = verify_entry(cache, &key, &table);
                    wrong += usize::from(bad);
                    verified = Some(said);
                } else if cache.get(&key).is_none() {
                    cache.put(&key, &table);
                }
                // As a trace reads it: the file's inputs, their hash, the entry.
                let started = Instant::now();
                let again = tables::Inputs::read(source.bytes())?;
                let key = again.key();
                let entry = Instant::now();
                let _ = cache.get(&key);
                entry_read_ms = entry.elapsed().as_secs_f64() * 1e3;
                started.elapsed().as_secs_f64() * 1e3
            }
            None => f64::NAN,
        };
        figures.push(TableFigures {
            file: file.display().to_string(),
            rows: table.rows.len(),
            bytes: (table.rows.len().div_ceil(ROWS_PER_CHUNK) * size_of::<RowChunk>()) as u64,
            build_ms,
            hash_ms,
            cached_read_ms,
            entry_read_ms,
            cache_entry: cache.as_ref().map(|cache| cache.path(&key).display().to_string()),
            verified,
        });
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&figures)?);
    } else {
        for f in &figures {
            match &f.verified {
                Some(verified) => println!("{}: the cached table {verified}", f.file),
                None => println!(
                    "{}: {}, {} of kernel memory; built in {:.1} ms (hashing {:.1} ms of it), read from the \
                     cache in {:.1} ms (the entry {:.1} ms of it)",
                    f.file,
                    crate::report::format::count(f.rows as u64, "row", "rows"),
                    crate::report::format::bytes(f.bytes),
                    f.build_ms,
                    f.hash_ms,
                    f.cached_read_ms,
                    f.entry_read_ms
                ),
            }
        }
    }
    Ok(if wrong > 0 { 1 } else { 0 })
}

/// A file named on the command line, opened as `user` where there is one (through sudo, root
/// opens nothing for them that they could not), only if it is a regular file, without
/// blocking on a FIFO.
fn open_named(
    file: &std::path::Path,
    user: Option<&crate::privileges::InvokingUser>,
) -> anyhow::Result<cache::Source> {
    use anyhow::Context as _;

    use crate::input::{InputError, Links, open_regular};
    if file == std::path::Path::new(cache::VDSO) {
        return cache::Source::open(file, None);
    }
    let opened = crate::privileges::as_user(user, || open_regular(file, Links::Follow))
        .with_context(|| format!("opening {}", file.display()))?;
    let opened = match (opened, user) {
        (Ok(opened), _) => opened,
        (Err(InputError::Io { source, .. }), Some(user))
            if source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            return Err(crate::error::Error::NotReadableByUser {
                path: file.to_path_buf(),
                user: user.name.clone(),
            }
            .into());
        }
        (Err(error), _) => return Err(error.into()),
    };
    cache::Source::stable(opened, file)
}

/// Compares the cached table named `key` with `built`, the table of the file it names;
/// removes it when it differs or cannot be read. What it found, and whether it was wrong.
fn verify_entry(cache: &cache::Cache, key: &cache::Key, built: &tables::Table) -> (String, bool) {
    let path = cache.path(key);
    let (what, bad) = match cache.lookup(key) {
        cache::Lookup::Missing => {
            return (format!("is missing ({}): nothing to verify", path.display()), false);
        }
        cache::Lookup::Found(cached) if cached == *built => {
            return (format!("matches its file ({})", path.display()), false);
        }
        cache::Lookup::Found(_) => ("differed from the one built from the file", true),
        cache::Lookup::Unusable(why) => {
            return (removed(cache, key, &path, &format!("was unusable ({why})")), true);
        }
    };
    (removed(cache, key, &path, what), bad)
}

fn removed(cache: &cache::Cache, key: &cache::Key, path: &std::path::Path, what: &str) -> String {
    match cache.remove(key) {
        Ok(()) => format!("{what}: removed {}", path.display()),
        Err(error) => format!("{what}: could not remove {}: {error}", path.display()),
    }
}

/// A file's table, from the cache or built (and then cached); whether it was cached, and how
/// long it took.
fn build_one(
    open: &std::path::Path,
    key: Option<FileKey>,
    cache: Option<&cache::Cache>,
) -> anyhow::Result<(tables::Table, bool, Duration)> {
    let started = Instant::now();
    let source = cache::Source::open(open, key).map_err(|error| match error.downcast::<MappedError>() {
        // The symbolizer says the file changed; said here as what it cost the stacks.
        Ok(MappedError::Changed { .. }) => anyhow::anyhow!("it is not the file the process mapped any more"),
        Ok(error) => error.into(),
        Err(error) => error,
    })?;
    // Copied out of the file, hashed and built from: the table is the one its name says even
    // if the file changes meanwhile.
    let inputs = tables::Inputs::read(source.bytes())?;
    drop(source);
    let name = cache.map(|_| inputs.key());
    if let (Some(cache), Some(name)) = (cache, &name)
        && let Some(table) = cache.get(name)
    {
        return Ok((table, true, started.elapsed()));
    }
    let table = tables::build_from(&inputs)?;
    if let (Some(cache), Some(name)) = (cache, &name) {
        cache.put(name, &table);
    }
    Ok((table, false, started.elapsed()))
}
