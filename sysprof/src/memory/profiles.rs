//! The memory stack profiles: where page faults happen (`faults.folded`, weighted in faults)
//! and where the heap is allocated (`alloc.folded`, weighted in bytes), with the call sites
//! that stand out in each.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use sysprof_common::{FaultKey, stack};

use crate::{
    callsites,
    memory::MemoryDump,
    procs::{ImageOf, ProcessTable},
    profile::{self, ResolvedStacks, StackProfile, StackSample},
    symbolize::Symbolizer,
};

/// Rows in the site tables.
const SITES: usize = 10;

/// Where one process allocates from one place.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AllocSite {
    pub pid: u32,
    pub process: String,
    /// The innermost function of the program's own code (past the allocator and the C and C++
    /// runtimes).
    pub site: String,
    pub allocations: u64,
    pub bytes: u64,
    /// Bytes allocated here during the trace and not freed by its end.
    pub live_bytes: u64,
}

/// Where one process faults.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FaultSite {
    pub pid: u32,
    pub process: String,
    pub site: String,
    /// Estimated from the sampled stacks (1 in N faults has its stack taken).
    pub faults: u64,
    pub share: f64,
}

/// Page faults by stack, the kind of fault as the first frame under the process. Takes the
/// read-out's stacks and resolves them one process at a time, freeing them before the profile
/// is laid out: on a busy host they are tens of thousands, and this profile was the analysis's
/// peak.
pub fn fault_profile(
    fault_stacks: Vec<(FaultKey, u64)>,
    fault_traces: HashMap<u32, Vec<u64>>,
    processes: &mut ProcessTable,
    symbolizer: &mut Symbolizer,
) -> StackProfile {
    let sample_of = |(key, weight): &(FaultKey, u64)| StackSample {
        tgid: key.tgid,
        tid: key.tgid,
        user_stack_id: key.user_stack_id,
        kernel_stack_id: key.kernel_stack_id,
        comm: None,
        weight: *weight,
        tag: key.major,
        image: ImageOf::Generation(key.exec_id),
    };
    let merged = profile::merge_by_process(
        fault_stacks,
        sample_of,
        &fault_traces,
        processes,
        symbolizer,
        |sample, _| Some(if sample.tag == 1 { "[major fault]" } else { "[minor fault]" }.into()),
    );
    drop(fault_traces);
    merged.into_profile("faults")
}

/// The functions that fault most, from the fault profile.
pub fn fault_sites(faults: &StackProfile) -> Vec<FaultSite> {
    let total = faults.total().max(1) as f64;
    let mut sites: BTreeMap<(u32, String, String), u64> = BTreeMap::new();
    for stack in &faults.stacks {
        // The program's own frame; else the innermost user frame (a libc function whose caller
        // a frame-pointer walk could not see); else there was no user stack.
        let site = callsites::own_frame(&stack.frames)
            .or_else(|| stack.frames.iter().rev().find(|f| !f.is_kernel() && !f.function.starts_with('[')))
            .map(callsites::describe)
            .unwrap_or_else(|| "[no user stack]".into());
        let slot = sites.entry((stack.pid, stack.process.clone(), site)).or_default();
        *slot = slot.saturating_add(stack.weight);
    }
    let mut rows: Vec<FaultSite> = sites
        .into_iter()
        .map(|((pid, process, site), faults)| FaultSite {
            pid,
            process,
            site,
            faults,
            share: faults as f64 / total,
        })
        .collect();
    rows.sort_by(|a, b| b.faults.cmp(&a.faults).then_with(|| a.site.cmp(&b.site)));
    rows.truncate(SITES);
    rows
}

/// Ids given to the stacks rebuilt with their caller, above any id the kernel hands out.
const REBUILT_STACK_IDS: u32 = 0x4000_0000;

/// The heap's profiles and the sites that allocate the most.
pub struct HeapProfiles {
    /// Bytes allocated, by stack.
    pub allocated: StackProfile,
    /// Bytes still live at the end, by the stack that allocated them.
    pub live: StackProfile,
    pub sites: Vec<AllocSite>,
}

/// Heap allocations by stack, weighted in bytes: allocated during the trace, and live at its
/// end. `sysprof_pid`'s own allocations (its calibration) are left out.
pub fn heap_profile(
    dump: &MemoryDump,
    processes: &mut ProcessTable,
    symbolizer: &mut Symbolizer,
    sysprof_pid: u32,
) -> HeapProfiles {
    // A stack taken at the allocator's first instruction misses its caller (the frame pointer
    // still belongs to the caller): each (stack, caller) pair becomes a stack of its own with
    // the caller put back.
    let mut rebuilt: HashMap<(i32, u64), i32> = HashMap::new();
    let mut stacks: HashMap<u32, Vec<u64>> = HashMap::new();
    let mut stack_of = |user_stack_id: i32, caller: u64| -> i32 {
        if user_stack_id < 0 || caller == 0 {
            return user_stack_id;
        }
        let next = REBUILT_STACK_IDS + rebuilt.len() as u32;
        *rebuilt.entry((user_stack_id, caller)).or_insert_with(|| {
            let mut ips = dump.stacks.get(&(user_stack_id as u32)).cloned().unwrap_or_default();
            if ips.get(1) != Some(&caller) {
                ips.insert(ips.len().min(1), caller);
            }
            stacks.insert(next, ips);
            next as i32
        })
    };
    let mut live: HashMap<(u32, u32, i32), u64> = HashMap::new();
    // A block of a program its process exec'd away from went with its address space (the
    // kernel side took it out of the live bytes then, `heap::exec_ended`).
    let current = |tgid: u32, exec_id: u32| {
        processes.get(tgid).is_none_or(|p| p.image_index(ImageOf::Generation(exec_id)) == p.earlier.len())
    };
    for (key, block) in dump.live.iter().filter(|(key, block)| current(key.tgid, block.exec_id)) {
        let stack = stack_of(block.user_stack_id, block.caller);
        let slot = live.entry((key.tgid, block.exec_id, stack)).or_default();
        *slot = slot.saturating_add(block.size);
    }
    let mut samples = Vec::with_capacity(dump.alloc_sites.len());
    let mut counts: HashMap<(u32, u32, i32), u64> = HashMap::new();
    for (key, stats) in dump.alloc_sites.iter().filter(|(key, _)| key.tgid != sysprof_pid) {
        let id = stack_of(key.user_stack_id, key.caller);
        let slot = counts.entry((key.tgid, key.exec_id, id)).or_default();
        *slot = slot.saturating_add(stats.count);
        samples.push(StackSample {
            tgid: key.tgid,
            tid: key.tgid,
            user_stack_id: id,
            kernel_stack_id: stack::NONE,
            comm: None,
            weight: stats.bytes,
            tag: 0,
            image: ImageOf::Generation(key.exec_id),
        });
    }
    let live_samples: Vec<StackSample> = live
        .iter()
        .filter(|((tgid, _, _), _)| *tgid != sysprof_pid)
        .map(|(&(tgid, exec_id, user_stack_id), &bytes)| StackSample {
            tgid,
            tid: tgid,
            user_stack_id,
            kernel_stack_id: stack::NONE,
            comm: None,
            weight: bytes,
            tag: 0,
            image: ImageOf::Generation(exec_id),
        })
        .collect();
    let every: Vec<StackSample> = samples.iter().chain(&live_samples).copied().collect();
    let resolved = ResolvedStacks::resolve(&every, &stacks, processes, symbolizer);
    let profile = profile::build(&samples, &resolved, processes, "bytes", |_, _| None);
    let live_profile = profile::build(&live_samples, &resolved, processes, "bytes", |_, _| None);

    let mut sites: BTreeMap<(u32, String, String), AllocSite> = BTreeMap::new();
    for sample in &samples {
        let frames = resolved.frames(sample);
        let site = callsites::own_frame(&frames)
            .or(frames.last())
            .map(callsites::describe)
            .unwrap_or_else(|| "[no user stack]".into());
        // Named as the program that allocated was.
        let image = resolved.image_of(sample) as usize;
        let process = processes.get(sample.tgid).map(|p| p.image(image).name.to_string()).unwrap_or_default();
        let row = sites.entry((sample.tgid, process.clone(), site.clone())).or_insert_with(|| AllocSite {
            pid: sample.tgid,
            process,
            site,
            allocations: 0,
            bytes: 0,
            live_bytes: 0,
        });
        let ImageOf::Generation(exec_id) = sample.image else { continue };
        let key = (sample.tgid, exec_id, sample.user_stack_id);
        row.allocations = row.allocations.saturating_add(counts.remove(&key).unwrap_or(0));
        row.live_bytes = row.live_bytes.saturating_add(live.remove(&key).unwrap_or(0));
        row.bytes = row.bytes.saturating_add(sample.weight);
    }
    let mut sites: Vec<AllocSite> = sites.into_values().collect();
    sites.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.cmp(&b.site)));
    sites.truncate(SITES);
    HeapProfiles { allocated: profile, live: live_profile, sites }
}
