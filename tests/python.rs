//! Python frames end to end: real CPython interpreters (pyenv's 3.10-3.13 and Debian's
//! stripped, non-PIE 3.11) running `tests/workloads/python_app.py` under the real BPF object,
//! their Python functions' shares checked against py-spy on the same script at the same rate
//! and against the script's own CPU time per function; sleeps, threads, a multiprocessing
//! child, a process traced by --pid, the GIL, and a CUDA call made through ctypes.

mod support;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use support::*;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/workloads/python_app.py")
}

/// The interpreters the tests run: pyenv's 3.10 to 3.13 and Debian's python3.11, each as
/// (label, path). In CI every one must be there (PLATFORM.md: these machines have them).
fn interpreters(test: &str) -> Vec<(String, PathBuf)> {
    let root = Command::new("pyenv")
        .arg("root")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".pyenv")
        });
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for minor in ["3.10", "3.11", "3.12", "3.13"] {
        let versions = std::fs::read_dir(root.join("versions")).into_iter().flatten().flatten();
        let installed = versions
            .map(|entry| entry.path())
            .filter(|path| {
                let name = path.file_name().unwrap().to_string_lossy();
                name.strip_prefix(minor).is_some_and(|rest| rest.starts_with('.'))
            })
            .map(|path| path.join(format!("bin/python{minor}")))
            .find(|python| python.is_file());
        match installed {
            Some(python) => found.push((format!("pyenv {minor}"), python)),
            None => missing.push(format!("pyenv {minor}")),
        }
    }
    let debian = PathBuf::from("/usr/bin/python3.11");
    if debian.is_file() {
        found.push(("Debian 3.11".into(), debian));
    } else {
        missing.push("Debian's /usr/bin/python3.11".into());
    }
    if !missing.is_empty() {
        if std::env::var_os("CI").is_some_and(|v| v != "false" && v != "0") {
            panic!("{test}: {} missing", missing.join(", "));
        }
        eprintln!("{test}: without {}", missing.join(", "));
    }
    found
}

/// py-spy (`pip install py-spy`: .ci/run installs it), on PATH or beside `python3`'s scripts.
fn py_spy(test: &str) -> Option<PathBuf> {
    let beside_python = Command::new("python3")
        .args(["-c", "import sysconfig; print(sysconfig.get_path('scripts'))"])
        .output()
        .ok()
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("py-spy"));
    let found = std::iter::once(PathBuf::from("py-spy"))
        .chain(beside_python)
        .find(|tool| Command::new(tool).arg("--version").output().is_ok_and(|out| out.status.success()));
    if found.is_none() {
        if std::env::var_os("CI").is_some_and(|v| v != "false" && v != "0") {
            panic!("{test}: py-spy is missing (.ci/run installs it with pip)");
        }
        eprintln!("skipped {test}: py-spy is not installed (pip install py-spy)");
    }
    found
}

/// The function a Python frame names: `regex_phase` of `regex_phase (python_app.py:20)`.
fn python_function(frame: &str) -> Option<&str> {
    let (name, place) = frame.split_once(" (")?;
    place.contains(".py:").then_some(name)
}

/// Each of `functions`' inclusive share (percent) of the samples under `root`.
fn shares(folded: &[(Vec<String>, u64)], root: &str, functions: &[&str]) -> (u64, HashMap<String, f64>) {
    let mut total = 0;
    let mut inclusive: HashMap<String, u64> = HashMap::new();
    for (frames, n) in folded {
        let names: Vec<&str> = frames.iter().filter_map(|f| python_function(f)).collect();
        if !names.contains(&root) {
            continue;
        }
        total += n;
        for function in functions {
            if names.contains(function) {
                *inclusive.entry(function.to_string()).or_default() += n;
            }
        }
    }
    let shares = functions
        .iter()
        .map(|f| (f.to_string(), 100.0 * *inclusive.get(*f).unwrap_or(&0) as f64 / total.max(1) as f64))
        .collect();
    (total, shares)
}

/// Runs `sysprof trace -q -o DIR ARGS...` and returns DIR.
fn traced(args: &[&str]) -> tempfile::TempDir {
    let dir = output_dir();
    let out = sysprof().args(["trace", "-q", "-o"]).arg(dir.path()).args(args).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    dir
}

const PHASES: [&str; 4] = ["regex_phase", "json_phase", "sort_phase", "pure_phase"];

#[test]
#[ignore = "needs root: loads BPF programs"]
fn python_functions_have_py_spys_shares_and_their_own_on_every_version() {
    let test = "python_functions_have_py_spys_shares_and_their_own_on_every_version";
    let Some(_guard) = root_guard(test) else { return };
    let Some(py_spy) = py_spy(test) else { return };
    let script = script();
    let mut failures = Vec::new();
    for (label, python) in interpreters(test) {
        // 499 Hz for 5 s: ~2,500 samples, so two profilers' shares differ by sampling alone
        // by about a point. (py-spy at 999 Hz on a two-CPU machine misses by up to 9 points
        // from one run to the next: it cannot keep the pace.)
        let timing = output_dir();
        let own = timing.path().join("own.json");
        let dir = traced(&[
            "-F",
            "499",
            "--",
            python.to_str().unwrap(),
            script.to_str().unwrap(),
            "phases",
            "5",
            own.to_str().unwrap(),
        ]);
        let folded = read_folded(&dir.path().join("cpu.folded"));
        let (samples, sysprof_shares) = shares(&folded, "phases", &PHASES);
        let own: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&own).unwrap()).unwrap();
        let own_total = own["total"].as_f64().unwrap();

        // py-spy's samples of three runs together: one run of it strays by up to 8 points here
        // (it stops the process for each sample, and its own scheduling on two CPUs clumps
        // them), while sysprof's stay within a point of the script's own time.
        let mut spy_folded = Vec::new();
        for run in 0..3 {
            let raw = timing.path().join(format!("py-spy-{run}.txt"));
            let out = Command::new(&py_spy)
                // --idle: else py-spy drops the samples of a thread it finds in a system call
                // (an allocation's mmap, a read), up to 10 points of json_phase here.
                .args(["record", "-r", "499", "--idle", "-f", "raw", "-o"])
                .arg(&raw)
                .arg("--")
                .arg(&python)
                .arg(&script)
                .args(["phases", "5"])
                .arg(timing.path().join("own-py-spy.json"))
                .output()
                .unwrap();
            assert!(out.status.success(), "py-spy on {label}: {}", text(&out));
            spy_folded.extend(read_folded(&raw));
        }
        let (spy_samples, spy_shares) = shares(&spy_folded, "phases", &PHASES);
        assert!(samples >= 1000 && spy_samples >= 1000, "{label}: {samples} samples, py-spy {spy_samples}");
        for function in PHASES {
            let (ours, theirs) = (sysprof_shares[function], spy_shares[function]);
            let true_share = 100.0 * own[function].as_f64().unwrap() / own_total;
            let line = format!(
                "{label} {function}: sysprof {ours:.1}%, py-spy {theirs:.1}%, own time {true_share:.1}%"
            );
            eprintln!("{line}");
            // Within 5 points of the truth (the phase's own CPU time), and of py-spy unless
            // sysprof is the nearer to the truth: on a loaded machine py-spy strays too (a CI
            // run read sort_phase at py-spy 43.6%, sysprof 49.1%, own time 49.1%), and its
            // error is not sysprof's.
            let off_truth = (ours - true_share).abs();
            if off_truth > 5.0 || ((ours - theirs).abs() > 5.0 && off_truth >= (theirs - true_share).abs()) {
                failures.push(line);
            }
        }
        // No frame is left unnamed.
        let unknown: u64 = folded
            .iter()
            .filter(|(frames, _)| frames.iter().any(|f| f.contains("[unknown Python")))
            .map(|(_, n)| n)
            .sum();
        assert!(unknown * 100 <= samples, "{label}: {unknown} samples with an unread code object");
        let report = read_report(dir.path());
        let walked = &report["run"]["unwind"]["python"]["processes"];
        assert!(walked.as_object().is_some_and(|v| v.len() == 1), "{label}: {walked}");
    }
    assert!(failures.is_empty(), "shares more than 5 points apart:\n{}", failures.join("\n"));
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_python_sleep_is_named_off_cpu_with_its_time() {
    let test = "a_python_sleep_is_named_off_cpu_with_its_time";
    let Some(_guard) = root_guard(test) else { return };
    let script = script();
    for (label, python) in interpreters(test) {
        // 20 sleeps of 10 ms in napper.
        let dir = traced(&["--", python.to_str().unwrap(), script.to_str().unwrap(), "sleep", "20", "10"]);
        let folded = read_folded(&dir.path().join("offcpu.folded"));
        let slept: u64 = folded
            .iter()
            .filter(|(frames, _)| {
                frames.iter().any(|f| f == "[sleep]")
                    && frames.iter().any(|f| python_function(f) == Some("napper"))
            })
            .map(|(_, n)| n)
            .sum();
        // offcpu.folded is weighted in microseconds.
        let slept_ms = slept as f64 / 1e3;
        assert!(
            (190.0..=400.0).contains(&slept_ms),
            "{label}: napper slept {slept_ms:.1} ms of 200: {}",
            heaviest(&folded)
        );
    }
}

/// The five heaviest stacks, for a failure's message.
fn heaviest(folded: &[(Vec<String>, u64)]) -> String {
    let mut stacks: Vec<_> = folded.iter().collect();
    stacks.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    stacks.iter().take(5).map(|(frames, n)| format!("\n{n} {}", frames.join(";"))).collect()
}

/// The samples of `folded` under a Python frame of `function`.
fn under(folded: &[(Vec<String>, u64)], function: &str) -> u64 {
    folded
        .iter()
        .filter(|(frames, _)| frames.iter().any(|f| python_function(f) == Some(function)))
        .map(|(_, n)| n)
        .sum()
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_running_process_threads_and_a_child_get_python_frames() {
    let test = "a_running_process_threads_and_a_child_get_python_frames";
    let Some(_guard) = root_guard(test) else { return };
    let script = script();
    let interpreters = interpreters(test);
    let Some((_, python)) =
        interpreters.iter().find(|(label, _)| label == "pyenv 3.12").or(interpreters.first())
    else {
        return;
    };
    let python = python.to_str().unwrap();
    let script = script.to_str().unwrap();

    // Started before the trace.
    let target = Background::spawn(Command::new(python).args([script, "spin", "30"]));
    std::thread::sleep(Duration::from_millis(300));
    let dir = traced(&["--pid", &target.pid().to_string(), "-d", "2s"]);
    let folded = read_folded(&dir.path().join("cpu.folded"));
    let total: u64 = folded.iter().map(|(_, n)| n).sum();
    let spinning = under(&folded, "spin_main");
    assert!(
        total >= 100 && spinning * 100 >= total * 95,
        "{spinning} of {total} samples in spin_main: {}",
        heaviest(&folded)
    );

    // A thread pool: both threads' samples, each under its own frames.
    let dir = traced(&["--", python, script, "threads", "2"]);
    let folded = read_folded(&dir.path().join("cpu.folded"));
    let total: u64 = folded.iter().map(|(_, n)| n).sum();
    let working = under(&folded, "thread_work");
    assert!(
        working * 100 >= total * 80,
        "{working} of {total} samples in thread_work: {}",
        heaviest(&folded)
    );
    assert!(
        folded.iter().all(|(frames, _)| !frames.iter().any(|f| python_function(f) == Some("thread_work"))
            || !frames.iter().any(|f| python_function(f) == Some("threads"))),
        "a pool thread's stack holds the main thread's frames"
    );

    // A multiprocessing child (forked, not exec'd).
    let dir = traced(&["--", python, script, "children", "2"]);
    let folded = read_folded(&dir.path().join("cpu.folded"));
    let total: u64 = folded.iter().map(|(_, n)| n).sum();
    let child = under(&folded, "child_work");
    assert!(child * 100 >= total * 80, "{child} of {total} samples in child_work: {}", heaviest(&folded));
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_thread_waiting_for_the_gil_is_reported_as_such() {
    let test = "a_thread_waiting_for_the_gil_is_reported_as_such";
    let Some(_guard) = root_guard(test) else { return };
    let script = script();
    let interpreters = interpreters(test);
    let Some((_, python)) = interpreters.iter().find(|(label, _)| label == "pyenv 3.12") else { return };
    let dir = traced(&["--", python.to_str().unwrap(), script.to_str().unwrap(), "gil", "2"]);
    let folded = read_folded(&dir.path().join("offcpu.folded"));
    let waited: u64 = folded
        .iter()
        .filter(|(frames, _)| {
            frames.iter().any(|f| f == "[waiting for the GIL]")
                && frames.iter().any(|f| python_function(f) == Some("gil_worker"))
        })
        .map(|(_, n)| n)
        .sum();
    // Two threads want the GIL for 2 s each: one of them waits for it most of the time the
    // other runs.
    assert!(waited >= 500_000, "{waited} µs waiting for the GIL under gil_worker: {}", heaviest(&folded));
    let report = read_report(dir.path());
    let row = &report["sched"]["processes"][0];
    let reasons = row["offcpu_by_reason"].as_array().unwrap();
    assert!(reasons.iter().any(|r| r["reason"] == "waiting for the GIL"), "{reasons:?}");
    assert!(
        !reasons.iter().any(|r| r["reason"] == "lock contention" && r["seconds"].as_f64().unwrap() > 0.1)
    );
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_cuda_call_made_through_ctypes_is_named_at_its_python_line() {
    let test = "a_cuda_call_made_through_ctypes_is_named_at_its_python_line";
    let Some(_guard) = root_guard(test) else { return };
    let Some(libs) = nvidia_libraries(test) else { return };
    let interpreters = interpreters(test);
    let Some((_, python)) = interpreters.iter().find(|(label, _)| label == "pyenv 3.12") else { return };
    let script = script();
    let dir = traced(&[
        "--focus",
        "gpu",
        "--",
        python.to_str().unwrap(),
        script.to_str().unwrap(),
        "cuda",
        libs.join("libcudart.so.12").to_str().unwrap(),
        "5",
    ]);
    let source = std::fs::read_to_string(&script).unwrap();
    let line = source.lines().position(|l| l.contains("cudart.cudaDeviceSynchronize()")).unwrap() + 1;
    let report = read_report(dir.path());
    let compute = &report["gpu"]["compute"];
    assert_eq!(compute["sync_calls"], 1, "{compute:#}");
    assert_eq!(compute["sync_sites"][0]["call_site"], format!("train_step (python_app.py:{line})"));
    let functions = report["gpu"]["functions"].as_array().unwrap();
    let memcpy = functions.iter().find(|f| f["function"] == "cudaMemcpy").unwrap();
    assert_eq!(memcpy["calls"], 5);
}
