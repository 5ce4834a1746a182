//! Data on both the CPU and the GPU: from the traced host-to-device copies, the host ranges
//! that were copied to a device and stayed allocated on the host while their device copy
//! lived, and the ranges copied again and again.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use sysprof_common::{LiveAlloc, LiveKey};

use crate::{callsites::Names, gpu::state::GpuState};

/// Rows kept in the report.
const RANGES: usize = 50;

/// What says the host side of a copy was still allocated at the end (or at its process's exit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostEvidence {
    /// A page-locked allocation (cudaMallocHost, cudaHostAlloc, cudaHostRegister) not freed.
    PinnedAllocation,
    /// A heap block (`--malloc`) not freed.
    HeapBlock,
    /// Not traced as an allocation, but its address was still mapped: likely still allocated
    /// (large blocks are unmapped when freed; small ones may be free inside the heap).
    StillMapped,
    /// Its address was no longer mapped at the end.
    Released,
    /// Pageable memory of a process that exited before the end: its maps cannot be read.
    Unknown,
}

impl HostEvidence {
    pub fn is_allocated(self) -> bool {
        matches!(self, HostEvidence::PinnedAllocation | HostEvidence::HeapBlock | HostEvidence::StillMapped)
    }

    pub fn describe(self) -> &'static str {
        match self {
            HostEvidence::PinnedAllocation => "pinned allocation not freed",
            HostEvidence::HeapBlock => "heap block not freed",
            HostEvidence::StillMapped => "still mapped (likely allocated)",
            HostEvidence::Released => "unmapped",
            HostEvidence::Unknown => "unknown (process exited; --malloc would tell)",
        }
    }
}

/// One host range copied to a GPU.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CopiedRange {
    pub pid: u32,
    pub host: u64,
    pub bytes: u64,
    pub copies: u64,
    /// The device the last copy went to, when its allocation is known.
    pub device: Option<i32>,
    /// Whether the device copy was still allocated at the end.
    pub device_allocated: bool,
    pub host_evidence: HostEvidence,
    /// Held on both the CPU and a GPU at the end.
    pub on_both_sides: bool,
    /// Bytes moved again from a range already copied.
    pub recopied: u64,
    /// The code that made the copies.
    pub call_site: String,
}

/// Heap blocks still live per process, by start address.
pub struct LiveBlocks(HashMap<u32, BTreeMap<u64, u64>>);

impl LiveBlocks {
    pub fn new(live: &[(LiveKey, LiveAlloc)]) -> Self {
        let mut blocks: HashMap<u32, BTreeMap<u64, u64>> = HashMap::new();
        for (key, block) in live {
            blocks.entry(key.tgid).or_default().insert(key.ptr, block.size);
        }
        LiveBlocks(blocks)
    }

    /// Whether `[addr, addr + len)` lies in a block still live.
    fn contains(&self, pid: u32, addr: u64, len: u64) -> bool {
        self.0
            .get(&pid)
            .and_then(|blocks| blocks.range(..=addr).next_back())
            .is_some_and(|(start, size)| addr + len <= start + size)
    }
}

/// The host ranges copied to a device, largest traffic first.
pub fn copied_ranges(gpu: &GpuState, heap: Option<&LiveBlocks>, names: &dyn Names) -> Vec<CopiedRange> {
    struct Copies {
        count: u64,
        last_device_address: u64,
        stack: i32,
        caller: u64,
        at_ns: u64,
    }
    let mut ranges: BTreeMap<(u32, u64, u64), Copies> = BTreeMap::new();
    for copy in &gpu.h2d {
        let entry = ranges.entry((copy.tgid, copy.host, copy.bytes)).or_insert(Copies {
            count: 0,
            last_device_address: 0,
            stack: copy.user_stack_id,
            caller: copy.caller,
            at_ns: copy.at_ns,
        });
        entry.count += 1;
        entry.last_device_address = copy.device;
    }
    let mut data_maps = DataMaps::default();
    let mut rows: Vec<CopiedRange> = ranges
        .into_iter()
        .map(|((pid, host, bytes), copies)| {
            let device = gpu.device_allocation(pid, copies.last_device_address).map(|a| a.device);
            let host_evidence = host_evidence(gpu, heap, &mut data_maps, pid, host, bytes);
            CopiedRange {
                pid,
                host,
                bytes,
                copies: copies.count,
                device,
                device_allocated: device.is_some(),
                host_evidence,
                on_both_sides: device.is_some() && host_evidence.is_allocated(),
                recopied: bytes * copies.count.saturating_sub(1),
                call_site: names.call_site(
                    pid,
                    crate::procs::ImageOf::At(copies.at_ns),
                    copies.stack,
                    copies.caller,
                ),
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        (b.bytes * b.copies).cmp(&(a.bytes * a.copies)).then(a.pid.cmp(&b.pid)).then(a.host.cmp(&b.host))
    });
    rows.truncate(RANGES);
    rows
}

fn host_evidence(
    gpu: &GpuState,
    heap: Option<&LiveBlocks>,
    data_maps: &mut DataMaps,
    pid: u32,
    host: u64,
    bytes: u64,
) -> HostEvidence {
    if gpu.host_pinned_live(pid, host) {
        return HostEvidence::PinnedAllocation;
    }
    if heap.is_some_and(|heap| heap.contains(pid, host, bytes)) {
        return HostEvidence::HeapBlock;
    }
    match data_maps.is_mapped(pid, host) {
        Some(true) => HostEvidence::StillMapped,
        Some(false) => HostEvidence::Released,
        None => HostEvidence::Unknown,
    }
}

/// Every mapping of each process still alive, read once (after the trace).
#[derive(Default)]
struct DataMaps(HashMap<u32, Option<Vec<(u64, u64)>>>);

impl DataMaps {
    /// Whether `addr` is mapped in `pid`; `None` when the process is gone.
    fn is_mapped(&mut self, pid: u32, addr: u64) -> Option<bool> {
        let ranges = self.0.entry(pid).or_insert_with(|| {
            let maps = procfs::process::Process::new(pid as i32).ok()?.maps().ok()?;
            Some(maps.iter().map(|map| map.address).collect())
        });
        ranges.as_ref().map(|ranges| ranges.iter().any(|&(start, end)| (start..end).contains(&addr)))
    }
}
