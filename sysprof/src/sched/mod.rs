//! Scheduler analysis: per process and thread, CPU time and utilization, voluntary and
//! involuntary switches, run-queue latency, and off-CPU time by reason and by stack.

pub(crate) mod probes;
pub(crate) mod recommend;
pub(crate) mod section;
pub(crate) mod wakes;

use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use serde::Serialize;
use sysprof_common::{TASK_REPORT_MAX, ThreadSched};

pub use self::probes::SchedDump;
use crate::{
    latency::{self, Percentiles},
    procs::{ImageOf, ProcessTable, comm_to_string},
    profile::{StackProfile, StackSample},
    symbolize::Frame,
};

/// Threads shown per process.
const TOP_THREADS: usize = 5;
/// Off-CPU stacks shown.
const TOP_OFFCPU_STACKS: usize = 10;

/// The scheduler section of the report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SchedReport {
    /// Largest CPU time first.
    pub processes: Vec<ProcessSched>,
    /// Target CPU time over wall time, all processes together.
    pub utilization: f64,
    /// The longest off-CPU stacks, all processes together.
    pub top_offcpu: Vec<OffCpuStack>,
    /// The wait-for graph: the longest waits by thread, reason and who ended them.
    pub wakes: Vec<wakes::Wake>,
    /// Where the lock a process's threads waited for was released, by the releasing function:
    /// the critical sections that held them up.
    pub lock_releases: Vec<LockRelease>,
}

/// A function that released a lock other threads of its process waited for.
#[derive(Clone, Debug, Serialize)]
pub struct LockRelease {
    pub pid: u32,
    pub released_in: String,
    /// The waits its releases ended, and how many.
    pub seconds: f64,
    pub wakeups: u64,
}

/// One process's scheduling.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessSched {
    pub pid: u32,
    pub name: String,
    pub threads: usize,
    pub cpu_time_s: f64,
    /// Its lifetime in the trace (the whole trace for a process that was already running).
    pub wall_s: f64,
    /// CPU time over wall time: above 1 when several threads run at once.
    pub utilization: f64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    pub voluntary_per_s: f64,
    pub involuntary_per_s: f64,
    /// Wakeup (or preemption) to running.
    pub runq_latency: Option<Percentiles>,
    pub offcpu_s: f64,
    /// What the hypervisor took from the CPUs while its threads were on them (steal; and
    /// interrupt time, where the kernel accounts it apart): neither its CPU time nor a wait of
    /// its own.
    pub stolen_s: f64,
    /// Largest first.
    pub offcpu_by_reason: Vec<ReasonTime>,
    /// The busiest threads.
    pub top_threads: Vec<ThreadRow>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReasonTime {
    pub reason: String,
    pub seconds: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ThreadRow {
    pub tid: u32,
    pub name: String,
    pub cpu_time_s: f64,
    pub utilization: f64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    pub offcpu_s: f64,
    pub stolen_s: f64,
}

/// One off-CPU stack and the time spent blocked in it.
#[derive(Clone, Debug, Serialize)]
pub struct OffCpuStack {
    pub pid: u32,
    pub process: String,
    pub reason: String,
    pub seconds: f64,
    /// The innermost function of the program (user code) on the stack: who blocked.
    pub blocked_in: Option<String>,
    /// Function names, outermost first.
    pub frames: Vec<String>,
}

/// Waits that hold a thread up (the time is lost to the target), as opposed to waits for work
/// (a sleep, an event loop's epoll_wait, a condition variable, a join): those are idle, never a
/// bottleneck.
pub const HELD_UP: [&str; 6] = [
    "preempted",
    "lock contention",
    GIL_WAIT,
    "page fault read from disk",
    "disk/uninterruptible I/O",
    "pipe/socket I/O",
];

/// A Python thread blocked until the interpreter lock is free: another thread runs Python.
pub const GIL_WAIT: &str = "waiting for the GIL";

/// CPython's functions that block for the GIL: `take_gil` (static, named where the interpreter
/// has a symbol table) and the exported ones that call it.
const GIL_TAKERS: [&str; 4] =
    ["take_gil", "PyEval_RestoreThread", "PyEval_AcquireThread", "PyGILState_Ensure"];

/// Why a thread was off CPU, from its state at the switch (`sched_switch` prev_state), its
/// kernel frames and the innermost of its user frames (the one that made the call, exact even
/// through code built without frame pointers).
pub fn offcpu_reason(state: u32, kernel: &[Frame], user: &[Frame]) -> &'static str {
    const UNINTERRUPTIBLE: u32 = 0x2;
    const STOPPED: u32 = 0x4 | 0x8;
    /// TASK_NOLOAD: with UNINTERRUPTIBLE, TASK_IDLE, a kernel thread parked until work comes.
    const NOLOAD: u32 = 0x400;
    if state == 0 || state == TASK_REPORT_MAX {
        return "preempted";
    }
    if state & NOLOAD != 0 {
        return "idle (waiting for work)";
    }
    let any = |needles: &[&str]| kernel.iter().any(|f| needles.iter().any(|n| f.function.contains(n)));
    if any(&["futex"]) {
        // The futex word is a mutex's when the call comes from a lock's slow path (glibc's
        // __lll_lock_wait, pthread_mutex_lock, Rust's lock_contended, rwlocks); otherwise it is a
        // condition variable, a join or a semaphore: waiting for another thread or for work.
        let caller = user.last().map(|f| f.function.to_ascii_lowercase()).unwrap_or_default();
        // Only the C code under the innermost Python frame: the wait is its own.
        let native_leaf = user.iter().rev().take_while(|f| !f.is_python());
        if native_leaf.into_iter().any(|f| GIL_TAKERS.contains(&&*f.function)) {
            GIL_WAIT
        } else if caller.contains("lock") && !caller.contains("unlock") {
            "lock contention"
        } else {
            "futex wait (condition, join, semaphore)"
        }
    } else if any(&["ep_poll", "do_epoll_wait", "do_select", "do_sys_poll", "core_sys_select"]) {
        // Before the sleeps: a select or poll with a timeout sleeps in poll_schedule_timeout.
        // CPython 3.10's time.sleep is a select() with no descriptors.
        if user.iter().rev().take_while(|f| !f.is_python()).any(|f| &*f.function == "time_sleep") {
            "sleep"
        } else {
            "poll/epoll wait"
        }
    } else if any(&["nanosleep", "hrtimer_sleep", "do_nanosleep", "schedule_timeout"])
        && state & UNINTERRUPTIBLE == 0
    {
        "sleep"
    } else if any(&[
        "pipe_read",
        "pipe_write",
        "unix_stream",
        "sock_",
        "tcp_",
        "udp_",
        "inet_",
        "sk_wait",
        "netlink",
    ]) {
        "pipe/socket I/O"
    } else if any(&["filemap_fault"]) && state & UNINTERRUPTIBLE != 0 {
        // A fault on a mapped file (the program's own code, an mmapped file) whose page was not
        // in the page cache: a major fault, not a read the program made.
        "page fault read from disk"
    } else if any(&["do_wait", "kernel_wait"]) {
        "waiting for a child"
    } else if state & UNINTERRUPTIBLE != 0 || any(&["io_schedule", "folio_wait", "blk_", "jbd2"]) {
        "disk/uninterruptible I/O"
    } else if state & STOPPED != 0 {
        "stopped"
    } else {
        "other sleep"
    }
}

/// The off-CPU samples of the dump: weight in microseconds, the scheduler state as the tag.
pub fn offcpu_samples(dump: &SchedDump) -> Vec<StackSample> {
    dump.offcpu
        .iter()
        .map(|(key, value)| StackSample {
            tgid: key.tgid,
            tid: key.tgid,
            user_stack_id: key.user_stack_id,
            kernel_stack_id: key.kernel_stack_id,
            comm: None,
            weight: value.total_ns / 1_000,
            tag: key.state,
            image: ImageOf::Generation(key.exec_id),
        })
        .collect()
}

/// Builds the scheduler report. `offcpu` is the off-CPU profile whose first frame is the
/// reason label; `end_ns` is the monotonic time the trace ended (for threads still on a CPU).
pub fn analyze(
    dump: &SchedDump,
    offcpu: &StackProfile,
    processes: &ProcessTable,
    wall: Duration,
    end_ns: u64,
) -> SchedReport {
    let wall_s = wall.as_secs_f64().max(1e-9);
    let mut threads_by_pid: HashMap<u32, Vec<(u32, &ThreadSched)>> = HashMap::new();
    for (tid, thread) in &dump.threads {
        threads_by_pid.entry(thread.tgid).or_default().push((*tid, thread));
    }
    let runq: HashMap<u32, Percentiles> =
        dump.runq.iter().map(|(pid, hist)| (*pid, latency::percentiles(hist))).collect();
    // Microseconds, by reason in name order: sums that come out the same run after run (in
    // seconds, added in a hash map's order, their last digits did not).
    let mut reasons: HashMap<u32, BTreeMap<String, u64>> = HashMap::new();
    for stack in &offcpu.stacks {
        let reason =
            stack.frames.first().map(|f| f.function.trim_matches(['[', ']']).to_string()).unwrap_or_default();
        let slot = reasons.entry(stack.pid).or_default().entry(reason).or_default();
        *slot = slot.saturating_add(stack.weight);
    }

    let mut rows: Vec<ProcessSched> = threads_by_pid
        .into_iter()
        .map(|(pid, threads)| {
            let mut thread_rows: Vec<ThreadRow> = threads
                .iter()
                .map(|(tid, t)| {
                    let cpu = cpu_time_ns(t, end_ns) as f64 / 1e9;
                    ThreadRow {
                        tid: *tid,
                        name: thread_name(*tid, t, processes),
                        cpu_time_s: cpu,
                        utilization: cpu / wall_s,
                        voluntary_switches: t.voluntary,
                        involuntary_switches: t.involuntary,
                        offcpu_s: t.offcpu_ns as f64 / 1e9,
                        stolen_s: t.stolen_ns as f64 / 1e9,
                    }
                })
                .collect();
            thread_rows.sort_by(|a, b| b.cpu_time_s.total_cmp(&a.cpu_time_s).then(a.tid.cmp(&b.tid)));
            let cpu_time_s: f64 = thread_rows.iter().map(|t| t.cpu_time_s).sum();
            let voluntary =
                crate::record::reader::saturating_sum(thread_rows.iter().map(|t| t.voluntary_switches));
            let involuntary =
                crate::record::reader::saturating_sum(thread_rows.iter().map(|t| t.involuntary_switches));
            let offcpu_s: f64 = thread_rows.iter().map(|t| t.offcpu_s).sum();
            let stolen_s: f64 = thread_rows.iter().map(|t| t.stolen_s).sum();
            let mut by_reason: Vec<ReasonTime> = reasons
                .remove(&pid)
                .unwrap_or_default()
                .into_iter()
                .map(|(reason, us)| ReasonTime { reason, seconds: us as f64 / 1e6 })
                .collect();
            take_back_switch_path(&mut by_reason, offcpu_s);
            by_reason.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
            let name = processes
                .get(pid)
                .map(|p| p.name.clone())
                .filter(|n| !n.is_empty())
                .or_else(|| thread_rows.iter().find(|t| t.tid == pid).map(|t| t.name.clone()))
                .unwrap_or_else(|| format!("pid {pid}"));
            let threads = thread_rows.len();
            // Its lifetime in the trace: a process started during it is seen from its first
            // thread's first switch, so its longest-lived thread's on and off time is how long
            // it lived; one that was there before lived the whole trace, as far as sysprof knows.
            let lifetime_s = match processes.get(pid).is_some_and(|p| p.started_during_trace) {
                true => thread_rows
                    .iter()
                    .map(|t| t.cpu_time_s + t.offcpu_s + t.stolen_s)
                    .fold(0.0, f64::max)
                    .min(wall_s)
                    .max(1e-9),
                false => wall_s,
            };
            for thread in &mut thread_rows {
                thread.utilization = thread.cpu_time_s / lifetime_s;
            }
            thread_rows.truncate(TOP_THREADS);
            ProcessSched {
                pid,
                name,
                threads,
                cpu_time_s,
                wall_s: lifetime_s,
                utilization: cpu_time_s / lifetime_s,
                voluntary_switches: voluntary,
                involuntary_switches: involuntary,
                voluntary_per_s: voluntary as f64 / lifetime_s,
                involuntary_per_s: involuntary as f64 / lifetime_s,
                runq_latency: runq.get(&pid).copied(),
                offcpu_s,
                stolen_s,
                offcpu_by_reason: by_reason,
                top_threads: thread_rows,
            }
        })
        .collect();
    rows.sort_by(|a, b| b.cpu_time_s.total_cmp(&a.cpu_time_s).then(a.pid.cmp(&b.pid)));
    // From 0.0: a float sum of nothing is -0.0, which a target that never ran read as "-0.00".
    let utilization = rows.iter().map(|r| r.cpu_time_s).fold(0.0, |sum, s| sum + s) / wall_s;
    SchedReport { processes: rows, utilization, top_offcpu: top_offcpu(offcpu), ..SchedReport::default() }
}

/// Makes a process's waits by reason add up to its threads' off-CPU time. The waits are timed
/// on sysprof's clock, from a thread's switch-out to its switch-in, and so hold the switch's
/// own path, which the kernel charges to the arriving thread from the start of the switch: its
/// CPU clock, which is the on-CPU time, counts it, and the switch program takes it out of the
/// thread's off-CPU time (`account_switch_out`). A few microseconds a switch on a VM, it was
/// 14% of a pipe ping-pong's waits, and its time model came to 109%. It is taken back from
/// the wait for a CPU first (the switch is the CPU being handed over), then from every reason
/// in proportion.
fn take_back_switch_path(by_reason: &mut [ReasonTime], offcpu_s: f64) {
    let total: f64 = by_reason.iter().map(|r| r.seconds).sum();
    let mut excess = total - offcpu_s;
    if excess <= 0.0 {
        return;
    }
    if let Some(preempted) = by_reason.iter_mut().find(|r| r.reason == "preempted") {
        let taken = excess.min(preempted.seconds);
        preempted.seconds -= taken;
        excess -= taken;
    }
    let left: f64 = by_reason.iter().map(|r| r.seconds).sum();
    if excess > 0.0 && left > 0.0 {
        let keep = (1.0 - excess / left).max(0.0);
        for reason in by_reason.iter_mut() {
            reason.seconds *= keep;
        }
    }
}

/// A thread's name: its own, kept at its first switch in the trace, as
/// `ProcessTable::thread_name` shows it.
pub fn thread_name(tid: u32, thread: &ThreadSched, processes: &ProcessTable) -> String {
    processes.thread_name(tid, thread.tgid, &comm_to_string(&thread.comm))
}

/// On-CPU time of a thread, counting the stretch it is still running at the end.
fn cpu_time_ns(thread: &ThreadSched, end_ns: u64) -> u64 {
    let running = if thread.on_cpu != 0 { end_ns.saturating_sub(thread.last_switch_in_ns) } else { 0 };
    thread.oncpu_ns + running
}

fn top_offcpu(offcpu: &StackProfile) -> Vec<OffCpuStack> {
    offcpu
        .stacks
        .iter()
        .take(TOP_OFFCPU_STACKS)
        .map(|stack| {
            let reason = stack
                .frames
                .first()
                .map(|f| f.function.trim_matches(['[', ']']).to_string())
                .unwrap_or_default();
            let code = &stack.frames[1.min(stack.frames.len())..];
            OffCpuStack {
                pid: stack.pid,
                process: stack.process.clone(),
                reason,
                seconds: stack.weight as f64 / 1e6,
                blocked_in: innermost_own_function(code),
                frames: code.iter().map(|f| f.function.to_string()).collect(),
            }
        })
        .collect()
}

/// The innermost user function of `frames` (outermost first) that is the program's own code,
/// not a runtime library's (else the innermost user function): who blocked, or who woke.
pub fn innermost_own_function(frames: &[Frame]) -> Option<String> {
    program_function(frames)
        .or_else(|| frames.iter().rev().find(|f| is_user(f)).map(|f| f.function.to_string()))
}

/// The innermost user function of `frames` that is the program's own code, if any.
pub fn program_function(frames: &[Frame]) -> Option<String> {
    frames.iter().rev().find(|f| is_user(f) && !is_runtime_library(&f.module)).map(|f| f.function.to_string())
}

fn is_user(frame: &Frame) -> bool {
    !frame.is_kernel() && !frame.module.is_empty() && !frame.function.starts_with('[')
}

/// Libraries whose frames name the mechanism (a futex wrapper, a syscall stub) rather than the
/// program's code that blocked.
fn is_runtime_library(module: &str) -> bool {
    ["libc.so", "libc-", "libpthread", "ld-linux", "libstdc++"].iter().any(|lib| module.starts_with(lib))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(names: &[&str]) -> Vec<Frame> {
        names.iter().map(|n| Frame::new((*n).into(), Frame::KERNEL_MODULE.into())).collect()
    }

    #[test]
    fn the_switch_path_is_taken_back_from_the_wait_for_a_cpu_first() {
        let reasons = |pairs: &[(&str, f64)]| -> Vec<ReasonTime> {
            pairs.iter().map(|(r, s)| ReasonTime { reason: r.to_string(), seconds: *s }).collect()
        };
        let seconds =
            |v: &[ReasonTime]| -> Vec<f64> { v.iter().map(|r| (r.seconds * 1e6).round() / 1e6).collect() };
        // A ping-pong: 0.4 s of its waits were the switches' path, counted on a CPU.
        let mut pingpong = reasons(&[("preempted", 1.5), ("pipe/socket I/O", 1.0)]);
        take_back_switch_path(&mut pingpong, 2.1);
        assert_eq!(seconds(&pingpong), [1.1, 1.0]);
        // More than the wait for a CPU holds: the rest in proportion.
        let mut sleeper = reasons(&[("preempted", 0.1), ("sleep", 3.0), ("futex", 1.0)]);
        take_back_switch_path(&mut sleeper, 3.6);
        assert_eq!(seconds(&sleeper), [0.0, 2.7, 0.9]);
        // Nothing over: nothing changes.
        let mut fine = reasons(&[("sleep", 3.0)]);
        take_back_switch_path(&mut fine, 3.5);
        assert_eq!(seconds(&fine), [3.0]);
    }

    #[test]
    fn reasons_from_state_and_kernel_stack() {
        assert_eq!(offcpu_reason(0, &kernel(&["schedule"]), &[]), "preempted");
        assert_eq!(offcpu_reason(TASK_REPORT_MAX, &[], &[]), "preempted");
        // make's pselect with a timeout sleeps in poll_schedule_timeout: a poll, not a sleep.
        let pselect =
            kernel(&["do_select", "poll_schedule_timeout.constprop.0", "schedule_hrtimeout_range_clock"]);
        assert_eq!(offcpu_reason(1, &pselect, &[]), "poll/epoll wait");
        assert_eq!(
            offcpu_reason(1, &kernel(&["__x64_sys_futex", "futex_wait", "schedule"]), &[]),
            "futex wait (condition, join, semaphore)"
        );
        let caller = [Frame::new("__GI___lll_lock_wait".into(), "libc.so.6".into())];
        assert_eq!(offcpu_reason(1, &kernel(&["__x64_sys_futex", "futex_wait"]), &caller), "lock contention");
        let gil = [
            Frame::new("worker (app.py:3)".into(), "app.py".into()),
            Frame::new("PyEval_RestoreThread".into(), "python3.12".into()),
            Frame::new("take_gil".into(), "python3.12".into()),
            Frame::new("pthread_cond_timedwait".into(), "libc.so.6".into()),
        ];
        assert_eq!(offcpu_reason(1, &kernel(&["__x64_sys_futex", "futex_wait"]), &gil), GIL_WAIT);
        // A GIL taken further out, around a Python frame, is not this wait's.
        let lock = [gil[1].clone(), gil[0].clone(), caller[0].clone()];
        assert_eq!(offcpu_reason(1, &kernel(&["__x64_sys_futex", "futex_wait"]), &lock), "lock contention");
        assert_eq!(offcpu_reason(0x402, &kernel(&["kthread", "schedule"]), &[]), "idle (waiting for work)");
        assert_eq!(
            offcpu_reason(1, &kernel(&["__x64_sys_clock_nanosleep", "do_nanosleep", "schedule"]), &[]),
            "sleep"
        );
        assert_eq!(
            offcpu_reason(1, &kernel(&["do_epoll_wait", "ep_poll", "schedule"]), &[]),
            "poll/epoll wait"
        );
        assert_eq!(
            offcpu_reason(1, &kernel(&["ksys_read", "pipe_read", "schedule"]), &[]),
            "pipe/socket I/O"
        );
        assert_eq!(offcpu_reason(2, &kernel(&["io_schedule"]), &[]), "disk/uninterruptible I/O");
        let fault = kernel(&["asm_exc_page_fault", "filemap_fault", "folio_wait_bit_common", "io_schedule"]);
        assert_eq!(offcpu_reason(2, &fault, &[]), "page fault read from disk");
        assert_eq!(offcpu_reason(1, &kernel(&["do_wait", "schedule"]), &[]), "waiting for a child");
        assert_eq!(offcpu_reason(1, &[], &[]), "other sleep");
    }

    #[test]
    fn running_threads_count_until_the_end() {
        let thread = ThreadSched {
            tgid: 1,
            on_cpu: 1,
            voluntary: 0,
            involuntary: 0,
            oncpu_ns: 500,
            offcpu_ns: 0,
            stolen_ns: 0,
            last_switch_in_ns: 1_000,
            comm: [0; 16],
        };
        assert_eq!(cpu_time_ns(&thread, 1_700), 1_200);
        assert_eq!(cpu_time_ns(&ThreadSched { on_cpu: 0, ..thread }, 1_700), 500);
    }
}
