//! Shared helpers for sysprof's integration tests: the binary, the test workloads, root gating,
//! and readers for what a run writes.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{Mutex, MutexGuard, OnceLock},
    time::Duration,
};

/// How long one test binary may run: a hung trace fails the run instead of holding CI to its
/// limit. The slowest binary takes about a minute on a 2-core VM.
const BINARY_TIME_BOUND: Duration = Duration::from_secs(900);

/// Starts, once per test binary, the watchdog that ends it past [`BINARY_TIME_BOUND`].
fn watchdog() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        std::thread::spawn(|| {
            std::thread::sleep(BINARY_TIME_BOUND);
            eprintln!("this test binary ran past its {} s bound: ending it", BINARY_TIME_BOUND.as_secs());
            std::process::exit(124);
        });
    });
}

/// The sysprof binary cargo built for these tests.
pub fn sysprof() -> Command {
    watchdog();
    let mut command = Command::new(env!("CARGO_BIN_EXE_sysprof"));
    command.stdin(Stdio::null());
    command
}

/// Runs sysprof with `args` and returns its output.
pub fn run_sysprof(args: &[&str]) -> Output {
    sysprof().args(args).output().expect("running sysprof")
}

/// Permission to run a test that loads BPF programs: a serializing guard (programs from two
/// traces at once would skew CPU shares and the detach checks), or `None` when the test must
/// skip. Such tests are `#[ignore = "needs root..."]`, so a run without root lists them as
/// ignored; `cargo xtask test` includes them as root. One included without root anyway skips
/// with one line outside CI; in CI (CI=true) it fails.
pub fn root_guard(test: &str) -> Option<MutexGuard<'static, ()>> {
    watchdog();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        if std::env::var_os("CI").is_some_and(|v| v != "false" && v != "0") {
            panic!("{test}: needs root, and CI must run every BPF test (run CI as root)");
        }
        eprintln!("skipped {test}: needs root to load BPF programs (run the tests with sudo)");
        return None;
    }
    static LOCK: Mutex<()> = Mutex::new(());
    Some(LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
}

/// Builds `tests/workloads/NAME.c` (once per test binary) with frame pointers and debug info.
pub fn workload(name: &str) -> PathBuf {
    build_workload(name, "workloads", &["-O1", "-fno-omit-frame-pointer"], name)
}

/// Builds `tests/workloads/NAME.c` (once per test binary) as distributions build libc and
/// python: optimized, WITHOUT frame pointers, with debug info; `shared`: as a library
/// (`libNAME.so`).
pub fn workload_without_frame_pointers(name: &str, shared: bool) -> PathBuf {
    match shared {
        true => build_workload(
            name,
            "workloads-nofp",
            &["-O2", "-fomit-frame-pointer", "-shared", "-fPIC"],
            &format!("lib{name}.so"),
        ),
        false => build_workload(name, "workloads-nofp", &["-O2", "-fomit-frame-pointer"], name),
    }
}

/// Builds `tests/workloads/NAME.c` with `flags` (and debug info, pthreads, libdl) into
/// `DIR/OUTPUT` under the test target's directory, once per test binary.
fn build_workload(name: &str, dir: &str, flags: &[&str], output: &str) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<PathBuf, PathBuf>>> = OnceLock::new();
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(dir);
    let binary = out_dir.join(output);
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap();
    if let Some(path) = built.get(&binary) {
        return path.clone();
    }
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tests/workloads/{name}.c"));
    std::fs::create_dir_all(&out_dir).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(flags)
        .args(["-g", "-pthread", "-o"])
        .arg(&binary)
        .arg(&source)
        .arg("-ldl")
        .status()
        .unwrap_or_else(|e| panic!("running {cc} for {name}: {e}"));
    assert!(status.success(), "building workload {name} failed");
    built.insert(binary.clone(), binary.clone());
    binary
}

/// Whether `tool` runs (`tool --version`); in CI, a tool the tests compare with must.
pub fn peer_tool(test: &str, tool: &str) -> bool {
    let works = Command::new(tool).arg("--version").output().is_ok_and(|out| out.status.success());
    if !works {
        if std::env::var_os("CI").is_some_and(|v| v != "false" && v != "0") {
            panic!("{test}: {tool} is missing (.ci/run installs it)");
        }
        eprintln!("skipped {test}: {tool} is not installed");
    }
    works
}

/// NVIDIA's real libcudart.so.12 and libnccl.so.2 (from PyPI, fetched by `cargo xtask test`
/// into a cache outside the repository), or `None` when the test must skip.
pub fn nvidia_libraries(test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("SYSPROF_NVIDIA_LIBS").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| "/root".into());
        home.join(".cache/sysprof/nvidia/lib")
    });
    if dir.join("libcudart.so.12").is_file() && dir.join("libnccl.so.2").is_file() {
        return Some(dir);
    }
    if std::env::var_os("CI").is_some_and(|v| v != "false" && v != "0") {
        panic!(
            "{test}: NVIDIA's libraries are missing from {} (cargo xtask test fetches them)",
            dir.display()
        );
    }
    eprintln!("skipped {test}: NVIDIA's libraries are not in {} (run cargo xtask test once)", dir.display());
    None
}

/// The test doubles of libcudart, libcuda, libnccl and libnvidia-ml (tests/doubles), built once.
pub fn gpu_doubles() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/doubles");
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("doubles");
            std::fs::create_dir_all(&dir).unwrap();
            let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
            for (file, soname, extra) in [
                ("cuda_driver_double.c", "libcuda.so.1", &[][..]),
                ("cudart_double.c", "libcudart.so.12", &["-L", "{dir}", "-l:libcuda.so.1"][..]),
                ("nccl_double.c", "libnccl.so.2", &[][..]),
                ("nvml_double.c", "libnvidia-ml.so.1", &[][..]),
            ] {
                let status = Command::new(&cc)
                    .args(["-O1", "-g", "-fno-omit-frame-pointer", "-shared", "-fPIC"])
                    .arg(format!("-Wl,-soname,{soname}"))
                    .arg("-o")
                    .arg(dir.join(soname))
                    .arg(source.join(file))
                    .args(extra.iter().map(|a| a.replace("{dir}", &dir.display().to_string())))
                    .status()
                    .unwrap();
                assert!(status.success(), "building test double {file} failed");
            }
            dir
        })
        .clone()
}

/// `tests/workloads/gpu_app.c`, linked against libcudart.so.12 and libnccl.so.2 by name (the
/// doubles at link time; LD_LIBRARY_PATH chooses at run time).
pub fn gpu_app() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| build_gpu_app("gpu_app", &["-O1", "-fno-omit-frame-pointer"])).clone()
}

/// `gpu_app` built as distributions build code: `-O2 -fomit-frame-pointer`.
pub fn gpu_app_without_frame_pointers() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| build_gpu_app("gpu_app_nofp", &["-O2", "-fomit-frame-pointer"])).clone()
}

fn build_gpu_app(name: &str, flags: &[&str]) -> PathBuf {
    let doubles = gpu_doubles();
    let binary = Path::new(env!("CARGO_TARGET_TMPDIR")).join("workloads").join(name);
    std::fs::create_dir_all(binary.parent().unwrap()).unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/workloads/gpu_app.c");
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(flags)
        .args(["-g", "-o"])
        .arg(&binary)
        .arg(&source)
        .arg("-L")
        .arg(&doubles)
        .arg(format!("-Wl,-rpath-link,{}", doubles.display()))
        .args(["-l:libcudart.so.12", "-l:libnccl.so.2"])
        .status()
        .unwrap();
    assert!(status.success(), "building {name} failed");
    binary
}

/// A background process killed when dropped, so a failing test leaves nothing running.
pub struct Background(pub Child);

impl Background {
    pub fn spawn(command: &mut Command) -> Self {
        Background(command.stdout(Stdio::null()).spawn().expect("spawning background workload"))
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts sysprof with `args` and returns once it says it is tracing (the probes are attached),
/// with its stderr drained in the background.
pub fn spawn_tracing(args: &[&str], output: &Path) -> Child {
    use std::io::BufRead as _;
    let mut child = sysprof().args(args).arg("-o").arg(output).stderr(Stdio::piped()).spawn().unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while stderr.read_line(&mut line).unwrap() > 0 && !line.contains("tracing") {
        line.clear();
    }
    assert!(line.contains("tracing"), "sysprof never started tracing");
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    child
}

/// utime + stime of `pid` so far, in seconds (the kernel's own accounting, as getrusage).
pub fn process_cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split_whitespace().collect();
    // utime and stime are fields 14 and 15; the rest starts at field 3.
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// A fresh output directory.
pub fn output_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("sysprof-test-").tempdir().unwrap()
}

/// The lines of a folded-stack file as (frames, count).
pub fn read_folded(path: &Path) -> Vec<(Vec<String>, u64)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .map(|line| {
            let (stack, count) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad folded line {line:?}"));
            (stack.split(';').map(String::from).collect(), count.parse().unwrap())
        })
        .collect()
}

/// Total weight of stacks whose innermost frame is `function`.
pub fn self_weight(folded: &[(Vec<String>, u64)], function: &str) -> u64 {
    folded.iter().filter(|(frames, _)| frames.last().is_some_and(|f| f == function)).map(|(_, n)| n).sum()
}

/// Total weight of stacks that contain `function` anywhere.
pub fn total_weight(folded: &[(Vec<String>, u64)], function: &str) -> u64 {
    folded.iter().filter(|(frames, _)| frames.iter().any(|f| f == function)).map(|(_, n)| n).sum()
}

/// Traces the command `program ARGS` with `options` to its end; returns the output directory,
/// the report and what the command printed.
pub fn trace_command(
    options: &[&str],
    program: &Path,
    args: &[&str],
) -> (tempfile::TempDir, serde_json::Value, String) {
    trace_command_by(sysprof(), options, program, args)
}

/// `trace_command` run by `sysprof`, a command made by [`sysprof`] and given what else the run
/// needs (an environment).
pub fn trace_command_by(
    mut sysprof: Command,
    options: &[&str],
    program: &Path,
    args: &[&str],
) -> (tempfile::TempDir, serde_json::Value, String) {
    let dir = output_dir();
    let out = sysprof
        .args(["trace", "-q", "-o"])
        .arg(dir.path())
        .args(options)
        .arg("--")
        .arg(program)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let report = read_report(dir.path());
    (dir, report, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The number a workload printed as `name=N`.
pub fn printed_value(printed: &str, name: &str) -> u64 {
    printed
        .split_whitespace()
        .find_map(|word| word.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in {printed:?}"))
}

/// Parses report.json.
pub fn read_report(dir: &Path) -> serde_json::Value {
    let path = dir.join("report.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Whether the running kernel is `major.minor` or later.
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts =
        release.trim().split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (major, minor)
}

/// Names of the BPF programs loaded in the kernel now (the kernel keeps 15 characters).
pub fn loaded_program_names() -> Vec<String> {
    aya::programs::loaded_programs().filter_map(|info| info.ok()?.name_as_str().map(String::from)).collect()
}

/// sysprof's program names, as the kernel lists them (15 characters at most: the copies for
/// multi-uprobe links are cut).
pub const SYSPROF_PROGRAMS: [&str; 22] = [
    "cpu_sample",
    "process_fork",
    "process_exec",
    "process_exit",
    "sched_switch",
    "sched_wakeup",
    "syscall_enter",
    "syscall_exit",
    "call_enter",
    "call_return",
    "fault_minor",
    "fault_major",
    "alloc_enter",
    "alloc_return",
    "free_enter",
    "call_enter_mult",
    "call_return_mul",
    "alloc_enter_mul",
    "alloc_return_mu",
    "free_enter_mult",
    "loader_ready",
    "loader_ready_mu",
];

/// Asserts no sysprof program is loaded (after a run has exited).
pub fn assert_no_sysprof_programs() {
    // The kernel frees a program once its last reference goes and an RCU grace period has
    // passed (a tasks-trace one for uprobe links and sleepable programs), which a loaded VM
    // stretches: usually within milliseconds, given 10 s. A program sysprof left behind stays
    // loaded however long the wait.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        let names = loaded_program_names();
        if !names.iter().any(|n| SYSPROF_PROGRAMS.contains(&n.as_str())) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("sysprof programs still loaded after exit: {:?}", loaded_program_names());
}

/// stdout and stderr as text, for assertion messages.
pub fn text(output: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// An unprivileged user for the sudo tests, created once (`useradd --system`) when missing.
pub struct TestUser {
    pub uid: u32,
    pub gid: u32,
    pub name: &'static str,
}

/// The sudo tests' user (the tests run as root: see `root_guard`).
pub fn test_user() -> TestUser {
    static CREATED: OnceLock<(u32, u32)> = OnceLock::new();
    let name = "sysprof-test";
    let (uid, gid) = *CREATED.get_or_init(|| {
        let id = |flag: &str| {
            let out = Command::new("id").arg(flag).arg(name).output().expect("running id");
            String::from_utf8_lossy(&out.stdout).trim().parse::<u32>().ok()
        };
        if id("-u").is_none() {
            let status = Command::new("useradd")
                .args(["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name])
                .status()
                .expect("running useradd (package passwd)");
            assert!(status.success(), "useradd {name} failed");
        }
        (id("-u").expect("the test user exists"), id("-g").expect("the test user has a group"))
    });
    TestUser { uid, gid, name }
}

impl TestUser {
    /// `command` as `sudo` would start it for this user: root, with SUDO_UID and friends set.
    pub fn sudo<'a>(&self, command: &'a mut Command) -> &'a mut Command {
        command
            .env("SUDO_UID", self.uid.to_string())
            .env("SUDO_GID", self.gid.to_string())
            .env("SUDO_USER", self.name)
    }

    /// A fresh directory that belongs to this user (mode 0755), inside one only root can
    /// change.
    pub fn dir(&self) -> tempfile::TempDir {
        let dir = tempfile::Builder::new().prefix("sysprof-user-").tempdir().unwrap();
        std::os::unix::fs::chown(dir.path(), Some(self.uid), Some(self.gid)).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }
}

/// How often `pid` (sysprof) slept and was woken, a second: the voluntary context switches of
/// all its threads over `over`, counted from `after` from now.
pub fn wakeups_per_second(pid: u32, after: Duration, over: Duration) -> f64 {
    let switches = || -> u64 {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("status")).ok())
            .flat_map(|status| {
                status
                    .lines()
                    .filter_map(|l| l.strip_prefix("voluntary_ctxt_switches:")?.trim().parse().ok())
                    .collect::<Vec<u64>>()
            })
            .sum()
    };
    std::thread::sleep(after);
    let (before, started) = (switches(), std::time::Instant::now());
    std::thread::sleep(over);
    (switches() - before) as f64 / started.elapsed().as_secs_f64()
}

/// Whether `pid` still runs (exists and is not a zombie).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()))
        .is_some_and(|state| state != 'Z' && state != 'X')
}

/// Sends `signal` to `child`.
pub fn signal(child: &Child, signal: i32) {
    // SAFETY: kill has no memory preconditions.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0, "kill {}", child.id());
}

/// Waits for `child` with a bound, killing it past the bound.
pub fn wait_bounded(child: &mut Child, bound: Duration) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + bound;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("sysprof did not exit within {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A sysprof started by [`spawn_tracing_with`]: its process and everything it printed on
/// stderr so far.
pub struct Tracing {
    pub child: Child,
    stderr: std::sync::Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Tracing {
    /// Everything sysprof printed on stderr, once it has exited.
    pub fn stderr(&mut self) -> String {
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Tracing {
    /// A failing test leaves no sysprof tracing behind (it would show in the next test).
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts `command` (a sysprof command line) and returns once it says it is tracing, keeping
/// its stderr.
pub fn spawn_tracing_with(command: &mut Command) -> Tracing {
    use std::io::BufRead as _;
    let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let text = std::sync::Arc::new(Mutex::new(String::new()));
    let mut line = String::new();
    while stderr.read_line(&mut line).unwrap() > 0 {
        text.lock().unwrap().push_str(&line);
        if line.contains("sysprof: tracing") {
            break;
        }
        line.clear();
    }
    assert!(line.contains("tracing"), "sysprof never started tracing:\n{}", text.lock().unwrap());
    let sink = text.clone();
    let reader = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut rest);
        sink.lock().unwrap().push_str(&rest);
    });
    Tracing { child, stderr: text, reader: Some(reader) }
}

/// Compares `actual` with the golden file at `path`; `SYSPROF_BLESS=1` rewrites it instead. A
/// missing golden file fails: they are only ever created on request.
pub fn assert_golden(path: &Path, actual: &str) {
    if std::env::var_os("SYSPROF_BLESS").is_some() {
        std::fs::write(path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(path).unwrap_or_else(|_| {
        panic!("no golden file {}: run with SYSPROF_BLESS=1 to create it", path.display())
    });
    assert_eq!(actual, expected, "{} changed: review, then SYSPROF_BLESS=1 to accept", path.display());
}

/// The timeline as Perfetto's own protos (PyPI `perfetto`, which CI installs) read it:
/// `tests/support/perfetto_summary.py`. `None` (said) where they are missing outside CI.
pub fn perfetto_summary(trace: &std::path::Path) -> Option<serde_json::Value> {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/support/perfetto_summary.py");
    let has_protos = std::process::Command::new("python3")
        .args(["-c", "import perfetto.protos.perfetto.trace.perfetto_trace_pb2"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_protos {
        assert!(
            std::env::var_os("CI").is_none_or(|v| v == "false" || v == "0"),
            "CI must read the timeline with Perfetto's protos: python3 -m pip install perfetto"
        );
        eprintln!("skipped the Perfetto part: python3 -m pip install perfetto");
        return None;
    }
    let out = std::process::Command::new("python3").arg(script).arg(trace).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    Some(serde_json::from_slice(&out.stdout).expect("the summary is JSON"))
}
