//! What the on-CPU profile recommends: the hot functions of the target's own code, and the
//! kernel's share when no syscall table explains it. Each estimate is in seconds of the
//! target's time: a function's CPU time, over the parallelism the target had, halved (what a
//! function made twice as fast wins back). The idle loop and sysprof's own probes are never the
//! target's problem; kernel functions are the mechanism of a syscall or a fault, which their own
//! families name.

use super::hotspots::{Hotspot, hotspots};
use crate::{
    procmaps::Backing,
    profile::{SYSPROF_PROBES, StackProfile},
    report::{
        format::{percent, thousands},
        recommendation::Recommendation,
    },
    symbolize::Frame,
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
        *h.module != *Frame::KERNEL_MODULE
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
    let unknown = share_of(&|s| s.frames.iter().any(|f| f.is_unnamed()));
    if unknown >= UNKNOWN_SHARE {
        limitations.extend(unnamed_frames(busy, total));
    }
    if total < FEW_SAMPLES {
        limitations.push(format!(
            "only {total} on-CPU samples of the target: its shares are uncertain by several points (trace for \
             longer with --duration, or sample faster with --freq 999)"
        ));
    }
    (recommendations, limitations)
}

/// Why a frame has no name, as what the user can do about it differs.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Unnamed {
    /// sysprof had no map of the address: the process ended before its maps were read (an
    /// exec is read within milliseconds; a program that lives less can be gone), or the code
    /// was loaded after the last read. Symbols would not help.
    NotMapped,
    /// In a file (or the kernel) with no symbol for it.
    NoSymbols,
    /// In anonymous executable memory with no perf map: a JIT's code.
    Jit,
}

impl Unnamed {
    fn of(frame: &Frame) -> Option<Self> {
        if &*frame.function == Frame::UNMAPPED_CODE {
            return Some(Unnamed::NotMapped);
        }
        if !frame.is_unnamed() {
            return None;
        }
        Some(match &*frame.module {
            Frame::UNREAD_MODULE | Frame::UNMAPPED_MODULE => Unnamed::NotMapped,
            Backing::ANONYMOUS_NAME => Unnamed::Jit,
            _ => Unnamed::NoSymbols,
        })
    }
}

/// Most names a limitation lists of the processes or modules it is about.
const NAMES_LISTED: usize = 4;

/// One limitation for each reason the busy samples have unnamed frames, with its share of
/// the samples and whose they are: the most samples first. A sample with frames unnamed for
/// two reasons counts for both.
fn unnamed_frames(busy: &StackProfile, total: u64) -> Vec<String> {
    use std::collections::BTreeMap;
    // Per reason: samples, and samples by the name the line lists (process or module).
    let mut by_reason: BTreeMap<Unnamed, (u64, BTreeMap<&str, u64>)> = BTreeMap::new();
    for stack in &busy.stacks {
        // Each stack counts once for each reason, and once for each name under it.
        let mut seen: Vec<(Unnamed, &str)> = Vec::new();
        for frame in &stack.frames {
            let Some(reason) = Unnamed::of(frame) else { continue };
            // Not mapped: whose process it was (the frame has no module to name).
            let name = if reason == Unnamed::NotMapped { stack.process.as_str() } else { &*frame.module };
            if seen.contains(&(reason, name)) {
                continue;
            }
            let (samples, names) = by_reason.entry(reason).or_default();
            if !seen.iter().any(|(r, _)| *r == reason) {
                *samples += stack.weight;
            }
            seen.push((reason, name));
            *names.entry(name).or_default() += stack.weight;
        }
    }
    let mut reasons: Vec<_> = by_reason.into_iter().collect();
    reasons.sort_by_key(|(_, (samples, _))| std::cmp::Reverse(*samples));
    reasons
        .into_iter()
        .map(|(reason, (samples, names))| {
            let share = percent(samples as f64 / total as f64);
            let mut names: Vec<(&str, u64)> = names.into_iter().collect();
            names.sort_by_key(|(name, samples)| (std::cmp::Reverse(*samples), *name));
            let listed = names.iter().take(NAMES_LISTED).map(|(name, _)| *name).collect::<Vec<_>>().join(", ");
            let more = names.len().saturating_sub(NAMES_LISTED);
            let listed = if more > 0 { format!("{listed} and {more} more") } else { listed };
            match reason {
                Unnamed::NotMapped => format!(
                    "{share} of the target's on-CPU samples have frames at addresses sysprof had no map of \
                     ([unknown] [unknown]+0x..., [unknown] [unmapped]+0x... and [unmapped code] frames; \
                     processes: {listed}): a \
                     program that ended within milliseconds of its start was gone before sysprof read where its \
                     code was, or code was loaded after the last read. Their time is counted under their \
                     process, and symbols would not name it"
                ),
                Unnamed::NoSymbols => format!(
                    "{share} of the target's on-CPU samples have frames sysprof could not name in {listed}: \
                     install debug symbols for them, and keep symbols in the binaries (no strip)"
                ),
                Unnamed::Jit => format!(
                    "{share} of the target's on-CPU samples are in code generated at run time with no perf map \
                     ([unknown] [anon]+0x... frames): run JITs with their perf map on (node --perf-basic-prof; \
                     Python needs nothing)"
                ),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::WeightedStack;

    /// A stack of `process` from (function, module) frames.
    fn stack(process: &str, frames: &[(&str, &str)], weight: u64) -> WeightedStack {
        WeightedStack {
            pid: 1,
            process: process.into(),
            frames: frames
                .iter()
                .map(|(function, module)| Frame::new((*function).into(), (*module).into()))
                .collect(),
            weight,
            threads: vec![],
        }
    }

    fn limitations(stacks: Vec<WeightedStack>) -> Vec<String> {
        let busy = StackProfile { unit: "samples".into(), stacks };
        let facts = CpuFacts { frequency_hz: 99, wall_s: 10.0, syscalls_traced: true };
        cpu_recommendations(&busy, &facts).1
    }

    #[test]
    fn unnamed_frames_are_told_apart_by_what_would_name_them() {
        let limits = limitations(vec![
            stack("make", &[("main", "make"), ("run", "make")], 600),
            // A compiler that was gone before its maps were read.
            stack(
                "cc1",
                &[("[unknown] [unknown]+0x5591", "[unknown]"), ("[unknown] [unknown]+0x7f22", "[unknown]")],
                200,
            ),
            stack("as", &[("[unknown] [unmapped]+0x9000", "[unmapped]")], 30),
            // A leaf in code unmapped before the maps were read.
            stack("sh", &[("main", "sh"), (Frame::UNMAPPED_CODE, "")], 20),
            // A stripped library, twice in one stack: its samples count once.
            stack(
                "make",
                &[
                    ("main", "make"),
                    ("[unknown] libz.so.1+0x10", "libz.so.1"),
                    ("[unknown] libz.so.1+0x20", "libz.so.1"),
                ],
                100,
            ),
            stack("node", &[("[unknown] [anon]+0x40", "[anon]")], 50),
        ]);
        assert_eq!(limits.len(), 3, "{limits:#?}");
        // The most samples first: 250 not mapped, 100 without symbols, 50 JIT (of 1,000).
        assert!(
            limits[0].starts_with("25.0% of the target's on-CPU samples have frames at addresses"),
            "{}",
            limits[0]
        );
        assert!(limits[0].contains("processes: cc1, as, sh)"), "{}", limits[0]);
        assert!(!limits[0].contains("debug symbols"), "{}", limits[0]);
        assert!(
            limits[1].starts_with(
                "10.0% of the target's on-CPU samples have frames sysprof could not name in libz.so.1:"
            ),
            "{}",
            limits[1]
        );
        assert!(limits[1].contains("install debug symbols"), "{}", limits[1]);
        assert!(
            limits[2].starts_with("5.0% of the target's on-CPU samples are in code generated at run time"),
            "{}",
            limits[2]
        );
    }

    #[test]
    fn a_few_unnamed_frames_are_not_a_limitation() {
        let limits = limitations(vec![
            stack("app", &[("main", "app")], 950),
            stack("app", &[("[unknown] libz.so.1+0x10", "libz.so.1")], 49),
        ]);
        assert!(limits.iter().all(|l| !l.contains("could not name")), "{limits:#?}");
    }
}
