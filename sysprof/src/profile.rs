//! The aggregate stage: the kernel's (thread, stack ids) -> count map becomes symbolized,
//! weighted stacks per process, the shape every stack output (folded, SVG, hotspots) reads.

use std::collections::{BTreeSet, HashMap};

use serde::Serialize;
use sysprof_common::{SampleKey, stack};

use crate::{
    probes::CpuSamples,
    procs::{ProcessTable, comm_to_string},
    symbolize::{Frame, Symbolizer},
};

/// One distinct stack of one process and how much of the measure it carries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WeightedStack {
    pub pid: u32,
    /// Root frame of the flamegraph: the process name, or a label for idle and kernel threads.
    pub process: String,
    /// Outermost first; user frames then kernel frames.
    pub frames: Vec<Frame>,
    pub weight: u64,
}

/// Stacks with weights in one unit (samples, microseconds, bytes, ...).
#[derive(Clone, Debug, Default, Serialize)]
pub struct StackProfile {
    pub unit: String,
    pub stacks: Vec<WeightedStack>,
}

impl StackProfile {
    pub fn total(&self) -> u64 {
        self.stacks.iter().map(|s| s.weight).sum()
    }
}

/// Marker frames for stacks the kernel could not keep.
const LOST_USER_STACK: &str = "[user stack lost]";
const LOST_KERNEL_STACK: &str = "[kernel stack lost]";

/// Builds the on-CPU profile from the raw samples.
pub fn cpu_profile(
    samples: &CpuSamples,
    processes: &mut ProcessTable,
    symbolizer: &mut Symbolizer,
) -> StackProfile {
    for (key, _) in &samples.counts {
        if key.tgid != 0 {
            processes.ensure(key.tgid);
        }
    }

    let kernel_addrs: BTreeSet<u64> = samples
        .counts
        .iter()
        .filter_map(|(key, _)| samples.stacks.get(&u32::try_from(key.kernel_stack_id).ok()?))
        .flatten()
        .copied()
        .collect();
    let kernel_frames = symbolizer.kernel(&kernel_addrs.into_iter().collect::<Vec<_>>());

    let mut user_addrs: HashMap<u32, BTreeSet<u64>> = HashMap::new();
    for (key, _) in &samples.counts {
        if let Some(ips) = u32::try_from(key.user_stack_id).ok().and_then(|id| samples.stacks.get(&id)) {
            user_addrs.entry(key.tgid).or_default().extend(lookup_addresses(ips));
        }
    }
    let mut user_frames: HashMap<u32, HashMap<u64, Vec<Frame>>> = HashMap::new();
    for (pid, addrs) in user_addrs {
        let maps = processes.get(pid).and_then(|p| p.maps.as_ref());
        let addrs: Vec<u64> = addrs.into_iter().collect();
        user_frames.insert(pid, symbolizer.user(pid, maps, &addrs));
    }

    let mut merged: HashMap<(u32, String, Vec<Frame>), u64> = HashMap::new();
    for (key, count) in &samples.counts {
        let mut frames = Vec::new();
        match key.user_stack_id {
            stack::NONE => {}
            stack::LOST => frames.push(marker(LOST_USER_STACK)),
            id => {
                if let (Some(ips), Some(resolved)) =
                    (samples.stacks.get(&(id as u32)), user_frames.get(&key.tgid))
                {
                    for addr in lookup_addresses(ips).collect::<Vec<_>>().into_iter().rev() {
                        frames.extend(resolved[&addr].iter().cloned());
                    }
                }
            }
        }
        match key.kernel_stack_id {
            stack::NONE => {}
            stack::LOST => frames.push(marker(LOST_KERNEL_STACK)),
            id => {
                if let Some(ips) = samples.stacks.get(&(id as u32)) {
                    for addr in ips.iter().rev() {
                        frames.extend(kernel_frames[addr].iter().cloned());
                    }
                }
            }
        }
        *merged.entry((key.tgid, root_label(key, processes), frames)).or_default() += count;
    }

    let mut stacks: Vec<WeightedStack> = merged
        .into_iter()
        .map(|((pid, process, frames), weight)| WeightedStack { pid, process, frames, weight })
        .collect();
    stacks.sort_by(|a, b| b.weight.cmp(&a.weight).then_with(|| a.frames.cmp(&b.frames)));
    StackProfile { unit: "samples".into(), stacks }
}

/// The addresses to symbolize for a stack, innermost first. Every frame but the innermost holds
/// a return address, which points after the call: one byte back lands inside the call
/// instruction, so a call at the end of a function is not blamed on the next one.
fn lookup_addresses(ips: &[u64]) -> impl Iterator<Item = u64> + '_ {
    ips.iter().enumerate().map(|(depth, &ip)| if depth == 0 { ip } else { ip.saturating_sub(1) })
}

fn marker(label: &str) -> Frame {
    Frame { function: label.to_string(), module: String::new() }
}

/// The flamegraph root for a sample: the process name, with idle and kernel threads labelled.
fn root_label(key: &SampleKey, processes: &ProcessTable) -> String {
    if key.tid == 0 {
        return "[idle]".into();
    }
    let record = processes.get(key.tgid);
    let name =
        record.map(|p| p.name.clone()).filter(|n| !n.is_empty()).unwrap_or_else(|| comm_to_string(&key.comm));
    let kernel_thread = key.user_stack_id == stack::NONE && record.is_some_and(|p| p.maps.is_none());
    if kernel_thread { format!("[kernel thread] {name}") } else { name }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_addresses_step_back_into_the_call() {
        let ips = [0x1000, 0x2005, 0x3010];
        assert_eq!(lookup_addresses(&ips).collect::<Vec<_>>(), [0x1000, 0x2004, 0x300f]);
    }

    #[test]
    fn idle_and_lost_stacks_are_labelled() {
        let samples = CpuSamples {
            counts: vec![
                (
                    SampleKey {
                        tgid: 0,
                        tid: 0,
                        user_stack_id: stack::NONE,
                        kernel_stack_id: stack::LOST,
                        comm: [0; 16],
                    },
                    5,
                ),
                (
                    SampleKey {
                        tgid: 0,
                        tid: 0,
                        user_stack_id: stack::NONE,
                        kernel_stack_id: stack::LOST,
                        comm: [1; 16],
                    },
                    2,
                ),
            ],
            stacks: HashMap::new(),
        };
        let profile = cpu_profile(&samples, &mut ProcessTable::new(), &mut Symbolizer::new());
        assert_eq!(profile.stacks.len(), 1, "same process and frames merge");
        assert_eq!(profile.stacks[0].process, "[idle]");
        assert_eq!(profile.stacks[0].frames, vec![marker(LOST_KERNEL_STACK)]);
        assert_eq!(profile.total(), 7);
    }
}
