//! Safe under sudo, and nothing lost: what sysprof writes and loads as root, what it does with
//! the command it launched, and what it keeps when stderr, the disk or the session goes away.
//! Each test runs sysprof as a user would (through "sudo": root with SUDO_UID set for a user the
//! test creates) and asserts the message, the exit code, the files and their owner.

mod support;

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use support::*;

/// Asserts every file in `dir` (and `dir`) belongs to `user`.
fn assert_owned_by(dir: &Path, user: &TestUser) {
    let meta = std::fs::metadata(dir).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (user.uid, user.gid), "{} belongs to the user", dir.display());
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let meta = entry.metadata().unwrap();
        assert_eq!((meta.uid(), meta.gid()), (user.uid, user.gid), "{:?} belongs to the user", entry.path());
    }
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn through_sudo_the_command_runs_as_the_user_and_the_results_are_theirs() {
    let Some(_guard) = root_guard("through_sudo_the_command_runs_as_the_user_and_the_results_are_theirs")
    else {
        return;
    };
    let user = test_user();
    let home = user.dir();
    // Intermediate directories of -o are created too, and as the user.
    let out_dir = home.path().join("runs/today");
    let out = user
        .sudo(&mut sysprof())
        .args(["trace", "-q", "-o"])
        .arg(&out_dir)
        .args(["--", "id", "-u"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), user.uid.to_string(), "{}", text(&out));
    assert_owned_by(&home.path().join("runs"), &user);
    assert_owned_by(&out_dir, &user);
    for file in ["report.md", "report.json", "cpu.folded", "cpu.svg"] {
        assert!(out_dir.join(file).is_file(), "{file} written");
    }
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn through_sudo_nothing_is_written_through_a_planted_symlink() {
    let Some(_guard) = root_guard("through_sudo_nothing_is_written_through_a_planted_symlink") else {
        return;
    };
    let user = test_user();
    let home = user.dir();
    let out_dir = home.path().join("o");
    std::fs::create_dir(&out_dir).unwrap();
    std::os::unix::fs::chown(&out_dir, Some(user.uid), Some(user.gid)).unwrap();
    // A root file the user must not be able to overwrite, and a root directory they must not
    // be able to create a file in.
    let root_only = tempfile::tempdir().unwrap();
    let precious = root_only.path().join("precious");
    std::fs::write(&precious, "root's").unwrap();
    let planted = [
        ("report.md", precious.clone()),
        ("cpu.svg", precious.clone()),
        (".sysprof-write-test", root_only.path().join("created-by-sysprof")),
    ];
    for (name, target) in &planted {
        std::os::unix::fs::symlink(target, out_dir.join(name)).unwrap();
        std::os::unix::fs::lchown(out_dir.join(name), Some(user.uid), Some(user.gid)).unwrap();
    }
    let out = user
        .sudo(&mut sysprof())
        .args(["trace", "-q", "-d", "1", "-o"])
        .arg(&out_dir)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "root's", "a root file was overwritten");
    assert_eq!(std::fs::metadata(&precious).unwrap().len(), 6);
    assert!(!root_only.path().join("created-by-sysprof").exists(), "a file was created through a symlink");
    for name in ["report.md", "cpu.svg"] {
        let meta = std::fs::symlink_metadata(out_dir.join(name)).unwrap();
        assert!(meta.is_file(), "{name} replaced the planted link with a file");
        assert_eq!(meta.uid(), user.uid, "{name} is the user's");
    }
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn through_sudo_only_the_users_own_directories_take_results() {
    let Some(_guard) = root_guard("through_sudo_only_the_users_own_directories_take_results") else { return };
    let user = test_user();
    // A directory of another user (nobody), open to all: refused before tracing.
    let shared = tempfile::tempdir().unwrap();
    let theirs = shared.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = user
        .sudo(&mut sysprof())
        .args(["trace", "-d", "1", "-o"])
        .arg(&theirs)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("error: cannot write results to"), "{stderr}");
    assert!(stderr.contains("it belongs to uid 65534, not to sysprof-test"), "{stderr}");
    assert_eq!(std::fs::read_dir(&theirs).unwrap().count(), 0, "nothing written there");
    // A place only root can write: the user's rights decide, not root's.
    let root_only = tempfile::tempdir().unwrap();
    let out = user
        .sudo(&mut sysprof())
        .args(["trace", "-d", "1", "-o"])
        .arg(root_only.path().join("new"))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("Permission denied") && stderr.contains("for sysprof-test"), "{stderr}");
    assert!(!root_only.path().join("new").exists());
}

/// A shared library whose constructor writes `marker`: loading it runs code.
fn marker_library(dir: &Path, marker: &Path) -> PathBuf {
    let source = dir.join("marker.c");
    std::fs::write(
        &source,
        format!(
            "#include <stdio.h>\n__attribute__((constructor)) static void ran(void) {{ FILE *f = \
             fopen(\"{}\", \"w\"); if (f) {{ fputs(\"ran\", f); fclose(f); }} }}\n",
            marker.display()
        ),
    )
    .unwrap();
    let library = dir.join("libmarker.so");
    let status =
        Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&library).arg(&source).status().unwrap();
    assert!(status.success(), "building the marker library");
    library
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn as_root_no_library_the_user_can_change_is_loaded() {
    let Some(_guard) = root_guard("as_root_no_library_the_user_can_change_is_loaded") else { return };
    let user = test_user();
    let home = user.dir();
    let marker = home.path().join("constructor-ran");
    let library = marker_library(home.path(), &marker);
    std::os::unix::fs::chown(&library, Some(user.uid), Some(user.gid)).unwrap();
    let out_dir = home.path().join("o");

    let out = user
        .sudo(&mut sysprof())
        .args(["trace", "-d", "1", "--nvml-lib"])
        .arg(&library)
        .arg("-o")
        .arg(&out_dir)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("error: refusing to load"), "{stderr}");
    assert!(stderr.contains(&format!("is owned by uid {}", user.uid)), "{stderr}");
    assert!(!out_dir.exists(), "a refused run leaves no output directory");
    // `check` and `topo` load it the same way: refused in one line.
    for args in [&["check", "--nvml-lib"][..], &["topo", "--nvml-lib"]] {
        let out = user.sudo(&mut sysprof()).args(args).arg(&library).output().unwrap();
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("NVML not loaded")
                || String::from_utf8_lossy(&out.stderr).contains("NVML not loaded"),
            "{args:?}: {}",
            text(&out)
        );
    }
    assert!(!marker.exists(), "the user's library ran code as root");

    // Root's own copy, which no one else can change, does load (its constructor runs, then
    // NVML init fails: it is no NVML).
    let root_dir = tempfile::tempdir().unwrap();
    let root_library = root_dir.path().join("libmarker.so");
    std::fs::copy(&library, &root_library).unwrap();
    let out = sysprof().args(["check", "--nvml-lib"]).arg(&root_library).output().unwrap();
    assert!(marker.exists(), "a root-owned library is loaded: {}", text(&out));
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn through_sudo_files_the_user_cannot_read_are_not_opened_and_as_root_is_refused() {
    let Some(_guard) =
        root_guard("through_sudo_files_the_user_cannot_read_are_not_opened_and_as_root_is_refused")
    else {
        return;
    };
    let user = test_user();
    let home = user.dir();
    let secret = tempfile::NamedTempFile::new().unwrap(); // mode 0600, root's
    let secret = secret.path().display().to_string();
    for (flag, value) in
        [("--cuda-lib", secret.clone()), ("--nccl-lib", secret.clone()), ("--func", format!("{secret}:main"))]
    {
        let out = user
            .sudo(&mut sysprof())
            .args(["trace", "-d", "1", flag, &value, "-o"])
            .arg(home.path().join("o"))
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{flag}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr.trim(),
            format!(
                "error: sysprof-test cannot read {secret}: through sudo, sysprof opens only files the user who ran it can read"
            ),
        );
    }
    let out = user
        .sudo(&mut sysprof())
        .args(["trace", "--as-root", "-o"])
        .arg(home.path().join("o"))
        .args(["--", "id", "-u"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(out.stdout.is_empty(), "nothing ran: {}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).starts_with("error: --as-root is refused through sudo"),
        "{}",
        text(&out)
    );
    assert!(!home.path().join("o").exists());
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn with_only_cap_bpf_and_cap_perfmon_uprobes_attach_as_multi_links_or_sysprof_says_why_not() {
    let Some(_guard) =
        root_guard("with_only_cap_bpf_and_cap_perfmon_uprobes_attach_as_multi_links_or_sysprof_says_why_not")
    else {
        return;
    };
    // Multi-uprobe links (Linux 6.6+) need only CAP_BPF and CAP_PERFMON; the perf-event
    // uprobes sysprof falls back to need CAP_SYS_ADMIN.
    let multi = kernel_at_least(6, 6);
    let caps_only = || {
        let mut command = Command::new("setpriv");
        command
            .args(["--bounding-set", "-all,+bpf,+perfmon", "--"])
            .arg(env!("CARGO_BIN_EXE_sysprof"))
            .stdin(Stdio::null());
        command
    };
    let out = caps_only().arg("check").output().expect("setpriv (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let uprobes =
        stdout.lines().find(|line| line.split_whitespace().nth(1) == Some("uprobes")).unwrap_or_default();
    if multi {
        assert!(uprobes.starts_with("ok       uprobes") && uprobes.contains("multi-uprobe link"), "{stdout}");
    } else {
        assert!(uprobes.starts_with("missing  uprobes"), "{stdout}");
        assert!(uprobes.contains("uprobes need CAP_SYS_ADMIN"), "{stdout}");
    }
    let busy = workload("busy");
    let dir = output_dir();
    let out = caps_only()
        .args(["trace", "-o"])
        .arg(dir.path())
        .arg("--func")
        .arg(format!("{}:burn_hot", busy.display()))
        .arg("--")
        .arg(&busy)
        .arg("0.3")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line =
        stderr.lines().find(|l| l.starts_with(&format!("sysprof: --func {}:burn_hot", busy.display())));
    if !multi {
        assert!(
            line.is_some_and(|l| l.contains("uprobes need CAP_SYS_ADMIN")),
            "the trace says it: {stderr}"
        );
        return;
    }
    assert!(line.is_none() && out.status.success(), "{}", text(&out));
    let report = read_report(dir.path());
    let function = &report["functions"][0];
    assert_eq!(function["function"], "burn_hot", "{function:#}");
    // busy calls burn_hot in a loop for 0.3 s of CPU: hundreds of calls, each counted.
    assert!(function["calls"].as_u64().unwrap() > 100, "{function:#}");
    assert_eq!(function["latency"]["count"], function["calls"], "{function:#}");
    assert_no_sysprof_programs();
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_closed_or_full_stderr_costs_no_result() {
    let Some(_guard) = root_guard("a_closed_or_full_stderr_costs_no_result") else { return };
    let dir = output_dir();
    let full = std::fs::File::options().write(true).open("/dev/full").unwrap();
    let status = sysprof()
        .args(["trace", "-d", "1", "-o"])
        .arg(dir.path().join("full"))
        .args(["--", "true"])
        .stderr(full)
        .status()
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(read_report(&dir.path().join("full"))["run"]["samples"].is_u64());

    // A reader that goes away (`2>&1 | head -c 10`): stderr becomes a broken pipe.
    let mut child = sysprof()
        .args(["trace", "-d", "1", "-o"])
        .arg(dir.path().join("pipe"))
        .args(["--", "true"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    let status = wait_bounded(&mut child, Duration::from_secs(30));
    assert!(status.success(), "{status}");
    assert!(dir.path().join("pipe/report.md").is_file());
}

/// Starts `sysprof trace -- sleep 30`, waits until it traces, sends `signo`, and returns
/// the exit status, stderr, the report and the sleep's pid.
fn interrupt_mid_trace(signo: i32) -> (std::process::ExitStatus, String, serde_json::Value, u32) {
    let dir = output_dir();
    let mut command = sysprof();
    command.args(["trace", "-o"]).arg(dir.path()).args(["--", "sleep", "30"]);
    // Run under nohup (or from a background job), the suite hands its children an ignored
    // SIGHUP, which sysprof keeps by design: this sysprof gets the default, as from a terminal.
    // SAFETY: signal() is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            libc::signal(libc::SIGHUP, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut tracing = spawn_tracing_with(&mut command);
    let sleep = child_pids(tracing.child.id()).into_iter().next().expect("the command runs");
    signal(&tracing.child, signo);
    let status = wait_bounded(&mut tracing.child, Duration::from_secs(30));
    let stderr = tracing.stderr();
    (status, stderr, read_report(dir.path()), sleep)
}

/// The children of `pid` (of any of its threads).
fn child_pids(pid: u32) -> Vec<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("children")).ok())
        .flat_map(|children| children.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<u32>>())
        .collect()
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn an_interrupt_mid_trace_ends_the_command_and_says_so() {
    let Some(_guard) = root_guard("an_interrupt_mid_trace_ends_the_command_and_says_so") else { return };
    for (signo, name, code) in
        [(libc::SIGINT, "SIGINT", 130), (libc::SIGTERM, "SIGTERM", 143), (libc::SIGHUP, "SIGHUP", 129)]
    {
        let (status, stderr, report, sleep) = interrupt_mid_trace(signo);
        assert_eq!(status.code(), Some(code), "{name}: {stderr}");
        assert!(!alive(sleep), "{name}: the command outlived sysprof");
        assert_eq!(report["run"]["ended_by"], format!("{name} (interrupted)"), "{name}");
        assert_eq!(
            report["run"]["command_status"],
            format!(
                "still running when the trace ended ({name}): sysprof ended it with SIGTERM; the command was killed by SIGTERM"
            ),
        );
        assert!(stderr.contains(&format!("sysprof: {name}: ending the trace")), "{stderr}");
        assert_no_sysprof_programs();
    }
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn an_interrupt_during_start_up_launches_nothing() {
    let Some(_guard) = root_guard("an_interrupt_during_start_up_launches_nothing") else { return };
    let dir = output_dir();
    let out_dir = dir.path().join("o");
    let marker = dir.path().join("ran");
    let child = sysprof()
        .args(["trace", "--malloc", "-o"])
        .arg(&out_dir)
        .args(["--", "sh", "-c"])
        .arg(format!("echo ran > {}", marker.display()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The output directory is made once the signal handlers are in place and before any
    // probe is attached: the window the interrupt must land in.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !out_dir.exists() {
        assert!(Instant::now() < deadline, "sysprof never prepared its output directory");
        std::thread::sleep(Duration::from_millis(1));
    }
    signal(&child, libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert_eq!(
        stderr.trim(),
        "error: SIGINT during start-up: the command was not started and nothing was traced"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(!marker.exists(), "the command ran after the interrupt");
    assert!(!out_dir.exists(), "an empty output directory is left behind");
    assert_no_sysprof_programs();
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn work_the_command_leaves_running_is_traced_to_its_end() {
    let Some(_guard) = root_guard("work_the_command_leaves_running_is_traced_to_its_end") else { return };
    let busy = workload("busy");
    let dir = output_dir();
    let out = sysprof()
        .args(["trace", "-o"])
        .arg(dir.path())
        .args(["--", "sh", "-c"])
        .arg(format!("{} 1 >/dev/null & exit 3", busy.display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "the command's own status: {stderr}");
    assert!(
        stderr.contains("sysprof: the command exited (exit status 3); 1 process it started still runs: tracing until it exits"),
        "{stderr}"
    );
    let report = read_report(dir.path());
    assert_eq!(report["run"]["ended_by"], "command exit");
    assert!(report["run"]["duration_s"].as_f64().unwrap() >= 0.9, "{}", report["run"]["duration_s"]);
    let folded = read_folded(&dir.path().join("cpu.folded"));
    assert!(self_weight(&folded, "burn_hot") > 0, "the backgrounded busy was sampled: {folded:?}");
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_full_disk_keeps_the_report_and_names_what_was_lost() {
    let Some(_guard) = root_guard("a_full_disk_keeps_the_report_and_names_what_was_lost") else { return };
    let mount = tempfile::tempdir().unwrap();
    // Room for the reports twice (the second names what was left out), the folded stacks and
    // the pprof files; not for the flamegraphs.
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=128k", "sysprof-test"])
        .arg(mount.path())
        .status()
        .unwrap();
    assert!(status.success(), "mounting a small tmpfs");
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(mount.path());
    let out_dir = mount.path().join("o");
    let out = sysprof().args(["trace", "-d", "1", "-o"]).arg(&out_dir).args(["--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let error = stderr
        .lines()
        .find(|l| l.starts_with("error: could not write"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(error.contains(".svg") && (error.contains("free") || error.contains("No space left")), "{error}");
    let report = read_report(&out_dir);
    let limitations = report["limitations"].as_array().unwrap();
    let lost: Vec<&str> = limitations
        .iter()
        .filter_map(|l| l.as_str())
        .filter(|l| l.contains("could not be written"))
        .collect();
    assert!(!lost.is_empty(), "the report names what was not written: {limitations:?}");
    for line in &lost {
        let name = line.split_whitespace().next().unwrap();
        assert!(!out_dir.join(name).exists(), "{name}: no partial file is left");
    }
    assert!(
        std::fs::read_to_string(out_dir.join("report.md")).unwrap().contains("## Part B"),
        "report.md is whole"
    );
    for name in ["cpu.folded", "offcpu.folded"] {
        assert!(out_dir.join(name).is_file(), "{name}: the folded stacks go before the flamegraphs");
    }
    let leftovers: Vec<_> = std::fs::read_dir(&out_dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn an_earlier_runs_files_are_removed_and_only_those() {
    let Some(_guard) = root_guard("an_earlier_runs_files_are_removed_and_only_those") else { return };
    let dir = output_dir();
    let out =
        sysprof().args(["trace", "-d", "1", "-o"]).arg(dir.path()).args(["--", "true"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(dir.path().join("offcpu.svg").is_file());
    std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
    let out = sysprof()
        .args(["trace", "-d", "1", "--focus", "cpu", "-o"])
        .arg(dir.path())
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["cpu.folded", "cpu.pb.gz", "cpu.svg", "notes.txt", "report.json", "report.md", "timeline.pftrace"]
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("sysprof: removed the files of an earlier run that this one did not write: offcpu.folded, offcpu.svg, faults.folded, faults.svg") || stderr.contains("removed the files of an earlier run"), "{stderr}");
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn an_output_directory_removed_mid_trace_is_created_again() {
    let Some(_guard) = root_guard("an_output_directory_removed_mid_trace_is_created_again") else { return };
    let dir = output_dir();
    let out_dir = dir.path().join("o");
    let mut tracing = spawn_tracing_with(
        sysprof().args(["trace", "-d", "1.5", "-o"]).arg(&out_dir).args(["--", "sleep", "30"]),
    );
    std::fs::remove_dir(&out_dir).unwrap();
    let status = wait_bounded(&mut tracing.child, Duration::from_secs(30));
    assert!(status.success(), "{status}");
    let stderr = tracing.stderr();
    assert!(
        stderr.contains(&format!(
            "sysprof: the output directory {} was removed during the trace: created it again",
            out_dir.display()
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("replaced during the trace"), "said once, as removed: {stderr}");
    assert!(read_report(&out_dir)["limitations"].to_string().contains("removed during the trace"));
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn sigkill_leaves_no_probe_and_no_command_behind() {
    let Some(_guard) = root_guard("sigkill_leaves_no_probe_and_no_command_behind") else { return };
    let busy = workload("busy");
    let dir = output_dir();
    let mut tracing = spawn_tracing_with(
        sysprof()
            .args(["trace", "--malloc", "--func"])
            .arg(format!("{}:burn_hot", busy.display()))
            .arg("-o")
            .arg(dir.path())
            .arg("--")
            .arg(&busy)
            .arg("30"),
    );
    let command = child_pids(tracing.child.id()).into_iter().next().expect("the command runs");
    signal(&tracing.child, libc::SIGKILL);
    let _ = wait_bounded(&mut tracing.child, Duration::from_secs(10));
    assert_no_sysprof_programs();
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(command) {
        assert!(Instant::now() < deadline, "the command outlived a killed sysprof");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_stopped_command_does_not_outlive_a_killed_sysprof() {
    // A command that is stopped when sysprof dies (held at its loader, or stopped by its user)
    // acts on no signal but SIGKILL and SIGCONT: a SIGTERM would wait, and the command with it.
    let Some(_guard) = root_guard("a_stopped_command_does_not_outlive_a_killed_sysprof") else { return };
    let dir = output_dir();
    let mut tracing = spawn_tracing_with(
        sysprof().args(["trace", "--focus", "cpu", "-o"]).arg(dir.path()).args(["--", "sleep", "30"]),
    );
    let command = child_pids(tracing.child.id()).into_iter().next().expect("the command runs");
    // SAFETY: plain kill(2) of the command's pid, which is sysprof's child and not yet reaped.
    assert_eq!(unsafe { libc::kill(command as i32, libc::SIGSTOP) }, 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !stopped(command) {
        assert!(Instant::now() < deadline, "the command did not stop");
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(&tracing.child, libc::SIGKILL);
    let _ = wait_bounded(&mut tracing.child, Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(command) {
        assert!(Instant::now() < deadline, "the stopped command outlived a killed sysprof");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `pid` is stopped (state T in /proc/PID/stat).
fn stopped(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'))
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_thread_id_is_traced_as_its_process() {
    let Some(_guard) = root_guard("a_thread_id_is_traced_as_its_process") else { return };
    let busy = Background::spawn(Command::new(workload("busy")).args(["10", "2"]));
    let deadline = Instant::now() + Duration::from_secs(5);
    let thread = loop {
        let tasks: Vec<u32> = std::fs::read_dir(format!("/proc/{}/task", busy.pid()))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|&tid| tid != busy.pid())
            .collect();
        if let Some(&tid) = tasks.first() {
            break tid;
        }
        assert!(Instant::now() < deadline, "busy started no thread");
        std::thread::sleep(Duration::from_millis(10));
    };
    let dir = output_dir();
    let out = sysprof()
        .args(["trace", "--focus", "cpu", "-d", "1", "-p", &thread.to_string(), "-o"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "sysprof: pid {thread} is a thread of process {} (busy): tracing process {}",
            busy.pid(),
            busy.pid()
        )),
        "{stderr}"
    );
    assert!(self_weight(&read_folded(&dir.path().join("cpu.folded")), "burn_hot") > 0);
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn sysprof_never_traces_itself() {
    let Some(_guard) = root_guard("sysprof_never_traces_itself") else { return };
    let dir = output_dir();
    // `sysprof trace --pid $$` from a shell: sysprof descends from its target.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} trace -d 1.5 --pid $$ -o {}; true",
            env!("CARGO_BIN_EXE_sysprof"),
            dir.path().display()
        ))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let report = read_report(dir.path());
    let named: Vec<String> = report["sched"]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    assert!(!named.iter().any(|n| n.starts_with("sysprof")), "sysprof in its own report: {named:?}");
    assert!(
        !report["syscalls"]["rows"].to_string().contains("\"sysprof\""),
        "sysprof's syscalls were traced"
    );
    // System-wide, too: its process is not among the machine's.
    let all = output_dir();
    let out = sysprof().args(["trace", "--all", "-d", "1", "-o"]).arg(all.path()).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let folded = read_folded(&all.path().join("cpu.folded"));
    let own: Vec<_> = folded.iter().filter(|(frames, _)| frames[0] == "sysprof").collect();
    assert!(own.is_empty(), "sysprof sampled itself: {own:?}");
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn check_tells_a_user_the_truth_about_tracefs_and_systemd() {
    let Some(_guard) = root_guard("check_tells_a_user_the_truth_about_tracefs_and_systemd") else { return };
    let user = test_user();
    // tracefs mounted with mode 0700 (in a mount namespace of the test's own, whatever the
    // machine has mounted there already): a user cannot list it, but it is mounted.
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c"])
        .arg(format!(
            "umount /sys/kernel/tracing 2>/dev/null; mount -t tracefs -o mode=0700 tracefs /sys/kernel/tracing && exec setpriv --reuid {} --regid {} \
             --clear-groups {} check",
            user.uid,
            user.gid,
            env!("CARGO_BIN_EXE_sysprof")
        ))
        .output()
        .expect("unshare (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("ok       tracefs                mounted at /sys/kernel/tracing"),
        "{}",
        text(&out)
    );
    let cgroup = stdout.lines().find(|l| l.contains("cgroup v2")).unwrap_or_default();
    if Path::new("/run/systemd/system").is_dir() {
        assert!(cgroup.contains("(--cgroup and --unit work)"), "{cgroup}");
    } else {
        let init = std::fs::read_to_string("/proc/1/comm").unwrap();
        assert!(cgroup.contains(&format!("--unit needs systemd, and pid 1 is {}", init.trim())), "{cgroup}");
    }
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn what_could_not_be_probed_is_said_and_a_failed_start_leaves_no_directory() {
    let Some(_guard) = root_guard("what_could_not_be_probed_is_said_and_a_failed_start_leaves_no_directory")
    else {
        return;
    };
    let busy = workload("busy");
    let dir = output_dir();
    let out = sysprof()
        .args(["trace", "--focus", "cpu", "--func", "libsysprof-nosuch.so:f", "--func"])
        .arg(format!("{}:sysprof_no_such_function", busy.display()))
        .arg("-o")
        .arg(dir.path())
        .arg("--")
        .arg(&busy)
        .arg("0.2")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("sysprof: --func libsysprof-nosuch.so:f: no binary named libsysprof-nosuch.so was mapped by the target"),
        "{stderr}"
    );
    let missing_symbol = format!("sysprof: --func {}:sysprof_no_such_function", busy.display());
    assert!(stderr.lines().any(|line| line.starts_with(&missing_symbol)), "{stderr}");

    let never = dir.path().join("never/made");
    let out = sysprof().args(["trace", "--pid", "4000000", "-o"]).arg(&never).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(!dir.path().join("never").exists(), "a failed start left a directory");
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn part_b_checks_the_probed_files_rather_than_assuming_them_untouched() {
    let Some(_guard) = root_guard("part_b_checks_the_probed_files_rather_than_assuming_them_untouched")
    else {
        return;
    };
    let dir = output_dir();
    let busy = dir.path().join("busy");
    std::fs::copy(workload("busy"), &busy).unwrap();
    let out_dir = dir.path().join("o");
    let mut tracing = spawn_tracing_with(
        sysprof()
            .args(["trace", "--focus", "cpu", "--func"])
            .arg(format!("{}:burn_cold", busy.display()))
            .arg("-o")
            .arg(&out_dir)
            .arg("--")
            .arg(&busy)
            .arg("1"),
    );
    // Someone else changes the probed file meanwhile (its modification time here).
    let later = std::time::SystemTime::now() + Duration::from_secs(3600);
    std::fs::File::open(&busy).unwrap().set_modified(later).unwrap();
    let status = wait_bounded(&mut tracing.child, Duration::from_secs(30));
    assert!(status.success(), "{status}: {}", tracing.stderr());
    let changed = read_report(&out_dir)["instrumentation"]["files_modified"].clone();
    assert_eq!(
        changed,
        serde_json::json!([format!("{}: modified (its modification time changed)", busy.display())]),
        "{changed}"
    );
    let markdown = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(markdown.contains("changed during the trace, not by sysprof"), "{markdown}");
}
