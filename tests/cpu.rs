//! On-CPU profiling end to end: the real BPF object in the real kernel, a real workload whose
//! shares are known (burn_hot 75%, burn_cold 25%), and what a user reads in the outputs.

mod support;

use std::{path::Path, process::Command, time::Duration};

use support::*;

/// Shares must be within this many points of the truth, or within four standard deviations
/// of a share counted from that many samples, when that is wider: 2 s at 99 Hz is some 200
/// samples of busy, whose burn_hot share then spreads by 0.031 from run to run (one CI run
/// read 0.837 of 196), so 0.07 alone was a 2.3-sigma test that failed about 1 run in 50.
const SHARE_TOLERANCE: f64 = 0.07;

/// The tolerance for a share `p` counted from `samples` samples (see `SHARE_TOLERANCE`).
fn share_tolerance(p: f64, samples: f64) -> f64 {
    SHARE_TOLERANCE.max(4.0 * (p * (1.0 - p) / samples.max(1.0)).sqrt())
}

/// The CPU time busy reports it got ("cpu_ns=N" on its stdout), in seconds.
fn reported_cpu_s(out: &std::process::Output) -> f64 {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("cpu_ns="))
        .and_then(|ns| ns.parse::<f64>().ok())
        .map(|ns| ns / 1e9)
        .unwrap_or_else(|| panic!("busy reports its CPU time: {}", text(out)))
}

/// Checks cpu.folded, cpu.svg and report.json of a run over `busy`, which got `cpu_s` seconds
/// of CPU while traced (what it really got, measured outside sysprof).
fn assert_busy_profile(dir: &Path, frequency: f64, cpu_s: f64) {
    let folded = read_folded(&dir.join("cpu.folded"));
    let hot = self_weight(&folded, "burn_hot") as f64;
    let cold = self_weight(&folded, "burn_cold") as f64;
    let busy: u64 = folded.iter().filter(|(frames, _)| frames[0] == "busy").map(|(_, n)| n).sum();
    assert!(hot + cold > 0.0, "no burn_* samples in {folded:?}");
    // Samples whose user stack the kernel could not keep (a bucket of the direct-mapped stack
    // map taken by another stack; counted as lost) may be either burner's: the true share lies
    // between these bounds, which are the share itself when nothing was lost.
    let lost = folded
        .iter()
        .filter(|(frames, _)| frames[0] == "busy" && frames.iter().any(|f| f == "[user stack lost]"))
        .map(|(_, n)| *n as f64)
        .sum::<f64>();
    let (low, high) = (hot / (hot + cold + lost), (hot + lost) / (hot + cold + lost));
    let tolerance = share_tolerance(0.75, hot + cold + lost);
    assert!(
        low - tolerance <= 0.75 && 0.75 <= high + tolerance,
        "burn_hot share {low:.3}..{high:.3} ({lost} samples lost their stack), expected 0.75 +- {tolerance:.3} \
         ({folded:?})"
    );
    // The stacks are whole: main (or a thread's start routine) calls burn_for, which calls the
    // burners. A sample taken on a burner's first instructions, before it has pushed its frame
    // pointer, skips its caller in a frame-pointer walk (the kernel's, perf's alike): allowed
    // for a sample in fifty, no more.
    let mut broken = 0;
    for (frames, n) in
        folded.iter().filter(|(frames, _)| frames.iter().any(|f| f == "burn_hot" || f == "burn_cold"))
    {
        let caller = frames.iter().position(|f| f == "burn_for");
        let start = frames.iter().position(|f| f == "main" || f == "thread_main");
        assert!(start.is_some(), "a stack without its root {frames:?}");
        if !matches!((start, caller), (Some(s), Some(c)) if s < c) {
            broken += n;
        }
    }
    assert!(broken as f64 <= (hot + cold) / 50.0, "{broken} broken stacks of {} in {folded:?}", hot + cold);
    // Samples follow the CPU time busy really got (its own clock, or the kernel's accounting),
    // whatever else the machine runs.
    let samples = busy as f64;
    let expected = frequency * cpu_s;
    let report = read_report(dir);
    assert!(
        samples >= expected * 0.8 - 5.0 && samples <= expected * 1.2 + 5.0,
        "{samples} samples of busy, expected about {expected:.0} ({frequency} Hz x the {cpu_s:.3} s of CPU busy got)"
    );

    let svg = std::fs::read_to_string(dir.join("cpu.svg")).unwrap();
    assert!(
        svg.starts_with("<?xml") && svg.trim_end().ends_with("</svg>"),
        "cpu.svg is not a whole SVG document"
    );
    assert!(svg.contains("burn_hot") && svg.contains("burn_cold"), "cpu.svg does not name the hot functions");

    assert_eq!(report["hotspots"][0]["function"], "burn_hot", "{:#}", report["hotspots"]);
    assert_eq!(report["hotspots"][0]["module"], "busy");
    assert_eq!(report["instrumentation"]["detach"]["still_attached"], serde_json::json!([]));
    assert!(report["instrumentation"]["files_modified"].as_array().unwrap().is_empty());
    let markdown = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(markdown.contains("| `burn_hot` | busy |"), "report.md hotspots:\n{markdown}");
    assert!(markdown.contains("## Part B: instrumentation changelog"));
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn profiles_a_command_to_its_end_with_true_shares() {
    let Some(_guard) = root_guard("profiles_a_command_to_its_end_with_true_shares") else { return };
    let busy = workload("busy");
    let dir = output_dir();
    let out = sysprof()
        .args(["trace", "-F", "199", "-o"])
        .arg(dir.path())
        .arg("--")
        .arg(&busy)
        .arg("3")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("command: exit status 0"), "{stderr}");
    assert!(stderr.contains("cpu.svg in a browser"), "{stderr}");
    assert_busy_profile(dir.path(), 199.0, reported_cpu_s(&out));
    assert_no_sysprof_programs();
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn profiles_a_running_pid_for_a_duration() {
    let Some(_guard) = root_guard("profiles_a_running_pid_for_a_duration") else { return };
    let busy = Background::spawn(Command::new(workload("busy")).arg("20"));
    std::thread::sleep(Duration::from_millis(100));
    let dir = output_dir();
    let pid = busy.pid().to_string();
    let mut trace = sysprof()
        // 299 Hz: some 600 samples in the 2 s, whose share is good to the tolerance's 0.07.
        .args(["trace", "--pid", &pid, "-d", "2", "-F", "299", "-q", "-o", dir.path().to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // busy's share of a CPU, from the kernel's accounting over sysprof's whole run (a little
    // wider than the trace itself), times the trace's duration.
    let (before, started) = (process_cpu_s(busy.pid()), std::time::Instant::now());
    let status = wait_bounded(&mut trace, Duration::from_secs(30));
    let share = (process_cpu_s(busy.pid()) - before) / started.elapsed().as_secs_f64();
    let out = trace.wait_with_output().unwrap();
    assert!(status.success(), "{}", text(&out));
    assert!(out.stderr.is_empty(), "--quiet printed: {}", text(&out));
    let traced_s = read_report(dir.path())["run"]["duration_s"].as_f64().unwrap();
    assert_busy_profile(dir.path(), 299.0, share.min(1.0) * traced_s);
    let report = read_report(dir.path());
    assert_eq!(report["run"]["ended_by"], "duration");
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn counts_every_busy_thread() {
    let Some(_guard) = root_guard("counts_every_busy_thread") else { return };
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(4);
    let dir = output_dir();
    let out = sysprof()
        .args(["trace", "-q", "-o"])
        .arg(dir.path())
        .arg("--")
        .arg(workload("busy"))
        .args(["2", &threads.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_busy_profile(dir.path(), 99.0, reported_cpu_s(&out));
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn symbolizes_a_short_lived_child() {
    let Some(_guard) = root_guard("symbolizes_a_short_lived_child") else { return };
    let dir = output_dir();
    let out = sysprof()
        .args(["trace", "-q", "-F", "499", "-o"])
        .arg(dir.path())
        .arg("--")
        .arg(workload("busy"))
        .args(["--spawn-child", "2"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let folded = read_folded(&dir.path().join("cpu.folded"));
    // The child burned in child_only_work for the CPU time it reports (up to 0.4 s: less on a
    // busy machine), had exited long before the trace ended, and is symbolized from the maps
    // read while it lived.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let cpu_ns: f64 = stdout
        .lines()
        .find_map(|line| line.strip_prefix("child_cpu_ns="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the child reports its CPU time: {}", text(&out)));
    let expected = cpu_ns / 1e9 * 499.0;
    let child = self_weight(&folded, "child_only_work") as f64;
    assert!(
        child >= 0.7 * expected - 5.0 && child <= 1.2 * expected + 5.0,
        "child_only_work has {child} samples for {:.3} s of CPU at 499 Hz (expected ~{expected:.0}): {folded:?}",
        cpu_ns / 1e9
    );
    assert!(
        folded.iter().any(|(frames, _)| frames[0] == "busy"
            && frames.iter().any(|f| f == "main")
            && frames.last().unwrap() == "child_only_work"),
        "child stacks are not whole: {folded:?}"
    );
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn system_wide_sees_the_workload() {
    let Some(_guard) = root_guard("system_wide_sees_the_workload") else { return };
    let busy = Background::spawn(Command::new(workload("busy")).arg("20"));
    std::thread::sleep(Duration::from_millis(100));
    let dir = output_dir();
    let out = run_sysprof(&["trace", "--all", "-d", "1.5", "-q", "-o", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let folded = read_folded(&dir.path().join("cpu.folded"));
    let hot = self_weight(&folded, "burn_hot");
    assert!(hot > 50, "burn_hot has {hot} samples system-wide: {folded:?}");
    let report = read_report(dir.path());
    // busy keeps one CPU busy: the machine was at least that busy.
    let cpus = report["run"]["cpus"].as_f64().unwrap();
    let busy_share = report["run"]["machine_busy_share"].as_f64().unwrap();
    assert!(busy_share >= 0.9 / cpus && busy_share <= 1.0, "machine busy share {busy_share} on {cpus} CPUs");
    let pid = busy.pid();
    assert!(
        report["processes"].as_array().unwrap().iter().any(|p| p["pid"] == pid && p["name"] == "busy"),
        "busy (pid {pid}) missing from {:#}",
        report["processes"]
    );
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn follows_processes_by_name_including_new_ones() {
    let Some(_guard) = root_guard("follows_processes_by_name_including_new_ones") else { return };
    let dir = output_dir();
    let mut trace = spawn_tracing(&["trace", "--comm", "busy", "-d", "4"], dir.path());
    // Started after the trace: matched at exec by its name.
    let busy = Command::new(workload("busy")).arg("1.5").status().unwrap();
    assert!(busy.success());
    assert!(trace.wait().unwrap().success());
    let folded = read_folded(&dir.path().join("cpu.folded"));
    assert!(self_weight(&folded, "burn_hot") > 50, "{folded:?}");
    assert!(folded.iter().all(|(frames, _)| frames[0] == "busy"), "only busy is traced: {folded:?}");
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn profiles_a_cgroup() {
    let Some(_guard) = root_guard("profiles_a_cgroup") else { return };
    let root = sysprof::target::cgroup2_root().expect("cgroup v2 is mounted (sysprof check)");
    let group = root.join(format!("sysprof-test-{}", std::process::id()));
    std::fs::create_dir(&group).unwrap();
    let busy = Background::spawn(Command::new(workload("busy")).arg("20"));
    std::fs::write(group.join("cgroup.procs"), busy.pid().to_string()).unwrap();
    let other = Background::spawn(Command::new(workload("busy")).arg("20"));
    let dir = output_dir();
    let out = run_sysprof(&[
        "trace",
        "--cgroup",
        group.to_str().unwrap(),
        "-d",
        "1.5",
        "-q",
        "-o",
        dir.path().to_str().unwrap(),
    ]);
    drop((busy, other));
    let _ = std::fs::remove_dir(&group);
    assert!(out.status.success(), "{}", text(&out));
    let report = read_report(dir.path());
    let processes = report["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 1, "only the process in the cgroup: {processes:#?}");
    assert_eq!(processes[0]["name"], "busy");
}
