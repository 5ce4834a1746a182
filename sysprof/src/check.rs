//! `sysprof check`: what this machine supports and what sysprof can do here. The BPF checks
//! load and attach sysprof's own programs for a moment, so "ok" means the real thing works.

use std::path::Path;

use serde::Serialize;
use sysprof_common::{Config, filter};

use crate::{
    btf,
    config::{Focus, SampleEvent, Target, TraceConfig},
    kernel_memory::{Snapshot, mib},
    limits, privileges,
    probes::{MapSizes, Probes},
};

/// One finding.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    pub name: &'static str,
    /// "ok", "missing" (sysprof works without it, with less), "fail" (tracing cannot work),
    /// or "skipped" (could not be checked without privileges).
    pub status: &'static str,
    pub detail: String,
}

/// Runs every check, prints the findings, and returns the exit code: 1 when tracing cannot work.
pub fn run(json: bool, nvml_library: Option<&Path>) -> anyhow::Result<u8> {
    let mut findings = findings();
    findings.push(
        match crate::gpu::nvml::open(nvml_library, privileges::InvokingUser::from_sudo_env().as_ref()) {
            Ok(nvml) => {
                let topology = crate::gpu::nvml::topology::read(&nvml);
                let names: Vec<String> =
                    topology.devices.iter().map(|d| format!("GPU{} {}", d.index, d.name)).collect();
                Finding {
                    name: "NVML",
                    status: "ok",
                    detail: format!(
                        "{}: {}",
                        crate::report::format::count(names.len() as u64, "GPU", "GPUs"),
                        names.join(", ")
                    ),
                }
            }
            Err(line) => Finding { name: "NVML", status: "missing", detail: line },
        },
    );
    let fatal = findings.iter().any(|f| f.status == "fail");
    let mut text = String::new();
    if json {
        text = format!("{}\n", serde_json::to_string_pretty(&findings)?);
    } else {
        for finding in &findings {
            let mark = match finding.status {
                "ok" => "ok     ",
                "missing" => "missing",
                "skipped" => "skipped",
                _ => "FAIL   ",
            };
            text.push_str(&format!("{mark}  {:<22} {}\n", finding.name, finding.detail));
        }
        text.push('\n');
        text.push_str(if fatal {
            "sysprof cannot trace here: fix the FAIL lines above.\n"
        } else {
            "sysprof can trace here.\n"
        });
    }
    crate::terminal::stdout_text(&text);
    Ok(u8::from(fatal))
}

/// Every check, in the order a user fixes them.
pub fn findings() -> Vec<Finding> {
    let mut findings = vec![kernel_version(), privileges_finding(), btf_finding(), paranoid_finding()];
    findings.extend(address_space_finding());
    // From the mount table: a non-root user cannot list a tracefs mounted with mode 0700.
    let tracefs = mount_point("tracefs");
    findings.push(presence(
        "tracefs",
        tracefs.is_some(),
        &format!("mounted at {} (not needed)", tracefs.unwrap_or_default()),
        "not mounted (not needed: sysprof uses raw tracepoints, perf events and uprobes)",
    ));
    let uprobe_pmu = Path::new("/sys/bus/event_source/devices/uprobe/type").exists();
    if !uprobe_pmu {
        findings.push(Finding {
            name: "uprobes",
            status: "missing",
            detail: "no uprobe PMU: --malloc, --func and GPU probes unavailable (kernel built without \
                     CONFIG_UPROBE_EVENTS)"
                .into(),
        });
    }
    findings.push(presence(
        "kprobes",
        Path::new("/sys/bus/event_source/devices/kprobe/type").exists(),
        "kprobe PMU present",
        "absent (not needed: sysprof uses tracepoints)",
    ));
    findings.push(match crate::target::cgroup2_root() {
        Ok(root) => Finding {
            name: "cgroup v2",
            status: "ok",
            detail: match init_system() {
                None => format!("mounted at {} (--cgroup and --unit work)", root.display()),
                Some(init) => format!(
                    "mounted at {} (--cgroup works; --unit needs systemd, and pid 1 is {init})",
                    root.display()
                ),
            },
        },
        Err(_) => Finding {
            name: "cgroup v2",
            status: "missing",
            detail: "not mounted: --cgroup and --unit unavailable".into(),
        },
    });
    if privileges::can_trace() {
        findings.extend(bpf_findings(uprobe_pmu));
    } else {
        let uprobes = uprobe_pmu.then_some("uprobes");
        for name in ["BPF load", "perf events", "raw tracepoints", "hardware PMU", "BPF statistics"]
            .into_iter()
            .chain(uprobes)
        {
            findings.push(Finding {
                name,
                status: "skipped",
                detail: "needs root: run `sudo sysprof check`".into(),
            });
        }
    }
    findings
}

/// Where a filesystem of `fs_type` is mounted, from /proc/self/mountinfo.
fn mount_point(fs_type: &str) -> Option<String> {
    let mounts = procfs::process::Process::myself().and_then(|me| me.mountinfo()).ok()?;
    mounts.into_iter().find(|m| m.fs_type == fs_type).map(|m| m.mount_point.display().to_string())
}

/// `None` when systemd runs the machine (what `--unit` needs), else pid 1's name.
fn init_system() -> Option<String> {
    if Path::new("/run/systemd/system").is_dir() {
        return None;
    }
    Some(
        std::fs::read_to_string("/proc/1/comm")
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|_| "unknown".into()),
    )
}

fn presence(name: &'static str, present: bool, ok: &str, missing: &str) -> Finding {
    if present {
        Finding { name, status: "ok", detail: ok.into() }
    } else {
        Finding { name, status: "missing", detail: missing.into() }
    }
}

fn kernel_version() -> Finding {
    let release =
        std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let mut numbers = release.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse::<u32>().ok());
    let version = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    // bpf_loop (5.17) is the newest helper the programs call: the unwinder's frame loop.
    if version >= (5, 17) {
        Finding { name: "kernel", status: "ok", detail: format!("Linux {release} (>= 5.17)") }
    } else {
        Finding {
            name: "kernel",
            status: "fail",
            detail: format!(
                "Linux {release}: sysprof needs 5.17 or later (its unwinder's bpf_loop; task storage, \
                 ring buffers, CAP_BPF)"
            ),
        }
    }
}

fn privileges_finding() -> Finding {
    if privileges::can_trace() {
        Finding { name: "privileges", status: "ok", detail: "root or CAP_BPF+CAP_PERFMON".into() }
    } else {
        Finding {
            name: "privileges",
            status: "fail",
            detail: "not root and no CAP_BPF+CAP_PERFMON: run sysprof with sudo".into(),
        }
    }
}

fn btf_finding() -> Finding {
    let path = btf::vmlinux_btf_path();
    match btf::TaskOffsets::from_btf(&path) {
        Ok(_) => Finding {
            name: "BTF",
            status: "ok",
            detail: format!("{} (child processes are followed)", path.display()),
        },
        Err(error) => Finding {
            name: "BTF",
            status: "missing",
            detail: format!(
                "{error:#}: child processes started during a trace are not followed \
                 (needs a kernel with CONFIG_DEBUG_INFO_BTF=y)"
            ),
        },
    }
}

fn paranoid_finding() -> Finding {
    match privileges::perf_event_paranoid() {
        Some(level) => Finding {
            name: "perf_event_paranoid",
            status: "ok",
            detail: format!("{level} (no limit for root or CAP_PERFMON)"),
        },
        None => Finding {
            name: "perf_event_paranoid",
            status: "missing",
            detail: "no perf events in this kernel".into(),
        },
    }
}

/// Loads and attaches sysprof's own programs, then detaches them.
fn bpf_findings(uprobe_pmu: bool) -> Vec<Finding> {
    let quiet_config = Config { filter: filter::TARGETS, self_tgid: std::process::id(), ..Config::default() };
    let mut findings = Vec::new();
    let mut probes = match Probes::load(&quiet_config, MapSizes::minimal()) {
        Ok(probes) => {
            findings.push(Finding {
                name: "BPF load",
                status: "ok",
                detail: "sysprof's BPF object loads".into(),
            });
            probes
        }
        Err(error) => {
            findings.push(Finding { name: "BPF load", status: "fail", detail: format!("{error:#}") });
            return findings;
        }
    };
    findings.push(match probes.attach_cpu_sampling(SampleEvent::CpuClock, 1) {
        Ok(()) => Finding {
            name: "perf events",
            status: "ok",
            detail: "cpu-clock sampling attaches on every CPU".into(),
        },
        Err(error) => Finding { name: "perf events", status: "fail", detail: format!("{error:#}") },
    });
    findings.push(match probes.attach_process_tracking() {
        Ok(()) => Finding {
            name: "raw tracepoints",
            status: "ok",
            detail: "process fork/exec/exit programs attach".into(),
        },
        Err(error) => Finding { name: "raw tracepoints", status: "fail", detail: format!("{error:#}") },
    });
    findings.push(match probes.attach_page_faults() {
        Ok(()) => Finding {
            name: "page-fault events",
            status: "ok",
            detail: "minor and major fault programs attach on every CPU".into(),
        },
        Err(error) => Finding { name: "page-fault events", status: "fail", detail: format!("{error:#}") },
    });
    if uprobe_pmu {
        findings.push(match attach_own_uprobe(&mut probes) {
            Ok(()) => Finding {
                name: "uprobes",
                status: "ok",
                detail: if probes.multi_uprobes() {
                    "a uprobe attaches, as a multi-uprobe link (--malloc, --func and GPU probes work, a \
                     library's functions in one link)"
                } else {
                    "a uprobe attaches, as a perf-event uprobe (--malloc, --func and GPU probes work, a \
                     link per function: Linux 6.6 makes one link of a library's)"
                }
                .into(),
            },
            Err(error) => Finding {
                name: "uprobes",
                status: "missing",
                detail: format!("{error:#}: --malloc, --func and GPU probes will not attach"),
            },
        });
    }
    findings.push(if probes.stats_available() {
        Finding {
            name: "BPF statistics",
            status: "ok",
            detail: "run time of each program is measured".into(),
        }
    } else {
        Finding {
            name: "BPF statistics",
            status: "missing",
            detail: "the report cannot give BPF program run times".into(),
        }
    });
    probes.detach().wait();
    findings.push(
        match Probes::load(&quiet_config, MapSizes::minimal())
            .and_then(|mut p| p.attach_cpu_sampling(SampleEvent::Cycles, 1).map(|()| p))
        {
            Ok(probes) => {
                probes.detach().wait();
                Finding { name: "hardware PMU", status: "ok", detail: "--event cycles available".into() }
            }
            Err(_) => Finding {
                name: "hardware PMU",
                status: "missing",
                detail: "no cycles event (usual in VMs): sampling uses cpu-clock".into(),
            },
        },
    );
    findings.push(kernel_memory_finding(&quiet_config));
    findings
}

/// What a default trace pins in kernel memory here, and a `--focus cpu` one: measured by loading
/// the object with their maps' sizes (the kernel's accounting of them, as the report gives it).
fn kernel_memory_finding(config: &Config) -> Finding {
    let measure = |trace: &TraceConfig| -> anyhow::Result<u64> {
        let probes = Probes::load(config, MapSizes::for_config(trace, false))?;
        let bytes = Snapshot::take().summary().total();
        drop(probes);
        Ok(bytes)
    };
    let default = TraceConfig::new(Target::All);
    let cpu_only = TraceConfig { focus: vec![Focus::Cpu], ..default.clone() };
    let bytes = match measure(&default) {
        Ok(bytes) => bytes,
        Err(error) => {
            // Tracing works here, with less, when the smallest trace fits.
            let smallest = TraceConfig { stack_storage_size: 1024, unwind_memory_mib: 0, ..cpu_only };
            let needed = crate::kernel_memory::estimate(&MapSizes::for_config(&smallest, false));
            let fits =
                limits::memory_cgroup().is_none_or(|cgroup| limits::leaves_room(needed, cgroup.room()));
            return Finding {
                name: "kernel memory",
                status: if fits { "missing" } else { "fail" },
                detail: format!("a default trace cannot load here: {error:#}"),
            };
        }
    };
    let cpu =
        measure(&cpu_only).map(|bytes| format!(", {} MiB with --focus cpu", mib(bytes))).unwrap_or_default();
    let cgroup = match limits::memory_cgroup() {
        Some(cgroup) => format!(
            "; sysprof's memory cgroup {} allows {} MiB, {} MiB of it in use",
            cgroup.dir.display(),
            cgroup.limit >> 20,
            mib(cgroup.usage)
        ),
        None => String::new(),
    };
    Finding {
        name: "kernel memory",
        status: "ok",
        detail: format!(
            "a default trace pins {} MiB in its BPF maps here{cpu} (--stack-storage-size and --unwind-memory \
             lower it){cgroup}",
            mib(bytes)
        ),
    }
}

/// The address-space limit (`ulimit -v`), when there is one.
fn address_space_finding() -> Option<Finding> {
    let limit = limits::address_space_limit()?;
    Some(match limits::check_address_space() {
        Ok(()) => Finding {
            name: "address space",
            status: "ok",
            detail: format!(
                "ulimit -v {} KiB leaves a trace room",
                crate::report::format::thousands(limit / 1024)
            ),
        },
        Err(error) => Finding { name: "address space", status: "fail", detail: error.to_string() },
    })
}

/// Attaches the call programs to a function of sysprof's own, as `--func` would.
fn attach_own_uprobe(probes: &mut Probes) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let exe = std::env::current_exe().context("locating sysprof's own binary")?;
    let symbol = "sysprof_probe_calibration";
    let offset = *crate::uprobes::elf::exported_functions(&exe)?
        .get(symbol)
        .with_context(|| format!("sysprof's binary lost its symbol {symbol} (stripped?)"))?;
    let exe = crate::uprobes::Binary::open(&exe, None)?;
    probes.attach_calls(&exe, &[(offset, u64::from(crate::uprobes::calibrate::CALIBRATION_ID))]).map(drop)
}
