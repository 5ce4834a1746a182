//! The formats other tools read: the pprof files (`NAME.pb.gz`) of a real run, decoded with the
//! protobuf types sysprof encodes them with and read by `go tool pprof` itself, must hold what
//! the folded stacks hold, with the hot function on top and the labels a backend filters by.

mod support;

use std::{collections::HashMap, io::Read as _, path::Path, process::Command};

use libdd_profiling_protobuf::prost_impls::{Message as _, Profile};
use support::*;

fn decode(path: &Path) -> Profile {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(bytes.as_slice()).read_to_end(&mut raw).expect("gzipped");
    Profile::decode(raw.as_slice()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn text(profile: &Profile, index: i64) -> &str {
    &profile.string_table[index as usize]
}

/// `sysprof trace -q OPTIONS -o DIR -- WORKLOAD ARGS` (with `env` set), which must succeed: the
/// directory and what it printed.
fn trace(
    options: &[&str],
    env: &[(&str, &str)],
    workload_name: &str,
    args: &[&str],
) -> (tempfile::TempDir, std::process::Output) {
    let dir = output_dir();
    let out = sysprof()
        .envs(env.iter().copied())
        .args(["trace", "-q"])
        .args(options)
        .arg("-o")
        .arg(dir.path())
        .arg("--")
        .arg(workload(workload_name))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", support::text(&out));
    (dir, out)
}

/// (type, unit) of each of the profile's values.
fn sample_types(profile: &Profile) -> Vec<(&str, &str)> {
    profile.sample_types.iter().map(|t| (text(profile, t.r#type), text(profile, t.unit))).collect()
}

/// The weights of a folded file, added up.
fn folded_total(path: &Path) -> u64 {
    read_folded(path).iter().map(|(_, n)| n).sum()
}

/// The value at `index` of every sample, added up.
fn total(profile: &Profile, index: usize) -> i64 {
    profile.samples.iter().map(|s| s.values[index]).sum()
}

/// Label values by key across the samples.
fn labels(profile: &Profile) -> HashMap<String, Vec<String>> {
    let mut labels: HashMap<String, Vec<String>> = HashMap::new();
    for label in profile.samples.iter().flat_map(|s| &s.labels) {
        let value = if label.str != 0 { text(profile, label.str).to_string() } else { label.num.to_string() };
        labels.entry(text(profile, label.key).to_string()).or_default().push(value);
    }
    labels
}

/// The leaf function's total of value `index`, by function name.
fn self_by_function(profile: &Profile, index: usize) -> HashMap<String, i64> {
    let mut totals = HashMap::new();
    for sample in &profile.samples {
        let location = &profile.locations[sample.location_ids[0] as usize - 1];
        let function = &profile.functions[location.lines[0].function_id as usize - 1];
        *totals.entry(text(profile, function.name).to_string()).or_default() += sample.values[index];
    }
    totals
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn the_pprof_files_hold_what_the_folded_files_do() {
    let Some(_guard) = root_guard("the_pprof_files_hold_what_the_folded_files_do") else { return };
    let (dir, _) = trace(&["-F", "199"], &[], "busy", &["2", "2"]);
    let folded = |name: &str| folded_total(&dir.path().join(name));

    // On-CPU: the sample counts and their CPU time at the period.
    let cpu = decode(&dir.path().join("cpu.pb.gz"));
    assert_eq!(sample_types(&cpu), [("samples", "count"), ("cpu", "nanoseconds")]);
    assert_eq!(cpu.period, 1_000_000_000 / 199);
    assert_eq!(total(&cpu, 0) as u64, folded("cpu.folded"));
    assert_eq!(total(&cpu, 1), total(&cpu, 0) * cpu.period);
    let hot = self_by_function(&cpu, 0);
    let top = hot.iter().max_by_key(|(_, n)| **n).unwrap();
    assert_eq!(top.0, "burn_hot", "{hot:?}");
    let cpu_labels = labels(&cpu);
    for key in ["pid", "process", "tid", "thread"] {
        assert!(cpu_labels.contains_key(key), "no {key} label: {cpu_labels:?}");
    }
    assert!(cpu_labels["process"].iter().all(|p| p == "busy"), "{cpu_labels:?}");
    // Two threads burn: both are labelled.
    let mut tids = cpu_labels["tid"].clone();
    tids.sort();
    tids.dedup();
    assert!(tids.len() >= 2, "{tids:?}");
    // The program's mapping names its file and its build id.
    let busy = cpu
        .mappings
        .iter()
        .find(|m| text(&cpu, m.filename).ends_with("/busy"))
        .unwrap_or_else(|| panic!("no mapping of busy: {:?}", cpu.mappings));
    assert_eq!(text(&cpu, busy.build_id).len(), 40, "a GNU build id in hex");

    // Off-CPU: nanoseconds, the folded microseconds times 1000, the reason a label.
    let offcpu = decode(&dir.path().join("offcpu.pb.gz"));
    assert_eq!(total(&offcpu, 0) as u64, folded("offcpu.folded") * 1000);
    assert!(labels(&offcpu).contains_key("reason"), "{:?}", labels(&offcpu));

    // Faults: the same weighted counts, minor or major as a label. busy faults too seldom for a
    // launched command's sampled fault stacks (1 in 256): memload touches 5,000 fresh pages.
    let (faulted, _) = trace(&["--focus", "memory"], &[], "memload", &["touch", "5000"]);
    let faults = decode(&faulted.path().join("faults.pb.gz"));
    let folded_faults = folded_total(&faulted.path().join("faults.folded"));
    assert!(folded_faults >= 4_000, "{folded_faults} faults in faults.folded for 5,000 pages");
    assert_eq!(total(&faults, 0) as u64, folded_faults);
    assert!(labels(&faults)["fault"].iter().all(|f| f == "minor fault" || f == "major fault"));

    // The reference reader: `go tool pprof` parses it and puts burn_hot on top.
    let Some(go) = go_tool() else { return };
    let top = Command::new(&go)
        .args(["tool", "pprof", "-top", "-sample_index=cpu"])
        .arg(dir.path().join("cpu.pb.gz"))
        .output()
        .unwrap();
    assert!(top.status.success(), "{}", support::text(&top));
    let listing = String::from_utf8_lossy(&top.stdout);
    let first = listing.lines().skip_while(|l| !l.trim_start().starts_with("flat")).nth(1).unwrap_or("");
    assert!(first.ends_with("burn_hot"), "{listing}");
    for file in [dir.path().join("offcpu.pb.gz"), faulted.path().join("faults.pb.gz")] {
        let raw = Command::new(&go).args(["tool", "pprof", "-raw"]).arg(&file).output().unwrap();
        assert!(raw.status.success(), "{}: {}", file.display(), support::text(&raw));
    }
}

/// `go`, which CI installs (golang-go); elsewhere its part of the test is skipped, said so.
fn go_tool() -> Option<std::path::PathBuf> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("go"))
        .find(|path| path.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none_or(|v| v == "false" || v == "0"),
            "CI must check the pprof files with `go tool pprof`: install golang-go"
        );
        eprintln!("skipped the `go tool pprof` part: no go on PATH (apt install golang-go)");
    }
    found
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn the_heap_profile_is_a_pprof_of_bytes() {
    let Some(_guard) = root_guard("the_heap_profile_is_a_pprof_of_bytes") else { return };
    let (dir, _) = trace(&["--malloc"], &[], "memload", &["mallocs", "20000"]);
    let alloc = decode(&dir.path().join("alloc.pb.gz"));
    assert_eq!(sample_types(&alloc), [("alloc_space", "bytes")]);
    assert_eq!(total(&alloc, 0) as u64, folded_total(&dir.path().join("alloc.folded")));
    // memload's 20,000 blocks of 64 bytes are all there.
    assert!(total(&alloc, 0) >= 20_000 * 64, "{} bytes", total(&alloc, 0));
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_saved_run_renders_again_without_tracing() {
    let Some(_guard) = root_guard("a_saved_run_renders_again_without_tracing") else { return };
    let (dir, _) = trace(&["--save-readout"], &[], "busy", &["1", "2"]);
    // Rendered again whole: the same report, byte for byte.
    let again = output_dir();
    let rendered = sysprof().arg("report").arg(dir.path()).arg("-o").arg(again.path()).output().unwrap();
    assert!(rendered.status.success(), "{}", support::text(&rendered));
    let read = |d: &Path, name: &str| std::fs::read_to_string(d.join(name)).unwrap();
    assert_eq!(read(again.path(), "report.md"), read(dir.path(), "report.md"));
    assert_eq!(read(again.path(), "cpu.folded"), read(dir.path(), "cpu.folded"));
    let bytes = |d: &Path, name: &str| std::fs::read(d.join(name)).unwrap();
    assert_eq!(bytes(again.path(), "timeline.pftrace"), bytes(dir.path(), "timeline.pftrace"));
    // The pprof files too, build ids included: the replay reads no file, the read-out has them.
    assert_eq!(bytes(again.path(), "cpu.pb.gz"), bytes(dir.path(), "cpu.pb.gz"));
    // Kept to the CPU family: its section and profile, nothing of the scheduler's.
    let focused = output_dir();
    let rendered = sysprof()
        .arg("report")
        .arg(dir.path())
        .arg("-o")
        .arg(focused.path())
        .args(["--focus", "cpu"])
        .output()
        .unwrap();
    assert!(rendered.status.success(), "{}", support::text(&rendered));
    let markdown = read(focused.path(), "report.md");
    assert!(
        markdown.contains("### CPU: hotspots") && !markdown.contains("### CPU overhead: scheduling"),
        "{markdown}"
    );
    assert!(focused.path().join("cpu.pb.gz").is_file() && !focused.path().join("offcpu.folded").exists());
}

/// TEST DOUBLE of a Pyroscope server (none can run here): it accepts `POST /ingest` requests on
/// loopback, answers 200 and keeps each request's target and body.
struct PyroscopeDouble {
    url: String,
    requests: std::sync::mpsc::Receiver<(String, Vec<u8>)>,
}

impl PyroscopeDouble {
    fn start() -> Self {
        use std::io::{BufRead as _, BufReader, Write as _};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (sender, requests) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                let target = line.split_whitespace().nth(1).unwrap_or("").to_string();
                let mut length = 0usize;
                loop {
                    let mut header = String::new();
                    if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                        break;
                    }
                    if let Some((name, value)) = header.split_once(':')
                        && name.eq_ignore_ascii_case("content-length")
                    {
                        length = value.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0; length];
                if reader.read_exact(&mut body).is_err() {
                    continue;
                }
                // Kept before the reply: sysprof may exit as soon as it has the last one, and
                // the test then reads what was kept.
                let _ = sender.send((target, body));
                let _ = reader
                    .get_mut()
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            }
        });
        PyroscopeDouble { url, requests }
    }
}

/// The gzipped profile inside a multipart body.
fn profile_of(body: &[u8]) -> Profile {
    let start = body.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let end = body.windows(4).rposition(|w| w == b"\r\n--").unwrap();
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&body[start..end]).read_to_end(&mut raw).expect("a gzipped pprof");
    Profile::decode(raw.as_slice()).unwrap()
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn the_profiles_reach_a_pyroscope_server_and_a_dead_one_costs_a_line() {
    let Some(_guard) = root_guard("the_profiles_reach_a_pyroscope_server_and_a_dead_one_costs_a_line") else {
        return;
    };
    let server = PyroscopeDouble::start();
    let (dir, _) = trace(&["--push", &server.url], &[("RANK", "3")], "busy", &["1", "1"]);
    let requests: Vec<(String, Vec<u8>)> = server.requests.try_iter().collect();
    let names: Vec<&str> = requests.iter().map(|(target, _)| target.as_str()).collect();
    assert_eq!(requests.len(), 3, "cpu, offcpu, faults: {names:?}");
    let (target, body) = requests.iter().find(|(t, _)| t.contains("sysprof.cpu")).unwrap();
    assert!(target.starts_with("/ingest?name=sysprof.cpu%7Bhost%3D"), "{target}");
    for label in ["service%3Dbusy", "rank%3D3", "pid%3D", "format=pprof", "sampleRate=99", "from=", "until="]
    {
        assert!(target.contains(label), "{label} in {target}");
    }
    // What arrived is what was written.
    let sent = profile_of(body);
    assert_eq!(sent, decode(&dir.path().join("cpu.pb.gz")));

    // A server that is not there: one line, every local file, the command's exit code.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let (dir, out) = trace(&["--push", &url], &[], "busy", &["1", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("push")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("could not push") && lines[0].contains("the local files are kept"), "{stderr}");
    assert!(dir.path().join("cpu.pb.gz").is_file() && dir.path().join("report.md").is_file());
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn the_live_heap_is_a_pprof_of_the_bytes_still_allocated() {
    let Some(_guard) = root_guard("the_live_heap_is_a_pprof_of_the_bytes_still_allocated") else { return };
    use std::io::Write as _;
    // 100 rounds of allocations all freed, then 50 blocks of 4096 bytes kept.
    let dir = output_dir();
    let mut child = sysprof()
        .args(["trace", "-q", "--malloc", "-o"])
        .arg(dir.path())
        .arg("--")
        .arg(workload("memload"))
        .args(["allocs", "100", "50"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    child.stdin.take().unwrap().write_all(b"x").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", support::text(&out));
    let live = decode(&dir.path().join("inuse.pb.gz"));
    assert_eq!(sample_types(&live), [("inuse_space", "bytes")]);
    assert_eq!(total(&live, 0) as u64, folded_total(&dir.path().join("inuse.folded")));
    // Through the function that kept them: exactly the bytes it kept; what was freed is not live.
    let through = |function: &str| -> i64 {
        live.samples
            .iter()
            .filter(|s| {
                s.location_ids.iter().any(|id| {
                    let location = &live.locations[*id as usize - 1];
                    text(&live, live.functions[location.lines[0].function_id as usize - 1].name) == function
                })
            })
            .map(|s| s.values[0])
            .sum()
    };
    assert_eq!(through("keep_known_blocks"), 50 * 4096);
    assert_eq!(through("allocate_known_sizes"), 0);
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn the_timeline_shows_each_thread_its_samples_waits_and_slow_calls() {
    let Some(_guard) = root_guard("the_timeline_shows_each_thread_its_samples_waits_and_slow_calls") else {
        return;
    };
    // One second of burn_hot/burn_cold, then three sleeps of 100 ms in sleep_in_named_function.
    let script =
        format!("{} 1 1 && {} sleep 3 100", workload("busy").display(), workload("sysload").display());
    let dir = output_dir();
    let out = sysprof()
        .args(["trace", "-q", "-F", "199", "-o"])
        .arg(dir.path())
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", support::text(&out));
    let trace = dir.path().join("timeline.pftrace");
    assert!(trace.is_file(), "no timeline.pftrace");
    let Some(summary) = perfetto_summary(&trace) else { return };

    // Placed in time: the kernel's clock, with boot time and wall-clock time beside it.
    assert_eq!(summary["clocks"], serde_json::json!([1, 3, 6]), "realtime, monotonic, boottime");
    assert_eq!(summary["sequence_cleared"], true);
    assert_eq!(summary["unclosed"], 0, "every slice that begins ends");
    let tracks = summary["tracks"].as_array().unwrap();
    let thread = |name: &str| {
        tracks
            .iter()
            .find(|t| t["kind"] == "thread" && t["name"] == name)
            .unwrap_or_else(|| panic!("no thread track named {name}: {tracks:?}"))
    };
    let busy = thread("busy");
    let sysload = thread("sysload");
    assert!(
        tracks.iter().any(|t| t["kind"] == "process" && t["pid"] == busy["pid"] && t["name"] == "busy"),
        "{tracks:?}"
    );

    // Every on-CPU sample is on the timeline, as many as cpu.folded counts, and busy's hottest
    // leaf is burn_hot.
    let samples = summary["samples"].as_object().unwrap();
    let on_timeline: u64 = samples
        .values()
        .flat_map(|leaves| leaves.as_object().unwrap().values())
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(on_timeline, folded_total(&dir.path().join("cpu.folded")));
    let busy_leaves = samples[&busy["tid"].to_string()].as_object().unwrap();
    let hottest = busy_leaves.iter().max_by_key(|(_, n)| n.as_u64()).unwrap();
    assert_eq!(hottest.0, "burn_hot", "{busy_leaves:?}");

    // sysload's three sleeps: off-CPU slices of at least 100 ms each, the reason in the name,
    // where it blocked in an annotation and its stack, under the thread's process.
    let slices = summary["slices"].as_array().unwrap();
    let on_track_of = |thread: &serde_json::Value, what: &str| -> Vec<&serde_json::Value> {
        let track = tracks
            .iter()
            .find(|t| {
                t["kind"] == "named"
                    && t["name"] == format!("{} {}: {what}", thread["name"].as_str().unwrap(), thread["tid"])
            })
            .unwrap_or_else(|| panic!("no {what} track for {thread}: {tracks:?}"));
        slices.iter().filter(|s| s["track"] == track["uuid"]).collect()
    };
    let waits = on_track_of(sysload, "off-CPU");
    let sleeps: Vec<_> = waits.iter().copied().filter(|s| s["name"] == "off-CPU: sleep").collect();
    assert_eq!(sleeps.len(), 3, "{waits:?}");
    // The first sleep starts within a millisecond of the dynamic loader mapping libc, which
    // may be before sysprof has read that mapping: that one's stack may skip the function.
    let mut named = 0;
    for sleep in &sleeps {
        assert!(sleep["ns"].as_u64().unwrap() >= 100_000_000, "{sleep}");
        let stack: Vec<&str> = sleep["stack"].as_array().unwrap().iter().filter_map(|f| f.as_str()).collect();
        assert!(stack.contains(&"main") && stack.last() == Some(&"__schedule"), "{stack:?}");
        if let Some(at) = stack.iter().position(|f| *f == "sleep_in_named_function") {
            assert!(stack[..at].contains(&"main"), "{stack:?}");
            assert!(
                sleep["args"]["blocked in"].as_str().unwrap().starts_with("sleep_in_named_function"),
                "{sleep}"
            );
            named += 1;
        }
    }
    assert!(named >= 2, "{sleeps:?}");
    // ... and the system calls they were: at least as long.
    let calls: Vec<_> = on_track_of(sysload, "slow syscalls")
        .into_iter()
        .filter(|s| s["name"] == "clock_nanosleep" || s["name"] == "nanosleep")
        .collect();
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(calls.iter().all(|c| c["ns"].as_u64().unwrap() >= 100_000_000 && c["args"]["returned"] == "0"));

    // The processes' resident memory is a counter track.
    let memory: Vec<_> =
        tracks.iter().filter(|t| t["kind"] == "counter" && t["name"] == "resident memory").collect();
    assert!(!memory.is_empty(), "{tracks:?}");
    let values = &summary["counters"][memory[0]["uuid"].to_string()];
    assert!(
        values.as_array().is_some_and(|v| !v.is_empty() && v.iter().all(|x| x.as_f64().unwrap() > 0.0)),
        "{values}"
    );
}

/// sysprof rests while nothing happens: a trace of a sleeping command wakes it a few times a
/// second, not the fifty of its 20 ms tick (67 a second before it rested, with the sampler's,
/// the statistics' and the status line's wakeups). And what happens then wakes it: 500 threads
/// that wake every 10 ms after sleeping 2.5 s record some 100,000 timeline events a second (a
/// wait and a sleep call each), which fill the kernel's ring (10,922 events) faster than a
/// resting sysprof ticks (250 ms). The event that finds the ring a quarter full wakes it, and
/// nothing is lost.
#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_resting_sysprof_wakes_for_a_burst_and_loses_nothing() {
    let Some(_guard) = root_guard("a_resting_sysprof_wakes_for_a_burst_and_loses_nothing") else { return };
    let dir = output_dir();
    let mut tracing = spawn_tracing_with(
        sysprof()
            .args(["trace", "-o"])
            .arg(dir.path())
            .arg("--")
            .arg(workload("sysload"))
            .args(["tickers", "500", "1", "2.5"]),
    );
    // The threads are started and asleep well within 0.7 s; the burst begins at 2.5 s.
    let per_s = wakeups_per_second(
        tracing.child.id(),
        std::time::Duration::from_millis(700),
        std::time::Duration::from_millis(1200),
    );
    assert!(per_s < 25.0, "sysprof woke {per_s:.0} times a second while its target slept");

    let status = wait_bounded(&mut tracing.child, std::time::Duration::from_secs(120));
    assert!(status.success(), "{}", tracing.stderr());
    let report = read_report(dir.path());
    let process =
        report["sched"]["processes"].as_array().unwrap().iter().find(|p| p["name"] == "sysload").unwrap();
    // The burst was fast enough to fill the ring between two resting ticks: each switch is a
    // wait on the timeline, and its sleep call another.
    let waits = process["voluntary_switches"].as_u64().unwrap();
    assert!(waits >= 25_000, "{process:#}");
    let limitations = report["limitations"].as_array().unwrap();
    assert!(
        !limitations.iter().any(|l| l.as_str().unwrap().contains("lost in the kernel")),
        "{limitations:#?}"
    );
    assert!(dir.path().join("timeline.pftrace").is_file());
}

/// A probed function called 100,000 times, traced with room for 2,000 timeline events: once
/// the bound raises the slices' minimum past the calls' length, the programs stop sending them
/// (`names::TIMELINE_RAISED_MIN`), and the timeline's note still accounts for every call: the
/// slices it kept and those it says it left out are exactly the calls.
#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn a_bounded_timeline_accounts_for_every_call_the_kernel_did_not_send() {
    let Some(_guard) = root_guard("a_bounded_timeline_accounts_for_every_call_the_kernel_did_not_send")
    else {
        return;
    };
    const CALLS: u64 = 100_000;
    let dir = output_dir();
    let sysload = workload("sysload");
    let out = sysprof()
        .args(["trace", "-q", "--focus", "cpu", "--timeline-events", "2000", "--func"])
        .arg(format!("{}:probed_function", sysload.display()))
        .arg("-o")
        .arg(dir.path())
        .arg("--")
        .arg(&sysload)
        .args(["probecall", &CALLS.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", support::text(&out));
    let report = read_report(dir.path());
    assert_eq!(report["functions"][0]["calls"], CALLS);
    let limitations = report["limitations"].as_array().unwrap();
    let note = limitations
        .iter()
        .filter_map(|l| l.as_str())
        .find(|l| l.starts_with("the timeline was bounded"))
        .unwrap_or_else(|| panic!("no bound's note in {limitations:#?}"));
    let left_out: u64 = note
        .split("; ")
        .find_map(|part| part.split(" slices and ").next()?.replace(',', "").parse().ok())
        .unwrap_or_else(|| panic!("no count of slices in {note:?}"));
    // Before the first raise reaches the kernel, a fast machine can fill the ring between two
    // drains: those events are counted as lost (with the samples'), in neither figure above.
    let lost: u64 = limitations
        .iter()
        .filter_map(|l| {
            l.as_str()?.split_once(" timeline event").filter(|(_, rest)| rest.contains(" lost in the kernel"))
        })
        .map(|(count, _)| count.replace(',', "").parse::<u64>().unwrap())
        .sum();
    let Some(summary) = perfetto_summary(&dir.path().join("timeline.pftrace")) else { return };
    let kept = summary["slices"].as_array().unwrap().iter().filter(|s| s["name"] == "probed_function").count()
        as u64;
    assert!(kept + left_out <= CALLS && CALLS <= kept + left_out + lost, "{note}; {lost} lost");
}
