//! `report.md`: the report model as tables a person reads top to bottom. Part A answers where the
//! time goes and what to change first; Part B is the changelog of what sysprof instrumented.
//! Each family's section writes its own part (`Section::markdown`), with the [`table`] and
//! [`escape`] of this file.

use std::fmt::Write as _;

use super::{Artifact, Rendered, Sink};
use crate::report::{
    Lost, Report,
    format::{percent, seconds, thousands, two_digits},
    recommendation::WORTH_A_LINE,
};

pub struct MarkdownReport;

impl Sink for MarkdownReport {
    fn render(&self, artifact: &Artifact<'_>) -> anyhow::Result<Option<Rendered>> {
        let Artifact::Report(report) = artifact else {
            return Ok(None);
        };
        Ok(Some(Rendered { name: "report.md".into(), bytes: render(report).into_bytes() }))
    }
}

/// The whole report as Markdown.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# sysprof report: {}\n", report.run.target);
    let _ = writeln!(out, "## Part A: where the time goes\n");
    run_summary(&mut out, report);
    recommendations(&mut out, report);
    for section in report.sections.iter() {
        section.markdown(&mut out);
    }
    overhead(&mut out, report);
    limitations(&mut out, report);
    part_b(&mut out, report);
    out
}

fn run_summary(out: &mut String, report: &Report) {
    let run = &report.run;
    let _ = writeln!(out, "### Run summary\n");
    let mut rows = vec![
        vec!["Target".to_string(), run.target.clone()],
        vec!["Started".into(), run.started_at.clone()],
        vec!["Duration".into(), format!("{:.2} s (ended by {})", run.duration_s, run.ended_by)],
    ];
    // Runs saved before the host was recorded have none.
    if !run.host.is_empty() {
        let rank = run.rank.as_ref().map(|rank| format!(", rank {rank}")).unwrap_or_default();
        rows.insert(1, vec!["Host".into(), format!("{}{rank}", run.host)]);
    }
    if let Some(status) = &run.command_status {
        rows.push(vec!["Command".into(), status.clone()]);
    }
    rows.extend([
        vec![
            "Sampling".into(),
            format!(
                "{} at {} Hz per CPU, {}",
                run.event,
                run.frequency_hz,
                crate::report::format::count(u64::from(run.cpus), "CPU", "CPUs")
            ),
        ],
        vec!["Target time".into(), format!("{:.2} s ({})", run.target_time_s, run.target_time)],
        vec!["Samples".into(), thousands(run.samples)],
        vec![
            "Machine CPU".into(),
            match run.machine_busy_share {
                Some(busy) => format!(
                    "{:.1}% busy, {:.1}% idle, all CPUs together (/proc/stat)",
                    busy * 100.0,
                    (1.0 - busy) * 100.0
                ),
                None => "unknown (/proc/stat unreadable)".into(),
            },
        ],
        vec!["Lost".into(), lost(&run.lost)],
        vec!["User stacks".into(), user_stacks(run.unwind.as_ref())],
    ]);
    if let Some(python) = run.unwind.as_ref().map(|unwind| &unwind.python).filter(|python| python.any()) {
        rows.push(vec!["Python frames".into(), python_frames(python)]);
    }
    rows.push(vec!["Files".into(), run.outputs.join(", ")]);
    table(out, &["", ""], &rows);
}

/// How user stacks were walked, and what the unwind tables covered.
fn user_stacks(unwind: Option<&crate::unwind::UnwindSummary>) -> String {
    let Some(unwind) = unwind else { return "by frame pointers only (no unwind tables)".into() };
    let mut text = format!(
        "unwound with the .eh_frame tables of {} ({} from the cache): {}, {} of the {} reserved; frame \
         pointers where a file has none",
        crate::report::format::count(unwind.files as u64, "file", "files"),
        unwind.cached,
        crate::report::format::count(unwind.rows, "row", "rows"),
        crate::report::format::bytes(unwind.bytes),
        crate::report::format::bytes(unwind.capacity_bytes),
    );
    if !unwind.without_table.is_empty() {
        text.push_str(&format!("; {} left to frame pointers (see Limitations)", unwind.without_table.len()));
    }
    text
}

/// Which CPython processes had their Python frames walked.
fn python_frames(python: &crate::python::PythonSummary) -> String {
    if python.processes.is_empty() {
        return "none walked (see Limitations)".into();
    }
    let versions: Vec<String> = python
        .processes
        .iter()
        .map(|(version, n)| format!("CPython {version} in {n} process{}", if *n == 1 { "" } else { "es" }))
        .collect();
    format!(
        "walked in the kernel at every stack: {}; {} code objects read",
        versions.join(", "),
        thousands(python.code_objects as u64)
    )
}

/// "none", or each kind of event lost with its count.
fn lost(lost: &Lost) -> String {
    let kinds = [
        (lost.samples, "samples"),
        (lost.user_stacks, "user stacks"),
        (lost.kernel_stacks, "kernel stacks"),
        (lost.fault_stacks, "page-fault stacks"),
        (lost.process_events, "process events"),
        (lost.processes_not_followed, "processes not followed"),
        (lost.syscalls, "syscalls"),
        (lost.syscall_errnos, "errnos of failed syscalls"),
        (lost.sched_events, "scheduler events"),
        (lost.offcpu_intervals, "off-CPU intervals"),
        (lost.wakes, "wakers of waits"),
        (lost.calls, "probed calls"),
        (lost.call_events, "call events"),
        (lost.faults, "page faults"),
        (lost.allocations, "allocations"),
    ];
    let lost: Vec<String> =
        kinds.iter().filter(|(n, _)| *n > 0).map(|(n, what)| format!("{} {what}", thousands(*n))).collect();
    if lost.is_empty() { "none".into() } else { lost.join(", ") }
}

fn recommendations(out: &mut String, report: &Report) {
    let run = &report.run;
    let _ = writeln!(out, "### Recommendations, ranked by the time they could win back\n");
    if report.recommendations.is_empty() {
        let worth = percent(WORTH_A_LINE);
        let _ = match run.command {
            Some(_) => writeln!(
                out,
                "Nothing stands out: no cost sysprof can see would win back {worth} of the command's {:.2} s.\n",
                run.target_time_s
            ),
            None => writeln!(
                out,
                "Nothing stands out: the target's threads were busy {:.2} s in the {:.2} s trace ({} of the \
                 CPU time available), and no cost sysprof can see would win back {worth} of that.\n",
                run.target_time_s,
                run.duration_s,
                percent(run.target_time_s / (run.duration_s * f64::from(run.cpus.max(1))).max(1e-9))
            ),
        };
        return;
    }
    let _ = writeln!(
        out,
        "Each is what the change could win back, in seconds of the target's time ({}: {:.2} s).\n",
        run.target_time, run.target_time_s
    );
    for (rank, rec) in report.recommendations.iter().enumerate() {
        let _ = writeln!(
            out,
            "{}. **{}** (~{}, {}). {}. {}.",
            rank + 1,
            escape(&rec.title),
            seconds(rec.seconds),
            percent(rec.impact),
            rec.evidence,
            rec.action
        );
    }
    out.push('\n');
}

fn overhead(out: &mut String, report: &Report) {
    let cost = &report.overhead;
    let _ = writeln!(out, "### sysprof's own cost\n");
    if cost.bpf_stats_available {
        let rows: Vec<Vec<String>> = cost
            .programs
            .iter()
            .map(|p| {
                let average = p.run_time_ns.checked_div(p.run_count).unwrap_or(0);
                vec![
                    format!("`{}`", p.program),
                    thousands(p.run_count),
                    format!("{:.3} ms", p.run_time_ns as f64 / 1e6),
                    format!("{average} ns"),
                ]
            })
            .collect();
        // Scaled from the windows where they did not cover the run (see below).
        let headers = if cost.bpf_stats_coverage >= 1.0 {
            ["BPF program", "Runs", "Total time", "Per run"]
        } else {
            ["BPF program", "Runs (estimated)", "Total time (estimated)", "Per run"]
        };
        table(out, &headers, &rows);
        if cost.bpf_stats_coverage >= 1.0 {
            let _ = writeln!(
                out,
                "BPF programs: {:.3} ms in all, {:.4}% of the CPU time available during the run: exact, the \
                 kernel timed every run (kernel.bpf_stats_enabled was on).",
                cost.bpf_time_ns as f64 / 1e6,
                cost.bpf_cpu_share * 100.0,
            );
        } else if cost.bpf_time_ns == 0 {
            let _ = writeln!(
                out,
                "BPF programs: no run fell in the windows the kernel timed them in ({}% of the run: its \
                 statistics cost two clock reads per run, so they are on in windows), too little to estimate \
                 from; `sysctl kernel.bpf_stats_enabled=1` during the trace makes it exact.",
                two_digits(cost.bpf_stats_coverage * 100.0)
            );
        } else {
            // Scaled from windows: two digits are what such an estimate can claim.
            let _ = writeln!(
                out,
                "BPF programs: about {} ms in all, about {}% of the CPU time available during the run, \
                 estimated: the kernel timed them during {}% of the run (its statistics cost two clock reads \
                 per run, so they are on in windows), and runs and times are scaled to the whole run. A load \
                 that changes over the run (a build's short processes) can put the estimate off by a factor of \
                 two or more; `sysctl kernel.bpf_stats_enabled=1` during the trace makes it exact.",
                two_digits(cost.bpf_time_ns as f64 / 1e6),
                two_digits(cost.bpf_cpu_share * 100.0),
                two_digits(cost.bpf_stats_coverage * 100.0)
            );
        }
    } else {
        let _ = writeln!(out, "The kernel keeps no BPF run-time statistics here (kernel.bpf_stats_enabled).");
    }
    // Recordings from before the kernel memory was kept render as they did.
    let kernel_memory = match &cost.kernel_memory {
        Some(memory) => format!(", and {}", memory.describe()),
        None => String::new(),
    };
    let _ = writeln!(
        out,
        "sysprof process: {:.2} s of CPU, peak RSS {} KiB{kernel_memory}. Lost events: {}.\n",
        cost.sysprof_cpu_s,
        thousands(cost.sysprof_peak_rss_kib),
        report.run.lost.total()
    );
}

fn limitations(out: &mut String, report: &Report) {
    if report.limitations.is_empty() {
        return;
    }
    let _ = writeln!(out, "### What sysprof could not see\n");
    for limitation in &report.limitations {
        let _ = writeln!(out, "- {limitation}");
    }
    out.push('\n');
}

fn part_b(out: &mut String, report: &Report) {
    let instr = &report.instrumentation;
    let _ = writeln!(out, "## Part B: instrumentation changelog\n");
    let file_rows: Vec<Vec<String>> = if instr.files_modified.is_empty() {
        vec![vec![
            "(none)".into(),
            "none".into(),
            "no file was modified, nothing was injected or restarted: eBPF programs were attached to the \
             running kernel and removed at exit"
                .into(),
            "0".into(),
        ]]
    } else {
        instr
            .files_modified
            .iter()
            .map(|f| {
                let (file, what) = f.rsplit_once(": ").unwrap_or((f.as_str(), ""));
                vec![
                    escape(file),
                    "changed during the trace, not by sysprof (it opens probed files read-only)".into(),
                    escape(what),
                    "-".into(),
                ]
            })
            .collect()
    };
    table(out, &["File", "Change type", "What", "Lines"], &file_rows);

    let _ = writeln!(out, "### BPF programs attached\n");
    let gone = instr.detach.still_attached.is_empty();
    let rows: Vec<Vec<String>> = instr
        .probes
        .iter()
        .map(|p| {
            let detached = if instr.detach.still_attached.contains(&p.program_id) {
                format!("NO: program id {} still attached", p.program_id)
            } else {
                format!("yes (program id {})", p.program_id)
            };
            vec![
                format!("`{}`", p.program),
                p.kind.clone(),
                escape(&p.attached_to),
                p.links.to_string(),
                detached,
            ]
        })
        .collect();
    table(out, &["Program", "Type", "Attached to", "Links", "Detached"], &rows);
    let _ = writeln!(
        out,
        "Detach check: {} of {} confirmed detached by listing the kernel's BPF links and programs after \
         detaching (no link to the program is left, or it is unloaded){}.",
        instr.detach.programs - instr.detach.still_attached.len(),
        crate::report::format::count(instr.detach.programs as u64, "program", "programs"),
        if gone { "" } else { " (some remained: see above)" }
    );
}

/// A Markdown table; the first header may be empty for key/value tables.
pub(crate) fn table(out: &mut String, headers: &[&str], rows: &[Vec<String>]) {
    let _ = writeln!(out, "| {} |", headers.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(headers.len()));
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    out.push('\n');
}

/// `text` in a table cell: a `|` would end the cell.
pub(crate) fn escape(text: &str) -> String {
    text.replace('|', "\\|")
}
