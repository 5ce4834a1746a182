//! The `--func` family's section of the report: each probed function's calls, latency,
//! negative returns and callers.

use std::fmt::Write as _;

use serde::Serialize;

use super::{FuncRow, rows};
use crate::{
    family::{Analysis, Family},
    latency::format_ns,
    output::markdown::{escape, table},
    record::ProbeShare,
    report::{Section, format::thousands},
};

/// `--func BIN:SYMBOL`: uprobes on the named functions, attached while the trace runs (see
/// `funcs::FuncTracer`).
pub(crate) struct FuncsFamily;

impl Family for FuncsFamily {
    fn name(&self) -> &'static str {
        "funcs"
    }

    fn analyze(&mut self, cx: &mut Analysis<'_>) -> anyhow::Result<Option<Box<dyn Section>>> {
        let functions = rows(&cx.outcome.functions, cx.calls, cx.names, &cx.run.probe_share);
        Ok(Some(Box::new(FuncsSection { functions, probe_share: cx.run.probe_share })))
    }
}

/// The functions timed with `--func` (none without it).
#[derive(Clone, Debug, Default, Serialize)]
pub struct FuncsSection {
    pub functions: Vec<FuncRow>,
    /// The probes' share of a timed call, by the kind of the function's first instruction.
    #[serde(skip)]
    pub probe_share: ProbeShare,
}

impl Section for FuncsSection {
    fn json(&self) -> Vec<(&'static str, &dyn erased_serde::Serialize)> {
        vec![("functions", &self.functions)]
    }

    fn markdown(&self, out: &mut String) {
        markdown(out, &self.functions, &self.probe_share);
    }
}

fn markdown(out: &mut String, functions: &[FuncRow], share: &ProbeShare) {
    if functions.is_empty() {
        return;
    }
    let _ = writeln!(out, "### Timed functions (--func)\n");
    let rows: Vec<Vec<String>> = functions
        .iter()
        .map(|f| {
            let callers: Vec<String> = f
                .callers
                .iter()
                .take(3)
                .map(|(site, n)| format!("{} ({})", escape(site), thousands(*n)))
                .collect();
            vec![
                format!("`{}`", escape(&f.function)),
                escape(&f.binary),
                thousands(f.calls),
                format!(
                    "{} / {} / {}",
                    format_ns(f.latency.p50_ns),
                    format_ns(f.latency.p99_ns),
                    format_ns(f.latency.max_ns)
                ),
                format_ns(f.latency.total_ns),
                thousands(f.negative_returns),
                callers.join(", "),
            ]
        })
        .collect();
    table(
        out,
        &["Function", "Binary", "Calls", "p50 / p99 / max", "Total", "Negative returns", "Callers"],
        &rows,
    );
    if let Some(probes) = share.emulated_ns {
        let _ = write!(
            out,
            "Each time above includes the probes' own, measured on functions of sysprof's own that do \
             nothing, timed the same way (the kernel's traps at the entry and the return): {}",
            format_ns(probes)
        );
        match share.stepped_ns {
            Some(stepped) => {
                let named: Vec<String> = functions
                    .iter()
                    .filter(|f| f.entry_stepped)
                    .map(|f| format!("`{}`", escape(&f.function)))
                    .collect();
                let _ = write!(
                    out,
                    " a call where the kernel emulates the function's first instruction, {} where it steps it \
                     out of line, a second trap ({}on x86-64, any first instruction but a push, a nop, a jump or \
                     a call; a CET build's endbr64 is one, so a function that begins with one and a push is \
                     probed at the push, where Part B says so).",
                    format_ns(stepped),
                    if named.is_empty() { String::new() } else { format!("{} here; ", named.join(", ")) }
                );
            }
            None => {
                // Not measured for a stepped first instruction (only x86-64's calibration has
                // one): this is the least, and such functions pay more.
                let _ = write!(
                    out,
                    " a call at least, and more where the kernel steps the function's first instruction \
                     out of line rather than emulating it."
                );
            }
        }
        let mostly: Vec<String> = functions
            .iter()
            .filter(|f| f.mostly_probes())
            .map(|f| format!("`{}` (p50 {})", escape(&f.function), format_ns(f.latency.p50_ns)))
            .collect();
        if !mostly.is_empty() {
            let _ = write!(
                out,
                " At least half of a typical call's time is the probes' for {}: the function itself \
                 takes less than its times say, and half its Total or more is theirs.",
                mostly.join(", ")
            );
        }
        let _ = writeln!(out, "\n");
    }
}
