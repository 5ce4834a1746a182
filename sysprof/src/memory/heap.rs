//! `--malloc`: uprobes on the allocator the target uses (glibc, jemalloc, tcmalloc, mimalloc,
//! or one linked into the executable), found in its memory maps and picked up when a process,
//! program or library appears later. The programs (sysprof-ebpf `memory.rs`) count in the
//! kernel.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
};

use serde::Serialize;
use sysprof_common::alloc;

use crate::{
    privileges::InvokingUser,
    probes::Probes,
    procmaps::Backing,
    procs::ProcessTable,
    uprobes::{self, Binary, CallProbes, calibrate, elf, needed},
};

/// The allocating functions and what the kernel side reads of their arguments (the cookie).
/// valloc and pvalloc are left out: obsolete and rare, and every probe costs a kernel grace
/// period (~0.1 s) to remove at the end.
const ALLOCATING: [(&str, u64); 6] = [
    ("malloc", alloc::MALLOC),
    ("calloc", alloc::CALLOC),
    ("realloc", alloc::REALLOC),
    ("aligned_alloc", alloc::ALIGNED),
    ("memalign", alloc::ALIGNED),
    ("posix_memalign", alloc::POSIX_MEMALIGN),
];
const FREEING: &str = "free";

const ALLOC_PROGRAMS: [&str; 2] = ["alloc_return", "alloc_enter"];
const FREE_PROGRAM: &str = "free_enter";

/// Allocator libraries, by file-name prefix, and what to call them.
const ALLOCATORS: [(&str, &str); 6] = [
    ("libc.so", "glibc"),
    ("libc.musl", "musl"),
    ("libjemalloc.so", "jemalloc"),
    ("libtcmalloc", "tcmalloc"),
    ("libmimalloc.so", "mimalloc"),
    ("libmimalloc-", "mimalloc"),
];

/// One allocator file with probes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ProbedAllocator {
    pub allocator: String,
    pub path: PathBuf,
    /// The functions probed in it.
    pub functions: Vec<String>,
    /// Whether its malloc and free are probed at an instruction the kernel steps out of line.
    #[serde(default)]
    pub entry_stepped: EntriesStepped,
}

/// Whether an allocator's malloc and free are probed at an instruction the kernel steps out
/// of line, a second trap at each call (`uprobes::entry_point`; `None` where it cannot tell, or
/// the function is not probed): what their probes cost depends on it. glibc's malloc begins
/// with a push, which the kernel emulates, and its free with a test, which it would step: free
/// is probed at the conditional jump after it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct EntriesStepped {
    pub malloc: Option<bool>,
    pub free: Option<bool>,
}

/// Finds the allocators the target uses and keeps them probed.
///
/// A uprobe puts a breakpoint in every process that maps the file, and libc is mapped by every
/// process on the machine: attached for all processes, each malloc anywhere would trap into the
/// kernel. So the probes are attached per target process (only its memory gets the breakpoints;
/// they survive exec) and detached when it exits, except in system-wide traces.
#[derive(Debug)]
pub struct HeapTracer {
    system_wide: bool,
    probes: CallProbes,
    /// Files already looked at: (pid, file identity) per target process, pid 0 system-wide.
    /// By identity: /lib/libc.so.6 and /usr/lib/libc.so.6 are one file, probed once.
    done: HashSet<(u32, (u64, u64))>,
    /// Target processes with probes of their own, detached when they exit.
    attached_pids: HashSet<u32>,
    /// Target processes given probes so far (exited ones included).
    probed_processes: usize,
    pub allocators: Vec<ProbedAllocator>,
    /// The identity of each file in `allocators`.
    allocator_files: HashSet<(u64, u64)>,
    pub problems: Vec<String>,
}

impl HeapTracer {
    pub fn new(system_wide: bool) -> Self {
        HeapTracer {
            system_wide,
            probes: CallProbes::default(),
            done: HashSet::new(),
            attached_pids: HashSet::new(),
            probed_processes: 0,
            allocators: Vec::new(),
            allocator_files: HashSet::new(),
            problems: Vec::new(),
        }
    }

    /// Probes the allocators each live target process whose maps changed since `version` has
    /// mapped, where not done yet (see `ProcessTable::changed_since`).
    pub fn attach_new(&mut self, probes: &mut Probes, processes: &ProcessTable, version: u64) {
        let mut found: Vec<(u32, &'static str, Binary)> = Vec::new();
        for (pid, record) in processes.changed_since(version).filter(|(_, record)| !record.exited) {
            let Some(maps) = &record.maps else { continue };
            for mapping in maps.mappings() {
                let Backing::File { open, key, .. } = &mapping.backing else { continue };
                let Some(file) = uprobes::file_id(open) else { continue };
                if self.done.contains(&(self.scope_pid(pid), file)) {
                    continue;
                }
                let allocator = allocator_of(open);
                let candidate = allocator.is_some() || (mapping.file_offset == 0 && !is_shared_library(open));
                let opened = candidate.then(|| Binary::mapped(open, *key).ok()).flatten();
                match (allocator, opened) {
                    (Some(allocator), Some(opened)) => found.push((pid, allocator, opened)),
                    // A program with its own allocator linked in (static binaries, jemalloc
                    // built into a server).
                    (None, Some(opened))
                        if self.probes.exports(&opened).is_ok_and(|e| e.contains_key("malloc")) =>
                    {
                        found.push((pid, LINKED_IN, opened))
                    }
                    // Not an allocator: never looked at again.
                    _ => {
                        self.done.insert((self.scope_pid(pid), file));
                    }
                }
            }
        }
        for (pid, allocator, file) in found {
            self.attach(probes, pid, allocator, &file);
        }
    }

    /// Probes the allocator a launched program (`pid`, still at its gate) will load, before it
    /// runs: found and opened as `user`, whom the command runs as.
    pub fn attach_needed(
        &mut self,
        probes: &mut Probes,
        pid: u32,
        program: &Path,
        user: Option<&InvokingUser>,
    ) {
        for path in needed::needed_libraries(program, user) {
            if let Some(allocator) = allocator_of(&path)
                && let Ok(file) = Binary::open(&path, user)
            {
                self.attach(probes, pid, allocator, &file);
            }
        }
        if !is_shared_library(program)
            && let Ok(file) = Binary::open(program, user)
            && defines_malloc(&file)
        {
            self.attach(probes, pid, LINKED_IN, &file);
        }
    }

    /// Detaches the probes of target processes that exited.
    pub fn release_exited(&mut self, probes: &mut Probes, processes: &ProcessTable) {
        self.attached_pids.retain(|&pid| {
            // Only an exit seen: a launched command is probed before the table knows it.
            let exited = processes.get(pid).is_some_and(|record| record.exited);
            if exited {
                probes.detach_process_uprobes(pid);
            }
            !exited
        });
    }

    /// 0 stands for every process in system-wide traces.
    fn scope_pid(&self, pid: u32) -> u32 {
        if self.system_wide { 0 } else { pid }
    }

    fn attach(&mut self, probes: &mut Probes, pid: u32, allocator: &'static str, binary: &Binary) {
        let Some(file) = binary.id() else { return };
        let path = binary.shown();
        if !self.done.insert((self.scope_pid(pid), file)) {
            return;
        }
        if !self.system_wide && !self.attached_pids.contains(&pid) {
            if self.probed_processes == MAX_PROCESSES {
                self.problems.push(format!(
                    "--malloc: the heap of target processes beyond the first {MAX_PROCESSES} is not traced \
                     (each process's probes take a fraction of a second to remove, one after another)"
                ));
            }
            self.probed_processes += 1;
            if self.probed_processes > MAX_PROCESSES {
                return;
            }
        }
        let owner = (!self.system_wide).then_some(pid);
        match attach_allocator(&mut self.probes, probes, binary, owner) {
            Ok((functions, ..)) if functions.is_empty() => {}
            Ok((functions, allocating, entry_stepped)) => {
                let whom = if self.system_wide { "every process" } else { "each target process" };
                let (enter, leave) = (
                    probes.uprobe_program("alloc_enter", owner),
                    probes.uprobe_program("alloc_return", owner),
                );
                probes.note_uprobes(
                    &[(enter, "uprobe"), (leave, "uretprobe")],
                    &format!(
                        "{allocator} allocator {} ({}), in {whom}",
                        path.display(),
                        functions.join(", ")
                    ),
                    allocating,
                );
                if functions.iter().any(|f| f == FREEING) {
                    probes.note_uprobes(
                        &[(probes.uprobe_program(FREE_PROGRAM, owner), "uprobe")],
                        &format!("free in {}, in {whom}", path.display()),
                        1,
                    );
                }
                if let Some(pid) = owner {
                    self.attached_pids.insert(pid);
                }
                if self.allocator_files.insert(file) {
                    self.allocators.push(ProbedAllocator {
                        allocator: allocator.to_string(),
                        path: path.to_path_buf(),
                        functions,
                        entry_stepped,
                    });
                }
            }
            Err(error) => self.problems.push(format!("--malloc: {}: {error:#}", path.display())),
        }
    }
}

/// Target processes whose heap is traced: removing a process's probes takes the kernel 0.3 s
/// (three multi-uprobe links: the allocating functions' entries and returns, and free; a
/// second with a link per function, before Linux 6.10), which a fork-heavy target would
/// multiply.
const MAX_PROCESSES: usize = 32;

/// What the report calls an allocator linked into the program itself.
const LINKED_IN: &str = "linked into the program";

/// Attaches the heap programs to every allocator function `path` defines, for process `pid`
/// (`None`: every process); returns the functions' names, how many links each of the
/// allocation programs got (see `Probes::attach_functions`), and how malloc and free begin.
fn attach_allocator(
    known: &mut CallProbes,
    probes: &mut Probes,
    file: &Binary,
    pid: Option<u32>,
) -> anyhow::Result<(Vec<String>, u32, EntriesStepped)> {
    let exports = known.exports(file)?;
    let path = file.path();
    let mut functions = Vec::new();
    // Aliases (memalign and aligned_alloc in some glibc versions) share an address: one probe.
    let mut offsets: HashMap<u64, &str> = HashMap::new();
    let mut points = Vec::new();
    // Each probe where it costs least (past a CET build's endbr64, or free's test of its
    // argument: `uprobes::entry_point`).
    let entry = |name: &str| {
        exports.get(name).map(|&offset| uprobes::entry_point(path, offset, exports.size_at(offset), true))
    };
    let stepped = |entry: uprobes::EntryPoint| entry.emulated.map(|emulated| !emulated);
    let mut entry_stepped = EntriesStepped::default();
    for (name, kind) in ALLOCATING {
        let Some(entry) = entry(name) else { continue };
        if offsets.insert(entry.offset, name).is_some() {
            continue;
        }
        if name == "malloc" {
            entry_stepped.malloc = stepped(entry);
        }
        points.push((entry.offset, kind));
        functions.push(name.to_string());
    }
    let links = probes.attach_functions(&ALLOC_PROGRAMS, file, &points, pid)?;
    if let Some(free) = entry(FREEING) {
        probes.attach_functions(&[FREE_PROGRAM], file, &[(free.offset, 0)], pid)?;
        functions.push(FREEING.to_string());
        entry_stepped.free = stepped(free);
    }
    Ok((functions, links, entry_stepped))
}

/// What an allocator call costs more under the heap probes than a bare one, by how it is
/// probed: an allocation at its entry and return, a free at its entry.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeapProbeCost {
    pub allocation_ns: f64,
    /// None when no free was probed.
    pub free_ns: Option<f64>,
}

/// [`HeapProbeCost`], measured on sysprof's calibration functions probed as the `allocators`'
/// malloc and free are, each beginning as theirs does (`calibrate::HeapShape`). Where the
/// allocators differ, the costlier: stepped, as no allocator is cheaper than that.
pub fn measure_probe_cost(
    probes: &mut Probes,
    allocators: &[ProbedAllocator],
) -> anyhow::Result<HeapProbeCost> {
    let stepped = |of: fn(&EntriesStepped) -> Option<bool>| {
        allocators.iter().any(|allocator| of(&allocator.entry_stepped) == Some(true))
    };
    let allocation = calibrate::HeapShape { entry_only: false, stepped: stepped(|e| e.malloc) };
    let allocation_ns =
        calibrate::measure_heap_probe_cost(probes, allocation, |probes, exe, symbol, offset| {
            let links = probes.attach_functions(&ALLOC_PROGRAMS, exe, &[(offset, alloc::MALLOC)], None)?;
            let (enter, leave) =
                (probes.uprobe_program("alloc_enter", None), probes.uprobe_program("alloc_return", None));
            probes.note_uprobes(
                &[(enter, "uprobe"), (leave, "uretprobe")],
                &format!("sysprof's own {symbol} (measures the cost of an allocation's probes)"),
                links,
            );
            Ok(())
        })?;
    let frees = allocators.iter().any(|allocator| allocator.functions.iter().any(|f| f == FREEING));
    let free = calibrate::HeapShape { entry_only: true, stepped: stepped(|e| e.free) };
    let free_ns = frees
        .then(|| {
            calibrate::measure_heap_probe_cost(probes, free, |probes, exe, symbol, offset| {
                let links = probes.attach_functions(&[FREE_PROGRAM], exe, &[(offset, 0)], None)?;
                probes.note_uprobes(
                    &[(probes.uprobe_program(FREE_PROGRAM, None), "uprobe")],
                    &format!("sysprof's own {symbol} (measures the cost of a free's probe)"),
                    links,
                );
                Ok(())
            })
        })
        .transpose()?;
    Ok(HeapProbeCost { allocation_ns, free_ns })
}

/// Which allocator a library is, by its file name.
fn allocator_of(path: &Path) -> Option<&'static str> {
    let name = path.file_name()?.to_str()?;
    ALLOCATORS.iter().find(|(prefix, _)| name.starts_with(prefix)).map(|(_, allocator)| *allocator)
}

fn is_shared_library(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.contains(".so"))
}

/// Whether an executable (not a shared library) defines malloc itself.
fn defines_malloc(file: &Binary) -> bool {
    !is_shared_library(file.shown())
        && file
            .reopen()
            .ok()
            .and_then(|opened| elf::exports_of(opened, file.shown()).ok())
            .is_some_and(|exports| exports.contains_key("malloc"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocators_are_known_by_name() {
        assert_eq!(allocator_of(Path::new("/lib/x86_64-linux-gnu/libc.so.6")), Some("glibc"));
        assert_eq!(allocator_of(Path::new("/usr/lib/libjemalloc.so.2")), Some("jemalloc"));
        assert_eq!(allocator_of(Path::new("/usr/lib/libtcmalloc_minimal.so.4")), Some("tcmalloc"));
        assert_eq!(allocator_of(Path::new("/usr/lib/libmimalloc.so.2")), Some("mimalloc"));
        assert_eq!(allocator_of(Path::new("/usr/lib/libcrypt.so.1")), None);
        assert_eq!(allocator_of(Path::new("/usr/lib/libcap.so.2")), None);
    }

    #[test]
    fn a_program_using_libc_malloc_does_not_define_it() {
        // This test binary allocates through libc's malloc, which it imports.
        let exe = Binary::open(&std::env::current_exe().unwrap(), None).unwrap();
        assert!(!defines_malloc(&exe));
    }
}
