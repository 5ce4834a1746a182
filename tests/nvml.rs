//! GPU metrics from NVML. NVML cannot exist on these machines (no driver, no GPU), so these
//! tests load a test double of libnvidia-ml (tests/doubles/nvml_double.c: two scripted GPUs)
//! through --nvml-lib, and check the polling cadence, the tables, the JSON series, and that
//! without NVML everything else still works.

mod support;

use std::process::Command;

use serde_json::Value;
use support::*;

fn device<'a>(report: &'a Value, table: &str, index: u64) -> &'a Value {
    report["gpu_metrics"][table]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == index)
        .unwrap_or_else(|| panic!("no GPU {index} in {table}: {:#}", report["gpu_metrics"]))
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn polls_the_nvml_double_and_reports_every_table() {
    let Some(_guard) = root_guard("polls_the_nvml_double_and_reports_every_table") else { return };
    let nvml = gpu_doubles().join("libnvidia-ml.so.1");
    let busy = Background::spawn(Command::new(workload("busy")).arg("20"));
    let dir = output_dir();
    let log = dir.path().join("polls.log");
    let out = sysprof()
        .env("NVML_DOUBLE_PID", busy.pid().to_string())
        .env("NVML_DOUBLE_LOG", &log)
        .args([
            "trace",
            "-q",
            "--focus",
            "gpu",
            "--gpu-interval",
            "100ms",
            "-d",
            "1.5",
            "--pid",
            &busy.pid().to_string(),
        ])
        .arg("--nvml-lib")
        .arg(&nvml)
        .arg("-o")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let report = read_report(dir.path());

    // Cadence: about one poll per 100 ms over 1.5 s, as the double itself counted them.
    let gpu0 = device(&report, "devices", 0);
    let samples = gpu0["samples"].as_u64().unwrap();
    assert!((12..=18).contains(&samples), "{samples} polls of GPU 0 in 1.5 s at 100 ms");
    let polls = std::fs::read_to_string(&log).unwrap().lines().count() as u64;
    assert_eq!(polls, samples, "the double saw every poll sysprof reports");
    let times: Vec<u64> = report["gpu_metrics"]["series"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["device"] == 0)
        .map(|s| s["t_ms"].as_u64().unwrap())
        .collect();
    let mut gaps: Vec<u64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort_unstable();
    let median = gaps[gaps.len() / 2];
    assert!((80..=130).contains(&median), "median gap between polls {median} ms: {times:?}");

    // The scripted values, in the compute, memory and link tables.
    assert_eq!(gpu0["sm_util_mean"], 85.0);
    assert_eq!(gpu0["power_mean_w"], 300.0);
    assert_eq!(gpu0["throttle_reasons"], serde_json::json!(["software power cap"]));
    assert_eq!(device(&report, "devices", 1)["sm_util_max"], 2);
    let memory = device(&report, "memory", 0);
    assert_eq!(memory["reserved_max"], 60u64 << 30);
    assert_eq!(memory["target_processes_max"], 10u64 << 30, "the target's own GPU memory");
    let rx = report["gpu_metrics"]["links"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["device"] == 0 && l["link"] == "PCIe RX")
        .unwrap();
    assert!((rx["mean_gb_s"].as_f64().unwrap() - 4.096).abs() < 1e-9, "{rx}");
    assert!((rx["peak_gb_s"].as_f64().unwrap() - 31.504).abs() < 1e-9, "gen4 x16: {rx}");
    assert_eq!(report["gpu_metrics"]["topology"]["matrix"][0][1], "NV4");

    let titles: Vec<&str> =
        report["recommendations"].as_array().unwrap().iter().map(|r| r["title"].as_str().unwrap()).collect();
    assert!(titles.contains(&"GPU 1 sat idle"), "{titles:?}");
    // Memory, not time: said in the GPU memory section, not ranked with the seconds.
    assert!(!titles.iter().any(|t| t.contains("unbalanced")), "{titles:?}");
    let markdown = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    assert!(markdown.contains("**Memory is unbalanced across devices**: GPU 0 holds 60.0 GiB"), "{markdown}");
    for heading in [
        "### GPU compute (NVML, every 100 ms)",
        "### GPU memory: reserved (NVML) vs allocated (traced)",
        "### GPU links",
        "### GPU topology",
    ] {
        assert!(markdown.contains(heading), "missing {heading}");
    }

    // On the timeline: a counter track per device and metric, a value per poll.
    if let Some(timeline) = perfetto_summary(&dir.path().join("timeline.pftrace")) {
        let tracks = timeline["tracks"].as_array().unwrap();
        let sm = tracks
            .iter()
            .find(|t| t["kind"] == "counter" && t["name"] == "GPU 0 SM utilization (%)")
            .unwrap_or_else(|| panic!("no SM utilization track: {tracks:?}"));
        let values: Vec<f64> = timeline["counters"][sm["uuid"].to_string()]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(values.len() as u64, samples);
        assert!((values.iter().sum::<f64>() / values.len() as f64 - 85.0).abs() < 1e-9, "{values:?}");
        assert!(tracks.iter().any(|t| t["name"] == "GPU 1 memory used"), "{tracks:?}");
    }
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn nvml_joins_the_traced_allocations() {
    let Some(_guard) = root_guard("nvml_joins_the_traced_allocations") else { return };
    let doubles = gpu_doubles();
    let dir = output_dir();
    let out = sysprof()
        .env("LD_LIBRARY_PATH", &doubles)
        .args(["trace", "-q", "--focus", "gpu", "--nvml-lib"])
        .arg(doubles.join("libnvidia-ml.so.1"))
        .arg("-o")
        .arg(dir.path())
        .arg("--")
        .arg(gpu_app())
        .arg("success")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let report = read_report(dir.path());
    let memory = device(&report, "memory", 1);
    assert_eq!(
        (memory["allocated"].as_u64(), memory["allocated_peak"].as_u64()),
        (Some(3 << 20), Some(67 << 20))
    );
    assert_eq!(memory["reserved_max"], 4u64 << 30);
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn without_nvml_one_line_and_everything_else_works() {
    let Some(_guard) = root_guard("without_nvml_one_line_and_everything_else_works") else { return };
    let dir = output_dir();
    let out = sysprof()
        .args(["trace", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1", "-o"])
        .arg(dir.path())
        .arg("--")
        .arg(workload("busy"))
        .arg("1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let nvml_lines: Vec<&str> = stderr.lines().filter(|l| l.contains("NVML")).collect();
    assert_eq!(nvml_lines.len(), 1, "{stderr}");
    assert!(
        nvml_lines[0].starts_with("sysprof: NVML not available (/nonexistent/libnvidia-ml.so.1"),
        "{stderr}"
    );
    assert!(nvml_lines[0].ends_with("): GPU metrics disabled"), "{stderr}");
    let report = read_report(dir.path());
    assert!(report["gpu_metrics"].is_null());
    assert!(self_weight(&read_folded(&dir.path().join("cpu.folded")), "burn_hot") > 30);
}

#[test]
fn topo_prints_the_matrix_and_link_peaks() {
    let nvml = gpu_doubles().join("libnvidia-ml.so.1");
    let out = sysprof().arg("topo").arg("--nvml-lib").arg(&nvml).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("GPU0   X     NV4"), "{stdout}");
    assert!(
        stdout.contains("PCIe gen4 x16 (max gen5 x16): 31.5 GB/s per direction; 4 NVLinks: 100 GB/s"),
        "{stdout}"
    );
    let out = sysprof().args(["topo", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NVML not available"));
    let out = sysprof().args(["check", "--json", "--nvml-lib"]).arg(&nvml).output().unwrap();
    let findings: Value = serde_json::from_slice(&out.stdout).unwrap();
    let finding = findings.as_array().unwrap().iter().find(|f| f["name"] == "NVML").unwrap();
    assert_eq!(finding["status"], "ok");
    assert_eq!(finding["detail"], "2 GPUs: GPU0 Test Double GPU 0, GPU1 Test Double GPU 1");
}
