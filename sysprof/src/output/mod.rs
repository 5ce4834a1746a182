//! The write stage: the output directory and one file per format behind the [`Sink`] trait.
//!
//! Every file but report.json is rendered in memory first (that one is serialized straight into
//! its file, see `json.rs`; the stack profiles' one at a time, see [`Profiles`]), then written
//! into the directory, opened and checked for each write, relative to its descriptor: to a
//! fresh temporary name (`O_CREAT|O_EXCL|O_NOFOLLOW`)
//! that is then renamed over the final one. A symlink planted in the directory is replaced,
//! never followed, and a full disk leaves the earlier file whole, never a truncated one.
//! Through sudo all of it happens as the invoking user ([`InvokingUser::act`]): the directories
//! and files are theirs, and nothing is written where they could not write themselves. As root
//! (not through sudo), the directory is reached only through directories no other user can
//! change (`open_dir_as_root`): a path another user could redirect is refused. Either way the
//! directory is held open from the start, and what is written goes into it, by its descriptor.

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
    fcntl::{AtFlags, OFlag, openat, renameat},
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
    input::{self, Links},
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

/// A run's stack profiles, rendered one at a time as they are written (`finish::write_all`):
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
    matches!(name, "report.md" | "report.json" | crate::record::FILE_NAME | crate::timeline::FILE_NAME)
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
/// lost to a typo, and held open from then: what is written goes into the directory that was
/// checked, whatever its path names by the end.
#[derive(Debug)]
pub struct OutputDir {
    path: PathBuf,
    /// Through sudo: the user it is written as.
    user: Option<InvokingUser>,
    /// The directory, opened when it was checked.
    dir: OwnedFd,
    /// (st_dev, st_ino) of `dir`.
    identity: (u64, u64),
    /// Whether it was said that the path no longer leads to `dir` (said once).
    moved_said: bool,
    /// The directories `prepare` created, outermost first: removed again (when empty) if
    /// the run ends without writing anything.
    created: Vec<PathBuf>,
    /// What the previous run into this directory wrote (its report.json's file list).
    previous: Vec<String>,
    /// What the start found worth a line (a previous report.json that could not be read).
    notes: Vec<String>,
    wrote: bool,
}

impl OutputDir {
    /// Creates the directory if needed (as the invoking user) and checks that it is theirs or
    /// root's and that a file can be created in it. As root (not through sudo), the path must
    /// lead there through directories no other user can change (see `open_dir_as_root`).
    pub fn prepare(path: &Path, user: Option<InvokingUser>) -> anyhow::Result<Self> {
        let prepared = as_user(user.as_ref(), || {
            let (fd, created) = open_dir(path, user.as_ref())?;
            let meta = fstat(fd.as_fd())?;
            let probe =
                Rendered { name: format!(".sysprof-write-test-{}", std::process::id()), bytes: Vec::new() };
            write_at(&fd, &(&probe).into())?;
            unlinkat(fd.as_fd(), probe.name.as_str(), UnlinkatFlags::NoRemoveDir)?;
            let (previous, note) = previous_outputs(&fd, path);
            Ok::<_, std::io::Error>((fd, meta, created, previous, note))
        });
        let (dir, meta, created, previous, note) =
            prepared.and_then(|result| result).map_err(|e| output_error(path, e.to_string()))?;
        Ok(OutputDir {
            path: path.to_path_buf(),
            user,
            dir,
            identity: (meta.st_dev, meta.st_ino),
            moved_said: false,
            created,
            previous,
            notes: note.into_iter().collect(),
            wrote: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the start found worth a line, for the terminal.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Writes `files` in order (put the report first: it is what a full disk must not cost),
    /// each whole or not at all, into the directory checked at the start. Only one removed
    /// during the trace is looked for again by its path: created again, with the same checks,
    /// and the notes say so.
    pub fn write(&mut self, files: &[ToWrite<'_>]) -> Written {
        let mut outcome = Written::default();
        let removed = fstat(self.dir.as_fd()).map_or(true, |meta| meta.st_nlink == 0);
        let where_now = (!removed).then(|| self.location()).flatten();
        let result = as_user(self.user.as_ref(), || {
            if removed {
                let (fd, created) = open_dir(&self.path, self.user.as_ref())?;
                let meta = fstat(fd.as_fd()).map_err(std::io::Error::from)?;
                outcome.notes.push(if created.is_empty() {
                    format!(
                        "the output directory {} was replaced during the trace: wrote into the new one",
                        self.path.display()
                    )
                } else {
                    format!(
                        "the output directory {} was removed during the trace: created it again",
                        self.path.display()
                    )
                });
                self.dir = fd;
                self.identity = (meta.st_dev, meta.st_ino);
            } else if !self.moved_said {
                let named = std::fs::metadata(&self.path).map(|meta| {
                    use std::os::unix::fs::MetadataExt as _;
                    (meta.dev(), meta.ino())
                });
                if named.ok() != Some(self.identity) {
                    self.moved_said = true;
                    outcome.notes.push(format!(
                        "the output directory {} was moved during the trace: wrote into it where it is now{}",
                        self.path.display(),
                        where_now.as_ref().map_or(String::new(), |now| format!(", {}", now.display()))
                    ));
                }
            }
            for file in files {
                match write_at(&self.dir, file) {
                    Ok(()) => outcome.written.push(file.name().to_string()),
                    Err(error) => outcome.failed.push((file.name().to_string(), error.to_string())),
                }
            }
            Ok::<_, std::io::Error>(())
        });
        if let Err(error) = result.and_then(|r| r) {
            outcome.failed.extend(files.iter().map(|f| (f.name().to_string(), error.to_string())))
        }
        self.wrote |= !outcome.written.is_empty();
        outcome
    }

    /// Where the directory is now (it may have been moved), as the kernel names it.
    fn location(&self) -> Option<PathBuf> {
        use std::os::fd::AsRawFd as _;
        std::fs::read_link(format!("/proc/self/fd/{}", self.dir.as_raw_fd())).ok()
    }

    /// Room left in the directory's filesystem for the user, as (bytes free, block size).
    pub fn room(&self) -> Option<(u64, u64)> {
        as_user(self.user.as_ref(), || {
            let stats = nix::sys::statvfs::fstatvfs(self.dir.as_fd()).ok()?;
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
            stale
                .into_iter()
                .filter(|name| unlinkat(self.dir.as_fd(), name.as_str(), UnlinkatFlags::NoRemoveDir).is_ok())
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
/// and checks that it belongs to the user (or root). Runs with the user's identity. As root
/// without one, see [`open_dir_as_root`].
fn open_dir(path: &Path, user: Option<&InvokingUser>) -> std::io::Result<(OwnedFd, Vec<PathBuf>)> {
    if user.is_none() && nix::unistd::geteuid().is_root() {
        return open_dir_as_root(path);
    }
    let mut created = Vec::new();
    let absolute = std::path::absolute(path)?;
    let mut missing: Vec<&Path> = absolute.ancestors().take_while(|p| !p.exists()).collect();
    missing.reverse();
    // Where the missing part would go: a kernel filesystem takes no results.
    if let Some(existing) = absolute.ancestors().find(|p| p.exists())
        && let Ok(dir) = open_existing(existing)
    {
        not_kernel_filesystem(&dir)?;
    }
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
    not_kernel_filesystem(&fd)?;
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

/// How many symbolic links a path may lead through (the kernel's own limit, MAXSYMLINKS).
const MAX_LINKS: usize = 40;

/// As root (not through sudo): opens `path` one component at a time from `/`, never through a
/// directory another user can change, and creates what is missing of it there. Another user
/// who could change a directory on the way (theirs, or one anyone can write that is not sticky,
/// or their own entry in a sticky one, as /tmp) could make the path lead anywhere, root's
/// directories included, and root would write there; so such a path is refused, naming the
/// directory and its owner. A symbolic link on the way is followed only where it lies in a
/// directory that passes (no one else can have put it there). What is returned is the
/// directory that passed, held open: the writes go into it, by its descriptor.
fn open_dir_as_root(path: &Path) -> std::io::Result<(OwnedFd, Vec<PathBuf>)> {
    let absolute = std::path::absolute(path)?;
    let mut rest: std::collections::VecDeque<std::ffi::OsString> =
        absolute.components().skip(1).map(|part| part.as_os_str().to_owned()).collect();
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let root = || openat(nix::fcntl::AT_FDCWD, "/", flags, Mode::empty());
    let mut dir = root()?;
    let mut at = PathBuf::from("/");
    let mut created = Vec::new();
    let mut links = 0;
    while let Some(name) = rest.pop_front() {
        if name == ".." {
            dir = openat(dir.as_fd(), "..", flags, Mode::empty())?;
            at.pop();
            continue;
        }
        let parent = fstat(dir.as_fd())?;
        let entry = match nix::sys::stat::fstatat(dir.as_fd(), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
        {
            Ok(entry) => Some(entry),
            Err(nix::errno::Errno::ENOENT) => None,
            Err(error) => return Err(error.into()),
        };
        changeable_only_by_root(&parent, entry.as_ref(), &at, &name)?;
        let Some(entry) = entry else {
            // Missing: made here, root's, in a directory only root can change.
            not_kernel_filesystem(&dir)?;
            match nix::sys::stat::mkdirat(dir.as_fd(), name.as_os_str(), Mode::from_bits_truncate(0o755)) {
                Ok(()) => created.push(at.join(&name)),
                // Made meanwhile: looked at again.
                Err(nix::errno::Errno::EEXIST) => {}
                Err(error) => return Err(error.into()),
            }
            rest.push_front(name);
            continue;
        };
        if entry.st_mode & libc::S_IFMT == libc::S_IFLNK {
            links += 1;
            if links > MAX_LINKS {
                return Err(std::io::Error::from_raw_os_error(libc::ELOOP));
            }
            let target = nix::fcntl::readlinkat(dir.as_fd(), name.as_os_str())?;
            let target = Path::new(&target);
            for part in target.components().rev() {
                match part {
                    std::path::Component::RootDir | std::path::Component::Prefix(_) => {}
                    std::path::Component::CurDir => {}
                    other => rest.push_front(other.as_os_str().to_owned()),
                }
            }
            if target.is_absolute() {
                dir = root()?;
                at = PathBuf::from("/");
            }
            continue;
        }
        if entry.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(match rest.is_empty() {
                true => std::io::Error::other("it is a file, not a directory"),
                false => {
                    std::io::Error::other(format!("{} is a file, not a directory", at.join(&name).display()))
                }
            });
        }
        dir = openat(dir.as_fd(), name.as_os_str(), flags, Mode::empty())?;
        at.push(&name);
    }
    not_kernel_filesystem(&dir)?;
    let meta = fstat(dir.as_fd())?;
    if meta.st_uid != 0 {
        return Err(std::io::Error::other(format!(
            "it belongs to uid {}, not to uid 0: sysprof writes only into a directory of yours or root's",
            meta.st_uid
        )));
    }
    if meta.st_mode & 0o022 != 0 && meta.st_mode & libc::S_ISVTX == 0 {
        return Err(std::io::Error::other(format!(
            "it is writable by others (mode {:o}): as root, sysprof writes only where no one else can replace \
             what it wrote",
            meta.st_mode & 0o7777
        )));
    }
    Ok((dir, created))
}

/// Whether entry `name` of directory `at` (`parent`; `entry` when it exists) can be changed by
/// root alone: `at` is root's, and no one else can write in it, or it is sticky (as /tmp) and
/// the entry is root's (or not there yet: root makes it, and no one else can take it away).
fn changeable_only_by_root(
    parent: &nix::sys::stat::FileStat,
    entry: Option<&nix::sys::stat::FileStat>,
    at: &Path,
    name: &std::ffi::OsStr,
) -> std::io::Result<()> {
    let refuse = |what: String| {
        Err(std::io::Error::other(format!(
            "{what}, who could change where the path leads: as root, sysprof writes only through \
             directories no other user can change (run it through sudo as that user to write as them)"
        )))
    };
    if parent.st_uid != 0 {
        return refuse(format!("{} belongs to {}", at.display(), owner_name(parent.st_uid)));
    }
    let others_write = parent.st_mode & 0o022 != 0;
    let sticky = parent.st_mode & libc::S_ISVTX != 0;
    match entry {
        _ if !others_write => Ok(()),
        None if sticky => Ok(()),
        Some(entry) if sticky && entry.st_uid == 0 => Ok(()),
        Some(entry) if sticky => {
            refuse(format!("{} belongs to {}", at.join(name).display(), owner_name(entry.st_uid)))
        }
        _ => refuse(format!("{} is writable by others (mode {:o})", at.display(), parent.st_mode & 0o7777)),
    }
}

/// "name (uid N)", or "uid N" for a uid with no name.
fn owner_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(user)) => format!("{} (uid {uid})", user.name),
        _ => format!("uid {uid}"),
    }
}

/// Kernel filesystems, by their magic number (statfs(2)): they hold the kernel's files, and
/// a write there fails in ways that say nothing of why (`No such file or directory` in /proc).
const KERNEL_FILESYSTEMS: [(i64, &str); 12] = [
    (0x9fa0, "proc"),
    (0x6265_6572, "sysfs"),
    (0x6367_7270, "cgroup2"),
    (0x0027_e0eb, "cgroup"),
    (0x6462_6720, "debugfs"),
    (0x7472_6163, "tracefs"),
    (0xcafe_4a11, "bpf"),
    (0x7363_6673, "securityfs"),
    (0x1cd1, "devpts"),
    (0x6165_676c, "pstore"),
    (0x6265_6570, "configfs"),
    (0xde5e_81e4, "efivarfs"),
];

/// Refuses a directory on a kernel filesystem: no place for results.
fn not_kernel_filesystem(dir: &OwnedFd) -> std::io::Result<()> {
    let kind = nix::sys::statfs::fstatfs(dir.as_fd())?.filesystem_type().0 as i64;
    match KERNEL_FILESYSTEMS.iter().find(|(magic, _)| *magic == kind) {
        Some((_, name)) => Err(std::io::Error::other(format!(
            "it is on {name}, a filesystem of the kernel's own files: not a place for results"
        ))),
        None => Ok(()),
    }
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

/// The most of a previous report.json read (a busy machine's is megabytes).
const PREVIOUS_REPORT_LIMIT: u64 = 256 << 20;

/// The files the previous run into this directory wrote, from its report.json (`path` is the
/// directory, for the note): a regular file only, read with a bound; one that cannot be read
/// leaves those files as they are, with a note that says why.
fn previous_outputs(dir: &OwnedFd, path: &Path) -> (Vec<String>, Option<String>) {
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
    let shown = path.join(json::FILE);
    let ignored = |why: String| {
        (Vec::new(), Some(format!("{why}: the earlier run's files there are left as they are")))
    };
    let file = match input::open_regular_at(dir.as_fd(), Path::new(json::FILE), Links::Refuse, &shown) {
        Ok(file) => file,
        Err(input::InputError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return (Vec::new(), None);
        }
        Err(error) => return ignored(error.to_string()),
    };
    match file.metadata() {
        Ok(meta) if meta.len() > PREVIOUS_REPORT_LIMIT => {
            return ignored(
                input::InputError::TooLarge { path: shown, limit: PREVIOUS_REPORT_LIMIT }.to_string(),
            );
        }
        _ => {}
    }
    // Bounded whatever the size said (the file can grow while it is read).
    let reader = std::io::BufReader::new(std::io::Read::take(file, PREVIOUS_REPORT_LIMIT));
    match serde_json::from_reader::<_, Earlier>(reader) {
        Ok(report) => (report.run.outputs.into_iter().filter(|n| is_sysprof_output(n)).collect(), None),
        Err(error) => ignored(format!("{}: not a report sysprof wrote ({error})", shown.display())),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

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
    fn a_fifo_as_the_previous_report_is_passed_over_at_once_with_a_note() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("report.json");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).unwrap();
        let started = std::time::Instant::now();
        let output = OutputDir::prepare(dir.path(), None).unwrap();
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "the start waited on the FIFO");
        assert_eq!(
            output.notes(),
            [format!(
                "{}: not a regular file (a FIFO); sysprof reads only regular files here: the earlier run's files \
                 there are left as they are",
                fifo.display()
            )]
        );
        std::fs::remove_file(&fifo).unwrap();
        std::fs::write(&fifo, "not json").unwrap();
        let output = OutputDir::prepare(dir.path(), None).unwrap();
        assert!(output.notes()[0].contains("not a report sysprof wrote"), "{:?}", output.notes());
    }

    #[test]
    fn a_kernel_filesystem_is_no_place_for_results() {
        for path in ["/proc/self", "/proc/self/results", "/sys/kernel"] {
            let error = OutputDir::prepare(Path::new(path), None).unwrap_err().to_string();
            assert!(error.contains(": not a place for results"), "{path}: {error}");
        }
    }

    #[test]
    fn as_root_a_path_another_user_can_change_is_refused_and_the_checked_directory_written() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        // Another user's directory on the way, and a link of theirs in it to one of root's.
        let theirs = dir.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        let roots = dir.path().join("roots");
        std::fs::create_dir(&roots).unwrap();
        std::os::unix::fs::symlink(&roots, theirs.join("link")).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        for path in [theirs.join("link"), theirs.join("new"), theirs.clone()] {
            let error = OutputDir::prepare(&path, None).unwrap_err().to_string();
            assert!(error.contains("uid 65534"), "{}: {error}", path.display());
        }
        assert_eq!(std::fs::read_dir(&roots).unwrap().count(), 0);
        assert!(!theirs.join("new").exists());
        // A directory anyone can write (not sticky) on the way: refused too.
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = OutputDir::prepare(&open.join("out"), None).unwrap_err().to_string();
        assert!(error.contains("is writable by others (mode 777)"), "{error}");
        // Root's own link in root's directory is followed; the directory moved during the
        // trace is still the one written.
        std::os::unix::fs::symlink(&roots, dir.path().join("mine")).unwrap();
        let mut output = OutputDir::prepare(&dir.path().join("mine/out"), None).unwrap();
        std::fs::rename(roots.join("out"), roots.join("moved")).unwrap();
        std::fs::create_dir(roots.join("out")).unwrap();
        let written = output.write(&[(&Rendered { name: "report.md".into(), bytes: b"x".to_vec() }).into()]);
        assert_eq!(written.written, ["report.md"]);
        assert!(roots.join("moved/report.md").is_file());
        assert!(!roots.join("out/report.md").exists());
        assert!(written.notes[0].contains("was moved during the trace"), "{:?}", written.notes);
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
