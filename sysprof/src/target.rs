//! Resolves a [`Target`] against the running system: pids that exist, processes by name, a
//! cgroup v2 directory (or a systemd unit's) with the id and depth the kernel filter needs.

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use sysprof_common::{TASK_COMM_LEN, filter};

use crate::{config::Target, error::Error};

/// A target as the kernel programs filter it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedTarget {
    /// One of `sysprof_common::filter`.
    pub filter: u32,
    /// Processes that are part of the target from the start.
    pub pids: Vec<u32>,
    /// `--comm`: NUL-padded name the exec program matches.
    pub comm: [u8; TASK_COMM_LEN],
    /// `--cgroup`/`--unit`: cgroup id and its depth below the root.
    pub cgroup: Option<(u64, u32)>,
    /// One-line notes for the user (a name longer than the kernel keeps, no match yet, ...).
    pub notes: Vec<String>,
}

impl ResolvedTarget {
    fn new(filter: u32) -> Self {
        ResolvedTarget { filter, pids: Vec::new(), comm: [0; TASK_COMM_LEN], cgroup: None, notes: Vec::new() }
    }
}

/// Checks the target exists and turns it into the kernel filter.
pub fn resolve(target: &Target) -> Result<ResolvedTarget, Error> {
    match target {
        Target::All => Ok(ResolvedTarget::new(filter::ALL)),
        Target::Command(_) => Ok(ResolvedTarget::new(filter::TARGETS)),
        Target::Pids(pids) => {
            let mut resolved = ResolvedTarget::new(filter::TARGETS);
            for &pid in pids {
                if !process_exists(pid) {
                    return Err(Error::NoSuchProcess(pid));
                }
                if pid == std::process::id() {
                    return Err(Error::TargetIsSysprof(pid));
                }
                // The kernel filters by process: a thread id would match nothing.
                let process = thread_group(pid).unwrap_or(pid);
                // A zombie would be traced for no time at all and reported as having exited.
                if let Some(stat) = proc_stat(process).filter(|stat| !stat.alive()) {
                    return Err(zombie(pid, stat.ppid));
                }
                if process != pid {
                    resolved.notes.push(format!(
                        "pid {pid} is a thread of process {process} ({}): tracing process {process}, all its threads",
                        std::fs::read_to_string(format!("/proc/{process}/comm")).unwrap_or_default().trim()
                    ));
                }
                if !resolved.pids.contains(&process) {
                    resolved.pids.push(process);
                }
            }
            Ok(resolved)
        }
        Target::Comm(name) => Ok(resolve_comm(name)),
        Target::Cgroup(path) => resolve_cgroup(path),
        Target::Unit(unit) => {
            let path = find_unit_cgroup(unit)?;
            resolve_cgroup(&path)
        }
    }
}

/// The error for `--pid` of a zombie, naming the parent that has not reaped it.
fn zombie(pid: u32, ppid: u32) -> Error {
    let parent = match std::fs::read_to_string(format!("/proc/{ppid}/comm")) {
        Ok(name) if ppid > 0 => format!(" and its parent {} (pid {ppid}) has not reaped it", name.trim()),
        _ => String::new(),
    };
    Error::ZombieProcess { pid, parent }
}

pub fn process_exists(pid: u32) -> bool {
    pid != 0 && Path::new(&format!("/proc/{pid}")).exists()
}

/// The process a task id belongs to (its Tgid); a process's own id gives itself.
fn thread_group(tid: u32) -> Option<u32> {
    let status = read_proc_text(&format!("/proc/{tid}/status")).ok()?;
    status.lines().find_map(|line| line.strip_prefix("Tgid:"))?.trim().parse().ok()
}

/// sysprof and the processes between a target and it (`sudo`, from `--pid $$` in a shell):
/// they exist only to run sysprof, and are never part of the target.
fn sysprof_and_its_launchers(roots: &[u32]) -> Vec<u32> {
    let mut chain = vec![std::process::id()];
    while let Some(parent) = chain.last().and_then(|&pid| parent_of(pid))
        && parent > 1
        && !roots.contains(&parent)
        && chain.len() < 64
    {
        chain.push(parent);
    }
    // Only when the chain does reach a target: otherwise sysprof's parents are unrelated.
    match chain.last().and_then(|&pid| parent_of(pid)) {
        Some(parent) if roots.contains(&parent) => chain,
        _ => vec![std::process::id()],
    }
}

fn parent_of(pid: u32) -> Option<u32> {
    proc_stat(pid).map(|stat| stat.ppid)
}

/// What sysprof reads of /proc/PID/stat.
#[derive(Clone, Copy, Debug)]
pub struct ProcStat {
    /// R, S, D, Z (a zombie waiting for its parent), X, ...
    pub state: char,
    pub ppid: u32,
    /// When it started, in clock ticks after boot: tells it apart from a later process that
    /// reuses its pid.
    pub start_ticks: u64,
    /// A kernel thread (PF_KTHREAD): it has no memory map, now or ever.
    pub kernel_thread: bool,
    /// Its threads, the leader counted until it is reaped.
    pub threads: u32,
}

/// `task_struct::flags` of a kernel thread.
const PF_KTHREAD: u64 = 0x0020_0000;

impl ProcStat {
    /// Exists, and is not a zombie, or is one whose leader ended before its other threads
    /// (`pthread_exit` in main: the state shown is the leader's).
    pub fn alive(&self) -> bool {
        !matches!(self.state, 'Z' | 'X') || self.threads > 1
    }
}

/// A /proc file's text in two reads: one into a buffer big enough for most of them, and the
/// one that finds the end. procfs files have no size, so `fs::read_to_string` asks for one (a
/// statx) and then reads in growing steps from 32 bytes: six calls after the open for a
/// process's stat. sysprof reads these files for every process it follows, and each call it
/// makes during a trace also runs its own syscall programs.
pub fn read_proc_text(path: &str) -> std::io::Result<String> {
    use std::io::Read as _;
    let mut file = std::fs::File::open(path)?;
    let mut text = Vec::new();
    let mut buffer = [0u8; PROC_READ];
    loop {
        match file.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => text.extend_from_slice(&buffer[..read]),
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    String::from_utf8(text).map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidData, error))
}

/// [`read_proc_text`]'s buffer: a page holds a process's stat or status, and a maps file comes
/// a page per read whatever the buffer.
const PROC_READ: usize = 4096;

/// /proc/PID/stat, when the process exists.
pub fn proc_stat(pid: u32) -> Option<ProcStat> {
    let stat = read_proc_text(&format!("/proc/{pid}/stat")).ok()?;
    // The fields after the parenthesized name (which may itself contain ") "), from field 3.
    let (_, rest) = stat.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        start_ticks: fields.get(19)?.parse().ok()?,
        kernel_thread: fields.get(6)?.parse::<u64>().ok()? & PF_KTHREAD != 0,
        threads: fields.get(17)?.parse().ok()?,
    })
}

/// Whether `pid` still runs (see `ProcStat::alive`).
pub fn process_alive(pid: u32) -> bool {
    proc_stat(pid).is_some_and(|stat| stat.alive())
}

fn resolve_comm(name: &str) -> ResolvedTarget {
    let mut resolved = ResolvedTarget::new(filter::TARGETS);
    // The kernel keeps 15 bytes of a task name.
    // The kernel keeps 15 bytes of a task name: a longer one is matched as `pgrep` would
    // need it cut (every process whose name begins so), and said, since the name given
    // itself can never be a process's.
    let kept = &name.as_bytes()[..name.len().min(TASK_COMM_LEN - 1)];
    let shown = String::from_utf8_lossy(kept);
    if kept.len() < name.len() {
        resolved.notes.push(format!(
            "the kernel keeps 15 characters of a process name: matching processes named {shown:?} (every name \
             that begins so)"
        ));
    }
    resolved.comm[..kept.len()].copy_from_slice(kept);
    resolved.pids = pids_named(kept);
    if resolved.pids.is_empty() {
        resolved.notes.push(format!("no process named {shown:?} is running yet: waiting for one to start"));
    }
    resolved
}

/// Processes that joined the target between preflight and the attach of the fork and exec
/// programs, which follow every later one: ones that took the `--comm` name, and children of
/// the target processes.
pub fn late_joiners(resolved: &ResolvedTarget) -> Vec<u32> {
    if resolved.filter != filter::TARGETS {
        return Vec::new();
    }
    let comm_len = resolved.comm.iter().position(|&b| b == 0).unwrap_or(TASK_COMM_LEN);
    let mut found = if comm_len > 0 { pids_named(&resolved.comm[..comm_len]) } else { Vec::new() };
    found.extend(descendants(&resolved.pids));
    let sysprof = sysprof_and_its_launchers(&resolved.pids);
    found.retain(|pid| !resolved.pids.contains(pid) && !sysprof.contains(pid));
    found.sort_unstable();
    found.dedup();
    found
}

/// Every process descending from `roots`, from the parent pids in /proc.
fn descendants(roots: &[u32]) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let parents: Vec<(u32, u32)> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, parent_of(pid)?)))
        .collect();
    let mut found: Vec<u32> = Vec::new();
    let mut frontier: Vec<u32> = roots.to_vec();
    while let Some(parent) = frontier.pop() {
        for &(pid, ppid) in &parents {
            if ppid == parent && !found.contains(&pid) && !roots.contains(&pid) {
                found.push(pid);
                frontier.push(pid);
            }
        }
    }
    found
}

/// Pids whose /proc/PID/comm is exactly `name`.
fn pids_named(name: &[u8]) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.strip_suffix(b"\n").unwrap_or(&comm) == name)
        })
        .filter(|&pid| pid != std::process::id())
        .collect();
    pids.sort_unstable();
    pids
}

/// Where the cgroup v2 hierarchy is mounted: /sys/fs/cgroup on unified systems,
/// /sys/fs/cgroup/unified on hybrid ones, elsewhere by hand. The kernel's cgroup ids and levels
/// count from its root.
pub fn cgroup2_root() -> Result<PathBuf, Error> {
    let mounts =
        procfs::process::Process::myself().and_then(|me| me.mountinfo()).map_err(|_| Error::NoCgroupV2)?;
    let mut roots: Vec<PathBuf> =
        mounts.into_iter().filter(|m| m.fs_type == "cgroup2").map(|m| m.mount_point).collect();
    // Bind mounts of subtrees (containers) appear too: the shortest path is the host's root.
    roots.sort_by_key(|p| p.as_os_str().len());
    roots.into_iter().next().ok_or(Error::NoCgroupV2)
}

fn resolve_cgroup(path: &Path) -> Result<ResolvedTarget, Error> {
    let root = cgroup2_root()?;
    let full = if path.is_absolute() { path.to_path_buf() } else { root.join(path) };
    let full = full.canonicalize().map_err(|_| Error::NoSuchCgroup(full.clone()))?;
    let relative = full.strip_prefix(&root).map_err(|_| Error::NoSuchCgroup(full.clone()))?;
    if !full.join("cgroup.procs").exists() {
        return Err(Error::NoSuchCgroup(full));
    }
    let id = std::fs::metadata(&full).map_err(|_| Error::NoSuchCgroup(full.clone()))?.ino();
    let level = relative.components().count() as u32;
    let mut resolved = ResolvedTarget::new(filter::CGROUP);
    resolved.cgroup = Some((id, level));
    resolved.pids = cgroup_pids(&full);
    resolved.pids.retain(|&pid| pid != std::process::id());
    Ok(resolved)
}

/// Processes in a cgroup and its descendants now (for symbolizing them from the start).
fn cgroup_pids(dir: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            pids.extend(procs.lines().filter_map(|line| line.trim().parse::<u32>().ok()));
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            pending.extend(entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_dir()));
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// The cgroup of a systemd unit: systemd names the directory after the unit, under a slice.
fn find_unit_cgroup(unit: &str) -> Result<PathBuf, Error> {
    let unit = if unit.contains('.') { unit.to_string() } else { format!("{unit}.service") };
    // Breadth first, a few levels deep: system.slice/x.service, user.slice/user-1000.slice/...
    let mut level = vec![cgroup2_root()?];
    for _ in 0..5 {
        let mut next = Vec::new();
        for dir in level {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for entry in entries.filter_map(Result::ok) {
                let path = entry.path();
                if !path.is_dir() {
                    continue;
                }
                if entry.file_name().to_str() == Some(unit.as_str()) {
                    return Ok(path);
                }
                next.push(path);
            }
        }
        level = next;
    }
    Err(Error::NoSuchUnit(unit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_alive_until_it_is_gone_or_a_zombie_of_one_thread() {
        assert!(process_alive(std::process::id()), "this test's own process runs");
        assert!(!process_alive(4_000_000_000), "no such process");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Not waited for: a zombie once it exits.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !proc_stat(pid).is_some_and(|stat| stat.state == 'Z') && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(proc_stat(pid).map(|stat| stat.threads), Some(1));
        assert!(!process_alive(pid), "a zombie");
        // Refused before anything is attached, in one line that says what it is.
        let error = resolve(&Target::Pids(vec![pid])).unwrap_err().to_string();
        let parent = std::fs::read_to_string("/proc/self/comm").unwrap();
        assert_eq!(
            error,
            format!(
                "pid {pid} is a zombie (it exited and its parent {} (pid {}) has not reaped it): there is nothing to trace",
                parent.trim(),
                std::process::id()
            )
        );
        child.wait().unwrap();
        assert!(!process_alive(pid), "reaped");
    }

    #[test]
    fn pids_must_exist() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let pid = child.id();
        let resolved = resolve(&Target::Pids(vec![pid]));
        let missing = resolve(&Target::Pids(vec![pid, 4_000_000]));
        let _ = child.kill();
        let _ = child.wait();
        let resolved = resolved.unwrap();
        assert_eq!(resolved.pids, vec![pid]);
        assert_eq!(resolved.filter, filter::TARGETS);
        let missing = missing.unwrap_err();
        assert_eq!(missing.to_string(), "no process with pid 4000000: check it with `ps -p 4000000`");
    }

    #[test]
    fn children_started_before_the_programs_attach_are_found() {
        let mut parent = std::process::Command::new("sh").args(["-c", "sleep 5 & wait"]).spawn().unwrap();
        let resolved = resolve(&Target::Pids(vec![parent.id()])).unwrap();
        let mut late = Vec::new();
        for _ in 0..100 {
            late = late_joiners(&resolved);
            if !late.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = std::process::Command::new("pkill").args(["-P", &parent.id().to_string()]).status();
        let _ = parent.kill();
        let _ = parent.wait();
        assert_eq!(late.len(), 1, "the backgrounded sleep: {late:?}");
        assert!(!late.contains(&std::process::id()));
    }

    #[test]
    fn a_thread_id_resolves_to_its_process_and_sysprof_is_never_a_target() {
        let (sender, receiver) = std::sync::mpsc::channel();
        let (release, hold) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            sender.send(unsafe { libc::gettid() } as u32).unwrap();
            let _ = hold.recv();
        });
        let tid = receiver.recv().unwrap();
        assert_eq!(thread_group(tid), Some(std::process::id()));
        drop(release);
        thread.join().unwrap();
        let error = resolve(&Target::Pids(vec![std::process::id()])).unwrap_err();
        assert!(error.to_string().contains("sysprof itself"), "{error}");
    }

    #[test]
    fn long_names_are_cut_as_the_kernel_cuts_them() {
        let resolved = resolve(&Target::Comm("a-very-long-process-name".into())).unwrap();
        assert_eq!(&resolved.comm[..15], b"a-very-long-pro");
        assert_eq!(resolved.comm[15], 0);
        assert!(resolved.notes[0].contains("15 characters"), "{:?}", resolved.notes);
        // A hundred characters: what is waited for is the name the kernel can hold, and said.
        let long = "x".repeat(100);
        let resolved = resolve(&Target::Comm(long.clone())).unwrap();
        assert_eq!(&resolved.comm[..15], "x".repeat(15).as_bytes());
        assert_eq!(
            resolved.notes,
            [
                "the kernel keeps 15 characters of a process name: matching processes named \"xxxxxxxxxxxxxxx\" \
                 (every name that begins so)",
                "no process named \"xxxxxxxxxxxxxxx\" is running yet: waiting for one to start",
            ]
        );
    }

    #[test]
    fn missing_cgroups_and_units_say_so() {
        let root = cgroup2_root().expect("cgroup v2 is mounted");
        let error = resolve(&Target::Cgroup("no/such/group".into())).unwrap_err();
        let expected = format!("no cgroup v2 at {}", root.join("no/such/group").display());
        assert!(error.to_string().starts_with(&expected), "{error}");
        let error = resolve(&Target::Unit("sysprof-no-such-unit".into())).unwrap_err();
        assert!(error.to_string().contains("sysprof-no-such-unit.service"), "{error}");
    }

    #[test]
    fn the_root_cgroup_is_level_zero_and_holds_everyone_but_sysprof() {
        let root = cgroup2_root().expect("cgroup v2 is mounted");
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let resolved = resolve(&Target::Cgroup(root));
        let _ = child.kill();
        let _ = child.wait();
        let resolved = resolved.unwrap();
        let (_, level) = resolved.cgroup.unwrap();
        assert_eq!(level, 0);
        assert!(resolved.pids.contains(&child.id()));
        assert!(!resolved.pids.contains(&std::process::id()), "sysprof is never its own target");
    }
}
