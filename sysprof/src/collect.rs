//! The collect stage: while the programs count in the kernel, userspace follows process events
//! (to snapshot memory maps), keeps the status line fresh, and waits for the end of the trace:
//! the duration, Ctrl-C or SIGTERM, the command's exit, or the last target's exit.

use std::time::{Duration, Instant};

use aya::maps::{MapData, RingBuf};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sysprof_common::{CallEvent, Counter, ProcessEvent};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{Signal, SignalKind, signal},
    sync::oneshot,
};

use crate::{
    funcs::FuncTracer, gpu::GpuTracer, memory::heap::HeapTracer, output::thousands, probes::Probes,
    procs::ProcessTable, selfcost::StatsWindows, target,
};

/// Why the trace ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndReason {
    Duration,
    /// SIGINT or SIGTERM, by name.
    Signal(&'static str),
    CommandExited(std::process::ExitStatus),
    /// Every target process (`--pid`) exited.
    TargetsExited,
}

impl EndReason {
    pub fn describe(&self) -> String {
        match self {
            EndReason::Duration => "duration".into(),
            EndReason::Signal(name) => format!("{name} (interrupted)"),
            EndReason::CommandExited(_) => "command exit".into(),
            EndReason::TargetsExited => "target exit (all target processes exited)".into(),
        }
    }
}

/// When to stop, besides a signal.
pub struct StopPlan {
    pub duration: Option<Duration>,
    /// Resolves when `-- CMD` exits.
    pub command_exit: Option<oneshot::Receiver<std::process::ExitStatus>>,
    /// Stop once no target process is left (`--pid`).
    pub stop_when_targets_exit: bool,
}

/// The signal streams, registered before the trace starts so that Ctrl-C is never the default
/// (kill) action once probes are attached; kept after the trace to catch a second Ctrl-C.
pub struct Signals {
    pub interrupt: Signal,
    pub terminate: Signal,
}

impl Signals {
    pub fn register() -> anyhow::Result<Self> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }
}

/// Live status on stderr: elapsed time, samples, lost events. Hidden when stderr is not a
/// terminal or with --quiet.
pub struct StatusLine {
    bar: ProgressBar,
}

impl StatusLine {
    pub fn new(quiet: bool) -> Self {
        let target = if quiet { ProgressDrawTarget::hidden() } else { ProgressDrawTarget::stderr() };
        let bar = ProgressBar::with_draw_target(None, target);
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        StatusLine { bar }
    }

    fn update(&self, elapsed: Duration, samples: u64, lost: u64) {
        self.bar.set_message(format!(
            "tracing {:.1}s · {} samples · {} lost · Ctrl-C to stop",
            elapsed.as_secs_f64(),
            thousands(samples),
            thousands(lost)
        ));
        self.bar.tick();
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// How often due map rescans run (new processes are rescanned at 5 and 30 ms of age).
const TICK: Duration = Duration::from_millis(20);
/// How often the status line is redrawn and the targets' liveness checked.
const STATUS_EVERY: Duration = Duration::from_millis(250);

/// The uprobe side of the trace: GPU libraries, `--func` functions and the allocator
/// (`--malloc`), attached as the target maps them, and the events of the calls that carry
/// arguments.
pub struct CallTracing {
    pub gpu: Option<GpuTracer>,
    pub funcs: FuncTracer,
    pub heap: Option<HeapTracer>,
    pub events: Option<RingBuf<MapData>>,
    /// `ProcessTable::maps_version` at the last look.
    pub seen_maps: u64,
}

impl CallTracing {
    /// Attaches to libraries and binaries the target mapped since the last look (dlopen,
    /// exec of a new program).
    pub fn attach_new(&mut self, probes: &mut Probes, processes: &ProcessTable) {
        if let Some(heap) = &mut self.heap {
            heap.release_exited(probes, processes);
        }
        if processes.maps_version() == self.seen_maps {
            return;
        }
        self.seen_maps = processes.maps_version();
        if let Some(gpu) = &mut self.gpu {
            gpu.attach_new(probes, processes);
        }
        self.funcs.attach_ready(probes, processes);
        if let Some(heap) = &mut self.heap {
            heap.attach_new(probes, processes);
        }
    }

    fn on_event(&mut self, event: &CallEvent) {
        if let Some(gpu) = &mut self.gpu {
            gpu.state.on_event(event);
        }
    }
}

/// What the collect stage ends with.
#[derive(Debug)]
pub struct Collected {
    pub ended_by: EndReason,
    pub elapsed: Duration,
    /// Share of the run the kernel's BPF statistics were on (see `selfcost::StatsWindows`).
    pub stats_coverage: f64,
}

/// Runs until the trace should end; returns why, and how long it ran.
pub async fn collect(
    probes: &mut Probes,
    events: RingBuf<MapData>,
    calls: &mut CallTracing,
    processes: &mut ProcessTable,
    mut plan: StopPlan,
    signals: &mut Signals,
    status: &StatusLine,
) -> anyhow::Result<Collected> {
    let started = Instant::now();
    let mut stats_windows = StatsWindows::start(probes);
    // SAFETY: the ring buffer owns its map fd, which stays open and unchanged until the
    // AsyncFd (which owns the ring buffer) is dropped.
    let mut events =
        unsafe { AsyncFd::register(events) }.map_err(|e| anyhow::anyhow!("polling the event ring: {e}"))?;
    let mut call_events = match calls.events.take() {
        // SAFETY: as above.
        Some(ring) => Some(
            unsafe { AsyncFd::register(ring) }
                .map_err(|e| anyhow::anyhow!("polling the call-event ring: {e}"))?,
        ),
        None => None,
    };
    let mut tick = tokio::time::interval(TICK);
    let mut last_status = started - STATUS_EVERY;
    let deadline = plan.duration.map(|d| tokio::time::Instant::from_std(started + d));
    let mut command_exit = plan.command_exit.take();

    let reason = loop {
        tokio::select! {
            _ = signals.interrupt.recv() => break EndReason::Signal("SIGINT"),
            _ = signals.terminate.recv() => break EndReason::Signal("SIGTERM"),
            _ = sleep_until(deadline) => break EndReason::Duration,
            status = wait(&mut command_exit) => break EndReason::CommandExited(status),
            guard = events.readable_mut() => {
                let mut guard = guard?;
                drain_events(guard.get_inner_mut(), processes);
                guard.clear_ready();
            }
            guard = readable(&mut call_events) => {
                let mut guard = guard?;
                drain_calls(guard.get_inner_mut(), calls);
                guard.clear_ready();
            }
            _ = tick.tick() => {
                processes.rescan_due();
                processes.sample_memory_due();
                calls.attach_new(probes, processes);
                stats_windows.tick(probes);
                if last_status.elapsed() >= STATUS_EVERY {
                    last_status = Instant::now();
                    if plan.stop_when_targets_exit && !processes.live_pids().any(target::process_alive) {
                        break EndReason::TargetsExited;
                    }
                    if let Ok(counters) = probes.counters() {
                        let lost = Counter::ALL
                            .iter()
                            .filter(|c| **c != Counter::CpuSamples)
                            .map(|c| counters.get(*c))
                            .sum();
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
    let stats_coverage = stats_windows.finish(probes);
    Ok(Collected { ended_by: reason, elapsed: started.elapsed(), stats_coverage })
}

fn drain_events(ring: &mut RingBuf<MapData>, processes: &mut ProcessTable) {
    while let Some(item) = ring.next() {
        if item.len() >= size_of::<ProcessEvent>() {
            // SAFETY: the kernel wrote a whole ProcessEvent (checked length); read_unaligned
            // because ring buffer records are only 8-byte aligned by convention.
            let event = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<ProcessEvent>()) };
            processes.on_event(&event);
        }
    }
}

fn drain_calls(ring: &mut RingBuf<MapData>, calls: &mut CallTracing) {
    while let Some(item) = ring.next() {
        if item.len() >= size_of::<CallEvent>() {
            // SAFETY: as in drain_events, for a CallEvent.
            let event = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<CallEvent>()) };
            calls.on_event(&event);
        }
    }
}

/// Readiness of an optional ring buffer; never ready when there is none.
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

async fn wait(exit: &mut Option<oneshot::Receiver<std::process::ExitStatus>>) -> std::process::ExitStatus {
    match exit {
        Some(receiver) => match receiver.await {
            Ok(status) => status,
            // The waiting thread is gone without a status: never end the trace for that.
            Err(_) => {
                *exit = None;
                std::future::pending().await
            }
        },
        None => std::future::pending().await,
    }
}

/// Waits for `child` on a thread and reports its status through the returned receiver.
pub fn watch_child(mut child: std::process::Child) -> oneshot::Receiver<std::process::ExitStatus> {
    let (sender, receiver) = oneshot::channel();
    std::thread::spawn(move || {
        if let Ok(status) = child.wait() {
            let _ = sender.send(status);
        }
    });
    receiver
}
