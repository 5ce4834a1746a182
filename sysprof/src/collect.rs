//! The collect stage: while the programs count in the kernel, userspace follows process events
//! (to snapshot memory maps), keeps the status line fresh, and waits for the end of the trace:
//! the duration, Ctrl-C or SIGTERM, the command's exit, or the last target's exit.

use std::{
    process::ExitStatus,
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant, SystemTime},
};

use aya::maps::{MapData, RingBuf};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sysprof_common::{CallEvent, Counter, ProcessEvent, names, process_event};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{Signal, SignalKind, signal},
    sync::Notify,
};

use crate::{
    funcs::FuncTracer,
    gpu::{GpuTracer, state::GpuState},
    launch::{CommandEnd, CommandWatch},
    memory::heap::HeapTracer,
    probes::Probes,
    procs::ProcessTable,
    record::reader::Counters,
    record::{CallOutcome, GpuOutcome, HeapOutcome},
    report::format::thousands,
    selfcost::StatsWindows,
    terminal::{say, stderr_line},
    unwind::{UnwindSummary, Unwinder},
};

/// Why the trace ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndReason {
    Duration,
    /// SIGINT, SIGTERM or SIGHUP.
    Signal(StopSignal),
    /// `-- CMD` exited, and so had every process it started.
    CommandExited,
    /// Every target process (`--pid`) exited.
    TargetsExited,
}

impl EndReason {
    pub fn describe(&self) -> String {
        match self {
            EndReason::Duration => "duration".into(),
            EndReason::Signal(signal) => format!("{} (interrupted)", signal.name()),
            EndReason::CommandExited => "command exit".into(),
            EndReason::TargetsExited => "target exit (all target processes exited)".into(),
        }
    }
}

/// When to stop, besides a signal.
pub struct StopPlan {
    /// When the trace started: the command's release from its gate, or the end of the attach
    /// for a pid or a system-wide trace. The trace's elapsed time and `--duration` count from
    /// here, so a command's start-up is inside them.
    pub started: Instant,
    pub duration: Option<Duration>,
    /// `-- CMD`: the trace lasts while it or any process it started runs.
    pub command: Option<CommandWatch>,
    /// Stop once no target process is left (`--pid`).
    pub stop_when_targets_exit: bool,
}

/// The signals that end a trace early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopSignal {
    Interrupt,
    Terminate,
    /// A lost terminal or ssh session.
    Hangup,
}

impl StopSignal {
    pub fn name(self) -> &'static str {
        match self {
            StopSignal::Interrupt => "SIGINT",
            StopSignal::Terminate => "SIGTERM",
            StopSignal::Hangup => "SIGHUP",
        }
    }

    /// The exit code of a run it interrupted: 128 + the signal, as shells report it.
    pub fn exit_code(self) -> u8 {
        128 + match self {
            StopSignal::Interrupt => libc::SIGINT,
            StopSignal::Terminate => libc::SIGTERM,
            StopSignal::Hangup => libc::SIGHUP,
        } as u8
    }
}

/// SIGINT, SIGTERM and SIGHUP, caught from the very start so that none of them kills sysprof
/// with probes attached and nothing written. The first asks the trace to stop (start-up code
/// polls [`Stop::requested`], the collect loop awaits [`Stop::stopped`]); a second one leaves at
/// once, after killing what sysprof launched ([`Stop::launched`]).
#[derive(Clone)]
pub struct Stop {
    inner: Arc<StopState>,
}

struct StopState {
    first: OnceLock<StopSignal>,
    notify: Notify,
    /// Processes sysprof started (`-- CMD` and its family), with their start times, killed if
    /// sysprof must leave at once.
    launched: Mutex<Vec<(u32, Option<u64>)>>,
}

impl Stop {
    /// Installs the handlers (on the runtime's signal driver) and the task that watches them.
    pub fn register() -> anyhow::Result<Self> {
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        // Started under nohup, sysprof keeps ignoring hangups, as its user asked.
        let mut hangup =
            if signal_ignored(libc::SIGHUP) { None } else { Some(signal(SignalKind::hangup())?) };
        let stop = Stop {
            inner: Arc::new(StopState {
                first: OnceLock::new(),
                notify: Notify::new(),
                launched: Mutex::new(Vec::new()),
            }),
        };
        let state = stop.inner.clone();
        tokio::spawn(async move {
            loop {
                let received = tokio::select! {
                    _ = interrupt.recv() => StopSignal::Interrupt,
                    _ = terminate.recv() => StopSignal::Terminate,
                    Some(()) = recv_optional(&mut hangup) => StopSignal::Hangup,
                };
                if state.first.set(received).is_ok() {
                    state.notify.notify_one();
                    continue;
                }
                for &(pid, started) in state.launched.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                    // Only the very process recorded, not a later one with its pid.
                    if started.is_some() && crate::procs::start_ticks(pid) == started {
                        // SAFETY: kill has no memory preconditions.
                        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                    }
                }
                say!("{} again: exiting without writing the results", received.name());
                std::process::exit(i32::from(received.exit_code()));
            }
        });
        Ok(stop)
    }

    /// The signal that asked the trace to stop, if one did.
    pub fn requested(&self) -> Option<StopSignal> {
        self.inner.first.get().copied()
    }

    /// Waits until a signal asks the trace to stop.
    pub async fn stopped(&self) -> StopSignal {
        loop {
            // The flag, not the notification, is the truth: a permit consumed by a branch
            // that lost a select! race is not a signal lost.
            if let Some(signal) = self.requested() {
                return signal;
            }
            self.inner.notify.notified().await;
        }
    }

    /// Records processes sysprof launched, for a second signal to kill before leaving.
    pub fn launched(&self, pids: &[u32]) {
        let mut launched = self.inner.launched.lock().unwrap_or_else(|e| e.into_inner());
        for &pid in pids {
            if !launched.iter().any(|(known, _)| *known == pid) {
                launched.push((pid, crate::procs::start_ticks(pid)));
            }
        }
    }
}

fn signal_ignored(signo: i32) -> bool {
    let mut current = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
    // SAFETY: a null new action only reads the current one into `current`.
    let read = unsafe { libc::sigaction(signo, std::ptr::null(), current.as_mut_ptr()) } == 0;
    // SAFETY: zeroed, then filled by the kernel when `read`.
    read && unsafe { current.assume_init() }.sa_sigaction == libc::SIG_IGN
}

async fn recv_optional(signal: &mut Option<Signal>) -> Option<()> {
    match signal {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}

/// Live status on stderr: elapsed time, samples, lost events. Hidden when stderr is not a
/// terminal or with --quiet.
pub struct StatusLine {
    bar: ProgressBar,
    /// What the status adds after the counts ("the command's processes still run").
    note: Mutex<Option<&'static str>>,
}

impl StatusLine {
    pub fn new(quiet: bool) -> Self {
        let target = if quiet { ProgressDrawTarget::hidden() } else { ProgressDrawTarget::stderr() };
        let bar = ProgressBar::with_draw_target(None, target);
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        StatusLine { bar, note: Mutex::new(None) }
    }

    fn update(&self, elapsed: Duration, samples: u64, lost: u64) {
        let note = self.note.lock().map(|note| *note).unwrap_or(None);
        self.bar.set_message(format!(
            "tracing {:.1}s · {} · {} lost · {}Ctrl-C to stop",
            elapsed.as_secs_f64(),
            crate::report::format::count(samples, "sample", "samples"),
            thousands(lost),
            note.map(|note| format!("{note} · ")).unwrap_or_default(),
        ));
        self.bar.tick();
    }

    /// Adds `note` to the status from now on.
    fn set_note(&self, note: &'static str) {
        if let Ok(mut current) = self.note.lock() {
            *current = Some(note);
        }
    }

    /// A line above the status (or just the line, without a terminal).
    fn println(&self, line: &str) {
        if self.bar.is_hidden() {
            stderr_line(format_args!("{line}"));
        } else {
            self.bar.println(line);
        }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// How often due map rescans run (new processes are rescanned at 5 and 30 ms of age).
const TICK: Duration = Duration::from_millis(20);
/// The tick while sysprof rests (see `Cadence`): the status line's and the targets' liveness
/// check's period.
const REST_TICK: Duration = STATUS_EVERY;
/// Ticks in a row that find nothing before sysprof rests.
const QUIET_TICKS: u32 = 5;
/// How often the status line is redrawn and the targets' liveness checked.
const STATUS_EVERY: Duration = Duration::from_millis(250);

/// How often the collect loop wakes for what does not wake it (forks, exits, mapped libraries,
/// probed calls' events, the timeline; see the programs' `events::wakeup`). Every `TICK` while anything happens; after
/// `QUIET_TICKS` that find nothing, sysprof rests: it ticks every `REST_TICK` (or the memory
/// reads' or the maps rescans' period, if shorter), and tells the programs (`names::USERSPACE_RESTING`), so
/// that the first process event, or a timeline ring a quarter full, wakes it instead of
/// waiting. A trace of an idle or CPU-bound target woke sysprof 67 times a second, 11 resting;
/// where the target kept every CPU busy, each wakeup preempted it: 70 preemptions a second more
/// than it had without sysprof, 14 resting.
struct Cadence {
    quiet_ticks: u32,
    resting: bool,
    rest_tick: Duration,
    /// A quarter of the timeline ring's events: a tick is quiet while the timeline comes at a
    /// rate that would not fill that much in `rest_tick` (when the programs would wake
    /// sysprof anyway).
    timeline_quarter: usize,
    /// When the last tick ran, and `ProcessTable::maps_version` then.
    last_tick: Instant,
    maps_version: u64,
}

impl Cadence {
    fn new(processes: &ProcessTable) -> Self {
        // No longer than the memory reads' or the maps rescans' period (0.2 s while GPU
        // libraries are probed and no syscall announces their mapping).
        let rest_tick = [processes.memory_interval(), Some(processes.rescan_interval())]
            .into_iter()
            .flatten()
            .fold(REST_TICK, Duration::min)
            .max(TICK);
        Cadence {
            quiet_ticks: 0,
            resting: false,
            rest_tick,
            timeline_quarter: sysprof_common::timeline::CAPACITY as usize
                / size_of::<sysprof_common::timeline::TimelineEvent>()
                / 4,
            last_tick: Instant::now(),
            maps_version: processes.maps_version(),
        }
    }

    /// The wait until the next tick.
    fn tick(&self) -> Duration {
        if self.resting { self.rest_tick } else { TICK }
    }

    /// Whether the tick just run found nothing to do: no process or call event, the timeline slow
    /// (see `timeline_quarter`), no maps changed, no table awaited.
    fn quiet(&mut self, events: usize, timeline: usize, processes: &ProcessTable, unwinding: bool) -> bool {
        let now = Instant::now();
        let since = now.duration_since(std::mem::replace(&mut self.last_tick, now));
        let slow_timeline = timeline as u128 * self.rest_tick.as_micros()
            <= self.timeline_quarter as u128 * since.as_micros();
        let maps_version = std::mem::replace(&mut self.maps_version, processes.maps_version());
        events == 0 && slow_timeline && maps_version == self.maps_version && !unwinding
    }

    /// After a tick: rests after `QUIET_TICKS` quiet ones, and stops resting at a busy one.
    fn after_tick(&mut self, quiet: bool, probes: &mut Probes) {
        if !quiet {
            self.quiet_ticks = 0;
            self.wake(probes);
            return;
        }
        self.quiet_ticks += 1;
        if !self.resting && self.quiet_ticks >= QUIET_TICKS {
            // Told to the programs first: an event sent before it did not wake sysprof, and
            // the caller drains once more after this.
            self.resting = probes.set(names::USERSPACE_RESTING, 0, 1u32).is_ok();
        }
    }

    /// Ends a rest: an event woke sysprof, or a tick found something.
    fn wake(&mut self, probes: &mut Probes) {
        if self.resting {
            self.resting = false;
            self.quiet_ticks = 0;
            // The programs clear it as they wake sysprof, but not for an exec or a Python
            // stack, which wake it anyway.
            let _ = probes.set(names::USERSPACE_RESTING, 0, 0u32);
        }
    }
}

/// When and how the trace ran, as the collect stage ends it.
pub(crate) struct TraceEnd {
    pub started_at: SystemTime,
    pub elapsed: Duration,
    /// CLOCK_MONOTONIC at the end, for threads still on a CPU then.
    pub end_ns: u64,
    pub ended_by: EndReason,
    /// How `-- CMD` ended, when there is one.
    pub command: Option<CommandEnd>,
    pub machine_busy_share: Option<f64>,
    /// Share of the run the kernel's BPF statistics were on.
    pub stats_coverage: f64,
    /// The programs' runs and run time during the trace.
    pub costs: Vec<crate::probes::ProgramCost>,
    /// What the unwinder did, when it ran.
    pub unwind: Option<UnwindSummary>,
    /// The kernel memory of the maps and programs when the trace started.
    pub kernel_memory: crate::kernel_memory::Snapshot,
    /// The NVML polls' interval at the end, when NVML was polled.
    pub gpu_interval: Option<Duration>,
}

/// The uprobe side of the trace: GPU libraries, `--func` functions and the allocator
/// (`--malloc`), attached as the target maps them, and the events of the calls that carry
/// arguments.
pub struct UprobeTracers {
    pub gpu: Option<GpuTracer>,
    pub funcs: FuncTracer,
    pub heap: Option<HeapTracer>,
    /// `ProcessTable::maps_version` at the last look.
    pub seen_maps: u64,
}

impl UprobeTracers {
    /// Attaches to libraries and binaries the target mapped since the last look (dlopen,
    /// exec of a new program).
    pub fn attach_new(&mut self, probes: &mut Probes, processes: &ProcessTable) {
        if let Some(heap) = &mut self.heap {
            heap.release_exited(probes, processes);
        }
        if processes.maps_version() == self.seen_maps {
            return;
        }
        let since = std::mem::replace(&mut self.seen_maps, processes.maps_version());
        if let Some(gpu) = &mut self.gpu {
            gpu.attach_new(probes, processes, since);
        }
        self.funcs.attach_ready(probes, processes, since);
        if let Some(heap) = &mut self.heap {
            heap.attach_new(probes, processes, since);
        }
    }

    fn on_event(&mut self, event: &CallEvent) {
        if let Some(gpu) = &mut self.gpu {
            gpu.state.on_event(event);
            if let Some(kept) = &mut gpu.kept_events {
                kept.push(crate::record::reader::Bytes::of(event));
            }
        }
    }

    /// The GPU state and what the tracers found, once the trace is over.
    pub fn into_outcome(self) -> (Option<GpuState>, CallOutcome) {
        let mut state = None;
        let gpu = self.gpu.map(|gpu| {
            state = Some(gpu.state);
            GpuOutcome {
                libraries: gpu.libraries,
                problems: gpu.problems,
                events: gpu.kept_events.unwrap_or_default(),
            }
        });
        let heap = self.heap.map(|heap| HeapOutcome { allocators: heap.allocators, problems: heap.problems });
        let outcome = CallOutcome { gpu, heap, functions: self.funcs.probed() };
        (state, outcome)
    }
}

/// What the collect stage ends with.
#[derive(Debug)]
pub struct Collected {
    pub ended_by: EndReason,
    pub elapsed: Duration,
    /// CLOCK_MONOTONIC at the end, when the programs stopped counting.
    pub end_ns: u64,
    /// Share of the run the kernel's BPF statistics were on (see `selfcost::StatsWindows`).
    pub stats_coverage: f64,
    /// The programs' runs and run time during the trace (see `selfcost::StatsWindows`).
    pub costs: Vec<crate::probes::ProgramCost>,
    /// `-- CMD`, and how it ended if it did (see [`CommandWatch::end`] for the rest).
    pub command: Option<CommandWatch>,
}

/// Runs until the trace should end; returns why, and how long it ran.
#[expect(clippy::too_many_arguments, reason = "the collect stage's inputs, each owned elsewhere")]
pub async fn collect(
    probes: &mut Probes,
    events: RingBuf<MapData>,
    calls: &mut UprobeTracers,
    mut timeline: Option<&mut crate::timeline::Collector>,
    processes: &mut ProcessTable,
    mut unwinder: Option<&mut Unwinder>,
    mut plan: StopPlan,
    stop: &Stop,
    status: &StatusLine,
    quiet: bool,
) -> anyhow::Result<Collected> {
    let started = plan.started;
    let mut stats_windows = StatsWindows::start(probes);
    // SAFETY: the ring buffer owns its map fd, which stays open and unchanged until the
    // AsyncFd (which owns the ring buffer) is dropped.
    let mut events =
        unsafe { AsyncFd::register(events) }.map_err(|e| anyhow::anyhow!("polling the event ring: {e}"))?;
    let mut call_events = None;
    map_call_events(probes, &mut call_events)?;
    let mut cadence = Cadence::new(processes);
    let mut next_tick = tokio::time::Instant::now();
    let mut last_status = started - STATUS_EVERY;
    let deadline = plan.duration.map(|d| tokio::time::Instant::from_std(started + d));
    let mut command = plan.command.take();
    // When to read the events again after an exec woke the loop: the execs of the next
    // `EXEC_WAKEUP_GAP_NS` do not wake it (see the programs' `events::wakeup`).
    let mut exec_recheck = None;

    let reason = loop {
        tokio::select! {
            signal = stop.stopped() => break EndReason::Signal(signal),
            _ = sleep_until(deadline) => break EndReason::Duration,
            exit = wait(&mut command) => {
                // Drain first: the fork events of what it left running may still be queued.
                drain_events(events.get_mut(), processes);
                let left = processes.running();
                if left.is_empty() {
                    break EndReason::CommandExited;
                }
                if !quiet {
                    status.println(&format!(
                        "sysprof: the command exited ({}); {} process{} it started still run{}: tracing until \
                         {} (Ctrl-C to stop)",
                        crate::launch::describe_exit(exit).0,
                        left.len(),
                        if left.len() == 1 { "" } else { "es" },
                        if left.len() == 1 { "s" } else { "" },
                        if left.len() == 1 { "it exits" } else { "they exit" },
                    ));
                }
                status.set_note("the command's processes still run");
                plan.stop_when_targets_exit = true;
            }
            guard = events.readable_mut() => {
                let mut guard = guard?;
                if drain_events(guard.get_inner_mut(), processes).exec {
                    exec_recheck = Some(
                        tokio::time::Instant::now() + Duration::from_nanos(process_event::EXEC_WAKEUP_GAP_NS),
                    );
                }
                guard.clear_ready();
                if cadence.resting {
                    cadence.wake(probes);
                    next_tick = next_tick.min(tokio::time::Instant::now() + TICK);
                }
                // An exec or a dlopen: its tables now, not at the next tick.
                if let Some(unwinder) = unwinder.as_deref_mut() {
                    unwinder.sync(probes, processes);
                }
            }
            _ = sleep_until(exec_recheck) => {
                exec_recheck = None;
                drain_events(events.get_mut(), processes);
                if let Some(unwinder) = unwinder.as_deref_mut() {
                    unwinder.sync(probes, processes);
                }
            }
            // Only the first call event while sysprof rests, or a ring a quarter full, wakes
            // it (the programs' `calls::event_wakeup`); the others are drained on the tick.
            guard = readable(&mut call_events) => {
                let mut guard = guard?;
                drain_calls(guard.get_inner_mut(), calls);
                guard.clear_ready();
                if cadence.resting {
                    cadence.wake(probes);
                    next_tick = next_tick.min(tokio::time::Instant::now() + TICK);
                }
            }
            _ = sleep_until(processes.next_early_rescan().map(tokio::time::Instant::from_std)) => {
                processes.rescan_due();
                if let Some(unwinder) = unwinder.as_deref_mut() {
                    unwinder.sync(probes, processes);
                }
            }
            // On its own deadline, not the tick's: a window lasts a few milliseconds.
            _ = sleep_until(stats_windows.next_change().map(tokio::time::Instant::from_std)) => {
                stats_windows.tick(probes);
            }
            woken = timeline_woken(&mut timeline) => {
                woken?;
                if let Some(timeline) = timeline.as_deref_mut() {
                    drain_timeline(timeline, probes);
                }
                if cadence.resting {
                    cadence.wake(probes);
                    next_tick = next_tick.min(tokio::time::Instant::now() + TICK);
                }
            }
            _ = tokio::time::sleep_until(next_tick) => {
                let timeline_events = timeline.as_deref_mut().map_or(0, |timeline| drain_timeline(timeline, probes));
                // Forks, exits and mapped libraries do not wake sysprof (see the programs'
                // `events::wakeup`): they are read here, if no exec came first.
                let drained = drain_events(events.get_mut(), processes);
                let call_events_drained =
                    call_events.as_mut().map_or(0, |ring| drain_calls(ring.get_mut(), calls));
                forget_ended_targets(probes, processes);
                processes.rescan_due();
                processes.sample_memory_due();
                calls.attach_new(probes, processes);
                map_call_events(probes, &mut call_events)?;
                if let Some(unwinder) = unwinder.as_deref_mut() {
                    unwinder.sync(probes, processes);
                }
                let unwinding = unwinder.as_deref().is_some_and(Unwinder::waiting);
                let was_resting = cadence.resting;
                let quiet =
                    cadence.quiet(drained.events + call_events_drained, timeline_events, processes, unwinding);
                cadence.after_tick(quiet, probes);
                // An event sent just before the programs were told did not wake sysprof.
                if cadence.resting && !was_resting && drain_events(events.get_mut(), processes).events > 0 {
                    cadence.wake(probes);
                }
                next_tick = tokio::time::Instant::now() + cadence.tick();
                if last_status.elapsed() >= STATUS_EVERY {
                    last_status = Instant::now();
                    // Read once a round: it looks at every followed process in /proc.
                    let running = (plan.stop_when_targets_exit || command.is_some()).then(|| processes.running());
                    if let Some(running) = &running {
                        if plan.stop_when_targets_exit && running.is_empty() {
                            break match &command {
                                Some(_) => EndReason::CommandExited,
                                None => EndReason::TargetsExited,
                            };
                        }
                        // The command itself is recorded at launch; these are what it started.
                        if command.is_some() {
                            stop.launched(running);
                        }
                    }
                    if let Ok(counters) = Counters::now(probes) {
                        let lost = Counter::ALL.iter().filter(|c| c.is_loss()).map(|c| counters.get(*c)).sum();
                        status.update(started.elapsed(), counters.get(Counter::CpuSamples), lost);
                    }
                }
            }
        }
    };
    // Events that arrived just before the end still matter (a child that exited last).
    drain_events(events.get_mut(), processes);
    if let Some(ring) = &mut call_events {
        drain_calls(ring.get_mut(), calls);
    }
    // The kernel side's end: nothing counts from here, however long the read-out takes.
    let end_ns = crate::probes::monotonic_ns();
    let elapsed = started.elapsed();
    probes.close_window(end_ns)?;
    let stats_coverage = stats_windows.finish(probes);
    // The programs' cost is the trace's, read as it ends: the read-out's thousands of map
    // reads are system calls too, sysprof's own, whose programs' runs are in its CPU time, not
    // in a cost of the trace (where the kernel's statistics are on for good, they counted a
    // sixth of a `make -j2`'s BPF time).
    let costs = stats_windows.costs(probes.costs(), stats_coverage);
    probes.settle_fault_counts()?;
    Ok(Collected { ended_by: reason, elapsed, end_ns, stats_coverage, costs, command })
}

/// Takes the target processes that exited since the last tick out of the kernel's target set
/// (`Probes::forget_ended_target`), once nothing of them is left. A machine with the default
/// `pid_max` of small hosts (32,768) gives an ended process's pid out again after that many
/// new processes, and the process that gets it is not a target; a command that started more
/// than 16,384 processes filled the set, after which its new ones were not followed.
fn forget_ended_targets(probes: &mut Probes, processes: &mut ProcessTable) {
    for pid in processes.take_exited() {
        // One still running (its leader's exit was taken for its own where the kernel's
        // offsets are unknown) stays, and so does one whose removal fails, as every ended one
        // did before: that costs room in the set, not a figure.
        if !crate::target::process_alive(pid) {
            let _ = probes.forget_ended_target(pid);
        }
    }
}

/// What a drain of the process events found.
struct Drained {
    events: usize,
    exec: bool,
}

/// Applies the process events the kernel sent.
fn drain_events(ring: &mut RingBuf<MapData>, processes: &mut ProcessTable) -> Drained {
    let mut drained = Drained { events: 0, exec: false };
    while let Some(item) = ring.next() {
        if item.len() >= size_of::<ProcessEvent>() {
            // SAFETY: the kernel wrote a whole ProcessEvent (checked length); read_unaligned
            // because ring buffer records are only 8-byte aligned by convention.
            let event = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<ProcessEvent>()) };
            drained.exec |= event.kind == process_event::EXEC;
            drained.events += 1;
            processes.on_event(&event);
        }
    }
    drained
}

/// Applies the probed calls' events the kernel sent; how many.
fn drain_calls(ring: &mut RingBuf<MapData>, calls: &mut UprobeTracers) -> usize {
    let mut drained = 0;
    while let Some(item) = ring.next() {
        if item.len() >= size_of::<CallEvent>() {
            // SAFETY: as in drain_events, for a CallEvent.
            let event = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<CallEvent>()) };
            calls.on_event(&event);
            drained += 1;
        }
    }
    drained
}

/// Drains the timeline's ring (how many events), then tells the programs its raised minimum,
/// once its bound raised it: a hot probed function or a storm of short waits then costs no
/// event the next drain would drop.
fn drain_timeline(timeline: &mut crate::timeline::Collector, probes: &mut Probes) -> usize {
    let drained = timeline.drain();
    // Where it cannot be written, the events still come and are dropped on arrival, and the
    // next drain tries again.
    if let Some(minimum) = timeline.raised_minimum_to_tell()
        && probes.set(names::TIMELINE_RAISED_MIN, 0, minimum).is_ok()
    {
        timeline.told_kernel(minimum);
    }
    drained
}

/// The timeline ring's wakeup (see `timeline::Collector::woken`); never when there is none.
async fn timeline_woken(timeline: &mut Option<&mut crate::timeline::Collector>) -> std::io::Result<()> {
    match timeline {
        Some(timeline) => timeline.woken().await,
        None => std::future::pending().await,
    }
}

/// Readiness of an optional ring buffer; never ready when there is none.
/// Maps the ring of the probed calls' events once a call probe is attached (a GPU library,
/// `--func`): its pages count in sysprof's memory (4 MiB, mapped twice), and most traces probe
/// nothing. What the probes sent before waits in the kernel's ring meanwhile.
fn map_call_events(probes: &mut Probes, ring: &mut Option<AsyncFd<RingBuf<MapData>>>) -> anyhow::Result<()> {
    if ring.is_some()
        || !probes.attached().iter().any(|probe| Probes::is_program(&probe.program, "call_enter"))
    {
        return Ok(());
    }
    // SAFETY: the ring buffer owns its map fd, which stays open and unchanged until the
    // AsyncFd (which owns the ring buffer) is dropped.
    let registered = unsafe { AsyncFd::register(probes.take_call_events()?) }
        .map_err(|e| anyhow::anyhow!("polling the call-event ring: {e}"))?;
    *ring = Some(registered);
    Ok(())
}

async fn readable(
    ring: &mut Option<AsyncFd<RingBuf<MapData>>>,
) -> std::io::Result<tokio::io::unix::AsyncFdReadyMutGuard<'_, RingBuf<MapData>>> {
    match ring {
        Some(ring) => ring.readable_mut().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Resolves once, when the command exits; never again after that.
async fn wait(command: &mut Option<CommandWatch>) -> ExitStatus {
    match command {
        Some(command) => command.exited().await,
        None => std::future::pending().await,
    }
}
