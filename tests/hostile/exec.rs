//! See main.rs.
//!
//! A target that exec()s mid-trace runs two programs under one pid, at addresses that overlap
//! or coincide (the same file, even, at another load address). Each sample belongs to the image
//! it ran in, named as it was then: `tests/workloads/execer.c` spends its CPU in three named
//! functions, then execs another program (or itself), as the test user, launched through sudo or
//! traced by its pid.

use std::{
    io::Write as _,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use crate::support::*;

/// Sampling frequency: some 750 samples over the 1.5 s before the exec, so each function's
/// share is good to a few points.
const HZ: f64 = 499.0;
/// The CPU time execer spends in its three functions before it execs.
const BEFORE_S: &str = "1.5";
/// The CPU time of the program after the exec.
const AFTER_S: &str = "1";

/// Shares must be within this many points of the truth, or within four standard deviations of
/// a share counted from that many samples, when that is wider (as `tests/cpu.rs`).
fn share_tolerance(p: f64, samples: f64) -> f64 {
    0.07_f64.max(4.0 * (p * (1.0 - p) / samples.max(1.0)).sqrt())
}

/// Whether `samples` is what `cpu_s` seconds of CPU give at `HZ`, as `tests/cpu.rs` judges it.
fn about(samples: f64, cpu_s: f64) -> bool {
    let expected = HZ * cpu_s;
    samples >= expected * 0.8 - 5.0 && samples <= expected * 1.2 + 5.0
}

/// What execer printed before its exec: each named function's CPU time by its own thread's
/// clock, in seconds.
fn before_exec(printed: &str) -> [(&'static str, f64); 3] {
    [("exec_alpha", "alpha_ns"), ("exec_beta", "beta_ns"), ("exec_gamma", "gamma_ns")]
        .map(|(function, printed_as)| (function, printed_value(printed, printed_as) as f64 / 1e9))
}

/// The program after the exec: its name, the function it spins in (with its caller), and its
/// CPU time in that function by its own clock.
struct After {
    program: &'static str,
    function: &'static str,
    caller: &'static str,
    cpu_s: f64,
}

/// The self weight of `function` among the report's hotspots, where its module is `module`.
fn hotspot(report: &serde_json::Value, function: &str, module: &str) -> f64 {
    report["hotspots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["function"] == function && row["module"] == module)
        .and_then(|row| row["self_weight"].as_f64())
        .unwrap_or_else(|| panic!("no hotspot {function} ({module}): {:#}", report["hotspots"]))
}

/// Checks what a trace over execer wrote to `dir`: every sample resolved against the image it
/// was taken in, named as that program was.
fn assert_each_image_resolved(dir: &Path, pid: u32, before: [(&'static str, f64); 3], after: &After) {
    let report = read_report(dir);
    let folded = read_folded(&dir.join("cpu.folded"));
    let total: u64 = folded.iter().map(|(_, n)| n).sum();

    // Almost nothing unresolved: before the fix, 89% of such a trace was `[unmapped code]`.
    let unmapped = total_weight(&folded, "[unmapped code]");
    assert!(unmapped * 20 <= total, "{unmapped} of {total} samples in [unmapped code]: {folded:?}");
    if let Some(offcpu) = Some(dir.join("offcpu.folded")).filter(|path| path.exists()) {
        let offcpu = read_folded(&offcpu);
        let (waited, unmapped): (u64, u64) =
            (offcpu.iter().map(|(_, n)| n).sum(), total_weight(&offcpu, "[unmapped code]"));
        assert!(unmapped * 20 <= waited, "{unmapped} of {waited} us off-CPU in [unmapped code]: {offcpu:?}");
    }

    // Each stack is whole, and under the program it ran in: a stack resolved against the other
    // image would name other functions, or none. A sample on a function's first instructions
    // skips its caller in a frame-pointer walk: one in fifty is allowed.
    let mut checked = vec![(function_names(&before), "execer", "before_exec")];
    checked.push((vec![after.function], after.program, after.caller));
    for (functions, program, caller) in checked {
        let (mut whole, mut broken) = (0, 0);
        for (frames, n) in
            folded.iter().filter(|(frames, _)| frames.iter().any(|f| functions.contains(&f.as_str())))
        {
            assert_eq!(frames[0], program, "a stack of {functions:?} under another program: {frames:?}");
            if frames.iter().any(|f| f == caller) && frames.iter().any(|f| f == "main") {
                whole += n;
            } else {
                broken += n;
            }
        }
        assert!(
            whole > 0 && broken * 50 <= whole,
            "{broken} broken stacks of {functions:?}, {whole} whole: {folded:?}"
        );
    }

    // The report's hot functions name the three, with the shares of their CPU time, and the
    // program after the exec's.
    let weights: Vec<f64> = before.iter().map(|(function, _)| hotspot(&report, function, "execer")).collect();
    let (samples, cpu_s): (f64, f64) = (weights.iter().sum(), before.iter().map(|(_, s)| s).sum());
    assert!(
        about(samples, cpu_s),
        "{samples} samples in the three functions, for {cpu_s:.3} s of their CPU time"
    );
    for ((function, seconds), weight) in before.iter().zip(&weights) {
        let (share, expected) = (weight / samples, seconds / cpu_s);
        let tolerance = share_tolerance(expected, samples);
        assert!(
            (share - expected).abs() <= tolerance,
            "{function}: {share:.3} of the three's samples, {expected:.3} of their CPU time (+- {tolerance:.3})"
        );
    }
    let spun = hotspot(&report, after.function, after.program);
    assert!(
        about(spun, after.cpu_s),
        "{spun} samples in {}, for {:.3} s of its CPU time",
        after.function,
        after.cpu_s
    );
    // One process, two programs, each its own row.
    let rows = report["processes"].as_array().unwrap();
    for program in ["execer", after.program] {
        assert!(
            rows.iter().any(|row| row["name"] == program && row["pid"] == pid),
            "no {program} row of pid {pid}: {rows:?}"
        );
    }

    let markdown = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(!markdown.contains("Nothing stands out"), "{markdown}");
    assert!(markdown.contains("**Optimize exec_alpha (execer)**"), "{markdown}");

    // The timeline's samples, resolved by when they were taken.
    if let Some(summary) = perfetto_summary(&dir.join("timeline.pftrace")) {
        let leaves = &summary["samples"][pid.to_string()];
        for function in function_names(&before).into_iter().chain([after.function]) {
            assert!(leaves[function].as_u64().unwrap_or(0) > 0, "no timeline sample in {function}: {leaves}");
        }
        let unmapped = leaves["[unmapped code]"].as_u64().unwrap_or(0);
        let all: u64 = leaves.as_object().unwrap().values().filter_map(|n| n.as_u64()).sum();
        assert!(unmapped * 20 <= all, "{unmapped} of {all} timeline samples in [unmapped code]: {leaves}");
    }
}

fn function_names(before: &[(&'static str, f64); 3]) -> Vec<&'static str> {
    before.iter().map(|(function, _)| *function).collect()
}

/// The run saved in `dir` (`--save-readout`) renders again as it was written: each image's
/// snapshot and symbol names are in the read-out.
fn assert_replays_as_written(dir: &Path) {
    let again = output_dir();
    let out = sysprof().arg("report").arg(dir).arg("-o").arg(again.path()).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".folded") || name == "report.md" {
            let read = |dir: &Path| std::fs::read_to_string(dir.join(&name)).unwrap();
            assert_eq!(read(again.path()), read(dir), "{name} rendered again from the read-out");
        }
    }
}

/// The files of `dir` are the user's, not root's.
fn assert_owned_by(dir: &Path, user: &TestUser) {
    use std::os::unix::fs::MetadataExt as _;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        assert_eq!(std::fs::metadata(&path).unwrap().uid(), user.uid, "{} is not the user's", path.display());
    }
}

/// `-- execer 1.5 busy 1` through sudo: the command runs as the user, its samples before the
/// exec are execer's three functions (not `[unmapped code]` against busy's maps), its calls'
/// sites and its heap's are execer's too, and busy's burn_hot is busy's. execer's heap blocks
/// are not live after the exec.
#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_launched_command_that_execs_keeps_each_programs_samples() {
    let Some(_guard) = root_guard("a_launched_command_that_execs_keeps_each_programs_samples") else {
        return;
    };
    let (execer, busy, user) = (workload("execer"), workload("busy"), test_user());
    let dir = user.dir();
    // A function the three call, whose callers are named in the image they ran in: a return
    // probe on one of the three would cut their samples' stacks at its trampoline.
    let probed = format!("{}:checkpoint", execer.display());
    let mut command = sysprof();
    user.sudo(&mut command)
        .args(["trace", "-q", "-F", "499", "--malloc", "--func", &probed, "--save-readout", "-o"])
        .arg(dir.path())
        .arg("--")
        .arg(&execer)
        .arg(BEFORE_S)
        .arg(&busy)
        .arg(AFTER_S);
    let out = command.output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let printed = String::from_utf8_lossy(&out.stdout);
    let report = read_report(dir.path());
    let pid = report["processes"][0]["pid"].as_u64().unwrap() as u32;
    // busy's clock counts the process's CPU time, execer's before it (BEFORE_S) included; a
    // quarter of its own is burn_cold's.
    let busy_s = printed_value(&printed, "cpu_ns") as f64 / 1e9 - BEFORE_S.parse::<f64>().unwrap();
    let after = After { program: "busy", function: "burn_hot", caller: "burn_for", cpu_s: busy_s * 0.75 };
    assert_each_image_resolved(dir.path(), pid, before_exec(&printed), &after);

    // The probed calls' site, and the heap's: execer's own code, not busy's at its addresses.
    let function =
        report["functions"].as_array().unwrap().iter().find(|f| f["function"] == "checkpoint").unwrap();
    let mut callers: Vec<&str> =
        function["callers"].as_array().unwrap().iter().filter_map(|caller| caller[0].as_str()).collect();
    callers.sort_unstable();
    assert_eq!(callers, ["exec_alpha (execer)", "exec_beta (execer)", "exec_gamma (execer)"], "{function:#}");
    // Each program's stdout buffer: execer's went with its address space at the exec, busy's
    // was live at its exit.
    let sites = report["memory"]["heap"]["sites"].as_array().unwrap();
    for (process, site, live) in [("execer", "before_exec (execer)", 0), ("busy", "main (busy)", 4096)] {
        assert!(
            sites.iter().any(|s| s["process"] == process
                && s["site"] == site
                && s["pid"] == pid
                && s["live_bytes"] == live),
            "no heap site {site} of {process} with {live} bytes live: {sites:?}"
        );
    }
    let heap =
        &report["memory"]["processes"].as_array().unwrap().iter().find(|p| p["pid"] == pid).unwrap()["heap"];
    assert_eq!(heap["live"], 4096, "{heap:#}");
    let in_use = read_folded(&dir.path().join("inuse.folded"));
    assert!(in_use.iter().all(|(frames, _)| frames[0] == "busy"), "{in_use:?}");
    // The command's start (its wait at sysprof's gate, its execve) is under its name, sysprof's
    // code in it one frame: none of the launcher's own functions is named.
    for profile in ["cpu.folded", "offcpu.folded"] {
        for (frames, _) in read_folded(&dir.path().join(profile)) {
            assert!(!frames.iter().any(|f| f.contains("sysprof::")), "{profile}: {frames:?}");
            if frames.iter().any(|f| f == "[sysprof launcher]") {
                assert_eq!(frames[0], "execer", "{profile}: {frames:?}");
            }
        }
    }
    assert_owned_by(dir.path(), &user);
    assert_replays_as_written(dir.path());
}

/// `--pid` of the user's execer, attached before it works and followed through its exec: the
/// image before is the one sysprof read at the attach.
#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_traced_pid_that_execs_keeps_each_programs_samples() {
    let Some(_guard) = root_guard("a_traced_pid_that_execs_keeps_each_programs_samples") else { return };
    let (execer, busy, user) = (workload("execer"), workload("busy"), test_user());
    let dir = user.dir();
    // As the user, held at its gate (one byte on stdin) until sysprof traces it.
    let mut target = Background(
        Command::new("setpriv")
            .args([format!("--reuid={}", user.uid), format!("--regid={}", user.gid), "--clear-groups".into()])
            .arg(&execer)
            .arg("--wait")
            .arg(BEFORE_S)
            .arg(&busy)
            .arg(AFTER_S)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = target.pid();
    let mut command = sysprof();
    user.sudo(&mut command).args(["trace", "-F", "499", "--pid", &pid.to_string(), "-o"]).arg(dir.path());
    let mut tracing = spawn_tracing_with(&mut command);
    target.0.stdin.take().unwrap().write_all(b"x").unwrap();
    let status = wait_bounded(&mut tracing.child, Duration::from_secs(60));
    assert!(status.success(), "{}", tracing.stderr());
    let mut printed = String::new();
    std::io::Read::read_to_string(&mut target.0.stdout.take().unwrap(), &mut printed).unwrap();
    let ended_by = read_report(dir.path())["run"]["ended_by"].as_str().unwrap_or_default().to_string();
    assert!(ended_by.starts_with("target exit"), "ended by {ended_by}: {}", tracing.stderr());
    let busy_s = printed_value(&printed, "cpu_ns") as f64 / 1e9 - BEFORE_S.parse::<f64>().unwrap();
    let after = After { program: "busy", function: "burn_hot", caller: "burn_for", cpu_s: busy_s * 0.75 };
    assert_each_image_resolved(dir.path(), pid, before_exec(&printed), &after);
    assert_owned_by(dir.path(), &user);
}

/// `-- execer 1.5 --self 1`: the same file, under the same name, as a second image at other
/// addresses. Both images' functions are in the first's code and the second's, and each sample
/// names its own: the work before (exec_*) and after (after_exec_spin) differ.
#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_program_that_execs_itself_keeps_each_images_samples() {
    let Some(_guard) = root_guard("a_program_that_execs_itself_keeps_each_images_samples") else { return };
    let (execer, user) = (workload("execer"), test_user());
    let dir = user.dir();
    let mut command = sysprof();
    user.sudo(&mut command)
        .args(["trace", "-q", "-F", "499", "--save-readout", "-o"])
        .arg(dir.path())
        .arg("--")
        .arg(&execer)
        .arg(BEFORE_S)
        .arg("--self")
        .arg(AFTER_S);
    let out = command.output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let printed = String::from_utf8_lossy(&out.stdout);
    let pid = read_report(dir.path())["processes"][0]["pid"].as_u64().unwrap() as u32;
    let after = After {
        program: "execer",
        function: "after_exec_spin",
        caller: "after_exec",
        cpu_s: printed_value(&printed, "after_ns") as f64 / 1e9,
    };
    assert_each_image_resolved(dir.path(), pid, before_exec(&printed), &after);
    assert_owned_by(dir.path(), &user);
    assert_replays_as_written(dir.path());
}
