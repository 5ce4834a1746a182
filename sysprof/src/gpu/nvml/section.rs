//! The NVML family's section of the report: GPU utilization, memory, clocks, power and links
//! as NVML polled them, joined with the traced allocations.

use std::{collections::BTreeSet, fmt::Write as _};

use super::report::{self, GpuMetricsReport};
use crate::{
    family::{Analysis, Family},
    gpu::report::GpuReport,
    output::markdown::{escape, table},
    report::{
        Section,
        format::{bytes, percent},
    },
};

/// NVML polling (a tokio task while the trace runs, see `gpu::nvml::Poller`).
pub(crate) struct NvmlFamily;

impl Family for NvmlFamily {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn analyzed_after(&self) -> &'static [&'static str] {
        &["gpu"]
    }

    fn analyze(&mut self, cx: &mut Analysis<'_>) -> anyhow::Result<Option<Box<dyn Section>>> {
        let Some((samples, topology)) = cx.nvml else { return Ok(None) };
        let targets: BTreeSet<u32> = cx.processes.iter().map(|(pid, _)| pid).collect();
        let gpu = cx.sections.get::<GpuReport>();
        let mut metrics =
            report::build(samples.clone(), topology.clone(), cx.props.gpu_interval_ms, gpu, &targets);
        metrics.interval_end_ms = cx.run.gpu_interval_end_ms;
        cx.recommendations.extend(report::recommendations(&metrics, gpu, cx.wall_s()));
        Ok(Some(Box::new(metrics)))
    }
}

impl Section for GpuMetricsReport {
    fn json(&self) -> Vec<(&'static str, &dyn erased_serde::Serialize)> {
        vec![("gpu_metrics", self)]
    }

    fn markdown(&self, out: &mut String) {
        markdown(out, self);
    }
}

fn markdown(out: &mut String, metrics: &GpuMetricsReport) {
    let opt = |v: Option<f64>, unit: &str| v.map(|v| format!("{v:.0}{unit}")).unwrap_or_else(|| "-".into());
    match metrics.interval_end_ms {
        None => {
            let _ = writeln!(out, "### GPU compute (NVML, every {} ms)\n", metrics.interval_ms);
        }
        Some(end_ms) => {
            let _ = writeln!(
                out,
                "### GPU compute (NVML, every {} ms, {end_ms} ms by the end)\n\nPast {} polls of a GPU every other \
                 poll was dropped and the interval doubled: the run's whole length in bounded memory.\n",
                metrics.interval_ms,
                crate::report::format::thousands(super::series::MAX_ROUNDS as u64)
            );
        }
    }
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
    if let Some(unbalanced) = super::report::unbalanced_memory(metrics) {
        let _ = writeln!(
            out,
            "**Memory is unbalanced across devices**: {unbalanced}. Balance the partitioning (pipeline \
             stages, tensor-parallel shards, the rank that keeps extra state such as the optimizer or the \
             logits): the fullest device caps the batch size (memory, not time: not among the ranked \
             recommendations).\n"
        );
    }
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
