//! NVML's polls over a whole run, in bounded memory: past [`MAX_ROUNDS`] rounds (a poll of
//! every GPU) every other round goes and the interval doubles, as the memory series is thinned
//! (`memory::usage::Series`). An hour at `--gpu-interval 10ms` keeps 1,024 to 2,048 polls a
//! GPU, evenly spread over the run; before, 1 ns polled without pause and took 1.2 GB in 2 s.

use std::time::Duration;

use super::Sample;

/// Most rounds kept: as many as the memory series keeps per process.
pub const MAX_ROUNDS: usize = 2048;

/// The rounds kept so far and the interval they are taken at now.
#[derive(Debug)]
pub struct Rounds {
    rounds: Vec<Vec<Sample>>,
    interval: Duration,
}

impl Rounds {
    pub fn new(interval: Duration) -> Self {
        Rounds { rounds: Vec::new(), interval }
    }

    /// Adds one round; the new interval when the bound doubled it.
    pub fn add(&mut self, round: Vec<Sample>) -> Option<Duration> {
        if round.is_empty() {
            return None;
        }
        self.rounds.push(round);
        if self.rounds.len() <= MAX_ROUNDS {
            return None;
        }
        // An odd number of rounds: every other one from the first keeps the first and the
        // last, and the spacing stays even, at twice the interval, which the next rounds are
        // taken at.
        let mut index = 0;
        self.rounds.retain(|_| {
            index += 1;
            index % 2 == 1
        });
        self.interval = self.interval.saturating_mul(2);
        Some(self.interval)
    }

    /// Every sample kept, in order, and the interval at the end.
    pub fn finish(self) -> (Vec<Sample>, Duration) {
        (self.rounds.into_iter().flatten().collect(), self.interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(t_ms: u64) -> Vec<Sample> {
        (0..2)
            .map(|device| Sample {
                t_ms,
                device,
                sm_util_pct: Some(50),
                mem_util_pct: None,
                mem_used: None,
                power_mw: None,
                sm_clock_mhz: None,
                mem_clock_mhz: None,
                temperature_c: None,
                throttle: None,
                pcie_tx_kb_s: None,
                pcie_rx_kb_s: None,
                nvlink_tx_kib: None,
                nvlink_rx_kib: None,
                processes: Default::default(),
            })
            .collect()
    }

    #[test]
    fn a_long_run_keeps_a_bounded_evenly_spaced_series() {
        let mut rounds = Rounds::new(Duration::from_millis(10));
        let mut interval = Duration::from_millis(10);
        let mut t_ms = 0;
        // An hour: each round is taken at the interval the bound has reached.
        while t_ms < 3_600_000 {
            if let Some(longer) = rounds.add(round(t_ms)) {
                interval = longer;
            }
            t_ms += interval.as_millis() as u64;
        }
        let (samples, last) = rounds.finish();
        assert_eq!(last, interval);
        assert!(last >= Duration::from_millis(1280), "{last:?}");
        let device0: Vec<u64> = samples.iter().filter(|s| s.device == 0).map(|s| s.t_ms).collect();
        assert!((MAX_ROUNDS / 2..=MAX_ROUNDS).contains(&device0.len()), "{} polls", device0.len());
        assert_eq!(samples.len(), device0.len() * 2, "every GPU keeps the same rounds");
        assert_eq!(device0[0], 0, "the start is kept");
        // Even: every gap is the interval at the end.
        let gaps: Vec<u64> = device0.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.iter().all(|&gap| gap == last.as_millis() as u64), "{gaps:?}");
    }
}
