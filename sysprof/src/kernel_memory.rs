//! The kernel memory a trace pins: how big each of the BPF object's maps is made for the run
//! ([`MapSizes`]), what that comes to before anything is loaded ([`estimate`]), and what the
//! kernel accounts for the maps and programs once they are ([`Snapshot`], [`KernelMemory`]).
//!
//! Maps are preallocated (stack maps always; hash maps unless created `BPF_F_NO_PREALLOC`,
//! which the hot programs' maps are not: see `SYSCALLS` in the BPF crate): their memory is
//! taken at load, used or not, and charged to sysprof's memory cgroup. So a map whose
//! programs this run does not attach gets 1 entry, as the live-allocation map always did
//! without `--malloc`: a default trace kept 68 maps and 152 MiB, a `--focus cpu` trace 132 MiB
//! of them, most for families it never attached.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sysprof_common::{capacity, names};

use crate::{
    config::{Families, TraceConfig},
    report::format::thousands,
};

/// How big the maps that depend on the run's options are, and which maps the run uses.
#[derive(Clone, Copy, Debug)]
pub struct MapSizes {
    /// Entries of each stack map (`--stack-storage-size`).
    pub stacks: u32,
    /// Chunks of unwind rows (`sysprof_common::unwind::ROWS`); 0 or 1 when stacks are taken by
    /// frame pointers only.
    pub unwind_chunks: u32,
    /// The families whose programs the run attaches.
    pub families: Families,
    /// Whether the call programs may attach (the GPU family, `--func`).
    pub calls: bool,
    /// Whether the timeline is kept (`--timeline-events` above 0).
    pub timeline: bool,
    /// Whether the target is a set of processes the programs grow (`--pid`, `--comm`,
    /// `-- CMD`), not a filter on every task (`--all`, `--cgroup`).
    pub target_set: bool,
}

/// Target processes `TARGETS` holds when the target is not a set: sysprof itself, while it
/// measures its probes' cost (`uprobes::calibrate`).
const TARGETS_WITHOUT_A_SET: u32 = 16;

impl MapSizes {
    /// The sizes a trace with `config` uses; `target_set` as in [`MapSizes::target_set`].
    pub fn for_config(config: &TraceConfig, target_set: bool) -> Self {
        MapSizes {
            stacks: config.stack_storage_size,
            unwind_chunks: unwind_chunks(config.unwind_memory_mib),
            families: config.families(),
            calls: config.wants(crate::config::Focus::Gpu) || !config.functions.is_empty(),
            timeline: config.timeline_events > 0,
            target_set,
        }
    }

    /// Every map at its smallest, for a check that loads and attaches and counts nothing.
    pub fn minimal() -> Self {
        let families =
            Families { cpu: false, sched: false, syscalls: false, gpu: false, memory: false, heap: false };
        MapSizes { stacks: 1, unwind_chunks: 1, families, calls: false, timeline: false, target_set: false }
    }

    /// The maps whose size the run decides, each with its entries (bytes, for a ring buffer).
    pub fn entries(&self) -> Vec<(&'static str, u32)> {
        let on = self.families;
        let used = |used: bool, entries: u32| if used { entries.max(1) } else { 1 };
        let ring = |used: bool, bytes: u32| if used { bytes } else { page_size() };
        // The off-CPU and waker stacks, the calls' and the allocations'.
        let stacks = on.sched || on.heap || self.calls;
        // The syscall programs count every call they see, and the memory family attaches
        // them too (mmap and brk).
        let syscall_programs = on.syscalls || on.memory;
        let unwinding = self.unwind_chunks > 1;
        let cpus = aya::util::nr_cpus().map_or(1, |n| n as u32);
        vec![
            (names::STACKS, used(stacks, self.stacks)),
            (names::STACKS_OVERFLOW, used(stacks, overflow_size(self.stacks))),
            (names::CPU_STACKS, used(on.cpu, self.stacks)),
            (names::CPU_STACKS_OVERFLOW, used(on.cpu, overflow_size(self.stacks))),
            (names::CPU_SAMPLES, used(on.cpu, capacity::CPU_SAMPLES)),
            (names::FAULT_TRACES, used(on.memory, self.stacks)),
            (names::FAULT_TRACES_OVERFLOW, used(on.memory, overflow_size(self.stacks))),
            (names::FAULT_STACKS, used(on.memory, capacity::FAULT_STACKS)),
            (names::FAULT_COUNTS, used(on.memory, capacity::FAULT_COUNTS)),
            (names::FAULT_BASELINES, used(on.memory, capacity::FAULT_BASELINES)),
            (names::ADDRESS_SPACE, used(on.memory, capacity::ADDRESS_SPACE)),
            (names::SYSCALLS, used(syscall_programs, capacity::SYSCALLS)),
            (names::SYSCALL_ERRORS, used(syscall_programs, capacity::SYSCALL_ERRORS)),
            (names::SYSCALLS_BY_NR, used(syscall_programs, capacity::SYSCALL_NUMBERS)),
            (names::THREAD_SCHED, used(on.sched, capacity::THREAD_SCHED)),
            (names::RUNQ_LATENCY, used(on.sched, capacity::RUNQ_LATENCY)),
            (names::OFFCPU, used(on.sched, capacity::OFFCPU)),
            (names::WAKES, used(on.sched, capacity::WAKES)),
            (sysprof_common::signals::SIGNALS, used(on.sched, sysprof_common::signals::CAPACITY)),
            (names::ALLOC_STACKS, used(on.heap, capacity::ALLOC_STACKS)),
            (names::PROCESS_ALLOCS, used(on.heap, capacity::PROCESS_ALLOCS)),
            (names::LIVE_ALLOCS, used(on.heap, capacity::LIVE_ALLOCS)),
            (names::CALLS, used(self.calls, capacity::CALLS)),
            (names::CALL_EVENTS, ring(self.calls, capacity::CALL_EVENTS)),
            (sysprof_common::timeline::EVENTS, ring(self.timeline, sysprof_common::timeline::CAPACITY)),
            (names::TARGETS, if self.target_set { capacity::TARGETS } else { TARGETS_WITHOUT_A_SET }),
            (sysprof_common::unwind::ROWS, self.unwind_chunks.max(1)),
            (sysprof_common::unwind::STACKS, used(unwinding, self.stacks)),
            (
                sysprof_common::unwind::ROW_CACHE,
                used(unwinding, sysprof_common::unwind::ROW_CACHE_SLOTS * cpus),
            ),
            (sysprof_common::unwind::PROCESS_MAPPINGS, used(unwinding, sysprof_common::unwind::PROCESSES)),
        ]
    }
}

/// Entries of a stack map's overflow: a quarter of the map's, as only the stacks whose bucket
/// was taken land there.
pub(crate) fn overflow_size(entries: u32) -> u32 {
    (entries / 4).max(1)
}

/// Chunks of unwind rows in `mib` MiB of kernel memory; 0 when the unwinder is off (or this
/// architecture has none).
pub fn unwind_chunks(mib: u32) -> u32 {
    if !crate::unwind::Unwinder::supported() {
        return 0;
    }
    (u64::from(mib) * 1024 * 1024 / size_of::<sysprof_common::unwind::RowChunk>() as u64) as u32
}

/// The smallest ring buffer: a page.
fn page_size() -> u32 {
    // SAFETY: sysconf has no memory preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(size).ok().filter(|&size| size > 0).unwrap_or(4096)
}

/// About how many bytes of kernel memory the object's maps take with `sizes`, by the kernel's
/// own accounting (`map_mem_usage` of each map type, kernel 6.x): what a load needs before
/// it is tried. The tests hold it to what the kernel reports once loaded.
pub fn estimate(sizes: &MapSizes) -> u64 {
    estimate_object(crate::probes::BPF_OBJECT, &sizes.entries())
}

fn estimate_object(object: &[u8], entries: &[(&str, u32)]) -> u64 {
    let Ok(object) = aya_obj::Object::parse(object) else { return 0 };
    let cpus = aya::util::nr_cpus().map_or(1, |n| n as u64);
    object
        .maps
        .iter()
        .map(|(name, map)| {
            let max_entries = entries
                .iter()
                .find(|(known, _)| known == name)
                .map_or(map.max_entries(), |&(_, entries)| entries);
            map_bytes(map.map_type(), map.map_flags(), map.key_size(), map.value_size(), max_entries, cpus)
        })
        .sum()
}

/// One map's kernel memory, as the kernel accounts it (its `memlock` in fdinfo).
fn map_bytes(map_type: u32, flags: u32, key: u32, value: u32, entries: u32, cpus: u64) -> u64 {
    use aya_obj::generated::bpf_map_type::*;
    let round8 = |n: u32| u64::from(n.div_ceil(8) * 8);
    let entries64 = u64::from(entries);
    let buckets = u64::from(entries.max(1).next_power_of_two());
    // A hash element's header (`struct htab_elem`) and a bucket (lock and list head).
    const HTAB_ELEM: u64 = 48;
    const BUCKET: u64 = 16;
    match map_type {
        t if t == BPF_MAP_TYPE_HASH as u32 || t == BPF_MAP_TYPE_LRU_HASH as u32 => {
            if flags & aya_obj::generated::BPF_F_NO_PREALLOC != 0 {
                // Elements come at insert: only the buckets now.
                buckets * BUCKET
            } else {
                buckets * BUCKET + entries64 * (HTAB_ELEM + round8(key) + round8(value))
            }
        }
        t if t == BPF_MAP_TYPE_PERCPU_HASH as u32 || t == BPF_MAP_TYPE_LRU_PERCPU_HASH as u32 => {
            buckets * BUCKET + entries64 * (HTAB_ELEM + round8(key) + 8 + round8(value) * cpus)
        }
        t if t == BPF_MAP_TYPE_ARRAY as u32 => entries64 * round8(value),
        t if t == BPF_MAP_TYPE_PERCPU_ARRAY as u32 => entries64 * round8(value) * cpus,
        // A bucket pointer each, and each entry's header and frames.
        t if t == BPF_MAP_TYPE_STACK_TRACE as u32 => buckets * 8 + entries64 * (16 + u64::from(value)),
        t if t == BPF_MAP_TYPE_RINGBUF as u32 => entries64,
        t if t == BPF_MAP_TYPE_PROG_ARRAY as u32 => entries64 * 8,
        // Task storage grows with the tasks that use it.
        t if t == BPF_MAP_TYPE_TASK_STORAGE as u32 => 0,
        _ => entries64 * u64::from(key + value),
    }
}

/// The kernel memory of this process's BPF maps and programs, by id, as the kernel accounts
/// it (`memlock` in /proc/self/fdinfo: the memory charged to sysprof's memory cgroup for
/// them), and each map's name.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    maps: BTreeMap<u32, (String, u64)>,
    programs: BTreeMap<u32, u64>,
}

impl Snapshot {
    /// Reads every BPF map and program this process holds a descriptor of.
    pub fn take() -> Self {
        let mut snapshot = Snapshot::default();
        let Ok(entries) = std::fs::read_dir("/proc/self/fdinfo") else { return snapshot };
        for entry in entries.flatten() {
            // Each a few hundred bytes; a descriptor closed meanwhile is skipped.
            let Ok(text) = std::fs::read_to_string(entry.path()) else { continue };
            let field = |name: &str| {
                text.lines()
                    .find_map(|line| line.strip_prefix(name)?.strip_prefix(':')?.trim().parse::<u64>().ok())
            };
            let memlock = field("memlock").unwrap_or(0);
            if let Some(id) = field("map_id").and_then(|id| u32::try_from(id).ok()) {
                snapshot.maps.entry(id).or_insert_with(|| (map_name(id), memlock));
            } else if let Some(id) = field("prog_id").and_then(|id| u32::try_from(id).ok()) {
                snapshot.programs.insert(id, memlock);
            }
        }
        snapshot
    }

    /// Each map and program at the most either snapshot saw: the maps allocated at insert
    /// grow, and the rings are closed before the end.
    pub fn merge(mut self, later: Snapshot) -> Self {
        for (id, (name, bytes)) in later.maps {
            let known = self.maps.entry(id).or_insert((name, 0));
            known.1 = known.1.max(bytes);
        }
        for (id, bytes) in later.programs {
            let known = self.programs.entry(id).or_insert(0);
            *known = (*known).max(bytes);
        }
        self
    }

    pub fn summary(&self) -> KernelMemory {
        let mut largest: Vec<MapMemory> =
            self.maps.values().map(|(name, bytes)| MapMemory { name: name.clone(), bytes: *bytes }).collect();
        largest.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
        largest.truncate(LARGEST);
        KernelMemory {
            map_bytes: self.maps.values().map(|(_, bytes)| bytes).sum(),
            maps: self.maps.len() as u32,
            program_bytes: self.programs.values().sum(),
            programs: self.programs.len() as u32,
            largest,
        }
    }
}

/// Maps named in the report: the few that hold most of it.
const LARGEST: usize = 3;

fn map_name(id: u32) -> String {
    aya::maps::MapInfo::from_id(id)
        .ok()
        .and_then(|info| info.name_as_str().map(String::from))
        .unwrap_or_else(|| format!("map {id}"))
}

/// The kernel memory sysprof's BPF objects held during a trace (see [`Snapshot`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelMemory {
    pub map_bytes: u64,
    pub maps: u32,
    pub program_bytes: u64,
    pub programs: u32,
    /// The maps that hold the most, largest first (the kernel keeps 15 characters of a name).
    pub largest: Vec<MapMemory>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapMemory {
    pub name: String,
    pub bytes: u64,
}

impl KernelMemory {
    pub fn total(&self) -> u64 {
        self.map_bytes + self.program_bytes
    }

    /// "152,344 KiB of kernel memory in its 68 BPF maps and 14 programs (the most: SYSCALLS
    /// 22,528 KiB, ...)".
    pub fn describe(&self) -> String {
        let largest: Vec<String> = self
            .largest
            .iter()
            .map(|map| format!("{} {} KiB", map.name, thousands(map.bytes / 1024)))
            .collect();
        format!(
            "{} KiB of kernel memory in its {} and {}{}",
            thousands(self.total() / 1024),
            crate::report::format::count(u64::from(self.maps), "BPF map", "BPF maps"),
            crate::report::format::count(u64::from(self.programs), "program", "programs"),
            if largest.is_empty() { String::new() } else { format!(" (the most: {})", largest.join(", ")) }
        )
    }
}

/// `bytes` in MiB, rounded up: what a limit must at least allow.
pub fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Focus, Target};

    fn sizes(configure: impl FnOnce(&mut TraceConfig)) -> MapSizes {
        let mut config = TraceConfig::new(Target::All);
        configure(&mut config);
        MapSizes::for_config(&config, false)
    }

    fn entries_of(sizes: &MapSizes, name: &str) -> u32 {
        sizes.entries().iter().find(|(known, _)| *known == name).unwrap().1
    }

    #[test]
    fn the_maps_of_families_not_traced_get_one_entry() {
        let all = sizes(|_| {});
        let cpu = sizes(|config| config.focus = vec![Focus::Cpu]);
        for name in [names::SYSCALLS, names::THREAD_SCHED, names::OFFCPU, names::FAULT_STACKS, names::STACKS]
        {
            assert!(entries_of(&all, name) > 1, "{name}");
            assert_eq!(entries_of(&cpu, name), 1, "{name}");
        }
        assert_eq!(entries_of(&cpu, names::CPU_STACKS), capacity::STACKS);
        assert_eq!(entries_of(&cpu, names::CALL_EVENTS), page_size(), "a ring takes a page at least");
        // The syscall programs run for the memory family too, and count what they see.
        let memory = sizes(|config| config.focus = vec![Focus::Memory]);
        assert_eq!(entries_of(&memory, names::SYSCALLS), capacity::SYSCALLS);
        assert_eq!(entries_of(&memory, names::THREAD_SCHED), 1);
        // An option not asked for.
        assert_eq!(entries_of(&all, names::LIVE_ALLOCS), 1);
        assert_eq!(entries_of(&all, names::ALLOC_STACKS), 1);
        let malloc = sizes(|config| config.malloc = true);
        assert_eq!(entries_of(&malloc, names::ALLOC_STACKS), capacity::ALLOC_STACKS);
        let no_timeline = sizes(|config| config.timeline_events = 0);
        assert_eq!(entries_of(&no_timeline, sysprof_common::timeline::EVENTS), page_size());
        // --func uses the call maps without the GPU family.
        let func = sizes(|config| {
            config.focus = vec![Focus::Cpu];
            config.functions = vec!["/bin/true:main".parse().unwrap()];
        });
        assert_eq!(entries_of(&func, names::CALLS), capacity::CALLS);
    }

    #[test]
    fn the_estimate_follows_the_kernels_accounting() {
        // Figures the kernel reported here (6.18, fdinfo memlock) for maps of each kind.
        let hash = map_bytes(1, 0, 8, 1336, 16384, 2);
        assert_eq!(hash, 16384 * 1408, "SYSCALLS: 22 MiB");
        assert_eq!(map_bytes(7, 0, 4, 1016, 16384, 2), 16384 * 1040, "a stack map: 16.25 MiB");
        assert_eq!(map_bytes(9, 0, 8, 1, 16384, 2), 16384 * 80, "an LRU hash of u64 -> u8");
        assert_eq!(map_bytes(2, 0, 4, 3072, 4096, 2), 12 << 20, "the unwind rows: 12 MiB");
        assert_eq!(map_bytes(1, 1, 8, 1312, 16384, 2), 16384 * 16, "allocated at insert: buckets only");
        // A focused trace needs less than a default one, and the default less than with --malloc.
        let all = estimate(&sizes(|_| {}));
        let cpu = estimate(&sizes(|config| config.focus = vec![Focus::Cpu]));
        let malloc = estimate(&sizes(|config| config.malloc = true));
        if crate::probes::BPF_OBJECT.is_empty() {
            return;
        }
        assert!(cpu < all && all < malloc, "cpu {cpu}, all {all}, malloc {malloc}");
    }
}
