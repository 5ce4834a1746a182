//! The floor under what tracing costs other processes: empty BPF programs (`return 0`, two
//! instructions) attached where sysprof's run for every process on the machine, as BTF
//! tracepoints like sysprof's, and on every CPU's page-fault events at sysprof's periods.
//! Whatever a program there does, other processes' events cost at least this much: the slow
//! path a syscall takes once the syscall tracepoints are on, the kernel's call of each program,
//! and each fault's count in the CPU's event (and a program's call for 1 in 256). sysprof's
//! figure minus this one is what its own code adds, and this one over bpftrace's is the lowest
//! ratio any program on these tracepoints could reach.
//!
//! The same holds for probed functions: empty programs on sysprof's uprobes measure the trap
//! each probed call and return takes (`cargo xtask empty-programs`, which the uprobe and heap
//! benchmarks run as a tool of their own), the cost no uprobe tool goes under; and for the
//! target's own syscalls, empty programs on the syscall tracepoints (the syscalls benchmark).
//!
//! And for sampling: an empty program on a CPU-clock event on every CPU at the frequency
//! sysprof samples at, as its CPU family opens them. What that costs a CPU-bound program is
//! the sample's interrupt (in a VM, the hypervisor's timer), which every sampling profiler
//! pays and no program there changes (`--sample-hz`).
//!
//! The programs are built and loaded here with the bare `bpf(2)` calls, not from an object: two
//! instructions need no compiler, and the bench needs nothing of sysprof's to measure under it.

use std::os::fd::{FromRawFd as _, OwnedFd};

use anyhow::{Context as _, bail};

/// The tracepoints every process's events run sysprof's programs on (`--pid` of another
/// process, default families): a syscall's entry and exit, a context switch, a wake-up.
pub(super) const SHARED_TRACEPOINTS: [&str; 4] = ["sys_enter", "sys_exit", "sched_switch", "sched_waking"];

/// Empty programs attached to tracepoints, and fault events; dropping this detaches and
/// unloads them.
pub(super) struct EmptyPrograms {
    /// Each program's fd and its attachment's, and the events'.
    _fds: Vec<OwnedFd>,
}

const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_int = 17;
const BPF_PROG_TYPE_KPROBE: u32 = 2;
const BPF_PROG_TYPE_TRACING: u32 = 26;
const BPF_TRACE_RAW_TP: u32 = 23;
const BPF_LINK_CREATE: libc::c_int = 28;
const BPF_TRACE_UPROBE_MULTI: u32 = 48;
/// `link_create.uprobe_multi.flags`: the probes are on the functions' returns.
const BPF_F_UPROBE_MULTI_RETURN: u32 = 1;

/// The head of `union bpf_attr` for `BPF_PROG_LOAD`, up to `attach_btf_id`; the kernel takes
/// the size it is given and zeroes the rest.
#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
    line_info_rec_size: u32,
    line_info: u64,
    line_info_cnt: u32,
    attach_btf_id: u32,
}

/// `union bpf_attr` for `BPF_RAW_TRACEPOINT_OPEN` (no name: a BTF tracepoint's program knows
/// its tracepoint).
#[repr(C)]
#[derive(Default)]
struct RawTracepointOpen {
    name: u64,
    prog_fd: u32,
    _pad: u32,
}

/// `union bpf_attr` for `BPF_LINK_CREATE` of a multi-uprobe link, for every process (pid 0).
#[repr(C)]
#[derive(Default)]
struct UprobeMultiLink {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    _pad: u32,
}

/// `r0 = 0; exit`.
const EMPTY: [u64; 2] = [0xb7, 0x95];

impl EmptyPrograms {
    /// Loads an empty program for each of `tracepoints` (names as in `btf_trace_<name>`) and
    /// attaches it, and one on each online CPU's minor and major page-fault events, run as
    /// sysprof's fault family runs its own for `--pid` (1 minor fault in 256, every major one).
    pub(super) fn attach(tracepoints: &[&str]) -> anyhow::Result<Self> {
        let mut fds = on_tracepoints(tracepoints)?;
        fds.extend(fault_events().context("opening the page-fault events")?);
        Ok(EmptyPrograms { _fds: fds })
    }
}

/// An empty program loaded and attached on each of `tracepoints` (names as in
/// `btf_trace_<name>`): each program's fd and its attachment's.
fn on_tracepoints<S: AsRef<str>>(tracepoints: &[S]) -> anyhow::Result<Vec<OwnedFd>> {
    let mut fds = Vec::new();
    if tracepoints.is_empty() {
        return Ok(fds);
    }
    let btf = btf_rs::Btf::from_file("/sys/kernel/btf/vmlinux").context("reading the kernel's BTF")?;
    for name in tracepoints.iter().map(AsRef::as_ref) {
        let typedef = format!("btf_trace_{name}");
        let id = btf
            .resolve_ids_by_name(&typedef)
            .ok()
            .and_then(|ids| ids.first().copied())
            .with_context(|| format!("no {typedef} in the kernel's BTF"))?;
        let program = load(id).with_context(|| format!("loading an empty program for {name}"))?;
        let link = attach(&program).with_context(|| format!("attaching the empty program to {name}"))?;
        fds.push(program);
        fds.push(link);
    }
    Ok(fds)
}

/// Runs `command` (its output and status its own) with empty programs on the entries of
/// `entries` and the returns of `returns`, each `PATH:SYMBOL`, on `tracepoints`, and on a
/// CPU-clock event at `sample_hz` on every CPU; they are detached as it ends.
pub(crate) fn run_with_empty_programs(
    entries: &[String],
    returns: &[String],
    tracepoints: &[String],
    sample_hz: Option<u64>,
    command: &[String],
) -> anyhow::Result<()> {
    let attached = on_tracepoints(tracepoints)?;
    let sampling = match sample_hz {
        Some(hz) => sampling_events(hz)?,
        None => Vec::new(),
    };
    let mut points = Vec::new();
    for (spec, is_return) in entries.iter().map(|e| (e, false)).chain(returns.iter().map(|r| (r, true))) {
        let (path, symbol) =
            spec.rsplit_once(':').with_context(|| format!("{spec}: expected PATH:SYMBOL"))?;
        points.push((path, file_offset(path, symbol)?, is_return));
    }
    // The kind of attachment sysprof makes: multi-uprobe links where the kernel has them.
    let events = match multi_uprobe_links(&points) {
        Ok(links) => links,
        Err(_) => perf_event_uprobes(&points)?,
    };
    let (program_name, arguments) = command.split_first().context("no command to run")?;
    let status = std::process::Command::new(program_name).args(arguments).status()?;
    drop(events);
    drop(sampling);
    drop(attached);
    if !status.success() {
        bail!("{program_name} ended with {status}");
    }
    Ok(())
}

/// An empty program on each `(path, offset, is_return)` point, as a perf-event uprobe each.
fn perf_event_uprobes(points: &[(&str, u64, bool)]) -> anyhow::Result<Vec<OwnedFd>> {
    let program = load_empty(BPF_PROG_TYPE_KPROBE, 0, 0).context("loading an empty uprobe program")?;
    let pmu = read_number("/sys/bus/event_source/devices/uprobe/type")
        .context("the kernel's uprobe event source (CONFIG_UPROBE_EVENTS)")?;
    let mut events = Vec::new();
    for &(path, offset, is_return) in points {
        events.push(
            uprobe_event(pmu, path, offset, is_return, &program)
                .with_context(|| format!("probing {path} at {offset:#x}"))?,
        );
    }
    events.push(program);
    Ok(events)
}

/// An empty program on each `(path, offset, is_return)` point, in one multi-uprobe link per
/// file and kind (Linux 6.6+), as sysprof attaches its own where the kernel makes them.
fn multi_uprobe_links(points: &[(&str, u64, bool)]) -> anyhow::Result<Vec<OwnedFd>> {
    use std::os::fd::AsRawFd as _;
    let program = load_empty(BPF_PROG_TYPE_KPROBE, BPF_TRACE_UPROBE_MULTI, 0)
        .context("loading an empty program for multi-uprobe links")?;
    let mut groups: Vec<(&str, bool, Vec<u64>)> = Vec::new();
    for &(path, offset, is_return) in points {
        match groups.iter_mut().find(|(p, r, _)| *p == path && *r == is_return) {
            Some((_, _, offsets)) => offsets.push(offset),
            None => groups.push((path, is_return, vec![offset])),
        }
    }
    let mut links = Vec::new();
    for (path, is_return, offsets) in groups {
        let path = std::ffi::CString::new(path)?;
        let attr = UprobeMultiLink {
            prog_fd: program.as_raw_fd() as u32,
            attach_type: BPF_TRACE_UPROBE_MULTI,
            path: path.as_ptr() as u64,
            offsets: offsets.as_ptr() as u64,
            cnt: offsets.len() as u32,
            multi_flags: if is_return { BPF_F_UPROBE_MULTI_RETURN } else { 0 },
            ..Default::default()
        };
        links.push(bpf(BPF_LINK_CREATE, &attr)?);
    }
    links.push(program);
    Ok(links)
}

/// The file offset of `symbol`'s code in the ELF file at `path` (what a uprobe is placed by).
fn file_offset(path: &str, symbol: &str) -> anyhow::Result<u64> {
    use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};
    let data = std::fs::read(path).with_context(|| format!("reading {path}"))?;
    let file = object::File::parse(&*data).with_context(|| format!("parsing {path}"))?;
    let address = file
        .symbols()
        .chain(file.dynamic_symbols())
        .find(|s| s.is_definition() && s.name() == Ok(symbol))
        .map(|s| s.address())
        .with_context(|| format!("no {symbol} in {path}"))?;
    file.segments()
        .find_map(|segment| {
            let (start, size) = segment.file_range();
            let offset = address.checked_sub(segment.address())?;
            (offset < size).then_some(start + offset)
        })
        .with_context(|| format!("{symbol} of {path} is in no loaded segment"))
}

/// A uprobe (or uretprobe) at `offset` of `path` on every process, running `program`.
fn uprobe_event(
    pmu: u64,
    path: &str,
    offset: u64,
    is_return: bool,
    program: &OwnedFd,
) -> anyhow::Result<OwnedFd> {
    let path = std::ffi::CString::new(path)?;
    let attr = PerfEventAttr {
        kind: pmu as u32,
        size: size_of::<PerfEventAttr>() as u32,
        // The uprobe source's `retprobe` format bit (config:0).
        config: u64::from(is_return),
        config1: path.as_ptr() as u64,
        config2: offset,
        ..Default::default()
    };
    // Every process is probed, which the kernel takes with a CPU (0) given. `path` lives on
    // until the event is open.
    event_running(&attr, 0, program)
}

/// The event `attr` (a uprobe's path or none in it, alive until this returns) for every
/// process (pid -1) on `cpu`, running `program` at each of its hits.
fn event_running(attr: &PerfEventAttr, cpu: i32, program: &OwnedFd) -> anyhow::Result<OwnedFd> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: `attr` is a live `perf_event_attr` of the size it states, and what it points to
    // lives as long (the caller's); no group.
    let event = new_fd(unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr as *const PerfEventAttr,
            -1,
            cpu,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    })?;
    // SAFETY: an ioctl on the event just opened, with the program's fd as its argument.
    if unsafe { libc::ioctl(event.as_raw_fd(), PERF_EVENT_IOC_SET_BPF, program.as_raw_fd()) } != 0 {
        bail!("attaching the program: {}", std::io::Error::last_os_error());
    }
    Ok(event)
}

fn read_number(path: &str) -> anyhow::Result<u64> {
    Ok(std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?.trim().parse()?)
}

fn load(btf_id: u32) -> anyhow::Result<OwnedFd> {
    load_empty(BPF_PROG_TYPE_TRACING, BPF_TRACE_RAW_TP, btf_id)
}

/// An empty program of `prog_type`.
fn load_empty(prog_type: u32, expected_attach_type: u32, attach_btf_id: u32) -> anyhow::Result<OwnedFd> {
    let license = c"GPL";
    let mut log = vec![0u8; 4096];
    let attr = ProgLoad {
        prog_type,
        insn_cnt: EMPTY.len() as u32,
        insns: EMPTY.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        prog_name: *b"bench_empty\0\0\0\0\0",
        expected_attach_type,
        attach_btf_id,
        ..Default::default()
    };
    bpf(BPF_PROG_LOAD, &attr).map_err(|error| {
        let log = String::from_utf8_lossy(&log);
        anyhow::anyhow!("{error}: {}", log.trim_end_matches('\0').trim())
    })
}

fn attach(program: &OwnedFd) -> anyhow::Result<OwnedFd> {
    use std::os::fd::AsRawFd as _;
    let attr = RawTracepointOpen { prog_fd: program.as_raw_fd() as u32, ..Default::default() };
    bpf(BPF_RAW_TRACEPOINT_OPEN, &attr)
}

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_PAGE_FAULTS_MIN: u64 = 5;
const PERF_COUNT_SW_PAGE_FAULTS_MAJ: u64 = 6;
/// `perf_event_open`'s flag for a close-on-exec fd: the measured command inherits none.
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

/// `_IOW('$', 8, __u32)`: runs a BPF program at each of the event's hits.
const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;

/// The second version of `struct perf_event_attr` (`PERF_ATTR_SIZE_VER1`), all a sampling
/// software event and a uprobe need.
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    /// `bp_addr`, or a uprobe's path.
    config1: u64,
    /// `bp_len`, or a uprobe's offset in its file.
    config2: u64,
}

/// An empty program on each online CPU's minor page-fault event, run for 1 fault in 256 (its
/// period, sysprof's `FAULT_STACK_EVERY`), and on its major one, run for every fault.
fn fault_events() -> anyhow::Result<Vec<OwnedFd>> {
    let program =
        load_empty(BPF_PROG_TYPE_PERF_EVENT, 0, 0).context("loading an empty perf-event program")?;
    let mut events = Vec::new();
    for cpu in online_cpus()? {
        for (config, period) in [(PERF_COUNT_SW_PAGE_FAULTS_MIN, 256), (PERF_COUNT_SW_PAGE_FAULTS_MAJ, 1)] {
            let attr = PerfEventAttr {
                kind: PERF_TYPE_SOFTWARE,
                size: size_of::<PerfEventAttr>() as u32,
                config,
                sample_period: period,
                ..Default::default()
            };
            events.push(
                event_running(&attr, cpu, &program)
                    .with_context(|| format!("a page-fault event on CPU {cpu}"))?,
            );
        }
    }
    events.push(program);
    Ok(events)
}

/// The online CPUs, from `/sys/devices/system/cpu/online` ("0-3,6").
fn online_cpus() -> anyhow::Result<Vec<i32>> {
    let online =
        std::fs::read_to_string("/sys/devices/system/cpu/online").context("reading the online CPUs")?;
    let mut cpus = Vec::new();
    for range in online.trim().split(',') {
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        cpus.extend(first.parse::<i32>()?..=last.parse::<i32>()?);
    }
    Ok(cpus)
}

/// `perf_event_attr.freq`: `sample_period` is a frequency, in Hz.
const FREQ: u64 = 1 << 10;
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
const BPF_PROG_TYPE_PERF_EVENT: u32 = 7;

/// An empty program on a CPU-clock event sampling at `hz` on each online CPU, every process's
/// time on it: sysprof's sampling events (its CPU family), with nothing done at each sample.
fn sampling_events(hz: u64) -> anyhow::Result<Vec<OwnedFd>> {
    let program =
        load_empty(BPF_PROG_TYPE_PERF_EVENT, 0, 0).context("loading an empty perf-event program")?;
    let mut events = Vec::new();
    for cpu in online_cpus()? {
        let attr = PerfEventAttr {
            kind: PERF_TYPE_SOFTWARE,
            size: size_of::<PerfEventAttr>() as u32,
            config: PERF_COUNT_SW_CPU_CLOCK,
            sample_period: hz,
            flags: FREQ,
            ..Default::default()
        };
        events.push(
            event_running(&attr, cpu, &program).with_context(|| format!("a cpu-clock event on CPU {cpu}"))?,
        );
    }
    events.push(program);
    Ok(events)
}

/// `bpf(cmd, attr)`, for the commands that return a new fd.
fn bpf<T>(cmd: libc::c_int, attr: &T) -> anyhow::Result<OwnedFd> {
    // SAFETY: `attr` is a live, initialised `bpf_attr` prefix of the size passed; the kernel
    // reads it and the buffers it points to (which outlive the call), and writes only the log.
    new_fd(unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *const T, size_of::<T>()) })
}

/// The fd a system call returned, or its error.
fn new_fd(fd: libc::c_long) -> anyhow::Result<OwnedFd> {
    if fd < 0 {
        bail!("{}", std::io::Error::last_os_error());
    }
    // SAFETY: a new fd the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
