//! sysprof's own cost: time in its BPF programs (kernel BPF statistics) and the CPU time and
//! peak memory of its own process. Every report carries these: a profiler that hides its cost
//! cannot be trusted about anyone else's.

use std::time::Duration;

use nix::sys::resource::{UsageWho, getrusage};

use crate::{probes::ProgramCost, report::Overhead};

/// The overhead section for a run of `duration` on `cpus` CPUs.
pub fn overhead(
    programs: Vec<ProgramCost>,
    stats_available: bool,
    duration: Duration,
    cpus: u32,
) -> Overhead {
    let bpf_time_ns: u64 = programs.iter().map(|p| p.run_time_ns).sum();
    let available_ns = duration.as_nanos() as f64 * f64::from(cpus.max(1));
    let (sysprof_cpu_s, sysprof_peak_rss_kib) = own_usage();
    Overhead {
        bpf_stats_available: stats_available,
        programs,
        bpf_time_ns,
        bpf_cpu_share: if available_ns > 0.0 { bpf_time_ns as f64 / available_ns } else { 0.0 },
        sysprof_cpu_s,
        sysprof_peak_rss_kib,
    }
}

/// CPU seconds (user + system) and peak RSS in KiB of this process.
pub fn own_usage() -> (f64, u64) {
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(usage) => {
            let seconds = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
            (seconds(usage.user_time()) + seconds(usage.system_time()), usage.max_rss() as u64)
        }
        Err(_) => (0.0, 0),
    }
}
