//! Saved read-outs of real runs (`tests/data/NAME/readout.json`: the kernel's maps, the process
//! snapshots and the symbol names of a `sysprof trace --save-readout`) replayed through the
//! analysis, the report and its Markdown, without root: each must give its golden report.md and
//! folded stacks (`SYSPROF_BLESS=1` rewrites them after a reviewed change). The root test at the
//! end checks that a replay gives exactly what the live run wrote.

mod support;

use std::path::{Path, PathBuf};

use support::*;

fn recorded_runs() -> Vec<PathBuf> {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data");
    let mut runs: Vec<PathBuf> = std::fs::read_dir(&data)
        .unwrap_or_else(|e| panic!("{}: {e}", data.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|dir| dir.join("readout.json").is_file())
        .collect();
    runs.sort();
    runs
}

/// A replay's report.md, report.json and folded stacks.
fn replay(readout: &Path) -> (String, String, Vec<(String, String)>) {
    let bytes = std::fs::read(readout).unwrap();
    let (report, files) = sysprof::replay(&bytes).unwrap_or_else(|e| panic!("{}: {e:#}", readout.display()));
    let folded = files
        .into_iter()
        .filter(|file| file.name.ends_with(".folded"))
        .map(|file| (file.name, String::from_utf8(file.bytes).unwrap()))
        .collect();
    (sysprof::output::render_markdown(&report), serde_json::to_string(&report).unwrap(), folded)
}

#[test]
fn recorded_runs_replay_to_their_golden_reports() {
    let runs = recorded_runs();
    assert!(runs.len() >= 2, "tests/data holds the recorded runs; found {runs:?}");
    for run in runs {
        let (markdown, _, folded) = replay(&run.join("readout.json"));
        assert_golden(&run.join("report.md"), &markdown);
        assert!(!folded.is_empty(), "{}: no folded stacks", run.display());
        for (name, text) in folded {
            assert_golden(&run.join(&name), &text);
        }
    }
}

#[test]
fn a_replay_is_the_same_every_time() {
    for run in recorded_runs() {
        let readout = run.join("readout.json");
        assert_eq!(replay(&readout), replay(&readout), "{}", run.display());
    }
}

#[test]
fn a_readout_of_another_format_is_refused_with_the_fix() {
    let error = sysprof::replay(br#"{"format": 999}"#).unwrap_err();
    assert!(format!("{error:#}").contains("record it again"), "{error:#}");
}

/// A live run with every default family and the heap: the replay of its read-out renders the
/// very report.md and folded stacks the run wrote.
#[test]
#[ignore = "needs root"]
fn a_replayed_readout_gives_what_the_live_run_wrote() {
    let Some(_guard) = root_guard("a_replayed_readout_gives_what_the_live_run_wrote") else { return };
    let out = output_dir();
    let memload = workload("memload");
    let status = sysprof()
        .args(["trace", "--quiet", "--malloc", "--save-readout", "-o"])
        .arg(out.path())
        .arg("--")
        .arg(&memload)
        .args(["mallocs", "20000"])
        .status()
        .unwrap();
    assert!(status.success());
    let (markdown, _, folded) = replay(&out.path().join("readout.json"));
    assert_eq!(markdown, std::fs::read_to_string(out.path().join("report.md")).unwrap());
    assert!(folded.iter().any(|(name, _)| name == "alloc.folded"), "the heap was traced");
    for (name, text) in folded {
        assert_eq!(text, std::fs::read_to_string(out.path().join(&name)).unwrap(), "{name}");
    }
}
