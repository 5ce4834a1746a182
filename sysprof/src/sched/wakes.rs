//! The wakeup relation: for each wait of a target thread, who ended it. The kernel side keeps,
//! at `sched_waking` (run by the waker), the thread that woke the waiter from a system call
//! and, when that thread is a target's, its user stack: the unlock that let a lock's waiter
//! go, the exit a join waited for, the write a reader waited for. A wait an interrupt ended (a
//! timer, a device) has no waker thread. Grouped by waiter thread, reason and waker, this is
//! the wait-for graph of the target's threads, and it names what held a held-up thread up.

use std::collections::HashMap;

use serde::Serialize;
use sysprof_common::{OffCpuValue, WakeKey, stack};

use super::{LockRelease, innermost_own_function, offcpu_reason, program_function, thread_name};
use crate::{
    procs::{ImageOf, ProcessTable},
    profile::{ResolvedStacks, StackSample},
    symbolize::Symbolizer,
};

/// Rows of the wait-for table.
pub const TOP_WAKES: usize = 12;

/// Waits of one thread, for one reason, ended by one waker.
#[derive(Clone, Debug, Serialize)]
pub struct Wake {
    pub pid: u32,
    pub tid: u32,
    /// The waiting thread's name.
    pub thread: String,
    pub reason: String,
    pub seconds: f64,
    pub wakeups: u64,
    /// The innermost function of the program where the thread blocked.
    pub blocked_in: Option<String>,
    /// Who ended the waits: "thread NAME (TID)", "process NAME (PID)" or "an interrupt (a
    /// timer or a device)".
    pub woken_by: String,
    pub waker_pid: Option<u32>,
    pub waker_tid: Option<u32>,
    /// The innermost function of the waker's program (not a runtime library's) as it woke the
    /// thread (the unlock, the post, the exit), when the waker is a target thread.
    pub waker_in: Option<String>,
}

/// The waits of `wakes` grouped by thread, reason and waker: the `TOP_WAKES` longest, and
/// the functions whose releases ended lock waits (from every group).
pub fn analyze(
    wakes: &[(WakeKey, OffCpuValue)],
    stacks: &HashMap<u32, Vec<u64>>,
    thread_names: &HashMap<u32, String>,
    processes: &mut ProcessTable,
    symbolizer: &mut Symbolizer,
) -> (Vec<Wake>, Vec<LockRelease>) {
    let sample = |tgid: u32, exec_id: u32, user_stack_id: i32, kernel_stack_id: i32| StackSample {
        tgid,
        tid: tgid,
        user_stack_id,
        kernel_stack_id,
        comm: None,
        weight: 0,
        tag: 0,
        image: ImageOf::Generation(exec_id),
    };
    let waiter = |key: &WakeKey| sample(key.tgid, key.exec_id, key.user_stack_id, key.kernel_stack_id);
    let waker =
        |key: &WakeKey| sample(key.waker_tgid, key.waker_exec_id, key.waker_user_stack_id, stack::NONE);
    let samples: Vec<StackSample> = wakes
        .iter()
        .flat_map(|(key, _)| std::iter::once(waiter(key)).chain((key.waker_tgid != 0).then(|| waker(key))))
        .collect();
    let resolved = ResolvedStacks::resolve(&samples, stacks, processes, symbolizer);
    drop(samples);

    // Figures only, until the rows shown are chosen: a busy host's threads make thousands of
    // groups, and their rows' names took 2.6 MB at the end's peak, for the 12 shown.
    let mut grouped: HashMap<GroupKey, Group> = HashMap::new();
    for (key, value) in wakes {
        let waiter = waiter(key);
        let user = resolved.user_frames(&waiter);
        let reason = offcpu_reason(key.state, resolved.kernel_frames(&waiter), user);
        let waker_in =
            (key.waker_tgid != 0).then(|| program_function(resolved.user_frames(&waker(key)))).flatten();
        let group = grouped.entry((key.tid, reason, key.waker_tid, waker_in)).or_insert_with(|| Group {
            key: *key,
            seconds: 0.0,
            wakeups: 0,
            blocked_at: None,
        });
        group.seconds += value.total_ns as f64 / 1e9;
        group.wakeups = group.wakeups.saturating_add(value.count);
        if group.blocked_at.is_none() && innermost_own_function(user).is_some() {
            group.blocked_at = Some(waiter);
        }
    }
    let mut groups: Vec<_> = grouped.into_iter().collect();
    groups.sort_by(|(a, x), (b, y)| y.seconds.total_cmp(&x.seconds).then(a.0.cmp(&b.0)));
    let releases = lock_releases(&groups);
    let rows = groups
        .into_iter()
        .take(TOP_WAKES)
        .map(|((tid, reason, waker_tid, waker_in), group)| {
            let key = &group.key;
            Wake {
                pid: key.tgid,
                tid,
                thread: thread_names.get(&tid).cloned().unwrap_or_else(|| format!("tid {tid}")),
                reason: reason.to_string(),
                seconds: group.seconds,
                wakeups: group.wakeups,
                blocked_in: group
                    .blocked_at
                    .and_then(|waiter| innermost_own_function(resolved.user_frames(&waiter))),
                woken_by: woken_by(key, thread_names, processes),
                waker_pid: (key.waker_tgid != 0).then_some(key.waker_tgid),
                waker_tid: (waker_tid != 0).then_some(waker_tid),
                waker_in,
            }
        })
        .collect();
    (rows, releases)
}

/// What the waits are grouped by: the waiting thread, the reason, the waker thread and the
/// function of its program it woke them from.
type GroupKey = (u32, &'static str, u32, Option<String>);

/// One group of waits as it adds up.
struct Group {
    /// The first key of the group: its process and waker's.
    key: WakeKey,
    seconds: f64,
    wakeups: u64,
    /// The first wait of the group that blocked in the program's own code.
    blocked_at: Option<StackSample>,
}

/// The functions whose releases ended lock waits, per process, most waiting ended first.
fn lock_releases(groups: &[(GroupKey, Group)]) -> Vec<LockRelease> {
    let mut releases: Vec<LockRelease> = Vec::new();
    for ((_, reason, _, waker_in), group) in groups {
        let (pid, waker_pid) = (group.key.tgid, group.key.waker_tgid);
        let Some(function) = waker_in.as_ref().filter(|_| *reason == "lock contention" && waker_pid == pid)
        else {
            continue;
        };
        match releases.iter_mut().find(|r| r.pid == pid && r.released_in == *function) {
            Some(release) => {
                release.seconds += group.seconds;
                release.wakeups = release.wakeups.saturating_add(group.wakeups);
            }
            None => releases.push(LockRelease {
                pid,
                released_in: function.clone(),
                seconds: group.seconds,
                wakeups: group.wakeups,
            }),
        }
    }
    releases.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    releases
}

/// The waker, named: a thread of a target (its name and id), another process, or an interrupt.
fn woken_by(key: &WakeKey, thread_names: &HashMap<u32, String>, processes: &ProcessTable) -> String {
    if key.waker_tid == 0 {
        return "an interrupt (a timer or a device)".into();
    }
    if let Some(name) = thread_names.get(&key.waker_tid) {
        return format!("thread {name} ({})", key.waker_tid);
    }
    match processes.get(key.waker_tgid).map(|p| p.name.as_str()).filter(|n| !n.is_empty()) {
        Some(name) => format!("process {name} ({})", key.waker_tgid),
        None => format!("pid {}", key.waker_tgid),
    }
}

/// Thread names by id, from the scheduler's per-thread statistics.
pub fn thread_names(
    threads: &[(u32, sysprof_common::ThreadSched)],
    processes: &ProcessTable,
) -> HashMap<u32, String> {
    threads.iter().map(|(tid, t)| (*tid, thread_name(*tid, t, processes))).collect()
}
