//! `sysprof merge DIR...`: the output directories of one job's ranks (one `sysprof trace` per
//! node, under srun, torchrun, mpirun or pdsh) as one report: per host and rank their CPU,
//! GPU and NCCL figures side by side, the straggler (`ranks.rs`), and one Perfetto trace with a
//! machine per host (`timeline.rs`).
//!
//! It reads what each run wrote (report.json, timeline.pftrace) and nothing of the machine, so
//! the directories can be copied from the nodes to wherever the merge runs. It writes
//! merged.md, merged.json and timeline.pftrace into the output directory, as the invoking user.

mod ranks;
mod timeline;

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::{
    output::{OutputDir, Rendered},
    privileges::{InvokingUser, as_user},
    terminal::{say, stderr_line},
};

pub use ranks::{RankRun, Straggler};

/// What a merge found, as merged.json has it.
#[derive(Debug, serde::Serialize)]
pub struct Merged {
    pub ranks: Vec<RankRun>,
    /// The rank that holds the others up, when one does.
    pub straggler: Option<Straggler>,
    /// The merged timeline's file, when every run wrote one.
    pub timeline: Option<String>,
    /// What the merge could not do.
    pub notes: Vec<String>,
}

/// Merges the runs in `dirs` into `output`; returns the exit code.
pub fn run(dirs: &[PathBuf], output: &Path) -> anyhow::Result<u8> {
    anyhow::ensure!(
        dirs.len() >= 2,
        "sysprof merge needs two output directories or more (one per host or rank)"
    );
    // Through sudo, read as the user: the directories are theirs.
    let user = InvokingUser::from_sudo_env();
    let mut runs = Vec::new();
    for dir in dirs {
        let report = read(user.as_ref(), &dir.join("report.json"), REPORT_LIMIT)?.with_context(|| {
            format!(
                "{} has no report.json: give the output directories of `sysprof trace` runs",
                dir.display()
            )
        })?;
        let timeline = read(user.as_ref(), &dir.join(crate::timeline::FILE_NAME), TIMELINE_LIMIT)?;
        runs.push(RunFiles { dir: dir.clone(), report, timeline });
    }
    let (merged, files) = merge(runs)?;

    let mut out = OutputDir::prepare(output, user)?;
    for note in out.notes() {
        say!("{note}");
    }
    let written = out.write(&files.iter().map(Into::into).collect::<Vec<_>>());
    for note in &written.notes {
        say!("{note}");
    }
    for (name, reason) in &written.failed {
        stderr_line(format_args!("error: could not write {name} in {}: {reason}", output.display()));
    }
    if let Some(straggler) = &merged.straggler {
        stderr_line(format_args!("sysprof: {}", straggler.summary));
    }
    let paths: Vec<String> = written.written.iter().map(|f| format!("{}/{f}", output.display())).collect();
    stderr_line(format_args!("Wrote {} ({} runs merged).", paths.join(", "), merged.ranks.len()));
    Ok(if written.failed.is_empty() { 0 } else { 1 })
}

/// What a merge reads of one run: its directory, its report.json, and its timeline.pftrace
/// when it wrote one.
pub struct RunFiles {
    pub dir: PathBuf,
    pub report: Vec<u8>,
    pub timeline: Option<Vec<u8>>,
}

/// The runs as one: what merged.json says, and the files to write (merged.md, merged.json,
/// and timeline.pftrace when every run wrote one). Reads nothing but `runs` (the fuzz targets
/// `fuzzing::report_json` and `fuzzing::timeline_pftrace` call it on their bytes).
pub fn merge(runs: Vec<RunFiles>) -> anyhow::Result<(Merged, Vec<Rendered>)> {
    let mut ranks = Vec::new();
    let mut traces = Vec::new();
    let mut notes = Vec::new();
    for run in runs {
        let RunFiles { dir, report, timeline } = run;
        let report =
            ranks::parse_report(&report).map_err(|fault| anyhow::anyhow!("{}: {fault}", dir.display()))?;
        let timeline = match timeline {
            Some(bytes) => Some(timeline::HostTimeline::decode(bytes).with_context(|| {
                format!("{}: {} is not a trace sysprof wrote", dir.display(), crate::timeline::FILE_NAME)
            })?),
            None => {
                notes.push(format!(
                    "{} has no {}: its rank is left out of the merged timeline and of the collective timing",
                    dir.display(),
                    crate::timeline::FILE_NAME
                ));
                None
            }
        };
        ranks.push(RankRun::of(&dir, &report, timeline.as_ref()));
        traces.push(timeline);
    }
    ranks::name_uniquely(&mut ranks);
    ranks::arrival_lags(&mut ranks);
    let straggler = ranks::straggler(&ranks);
    let mut files = Vec::new();
    let timeline_file = if traces.iter().all(Option::is_some) {
        let hosts: Vec<(&str, timeline::HostTimeline)> =
            ranks.iter().map(|run| run.label.as_str()).zip(traces.into_iter().flatten()).collect();
        files.push(Rendered { name: crate::timeline::FILE_NAME.into(), bytes: timeline::merge(hosts) });
        Some(crate::timeline::FILE_NAME.to_string())
    } else {
        None
    };
    let merged = Merged { ranks, straggler, timeline: timeline_file, notes };
    files.insert(0, Rendered { name: "merged.md".into(), bytes: ranks::markdown(&merged).into_bytes() });
    files.insert(1, Rendered { name: "merged.json".into(), bytes: serde_json::to_vec_pretty(&merged)? });
    Ok((merged, files))
}

/// The most of a report.json the merge reads: a trace of 17,000 processes wrote 29 MB.
pub const REPORT_LIMIT: u64 = 256 << 20;
/// The most of a timeline.pftrace: --timeline-events' default 200,000 events take a few
/// megabytes, and each host's whole file is held for the merged one.
pub const TIMELINE_LIMIT: u64 = 1 << 30;

/// A file's bytes, read as `user`, at most `limit` of them, from a regular file only (a FIFO
/// is refused, not waited on); `None` when it does not exist.
fn read(user: Option<&InvokingUser>, path: &Path, limit: u64) -> anyhow::Result<Option<Vec<u8>>> {
    use crate::input::{InputError, Links, read_regular};
    let read = as_user(user, || read_regular(path, Links::Follow, limit))
        .map_err(|error| anyhow::anyhow!("reading {}: {error}", path.display()))?;
    match read {
        Ok(bytes) => Ok(Some(bytes)),
        Err(InputError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error.into()),
    }
}
