//! What the on-CPU profile recommends: the hot functions of the target's own code, and the
//! kernel's share when no syscall table explains it. Each estimate is in seconds of the
//! target's time: a function's CPU time, over the parallelism the target had, halved (what a
//! function made twice as fast wins back). The idle loop and sysprof's own probes are never the
//! target's problem; kernel functions are the mechanism of a syscall or a fault, which their own
//! families name.

use super::hotspots::{Hotspot, hotspots};
use crate::{
    profile::{SYSPROF_PROBES, StackProfile},
    report::{
        format::{percent, thousands},
        recommendation::Recommendation,
    },
};

/// Self share above which a single function is worth a recommendation of its own.
const HOT_FUNCTION_SHARE: f64 = 0.10;
/// Fewer self samples than this say too little about a function to advise on it.
const HOT_FUNCTION_SAMPLES: u64 = 20;
/// Kernel share of on-CPU time above which the kernel is worth a look.
const KERNEL_SHARE: f64 = 0.30;
/// Share of samples with unresolved frames above which symbols are worth fixing first.
const UNKNOWN_SHARE: f64 = 0.10;
/// Fewer samples than this make every share uncertain by several points.
const FEW_SAMPLES: u64 = 200;
/// Libraries whose time is a GPU call's: the GPU family weighs those calls.
const GPU_RUNTIMES: [&str; 3] = ["libcudart", "libcuda.", "libnccl"];
/// What making a function twice as fast wins back of its time.
const SPEEDUP_WIN: f64 = 0.5;

/// What the recommendations are computed from beside the profile.
pub struct CpuFacts {
    pub frequency_hz: u64,
    pub wall_s: f64,
    /// The syscall family ran: its table names the kernel's time more precisely.
    pub syscalls_traced: bool,
}

/// The target's busy samples: the profile less the idle loop.
pub fn busy(profile: &StackProfile) -> StackProfile {
    let stacks = profile.stacks.iter().filter(|s| s.process != "[idle]").cloned().collect();
    StackProfile { unit: profile.unit.clone(), stacks }
}

/// Samples in sysprof's own probes (see `profile::SYSPROF_PROBES`).
pub fn probe_samples(profile: &StackProfile) -> u64 {
    profile
        .stacks
        .iter()
        .filter(|s| s.frames.iter().any(|f| *f.function == *SYSPROF_PROBES))
        .map(|s| s.weight)
        .sum()
}

/// The recommendations from the target's busy samples (see [`busy`]), and what they could not
/// say (the limitations).
pub fn cpu_recommendations(busy: &StackProfile, facts: &CpuFacts) -> (Vec<Recommendation>, Vec<String>) {
    let total = busy.total();
    let mut recommendations = Vec::new();
    let mut limitations = Vec::new();
    if total == 0 {
        return (recommendations, limitations);
    }
    let hz = facts.frequency_hz.max(1) as f64;
    let cpu_s = total as f64 / hz;
    // Several threads running at once: a second of CPU is less than a second of elapsed time.
    let parallelism = (cpu_s / facts.wall_s.max(1e-9)).max(1.0);
    // The kernel's functions and the GPU runtimes' are the mechanism of a syscall, a fault or a
    // CUDA/NCCL call, which their own families advise on with the call's figures.
    let advisable = |h: &&Hotspot| {
        *h.module != *crate::symbolize::Frame::KERNEL_MODULE
            && !h.function.starts_with('[')
            && &*h.module != "sysprof"
            && !GPU_RUNTIMES.iter().any(|m| h.module.starts_with(m))
    };
    for hotspot in hotspots(busy, 25)
        .iter()
        .filter(advisable)
        .filter(|h| h.self_share >= HOT_FUNCTION_SHARE && h.self_weight >= HOT_FUNCTION_SAMPLES)
        .take(3)
    {
        let own_s = hotspot.self_weight as f64 / hz;
        let seconds = own_s / parallelism * SPEEDUP_WIN;
        recommendations.push(Recommendation::new(
            seconds,
            format!("Optimize {}", crate::callsites::describe(&hotspot.frame())),
            format!(
                "{} of the target's on-CPU samples are in its own code ({} of {}, {own_s:.2} s of CPU); {} \
                 pass through it; twice as fast, it would win back ~{seconds:.2} s",
                percent(hotspot.self_share),
                thousands(hotspot.self_weight),
                thousands(total),
                percent(hotspot.total_share)
            ),
            "Start here: a faster algorithm, less work per call, or fewer calls (see its callers in cpu.svg)",
        ));
    }
    let share_of = |predicate: &dyn Fn(&crate::profile::WeightedStack) -> bool| {
        busy.stacks.iter().filter(|s| predicate(s)).map(|s| s.weight).sum::<u64>() as f64 / total as f64
    };
    let kernel = share_of(&|s| s.frames.last().is_some_and(|f| f.is_kernel()));
    if kernel >= KERNEL_SHARE && !facts.syscalls_traced {
        let seconds = kernel * cpu_s / parallelism * SPEEDUP_WIN;
        recommendations.push(Recommendation::new(
            seconds,
            "Reduce time in the kernel",
            format!("{} of the target's on-CPU samples are in kernel code ({:.2} s of CPU)", percent(kernel), kernel * cpu_s),
            "Trace the syscalls (--focus cpu,syscalls) to see which ones; batch small reads and writes, avoid \
             needless syscalls, reuse memory instead of mapping it anew",
        ));
    }
    let unknown = share_of(&|s| s.frames.iter().any(|f| f.function.starts_with("[unknown]")));
    if unknown >= UNKNOWN_SHARE {
        limitations.push(format!(
            "{} of the target's on-CPU samples have frames sysprof could not name: install debug symbols for \
             the modules in the [unknown] frames, keep symbols in the binaries (no strip), and run JITs with \
             their perf map on (node --perf-basic-prof; Python needs nothing)",
            percent(unknown)
        ));
    }
    if total < FEW_SAMPLES {
        limitations.push(format!(
            "only {total} on-CPU samples of the target: its shares are uncertain by several points (trace for \
             longer with --duration, or sample faster with --freq 999)"
        ));
    }
    (recommendations, limitations)
}
