//! See main.rs. Here: the files a target maps or leaves for sysprof, made hostile by their
//! owner. A binary whose compressed debug info claims a tebibyte, a perf map that is a FIFO or a
//! sparse 4 GB file, a library swapped for a link to one only root may read as its process
//! exits, a library cut short and put back while sysprof reads it: each costs at most that
//! file's names, says so once, and reads nothing root-only into the user's results.

use std::{
    ffi::OsStr,
    io::{BufRead as _, Read as _},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
    time::Duration,
};

use crate::support::*;

/// `program` run as `user` (no supplementary groups).
fn as_user(user: &TestUser, program: impl AsRef<OsStr>) -> Command {
    let mut command = Command::new("setpriv");
    command
        .args(["--reuid", &user.uid.to_string(), "--regid", &user.gid.to_string(), "--clear-groups", "--"])
        .arg(program);
    command
}

/// Runs `command` to its end; it must succeed.
fn run(command: &mut Command) {
    let out = command.output().unwrap();
    assert!(out.status.success(), "{command:?}: {}", text(&out));
}

/// Starts `command` (a target) and returns once it prints "ready"; killed when dropped.
fn start(command: &mut Command) -> Background {
    let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "{command:?} did not start");
    // What it prints later goes nowhere, and never fills a pipe.
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    Background(child)
}

/// `sysprof trace ARGS -o OUT` as root, to its end within `bound`: its status and stderr.
fn trace(args: &[&str], out: &Path, bound: Duration) -> (ExitStatus, String) {
    let mut tracing = spawn_tracing_with(sysprof().arg("trace").args(args).arg("-o").arg(out));
    let status = wait_bounded(&mut tracing.child, bound);
    (status, tracing.stderr())
}

/// The report's limitations.
fn limitations(out: &Path) -> Vec<String> {
    let report = read_report(out);
    report["limitations"].as_array().unwrap().iter().map(|line| line.as_str().unwrap().to_string()).collect()
}

/// Asserts `line` is one of the report's limitations, once, and printed on stderr once.
fn assert_said_once(out: &Path, stderr: &str, line: &str) {
    let said = limitations(out).iter().filter(|limitation| *limitation == line).count();
    assert_eq!(said, 1, "{line:?} in the limitations: {:#?}", limitations(out));
    assert_eq!(stderr.matches(line).count(), 1, "{line:?} on stderr once:\n{stderr}");
}

/// Every file sysprof wrote in `out`, as text, the compressed ones (pprof) decompressed.
fn everything_written(out: &Path) -> String {
    let mut all = String::new();
    for entry in std::fs::read_dir(out).unwrap() {
        let path = entry.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        if path.extension() == Some(OsStr::new("gz")) {
            let mut plain = Vec::new();
            flate2::read::GzDecoder::new(&bytes[..]).read_to_end(&mut plain).unwrap();
            bytes = plain;
        }
        all.push_str(&String::from_utf8_lossy(&bytes));
    }
    all
}

/// Builds `tests/workloads/SOURCE` with `cc SOURCE ARGS` into `NAME` under this test binary's
/// directory (once per name).
fn build(source: &str, name: &str, args: &[&str]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("target_files");
    std::fs::create_dir_all(&dir).unwrap();
    let output = dir.join(name);
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/workloads").join(source);
    let modified = |path: &Path| std::fs::metadata(path).and_then(|meta| meta.modified()).ok();
    if modified(&output).is_some_and(|built| Some(built) >= modified(&source)) {
        return output;
    }
    let partial = dir.join(format!("{name}.partial"));
    let status = Command::new("cc")
        .arg("-o")
        .arg(&partial)
        .arg(&source)
        .args(args)
        .current_dir(&dir)
        .status()
        .expect("running cc");
    assert!(status.success(), "building {name}");
    std::fs::rename(&partial, &output).unwrap();
    output
}

/// Copies `from` to `to` as `user`: the file is theirs, created by them.
fn copy_as(user: &TestUser, from: &Path, to: &Path) {
    // The source must be readable to the user; the build's directory is root's.
    let staged = tempfile::NamedTempFile::new().unwrap();
    std::fs::copy(from, staged.path()).unwrap();
    std::fs::set_permissions(staged.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    run(as_user(user, "cp").arg(staged.path()).arg(to));
}

/// busy.c built with compressed DWARF (`-gz=zlib`), its `.debug_info`'s compression header then
/// made to claim 1 TiB: what made `sysprof trace` die with "memory allocation of 1099511627776
/// bytes failed". Copied into `dir` by the user.
fn lying_program(user: &TestUser, dir: &Path) -> PathBuf {
    use object::{Object as _, ObjectSection as _};
    let built = build("busy.c", "busy-gz", &["-O1", "-g", "-gz=zlib", "-fno-omit-frame-pointer", "-pthread"]);
    let mut bytes = std::fs::read(&built).unwrap();
    let (offset, flags) = {
        let elf = object::File::parse(&*bytes).unwrap();
        let section = elf.section_by_name(".debug_info").expect("built with -g");
        let object::SectionFlags::Elf { sh_flags } = section.flags() else { panic!("not ELF") };
        (section.file_range().unwrap().0 as usize, sh_flags)
    };
    assert_ne!(flags & u64::from(object::elf::SHF_COMPRESSED), 0, "built with -gz=zlib");
    // Elf64_Chdr: ch_type (zlib), ch_reserved, then ch_size.
    assert_eq!(bytes[offset..offset + 4], object::elf::ELFCOMPRESS_ZLIB.to_le_bytes());
    bytes[offset + 8..offset + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let patched = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(patched.path(), &bytes).unwrap();
    let program = dir.join("busy-gz");
    copy_as(user, patched.path(), &program);
    program
}

/// What the report says of the lying program.
fn lying_program_line(program: &Path, compressed: &str) -> String {
    format!(
        "could not read the debug info of {}: its .debug_info claims 1.0 TiB decompressed from {compressed} \
         compressed, more than zlib expands to; its functions are named from its symbol table",
        program.display()
    )
}

/// The lying program, run as the user for `seconds`, traced as root with `args`: sysprof ends
/// well, names the program's functions from its symbol table, and says why once.
fn trace_the_lying_program(args: &[&str]) {
    let user = test_user();
    let home = user.dir();
    let program = lying_program(&user, home.path());
    let target = Background(as_user(&user, &program).arg("30").stdout(Stdio::null()).spawn().unwrap());
    std::thread::sleep(Duration::from_millis(300));
    let out = output_dir();
    let pid = target.pid().to_string();
    let args: Vec<&str> = args.iter().map(|arg| if *arg == "PID" { pid.as_str() } else { arg }).collect();
    let (status, stderr) = trace(&args, out.path(), Duration::from_secs(120));
    assert!(status.success(), "{status}\n{stderr}");
    let folded = read_folded(&out.path().join("cpu.folded"));
    assert!(total_weight(&folded, "burn_hot") > 0, "busy-gz's functions are named: {folded:?}");
    let line = limitations(out.path())
        .into_iter()
        .find(|line| line.starts_with(&format!("could not read the debug info of {}", program.display())))
        .unwrap_or_else(|| panic!("no line on the debug info: {:#?}", limitations(out.path())));
    let compressed =
        line.split(" decompressed from ").nth(1).and_then(|rest| rest.split(" compressed").next());
    assert_eq!(line, lying_program_line(&program, compressed.unwrap_or("?")));
    assert_said_once(out.path(), &stderr, &line);
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_program_whose_debug_info_claims_a_tebibyte_is_named_from_its_symbol_table() {
    let Some(_guard) =
        root_guard("a_program_whose_debug_info_claims_a_tebibyte_is_named_from_its_symbol_table")
    else {
        return;
    };
    trace_the_lying_program(&["--pid", "PID", "-d", "2"]);
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn with_all_a_program_whose_debug_info_claims_a_tebibyte_costs_only_its_debug_info() {
    let Some(_guard) =
        root_guard("with_all_a_program_whose_debug_info_claims_a_tebibyte_costs_only_its_debug_info")
    else {
        return;
    };
    trace_the_lying_program(&["--all", "-d", "2"]);
}

/// Removes a perf map when dropped.
struct PerfMapFile(PathBuf);

impl Drop for PerfMapFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The JIT workload run as the user for 30 s (`map`: writing its own perf map), and where its
/// perf map goes.
fn jit(user: &TestUser, map: bool) -> (Background, PerfMapFile) {
    let mut command = as_user(user, workload("jit"));
    command.arg("30");
    if map {
        command.arg("map");
    }
    let target = start(&mut command);
    let map = PerfMapFile(PathBuf::from(format!("/tmp/perf-{}.map", target.pid())));
    (target, map)
}

/// The JIT workload traced as root for 2 s, with its perf map as `plant` left it: sysprof ends
/// well, with the workload's own functions named; returns the report's directory, stderr, the
/// folded CPU stacks and the JIT's pid.
fn trace_jit(
    map: bool,
    plant: impl FnOnce(&TestUser, &Path),
) -> (tempfile::TempDir, String, Vec<(Vec<String>, u64)>, u32) {
    let user = test_user();
    let (target, map) = jit(&user, map);
    plant(&user, &map.0);
    let out = output_dir();
    let (status, stderr) =
        trace(&["--pid", &target.pid().to_string(), "-d", "2"], out.path(), Duration::from_secs(60));
    assert!(status.success(), "{status}\n{stderr}");
    let folded = read_folded(&out.path().join("cpu.folded"));
    assert!(total_weight(&folded, "main") > 0, "the workload's own functions are named: {folded:?}");
    (out, stderr, folded, target.pid())
}

/// Samples whose innermost frame is JIT code sysprof could not name.
fn unnamed_jit(folded: &[(Vec<String>, u64)]) -> u64 {
    folded
        .iter()
        .filter(|(frames, _)| frames.last().is_some_and(|frame| frame.starts_with("[unknown] [anon]+")))
        .map(|(_, count)| count)
        .sum()
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_jits_own_perf_map_names_its_code() {
    let Some(_guard) = root_guard("a_jits_own_perf_map_names_its_code") else { return };
    let (out, _, folded, _) = trace_jit(true, |_, _| {});
    assert!(self_weight(&folded, "jit_spin_loop") > 0, "the perf map named the JIT code: {folded:?}");
    assert_eq!(unnamed_jit(&folded), 0, "{folded:?}");
    assert!(
        !limitations(out.path()).iter().any(|line| line.contains("/tmp/perf-")),
        "{:#?}",
        limitations(out.path())
    );
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_perf_map_that_is_a_fifo_does_not_hold_the_trace() {
    let Some(_guard) = root_guard("a_perf_map_that_is_a_fifo_does_not_hold_the_trace") else { return };
    // Before: sysprof's open of the FIFO blocked for good, past Ctrl-C, nothing written.
    let (out, stderr, folded, pid) = trace_jit(false, |user, map| {
        run(as_user(user, "mkfifo").args(["-m", "0644"]).arg(map));
    });
    assert!(unnamed_jit(&folded) > 0, "the JIT code was sampled, and not named: {folded:?}");
    let line = format!(
        "/tmp/perf-{pid}.map: not a regular file (a FIFO); sysprof reads only regular files here; the JIT \
         code of process {pid} shows as [unknown] [anon]+offset"
    );
    assert_said_once(out.path(), &stderr, &line);
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_sparse_perf_map_of_4_gb_is_not_read() {
    let Some(_guard) = root_guard("a_sparse_perf_map_of_4_gb_is_not_read") else { return };
    // Before: read whole (4 GB of zeros) until the kernel killed sysprof for its memory.
    let (out, stderr, folded, pid) = trace_jit(false, |user, map| {
        run(as_user(user, "truncate").args(["-s", "4G"]).arg(map));
        run(as_user(user, "chmod").arg("0644").arg(map));
    });
    assert!(unnamed_jit(&folded) > 0, "the JIT code was sampled, and not named: {folded:?}");
    let line = format!(
        "/tmp/perf-{pid}.map: larger than the 64.0 MiB sysprof reads from such a file; the JIT code of process \
         {pid} shows as [unknown] [anon]+offset"
    );
    assert_said_once(out.path(), &stderr, &line);
    let peak_kib = read_report(out.path())["overhead"]["sysprof_peak_rss_kib"].as_u64().unwrap();
    assert!(peak_kib < 1 << 20, "sysprof's peak was {peak_kib} KiB");
}

/// mapped_lib.c built: the user's library (`tf_public_` names), the copy only root may read
/// (`tf_secret_` names, the same layout), and the program, which finds its library beside it.
fn mapped_lib() -> (PathBuf, PathBuf, PathBuf) {
    let flags = ["-O1", "-g", "-fno-omit-frame-pointer", "-shared", "-fPIC"];
    let public = build("mapped_lib.c", "libtf.so", &[&flags[..], &["-DPREFIX=tf_public_"]].concat());
    let secret = build("mapped_lib.c", "libtf-secret.so", &[&flags[..], &["-DPREFIX=tf_secret_"]].concat());
    let program = build(
        "mapped_lib.c",
        "mapped_lib",
        &[
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-DPROGRAM",
            "-L.",
            "-l:libtf.so",
            "-Wl,-rpath,$ORIGIN",
            "-Wl,-z,now",
        ],
    );
    (public, secret, program)
}

/// The program and its library, copied by the user into `dir`: the program's path.
fn install_mapped_lib(user: &TestUser, dir: &Path) -> PathBuf {
    let (public, _, program) = mapped_lib();
    copy_as(user, &public, &dir.join("libtf.so"));
    copy_as(user, &program, &dir.join("mapped_lib"));
    dir.join("mapped_lib")
}

/// Where the loadable segments of ELF file `path` end, rounded up to a page: what a process
/// that maps the file runs on, and all of it.
fn loaded_end(path: &Path) -> u64 {
    use object::{Object as _, ObjectSegment as _};
    let bytes = std::fs::read(path).unwrap();
    let elf = object::File::parse(&*bytes).unwrap();
    let end = elf.segments().map(|segment| segment.file_range().0 + segment.file_range().1).max().unwrap();
    end.next_multiple_of(4096)
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_library_swapped_for_a_link_to_a_root_only_one_is_not_read() {
    let Some(_guard) = root_guard("a_library_swapped_for_a_link_to_a_root_only_one_is_not_read") else {
        return;
    };
    let user = test_user();
    let home = user.dir();
    let program = install_mapped_lib(&user, home.path());
    let library = home.path().join("libtf.so");
    // The root-only library: 0600 in a 0700 directory.
    let vault = tempfile::Builder::new().prefix("sysprof-root-only-").tempdir().unwrap();
    let secret = vault.path().join("libtf.so");
    std::fs::copy(mapped_lib().1, &secret).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(vault.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    // It spins in its library for 3 s, then swaps the library for a link to the root-only one
    // and exits at once: its maps, last read while it ran, name the library's path.
    let target = start(as_user(&user, &program).arg("3").arg(&library).arg(&secret));
    let out = output_dir();
    let (status, stderr) = trace(&["--pid", &target.pid().to_string()], out.path(), Duration::from_secs(60));
    assert!(status.success(), "{status}\n{stderr}");
    assert!(std::fs::symlink_metadata(&library).unwrap().is_symlink(), "the program swapped its library");
    let written = everything_written(out.path());
    assert!(!written.contains("tf_secret_"), "a name from the root-only library was written");
    let folded = read_folded(&out.path().join("cpu.folded"));
    // Its own functions (the loop's caller is hidden where the library's unwind table is not
    // read: the loop is a leaf, which keeps no frame pointer).
    assert!(total_weight(&folded, "main") > 0, "the program's own functions are named: {folded:?}");
    let unnamed: u64 = folded
        .iter()
        .filter(|(frames, _)| frames.last().is_some_and(|frame| frame.starts_with("[unknown] libtf.so+0x")))
        .map(|(_, count)| count)
        .sum();
    assert!(unnamed > 0, "the library's frames keep its name and offset: {folded:?}");
    let line = limitations(out.path())
        .into_iter()
        .find(|line| line.starts_with(&format!("{} changed during the trace: ", library.display())))
        .unwrap_or_else(|| panic!("no line on the library: {:#?}", limitations(out.path())));
    assert!(
        line.contains("another file is there now than the one the process mapped")
            && line.ends_with("so it was not read and its frames show as [unknown] libtf.so+offset"),
        "{line}"
    );
    assert_said_once(out.path(), &stderr, &line);
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_library_cut_short_while_sysprof_reads_it_costs_no_more_than_its_names() {
    let Some(_guard) = root_guard("a_library_cut_short_while_sysprof_reads_it_costs_no_more_than_its_names")
    else {
        return;
    };
    let user = test_user();
    let home = user.dir();
    let program = install_mapped_lib(&user, home.path());
    let library = home.path().join("libtf.so");
    let target = start(as_user(&user, &program).arg("30"));
    // Everything past what the program runs on (its symbol tables and DWARF, the section
    // headers) goes, and comes back, every 0.6 ms, while sysprof reads the file: to build its
    // unwind table, to name its functions.
    let cutter = home.path().join("cutter");
    copy_as(&user, &build("mapped_lib.c", "cutter", &["-O1", "-DCUTTER"]), &cutter);
    let cut = loaded_end(&library).to_string();
    let _cutter = start(as_user(&user, &cutter).arg(&library).args([cut.as_str(), "30"]));
    let out = output_dir();
    let (status, stderr) =
        trace(&["--pid", &target.pid().to_string(), "-d", "3"], out.path(), Duration::from_secs(60));
    // Before: SIGBUS, in the unwinder's or blazesym's read of the mapped library.
    assert!(status.success(), "{status}\n{stderr}");
    let folded = read_folded(&out.path().join("cpu.folded"));
    // Its own functions (the loop's caller is hidden where the library's unwind table is not
    // read: the loop is a leaf, which keeps no frame pointer).
    assert!(total_weight(&folded, "main") > 0, "the program's own functions are named: {folded:?}");
}
