//! What the fuzz targets (`fuzz/`, run by `cargo xtask fuzz`) were given, replayed through the
//! same doors (`sysprof::fuzzing`) by a plain `cargo test`: every crash they found, kept in
//! `fuzz/regressions/TARGET/`, and the committed seed corpus, `fuzz/corpus/TARGET/`. A debug
//! build, so overflow checks are on, as in the fuzzer's; no fuzzer, no root.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use sysprof::fuzzing::TARGETS;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// The names of the entries of `dir` (files or folders), sorted; none when it is missing.
fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries.map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned()).collect()
        })
        .unwrap_or_default()
}

/// Feeds every file of `fuzz/KIND/TARGET/` to its target's door; returns the files that made
/// one panic, with the panic's message, and how many were fed.
fn replay(kind: &str) -> (Vec<String>, usize) {
    let mut failed = Vec::new();
    let mut fed = 0;
    for &(target, door) in TARGETS {
        let dir = fuzz_dir().join(kind).join(target);
        for name in names(&dir) {
            let path = dir.join(&name);
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            fed += 1;
            if let Err(panic) = std::panic::catch_unwind(|| door(&bytes)) {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failed.push(format!("fuzz/{kind}/{target}/{name}: {message}"));
            }
        }
    }
    (failed, fed)
}

#[test]
fn every_crash_the_fuzzer_found_stays_fixed() {
    let (failed, fed) = replay("regressions");
    assert!(failed.is_empty(), "{} of {fed} regression inputs panic:\n{}", failed.len(), failed.join("\n"));
}

#[test]
fn the_seed_corpus_goes_through_every_door() {
    let (failed, fed) = replay("corpus");
    assert!(failed.is_empty(), "{} of {fed} corpus inputs panic:\n{}", failed.len(), failed.join("\n"));
}

/// A target is a fuzz target (`fuzz/fuzz_targets/NAME.rs`, listed in `fuzz/Cargo.toml`), a door
/// here, and a seed corpus; a regression belongs to one of them.
#[test]
fn every_target_has_its_door_and_its_corpus() {
    let doors: BTreeSet<String> = TARGETS.iter().map(|(name, _)| name.to_string()).collect();
    let sources: BTreeSet<String> = names(&fuzz_dir().join("fuzz_targets"))
        .into_iter()
        .filter_map(|name| name.strip_suffix(".rs").map(str::to_string))
        .collect();
    assert_eq!(sources, doors, "fuzz/fuzz_targets/*.rs against sysprof::fuzzing::TARGETS");
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
    for door in &doors {
        assert!(
            manifest.contains(&format!("path = \"fuzz_targets/{door}.rs\"")),
            "{door} in fuzz/Cargo.toml"
        );
        let seeds = names(&fuzz_dir().join("corpus").join(door));
        assert!(!seeds.is_empty(), "fuzz/corpus/{door} has no seeds");
    }
    let regressions = names(&fuzz_dir().join("regressions"));
    let strays: Vec<&String> = regressions.iter().filter(|name| !doors.contains(*name)).collect();
    assert!(strays.is_empty(), "fuzz/regressions/ folders of no target: {strays:?}");
}
