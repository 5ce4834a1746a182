//! Through sudo, root reads nothing the user cannot: the files they name are opened once, as
//! them (a link they flip cannot swap a root-only file in between), their program's RUNPATH
//! and `-- CMD` are searched with their rights, and no library path of theirs chooses what
//! sysprof loads into itself. As plain root, nothing is written through a path another user
//! can change, and what is written goes into the directory that was checked.

use std::{
    os::unix::fs::{PermissionsExt as _, symlink},
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use crate::support::*;

/// Compiles C `source` into `dir/name` with `args`.
fn build_c(dir: &Path, name: &str, source: &str, args: &[&str]) -> PathBuf {
    let file = dir.join(format!("{name}.c"));
    std::fs::write(&file, source).unwrap();
    let output = dir.join(name);
    let status = Command::new("cc").args(["-O1", "-o"]).arg(&output).arg(&file).args(args).status().unwrap();
    assert!(status.success(), "building {name}");
    output
}

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

/// The report as text (for "does it name this path anywhere").
fn report_text(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("report.json")).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// A shared library whose constructor writes `marker`: loading it runs code.
fn marker_library(dir: &Path, name: &str, marker: &Path) -> PathBuf {
    let source = format!(
        "#include <stdio.h>\n__attribute__((constructor)) static void ran(void) {{ FILE *f = fopen(\"{}\", \
         \"w\"); if (f) {{ fputs(\"ran\", f); fclose(f); }} }}\nint marker_function(void) {{ return 1; }}\n",
        marker.display()
    );
    build_c(dir, name, &source, &["-shared", "-fPIC"])
}

const FLIP_LIBRARY: &str = "int flip_target(int x) { return x + 1; }\n";
/// Calls flip_target this often: a probe on the file the program maps counts every call.
const FLIP_CALLS: u64 = 2000;
const FLIP_PROGRAM: &str = "int flip_target(int);\nint main(void) { int x = 0; for (int i = 0; i < 2000; i++) \
                            x = flip_target(x); return x == 2000 ? 0 : 1; }\n";

/// Flips `link` between `targets` as fast as it can, as `user` (its filesystem identity on its
/// own thread), until `stop`; counts the flips.
fn flipper(
    user: &TestUser,
    link: PathBuf,
    targets: [PathBuf; 2],
    stop: Arc<AtomicBool>,
    flips: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    let (uid, gid) = (user.uid, user.gid);
    std::thread::spawn(move || {
        // SAFETY: setfsgid/setfsuid change only this thread's filesystem ids.
        unsafe {
            libc::setfsgid(gid);
            libc::setfsuid(uid);
        }
        let next = link.with_extension("next");
        while !stop.load(Ordering::Relaxed) {
            for target in &targets {
                let _ = std::fs::remove_file(&next);
                if symlink(target, &next).is_ok() && std::fs::rename(&next, &link).is_ok() {
                    flips.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    })
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn through_sudo_a_link_flipped_during_the_start_never_gets_a_root_only_file_probed() {
    let Some(_guard) =
        root_guard("through_sudo_a_link_flipped_during_the_start_never_gets_a_root_only_file_probed")
    else {
        return;
    };
    let user = test_user();
    let home = user.dir();
    let library = build_c(home.path(), "libflip.so", FLIP_LIBRARY, &["-shared", "-fPIC"]);
    let rpath = format!("-Wl,-rpath,{}", home.path().display());
    let lib_dir = home.path().display().to_string();
    let program = build_c(home.path(), "flip_app", FLIP_PROGRAM, &["-L", &lib_dir, "-lflip", &rpath]);
    // Root's copy of the same library, 0600, in a directory only root can enter: a probe
    // there would see none of the program's calls.
    let root_only = root_only_dir();
    let secret = root_only.path().join("libflip.so");
    std::fs::copy(&library, &secret).unwrap();
    chmod(&secret, 0o600);
    let link = home.path().join("flip.so");
    symlink(&library, &link).unwrap();
    give(&user, &[&library, &program, &link]);

    let stop = Arc::new(AtomicBool::new(false));
    let flips = Arc::new(AtomicU64::new(0));
    let flipping =
        flipper(&user, link.clone(), [library.clone(), secret.clone()], stop.clone(), flips.clone());
    let spec = format!("{}:flip_target", link.display());
    let refused = format!(
        "error: {} cannot read {}: through sudo, sysprof opens only files the user who ran it can read",
        user.name,
        link.display()
    );
    let (mut probed, mut refusals) = (0, 0);
    for run in 0..10 {
        let out_dir = home.path().join(format!("o{run}"));
        let out = user
            .sudo(&mut sysprof())
            .args(["trace", "-q", "--func", &spec, "-o"])
            .arg(&out_dir)
            .arg("--")
            .arg(&program)
            .output()
            .unwrap();
        match out.status.code() {
            // Opened as the user while the link led to the file they can read: that file is
            // what is probed, whatever the link leads to when the probes attach.
            Some(0) => {
                let report = read_report(&out_dir);
                let functions = report["functions"].as_array().unwrap();
                assert_eq!(functions.len(), 1, "run {run}: {functions:?}");
                assert_eq!(
                    functions[0]["calls"], FLIP_CALLS,
                    "run {run}: the probe is not on the file the program maps"
                );
                let probes = report["instrumentation"]["probes"].as_array().unwrap();
                let attached = format!("function flip_target in {}", link.display());
                assert!(
                    probes
                        .iter()
                        .any(|p| p["attached_to"].as_str().is_some_and(|a| a.starts_with(&attached))),
                    "run {run}: Part B names the user's path: {probes:?}"
                );
                // The end's check asks the path as the user: never "replaced" by root's look
                // behind the link.
                let changed = report["instrumentation"]["files_modified"].to_string();
                assert!(!changed.contains("replaced"), "run {run}: {changed}");
                assert!(!report_text(&out_dir).contains(&root_only.path().display().to_string()));
                probed += 1;
            }
            // Opened while it led to root's file: refused, as the user would be.
            Some(1) => {
                assert_eq!(stderr_of(&out).trim(), refused, "run {run}");
                assert!(!out_dir.exists(), "run {run}: a refused run leaves no output directory");
                refusals += 1;
            }
            _ => panic!("run {run}: {}", text(&out)),
        }
    }
    stop.store(true, Ordering::Relaxed);
    flipping.join().unwrap();
    eprintln!(
        "{probed} runs probed the user's file, {refusals} refused; {} flips",
        flips.load(Ordering::Relaxed)
    );
    assert!(flips.load(Ordering::Relaxed) > 1000, "the link hardly flipped");
    assert!(probed > 0, "no run ever probed: the race was never run");
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn through_sudo_a_runpath_into_a_root_only_directory_finds_nothing_there() {
    let Some(_guard) = root_guard("through_sudo_a_runpath_into_a_root_only_directory_finds_nothing_there")
    else {
        return;
    };
    let user = test_user();
    let home = user.dir();
    // Libraries only root can reach (readable files, in a directory only root can enter): a
    // function to probe by name, and a CUDA runtime.
    let root_only = root_only_dir();
    let root_dir = root_only.path().display().to_string();
    build_c(
        root_only.path(),
        "libsecret.so",
        "int secret_fn(int x) { return x * 2; }\n",
        &["-shared", "-fPIC"],
    );
    let doubles = gpu_doubles();
    for name in ["libcudart.so.12", "libcuda.so.1"] {
        std::fs::copy(doubles.join(name), root_only.path().join(name)).unwrap();
    }
    // The user's program finds them through its RUNPATH.
    let program = build_c(
        home.path(),
        "runpath_app",
        "int secret_fn(int);\nint cudaDeviceSynchronize(void);\nint main(void) { cudaDeviceSynchronize(); \
         return secret_fn(1); }\n",
        &[
            "-L",
            &root_dir,
            "-lsecret",
            "-l:libcudart.so.12",
            "-Wl,--enable-new-dtags",
            &format!("-Wl,-rpath,{root_dir}"),
        ],
    );
    give(&user, &[&program]);
    let out_dir = home.path().join("o");
    let out = user
        .sudo(&mut sysprof())
        .args(["trace", "-q", "--func", "libsecret.so:secret_fn", "-o"])
        .arg(&out_dir)
        .arg("--")
        .arg(&program)
        .output()
        .unwrap();
    // The user's loader cannot open the libraries either: the command fails, and sysprof
    // passes its exit code on.
    assert_eq!(out.status.code(), Some(127), "{}", text(&out));
    let report = read_report(&out_dir);
    assert_eq!(report["functions"].as_array().map(Vec::len), Some(0), "{}", report["functions"]);
    let limitations = report["limitations"].to_string();
    assert!(
        limitations
            .contains("--func libsecret.so:secret_fn: no binary named libsecret.so was mapped by the target"),
        "{limitations}"
    );
    // No probe, no library, no line names anything there.
    assert!(
        !report_text(&out_dir).contains(&root_dir),
        "the report names a root-only file: {}",
        report["instrumentation"]
    );
}

/// What sysprof says to `-- COMMAND`, the command's name replaced by NAME.
fn command_error(
    user: &TestUser,
    out_dir: &Path,
    path: Option<&str>,
    command: &Path,
) -> (Option<i32>, String) {
    let mut sysprof = sysprof();
    if let Some(path) = path {
        sysprof.env("PATH", path);
    }
    let out = user
        .sudo(&mut sysprof)
        .args(["trace", "-d", "1", "-o"])
        .arg(out_dir)
        .arg("--")
        .arg(command)
        .output()
        .unwrap();
    let name = command.display().to_string();
    (out.status.code(), stderr_of(&out).trim().replace(&name, "NAME"))
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn through_sudo_a_command_in_a_root_only_directory_is_refused_as_the_user_is() {
    let Some(_guard) =
        root_guard("through_sudo_a_command_in_a_root_only_directory_is_refused_as_the_user_is")
    else {
        return;
    };
    let user = test_user();
    let home = user.dir();
    let out_dir = home.path().join("o");
    let root_only = root_only_dir();
    std::fs::create_dir(root_only.path().join("a-directory")).unwrap();
    std::fs::write(root_only.path().join("not-executable"), "#!/bin/sh\n").unwrap();
    let executable = root_only.path().join("executable");
    std::fs::write(&executable, "#!/bin/sh\nexit 0\n").unwrap();
    chmod(&executable, 0o755);
    let names = ["missing", "a-directory", "not-executable", "executable"];
    // By path: the four would say four things to root; to the user, one.
    let answers: Vec<_> =
        names.iter().map(|name| command_error(&user, &out_dir, None, &root_only.path().join(name))).collect();
    let expected = (
        Some(1),
        format!(
            "error: cannot run NAME: permission denied for {} (through sudo, sysprof runs the command as the user \
             who ran it)",
            user.name
        ),
    );
    for (name, answer) in names.iter().zip(&answers) {
        assert_eq!(answer, &expected, "{name}");
    }
    // On PATH: a directory the user cannot search holds nothing for them.
    let path = format!("{}:/usr/bin:/bin", root_only.path().display());
    for name in names {
        let answer = command_error(&user, &out_dir, Some(&path), Path::new(name));
        assert_eq!(answer, (Some(1), "error: command not found: NAME".to_string()), "{name}");
    }
    assert!(!out_dir.exists(), "a refused run leaves no output directory");
    // What the user can run still runs, found on their PATH.
    let out = user
        .sudo(&mut sysprof())
        .env("PATH", &path)
        .args(["trace", "-q", "-d", "1", "-o"])
        .arg(&out_dir)
        .args(["--", "id", "-u"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), user.uid.to_string());
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn as_root_no_library_path_of_the_callers_chooses_the_nvml_sysprof_loads() {
    let Some(_guard) = root_guard("as_root_no_library_path_of_the_callers_chooses_the_nvml_sysprof_loads")
    else {
        return;
    };
    let user = test_user();
    let home = user.dir();
    let marker = home.path().join("constructor-ran");
    // The user's "NVML" on the library path they pass along (`sudo -E`, or a sudo rule's
    // env_keep), and a library it names.
    let nvml = marker_library(home.path(), "libnvidia-ml.so.1", &marker);
    let dependency = marker_library(home.path(), "libsysprofdep.so", &marker);
    give(&user, &[&nvml, &dependency]);
    let library_path = home.path().display().to_string();
    let roots = roots_directory();
    for sudo in [true, false] {
        let command = |args: &[&str]| {
            let mut command = sysprof();
            if sudo {
                user.sudo(&mut command);
            }
            command.env("LD_LIBRARY_PATH", &library_path).args(args);
            command
        };
        let out = command(&["check"]).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let nvml_line =
            stdout.lines().find(|line| line.contains("NVML")).unwrap_or_else(|| panic!("{}", text(&out)));
        assert!(nvml_line.contains("NVML not available"), "{nvml_line}");
        let out = command(&["topo"]).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        // As root, results go to root's own directory (see the test below).
        let out_dir = if sudo { home.path().join("o") } else { roots.path().join("o") };
        let mut trace = command(&["trace", "-d", "1", "--focus", "gpu", "-o"]);
        let out = trace.arg(&out_dir).args(["--", "true"]).output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        assert!(stderr_of(&out).contains("sysprof: NVML not available"), "{}", text(&out));
        assert!(!marker.exists(), "sudo {sudo}: a library on the caller's library path ran code as root");
    }

    // A library root may load (root's, in root's directory) that needs one more: that one is
    // looked for where the loader looks with no caller's path, never on theirs.
    let root_dir = roots_directory();
    let trusted = build_c(
        root_dir.path(),
        "libnvidia-ml.so.1",
        "int marker_function(void);\nint nvmlInit_v2(void) { return marker_function(); }\n",
        &["-shared", "-fPIC", "-L", &library_path, "-lsysprofdep"],
    );
    let out = user
        .sudo(&mut sysprof())
        .env("LD_LIBRARY_PATH", &library_path)
        .args(["check", "--nvml-lib"])
        .arg(&trusted)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        stdout.contains("needs libsysprofdep.so, which is in neither the loader's cache nor the standard library directories"),
        "{}",
        text(&out)
    );
    assert!(!marker.exists(), "a library NVML needs was loaded from the caller's library path as root");
}

/// A directory only root can enter (tempfile's are 0755 under the usual umask).
fn root_only_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o700);
    dir
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
