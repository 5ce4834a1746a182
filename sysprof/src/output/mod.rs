//! The write stage: the output directory and one file per format behind the [`Sink`] trait.
//!
//! Every file but report.json is rendered in memory first (that one is serialized straight into
//! its file, see `json.rs`; the stack profiles' one at a time, see [`Profiles`]), then written
//! into the directory, opened and checked for each write, relative to its descriptor: to a
//! fresh temporary name (`O_CREAT|O_EXCL|O_NOFOLLOW`)
//! that is then renamed over the final one. A symlink planted in the directory is replaced,
//! never followed, and a full disk leaves the earlier file whole, never a truncated one.
//! Through sudo all of it happens as the invoking user ([`InvokingUser::act`]): the directories
//! and files are theirs, and nothing is written where they could not write themselves.

mod flamegraph;
mod folded;
pub(crate) mod json;
pub(crate) mod markdown;
pub(crate) mod pprof;

use std::{
    io::{BufWriter, Write},
    os::{
        fd::{AsFd as _, OwnedFd},
        unix::fs::DirBuilderExt as _,
    },
    path::{Path, PathBuf},
};

use nix::{
    fcntl::{OFlag, openat, renameat},
    sys::stat::{Mode, fstat},
    unistd::{UnlinkatFlags, unlinkat},
};

pub use self::{
    flamegraph::Flamegraph,
    markdown::{MarkdownReport, render as render_markdown},
};
use crate::{
    error::Error,
    family::StackFile,
    privileges::{InvokingUser, as_user},
    profile::StackProfile,
    report::Report,
};

/// What the sinks write from.
pub enum Artifact<'a> {
    /// A stack profile under a base name ("cpu" -> cpu.svg, cpu.pb.gz; its folded file is
    /// [`Profiles::render_data`]'s).
    Stacks {
        name: &'a str,
        title: &'a str,
        profile: &'a StackProfile,
        /// The profile's folded lines (`folded::folded_text`), which the flamegraph is drawn
        /// from.
        folded: &'a str,
        /// What the pprof file needs beside the stacks.
        facts: &'a pprof::ProfileFacts,
    },
    Report(&'a Report),
}

/// One file's name and contents, rendered and not yet written.
#[derive(Debug)]
pub struct Rendered {
    pub name: String,
    pub bytes: Vec<u8>,
}

/// A file to write: rendered already, or the report serialized as report.json as it is written.
pub enum ToWrite<'a> {
    Rendered(&'a Rendered),
    ReportJson(&'a Report),
}

impl<'a> From<&'a Rendered> for ToWrite<'a> {
    fn from(file: &'a Rendered) -> Self {
        ToWrite::Rendered(file)
    }
}

impl ToWrite<'_> {
    pub fn name(&self) -> &str {
        match self {
            ToWrite::Rendered(file) => &file.name,
            ToWrite::ReportJson(_) => json::FILE,
        }
    }

    fn write_into(&self, out: &mut dyn Write) -> std::io::Result<()> {
        match self {
            ToWrite::Rendered(file) => out.write_all(&file.bytes),
            ToWrite::ReportJson(report) => json::write(report, out),
        }
    }
}

/// One output format.
pub trait Sink {
    /// The file for `artifact`; `None` when this format does not apply to the artifact.
    fn render(&self, artifact: &Artifact<'_>) -> anyhow::Result<Option<Rendered>>;
}

/// The report's rendered file, report.md (report.json is serialized as it is written).
pub fn render_report(report: &Report) -> anyhow::Result<Vec<Rendered>> {
    Ok(MarkdownReport.render(&Artifact::Report(report))?.into_iter().collect())
}

/// A run's stack profiles, rendered one at a time as they are written (`results::write_all`):
/// drawn, a busy machine's are megabytes each, and rendered all at once before the first was
/// written they were the peak of the end of a trace.
pub struct Profiles {
    pub(crate) stacks: Vec<StackFile>,
    pub(crate) facts: pprof::ProfileFacts,
}

impl Profiles {
    /// The files they become, in the order [`Self::render_all`] gives them.
    pub fn file_names(&self) -> impl Iterator<Item = String> + '_ {
        (0..self.stacks.len()).flat_map(|index| {
            let [folded, pprof] = self.data_names(index);
            [folded, self.flamegraph_name(index), pprof]
        })
    }

    /// The names of [`Self::render_data`]'s files.
    pub fn data_names(&self, index: usize) -> [String; 2] {
        [FOLDED, PPROF].map(|extension| format!("{}.{extension}", self.stacks[index].name))
    }

    /// The name of [`Self::render_flamegraph`]'s file.
    pub fn flamegraph_name(&self, index: usize) -> String {
        format!("{}.{FLAMEGRAPH}", self.stacks[index].name)
    }

    /// Profile `index`'s data files: its folded stacks and its pprof file. The folded text is
    /// built for them and becomes the folded file itself.
    pub fn render_data(&self, index: usize) -> anyhow::Result<[Rendered; 2]> {
        let stack = &self.stacks[index];
        let folded = folded::folded_text(&stack.profile);
        let pprof = pprof::Pprof.render(&self.artifact(stack, &folded))?;
        let pprof = pprof.ok_or_else(|| anyhow::anyhow!("no pprof file for {}", stack.name))?;
        Ok([folded::file(stack.name, folded), pprof])
    }

    /// Profile `index`'s flamegraph, drawn from its folded text (built again: holding every
    /// profile's until the flamegraphs, which are written last, would be the peak again).
    pub fn render_flamegraph(&self, index: usize) -> anyhow::Result<Rendered> {
        let stack = &self.stacks[index];
        let folded = folded::folded_text(&stack.profile);
        let svg = Flamegraph.render(&self.artifact(stack, &folded))?;
        svg.ok_or_else(|| anyhow::anyhow!("no flamegraph for {}", stack.name))
    }

    /// Every file, rendered: for a caller that wants them in hand ([`crate::replay`]).
    pub fn render_all(&self) -> anyhow::Result<Vec<Rendered>> {
        let mut files = Vec::new();
        for index in 0..self.stacks.len() {
            let [folded, pprof] = self.render_data(index)?;
            files.extend([folded, self.render_flamegraph(index)?, pprof]);
        }
        Ok(files)
    }

    fn artifact<'a>(&'a self, stack: &'a StackFile, folded: &'a str) -> Artifact<'a> {
        Artifact::Stacks {
            name: stack.name,
            title: &stack.title,
            profile: &stack.profile,
            folded,
            facts: &self.facts,
        }
    }
}

const FOLDED: &str = "folded";
const FLAMEGRAPH: &str = "svg";
const PPROF: &str = "pb.gz";

/// Whether `name` is a file sysprof writes: only those are ever removed as stale.
pub fn is_sysprof_output(name: &str) -> bool {
    matches!(name, "report.md" | "report.json" | crate::recording::FILE_NAME | crate::timeline::FILE_NAME)
        || name.split_once('.').is_some_and(|(base, ext)| {
            matches!(
                base,
                "cpu" | "offcpu" | "faults" | "alloc" | "inuse" | crate::gpu::section::CALL_PROFILE
            ) && matches!(ext, FOLDED | FLAMEGRAPH | PPROF)
        })
}

/// What [`OutputDir::write`] did.
#[derive(Debug, Default)]
pub struct Written {
    pub written: Vec<String>,
    /// Files that could not be written, with why.
    pub failed: Vec<(String, String)>,
    /// What happened to the directory meanwhile (removed and created again, ...).
    pub notes: Vec<String>,
}

impl Written {
    /// Adds what a later write did.
    pub fn add(&mut self, later: Written) {
        self.written.extend(later.written);
        self.failed.extend(later.failed);
        self.notes.extend(later.notes);
    }
}

/// The directory the results go to, checked before tracing starts so a long trace is never
/// lost to a typo.
#[derive(Debug)]
pub struct OutputDir {
    path: PathBuf,
    /// Through sudo: the user it is written as.
    user: Option<InvokingUser>,
    /// (st_dev, st_ino) when it was prepared, then as the last write found it: to notice it
    /// removed or replaced.
    identity: (u64, u64),
    /// The directories `prepare` created, outermost first: removed again (when empty) if
    /// the run ends without writing anything.
    created: Vec<PathBuf>,
    /// What the previous run into this directory wrote (its report.json's file list).
    previous: Vec<String>,
    wrote: bool,
}

impl OutputDir {
    /// Creates the directory if needed (as the invoking user) and checks that it is theirs or
    /// root's and that a file can be created in it.
    pub fn prepare(path: &Path, user: Option<InvokingUser>) -> anyhow::Result<Self> {
        let prepared = as_user(user.as_ref(), || {
            let (fd, created) = open_dir(path, user.as_ref())?;
            let meta = fstat(fd.as_fd())?;
            let probe =
                Rendered { name: format!(".sysprof-write-test-{}", std::process::id()), bytes: Vec::new() };
            write_at(&fd, &(&probe).into())?;
            unlinkat(fd.as_fd(), probe.name.as_str(), UnlinkatFlags::NoRemoveDir)?;
            Ok::<_, std::io::Error>((meta, created, previous_outputs(&fd)))
        });
        let (meta, created, previous) =
            prepared.and_then(|result| result).map_err(|e| output_error(path, e.to_string()))?;
        Ok(OutputDir {
            path: path.to_path_buf(),
            user,
            identity: (meta.st_dev, meta.st_ino),
            created,
            previous,
            wrote: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `files` in order (put the report first: it is what a full disk must not cost),
    /// each whole or not at all. The directory is opened again by its path: one removed during
    /// the trace is created again, and the notes say so.
    pub fn write(&mut self, files: &[ToWrite<'_>]) -> Written {
        let mut outcome = Written::default();
        let result = as_user(self.user.as_ref(), || {
            let (fd, created) = open_dir(&self.path, self.user.as_ref())?;
            let meta = fstat(fd.as_fd()).map_err(std::io::Error::from)?;
            if !created.is_empty() {
                outcome.notes.push(format!(
                    "the output directory {} was removed during the trace: created it again",
                    self.path.display()
                ));
            } else if (meta.st_dev, meta.st_ino) != self.identity {
                outcome.notes.push(format!(
                    "the output directory {} was replaced during the trace: wrote into the new one",
                    self.path.display()
                ));
            }
            for file in files {
                match write_at(&fd, file) {
                    Ok(()) => outcome.written.push(file.name().to_string()),
                    Err(error) => outcome.failed.push((file.name().to_string(), error.to_string())),
                }
            }
            Ok::<_, std::io::Error>((meta.st_dev, meta.st_ino))
        });
        match result.and_then(|r| r) {
            // The directory written into is the one the next write compares with: a run's files
            // are written one at a time, and a directory made again is said once, not again as
            // replaced at each later file.
            Ok(identity) => self.identity = identity,
            Err(error) => {
                outcome.failed.extend(files.iter().map(|f| (f.name().to_string(), error.to_string())))
            }
        }
        self.wrote |= !outcome.written.is_empty();
        outcome
    }

    /// Room left in the directory's filesystem for the user, as (bytes free, block size).
    pub fn room(&self) -> Option<(u64, u64)> {
        as_user(self.user.as_ref(), || {
            let dir = open_existing(&self.path).ok()?;
            let stats = nix::sys::statvfs::fstatvfs(dir.as_fd()).ok()?;
            let block = stats.fragment_size().max(1);
            Some((stats.blocks_available() * block, block))
        })
        .ok()
        .flatten()
    }

    /// Removes what the previous run into this directory wrote and this one did not (an
    /// `alloc.svg` beside a later run without `--malloc`); returns the names removed.
    pub fn remove_stale(&self, written: &[String]) -> Vec<String> {
        let stale: Vec<&String> =
            self.previous.iter().filter(|name| !written.contains(name) && is_sysprof_output(name)).collect();
        if stale.is_empty() {
            return Vec::new();
        }
        as_user(self.user.as_ref(), || {
            let Ok(dir) = open_existing(&self.path) else { return Vec::new() };
            stale
                .into_iter()
                .filter(|name| unlinkat(dir.as_fd(), name.as_str(), UnlinkatFlags::NoRemoveDir).is_ok())
                .cloned()
                .collect()
        })
        .unwrap_or_default()
    }
}

impl Drop for OutputDir {
    /// A run that wrote nothing (preflight failed, start-up interrupted) leaves no empty
    /// directory behind: only the ones it created, and only while empty.
    fn drop(&mut self) {
        if self.wrote || self.created.is_empty() {
            return;
        }
        let _ = as_user(self.user.as_ref(), || {
            for dir in self.created.iter().rev() {
                if std::fs::remove_dir(dir).is_err() {
                    break;
                }
            }
        });
    }
}

fn output_error(path: &Path, reason: String) -> anyhow::Error {
    Error::OutputDir { path: path.to_path_buf(), reason }.into()
}

/// Opens `path` as a directory, creating what is missing of it (returned, outermost first),
/// and checks that it belongs to the user (or root). Runs with the user's identity.
fn open_dir(path: &Path, user: Option<&InvokingUser>) -> std::io::Result<(OwnedFd, Vec<PathBuf>)> {
    let mut created = Vec::new();
    let absolute = std::path::absolute(path)?;
    let mut missing: Vec<&Path> = absolute.ancestors().take_while(|p| !p.exists()).collect();
    missing.reverse();
    for dir in missing {
        match std::fs::DirBuilder::new().mode(0o755).create(dir) {
            Ok(()) => created.push(dir.to_path_buf()),
            // Someone (a parallel run) made it meanwhile: fine, it is checked below.
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(denied_as(error, user)),
        }
    }
    if absolute.exists() && !absolute.is_dir() {
        return Err(std::io::Error::other("it is a file, not a directory"));
    }
    let fd = open_existing(&absolute).map_err(|e| denied_as(e, user))?;
    let owner = fstat(fd.as_fd())?.st_uid;
    let me = user.map(|u| u.uid).unwrap_or_else(|| nix::unistd::geteuid().as_raw());
    if owner != me && owner != 0 {
        return Err(std::io::Error::other(format!(
            "it belongs to uid {owner}, not to {}: sysprof writes only into a directory of yours or root's",
            user.map(|u| u.name.clone()).unwrap_or_else(|| format!("uid {me}"))
        )));
    }
    Ok((fd, created))
}

fn open_existing(path: &Path) -> std::io::Result<OwnedFd> {
    let cwd = std::fs::File::open(".")?;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    Ok(openat(cwd.as_fd(), path, flags, Mode::empty())?)
}

/// Says whose rights a refusal was about: through sudo, the user's, not root's.
fn denied_as(error: std::io::Error, user: Option<&InvokingUser>) -> std::io::Error {
    match user {
        Some(user) if error.kind() == std::io::ErrorKind::PermissionDenied => std::io::Error::other(format!(
            "{error} for {} (sysprof writes as the user who ran sudo)",
            user.name
        )),
        _ => error,
    }
}

/// Writes `file` into `dir` whole or not at all: a new temporary file, renamed over its name.
fn write_at(dir: &OwnedFd, file: &ToWrite<'_>) -> std::io::Result<()> {
    let name = file.name();
    let temporary = format!(".{name}.{}.tmp", std::process::id());
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(dir.as_fd(), temporary.as_str(), flags, Mode::from_bits_truncate(0o644))?;
    let mut out = BufWriter::new(std::fs::File::from(fd));
    let result = file
        .write_into(&mut out)
        .and_then(|()| out.flush())
        .and_then(|()| Ok(renameat(dir.as_fd(), temporary.as_str(), dir.as_fd(), name)?));
    if result.is_err() {
        let _ = unlinkat(dir.as_fd(), temporary.as_str(), UnlinkatFlags::NoRemoveDir);
    }
    result
}

/// The files the previous run into this directory wrote, from its report.json.
fn previous_outputs(dir: &OwnedFd) -> Vec<String> {
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    /// The one field read of an earlier report: serde skips the rest without building it (a
    /// report of a shell script's thousands of processes is megabytes, and read whole it took
    /// 32 MB and a tenth of a second of the next run's start).
    #[derive(serde::Deserialize)]
    struct Earlier {
        run: EarlierRun,
    }
    #[derive(serde::Deserialize)]
    struct EarlierRun {
        #[serde(default)]
        outputs: Vec<String>,
    }
    let Ok(fd) = openat(dir.as_fd(), "report.json", flags, Mode::empty()) else { return Vec::new() };
    let Ok(report) = serde_json::from_reader::<_, Earlier>(std::io::BufReader::new(std::fs::File::from(fd)))
    else {
        return Vec::new();
    };
    report.run.outputs.into_iter().filter(|n| is_sysprof_output(n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_not_an_output_directory() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let error = OutputDir::prepare(file.path(), None).unwrap_err();
        assert!(error.to_string().contains("it is a file"), "{error}");
    }

    #[test]
    fn missing_directories_are_created_and_removed_when_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a/b");
        let output = OutputDir::prepare(&nested, None).unwrap();
        assert!(nested.is_dir());
        drop(output);
        assert!(!dir.path().join("a").exists(), "an unused output directory is left behind");
    }

    #[test]
    fn files_are_written_whole_through_a_planted_symlink_never_through_it() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("precious");
        std::fs::write(&target, "keep").unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        std::os::unix::fs::symlink(&target, out.join("report.md")).unwrap();
        let mut output = OutputDir::prepare(&out, None).unwrap();
        let written =
            output.write(&[(&Rendered { name: "report.md".into(), bytes: b"new".to_vec() }).into()]);
        assert_eq!(written.written, ["report.md"]);
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert!(!out.join("report.md").is_symlink());
        assert_eq!(std::fs::read_to_string(out.join("report.md")).unwrap(), "new");
    }

    #[test]
    fn a_directory_removed_during_the_trace_is_created_again() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let mut output = OutputDir::prepare(&out, None).unwrap();
        std::fs::remove_dir(&out).unwrap();
        let written = output.write(&[(&Rendered { name: "report.md".into(), bytes: b"x".to_vec() }).into()]);
        assert_eq!(written.written, ["report.md"]);
        assert!(written.notes[0].contains("removed during the trace"), "{:?}", written.notes);
    }

    #[test]
    fn a_directory_removed_during_the_trace_is_noted_once_over_several_writes() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let mut output = OutputDir::prepare(&out, None).unwrap();
        std::fs::remove_dir(&out).unwrap();
        // Holds the freed inode, so that the directory made again gets another one.
        std::fs::write(dir.path().join("filler"), "").unwrap();
        let mut written =
            output.write(&[(&Rendered { name: "report.md".into(), bytes: b"x".to_vec() }).into()]);
        written.add(output.write(&[(&Rendered { name: "cpu.folded".into(), bytes: b"y".to_vec() }).into()]));
        assert_eq!(written.written, ["report.md", "cpu.folded"]);
        assert_eq!(written.notes.len(), 1, "{:?}", written.notes);
        assert!(written.notes[0].contains("removed during the trace"), "{:?}", written.notes);
    }

    #[test]
    fn only_the_previous_runs_own_files_are_removed_as_stale() {
        let dir = tempfile::tempdir().unwrap();
        let previous = r#"{"run": {"outputs": ["alloc.svg", "report.json", "../escape", "notes.txt"]}}"#;
        std::fs::write(dir.path().join("report.json"), previous).unwrap();
        for name in ["alloc.svg", "notes.txt"] {
            std::fs::write(dir.path().join(name), "old").unwrap();
        }
        let mut output = OutputDir::prepare(dir.path(), None).unwrap();
        let written =
            output.write(&[(&Rendered { name: "report.json".into(), bytes: b"{}".to_vec() }).into()]);
        assert_eq!(output.remove_stale(&written.written), ["alloc.svg"]);
        assert!(dir.path().join("notes.txt").exists(), "a file sysprof did not write is kept");
    }
}
