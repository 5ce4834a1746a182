//! sysprof's own cost: time in its BPF programs (kernel BPF statistics) and the CPU time and
//! peak memory of its own process. Every report carries these: a profiler that hides its cost
//! cannot be trusted about anyone else's.
//!
//! The kernel's statistics time every run of every BPF program on the machine, two clock reads
//! per run: on a syscall-heavy target that costs more than sysprof's programs themselves (a
//! getuid loop ran 85 ns a call slower with them on, here). So they are on in short windows
//! ([`StatsWindows`]): 2 ms at the start, then 10 ms every second, 1% of a long trace. The first
//! window counts as itself, and the later ones' runs and time are scaled to the rest of the trace
//! (`StatsWindows::costs`). Where they are on already
//! for the whole machine (`sysctl kernel.bpf_stats_enabled=1`, as `cargo xtask bench` sets for
//! its realistic rows), they cover the whole trace and nothing is scaled.

use std::time::{Duration, Instant};

use nix::sys::resource::{UsageWho, getrusage};

use crate::{
    probes::{Probes, ProgramCost},
    report::Overhead,
};

// Short windows. Not more often: turning the statistics on or off patches the kernel's code,
// which stops every CPU for a moment (`smp_text_poke_batch_finish`), and takes sysprof 150 to
// 330 us.
const WINDOW: Duration = Duration::from_millis(10);
const WINDOW_EVERY: Duration = Duration::from_secs(1);

/// The first window, at the start, is shorter: it falls on a launched command's first
/// milliseconds, a large share of a short command's run: 10 ms of it cost a 0.27 s getuid
/// loop about 4 ns a call, and 2 ms about 1.
const FIRST_WINDOW: Duration = Duration::from_millis(2);

/// When the kernel's BPF statistics are on, and for how long they were.
#[derive(Debug)]
pub struct StatsWindows {
    /// The programs' statistics when the trace started: the probe calibration's runs, and
    /// whatever ran before the first window, are not the trace's.
    pub baseline: Vec<ProgramCost>,
    started: Instant,
    on_since: Option<Instant>,
    covered: Duration,
    /// The programs' statistics as the first window closed, and its length: that window is at
    /// the start by design, over a launched command's first milliseconds (its loader's and
    /// its first children's syscalls, the densest of a build), so it stands for itself only,
    /// not for the rest of the run (see `costs`).
    first: Option<(Vec<ProgramCost>, Duration)>,
    /// The run's length, from the start to `finish`.
    total: Duration,
    next_change: Instant,
    /// The statistics were on for the whole machine when the trace started.
    always: bool,
}

impl StatsWindows {
    /// Starts the first window.
    pub fn start(probes: &mut Probes) -> Self {
        let baseline = probes.costs();
        let now = Instant::now();
        probes.set_stats(true);
        let always =
            std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").is_ok_and(|on| on.trim() == "1");
        StatsWindows {
            baseline,
            started: now,
            on_since: Some(now),
            covered: Duration::ZERO,
            first: None,
            total: Duration::ZERO,
            next_change: now + FIRST_WINDOW,
            always,
        }
    }

    /// When the next window opens or closes; `None` when the statistics stay on.
    pub fn next_change(&self) -> Option<Instant> {
        (!self.always).then_some(self.next_change)
    }

    /// Opens or closes a window when due.
    pub fn tick(&mut self, probes: &mut Probes) {
        let now = Instant::now();
        if self.always || now < self.next_change {
            return;
        }
        match self.on_since.take() {
            Some(since) => {
                probes.set_stats(false);
                self.covered += now - since;
                if self.first.is_none() {
                    self.first = Some((probes.costs(), now - since));
                }
                self.next_change = now + WINDOW_EVERY - WINDOW;
            }
            None => {
                probes.set_stats(true);
                self.on_since = Some(now);
                self.next_change = now + WINDOW;
            }
        }
    }

    /// Closes the last window; returns the share of the trace the windows covered (0 to 1).
    pub fn finish(&mut self, probes: &mut Probes) -> f64 {
        let now = Instant::now();
        if let Some(since) = self.on_since.take() {
            self.covered += now - since;
        }
        probes.set_stats(false);
        let total = now - self.started;
        self.total = total;
        if total.is_zero() { 1.0 } else { (self.covered.as_secs_f64() / total.as_secs_f64()).min(1.0) }
    }

    /// The programs' runs and time for [`overhead`] to scale by `coverage` (what `finish`
    /// returned), from their statistics `now` (after `finish`). The first window counts as
    /// itself, and the later ones stand for the rest of the run: in a `make -j2` trace the
    /// first window's 2 ms, scaled like the others, put the BPF time at 1.2% of the CPU time
    /// available, against 0.51% timed whole. Given back multiplied by `coverage`, so that
    /// `overhead`'s one scaling yields that estimate. Scaled as one where the statistics were on
    /// throughout, or no later window ran.
    pub fn costs(&self, now: Vec<ProgramCost>, coverage: f64) -> Vec<ProgramCost> {
        let whole = since(now.clone(), &self.baseline);
        let Some((at_first, first_length)) = &self.first else { return whole };
        let later_covered = self.covered.saturating_sub(*first_length);
        let rest = self.total.saturating_sub(*first_length);
        if self.always || later_covered.is_zero() || rest.is_zero() {
            return whole;
        }
        let later_scale = rest.as_secs_f64() / later_covered.as_secs_f64();
        let first = since(at_first.clone(), &self.baseline);
        since(now, at_first)
            .into_iter()
            .map(|later| {
                let (runs, time) = first
                    .iter()
                    .find(|f| f.program == later.program)
                    .map_or((0, 0), |f| (f.run_count, f.run_time_ns));
                let estimate = |first: u64, later: u64| first as f64 + later as f64 * later_scale;
                ProgramCost {
                    run_count: (estimate(runs, later.run_count) * coverage).round() as u64,
                    run_time_ns: (estimate(time, later.run_time_ns) * coverage).round() as u64,
                    program: later.program,
                }
            })
            .collect()
    }
}

/// The programs' runs and run time since `baseline` (the start of the trace).
pub fn since(now: Vec<ProgramCost>, baseline: &[ProgramCost]) -> Vec<ProgramCost> {
    now.into_iter()
        .map(|p| match baseline.iter().find(|b| b.program == p.program) {
            Some(b) => ProgramCost {
                run_count: p.run_count.saturating_sub(b.run_count),
                run_time_ns: p.run_time_ns.saturating_sub(b.run_time_ns),
                program: p.program,
            },
            None => p,
        })
        .collect()
}

/// The overhead section for a run of `duration` on `cpus` CPUs, from the programs' statistics
/// measured over `coverage` of the run. The sampling program cannot run more often than
/// `frequency_hz` on every CPU: its scaled figures are held to that.
pub fn overhead(
    measured: Vec<ProgramCost>,
    stats_available: bool,
    coverage: f64,
    duration: Duration,
    cpus: u32,
    frequency_hz: u64,
) -> Overhead {
    let scale = if coverage > 0.0 { 1.0 / coverage } else { 0.0 };
    let sampling_bound = (frequency_hz as f64 * f64::from(cpus.max(1)) * duration.as_secs_f64()).ceil();
    let programs: Vec<ProgramCost> = measured
        .into_iter()
        .map(|p| {
            let mut runs = p.run_count as f64 * scale;
            let mut time = p.run_time_ns as f64 * scale;
            if p.program == "cpu_sample" && runs > sampling_bound {
                // The time per run is what was measured; the runs are what the clock allows.
                time *= sampling_bound / runs;
                runs = sampling_bound;
            }
            ProgramCost {
                program: p.program,
                run_count: runs.round() as u64,
                run_time_ns: time.round() as u64,
            }
        })
        .collect();
    let bpf_time_ns = crate::record::reader::saturating_sum(programs.iter().map(|p| p.run_time_ns));
    let available_ns = duration.as_nanos() as f64 * f64::from(cpus.max(1));
    let (sysprof_cpu_s, sysprof_peak_rss_kib) = own_usage();
    Overhead {
        bpf_stats_available: stats_available,
        bpf_stats_coverage: coverage,
        programs,
        bpf_time_ns,
        bpf_cpu_share: if available_ns > 0.0 { bpf_time_ns as f64 / available_ns } else { 0.0 },
        sysprof_cpu_s,
        sysprof_peak_rss_kib,
        kernel_memory: None,
    }
}

/// CPU seconds (user + system) and peak RSS in KiB of this process.
pub fn own_usage() -> (f64, u64) {
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(usage) => {
            let seconds = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
            (seconds(usage.user_time()) + seconds(usage.system_time()), usage.max_rss() as u64)
        }
        Err(_) => (0.0, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_costs_scale_to_the_whole_run() {
        let measured = vec![ProgramCost { program: "p".into(), run_count: 100, run_time_ns: 5_000 }];
        let overhead = overhead(measured, true, 0.25, Duration::from_secs(2), 2, 99);
        assert_eq!(overhead.programs[0].run_count, 400);
        assert_eq!(overhead.programs[0].run_time_ns, 20_000);
        assert_eq!(overhead.bpf_time_ns, 20_000);
        assert!((overhead.bpf_cpu_share - 20_000.0 / 4e9).abs() < 1e-12);
    }

    #[test]
    fn the_first_window_stands_for_itself_and_the_later_ones_for_the_rest() {
        let cost =
            |runs: u64| vec![ProgramCost { program: "p".into(), run_count: runs, run_time_ns: runs * 100 }];
        let windows = StatsWindows {
            baseline: cost(0),
            started: Instant::now(),
            on_since: None,
            // 2 ms at the start, then two windows of 10 ms, in a 2.002 s run.
            covered: Duration::from_millis(22),
            first: Some((cost(1_000), Duration::from_millis(2))),
            total: Duration::from_millis(2_002),
            next_change: Instant::now(),
            always: false,
        };
        let coverage = 22.0 / 2_002.0;
        // 1,000 runs in the first window (a command's start), 200 in the later 20 ms: the rest
        // of the run (2 s) had 200 x 100 of them, not 1,200 x 91.
        let overhead =
            overhead(windows.costs(cost(1_200), coverage), true, coverage, Duration::from_secs(2), 2, 99);
        assert!(overhead.programs[0].run_count.abs_diff(21_000) <= 50, "{:?}", overhead.programs);
        assert!(overhead.programs[0].run_time_ns.abs_diff(2_100_000) <= 50, "{:?}", overhead.programs);
        // With the statistics on throughout, nothing is estimated.
        let always = StatsWindows { always: true, ..windows };
        assert_eq!(always.costs(cost(1_200), 1.0)[0].run_count, 1_200);
    }

    #[test]
    fn the_sampling_program_runs_no_more_than_its_clock_allows() {
        let measured =
            vec![ProgramCost { program: "cpu_sample".into(), run_count: 200, run_time_ns: 400_000 }];
        // 99 Hz on 2 CPUs for 2 s: 396 runs at most, whatever the windows' scaling says.
        let overhead = overhead(measured, true, 0.25, Duration::from_secs(2), 2, 99);
        assert_eq!(overhead.programs[0].run_count, 396);
        assert_eq!(overhead.programs[0].run_time_ns, 792_000, "at the measured 2 µs per run");
    }

    #[test]
    fn the_calibration_is_not_the_trace() {
        let at_start =
            vec![ProgramCost { program: "call_enter".into(), run_count: 6000, run_time_ns: 9_000_000 }];
        let at_end =
            vec![ProgramCost { program: "call_enter".into(), run_count: 6150, run_time_ns: 9_300_000 }];
        assert_eq!(since(at_end, &at_start)[0].run_count, 150);
    }
}
