//! The signal family end to end: a workload that counts the signals its handlers took, traced,
//! and sysprof's counts by signal, sender and disposition compared with its own.

mod support;

use serde_json::Value;
use support::*;

/// The row of `signal` for the workload.
fn row<'a>(report: &'a Value, signal: &str) -> &'a Value {
    report["signals"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["signal"] == signal && row["process"] == "signals")
        .unwrap_or_else(|| panic!("no {signal} row in {:#}", report["signals"]))
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn counts_every_signal_the_target_took() {
    let Some(_guard) = root_guard("counts_every_signal_the_target_took") else { return };
    let dir = output_dir();
    let out = sysprof()
        .args(["trace", "-q", "--focus", "sched", "-o"])
        .arg(dir.path())
        .arg("--")
        .arg(workload("signals"))
        .args(["3000", "40"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    // What the handlers counted, from the workload's own line.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let counted: Vec<u64> = stdout.split_whitespace().filter_map(|word| word.parse().ok()).collect();
    assert_eq!(counted.len(), 3, "workload said {stdout:?}");
    let report = read_report(dir.path());
    for (signal, sent_by, expected) in [
        ("SIGUSR1", "a process", counted[0]),
        ("SIGUSR2", "a process", counted[1]),
        ("SIGALRM", "the kernel", counted[2]),
    ] {
        let row = row(&report, signal);
        assert_eq!(row["delivered"], expected, "{row:#}");
        assert_eq!(row["sent_by"], sent_by, "{row:#}");
        assert_eq!(row["action"], "handler", "{row:#}");
    }
    // Nothing else: sysprof's own stop of the command at its loader (Part B) is not a signal
    // the target got.
    let rows = report["signals"]["rows"].as_array().unwrap();
    let others: Vec<&Value> = rows.iter().filter(|row| row["process"] == "signals").collect();
    assert_eq!(others.len(), 3, "{others:#?}");
    assert_eq!(report["signals"]["lost"], 0);
    let markdown = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    assert!(markdown.contains("### Signals"), "{markdown}");
    assert!(markdown.contains("| signals |"), "{markdown}");
}
