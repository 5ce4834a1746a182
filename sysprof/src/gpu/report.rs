//! The GPU sections of the report, from the call events (transfers, allocations, NCCL) and the
//! kernel-side call statistics (launches, synchronizations, every function's count and
//! latency): interconnect, NCCL, GPU compute as the host sees it, GPU memory.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use sysprof_common::{CallKey, CallStats};

use super::{
    ProbedLibrary,
    functions::{self, Kind, Library, NcclOp, Pool},
    state::GpuState,
};
use crate::{
    callsites::Names,
    latency::{self, Percentiles},
    procs::ImageOf,
    report::{
        format::{bytes, thousands},
        recommendation::Recommendation,
    },
};

/// The GPU sections.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GpuReport {
    pub libraries: Vec<ProbedLibrary>,
    /// Transfer kinds (H2D, D2H, D2D, P2P, H2H, memset), most bytes first.
    pub interconnect: Vec<TransferRow>,
    pub nccl: Vec<NcclRow>,
    pub compute: ComputeReport,
    pub memory: Vec<PoolRow>,
    pub leaks: Vec<LeakRow>,
    /// Every probed function: calls, errors, latency.
    pub functions: Vec<FunctionRow>,
    pub probe_cost: Option<ProbeCost>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TransferRow {
    pub kind: String,
    pub calls: u64,
    pub errors: u64,
    pub calls_per_s: f64,
    pub size_p50: u64,
    pub size_p99: u64,
    pub size_max: u64,
    pub total_bytes: u64,
    pub latency_p50_ns: u64,
    pub latency_p99_ns: u64,
    /// Bytes over time of the successful synchronous calls (asynchronous ones return before
    /// the copy is done).
    pub bandwidth_gb_s: Option<f64>,
    pub pinned: u64,
    pub pageable: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct NcclRow {
    pub op: NcclOp,
    pub calls: u64,
    pub errors: u64,
    pub total_bytes: u64,
    pub size_p50: u64,
    pub size_p99: u64,
    pub size_max: u64,
    /// Host-side time of the call: NCCL enqueues the collective and returns.
    pub enqueue_p50_ns: u64,
    pub enqueue_p99_ns: u64,
    /// The median time from a call to the return of the thread's next synchronize, over the
    /// calls that had one: a collective's time as the host waits for it.
    pub completed_p50_s: Option<f64>,
    /// From the call to the return of the thread's next synchronize, when there was one.
    pub algbw_gb_s: Option<f64>,
    pub busbw_gb_s: Option<f64>,
    pub datatypes: BTreeMap<&'static str, u64>,
}

/// GPU compute as the host sees it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ComputeReport {
    pub launches: u64,
    pub launches_per_s: f64,
    /// CPU time of a launch call: the launch overhead.
    pub launch_latency: Option<Percentiles>,
    pub graph_launches: u64,
    /// Most launched kernels (host stub symbols).
    pub top_kernels: Vec<KernelRow>,
    pub sync_calls: u64,
    pub sync_blocked_s: f64,
    /// Where threads blocked in synchronization, longest first.
    pub sync_sites: Vec<SiteRow>,
    /// Host-observed communication time (NCCL calls, synchronous copies) over time blocked
    /// waiting for the GPU (synchronizations).
    pub comm_to_compute: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct KernelRow {
    pub kernel: String,
    pub launches: u64,
    pub launch_p50_ns: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SiteRow {
    pub function: String,
    pub call_site: String,
    pub calls: u64,
    pub total_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct PoolRow {
    pub pool: Pool,
    /// -1 for host memory.
    pub device: i32,
    pub current_bytes: u64,
    pub peak_bytes: u64,
    pub allocations: u64,
    pub frees: u64,
    pub failed: u64,
    pub size_p50: u64,
    pub size_p99: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct LeakRow {
    pub pool: Pool,
    pub device: i32,
    pub allocations: u64,
    pub bytes: u64,
    pub call_site: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct FunctionRow {
    pub function: String,
    pub library: Library,
    pub calls: u64,
    pub errors: u64,
    /// Return code -> calls, for the functions whose calls are events (not launches).
    pub return_codes: BTreeMap<i32, u64>,
    pub latency: Percentiles,
}

/// What a probe hit costs the target, measured on this machine.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ProbeCost {
    pub ns_per_call: f64,
    pub hits: u64,
    /// hits x cost: time added to the target's threads.
    pub added_s: f64,
}

/// Builds the GPU report. `calls` are the kernel-side statistics of the GPU functions.
pub fn build(
    libraries: Vec<ProbedLibrary>,
    state: &GpuState,
    calls: &[(CallKey, CallStats)],
    names: &dyn Names,
    wall_s: f64,
    probe_cost_ns: Option<f64>,
) -> GpuReport {
    let wall_s = wall_s.max(1e-9);
    let mut interconnect: Vec<TransferRow> = state
        .transfers
        .iter()
        .map(|(kind, t)| TransferRow {
            kind: kind.clone(),
            calls: t.calls,
            errors: t.errors,
            calls_per_s: t.calls as f64 / wall_s,
            size_p50: t.sizes.value_at_quantile(0.5),
            size_p99: t.sizes.value_at_quantile(0.99),
            size_max: t.sizes.max(),
            total_bytes: t.bytes,
            latency_p50_ns: t.latency.value_at_quantile(0.5),
            latency_p99_ns: t.latency.value_at_quantile(0.99),
            bandwidth_gb_s: (t.sync_ns > 0).then(|| t.sync_bytes as f64 / t.sync_ns as f64),
            pinned: t.pinned,
            pageable: t.pageable,
        })
        .collect();
    interconnect.sort_by(|a, b| b.total_bytes.cmp(&a.total_bytes).then_with(|| a.kind.cmp(&b.kind)));

    let nccl = state
        .nccl
        .iter()
        .map(|(op, n)| {
            let bytes: u64 = n.completed.iter().map(|(b, _, _)| b).sum();
            let seconds: f64 = n.completed.iter().map(|(_, s, _)| s).sum();
            let algbw = (seconds > 0.0).then(|| bytes as f64 / seconds / 1e9);
            let ranks = n.completed.iter().map(|(_, _, r)| *r).max().unwrap_or(1);
            let mut times: Vec<f64> = n.completed.iter().map(|(_, s, _)| *s).collect();
            times.sort_by(f64::total_cmp);
            NcclRow {
                completed_p50_s: times.get(times.len() / 2).copied(),
                op: *op,
                calls: n.calls,
                errors: n.errors,
                total_bytes: n.bytes,
                size_p50: n.sizes.value_at_quantile(0.5),
                size_p99: n.sizes.value_at_quantile(0.99),
                size_max: n.sizes.max(),
                enqueue_p50_ns: n.latency.value_at_quantile(0.5),
                enqueue_p99_ns: n.latency.value_at_quantile(0.99),
                algbw_gb_s: algbw,
                busbw_gb_s: algbw.map(|a| a * op.bus_factor(ranks)),
                datatypes: n.datatypes.clone(),
            }
        })
        .collect();

    let memory = state
        .pools
        .iter()
        .map(|((pool, device), p)| PoolRow {
            pool: *pool,
            device: *device,
            current_bytes: p.current,
            peak_bytes: p.peak,
            allocations: p.allocations,
            frees: p.frees,
            failed: p.failed,
            size_p50: if p.allocations > 0 { p.sizes.value_at_quantile(0.5) } else { 0 },
            size_p99: if p.allocations > 0 { p.sizes.value_at_quantile(0.99) } else { 0 },
        })
        .collect();

    let mut leaks: HashMap<(Pool, i32, String), (u64, u64)> = HashMap::new();
    for ((tgid, _), allocation) in state.live() {
        let image = ImageOf::At(allocation.at_ns);
        let site = names.call_site(*tgid, image, allocation.user_stack_id, allocation.caller);
        let entry = leaks.entry((allocation.pool, allocation.device, site)).or_default();
        entry.0 += 1;
        entry.1 += allocation.size;
    }
    let mut leaks: Vec<LeakRow> = leaks
        .into_iter()
        .map(|((pool, device, call_site), (allocations, bytes))| LeakRow {
            pool,
            device,
            allocations,
            bytes,
            call_site,
        })
        .collect();
    leaks.sort_by_key(|leak| std::cmp::Reverse(leak.bytes));

    GpuReport {
        libraries,
        interconnect,
        nccl,
        compute: compute(calls, names, wall_s),
        memory,
        leaks,
        functions: function_rows(calls, state),
        probe_cost: probe_cost_ns.map(|ns| {
            let hits: u64 = calls.iter().map(|(_, s)| s.latency.count).sum();
            ProbeCost { ns_per_call: ns, hits, added_s: hits as f64 * ns / 1e9 }
        }),
    }
}

fn compute(calls: &[(CallKey, CallStats)], names: &dyn Names, wall_s: f64) -> ComputeReport {
    let kind = |key: &CallKey| functions::by_id(key.func).map(|f| f.kind);
    let image = |key: &CallKey| ImageOf::Generation(key.exec_id);
    let mut launch_latency = latency::empty();
    let mut kernels: HashMap<(u32, u32, u64), (u64, sysprof_common::LatencyHistogram)> = HashMap::new();
    let mut report = ComputeReport::default();
    let mut sites: HashMap<(String, String), (u64, u64)> = HashMap::new();
    let mut sync_ns = 0u64;
    let mut comm_ns = 0u64;
    for (key, stats) in calls {
        match kind(key) {
            Some(Kind::Launch) => {
                report.launches += stats.latency.count;
                latency::merge(&mut launch_latency, &stats.latency);
                let entry = kernels
                    .entry((key.tgid, key.exec_id, key.detail))
                    .or_insert_with(|| (0, latency::empty()));
                entry.0 += stats.latency.count;
                latency::merge(&mut entry.1, &stats.latency);
            }
            Some(Kind::GraphLaunch) => report.graph_launches += stats.latency.count,
            Some(Kind::Sync) => {
                report.sync_calls += stats.latency.count;
                sync_ns += stats.latency.total_ns;
                let function = functions::by_id(key.func).map_or("?", |f| f.name).to_string();
                let entry = sites
                    .entry((function, names.call_site(key.tgid, image(key), key.user_stack_id, key.caller)))
                    .or_default();
                entry.0 += stats.latency.count;
                entry.1 += stats.latency.total_ns;
            }
            Some(Kind::Collective { .. }) => comm_ns += stats.latency.total_ns,
            Some(Kind::Copy { asynchronous: false, .. }) => comm_ns += stats.latency.total_ns,
            _ => {}
        }
    }
    report.launches_per_s = report.launches as f64 / wall_s;
    report.launch_latency = (report.launches > 0).then(|| latency::percentiles(&launch_latency));
    let mut top: Vec<KernelRow> = kernels
        .into_iter()
        .map(|((tgid, exec_id, address), (launches, hist))| KernelRow {
            kernel: match address {
                0 => "(unknown kernel)".into(),
                _ => names.symbol(tgid, ImageOf::Generation(exec_id), address),
            },
            launches,
            launch_p50_ns: latency::percentiles(&hist).p50_ns,
        })
        .collect();
    top.sort_by(|a, b| b.launches.cmp(&a.launches).then_with(|| a.kernel.cmp(&b.kernel)));
    top.truncate(10);
    report.top_kernels = top;
    report.sync_blocked_s = sync_ns as f64 / 1e9;
    let mut sites: Vec<SiteRow> = sites
        .into_iter()
        .map(|((function, call_site), (calls, ns))| SiteRow {
            function,
            call_site,
            calls,
            total_s: ns as f64 / 1e9,
        })
        .collect();
    sites.sort_by(|a, b| b.total_s.total_cmp(&a.total_s));
    sites.truncate(10);
    report.sync_sites = sites;
    report.comm_to_compute = (sync_ns > 0).then(|| comm_ns as f64 / sync_ns as f64);
    report
}

fn function_rows(calls: &[(CallKey, CallStats)], state: &GpuState) -> Vec<FunctionRow> {
    let mut by_function: BTreeMap<u32, (u64, sysprof_common::LatencyHistogram)> = BTreeMap::new();
    for (key, stats) in calls {
        let entry = by_function.entry(key.func).or_insert_with(|| (0, latency::empty()));
        entry.0 += stats.errors;
        latency::merge(&mut entry.1, &stats.latency);
    }
    let mut rows: Vec<FunctionRow> = by_function
        .into_iter()
        .filter_map(|(id, (errors, hist))| {
            let function = functions::by_id(id)?;
            Some(FunctionRow {
                function: function.name.to_string(),
                library: function.library,
                calls: hist.count,
                errors,
                return_codes: state.return_codes.get(&id).cloned().unwrap_or_default(),
                latency: latency::percentiles(&hist),
            })
        })
        .collect();
    rows.sort_by(|a, b| {
        b.latency.total_ns.cmp(&a.latency.total_ns).then_with(|| a.function.cmp(&b.function))
    });
    rows
}

/// Copies below this size are small: each costs a call's fixed overhead.
const SMALL_COPY: u64 = 64 * 1024;
/// NCCL messages below this are too small to reach the links' bandwidth.
const SMALL_NCCL: u64 = 1 << 20;

/// Recommendations from the GPU figures.
/// A pinned host-to-device copy's bandwidth on a PCIe 4.0 x16 link, what a pageable copy is
/// weighed against.
pub(crate) const PINNED_H2D_GB_S: f64 = 25.0;

pub fn recommendations(gpu: &GpuReport) -> Vec<Recommendation> {
    let mut out = Vec::new();
    if let Some(h2d) = gpu.interconnect.iter().find(|t| t.kind == "H2D")
        && h2d.pageable > 0
        && h2d.pageable * 2 >= h2d.pinned
    {
        let time_s = h2d.latency_p50_ns as f64 * h2d.calls as f64 / 1e9;
        // What the pageable share of the copies took, against what it would at a pinned copy's
        // bandwidth.
        let pageable = h2d.pageable as f64 / h2d.calls.max(1) as f64;
        let pinned_s = h2d.total_bytes as f64 * pageable / (PINNED_H2D_GB_S * 1e9);
        let seconds = (time_s * pageable - pinned_s).max(0.0);
        out.push(Recommendation {
            seconds,
            impact: 0.0,
            title: "Pin the host memory of host-to-device copies".into(),
            evidence: format!(
                "{} of {} H2D copies come from pageable memory ({} in all{}); at {PINNED_H2D_GB_S:.0} GB/s \
                 pinned they would take {pinned_s:.2} s of their {:.2} s",
                thousands(h2d.pageable),
                thousands(h2d.calls),
                bytes(h2d.total_bytes),
                h2d.bandwidth_gb_s.map(|b| format!(", {b:.2} GB/s achieved")).unwrap_or_default(),
                time_s * pageable
            ),
            action:
                "Allocate staging buffers with cudaMallocHost/cudaHostAlloc (PyTorch: pin_memory=True in \
                     the DataLoader, tensor.pin_memory()): pageable copies go through a bounce buffer at a \
                     fraction of the link's speed and cannot overlap compute"
                    .into(),
        });
    }
    for row in
        gpu.interconnect.iter().filter(|t| t.calls >= 1000 && t.size_p50 < SMALL_COPY && t.kind != "memset")
    {
        let time_s = row.latency_p50_ns as f64 * row.calls as f64 / 1e9;
        out.push(Recommendation {
            seconds: time_s * 0.5,
            impact: 0.0,
            title: format!("Batch small {} copies", row.kind),
            evidence: format!(
                "{} copies ({:.0}/s), median {} each",
                thousands(row.calls),
                row.calls_per_s,
                bytes(row.size_p50)
            ),
            action: "Copy fewer, larger buffers (pack tensors into one, move data once per step), or keep \
                     the data on the device"
                .into(),
        });
    }
    let compute = &gpu.compute;
    if compute.launches >= 100 && compute.sync_calls * 2 >= compute.launches {
        out.push(Recommendation {
            // Half the blocked time: the host keeps launching while the GPU works.
            seconds: compute.sync_blocked_s * 0.5,
            impact: 0.0,
            title: "Stop synchronizing after every launch".into(),
            evidence: format!(
                "{} synchronizations for {} launches, {:.2} s blocked",
                thousands(compute.sync_calls),
                thousands(compute.launches),
                compute.sync_blocked_s
            ),
            action: "Synchronize once per step, not per kernel: drop cudaDeviceSynchronize/.item()/.cpu() \
                     calls from the inner loop, use events or streams to order work"
                .into(),
        });
    }
    for row in gpu.nccl.iter().filter(|n| n.calls >= 100 && n.size_p50 < SMALL_NCCL) {
        // Small collectives are latency-bound: each costs about the same however few bytes it
        // carries. Fused into buckets of SMALL_NCCL, the calls (and their latencies) shrink by
        // the ratio of the sizes; what is left of their time is what comes back. Their time is
        // the median wait for one as the host saw it, else the host-side call alone.
        let (each_s, measured) = match row.completed_p50_s {
            Some(each) => (each, "the median wait for one to complete"),
            None => (row.enqueue_p50_ns as f64 / 1e9, "the median host-side call (none was waited for)"),
        };
        let time_s = each_s * row.calls as f64;
        let fused = (row.size_p50.max(1) as f64 / SMALL_NCCL as f64).min(1.0);
        let seconds = time_s * (1.0 - fused);
        out.push(Recommendation {
            seconds,
            impact: 0.0,
            title: format!("Fuse small NCCL {:?} messages", row.op),
            evidence: format!(
                "{} calls, median message {}, {:.2} s at {} each ({measured}); in buckets of {} the \
                 calls would be {:.0}x fewer",
                thousands(row.calls),
                bytes(row.size_p50),
                time_s,
                crate::latency::format_ns((each_s * 1e9) as u64),
                bytes(SMALL_NCCL),
                1.0 / fused
            ),
            action:
                "Bucket gradients into larger all-reduces (DDP bucket_cap_mb, FSDP/ZeRO bucket sizes), or \
                     group calls with ncclGroupStart/End: small messages are latency-bound"
                    .into(),
        });
    }
    out
}
