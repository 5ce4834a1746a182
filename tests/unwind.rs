//! The unwinder end to end: programs built without frame pointers (as distributions build libc
//! and python) traced with the real BPF object, their stacks walked with the .eh_frame tables
//! sysprof builds, checked against the call chains the workloads are known to have and against
//! `perf record --call-graph dwarf` on Debian's own python3.

mod support;

use std::{collections::HashSet, path::Path, process::Command, time::Duration};

use support::*;

/// The kernel's function names, to tell a folded stack's kernel frames from its user frames.
fn kernel_functions() -> HashSet<String> {
    std::fs::read_to_string("/proc/kallsyms")
        .unwrap()
        .lines()
        .filter_map(|line| line.split_whitespace().nth(2).map(String::from))
        .collect()
}

/// Whether `frames` holds `chain` in order, each right after the one before.
fn has_chain(frames: &[String], chain: &[&str]) -> bool {
    frames.windows(chain.len()).any(|window| window.iter().zip(chain).all(|(frame, want)| frame == want))
}

/// Runs `sysprof trace -q -o DIR ARGS...` and returns DIR.
fn traced(args: &[&str]) -> tempfile::TempDir {
    let dir = output_dir();
    let out = sysprof().args(["trace", "-q", "-o"]).arg(dir.path()).args(args).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    dir
}

/// Frames that are no code: an address outside every mapping.
fn unmapped_frames(folded: &[(Vec<String>, u64)]) -> Vec<String> {
    folded.iter().flat_map(|(frames, _)| frames).filter(|f| f.contains("[unmapped]")).cloned().collect()
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_program_without_frame_pointers_unwinds_to_main() {
    let Some(_guard) = root_guard("a_program_without_frame_pointers_unwinds_to_main") else { return };
    let program = workload_without_frame_pointers("unwind", false);
    let chain = ["main", "level1", "level2", "level3", "leaf_spin"];
    // Running before the trace: its tables are written before the trace starts, so every
    // sample is walked with them.
    let target = Background::spawn(Command::new(&program).args(["spin", "30"]));
    std::thread::sleep(Duration::from_millis(200));
    let pid = target.pid().to_string();
    let dir = traced(&["--pid", &pid, "-d", "2s"]);
    let folded = read_folded(&dir.path().join("cpu.folded"));
    let leaf = self_weight_through(&folded, "leaf_spin");
    assert!(leaf >= 50, "only {leaf} samples of leaf_spin: {folded:?}");
    for (frames, n) in folded.iter().filter(|(frames, _)| frames.iter().any(|f| f == "leaf_spin")) {
        assert!(has_chain(frames, &chain), "{n} samples of leaf_spin without its whole chain: {frames:?}");
        assert!(
            frames.iter().take_while(|f| *f != "main").any(|f| f == "__libc_start_call_main"),
            "the walk goes on through libc to the start: {frames:?}"
        );
    }
    assert_eq!(unmapped_frames(&folded), Vec::<String>::new(), "frames outside every mapping");
    let report = read_report(dir.path());
    let unwind = &report["run"]["unwind"];
    assert!(unwind["files"].as_u64().unwrap() >= 2, "the program's and libc's tables at least: {unwind}");
    assert!(unwind["bytes"].as_u64().unwrap() <= unwind["capacity_bytes"].as_u64().unwrap());

    // The same trace by frame pointers only loses the chain: the check above is the unwinder's.
    let fp = traced(&["--pid", &pid, "-d", "1s", "--unwind-memory", "0"]);
    let folded = read_folded(&fp.path().join("cpu.folded"));
    let whole: u64 = folded.iter().filter(|(frames, _)| has_chain(frames, &chain)).map(|(_, n)| n).sum();
    assert!(
        whole * 10 < self_weight_through(&folded, "leaf_spin"),
        "frame pointers walked it whole? {folded:?}"
    );
}

/// Samples whose user stack ends in `function` (kernel frames may follow it: an interrupt).
fn self_weight_through(folded: &[(Vec<String>, u64)], function: &str) -> u64 {
    folded.iter().filter(|(frames, _)| frames.iter().any(|f| f == function)).map(|(_, n)| n).sum()
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn waits_through_glibc_are_named_at_their_caller() {
    let Some(_guard) = root_guard("waits_through_glibc_are_named_at_their_caller") else { return };
    let program = workload_without_frame_pointers("unwind", false);
    // 20 sleeps of 10 ms in sleeper, through glibc's nanosleep (no frame pointers).
    let dir = traced(&["--", program.to_str().unwrap(), "sleep", "20", "10"]);
    let folded = read_folded(&dir.path().join("offcpu.folded"));
    let slept: u64 = folded
        .iter()
        .filter(|(frames, _)| {
            frames.iter().any(|f| f == "[sleep]") && has_chain(frames, &["main", "sleeper"])
        })
        .map(|(_, n)| n)
        .sum();
    // offcpu.folded is weighted in microseconds.
    let slept_ms = slept as f64 / 1e3;
    assert!((190.0..=400.0).contains(&slept_ms), "sleeper slept {slept_ms:.1} ms of 200: {folded:?}");
    assert_eq!(unmapped_frames(&folded), Vec::<String>::new());

    // A lock taken through glibc's pthread_mutex_lock: its caller is in the contention stack.
    let dir = traced(&["--", program.to_str().unwrap(), "lock", "1.5"]);
    let folded = read_folded(&dir.path().join("offcpu.folded"));
    let contended = folded.iter().find(|(frames, _)| {
        frames.iter().any(|f| f == "[lock contention]")
            && has_chain(frames, &["main", "lock_waiter"])
            && frames.iter().any(|f| f.contains("pthread_mutex_lock"))
    });
    assert!(contended.is_some(), "no contention stack through lock_waiter: {folded:?}");
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_library_dlopened_mid_trace_is_unwound() {
    let Some(_guard) = root_guard("a_library_dlopened_mid_trace_is_unwound") else { return };
    let program = workload_without_frame_pointers("unwind", false);
    let library = workload_without_frame_pointers("unwind_lib", true);
    let dir = traced(&["--", program.to_str().unwrap(), "dlopen", library.to_str().unwrap(), "2"]);
    let folded = read_folded(&dir.path().join("cpu.folded"));
    let inner = self_weight_through(&folded, "lib_inner");
    let whole: u64 = folded
        .iter()
        .filter(|(frames, _)| has_chain(frames, &["main", "run_library", "lib_outer", "lib_inner"]))
        .map(|(_, n)| n)
        .sum();
    // The library's samples before its table is written (milliseconds after the dlopen, which
    // sysprof hears of from the mmap) are walked by frame pointers.
    assert!(inner >= 100, "only {inner} samples in the library: {folded:?}");
    assert!(whole as f64 >= inner as f64 * 0.95, "{whole} of {inner} library samples whole: {folded:?}");
    assert_eq!(unmapped_frames(&folded), Vec::<String>::new());
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_cuda_call_through_nvidias_libcudart_is_stacked_to_main() {
    let test = "a_cuda_call_through_nvidias_libcudart_is_stacked_to_main";
    let Some(_guard) = root_guard(test) else { return };
    let Some(libs) = nvidia_libraries(test) else { return };
    // gpu_app built without frame pointers calls NVIDIA's real libcudart (none either) from
    // api_calls: each of its five cudaMemcpy calls is stacked at the probe, at the function's
    // first instruction, where a frame-pointer walk skips the caller (the return address
    // names api_calls still) and everything above it.
    let program = gpu_app_without_frame_pointers();
    let run = |extra: &[&str]| {
        let dir = output_dir();
        let out = sysprof()
            .env("LD_LIBRARY_PATH", &libs)
            .args(["trace", "-q", "--focus", "gpu", "-o"])
            .arg(dir.path())
            .args(extra)
            .arg("--")
            .arg(&program)
            .arg("api")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let folded = read_folded(&dir.path().join("gpucalls.folded"));
        let memcpy: Vec<Vec<String>> = folded
            .into_iter()
            .filter(|(frames, _)| frames.last().is_some_and(|leaf| leaf == "cudaMemcpy"))
            .map(|(frames, _)| frames)
            .collect();
        (dir, memcpy)
    };
    let (_dir, memcpy) = run(&[]);
    assert!(!memcpy.is_empty(), "no cudaMemcpy stack in gpucalls.folded");
    for frames in &memcpy {
        assert!(
            has_chain(frames, &["main", "api_calls", "cudaMemcpy"]),
            "cudaMemcpy without its caller: {frames:?}"
        );
    }
    // By frame pointers only, the stacks end at api_calls: the check above is the unwinder's.
    let (_fp, memcpy) = run(&["--unwind-memory", "0"]);
    assert!(
        memcpy.iter().all(|frames| !has_chain(frames, &["main", "api_calls", "cudaMemcpy"])),
        "frame pointers walked it whole? {memcpy:?}"
    );
}

/// The user frames of each sample of a perf.data recorded with --call-graph dwarf, innermost
/// first, without the frames perf adds for inlined functions (sysprof's symbolizer shows
/// those only where the file has DWARF).
fn perf_user_stacks(data: &Path) -> Vec<Vec<String>> {
    let out = Command::new("perf").args(["script", "-F", "ip,sym", "-i"]).arg(data).output().unwrap();
    assert!(out.status.success(), "perf script: {}", text(&out));
    String::from_utf8_lossy(&out.stdout)
        .split("\n\n")
        .map(|sample| {
            sample
                .lines()
                .filter_map(|line| {
                    let (ip, symbol) = line.trim().split_once(' ').unwrap_or((line.trim(), "?"));
                    let ip = u64::from_str_radix(ip, 16).ok()?;
                    (ip < 0xffff_8000_0000_0000 && !symbol.contains("(inlined)")).then(|| symbol.to_string())
                })
                .collect::<Vec<_>>()
        })
        .filter(|frames| !frames.is_empty())
        .collect()
}

fn median(mut values: Vec<usize>) -> usize {
    values.sort_unstable();
    values[values.len() / 2]
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn debian_python_stacks_reach_main_as_perf_dwarf_does() {
    let test = "debian_python_stacks_reach_main_as_perf_dwarf_does";
    let Some(_guard) = root_guard(test) else { return };
    if !peer_tool(test, "perf") || !peer_tool(test, "python3") {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/workloads/stdlib_mix.py");
    let dir = traced(&["--", "python3", script.to_str().unwrap(), "3"]);
    let kernel = kernel_functions();
    let folded = read_folded(&dir.path().join("cpu.folded"));
    let (mut samples, mut to_main, mut in_eval, mut depths) = (0u64, 0u64, 0u64, Vec::new());
    for (frames, n) in folded.iter().filter(|(frames, _)| frames[0].starts_with("python3")) {
        let user: Vec<&String> = frames[1..].iter().filter(|f| !kernel.contains(*f)).collect();
        samples += n;
        to_main += n * u64::from(user.iter().any(|f| *f == "Py_BytesMain" || *f == "main"));
        // Each call of the evaluation function reads as the Python frames it ran (a run of
        // `function (file.py:N)` frames between native ones): one frame of perf's.
        let python = |f: &&String| f.contains(".py:") || f.starts_with("<module>");
        in_eval += n * u64::from(user.iter().any(python));
        let runs = user.windows(2).filter(|w| python(&w[1]) && !python(&w[0])).count()
            + usize::from(user.first().is_some_and(python));
        let depth = user.iter().filter(|f| !python(f)).count() + runs;
        depths.extend(std::iter::repeat_n(depth, *n as usize));
    }
    assert!(samples >= 150, "only {samples} samples of python3");
    let main_share = to_main as f64 / samples as f64;
    assert!(main_share >= 0.9, "{:.1}% of the stacks reach main: {folded:?}", main_share * 100.0);

    let data = dir.path().join("perf.data");
    let status = Command::new("perf")
        .args(["record", "-q", "-F", "99", "-e", "cpu-clock", "--call-graph", "dwarf", "-o"])
        .arg(&data)
        .args(["--", "python3"])
        .arg(&script)
        .arg("3")
        .status()
        .unwrap();
    assert!(status.success(), "perf record failed");
    let perf = perf_user_stacks(&data);
    let perf_eval =
        perf.iter().filter(|frames| frames.iter().any(|f| f == "_PyEval_EvalFrameDefault")).count() as f64
            / perf.len() as f64;
    let (ours, theirs) = (median(depths), median(perf.iter().map(Vec::len).collect()));
    // perf's DWARF walk stops at __libc_start_call_main, two frames short of _start.
    assert!(
        ours + 2 >= theirs && ours <= theirs + 4,
        "median user stack depth {ours}, perf --call-graph dwarf's {theirs}"
    );
    let eval = in_eval as f64 / samples as f64;
    assert!(
        (eval - perf_eval).abs() <= 0.1,
        "Python frames (for _PyEval_EvalFrameDefault) in {:.1}% of the stacks, perf's evaluation frames: {:.1}%",
        eval * 100.0,
        perf_eval * 100.0
    );
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_table_that_does_not_fit_is_named_in_the_report() {
    let test = "a_table_that_does_not_fit_is_named_in_the_report";
    let Some(_guard) = root_guard(test) else { return };
    if !peer_tool(test, "python3") {
        return;
    }
    // 1 MiB holds libc's table (about 330 KiB) but not python3's as well (about 760 KiB).
    let dir = traced(&["--unwind-memory", "1", "--", "python3", "-c", "sum(range(10**7))"]);
    let report = read_report(dir.path());
    let limitations = report["limitations"].as_array().unwrap();
    let line = limitations.iter().filter_map(|l| l.as_str()).find(|l| l.contains("did not fit"));
    assert!(
        line.is_some_and(
            |l| l.starts_with("user stacks walked by frame pointers in /") && l.contains("--unwind-memory")
        ),
        "{limitations:#?}"
    );
    let unwind = &report["run"]["unwind"];
    assert!(unwind["bytes"].as_u64().unwrap() <= unwind["capacity_bytes"].as_u64().unwrap(), "{unwind}");
    let markdown = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    assert!(markdown.contains("left to frame pointers (see Limitations)"), "{markdown}");
}

/// A shell's child runs its parent's code until it execs, and sysprof writes its unwinding
/// entry from the parent's maps when it hears of the fork: heard late (its tick, a wait for a
/// table), the write could come after the exec, and the new program's first stacks were walked
/// with the shell's tables, ending at their first frame. The kernel side takes an entry only
/// for the address space it was read from; until the new program's is written, its stacks are
/// taken by frame pointers.
#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_new_program_is_never_walked_with_its_parents_tables() {
    let Some(_guard) = root_guard("a_new_program_is_never_walked_with_its_parents_tables") else { return };
    // 200 programs in turn, each sleeping in sleep_in_named_function as it starts (built with
    // frame pointers: a stack walked by them reaches main), beside a burner on every CPU:
    // sysprof preempted between reading the fork and writing the entry is what makes the
    // write late (before the fix, 2 runs in 5 had a sleep without main, with 5 ms sleeps).
    // 25 ms, not 5: the race is at the start, whatever the sleep's length, and a program that
    // lives 5 ms may be gone before sysprof reads its maps (an exec waits up to 5 ms to be
    // read, `EXEC_WAKEUP_GAP_NS`), which leaves its frames unnamed: 1 run in 15 here.
    let script = format!(
        "{} 6 $(nproc) & for i in $(seq 200); do {} sleep 1 25; done; wait",
        workload("busy").display(),
        workload("sysload").display()
    );
    let dir = traced(&["--", "sh", "-c", &script]);
    let folded = read_folded(&dir.path().join("offcpu.folded"));
    let sleeps: Vec<_> = folded
        .iter()
        .filter(|(frames, _)| {
            frames.first().is_some_and(|f| f == "sysload") && frames.iter().any(|f| f == "[sleep]")
        })
        .collect();
    let slept: u64 = sleeps.iter().map(|(_, n)| n).sum();
    // offcpu.folded is weighted in microseconds.
    assert!(slept >= 200 * 25_000, "the 200 sleeps came to {slept} us: {folded:?}");
    for (frames, n) in &sleeps {
        assert!(frames.iter().any(|f| f == "main"), "{n} us of sleep without main: {frames:?}");
    }
}
