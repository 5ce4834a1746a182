//! `report.md`: the report model as tables a person reads top to bottom. Part A answers where the
//! time goes and what to change first; Part B is the changelog of what sysprof instrumented.

use std::{fmt::Write as _, path::Path};

use super::{Artifact, Sink, write_file};
use crate::{gpu::report::bytes, latency::format_ns, report::Report};

/// Rows in the syscall table (report.json has them all).
const SYSCALL_ROWS: usize = 25;
/// Processes whose threads are listed.
const THREAD_TABLES: usize = 3;

pub struct MarkdownReport;

impl Sink for MarkdownReport {
    fn write(&self, artifact: &Artifact<'_>, dir: &Path) -> anyhow::Result<Option<String>> {
        let Artifact::Report(report) = artifact else {
            return Ok(None);
        };
        write_file(dir, "report.md", render(report).as_bytes())?;
        Ok(Some("report.md".into()))
    }
}

/// The whole report as Markdown.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# sysprof report: {}\n", report.run.target);
    let _ = writeln!(out, "## Part A: where the time goes\n");
    run_summary(&mut out, report);
    recommendations(&mut out, report);
    cpu(&mut out, report);
    sched(&mut out, report);
    syscalls(&mut out, report);
    gpu(&mut out, report);
    gpu_metrics(&mut out, report);
    functions(&mut out, report);
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
    if let Some(status) = &run.command_status {
        rows.push(vec!["Command".into(), status.clone()]);
    }
    rows.extend([
        vec![
            "Sampling".into(),
            format!("{} at {} Hz per CPU, {} CPUs", run.event, run.frequency_hz, run.cpus),
        ],
        vec!["Samples".into(), thousands(run.samples)],
        vec![
            "Machine CPU".into(),
            match run.machine_busy_share {
                Some(busy) => format!(
                    "{:.1}% busy, {:.1}% idle, all CPUs together (/proc/stat); idle CPUs are not sampled",
                    busy * 100.0,
                    (1.0 - busy) * 100.0
                ),
                None => "unknown (/proc/stat unreadable)".into(),
            },
        ],
        vec![
            "Lost".into(),
            format!(
                "{} samples, {} user stacks, {} kernel stacks, {} process events, {} processes not followed, \
                 {} syscalls, {} scheduler events, {} off-CPU intervals",
                run.lost.samples,
                run.lost.user_stacks,
                run.lost.kernel_stacks,
                run.lost.process_events,
                run.lost.processes_not_followed,
                run.lost.syscalls,
                run.lost.sched_events,
                run.lost.offcpu_intervals
            ),
        ],
        vec!["Files".into(), run.outputs.join(", ")],
    ]);
    table(out, &["", ""], &rows);
}

fn recommendations(out: &mut String, report: &Report) {
    let _ = writeln!(out, "### Recommendations, ranked by expected impact\n");
    if report.recommendations.is_empty() {
        let _ = writeln!(out, "Nothing stands out: no single function or cost dominates.\n");
        return;
    }
    for (rank, rec) in report.recommendations.iter().enumerate() {
        let _ = writeln!(
            out,
            "{}. **{}** (impact ~{:.0}% of measured time). {}. {}.",
            rank + 1,
            escape(&rec.title),
            rec.impact * 100.0,
            rec.evidence,
            rec.action
        );
    }
    out.push('\n');
}

fn cpu(out: &mut String, report: &Report) {
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

fn sched(out: &mut String, report: &Report) {
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

fn syscalls(out: &mut String, report: &Report) {
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

fn gpu(out: &mut String, report: &Report) {
    let Some(gpu) = &report.gpu else { return };
    if gpu.libraries.is_empty() {
        return;
    }
    let _ = writeln!(out, "### Interconnect: CPU-GPU transfers\n");
    let probed: Vec<String> =
        gpu.libraries.iter().map(|l| format!("{} ({} functions)", l.path.display(), l.functions)).collect();
    let _ = writeln!(
        out,
        "Probed: {}. Sizes are what each call asked to move (failed calls included, counted under \
         errors); bandwidth is bytes over time of the successful synchronous copies (asynchronous ones \
         return before the copy is done).\n",
        probed.join("; ")
    );
    if gpu.interconnect.is_empty() {
        let _ = writeln!(out, "No transfers.\n");
    } else {
        let rows: Vec<Vec<String>> = gpu
            .interconnect
            .iter()
            .map(|t| {
                vec![
                    t.kind.clone(),
                    thousands(t.calls),
                    thousands(t.errors),
                    format!("{:.1}", t.calls_per_s),
                    format!("{} / {} / {}", bytes(t.size_p50), bytes(t.size_p99), bytes(t.size_max)),
                    bytes(t.total_bytes),
                    format!("{} / {}", format_ns(t.latency_p50_ns), format_ns(t.latency_p99_ns)),
                    t.bandwidth_gb_s.map(|b| format!("{b:.2} GB/s")).unwrap_or_else(|| "-".into()),
                    format!("{} / {}", t.pinned, t.pageable),
                ]
            })
            .collect();
        table(
            out,
            &[
                "Type",
                "Calls",
                "Errors",
                "Calls/s",
                "Size p50 / p99 / max",
                "Total",
                "Latency p50 / p99",
                "Bandwidth",
                "Pinned / pageable",
            ],
            &rows,
        );
    }
    if !gpu.nccl.is_empty() {
        let _ = writeln!(out, "### NCCL collectives\n");
        let _ = writeln!(
            out,
            "Latency is host-side enqueue time: NCCL returns once the collective is queued. algbw/busbw \
             use the time from the call to the thread's next synchronize, when there was one.\n"
        );
        let rows: Vec<Vec<String>> = gpu
            .nccl
            .iter()
            .map(|n| {
                let types: Vec<String> = n.datatypes.iter().map(|(t, c)| format!("{t} {c}")).collect();
                vec![
                    format!("{:?}", n.op),
                    thousands(n.calls),
                    thousands(n.errors),
                    bytes(n.total_bytes),
                    format!("{} / {} / {}", bytes(n.size_p50), bytes(n.size_p99), bytes(n.size_max)),
                    format!("{} / {}", format_ns(n.enqueue_p50_ns), format_ns(n.enqueue_p99_ns)),
                    match (n.algbw_gb_s, n.busbw_gb_s) {
                        (Some(a), Some(b)) => format!("{a:.2} / {b:.2} GB/s"),
                        _ => "- (no synchronize seen)".into(),
                    },
                    types.join(", "),
                ]
            })
            .collect();
        table(
            out,
            &[
                "Op",
                "Calls",
                "Errors",
                "Total",
                "Size p50 / p99 / max",
                "Enqueue p50 / p99",
                "algbw / busbw",
                "Data types",
            ],
            &rows,
        );
    }
    let compute = &gpu.compute;
    let _ = writeln!(out, "### GPU compute (host side)\n");
    let launch = compute
        .launch_latency
        .map(|l| format!("{} / {}", format_ns(l.p50_ns), format_ns(l.p99_ns)))
        .unwrap_or_else(|| "-".into());
    let rows = vec![
        vec!["Kernel launches".to_string(), format!("{} ({:.1}/s)", thousands(compute.launches), compute.launches_per_s)],
        vec!["Launch overhead p50 / p99 (CPU time of the call)".into(), launch],
        vec!["Graph launches".into(), thousands(compute.graph_launches)],
        vec![
            "Blocked in synchronization".into(),
            format!("{:.3} s in {} calls", compute.sync_blocked_s, thousands(compute.sync_calls)),
        ],
        vec![
            "Communication / computation (host-observed)".into(),
            compute
                .comm_to_compute
                .map(|r| format!("{r:.2}: time in NCCL calls and synchronous copies over time blocked waiting for the GPU"))
                .unwrap_or_else(|| "- (no synchronization seen)".into()),
        ],
    ];
    table(out, &["", ""], &rows);
    if !compute.top_kernels.is_empty() {
        let rows: Vec<Vec<String>> = compute
            .top_kernels
            .iter()
            .map(|k| {
                vec![format!("`{}`", escape(&k.kernel)), thousands(k.launches), format_ns(k.launch_p50_ns)]
            })
            .collect();
        table(out, &["Kernel (host stub)", "Launches", "Launch p50"], &rows);
    }
    if !compute.sync_sites.is_empty() {
        let rows: Vec<Vec<String>> = compute
            .sync_sites
            .iter()
            .map(|s| {
                vec![
                    format!("`{}`", s.function),
                    escape(&s.call_site),
                    thousands(s.calls),
                    format!("{:.3} s", s.total_s),
                ]
            })
            .collect();
        table(out, &["Synchronization", "Called from", "Calls", "Blocked"], &rows);
    }
    if !gpu.memory.is_empty() {
        let _ = writeln!(out, "### GPU memory (traced allocations)\n");
        let rows: Vec<Vec<String>> = gpu
            .memory
            .iter()
            .map(|m| {
                vec![
                    format!("{:?}", m.pool),
                    if m.device < 0 { "host".into() } else { m.device.to_string() },
                    bytes(m.current_bytes),
                    bytes(m.peak_bytes),
                    thousands(m.allocations),
                    thousands(m.frees),
                    thousands(m.failed),
                    format!("{} / {}", bytes(m.size_p50), bytes(m.size_p99)),
                ]
            })
            .collect();
        table(
            out,
            &["Pool", "Device", "Allocated now", "Peak", "Allocations", "Frees", "Failed", "Size p50 / p99"],
            &rows,
        );
        if !gpu.leaks.is_empty() {
            let rows: Vec<Vec<String>> = gpu
                .leaks
                .iter()
                .take(10)
                .map(|l| {
                    vec![
                        format!("{:?}", l.pool),
                        l.device.to_string(),
                        thousands(l.allocations),
                        bytes(l.bytes),
                        escape(&l.call_site),
                    ]
                })
                .collect();
            let _ = writeln!(out, "Still allocated when the trace ended (leaks, if the program was done):\n");
            table(out, &["Pool", "Device", "Allocations", "Bytes", "Allocated from"], &rows);
        }
    }
    if let Some(cost) = gpu.probe_cost {
        let _ = writeln!(
            out,
            "Probe cost: {} probed calls at {:.0} ns each (measured on this machine: uprobe trap plus \
             sysprof's programs) added {:.3} s to the target's threads.\n",
            thousands(cost.hits),
            cost.ns_per_call,
            cost.added_s
        );
    }
}

fn gpu_metrics(out: &mut String, report: &Report) {
    let Some(metrics) = &report.gpu_metrics else { return };
    let opt = |v: Option<f64>, unit: &str| v.map(|v| format!("{v:.0}{unit}")).unwrap_or_else(|| "-".into());
    let _ = writeln!(out, "### GPU compute (NVML, every {} ms)\n", metrics.interval_ms);
    for meaning in &metrics.meanings {
        let _ = writeln!(out, "- {meaning}");
    }
    out.push('\n');
    let rows: Vec<Vec<String>> = metrics
        .devices
        .iter()
        .map(|d| {
            vec![
                d.device.to_string(),
                escape(&d.name),
                d.samples.to_string(),
                format!(
                    "{} / {} / {}",
                    opt(d.sm_util_mean, "%"),
                    d.sm_util_p50.map_or("-".into(), |v| format!("{v}%")),
                    d.sm_util_max.map_or("-".into(), |v| format!("{v}%"))
                ),
                format!(
                    "{} / {}",
                    opt(d.mem_util_mean, "%"),
                    d.mem_util_max.map_or("-".into(), |v| format!("{v}%"))
                ),
                format!("{} / {}", opt(d.power_mean_w, " W"), opt(d.power_max_w, " W")),
                format!("{} / {}", opt(d.sm_clock_mean_mhz, " MHz"), opt(d.mem_clock_mean_mhz, " MHz")),
                d.temperature_max_c.map_or("-".into(), |t| format!("{t} C")),
                if d.throttle_reasons.is_empty() { "none".into() } else { d.throttle_reasons.join(", ") },
            ]
        })
        .collect();
    table(
        out,
        &[
            "GPU",
            "Name",
            "Samples",
            "SM util mean / p50 / max",
            "Memory util mean / max",
            "Power mean / max",
            "SM / memory clock",
            "Max temp",
            "Throttling",
        ],
        &rows,
    );
    let _ = writeln!(out, "### GPU memory: reserved (NVML) vs allocated (traced)\n");
    let rows: Vec<Vec<String>> = metrics
        .memory
        .iter()
        .map(|m| {
            vec![
                m.device.to_string(),
                bytes(m.total),
                m.reserved_max.map_or("-".into(), bytes),
                m.allocated.map_or("- (not traced)".into(), bytes),
                m.allocated_peak.map_or("-".into(), bytes),
                bytes(m.target_processes_max),
            ]
        })
        .collect();
    table(
        out,
        &[
            "GPU",
            "Total",
            "Reserved (NVML used, max)",
            "Allocated now (traced)",
            "Allocated peak (traced)",
            "Target processes (NVML, max)",
        ],
        &rows,
    );
    if !metrics.links.is_empty() {
        let _ = writeln!(out, "### GPU links: measured vs peak\n");
        let rows: Vec<Vec<String>> = metrics
            .links
            .iter()
            .map(|l| {
                vec![
                    l.device.to_string(),
                    l.link.clone(),
                    format!("{:.2} GB/s", l.mean_gb_s),
                    format!("{:.2} GB/s", l.max_gb_s),
                    l.peak_gb_s.map_or("-".into(), |p| format!("{p:.1} GB/s")),
                    l.peak_gb_s.map_or("-".into(), |p| percent(l.max_gb_s / p)),
                ]
            })
            .collect();
        table(out, &["GPU", "Link", "Mean", "Max", "Peak (per direction)", "Max / peak"], &rows);
    }
    let topology = &metrics.topology;
    if topology.devices.len() > 1 {
        let _ = writeln!(out, "### GPU topology\n");
        let mut headers = vec![String::new()];
        headers.extend(topology.devices.iter().map(|d| format!("GPU{}", d.index)));
        let rows: Vec<Vec<String>> = topology
            .devices
            .iter()
            .zip(&topology.matrix)
            .map(|(d, row)| std::iter::once(format!("GPU{}", d.index)).chain(row.iter().cloned()).collect())
            .collect();
        let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
        table(out, &headers, &rows);
        let _ = writeln!(
            out,
            "NV# = # NVLinks, PIX/PXB = PCIe switch(es), PHB = host bridge, NODE = same NUMA node, SYS = across \
             NUMA nodes.\n"
        );
    }
}

fn functions(out: &mut String, report: &Report) {
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
        table(out, &["BPF program", "Runs", "Total time", "Per run"], &rows);
        let _ = writeln!(
            out,
            "BPF programs: {:.3} ms in all, {:.4}% of the CPU time available during the run. The kernel \
             timed them during {:.0}% of the run (its statistics cost two clock reads per run, so they are \
             on in windows); runs and times are scaled to the whole run.",
            cost.bpf_time_ns as f64 / 1e6,
            cost.bpf_cpu_share * 100.0,
            cost.bpf_stats_coverage * 100.0
        );
    } else {
        let _ = writeln!(out, "The kernel keeps no BPF run-time statistics here (kernel.bpf_stats_enabled).");
    }
    let _ = writeln!(
        out,
        "sysprof process: {:.2} s of CPU, peak RSS {} KiB. Lost events: {}.\n",
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
            .map(|f| vec![escape(f), "modified".into(), String::new(), "?".into()])
            .collect()
    };
    table(out, &["File", "Change type", "What", "Lines"], &file_rows);

    let _ = writeln!(out, "### BPF programs attached\n");
    let gone = instr.detach.still_loaded.is_empty();
    let rows: Vec<Vec<String>> = instr
        .probes
        .iter()
        .map(|p| {
            let detached = if instr.detach.still_loaded.contains(&p.program_id) {
                format!("NO: program id {} still loaded", p.program_id)
            } else {
                format!("yes (program id {} gone)", p.program_id)
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
        "Detach check: {} of {} programs confirmed unloaded by listing the kernel's BPF programs after \
         detaching{}.",
        instr.detach.programs - instr.detach.still_loaded.len(),
        instr.detach.programs,
        if gone { "" } else { " (some remained: see above)" }
    );
}

/// A Markdown table; the first header may be empty for key/value tables.
fn table(out: &mut String, headers: &[&str], rows: &[Vec<String>]) {
    let _ = writeln!(out, "| {} |", headers.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(headers.len()));
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    out.push('\n');
}

fn escape(text: &str) -> String {
    text.replace('|', "\\|")
}

fn percent(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// 1234567 -> "1,234,567".
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
    }
}
