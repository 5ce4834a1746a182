//! Hotspots: which functions the samples land in (self) and pass through (inclusive).

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use serde::Serialize;

use crate::{profile::StackProfile, symbolize::Frame};

/// One function's share of a stack profile.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Hotspot {
    pub function: Arc<str>,
    pub module: Arc<str>,
    /// Weight of the stacks whose innermost frame is this function.
    pub self_weight: u64,
    pub self_share: f64,
    /// Weight of the stacks this function appears in (counted once per stack).
    pub total_weight: u64,
    pub total_share: f64,
}

impl Hotspot {
    pub fn frame(&self) -> Frame {
        Frame::new(self.function.clone(), self.module.clone())
    }
}

/// One process's share of a stack profile.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProcessShare {
    pub pid: u32,
    pub name: String,
    pub weight: u64,
    pub share: f64,
}

/// The `limit` functions with the most self weight (ties: most inclusive weight).
pub fn hotspots(profile: &StackProfile, limit: usize) -> Vec<Hotspot> {
    let total = profile.total();
    let mut self_weight: HashMap<&Frame, u64> = HashMap::new();
    let mut total_weight: HashMap<&Frame, u64> = HashMap::new();
    for stack in &profile.stacks {
        if let Some(leaf) = stack.frames.last() {
            let slot = self_weight.entry(leaf).or_default();
            *slot = slot.saturating_add(stack.weight);
        }
        let distinct: HashSet<&Frame> = stack.frames.iter().collect();
        for frame in distinct {
            let slot = total_weight.entry(frame).or_default();
            *slot = slot.saturating_add(stack.weight);
        }
    }
    let share = |weight: u64| if total == 0 { 0.0 } else { weight as f64 / total as f64 };
    let mut rows: Vec<Hotspot> = total_weight
        .into_iter()
        .map(|(frame, total_weight)| {
            let self_weight = self_weight.get(frame).copied().unwrap_or(0);
            Hotspot {
                function: frame.function.clone(),
                module: frame.module.clone(),
                self_weight,
                self_share: share(self_weight),
                total_weight,
                total_share: share(total_weight),
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        (b.self_weight, b.total_weight)
            .cmp(&(a.self_weight, a.total_weight))
            .then_with(|| a.function.cmp(&b.function))
    });
    rows.truncate(limit);
    rows
}

/// Weight per process, largest first.
pub fn process_shares(profile: &StackProfile) -> Vec<ProcessShare> {
    let total = profile.total();
    let mut by_pid: HashMap<(u32, &str), u64> = HashMap::new();
    for stack in &profile.stacks {
        let slot = by_pid.entry((stack.pid, &stack.process)).or_default();
        *slot = slot.saturating_add(stack.weight);
    }
    let mut rows: Vec<ProcessShare> = by_pid
        .into_iter()
        .map(|((pid, name), weight)| ProcessShare {
            pid,
            name: name.to_string(),
            weight,
            share: if total == 0 { 0.0 } else { weight as f64 / total as f64 },
        })
        .collect();
    rows.sort_by(|a, b| b.weight.cmp(&a.weight).then(a.pid.cmp(&b.pid)));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::WeightedStack;

    fn frame(name: &str) -> Frame {
        Frame::new(name.into(), "app".into())
    }

    fn stack(frames: &[&str], weight: u64) -> WeightedStack {
        WeightedStack {
            pid: 1,
            process: "app".into(),
            frames: frames.iter().map(|f| frame(f)).collect(),
            weight,
            threads: vec![],
        }
    }

    #[test]
    fn self_and_inclusive_shares() {
        let profile = StackProfile {
            unit: "samples".into(),
            stacks: vec![
                stack(&["main", "work", "hot"], 75),
                stack(&["main", "work", "cold"], 25),
                // Recursion: `work` counts once for this stack.
                stack(&["main", "work", "work"], 0),
            ],
        };
        let rows = hotspots(&profile, 10);
        assert_eq!(&*rows[0].function, "hot");
        assert_eq!(rows[0].self_weight, 75);
        assert!((rows[0].self_share - 0.75).abs() < 1e-9);
        assert_eq!(&*rows[1].function, "cold");
        let main = rows.iter().find(|r| &*r.function == "main").unwrap();
        assert_eq!((main.self_weight, main.total_weight), (0, 100));
        assert!((main.total_share - 1.0).abs() < 1e-9);
        assert_eq!(hotspots(&profile, 2).len(), 2);
    }

    #[test]
    fn processes_by_weight() {
        let mut other = stack(&["x"], 30);
        other.pid = 2;
        other.process = "other".into();
        let profile =
            StackProfile { unit: "samples".into(), stacks: vec![stack(&["a"], 10), other, stack(&["b"], 5)] };
        let rows = process_shares(&profile);
        assert_eq!((rows[0].pid, rows[0].weight), (2, 30));
        assert_eq!((rows[1].pid, rows[1].weight), (1, 15));
    }
}
