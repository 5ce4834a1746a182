//! The GPU sections: interconnect, NCCL, GPU compute as the host sees it, GPU memory, and the
//! NVML metrics and topology.

use std::fmt::Write as _;

use super::{bytes, escape, percent, table, thousands};
use crate::{latency::format_ns, report::Report};

pub(super) fn gpu(out: &mut String, report: &Report) {
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

pub(super) fn gpu_metrics(out: &mut String, report: &Report) {
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
