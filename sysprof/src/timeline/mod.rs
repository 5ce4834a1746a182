//! The timeline (`timeline.pftrace`): what happened when, thread by thread. Every other output
//! is aggregated in the kernel; the timeline is the one that keeps events, so it is bounded:
//!
//! - the kernel records only samples, waits off the CPU and system calls of at least
//!   [`MIN_SLICE_US`], and probed calls (`sysprof-ebpf/src/timeline.rs`), into a ring that is
//!   drained every tick ([`Collector::drain`]);
//! - userspace keeps at most `--timeline-events` of them. Past that it drops the finest first:
//!   it doubles the shortest wait, system call and call it keeps (up to [`SLICES_FIRST_UNTIL_NS`]),
//!   then keeps one sample in two, four... (up to [`MAX_SAMPLE_STRIDE`]), then doubles the
//!   slices' minimum again. What it dropped is said in the trace and in the report.
//!
//! `render.rs` turns the events, with the stacks and names the analysis resolved, into
//! Perfetto's trace format (`perfetto.rs`).

pub mod perfetto;
pub(crate) mod render;

/// The file name in the output directory.
pub const FILE_NAME: &str = "timeline.pftrace";

use std::collections::BTreeMap;

use aya::maps::{MapData, RingBuf};
use serde::{Deserialize, Serialize};
use sysprof_common::timeline::{TimelineEvent, kind};
use tokio::io::unix::AsyncFd;

use crate::record::reader::Bytes;

/// The shortest wait off the CPU and system call the kernel records, in microseconds: shorter
/// ones are frequent and say little on a timeline (their time is in the off-CPU profile and
/// the syscall table all the same).
pub const MIN_SLICE_US: u32 = 100;

/// The slices' minimum is raised to this before any sample is dropped.
const SLICES_FIRST_UNTIL_NS: u64 = 10_000_000;

/// Samples are thinned to no fewer than one in this many before slices are dropped again.
const MAX_SAMPLE_STRIDE: u64 = 64;

/// What the timeline kept, and the clocks to place it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Timeline {
    /// CLOCK_MONOTONIC (the kernel's event clock), CLOCK_BOOTTIME and CLOCK_REALTIME, read
    /// together at the start: a merge of several hosts' timelines aligns them on the realtime
    /// offset.
    pub clocks: Clocks,
    #[serde(with = "events_as_hex")]
    pub events: Vec<TimelineEvent>,
    /// Thread id -> (process id, name), read when the thread was first seen.
    pub threads: BTreeMap<u32, (u32, String)>,
    /// What the bound dropped.
    pub thinning: Thinning,
    /// The most events kept.
    pub capacity: usize,
}

/// The clocks at the trace's start, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Clocks {
    pub monotonic_ns: u64,
    pub boottime_ns: u64,
    pub realtime_ns: u64,
}

impl Clocks {
    pub fn now() -> Self {
        use nix::time::{ClockId, clock_gettime};
        let read = |clock| {
            clock_gettime(clock).map_or(0, |t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        };
        Clocks {
            monotonic_ns: read(ClockId::CLOCK_MONOTONIC),
            boottime_ns: read(ClockId::CLOCK_BOOTTIME),
            realtime_ns: read(ClockId::CLOCK_REALTIME),
        }
    }
}

/// How far the bound thinned the timeline.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Thinning {
    /// The shortest wait, system call or call kept.
    pub min_slice_ns: u64,
    /// One sample in this many kept.
    pub sample_stride: u64,
    pub slices_dropped: u64,
    pub samples_dropped: u64,
}

impl Default for Thinning {
    fn default() -> Self {
        Thinning {
            min_slice_ns: u64::from(MIN_SLICE_US) * 1000,
            sample_stride: 1,
            slices_dropped: 0,
            samples_dropped: 0,
        }
    }
}

impl Thinning {
    fn keeps(&self, event: &TimelineEvent) -> bool {
        match event.kind {
            kind::SAMPLE => sample_hash(event).is_multiple_of(self.sample_stride),
            // Calls are kept whatever their length until the slices' minimum was raised.
            kind::CALL if self.min_slice_ns <= u64::from(MIN_SLICE_US) * 1000 => true,
            _ => event.end_ns.saturating_sub(event.start_ns) >= self.min_slice_ns,
        }
    }

    fn count_dropped(&mut self, event: &TimelineEvent) {
        match event.kind {
            kind::SAMPLE => self.samples_dropped += 1,
            _ => self.slices_dropped += 1,
        }
    }

    /// The slices' minimum, once the bound raised it past the kernel's own.
    fn raised_minimum(&self) -> Option<u64> {
        (self.min_slice_ns > Thinning::default().min_slice_ns).then_some(self.min_slice_ns)
    }

    /// Whether anything was dropped.
    pub fn dropped(&self) -> bool {
        self.slices_dropped + self.samples_dropped > 0
    }

    /// Finer events go first: the slices' minimum doubles until 10 ms, then samples thin out
    /// to 1 in 64, then the slices' minimum doubles again.
    fn tighten(&mut self) {
        if self.min_slice_ns < SLICES_FIRST_UNTIL_NS || self.sample_stride >= MAX_SAMPLE_STRIDE {
            self.min_slice_ns *= 2;
        } else {
            self.sample_stride *= 2;
        }
    }
}

/// A sample's place in the thinning: a mix of its time and thread, so that the samples kept at
/// a stride are spread evenly, and those kept at twice the stride are a subset of them.
fn sample_hash(event: &TimelineEvent) -> u64 {
    (event.start_ns ^ u64::from(event.tid).rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40
}

/// Drains the kernel's timeline ring during the trace.
pub struct Collector {
    ring: AsyncFd<RingBuf<MapData>>,
    timeline: Timeline,
    /// The raised minimum the programs were last told (`names::TIMELINE_RAISED_MIN`).
    told_kernel_ns: u64,
}

impl Collector {
    /// Starts the timeline now (its clocks), keeping at most `capacity` events. Inside the
    /// runtime: the ring is polled for the wakeup a resting sysprof gets (see `woken`).
    pub fn new(ring: RingBuf<MapData>, capacity: usize) -> std::io::Result<Self> {
        // SAFETY: the ring buffer owns its map fd, which stays open and unchanged until the
        // AsyncFd (which owns the ring buffer) is dropped.
        let ring = unsafe { AsyncFd::register(ring) }?;
        Ok(Collector {
            ring,
            timeline: Timeline { clocks: Clocks::now(), capacity, ..Timeline::default() },
            told_kernel_ns: 0,
        })
    }

    /// The slices' minimum, once the bound raised it and until the programs are told (see
    /// `told_kernel`): they then send nothing shorter, which the next drain would drop (see
    /// `Thinning::keeps`: the same test, on the same duration).
    pub fn raised_minimum_to_tell(&self) -> Option<u64> {
        self.timeline.thinning.raised_minimum().filter(|&raised| raised != self.told_kernel_ns)
    }

    /// The programs were told `minimum`.
    pub fn told_kernel(&mut self, minimum: u64) {
        self.told_kernel_ns = minimum;
    }

    /// Resolves when the kernel woke the ring: only the event that finds it a quarter full
    /// while sysprof rests does (the programs' `timeline::wakeup`), and the caller drains it.
    pub async fn woken(&mut self) -> std::io::Result<()> {
        self.ring.readable_mut().await?.clear_ready();
        Ok(())
    }

    /// Takes what the kernel recorded since the last drain, naming each new thread; how many
    /// events that was.
    pub fn drain(&mut self) -> usize {
        let timeline = &mut self.timeline;
        let ring = self.ring.get_mut();
        let mut drained = 0;
        while let Some(item) = ring.next() {
            drained += 1;
            if item.len() < size_of::<TimelineEvent>() {
                continue;
            }
            // SAFETY: the length is checked and a TimelineEvent is plain data; read_unaligned
            // because ring buffer records are only 8-byte aligned by convention.
            let event = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<TimelineEvent>()) };
            if !timeline.thinning.keeps(&event) {
                timeline.thinning.count_dropped(&event);
                continue;
            }
            timeline
                .threads
                .entry(event.tid)
                .or_insert_with(|| (event.tgid, thread_name(event.tgid, event.tid)));
            timeline.events.push(event);
        }
        if timeline.events.len() > timeline.capacity {
            timeline.bound();
        }
        drained
    }

    /// The timeline, once the trace is over (after a last drain).
    pub fn finish(mut self) -> Timeline {
        self.drain();
        self.timeline
    }
}

impl Timeline {
    /// Thins the events until three quarters of the capacity are used, so that the next
    /// drains do not thin again at once.
    fn bound(&mut self) {
        let target = self.capacity * 3 / 4;
        while self.events.len() > target {
            self.thinning.tighten();
            let thinning = &mut self.thinning;
            self.events.retain(|event| {
                let keep = thinning.keeps(event);
                if !keep {
                    thinning.count_dropped(event);
                }
                keep
            });
            if self.thinning.min_slice_ns > 1 << 50 {
                // Only what no minimum drops is left (samples at the widest stride): the rest
                // goes at the end.
                let dropped = self.events.len().saturating_sub(target);
                self.thinning.samples_dropped += dropped as u64;
                self.events.truncate(target);
            }
        }
    }

    /// What the bound dropped, in one line for the report and the trace; `None` when nothing.
    /// `kernel_thinned`: the slices the programs did not send, under the raised minimum
    /// (`Counter::TimelineThinned`).
    pub fn thinning_note(&self, kernel_thinned: u64) -> Option<String> {
        use crate::report::format::count;
        let thinning =
            &Thinning { slices_dropped: self.thinning.slices_dropped + kernel_thinned, ..self.thinning };
        thinning.dropped().then(|| {
            format!(
                "the timeline was bounded at {} (--timeline-events): it keeps waits, system calls and calls \
                 of at least {} and 1 on-CPU sample in {}; {} and {} were left out of it (every other output \
                 has them all)",
                count(self.capacity as u64, "event", "events"),
                crate::latency::format_ns(thinning.min_slice_ns),
                thinning.sample_stride,
                count(thinning.slices_dropped, "slice", "slices"),
                count(thinning.samples_dropped, "sample", "samples"),
            )
        })
    }
}

/// A thread's name from /proc, or its process's when the thread is gone, or empty.
fn thread_name(tgid: u32, tid: u32) -> String {
    let read = |path: String| std::fs::read_to_string(path).ok().map(|name| name.trim_end().to_string());
    read(format!("/proc/{tgid}/task/{tid}/comm"))
        .or_else(|| read(format!("/proc/{tgid}/comm")))
        .unwrap_or_default()
}

/// The events as hex records in `readout.json`, as the maps' entries are.
mod events_as_hex {
    use serde::{Deserialize as _, Deserializer, Serializer, ser::SerializeSeq as _};
    use sysprof_common::timeline::TimelineEvent;

    use super::Bytes;

    pub fn serialize<S: Serializer>(events: &[TimelineEvent], serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(events.len()))?;
        for event in events {
            seq.serialize_element(&Bytes::of(event))?;
        }
        seq.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<TimelineEvent>, D::Error> {
        Vec::<Bytes>::deserialize(deserializer)?
            .iter()
            .map(|bytes| bytes.decode().map_err(serde::de::Error::custom))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: u32, tid: u32, start_ns: u64, len_ns: u64) -> TimelineEvent {
        TimelineEvent {
            kind,
            tgid: 1,
            tid,
            detail: 0,
            start_ns,
            end_ns: start_ns + len_ns,
            mark_ns: 0,
            user_stack_id: -1,
            kernel_stack_id: -1,
        }
    }

    #[test]
    fn the_bound_drops_short_slices_first_then_thins_samples() {
        let mut timeline = Timeline { capacity: 1000, ..Timeline::default() };
        // 600 samples, 600 waits of 200 us and 10 waits of 50 ms.
        for i in 0..600u64 {
            timeline.events.push(event(kind::SAMPLE, 7, i * 10_101_010, 0));
            timeline.events.push(event(kind::OFF_CPU, 7, i * 10_000_000, 200_000));
        }
        for i in 0..10u64 {
            timeline.events.push(event(kind::OFF_CPU, 8, i * 100_000_000, 50_000_000));
        }
        timeline.bound();
        let count = |timeline: &Timeline, k: u32| timeline.events.iter().filter(|e| e.kind == k).count();
        assert!(timeline.events.len() <= 750, "{}", timeline.events.len());
        // The short waits went, the long ones stayed; samples were only thinned once the
        // slices' minimum reached 10 ms... and the 610 left fit without that.
        assert_eq!(count(&timeline, kind::OFF_CPU), 10);
        assert_eq!(count(&timeline, kind::SAMPLE), 600);
        assert_eq!(timeline.thinning.slices_dropped, 600);
        assert_eq!(timeline.thinning.samples_dropped, 0);
        assert!(timeline.thinning.min_slice_ns > 200_000);
        assert_eq!(timeline.thinning.raised_minimum(), Some(timeline.thinning.min_slice_ns));
        assert_eq!(Thinning::default().raised_minimum(), None);

        // Now too many samples: they thin out, and the long waits stay.
        timeline.capacity = 400;
        timeline.bound();
        assert_eq!(count(&timeline, kind::OFF_CPU), 10);
        let samples = count(&timeline, kind::SAMPLE);
        assert!((100..=300).contains(&samples), "{samples} samples kept");
        assert_eq!(timeline.thinning.samples_dropped, 600 - samples as u64);
        assert!(timeline.thinning.sample_stride >= 2);
        assert!(timeline.thinning_note(0).unwrap().contains("1 on-CPU sample in"));
        // The slices the programs did not send, under the raised minimum, count as dropped.
        assert!(timeline.thinning_note(5).unwrap().contains("605 slices"), "{:?}", timeline.thinning_note(5));
    }

    #[test]
    fn events_survive_the_readout_format() {
        let timeline = Timeline { events: vec![event(kind::SYSCALL, 3, 5, 6)], ..Timeline::default() };
        let json = serde_json::to_string(&timeline).unwrap();
        let back: Timeline = serde_json::from_str(&json).unwrap();
        assert_eq!(back.events, timeline.events);
    }
}
