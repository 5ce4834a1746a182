//! What the scheduler figures recommend: oversubscription, and the waits that hold a thread up
//! (lock contention, disk I/O, a slow peer), in seconds of the target's time: the mean wait of
//! a thread of the process. Waiting for work (sleeps, epoll_wait, condition variables, joins,
//! parked kernel threads) is idle, never advice.

use super::SchedReport;
use crate::{latency::format_ns, report::recommendation::Recommendation};

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
    let own = sched.utilization >= SATURATED * f64::from(cpus);
    let machine = machine_busy.is_some_and(|busy| busy >= SATURATED);
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
                "utilization {:.2} on {cpus} CPUs{}, {:.0} involuntary switches/s; {threads} threads waited \
                 {runq_s:.2} s for a CPU, {seconds:.2} s each on average (run-queue latency p99 {}, {:.2} s \
                 of CPU)",
                sched.utilization,
                machine_busy
                    .map(|busy| format!(" (the machine {:.0}% busy)", busy * 100.0))
                    .unwrap_or_default(),
                involuntary_per_s,
                format_ns(worst_p99),
                cpu_s
            ),
            action,
        ));
    }
    for process in &sched.processes {
        let thread_time = process.wall_s * process.threads.max(1) as f64;
        for reason in &process.offcpu_by_reason {
            let share = reason.seconds / thread_time;
            if share < BLOCKED_SHARE {
                continue;
            }
            let stack = sched
                .top_offcpu
                .iter()
                .find(|s| s.pid == process.pid && s.reason == reason.reason)
                .and_then(|s| s.blocked_in.clone().map(|f| (f, s.seconds)));
            let where_ =
                stack.map(|(f, s)| format!("; the longest waits are in {f} ({s:.2} s)")).unwrap_or_default();
            let (title, action) = match reason.reason.as_str() {
                "lock contention" => (
                    format!("Lock contention in {}", process.name),
                    "Shorten critical sections, split the lock (per shard or per thread), or use lock-free \
                     queues; check the blocking stacks in offcpu.svg",
                ),
                "disk/uninterruptible I/O" => (
                    format!("{} waits on disk I/O", process.name),
                    "Read ahead or in larger blocks, cache what is read again, move I/O off the critical \
                     path (async I/O, a loader thread)",
                ),
                "pipe/socket I/O" => (
                    format!("{} waits on pipes or sockets", process.name),
                    "If the peer is slow, look at it; otherwise overlap the waits (more requests in flight, \
                     async I/O)",
                ),
                _ => continue,
            };
            // The threads' waits overlap in time: the mean wait of one is what the process
            // could win back of its elapsed time. Without the lock, its threads could run on
            // the CPUs the machine left free, no more: on a machine with none, nothing comes
            // back.
            let mean_wait = reason.seconds / process.threads.max(1) as f64;
            let mut seconds = mean_wait;
            let mut cap = String::new();
            if reason.reason == "lock contention" {
                let could_run = free_cpus.min(process.threads as f64);
                let parallel_win = process.wall_s * (1.0 - process.utilization / could_run).max(0.0);
                if parallel_win < mean_wait {
                    seconds = parallel_win;
                    cap = format!(
                        "; it runs {:.2} CPUs' worth where {could_run:.1} were free for it, so removing the \
                         wait wins at most {parallel_win:.2} s",
                        process.utilization
                    );
                }
            }
            recommendations.push(Recommendation::new(
                seconds,
                title,
                format!(
                    "{:.2} s off CPU for {} across {} threads ({:.1}% of their time, {mean_wait:.2} s each on \
                     average){cap}{where_}",
                    reason.seconds,
                    reason.reason,
                    process.threads,
                    share * 100.0
                ),
                action,
            ));
        }
    }
    recommendations
}
