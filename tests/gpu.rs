//! GPU API tracing, with no GPU: against NVIDIA's real libcudart and libnccl (every call fails
//! for lack of a GPU, so the tests check the exact arguments and return codes the probes saw),
//! and against test doubles of libcudart, libcuda and libnccl for the success paths (bandwidth,
//! allocations, leaks, completion times). Also `--func`, which uses the same probes.

mod support;

use std::{collections::HashMap, path::Path};

use serde_json::Value;
use support::*;

/// Traces `program ARGS` with LD_LIBRARY_PATH=`libs`; returns the report and the program's
/// stdout.
fn trace_with(
    libs: &Path,
    options: &[&str],
    program: &Path,
    args: &[&str],
) -> (tempfile::TempDir, Value, String) {
    let mut sysprof = sysprof();
    sysprof.env("LD_LIBRARY_PATH", libs);
    trace_command_by(sysprof, options, program, args)
}

fn row<'a>(rows: &'a Value, field: &str, value: &str) -> &'a Value {
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| r[field] == value)
        .unwrap_or_else(|| panic!("no {field} = {value} in {rows:#}"))
}

/// The codes the program printed: "name=code" lines, by name.
fn printed_codes(stdout: &str) -> HashMap<String, Vec<i64>> {
    let mut codes: HashMap<String, Vec<i64>> = HashMap::new();
    for line in stdout.lines() {
        if let Some((name, code)) = line.split_once('=') {
            codes.entry(name.to_string()).or_default().push(code.parse().unwrap());
        }
    }
    codes
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn real_libraries_report_the_exact_arguments_and_return_codes() {
    let Some(_guard) = root_guard("real_libraries_report_the_exact_arguments_and_return_codes") else {
        return;
    };
    let Some(libs) = nvidia_libraries("real_libraries_report_the_exact_arguments_and_return_codes") else {
        return;
    };
    let (dir, report, stdout) = trace_with(&libs, &["--focus", "gpu"], &gpu_app(), &["api"]);
    let gpu = &report["gpu"];
    let libraries: Vec<&str> =
        gpu["libraries"].as_array().unwrap().iter().map(|l| l["library"].as_str().unwrap()).collect();
    assert!(libraries.contains(&"Runtime") && libraries.contains(&"Nccl"), "{libraries:?}");

    // Transfers: the bytes each call asked to move, by the direction its kind argument gave.
    let interconnect = &gpu["interconnect"];
    for (kind, bytes, calls) in [
        ("H2D", 4096 + 8192 + 24576 + 64 * 32 + 16 * 8 * 4, 5),
        ("D2H", 12288, 1),
        ("D2D", 16384, 1),
        ("H2H", 20480, 1),
        ("memset", 3000, 1),
    ] {
        let transfer = row(interconnect, "kind", kind);
        assert_eq!(transfer["total_bytes"], bytes, "{kind}: {transfer:#}");
        assert_eq!(transfer["calls"], calls, "{kind}");
        assert_eq!(transfer["errors"], calls, "{kind}: without a GPU every call fails");
    }
    assert_eq!(row(interconnect, "kind", "H2D")["pageable"], 5);

    // Return codes: what the program itself saw.
    let codes = printed_codes(&stdout);
    let functions = &gpu["functions"];
    for (function, printed) in [
        ("cudaMalloc", "cudaMalloc"),
        ("cudaMemcpy2D", "cudaMemcpy2D"),
        ("cudaMemcpy3D", "cudaMemcpy3D"),
        ("cudaFree", "cudaFree"),
        ("ncclAllReduce", "ncclAllReduce"),
        ("ncclSend", "ncclSend"),
    ] {
        let expected = codes[printed][0];
        assert_ne!(expected, 0, "{printed} succeeded without a GPU?");
        let recorded = &row(functions, "function", function)["return_codes"];
        assert_eq!(recorded, &serde_json::json!({ expected.to_string(): 1 }), "{function}");
    }
    let memcpy = row(functions, "function", "cudaMemcpy");
    assert_eq!(memcpy["calls"], 5);
    assert_eq!(memcpy["return_codes"][codes["cudaMemcpyH2D"][0].to_string()], 5);

    // Launches: counted in the kernel, named by the kernel's host stub.
    let compute = &gpu["compute"];
    assert_eq!(compute["launches"], 5);
    assert_eq!(compute["top_kernels"][0]["kernel"], "vector_add_kernel_stub");
    assert_eq!(row(functions, "function", "cudaLaunchKernel")["errors"], 5);
    assert_eq!(compute["sync_calls"], 3);
    assert_eq!(compute["sync_sites"][0]["call_site"], "api_calls (gpu_app)");

    // NCCL: count x the data type's size.
    let nccl = &gpu["nccl"];
    for (op, bytes, datatype) in [
        ("AllReduce", 1024 * 4, "float32"),
        ("Broadcast", 256, "int8"),
        ("AllGather", 512 * 2, "float16"),
        ("ReduceScatter", 128 * 8, "float64"),
        ("Send", 400, "int32"),
        ("Recv", 400, "int32"),
    ] {
        let op_row = row(nccl, "op", op);
        assert_eq!(op_row["total_bytes"], bytes, "{op}");
        assert_eq!(op_row["calls"], 1, "{op}");
        assert_eq!(op_row["errors"], 1, "{op}");
        assert_eq!(op_row["datatypes"][datatype], 1, "{op}");
    }

    // The timeline: each call a slice on the thread that made it, with what it moved and
    // where it was called from.
    if let Some(timeline) = perfetto_summary(&dir.path().join("timeline.pftrace")) {
        let tracks = timeline["tracks"].as_array().unwrap();
        let thread =
            tracks.iter().find(|t| t["kind"] == "thread" && t["name"] == "gpu_app").expect("gpu_app's track");
        let calls: Vec<&Value> =
            timeline["slices"].as_array().unwrap().iter().filter(|s| s["track"] == thread["uuid"]).collect();
        let named = |name: &str| calls.iter().filter(|s| s["name"] == name).collect::<Vec<_>>();
        let copies = named("cudaMemcpy");
        let mut moved: Vec<(u64, &str)> = copies
            .iter()
            .map(|s| (s["args"]["bytes"].as_u64().unwrap(), s["args"]["direction"].as_str().unwrap()))
            .collect();
        moved.sort();
        assert_eq!(moved, [(4096, "H2D"), (8192, "H2D"), (12288, "D2H"), (16384, "D2D"), (20480, "H2H")]);
        assert!(
            copies
                .iter()
                .all(|s| s["args"]["call site"] == "api_calls (gpu_app)" && s["args"]["result"] == "failed")
        );
        let launches = named("cudaLaunchKernel");
        assert_eq!(launches.len(), 5, "{calls:?}");
        assert!(launches.iter().all(|s| s["args"]["kernel"] == "vector_add_kernel_stub"), "{launches:?}");
        assert_eq!(named("ncclAllReduce")[0]["args"]["bytes"], 1024 * 4);
        // Each slice carries its call stack. (The first calls may come before libcudart's unwind
        // table is in, on a loaded machine: tests/unwind.rs holds the unwinder to its figures.)
        let stack = |slice: &Value| -> Vec<String> {
            slice["stack"].as_array().unwrap().iter().filter_map(|f| f.as_str().map(str::to_string)).collect()
        };
        let to_main = ["main", "api_calls", "cudaMemcpy"].map(String::from);
        assert!(copies.iter().any(|s| stack(s).ends_with(&to_main)), "{copies:?}");
    }
    assert_no_sysprof_programs();
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn test_doubles_exercise_the_success_paths() {
    let Some(_guard) = root_guard("test_doubles_exercise_the_success_paths") else { return };
    let (dir, report, _) = trace_with(&gpu_doubles(), &["--focus", "gpu"], &gpu_app(), &["success"]);
    let gpu = &report["gpu"];

    // 30 copies of 1 MiB at the double's 1 GB/s: 20 from pinned memory, 10 pageable.
    let h2d = row(&gpu["interconnect"], "kind", "H2D");
    assert_eq!(h2d["calls"], 30);
    assert_eq!(h2d["total_bytes"], 30 << 20);
    assert_eq!((h2d["pinned"].as_u64(), h2d["pageable"].as_u64()), (Some(20), Some(10)));
    // The double spins 1 ns a byte: a copy of 1 MiB takes 1.05 ms, unless the machine takes the
    // CPU from it meanwhile, and the copy is then that much longer (a busy VM did once, for some
    // 13 ms: 0.74 GB/s over the 30). So the median copy is the double's speed, and the bandwidth
    // over them all is at most that.
    let p50 = h2d["latency_p50_ns"].as_f64().unwrap();
    assert!(
        (1.0e6..1.3e6).contains(&p50),
        "the median copy of 1 MiB took {p50} ns; the double spins 1.05 ms"
    );
    let bandwidth = h2d["bandwidth_gb_s"].as_f64().unwrap();
    assert!(bandwidth > 0.3 && bandwidth < 1.1, "bandwidth {bandwidth} GB/s, the double moves 1 GB/s");

    // cudaMemcpy runs cuMemcpy inside: counted once.
    let functions = &gpu["functions"];
    assert_eq!(row(functions, "function", "cudaMemcpy")["calls"], 30);
    assert!(
        functions.as_array().unwrap().iter().all(|f| f["function"] != "cuMemcpy"),
        "the driver call inside the runtime call was counted too: {functions:#}"
    );

    // Memory on device 1: 64 MiB freed, 3 MiB leaked from success_paths.
    let device = gpu["memory"].as_array().unwrap().iter().find(|m| m["pool"] == "Device").unwrap();
    assert_eq!(device["device"], 1);
    assert_eq!(device["peak_bytes"], 67 << 20);
    assert_eq!(device["current_bytes"], 3 << 20);
    let leak = &gpu["leaks"][0];
    assert_eq!(
        (leak["bytes"].as_u64(), leak["call_site"].as_str()),
        (Some(3 << 20), Some("success_paths (gpu_app)"))
    );

    // All-reduces complete at the next synchronize: algbw, and busbw for 4 ranks.
    let allreduce = row(&gpu["nccl"], "op", "AllReduce");
    let algbw = allreduce["algbw_gb_s"].as_f64().unwrap();
    let busbw = allreduce["busbw_gb_s"].as_f64().unwrap();
    assert!(algbw > 0.0 && (busbw / algbw - 1.5).abs() < 1e-9, "algbw {algbw}, busbw {busbw}");
    assert_eq!(gpu["compute"]["sync_sites"][0]["call_site"], "training_step (gpu_app)");
    assert!(gpu["probe_cost"]["ns_per_call"].as_f64().unwrap() > 0.0);

    let recommendations = report["recommendations"].as_array().unwrap();
    assert!(recommendations.iter().any(|r| r["title"] == "Pin the host memory of host-to-device copies"));
    let markdown = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    for heading in [
        "### Interconnect: CPU-GPU transfers",
        "### NCCL collectives",
        "### GPU compute (host side)",
        "### GPU memory",
    ] {
        assert!(markdown.contains(heading), "missing {heading}");
    }
    // One multi-uprobe link for all the library's functions where the kernel makes them (6.6+),
    // else a uprobe per function.
    let cuda_row = markdown
        .lines()
        .find(|line| line.starts_with("| `call_enter") && line.contains("| uprobe | CUDA runtime"))
        .expect("Part B lists the uprobes");
    let links: u32 = cuda_row.split('|').nth(4).unwrap().trim().parse().unwrap();
    let functions: u32 =
        cuda_row.split(" functions)").next().unwrap().rsplit('(').next().unwrap().parse().unwrap();
    if cuda_row.starts_with("| `call_enter_multi`") {
        assert_eq!(links, 1, "{cuda_row}");
    } else {
        assert_eq!(links, functions, "{cuda_row}");
    }
    assert_no_sysprof_programs();
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn perf_event_uprobes_count_what_multi_uprobe_links_count() {
    let Some(_guard) = root_guard("perf_event_uprobes_count_what_multi_uprobe_links_count") else { return };
    let Some(libs) = nvidia_libraries("perf_event_uprobes_count_what_multi_uprobe_links_count") else {
        return;
    };
    // The kernels before 6.6 get perf-event uprobes, one per function: the same calls,
    // arguments and return codes as one multi-uprobe link per library.
    let run = |links: &str| {
        let dir = output_dir();
        let out = sysprof()
            .env("LD_LIBRARY_PATH", &libs)
            .env("SYSPROF_UPROBE_LINKS", links)
            .args(["trace", "-q", "--focus", "gpu", "-o"])
            .arg(dir.path())
            .arg("--")
            .arg(gpu_app())
            .arg("api")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let report = read_report(dir.path());
        // By name: equal figures may be listed in either order.
        let mut calls: Vec<(String, u64, String)> = report["gpu"]["functions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                let name = f["function"].as_str().unwrap().to_string();
                (name, f["calls"].as_u64().unwrap(), f["return_codes"].to_string())
            })
            .collect();
        calls.sort();
        let links: Vec<(String, u64)> = report["instrumentation"]["probes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["attached_to"].as_str().unwrap().starts_with("CUDA runtime"))
            .map(|p| (p["program"].as_str().unwrap().to_string(), p["links"].as_u64().unwrap()))
            .collect();
        (calls, links, printed_codes(&String::from_utf8_lossy(&out.stdout)))
    };
    let (perf_calls, perf_links, perf_codes) = run("perf-event");
    let (calls, _, codes) = run("");
    assert!(!perf_calls.is_empty());
    assert_eq!(perf_calls, calls);
    assert_eq!(perf_codes, codes);
    // A perf-event uprobe per function, entry and return.
    assert_eq!(perf_links.len(), 2, "{perf_links:?}");
    assert!(
        perf_links.iter().all(|(program, links)| !program.ends_with("_multi") && *links > 40),
        "{perf_links:?}"
    );
    assert_no_sysprof_programs();
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_library_loaded_with_dlopen_is_traced() {
    let Some(_guard) = root_guard("a_library_loaded_with_dlopen_is_traced") else { return };
    let Some(libs) = nvidia_libraries("a_library_loaded_with_dlopen_is_traced") else { return };
    let (_dir, report, stdout) = trace_with(&libs, &["--focus", "gpu"], &workload("gpu_dlopen"), &[]);
    let malloc = row(&report["gpu"]["functions"], "function", "cudaMalloc");
    assert_eq!(malloc["calls"], 3, "{stdout}");
    let code = printed_codes(&stdout)["cudaMalloc"][0];
    assert_eq!(malloc["return_codes"][code.to_string()], 3);
}

/// `sysprof trace -q --focus cpu --func FUNC -- WORKLOAD ARGS`: its output directory and
/// report.json.
fn trace_func(func: &str, program: &str, args: &[&str]) -> (tempfile::TempDir, Value) {
    let dir = output_dir();
    let out = sysprof()
        .args(["trace", "-q", "--focus", "cpu", "--func", func, "-o"])
        .arg(dir.path())
        .arg("--")
        .arg(workload(program))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let report = read_report(dir.path());
    (dir, report)
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn probed_calls_stay_exact_while_other_processes_exec() {
    let Some(_guard) = root_guard("probed_calls_stay_exact_while_other_processes_exec") else { return };
    // An exec notes the exec'ing task on its CPU (`target::renote_current`). Without the switch
    // program (`--focus cpu` loads none) nothing replaced that note, and the call programs,
    // which read it, took the target's calls for that task's on that CPU: 0 of 500 counted in
    // 3 runs of 4 beside this storm of execs.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let storm: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = std::process::Command::new("true").status();
                }
            })
        })
        .collect();
    for round in 0..4 {
        let (_dir, report) = trace_func("busy:burn_cold", "busy", &["--work", "500"]);
        assert_eq!(row(&report["functions"], "function", "burn_cold")["calls"], 500, "round {round}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for thread in storm {
        thread.join().unwrap();
    }
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn func_times_any_function_with_exact_counts() {
    let Some(_guard) = root_guard("func_times_any_function_with_exact_counts") else { return };
    let (dir, report) = trace_func("busy:burn_cold", "busy", &["--work", "500"]);
    let function = row(&report["functions"], "function", "burn_cold");
    assert_eq!(function["calls"], 500);
    assert_eq!(function["callers"][0][0], "burn_rounds (busy)");
    let p50 = function["latency"]["p50_ns"].as_u64().unwrap();
    assert!(p50 > 1_000, "burn_cold takes microseconds: p50 {p50} ns");
    // On the timeline: every call a slice on busy's thread, named by the function.
    if let Some(timeline) = perfetto_summary(&dir.path().join("timeline.pftrace")) {
        let calls: Vec<&Value> =
            timeline["slices"].as_array().unwrap().iter().filter(|s| s["name"] == "burn_cold").collect();
        assert_eq!(calls.len(), 500);
        assert!(calls.iter().all(|s| s["args"]["call site"] == "burn_rounds (busy)"), "{:?}", calls[0]);
    }

    let (_dir, report) = trace_func("sysload:maybe_fail", "sysload", &["negatives", "1000"]);
    let function = row(&report["functions"], "function", "maybe_fail");
    assert_eq!((function["calls"].as_u64(), function["negative_returns"].as_u64()), (Some(1000), Some(500)));
    assert_no_sysprof_programs();
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn no_gpu_library_is_one_line_and_the_rest_runs() {
    let Some(_guard) = root_guard("no_gpu_library_is_one_line_and_the_rest_runs") else { return };
    let dir = output_dir();
    let out = sysprof()
        .args(["trace", "-o"])
        .arg(dir.path())
        .arg("--")
        .arg(workload("busy"))
        .arg("1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("CUDA")).collect();
    assert_eq!(
        lines,
        ["sysprof: no CUDA runtime, driver or NCCL library was mapped by the target: no GPU calls traced"]
    );
    assert!(self_weight(&read_folded(&dir.path().join("cpu.folded")), "burn_hot") > 30);
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn merge_names_the_slow_rank_as_the_straggler() {
    let Some(_guard) = root_guard("merge_names_the_slow_rank_as_the_straggler") else { return };
    let Some(libs) = nvidia_libraries("merge_names_the_slow_rank_as_the_straggler") else { return };
    // Two ranks of a data-parallel job, standing for two hosts: the same 12 all-reduces, with
    // 3 ms of work before each on rank 0 and 15 ms on rank 1, which is made slower.
    let rank = |rank: &str, ms: &str| {
        let dir = output_dir();
        let out = sysprof()
            .env("LD_LIBRARY_PATH", &libs)
            .env("RANK", rank)
            .args(["trace", "-q", "-o"])
            .arg(dir.path())
            .arg("--")
            .arg(gpu_app())
            .args(["collectives", "12", ms])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        dir
    };
    let (fast, slow) = (rank("0", "3"), rank("1", "15"));
    let merged = output_dir();
    let out = sysprof()
        .arg("merge")
        .arg(fast.path())
        .arg(slow.path())
        .arg("-o")
        .arg(merged.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let json: Value =
        serde_json::from_slice(&std::fs::read(merged.path().join("merged.json")).unwrap()).unwrap();
    let host = read_report(fast.path())["run"]["host"].as_str().unwrap().to_string();
    let straggler = &json["straggler"];
    assert_eq!(straggler["label"], format!("rank 1 ({host})"), "{json:#}");
    assert_eq!(straggler["measure"], "time before each collective");
    let ranks = json["ranks"].as_array().unwrap();
    let before = |i: usize| ranks[i]["mean_before_collective_ns"].as_f64().unwrap() / 1e6;
    assert!((3.0..6.0).contains(&before(0)) && before(1) >= 15.0, "{} ms and {} ms", before(0), before(1));
    assert!(ranks.iter().all(|r| r["collectives"] == 12), "{ranks:?}");
    let markdown = std::fs::read_to_string(merged.path().join("merged.md")).unwrap();
    assert!(markdown.contains(&format!("rank 1 ({host}) is the straggler")), "{markdown}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("is the straggler"));

    // One timeline, a machine per host, each with its process named by its rank.
    if let Some(timeline) = perfetto_summary(&merged.path().join("timeline.pftrace")) {
        let tracks = timeline["tracks"].as_array().unwrap();
        for (machine, label) in [(1, "rank 0"), (2, "rank 1")] {
            assert!(
                tracks.iter().any(|t| t["kind"] == "process"
                    && t["machine"] == machine
                    && t["name"].as_str().unwrap().starts_with(label)),
                "{tracks:?}"
            );
        }
        let collectives =
            timeline["slices"].as_array().unwrap().iter().filter(|s| s["name"] == "ncclAllReduce").count();
        assert_eq!(collectives, 24);
    }
}

/// A loop of `cudaMemcpy` (NVIDIA's real libcudart, no GPU: each call fails at once) sends
/// hundreds of thousands of call events a second. The kernel woke a release build of sysprof
/// for nearly each one (61,506 to 71,882 wakeups a second here, each an interrupt in the
/// target's call, and 10 s of sysprof's CPU for a 14 s loop); now they wait for its tick, and
/// every one still arrives: the transfers counted from them are the calls the kernel counted.
/// The tests' debug build drains too slowly to catch up with the kernel, which wakes only a
/// reader that has: the first assertion holds for it either way, the last ones are the test.
#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn call_events_do_not_wake_sysprof_per_call_and_all_arrive() {
    let Some(_guard) = root_guard("call_events_do_not_wake_sysprof_per_call_and_all_arrive") else { return };
    let Some(libs) = nvidia_libraries("call_events_do_not_wake_sysprof_per_call_and_all_arrive") else {
        return;
    };
    let dir = output_dir();
    let mut tracing = spawn_tracing_with(
        sysprof()
            .env("LD_LIBRARY_PATH", &libs)
            .args(["trace", "--focus", "gpu", "-o"])
            .arg(dir.path())
            .arg("--")
            .arg(gpu_app())
            .args(["pageable", "3000000"]),
    );
    // The probes are attached within the first half second; the loop runs for seconds.
    let per_s = wakeups_per_second(
        tracing.child.id(),
        std::time::Duration::from_millis(700),
        std::time::Duration::from_millis(1000),
    );
    assert!(per_s < 1000.0, "sysprof woke {per_s:.0} times a second during a loop of probed calls");

    let status = wait_bounded(&mut tracing.child, std::time::Duration::from_secs(120));
    assert!(status.success(), "{}", tracing.stderr());
    let report = read_report(dir.path());
    assert_eq!(report["run"]["lost"]["call_events"], 0, "{:#}", report["run"]["lost"]);
    let counted = row(&report["gpu"]["functions"], "function", "cudaMemcpy")["calls"].as_u64().unwrap();
    assert!(counted > 100_000, "{:#}", report["gpu"]["functions"]);
    assert_eq!(report["gpu"]["interconnect"][0]["calls"].as_u64(), Some(counted), "{:#}", report["gpu"]);
}

/// The loop's own time a call, as `gpu_app pageable` prints it.
fn own_ns_per_call(stdout: &str) -> f64 {
    stdout
        .split_whitespace()
        .find_map(|word| word.strip_prefix("ns_per_call=")?.parse().ok())
        .unwrap_or_else(|| panic!("no ns_per_call= in {stdout:?}"))
}

/// A function of a build for CET begins with an endbr64, which the kernel steps out of line (a
/// second trap each call, 5.5-6.9 us here against 0.85-1.04 us for a push). sysprof probes
/// such a function at the push after it: every call counted, its time the function's, and the
/// probe as cheap as a push-first function's. sysload's cet_function is written out so (x86-64).
#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_function_of_a_cet_build_is_probed_past_its_endbr64() {
    let Some(_guard) = root_guard("a_function_of_a_cet_build_is_probed_past_its_endbr64") else { return };
    if !cfg!(target_arch = "x86_64") {
        eprintln!("skipped: endbr64 is x86-64's");
        return;
    }
    const CALLS: u64 = 20_000;
    let calls = CALLS.to_string();
    let (_dir, report) = trace_func("sysload:cet_function", "sysload", &["cetcall", &calls]);
    let cet = row(&report["functions"], "function", "cet_function");
    assert_eq!(cet["calls"], CALLS, "{cet:#}");
    assert_eq!(cet["entry_stepped"], false, "{cet:#}");
    let probes = report["instrumentation"]["probes"].as_array().unwrap();
    assert!(
        probes.iter().any(|p| {
            let to = p["attached_to"].as_str().unwrap();
            to.starts_with("function cet_function in ")
                && to.ends_with("(past its endbr64, at the push the kernel emulates)")
        }),
        "{probes:#?}"
    );
    // The same function without the endbr64's trap: a lea first, which the kernel steps.
    let (_dir, report) = trace_func("sysload:probed_function", "sysload", &["probecall", &calls]);
    let stepped = row(&report["functions"], "function", "probed_function");
    assert_eq!(stepped["entry_stepped"], true, "{stepped:#}");
    let p50 = |row: &Value| row["latency"]["p50_ns"].as_f64().unwrap();
    assert!(
        p50(cet) < p50(stepped),
        "cet_function's p50 {:.0} ns, probed_function's (its first instruction stepped) {:.0} ns",
        p50(cet),
        p50(stepped)
    );
    assert_no_sysprof_programs();
}

/// What the report says the probes cost the target is what the target paid. A loop of
/// cudaMemcpy (NVIDIA's real libcudart, no GPU) times its own calls, bare and traced; the cost
/// a call the report states must be no more than twice the loop's added time, nor under a
/// third of it (the calibration's calls carry no arguments and send no events). It read 8.1 to
/// 8.4 us where the loop lost 1.7 to 1.9 us a call: the calibration function's first
/// instruction was one the kernel steps out of line, and cudaMemcpy's, a push, it emulates.
/// Then `--func` on the loop's own function (a push first too, and a failing call inside):
/// its times are mostly the probes', which the report measures and says.
#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn the_probe_cost_the_report_states_is_what_the_target_paid() {
    let Some(_guard) = root_guard("the_probe_cost_the_report_states_is_what_the_target_paid") else { return };
    let Some(libs) = nvidia_libraries("the_probe_cost_the_report_states_is_what_the_target_paid") else {
        return;
    };
    let bare = (0..3)
        .map(|_| {
            let out = std::process::Command::new(gpu_app())
                .env("LD_LIBRARY_PATH", &libs)
                .args(["pageable", "200000"])
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", text(&out));
            own_ns_per_call(&String::from_utf8_lossy(&out.stdout))
        })
        .fold(f64::MAX, f64::min);

    let (_dir, report, stdout) = trace_with(&libs, &["--focus", "gpu"], &gpu_app(), &["pageable", "200000"]);
    let added = own_ns_per_call(&stdout) - bare;
    let stated = report["gpu"]["probe_cost"]["ns_per_call"].as_f64().unwrap();
    assert!(
        stated > added / 3.0 && stated < added * 2.0,
        "the report says a probed call costs {stated:.0} ns; the loop lost {added:.0} ns a call"
    );

    let (dir, report, stdout) = trace_with(
        &libs,
        &["--focus", "cpu", "--func", "gpu_app:load_batch"],
        &gpu_app(),
        &["pageable", "200000"],
    );
    let added = own_ns_per_call(&stdout) - bare;
    let function = row(&report["functions"], "function", "load_batch");
    assert_eq!(function["calls"], 200_000);
    let share = function["probe_time_per_call_ns"].as_f64().expect("the probes' share of a call, measured");
    let p50 = function["latency"]["p50_ns"].as_f64().unwrap();
    // Inside each call's time, and no more than what the probes cost the loop in all.
    assert!(
        share > 0.0 && share < added * 1.5,
        "probes' share {share:.0} ns, the loop lost {added:.0} ns a call"
    );
    assert!(p50 < 2.0 * share, "load_batch's p50 {p50:.0} ns, the probes' share {share:.0} ns");
    let markdown = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    assert!(
        markdown.contains("At least half of a typical call's time is the probes' for `load_batch`"),
        "{markdown}"
    );

    // A function whose first instruction is stepped out of line (sysload's probed_function, a
    // `lea`) is told apart, and its share is the larger one measured for such functions.
    let (dir, report) = trace_func("sysload:probed_function", "sysload", &["probecall", "20000"]);
    let stepped = row(&report["functions"], "function", "probed_function");
    assert_eq!(stepped["entry_stepped"], true, "{stepped:#}");
    assert_eq!(function["entry_stepped"], false, "{function:#}");
    let stepped_share = stepped["probe_time_per_call_ns"].as_f64().unwrap();
    assert!(stepped_share > share, "stepped {stepped_share:.0} ns, emulated {share:.0} ns");
    let p50 = stepped["latency"]["p50_ns"].as_f64().unwrap();
    assert!(
        p50 < 2.0 * stepped_share,
        "probed_function's p50 {p50:.0} ns, the probes' share {stepped_share:.0} ns"
    );
    let markdown = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    assert!(markdown.contains("(`probed_function` here; on x86-64"), "{markdown}");
    assert_no_sysprof_programs();
}
