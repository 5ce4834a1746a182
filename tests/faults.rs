//! Bad input and faults: each gets one clear line naming the fix and the right exit code, what
//! was collected is written, and no sysprof program is left in the kernel.

mod support;

use std::{
    os::unix::{fs::PermissionsExt as _, process::CommandExt as _},
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use support::*;

/// The last line sysprof wrote to stderr.
fn last_line(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).lines().last().unwrap_or_default().to_string()
}

#[test]
fn without_privileges_it_says_to_use_sudo() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let out = if root {
        // Run the binary from a folder the unprivileged user can reach (the build may sit
        // under /root): a hard link where the folder shares the build's filesystem, since a
        // debug build is some 200 MB and CI's disk is not ours to fill; a copy elsewhere.
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let copy = dir.path().join("sysprof");
        let binary = env!("CARGO_BIN_EXE_sysprof");
        if std::fs::hard_link(binary, &copy).is_err() {
            std::fs::copy(binary, &copy).unwrap();
        }
        Command::new(&copy)
            .args(["trace", "--all", "-d", "1"])
            .current_dir(dir.path())
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap()
    } else {
        run_sysprof(&["trace", "--all", "-d", "1"])
    };
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(
        last_line(&out),
        "error: sysprof needs root (or CAP_BPF and CAP_PERFMON) to load BPF programs: run it with sudo"
    );
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_missing_pid_is_named() {
    let Some(_guard) = root_guard("a_missing_pid_is_named") else { return };
    let dir = output_dir();
    let out = run_sysprof(&["trace", "--pid", "4000000", "-o", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(last_line(&out), "error: no process with pid 4000000: check it with `ps -p 4000000`");
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_pid_that_exits_mid_trace_ends_it_and_keeps_the_samples() {
    let Some(_guard) = root_guard("a_pid_that_exits_mid_trace_ends_it_and_keeps_the_samples") else { return };
    let busy = Background::spawn(Command::new(workload("busy")).arg("3"));
    let dir = output_dir();
    let started = Instant::now();
    let out = run_sysprof(&[
        "trace",
        "--pid",
        &busy.pid().to_string(),
        "-d",
        "30",
        "-o",
        dir.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(started.elapsed() < Duration::from_secs(10), "the trace did not end with its target");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("every target process exited: ending the trace"), "{stderr}");
    // The samples of a target that exited are kept and symbolized, burn_hot's ahead (how many
    // there are depends on the CPU time busy got, which a busy machine lowers).
    let folded = read_folded(&dir.path().join("cpu.folded"));
    let (hot, cold) = (self_weight(&folded, "burn_hot") as f64, self_weight(&folded, "burn_cold") as f64);
    assert!(hot + cold >= 20.0 && hot > cold, "{folded:?}");
    assert!(read_report(dir.path())["run"]["ended_by"].as_str().unwrap().starts_with("target exit"));
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_missing_command_is_named() {
    let Some(_guard) = root_guard("a_missing_command_is_named") else { return };
    let dir = output_dir();
    let out =
        run_sysprof(&["trace", "-o", dir.path().to_str().unwrap(), "--", "sysprof-no-such-command", "x"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(last_line(&out), "error: command not found: sysprof-no-such-command");
    assert_no_sysprof_programs();
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_failing_command_passes_its_status_on_and_is_still_profiled() {
    let Some(_guard) = root_guard("a_failing_command_passes_its_status_on_and_is_still_profiled") else {
        return;
    };
    let dir = output_dir();
    let script = format!("{} 1 && exit 3", workload("busy").display());
    let out = run_sysprof(&["trace", "-o", dir.path().to_str().unwrap(), "--", "sh", "-c", &script]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("command: exit status 3"), "{}", text(&out));
    // busy ran as a child of sh: followed and symbolized.
    let folded = read_folded(&dir.path().join("cpu.folded"));
    assert!(self_weight(&folded, "burn_hot") > 30, "{folded:?}");
    assert_eq!(read_report(dir.path())["run"]["command_status"], "exit status 3");
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_killed_command_exits_as_shells_report_it() {
    let Some(_guard) = root_guard("a_killed_command_exits_as_shells_report_it") else { return };
    let dir = output_dir();
    let out =
        run_sysprof(&["trace", "-q", "-o", dir.path().to_str().unwrap(), "--", "sh", "-c", "kill -SEGV $$"]);
    assert_eq!(out.status.code(), Some(128 + 11), "{}", text(&out));
    assert_eq!(read_report(dir.path())["run"]["command_status"], "killed by SIGSEGV");
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn an_output_path_that_is_a_file_is_refused_before_tracing() {
    let Some(_guard) = root_guard("an_output_path_that_is_a_file_is_refused_before_tracing") else { return };
    let file = tempfile::NamedTempFile::new().unwrap();
    let out = run_sysprof(&["trace", "--all", "-d", "1", "-o", file.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(
        last_line(&out),
        format!(
            "error: cannot write results to {}: it is a file, not a directory; choose another directory with -o DIR",
            file.path().display()
        )
    );
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn an_unwritable_output_directory_is_refused_before_tracing() {
    let Some(_guard) = root_guard("an_unwritable_output_directory_is_refused_before_tracing") else { return };
    // Even root cannot create directories in /proc.
    let out = run_sysprof(&["trace", "--all", "-d", "1", "-o", "/proc/sysprof-results"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let line = last_line(&out);
    assert!(line.starts_with("error: cannot write results to /proc/sysprof-results: "), "{line}");
    assert!(line.ends_with("choose another directory with -o DIR"), "{line}");
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn runs_without_tracefs() {
    let Some(_guard) = root_guard("runs_without_tracefs") else { return };
    let dir = output_dir();
    // A private mount namespace without tracefs, whatever the host has mounted.
    let script = format!(
        "umount /sys/kernel/tracing 2>/dev/null; umount /sys/kernel/debug/tracing 2>/dev/null; \
         test -e /sys/kernel/tracing/events && exit 99; exec {} trace -q -o {} -- {} 1",
        env!("CARGO_BIN_EXE_sysprof"),
        dir.path().display(),
        workload("busy").display()
    );
    let out = Command::new("unshare").args(["-m", "sh", "-c", &script]).output().unwrap();
    assert_ne!(out.status.code(), Some(99), "could not hide tracefs");
    assert!(out.status.success(), "{}", text(&out));
    assert!(self_weight(&read_folded(&dir.path().join("cpu.folded")), "burn_hot") > 30);
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn without_kernel_btf_it_warns_and_still_profiles() {
    let Some(_guard) = root_guard("without_kernel_btf_it_warns_and_still_profiles") else { return };
    let dir = output_dir();
    let out = sysprof()
        .env("SYSPROF_BTF", "/nonexistent/vmlinux")
        .args(["trace", "-o"])
        .arg(dir.path())
        .arg("--")
        .arg(workload("busy"))
        .arg("1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.lines().any(|l| l.starts_with("sysprof: kernel BTF not available")
            && l.contains("child processes started during the trace are not followed")
            && l.contains("CONFIG_DEBUG_INFO_BTF=y")),
        "{stderr}"
    );
    assert!(self_weight(&read_folded(&dir.path().join("cpu.folded")), "burn_hot") > 30);
    let report = read_report(dir.path());
    assert!(report["limitations"][0].as_str().unwrap().contains("kernel BTF not available"));
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_missing_hardware_pmu_names_the_fallback() {
    let Some(_guard) = root_guard("a_missing_hardware_pmu_names_the_fallback") else { return };
    let dir = output_dir();
    let out = run_sysprof(&[
        "trace",
        "--event",
        "cycles",
        "-q",
        "-d",
        "0.5",
        "--all",
        "-o",
        dir.path().to_str().unwrap(),
    ]);
    let has_pmu = Path::new("/sys/bus/event_source/devices/cpu/events/cpu-cycles").exists();
    if has_pmu {
        assert!(out.status.success(), "{}", text(&out));
    } else {
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(
            last_line(&out).starts_with("error: perf event cycles is not supported on this machine"),
            "{}",
            text(&out)
        );
        assert!(last_line(&out).ends_with("use --event cpu-clock"), "{}", text(&out));
    }
    assert_no_sysprof_programs();
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_full_stack_map_counts_and_reports_the_lost_stacks() {
    let Some(_guard) = root_guard("a_full_stack_map_counts_and_reports_the_lost_stacks") else { return };
    let dir = output_dir();
    let out = sysprof()
        .args(["trace", "-q", "-F", "499", "--stack-storage-size", "1", "-o"])
        .arg(dir.path())
        .arg("--")
        .arg(workload("busy"))
        .args(["--spawn-child", "1.5"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let report = read_report(dir.path());
    let lost = &report["run"]["lost"];
    let stacks_lost = lost["user_stacks"].as_u64().unwrap() + lost["kernel_stacks"].as_u64().unwrap();
    assert!(stacks_lost > 0, "no lost stacks counted with a 1-entry stack map: {lost}");
    let folded = std::fs::read_to_string(dir.path().join("cpu.folded")).unwrap();
    assert!(folded.contains("[user stack lost]"), "lost stacks keep their samples, marked");
    let markdown = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    assert!(markdown.contains("events were lost in the kernel"), "{markdown}");
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn interrupting_ends_the_trace_and_writes_everything() {
    let Some(_guard) = root_guard("interrupting_ends_the_trace_and_writes_everything") else { return };
    for (signal, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")] {
        let busy = Background::spawn(Command::new(workload("busy")).arg("20"));
        let dir = output_dir();
        // Signal once the probes are attached and busy has had a second of CPU since: what it
        // got, not a wall-clock second, which a loaded machine shares out.
        let mut trace = spawn_tracing(&["trace", "--pid", &busy.pid().to_string()], dir.path());
        let before = process_cpu_s(busy.pid());
        let waited = std::time::Instant::now();
        while process_cpu_s(busy.pid()) - before < 1.0 && waited.elapsed() < Duration::from_secs(15) {
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: kill with a valid pid and signal.
        assert_eq!(unsafe { libc::kill(trace.id() as i32, signal) }, 0);
        let status = trace.wait().unwrap();
        assert!(status.success(), "{name}: {status}");
        let report = read_report(dir.path());
        assert!(report["run"]["ended_by"].as_str().unwrap().starts_with(name), "{:#}", report["run"]);
        assert!(self_weight(&read_folded(&dir.path().join("cpu.folded")), "burn_hot") > 50);
        assert!(dir.path().join("cpu.svg").exists() && dir.path().join("report.md").exists());
        assert_no_sysprof_programs();
    }
}
