//! Failures a user can act on. Each message is one line that names the fix; `main` prints it
//! with its cause chain.

use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    /// Neither root nor CAP_BPF + CAP_PERFMON.
    #[error("sysprof needs root (or CAP_BPF and CAP_PERFMON) to load BPF programs: run it with sudo")]
    NotPrivileged,

    /// A `--pid` that names no running process.
    #[error("no process with pid {0}: check it with `ps -p {0}`")]
    NoSuchProcess(u32),

    /// `--pid` names sysprof's own process.
    #[error(
        "pid {0} is sysprof itself: sysprof never profiles itself (its cost is in the report's own section)"
    )]
    TargetIsSysprof(u32),

    /// The output directory cannot hold the results.
    #[error("cannot write results to {}: {reason}; choose another directory with -o DIR", path.display())]
    OutputDir { path: PathBuf, reason: String },

    /// `-- CMD` names no program on PATH.
    #[error("command not found: {0}")]
    CommandNotFound(String),

    /// `-- CMD` exists but cannot be executed.
    #[error("cannot run {program}: {reason}")]
    CommandNotRunnable { program: String, reason: String },

    /// `--cgroup` names no cgroup v2 directory.
    #[error("no cgroup v2 at {}: list them with `systemd-cgls` or under the cgroup2 mount (`findmnt -t cgroup2`)", .0.display())]
    NoSuchCgroup(PathBuf),

    /// The cgroup v2 hierarchy is not mounted (cgroup v1 only).
    #[error(
        "cgroup v2 is not mounted: --cgroup and --unit need it (`mount -t cgroup2 none /sys/fs/cgroup/unified`, or boot with systemd.unified_cgroup_hierarchy=1)"
    )]
    NoCgroupV2,

    /// `--unit` names no running systemd unit.
    #[error("no running systemd unit {0} (no cgroup found for it): check `systemctl status {0}`")]
    NoSuchUnit(String),

    /// The sampling event needs hardware the machine lacks.
    #[error("perf event {event} is not supported on this machine ({reason}): use --event cpu-clock")]
    EventUnsupported { event: String, reason: String },

    /// perf_event_open refused by policy.
    #[error(
        "perf events are restricted (kernel.perf_event_paranoid = {paranoid}): run as root, or `sudo sysctl kernel.perf_event_paranoid=1`"
    )]
    PerfEventsRestricted { paranoid: i32 },

    /// The kernel refused to load a program; the verifier log is kept for bug reports.
    #[error(
        "the kernel refused BPF program {program}: {reason} (kernel {kernel}); please report this with `sysprof check` output"
    )]
    ProgramRejected { program: String, reason: String, kernel: String },

    /// `--as-root` through sudo: a sudo rule for sysprof alone must not become root for anything.
    #[error(
        "--as-root is refused through sudo: it would run any command as root for {user}; sysprof runs -- CMD as \
         {user}. To trace a root command, start it as root yourself and use --pid"
    )]
    AsRootUnderSudo { user: String },

    /// Through sudo, a file the user named that they cannot read themselves.
    #[error(
        "{user} cannot read {}: through sudo, sysprof opens only files the user who ran it can read",
        path.display()
    )]
    NotReadableByUser { path: PathBuf, user: String },

    /// Through sudo, a file the user named that they opened and that is no file to read (a
    /// FIFO, a device).
    #[error("{0}")]
    Unreadable(crate::input::InputError),

    /// A library to load as root that someone other than root could change.
    #[error("refusing to load {reason}")]
    UntrustedLibrary { reason: String },

    /// A signal arrived while the probes were being attached, before `-- CMD` started.
    #[error("{signal} during start-up: the command was not started and nothing was traced")]
    InterruptedAtStart { signal: &'static str, code: u8 },

    /// The BPF maps do not fit in sysprof's memory cgroup, or the kernel did not create one.
    #[error("{what}: {reason}")]
    KernelMemory { what: String, reason: String },

    /// An address-space limit (`ulimit -v`) that leaves a trace too little room.
    #[error(
        "{what}: the address-space limit (`ulimit -v`) is {} KiB, and sysprof maps the BPF rings and arrays, its \
         threads' stacks and the files it reads into its address space: raise the limit (`ulimit -v unlimited`) \
         where sysprof runs",
        crate::report::format::thousands(*limit_kib)
    )]
    AddressSpace { what: String, limit_kib: u64 },

    /// `--pid` names a zombie: a process that exited and that its parent has not reaped.
    #[error("pid {pid} is a zombie (it exited{parent}): there is nothing to trace")]
    ZombieProcess { pid: u32, parent: String },

    /// The kernel lacks a feature the requested probes need.
    #[error("{feature} is not available on this kernel: {fix}")]
    MissingKernelFeature { feature: String, fix: String },
}
