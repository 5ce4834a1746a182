//! What the syscall figures recommend: small and frequent calls, failing calls, each in
//! seconds of the target's time (the time in those calls that the change saves).

use super::SyscallReport;
use crate::{
    latency::format_ns,
    report::{format::thousands, recommendation::Recommendation},
};

/// Syscalls that move data in small pieces when called often.
const IO_SYSCALLS: [&str; 12] = [
    "read", "write", "readv", "writev", "pread64", "pwrite64", "recvfrom", "sendto", "recvmsg", "sendmsg",
    "recv", "send",
];
/// "Small and frequent": median latency under this, more calls per second than this.
const TINY_CALL_NS: u64 = 10_000;
const FREQUENT_PER_S: f64 = 1_000.0;
/// What batching small calls into ones ten times larger saves of their time.
const BATCHING_WIN: f64 = 0.9;
/// Calls whose "errors" are not failures: rt_sigreturn returns the interrupted call's result,
/// uretprobe is sysprof's own return probe, and a wait that times out or is woken early (a
/// futex, epoll, poll, select, a sleep, wait4 with no child) has done its job: waiting for work.
const NOT_FAILURES: [&str; 13] = [
    "rt_sigreturn",
    super::URETPROBE,
    "futex",
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
    "poll",
    "ppoll",
    "select",
    "pselect6",
    "nanosleep",
    "clock_nanosleep",
    "wait4",
];

pub fn syscall_recommendations(syscalls: &SyscallReport) -> Vec<Recommendation> {
    let mut recommendations = Vec::new();
    // The calls of processes the map had no room for are many processes' together: their rate
    // and failures say nothing of any one of them.
    for row in syscalls.rows.iter().filter(|row| row.pid != super::UNATTRIBUTED) {
        let total_s = row.latency.total_ns as f64 / 1e9;
        if IO_SYSCALLS.contains(&&*row.syscall)
            && row.calls_per_s >= FREQUENT_PER_S
            && row.latency.p50_ns < TINY_CALL_NS
        {
            recommendations.push(Recommendation::new(
                total_s * BATCHING_WIN,
                format!("Batch small {} calls in {}", row.syscall, row.process),
                format!(
                    "{} calls ({:.0}/s), median {}, {total_s:.2} s in all",
                    thousands(row.calls),
                    row.calls_per_s,
                    format_ns(row.latency.p50_ns),
                ),
                "Buffer: fewer, larger reads and writes (BufWriter/BufReader, setvbuf, writev), or \
                 mmap/io_uring for bulk data",
            ));
        }
        if row.errors >= 100
            && row.errors.saturating_mul(2) >= row.calls
            && !NOT_FAILURES.contains(&&*row.syscall)
        {
            let errno = row.errnos.first().map(|e| e.errno.as_str()).unwrap_or("an error");
            let failed_s = total_s * row.errors as f64 / row.calls.max(1) as f64;
            recommendations.push(Recommendation::new(
                failed_s,
                format!("Most {} calls in {} fail", row.syscall, row.process),
                format!(
                    "{} of {} calls failed, most with {errno}: {failed_s:.3} s in failing calls",
                    thousands(row.errors),
                    thousands(row.calls)
                ),
                "A loop retrying a failing call (busy polling on EAGAIN, probing missing files) spends \
                 time for nothing: wait for readiness (epoll) or cache the answer",
            ));
        }
    }
    recommendations
}
