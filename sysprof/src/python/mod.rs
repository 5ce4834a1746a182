//! Python frames in every stack of a CPython process (3.10 to 3.13), with no restart.
//!
//! - `layout`: which CPython a mapped file is and the layout of its structs;
//! - this stage tells the BPF walker (`sysprof-ebpf/src/python.rs`) about each process whose
//!   mappings hold an interpreter, and reads the code objects of each new stack it reports,
//!   while the process still has them (`code`);
//! - `merge`, called by the aggregate stage, puts each call of the evaluation function's
//!   Python frames in the place of its native frame;
//! - `functions`: the view the CPU advice reads, by Python function with the interpreter's
//!   work under it folded in.

pub mod code;
mod functions;
pub(crate) mod layout;
mod merge;

use std::{
    collections::{BTreeSet, HashMap},
    path::PathBuf,
};

use aya::maps::{Array, HashMap as BpfHashMap, MapData};
pub use code::{Code, ProcessCode};
pub use functions::by_function;
pub use layout::{Interpreter, is_interpreter_file};
pub use merge::{PythonFrames, is_python_frame, merge};
use sysprof_common::python::{ANY_PROCESS, FRAME_CODE_MASK, FRAME_PYTHON, PROCESSES, PythonProcess};

use crate::{
    probes::Probes,
    procmaps::{Backing, ProcessMaps},
    procs::ProcessTable,
};

/// What the stage found, for the report.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PythonSummary {
    /// Processes whose Python frames were walked, by version ("3.12").
    pub processes: std::collections::BTreeMap<String, usize>,
    /// Interpreters found but not walked, each with why (an unsupported version).
    pub unsupported: Vec<String>,
    /// Processes beyond the kernel's table of CPython processes.
    pub processes_full: std::collections::BTreeSet<u32>,
    /// Code objects read, and frames whose code object was gone when read.
    pub code_objects: usize,
    pub unreadable: usize,
}

impl PythonSummary {
    /// Whether any target ran CPython.
    pub fn any(&self) -> bool {
        !self.processes.is_empty() || !self.unsupported.is_empty()
    }

    /// What the report's limitations say of Python frames.
    pub fn limitations(&self) -> Vec<String> {
        let mut lines: Vec<String> =
            self.unsupported.iter().map(|line| format!("Python frames not walked in {line}")).collect();
        if !self.processes_full.is_empty() {
            lines.push(format!(
                "Python frames not walked in {} CPython processes beyond the {} the kernel's table holds",
                self.processes_full.len(),
                sysprof_common::python::MAX_PROCESSES
            ));
        }
        if self.unreadable > 0 {
            lines.push(format!(
                "{} Python frames ran code objects gone by the time sysprof read them (freed within \
                 milliseconds, or in a process that exited): they read [unknown Python function]",
                self.unreadable
            ));
        }
        lines
    }
}

/// A process whose frames the kernel walks.
struct Target {
    /// Its interpreter's file (a key of `files`).
    file: PathBuf,
    /// `PyCode_Type`'s address in the process.
    code_type: u64,
    /// The process's exec count when written: an exec drops the kernel's entry.
    execs: u32,
}

#[derive(Default)]
pub struct Python {
    /// Each file looked at: its interpreter, if it has one sysprof reads.
    files: HashMap<PathBuf, Option<Interpreter>>,
    /// The processes written into the kernel's table.
    written: HashMap<u32, Target>,
    /// `ProcessTable::maps_version` at the last look.
    seen_maps: u64,
    summary: PythonSummary,
}

impl Python {
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes the entries of processes that mapped an interpreter since the last call, drops
    /// those of processes that exited, and reads the code objects of the new stacks the
    /// kernel reported. Cheap when nothing changed: called with the unwinder's sync.
    pub fn sync(&mut self, probes: &mut Probes, processes: &mut ProcessTable) {
        if processes.maps_version() != self.seen_maps {
            let since = std::mem::replace(&mut self.seen_maps, processes.maps_version());
            self.write_entries(probes, processes, since);
        }
        let stacks = processes.take_python_stacks();
        if !stacks.is_empty() {
            self.read_code(probes, processes, stacks);
        }
    }

    /// What the stage did.
    pub fn finish(self) -> PythonSummary {
        self.summary
    }

    /// Writes or drops the entries of the processes that changed since `version` (see
    /// `ProcessTable::changed_since`), and tries again those the table had no room for, as
    /// exits make room.
    fn write_entries(&mut self, probes: &mut Probes, processes: &mut ProcessTable, version: u64) {
        let Ok(map) = probes.map_mut(PROCESSES) else { return };
        let Ok(mut entries) = BpfHashMap::<&mut MapData, u32, PythonProcess>::try_from(map) else { return };
        let refused: Vec<u32> = self
            .summary
            .processes_full
            .iter()
            .copied()
            .filter(|pid| !self.written.contains_key(pid))
            .collect();
        let mut found = Vec::new();
        for (pid, record) in processes.changed_since_or(version, refused) {
            if record.exited {
                if self.written.remove(&pid).is_some() {
                    let _ = entries.remove(&pid);
                }
                continue;
            }
            match self.written.get(&pid) {
                Some(target) if target.execs == record.execs => continue,
                Some(_) => {
                    // It exec'd. The kernel dropped the entry then, unless this one was written
                    // after (from its parent's maps, read at a fork just before): one left
                    // would have every stack of the new program walked as Python's, with the
                    // old interpreter's addresses. Written again below if it is Python still.
                    self.written.remove(&pid);
                    let _ = entries.remove(&pid);
                }
                None => {}
            }
            let Some(maps) = &record.maps else { continue };
            if let Some((mut target, entry, version)) = self.interpreter_of(maps) {
                target.execs = record.execs;
                found.push((pid, (target, entry, version)));
            }
        }
        let mut wrote = false;
        for (pid, (target, entry, version)) in found {
            if entries.insert(&pid, &entry, 0).is_err() {
                self.summary.processes_full.insert(pid);
                continue;
            }
            wrote = true;
            self.written.insert(pid, target);
            *self.summary.processes.entry(format!("{}.{}", version.0, version.1)).or_default() += 1;
            processes.set_python(pid, ProcessCode { version, ..ProcessCode::default() });
        }
        // After the entry: a program that reads the flag set finds the entry there.
        if wrote
            && let Ok(map) = probes.map_mut(ANY_PROCESS)
            && let Ok(mut flag) = Array::<&mut MapData, u32>::try_from(map)
        {
            let _ = flag.set(0, &1, 0);
        }
    }

    /// The interpreter a process has mapped, and its entry for the kernel.
    fn interpreter_of(&mut self, maps: &ProcessMaps) -> Option<(Target, PythonProcess, (u8, u8))> {
        for mapping in maps.mappings() {
            let Backing::File { path, open, key } = &mapping.backing else { continue };
            // Only a CPython executable or libpython holds `_PyRuntime`: skip reading the rest.
            if !path.file_name().is_some_and(|name| name.to_string_lossy().contains("python")) {
                continue;
            }
            let interpreter =
                self.files.entry(open.to_path_buf()).or_insert_with(|| {
                    match Interpreter::find(open, Some(*key)) {
                        Ok(found) => found,
                        Err(error) => {
                            self.summary.unsupported.push(format!("{}: {error:#}", path.display()));
                            None
                        }
                    }
                });
            let Some(interpreter) = interpreter else { continue };
            let (entry, code_type) = interpreter.process_entry(mapping.start, mapping.file_offset)?;
            return Some((
                Target { file: open.to_path_buf(), code_type, execs: 0 },
                entry,
                interpreter.version,
            ));
        }
        None
    }

    /// Reads the code objects of `stacks` that their processes' tables lack.
    fn read_code(&mut self, probes: &Probes, processes: &mut ProcessTable, stacks: Vec<(u32, u32)>) {
        let ids: BTreeSet<u32> = stacks.iter().map(|&(_, id)| id).collect();
        let Ok(frames) = probes.stacks_in(sysprof_common::unwind::STACKS, &ids) else { return };
        for (pid, id) in stacks {
            let Some(target) = self.written.get(&pid) else { continue };
            let Some(Some(interpreter)) = self.files.get(&target.file) else { continue };
            let Some(code) = processes.python_mut(pid) else { continue };
            let Some(frames) = frames.get(&id) else { continue };
            let objects = code::CodeObjects {
                code_type: target.code_type,
                layout: interpreter.code,
                version: interpreter.version,
            };
            let addresses = frames
                .iter()
                .filter(|&&frame| frame & FRAME_PYTHON != 0)
                .map(|frame| frame & FRAME_CODE_MASK);
            let (read, unreadable) = code.read_stack(id, addresses, &code::Memory::of(pid), &objects);
            self.summary.code_objects += read;
            self.summary.unreadable += unreadable;
        }
    }
}
