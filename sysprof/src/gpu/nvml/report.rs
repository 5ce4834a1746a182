//! The NVML sections of the report: per device compute (utilization, power, clocks,
//! throttling), memory (NVML's reserved against the traced allocations), links (measured
//! against their peaks), the time series, and the recommendations they support.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::{Sample, topology::Topology};
use crate::{gpu::report::GpuReport, report::recommendation::Recommendation};

/// What the NVML figures mean, quoted in the report.
pub const MEANINGS: [&str; 5] = [
    "SM utilization: share of NVML's sample period (1/6 s to 1 s, by product) in which a kernel ran; not how busy the SMs were",
    "Memory-controller utilization: share of the sample period in which device memory was read or written",
    "PCIe throughput: measured by NVML over a 20 ms window at each poll",
    "Power: board draw as NVML reports it (averaged over about a second on most products)",
    "Memory used: what the driver reserved (a framework's caching allocator keeps freed memory); traced allocations are what the program asked for",
];

#[derive(Clone, Debug, Default, Serialize)]
pub struct GpuMetricsReport {
    pub interval_ms: u64,
    /// The interval at the end, when the polls' bound doubled it (`super::series`).
    pub interval_end_ms: Option<u64>,
    pub meanings: Vec<&'static str>,
    pub topology: Topology,
    pub devices: Vec<DeviceMetrics>,
    pub memory: Vec<DeviceMemory>,
    pub links: Vec<LinkRow>,
    /// Every poll of every device.
    pub series: Vec<Sample>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeviceMetrics {
    pub device: u32,
    pub name: String,
    pub samples: usize,
    pub sm_util_mean: Option<f64>,
    pub sm_util_p50: Option<u32>,
    pub sm_util_max: Option<u32>,
    pub mem_util_mean: Option<f64>,
    pub mem_util_max: Option<u32>,
    pub power_mean_w: Option<f64>,
    pub power_max_w: Option<f64>,
    pub sm_clock_mean_mhz: Option<f64>,
    pub mem_clock_mean_mhz: Option<f64>,
    pub temperature_max_c: Option<u32>,
    /// Throttle reasons seen in any sample (idle excluded).
    pub throttle_reasons: Vec<&'static str>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeviceMemory {
    pub device: u32,
    pub total: u64,
    /// NVML "used" at its highest during the trace: reserved by the driver.
    pub reserved_max: Option<u64>,
    /// Traced allocations (cudaMalloc & co.) now and at peak, when GPU calls were traced.
    pub allocated: Option<u64>,
    pub allocated_peak: Option<u64>,
    /// GPU memory of the target processes, as NVML accounts it, at its highest.
    pub target_processes_max: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct LinkRow {
    pub device: u32,
    /// "PCIe TX", "PCIe RX", "NVLink TX", "NVLink RX".
    pub link: String,
    pub mean_gb_s: f64,
    pub max_gb_s: f64,
    pub peak_gb_s: Option<f64>,
}

const THROTTLE_REASONS: [(u64, &str); 8] = [
    (0x2, "applications clocks setting"),
    (0x4, "software power cap"),
    (0x8, "hardware slowdown"),
    (0x10, "sync boost"),
    (0x20, "software thermal slowdown"),
    (0x40, "hardware thermal slowdown"),
    (0x80, "hardware power brake"),
    (0x100, "display clock setting"),
];

fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// Builds the section from the polls; `gpu` joins the traced allocations; `targets` are the
/// target pids.
pub fn build(
    samples: Vec<Sample>,
    topology: Topology,
    interval_ms: u64,
    gpu: Option<&GpuReport>,
    targets: &BTreeSet<u32>,
) -> GpuMetricsReport {
    let mut by_device: BTreeMap<u32, Vec<&Sample>> = BTreeMap::new();
    for sample in &samples {
        by_device.entry(sample.device).or_default().push(sample);
    }
    let name = |device: u32| {
        topology.devices.iter().find(|d| d.index == device).map(|d| d.name.clone()).unwrap_or_default()
    };
    let mut devices = Vec::new();
    let mut memory = Vec::new();
    let mut links = Vec::new();
    for (&device, polls) in &by_device {
        let values =
            |f: &dyn Fn(&Sample) -> Option<u32>| -> Vec<u32> { polls.iter().filter_map(|s| f(s)).collect() };
        let sm = values(&|s| s.sm_util_pct);
        let mut sm_sorted = sm.clone();
        sm_sorted.sort_unstable();
        let mem_util = values(&|s| s.mem_util_pct);
        let power = values(&|s| s.power_mw);
        let as_f64 = |v: &[u32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
        let throttle = polls.iter().filter_map(|s| s.throttle).fold(0, |a, b| a | b);
        devices.push(DeviceMetrics {
            device,
            name: name(device),
            samples: polls.len(),
            sm_util_mean: mean(&as_f64(&sm)),
            sm_util_p50: sm_sorted.get(sm_sorted.len() / 2).copied(),
            sm_util_max: sm.iter().max().copied(),
            mem_util_mean: mean(&as_f64(&mem_util)),
            mem_util_max: mem_util.iter().max().copied(),
            power_mean_w: mean(&as_f64(&power)).map(|mw| mw / 1000.0),
            power_max_w: power.iter().max().map(|&mw| f64::from(mw) / 1000.0),
            sm_clock_mean_mhz: mean(&as_f64(&values(&|s| s.sm_clock_mhz))),
            mem_clock_mean_mhz: mean(&as_f64(&values(&|s| s.mem_clock_mhz))),
            temperature_max_c: values(&|s| s.temperature_c).into_iter().max(),
            throttle_reasons: THROTTLE_REASONS
                .iter()
                .filter(|(bit, _)| throttle & bit != 0)
                .map(|(_, n)| *n)
                .collect(),
        });
        let traced = gpu.and_then(|g| {
            let pools: Vec<_> = g.memory.iter().filter(|m| m.device == device as i32).collect();
            (!pools.is_empty()).then(|| {
                (
                    pools.iter().map(|m| m.current_bytes).sum::<u64>(),
                    pools.iter().map(|m| m.peak_bytes).sum::<u64>(),
                )
            })
        });
        let info = topology.devices.iter().find(|d| d.index == device);
        memory.push(DeviceMemory {
            device,
            total: info.map_or(0, |d| d.memory_total),
            reserved_max: polls.iter().filter_map(|s| s.mem_used).max(),
            allocated: traced.map(|t| t.0),
            allocated_peak: traced.map(|t| t.1),
            target_processes_max: polls
                .iter()
                .map(|s| {
                    s.processes.iter().filter(|(pid, _)| targets.contains(pid)).map(|(_, b)| b).sum::<u64>()
                })
                .max()
                .unwrap_or(0),
        });
        let mut link_row = |label: &str, rates: &[f64], peak_gb_s: Option<f64>| {
            if let Some(mean_gb_s) = mean(rates) {
                let max_gb_s = rates.iter().copied().fold(0.0, f64::max);
                links.push(LinkRow { device, link: label.into(), mean_gb_s, max_gb_s, peak_gb_s });
            }
        };
        let pcie_peak = info.and_then(|d| d.pcie_peak_gb_s);
        for (label, f) in [
            ("PCIe TX", (|s: &Sample| s.pcie_tx_kb_s) as fn(&Sample) -> Option<u32>),
            ("PCIe RX", |s: &Sample| s.pcie_rx_kb_s),
        ] {
            let rates: Vec<f64> =
                polls.iter().filter_map(|s| f(s)).map(|kb| f64::from(kb) * 1024.0 / 1e9).collect();
            link_row(label, &rates, pcie_peak);
        }
        let nvlink_peak = info.map(|d| d.nvlink_peak_gb_s).filter(|p| *p > 0.0);
        for (label, f) in [
            ("NVLink TX", (|s: &Sample| s.nvlink_tx_kib) as fn(&Sample) -> Option<u64>),
            ("NVLink RX", |s: &Sample| s.nvlink_rx_kib),
        ] {
            // Cumulative counters: rates between consecutive polls.
            let points: Vec<(u64, u64)> = polls.iter().filter_map(|s| Some((s.t_ms, f(s)?))).collect();
            let rates: Vec<f64> = points
                .windows(2)
                .filter(|w| w[1].0 > w[0].0)
                .map(|w| {
                    w[1].1.saturating_sub(w[0].1) as f64 * 1024.0 / ((w[1].0 - w[0].0) as f64 / 1000.0) / 1e9
                })
                .collect();
            link_row(label, &rates, nvlink_peak);
        }
    }
    GpuMetricsReport {
        interval_ms,
        interval_end_ms: None,
        meanings: MEANINGS.to_vec(),
        topology,
        devices,
        memory,
        links,
        series: samples,
    }
}

/// The GPU metrics' recommendations, joined with the traced calls; their seconds come from
/// NVML's utilization over the trace's `wall_s`, which it cannot resolve any finer. Unbalanced
/// memory is memory, not time: the section says it (see [`unbalanced_memory`]). A PCIe link far
/// below its peak with pageable copies is the GPU family's pinning advice, not a second one.
pub fn recommendations(
    metrics: &GpuMetricsReport,
    gpu: Option<&GpuReport>,
    wall_s: f64,
) -> Vec<Recommendation> {
    let mut out = Vec::new();
    let launches_per_s = gpu.map_or(0.0, |g| g.compute.launches_per_s);
    for device in &metrics.devices {
        let Some(util) = device.sm_util_mean else { continue };
        if util < 40.0 && launches_per_s > 5_000.0 {
            out.push(Recommendation {
                seconds: (1.0 - util / 100.0) * 0.5 * wall_s,
                impact: 0.0,
                title: format!("GPU {} is launch-bound", device.device),
                evidence: format!("SM utilization {util:.0}% while the host launches {launches_per_s:.0} kernels/s"),
                action: "Launch fewer, larger kernels: CUDA graphs (torch.cuda.graphs, torch.compile mode=\"reduce-overhead\"), \
                         kernel fusion, larger batches"
                    .into(),
            });
        }
    }
    // Work not spread across the GPUs: the busiest GPU's busy time, shared with the idle ones,
    // shrinks by their share of all the GPUs. One cause, one recommendation, naming them all.
    let busiest = metrics.devices.iter().filter_map(|d| d.sm_util_mean).fold(0.0, f64::max);
    let idle: Vec<u32> =
        metrics.devices.iter().filter(|d| d.sm_util_max.is_some_and(|m| m < 5)).map(|d| d.device).collect();
    if busiest >= 50.0 && !idle.is_empty() {
        let share = idle.len() as f64 / metrics.devices.len() as f64;
        let busy_s = busiest / 100.0 * wall_s;
        let names: Vec<String> = idle.iter().map(u32::to_string).collect();
        out.push(Recommendation {
            seconds: busy_s * share,
            impact: 0.0,
            title: match idle.len() {
                1 => format!("GPU {} sat idle", names[0]),
                _ => format!("GPUs {} sat idle", names.join(", ")),
            },
            evidence: format!(
                "SM utilization never passed 5% while the busiest GPU averaged {busiest:.0}% ({busy_s:.2} s \
                 busy); spread over all {} GPUs, that work would take {:.0}% less",
                metrics.devices.len(),
                share * 100.0
            ),
            action: "Spread the work (data or model parallelism across all GPUs), or free the idle GPU for \
                     another job"
                .into(),
        });
    }
    out
}

/// "GPU A holds X GiB, GPU B Y GiB" when the devices' memory differs by more than half.
pub fn unbalanced_memory(metrics: &GpuMetricsReport) -> Option<String> {
    let used: Vec<(u32, u64)> =
        metrics.memory.iter().filter_map(|m| Some((m.device, m.reserved_max?))).collect();
    let (max_device, max) = used.iter().copied().max_by_key(|(_, b)| *b)?;
    let (min_device, min) = used.iter().copied().min_by_key(|(_, b)| *b)?;
    (used.len() >= 2 && min > 0 && max as f64 / min as f64 > 1.5).then(|| {
        format!(
            "GPU {max_device} holds {:.1} GiB, GPU {min_device} {:.1} GiB",
            max as f64 / (1u64 << 30) as f64,
            min as f64 / (1u64 << 30) as f64
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t_ms: u64, device: u32, sm: u32) -> Sample {
        Sample {
            t_ms,
            device,
            sm_util_pct: Some(sm),
            mem_util_pct: Some(10),
            mem_used: Some(1 << 30),
            power_mw: Some(100_000),
            sm_clock_mhz: Some(1000),
            mem_clock_mhz: Some(2000),
            temperature_c: Some(50),
            throttle: Some(0x4),
            pcie_tx_kb_s: Some(1000),
            pcie_rx_kb_s: None,
            nvlink_tx_kib: Some(t_ms * 1024),
            nvlink_rx_kib: None,
            processes: BTreeMap::from([(7, 100), (8, 50)]),
        }
    }

    #[test]
    fn device_statistics_and_counters_as_rates() {
        let samples = vec![sample(0, 0, 10), sample(100, 0, 30), sample(200, 0, 50)];
        let report = build(samples, Topology::default(), 100, None, &BTreeSet::from([7]));
        let device = &report.devices[0];
        assert_eq!(device.samples, 3);
        assert_eq!(
            (device.sm_util_mean, device.sm_util_p50, device.sm_util_max),
            (Some(30.0), Some(30), Some(50))
        );
        assert_eq!(device.power_mean_w, Some(100.0));
        assert_eq!(device.throttle_reasons, ["software power cap"]);
        assert_eq!(report.memory[0].target_processes_max, 100);
        let nvlink = report.links.iter().find(|l| l.link == "NVLink TX").unwrap();
        // 1024 KiB per 100 ms... per ms of t: 1 MiB/s x 1000 = 1.048 GB/s.
        assert!((nvlink.mean_gb_s - 1.048576).abs() < 1e-6, "{}", nvlink.mean_gb_s);
        assert_eq!(report.series.len(), 3);
    }
}
