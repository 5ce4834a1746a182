//! The command line as a user meets it: help text (golden files), usage errors, `sysprof check`.

mod support;

use std::path::Path;

use support::*;

fn assert_golden(name: &str, actual: &str) {
    support::assert_golden(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden").join(name), actual);
}

#[test]
fn help_texts_match_their_golden_files() {
    for (args, golden) in [(&["--help"][..], "help.txt"), (&["trace", "--help"][..], "trace-help.txt")] {
        let out = run_sysprof(args);
        assert!(out.status.success(), "{}", text(&out));
        assert_golden(golden, &String::from_utf8_lossy(&out.stdout));
    }
}

#[test]
fn trace_without_a_target_says_what_it_needs() {
    let out = run_sysprof(&["trace"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("sysprof trace needs a target: --pid PID, --all"), "{stderr}");
    assert!(stderr.contains("sudo sysprof trace -- ./train.py"), "examples follow: {stderr}");
}

#[test]
fn report_of_a_run_without_its_readout_names_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_sysprof(&["report", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("has no readout.json") && stderr.contains("--save-readout"), "{stderr}");
}

#[test]
fn bad_arguments_are_usage_errors() {
    for args in [
        &["trace", "--all", "--pid", "1"][..],
        &["trace", "--all", "--freq", "0"],
        &["trace", "--all", "-d", "soon"],
        &["trace", "--all", "-d", "0s"],
        &["trace", "--all", "--memory-interval", "1ms"],
        &["trace", "--comm", ""],
        &["trace", "--all", "--stack-storage-size", "1048576"],
        &["trace", "--all", "--malloc", "--focus", "cpu"],
    ] {
        let out = run_sysprof(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.starts_with("error: "), "{args:?}: one line that says error: {stderr}");
    }
}

#[test]
#[ignore = "needs root: `cargo xtask test` runs it as root"]
fn check_reports_what_this_machine_can_do() {
    let Some(_guard) = root_guard("check_reports_what_this_machine_can_do") else { return };
    let out = run_sysprof(&["check"]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in [
        "ok       kernel",
        "ok       privileges",
        "ok       BPF load",
        "ok       perf events",
        "ok       raw tracepoints",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
    assert!(stdout.trim_end().ends_with("sysprof can trace here."), "{stdout}");
    let json = run_sysprof(&["check", "--json"]);
    let findings: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(findings.as_array().unwrap().iter().any(|f| f["name"] == "uprobes"));
    assert_no_sysprof_programs();
}

/// The memory section of the golden report: a process with a heap, a GPU, a range copied again.
fn memory_section() -> sysprof::memory::report::MemoryReport {
    use sysprof::memory::{
        heap::{EntriesStepped, ProbedAllocator},
        profiles::{AllocSite, FaultSite},
        redundancy::{CopiedRange, HostEvidence},
        report::*,
        usage::MemorySample,
    };
    let sample = |t_ms, rss_anon| MemorySample {
        t_ms,
        rss_anon,
        rss_file: 4 << 20,
        rss_shmem: 0,
        rss_peak: 300 << 20,
        vm_size: 1 << 30,
        swap: 0,
    };
    MemoryReport {
        interval_ms: 250,
        overview: vec![
            OverviewRow {
                side: Side::Cpu,
                what: "busy (4242)".into(),
                allocated: Some(10 << 20),
                reserved: Some(200 << 20),
                peak: Some(300 << 20),
                on_both_sides: 2 << 20,
                recopied: 8 << 20,
                minor_faults: Some(51_200),
                major_faults: Some(3),
            },
            OverviewRow {
                side: Side::Gpu,
                what: "GPU 0".into(),
                allocated: Some(2 << 20),
                reserved: None,
                peak: Some(3 << 20),
                on_both_sides: 2 << 20,
                recopied: 0,
                minor_faults: None,
                major_faults: None,
            },
        ],
        processes: vec![ProcessMemory {
            pid: 4242,
            name: "busy".into(),
            rss_max: sample(1000, 280 << 20),
            end: sample(3000, 196 << 20),
            swap_max: 0,
            minor_faults: 51_200,
            major_faults: 3,
            faults_per_s: 17_067.0,
            address_space: Some(AddressSpaceChanges {
                mmap_calls: 12,
                mmap_bytes: 36 << 20,
                munmap_calls: 10,
                munmap_bytes: 30 << 20,
                brk_calls: 4,
                brk_grow_bytes: 528 << 10,
                ..AddressSpaceChanges::default()
            }),
            heap: Some(Heap {
                allocations: 4050,
                frees: 4000,
                bytes: 9_304_800,
                allocations_per_s: 1350.0,
                live: 204_800,
                peak_live: 215_000,
                size_p50: 1000,
                size_p99: 5000,
                size_max: 5000,
                untracked_frees: 0,
                sizes: vec![SizeBin { below: 1024, count: 2000 }, SizeBin { below: 8192, count: 2050 }],
            }),
            series: vec![],
        }],
        fault_sites: vec![FaultSite {
            pid: 4242,
            process: "busy".into(),
            site: "touch_pages (busy)".into(),
            faults: 50_000,
            share: 0.98,
        }],
        heap: Some(HeapReport {
            allocators: vec![ProbedAllocator {
                allocator: "glibc".into(),
                path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
                functions: vec!["malloc".into(), "calloc".into(), "realloc".into(), "free".into()],
                entry_stepped: EntriesStepped { malloc: Some(false), free: Some(true) },
            }],
            sites: vec![AllocSite {
                pid: 4242,
                process: "busy".into(),
                site: "allocate_known_sizes (busy)".into(),
                allocations: 4000,
                bytes: 9_100_000,
                live_bytes: 0,
            }],
            probe_cost: Some(HeapProbeCostReport {
                ns_per_allocation: 1500.0,
                allocations: 4050,
                ns_per_free: 6900.0,
                frees: 4000,
                hits: 8050,
                added_s: 0.0337,
                malloc_stepped: Some(false),
                free_stepped: Some(true),
            }),
        }),
        copied_ranges: vec![CopiedRange {
            pid: 4242,
            host: 0x7f00_0000_0000,
            bytes: 2 << 20,
            copies: 5,
            device: Some(0),
            device_allocated: true,
            host_evidence: HostEvidence::PinnedAllocation,
            on_both_sides: true,
            recopied: 8 << 20,
            call_site: "upload_constant_input (busy)".into(),
        }],
        address_space_rest: None,
    }
}

/// A report built by hand: the Markdown rendering of every section, pinned by a golden file.
#[test]
fn the_markdown_report_matches_its_golden_file() {
    use sysprof::{
        config::SampleEvent,
        cpu::{CpuSection, Hotspot, ProcessShare},
        probes::{AttachedProbe, DetachReport, ProgramCost},
        report::*,
    };
    let report = Report {
        sysprof_version: "0.1.0".into(),
        run: RunSummary {
            target: "command `./busy 3`".into(),
            host: String::new(),
            rank: None,
            command: Some(vec!["./busy".into(), "3".into()]),
            started_at: "2026-11-30T03:39:21Z".into(),
            duration_s: 3.004,
            ended_by: "command exit".into(),
            command_status: Some("exit status 0".into()),
            event: SampleEvent::CpuClock,
            frequency_hz: 99,
            cpus: 2,
            machine_busy_share: Some(0.52),
            target_time_s: 3.004,
            target_time: "the command's wall time".into(),
            samples: 297,
            lost: Lost { user_stacks: 2, ..Lost::default() },
            outputs: vec!["cpu.folded".into(), "cpu.svg".into(), "report.md".into(), "report.json".into()],
            unwind: None,
        },
        sections: Sections::new(vec![
            Box::new(CpuSection {
                processes: vec![ProcessShare { pid: 4242, name: "busy".into(), weight: 297, share: 1.0 }],
                hotspots: vec![
                    Hotspot {
                        function: "burn_hot".into(),
                        module: "busy".into(),
                        self_weight: 229,
                        self_share: 229.0 / 297.0,
                        total_weight: 229,
                        total_share: 229.0 / 297.0,
                    },
                    Hotspot {
                        function: "main".into(),
                        module: "busy".into(),
                        self_weight: 0,
                        self_share: 0.0,
                        total_weight: 297,
                        total_share: 1.0,
                    },
                ],
                probe_samples: 3,
                cpu_s: 3.0,
            }),
            Box::new(sysprof::sched::SchedReport {
                processes: vec![sysprof::sched::ProcessSched {
                    pid: 4242,
                    name: "busy".into(),
                    threads: 2,
                    cpu_time_s: 2.9,
                    wall_s: 3.0,
                    utilization: 0.97,
                    voluntary_switches: 12,
                    involuntary_switches: 300,
                    voluntary_per_s: 4.0,
                    involuntary_per_s: 100.0,
                    runq_latency: Some(sysprof::latency::Percentiles {
                        count: 300,
                        total_ns: 3_000_000,
                        p50_ns: 8_000,
                        p90_ns: 20_000,
                        p99_ns: 1_500_000,
                        max_ns: 4_000_000,
                    }),
                    offcpu_s: 0.1,
                    stolen_s: 0.0,
                    offcpu_by_reason: vec![sysprof::sched::ReasonTime {
                        reason: "preempted".into(),
                        seconds: 0.1,
                    }],
                    top_threads: vec![sysprof::sched::ThreadRow {
                        tid: 4243,
                        name: "worker".into(),
                        cpu_time_s: 1.5,
                        utilization: 0.5,
                        voluntary_switches: 6,
                        involuntary_switches: 150,
                        offcpu_s: 0.05,
                        stolen_s: 0.0,
                    }],
                }],
                utilization: 0.97,
                top_offcpu: vec![sysprof::sched::OffCpuStack {
                    pid: 4242,
                    process: "busy".into(),
                    reason: "preempted".into(),
                    seconds: 0.1,
                    blocked_in: Some("burn_hot".into()),
                    frames: vec!["main".into(), "burn_hot".into(), "schedule".into(), "__schedule".into()],
                }],
                ..Default::default()
            }),
            Box::new(sysprof::syscalls::SyscallReport {
                rows: vec![sysprof::syscalls::SyscallRow {
                    pid: 4242,
                    process: "busy".into(),
                    syscall: "close".into(),
                    nr: 3,
                    calls: 5002,
                    calls_per_s: 1667.3,
                    timed: 5002,
                    timed_from_block: 0,
                    errors: 5000,
                    errnos: vec![sysprof::syscalls::ErrnoCount { errno: "EBADF".into(), count: 5000 }],
                    latency: sysprof::latency::Percentiles {
                        count: 5002,
                        total_ns: 1_000_000,
                        p50_ns: 200,
                        p90_ns: 216,
                        p99_ns: 248,
                        max_ns: 20_600,
                    },
                    share_of_wall: 0.0003,
                }],
                calls: 5002,
                timed: 5002,
                errors: 5000,
                total_ns: 1_000_000,
                lost: 0,
                unattributed: 0,
            }),
            Box::new(memory_section()),
        ]),
        recommendations: vec![Recommendation {
            seconds: 1.16,
            impact: 0.386,
            title: "Optimize burn_hot (busy)".into(),
            evidence: "77.1% of on-CPU samples are in its own code".into(),
            action: "Start here".into(),
        }],
        overhead: Overhead {
            programs: vec![ProgramCost {
                program: "cpu_sample".into(),
                run_count: 594,
                run_time_ns: 1_528_000,
            }],
            bpf_time_ns: 1_528_000,
            bpf_cpu_share: 0.000254,
            sysprof_cpu_s: 0.21,
            sysprof_peak_rss_kib: 55904,
            kernel_memory: Some(sysprof::kernel_memory::KernelMemory {
                map_bytes: 66_759_288,
                maps: 68,
                program_bytes: 4096,
                programs: 1,
                largest: vec![sysprof::kernel_memory::MapMemory {
                    name: "CPU_STACKS".into(),
                    bytes: 17_039_680,
                }],
            }),
            bpf_stats_available: true,
            bpf_stats_coverage: 0.25,
        },
        limitations: vec!["2 events were lost in the kernel".into()],
        instrumentation: Instrumentation {
            files_modified: vec![],
            probes: vec![AttachedProbe {
                program: "cpu_sample".into(),
                kind: "perf_event".into(),
                attached_to: "cpu-clock at 99 Hz on CPUs 0-1".into(),
                links: 2,
                program_id: 8,
            }],
            detach: DetachReport { programs: 1, still_attached: vec![] },
        },
    };
    assert_golden("report.md", &sysprof::output::render_markdown(&report));
}
