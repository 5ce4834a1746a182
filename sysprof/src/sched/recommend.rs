//! What the scheduler figures recommend: oversubscription, preemption, waits by reason.

use super::SchedReport;
use crate::{latency::format_ns, report::recommendation::Recommendation};

/// Total utilization above this share of the CPUs counts as saturated.
const SATURATED: f64 = 0.85;
/// Involuntary switches per second above which preemption is worth a look.
const INVOLUNTARY_PER_S: f64 = 100.0;
/// Off-CPU reasons worth a recommendation once they take this share of the threads' time.
const BLOCKED_SHARE: f64 = 0.10;

pub fn sched_recommendations(sched: &SchedReport, cpus: u32) -> Vec<Recommendation> {
    let mut recommendations = Vec::new();
    let cpu_s: f64 = sched.processes.iter().map(|p| p.cpu_time_s).sum();
    let involuntary_per_s: f64 = sched.processes.iter().map(|p| p.involuntary_per_s).sum();
    let runq_s: f64 =
        sched.processes.iter().filter_map(|p| p.runq_latency).map(|r| r.total_ns as f64 / 1e9).sum();
    let worst_p99 =
        sched.processes.iter().filter_map(|p| p.runq_latency).map(|r| r.p99_ns).max().unwrap_or(0);
    if sched.utilization >= SATURATED * f64::from(cpus) && involuntary_per_s >= INVOLUNTARY_PER_S {
        recommendations.push(Recommendation {
            impact: if cpu_s + runq_s > 0.0 { runq_s / (cpu_s + runq_s) } else { 0.0 },
            title: "CPU oversubscribed: more runnable threads than CPUs".into(),
            evidence: format!(
                "utilization {:.2} on {cpus} CPUs, {:.0} involuntary switches/s, {:.2} s waiting for a CPU \
                 (run-queue latency p99 {})",
                sched.utilization,
                involuntary_per_s,
                runq_s,
                format_ns(worst_p99)
            ),
            action: "Run no more busy threads than CPUs: size thread pools to the cores (OMP_NUM_THREADS, \
                     torch.set_num_threads, worker counts), move other work off these CPUs, or add CPUs"
                .into(),
        });
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
                "futex/lock" => (
                    format!("Lock contention in {}", process.name),
                    "Shorten critical sections, split the lock (per shard or per thread), or use lock-free \
                     queues; check the blocking stacks in offcpu.svg",
                ),
                "disk/uninterruptible I/O" => (
                    format!("{} waits on disk I/O", process.name),
                    "Read ahead or in larger blocks, cache what is read again, move I/O off the critical \
                     path (async I/O, a loader thread)",
                ),
                "pipe/socket I/O" | "poll/epoll wait" => (
                    format!("{} waits on pipes or sockets", process.name),
                    "If the peer is slow, look at it; otherwise overlap the waits (more requests in flight, \
                     async I/O)",
                ),
                _ => continue,
            };
            recommendations.push(Recommendation {
                impact: share * 0.5,
                title,
                evidence: format!(
                    "{:.2} s off CPU for {} across {} threads ({:.1}% of their time){where_}",
                    reason.seconds,
                    reason.reason,
                    process.threads,
                    share * 100.0
                ),
                action: action.into(),
            });
        }
    }
    recommendations
}
