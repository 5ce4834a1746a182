//! What the CUDA and NCCL call events say, accumulated as they arrive: live allocations per
//! device, pinned host ranges, each thread's current device, transfers by direction and NCCL
//! operations by kind. Order matters here (an allocation before the copy that uses it), which is
//! why these calls are events rather than kernel-side counts.

use std::collections::{BTreeMap, HashMap};

use hdrhistogram::Histogram;
use sysprof_common::{CallEvent, call::memcpy3d};

use super::functions::{self, Bytes, Direction, DirectionFrom, Kind, NcclOp, Pool};

/// One allocation still live.
#[derive(Clone, Debug)]
pub struct Allocation {
    pub size: u64,
    pub pool: Pool,
    pub device: i32,
    pub user_stack_id: i32,
    pub caller: u64,
    /// When it was made (its call's start): which image of its process the stack is of.
    pub at_ns: u64,
}

/// Allocations of one pool on one device.
#[derive(Clone, Debug)]
pub struct PoolStats {
    pub current: u64,
    pub peak: u64,
    pub allocations: u64,
    pub frees: u64,
    pub failed: u64,
    pub sizes: Histogram<u64>,
}

impl Default for PoolStats {
    fn default() -> Self {
        PoolStats { current: 0, peak: 0, allocations: 0, frees: 0, failed: 0, sizes: histogram() }
    }
}

/// Transfers of one kind (a direction, or memset).
#[derive(Clone, Debug)]
pub struct TransferStats {
    pub calls: u64,
    pub errors: u64,
    /// Bytes the calls asked to move (failed calls included: they are what the program did).
    pub bytes: u64,
    pub sizes: Histogram<u64>,
    pub latency: Histogram<u64>,
    /// Successful synchronous calls: their bytes and time give the achieved bandwidth.
    pub sync_bytes: u64,
    pub sync_ns: u64,
    /// Host side of H2D/D2H copies: page-locked or pageable.
    pub pinned: u64,
    pub pageable: u64,
    pub first_ns: u64,
    pub last_ns: u64,
}

impl Default for TransferStats {
    fn default() -> Self {
        TransferStats {
            calls: 0,
            errors: 0,
            bytes: 0,
            sizes: histogram(),
            latency: histogram(),
            sync_bytes: 0,
            sync_ns: 0,
            pinned: 0,
            pageable: 0,
            first_ns: u64::MAX,
            last_ns: 0,
        }
    }
}

/// Calls of one NCCL operation.
#[derive(Clone, Debug)]
pub struct NcclStats {
    pub calls: u64,
    pub errors: u64,
    pub bytes: u64,
    pub sizes: Histogram<u64>,
    /// Host-side call time: NCCL enqueues the work and returns.
    pub latency: Histogram<u64>,
    /// Data types seen.
    pub datatypes: BTreeMap<&'static str, u64>,
    /// Completed operations (the thread's next synchronize returned): bytes, seconds, ranks.
    pub completed: Vec<(u64, f64, u64)>,
}

impl Default for NcclStats {
    fn default() -> Self {
        NcclStats {
            calls: 0,
            errors: 0,
            bytes: 0,
            sizes: histogram(),
            latency: histogram(),
            datatypes: BTreeMap::new(),
            completed: Vec::new(),
        }
    }
}

/// One host-to-device copy, kept for the memory analysis (data on both sides).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostToDevice {
    pub tgid: u32,
    pub host: u64,
    pub device: u64,
    pub bytes: u64,
    pub user_stack_id: i32,
    pub caller: u64,
    pub at_ns: u64,
}

/// Most H2D copies remembered for the redundancy analysis.
const MAX_H2D_LOG: usize = 200_000;

/// Everything the events said.
#[derive(Debug, Default)]
pub struct GpuState {
    pub events: u64,
    live: BTreeMap<(u32, u64), Allocation>,
    pub pools: BTreeMap<(Pool, i32), PoolStats>,
    /// Page-locked host ranges: (process, start) -> end.
    pinned: BTreeMap<(u32, u64), u64>,
    thread_device: HashMap<u32, i32>,
    pub transfers: BTreeMap<String, TransferStats>,
    pub nccl: BTreeMap<NcclOp, NcclStats>,
    /// Communicator -> ranks, from ncclCommInitRank.
    comms: HashMap<(u32, u64), u64>,
    /// NCCL operations a thread issued since its last synchronize: op, bytes, start, ranks.
    pending_nccl: HashMap<u32, Vec<(NcclOp, u64, u64, u64)>>,
    pub h2d: Vec<HostToDevice>,
    pub h2d_dropped: u64,
    /// Device ids seen (cudaSetDevice and allocations).
    pub devices_seen: BTreeMap<i32, u64>,
    /// Return codes of the calls with events: function id -> code -> calls.
    pub return_codes: BTreeMap<u32, BTreeMap<i32, u64>>,
    /// The calls with events, one by one, for the timeline (at most [`MAX_SLICES`]).
    pub slices: Vec<GpuSlice>,
    pub slices_dropped: u64,
}

/// Most calls kept one by one for the timeline.
const MAX_SLICES: usize = 200_000;

/// One call with an event, as the timeline shows it.
#[derive(Clone, Debug)]
pub struct GpuSlice {
    pub tgid: u32,
    pub tid: u32,
    pub func: u32,
    pub start_ns: u64,
    pub duration_ns: u64,
    pub user_stack_id: i32,
    pub caller: u64,
    /// What it moved or allocated, and how: a copy's direction, a collective's operation.
    pub bytes: Option<u64>,
    pub what: Option<&'static str>,
    pub failed: bool,
}

/// Label of memset rows in the transfer table.
pub const MEMSET: &str = "memset";

impl GpuState {
    /// The state as the events of a saved read-out build it.
    pub fn replay(events: &[crate::record::reader::Bytes]) -> anyhow::Result<Self> {
        let mut state = GpuState::default();
        for event in events {
            state.on_event(&event.decode()?);
        }
        Ok(state)
    }

    pub fn on_event(&mut self, event: &CallEvent) {
        let Some(function) = functions::by_id(event.func) else { return };
        self.events += 1;
        let ok = event.ret as u32 == 0;
        *self.return_codes.entry(event.func).or_default().entry(event.ret as i32).or_default() += 1;
        let arg = |i: usize| event.args[i];
        // What the timeline says of the call beside its name and time.
        let mut note: (Option<u64>, Option<&'static str>) = (None, None);
        match function.kind {
            Kind::SetDevice { device } => {
                if ok {
                    let device = arg(device) as i32;
                    self.thread_device.insert(event.tid, device);
                    *self.devices_seen.entry(device).or_default() += 1;
                }
            }
            Kind::Alloc { pool, size } => {
                note = (Some(arg(size)), None);
                self.allocate(event, pool, arg(size), ok);
            }
            Kind::Register { ptr, size } => {
                if ok {
                    self.pinned.insert((event.tgid, arg(ptr)), arg(ptr) + arg(size));
                }
            }
            Kind::Free { pool, ptr } => self.free(event, pool, arg(ptr), ok),
            Kind::Copy { dst, src, bytes, direction, asynchronous } => {
                let bytes = bytes_of(event, bytes);
                let direction = match direction {
                    DirectionFrom::KindArg(i) => Direction::from_kind(arg(i))
                        .unwrap_or_else(|| self.place(event.tgid, arg(dst), arg(src))),
                    DirectionFrom::Fixed(direction) => direction,
                    DirectionFrom::Pointers => self.place(event.tgid, arg(dst), arg(src)),
                };
                let host = match direction {
                    Direction::H2D => Some(arg(src)),
                    Direction::D2H => Some(arg(dst)),
                    _ => None,
                };
                let pinned = host.map(|host| self.is_pinned(event.tgid, host));
                note = (Some(bytes), Some(direction.label()));
                self.transfer(direction.label(), event, bytes, asynchronous, pinned, ok);
                if direction == Direction::H2D && ok {
                    if self.h2d.len() < MAX_H2D_LOG {
                        self.h2d.push(HostToDevice {
                            tgid: event.tgid,
                            host: arg(src),
                            device: arg(dst),
                            bytes,
                            user_stack_id: event.user_stack_id,
                            caller: event.caller,
                            at_ns: event.start_ns,
                        });
                    } else {
                        self.h2d_dropped += 1;
                    }
                }
            }
            Kind::Memset { bytes, asynchronous, .. } => {
                let bytes = bytes_of(event, bytes);
                note = (Some(bytes), None);
                self.transfer(MEMSET, event, bytes, asynchronous, None, ok);
            }
            Kind::Collective { op, count, datatype, comm } => {
                let stats = self.nccl.entry(op).or_default();
                let element = functions::nccl_datatype_size(arg(datatype)).unwrap_or(1);
                let bytes = arg(count) * element;
                note = (Some(bytes), None);
                stats.calls += 1;
                stats.errors += u64::from(!ok);
                stats.bytes += bytes;
                record(&mut stats.sizes, bytes);
                record(&mut stats.latency, event.duration_ns);
                *stats.datatypes.entry(functions::nccl_datatype_name(arg(datatype))).or_default() += 1;
                if ok {
                    let ranks = self.comms.get(&(event.tgid, arg(comm))).copied().unwrap_or(1);
                    self.pending_nccl.entry(event.tid).or_default().push((op, bytes, event.start_ns, ranks));
                }
            }
            Kind::NcclCommInit { ranks } => {
                if ok && event.out != 0 {
                    self.comms.insert((event.tgid, event.out), arg(ranks));
                }
            }
            Kind::Sync => {
                // NCCL work the thread enqueued is done when its synchronize returns.
                if let Some(pending) = self.pending_nccl.remove(&event.tid)
                    && ok
                {
                    let end = event.start_ns + event.duration_ns;
                    for (op, bytes, start, ranks) in pending {
                        let seconds = end.saturating_sub(start) as f64 / 1e9;
                        self.nccl.entry(op).or_default().completed.push((bytes, seconds, ranks));
                    }
                }
            }
            Kind::Launch | Kind::GraphLaunch | Kind::NcclGroup => {}
        }
        if self.slices.len() < MAX_SLICES {
            self.slices.push(GpuSlice {
                tgid: event.tgid,
                tid: event.tid,
                func: event.func,
                start_ns: event.start_ns,
                duration_ns: event.duration_ns,
                user_stack_id: event.user_stack_id,
                caller: event.caller,
                bytes: note.0,
                what: note.1,
                failed: !ok,
            });
        } else {
            self.slices_dropped += 1;
        }
    }

    fn allocate(&mut self, event: &CallEvent, pool: Pool, size: u64, ok: bool) {
        let device = if pool == Pool::PinnedHost { -1 } else { self.device_of(event.tid) };
        let stats = self.pools.entry((pool, device)).or_default();
        if !ok || event.out == 0 {
            stats.failed += 1;
            return;
        }
        stats.allocations += 1;
        stats.current += size;
        stats.peak = stats.peak.max(stats.current);
        record(&mut stats.sizes, size);
        if device >= 0 {
            *self.devices_seen.entry(device).or_default() += 1;
        }
        if pool == Pool::PinnedHost {
            self.pinned.insert((event.tgid, event.out), event.out + size);
        }
        self.live.insert(
            (event.tgid, event.out),
            Allocation {
                size,
                pool,
                device,
                user_stack_id: event.user_stack_id,
                caller: event.caller,
                at_ns: event.start_ns,
            },
        );
    }

    fn free(&mut self, event: &CallEvent, pool: Pool, ptr: u64, ok: bool) {
        if !ok || ptr == 0 {
            return;
        }
        if pool == Pool::PinnedHost {
            self.pinned.remove(&(event.tgid, ptr));
        }
        // Freed by a call of the other pool's family (cudaFree on managed memory): the live
        // entry says what it was.
        if let Some(allocation) = self.live.remove(&(event.tgid, ptr)) {
            let stats = self.pools.entry((allocation.pool, allocation.device)).or_default();
            stats.frees += 1;
            stats.current = stats.current.saturating_sub(allocation.size);
        }
    }

    fn transfer(
        &mut self,
        label: &str,
        event: &CallEvent,
        bytes: u64,
        asynchronous: bool,
        pinned: Option<bool>,
        ok: bool,
    ) {
        let stats = self.transfers.entry(label.to_string()).or_default();
        stats.calls += 1;
        stats.errors += u64::from(!ok);
        stats.bytes += bytes;
        record(&mut stats.sizes, bytes);
        record(&mut stats.latency, event.duration_ns);
        stats.first_ns = stats.first_ns.min(event.start_ns);
        stats.last_ns = stats.last_ns.max(event.start_ns + event.duration_ns);
        match pinned {
            Some(true) => stats.pinned += 1,
            Some(false) => stats.pageable += 1,
            None => {}
        }
        if ok && !asynchronous {
            stats.sync_bytes += bytes;
            stats.sync_ns += event.duration_ns;
        }
    }

    /// The current device of a thread (cudaSetDevice), 0 until it sets one.
    fn device_of(&self, tid: u32) -> i32 {
        self.thread_device.get(&tid).copied().unwrap_or(0)
    }

    fn live_containing(&self, tgid: u32, addr: u64) -> Option<&Allocation> {
        let ((owner, start), allocation) = self.live.range(..=(tgid, addr)).next_back()?;
        (*owner == tgid && addr < start + allocation.size).then_some(allocation)
    }

    fn is_pinned(&self, tgid: u32, addr: u64) -> bool {
        self.pinned
            .range(..=(tgid, addr))
            .next_back()
            .is_some_and(|((owner, _), end)| *owner == tgid && addr < *end)
    }

    fn on_device(&self, tgid: u32, addr: u64) -> Option<bool> {
        self.live_containing(tgid, addr).map(|a| matches!(a.pool, Pool::Device | Pool::Managed))
    }

    /// A copy's direction from where its pointers point (cudaMemcpyDefault, cuMemcpy).
    fn place(&self, tgid: u32, dst: u64, src: u64) -> Direction {
        let side = |addr: u64| match self.on_device(tgid, addr) {
            Some(device) => Some(device),
            None if self.is_pinned(tgid, addr) => Some(false),
            None => None,
        };
        match (side(dst), side(src)) {
            (Some(true), Some(true)) => Direction::D2D,
            (Some(true), _) => Direction::H2D,
            (_, Some(true)) => Direction::D2H,
            (Some(false), Some(false)) => Direction::H2H,
            _ => Direction::Unresolved,
        }
    }

    /// The device (or managed) allocation still live that holds `addr`.
    pub fn device_allocation(&self, tgid: u32, addr: u64) -> Option<&Allocation> {
        self.live_containing(tgid, addr).filter(|a| matches!(a.pool, Pool::Device | Pool::Managed))
    }

    /// Whether `addr` lies in page-locked host memory not freed.
    pub fn host_pinned_live(&self, tgid: u32, addr: u64) -> bool {
        self.is_pinned(tgid, addr)
    }

    /// Allocations never freed, for the leak table.
    pub fn live(&self) -> impl Iterator<Item = (&(u32, u64), &Allocation)> {
        self.live.iter()
    }
}

fn bytes_of(event: &CallEvent, bytes: Bytes) -> u64 {
    let arg = |i: usize| event.args[i];
    match bytes {
        Bytes::Arg(i) => arg(i),
        Bytes::Product(i, j) => arg(i).saturating_mul(arg(j)),
        Bytes::Elements(i, size) => arg(i).saturating_mul(size),
        Bytes::Extent3D => {
            arg(memcpy3d::WIDTH).saturating_mul(arg(memcpy3d::HEIGHT)).saturating_mul(arg(memcpy3d::DEPTH))
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant figures is a valid precision")
}

fn record(histogram: &mut Histogram<u64>, value: u64) {
    // Auto-resizing: a new maximum grows the histogram rather than failing.
    let _ = histogram.record(value.max(1));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::functions::FUNCTIONS;

    fn id(name: &str) -> u32 {
        functions::id_of(FUNCTIONS.iter().position(|f| f.name == name).unwrap())
    }

    fn event(name: &str, args: &[u64], ret: i64, out: u64) -> CallEvent {
        let mut all = [0u64; 8];
        all[..args.len()].copy_from_slice(args);
        CallEvent {
            func: id(name),
            tgid: 10,
            tid: 11,
            user_stack_id: -1,
            start_ns: 1_000,
            duration_ns: 1_000_000,
            ret,
            args: all,
            out,
            caller: 0,
        }
    }

    #[test]
    fn allocations_per_device_with_peak_and_leaks() {
        let mut state = GpuState::default();
        state.on_event(&event("cudaSetDevice", &[1], 0, 0));
        state.on_event(&event("cudaMalloc", &[0x1000, 4096], 0, 0xd000));
        state.on_event(&event("cudaMalloc", &[0x1000, 1024], 0, 0xe000));
        state.on_event(&event("cudaFree", &[0xd000], 0, 0));
        state.on_event(&event("cudaMalloc", &[0x1000, 1 << 40], 2, 0));
        let stats = &state.pools[&(Pool::Device, 1)];
        assert_eq!(
            (stats.current, stats.peak, stats.allocations, stats.frees, stats.failed),
            (1024, 5120, 2, 1, 1)
        );
        let leaks: Vec<_> = state.live().collect();
        assert_eq!(leaks.len(), 1);
        assert_eq!(*leaks[0].0, (10, 0xe000));
    }

    #[test]
    fn copy_directions_sizes_and_pinned_host_memory() {
        let mut state = GpuState::default();
        state.on_event(&event("cudaMallocHost", &[0x1000, 8192], 0, 0x5000));
        state.on_event(&event("cudaMalloc", &[0x1000, 1 << 20], 0, 0xd0000));
        // Pinned source, pageable source, then kind Default resolved from the allocations.
        state.on_event(&event("cudaMemcpy", &[0xd0000, 0x5000, 4096, 1], 0, 0));
        state.on_event(&event("cudaMemcpy", &[0xd0000, 0x99000, 2048, 1], 0, 0));
        state.on_event(&event("cudaMemcpy", &[0x5000, 0xd0000, 100, 4], 0, 0));
        state.on_event(&event("cudaMemcpy2D", &[0xd0000, 64, 0x5000, 64, 64, 32, 1], 0, 0));
        let h2d = &state.transfers["H2D"];
        assert_eq!((h2d.calls, h2d.bytes, h2d.pinned, h2d.pageable), (3, 4096 + 2048 + 64 * 32, 2, 1));
        assert_eq!(h2d.sync_bytes, h2d.bytes);
        assert_eq!(state.transfers["D2H"].bytes, 100);
        assert_eq!(state.h2d.len(), 3);
    }

    #[test]
    fn failed_calls_still_count_what_they_asked_for() {
        let mut state = GpuState::default();
        state.on_event(&event("cudaMemcpyAsync", &[1, 2, 1000, 3, 0], 35, 0));
        let d2d = &state.transfers["D2D"];
        assert_eq!((d2d.calls, d2d.errors, d2d.bytes, d2d.sync_bytes), (1, 1, 1000, 0));
    }

    #[test]
    fn nccl_bytes_from_count_and_datatype_and_completion_at_sync() {
        let mut state = GpuState::default();
        state.on_event(&event("ncclCommInitRank", &[0x100, 4, 0], 0, 0xc0));
        // 1024 float32 on a 4-rank communicator, then a synchronize 1 ms later.
        state.on_event(&event("ncclAllReduce", &[1, 2, 1024, 7, 0, 0xc0, 0], 0, 0));
        state.on_event(&event("cudaStreamSynchronize", &[0], 0, 0));
        let stats = &state.nccl[&NcclOp::AllReduce];
        assert_eq!((stats.calls, stats.bytes), (1, 4096));
        assert_eq!(stats.datatypes["float32"], 1);
        assert_eq!(stats.completed.len(), 1);
        assert_eq!(stats.completed[0].2, 4);
    }
}
