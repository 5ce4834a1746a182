//! Recommendations from the measured figures. Each quotes the figure behind it; the impact is an
//! estimate of the share of the measured time the change could win back, which ranks them.

use super::{Hotspot, Recommendation};
use crate::{
    latency::format_ns, profile::StackProfile, report::format::thousands, sched::SchedReport,
    syscalls::SyscallReport,
};

/// Self share above which a single function is worth a recommendation of its own.
const HOT_FUNCTION_SHARE: f64 = 0.10;
/// Kernel share of on-CPU time above which the kernel is worth a look.
const KERNEL_SHARE: f64 = 0.30;
/// Share of samples with unresolved frames above which symbols are worth fixing first.
const UNKNOWN_SHARE: f64 = 0.10;
/// Fewer samples than this make every share uncertain by several points.
const FEW_SAMPLES: u64 = 200;

pub fn cpu_recommendations(profile: &StackProfile, hotspots: &[Hotspot]) -> Vec<Recommendation> {
    let total = profile.total();
    let mut recommendations = Vec::new();
    if total == 0 {
        return recommendations;
    }
    for hotspot in hotspots.iter().filter(|h| h.self_share >= HOT_FUNCTION_SHARE).take(3) {
        recommendations.push(Recommendation {
            impact: hotspot.self_share,
            title: format!("Optimize {} ({})", hotspot.function, hotspot.module),
            evidence: format!(
                "{:.1}% of on-CPU samples are in its own code ({} of {total}); {:.1}% pass through it",
                hotspot.self_share * 100.0,
                hotspot.self_weight,
                hotspot.total_share * 100.0
            ),
            action: "Start here: a faster algorithm, less work per call, or fewer calls (see its callers in cpu.svg)".into(),
        });
    }
    let share_of = |predicate: &dyn Fn(&crate::profile::WeightedStack) -> bool| {
        profile.stacks.iter().filter(|s| predicate(s)).map(|s| s.weight).sum::<u64>() as f64 / total as f64
    };
    let kernel = share_of(&|s| s.frames.last().is_some_and(|f| f.is_kernel()));
    if kernel >= KERNEL_SHARE {
        recommendations.push(Recommendation {
            impact: kernel * 0.5,
            title: "Reduce time in the kernel".into(),
            evidence: format!("{:.1}% of on-CPU samples are in kernel code", kernel * 100.0),
            action:
                "Look at the kernel frames in cpu.svg for the syscalls behind them; batch small reads and \
                     writes, avoid needless syscalls, reuse memory instead of mapping it anew"
                    .into(),
        });
    }
    let unknown = share_of(&|s| s.frames.iter().any(|f| f.function.starts_with("[unknown]")));
    if unknown >= UNKNOWN_SHARE {
        recommendations.push(Recommendation {
            impact: unknown * 0.25,
            title: "Make the profile readable: add symbols".into(),
            evidence: format!("{:.1}% of samples have frames sysprof could not name", unknown * 100.0),
            action: "Install debug symbols for the modules named in [unknown] frames, keep symbols in your \
                     binaries (no strip), build with -fno-omit-frame-pointer, and run JITs with their perf \
                     map on (python -X perf, node --perf-basic-prof)"
                .into(),
        });
    }
    if total < FEW_SAMPLES {
        recommendations.push(Recommendation {
            impact: 0.0,
            title: "Collect more samples".into(),
            evidence: format!("only {total} on-CPU samples: shares are uncertain by several points"),
            action: "Trace for longer (--duration) or sample faster (--freq 999)".into(),
        });
    }
    recommendations.sort_by(|a, b| b.impact.total_cmp(&a.impact));
    recommendations
}

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

/// Syscalls that move data in small pieces when called often.
const IO_SYSCALLS: [&str; 12] = [
    "read", "write", "readv", "writev", "pread64", "pwrite64", "recvfrom", "sendto", "recvmsg", "sendmsg",
    "recv", "send",
];
/// "Small and frequent": median latency under this, more calls per second than this.
const TINY_CALL_NS: u64 = 10_000;
const FREQUENT_PER_S: f64 = 1_000.0;

pub fn syscall_recommendations(syscalls: &SyscallReport) -> Vec<Recommendation> {
    let mut recommendations = Vec::new();
    for row in &syscalls.rows {
        let share = row.share_of_wall.min(1.0);
        if IO_SYSCALLS.contains(&row.syscall.as_str())
            && row.calls_per_s >= FREQUENT_PER_S
            && row.latency.p50_ns < TINY_CALL_NS
        {
            recommendations.push(Recommendation {
                impact: share * 0.5,
                title: format!("Batch small {} calls in {}", row.syscall, row.process),
                evidence: format!(
                    "{} calls ({:.0}/s), median {}, {:.2} s in all",
                    thousands(row.calls),
                    row.calls_per_s,
                    format_ns(row.latency.p50_ns),
                    row.latency.total_ns as f64 / 1e9
                ),
                action: "Buffer: fewer, larger reads and writes (BufWriter/BufReader, setvbuf, writev), or \
                         mmap/io_uring for bulk data"
                    .into(),
            });
        }
        if row.errors >= 100 && row.errors * 2 >= row.calls {
            let errno = row.errnos.first().map(|e| e.errno.as_str()).unwrap_or("an error");
            recommendations.push(Recommendation {
                impact: share * 0.5,
                title: format!("Most {} calls in {} fail", row.syscall, row.process),
                evidence: format!(
                    "{} of {} calls failed, most with {errno}",
                    thousands(row.errors),
                    thousands(row.calls)
                ),
                action: "A loop retrying a failing call (busy polling on EAGAIN, probing missing files) \
                         spends time for nothing: wait for readiness (epoll) or cache the answer"
                    .into(),
            });
        }
    }
    recommendations
}
