//! Through sudo, root reads nothing the user cannot: the files they name are opened once, as
//! them (a link they flip cannot swap a root-only file in between), their program's RUNPATH
//! and `-- CMD` are searched with their rights, and no library path of theirs chooses what
//! sysprof loads into itself. As plain root, nothing is written through a path another user
//! can change, and what is written goes into the directory that was checked.

use std::{
    os::unix::fs::{PermissionsExt as _, symlink},
    path::Path,
    process::{Command, Output},
    time::{Duration, Instant},
};

use crate::support::*;

/// Gives `paths` to `user`.
fn give(user: &TestUser, paths: &[&Path]) {
    for path in paths {
        std::os::unix::fs::lchown(path, Some(user.uid), Some(user.gid)).unwrap();
    }
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A directory of root's that only root can change, for results.
fn roots_directory() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    dir
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn as_root_no_result_is_written_through_a_path_another_user_can_change() {
    let Some(_guard) = root_guard("as_root_no_result_is_written_through_a_path_another_user_can_change")
    else {
        return;
    };
    let user = test_user();
    let home = user.dir();
    let roots = roots_directory();
    // The user's link to a directory of root's, where root's trace would write.
    let share = home.path().join("share");
    std::fs::create_dir(&share).unwrap();
    let link = share.join("prof");
    symlink(roots.path(), &link).unwrap();
    give(&user, &[&share, &link]);
    for out_dir in [link.clone(), share.join("new")] {
        let out =
            sysprof().args(["trace", "-d", "1", "-o"]).arg(&out_dir).args(["--", "true"]).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert_eq!(
            stderr_of(&out).trim(),
            format!(
                "error: cannot write results to {}: {} belongs to {} (uid {}), who could change where the path \
                 leads: as root, sysprof writes only through directories no other user can change (run it \
                 through sudo as that user to write as them); choose another directory with -o DIR",
                out_dir.display(),
                home.path().display(),
                user.name,
                user.uid
            )
        );
    }
    assert_eq!(
        std::fs::read_dir(roots.path()).unwrap().count(),
        0,
        "a file was written into root's directory"
    );
    assert!(!share.join("new").exists());

    // Through root's own directories: written, into the directory that was checked even when
    // its path leads elsewhere by the end.
    let out_dir = roots.path().join("out");
    let mut tracing = spawn_tracing_with(
        sysprof().args(["trace", "-d", "3", "-o"]).arg(&out_dir).args(["--", "sleep", "10"]),
    );
    let moved = roots.path().join("moved");
    std::fs::rename(&out_dir, &moved).unwrap();
    std::fs::create_dir(&out_dir).unwrap();
    let status = wait_bounded(&mut tracing.child, Duration::from_secs(60));
    let stderr = tracing.stderr();
    assert!(status.success(), "{stderr}");
    assert!(moved.join("report.json").is_file() && moved.join("cpu.folded").is_file(), "{stderr}");
    assert_eq!(
        std::fs::read_dir(&out_dir).unwrap().count(),
        0,
        "written into the directory put in its place"
    );
    let note = format!(
        "the output directory {} was moved during the trace: wrote into it where it is now, {}",
        out_dir.display(),
        moved.display()
    );
    assert!(stderr.contains(&note), "{stderr}");
    assert!(read_report(&moved)["limitations"].to_string().contains(&note));

    // One removed during the trace is made again, with the same checks.
    let removed = roots.path().join("removed");
    let mut tracing = spawn_tracing_with(
        sysprof().args(["trace", "-d", "2", "-o"]).arg(&removed).args(["--", "sleep", "10"]),
    );
    std::fs::remove_dir(&removed).unwrap();
    let status = wait_bounded(&mut tracing.child, Duration::from_secs(60));
    let stderr = tracing.stderr();
    assert!(status.success(), "{stderr}");
    assert!(removed.join("report.json").is_file(), "{stderr}");
    assert!(stderr.contains("was removed during the trace: created it again"), "{stderr}");
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_fifo_as_the_previous_report_is_passed_over_with_a_note() {
    let Some(_guard) = root_guard("a_fifo_as_the_previous_report_is_passed_over_with_a_note") else { return };
    let user = test_user();
    let home = user.dir();
    let roots = roots_directory();
    for sudo in [false, true] {
        let out_dir = if sudo { home.path().join("o") } else { roots.path().join("o") };
        std::fs::create_dir(&out_dir).unwrap();
        let fifo = out_dir.join("report.json");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        if sudo {
            give(&user, &[&out_dir, &fifo]);
        }
        let mut command = sysprof();
        if sudo {
            user.sudo(&mut command);
        }
        let started = Instant::now();
        let mut child = command
            .args(["trace", "-d", "1", "-o"])
            .arg(&out_dir)
            .args(["--", "true"])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let status = wait_bounded(&mut child, Duration::from_secs(60));
        let stderr = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
        assert!(status.success(), "sudo {sudo}: {stderr}");
        assert!(started.elapsed() < Duration::from_secs(30), "sudo {sudo}: the start waited on the FIFO");
        let note = format!(
            "sysprof: {}: not a regular file (a FIFO); sysprof reads only regular files here: the earlier run's \
             files there are left as they are",
            fifo.display()
        );
        assert!(stderr.contains(&note), "sudo {sudo}: {stderr}");
        assert!(std::fs::symlink_metadata(&fifo).unwrap().is_file(), "the report replaced the FIFO");
    }
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_kernel_filesystem_is_no_place_for_results() {
    let Some(_guard) = root_guard("a_kernel_filesystem_is_no_place_for_results") else { return };
    let user = test_user();
    for (sudo, dir) in
        [(false, "/proc/self"), (false, "/proc/self/results"), (true, "/proc/self"), (false, "/sys/kernel")]
    {
        let mut command = sysprof();
        if sudo {
            user.sudo(&mut command);
        }
        let out = command.args(["trace", "-d", "1", "-o", dir, "--", "true"]).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let filesystem = if dir.starts_with("/proc") { "proc" } else { "sysfs" };
        assert_eq!(
            stderr_of(&out).trim(),
            format!(
                "error: cannot write results to {dir}: it is on {filesystem}, a filesystem of the kernel's own files: \
                 not a place for results; choose another directory with -o DIR"
            ),
            "sudo {sudo}"
        );
    }
}

/// Bytes in "12.0 KiB" (report::format::bytes).
fn parse_bytes(text: &str) -> f64 {
    let (number, unit) = text.split_once(' ').unwrap();
    let scale = match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        other => panic!("unit {other}"),
    };
    number.parse::<f64>().unwrap() * scale
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_full_disk_is_quoted_as_it_was_when_the_file_was_left_out() {
    let Some(_guard) = root_guard("a_full_disk_is_quoted_as_it_was_when_the_file_was_left_out") else {
        return;
    };
    let mount = tempfile::tempdir().unwrap();
    let size = 128 * 1024;
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "sysprof-test"])
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
    let stderr = stderr_of(&out);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error: could not write") && l.contains(" free"))
        .unwrap_or_else(|| panic!("{stderr}"));
    let free = line
        .split(" had ")
        .nth(1)
        .and_then(|rest| rest.split(" free").next())
        .unwrap_or_else(|| panic!("{line}"));
    // Before the reports and the files written first took their part, the disk had nearly all
    // of its 128 KiB: what was free when the file was left out is that, less them.
    let page = 4096.0;
    let taken: f64 = ["report.md", "report.json", "cpu.folded"]
        .iter()
        .map(|name| (std::fs::metadata(out_dir.join(name)).unwrap().len() as f64 / page).ceil() * page)
        .sum();
    assert!(parse_bytes(free) <= size as f64 - taken, "{line}: {taken} bytes were written before");
}
