//! Process memory over the run: resident memory by kind, peak, virtual size and swap, read from
//! /proc/PID/status at a fixed interval while the trace runs.

use std::time::{Duration, Instant};

use serde::Serialize;

/// A process's memory at one moment (bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct MemorySample {
    /// Milliseconds since the trace started.
    pub t_ms: u64,
    pub rss_anon: u64,
    pub rss_file: u64,
    pub rss_shmem: u64,
    /// VmHWM: the largest RSS the kernel has seen for the process since it started.
    pub rss_peak: u64,
    /// VmSize: the address space it has reserved.
    pub vm_size: u64,
    pub swap: u64,
}

impl MemorySample {
    /// Reads the process's status now; `None` when it is gone or has no memory of its own
    /// (a kernel thread, or a process that has released it while exiting).
    pub fn read(pid: u32, t_ms: u64) -> Option<Self> {
        // Read every few hundred ms for every process: only the six fields are parsed.
        let status = crate::target::read_proc_text(&format!("/proc/{pid}/status")).ok()?;
        let mut sample = MemorySample { t_ms, ..MemorySample::default() };
        let mut has_memory = false;
        for line in status.lines() {
            let Some((name, value)) = line.split_once(':') else { continue };
            let field = match name {
                "VmSize" => {
                    has_memory = true;
                    &mut sample.vm_size
                }
                "VmHWM" => &mut sample.rss_peak,
                "RssAnon" => &mut sample.rss_anon,
                "RssFile" => &mut sample.rss_file,
                "RssShmem" => &mut sample.rss_shmem,
                "VmSwap" => &mut sample.swap,
                _ => continue,
            };
            // "   1234 kB"
            *field = value.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap_or(0) * 1024;
        }
        has_memory.then_some(sample)
    }

    /// Resident memory of every kind.
    pub fn rss(&self) -> u64 {
        self.rss_anon + self.rss_file + self.rss_shmem
    }
}

/// Most samples kept per process: past it every other one goes, so an hour-long trace keeps
/// its shape in bounded memory.
const MAX_SAMPLES: usize = 2048;

/// One process's samples, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Series {
    samples: Vec<MemorySample>,
}

impl Series {
    pub fn push(&mut self, sample: MemorySample) {
        if self.samples.len() >= MAX_SAMPLES {
            let mut index = 0;
            self.samples.retain(|_| {
                index += 1;
                index % 2 == 1
            });
        }
        self.samples.push(sample);
    }

    pub fn samples(&self) -> &[MemorySample] {
        &self.samples
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The sample with the most resident memory.
    pub fn max_rss(&self) -> Option<MemorySample> {
        self.samples.iter().copied().max_by_key(MemorySample::rss)
    }

    pub fn last(&self) -> Option<MemorySample> {
        self.samples.last().copied()
    }
}

/// When the processes' memory is read: every `interval`, stretched on a busy machine so that
/// reading /proc costs about as much as with 64 processes.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    started: Instant,
    interval: Duration,
    last: Option<Instant>,
}

/// Processes read at the base interval; more stretch it in proportion.
const PROCESSES_AT_BASE_INTERVAL: usize = 64;

impl Schedule {
    pub fn new(interval: Duration) -> Self {
        Schedule { started: Instant::now(), interval, last: None }
    }

    /// Whether `live` processes are due a read now; if so, the time to stamp them with.
    pub fn due(&mut self, live: usize) -> Option<u64> {
        let now = Instant::now();
        let stretch = live.div_ceil(PROCESSES_AT_BASE_INTERVAL).max(1) as u32;
        if self.last.is_some_and(|last| now < last + self.interval * stretch) {
            return None;
        }
        self.last = Some(now);
        Some(self.elapsed_ms())
    }

    /// Milliseconds since the schedule started (the trace's clock for the samples).
    pub fn elapsed_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The base interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The same schedule with the next read due at once (the last read of the run).
    pub fn restarted_for_final_read(self) -> Self {
        Schedule { last: None, ..self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let sample = MemorySample::read(std::process::id(), 5).unwrap();
        assert_eq!(sample.t_ms, 5);
        assert!(sample.rss() > 0 && sample.rss_peak >= sample.rss() && sample.vm_size >= sample.rss());
        assert!(MemorySample::read(u32::MAX - 1, 0).is_none());
    }

    #[test]
    fn long_series_are_thinned_not_truncated() {
        let mut series = Series::default();
        for t in 0..(MAX_SAMPLES as u64 * 3) {
            series.push(MemorySample { t_ms: t, rss_anon: t, ..Default::default() });
        }
        let samples = series.samples();
        assert!(samples.len() <= MAX_SAMPLES);
        assert_eq!(samples[0].t_ms, 0);
        assert_eq!(series.last().unwrap().t_ms, MAX_SAMPLES as u64 * 3 - 1);
        assert_eq!(series.max_rss().unwrap().t_ms, MAX_SAMPLES as u64 * 3 - 1);
    }

    #[test]
    fn many_processes_stretch_the_interval() {
        let mut schedule = Schedule::new(Duration::from_secs(3600));
        assert!(schedule.due(1).is_some());
        assert!(schedule.due(1).is_none());
        let mut schedule = Schedule::new(Duration::ZERO);
        assert!(schedule.due(1000).is_some());
        assert!(schedule.due(1000).is_some());
    }
}
