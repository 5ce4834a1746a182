//! Launches `-- CMD` held at a gate: the child exists (so its pid can join the in-kernel target
//! set and the probes can attach) but runs none of CMD until the gate opens. Nothing CMD does,
//! not even its first instructions or its first child, escapes the trace. Then
//! [`CommandWatch`] follows it to its exit and, when the trace ends first, ends it and what it
//! started.
//!
//! Run through sudo, CMD runs as the invoking user with their groups, and is found as they
//! would find it: on PATH, with their rights.

use std::{
    ffi::{OsStr, OsString},
    io::{Read as _, Write as _},
    os::{
        fd::AsRawFd as _,
        unix::{ffi::OsStrExt as _, fs::PermissionsExt as _, process::CommandExt as _},
    },
    path::{Path, PathBuf},
    process::{Command, ExitStatus},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::Context as _;

use tokio::sync::oneshot;

use crate::{
    error::Error,
    privileges::{InvokingUser, as_user},
    procs::ProcessTable,
};

/// A child created and waiting at the gate.
pub struct GatedChild {
    pid: u32,
    /// The program the child will exec.
    path: PathBuf,
    gate: std::fs::File,
    /// The exec's outcome, from the thread that forked the child.
    spawned: mpsc::Receiver<std::io::Result<()>>,
    exit: oneshot::Receiver<ExitStatus>,
    program: String,
}

impl GatedChild {
    /// Forks the child for `argv` and waits until it sits at the gate.
    pub fn spawn(argv: &[OsString], run_as: Option<&InvokingUser>) -> anyhow::Result<Self> {
        let program = argv.first().context("no command given after --")?;
        let program_text = program.to_string_lossy().into_owned();
        let path = resolve_program(program, run_as)?;

        // The file found is the one run (its name as given is its argv[0]).
        let mut command = Command::new(&path);
        command.arg0(program).args(&argv[1..]);
        let identity = run_as.map(|user| {
            command.env("HOME", &user.home).env("USER", &user.name).env("LOGNAME", &user.name);
            (user.uid, user.gid, user.groups.clone())
        });

        let (pid_reader, pid_writer) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let (gate_reader, gate_writer) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let (pid_fd, gate_fd) = (pid_writer.as_raw_fd(), gate_reader.as_raw_fd());
        // The child's copies of sysprof's ends: closed first thing, or a sysprof that dies
        // before opening the gate would leave the child waiting on a pipe it holds open itself.
        let (parent_pid_end, parent_gate_end) = (pid_reader.as_raw_fd(), gate_writer.as_raw_fd());
        // Whether sysprof is still the parent after PR_SET_PDEATHSIG (else it died before).
        let sysprof = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe system calls on memory allocated before the fork.
        unsafe {
            command.pre_exec(move || {
                libc::close(parent_pid_end);
                libc::close(parent_gate_end);
                // The command runs at the priority sysprof was started with, not sysprof's own.
                crate::priority::restore_in_child();
                // Killed with sysprof (even by SIGKILL, which sysprof cannot catch). It fires
                // when the forking thread ends, which is the one that waits for the command.
                // SIGKILL, not SIGTERM: a stopped command (held at its loader while its unwind
                // tables are written, or stopped by its user) would keep a SIGTERM pending and
                // stay stopped for good. sysprof ends the command itself on every signal it
                // can catch (`CommandWatch`); this is for the ones it cannot.
                // Before the pid is sent, so before the probes see this child: the trace shows
                // only what CMD does (the gate's read, and the identity change under sudo).
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 || libc::getppid() != sysprof {
                    return Err(std::io::Error::from_raw_os_error(libc::ECANCELED));
                }
                let pid = libc::getpid().to_ne_bytes();
                if libc::write(pid_fd, pid.as_ptr().cast(), pid.len()) != pid.len() as isize {
                    return Err(std::io::Error::last_os_error());
                }
                let mut go = 0u8;
                if libc::read(gate_fd, (&raw mut go).cast(), 1) != 1 {
                    // The gate closed without opening: sysprof gave up; run nothing.
                    return Err(std::io::Error::from_raw_os_error(libc::ECANCELED));
                }
                // Groups, then group, then user: once the user is dropped the others cannot be.
                // The identity change clears the parent-death signal: set it again.
                if let Some((uid, gid, groups)) = &identity
                    && (libc::setgroups(groups.len(), groups.as_ptr()) != 0
                        || libc::setgid(*gid) != 0
                        || libc::setuid(*uid) != 0
                        || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0)
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }

        // `spawn` returns only once the child has exec'd, which is after the gate opens, so it
        // runs on its own thread while this one learns the pid; that thread then waits for it.
        let (spawned_sender, spawned) = mpsc::channel();
        let (exit_sender, exit) = oneshot::channel();
        std::thread::spawn(move || {
            let result = command.spawn();
            drop((pid_writer, gate_reader));
            match result {
                Ok(mut child) => {
                    let _ = spawned_sender.send(Ok(()));
                    if let Ok(status) = child.wait() {
                        let _ = exit_sender.send(status);
                    }
                }
                Err(error) => {
                    let _ = spawned_sender.send(Err(error));
                }
            }
        });
        let mut pid = [0u8; 4];
        let mut pid_reader = std::fs::File::from(pid_reader);
        if pid_reader.read_exact(&mut pid).is_err() {
            let error = match spawned.recv() {
                Ok(Err(error)) => error,
                _ => std::io::Error::other("the child exited before reaching the gate"),
            };
            return Err(spawn_error(&program_text, error));
        }
        Ok(GatedChild {
            pid: i32::from_ne_bytes(pid) as u32,
            path,
            gate: std::fs::File::from(gate_writer),
            spawned,
            exit,
            program: program_text,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The program the child will run, as found on PATH.
    pub fn program(&self) -> &Path {
        &self.path
    }

    /// Opens the gate: the child execs CMD. (Dropping a `GatedChild` instead closes the gate:
    /// the child exits without running anything.)
    pub fn release(mut self) -> anyhow::Result<CommandWatch> {
        self.gate.write_all(&[1]).context("releasing the command")?;
        drop(self.gate);
        match self.spawned.recv() {
            Ok(Ok(())) => Ok(CommandWatch { pid: self.pid, exit: Some(self.exit), status: None }),
            Ok(Err(error)) => Err(spawn_error(&self.program, error)),
            Err(_) => anyhow::bail!("the thread launching {} ended without a word", self.program),
        }
    }
}

/// How long the processes of `-- CMD` get to exit on SIGTERM before they are killed, and then
/// how long SIGKILL gets.
const END_GRACE: Duration = Duration::from_secs(2);
const KILL_GRACE: Duration = Duration::from_secs(1);

/// `-- CMD` while it runs: its pid, and its exit status once the thread that waits for it has
/// it.
#[derive(Debug)]
pub struct CommandWatch {
    pub pid: u32,
    exit: Option<oneshot::Receiver<ExitStatus>>,
    /// How it exited, once it did.
    pub status: Option<ExitStatus>,
}

/// How `-- CMD` ended, for the report and the exit code.
#[derive(Clone, Debug, Default)]
pub struct CommandEnd {
    pub status: Option<ExitStatus>,
    /// When sysprof ended it because the trace ended first: the last signal it needed, and
    /// how many processes (the command and what it started) were still running.
    pub ended_by_sysprof: Option<(&'static str, usize)>,
    /// The command itself (not only what it started) was still running then.
    pub command_was_running: bool,
}

impl CommandWatch {
    /// Resolves once, when the command exits; never again after that.
    pub async fn exited(&mut self) -> ExitStatus {
        let Some(exit) = &mut self.exit else { return std::future::pending().await };
        let result = exit.await;
        self.exit = None;
        match result {
            Ok(status) => {
                self.status = Some(status);
                status
            }
            // The waiting thread is gone without a status: never end the trace for that.
            Err(_) => std::future::pending().await,
        }
    }

    /// Ends what is left of the command when the trace ends before it does, as `perf record`
    /// ends its workload: SIGTERM to the command and to every process it started that still
    /// runs (`processes` holds them, as the kernel followed them), SIGKILL to what is left
    /// after a grace period.
    pub async fn end(mut self, processes: &ProcessTable) -> CommandEnd {
        let running = self.running(processes);
        let command_was_running = self.status.is_none();
        if running.is_empty() {
            return CommandEnd { status: self.status, ended_by_sysprof: None, command_was_running };
        }
        let mut last = "SIGTERM";
        for (name, signal, grace) in
            [("SIGTERM", libc::SIGTERM, END_GRACE), ("SIGKILL", libc::SIGKILL, KILL_GRACE)]
        {
            let left = self.running(processes);
            if left.is_empty() {
                break;
            }
            last = name;
            for pid in left {
                // SAFETY: kill has no memory preconditions. Each pid is the process seen (its
                // start time matched just now), not a later one that reuses the number.
                unsafe { libc::kill(pid as i32, signal) };
            }
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline && !self.running(processes).is_empty() {
                let _ = tokio::time::timeout(Duration::from_millis(20), self.exited()).await;
            }
        }
        CommandEnd { status: self.status, ended_by_sysprof: Some((last, running.len())), command_was_running }
    }

    /// The command, until it exited, and the processes it started that still run.
    fn running(&self, processes: &ProcessTable) -> Vec<u32> {
        let mut pids = processes.running();
        pids.retain(|&pid| pid != self.pid);
        if self.status.is_none() {
            pids.push(self.pid);
        }
        pids
    }
}

/// Finds `program` before anything is loaded, as `user` (who will run it; sysprof itself
/// without one) would: on PATH when it names no directory, and with their rights. What the
/// answer tells is then only what they could learn themselves: every path in a directory they
/// cannot search is refused alike, whatever is there.
fn resolve_program(program: &OsStr, user: Option<&InvokingUser>) -> Result<PathBuf, Error> {
    let text = program.to_string_lossy().into_owned();
    let refused = |reason: String| Error::CommandNotRunnable { program: text.clone(), reason };
    as_user(user, || find_program(program, &text, user))
        .map_err(|error| refused(format!("could not act as the user who ran sudo: {error}")))?
}

fn find_program(program: &OsStr, text: &str, user: Option<&InvokingUser>) -> Result<PathBuf, Error> {
    let refused = |reason: String| Error::CommandNotRunnable { program: text.to_string(), reason };
    if text.contains('/') {
        let path = PathBuf::from(program);
        return match runnable(&path) {
            Ok(()) => Ok(path),
            Err(Refusal::Missing) => Err(Error::CommandNotFound(text.to_string())),
            Err(refusal) => Err(refused(refusal.reason(user))),
        };
    }
    // As execvp searches: the first candidate that runs; failing that, why the first one
    // found would not. A directory on PATH the user cannot search holds nothing for them.
    let mut first_refusal = None;
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        // An empty entry is the working directory, as the shells have it.
        let dir = if dir.as_os_str().is_empty() { PathBuf::from(".") } else { dir };
        let path = dir.join(program);
        match runnable(&path) {
            Ok(()) => return Ok(path),
            Err(Refusal::Missing | Refusal::Denied) => {}
            Err(refusal) => {
                first_refusal.get_or_insert(refusal);
            }
        }
    }
    match first_refusal {
        Some(refusal) => Err(refused(refusal.reason(user))),
        None => Err(Error::CommandNotFound(text.to_string())),
    }
}

/// Why a path cannot be run.
#[derive(Debug)]
enum Refusal {
    /// Nothing there (or a path through a file).
    Missing,
    /// A directory on the way cannot be searched.
    Denied,
    Directory,
    /// There, but not executable by the user.
    NotExecutable,
    Other(std::io::Error),
}

impl Refusal {
    fn reason(&self, user: Option<&InvokingUser>) -> String {
        let as_whom = user.map_or(String::new(), |user| {
            format!(" for {} (through sudo, sysprof runs the command as the user who ran it)", user.name)
        });
        match self {
            Refusal::Missing => "no such file".into(),
            Refusal::Denied => format!("permission denied{as_whom}"),
            Refusal::Directory => "it is a directory".into(),
            Refusal::NotExecutable => format!("permission denied{as_whom} (is it executable? `chmod +x` it)"),
            Refusal::Other(error) => error.to_string(),
        }
    }
}

/// Whether `path` is a file the current (filesystem) identity may execute.
fn runnable(path: &Path) -> Result<(), Refusal> {
    let meta = std::fs::metadata(path).map_err(|error| match error.raw_os_error() {
        Some(libc::ENOENT | libc::ENOTDIR) => Refusal::Missing,
        Some(libc::EACCES) => Refusal::Denied,
        _ => Refusal::Other(error),
    })?;
    if meta.is_dir() {
        return Err(Refusal::Directory);
    }
    if !meta.is_file() || !may_execute(path, &meta) {
        return Err(Refusal::NotExecutable);
    }
    Ok(())
}

/// Whether the thread's filesystem identity may execute `path`: faccessat2 with AT_EACCESS
/// checks with exactly the ids `InvokingUser::act` sets (access(2) would check the real uid,
/// root's). Where the kernel predates it (5.8), any execute bit.
fn may_execute(path: &Path, meta: &std::fs::Metadata) -> bool {
    let Ok(name) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: `name` is a valid C string; the call only reads it.
    let result = unsafe {
        libc::syscall(libc::SYS_faccessat2, libc::AT_FDCWD, name.as_ptr(), libc::X_OK, libc::AT_EACCESS)
    };
    match result {
        0 => true,
        _ if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) => {
            meta.permissions().mode() & 0o111 != 0
        }
        _ => false,
    }
}

fn spawn_error(program: &str, error: std::io::Error) -> anyhow::Error {
    match error.kind() {
        std::io::ErrorKind::NotFound => Error::CommandNotFound(program.to_string()).into(),
        _ => Error::CommandNotRunnable { program: program.to_string(), reason: error.to_string() }.into(),
    }
}

/// How a command ended, in words, and the exit code sysprof passes on (128 + signal when killed,
/// as shells do).
pub fn describe_exit(status: std::process::ExitStatus) -> (String, u8) {
    use std::os::unix::process::ExitStatusExt as _;
    if let Some(code) = status.code() {
        return (format!("exit status {code}"), code as u8);
    }
    let signal = status.signal().unwrap_or(0);
    let name = nix::sys::signal::Signal::try_from(signal)
        .map(|s| s.as_str().to_string())
        .unwrap_or(signal.to_string());
    (format!("killed by {name}"), 128u8.wrapping_add(signal as u8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gated_child_runs_only_once_released() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let argv: Vec<OsString> =
            vec!["sh".into(), "-c".into(), format!("echo $$ > {}", marker.display()).into()];
        let gated = GatedChild::spawn(&argv, None).unwrap();
        let pid = gated.pid();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!marker.exists(), "the command ran before the gate opened");
        let mut child = gated.release().unwrap();
        assert_eq!(child.pid, pid);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        assert!(runtime.block_on(child.exited()).success());
        // `sh -c` with one command execs it in place, so the pid written is the gated one.
        assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), pid.to_string());
    }

    #[test]
    fn missing_and_unrunnable_commands_are_named() {
        let error = GatedChild::spawn(&["sysprof-no-such-command".into()], None).err().unwrap();
        assert_eq!(error.to_string(), "command not found: sysprof-no-such-command");
        let file = tempfile::NamedTempFile::new().unwrap();
        let error = GatedChild::spawn(&[file.path().as_os_str().to_owned()], None).err().unwrap();
        assert!(error.to_string().contains("permission denied"), "{error}");
    }

    #[test]
    fn a_command_never_released_runs_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let argv: Vec<OsString> =
            vec!["sh".into(), "-c".into(), format!("echo x > {}", marker.display()).into()];
        let gated = GatedChild::spawn(&argv, None).unwrap();
        let pid = gated.pid();
        drop(gated);
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!marker.exists(), "an abandoned command ran");
        assert!(!crate::target::process_alive(pid), "the gated child is still there");
    }

    #[test]
    fn a_directory_is_not_a_command() {
        let dir = tempfile::tempdir().unwrap();
        let error = GatedChild::spawn(&[dir.path().as_os_str().to_owned()], None).err().unwrap();
        assert!(error.to_string().ends_with("it is a directory"), "{error}");
    }

    #[test]
    fn exits_are_described_as_shells_do() {
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(describe_exit(std::process::ExitStatus::from_raw(3 << 8)), ("exit status 3".into(), 3));
        assert_eq!(describe_exit(std::process::ExitStatus::from_raw(9)), ("killed by SIGKILL".into(), 137));
    }
}
