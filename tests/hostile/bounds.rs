//! Bounds and faults: options at their limits (a duration past any clock, an interval of
//! nothing), the kernel memory a trace pins and the limits it meets (a small memory cgroup,
//! `ulimit -v`), a zombie for a target, counts of one, a name longer than the kernel keeps.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use sysprof::{
    config::{Focus, Target, TraceConfig},
    kernel_memory::{self, MapSizes},
};

use crate::support::*;

/// stderr's lines, for the one-line checks.
fn stderr_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr).lines().map(String::from).collect()
}

/// Asserts a failure said in one line, without a panic or a backtrace.
fn assert_one_line(out: &Output, starts: &str) {
    let lines = stderr_lines(out);
    assert_eq!(lines.len(), 1, "one line: {}", text(out));
    assert!(lines[0].starts_with(starts), "{}", text(out));
    let all = text(out);
    assert!(!all.contains("panicked") && !all.contains("stack backtrace"), "{all}");
}

#[test]
fn a_duration_past_a_year_is_refused_before_the_command_runs() {
    // Once the trace's deadline (start + duration), which panicked past the clock's range
    // after the command had been launched, and wrote nothing.
    let dir = output_dir();
    let marker = dir.path().join("marker");
    let out = sysprof()
        .env("RUST_BACKTRACE", "1")
        .args(["trace", "-d", "300000000000y", "-o"])
        .arg(dir.path().join("out"))
        .arg("--")
        .arg("touch")
        .arg(&marker)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error: {}", text(&out));
    let lines = stderr_lines(&out);
    assert_eq!(
        lines[0],
        "error: invalid value '300000000000y' for '--duration <DURATION>': must be at most 1year",
        "{}",
        text(&out)
    );
    // Then clap's pointer to --help, as for every usage error; no second error.
    assert_eq!(lines.iter().filter(|line| line.starts_with("error")).count(), 1, "{}", text(&out));
    assert!(!marker.exists(), "the command must not have run");
    assert!(!dir.path().join("out").exists(), "nothing is written");
    // Every option that becomes a Duration has the bound.
    for option in ["--memory-interval", "--gpu-interval"] {
        let out = run_sysprof(&["trace", "--all", option, "300000000000y"]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(stderr_lines(&out)[0].ends_with("must be at most 1year"), "{}", text(&out));
    }
}

#[test]
fn a_gpu_interval_below_its_floor_is_a_usage_error() {
    // 0 panicked the NVML poller; 1ns polled without pause, 1.2 GB of memory in 2 s.
    for interval in ["0", "1ns", "9ms"] {
        let out = run_sysprof(&["trace", "--all", "--gpu-interval", interval]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert_eq!(
            stderr_lines(&out)[0],
            format!(
                "error: invalid value '{interval}' for '--gpu-interval <DURATION>': must be at least 10ms"
            )
        );
    }
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_long_gpu_run_keeps_a_bounded_evenly_spaced_series() {
    let Some(_guard) = root_guard("a_long_gpu_run_keeps_a_bounded_evenly_spaced_series") else { return };
    let nvml = gpu_doubles().join("libnvidia-ml.so.1");
    let busy = Background::spawn(Command::new(workload("busy")).arg("40"));
    let dir = output_dir();
    let log = dir.path().join("polls.log");
    // At the floor, 10 ms: past 2,048 rounds (20 s here) the bound halves the series and the
    // interval doubles.
    let out = sysprof()
        .env("NVML_DOUBLE_LOG", &log)
        .args(["trace", "-q", "--focus", "gpu", "--gpu-interval", "10ms", "-d", "30", "--pid"])
        .arg(busy.pid().to_string())
        .arg("--nvml-lib")
        .arg(&nvml)
        .arg("-o")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let report = read_report(dir.path());
    let metrics = &report["gpu_metrics"];
    let polls = std::fs::read_to_string(&log).unwrap().lines().count();
    let series = metrics["series"].as_array().unwrap();
    let device0: Vec<u64> =
        series.iter().filter(|s| s["device"] == 0).map(|s| s["t_ms"].as_u64().unwrap()).collect();
    // The double logs a line per poll of GPU 0 (see tests/nvml.rs).
    assert!(polls > 2048, "the run polled past the bound: {polls} polls");
    assert!((1024..=2048).contains(&device0.len()), "{} of {polls} polls kept", device0.len());
    assert_eq!(series.len(), device0.len() * 2, "both GPUs keep the same rounds");
    assert_eq!(metrics["interval_end_ms"], 20, "the interval doubled once: {}", metrics["interval_end_ms"]);
    // Evenly spread over the whole run: from its start to its end.
    assert!(device0[0] < 100, "{:?}", &device0[..4]);
    assert!(*device0.last().unwrap() > 29_000, "{:?}", &device0[device0.len() - 4..]);
    let mut gaps: Vec<u64> = device0.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort_unstable();
    assert!((18..=30).contains(&gaps[gaps.len() / 2]), "median gap {} ms", gaps[gaps.len() / 2]);
    // Bounded: 2,048 rounds of 2 GPUs at most, whatever the run's length (a sample is some 300
    // bytes of JSON): 1.1 GB for 2 s at 1 ns before.
    let size = std::fs::metadata(dir.path().join("report.json")).unwrap().len();
    assert!(size < 4 << 20, "report.json is {size} bytes");
    let markdown = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    assert!(markdown.contains("### GPU compute (NVML, every 10 ms, 20 ms by the end)"), "{markdown}");
}

/// The kernel memory report.json states, in bytes.
fn kernel_memory_of(report: &serde_json::Value) -> u64 {
    let memory = &report["overhead"]["kernel_memory"];
    memory["map_bytes"].as_u64().unwrap_or_else(|| panic!("no kernel memory: {}", report["overhead"]))
        + memory["program_bytes"].as_u64().unwrap()
}

fn trace_all(extra: &[&str]) -> (tempfile::TempDir, serde_json::Value, String) {
    let dir = output_dir();
    let out = sysprof()
        .args(["trace", "-q", "--all", "-d", "1"])
        .args(extra)
        .arg("-o")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let report = read_report(dir.path());
    let markdown = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    (dir, report, markdown)
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn the_report_and_check_state_the_kernel_memory_a_trace_pins() {
    let Some(_guard) = root_guard("the_report_and_check_state_the_kernel_memory_a_trace_pins") else {
        return;
    };
    let (_dir, report, markdown) = trace_all(&[]);
    let default = kernel_memory_of(&report);
    let memory = &report["overhead"]["kernel_memory"];
    assert!(memory["maps"].as_u64().unwrap() >= 60, "{memory}");
    // Beside the peak RSS, in the own-cost line.
    let line = markdown.lines().find(|l| l.starts_with("sysprof process: ")).unwrap();
    let expected = format!("KiB of kernel memory in its {} BPF maps and ", memory["maps"]);
    assert!(line.contains("peak RSS ") && line.contains(&expected), "{line}");

    // The bound, from the default options: three stack maps (on-CPU, page faults, the rest)
    // of 16,384 entries and their overflows of a quarter, each entry 127 frames (1,016 bytes)
    // and 24 of header and bucket; the stacks walked with unwind tables (16,384 of 128 frames,
    // 1,104 bytes with a hash map's element); the unwind rows (--unwind-memory, 12 MiB); and
    // every other map at its capacity, 60 MiB (the syscalls' 22, the samples' 6.5, the
    // scheduler's 11, ...). 150 MiB: before the maps of what a trace does not use got one
    // entry, a default trace pinned 152.
    let config = TraceConfig::new(Target::All);
    let stacks = u64::from(config.stack_storage_size);
    let bound = 3 * (stacks + stacks / 4) * (1016 + 24)
        + stacks * 1104
        + (u64::from(config.unwind_memory_mib) << 20)
        + (60 << 20);
    assert!(default <= bound, "a default trace pins {default} bytes, over {bound}");

    // A trace of the on-CPU samples alone pins none of the scheduler's, the syscalls', the page
    // faults' or the other stacks' maps: 84 MiB of them.
    let (_dir, cpu_report, _) = trace_all(&["--focus", "cpu"]);
    let cpu = kernel_memory_of(&cpu_report);
    assert!(cpu + (64 << 20) <= default, "--focus cpu pins {cpu} bytes, the default {default}");

    // `check` says what a default trace pins, measured the same way.
    let out = run_sysprof(&["check"]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("ok       kernel memory"))
        .unwrap_or_else(|| panic!("no kernel memory line in:\n{stdout}"));
    let checked_mib: u64 =
        line.split("a default trace pins ").nth(1).unwrap().split(" MiB").next().unwrap().parse().unwrap();
    let traced_mib = default >> 20;
    assert!(checked_mib.abs_diff(traced_mib) <= traced_mib / 10, "{line}: the trace pinned {traced_mib} MiB");
    assert!(line.contains("MiB with --focus cpu"), "{line}");
    // The estimate that the limits' messages give is what the kernel accounts, within 10%.
    let estimate = kernel_memory::estimate(&MapSizes::for_config(&config, false)) >> 20;
    assert!(estimate.abs_diff(checked_mib) <= checked_mib / 10, "estimate {estimate} MiB, check {line}");
    let focused = TraceConfig { focus: vec![Focus::Cpu], ..config };
    let estimate = kernel_memory::estimate(&MapSizes::for_config(&focused, false));
    assert!(estimate.abs_diff(cpu) <= cpu / 10, "estimate {estimate}, --focus cpu pinned {cpu}");
    assert_no_sysprof_programs();
}

/// A memory cgroup of `bytes`, removed on drop: cgroup v2's memory.max where the memory
/// controller is there, else v1's memory.limit_in_bytes (a hybrid host's).
struct LimitedCgroup(PathBuf);

impl LimitedCgroup {
    fn create(bytes: u64) -> Self {
        let v2 = Path::new("/sys/fs/cgroup");
        let controllers = std::fs::read_to_string(v2.join("cgroup.controllers")).unwrap_or_default();
        let (dir, limit_file) = if controllers.split_whitespace().any(|c| c == "memory") {
            let _ = std::fs::write(v2.join("cgroup.subtree_control"), "+memory");
            (v2.join("sysprof-test-bounds"), "memory.max")
        } else {
            (v2.join("memory/sysprof-test-bounds"), "memory.limit_in_bytes")
        };
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        std::fs::write(dir.join(limit_file), bytes.to_string()).unwrap();
        LimitedCgroup(dir)
    }

    /// `sysprof ARGS` run inside the cgroup.
    fn run(&self, args: &[&str]) -> Output {
        let script = format!("echo $$ > {}/cgroup.procs && exec \"$0\" \"$@\"", self.0.display());
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(env!("CARGO_BIN_EXE_sysprof"))
            .args(args)
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }
}

impl Drop for LimitedCgroup {
    fn drop(&mut self) {
        // Empty once its processes exit; the kernel frees the maps' memory a moment later.
        for _ in 0..100 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_memory_cgroup_too_small_is_one_line_with_the_fix() {
    let Some(_guard) = root_guard("a_memory_cgroup_too_small_is_one_line_with_the_fix") else { return };
    let cgroup = LimitedCgroup::create(64 << 20);
    let dir = output_dir();
    let out_dir = dir.path().join("out");
    let out = cgroup.run(&["trace", "--all", "-d", "1", "-o", out_dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    // Once "failed to create map `X`: failed to create map `X`: Cannot allocate memory".
    assert_one_line(
        &out,
        "error: sysprof's BPF maps do not fit in its memory cgroup: this trace's maps take about ",
    );
    let line = &stderr_lines(&out)[0];
    assert!(!line.contains("failed to create map"), "{line}");
    assert!(
        line.contains(&format!("sysprof's memory cgroup {} allows 64 MiB", cgroup.0.display())),
        "{line}"
    );
    assert!(line.contains("raise its limit, or trace with "), "{line}");
    assert_no_sysprof_programs();

    // The options it names fit in the cgroup: that trace runs there.
    let options = line.split("trace with ").nth(1).unwrap().split(" (about").next().unwrap();
    let mut args = vec!["trace", "-q", "--all", "-d", "1", "-o", out_dir.to_str().unwrap()];
    args.extend(options.split(' '));
    let out = cgroup.run(&args);
    assert!(out.status.success(), "{options}: {}", text(&out));
    assert!(read_report(&out_dir)["run"]["samples"].as_u64().unwrap() > 0, "{options}");
    assert_no_sysprof_programs();
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn an_address_space_limit_is_one_line_and_leaves_no_probe() {
    let Some(_guard) = root_guard("an_address_space_limit_is_one_line_and_leaves_no_probe") else { return };
    let dir = output_dir();
    let mut reached = 0;
    // 30,000 KiB: the limit a release build met (a panic and its backtrace, where the BPF rings
    // and the threads' stacks were mapped). A debug build needs more than that to be loaded at
    // all, which the dynamic loader says, before any of sysprof runs: the higher limits reach it.
    for kib in [30_000, 45_000, 60_000] {
        let out_dir = dir.path().join(kib.to_string());
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!("ulimit -v {kib}; exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_sysprof"))
            .args(["trace", "--all", "-d", "1", "-o"])
            .arg(&out_dir)
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        if String::from_utf8_lossy(&out.stderr).contains("error while loading shared libraries") {
            continue;
        }
        reached += 1;
        assert_eq!(out.status.code(), Some(1), "ulimit -v {kib}: {}", text(&out));
        assert_one_line(&out, "error: a trace needs about ");
        let line = &stderr_lines(&out)[0];
        let limit = format!("the address-space limit (`ulimit -v`) is {},{:03} KiB", kib / 1000, kib % 1000);
        assert!(line.contains(&limit), "{line}");
        assert!(line.ends_with("raise the limit (`ulimit -v unlimited`) where sysprof runs"), "{line}");
        assert!(!out_dir.exists(), "nothing written under ulimit -v {kib}");
        assert_no_sysprof_programs();
    }
    assert!(reached > 0, "no limit let sysprof start");
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_zombie_pid_is_refused_before_anything_is_attached() {
    let Some(_guard) = root_guard("a_zombie_pid_is_refused_before_anything_is_attached") else { return };
    // A child that exited and that this test does not reap (yet): a zombie.
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    let dir = output_dir();
    let out_dir = dir.path().join("out");
    let out =
        sysprof().args(["trace", "--pid", &pid.to_string(), "-d", "2", "-o"]).arg(&out_dir).output().unwrap();
    child.wait().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    // Not "every target process exited: ending the trace after 0.0 s".
    assert_one_line(&out, &format!("error: pid {pid} is a zombie (it exited and its parent "));
    assert!(
        stderr_lines(&out)[0].ends_with("has not reaped it): there is nothing to trace"),
        "{}",
        text(&out)
    );
    assert!(!out_dir.exists(), "nothing written");
}

/// The count in "Wrote ... (N samples, M lost).", and its noun.
fn wrote_count(stderr: &str) -> (u64, String) {
    let line = stderr.lines().find(|l| l.starts_with("Wrote ")).unwrap_or_else(|| panic!("{stderr}"));
    let inside = line.rsplit_once(" (").unwrap().1;
    let (count, rest) = inside.split_once(' ').unwrap();
    (count.replace(',', "").parse().unwrap(), rest.split(',').next().unwrap().to_string())
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn the_summary_says_1_sample_not_1_samples() {
    let Some(_guard) = root_guard("the_summary_says_1_sample_not_1_samples") else { return };
    let dir = output_dir();
    // A command that never runs on a CPU long enough for a sample, then one sampled at 1 Hz
    // for a little over a second: 0 samples, then about 1.
    for (args, burn) in [(&["--focus", "cpu"][..], None), (&["--focus", "cpu", "-F", "1"][..], Some("1.3"))] {
        let mut command = sysprof();
        command.args(["trace"]).args(args).arg("-o").arg(dir.path()).arg("--");
        match burn {
            None => command.arg("true"),
            Some(seconds) => command.arg(workload("busy")).arg(seconds),
        };
        let out = command.output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        let (count, noun) = wrote_count(&stderr);
        assert_eq!(noun, if count == 1 { "sample" } else { "samples" }, "{stderr}");
        assert_eq!(count, read_report(dir.path())["run"]["samples"].as_u64().unwrap());
    }
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_comm_of_a_hundred_characters_matches_what_the_kernel_keeps() {
    let Some(_guard) = root_guard("a_comm_of_a_hundred_characters_matches_what_the_kernel_keeps") else {
        return;
    };
    let dir = output_dir();
    // The kernel names a process after the first 15 bytes of its program's file name.
    let name = format!("sysprofcommtest{}", "x".repeat(85));
    let program = dir.path().join(&name);
    std::fs::copy(workload("busy"), &program).unwrap();
    let out_dir = dir.path().join("out");
    let mut tracing = spawn_tracing_with(
        sysprof().args(["trace", "--focus", "cpu", "-d", "3", "--comm", &name, "-o"]).arg(&out_dir),
    );
    // A process started now, whose whole name is the hundred characters, is traced.
    let status = Command::new(&program).arg("1").stdout(Stdio::null()).status().unwrap();
    assert!(status.success());
    let status = wait_bounded(&mut tracing.child, Duration::from_secs(30));
    let said = tracing.stderr();
    assert!(status.success(), "{said}");
    // What it waited for was said, by the name a process can have.
    assert!(
        said.contains(
            "the kernel keeps 15 characters of a process name: matching processes named \"sysprofcommtest\" (every \
             name that begins so)"
        ),
        "{said}"
    );
    assert!(
        said.contains("no process named \"sysprofcommtest\" is running yet: waiting for one to start"),
        "{said}"
    );
    let folded = read_folded(&out_dir.join("cpu.folded"));
    assert!(self_weight(&folded, "burn_hot") > 0, "the process named so was profiled: {folded:?}");
}
