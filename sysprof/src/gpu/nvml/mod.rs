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
    collections::{BTreeMap, HashSet},
    ffi::CString,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
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

use crate::{
    privileges::{self, InvokingUser, as_user},
    terminal::{stderr_line, stdout_text},
    uprobes::needed,
};

/// The library NVIDIA's driver installs.
const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";
/// Cumulative NVLink data counters (KiB), nvml.h NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX.
const NVLINK_TX: u32 = 138;
const NVLINK_RX: u32 = 139;
/// How deep the libraries NVML needs are followed (its own needs are glibc's).
const MAX_DEPENDENCY_DEPTH: usize = 8;

/// Why NVML is not loaded.
#[derive(Debug, PartialEq, Eq)]
pub enum Unloadable {
    /// Not there: no library at the path given, or none where the loader would look.
    Missing(String),
    /// Through sudo, a library the user named that they cannot read.
    Unreadable { path: PathBuf, user: String },
    /// As root, a library someone other than root could change: its code would run as root.
    Untrusted(String),
}

impl Unloadable {
    /// The one line that says so (GPU metrics are off, everything else runs).
    pub fn line(&self) -> String {
        match self {
            Unloadable::Missing(reason) => format!("NVML not available ({reason}): GPU metrics disabled"),
            Unloadable::Unreadable { path, user } => {
                format!("NVML not loaded ({user} cannot read {}): GPU metrics disabled", path.display())
            }
            Unloadable::Untrusted(reason) => format!("NVML not loaded ({reason}): GPU metrics disabled"),
        }
    }
}

/// Where NVML is loaded from. As root, the library must be root's and writable by no one else
/// (`privileges::trusted_library`), and the caller's library path is never searched: the
/// driver's libnvidia-ml.so.1 is looked for as the loader would with none (its cache, then
/// the standard directories), and loaded by that absolute path. `library` (`--nvml-lib`) is
/// resolved with `user`'s rights, through sudo, and only what they can read is loaded. Not as
/// root, the library as named (the loader's own search, sysprof's own rights).
pub fn locate(library: Option<&Path>, user: Option<&InvokingUser>) -> Result<PathBuf, Unloadable> {
    if !privileges::is_root() {
        return Ok(library.map_or_else(|| PathBuf::from(DEFAULT_LIBRARY), Path::to_path_buf));
    }
    let resolved = match library {
        Some(library) => {
            let unreadable = || Unloadable::Unreadable {
                path: library.to_path_buf(),
                user: user.map(|user| user.name.clone()).unwrap_or_default(),
            };
            match as_user(user, || library.canonicalize()) {
                Ok(Ok(resolved)) => resolved,
                _ if user.is_some() => return Err(unreadable()),
                Ok(Err(error)) => return Err(Unloadable::Missing(format!("{}: {error}", library.display()))),
                Err(error) => return Err(Unloadable::Missing(error.to_string())),
            }
        }
        None => needed::trusted_location(DEFAULT_LIBRARY).ok_or_else(|| {
            Unloadable::Missing(format!(
                "{DEFAULT_LIBRARY} is in neither the loader's cache nor the standard library directories"
            ))
        })?,
    };
    // Every directory of the resolved path is root's and no one else's to change: what is
    // checked below is what is loaded.
    let resolved = privileges::trusted_library(&resolved).map_err(Unloadable::Untrusted)?;
    if let Some(user) = user
        && !user.can_read(&resolved)
    {
        return Err(Unloadable::Unreadable {
            path: library.map_or_else(|| resolved.clone(), Path::to_path_buf),
            user: user.name.clone(),
        });
    }
    Ok(resolved)
}

/// Opens NVML from `library` (default: the driver's libnvidia-ml.so.1), found as [`locate`]
/// finds it; the error is one line.
pub fn open(library: Option<&Path>, user: Option<&InvokingUser>) -> Result<Arc<Nvml>, String> {
    let path = locate(library, user).map_err(|unloadable| unloadable.line())?;
    if privileges::is_root() {
        load_dependencies(&path, &mut HashSet::new(), 0).map_err(|reason| reason.line())?;
    }
    let nvml = Nvml::builder().lib_path(path.as_os_str()).init().map_err(|error| {
        // libloading's message repeats itself ("a libloading error occurred: PATH: ...").
        let text = error.to_string();
        let reason = text.rsplit(": ").next().unwrap_or(&text).to_string();
        format!("NVML not available ({}: {reason}): GPU metrics disabled", path.display())
    })?;
    match nvml.device_count() {
        Ok(0) => Err("NVML found no GPU: GPU metrics disabled".into()),
        Ok(_) => Ok(Arc::new(nvml)),
        Err(error) => Err(format!("NVML cannot list GPUs ({error}): GPU metrics disabled")),
    }
}

/// Loads, as root, the libraries `library` needs before it: each found as [`locate`] finds
/// NVML (no caller's library path) and trusted as it is. Loading `library` then finds each
/// loaded already, by its name, and searches no directory for it: the loader would search the
/// LD_LIBRARY_PATH sysprof was started with first (through `sudo -E`, or a sudo rule that keeps
/// it, the caller's).
fn load_dependencies(library: &Path, loaded: &mut HashSet<PathBuf>, depth: usize) -> Result<(), Unloadable> {
    if depth > MAX_DEPENDENCY_DEPTH {
        return Ok(());
    }
    for name in needed::needed_names(library) {
        let found =
            if name.contains('/') { Some(PathBuf::from(&name)) } else { needed::trusted_location(&name) };
        let found = found.ok_or_else(|| {
            Unloadable::Missing(format!(
                "{} needs {name}, which is in neither the loader's cache nor the standard library directories",
                library.display()
            ))
        })?;
        let found = privileges::trusted_library(&found).map_err(Unloadable::Untrusted)?;
        if !loaded.insert(found.clone()) {
            continue;
        }
        load_dependencies(&found, loaded, depth + 1)?;
        let name = CString::new(found.as_os_str().as_bytes())
            .map_err(|_| Unloadable::Missing(format!("{}: not a path the loader takes", found.display())))?;
        // Kept for the life of the process, as NVML, which needs it, is. A library loaded
        // already (libc) is found by its path or identity and not loaded twice.
        // SAFETY: a valid C string; the library is root's and no one else's to change.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(Unloadable::Missing(format!("{} could not be loaded", found.display())));
        }
    }
    Ok(())
}

/// `sysprof topo`: the GPUs and their links; exit code 1 when NVML is not available.
pub fn topo(library: Option<&Path>, json: bool) -> anyhow::Result<u8> {
    match open(library, InvokingUser::from_sudo_env().as_ref()) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn as_root_the_default_library_is_found_without_any_library_path() {
        if !privileges::is_root() {
            assert_eq!(locate(None, None), Ok(PathBuf::from(DEFAULT_LIBRARY)));
            return;
        }
        match needed::trusted_location(DEFAULT_LIBRARY) {
            Some(path) => assert!(locate(None, None).is_ok_and(|found| found.is_absolute()), "{path:?}"),
            None => assert_eq!(
                locate(None, None).unwrap_err().line(),
                "NVML not available (libnvidia-ml.so.1 is in neither the loader's cache nor the standard \
                 library directories): GPU metrics disabled"
            ),
        }
    }

    #[test]
    fn what_a_library_needs_is_found_where_the_loader_looks_with_no_path_of_the_callers() {
        let libm = needed::trusted_location("libm.so.6").expect("libm in the loader's cache");
        assert!(needed::needed_names(&libm).iter().any(|name| name == "libc.so.6"));
        let libc = needed::trusted_location("libc.so.6").unwrap();
        assert!(privileges::trusted_library(&libc).is_ok(), "{}", libc.display());
        // libc is loaded already: found so, not loaded twice.
        load_dependencies(&libm, &mut HashSet::new(), 0).unwrap();
    }
}
