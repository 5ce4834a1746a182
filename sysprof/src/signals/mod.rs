//! The signal family: every signal delivered to the target, counted in the kernel per process,
//! signal, sender (a process, a POSIX timer, the kernel) and disposition (default, ignored, a
//! handler). A program that takes thousands of signals a second (a profiler's timer, a
//! runtime's fault-driven barriers, a parent flooded with SIGCHLD) pays a kernel entry and a
//! handler frame for each; a fatal one explains an exit.

use std::{collections::BTreeSet, fmt::Write as _};

use nix::sys::signal::Signal;
use serde::Serialize;
use sysprof_common::signals::{self, SignalKey, action, origin};

use crate::{
    family::{Analysis, Family},
    output::markdown::{escape, table},
    probes::{Preload, Probes},
    record::reader::MapReader,
    report::{Section, format::thousands},
};

/// The signal family: one tp_btf program on `signal_deliver`.
#[derive(Default)]
pub(crate) struct SignalFamily {
    delivered: Vec<(SignalKey, u64)>,
    lost: u64,
}

impl Family for SignalFamily {
    fn name(&self) -> &'static str {
        "signals"
    }

    fn programs(&self) -> &'static [Preload] {
        &[Preload::BtfTracePoint("signal_deliver", "signal_deliver")]
    }

    fn attach(&self, probes: &mut Probes) -> anyhow::Result<()> {
        probes.attach_btf_tracepoint("signal_deliver", "signal_deliver")
    }

    fn read(&mut self, maps: &mut MapReader<'_>) -> anyhow::Result<()> {
        self.delivered = maps.entries(signals::SIGNALS)?;
        self.lost = maps.per_cpu::<u64>(signals::SIGNALS_LOST, 0)?.into_iter().fold(0, u64::saturating_add);
        Ok(())
    }

    fn processes(&self) -> Vec<u32> {
        self.delivered.iter().map(|(key, _)| key.tgid).collect()
    }

    fn analyze(&mut self, cx: &mut Analysis<'_>) -> anyhow::Result<Option<Box<dyn Section>>> {
        let wall_s = cx.wall_s().max(1e-9);
        let mut rows: Vec<SignalRow> = self
            .delivered
            .iter()
            .map(|(key, count)| SignalRow {
                pid: key.tgid,
                process: cx.processes.get(key.tgid).map(|p| p.name.clone()).unwrap_or_default(),
                signal: signal_name(key.signal),
                number: key.signal,
                sent_by: match key.origin {
                    origin::PROCESS => "a process",
                    origin::TIMER => "a POSIX timer",
                    _ => "the kernel",
                },
                action: match key.action {
                    action::DEFAULT => "default",
                    action::IGNORED => "ignored",
                    _ => "handler",
                },
                delivered: *count,
                per_s: *count as f64 / wall_s,
            })
            .collect();
        rows.sort_by(|a, b| {
            b.delivered.cmp(&a.delivered).then(a.pid.cmp(&b.pid)).then(a.number.cmp(&b.number))
        });
        if self.lost > 0 {
            cx.limitations.push(format!(
                "{} not counted: the signal map ({} entries) was full",
                crate::report::format::count(self.lost, "signal was", "signals were"),
                signals::CAPACITY
            ));
        }
        let processes: BTreeSet<u32> = rows.iter().map(|row| row.pid).collect();
        Ok(Some(Box::new(SignalReport {
            delivered: rows.iter().map(|row| row.delivered).sum(),
            processes: processes.len(),
            lost: self.lost,
            rows,
        })))
    }
}

/// The signal section of the report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SignalReport {
    /// Most delivered first.
    pub rows: Vec<SignalRow>,
    /// Signals delivered to the target, all processes together (exact, less `lost`).
    pub delivered: u64,
    /// Target processes that were delivered a signal.
    pub processes: usize,
    pub lost: u64,
}

/// Signals of one kind delivered to one process.
#[derive(Clone, Debug, Serialize)]
pub struct SignalRow {
    pub pid: u32,
    pub process: String,
    /// "SIGUSR1", "SIGRTMIN+3".
    pub signal: String,
    pub number: u32,
    /// "a process" (kill, tgkill, sigqueue), "a POSIX timer" or "the kernel".
    pub sent_by: &'static str,
    /// The disposition it met: "default", "ignored" or "handler".
    pub action: &'static str,
    pub delivered: u64,
    pub per_s: f64,
}

/// Rows in the signal table (report.json has them all).
const SIGNAL_ROWS: usize = 15;

impl Section for SignalReport {
    fn json(&self) -> Vec<(&'static str, &dyn erased_serde::Serialize)> {
        vec![("signals", self)]
    }

    /// Nothing when no signal reached the target: most programs never take one.
    fn markdown(&self, out: &mut String) {
        if self.rows.is_empty() {
            return;
        }
        let _ = writeln!(out, "### Signals\n");
        let _ = writeln!(
            out,
            "{} delivered to {}, counted exactly as each thread took them. Each costs a kernel entry, and \
             with a handler a signal frame on the thread's stack.\n",
            crate::report::format::count(self.delivered, "signal", "signals"),
            crate::report::format::count(self.processes as u64, "target process", "target processes")
        );
        let rows: Vec<Vec<String>> = self
            .rows
            .iter()
            .take(SIGNAL_ROWS)
            .map(|row| {
                vec![
                    escape(&row.process),
                    row.pid.to_string(),
                    format!("`{}`", row.signal),
                    row.sent_by.to_string(),
                    row.action.to_string(),
                    thousands(row.delivered),
                    format!("{:.1}", row.per_s),
                ]
            })
            .collect();
        table(out, &["Process", "PID", "Signal", "Sent by", "Action", "Delivered", "Per second"], &rows);
        if self.rows.len() > SIGNAL_ROWS {
            let _ = writeln!(out, "{} more rows in report.json.\n", self.rows.len() - SIGNAL_ROWS);
        }
    }
}

/// "SIGUSR1"; real-time signals as "SIGRTMIN+n" from the C library's SIGRTMIN.
fn signal_name(number: u32) -> String {
    if let Ok(signal) = Signal::try_from(number as i32) {
        return signal.as_str().to_string();
    }
    let rtmin = libc::SIGRTMIN() as u32;
    match number.checked_sub(rtmin) {
        Some(n) if number <= libc::SIGRTMAX() as u32 => format!("SIGRTMIN+{n}"),
        _ => format!("signal {number}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_have_their_names() {
        assert_eq!(signal_name(10), "SIGUSR1");
        assert_eq!(signal_name(14), "SIGALRM");
        assert_eq!(signal_name(libc::SIGRTMIN() as u32 + 2), "SIGRTMIN+2");
        assert_eq!(signal_name(200), "signal 200");
    }
}
