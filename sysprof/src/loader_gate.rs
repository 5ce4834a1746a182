//! Holds a launched command at its dynamic loader (sysprof-ebpf `loader.rs`) until its
//! libraries' unwind entries are written, so that its first calls' stacks are whole.
//!
//! A command released from its gate execs, and its loader maps its libraries within a
//! millisecond; their addresses are known only once userspace reads its maps, and until their
//! entries are written a stack through code without frame pointers ends at its first such
//! frame. A program that calls into a library at once (a CUDA program's first API calls, a
//! few milliseconds after its exec) would have those stacks cut short, as often as not. The
//! hold makes the race go away: the process stops once its loader has mapped every library
//! it starts with and before any of its own code runs, for as long as reading its maps and
//! writing their entries takes (a millisecond or two when the tables were built at its spawn).
//! Part B says how long it was held.

use std::{
    fs::File,
    io::Read as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use object::{Object as _, ObjectSymbol as _, read::elf::ElfFile64, read::elf::ProgramHeader as _};
use sysprof_common::{
    loader::{HELD, R_STATE_OFFSET, TO_STOP},
    names,
};

use crate::{
    input::{Links, open_regular},
    privileges::{InvokingUser, as_user},
    probes::Probes,
    procmaps::Backing,
    procs::ProcessTable,
    uprobes::{self, Binary, file_id},
};

/// The program in sysprof-ebpf `loader.rs`.
const PROGRAM: &str = "loader_ready";

/// How long the command gets to reach the end of its loader's work: it maps a few libraries in
/// about a millisecond; a hundred large ones take tens.
const LOADER_WAIT: Duration = Duration::from_millis(500);

/// The hold, armed for one launched command still at its gate.
pub struct LoaderGate {
    pid: u32,
    loader: Binary,
}

impl LoaderGate {
    /// Arms the hold for process `pid`, which will exec `program`: a uprobe on its loader's
    /// `_dl_debug_state`, for that process alone. `None` where there is no loader to probe (a
    /// static program, a loader without the symbols, as musl's) or the probe cannot attach:
    /// the command then runs unheld, as it did before the hold existed. The program and its
    /// loader are read as `user`, whom the command runs as.
    pub fn arm(probes: &mut Probes, pid: u32, program: &Path, user: Option<&InvokingUser>) -> Option<Self> {
        let loader = loader_of(program, user)?;
        let loader = Binary::open(&loader, user).ok()?;
        let (offset, state_offset) = debug_state(&loader)?;
        probes.set(names::LOADER_GATE, TO_STOP, pid).ok()?;
        // Where the probe cannot attach, the command runs unheld, as without this.
        if probes.attach_functions(&[PROGRAM], &loader, &[(offset, state_offset)], Some(pid)).is_err() {
            let _ = probes.set(names::LOADER_GATE, TO_STOP, 0u32);
            return None;
        }
        Some(Self { pid, loader })
    }

    /// Waits for the released command to stop at its loader; when it stopped, when it did.
    /// The caller then reads its maps and writes their entries, and continues it with
    /// [`Self::open`]. A command whose loader is not the one probed (a script's interpreter
    /// may use another) or that does not stop in time runs on.
    pub fn wait(&self, processes: &ProcessTable) -> Option<Instant> {
        (loader_mapped(processes, self.pid, &self.loader) && wait_for_stop(self.pid)).then(Instant::now)
    }

    /// Continues the command (held since `held`, when it stopped) and takes the probe away.
    pub fn open(self, probes: &mut Probes, held: Option<Instant>) {
        // Closed before the check below, so that no stop comes after it.
        let _ = probes.set(names::LOADER_GATE, TO_STOP, 0u32);
        if held.is_some() || is_stopped(self.pid) {
            // SAFETY: kill has no memory preconditions; the pid is the command, a child of
            // sysprof not yet waited for, so the number is not reused.
            unsafe { libc::kill(self.pid as i32, libc::SIGCONT) };
        }
        let _ = probes.set(names::LOADER_GATE, HELD, 0u32);
        probes.detach_process_uprobe(self.pid, PROGRAM);
        let loader = self.loader.shown().display();
        let what = match held {
            Some(held) => format!(
                "{loader} _dl_debug_state, the launched command's loader: stopped it there once its libraries \
                 were mapped, and continued it {:.1} ms after, their unwind entries written",
                held.elapsed().as_secs_f64() * 1e3
            ),
            None => format!(
                "{loader} _dl_debug_state, the launched command's loader: not held (it did not stop there)"
            ),
        };
        let program = probes.uprobe_program(PROGRAM, Some(self.pid));
        probes.note_uprobes(&[(program, "uprobe")], &what, 1);
    }
}

/// The loader `program` names (`PT_INTERP`), read as `user`; for a script, the loader sysprof
/// itself runs with, which the interpreters a script names use as a rule.
fn loader_of(program: &Path, user: Option<&InvokingUser>) -> Option<PathBuf> {
    let mut file = as_user(user, || open_regular(program, Links::Follow)).ok()?.ok()?;
    let mut magic = [0u8; 2];
    file.read_exact(&mut magic).ok()?;
    if &magic == b"#!" {
        file = File::open("/proc/self/exe").ok()?;
    }
    let cache = object::ReadCache::new(file);
    let file = ElfFile64::<object::Endianness, _>::parse(&cache).ok()?;
    let endian = file.endian();
    let interpreter = file
        .elf_program_headers()
        .iter()
        .find_map(|header| header.interpreter(endian, &cache).ok().flatten())?;
    Some(PathBuf::from(std::str::from_utf8(interpreter).ok()?))
}

/// Where to probe `_dl_debug_state` in `loader` (its file offset), and where `_r_debug.r_state`
/// lies relative to the function (the probe's cookie: both are in the loader's one image).
fn debug_state(loader: &Binary) -> Option<(u64, u64)> {
    let cache = object::ReadCache::new(loader.reopen().ok()?);
    let file = object::File::parse(&cache).ok()?;
    let symbol = |name: &str| {
        file.dynamic_symbols().find(|symbol| {
            !symbol.is_undefined() && symbol.name().is_ok_and(|n| n.split('@').next() == Some(name))
        })
    };
    let (function, r_debug) = (symbol("_dl_debug_state")?, symbol("_r_debug")?);
    let offset = uprobes::elf::file_offset(&file, &function)?;
    Some((offset, (r_debug.address() + R_STATE_OFFSET).wrapping_sub(function.address())))
}

/// Whether the maps read at the command's exec hold `loader` (they do unless the program
/// has none, or another).
fn loader_mapped(processes: &ProcessTable, pid: u32, loader: &Binary) -> bool {
    let Some(id) = loader.id() else { return false };
    processes.get(pid).and_then(|record| record.maps.as_ref()).is_some_and(|maps| {
        maps.mappings().iter().any(
            |mapping| matches!(&mapping.backing, Backing::File { open, .. } if file_id(open) == Some(id)),
        )
    })
}

/// Waits until `pid` is stopped, at most `LOADER_WAIT`; false when it exited or ran on.
fn wait_for_stop(pid: u32) -> bool {
    let deadline = Instant::now() + LOADER_WAIT;
    while Instant::now() < deadline {
        match crate::target::proc_stat(pid) {
            Some(stat) if stat.state == 'T' => return true,
            Some(stat) if stat.alive() => std::thread::sleep(Duration::from_micros(20)),
            _ => return false,
        }
    }
    false
}

fn is_stopped(pid: u32) -> bool {
    crate::target::proc_stat(pid).is_some_and(|stat| stat.state == 'T')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_s_loader_has_the_debug_interface() {
        let loader = loader_of(Path::new("/proc/self/exe"), None).expect("a dynamically linked test binary");
        let loader = Binary::open(&loader, None).unwrap();
        let (offset, state_offset) = debug_state(&loader).expect("glibc's loader exports both symbols");
        assert!(offset > 0);
        assert_ne!(state_offset, 0);
    }
}
