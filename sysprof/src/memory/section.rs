//! The memory family's section of the report: the overhead table (allocated vs reserved vs
//! peak, with what is held on both CPU and GPU), memory over the run, page faults,
//! address-space changes, the heap, and the host ranges copied to a GPU; the page-fault and
//! heap profiles' files.

use std::{collections::HashMap, fmt::Write as _};

use super::{
    MemoryDump,
    heap::HeapProbeCost,
    profiles::{self, fault_sites},
    redundancy::{self, LiveBlocks},
    report::{self as memory_report, HeapProbeCostReport, Inputs, MemoryReport, Side},
};
use crate::{
    family::Analysis,
    gpu::{nvml::report::GpuMetricsReport, report::GpuReport},
    output::markdown::{escape, table},
    report::{
        Section,
        format::{bytes, percent, thousands},
    },
};

/// The section, its limitations and recommendations, and the profiles' files. Runs after the
/// GPU families: it reads their transfers and device memory.
pub(crate) fn analyze(dump: &mut MemoryDump, cx: &mut Analysis<'_>) -> MemoryReport {
    // Nothing else reads the fault stacks: the profile takes them.
    let (stacks, traces) = (std::mem::take(&mut dump.fault_stacks), std::mem::take(&mut dump.fault_traces));
    let faults = profiles::fault_profile(stacks, traces, cx.processes, cx.symbolizer);
    let dump = &*dump;
    let (alloc, alloc_sites) = match dump.heaps.is_empty() {
        true => (None, Vec::new()),
        false => {
            let heap = profiles::heap_profile(dump, cx.processes, cx.symbolizer, cx.run.sysprof_pid);
            (Some((heap.allocated, heap.live)), heap.sites)
        }
    };
    let heap = cx.outcome.heap.as_ref();
    let live = heap.map(|_| LiveBlocks::new(&dump.live));
    let copied_ranges = cx
        .gpu_state
        .map(|state| redundancy::copied_ranges(state, live.as_ref(), cx.names))
        .unwrap_or_default();
    let wall_s = cx.wall_s();
    let report = memory_report::build(Inputs {
        processes: cx.processes,
        dump,
        fault_sites: fault_sites(&faults),
        heap: heap.map(|heap| {
            let cost = cx.run.heap_probe_cost_ns.map(|allocation_ns| HeapProbeCost {
                allocation_ns,
                free_ns: cx.run.heap_free_probe_cost_ns,
            });
            (heap.allocators.clone(), alloc_sites, cost)
        }),
        gpu: cx.gpu_state,
        gpu_metrics: cx.sections.get::<GpuMetricsReport>(),
        copied_ranges,
        wall_s,
        sysprof_pid: cx.run.sysprof_pid,
    });
    let untracked = cx.counters.get(sysprof_common::Counter::AllocsUntracked);
    cx.limitations.extend(memory_report::limitations(&report, cx.processes, untracked));
    let h2d_gb_s = cx
        .sections
        .get::<GpuReport>()
        .and_then(|gpu| gpu.interconnect.iter().find(|t| t.kind == "H2D"))
        .and_then(|t| t.bandwidth_gb_s);
    let fault_time = fault_handling_time(cx);
    cx.recommendations.extend(memory_report::recommendations(&report, h2d_gb_s, &fault_time, wall_s));
    cx.add_profile("faults", "page faults", faults);
    if let Some((allocated, live)) = alloc {
        cx.add_profile("alloc", "heap allocations (bytes)", allocated);
        cx.add_profile("inuse", "heap bytes live at the end (bytes)", live);
    }
    report
}

/// The seconds of the target's time each process spent handling its page faults, measured:
/// the on-CPU samples in the kernel's fault entry, at a cpu-clock sample's period, over the
/// target's parallelism (a second of CPU among several running threads is less than a second of
/// elapsed time). Empty when the samples are not of time (another `--event`) or the CPU
/// family did not run.
fn fault_handling_time(cx: &Analysis<'_>) -> HashMap<u32, f64> {
    let mut seconds = HashMap::new();
    let Some(cpu) = cx.profiles.iter().find(|p| p.name == "cpu") else { return seconds };
    if cx.props.event != crate::config::SampleEvent::CpuClock {
        return seconds;
    }
    let period_s = 1.0 / cx.props.frequency_hz.max(1) as f64;
    let busy: u64 = cpu.profile.stacks.iter().filter(|s| s.process != "[idle]").map(|s| s.weight).sum();
    let parallelism = (busy as f64 * period_s / cx.wall_s().max(1e-9)).max(1.0);
    for stack in &cpu.profile.stacks {
        if stack.frames.iter().any(|f| f.is_kernel() && *f.function == *FAULT_ENTRY) {
            *seconds.entry(stack.pid).or_default() += stack.weight as f64 * period_s / parallelism;
        }
    }
    seconds
}

/// The kernel's page-fault entry on x86-64 (`exc_page_fault` below it; arm64's is `do_mem_abort`).
const FAULT_ENTRY: &str = if cfg!(target_arch = "aarch64") { "do_mem_abort" } else { "asm_exc_page_fault" };

impl Section for MemoryReport {
    fn json(&self) -> Vec<(&'static str, &dyn erased_serde::Serialize)> {
        vec![("memory", self)]
    }

    fn markdown(&self, out: &mut String) {
        markdown(out, self);
    }
}

/// Processes listed in the per-process tables (report.json has them all).
const PROCESS_ROWS: usize = 10;
/// Host ranges listed.
const RANGE_ROWS: usize = 15;

fn markdown(out: &mut String, memory: &MemoryReport) {
    let _ = writeln!(out, "### Memory\n");
    overview(out, memory);
    usage(out, memory);
    faults(out, memory);
    address_space(out, memory);
    heap(out, memory);
    both_sides(out, memory);
}

fn optional(value: Option<u64>) -> String {
    value.map(bytes).unwrap_or_else(|| "-".into())
}

fn overview(out: &mut String, memory: &MemoryReport) {
    let processes = memory.overview.iter().filter(|row| row.side == Side::Cpu).count();
    let rows: Vec<Vec<String>> = memory
        .overview
        .iter()
        .filter(|row| row.side == Side::Cpu)
        .take(PROCESS_ROWS)
        .chain(memory.overview.iter().filter(|row| row.side != Side::Cpu))
        .map(|row| {
            vec![
                match row.side {
                    Side::Cpu => "CPU",
                    Side::CpuPinned => "CPU (pinned)",
                    Side::Gpu => "GPU",
                }
                .to_string(),
                escape(&row.what),
                optional(row.allocated),
                optional(row.reserved),
                optional(row.peak),
                bytes(row.on_both_sides),
                bytes(row.recopied),
                match (row.minor_faults, row.major_faults) {
                    (Some(minor), Some(major)) => format!("{} / {}", thousands(minor), thousands(major)),
                    _ => "-".into(),
                },
            ]
        })
        .collect();
    table(
        out,
        &[
            "Side",
            "Process / device",
            "Allocated",
            "Reserved",
            "Peak",
            "On both CPU and GPU",
            "Copied H2D again",
            "Page faults (minor / major)",
        ],
        &rows,
    );
    if processes > PROCESS_ROWS {
        let _ = writeln!(
            out,
            "The {PROCESS_ROWS} processes with the most memory; report.json has all {processes}.\n"
        );
    }
    let _ = writeln!(
        out,
        "CPU rows: allocated = heap bytes live at the end (`--malloc`), reserved = resident memory (RSS) \
         at the end, peak = peak RSS (VmHWM). GPU rows: allocated = traced allocations (cudaMalloc & co.) \
         live at the end, reserved = GPU memory NVML accounts to the target, peak = traced allocations at \
         their highest. Redundancy: bytes copied to a GPU and still allocated on both sides at the end; \
         bytes moved host-to-device again from a range already copied.\n"
    );
    if let Some(both) = super::report::worth_freeing(memory) {
        let _ = writeln!(
            out,
            "**Memory to free**: {} copied to a GPU is still allocated on the host too. Release the host \
             buffer once the device copy exists, or stage through one reused pinned buffer (memory, not \
             time: not among the ranked recommendations).\n",
            crate::report::format::bytes(both)
        );
    }
}

fn usage(out: &mut String, memory: &MemoryReport) {
    if memory.processes.is_empty() {
        return;
    }
    let _ = writeln!(out, "#### Memory over the run (every {} ms)\n", memory.interval_ms);
    let rows: Vec<Vec<String>> = memory
        .processes
        .iter()
        .take(PROCESS_ROWS)
        .map(|p| {
            let max = &p.rss_max;
            vec![
                format!("{} ({})", escape(&p.name), p.pid),
                format!(
                    "{} ({} anon, {} file, {} shmem)",
                    bytes(max.rss()),
                    bytes(max.rss_anon),
                    bytes(max.rss_file),
                    bytes(max.rss_shmem)
                ),
                bytes(p.end.rss()),
                bytes(max.rss_peak.max(p.end.rss_peak)),
                bytes(p.end.vm_size.max(max.vm_size)),
                bytes(p.swap_max),
            ]
        })
        .collect();
    table(
        out,
        &["Process", "RSS at its highest", "RSS at the end", "Peak RSS (VmHWM)", "Virtual size", "Swap"],
        &rows,
    );
}

fn faults(out: &mut String, memory: &MemoryReport) {
    let _ = writeln!(out, "#### Page faults\n");
    let mut rows: Vec<Vec<String>> = memory
        .processes
        .iter()
        .filter(|p| p.minor_faults > 0 || p.major_faults > 0)
        .take(PROCESS_ROWS)
        .map(|p| {
            vec![
                format!("{} ({})", escape(&p.name), p.pid),
                thousands(p.minor_faults),
                thousands(p.major_faults),
                format!("{:.0}", p.faults_per_s),
            ]
        })
        .collect();
    // The faults of the processes the fault map had no room for, together.
    rows.extend(memory.overview.iter().filter(|row| row.what == super::UNATTRIBUTED_NAME).map(|row| {
        vec![
            escape(&row.what),
            thousands(row.minor_faults.unwrap_or(0)),
            thousands(row.major_faults.unwrap_or(0)),
            "-".into(),
        ]
    }));
    if rows.is_empty() {
        let _ = writeln!(out, "No page faults in the target.\n");
        return;
    }
    table(out, &["Process", "Minor faults", "Major faults (disk)", "Faults/s"], &rows);
    if !memory.fault_sites.is_empty() {
        let rows: Vec<Vec<String>> = memory
            .fault_sites
            .iter()
            .map(|s| {
                vec![
                    format!("{} ({})", escape(&s.process), s.pid),
                    escape(&s.site),
                    percent(s.share),
                    format!("~{}", thousands(s.faults)),
                ]
            })
            .collect();
        table(out, &["Process", "Faulting in", "Share of faults", "Faults"], &rows);
        let _ = writeln!(
            out,
            "Counts are every fault the process's own accesses took (the kernel's page-fault events); \
             faults the kernel takes on its behalf through get_user_pages are not events and are not \
             counted (about one per exec, as the new program's arguments are set up; ptrace or \
             process_vm_readv of its memory), so getrusage's minor faults can be higher by about one \
             per exec. Stacks are taken for a sample of the faults (faults.svg, faults.folded).\n"
        );
    }
}

fn address_space(out: &mut String, memory: &MemoryReport) {
    let mut rows: Vec<Vec<String>> = memory
        .processes
        .iter()
        .filter_map(|p| Some((p, p.address_space?)))
        .take(PROCESS_ROWS)
        .map(|(p, a)| {
            vec![
                format!("{} ({})", escape(&p.name), p.pid),
                format!("{} ({})", thousands(a.mmap_calls), bytes(a.mmap_bytes)),
                format!("{} ({})", thousands(a.munmap_calls), bytes(a.munmap_bytes)),
                format!(
                    "{} (+{} / -{})",
                    thousands(a.brk_calls),
                    bytes(a.brk_grow_bytes),
                    bytes(a.brk_shrink_bytes)
                ),
                format!(
                    "{} (+{} / -{})",
                    thousands(a.mremap_calls),
                    bytes(a.mremap_grow_bytes),
                    bytes(a.mremap_shrink_bytes)
                ),
            ]
        })
        .collect();
    rows.extend(memory.address_space_rest.map(|a| {
        vec![
            escape(super::UNATTRIBUTED_SPACE_NAME),
            format!("{} ({})", thousands(a.mmap_calls), bytes(a.mmap_bytes)),
            format!("{} ({})", thousands(a.munmap_calls), bytes(a.munmap_bytes)),
            // Many processes' breaks: how far each moved is not kept.
            thousands(a.brk_calls),
            format!(
                "{} (+{} / -{})",
                thousands(a.mremap_calls),
                bytes(a.mremap_grow_bytes),
                bytes(a.mremap_shrink_bytes)
            ),
        ]
    }));
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(out, "#### Address space (from the syscalls' arguments)\n");
    table(out, &["Process", "mmap", "munmap", "brk", "mremap"], &rows);
}

fn heap(out: &mut String, memory: &MemoryReport) {
    let _ = writeln!(out, "#### Heap\n");
    let Some(heap) = &memory.heap else {
        let _ = writeln!(
            out,
            "Not profiled: `--malloc` probes the allocator for allocation rate, sizes, live and peak bytes \
             and the stacks that allocate most (a few microseconds per allocator call).\n"
        );
        return;
    };
    if heap.allocators.is_empty() {
        let _ = writeln!(out, "No allocator was found in the target.\n");
        return;
    }
    let allocators: Vec<String> = heap
        .allocators
        .iter()
        .map(|a| format!("{} `{}` ({})", a.allocator, a.path.display(), a.functions.join(", ")))
        .collect();
    let _ = writeln!(out, "Allocators probed: {}.\n", allocators.join("; "));
    let rows: Vec<Vec<String>> = memory
        .processes
        .iter()
        .filter_map(|p| Some((p, p.heap.as_ref()?)))
        .take(PROCESS_ROWS)
        .map(|(p, h)| {
            vec![
                format!("{} ({})", escape(&p.name), p.pid),
                thousands(h.allocations),
                thousands(h.frees),
                bytes(h.bytes),
                format!("{:.0}", h.allocations_per_s),
                bytes(h.live),
                bytes(h.peak_live),
                format!("{} / {} / {}", bytes(h.size_p50), bytes(h.size_p99), bytes(h.size_max)),
                thousands(h.untracked_frees),
            ]
        })
        .collect();
    if rows.is_empty() {
        let _ = writeln!(out, "The target made no allocations while traced.\n");
        return;
    }
    table(
        out,
        &[
            "Process",
            "Allocations",
            "Frees",
            "Allocated",
            "Allocations/s",
            "Live at the end",
            "Peak live",
            "Size p50 / p99 / max",
            "Frees of older blocks",
        ],
        &rows,
    );
    for (p, h) in memory.processes.iter().filter_map(|p| Some((p, p.heap.as_ref()?))).take(3) {
        let total = h.sizes.iter().map(|b| b.count).sum::<u64>().max(1) as f64;
        let bins: Vec<String> = h
            .sizes
            .iter()
            .filter(|b| b.count as f64 / total >= 0.01)
            .map(|b| format!("< {} {}", bytes(b.below), percent(b.count as f64 / total)))
            .collect();
        if !bins.is_empty() {
            let _ =
                writeln!(out, "Allocation sizes in {} ({}): {}.\n", escape(&p.name), p.pid, bins.join(", "));
        }
    }
    if !heap.sites.is_empty() {
        let rows: Vec<Vec<String>> = heap
            .sites
            .iter()
            .map(|s| {
                vec![
                    format!("{} ({})", escape(&s.process), s.pid),
                    escape(&s.site),
                    thousands(s.allocations),
                    bytes(s.bytes),
                    bytes(s.live_bytes),
                ]
            })
            .collect();
        table(out, &["Process", "Allocated from", "Allocations", "Bytes", "Live at the end"], &rows);
    }
    if let Some(cost) = &heap.probe_cost {
        let _ = writeln!(out, "{}\n", probe_cost_line(cost));
    }
}

/// What the allocator probes cost, each kind of call at its own measured cost.
fn probe_cost_line(cost: &HeapProbeCostReport) -> String {
    let how = |function: &str, stepped: Option<bool>| match stepped {
        Some(true) => format!(
            "; {function}'s first instruction is one the kernel steps out of line, a second trap each call"
        ),
        Some(false) => format!("; the kernel emulates the instruction {function} is probed at"),
        None => String::new(),
    };
    let mut line = format!(
        "Cost of the allocator probes, measured on this machine: {:.2} µs an allocation (its entry and \
         return{}) x {}",
        cost.ns_per_allocation / 1000.0,
        how("malloc", cost.malloc_stepped),
        thousands(cost.allocations),
    );
    if cost.frees > 0 {
        let _ = write!(
            line,
            ", and {:.2} µs a free (its entry{}) x {}",
            cost.ns_per_free / 1000.0,
            how("free", cost.free_stepped),
            thousands(cost.frees)
        );
    }
    let _ = write!(
        line,
        ": {:.3} s added to the target's threads (alloc.svg, alloc.folded show the bytes by stack).",
        cost.added_s
    );
    line
}

fn both_sides(out: &mut String, memory: &MemoryReport) {
    if memory.copied_ranges.is_empty() {
        return;
    }
    let _ = writeln!(out, "#### Data on both CPU and GPU\n");
    let rows: Vec<Vec<String>> = memory
        .copied_ranges
        .iter()
        .take(RANGE_ROWS)
        .map(|r| {
            vec![
                r.pid.to_string(),
                format!("`{:#x}`", r.host),
                bytes(r.bytes),
                thousands(r.copies),
                bytes(r.recopied),
                match (r.device_allocated, r.device) {
                    (true, Some(device)) => format!("allocated on GPU {device}"),
                    _ => "freed".into(),
                },
                r.host_evidence.describe().to_string(),
                escape(&r.call_site),
            ]
        })
        .collect();
    table(
        out,
        &[
            "Pid",
            "Host range",
            "Size",
            "H2D copies",
            "Copied again",
            "Device copy",
            "Host copy",
            "Copied from",
        ],
        &rows,
    );
}
