//! Recommendations from the measured figures. Each quotes the figure behind it; the impact is an
//! estimate of the share of the measured time the change could win back, which ranks them.

use super::hotspots::Hotspot;
use crate::{profile::StackProfile, report::recommendation::Recommendation};

/// Self share above which a single function is worth a recommendation of its own.
const HOT_FUNCTION_SHARE: f64 = 0.10;
/// Kernel share of on-CPU time above which the kernel is worth a look.
const KERNEL_SHARE: f64 = 0.30;
/// Share of samples with unresolved frames above which symbols are worth fixing first.
const UNKNOWN_SHARE: f64 = 0.10;
/// Fewer samples than this make every share uncertain by several points.
const FEW_SAMPLES: u64 = 200;

pub fn cpu_recommendations(profile: &StackProfile, hotspots: &[Hotspot]) -> Vec<Recommendation> {
    let total = profile.total();
    let mut recommendations = Vec::new();
    if total == 0 {
        return recommendations;
    }
    for hotspot in hotspots.iter().filter(|h| h.self_share >= HOT_FUNCTION_SHARE).take(3) {
        recommendations.push(Recommendation {
            impact: hotspot.self_share,
            title: format!("Optimize {} ({})", hotspot.function, hotspot.module),
            evidence: format!(
                "{:.1}% of on-CPU samples are in its own code ({} of {total}); {:.1}% pass through it",
                hotspot.self_share * 100.0,
                hotspot.self_weight,
                hotspot.total_share * 100.0
            ),
            action: "Start here: a faster algorithm, less work per call, or fewer calls (see its callers in cpu.svg)".into(),
        });
    }
    let share_of = |predicate: &dyn Fn(&crate::profile::WeightedStack) -> bool| {
        profile.stacks.iter().filter(|s| predicate(s)).map(|s| s.weight).sum::<u64>() as f64 / total as f64
    };
    let kernel = share_of(&|s| s.frames.last().is_some_and(|f| f.is_kernel()));
    if kernel >= KERNEL_SHARE {
        recommendations.push(Recommendation {
            impact: kernel * 0.5,
            title: "Reduce time in the kernel".into(),
            evidence: format!("{:.1}% of on-CPU samples are in kernel code", kernel * 100.0),
            action:
                "Look at the kernel frames in cpu.svg for the syscalls behind them; batch small reads and \
                     writes, avoid needless syscalls, reuse memory instead of mapping it anew"
                    .into(),
        });
    }
    let unknown = share_of(&|s| s.frames.iter().any(|f| f.function.starts_with("[unknown]")));
    if unknown >= UNKNOWN_SHARE {
        recommendations.push(Recommendation {
            impact: unknown * 0.25,
            title: "Make the profile readable: add symbols".into(),
            evidence: format!("{:.1}% of samples have frames sysprof could not name", unknown * 100.0),
            action: "Install debug symbols for the modules named in [unknown] frames, keep symbols in your \
                     binaries (no strip), build with -fno-omit-frame-pointer, and run JITs with their perf \
                     map on (python -X perf, node --perf-basic-prof)"
                .into(),
        });
    }
    if total < FEW_SAMPLES {
        recommendations.push(Recommendation {
            impact: 0.0,
            title: "Collect more samples".into(),
            evidence: format!("only {total} on-CPU samples: shares are uncertain by several points"),
            action: "Trace for longer (--duration) or sample faster (--freq 999)".into(),
        });
    }
    recommendations.sort_by(|a, b| b.impact.total_cmp(&a.impact));
    recommendations
}
