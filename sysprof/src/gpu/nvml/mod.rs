//! GPU metrics and topology from NVML (nvml-wrapper), polled on a tokio task while tracing.
//! Optional: without libnvidia-ml (or a GPU) sysprof says so in one line and does everything
//! else.
//!
//! What NVML's figures mean (each is quoted in the report): SM utilization is the share of the
//! last sample period (1/6 s to 1 s, by product) in which a kernel ran; memory-controller
//! utilization the share in which device memory was read or written; PCIe throughput is
//! measured over a 20 ms window; power is the board's draw (averaged over about a second on most
//! products); memory "used" is what the driver reserved, which frameworks' caching allocators
//! hold on to (traced allocations are what the program asked for).

pub mod report;
pub mod section;
pub mod series;
pub mod topology;

use std::{
    collections::BTreeMap,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use nvml_wrapper::{
    Nvml,
    enum_wrappers::device::{Clock, PcieUtilCounter, TemperatureSensor},
    enums::device::{SampleValue, UsedGpuMemory},
    structs::device::FieldId,
};
use serde::Serialize;
use tokio::{sync::watch, task::JoinHandle};

use crate::terminal::{stderr_line, stdout_text};

/// The library NVIDIA's driver installs.
const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";
/// Cumulative NVLink data counters (KiB), nvml.h NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX.
const NVLINK_TX: u32 = 138;
const NVLINK_RX: u32 = 139;

/// Opens NVML from `library` (default: the driver's libnvidia-ml.so.1); the error is one line.
pub fn open(library: Option<&Path>) -> Result<Arc<Nvml>, String> {
    let path = match library {
        // Its constructors would run as root: only a library no one but root can change.
        Some(library) if crate::privileges::is_root() => match crate::privileges::trusted_library(library) {
            Ok(resolved) => resolved.into_os_string(),
            Err(reason) if !library.exists() => {
                return Err(format!("NVML not available ({reason}): GPU metrics disabled"));
            }
            Err(reason) => return Err(format!("NVML not loaded ({reason}): GPU metrics disabled")),
        },
        Some(library) => library.as_os_str().to_owned(),
        None => DEFAULT_LIBRARY.into(),
    };
    let nvml = Nvml::builder().lib_path(&path).init().map_err(|error| {
        // libloading's message repeats itself ("a libloading error occurred: PATH: ...").
        let text = error.to_string();
        let reason = text.rsplit(": ").next().unwrap_or(&text).to_string();
        format!("NVML not available ({}: {reason}): GPU metrics disabled", path.to_string_lossy())
    })?;
    match nvml.device_count() {
        Ok(0) => Err("NVML found no GPU: GPU metrics disabled".into()),
        Ok(_) => Ok(Arc::new(nvml)),
        Err(error) => Err(format!("NVML cannot list GPUs ({error}): GPU metrics disabled")),
    }
}

/// `sysprof topo`: the GPUs and their links; exit code 1 when NVML is not available.
pub fn topo(library: Option<&Path>, json: bool) -> anyhow::Result<u8> {
    match open(library) {
        Ok(nvml) => {
            let topology = topology::read(&nvml);
            if json {
                stdout_text(&format!("{}\n", serde_json::to_string_pretty(&topology)?));
            } else {
                stdout_text(&topology::render(&topology));
            }
            Ok(0)
        }
        Err(line) => {
            stderr_line(format_args!("{line}"));
            Ok(1)
        }
    }
}

/// One poll of one device. Fields are None where the device does not support them.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Sample {
    /// Milliseconds since polling started.
    pub t_ms: u64,
    pub device: u32,
    pub sm_util_pct: Option<u32>,
    pub mem_util_pct: Option<u32>,
    pub mem_used: Option<u64>,
    pub power_mw: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub temperature_c: Option<u32>,
    /// Clock throttle reasons (NVML bit mask).
    pub throttle: Option<u64>,
    pub pcie_tx_kb_s: Option<u32>,
    pub pcie_rx_kb_s: Option<u32>,
    /// Cumulative NVLink data counters, KiB.
    pub nvlink_tx_kib: Option<u64>,
    pub nvlink_rx_kib: Option<u64>,
    /// GPU memory per process (all processes on the device; the report keeps the targets).
    pub processes: BTreeMap<u32, u64>,
}

/// Polls every device every `interval` until stopped; returns the samples, thinned to a bound
/// (`series`), and the interval they ended at.
pub struct Poller {
    stop: watch::Sender<bool>,
    task: JoinHandle<(Vec<Sample>, Duration)>,
}

impl Poller {
    pub fn start(nvml: Arc<Nvml>, interval: Duration) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut rounds = series::Rounds::new(interval);
            loop {
                tokio::select! {
                    _ = ticker.tick() => {
                        let mut round = Vec::new();
                        poll(&nvml, started, &mut round);
                        if let Some(longer) = rounds.add(round) {
                            ticker = tokio::time::interval_at(tokio::time::Instant::now() + longer, longer);
                            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        }
                    }
                    _ = stopped.changed() => break,
                }
            }
            rounds.finish()
        });
        Poller { stop, task }
    }

    pub async fn finish(self) -> (Vec<Sample>, Duration) {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

fn poll(nvml: &Nvml, started: Instant, samples: &mut Vec<Sample>) {
    let t_ms = started.elapsed().as_millis() as u64;
    let count = nvml.device_count().unwrap_or(0);
    for index in 0..count {
        let Ok(device) = nvml.device_by_index(index) else { continue };
        let utilization = device.utilization_rates().ok();
        let nvlink = device.field_values_for(&[FieldId(NVLINK_TX), FieldId(NVLINK_RX)]).ok();
        let counter = |i: usize| -> Option<u64> {
            match nvlink.as_ref()?.get(i)?.as_ref().ok()?.value.as_ref().ok()? {
                SampleValue::U64(v) => Some(*v),
                SampleValue::U32(v) => Some(u64::from(*v)),
                _ => None,
            }
        };
        samples.push(Sample {
            t_ms,
            device: index,
            sm_util_pct: utilization.as_ref().map(|u| u.gpu),
            mem_util_pct: utilization.as_ref().map(|u| u.memory),
            mem_used: device.memory_info().ok().map(|m| m.used),
            power_mw: device.power_usage().ok(),
            sm_clock_mhz: device.clock_info(Clock::SM).ok(),
            mem_clock_mhz: device.clock_info(Clock::Memory).ok(),
            temperature_c: device.temperature(TemperatureSensor::Gpu).ok(),
            throttle: device.current_throttle_reasons().ok().map(|r| r.bits()),
            pcie_tx_kb_s: device.pcie_throughput(PcieUtilCounter::Send).ok(),
            pcie_rx_kb_s: device.pcie_throughput(PcieUtilCounter::Receive).ok(),
            nvlink_tx_kib: counter(0),
            nvlink_rx_kib: counter(1),
            processes: device
                .running_compute_processes()
                .map(|processes| {
                    processes
                        .into_iter()
                        .filter_map(|p| match p.used_gpu_memory {
                            UsedGpuMemory::Used(bytes) => Some((p.pid, bytes)),
                            UsedGpuMemory::Unavailable => None,
                        })
                        .collect()
                })
                .unwrap_or_default(),
        });
    }
}
