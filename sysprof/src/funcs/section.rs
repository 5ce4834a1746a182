//! The `--func` family's section of the report: each probed function's calls, latency,
//! negative returns and callers.

use std::fmt::Write as _;

use serde::Serialize;

use super::{FuncRow, rows};
use crate::{
    family::{Analysis, Family},
    latency::format_ns,
    output::markdown::{escape, table},
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
        let functions = rows(&cx.outcome.functions, cx.calls, cx.names);
        Ok(Some(Box::new(FuncsSection { functions })))
    }
}

/// The functions timed with `--func` (none without it).
#[derive(Clone, Debug, Default, Serialize)]
pub struct FuncsSection {
    pub functions: Vec<FuncRow>,
}

impl Section for FuncsSection {
    fn json(&self) -> Vec<(&'static str, &dyn erased_serde::Serialize)> {
        vec![("functions", &self.functions)]
    }

    fn markdown(&self, out: &mut String) {
        markdown(out, &self.functions);
    }
}

fn markdown(out: &mut String, functions: &[FuncRow]) {
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
}
