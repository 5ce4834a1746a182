//! What the scheduler figures recommend: oversubscription, and the waits that hold a thread up
//! (lock contention, disk I/O, a slow peer), in seconds of the target's time: the mean wait of
//! a thread of the process. Waiting for work (sleeps, epoll_wait, condition variables, joins,
//! parked kernel threads) is idle, never advice.

use std::collections::BTreeMap;

use super::{ProcessSched, SchedReport};
use crate::{
    latency::format_ns,
    report::{format::count, recommendation::Recommendation},
};

/// Total utilization above this share of the CPUs counts as saturated.
const SATURATED: f64 = 0.85;
/// Involuntary switches per second above which preemption is worth a look.
const INVOLUNTARY_PER_S: f64 = 100.0;
/// Off-CPU reasons worth a recommendation once they take this share of the threads' time.
const BLOCKED_SHARE: f64 = 0.10;

/// `machine_busy` is the share of all CPUs' time that was busy (every process, /proc/stat).
pub fn sched_recommendations(
    sched: &SchedReport,
    cpus: u32,
    machine_busy: Option<f64>,
    wall_s: f64,
) -> Vec<Recommendation> {
    // CPUs the target could have used beyond what it did: those the rest of the machine left.
    let others = machine_busy.map_or(0.0, |busy| (busy * f64::from(cpus) - sched.utilization).max(0.0));
    let free_cpus = (f64::from(cpus) - others).max(1.0);
    let mut recommendations = Vec::new();
    let cpu_s: f64 = sched.processes.iter().map(|p| p.cpu_time_s).sum();
    let involuntary_per_s: f64 = sched.processes.iter().map(|p| p.involuntary_per_s).sum();
    let runq_s: f64 =
        sched.processes.iter().filter_map(|p| p.runq_latency).map(|r| r.total_ns as f64 / 1e9).sum();
    let worst_p99 =
        sched.processes.iter().filter_map(|p| p.runq_latency).map(|r| r.p99_ns).max().unwrap_or(0);
    let threads: usize = sched.processes.iter().map(|p| p.threads.max(1)).sum();
    let machine = machine_busy.is_some_and(|busy| busy >= SATURATED);
    // Its own threads saturate the CPUs, or take most of a saturated machine (the rest is the
    // kernel's and other processes' share, which is then not the cause).
    let own = sched.utilization >= SATURATED * f64::from(cpus) || (machine && sched.utilization >= others);
    if (own || machine) && involuntary_per_s >= INVOLUNTARY_PER_S {
        let seconds = runq_s / threads.max(1) as f64;
        let (title, action) = if own {
            (
                "CPU oversubscribed: more runnable threads than CPUs",
                "Run no more busy threads than CPUs: size thread pools to the cores (OMP_NUM_THREADS, \
                 torch.set_num_threads, worker counts), move other work off these CPUs, or add CPUs",
            )
        } else {
            (
                "CPU oversubscribed: other processes take the CPUs it waits for",
                "Give it CPUs of its own (cgroup cpu.weight or cpusets, nice the other work, taskset), move \
                 the other work elsewhere, or add CPUs",
            )
        };
        recommendations.push(Recommendation::new(
            seconds,
            title,
            format!(
                "utilization {:.2} on {}{}, {:.0} involuntary switches/s; {} waited \
                 {runq_s:.2} s for a CPU, {seconds:.2} s each on average (run-queue latency p99 {}, {:.2} s \
                 of CPU)",
                sched.utilization,
                count(u64::from(cpus), "CPU", "CPUs"),
                machine_busy
                    .map(|busy| format!(" (the machine {:.0}% busy)", busy * 100.0))
                    .unwrap_or_default(),
                involuntary_per_s,
                count(threads as u64, "thread", "threads"),
                format_ns(worst_p99),
                cpu_s
            ),
            action,
        ));
    }
    for process in &sched.processes {
        let thread_time = process.wall_s * process.threads.max(1) as f64;
        let Some(reason) = process.offcpu_by_reason.iter().find(|r| r.reason == "lock contention") else {
            continue;
        };
        let share = reason.seconds / thread_time;
        if share < BLOCKED_SHARE {
            continue;
        }
        // The threads' waits overlap in time: the mean wait of one is what the process could
        // win back of its elapsed time. Without the lock, its threads could run on the CPUs the
        // machine left free, no more: on a machine with none, nothing comes back.
        let mean_wait = reason.seconds / process.threads.max(1) as f64;
        let mut seconds = mean_wait;
        let mut cap = String::new();
        let could_run = free_cpus.min(process.threads as f64);
        let parallel_win = process.wall_s * (1.0 - process.utilization / could_run).max(0.0);
        if parallel_win < mean_wait {
            seconds = parallel_win;
            cap = format!(
                "; it runs {:.2} CPUs' worth where {could_run:.1} were free for it, so removing the wait \
                 wins at most {parallel_win:.2} s",
                process.utilization
            );
        }
        recommendations.push(Recommendation::new(
            seconds,
            format!("Lock contention in {}", process.name),
            format!(
                "{:.2} s off CPU for lock contention across {} ({:.1}% of their time, {mean_wait:.2} s \
                 each on average){cap}{}{}",
                reason.seconds,
                count(process.threads as u64, "thread", "threads"),
                share * 100.0,
                longest_wait(sched, &[process.pid], &reason.reason),
                released_by(sched, process.pid)
            ),
            "Shorten critical sections, split the lock (per shard or per thread), or use lock-free queues; \
             check the blocking stacks in offcpu.svg",
        ));
    }
    let mut programs: BTreeMap<&str, Vec<&ProcessSched>> = BTreeMap::new();
    for process in &sched.processes {
        programs.entry(process.name.as_str()).or_default().push(process);
    }
    // Disk and peer waits, by program: a build's dozen compilers are one cause. Their waits add
    // up where the processes ran one after another, and overlap where they ran at once: what
    // comes back of the elapsed time is the total scaled by the trace over their lifetimes.
    for (reason, what, action) in [
        (
            "page fault read from disk",
            "waits for its mapped files' pages from disk",
            "These are page faults on mapped files (its own code, libraries, mmapped data) whose pages \
             were not in the page cache: a warm cache (a second run, vmtouch), memory left for the page \
             cache, or reading them ahead (MAP_POPULATE, madvise WILLNEED) removes them",
        ),
        (
            "disk/uninterruptible I/O",
            "waits on disk I/O",
            "Read ahead or in larger blocks, cache what is read again, move I/O off the critical path \
             (async I/O, a loader thread)",
        ),
        (
            "pipe/socket I/O",
            "waits on pipes or sockets",
            "If the peer is slow, look at it; otherwise overlap the waits (more requests in flight, \
             async I/O)",
        ),
    ] {
        for (name, group) in &programs {
            let waited: f64 = group
                .iter()
                .flat_map(|p| p.offcpu_by_reason.iter().filter(|r| r.reason == reason))
                .map(|r| r.seconds)
                .sum();
            let threads: usize = group.iter().map(|p| p.threads.max(1)).sum();
            let lifetimes: f64 =
                group.iter().map(|p| p.wall_s * p.threads.max(1) as f64).sum::<f64>().max(1e-9);
            let share = waited / lifetimes;
            if waited <= 0.0 || share < BLOCKED_SHARE {
                continue;
            }
            let seconds = waited * (wall_s / lifetimes).min(1.0);
            let processes = match group.len() {
                1 => String::new(),
                n => format!(" of {n} processes"),
            };
            let pids: Vec<u32> = group.iter().map(|p| p.pid).collect();
            recommendations.push(Recommendation::new(
                seconds,
                format!("{name} {what}"),
                format!(
                    "{waited:.2} s off CPU for {reason} across {}{processes} ({:.1}% of their \
                     time), about {seconds:.2} s of the trace's elapsed time{}",
                    count(threads as u64, "thread", "threads"),
                    share * 100.0,
                    longest_wait(sched, &pids, reason)
                ),
                action,
            ));
        }
    }
    recommendations
}

/// "; the lock is released in F, ...": the holder's code, from the wakeup relation (the
/// thread whose unlock woke the waiters), which is the critical section to shorten.
fn released_by(sched: &SchedReport, pid: u32) -> String {
    let mut releases = sched.lock_releases.iter().filter(|r| r.pid == pid);
    let Some(top) = releases.next() else { return String::new() };
    let others = releases.count();
    format!(
        "; the lock is released in {} (its unlocks woke waiters {}, ending {:.2} s of waits{}): the \
         critical section that holds them up",
        top.released_in,
        count(top.wakeups, "time", "times"),
        top.seconds,
        match others {
            0 => String::new(),
            n => format!("; {n} other function{} release it too", if n == 1 { "" } else { "s" }),
        }
    )
}

/// "; the longest waits are in F (S s)": the longest wait for `reason` of these processes, and
/// the function that blocked.
fn longest_wait(sched: &SchedReport, pids: &[u32], reason: &str) -> String {
    sched
        .top_offcpu
        .iter()
        .find(|s| pids.contains(&s.pid) && s.reason == reason)
        .and_then(|s| {
            s.blocked_in.clone().map(|f| format!("; the longest waits are in {f} ({:.2} s)", s.seconds))
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::ReasonTime;

    /// A single-threaded process of `name` that lived `wall_s` and waited `disk_s` on the disk.
    fn process(pid: u32, name: &str, wall_s: f64, disk_s: f64) -> ProcessSched {
        ProcessSched {
            pid,
            name: name.into(),
            threads: 1,
            cpu_time_s: wall_s - disk_s,
            wall_s,
            utilization: (wall_s - disk_s) / wall_s,
            voluntary_switches: 1,
            involuntary_switches: 0,
            voluntary_per_s: 1.0,
            involuntary_per_s: 0.0,
            runq_latency: None,
            offcpu_s: disk_s,
            stolen_s: 0.0,
            offcpu_by_reason: vec![ReasonTime { reason: "disk/uninterruptible I/O".into(), seconds: disk_s }],
            top_threads: vec![],
        }
    }

    #[test]
    fn the_processes_of_one_program_are_one_cause() {
        // Four compilers, two at a time, in a 1 s build: 0.5 s of lifetime each, 0.1 s on the disk.
        let processes = (0..4).map(|i| process(100 + i, "cc1", 0.5, 0.1)).collect();
        let sched = SchedReport { processes, utilization: 1.6, ..SchedReport::default() };
        let advice = sched_recommendations(&sched, 2, Some(0.8), 1.0);
        assert_eq!(advice.len(), 1, "{advice:#?}");
        assert_eq!(advice[0].title, "cc1 waits on disk I/O");
        // 0.4 s of waits over 2 s of lifetimes in a 1 s trace: half of them overlapped.
        assert!((advice[0].seconds - 0.2).abs() < 1e-9, "{advice:#?}");
        assert!(advice[0].evidence.contains("of 4 processes"), "{}", advice[0].evidence);
    }
}
