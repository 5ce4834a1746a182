//! The stages after collection, in order: read the kernel's maps out through every family,
//! start the detach (proving nothing is left), analyze (`analysis.rs`), then write every output
//! and say what was written.

use std::path::{Path, PathBuf};

use crate::{
    analysis::{self, Analyzed},
    collect::{EndReason, UprobeTracers},
    families,
    launch::{self, CommandEnd},
    output::{self, Artifact, OutputDir, Rendered, ToWrite},
    probes::Probes,
    procs::ProcessTable,
    readout::MapReader,
    recording::{self, Recording, ReportProps, RunFacts},
    report::{self, Report, format::thousands},
    symbolize::{Symbolizer, Symbols},
    terminal::{say, stderr_line},
};

/// How a trace ended, for the caller and the exit code.
#[derive(Clone, Debug)]
pub struct TraceOutcome {
    /// 0, or the command's exit code for `-- CMD` (128 + signal when it was killed).
    pub exit_code: u8,
    pub output_dir: PathBuf,
    /// Files written, relative to `output_dir`.
    pub files: Vec<String>,
    pub samples: u64,
    pub lost: u64,
}

/// What the collect stage hands over: the loaded probes, the process table, the uprobe
/// tracers and the measurements taken while the trace ran.
pub(crate) struct Results {
    pub props: ReportProps,
    pub probes: Probes,
    pub processes: ProcessTable,
    pub output: OutputDir,
    pub limitations: Vec<String>,
    pub end: crate::collect::TraceEnd,
    pub tracers: UprobeTracers,
    /// What the timeline kept, when it was on.
    pub timeline: Option<crate::timeline::Timeline>,
    /// NVML polls and the topology, when NVML was there.
    pub nvml_samples: Option<(Vec<crate::gpu::nvml::Sample>, crate::gpu::nvml::topology::Topology)>,
}

impl Results {
    pub(crate) fn deliver(self) -> anyhow::Result<TraceOutcome> {
        let Results {
            props,
            probes,
            mut processes,
            mut output,
            mut limitations,
            mut end,
            tracers,
            timeline,
            nvml_samples,
        } = self;
        let mut probes = probes;
        let (started_at, elapsed) = (end.started_at, end.elapsed);
        // Read everything, then start detaching: the probes go before the slow stages
        // (symbolization), and the detach is verified before the report is written.
        let mut families = families::enabled(&props);
        let gpu_state = tracers.gpu.as_ref().map(|gpu| &gpu.state);
        let mut maps = MapReader::live(&probes, props.save_readout);
        let shared = analysis::read(&mut maps, &props, &mut families, gpu_state, timeline.as_ref())?;
        // Named while the program that names them is loaded (`ksyms.rs`); /proc/kallsyms is
        // read later only for what this could not name.
        let kernel_addresses = maps.kernel_addresses();
        let maps = maps.into_contents();
        let kernel_frames = probes.kernel_frames(&kernel_addresses).unwrap_or_default();
        let stats_available = probes.stats_available();
        // After the read-out, so that none of the calibration's runs is in a figure.
        let (probe_cost_ns, heap_probe_cost_ns) =
            calibrate_probes(&mut probes, &mut limitations, props.quiet);
        let attached = probes.attached().to_vec();
        let files_changed = probes.probed_files_changed();
        let detach = probes.detach();
        processes.final_scan();
        for pid in analysis::processes(&families) {
            processes.ensure(pid);
        }

        limitations.extend(tracer_limitations(props.quiet, &tracers));
        let (command_status, exit_code) = match &end.command {
            Some(command) => {
                let (text, code) = describe_end(command, &end.ended_by);
                (Some(text), code)
            }
            None => (None, 0),
        };
        let (gpu_state, outcome) = tracers.into_outcome();
        // Before the analysis, which adds processes it symbolizes (sysprof's own, for one).
        let snapshot: Vec<_> = match props.save_readout {
            true => processes.iter().map(|(pid, record)| (pid, record.clone())).collect(),
            false => Vec::new(),
        };
        let mut recording = Recording {
            format: recording::FORMAT,
            run: RunFacts {
                host: crate::push::hostname(),
                rank: crate::push::rank(),
                started_at: humantime::format_rfc3339_seconds(end.started_at).to_string(),
                elapsed: end.elapsed,
                end_ns: end.end_ns,
                ended_by: end.ended_by.describe(),
                command_status,
                exit_code,
                sysprof_pid: std::process::id(),
                cpus: aya::util::online_cpus().map(|cpus| cpus.len() as u32).unwrap_or(1),
                machine_busy_share: end.machine_busy_share,
                stats_coverage: end.stats_coverage,
                probe_cost_ns,
                heap_probe_cost_ns,
                own_usage: None,
                unwind: end.unwind.clone(),
            },
            props,
            maps,
            processes: snapshot,
            memory_interval: processes.memory_interval(),
            symbols: Symbols::default(),
            build_ids: Default::default(),
            calls: outcome,
            timeline,
            nvml: nvml_samples,
            costs: std::mem::take(&mut end.costs),
            stats_available,
            attached,
            files_changed,
            detach: None,
            limitations,
        };

        let mut symbolizer = if recording.props.save_readout {
            Symbolizer::new().keeping_answers()
        } else {
            Symbolizer::new()
        };
        symbolizer.know_kernel(kernel_frames);
        let Analyzed { mut report, mut files, cpu_samples, build_ids } = analysis::analyze(
            &recording,
            families,
            shared,
            &mut processes,
            gpu_state.as_ref(),
            &mut symbolizer,
        )?;
        let detach = detach.wait();
        report.instrumentation.detach = detach.clone();
        if recording.props.save_readout {
            recording.detach = Some(detach);
            recording.run.own_usage =
                Some((report.overhead.sysprof_cpu_s, report.overhead.sysprof_peak_rss_kib));
            recording.symbols = symbolizer.answers().clone();
            recording.build_ids = build_ids;
            files.push(Rendered { name: recording::FILE_NAME.into(), bytes: recording.to_json()? });
        }
        // The report and the rendered files are all that is written from here: the read-out,
        // the symbols and the process table go before the report is rendered.
        drop((symbolizer, processes));
        let Recording { props, run, .. } = recording;
        let quiet = props.quiet;
        let exit_code = run.exit_code;
        let pprofs: Vec<(String, Vec<u8>)> = match &props.push {
            Some(_) => files
                .iter()
                .filter(|f| f.name.ends_with(".pb.gz"))
                .map(|f| (f.name.clone(), f.bytes.clone()))
                .collect(),
            None => Vec::new(),
        };
        let (report, written) = write_all(&mut output, report, files)?;
        if let Some(push) = &props.push {
            push_profiles(push, &pprofs, started_at, elapsed, props.frequency_hz, quiet);
        }
        let removed = output.remove_stale(&written.written);

        if !quiet {
            print_summary(&output, &written, &removed, &report, cpu_samples);
        }
        // Said even with --quiet: results that are missing are never a quiet matter.
        let mut reasons: Vec<&str> = written.failed.iter().map(|(_, reason)| reason.as_str()).collect();
        reasons.sort_unstable();
        reasons.dedup();
        for reason in reasons {
            let names: Vec<&str> =
                written.failed.iter().filter(|(_, r)| r == reason).map(|(name, _)| name.as_str()).collect();
            stderr_line(format_args!(
                "error: could not write {} in {}: {reason}; free space there or choose another directory with -o DIR",
                names.join(", "),
                output.path().display()
            ));
        }
        let exit_code = if written.failed.is_empty() || exit_code != 0 { exit_code } else { 1 };
        Ok(TraceOutcome {
            exit_code,
            output_dir: output.path().to_path_buf(),
            files: written.written,
            samples: report.run.samples,
            lost: report.run.lost.total(),
        })
    }
}

/// What one hit of the call probes (GPU APIs, `--func`) and of the heap probes costs the
/// target, measured on sysprof's own calibration functions, for the families whose probes
/// were attached. Measured at the end rather than the start: the call programs' loading and
/// the probes' attach and detach (about 100 ms a uprobe) then stay out of the start, and a
/// run that probed no call pays nothing.
fn calibrate_probes(
    probes: &mut Probes,
    limitations: &mut Vec<String>,
    quiet: bool,
) -> (Option<f64>, Option<f64>) {
    let attached =
        |program: &str| probes.attached().iter().any(|probe| Probes::is_program(&probe.program, program));
    let (calls, heap) = (attached("call_enter"), attached("alloc_enter"));
    let mut failed = |what: &str, error: anyhow::Error| {
        let line = format!("the cost of {what} could not be measured: {error:#}");
        if !quiet {
            say!("{line}");
        }
        limitations.push(line);
        None
    };
    let call_cost = match calls.then(|| crate::uprobes::calibrate::measure_probe_cost(probes)) {
        Some(Ok(ns)) => Some(ns),
        Some(Err(error)) => failed("a probe hit", error),
        None => None,
    };
    let heap_cost = match heap.then(|| crate::memory::heap::measure_probe_cost(probes)) {
        Some(Ok(ns)) => Some(ns),
        Some(Err(error)) => failed("an allocator probe hit", error),
        None => None,
    };
    (call_cost, heap_cost)
}

/// Sends the pprof profiles to the `--push` server, after the local files are written: a
/// failure is one line, and neither the files nor the exit code depend on it.
fn push_profiles(
    push: &recording::PushProps,
    pprofs: &[(String, Vec<u8>)],
    started_at: std::time::SystemTime,
    elapsed: std::time::Duration,
    frequency_hz: u64,
    quiet: bool,
) {
    let series =
        crate::push::Series::of(&push.service, push.pid, started_at, started_at + elapsed, frequency_hz);
    match crate::push::send(&push.url, pprofs, &series) {
        Ok(lines) if !quiet => lines.iter().for_each(|line| say!("sysprof: {line}")),
        Ok(_) => {}
        Err(error) => stderr_line(format_args!(
            "sysprof: could not push the profiles to {}: {error}; the local files are kept",
            push.url
        )),
    }
}

/// `sysprof report DIR`: renders a saved run (DIR/readout.json) again with this sysprof's
/// analysis, keeping only the `focus` families when given, into `output` (default DIR), as
/// the invoking user through sudo. The exit code: 0, or 1 when a file could not be written.
pub fn rerender(dir: &Path, output: Option<&Path>, focus: &[crate::config::Family]) -> anyhow::Result<u8> {
    let path = dir.join(recording::FILE_NAME);
    // Through sudo, read as the user: the read-out is theirs, never root's to open for them.
    let user = crate::privileges::InvokingUser::from_sudo_env();
    let read = crate::privileges::as_user(user.as_ref(), || std::fs::read(&path)).and_then(|read| read);
    let bytes = match read {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => anyhow::bail!(
            "{} has no {}: `sysprof report` renders runs traced with --save-readout; trace again with it",
            dir.display(),
            recording::FILE_NAME
        ),
        Err(error) => anyhow::bail!("reading {}: {error}", path.display()),
    };
    let (report, mut files) = crate::analysis::replay_keeping(&bytes, focus)?;
    let mut out = OutputDir::prepare(output.unwrap_or(dir), user)?;
    // The read-out stays where it is; a copy goes with the files rendered elsewhere.
    if output.is_some_and(|o| o != dir) {
        files.push(Rendered { name: recording::FILE_NAME.into(), bytes });
    }
    let (report, written) = write_all(&mut out, report, files)?;
    let removed = out.remove_stale(&written.written);
    print_summary(&out, &written, &removed, &report, report.run.samples);
    Ok(if written.failed.is_empty() { 0 } else { 1 })
}

/// Writes the report first (on a full disk it is what must survive), then the folded stacks,
/// then the flamegraphs. Files that will not fit in the room the disk has are left out before
/// anything is written, so the report, written first, already says which; a write that fails
/// anyway gets the report written again, as far as the disk allows (each file is replaced
/// whole or not at all, so the first report stays intact).
fn write_all(
    output: &mut OutputDir,
    mut report: Report,
    mut profiles: Vec<Rendered>,
) -> anyhow::Result<(Report, output::Written)> {
    profiles.sort_by_key(|file| file.name.ends_with(".svg"));
    // (file, why it was not written), as `Written::failed` has them.
    let mut skipped: Vec<(String, String)> = Vec::new();
    if let Some((free, block)) = output.room() {
        let on_disk = |bytes: usize| (bytes as u64).div_ceil(block).max(1) * block;
        // The report as it is now, and room for the lines this adds to it.
        let reports: u64 = output::render(&Artifact::Report(&report))?
            .iter()
            .map(|f| f.bytes.len())
            .chain([output::json::size(&report)? as usize])
            .map(|bytes| on_disk(bytes) + block)
            .sum();
        let mut left = free.saturating_sub(reports);
        profiles.retain(|file| {
            let needs = on_disk(file.bytes.len());
            let fits = needs <= left;
            if fits {
                left -= needs;
            } else {
                let reason = format!(
                    "it needs {} and {} had {} free",
                    report::format::bytes(needs),
                    output.path().display(),
                    report::format::bytes(free)
                );
                skipped.push((file.name.clone(), reason));
            }
            fits
        });
    }
    let planned: Vec<&str> = profiles.iter().map(|f| f.name.as_str()).collect();
    report.run.outputs.retain(|name| name.starts_with("report.") || planned.contains(&name.as_str()));
    report
        .limitations
        .extend(skipped.iter().map(|(name, reason)| format!("{name} could not be written: {reason}")));
    let mut written = write_with_report(output, &report, &profiles)?;
    if !written.failed.is_empty() || !written.notes.is_empty() {
        report.limitations.extend(written.notes.iter().cloned());
        for (name, reason) in &written.failed {
            report.limitations.push(format!("{name} could not be written: {reason}"));
        }
        report.run.outputs.retain(|name| written.written.contains(name));
        let again = write_with_report(output, &report, &[])?;
        for name in again.written {
            if !written.written.contains(&name) {
                written.written.push(name.clone());
                written.failed.retain(|(failed, _)| *failed != name);
            }
        }
    }
    written.failed.extend(skipped);
    Ok((report, written))
}

/// Writes the report (report.md, then report.json, serialized as it is written) and then
/// `files`.
fn write_with_report(
    output: &mut OutputDir,
    report: &Report,
    files: &[Rendered],
) -> anyhow::Result<output::Written> {
    let markdown = output::render(&Artifact::Report(report))?;
    let all: Vec<ToWrite<'_>> = markdown
        .iter()
        .map(ToWrite::from)
        .chain([ToWrite::ReportJson(report)])
        .chain(files.iter().map(ToWrite::from))
        .collect();
    Ok(output.write(&all))
}

/// How `-- CMD` ended, in words, and the exit code of sysprof's run: the command's own when it
/// exited by itself; 128 + the signal when a signal to sysprof interrupted the run and sysprof
/// ended the command; 0 when `--duration` ran out first.
fn describe_end(end: &CommandEnd, ended_by: &EndReason) -> (String, u8) {
    let own = end.status.map(launch::describe_exit);
    let Some((signal, count)) = end.ended_by_sysprof else {
        return own.unwrap_or_else(|| ("still running when the trace ended".into(), 0));
    };
    let code = match ended_by {
        EndReason::Signal(interrupt) => interrupt.exit_code(),
        _ => own.as_ref().filter(|_| !end.command_was_running).map_or(0, |(_, code)| *code),
    };
    let others = count - usize::from(end.command_was_running);
    let why = match ended_by {
        EndReason::Signal(signal) => signal.name().to_string(),
        EndReason::Duration => "--duration".to_string(),
        other => other.describe(),
    };
    let plural = |n: usize| if n == 1 { "process" } else { "processes" };
    let text = if end.command_was_running {
        let what = match others {
            0 => "it".to_string(),
            n => format!("it and the {n} {} it started", plural(n)),
        };
        format!(
            "still running when the trace ended ({why}): sysprof ended {what} with {signal}; the command {}",
            own.map_or("did not report its status".to_string(), |(text, _)| {
                match text.strip_prefix("exit status ") {
                    Some(code) => format!("exited with status {code}"),
                    None => format!("was {text}"),
                }
            }),
        )
    } else {
        format!(
            "{}; sysprof ended the {others} {} it left running with {signal} when the trace ended ({why})",
            own.map_or_else(String::new, |(text, _)| text),
            plural(others),
        )
    };
    (text, code)
}

/// What the uprobe tracers could not do, one line each, also said on the terminal: a probe
/// that did not attach must not pass for a function that was never called.
fn tracer_limitations(quiet: bool, calls: &UprobeTracers) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(tracer) = &calls.gpu {
        lines.extend(tracer.problems.iter().cloned());
        if tracer.libraries.is_empty() {
            lines.push(
                "no CUDA runtime, driver or NCCL library was mapped by the target: no GPU calls traced"
                    .into(),
            );
        }
    }
    if let Some(heap) = &calls.heap {
        lines.extend(heap.problems.iter().cloned());
        if heap.allocators.is_empty() {
            lines.push(
                "--malloc: no allocator (libc, jemalloc, tcmalloc, mimalloc) was mapped by the target".into(),
            );
        }
    }
    lines.extend(calls.funcs.problems.iter().cloned());
    lines.extend(calls.funcs.unresolved());
    if !quiet {
        for line in &lines {
            say!("{line}");
        }
    }
    lines
}

fn print_summary(
    output: &OutputDir,
    written: &output::Written,
    removed: &[String],
    report: &Report,
    cpu_samples: u64,
) {
    let dir = output.path().display();
    if let Some(status) = &report.run.command_status {
        say!("command: {status}");
    }
    for note in &written.notes {
        say!("{note}");
    }
    if !removed.is_empty() {
        say!("removed the files of an earlier run that this one did not write: {}", removed.join(", "));
    }
    if !written.written.is_empty() {
        let paths: Vec<String> = written.written.iter().map(|f| format!("{dir}/{f}")).collect();
        stderr_line(format_args!(
            "Wrote {} ({} samples, {} lost).",
            paths.join(", "),
            thousands(report.run.samples),
            thousands(report.run.lost.total())
        ));
    }
    if !written.failed.is_empty() {
        return;
    }
    if cpu_samples > 0 {
        stderr_line(format_args!(
            "Open {dir}/cpu.svg in a browser; read {dir}/report.md for the hotspots and what to change first."
        ));
        if written.written.iter().any(|f| f == crate::timeline::FILE_NAME) {
            stderr_line(format_args!(
                "The timeline: open {dir}/{} at ui.perfetto.dev.",
                crate::timeline::FILE_NAME
            ));
        }
    } else {
        stderr_line(format_args!(
            "No on-CPU samples of the target: it did not run on a CPU while traced. See {dir}/report.md."
        ));
    }
}
