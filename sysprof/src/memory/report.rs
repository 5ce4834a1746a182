//! The memory section of the report: the overhead table (per process and per device, allocated
//! vs reserved vs peak, with what is redundant), memory over the run, page faults,
//! address-space changes, the heap, the data held on both CPU and GPU, and what to change.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use sysprof_common::{AddressSpace, LatencyHistogram, histogram};

use super::{
    heap::{EntriesStepped, HeapProbeCost, ProbedAllocator},
    profiles::{AllocSite, FaultSite},
    redundancy::{CopiedRange, HostEvidence},
    usage::MemorySample,
};
use crate::{
    gpu::nvml::report::GpuMetricsReport,
    gpu::{functions::Pool, state::GpuState},
    latency,
    memory::MemoryDump,
    procs::ProcessTable,
    report::format::{bytes, count, thousands},
    report::recommendation::Recommendation,
};

/// Processes whose memory series go into report.json.
const SERIES: usize = 10;

/// The memory section.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MemoryReport {
    /// Base interval of the memory readings.
    pub interval_ms: u64,
    /// One row per process, then per GPU (and page-locked host memory).
    pub overview: Vec<OverviewRow>,
    /// Most resident memory first.
    pub processes: Vec<ProcessMemory>,
    /// The functions that fault most.
    pub fault_sites: Vec<FaultSite>,
    /// With `--malloc`.
    pub heap: Option<HeapReport>,
    /// Host ranges copied to a GPU, most traffic first.
    pub copied_ranges: Vec<CopiedRange>,
    /// The address-space changes of the processes the map had no room for, together (their
    /// brk calls, not how far their breaks moved).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address_space_rest: Option<AddressSpaceChanges>,
}

/// Where memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Side {
    Cpu,
    /// Page-locked host memory from the CUDA API.
    CpuPinned,
    Gpu,
}

/// One row of the memory overhead table (bytes).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OverviewRow {
    pub side: Side,
    /// `name (pid)`, `GPU 0`, `pinned host`.
    pub what: String,
    /// CPU: heap bytes live at the end (`--malloc`). GPU: traced allocations live at the end.
    pub allocated: Option<u64>,
    /// CPU: resident memory at the end. GPU: memory NVML accounts to the target.
    pub reserved: Option<u64>,
    /// CPU: peak resident memory (VmHWM). GPU: traced allocations at their highest.
    pub peak: Option<u64>,
    /// Bytes held on both sides at the end (host copies of data on a GPU, or the reverse).
    pub on_both_sides: u64,
    /// Bytes copied host-to-device again from ranges already copied.
    pub recopied: u64,
    pub minor_faults: Option<u64>,
    pub major_faults: Option<u64>,
}

/// One process in detail.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessMemory {
    pub pid: u32,
    pub name: String,
    /// The reading with the most resident memory, and the last one.
    pub rss_max: MemorySample,
    pub end: MemorySample,
    pub swap_max: u64,
    pub minor_faults: u64,
    pub major_faults: u64,
    pub faults_per_s: f64,
    pub address_space: Option<AddressSpaceChanges>,
    pub heap: Option<Heap>,
    /// Readings over the run (for the processes with the most memory).
    pub series: Vec<MemorySample>,
}

/// What the address-space syscalls did (bytes from their arguments; failed calls left out).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AddressSpaceChanges {
    pub mmap_calls: u64,
    pub mmap_bytes: u64,
    pub munmap_calls: u64,
    pub munmap_bytes: u64,
    pub brk_calls: u64,
    pub brk_grow_bytes: u64,
    pub brk_shrink_bytes: u64,
    pub mremap_calls: u64,
    pub mremap_grow_bytes: u64,
    pub mremap_shrink_bytes: u64,
}

impl From<AddressSpace> for AddressSpaceChanges {
    fn from(a: AddressSpace) -> Self {
        AddressSpaceChanges {
            mmap_calls: a.mmap_calls,
            mmap_bytes: a.mmap_bytes,
            munmap_calls: a.munmap_calls,
            munmap_bytes: a.munmap_bytes,
            brk_calls: a.brk_calls,
            brk_grow_bytes: a.brk_grow_bytes,
            brk_shrink_bytes: a.brk_shrink_bytes,
            mremap_calls: a.mremap_calls,
            mremap_grow_bytes: a.mremap_grow_bytes,
            mremap_shrink_bytes: a.mremap_shrink_bytes,
        }
    }
}

/// One process's heap (`--malloc`).
#[derive(Clone, Debug, Serialize)]
pub struct Heap {
    pub allocations: u64,
    pub frees: u64,
    pub bytes: u64,
    pub allocations_per_s: f64,
    /// Bytes allocated during the trace and not freed by its end.
    pub live: u64,
    pub peak_live: u64,
    pub size_p50: u64,
    pub size_p99: u64,
    pub size_max: u64,
    /// Frees of blocks sysprof did not see allocated (before the trace, or beyond the table).
    pub untracked_frees: u64,
    /// Allocation sizes in power-of-two bins, smallest first (empty bins left out).
    pub sizes: Vec<SizeBin>,
}

/// Allocations smaller than `below` bytes (and at least half of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SizeBin {
    pub below: u64,
    pub count: u64,
}

/// The kernel's size histogram in power-of-two bins: each of its buckets lies within one.
fn size_bins(sizes: &LatencyHistogram) -> Vec<SizeBin> {
    let mut bins: BTreeMap<u64, u64> = BTreeMap::new();
    for (index, &count) in sizes.buckets.iter().enumerate().filter(|(_, count)| **count > 0) {
        let (low, _) = histogram::bucket_range(index);
        let below = if low == 0 { 1 } else { 1u64 << (64 - low.leading_zeros()).min(63) };
        *bins.entry(below).or_default() += u64::from(count);
    }
    bins.into_iter().map(|(below, count)| SizeBin { below, count }).collect()
}

/// The heap tables (`--malloc`).
#[derive(Clone, Debug, Serialize)]
pub struct HeapReport {
    pub allocators: Vec<ProbedAllocator>,
    /// Most bytes first.
    pub sites: Vec<AllocSite>,
    /// What the allocator probes cost the target.
    pub probe_cost: Option<HeapProbeCostReport>,
}

/// What the allocator probes cost the target's threads: each allocation (probed at its entry
/// and return) and each free (at its entry) at the cost measured for its kind, on this machine
/// (`heap::measure_probe_cost`).
#[derive(Clone, Debug, Serialize)]
pub struct HeapProbeCostReport {
    pub ns_per_allocation: f64,
    pub allocations: u64,
    pub ns_per_free: f64,
    pub frees: u64,
    /// Allocations and frees.
    pub hits: u64,
    /// Time added to the target's threads.
    pub added_s: f64,
    /// Whether the probed malloc, and free, are probed at an instruction the kernel steps out
    /// of line, a second trap (None: not told, or the allocators differ).
    pub malloc_stepped: Option<bool>,
    pub free_stepped: Option<bool>,
}

/// What the memory section is built from.
pub struct Inputs<'a> {
    pub processes: &'a ProcessTable,
    pub dump: &'a MemoryDump,
    pub fault_sites: Vec<FaultSite>,
    /// `--malloc`: the allocators probed, the allocation sites and what their probes cost.
    pub heap: Option<(Vec<ProbedAllocator>, Vec<AllocSite>, Option<HeapProbeCost>)>,
    pub gpu: Option<&'a GpuState>,
    pub gpu_metrics: Option<&'a GpuMetricsReport>,
    pub copied_ranges: Vec<CopiedRange>,
    pub wall_s: f64,
    /// sysprof's own process, never one of the rows.
    pub sysprof_pid: u32,
}

/// Builds the memory section.
pub fn build(inputs: Inputs<'_>) -> MemoryReport {
    let Inputs { processes, dump, fault_sites, heap, gpu, gpu_metrics, copied_ranges, wall_s, sysprof_pid } =
        inputs;
    let wall_s = wall_s.max(1e-9);
    let faults = |pid: u32, major: bool| dump.faults.get(&(pid, major)).copied().unwrap_or(0);
    let me = sysprof_pid;
    let mut rows: Vec<ProcessMemory> = processes
        .iter()
        .filter(|(pid, record)| {
            let traced = !record.memory.is_empty()
                || dump.faults.contains_key(&(*pid, false))
                || dump.faults.contains_key(&(*pid, true))
                || dump.address_space.iter().any(|(p, _)| p == pid)
                || dump.heaps.iter().any(|(p, _)| p == pid);
            *pid != me && traced
        })
        .map(|(pid, record)| {
            let (minor, major) = (faults(pid, false), faults(pid, true));
            let heap = dump.heaps.iter().find(|(p, _)| *p == pid).map(|(_, a)| {
                let sizes = latency::percentiles(&a.sizes);
                Heap {
                    allocations: a.allocs,
                    frees: a.frees,
                    bytes: a.bytes,
                    allocations_per_s: a.allocs as f64 / wall_s,
                    live: a.live,
                    peak_live: a.peak_live,
                    size_p50: sizes.p50_ns,
                    size_p99: sizes.p99_ns,
                    size_max: a.sizes.max_ns,
                    untracked_frees: a.untracked_frees,
                    sizes: size_bins(&a.sizes),
                }
            });
            ProcessMemory {
                pid,
                name: record.name.clone(),
                rss_max: record.memory.max_rss().unwrap_or_default(),
                end: record.memory.last().unwrap_or_default(),
                swap_max: record.memory.samples().iter().map(|s| s.swap).max().unwrap_or(0),
                minor_faults: minor,
                major_faults: major,
                faults_per_s: minor.saturating_add(major) as f64 / wall_s,
                address_space: dump.address_space.iter().find(|(p, _)| *p == pid).map(|(_, a)| (*a).into()),
                heap,
                series: Vec::new(),
            }
        })
        .collect();
    rows.sort_by(|a, b| b.rss_max.rss().cmp(&a.rss_max.rss()).then(a.pid.cmp(&b.pid)));
    for (row, record) in rows.iter_mut().take(SERIES).filter_map(|row| {
        let record = processes.get(row.pid)?;
        Some((row, record))
    }) {
        row.series = record.memory.samples().to_vec();
    }

    let mut overview: Vec<OverviewRow> = rows.iter().map(|p| process_row(p, &copied_ranges)).collect();
    let unattributed = (faults(super::UNATTRIBUTED, false), faults(super::UNATTRIBUTED, true));
    if unattributed != (0, 0) {
        overview.push(OverviewRow {
            side: Side::Cpu,
            what: super::UNATTRIBUTED_NAME.into(),
            allocated: None,
            reserved: None,
            peak: None,
            on_both_sides: 0,
            recopied: 0,
            minor_faults: Some(unattributed.0),
            major_faults: Some(unattributed.1),
        });
    }
    if let Some(gpu) = gpu {
        overview.extend(device_rows(gpu, gpu_metrics, &copied_ranges));
    }
    let heap = heap.map(|(allocators, sites, cost)| {
        let (allocations, frees) = dump.heaps.iter().filter(|(pid, _)| *pid != me).fold(
            (0u64, 0u64),
            |(allocations, frees), (_, a)| {
                (
                    allocations.saturating_add(a.allocs),
                    frees.saturating_add(a.frees).saturating_add(a.untracked_frees),
                )
            },
        );
        let agreed = |of: fn(&EntriesStepped) -> Option<bool>| {
            let mut kinds = allocators.iter().map(|a| of(&a.entry_stepped));
            let first = kinds.next().flatten();
            kinds.all(|kind| kind == first).then_some(first).flatten()
        };
        let probe_cost = cost.map(|cost: HeapProbeCost| {
            // A recording from before frees were measured apart: its one figure for both.
            let ns_per_free = cost.free_ns.unwrap_or(cost.allocation_ns);
            HeapProbeCostReport {
                ns_per_allocation: cost.allocation_ns,
                allocations,
                ns_per_free,
                frees,
                hits: allocations.saturating_add(frees),
                added_s: (cost.allocation_ns * allocations as f64 + ns_per_free * frees as f64) / 1e9,
                malloc_stepped: agreed(|e| e.malloc),
                free_stepped: agreed(|e| e.free),
            }
        });
        HeapReport { allocators, sites, probe_cost }
    });
    MemoryReport {
        interval_ms: processes.memory_interval().map_or(0, |i| i.as_millis() as u64),
        overview,
        processes: rows,
        fault_sites,
        heap,
        copied_ranges,
        address_space_rest: dump
            .address_space
            .iter()
            .find(|(pid, _)| *pid == super::UNATTRIBUTED)
            .map(|(_, a)| (*a).into()),
    }
}

fn process_row(process: &ProcessMemory, ranges: &[CopiedRange]) -> OverviewRow {
    let mine = ranges.iter().filter(|r| r.pid == process.pid);
    OverviewRow {
        side: Side::Cpu,
        what: format!("{} ({})", process.name, process.pid),
        allocated: process.heap.as_ref().map(|h| h.live),
        reserved: Some(process.end.rss()),
        peak: Some(process.rss_max.rss_peak.max(process.rss_max.rss())),
        on_both_sides: mine.clone().filter(|r| r.on_both_sides).map(|r| r.bytes).sum(),
        recopied: mine.map(|r| r.recopied).sum(),
        minor_faults: Some(process.minor_faults),
        major_faults: Some(process.major_faults),
    }
}

/// A row per GPU (NVML's view where there is one, else the traced allocations) and one for
/// page-locked host memory.
fn device_rows(
    gpu: &GpuState,
    metrics: Option<&GpuMetricsReport>,
    ranges: &[CopiedRange],
) -> Vec<OverviewRow> {
    let on_device = |device: i32| -> u64 {
        ranges.iter().filter(|r| r.on_both_sides && r.device == Some(device)).map(|r| r.bytes).sum()
    };
    let mut rows = Vec::new();
    let gpu_row = |device: i32, allocated, reserved, peak| OverviewRow {
        side: Side::Gpu,
        what: format!("GPU {device}"),
        allocated,
        reserved,
        peak,
        on_both_sides: on_device(device),
        recopied: 0,
        minor_faults: None,
        major_faults: None,
    };
    match metrics.filter(|m| !m.memory.is_empty()) {
        Some(metrics) => {
            for memory in &metrics.memory {
                let reserved = Some(memory.target_processes_max).filter(|b| *b > 0).or(memory.reserved_max);
                rows.push(gpu_row(memory.device as i32, memory.allocated, reserved, memory.allocated_peak));
            }
        }
        None => {
            let mut devices: Vec<i32> = gpu
                .pools
                .keys()
                .filter(|(pool, _)| matches!(pool, Pool::Device | Pool::Managed))
                .map(|(_, device)| *device)
                .collect();
            devices.dedup();
            for device in devices {
                let (current, peak) = gpu
                    .pools
                    .iter()
                    .filter(|((pool, d), _)| *d == device && matches!(pool, Pool::Device | Pool::Managed))
                    .fold((0, 0), |(c, p), (_, stats)| (c + stats.current, p + stats.peak));
                rows.push(gpu_row(device, Some(current), None, Some(peak)));
            }
        }
    }
    if let Some(pinned) = gpu.pools.get(&(Pool::PinnedHost, -1)) {
        rows.push(OverviewRow {
            side: Side::CpuPinned,
            what: "pinned host memory".into(),
            allocated: Some(pinned.current),
            reserved: None,
            peak: Some(pinned.peak),
            on_both_sides: ranges
                .iter()
                .filter(|r| r.on_both_sides && r.host_evidence == HostEvidence::PinnedAllocation)
                .map(|r| r.bytes)
                .sum(),
            recopied: 0,
            minor_faults: None,
            major_faults: None,
        });
    }
    rows
}

/// What the memory figures cannot show, one line each.
/// `untracked_allocations`: blocks allocated while the live-block table was full.
pub fn limitations(
    memory: &MemoryReport,
    processes: &ProcessTable,
    untracked_allocations: u64,
) -> Vec<String> {
    let mut lines = Vec::new();
    if memory.heap.is_some() {
        if untracked_allocations > 0 {
            lines.push(format!(
                "--malloc: {} while {} blocks were live and tracked: they count in the allocations, bytes \
                 and call sites, not in the live bytes nor the in-use profile",
                count(untracked_allocations, "allocation came", "allocations came"),
                thousands(u64::from(sysprof_common::capacity::LIVE_ALLOCS))
            ));
        }
        let untracked: u64 =
            memory.processes.iter().filter_map(|p| p.heap.as_ref()).map(|h| h.untracked_frees).sum();
        if untracked > 0 {
            lines.push(format!(
                "--malloc: {} of blocks allocated before the trace (or beyond the {} blocks tracked at \
                 once): live bytes count only blocks allocated while traced",
                count(untracked, "free was", "frees were"),
                thousands(u64::from(sysprof_common::capacity::LIVE_ALLOCS))
            ));
        }
        // Forked during the trace (a launched command is probed before it starts).
        if processes.iter().any(|(_, record)| record.parent.is_some()) {
            lines.push(
                "--malloc: a process that starts during the trace gets its allocator probes when sysprof \
                 sees it (tens of milliseconds): allocations before that are not counted"
                    .into(),
            );
        }
    }
    lines
}

/// A pinned host-to-device copy's bandwidth on a PCIe 4.0 x16 link.
const PINNED_H2D_GB_S: f64 = crate::gpu::report::PINNED_H2D_GB_S;
/// What prefaulting and reusing memory win back of the fault handling.
const FAULT_WIN: f64 = 0.5;
/// The measured fault time counts from 1 s / this (5 samples at 99 Hz): fewer say little.
const FAULT_SAMPLE_HZ_FLOOR: f64 = 20.0;
/// What one minor fault costs, roughly (trap, page allocation and zeroing, return).
const MINOR_FAULT_S: f64 = 1e-6;
/// And a major one (a read from disk, on a fast one).
const MAJOR_FAULT_S: f64 = 100e-6;
/// Fault rates past which faults are worth attention.
const FAULT_STORM_PER_S: f64 = 20_000.0;
const MAJOR_STORM_PER_S: f64 = 50.0;
/// Fewer faults than these are no storm whatever the rate (a short program's start-up).
const STORM_FAULTS: u64 = 2_000;
const STORM_MAJOR_FAULTS: u64 = 20;
/// Allocation rate past which pooling pays, and a typical allocator call's cost.
const CHURN_PER_S: f64 = 200_000.0;
const ALLOCATION_S: f64 = 60e-9;
/// Data kept on both sides that is worth freeing.
const BOTH_SIDES_WORTH_FREEING: u64 = 64 << 20;

/// Bytes copied to a GPU and still allocated on the host, when worth freeing: memory, not time,
/// so the memory section says it and the ranked recommendations (seconds) do not.
pub fn worth_freeing(memory: &MemoryReport) -> Option<u64> {
    let both: u64 = memory.copied_ranges.iter().filter(|r| r.on_both_sides).map(|r| r.bytes).sum();
    (both >= BOTH_SIDES_WORTH_FREEING).then_some(both)
}

/// Recommendations from the memory figures. `h2d_gb_s` is the achieved host-to-device bandwidth,
/// when known, to put a time on copies that need not happen; `fault_time` the seconds each
/// process spent handling page faults, as the CPU samples measured them.
pub fn recommendations(
    memory: &MemoryReport,
    h2d_gb_s: Option<f64>,
    fault_time: &HashMap<u32, f64>,
    wall_s: f64,
) -> Vec<Recommendation> {
    let wall_s = wall_s.max(1e-9);
    let mut out = Vec::new();
    let recopied: Vec<&CopiedRange> = memory.copied_ranges.iter().filter(|r| r.copies >= 3).collect();
    if let Some(top) = recopied.iter().max_by_key(|r| r.recopied) {
        // Without a measured bandwidth, assume PCIe 4.0 x16's practical 25 GB/s. Copies from
        // pageable memory are weighed at that pinned bandwidth whatever they achieved: pinning
        // them is a recommendation of its own, which counts the rest of their time, and the two
        // wins must not add up to more than the copies took.
        let again: u64 = recopied.iter().map(|r| r.recopied).sum();
        let pinned = recopied.iter().all(|r| matches!(r.host_evidence, HostEvidence::PinnedAllocation));
        let gb_s = match pinned {
            true => h2d_gb_s.unwrap_or(PINNED_H2D_GB_S),
            false => h2d_gb_s.unwrap_or(0.0).max(PINNED_H2D_GB_S),
        };
        let seconds = again as f64 / (gb_s * 1e9);
        out.push(Recommendation::new(
            seconds,
            "Keep data that is copied to the GPU again and again on the GPU",
            format!(
                "{} copied host-to-device 3 times or more ({} moved again, ~{seconds:.2} s of copying); the \
                 largest, {} from {}, {} times. If they hold the same data each time (constant inputs, \
                 weights), the copies after the first are waste; a staging buffer refilled with new data is not",
                match recopied.len() {
                    1 => "1 host range was".to_string(),
                    n => format!("{} host ranges were each", thousands(n as u64)),
                },
                bytes(again),
                bytes(top.bytes),
                top.call_site,
                top.copies
            ),
            "Copy it once and reuse the device copy: cache constant inputs and weights on the device, move \
             the copy out of the loop",
        ));
    }
    for process in &memory.processes {
        let major_per_s = process.major_faults as f64 / wall_s;
        let minor_storm = process.faults_per_s >= FAULT_STORM_PER_S
            && process.minor_faults.saturating_add(process.major_faults) >= STORM_FAULTS;
        let major_storm = major_per_s >= MAJOR_STORM_PER_S && process.major_faults >= STORM_MAJOR_FAULTS;
        if !minor_storm && !major_storm {
            continue;
        }
        // A major fault waits for the disk (off CPU), a minor one runs the kernel's fault path:
        // measured in the CPU samples when there are enough of them, else the usual cost of one.
        let major_s = process.major_faults as f64 * MAJOR_FAULT_S;
        let (handling_s, how) = match fault_time.get(&process.pid) {
            Some(&measured) if measured * FAULT_SAMPLE_HZ_FLOOR >= 1.0 => {
                (measured, "measured in the CPU samples")
            }
            _ => (process.minor_faults as f64 * MINOR_FAULT_S, "at about 1 us each"),
        };
        // Prefaulting, reuse and huge pages remove the traps and the per-page work, not the
        // zeroing of new memory: about half.
        let seconds = FAULT_WIN * handling_s + major_s;
        let (title, action) = if major_storm {
            (
                format!("Major page faults in {}: it waits for the disk", process.name),
                "Keep the working set in memory: more RAM or a smaller footprint, mlock hot data, \
                 read files ahead (madvise WILLNEED, larger readahead); swap use makes it worse",
            )
        } else {
            (
                format!("Page-fault storm in {}", process.name),
                "Prefault and reuse memory: MAP_POPULATE or touching buffers once at start, a pool \
                 instead of mmap/munmap churn, transparent huge pages (madvise MADV_HUGEPAGE) for large \
                 buffers",
            )
        };
        out.push(Recommendation {
            seconds,
            impact: 0.0,
            title,
            evidence: format!(
                "{:.0} page faults/s ({} minor, {} major), {handling_s:.2} s of fault handling ({how}){}; \
                 about half of that comes back",
                process.faults_per_s,
                thousands(process.minor_faults),
                thousands(process.major_faults),
                match process.major_faults {
                    0 => String::new(),
                    _ => format!(", and about {major_s:.2} s waiting for the disk"),
                }
            ),
            action: action.into(),
        });
    }
    for (process, heap) in memory.processes.iter().filter_map(|p| Some((p, p.heap.as_ref()?))) {
        if heap.allocations_per_s < CHURN_PER_S {
            continue;
        }
        out.push(Recommendation {
            seconds: heap.allocations as f64 * ALLOCATION_S,
            impact: 0.0,
            title: format!("Allocation churn in {}", process.name),
            evidence: format!("{:.0} allocations/s, median {}", heap.allocations_per_s, bytes(heap.size_p50)),
            action: "Reuse buffers (object pools, arenas, reserve() on vectors) in the allocation sites \
                     listed under Heap"
                .into(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_fall_in_power_of_two_bins() {
        let mut sizes = crate::latency::empty();
        for (size, count) in [(1000u64, 3u32), (5000, 2), (5000, 1), (24, 4), (0, 1)] {
            sizes.buckets[histogram::bucket_of(size)] += count;
        }
        let bins: Vec<(u64, u64)> = size_bins(&sizes).iter().map(|b| (b.below, b.count)).collect();
        assert_eq!(bins, vec![(1, 1), (32, 4), (1024, 3), (8192, 3)]);
    }
}
