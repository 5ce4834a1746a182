//! The CPU overhead sections: on-CPU hotspots, scheduling, syscalls, and `--func` functions.

use std::fmt::Write as _;

use super::{escape, percent, table, thousands};
use crate::{latency::format_ns, report::Report};

/// Rows in the syscall table (report.json has them all).
const SYSCALL_ROWS: usize = 25;
/// Processes whose threads are listed.
const THREAD_TABLES: usize = 3;

pub(super) fn cpu(out: &mut String, report: &Report) {
    let _ = writeln!(out, "### CPU: processes\n");
    if report.processes.is_empty() {
        let _ = writeln!(out, "No on-CPU samples of the target: it did not run on a CPU while traced.\n");
        return;
    }
    let rows: Vec<Vec<String>> = report
        .processes
        .iter()
        .take(20)
        .map(|p| vec![escape(&p.name), p.pid.to_string(), thousands(p.weight), percent(p.share)])
        .collect();
    table(out, &["Process", "PID", "Samples", "Share"], &rows);

    let _ = writeln!(out, "### CPU: hotspots\n");
    let _ = writeln!(
        out,
        "Self: samples in the function's own code. Total: samples in it or in what it calls. \
         The flamegraph is cpu.svg.\n"
    );
    let rows: Vec<Vec<String>> = report
        .hotspots
        .iter()
        .map(|h| {
            vec![
                format!("`{}`", escape(&h.function)),
                escape(&h.module),
                percent(h.self_share),
                thousands(h.self_weight),
                percent(h.total_share),
                thousands(h.total_weight),
            ]
        })
        .collect();
    table(out, &["Function", "Module", "Self %", "Self", "Total %", "Total"], &rows);
}

pub(super) fn sched(out: &mut String, report: &Report) {
    let Some(sched) = &report.sched else { return };
    let _ = writeln!(out, "### CPU overhead: scheduling\n");
    let _ = writeln!(
        out,
        "Utilization is CPU time over wall time (above 1 when threads run in parallel); all target \
         processes together: {:.2}. Voluntary switches are waits (sleep, I/O, locks); involuntary ones \
         are preemptions. Run-queue latency is the time from runnable to running.\n",
        sched.utilization
    );
    let rows: Vec<Vec<String>> = sched
        .processes
        .iter()
        .map(|p| {
            let runq = p
                .runq_latency
                .map(|r| format!("{} / {}", format_ns(r.p50_ns), format_ns(r.p99_ns)))
                .unwrap_or_else(|| "-".into());
            let reasons: Vec<String> = p
                .offcpu_by_reason
                .iter()
                .take(3)
                .map(|r| format!("{} {}", r.reason, format_ns((r.seconds * 1e9) as u64)))
                .collect();
            vec![
                escape(&p.name),
                p.pid.to_string(),
                p.threads.to_string(),
                format!("{:.2} s", p.cpu_time_s),
                format!("{:.2} s", p.wall_s),
                format!("{:.2}", p.utilization),
                format!("{} ({:.0}/s)", thousands(p.voluntary_switches), p.voluntary_per_s),
                format!("{} ({:.0}/s)", thousands(p.involuntary_switches), p.involuntary_per_s),
                runq,
                format!(
                    "{}: {}",
                    format_ns((p.offcpu_s * 1e9) as u64),
                    if reasons.is_empty() { "-".into() } else { reasons.join(", ") }
                ),
            ]
        })
        .collect();
    table(
        out,
        &[
            "Process",
            "PID",
            "Threads",
            "CPU time",
            "Wall",
            "Utilization",
            "Voluntary",
            "Involuntary",
            "Run queue p50 / p99",
            "Off-CPU (by reason)",
        ],
        &rows,
    );
    for process in sched.processes.iter().take(THREAD_TABLES).filter(|p| p.threads > 1) {
        let _ = writeln!(out, "Busiest threads of {} ({}):\n", escape(&process.name), process.pid);
        let rows: Vec<Vec<String>> = process
            .top_threads
            .iter()
            .map(|t| {
                vec![
                    escape(&t.name),
                    t.tid.to_string(),
                    format!("{:.2} s", t.cpu_time_s),
                    format!("{:.2}", t.utilization),
                    thousands(t.voluntary_switches),
                    thousands(t.involuntary_switches),
                    format!("{:.2} s", t.offcpu_s),
                ]
            })
            .collect();
        table(
            out,
            &["Thread", "TID", "CPU time", "Utilization", "Voluntary", "Involuntary", "Off-CPU"],
            &rows,
        );
    }
    if !sched.top_offcpu.is_empty() {
        let _ = writeln!(out, "### Off-CPU: the longest waits\n");
        let _ = writeln!(
            out,
            "Where target threads waited, by stack (offcpu.svg has them all, in microseconds).\n"
        );
        let rows: Vec<Vec<String>> = sched
            .top_offcpu
            .iter()
            .map(|s| {
                let tail: Vec<&str> = s.frames.iter().rev().take(4).rev().map(String::as_str).collect();
                vec![
                    escape(&s.process),
                    s.reason.clone(),
                    format_ns((s.seconds * 1e9) as u64),
                    s.blocked_in.as_deref().map(|f| format!("`{}`", escape(f))).unwrap_or_else(|| "-".into()),
                    escape(&tail.join(" > ")),
                ]
            })
            .collect();
        table(out, &["Process", "Reason", "Time", "Blocked in", "Innermost frames"], &rows);
    }
}

pub(super) fn syscalls(out: &mut String, report: &Report) {
    let Some(syscalls) = &report.syscalls else { return };
    let _ = writeln!(out, "### Syscalls\n");
    let _ = writeln!(
        out,
        "{} calls, {} failed, {:.3} s in all. % of wall is the time in the syscall over the trace's wall \
         time (threads add up). Counts and errors are exact; {} of the calls were timed one by one, the \
         others' latency was sampled in bursts (see --time-every-syscall).\n",
        thousands(syscalls.calls),
        thousands(syscalls.errors),
        syscalls.total_ns as f64 / 1e9,
        percent(if syscalls.calls == 0 { 1.0 } else { syscalls.timed as f64 / syscalls.calls as f64 })
    );
    let rows: Vec<Vec<String>> = syscalls
        .rows
        .iter()
        .take(SYSCALL_ROWS)
        .map(|r| {
            let errors = if r.errors == 0 {
                "0".to_string()
            } else {
                let by: Vec<String> =
                    r.errnos.iter().take(3).map(|e| format!("{} {}", e.errno, thousands(e.count))).collect();
                format!("{} ({})", thousands(r.errors), by.join(", "))
            };
            vec![
                escape(&r.process),
                format!("`{}`", r.syscall),
                thousands(r.calls),
                errors,
                format_ns(r.latency.total_ns),
                format_ns(r.latency.p50_ns),
                format_ns(r.latency.p90_ns),
                format_ns(r.latency.p99_ns),
                format_ns(r.latency.max_ns),
                percent(r.share_of_wall),
            ]
        })
        .collect();
    table(
        out,
        &["Process", "Syscall", "Calls", "Errors", "Total", "p50", "p90", "p99", "Max", "% of wall"],
        &rows,
    );
    if syscalls.rows.len() > SYSCALL_ROWS {
        let _ = writeln!(out, "{} more rows in report.json.\n", syscalls.rows.len() - SYSCALL_ROWS);
    }
}

pub(super) fn functions(out: &mut String, report: &Report) {
    if report.functions.is_empty() {
        return;
    }
    let _ = writeln!(out, "### Timed functions (--func)\n");
    let rows: Vec<Vec<String>> = report
        .functions
        .iter()
        .map(|f| {
            let callers: Vec<String> = f
                .callers
                .iter()
                .take(3)
                .map(|(site, n)| format!("{} ({})", escape(site), thousands(*n)))
                .collect();
            vec![
                format!("`{}`", escape(&f.function)),
                escape(&f.binary),
                thousands(f.calls),
                format!(
                    "{} / {} / {}",
                    format_ns(f.latency.p50_ns),
                    format_ns(f.latency.p99_ns),
                    format_ns(f.latency.max_ns)
                ),
                format_ns(f.latency.total_ns),
                thousands(f.negative_returns),
                callers.join(", "),
            ]
        })
        .collect();
    table(
        out,
        &["Function", "Binary", "Calls", "p50 / p99 / max", "Total", "Negative returns", "Callers"],
        &rows,
    );
}
