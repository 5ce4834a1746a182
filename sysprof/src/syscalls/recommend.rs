//! What the syscall figures recommend: small and frequent calls, failing calls.

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
