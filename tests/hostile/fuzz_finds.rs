//! What the fuzz targets found (`fuzz/regressions/`) that a user can do to a real trace, on the
//! real kernel.

use std::{path::Path, process::Command, time::Duration};

use crate::support::*;

/// A user's program that the kernel names `/SYSV`: run from a mount namespace of the user's
/// (`unshare -Urm`, then `pivot_root` into a tmpfs that holds it), whose mappings the kernel
/// names from the top of that namespace. procfs took the name for a System V shared memory
/// segment's (`/SYSV0000abcd`) and panicked slicing its key out of it: `sysprof trace --pid`
/// of it died (the fuzzer found the panic in `/proc/PID/maps` text, the query of Linux 6.11+
/// names mappings the same way). It is a file now, profiled as any other.
#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_program_the_kernel_names_sysv_is_profiled() {
    let Some(_guard) = root_guard("a_program_the_kernel_names_sysv_is_profiled") else { return };
    let user = test_user();
    let dir = user.dir();
    // Static: the new root holds nothing else to load it with.
    let program = dir.path().join("busy");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/workloads/busy.c");
    let built = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-O1", "-g", "-fno-omit-frame-pointer", "-pthread", "-static", "-o"])
        .arg(&program)
        .arg(&source)
        .status()
        .unwrap();
    assert!(built.success(), "building a static busy (libc6-dev has libc.a)");
    let new_root = dir.path().join("root");
    std::fs::create_dir(&new_root).unwrap();
    std::os::unix::fs::chown(&new_root, Some(user.uid), Some(user.gid)).unwrap();
    let script = format!(
        "mount -t tmpfs none {root} && cp {program} {root}/SYSV && mkdir {root}/old && cd {root} && \
         pivot_root . old && exec /SYSV 30",
        root = new_root.display(),
        program = program.display()
    );
    let target = Background::spawn(
        Command::new("setpriv")
            .args(["--reuid", &user.uid.to_string(), "--regid", &user.gid.to_string(), "--clear-groups"])
            .args(["unshare", "-Urm", "sh", "-c", &script])
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
    );
    let pid = target.pid();
    let maps = std::path::PathBuf::from(format!("/proc/{pid}/maps"));
    let named = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        std::fs::read_to_string(&maps).is_ok_and(|text| text.lines().any(|line| line.ends_with(" /SYSV")))
    });
    assert!(
        named,
        "the kernel names the program /SYSV: {}",
        std::fs::read_to_string(&maps).unwrap_or_default()
    );

    let out_dir = output_dir();
    let mut trace = sysprof();
    trace.args(["trace", "-q", "-d", "2", "--pid", &pid.to_string(), "-o"]).arg(out_dir.path());
    let out = trace.output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(!text(&out).contains("panicked"), "{}", text(&out));
    let folded = read_folded(&out_dir.path().join("cpu.folded"));
    assert!(self_weight(&folded, "burn_hot") > 0, "burn_hot of /SYSV in the profile: {folded:?}");
}
