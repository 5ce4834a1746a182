//! The stages after collection, in order: read the kernel's maps out through every family,
//! start the detach (proving nothing is left), analyze (`analysis.rs`), then write every output
//! and say what was written.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::{
    analysis::{self, Analyzed},
    collect::{EndReason, UprobeTracers},
    family::list,
    launch::{self, CommandEnd},
    memory::heap::{HeapProbeCost, ProbedAllocator},
    output::{self, OutputDir, Profiles, Rendered, ToWrite},
    probes::Probes,
    procs::ProcessTable,
    record::reader::MapReader,
    record::{self, ProbeShare, Recording, RunFacts, RunProps},
    report::{self, Report, format::thousands},
    symbolize::{Symbolizer, Symbols},
    terminal::{say, stderr_line},
};

/// How a trace ended, for the caller and the exit code.
#[derive(Clone, Debug)]
pub struct Finished {
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
    pub props: RunProps,
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
    pub(crate) fn deliver(self) -> anyhow::Result<Finished> {
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
        let mut families = list::enabled(&props);
        let gpu_state = tracers.gpu.as_ref().map(|gpu| &gpu.state);
        let mut maps = MapReader::live(&probes, props.save_readout);
        let shared = analysis::read(&mut maps, &props, &mut families, gpu_state, timeline.as_ref())?;
        // Named while the program that names them is loaded (`ksyms.rs`); /proc/kallsyms is
        // read later only for what this could not name.
        let kernel_addresses = maps.kernel_addresses();
        let maps = maps.into_contents();
        let kernel_frames = probes.kernel_frames(&kernel_addresses).unwrap_or_else(|error| {
            // Said, not hidden: the names then come from parsing all of /proc/kallsyms, which
            // costs megabytes and names nothing where kptr_restrict hides the addresses.
            limitations.push(format!(
                "kernel functions were named from /proc/kallsyms: the kernel's own lookup failed ({error:#})"
            ));
            Default::default()
        });
        let stats_available = probes.stats_available();
        // After the read-out, so that none of the calibration's runs is in a figure.
        let allocators = tracers.heap.as_ref().map_or(&[][..], |heap| &heap.allocators[..]);
        let (probe_cost_ns, probe_share, heap_cost) =
            calibrate_probes(&mut probes, allocators, &mut limitations, props.quiet);
        let attached = probes.attached().to_vec();
        let files_changed = probes.probed_files_changed();
        // While the maps are loaded: the ones allocated at insert have grown since the start.
        let kernel_memory =
            std::mem::take(&mut end.kernel_memory).merge(crate::kernel_memory::Snapshot::take()).summary();
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
            format: record::FORMAT,
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
                probe_share,
                heap_probe_cost_ns: heap_cost.map(|cost| cost.allocation_ns),
                heap_free_probe_cost_ns: heap_cost.and_then(|cost| cost.free_ns),
                own_usage: None,
                unwind: end.unwind.clone(),
                kernel_memory: Some(kernel_memory),
                gpu_interval_end_ms: end
                    .gpu_interval
                    .map(|interval| interval.as_millis() as u64)
                    .filter(|&end_ms| end_ms != props.gpu_interval_ms),
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
        let Analyzed { mut report, profiles, mut files, cpu_samples, build_ids } = analysis::analyze(
            &recording,
            families,
            shared,
            &mut processes,
            gpu_state.as_ref(),
            &mut symbolizer,
        )?;
        if !recording.props.quiet {
            for note in symbolizer.notes() {
                say!("{note}");
            }
        }
        let detach = detach.wait();
        report.instrumentation.detach = detach.clone();
        if recording.props.save_readout {
            recording.detach = Some(detach);
            recording.run.own_usage =
                Some((report.overhead.sysprof_cpu_s, report.overhead.sysprof_peak_rss_kib));
            recording.symbols = symbolizer.answers().clone();
            recording.build_ids = build_ids;
            files.push(Rendered { name: record::FILE_NAME.into(), bytes: recording.to_json()? });
        }
        // The report, the profiles and the rendered files are all that is written from here:
        // the read-out, the symbols and the process table go before the report is rendered.
        drop((symbolizer, processes));
        let Recording { props, run, .. } = recording;
        let quiet = props.quiet;
        let exit_code = run.exit_code;
        let (report, written, pprofs) =
            write_all(&mut output, report, &profiles, files, props.push.is_some())?;
        drop(profiles);
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
        Ok(Finished {
            exit_code,
            output_dir: output.path().to_path_buf(),
            files: written.written,
            samples: report.run.samples,
            lost: report.run.lost.total(),
        })
    }
}

/// What one hit of the call probes (GPU APIs, `--func`) and of the heap probes costs the
/// target, and how much of a call's time as the call probes time it is theirs, measured on
/// sysprof's own calibration functions, for the families whose probes were attached. Measured
/// at the end rather than the start: the call programs' loading and the probes' attach and
/// detach (about 100 ms a uprobe) then stay out of the start, and a run that probed no call
/// pays nothing.
fn calibrate_probes(
    probes: &mut Probes,
    allocators: &[ProbedAllocator],
    limitations: &mut Vec<String>,
    quiet: bool,
) -> (Option<f64>, ProbeShare, Option<HeapProbeCost>) {
    let attached =
        |program: &str| probes.attached().iter().any(|probe| Probes::is_program(&probe.program, program));
    let (calls, heap) = (attached("call_enter"), attached("alloc_enter"));
    let mut failed = |what: &str, error: anyhow::Error| {
        let line = format!("the cost of {what} could not be measured: {error:#}");
        if !quiet {
            say!("{line}");
        }
        limitations.push(line);
    };
    let call_cost = calls
        .then(|| crate::uprobes::calibrate::measure_probe_cost(probes))
        .transpose()
        .unwrap_or_else(|error| {
            failed("a probe hit", error);
            None
        });
    let mut share = |id: u32, what: &str| {
        call_cost
            .map(|_| crate::uprobes::calibrate::timed_share_ns(probes, id))
            .transpose()
            .unwrap_or_else(|error| {
                failed(what, error);
                None
            })
            .flatten()
    };
    let in_call = ProbeShare {
        emulated_ns: share(
            crate::uprobes::calibrate::CALIBRATION_ID,
            "the probes' share of a timed call (first instruction emulated)",
        ),
        stepped_ns: share(
            crate::uprobes::calibrate::CALIBRATION_STEPPED_ID,
            "the probes' share of a timed call (first instruction stepped)",
        ),
    };
    let heap_cost = heap
        .then(|| crate::memory::heap::measure_probe_cost(probes, allocators))
        .transpose()
        .unwrap_or_else(|error| {
            failed("an allocator probe hit", error);
            None
        });
    (call_cost, in_call, heap_cost)
}

/// Sends the pprof profiles to the `--push` server, after the local files are written: a
/// failure is one line, and neither the files nor the exit code depend on it.
fn push_profiles(
    push: &record::PushProps,
    pprofs: &[Rendered],
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
pub fn rerender(dir: &Path, output: Option<&Path>, focus: &[crate::config::Focus]) -> anyhow::Result<u8> {
    use crate::input::{InputError, Links, read_regular};
    let path = dir.join(record::FILE_NAME);
    // Through sudo, read as the user: the read-out is theirs, never root's to open for them.
    // A regular file only, opened without blocking, and bounded.
    let user = crate::privileges::InvokingUser::from_sudo_env();
    let read =
        crate::privileges::as_user(user.as_ref(), || read_regular(&path, Links::Follow, READOUT_LIMIT))
            .map_err(|error| anyhow::anyhow!("reading {}: {error}", path.display()))?;
    let bytes = match read {
        Ok(bytes) => bytes,
        Err(InputError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => anyhow::bail!(
            "{} has no {}: `sysprof report` renders runs traced with --save-readout; trace again with it",
            dir.display(),
            record::FILE_NAME
        ),
        Err(error) => return Err(error.into()),
    };
    let (report, profiles, mut files) =
        crate::analysis::replay_keeping(&bytes, focus).with_context(|| path.display().to_string())?;
    let mut out = OutputDir::prepare(output.unwrap_or(dir), user)?;
    for note in out.notes() {
        crate::terminal::say!("{note}");
    }
    // The read-out stays where it is; a copy goes with the files rendered elsewhere.
    if output.is_some_and(|o| o != dir) {
        files.push(Rendered { name: record::FILE_NAME.into(), bytes });
    }
    let (report, written, _) = write_all(&mut out, report, &profiles, files, false)?;
    let removed = out.remove_stale(&written.written);
    print_summary(&out, &written, &removed, &report, report.run.samples);
    for (name, reason) in &written.failed {
        stderr_line(format_args!("error: could not write {name} in {}: {reason}", out.path().display()));
    }
    Ok(if written.failed.is_empty() { 0 } else { 1 })
}

/// The most of `readout.json` that `sysprof report` reads: a --all trace of a busy machine
/// with its processes' maps and every symbol writes tens of megabytes.
pub const READOUT_LIMIT: u64 = 1 << 30;

/// Writes the report first (on a full disk it is what must survive), then the folded stacks,
/// the pprof files and `others`, then the flamegraphs. Each profile's files are rendered just
/// before they are written and dropped after (held together, a busy machine's were the end of a
/// trace's peak), so a file's size is known only then: one that will not fit in the room the
/// disk had is left out, and what was left out or failed gets the report written again. The
/// room kept for the reports is twice theirs, for that second report (each file is replaced
/// whole or not at all, so the first one stays intact until it is). Returns the pprof files too
/// when `keep_pprofs` (to push them).
fn write_all(
    output: &mut OutputDir,
    mut report: Report,
    profiles: &Profiles,
    others: Vec<Rendered>,
    keep_pprofs: bool,
) -> anyhow::Result<(Report, output::Written, Vec<Rendered>)> {
    let room = match output.room() {
        Some((free, block)) => {
            let reports: u64 = output::render_report(&report)?
                .iter()
                .map(|f| f.bytes.len())
                .chain([output::json::size(&report)? as usize])
                .map(|bytes| on_disk(bytes, block) + block)
                .sum();
            Some(Room { block, left: free.saturating_sub(2 * reports) })
        }
        None => None,
    };
    let first = write_with_report(output, &report)?;
    let mut writer = Writer { output, room, written: first, skipped: Vec::new() };
    let mut pprofs = Vec::new();
    for index in 0..profiles.stacks.len() {
        match profiles.render_data(index) {
            Ok([folded, pprof]) => {
                writer.put(&folded);
                writer.put(&pprof);
                if keep_pprofs {
                    pprofs.push(pprof);
                }
            }
            Err(error) => writer.not_rendered(profiles.data_names(index), &error),
        }
    }
    for file in &others {
        writer.put(file);
    }
    drop(others);
    for index in 0..profiles.stacks.len() {
        match profiles.render_flamegraph(index) {
            Ok(file) => writer.put(&file),
            Err(error) => writer.not_rendered([profiles.flamegraph_name(index)], &error),
        }
    }
    let Writer { output, mut written, skipped, .. } = writer;
    if !skipped.is_empty() || !written.failed.is_empty() || !written.notes.is_empty() {
        report
            .limitations
            .extend(skipped.iter().map(|(name, reason)| format!("{name} could not be written: {reason}")));
        report.limitations.extend(written.notes.iter().cloned());
        for (name, reason) in &written.failed {
            report.limitations.push(format!("{name} could not be written: {reason}"));
        }
        report.run.outputs.retain(|name| written.written.contains(name));
        let again = write_with_report(output, &report)?;
        for name in again.written {
            if !written.written.contains(&name) {
                written.written.push(name.clone());
                written.failed.retain(|(failed, _)| *failed != name);
            }
        }
    }
    written.failed.extend(skipped);
    Ok((report, written, pprofs))
}

/// What a file takes on a disk of `block`-byte blocks.
fn on_disk(bytes: usize, block: u64) -> u64 {
    (bytes as u64).div_ceil(block).max(1) * block
}

/// The room the output's filesystem had for the files after the reports.
struct Room {
    block: u64,
    left: u64,
}

/// Writes the files after the report one at a time, as they are rendered.
struct Writer<'a> {
    output: &'a mut OutputDir,
    room: Option<Room>,
    written: output::Written,
    /// Files left out for want of room, with why.
    skipped: Vec<(String, String)>,
}

impl Writer<'_> {
    fn put(&mut self, file: &Rendered) {
        if let Some(room) = &mut self.room {
            let needs = on_disk(file.bytes.len(), room.block);
            if needs > room.left {
                // What was free then, not at the start: the reports and the files before took
                // their part. Of that, what is kept for the report that names this one.
                let free = self.output.room().map_or(room.left, |(free, _)| free);
                let kept = free.saturating_sub(room.left);
                let reason = format!(
                    "it needs {} and {} had {} free{}",
                    report::format::bytes(needs),
                    self.output.path().display(),
                    report::format::bytes(free),
                    if kept > 0 {
                        format!(", {} of it kept for the report to say so", report::format::bytes(kept))
                    } else {
                        String::new()
                    }
                );
                self.skipped.push((file.name.clone(), reason));
                return;
            }
            room.left -= needs;
        }
        self.written.add(self.output.write(&[file.into()]));
    }

    /// Files that could not be rendered, with why.
    fn not_rendered(&mut self, names: impl IntoIterator<Item = String>, error: &anyhow::Error) {
        let reason = format!("it could not be rendered: {error:#}");
        self.written.failed.extend(names.into_iter().map(|name| (name, reason.clone())));
    }
}

/// Writes the report: report.md, then report.json, serialized as it is written.
fn write_with_report(output: &mut OutputDir, report: &Report) -> anyhow::Result<output::Written> {
    let markdown = output::render_report(report)?;
    let all: Vec<ToWrite<'_>> =
        markdown.iter().map(ToWrite::from).chain([ToWrite::ReportJson(report)]).collect();
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
            "Wrote {} ({}, {} lost).",
            paths.join(", "),
            crate::report::format::count(report.run.samples, "sample", "samples"),
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
