//! The scheduler family's section of the report: CPU time, switches and run-queue latency per
//! process, off-CPU time by reason and by stack (written as offcpu.folded and offcpu.svg).

use std::fmt::Write as _;

use super::{
    ProcessSched, SchedDump, SchedReport, offcpu_reason, offcpu_samples,
    recommend::sched_recommendations,
    wakes::{self, Wake},
};
use crate::{
    family::Analysis,
    latency::format_ns,
    output::markdown::{escape, table},
    profile::{self, ResolvedStacks},
    report::{
        Section,
        format::{percent, thousands},
    },
};

/// Processes whose threads are listed.
const THREAD_TABLES: usize = 3;

/// Processes in the scheduling table; the rest share one row (report.json has them all).
const PROCESS_ROWS: usize = 25;

/// The section and its recommendations; the off-CPU profile's files.
pub(crate) fn analyze(dump: &SchedDump, cx: &mut Analysis<'_>) -> SchedReport {
    // Off-CPU time by stack, weighted in microseconds, with why the thread was off CPU as the
    // first frame under the process.
    let samples = offcpu_samples(dump);
    let resolved = ResolvedStacks::resolve(&samples, &dump.stacks, cx.processes, cx.symbolizer);
    let offcpu = profile::build(&samples, &resolved, cx.processes, "us", |sample, kernel| {
        Some(format!("[{}]", offcpu_reason(sample.tag, kernel, resolved.user_frames(sample))))
    });
    let mut report = super::analyze(dump, &offcpu, cx.processes, cx.run.elapsed, cx.run.end_ns);
    let names = wakes::thread_names(&dump.threads, cx.processes);
    (report.wakes, report.lock_releases) =
        wakes::analyze(&dump.wakes, &dump.stacks, &names, cx.processes, cx.symbolizer);
    // The time model's check: a thread is on a CPU (running, or kept from it) or off it, never
    // both, and only while it lives; what is over is said, not hidden.
    for process in &report.processes {
        let lifetimes = process.wall_s * process.threads.max(1) as f64;
        let residue = process.cpu_time_s + process.stolen_s + process.offcpu_s - lifetimes;
        if residue > 0.02 * lifetimes + 0.001 {
            cx.limitations.push(format!(
                "{} ({}): its threads' on-CPU {:.3} s (and {:.3} s kept from running on a CPU) and off-CPU \
                 {:.3} s add up to {residue:.3} s more than their {lifetimes:.3} s in the trace: some of its \
                 scheduler events were missed",
                process.name, process.pid, process.cpu_time_s, process.stolen_s, process.offcpu_s
            ));
        }
    }
    cx.recommendations.extend(sched_recommendations(
        &report,
        cx.run.cpus,
        cx.run.machine_busy_share,
        cx.wall_s(),
    ));
    cx.add_profile("offcpu", "off-CPU (microseconds blocked)", offcpu);
    report
}

impl Section for SchedReport {
    fn json(&self) -> Vec<(&'static str, &dyn erased_serde::Serialize)> {
        vec![("sched", self)]
    }

    fn markdown(&self, out: &mut String) {
        markdown(out, self);
    }

    fn busy_s(&self) -> Option<f64> {
        let held_up = |p: &super::ProcessSched| -> f64 {
            p.offcpu_by_reason
                .iter()
                .filter(|r| super::HELD_UP.contains(&r.reason.as_str()))
                .map(|r| r.seconds)
                .sum()
        };
        // From 0.0, as `analyze`'s utilization: an empty float sum is -0.0.
        Some(self.processes.iter().map(|p| p.cpu_time_s + held_up(p)).fold(0.0, |sum, s| sum + s))
    }
}

/// Where the target's threads' time went: on a CPU, waiting for one, held up (by reason),
/// waiting for work; and what no event covered (a thread's time before its first switch).
fn time_model(out: &mut String, sched: &SchedReport) {
    let threads: usize = sched.processes.iter().map(|p| p.threads).sum();
    let lifetimes: f64 = sched.processes.iter().map(|p| p.wall_s * p.threads as f64).sum();
    if threads == 0 || lifetimes <= 0.0 {
        return;
    }
    let on: f64 = sched.processes.iter().map(|p| p.cpu_time_s).sum();
    let mut reasons: Vec<(String, f64)> = Vec::new();
    for reason in sched.processes.iter().flat_map(|p| &p.offcpu_by_reason) {
        match reasons.iter_mut().find(|(r, _)| *r == reason.reason) {
            Some((_, seconds)) => *seconds += reason.seconds,
            None => reasons.push((reason.reason.clone(), reason.seconds)),
        }
    }
    let held = |r: &str| super::HELD_UP.contains(&r);
    let mut held_up: Vec<&(String, f64)> = reasons.iter().filter(|(r, _)| held(r)).collect();
    held_up.sort_by(|a, b| b.1.total_cmp(&a.1));
    let waiting: f64 = reasons.iter().filter(|(r, _)| !held(r)).map(|(_, s)| s).sum();
    let off: f64 = reasons.iter().map(|(_, s)| s).sum();
    let stolen: f64 = sched.processes.iter().map(|p| p.stolen_s).sum();
    let share = |s: f64| percent(s / lifetimes);
    let mut parts = vec![format!("on a CPU {} ({})", format_ns((on * 1e9) as u64), share(on))];
    for (reason, seconds) in held_up {
        let what = if reason == "preempted" { "waiting for a CPU".to_string() } else { reason.clone() };
        parts.push(format!("{what} {} ({})", format_ns((seconds * 1e9) as u64), share(*seconds)));
    }
    if waiting > 0.0 {
        parts.push(format!("waiting for work {} ({})", format_ns((waiting * 1e9) as u64), share(waiting)));
    }
    // A thread's CPU clock leaves out what its CPU did for others while it was on it: the
    // hypervisor's steal in a VM, and interrupt work where the kernel accounts it apart.
    // Named, like the unseen time below, from 1%.
    if stolen > 0.01 * lifetimes {
        parts.push(format!(
            "on a CPU but kept from running (the hypervisor's steal, or interrupts) {} ({})",
            format_ns((stolen * 1e9) as u64),
            share(stolen)
        ));
    }
    let unseen = lifetimes - on - off - stolen;
    if unseen > 0.01 * lifetimes {
        parts.push(format!(
            "asleep from before the trace to its first wakeup, its reason unseen {} ({})",
            format_ns((unseen * 1e9) as u64),
            share(unseen)
        ));
    }
    let whose = if threads == 1 {
        "the target thread's".to_string()
    } else {
        format!("the {threads} target threads'")
    };
    let _ =
        writeln!(out, "Where {whose} {} went: {}.\n", format_ns((lifetimes * 1e9) as u64), parts.join(", "));
}

fn markdown(out: &mut String, sched: &SchedReport) {
    let _ = writeln!(out, "### CPU overhead: scheduling\n");
    time_model(out, sched);
    let _ = writeln!(
        out,
        "Utilization is CPU time over the process's lifetime in the trace (Wall; above 1 when threads \
         run in parallel); all target processes together, over the trace: {:.2}. Voluntary switches \
         are waits (sleep, I/O, locks); involuntary ones are preemptions. Run-queue latency is the \
         time from runnable to running.\n",
        sched.utilization
    );
    let mut rows: Vec<Vec<String>> = sched
        .processes
        .iter()
        .take(PROCESS_ROWS)
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
    rows.extend(rest_row(&sched.processes[sched.processes.len().min(PROCESS_ROWS)..]));
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
    wait_for(out, &sched.wakes);
}

/// One row for the processes past the table's: a build's thousands of compiler processes,
/// each a row of its own, made the report tens of thousands of lines long. Their sums, and
/// the programs they ran, most processes first.
fn rest_row(rest: &[ProcessSched]) -> Option<Vec<String>> {
    if rest.is_empty() {
        return None;
    }
    let mut by_program: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for process in rest {
        *by_program.entry(&process.name).or_default() += 1;
    }
    let mut programs: Vec<(&str, usize)> = by_program.into_iter().collect();
    programs.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let mut named: Vec<String> =
        programs.iter().take(3).map(|(name, count)| format!("{} x{count}", escape(name))).collect();
    if programs.len() > 3 {
        named.push(format!("{} more programs", programs.len() - 3));
    }
    let sum = |f: fn(&ProcessSched) -> f64| rest.iter().map(f).sum::<f64>();
    let count = |f: fn(&ProcessSched) -> u64| rest.iter().map(f).sum::<u64>();
    Some(vec![
        format!("{} more processes ({})", thousands(rest.len() as u64), named.join(", ")),
        "-".into(),
        thousands(rest.iter().map(|p| p.threads as u64).sum()),
        format!("{:.2} s", sum(|p| p.cpu_time_s)),
        "-".into(),
        "-".into(),
        thousands(count(|p| p.voluntary_switches)),
        thousands(count(|p| p.involuntary_switches)),
        "-".into(),
        format_ns((sum(|p| p.offcpu_s) * 1e9) as u64),
    ])
}

/// The wait-for graph: who ended the longest waits of the target's threads.
fn wait_for(out: &mut String, wakes: &[Wake]) {
    if wakes.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "### Off-CPU: who woke whom
"
    );
    let _ = writeln!(
        out,
        "The longest waits by thread and by who ended them: the thread that woke it from a system call \
         (an unlock, a post, a write, an exit) and its code as it did, or an interrupt (a timer, a device).\n"
    );
    let code =
        |f: &Option<String>| f.as_deref().map(|f| format!("`{}`", escape(f))).unwrap_or_else(|| "-".into());
    let rows: Vec<Vec<String>> = wakes
        .iter()
        .map(|w| {
            vec![
                format!("{} ({})", escape(&w.thread), w.tid),
                w.reason.clone(),
                format_ns((w.seconds * 1e9) as u64),
                thousands(w.wakeups),
                code(&w.blocked_in),
                escape(&w.woken_by),
                code(&w.waker_in),
            ]
        })
        .collect();
    table(out, &["Thread", "Reason", "Waited", "Wakeups", "Blocked in", "Woken by", "Waker's code"], &rows);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::{ProcessSched, ReasonTime};

    /// One thread that lived 3 s: 2.5 s on a CPU by its own clock, 0.1 s preempted, and
    /// `stolen_s` of its time on a CPU taken by the hypervisor.
    fn one_thread(stolen_s: f64) -> SchedReport {
        let process = ProcessSched {
            pid: 7,
            name: "busy".into(),
            threads: 1,
            cpu_time_s: 2.5,
            wall_s: 3.0,
            utilization: 2.5 / 3.0,
            voluntary_switches: 0,
            involuntary_switches: 10,
            voluntary_per_s: 0.0,
            involuntary_per_s: 3.3,
            runq_latency: None,
            offcpu_s: 0.1,
            stolen_s,
            offcpu_by_reason: vec![ReasonTime { reason: "preempted".into(), seconds: 0.1 }],
            top_threads: vec![],
        };
        SchedReport { processes: vec![process], ..SchedReport::default() }
    }

    /// A `--pid` of a process that slept through the trace: nothing ran, and the report says
    /// 0.00, not the -0.00 that a float sum of nothing gives.
    #[test]
    fn a_target_that_never_ran_was_busy_zero_seconds_not_minus_zero() {
        let report = crate::sched::analyze(
            &Default::default(),
            &Default::default(),
            &Default::default(),
            std::time::Duration::from_secs(3),
            0,
        );
        assert!(report.utilization == 0.0 && report.utilization.is_sign_positive());
        let busy = report.busy_s().expect("the scheduler's section states busy time");
        assert!(busy == 0.0 && busy.is_sign_positive());
        let mut out = String::new();
        markdown(&mut out, &report);
        assert!(out.contains("over the trace: 0.00."), "{out}");
    }

    #[test]
    fn processes_past_the_table_share_one_row_with_their_sums_and_programs() {
        let busy = one_thread(0.0).processes.remove(0);
        let process = |pid, name: &str| ProcessSched { pid, name: name.into(), ..busy.clone() };
        let mut report = one_thread(0.0);
        report.processes = (0..PROCESS_ROWS as u32).map(|pid| process(pid, "make")).collect();
        report.processes.extend([process(100, "cc1"), process(101, "as"), process(102, "cc1")]);
        let mut out = String::new();
        markdown(&mut out, &report);
        let rows: Vec<&str> = out.lines().filter(|line| line.starts_with("| ")).skip(1).collect();
        assert_eq!(rows.len(), PROCESS_ROWS + 1, "{out}");
        assert!(
            rows[PROCESS_ROWS]
                .starts_with("| 3 more processes (cc1 x2, as x1) | - | 3 | 7.50 s | - | - | 0 | 30 |"),
            "{out}"
        );
    }

    #[test]
    fn steal_is_named_apart_and_not_taken_for_a_sleep_unseen() {
        let mut out = String::new();
        time_model(&mut out, &one_thread(0.4));
        assert!(
            out.contains("kept from running (the hypervisor's steal, or interrupts) 400.00 ms (13.3%)"),
            "{out}"
        );
        assert!(!out.contains("unseen"), "{out}");
        // Without steal, the same 0.4 s is time no event covered.
        let mut out = String::new();
        time_model(&mut out, &one_thread(0.0));
        assert!(!out.contains("steal"), "{out}");
        assert!(out.contains("its reason unseen 400.00 ms (13.3%)"), "{out}");
    }
}
