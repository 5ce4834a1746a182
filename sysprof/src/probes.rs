//! The generic loader: the embedded BPF object loaded with its configuration, the target set,
//! the attach primitives the families use (BTF tracepoints, uprobes), stacks, counters, the
//! kernel's run-time statistics, and the proof that everything was detached. Each family's own
//! attach code and map read-out live in its folder (`cpu/probes.rs`, `sched/probes.rs`, ...).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    num::NonZeroU32,
    os::fd::OwnedFd,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context as _, anyhow};
use aya::{
    Btf, Ebpf, EbpfLoader, Pod,
    maps::{Array, HashMap as BpfHashMap, MapData, RingBuf, StackTraceMap},
    programs::{
        BtfTracePoint, ProgramError, RawTracePoint, UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeLinkId, UProbeScope},
    },
    sys::UProbeMultiFeature,
};
use serde::{Deserialize, Serialize};
use sysprof_common::{Config, names};

use crate::{error::Error, privileges, target_bits::TargetBits, uprobes::Binary};

/// The BPF object built from `sysprof-ebpf` by build.rs.
pub(crate) static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("SYSPROF_BPF_OBJECT"));

/// One program attached to the kernel, for the Part B changelog.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AttachedProbe {
    /// Program name in the object.
    pub program: String,
    /// BPF program type: perf_event, raw_tracepoint, uprobe, ...
    pub kind: String,
    /// What it is attached to.
    pub attached_to: String,
    /// Number of kernel attachments (one per CPU for perf events).
    pub links: u32,
    /// Kernel program id, used to prove the program is gone after detach.
    pub program_id: u32,
}

/// Run-time statistics of one program, from the kernel's BPF stats.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProgramCost {
    pub program: String,
    pub run_count: u64,
    pub run_time_ns: u64,
}

/// What detaching left behind, checked against the kernel's lists of BPF links and programs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DetachReport {
    /// Programs sysprof had loaded.
    pub programs: usize,
    /// Kernel ids of those still attached after detach (empty when everything is gone): a
    /// program attached through links while a link to it remains, any other while it is
    /// loaded.
    #[serde(alias = "still_loaded")]
    pub still_attached: Vec<u32>,
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

pub use crate::kernel_memory::MapSizes;

/// The program ids the kernel's BPF links refer to.
fn kernel_links() -> BTreeSet<u32> {
    aya::programs::loaded_links().filter_map(|info| info.ok().map(|info| info.program_id())).collect()
}

/// The ids of the kernel's loaded BPF programs.
fn kernel_programs() -> BTreeSet<u32> {
    aya::programs::loaded_programs().filter_map(|info| info.ok().map(|info| info.id())).collect()
}

/// Each program's size in the object, in bytes, by name (empty if the object cannot be read).
fn program_sizes() -> HashMap<&'static str, u64> {
    use object::{Object as _, ObjectSymbol as _};
    let Ok(file) = object::File::parse(BPF_OBJECT) else {
        return HashMap::new();
    };
    file.symbols()
        .filter(|symbol| symbol.kind() == object::SymbolKind::Text && symbol.is_global())
        .filter_map(|symbol| Some((symbol.name().ok()?, symbol.size())))
        .collect()
}

/// A detach under way (see [`Probes::detach`]).
pub struct Detaching(std::thread::JoinHandle<DetachReport>);

impl Detaching {
    /// Waits for the detach to finish, and its proof.
    pub fn wait(self) -> DetachReport {
        self.0.join().unwrap_or(DetachReport { programs: 0, still_attached: vec![u32::MAX] })
    }
}

/// One uprobe link: its program, and the process it was attached for (`None`: every process).
struct UprobeLinkRecord {
    pid: Option<u32>,
    program: String,
    id: UProbeLinkId,
}

/// A program a family attaches, for [`Probes::preload`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum Preload {
    /// A perf-event, raw-tracepoint or uprobe program, by name.
    Plain(&'static str),
    /// A BTF tracepoint program and its tracepoint.
    BtfTracePoint(&'static str, &'static str),
}

impl Preload {
    pub(crate) fn program(&self) -> &'static str {
        match self {
            Preload::Plain(name) | Preload::BtfTracePoint(name, _) => name,
        }
    }
}

/// The process life-cycle programs (`attach_process_tracking`), always attached.
pub(crate) const PROCESS_TRACKING: [Preload; 3] =
    [Preload::Plain("process_fork"), Preload::Plain("process_exec"), Preload::Plain("process_exit")];

/// The kernel's BTF as aya needs it: only to attach BTF tracepoints.
enum KernelBtf {
    /// The tracepoints' ids from sysprof's own walk of the kernel BTF: aya gets a `Btf` of just
    /// the typedefs it looks up (see `btf::TracepointIds`), and the kernel's is never parsed.
    Indexed(crate::btf::TracepointIds),
    NotAsked,
    Parsing(std::thread::JoinHandle<Result<Btf, aya::BtfError>>),
    Parsed(Btf),
    Failed(String),
}

impl KernelBtf {
    /// A `Btf` in which aya finds `tracepoints`: made from the ids when they are known, else
    /// the kernel's, parsed.
    fn for_tracepoints(&mut self, tracepoints: &[&str]) -> Result<std::borrow::Cow<'_, Btf>, String> {
        if let KernelBtf::Indexed(ids) = self
            && let Ok(btf) = ids.btf_for(tracepoints)
        {
            return Ok(std::borrow::Cow::Owned(btf));
        }
        self.get().map(std::borrow::Cow::Borrowed)
    }

    fn get(&mut self) -> Result<&Btf, String> {
        let parsed = match std::mem::replace(self, KernelBtf::NotAsked) {
            KernelBtf::Indexed(_) | KernelBtf::NotAsked => {
                Btf::from_sys_fs().map_err(|error| error.to_string())
            }
            KernelBtf::Parsing(thread) => match thread.join() {
                Ok(parsed) => parsed.map_err(|error| error.to_string()),
                Err(_) => Err("the BTF parser panicked".into()),
            },
            KernelBtf::Parsed(btf) => Ok(btf),
            KernelBtf::Failed(error) => Err(error),
        };
        *self = match parsed {
            Ok(btf) => KernelBtf::Parsed(btf),
            Err(error) => KernelBtf::Failed(error),
        };
        match self {
            KernelBtf::Parsed(btf) => Ok(btf),
            KernelBtf::Failed(error) => Err(error.clone()),
            _ => unreachable!("set just above"),
        }
    }
}

/// The loaded BPF object and everything attached from it.
pub struct Probes {
    pub(crate) ebpf: Ebpf,
    /// Kernel BTF for the BTF tracepoints (see `parse_kernel_btf_ahead`).
    btf: KernelBtf,
    pub(crate) attached: Vec<AttachedProbe>,
    /// Keeps the kernel's run-time statistics on while held (see `set_stats`).
    stats: Option<OwnedFd>,
    /// Whether the kernel ever accepted to keep them.
    stats_available: bool,
    /// Every uprobe link, to detach those of a process that exits.
    uprobe_links: Vec<UprobeLinkRecord>,
    /// Links being closed in the background (their process exited).
    closing: Vec<std::thread::JoinHandle<()>>,
    /// Every file uprobes were attached to (by the path it is shown by), held open, and as it
    /// was then: Part B checks it did not change.
    probed_files: BTreeMap<PathBuf, (Binary, FileStamp)>,
    /// Whether the target is exactly a set of processes and what they start (`--pid`, a
    /// command): the kernel's per-task fault counters then count its faults, from the start
    /// of each thread or of the trace (see `attach_page_faults`).
    pub(crate) lineage: bool,
    /// Whether the programs know where a thread's fault counters are (kernel BTF had them).
    pub(crate) fault_counters_known: bool,
    /// Each target process's faults [minor, major] when the trace started, when the kernel's
    /// per-task counters count them (see `start_fault_counts`).
    pub(crate) fault_baselines: Option<HashMap<u32, [u64; 2]>>,
    /// The target set's bits, mapped when the first target is added (see `TargetBits`).
    target_bits: Option<TargetBits>,
    /// The notes' epoch last written (`forget_switch_notes`).
    notes_epoch: u32,
    /// Whether the kernel makes multi-uprobe links, for every process and for one process
    /// (see `attach_functions`).
    multi_uprobes: bool,
    multi_uprobes_per_process: bool,
}

/// Set to `perf-event`, sysprof attaches perf-event uprobes where the kernel would make
/// multi-uprobe links: what kernels before 6.6 get, for a kernel whose multi-uprobe links
/// misbehave, and for the tests of that path.
pub const UPROBE_LINKS_ENV: &str = "SYSPROF_UPROBE_LINKS";

/// Whether the kernel makes multi-uprobe links with `feature`: a failed probe (a kernel before
/// 6.6; before 6.10 for one process's links, whose filter then saw one thread) leaves the
/// perf-event uprobes, as `UPROBE_LINKS_ENV` does.
fn multi_uprobes(feature: UProbeMultiFeature) -> bool {
    std::env::var(UPROBE_LINKS_ENV).map_or(true, |links| links != "perf-event")
        && aya::sys::is_uprobe_multi_supported(feature).unwrap_or(false)
}

/// The uprobe programs with a copy for multi-uprobe links (`#[uprobe(multi)]`), which the
/// kernel takes only from programs loaded for them.
const MULTI_COPIES: [(&str, &str); 6] = [
    ("call_enter", "call_enter_multi"),
    ("call_return", "call_return_multi"),
    ("alloc_enter", "alloc_enter_multi"),
    ("alloc_return", "alloc_return_multi"),
    ("free_enter", "free_enter_multi"),
    ("loader_ready", "loader_ready_multi"),
];

/// What tells a file changed: its identity, size and modification time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
}

impl FileStamp {
    fn of(file: &std::fs::File) -> Option<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = file.metadata().ok()?;
        Some(FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
        })
    }
}

impl Probes {
    /// Loads the object with `config` baked into its read-only data and its maps sized. No
    /// program runs yet.
    pub fn load(config: &Config, sizes: MapSizes) -> anyhow::Result<Self> {
        if BPF_OBJECT.is_empty() {
            anyhow::bail!(
                "this sysprof was built with SYSPROF_BPF_SKIP and carries no BPF programs: build it with \
                 `cargo xtask build`"
            );
        }
        // Whether the kernel can time the programs, asked and answered at once: on, the
        // statistics time every run of every program on the machine (two clock reads a run,
        // 85 ns more a getuid here), and the collector keeps them on in windows only (see
        // `selfcost`). Once held from here to the collector's first window, they timed the
        // whole start: a launched command's loader, its hold there, and its first milliseconds
        // after (a getuid loop run during a hold that timed out: 221 ns a call, 124.5 without).
        let stats_available = aya::sys::enable_stats(aya::sys::Stats::RunTime).is_ok();
        // The programs carry no CO-RE relocations (Rust cannot emit them: see btf.rs), so aya
        // never reads the kernel's BTF for them (it does only for such relocations).
        // Before the maps are created: their kernel memory is charged to this cgroup.
        let cgroup = crate::limits::memory_cgroup();
        crate::limits::check_kernel_memory(&sizes, cgroup.as_ref())?;
        let entries = sizes.entries();
        let mut loader = EbpfLoader::new();
        loader.override_global(names::CONFIG, config, true);
        for &(name, max_entries) in &entries {
            loader.map_max_entries(name, max_entries);
        }
        // TASK_STATE is a task-storage map, which aya creates but cannot read from
        // userspace: only the kernel side uses it.
        let ebpf = loader
            .allow_unsupported_maps()
            .load(BPF_OBJECT)
            .map_err(|error| crate::limits::load_error(error, &sizes, cgroup.as_ref()))?;
        Ok(Probes {
            ebpf,
            btf: KernelBtf::NotAsked,
            attached: Vec::new(),
            stats_available,
            stats: None,
            uprobe_links: Vec::new(),
            closing: Vec::new(),
            probed_files: BTreeMap::new(),
            lineage: false,
            fault_counters_known: config.task_min_flt_offset != 0,
            fault_baselines: None,
            target_bits: None,
            notes_epoch: 0,
            multi_uprobes: multi_uprobes(UProbeMultiFeature::LinkCreation),
            multi_uprobes_per_process: multi_uprobes(UProbeMultiFeature::ProcessScopedPidFilter),
        })
    }

    /// Starts parsing the kernel's BTF on a thread of its own, for the BTF tracepoints that
    /// attach later: its 50 ms then overlap the unwind tables' and the other programs'
    /// loading instead of adding to the start.
    /// Gives the BTF tracepoints' ids, found by sysprof's own walk of the kernel's BTF: the
    /// kernel's BTF is then not parsed at all (see `btf::TracepointIds`).
    pub fn use_tracepoint_ids(&mut self, ids: crate::btf::TracepointIds) {
        self.btf = KernelBtf::Indexed(ids);
    }

    pub fn parse_kernel_btf_ahead(&mut self) {
        if matches!(self.btf, KernelBtf::NotAsked) {
            self.btf = KernelBtf::Parsing(std::thread::spawn(Btf::from_sys_fs));
        }
    }

    /// Lets the kernel BTF go once the BTF tracepoints are attached: aya's parse of it holds
    /// some 20 MB, most of sysprof's memory otherwise. A later BTF tracepoint parses it again.
    pub fn forget_kernel_btf(&mut self) {
        if matches!(self.btf, KernelBtf::Parsed(_) | KernelBtf::Parsing(_)) {
            self.btf = KernelBtf::NotAsked;
            // Its many small blocks go back to the system, not only to malloc's free lists.
            // SAFETY: malloc_trim has no preconditions.
            unsafe { libc::malloc_trim(0) };
        }
    }

    /// Adds a process to the in-kernel target set.
    pub fn add_target_process(&mut self, pid: u32) -> anyhow::Result<()> {
        let mut targets: BpfHashMap<&mut MapData, u32, u8> =
            BpfHashMap::try_from(self.map_mut(names::TARGETS)?)?;
        targets.insert(&pid, &1, 0).with_context(|| format!("adding pid {pid} to the targets"))?;
        self.target_bits()?.set(pid, true);
        self.forget_switch_notes()
    }

    /// Forgets each CPU's note of its current task by moving the notes' epoch on
    /// (`names::NOTES_EPOCH`): the note carries the switch's verdict that the task was outside
    /// the target set, and a thread of a process that has just joined would be taken for an
    /// outsider until it next leaves the CPU. A note of an earlier epoch sends the programs to
    /// the set itself, and the next switch notes afresh. Not by zeroing the notes: they share
    /// each CPU's value with the syscall programs' counts (`CpuState`), which a write of the
    /// whole value would lose.
    pub fn forget_switch_notes(&mut self) -> anyhow::Result<()> {
        self.notes_epoch = self.notes_epoch.wrapping_add(1);
        self.set(names::NOTES_EPOCH, 0, self.notes_epoch)
    }

    /// Takes a process out of the in-kernel target set.
    pub fn remove_target_process(&mut self, pid: u32) -> anyhow::Result<()> {
        self.forget_ended_target(pid)?;
        // Unlike an ended process, this one runs: a note may say it is a target.
        self.forget_switch_notes()
    }

    /// Takes a process that has ended out of the in-kernel target set, so that its pid, when
    /// the kernel gives it to another process, is not taken for a target's, and its entry is
    /// free for the next child (the set holds `capacity::TARGETS`). No switch note can name a
    /// thread of it: none is left to run.
    pub fn forget_ended_target(&mut self, pid: u32) -> anyhow::Result<()> {
        self.target_bits()?.set(pid, false);
        let mut targets: BpfHashMap<&mut MapData, u32, u8> =
            BpfHashMap::try_from(self.map_mut(names::TARGETS)?)?;
        let _ = targets.remove(&pid);
        Ok(())
    }

    /// The target set's bits, mapped on first use.
    fn target_bits(&mut self) -> anyhow::Result<&TargetBits> {
        if self.target_bits.is_none() {
            self.target_bits = Some(TargetBits::map(self.map(names::TARGET_BITS)?)?);
        }
        Ok(self.target_bits.as_ref().expect("mapped above"))
    }

    /// Opens the trace's window at `start_ns` (CLOCK_MONOTONIC): the programs count from here.
    pub(crate) fn open_window(&mut self, start_ns: u64) -> anyhow::Result<()> {
        self.set(names::TRACE_WINDOW, 0, sysprof_common::TraceWindow { start_ns, end_ns: 0 })
    }

    /// Closes the trace's window at `end_ns`: nothing counts from here.
    pub(crate) fn close_window(&mut self, end_ns: u64) -> anyhow::Result<()> {
        let array: Array<&MapData, sysprof_common::TraceWindow> =
            Array::try_from(self.map(names::TRACE_WINDOW)?)?;
        let window = array.get(&0, 0).context("reading the trace's window")?;
        self.set(names::TRACE_WINDOW, 0, sysprof_common::TraceWindow { end_ns, ..window })
    }

    /// Writes entry `index` of the array map `name`.
    pub(crate) fn set<T: aya::Pod>(&mut self, name: &str, index: u32, value: T) -> anyhow::Result<()> {
        let mut array: Array<&mut MapData, T> = Array::try_from(self.map_mut(name)?)?;
        array.set(index, &value, 0).with_context(|| format!("writing map {name}"))
    }

    /// Attaches the process life-cycle programs (fork, exec, exit).
    pub fn attach_process_tracking(&mut self) -> anyhow::Result<()> {
        for (program_name, tracepoint) in [
            ("process_fork", "sched_process_fork"),
            ("process_exec", "sched_process_exec"),
            ("process_exit", "sched_process_exit"),
        ] {
            self.attach_raw_tracepoints(program_name, &[("sched", tracepoint)])?;
        }
        Ok(())
    }

    /// Attaches one raw-tracepoint program to each of `tracepoints` (subsystem, name): one
    /// entry in Part B with a link per tracepoint.
    pub(crate) fn attach_raw_tracepoints(
        &mut self,
        program_name: &str,
        tracepoints: &[(&str, &str)],
    ) -> anyhow::Result<()> {
        let program: &mut RawTracePoint = program_mut(&mut self.ebpf, program_name)?.try_into()?;
        if program.fd().is_err() {
            program.load().map_err(|e| rejected(program_name, e))?;
        }
        for (_, tracepoint) in tracepoints {
            program
                .attach(tracepoint)
                .with_context(|| format!("attaching {program_name} to raw tracepoint {tracepoint}"))?;
        }
        let program_id = program.info()?.id();
        let names: Vec<String> =
            tracepoints.iter().map(|(system, name)| format!("{system}:{name}")).collect();
        self.attached.push(AttachedProbe {
            program: program_name.into(),
            kind: "raw_tracepoint".into(),
            attached_to: names.join(", "),
            links: tracepoints.len() as u32,
            program_id,
        });
        Ok(())
    }

    /// Verifies `programs` side by side, a thread each, before the families attach them one
    /// by one: the verifier is most of the start (sched_switch alone takes 50 ms here), and
    /// privileged loads run in parallel in the kernel. The BTF tracepoints wait for the BTF
    /// (`parse_kernel_btf_ahead`). A program that fails here is left for its attach to load
    /// again and report, with the verifier's log.
    pub(crate) fn preload(&mut self, programs: &[Preload]) {
        let tracepoints: Vec<&str> = programs
            .iter()
            .filter_map(|p| match p {
                Preload::BtfTracePoint(_, tracepoint) => Some(*tracepoint),
                Preload::Plain(_) => None,
            })
            .collect();
        let btf = match tracepoints.is_empty() {
            false => self.btf.for_tracepoints(&tracepoints).ok(),
            true => None,
        };
        let btf = btf.as_deref();
        let mut wanted: Vec<(&Preload, &mut aya::programs::Program)> = Vec::new();
        for (name, program) in self.ebpf.programs_mut() {
            // Families share programs: the first naming one is enough.
            let spec = programs.iter().find(|p| p.program() == name);
            if let Some(spec) = spec.filter(|_| program.fd().is_err()) {
                wanted.push((spec, program));
            }
        }
        // The biggest first: the verifier's time grows with a program's size, and the start
        // waits for the slowest, which should not be the last to get a CPU.
        let sizes = program_sizes();
        wanted.sort_by_key(|(spec, _)| std::cmp::Reverse(sizes.get(spec.program()).copied().unwrap_or(0)));
        std::thread::scope(|scope| {
            for (spec, program) in wanted {
                scope.spawn(move || {
                    use aya::programs::Program;
                    let _ = match (spec, program) {
                        (Preload::BtfTracePoint(_, tracepoint), Program::BtfTracePoint(program)) => match btf
                        {
                            Some(btf) => program.load(tracepoint, btf),
                            None => Ok(()),
                        },
                        (Preload::Plain(_), Program::PerfEvent(program)) => program.load(),
                        (Preload::Plain(_), Program::RawTracePoint(program)) => program.load(),
                        (Preload::Plain(_), Program::UProbe(program)) => program.load(),
                        _ => Ok(()),
                    };
                });
            }
        });
    }

    pub(crate) fn attach_btf_tracepoint(
        &mut self,
        program_name: &str,
        tracepoint: &str,
    ) -> anyhow::Result<()> {
        // Families share some programs (the switch program parks syscalls in flight).
        if self.attached.iter().any(|probe| probe.program == program_name) {
            return Ok(());
        }
        let program = self.load_btf_tracepoint(program_name, tracepoint)?;
        program.attach().with_context(|| format!("attaching {program_name} to tp_btf/{tracepoint}"))?;
        let program_id = program.info()?.id();
        self.record_btf_tracepoint(program_name, format!("tracepoint {tracepoint}"), 1, program_id);
        Ok(())
    }

    /// Puts BTF tracepoint program `program_name` in entry `index` of program array `array`, for
    /// the program attached to the same tracepoint to end with a tail call to it. Part B lists
    /// it with no link of its own: it runs only through that program.
    pub(crate) fn chain_btf_tracepoint(
        &mut self,
        program_name: &str,
        tracepoint: &str,
        array: &str,
        index: u32,
    ) -> anyhow::Result<()> {
        if self.attached.iter().any(|probe| probe.program == program_name) {
            return Ok(());
        }
        let program = self.load_btf_tracepoint(program_name, tracepoint)?;
        let program_id = program.info()?.id();
        let fd = program.fd()?.try_clone()?;
        let mut chain = aya::maps::ProgramArray::try_from(self.map_mut(array)?)?;
        chain.set(index, &fd, 0).with_context(|| format!("putting {program_name} in {array}"))?;
        self.record_btf_tracepoint(
            program_name,
            format!("tracepoint {tracepoint}, by tail call"),
            0,
            program_id,
        );
        Ok(())
    }

    /// Part B's line for a BTF tracepoint program.
    fn record_btf_tracepoint(
        &mut self,
        program_name: &str,
        attached_to: String,
        links: u32,
        program_id: u32,
    ) {
        self.attached.push(AttachedProbe {
            program: program_name.into(),
            kind: "tp_btf".into(),
            attached_to,
            links,
            program_id,
        });
    }

    /// BTF tracepoint program `program_name`, loaded for `tracepoint` unless it was preloaded.
    fn load_btf_tracepoint(
        &mut self,
        program_name: &str,
        tracepoint: &str,
    ) -> anyhow::Result<&mut BtfTracePoint> {
        let program: &mut BtfTracePoint = program_mut(&mut self.ebpf, program_name)?.try_into()?;
        if program.fd().is_err() {
            let btf =
                self.btf.for_tracepoints(&[tracepoint]).map_err(|error| Error::MissingKernelFeature {
                    feature: "kernel BTF (/sys/kernel/btf/vmlinux)".into(),
                    fix: format!(
                        "the scheduler and syscall probes need it ({error}): use a kernel built with \
                     CONFIG_DEBUG_INFO_BTF=y, or --focus cpu"
                    ),
                })?;
            program.load(tracepoint, &btf).map_err(|e| rejected(program_name, e))?;
        }
        Ok(program)
    }

    /// `program`, or its copy for multi-uprobe links where the kernel makes them for `pid`'s
    /// scope (see `attach_functions`).
    ///
    /// A copy already loaded is kept to: a perf-event uprobe serves every scope, and a program
    /// first loaded at the end (the probe-cost calibration, for every process, after a trace
    /// whose heap probes were one process's, on a kernel with multi-uprobe links for every
    /// process only: 6.6 to 6.9) is refused: the ring buffers it was built against were
    /// handed over to their collectors and are closed by then.
    pub fn uprobe_program(&self, program: &'static str, pid: Option<u32>) -> &'static str {
        let multi = if pid.is_some() { self.multi_uprobes_per_process } else { self.multi_uprobes };
        let loaded = |name: &str| self.ebpf.program(name).is_some_and(|p| p.fd().is_ok());
        match MULTI_COPIES.iter().find(|(single, _)| *single == program) {
            Some(&(_, copy)) if multi && (loaded(copy) || !loaded(program)) => copy,
            _ => program,
        }
    }

    /// Whether the kernel makes multi-uprobe links for every process (see `attach_functions`).
    pub fn multi_uprobes(&self) -> bool {
        self.multi_uprobes
    }

    /// Whether `attached` is `program` or its multi-uprobe copy.
    pub fn is_program(attached: &str, program: &str) -> bool {
        attached == program
            || MULTI_COPIES.iter().any(|&(single, copy)| single == program && attached == copy)
    }

    /// Attaches the call programs (entry and return) at each `(offset, cookie)` of `path`, for
    /// every process (the programs filter targets in the kernel, children included); returns
    /// how many links each program got. The return probe goes first: a call caught entering
    /// but not returning would look open forever.
    pub fn attach_calls(&mut self, file: &Binary, points: &[(u64, u64)]) -> anyhow::Result<u32> {
        self.attach_functions(&["call_return", "call_enter"], file, points, None)
    }

    /// Attaches `programs`, in order, at each `(offset, cookie)` of `file`, for every process
    /// or process `pid` only; returns how many links each program got. One multi-uprobe link
    /// per program where the kernel has them (`uprobe_program`), else a perf-event uprobe per
    /// point: each link's removal waits for kernel grace periods (two, ~110 ms here, under a
    /// lock every removal takes), so the CUDA runtime's 47 functions in one link end a trace
    /// 10 s sooner than as 94 perf-event uprobes. A multi-uprobe link also needs no more than
    /// CAP_BPF and CAP_PERFMON, where a perf-event uprobe needs CAP_SYS_ADMIN.
    pub fn attach_functions(
        &mut self,
        programs: &[&'static str],
        file: &Binary,
        points: &[(u64, u64)],
        pid: Option<u32>,
    ) -> anyhow::Result<u32> {
        if points.is_empty() {
            return Ok(0);
        }
        let chosen: Vec<&str> = programs.iter().map(|&program| self.uprobe_program(program, pid)).collect();
        if chosen.iter().zip(programs).all(|(chosen, program)| chosen != program) {
            self.attach_uprobes(&chosen, file, points, pid)?;
            return Ok(1);
        }
        for &point in points {
            self.attach_uprobes(programs, file, &[point], pid)?;
        }
        Ok(points.len() as u32)
    }

    /// Attaches uprobe programs, in order, at each `(offset, cookie)` of `file` (one link per
    /// program: give several points to a program from a multi-uprobe section only): for every
    /// process (the programs filter targets in the kernel), or for process `pid` only, whose
    /// memory alone then gets the breakpoints (see `detach_process_uprobes`). The kernel is
    /// given the open file's own path (`Binary::path`), never a name to look up again.
    fn attach_uprobes(
        &mut self,
        programs: &[&str],
        file: &Binary,
        points: &[(u64, u64)],
        pid: Option<u32>,
    ) -> anyhow::Result<()> {
        let scope = match pid.and_then(NonZeroU32::new) {
            Some(pid) => UProbeScope::OneProcess(pid),
            None => UProbeScope::AllProcesses,
        };
        for &name in programs {
            let program: &mut UProbe = program_mut(&mut self.ebpf, name)?.try_into()?;
            if program.fd().is_err() {
                program.load().map_err(|e| rejected(name, e))?;
            }
            let located = points.iter().map(|&(offset, cookie)| UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(offset),
                cookie: Some(cookie),
            });
            let link = program.attach(located, file.path(), scope).map_err(|error| {
                let perf_event = !MULTI_COPIES.iter().any(|&(_, copy)| copy == name);
                let hint = if perf_event
                    && os_error(&error) == Some(libc::EACCES)
                    && !privileges::has_sys_admin()
                {
                    " (uprobes need CAP_SYS_ADMIN: CAP_BPF and CAP_PERFMON are not enough; run sysprof as root)"
                } else {
                    ""
                };
                let cause = anyhow::Error::new(error);
                let at = match points {
                    [(offset, _)] => format!("at {offset:#x}"),
                    _ => format!("at {} functions", points.len()),
                };
                anyhow!("attaching {name} {at} in {}: {cause:#}{hint}", file.shown().display())
            })?;
            self.uprobe_links.push(UprobeLinkRecord { pid, program: name.to_string(), id: link });
        }
        if !self.probed_files.contains_key(file.shown())
            && let Some(stamp) = FileStamp::of(file.file())
        {
            self.probed_files.insert(file.shown().to_path_buf(), (file.clone(), stamp));
        }
        Ok(())
    }

    /// Detaches, in the background, the uprobes attached for process `pid` only (it exited).
    pub fn detach_process_uprobes(&mut self, pid: u32) {
        self.detach_uprobes_where(|link| link.pid == Some(pid));
    }

    /// Detaches, in the background, `program`'s uprobes attached for process `pid` only.
    pub fn detach_process_uprobe(&mut self, pid: u32, program: &str) {
        self.detach_uprobes_where(|link| link.pid == Some(pid) && Self::is_program(&link.program, program));
    }

    fn detach_uprobes_where(&mut self, which: impl Fn(&UprobeLinkRecord) -> bool) {
        let (mine, others) = std::mem::take(&mut self.uprobe_links).into_iter().partition(which);
        self.uprobe_links = others;
        let owned = self.take_uprobe_links(mine);
        // Removing a uprobe link waits for kernel grace periods (~110 ms here), one removal at
        // a time: not on the collector's thread.
        self.closing.push(std::thread::spawn(move || drop(owned)));
    }

    /// Takes the links out of their programs, to close them elsewhere.
    fn take_uprobe_links(&mut self, links: Vec<UprobeLinkRecord>) -> Vec<UProbeLink> {
        links
            .into_iter()
            .filter_map(|UprobeLinkRecord { program: name, id, .. }| {
                let program: &mut UProbe = program_mut(&mut self.ebpf, &name).ok()?.try_into().ok()?;
                program.take_link(id).ok()
            })
            .collect()
    }

    /// Records, for Part B, that the call programs were attached `links` times to `what`.
    pub fn note_call_probes(&mut self, what: &str, links: u32) {
        let (enter, leave) =
            (self.uprobe_program("call_enter", None), self.uprobe_program("call_return", None));
        self.note_uprobes(&[(enter, "uprobe"), (leave, "uretprobe")], what, links);
    }

    /// Records, for Part B, that `(program, kind)` pairs were attached `links` times to `what`
    /// (adding to an earlier note of the same attachment).
    pub fn note_uprobes(&mut self, programs: &[(&str, &str)], what: &str, links: u32) {
        for &(name, kind) in programs {
            if let Some(known) = self.attached.iter_mut().find(|p| p.program == name && p.attached_to == what)
            {
                known.links += links;
                continue;
            }
            let program_id = self.ebpf.program(name).and_then(|p| p.info().ok()).map_or(0, |info| info.id());
            self.attached.push(AttachedProbe {
                program: name.into(),
                kind: kind.into(),
                attached_to: what.to_string(),
                links,
                program_id,
            });
        }
    }

    /// The ring buffer of call events, for the collector to own.
    pub fn take_call_events(&mut self) -> anyhow::Result<RingBuf<MapData>> {
        self.take_ring(names::CALL_EVENTS)
    }

    /// The ring buffer of process events, for the collector to own.
    pub fn take_process_events(&mut self) -> anyhow::Result<RingBuf<MapData>> {
        self.take_ring(names::PROCESS_EVENTS)
    }

    /// The ring buffer `name`, for whoever drains it to own.
    pub fn take_ring(&mut self, name: &str) -> anyhow::Result<RingBuf<MapData>> {
        let map =
            self.ebpf.take_map(name).with_context(|| format!("map {name} missing from the BPF object"))?;
        RingBuf::try_from(map).map_err(|error| {
            // Mapped twice over (its pages wrap around): an address-space limit refuses it.
            match &error {
                aya::maps::MapError::SyscallError(syscall) => {
                    crate::limits::mapping_failed(format!("the BPF ring {name}"), &syscall.io_error)
                        .map(anyhow::Error::from)
                }
                _ => None,
            }
            .unwrap_or_else(|| anyhow::Error::new(error).context(format!("mapping the BPF ring {name}")))
        })
    }

    /// Every entry of a hash map.
    pub(crate) fn entries<K: Pod, V: Pod>(&self, name: &str) -> anyhow::Result<Vec<(K, V)>> {
        let map: BpfHashMap<&MapData, K, V> = BpfHashMap::try_from(self.map(name)?)?;
        map.iter().collect::<Result<_, _>>().with_context(|| format!("reading map {name}"))
    }

    /// The stacks with these ids in the stack map `name`.
    pub(crate) fn stacks_in(
        &self,
        name: &str,
        ids: &BTreeSet<u32>,
    ) -> anyhow::Result<HashMap<u32, Vec<u64>>> {
        if name == sysprof_common::unwind::STACKS {
            let map: BpfHashMap<&MapData, u32, sysprof_common::unwind::UnwoundStack> =
                BpfHashMap::try_from(self.map(name)?)?;
            return Ok(ids
                .iter()
                .filter_map(|&id| {
                    let stack = map.get(&id, 0).ok()?;
                    Some((id, stack.frames[..(stack.len as usize).min(stack.frames.len())].to_vec()))
                })
                .collect());
        }
        let map = StackTraceMap::try_from(self.map(name)?)?;
        let mut stacks = HashMap::with_capacity(ids.len());
        for &id in ids {
            // A stack id can vanish only if the map were cleared; skip rather than fail.
            if let Ok(trace) = map.get(&id, 0) {
                stacks.insert(id, trace.frames().iter().map(|frame| frame.ip).collect());
            }
        }
        Ok(stacks)
    }

    /// Whether the kernel keeps run-time statistics for the programs.
    pub fn stats_available(&self) -> bool {
        self.stats_available
    }

    /// Turns the kernel's BPF run-time statistics on or off. They time every run of every BPF
    /// program on the machine (two clock reads per run), which costs more than some of the
    /// programs themselves, so the collector keeps them on in windows only (see `selfcost`).
    pub fn set_stats(&mut self, on: bool) {
        if !on {
            self.stats = None;
        } else if self.stats.is_none() && self.stats_available {
            self.stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).ok();
        }
    }

    /// The probed files that changed since they were probed (size, modification time or the
    /// file itself), each with what changed. sysprof opens them read-only and its uprobes live
    /// in the kernel's copy of their pages, so this is checked, not assumed: a change is
    /// someone else's, and the report says so. The file probed is asked through its descriptor;
    /// what its path names now, with the rights it was opened with (through sudo, a path the
    /// user named never has root look behind it: `Binary::named_now`).
    pub fn probed_files_changed(&self) -> Vec<String> {
        self.probed_files
            .iter()
            .filter_map(|(path, (file, before))| {
                let named = file.named_now();
                let now = FileStamp::of(file.file());
                let what = match (named, now) {
                    (Err(error), _) if error.kind() == std::io::ErrorKind::NotFound => "removed".to_string(),
                    (Err(error), _) => format!("no longer reachable by its path ({error})"),
                    (Ok(named), _) if named != (before.dev, before.ino) => "replaced by another file".into(),
                    (Ok(_), None) => return None,
                    (Ok(_), Some(now)) if now.size != before.size => {
                        format!("size {} -> {} bytes", before.size, now.size)
                    }
                    (Ok(_), Some(now)) if now.mtime != before.mtime => {
                        "modified (its modification time changed)".into()
                    }
                    (Ok(_), Some(_)) => return None,
                };
                Some(format!("{}: {what}", path.display()))
            })
            .collect()
    }

    /// What is attached so far.
    pub fn attached(&self) -> &[AttachedProbe] {
        &self.attached
    }

    /// Run count and time of each attached program (zero where the kernel keeps no stats).
    pub fn costs(&self) -> Vec<ProgramCost> {
        let mut seen = BTreeSet::new();
        self.attached
            .iter()
            .filter(|probe| seen.insert(probe.program.clone()))
            .filter_map(|probe| {
                let info = self.ebpf.program(&probe.program)?.info().ok()?;
                Some(ProgramCost {
                    program: probe.program.clone(),
                    run_count: info.run_count(),
                    run_time_ns: info.run_time().as_nanos() as u64,
                })
            })
            .collect()
    }

    /// Detaches and unloads everything, then checks with the kernel that no program remains;
    /// on a thread of its own, as removing a uprobe link takes kernel grace periods (about
    /// 110 ms here, one removal after the other): the results are symbolized meanwhile.
    pub fn detach(self) -> Detaching {
        Detaching(std::thread::spawn(move || self.detach_now()))
    }

    fn detach_now(mut self) -> DetachReport {
        let ids: BTreeSet<u32> = self.attached.iter().map(|probe| probe.program_id).collect();
        // A program is detached once no link refers to it: the kernel unhooks it when its
        // last link closes, and frees it only after a grace period, which for the syscall
        // tracepoints (faultable since 6.13) takes some 300 ms. Programs attached without
        // a link (older kernels' perf-event ioctl) are detached only once they are freed.
        let linked: BTreeSet<u32> = kernel_links().into_iter().filter(|id| ids.contains(id)).collect();
        for closing in self.closing.drain(..) {
            let _ = closing.join();
        }
        // Each link waits for grace periods of its own as it is removed (~110 ms here), mostly
        // under a lock every removal takes, so they add up (122 perf-event uprobes took 13 s;
        // multi-uprobe links keep them few: `attach_functions`); closed side by side all the
        // same, for what does overlap.
        let uprobes = std::mem::take(&mut self.uprobe_links);
        let owned = self.take_uprobe_links(uprobes);
        std::thread::scope(|scope| {
            let per_thread = owned.len().div_ceil(16).max(1);
            let mut owned = owned;
            while !owned.is_empty() {
                let chunk: Vec<UProbeLink> = owned.drain(..per_thread.min(owned.len())).collect();
                scope.spawn(move || drop(chunk));
            }
        });
        drop(self.ebpf);
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let (links, loaded) = (kernel_links(), kernel_programs());
            let still_attached: Vec<u32> = ids
                .iter()
                .copied()
                .filter(|id| if linked.contains(id) { links.contains(id) } else { loaded.contains(id) })
                .collect();
            if still_attached.is_empty() || Instant::now() > deadline {
                return DetachReport { programs: ids.len(), still_attached };
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub(crate) fn map(&self, name: &str) -> anyhow::Result<&aya::maps::Map> {
        self.ebpf.map(name).with_context(|| format!("map {name} missing from the BPF object"))
    }

    pub(crate) fn map_mut(&mut self, name: &str) -> anyhow::Result<&mut aya::maps::Map> {
        self.ebpf.map_mut(name).with_context(|| format!("map {name} missing from the BPF object"))
    }
}

pub(crate) fn program_mut<'a>(
    ebpf: &'a mut Ebpf,
    name: &str,
) -> anyhow::Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name).with_context(|| format!("program {name} missing from the BPF object"))
}

/// A verifier rejection, with the log saved for the bug report.
pub(crate) fn rejected(program: &str, error: ProgramError) -> anyhow::Error {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|release| release.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let reason = match &error {
        ProgramError::LoadError { io_error, verifier_log } => {
            match save_log(&std::env::temp_dir(), program, &verifier_log.to_string()) {
                Some(path) => format!("{io_error}; verifier log in {}", path.display()),
                None => io_error.to_string(),
            }
        }
        other => other.to_string(),
    };
    Error::ProgramRejected { program: program.into(), reason, kernel }.into()
}

/// Saves a verifier log in `dir` under a new name. /tmp is anyone's, and sysprof runs as root:
/// the file must be a new one of its own (`O_EXCL|O_NOFOLLOW`: a name planted there, a symlink
/// to /etc/passwd say, is never written through), readable by root alone.
fn save_log(dir: &std::path::Path, program: &str, log: &str) -> Option<std::path::PathBuf> {
    use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
    for attempt in 0..16 {
        let path = dir.join(format!("sysprof-verifier-{program}-{}-{attempt}.log", std::process::id()));
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path);
        match opened {
            Ok(mut file) => return file.write_all(log.as_bytes()).ok().map(|()| path),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(_) => return None,
        }
    }
    None
}

/// A page-fault event the kernel does not offer, or the usual perf_event_open failures.
pub(crate) fn fault_event_error(event: &str, error: ProgramError) -> anyhow::Error {
    match os_error(&error) {
        Some(libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV) => Error::MissingKernelFeature {
            feature: format!("the {event} perf event"),
            fix: "page faults are counted through it: leave memory out of --focus".into(),
        }
        .into(),
        _ => perf_event_error(event, error),
    }
}

fn os_error(error: &ProgramError) -> Option<i32> {
    match error {
        ProgramError::SyscallError(syscall) => syscall.io_error.raw_os_error(),
        _ => None,
    }
}

pub(crate) fn online_cpus() -> anyhow::Result<Vec<u32>> {
    aya::util::online_cpus()
        .map_err(|(what, error)| anyhow!("{what}: {error}"))
        .context("listing online CPUs")
}

/// Turns perf_event_open failures into the fix a user needs.
pub(crate) fn perf_event_error(event: &str, error: ProgramError) -> anyhow::Error {
    match os_error(&error) {
        Some(libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV) => Error::EventUnsupported {
            event: event.to_string(),
            reason: "no hardware PMU: usual in virtual machines".into(),
        }
        .into(),
        Some(libc::EACCES | libc::EPERM) => {
            Error::PerfEventsRestricted { paranoid: privileges::perf_event_paranoid().unwrap_or(-1) }.into()
        }
        _ => anyhow::Error::new(error).context(format!("opening the {event} perf event")),
    }
}

/// "0-3,6" for a list of CPU numbers.
pub(crate) fn cpu_ranges(cpus: &[u32]) -> String {
    let mut ranges: Vec<String> = Vec::new();
    let mut index = 0;
    while index < cpus.len() {
        let start = cpus[index];
        let mut end = start;
        while index + 1 < cpus.len() && cpus[index + 1] == end + 1 {
            index += 1;
            end = cpus[index];
        }
        ranges.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
        index += 1;
    }
    ranges.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verifier_log_is_never_written_through_a_planted_name() {
        let dir = tempfile::tempdir().unwrap();
        let precious = dir.path().join("precious");
        std::fs::write(&precious, "keep").unwrap();
        let planted = dir.path().join(format!("sysprof-verifier-cpu_sample-{}-0.log", std::process::id()));
        std::os::unix::fs::symlink(&precious, &planted).unwrap();
        let saved = save_log(dir.path(), "cpu_sample", "the log").unwrap();
        assert_ne!(saved, planted);
        assert_eq!(std::fs::read_to_string(&saved).unwrap(), "the log");
        assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep");
    }

    #[test]
    fn cpu_lists_read_as_ranges() {
        assert_eq!(cpu_ranges(&[0, 1, 2, 3]), "0-3");
        assert_eq!(cpu_ranges(&[0, 2, 3, 7]), "0,2-3,7");
        assert_eq!(cpu_ranges(&[5]), "5");
    }
}
