//! The GPU family's section of the report: CPU-GPU transfers, NCCL collectives, the host side
//! of compute (launches, syncs), device memory and the probes' own cost, from the CUDA and
//! NCCL calls the uprobes saw.

use std::fmt::Write as _;

use super::{
    functions,
    report::{self, GpuReport},
};
use sysprof_common::{CallKey, CallStats};

use crate::{
    callsites,
    family::{Analysis, Family},
    latency::format_ns,
    output::markdown::{escape, table},
    procs::ImageOf,
    profile::{self, StackProfile, StackSample},
    report::{
        Section,
        format::{bytes, thousands},
    },
};

/// The GPU family: uprobes on CUDA and NCCL, attached while the trace runs (see `gpu::GpuTracer`).
pub(crate) struct GpuFamily;

impl Family for GpuFamily {
    fn name(&self) -> &'static str {
        "gpu"
    }

    fn analyze(&mut self, cx: &mut Analysis<'_>) -> anyhow::Result<Option<Box<dyn Section>>> {
        let (Some(outcome), Some(state)) = (cx.outcome.gpu.as_ref(), cx.gpu_state) else {
            return Ok(None);
        };
        let calls: Vec<_> =
            cx.calls.iter().filter(|(key, _)| functions::by_id(key.func).is_some()).copied().collect();
        let wall_s = cx.wall_s();
        let gpu =
            report::build(outcome.libraries.clone(), state, &calls, cx.names, wall_s, cx.run.probe_cost_ns);
        cx.recommendations.extend(report::recommendations(&gpu));
        let by_stack = call_profile(&calls, cx);
        if by_stack.total() > 0 {
            cx.add_profile(CALL_PROFILE, "time in CUDA and NCCL calls (nanoseconds)", by_stack);
        }
        Ok(Some(Box::new(gpu)))
    }
}

/// The files of the calls' time by calling stack (gpucalls.folded, .svg, .pb.gz).
pub const CALL_PROFILE: &str = "gpucalls";

/// Time in the probed CUDA and NCCL calls by the stack they were called from, outermost
/// first: the probed function is the leaf, its callers above it, so a flamegraph shows which
/// code of the program waits on which call (failed calls included).
fn call_profile(calls: &[(CallKey, CallStats)], cx: &Analysis<'_>) -> StackProfile {
    let samples: Vec<StackSample> = calls
        .iter()
        .map(|(key, stats)| StackSample {
            weight: stats.latency.total_ns,
            ..callsites::sample(key.tgid, ImageOf::Generation(key.exec_id), key.user_stack_id)
        })
        .collect();
    profile::build(&samples, cx.names.stacks(), cx.processes, "ns", |_, _| None)
}

impl Section for GpuReport {
    fn json(&self) -> Vec<(&'static str, &dyn erased_serde::Serialize)> {
        vec![("gpu", self)]
    }

    fn markdown(&self, out: &mut String) {
        markdown(out, self);
    }
}

fn markdown(out: &mut String, gpu: &GpuReport) {
    if gpu.libraries.is_empty() {
        return;
    }
    let _ = writeln!(out, "### Interconnect: CPU-GPU transfers\n");
    let probed: Vec<String> = gpu
        .libraries
        .iter()
        .map(|l| {
            format!(
                "{} ({})",
                l.path.display(),
                crate::report::format::count(l.functions as u64, "function", "functions")
            )
        })
        .collect();
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
            format!(
                "{:.3} s in {}",
                compute.sync_blocked_s,
                crate::report::format::count(compute.sync_calls, "call", "calls")
            ),
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
