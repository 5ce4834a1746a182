//! Files handed to `report`, `merge` and `tables`, and the unwind cache: a FIFO, a link to
//! /dev/zero or a sparse file in place of a run's files, JSON that is no report, a read-out that
//! claims impossible numbers, a root-only file named through sudo, and a library planted with
//! another's build id and size to poison the cache.

use std::{
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use object::{Object as _, ObjectSection as _};

use crate::support::*;

/// How long a refusal may take: it reads nothing.
const REFUSAL_BOUND: Duration = Duration::from_secs(5);

/// Runs `command` to its end within [`REFUSAL_BOUND`].
fn bounded(command: &mut Command) -> Output {
    let started = Instant::now();
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("starting sysprof");
    wait_bounded(&mut child, REFUSAL_BOUND);
    let output = child.wait_with_output().unwrap();
    assert!(started.elapsed() < REFUSAL_BOUND, "took {:?}", started.elapsed());
    output
}

/// Asserts `output` is a refusal: exit 1, and on stderr the one line `line`.
fn assert_refused(output: &Output, line: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{}", text(output));
    assert_eq!(stderr.lines().collect::<Vec<_>>(), [line], "{}", text(output));
}

fn mkfifo(path: &Path) {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
}

/// A directory holding a run's `name` as a FIFO, a link to /dev/zero or a sparse 4 GiB file,
/// each in turn; `check` runs on each with the path and what the one line must say of it.
fn each_hostile_file(name: &str, mut check: impl FnMut(&Path, &Path, &str)) {
    let dir = output_dir();
    let path = dir.path().join(name);
    mkfifo(&path);
    check(dir.path(), &path, "not a regular file (a FIFO); sysprof reads only regular files here");
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
    check(
        dir.path(),
        &path,
        "not a regular file (a character device); sysprof reads only regular files here",
    );
    std::fs::remove_file(&path).unwrap();
    std::fs::File::create(&path).unwrap().set_len(4 << 30).unwrap();
    check(dir.path(), &path, "larger than the 1.0 GiB sysprof reads from such a file");
}

#[test]
fn report_refuses_a_fifo_dev_zero_and_a_sparse_read_out_at_once() {
    each_hostile_file("readout.json", |dir, path, why| {
        let out = bounded(sysprof().arg("report").arg(dir).arg("-o").arg(dir.join("out")));
        assert_refused(&out, &format!("error: {}: {why}", path.display()));
        assert!(!dir.join("out").exists(), "nothing is written for a refused read-out");
    });
}

/// Two copies of a real run's output directory (rendered from a saved read-out).
fn two_real_runs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let root = output_dir();
    let rendered = root.path().join("rendered");
    std::fs::create_dir(&rendered).unwrap();
    std::fs::copy(data("cpu-two-threads").join("readout.json"), rendered.join("readout.json")).unwrap();
    let out = sysprof().arg("report").arg(&rendered).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let (a, b) = (root.path().join("a"), root.path().join("b"));
    for dir in [&a, &b] {
        std::fs::create_dir(dir).unwrap();
        std::fs::copy(rendered.join("report.json"), dir.join("report.json")).unwrap();
    }
    (root, a, b)
}

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name)
}

#[test]
fn merge_refuses_a_fifo_dev_zero_and_a_sparse_report_or_timeline_at_once() {
    let (root, a, b) = two_real_runs();
    // The real runs merge: what the refusals below refuse is the file, not the runs.
    let out = bounded(sysprof().arg("merge").arg(&a).arg(&b).arg("-o").arg(root.path().join("merged")));
    assert!(out.status.success(), "{}", text(&out));
    for name in ["report.json", "timeline.pftrace"] {
        each_hostile_file(name, |dir, path, why| {
            if name != "report.json" {
                std::fs::copy(a.join("report.json"), dir.join("report.json")).unwrap();
            }
            let why = match why.strip_prefix("larger than the 1.0 GiB") {
                Some(rest) if name == "report.json" => format!("larger than the 256.0 MiB{rest}"),
                _ => why.to_string(),
            };
            let out = bounded(sysprof().arg("merge").arg(&a).arg(dir).arg("-o").arg(root.path().join("out")));
            assert_refused(&out, &format!("error: {}: {why}", path.display()));
        });
    }
}

#[test]
fn merge_says_which_report_json_is_not_a_sysprof_report() {
    let (root, a, _) = two_real_runs();
    let dir = root.path().join("not-a-run");
    std::fs::create_dir(&dir).unwrap();
    let why =
        "(one has \"sysprof_version\" and a \"run\" with \"started_at\", \"duration_s\" and \"samples\")";
    for json in ["null", "[]", "{\"hello\":1}", "{\"sysprof_version\":\"0.1\",\"run\":{}}"] {
        std::fs::write(dir.join("report.json"), json).unwrap();
        let out = bounded(sysprof().arg("merge").arg(&a).arg(&dir).arg("-o").arg(root.path().join("out")));
        assert_refused(&out, &format!("error: {}: report.json is not a sysprof report {why}", dir.display()));
    }
    std::fs::write(dir.join("report.json"), "").unwrap();
    let out = bounded(sysprof().arg("merge").arg(&a).arg(&dir).arg("-o").arg(root.path().join("out")));
    assert_refused(
        &out,
        &format!(
            "error: {}: report.json is not a sysprof report (not JSON: EOF while parsing a value at line 1 column 0)",
            dir.display()
        ),
    );
    // A real report whose figures no run has.
    let mut report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.join("report.json")).unwrap()).unwrap();
    report["run"]["duration_s"] = serde_json::json!(-1.0);
    std::fs::write(dir.join("report.json"), report.to_string()).unwrap();
    let out = bounded(sysprof().arg("merge").arg(&a).arg(&dir).arg("-o").arg(root.path().join("out")));
    assert_refused(
        &out,
        &format!(
            "error: {}: report.json's run.duration_s is -1.0, not a number of seconds a run can have",
            dir.display()
        ),
    );
}

#[test]
fn a_read_out_that_claims_u64_max_samples_is_refused_with_the_field() {
    let readout: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data("cpu-two-threads").join("readout.json")).unwrap())
            .unwrap();
    let max = "ffffffffffffffff";
    // The samples counted (per CPU), and the samples kept under a stack.
    let mut counted = readout.clone();
    counted["maps"]["per_cpu"]["COUNTERS"]["0"][0] = max.into();
    let mut kept = readout.clone();
    kept["maps"]["hashes"]["CPU_SAMPLES"][0][1] = max.into();
    let cases = [
        (
            counted,
            "maps.per_cpu.COUNTERS[0] counts 18,446,744,073,709,551,615 events on CPU 0 in a run of 2.0 s: \
             more than one a nanosecond",
        ),
        (kept, "maps.hashes.CPU_SAMPLES holds over 18,446,744,073,709,551,615 samples, more than the 390"),
    ];
    for (patched, why) in cases {
        let dir = output_dir();
        let path = dir.path().join("readout.json");
        std::fs::write(&path, patched.to_string()).unwrap();
        // The test binary's sysprof is a debug build: an overflow would panic, not wrap.
        let out = bounded(sysprof().arg("report").arg(dir.path()).arg("-o").arg(dir.path().join("out")));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert_eq!(stderr.lines().count(), 1, "{}", text(&out));
        assert!(stderr.starts_with(&format!("error: {}: {why}", path.display())), "{}", text(&out));
        assert!(stderr.trim_end().ends_with("the read-out is damaged: record it again"), "{}", text(&out));
    }
}

#[test]
fn tables_refuses_a_fifo_at_once() {
    let dir = output_dir();
    let fifo = dir.path().join("lib.so");
    mkfifo(&fifo);
    let out = bounded(sysprof().arg("tables").arg(&fifo));
    assert_refused(
        &out,
        &format!(
            "error: {}: not a regular file (a FIFO); sysprof reads only regular files here",
            fifo.display()
        ),
    );
}

/// What `sysprof tables --json [--verify] FILE` prints of FILE, run as `command` is.
fn tables_json(mut command: Command, file: &Path, verify: bool) -> serde_json::Value {
    command.args(["tables", "--json"]);
    if verify {
        command.arg("--verify");
    }
    let out = command.arg(file).output().unwrap();
    let figures: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("tables --json printed no JSON ({e}): {}", text(&out)));
    figures[0].clone()
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn through_sudo_tables_opens_only_what_the_user_can_and_caches_nothing_else() {
    let Some(_guard) = root_guard("through_sudo_tables_opens_only_what_the_user_can_and_caches_nothing_else")
    else {
        return;
    };
    let user = test_user();
    // A library no one has cached: its own code, of a size no other has.
    let dir = output_dir();
    let source = dir.path().join("secret.c");
    let functions: String = (0..(std::process::id() % 97 + 3))
        .map(|i| format!("int secret_{i}(int x) {{ return x * {i}; }}\n"))
        .collect();
    std::fs::write(&source, functions).unwrap();
    let secret = dir.path().join("libsecret.so");
    let built = Command::new("cc").args(["-O1", "-shared", "-fPIC", "-o"]).arg(&secret).arg(&source).status();
    assert!(built.unwrap().success());
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();

    let out = bounded(user.sudo(&mut sysprof()).arg("tables").arg(&secret));
    assert_refused(
        &out,
        &format!(
            "error: {} cannot read {}: through sudo, sysprof opens only files the user who ran it can read",
            user.name,
            secret.display()
        ),
    );
    assert!(out.stdout.is_empty(), "{}", text(&out));
    // Root's own look (which writes nothing): no table was kept for it.
    let verified = tables_json(sysprof(), &secret, true);
    let entry = verified["cache_entry"].as_str().unwrap();
    assert!(verified["verified"].as_str().unwrap().starts_with("is missing"), "{verified}");
    assert!(!Path::new(entry).exists(), "{entry} was written");
    // A file the user can read is opened as them, and its table is kept.
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = bounded(user.sudo(&mut sysprof()).arg("tables").arg(&secret));
    assert!(out.status.success(), "{}", text(&out));
    let meta = std::fs::metadata(entry).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o600), "root's cache entry, root's only");
    let _ = std::fs::remove_file(entry);
}

/// `library` with its call frame information zeroed (no entries), its build id and size kept:
/// what a user plants to poison a cache keyed by what a file claims.
fn fake_of(library: &Path) -> Vec<u8> {
    let mut bytes = std::fs::read(library).unwrap();
    let (start, size) = {
        let file = object::File::parse(&*bytes).unwrap();
        file.section_by_name(".eh_frame").unwrap().file_range().unwrap()
    };
    bytes[start as usize..(start + size) as usize].fill(0);
    let original = std::fs::read(library).unwrap();
    let (fake, real) = (object::File::parse(&*bytes).unwrap(), object::File::parse(&*original).unwrap());
    assert!(real.build_id().unwrap().is_some(), "{} has a build id", library.display());
    assert_eq!(fake.build_id().unwrap(), real.build_id().unwrap(), "the fake keeps the build id");
    bytes
}

/// Of the samples in the library's `lib_inner`, how many have the whole chain from `main`. At
/// 99 Hz its 3 s are about 270 samples on an idle CPU; a loaded machine gives it fewer, and
/// only the share that is whole is the unwinder's.
fn whole_through_library(program: &Path, library: &Path) -> (u64, u64) {
    let dir = output_dir();
    let out = sysprof()
        .args(["trace", "-q", "-o"])
        .arg(dir.path())
        .args(["--", program.to_str().unwrap(), "dlopen", library.to_str().unwrap(), "3"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let folded = read_folded(&dir.path().join("cpu.folded"));
    let chain = ["main", "run_library", "lib_outer", "lib_inner"];
    let whole = folded
        .iter()
        .filter(|(frames, _)| frames.windows(chain.len()).any(|w| w.iter().zip(&chain).all(|(f, c)| f == c)))
        .map(|(_, n)| n)
        .sum();
    (whole, total_weight(&folded, "lib_inner"))
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_planted_library_with_the_real_ones_build_id_cannot_cut_its_stacks() {
    let Some(_guard) = root_guard("a_planted_library_with_the_real_ones_build_id_cannot_cut_its_stacks")
    else {
        return;
    };
    let program = workload_without_frame_pointers("unwind", false);
    let library = workload_without_frame_pointers("unwind_lib", true);
    let (whole, inner) = whole_through_library(&program, &library);
    assert!(inner >= 50 && whole as f64 >= inner as f64 * 0.9, "before: {whole} of {inner} whole");
    // As for a library root has not traced since it was installed: its table is not cached
    // yet when the user plants theirs (a cache keyed by build id then kept the fake's).
    let real_entry = tables_json(sysprof(), &library, true)["cache_entry"].as_str().unwrap().to_string();
    std::fs::remove_file(&real_entry).unwrap();

    // The user's copy: the same build id and size, no call frame information.
    let user = test_user();
    let home = user.dir();
    let fake = home.path().join("libunwind_lib.so");
    std::fs::write(&fake, fake_of(&library)).unwrap();
    std::os::unix::fs::chown(&fake, Some(user.uid), Some(user.gid)).unwrap();
    assert_eq!(std::fs::metadata(&fake).unwrap().len(), std::fs::metadata(&library).unwrap().len());
    let planted = bounded(user.sudo(&mut sysprof()).arg("tables").arg(&fake));
    assert!(planted.status.success(), "{}", text(&planted));
    let fake_table = tables_json(sysprof(), &fake, false);
    assert_eq!(fake_table["rows"], 0, "the fake has no table: {fake_table}");
    assert_ne!(fake_table["cache_entry"], real_entry, "named by content, not by build id");
    assert!(!Path::new(&real_entry).exists(), "nothing was kept under the real library's name");

    let (whole, inner) = whole_through_library(&program, &library);
    assert!(inner >= 50 && whole as f64 >= inner as f64 * 0.9, "after planting: {whole} of {inner} whole");
    let real_table = tables_json(sysprof(), &library, true);
    assert!(real_table["verified"].as_str().unwrap().starts_with("matches"), "{real_table}");
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn tables_verify_finds_removes_and_names_a_cached_table_that_is_wrong() {
    let Some(_guard) = root_guard("tables_verify_finds_removes_and_names_a_cached_table_that_is_wrong")
    else {
        return;
    };
    let library = workload_without_frame_pointers("unwind_lib", true);
    let figures = tables_json(sysprof(), &library, false);
    let entry = PathBuf::from(figures["cache_entry"].as_str().unwrap());
    let rows = figures["rows"].as_u64().unwrap() as usize;
    assert!(rows > 2, "{figures}");

    // A row's CFA offset changed and the checksum made right again: a well-formed entry whose
    // table is not its file's.
    let mut bytes = std::fs::read(&entry).unwrap();
    let rows_at = bytes.len() - 4 - rows * 12;
    bytes[rows_at + 12 + 4] ^= 0x08;
    let body = bytes.len() - 4;
    let checksum = crc32fast::hash(&bytes[..body]);
    bytes[body..].copy_from_slice(&checksum.to_le_bytes());
    std::fs::write(&entry, &bytes).unwrap();
    let out = sysprof().args(["tables", "--verify"]).arg(&library).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        format!(
            "{}: the cached table differed from the one built from the file: removed {}",
            library.display(),
            entry.display()
        )
    );
    assert!(!entry.exists(), "the wrong entry was removed");

    // Cut short: damaged, found as such.
    let _ = tables_json(sysprof(), &library, false);
    let bytes = std::fs::read(&entry).unwrap();
    std::fs::write(&entry, &bytes[..bytes.len() / 2]).unwrap();
    let verified = tables_json(sysprof(), &library, true);
    let said = verified["verified"].as_str().unwrap();
    assert!(
        said.starts_with("was unusable (damaged") && said.ends_with(&format!("removed {}", entry.display())),
        "{said}"
    );
    assert!(!entry.exists());

    // A right one matches, and stays.
    let _ = tables_json(sysprof(), &library, false);
    let out = sysprof().args(["tables", "--verify"]).arg(&library).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("the cached table matches its file"),
        "{}",
        text(&out)
    );
    assert!(entry.exists());
}
