//! The syscall family's section of the report: calls, failures and latency per process and
//! syscall.

use std::fmt::Write as _;

use super::{SyscallDump, SyscallReport, recommend::syscall_recommendations};
use crate::{
    family::Analysis,
    latency::format_ns,
    output::markdown::{escape, table},
    report::{
        Section,
        format::{count, percent, thousands},
    },
};

/// Rows in the syscall table (report.json has them all).
const SYSCALL_ROWS: usize = 25;

/// The section and its recommendations.
pub(crate) fn analyze(dump: &SyscallDump, cx: &mut Analysis<'_>) -> SyscallReport {
    let mut report = super::analyze(dump, cx.processes, cx.run.elapsed);
    report.lost = cx.counters.get(sysprof_common::Counter::SyscallsLost);
    cx.recommendations.extend(syscall_recommendations(&report));
    report
}

impl Section for SyscallReport {
    fn json(&self) -> Vec<(&'static str, &dyn erased_serde::Serialize)> {
        vec![("syscalls", self)]
    }

    fn markdown(&self, out: &mut String) {
        markdown(out, self);
    }
}

fn markdown(out: &mut String, syscalls: &SyscallReport) {
    let _ = writeln!(out, "### Syscalls\n");
    let mut exact = match syscalls.lost {
        0 => "Counts and errors are exact (exit and exit_group counted as they are entered)".to_string(),
        lost => format!(
            "Counts and errors are exact for what was kept: {} not counted (the syscall map was full)",
            count(lost, "call was", "calls were")
        ),
    };
    if syscalls.unattributed != 0 {
        let _ = write!(
            exact,
            ". The syscall map filled at {} process-syscall pairs: {} of the processes it had no room for \
             {} counted by syscall alone, under \"{}\"",
            thousands(u64::from(sysprof_common::capacity::SYSCALLS)),
            count(syscalls.unattributed, "call", "calls"),
            if syscalls.unattributed == 1 { "is" } else { "are" },
            super::UNATTRIBUTED_NAME
        );
    }
    let _ = writeln!(
        out,
        "{}, {} failed, {:.3} s in all. % of wall is the time in the syscall over the trace's wall \
         time (threads add up). {exact}; {} of the calls were timed one by one, the others' latency was \
         sampled in bursts (see --time-every-syscall).\n",
        count(syscalls.calls, "call", "calls"),
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
