//! The CUDA runtime, CUDA driver and NCCL functions sysprof probes, and how to read each one's
//! arguments. Ids are positions in [`FUNCTIONS`] (plus one): they travel in uprobe cookies.

use sysprof_common::call;

/// Which library exports a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Library {
    /// libcudart (CUDA runtime API), or an executable that links it statically.
    Runtime,
    /// libcuda (CUDA driver API).
    Driver,
    /// libnccl.
    Nccl,
}

impl Library {
    /// File name prefix that identifies the library in a memory map.
    pub fn file_prefix(self) -> &'static str {
        match self {
            Library::Runtime => "libcudart.so",
            Library::Driver => "libcuda.so",
            Library::Nccl => "libnccl.so",
        }
    }

    /// What Part B and the problems call it.
    pub fn label(self) -> &'static str {
        match self {
            Library::Runtime => "CUDA runtime",
            Library::Driver => "CUDA driver",
            Library::Nccl => "NCCL",
        }
    }
}

/// Copy direction, as `cudaMemcpyKind` numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Direction {
    H2H,
    H2D,
    D2H,
    D2D,
    /// Between two devices (cudaMemcpyPeer).
    P2P,
    /// cudaMemcpyDefault with pointers sysprof could not place.
    Unresolved,
}

impl Direction {
    /// A `cudaMemcpyKind` value; 4 (cudaMemcpyDefault) resolves from known allocations.
    pub fn from_kind(kind: u64) -> Option<Direction> {
        match kind {
            0 => Some(Direction::H2H),
            1 => Some(Direction::H2D),
            2 => Some(Direction::D2H),
            3 => Some(Direction::D2D),
            _ => None,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Direction::H2H => "H2H",
            Direction::H2D => "H2D",
            Direction::D2H => "D2H",
            Direction::D2D => "D2D",
            Direction::P2P => "P2P",
            Direction::Unresolved => "default (unresolved)",
        }
    }
}

/// How many bytes a call moves, from its arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bytes {
    /// Argument i.
    Arg(usize),
    /// Argument i times argument j (2D: width x height).
    Product(usize, usize),
    /// Argument i times a fixed element size (cuMemsetD32: elements x 4).
    Elements(usize, u64),
    /// A 3D copy's extent, as the kernel side copied it into the arguments.
    Extent3D,
}

/// How a copy's direction is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectionFrom {
    /// A `cudaMemcpyKind` argument.
    KindArg(usize),
    /// The function says it (cuMemcpyHtoD, cudaMemcpyPeer).
    Fixed(Direction),
    /// Unified addressing: from where the pointers point (cuMemcpy).
    Pointers,
}

/// Memory a function allocates or frees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Pool {
    Device,
    /// Page-locked host memory (cudaMallocHost, cudaHostAlloc, cudaHostRegister).
    PinnedHost,
    /// Unified memory (cudaMallocManaged).
    Managed,
}

/// NCCL collectives and point-to-point operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum NcclOp {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    Send,
    Recv,
}

impl NcclOp {
    /// busbw = algbw x this factor for `ranks` ranks (nccl-tests' definitions).
    pub fn bus_factor(self, ranks: u64) -> f64 {
        let n = ranks.max(1) as f64;
        match self {
            NcclOp::AllReduce => 2.0 * (n - 1.0) / n,
            NcclOp::AllGather | NcclOp::ReduceScatter | NcclOp::AllToAll => (n - 1.0) / n,
            NcclOp::Broadcast | NcclOp::Reduce | NcclOp::Send | NcclOp::Recv => 1.0,
        }
    }
}

/// What a function does, and where its arguments are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Copy {
        dst: usize,
        src: usize,
        bytes: Bytes,
        direction: DirectionFrom,
        asynchronous: bool,
    },
    Memset {
        dst: usize,
        bytes: Bytes,
        asynchronous: bool,
    },
    /// The new allocation is read through argument 0 at return.
    Alloc {
        pool: Pool,
        size: usize,
    },
    /// Pins existing host memory: (pointer, size).
    Register {
        ptr: usize,
        size: usize,
    },
    Free {
        pool: Pool,
        ptr: usize,
    },
    Launch,
    GraphLaunch,
    Sync,
    SetDevice {
        device: usize,
    },
    Collective {
        op: NcclOp,
        count: usize,
        datatype: usize,
        comm: usize,
    },
    NcclGroup,
    /// ncclCommInitRank*: the communicator is read through argument 0; ranks in argument 1.
    NcclCommInit {
        ranks: usize,
    },
}

/// One probed function.
#[derive(Clone, Copy, Debug)]
pub struct Function {
    pub name: &'static str,
    pub library: Library,
    pub kind: Kind,
}

impl Function {
    /// The cookie flags the kernel side needs for this function.
    pub fn flags(&self) -> u64 {
        let reads = self.kind.last_argument_read().filter(|&index| index >= REGISTER_ARGS);
        self.kind_flags() | if reads.is_some() { call::STACK_ARGS } else { 0 }
    }

    fn kind_flags(&self) -> u64 {
        match self.kind {
            Kind::Launch if self.name.contains("ExC") || self.name.ends_with("Ex") => call::DETAIL_ARG1,
            Kind::Launch => call::DETAIL_ARG0,
            Kind::GraphLaunch | Kind::NcclGroup => 0,
            Kind::Alloc { .. } | Kind::NcclCommInit { .. } => call::EVENT | call::OUT_ARG0,
            Kind::Copy { bytes: Bytes::Extent3D, .. } => call::EVENT | call::MEMCPY3D_PARAMS,
            _ => call::EVENT,
        }
    }
}

/// The arguments the kernel side reads at every entry that reads any: those x86-64 passes in
/// registers (`call::STACK_ARGS`).
const REGISTER_ARGS: usize = 6;

impl Kind {
    /// The highest argument the analysis of a call reads from its event (`state.rs`), if any,
    /// as the probed function received it. A 3D copy's are read from its parameters into the
    /// event's slots by the kernel side (`call::MEMCPY3D_PARAMS`), whatever this says.
    fn last_argument_read(&self) -> Option<usize> {
        let bytes = |bytes: Bytes| match bytes {
            Arg(i) | Elements(i, _) => Some(i),
            Product(i, j) => Some(i.max(j)),
            Extent3D => None,
        };
        match *self {
            Copy { bytes: Extent3D, .. } => None,
            Copy { dst, src, bytes: b, direction, .. } => {
                let kind = match direction {
                    KindArg(i) => Some(i),
                    Fixed(_) | Pointers => None,
                };
                [Some(dst), Some(src), bytes(b), kind].into_iter().flatten().max()
            }
            Memset { dst, bytes: b, .. } => bytes(b).map(|b| b.max(dst)),
            Alloc { size, .. } => Some(size),
            Register { ptr, size } => Some(ptr.max(size)),
            Free { ptr, .. } => Some(ptr),
            Launch => Some(1),
            GraphLaunch | Sync | NcclGroup => None,
            SetDevice { device } => Some(device),
            Collective { count, datatype, comm, .. } => Some(count.max(datatype).max(comm)),
            NcclCommInit { ranks } => Some(ranks),
        }
    }
}

use Bytes::*;
use DirectionFrom::*;
use Kind::*;
use Library::*;

const fn copy(dst: usize, src: usize, bytes: Bytes, direction: DirectionFrom, asynchronous: bool) -> Kind {
    Copy { dst, src, bytes, direction, asynchronous }
}

const fn f(name: &'static str, library: Library, kind: Kind) -> Function {
    Function { name, library, kind }
}

/// Every probed function. Per-thread-default-stream variants (`_ptds`, `_ptsz`) are attached
/// under the same id when the library exports them.
pub const FUNCTIONS: &[Function] = &[
    // Runtime: transfers.
    f("cudaMemcpy", Runtime, copy(0, 1, Arg(2), KindArg(3), false)),
    f("cudaMemcpyAsync", Runtime, copy(0, 1, Arg(2), KindArg(3), true)),
    f("cudaMemcpy2D", Runtime, copy(0, 2, Product(4, 5), KindArg(6), false)),
    f("cudaMemcpy2DAsync", Runtime, copy(0, 2, Product(4, 5), KindArg(6), true)),
    f("cudaMemcpy3D", Runtime, copy(6, 1, Extent3D, KindArg(5), false)),
    f("cudaMemcpy3DAsync", Runtime, copy(6, 1, Extent3D, KindArg(5), true)),
    f("cudaMemcpyPeer", Runtime, copy(0, 2, Arg(4), Fixed(Direction::P2P), false)),
    f("cudaMemcpyPeerAsync", Runtime, copy(0, 2, Arg(4), Fixed(Direction::P2P), true)),
    f("cudaMemset", Runtime, Memset { dst: 0, bytes: Arg(2), asynchronous: false }),
    f("cudaMemsetAsync", Runtime, Memset { dst: 0, bytes: Arg(2), asynchronous: true }),
    f("cudaMemset2D", Runtime, Memset { dst: 0, bytes: Product(3, 4), asynchronous: false }),
    f("cudaMemset2DAsync", Runtime, Memset { dst: 0, bytes: Product(3, 4), asynchronous: true }),
    // Runtime: memory.
    f("cudaMalloc", Runtime, Alloc { pool: Pool::Device, size: 1 }),
    f("cudaMallocAsync", Runtime, Alloc { pool: Pool::Device, size: 1 }),
    f("cudaMallocManaged", Runtime, Alloc { pool: Pool::Managed, size: 1 }),
    f("cudaMallocHost", Runtime, Alloc { pool: Pool::PinnedHost, size: 1 }),
    f("cudaHostAlloc", Runtime, Alloc { pool: Pool::PinnedHost, size: 1 }),
    f("cudaHostRegister", Runtime, Register { ptr: 0, size: 1 }),
    f("cudaFree", Runtime, Free { pool: Pool::Device, ptr: 0 }),
    f("cudaFreeAsync", Runtime, Free { pool: Pool::Device, ptr: 0 }),
    f("cudaFreeHost", Runtime, Free { pool: Pool::PinnedHost, ptr: 0 }),
    f("cudaHostUnregister", Runtime, Free { pool: Pool::PinnedHost, ptr: 0 }),
    // Runtime: launches, synchronization, devices.
    f("cudaLaunchKernel", Runtime, Launch),
    f("cudaLaunchKernelExC", Runtime, Launch),
    f("cudaLaunchCooperativeKernel", Runtime, Launch),
    f("cudaGraphLaunch", Runtime, GraphLaunch),
    f("cudaDeviceSynchronize", Runtime, Sync),
    f("cudaStreamSynchronize", Runtime, Sync),
    f("cudaEventSynchronize", Runtime, Sync),
    f("cudaSetDevice", Runtime, SetDevice { device: 0 }),
    // Driver.
    f("cuMemcpy", Driver, copy(0, 1, Arg(2), Pointers, false)),
    f("cuMemcpyAsync", Driver, copy(0, 1, Arg(2), Pointers, true)),
    f("cuMemcpyHtoD_v2", Driver, copy(0, 1, Arg(2), Fixed(Direction::H2D), false)),
    f("cuMemcpyDtoH_v2", Driver, copy(0, 1, Arg(2), Fixed(Direction::D2H), false)),
    f("cuMemcpyDtoD_v2", Driver, copy(0, 1, Arg(2), Fixed(Direction::D2D), false)),
    f("cuMemcpyHtoDAsync_v2", Driver, copy(0, 1, Arg(2), Fixed(Direction::H2D), true)),
    f("cuMemcpyDtoHAsync_v2", Driver, copy(0, 1, Arg(2), Fixed(Direction::D2H), true)),
    f("cuMemcpyDtoDAsync_v2", Driver, copy(0, 1, Arg(2), Fixed(Direction::D2D), true)),
    f("cuMemcpyPeer", Driver, copy(0, 2, Arg(4), Fixed(Direction::P2P), false)),
    f("cuMemcpyPeerAsync", Driver, copy(0, 2, Arg(4), Fixed(Direction::P2P), true)),
    f("cuMemsetD8_v2", Driver, Memset { dst: 0, bytes: Arg(2), asynchronous: false }),
    f("cuMemsetD16_v2", Driver, Memset { dst: 0, bytes: Elements(2, 2), asynchronous: false }),
    f("cuMemsetD32_v2", Driver, Memset { dst: 0, bytes: Elements(2, 4), asynchronous: false }),
    f("cuMemsetD8Async", Driver, Memset { dst: 0, bytes: Arg(2), asynchronous: true }),
    f("cuMemsetD32Async", Driver, Memset { dst: 0, bytes: Elements(2, 4), asynchronous: true }),
    f("cuMemAlloc_v2", Driver, Alloc { pool: Pool::Device, size: 1 }),
    f("cuMemAllocAsync", Driver, Alloc { pool: Pool::Device, size: 1 }),
    f("cuMemAllocManaged", Driver, Alloc { pool: Pool::Managed, size: 1 }),
    f("cuMemAllocHost_v2", Driver, Alloc { pool: Pool::PinnedHost, size: 1 }),
    f("cuMemHostAlloc", Driver, Alloc { pool: Pool::PinnedHost, size: 1 }),
    f("cuMemHostRegister_v2", Driver, Register { ptr: 0, size: 1 }),
    f("cuMemFree_v2", Driver, Free { pool: Pool::Device, ptr: 0 }),
    f("cuMemFreeAsync", Driver, Free { pool: Pool::Device, ptr: 0 }),
    f("cuMemFreeHost", Driver, Free { pool: Pool::PinnedHost, ptr: 0 }),
    f("cuMemHostUnregister", Driver, Free { pool: Pool::PinnedHost, ptr: 0 }),
    f("cuLaunchKernel", Driver, Launch),
    f("cuLaunchKernelEx", Driver, Launch),
    f("cuLaunchCooperativeKernel", Driver, Launch),
    f("cuGraphLaunch", Driver, GraphLaunch),
    f("cuCtxSynchronize", Driver, Sync),
    f("cuStreamSynchronize", Driver, Sync),
    f("cuEventSynchronize", Driver, Sync),
    // NCCL.
    f("ncclAllReduce", Nccl, Collective { op: NcclOp::AllReduce, count: 2, datatype: 3, comm: 5 }),
    f("ncclAllGather", Nccl, Collective { op: NcclOp::AllGather, count: 2, datatype: 3, comm: 4 }),
    f("ncclReduceScatter", Nccl, Collective { op: NcclOp::ReduceScatter, count: 2, datatype: 3, comm: 5 }),
    f("ncclBroadcast", Nccl, Collective { op: NcclOp::Broadcast, count: 2, datatype: 3, comm: 5 }),
    f("ncclBcast", Nccl, Collective { op: NcclOp::Broadcast, count: 1, datatype: 2, comm: 4 }),
    f("ncclReduce", Nccl, Collective { op: NcclOp::Reduce, count: 2, datatype: 3, comm: 6 }),
    f("ncclAllToAll", Nccl, Collective { op: NcclOp::AllToAll, count: 2, datatype: 3, comm: 4 }),
    f("ncclSend", Nccl, Collective { op: NcclOp::Send, count: 1, datatype: 2, comm: 4 }),
    f("ncclRecv", Nccl, Collective { op: NcclOp::Recv, count: 1, datatype: 2, comm: 4 }),
    f("ncclGroupStart", Nccl, NcclGroup),
    f("ncclGroupEnd", Nccl, NcclGroup),
    // ncclUniqueId (128 bytes) is passed in memory, so the rank goes in the third register.
    f("ncclCommInitRank", Nccl, NcclCommInit { ranks: 1 }),
    f("ncclCommInitRankConfig", Nccl, NcclCommInit { ranks: 1 }),
    f("ncclCommInitAll", Nccl, NcclCommInit { ranks: 1 }),
];

/// Suffixes of the per-thread-default-stream variants the runtime exports.
pub const VARIANT_SUFFIXES: [&str; 2] = ["_ptds", "_ptsz"];

/// The id of `FUNCTIONS[index]` (ids start at 1; 0 means none).
pub fn id_of(index: usize) -> u32 {
    index as u32 + 1
}

/// The function with this id.
pub fn by_id(id: u32) -> Option<&'static Function> {
    FUNCTIONS.get((id as usize).checked_sub(1)?)
}

/// Bytes per element of an `ncclDataType_t`.
pub fn nccl_datatype_size(datatype: u64) -> Option<u64> {
    Some(match datatype {
        0 | 1 => 1,   // ncclInt8, ncclUint8
        2 | 3 => 4,   // ncclInt32, ncclUint32
        4 | 5 => 8,   // ncclInt64, ncclUint64
        6 => 2,       // ncclFloat16
        7 => 4,       // ncclFloat32
        8 => 8,       // ncclFloat64
        9 => 2,       // ncclBfloat16
        10 | 11 => 1, // ncclFloat8e4m3, ncclFloat8e5m2
        _ => return None,
    })
}

/// The name of an `ncclDataType_t`.
pub fn nccl_datatype_name(datatype: u64) -> &'static str {
    match datatype {
        0 => "int8",
        1 => "uint8",
        2 => "int32",
        3 => "uint32",
        4 => "int64",
        5 => "uint64",
        6 => "float16",
        7 => "float32",
        8 => "float64",
        9 => "bfloat16",
        10 => "float8e4m3",
        11 => "float8e5m2",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_ids_round_trip() {
        for (index, function) in FUNCTIONS.iter().enumerate() {
            assert_eq!(by_id(id_of(index)).unwrap().name, function.name);
            assert_eq!(FUNCTIONS.iter().filter(|g| g.name == function.name).count(), 1, "{}", function.name);
            assert!(function.name.starts_with(match function.library {
                Runtime => "cuda",
                Driver => "cu",
                Nccl => "nccl",
            }));
        }
        assert!(by_id(0).is_none());
        assert!((FUNCTIONS.len() as u64) < call::ID_MASK);
    }

    #[test]
    fn datatypes_and_bus_factors() {
        assert_eq!(nccl_datatype_size(7), Some(4));
        assert_eq!(nccl_datatype_size(9), Some(2));
        assert_eq!(nccl_datatype_size(99), None);
        assert!((NcclOp::AllReduce.bus_factor(4) - 1.5).abs() < 1e-12);
        assert!((NcclOp::AllGather.bus_factor(4) - 0.75).abs() < 1e-12);
        assert_eq!(NcclOp::Broadcast.bus_factor(8), 1.0);
    }

    #[test]
    fn launches_key_by_the_kernel_and_allocations_read_their_result() {
        let flags = |name: &str| FUNCTIONS.iter().find(|f| f.name == name).unwrap().flags();
        assert_eq!(flags("cudaLaunchKernel"), call::DETAIL_ARG0);
        assert_eq!(flags("cudaLaunchKernelExC"), call::DETAIL_ARG1);
        assert_eq!(flags("cudaMalloc"), call::EVENT | call::OUT_ARG0);
        assert_eq!(flags("cudaMemcpy3D"), call::EVENT | call::MEMCPY3D_PARAMS);
        assert_eq!(flags("ncclGroupStart"), 0);
        assert_eq!(flags("cudaStreamSynchronize"), call::EVENT);
    }

    #[test]
    fn only_calls_whose_analysis_reads_the_stack_arguments_read_them() {
        let flags = |name: &str| FUNCTIONS.iter().find(|f| f.name == name).unwrap().flags();
        // The kind of a 2D copy is its seventh argument; ncclReduce's communicator too.
        assert_eq!(flags("cudaMemcpy2D"), call::EVENT | call::STACK_ARGS);
        assert_eq!(flags("cudaMemcpy2DAsync"), call::EVENT | call::STACK_ARGS);
        assert_eq!(flags("ncclReduce"), call::EVENT | call::STACK_ARGS);
        // The rest: a 3D copy's fields are read from its parameters, not its arguments.
        assert_eq!(flags("cudaMemcpy"), call::EVENT);
        assert_eq!(flags("cudaMemcpy3D"), call::EVENT | call::MEMCPY3D_PARAMS);
        assert_eq!(flags("ncclAllReduce"), call::EVENT);
        let stack = FUNCTIONS.iter().filter(|f| f.flags() & call::STACK_ARGS != 0).count();
        assert_eq!(stack, 3);
    }
}
