//! Syscall analysis: per process and syscall, calls, failures by errno, total time and latency
//! percentiles, named from the running architecture's syscall table.

pub(crate) mod probes;
pub(crate) mod recommend;
pub(crate) mod section;

use crate::record::reader::saturating_sum;
use std::{collections::HashMap, sync::Arc, time::Duration};

use serde::Serialize;

use sysprof_common::SyscallKey;

pub use self::probes::{SyscallDump, SyscallSummary};
use crate::{latency::Percentiles, procs::ProcessTable};

/// The syscall section of the report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SyscallReport {
    /// Most total time first.
    pub rows: Vec<SyscallRow>,
    pub calls: u64,
    /// Calls timed one by one (the others' latency was sampled).
    pub timed: u64,
    pub errors: u64,
    pub total_ns: u64,
    /// Calls not counted: the syscall map had no room for their process and syscall, nor the
    /// by-number table for their number.
    #[serde(default)]
    pub lost: u64,
    /// Calls counted under no process (`UNATTRIBUTED`): the map had no room for their process.
    #[serde(default)]
    pub unattributed: u64,
}

/// One syscall of one process.
#[derive(Clone, Debug, Serialize)]
pub struct SyscallRow {
    pub pid: u32,
    /// Shared by the process's rows, as the syscall's name is by every process's: a busy host
    /// has tens of thousands of rows, held until the report is written.
    pub process: Arc<str>,
    pub syscall: Arc<str>,
    pub nr: u32,
    pub calls: u64,
    pub calls_per_s: f64,
    /// Calls timed from entry (the others' latency was sampled in bursts, see `latency`).
    pub timed: u64,
    /// Calls not sampled that blocked, timed from the moment they left the CPU.
    pub timed_from_block: u64,
    pub errors: u64,
    /// Failed calls by errno, most frequent first.
    pub errnos: Vec<ErrnoCount>,
    /// Latency percentiles and total time; when `timed` < `calls` these are estimates from the
    /// sampled calls, each standing for the calls around it.
    pub latency: Percentiles,
    /// Time in this syscall over the trace's wall time (threads add up: it can exceed 1).
    pub share_of_wall: f64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ErrnoCount {
    /// Symbolic name (EAGAIN), or the number when unknown.
    pub errno: String,
    pub count: u64,
}

pub use crate::procs::UNATTRIBUTED;

/// How the report names the processes the syscall map had no room for (`names::SYSCALLS_BY_NR`),
/// whose calls are under `UNATTRIBUTED`.
pub const UNATTRIBUTED_NAME: &str = "(processes the syscall map had no room for)";

/// How the report names the kernel's return-probe trampoline call, which it makes for sysprof's
/// uretprobes: sysprof's cost, never the target's.
pub const URETPROBE: &str = "uretprobe (sysprof's return probes)";

/// The name of syscall `nr` on this architecture.
pub fn syscall_name(nr: u32) -> String {
    let name = syscalls::Sysno::new(nr as usize).map(|s| s.name()).unwrap_or_default();
    match name {
        "" => format!("syscall_{nr}"),
        "uretprobe" => URETPROBE.into(),
        name => name.to_string(),
    }
}

/// "EBADF" for 9. The kernel's own restart codes (include/linux/errno.h), which a syscall
/// interrupted by a signal returns at its exit before the kernel restarts it or turns them into
/// EINTR, are named too.
pub fn errno_name(errno: u32) -> String {
    match errno {
        512 => return "ERESTARTSYS".into(),
        513 => return "ERESTARTNOINTR".into(),
        514 => return "ERESTARTNOHAND".into(),
        516 => return "ERESTART_RESTARTBLOCK".into(),
        _ => {}
    }
    match nix::errno::Errno::from_raw(errno as i32) {
        nix::errno::Errno::UnknownErrno => errno.to_string(),
        known => format!("{known:?}"),
    }
}

pub fn analyze(dump: &SyscallDump, processes: &ProcessTable, wall: Duration) -> SyscallReport {
    let wall_s = wall.as_secs_f64().max(1e-9);
    // Calls and failures still pending in the per-CPU caches join the shared maps' counts.
    let mut stats: HashMap<(u32, u32), SyscallSummary> =
        dump.stats.iter().map(|(key, stats)| ((key.tgid, key.nr), *stats)).collect();
    let mut by_errno: HashMap<(u32, u32, u32), u64> =
        dump.errors.iter().map(|(key, count)| ((key.tgid, key.nr, key.errno), *count)).collect();
    for pending in &dump.pending {
        // An entry may hold only the errnos of timed calls, which are counted in the maps.
        if pending.count != 0 {
            let stats = stats.entry((pending.tgid, pending.nr)).or_default();
            stats.calls = stats.calls.saturating_add(u64::from(pending.count));
            stats.errors = stats.errors.saturating_add(u64::from(pending.errors));
        }
        if pending.errno_count != 0 {
            let count = by_errno.entry((pending.tgid, pending.nr, pending.errno)).or_default();
            *count = count.saturating_add(u64::from(pending.errno_count));
        }
    }
    // A failure's errno is kept under its process even when its calls went to the by-number
    // table (the errno map had room): it joins those calls there.
    let mut unattributed_errnos: HashMap<(u32, u32), u64> = HashMap::new();
    for ((tgid, nr, errno), count) in by_errno.iter_mut() {
        if !stats.contains_key(&(*tgid, *nr)) && stats.contains_key(&(UNATTRIBUTED, *nr)) {
            let moved = unattributed_errnos.entry((*nr, *errno)).or_default();
            *moved = moved.saturating_add(std::mem::take(count));
        }
    }
    for ((nr, errno), count) in unattributed_errnos {
        let joined = by_errno.entry((UNATTRIBUTED, nr, errno)).or_default();
        *joined = joined.saturating_add(count);
    }
    let mut errnos: HashMap<(u32, u32), Vec<ErrnoCount>> = HashMap::new();
    for ((tgid, nr, errno), count) in by_errno.into_iter().filter(|(_, count)| *count != 0) {
        errnos.entry((tgid, nr)).or_default().push(ErrnoCount { errno: errno_name(errno), count });
    }
    let mut process_names: HashMap<u32, Arc<str>> = HashMap::new();
    let mut syscall_names: HashMap<u32, Arc<str>> = HashMap::new();
    let mut rows: Vec<SyscallRow> = stats
        .iter()
        .map(|(&(tgid, nr), stats)| {
            let key = SyscallKey { tgid, nr };
            let mut by_errno = errnos.remove(&(key.tgid, key.nr)).unwrap_or_default();
            by_errno.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.errno.cmp(&b.errno)));
            let latency = stats.latency;
            SyscallRow {
                pid: key.tgid,
                process: process_names
                    .entry(key.tgid)
                    .or_insert_with(|| {
                        if key.tgid == UNATTRIBUTED {
                            UNATTRIBUTED_NAME.into()
                        } else {
                            processes
                                .get(key.tgid)
                                .map(|p| p.name.as_str())
                                .filter(|n| !n.is_empty())
                                .map_or_else(|| format!("pid {}", key.tgid).into(), Arc::from)
                        }
                    })
                    .clone(),
                syscall: syscall_names.entry(key.nr).or_insert_with(|| syscall_name(key.nr).into()).clone(),
                nr: key.nr,
                calls: stats.calls,
                calls_per_s: stats.calls as f64 / wall_s,
                timed: stats.timed,
                timed_from_block: stats.timed_from_block,
                errors: stats.errors,
                errnos: by_errno,
                share_of_wall: stats.latency.total_ns as f64 / 1e9 / wall_s,
                latency,
            }
        })
        .collect();
    // Each (process, syscall) is one row, so no two compare equal, and an unstable sort orders
    // them as a stable one would without its scratch copy (megabytes for thousands of processes).
    rows.sort_unstable_by(|a, b| {
        b.latency.total_ns.cmp(&a.latency.total_ns).then(a.pid.cmp(&b.pid)).then(a.nr.cmp(&b.nr))
    });
    SyscallReport {
        calls: saturating_sum(rows.iter().map(|r| r.calls)),
        timed: saturating_sum(rows.iter().map(|r| r.timed.saturating_add(r.timed_from_block))),
        errors: saturating_sum(rows.iter().map(|r| r.errors)),
        total_ns: saturating_sum(rows.iter().map(|r| r.latency.total_ns)),
        unattributed: saturating_sum(rows.iter().filter(|r| r.pid == UNATTRIBUTED).map(|r| r.calls)),
        rows,
        lost: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_this_architectures_table() {
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(syscall_name(0), "read");
            assert_eq!(syscall_name(110), "getppid");
        }
        #[cfg(target_arch = "aarch64")]
        {
            assert_eq!(syscall_name(63), "read");
            assert_eq!(syscall_name(173), "getppid");
        }
        assert_eq!(syscall_name(100_000), "syscall_100000");
        if let Some(probe) = syscalls::Sysno::iter().find(|s| s.name() == "uretprobe") {
            assert_eq!(syscall_name(probe as u32), "uretprobe (sysprof's return probes)");
        }
    }

    #[test]
    fn the_calls_the_map_had_no_room_for_make_one_row_per_syscall_with_their_errnos() {
        use sysprof_common::{PendingCount, SyscallErrorKey};
        let summary = |calls, errors| SyscallSummary { calls, errors, ..Default::default() };
        let ioctl = 16;
        let dump = SyscallDump {
            stats: vec![
                (SyscallKey { tgid: 7, nr: 0 }, summary(5, 0)),
                (SyscallKey { tgid: UNATTRIBUTED, nr: ioctl }, summary(3, 2)),
            ],
            // Process 9's failed ioctls: counted in the by-number row, their errno under 9, one
            // in the errno map, one still in a CPU's cache.
            errors: vec![(SyscallErrorKey { tgid: 9, nr: ioctl, errno: 25, _pad: 0 }, 1)],
            pending: vec![PendingCount {
                tgid: 9,
                nr: ioctl,
                errno: 25,
                errno_count: 1,
                ..Default::default()
            }],
        };
        let report = analyze(&dump, &ProcessTable::default(), Duration::from_secs(1));
        assert_eq!(report.rows.len(), 2, "no row for process 9, which has no calls of its own: {report:#?}");
        let row = report.rows.iter().find(|r| r.pid == UNATTRIBUTED).unwrap();
        assert_eq!(&*row.process, UNATTRIBUTED_NAME);
        assert_eq!(row.errnos, vec![ErrnoCount { errno: errno_name(25), count: 2 }]);
        assert_eq!((report.calls, report.unattributed), (8, 3));
    }

    #[test]
    fn errnos_have_their_names() {
        assert_eq!(errno_name(9), "EBADF");
        assert_eq!(errno_name(11), "EAGAIN");
        assert_eq!(errno_name(4000), "4000");
        assert_eq!(errno_name(514), "ERESTARTNOHAND");
    }
}
