//! Snapshots of a process's executable mappings, taken while it lives, so that its addresses
//! can still be symbolized after it exits.

use std::{
    collections::{BTreeMap, BTreeSet},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::Arc,
};

use procfs::process::MMapPath;

use crate::mapped::FileKey;

mod query;

/// What backs an executable mapping.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Backing {
    /// An ELF file: `path` as the process saw it, `open` as sysprof can open it, `key` the file
    /// the process mapped (what is at `open` is read only while it is that file: see
    /// `mapped`). The paths are shared: one allocation for both where they are the same file
    /// (most are), and one for every process mapping the file (a busy host's thousands of
    /// short processes map the same few).
    File {
        path: Arc<Path>,
        open: Arc<Path>,
        #[serde(default)]
        key: FileKey,
    },
    /// The kernel's vDSO.
    Vdso,
    /// Anonymous executable memory: JIT code, described by /tmp/perf-PID.map when the runtime
    /// writes one.
    Anonymous,
    /// Anything else (`[vsyscall]`, ...).
    Other(String),
}

impl Backing {
    /// The module name of anonymous executable memory's frames.
    pub const ANONYMOUS_NAME: &'static str = "[anon]";
}

/// One executable mapping.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// Offset in the file of `start`.
    pub file_offset: u64,
    pub backing: Backing,
}

impl Mapping {
    /// Offset in the backing file of an address inside this mapping (saturated: the kernel
    /// writes any offset a mapping was made at, which no file need have).
    pub fn file_offset_of(&self, addr: u64) -> u64 {
        (addr - self.start).saturating_add(self.file_offset)
    }

    /// Short module name for reports: the file name, or `[vdso]`, `[anon]`.
    pub fn module_name(&self) -> String {
        match &self.backing {
            Backing::File { path, .. } => path
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.display().to_string()),
            Backing::Vdso => "[vdso]".into(),
            Backing::Anonymous => Backing::ANONYMOUS_NAME.into(),
            Backing::Other(name) => name.clone(),
        }
    }
}

/// The executable mappings of one process, sorted by address.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcessMaps {
    mappings: Vec<Mapping>,
    /// The process's user when its maps were read: whose files in /tmp (perf maps) it may
    /// have written.
    owner: Option<u32>,
    /// Where the vDSO's code is in the latest read (see [`ProcessMaps::vdso`]); not saved.
    #[serde(skip)]
    vdso: u64,
}

impl ProcessMaps {
    /// Reads the process's executable mappings now.
    pub fn read(pid: u32) -> std::io::Result<Self> {
        Ok(Self::read_if_changed(pid, None)?.map_or_else(Self::default, |(maps, _)| maps))
    }

    /// Reads the process's executable mappings now, when they differ from those whose digest
    /// is `known`; returns them with their digest. A process's maps are read again every few
    /// seconds, and are nearly always unchanged: then nothing is parsed or looked up.
    pub fn read_if_changed(pid: u32, known: Option<u64>) -> std::io::Result<Option<(Self, u64)>> {
        if let Some(listed) = query::executable_mappings(pid) {
            let listed = listed?;
            let digest = query::digest(&listed);
            if known == Some(digest) {
                return Ok(None);
            }
            let mappings = listed.into_iter().map(|listed| {
                let path = mmap_path(&listed.name);
                let key = FileKey { device: listed.device, inode: listed.inode };
                (listed.start, listed.end, listed.offset, key, path)
            });
            return Ok(Some((Self::from_listed(pid, mappings), digest)));
        }
        Self::read_text_if_changed(pid, known)
    }

    /// `read_if_changed` from the maps file's text: kernels before 6.11.
    fn read_text_if_changed(pid: u32, known: Option<u64>) -> std::io::Result<Option<(Self, u64)>> {
        use std::hash::{Hash as _, Hasher as _};
        let text = crate::target::read_proc_text(&format!("/proc/{pid}/maps"))?;
        let lines: Vec<&str> = executable_lines(&text).collect();
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        lines.hash(&mut hasher);
        let digest = hasher.finish();
        if known == Some(digest) {
            return Ok(None);
        }
        Ok(Some((Self::parse(pid, lines.into_iter()), digest)))
    }

    /// The mappings of `pid` from its maps file's text (the fuzz target's door,
    /// `fuzzing::proc_maps`).
    pub fn parse_text(pid: u32, text: &str) -> Self {
        Self::parse(pid, executable_lines(text))
    }

    /// The mappings of `pid` from its maps' executable lines (see `parse_line`).
    fn parse<'a>(pid: u32, lines: impl Iterator<Item = &'a str>) -> Self {
        let parsed = lines.filter_map(parse_line);
        let mappings = parsed.map(|map| {
            let (major, minor) = (map.dev.0 as u32, map.dev.1 as u32);
            let key = FileKey { device: libc::makedev(major, minor), inode: map.inode };
            (map.address.0, map.address.1, map.offset, key, map.pathname)
        });
        Self::from_listed(pid, mappings)
    }

    /// The mappings of `pid` from (start, end, file offset, device and inode, name) as the
    /// kernel listed them.
    fn from_listed(pid: u32, listed: impl Iterator<Item = (u64, u64, u64, FileKey, MMapPath)>) -> Self {
        let mut mappings: Vec<Mapping> = listed
            .map(|(start, end, file_offset, key, name)| Mapping {
                start,
                end,
                file_offset,
                backing: match name {
                    MMapPath::Path(path) => file_backing(pid, path, key, (start, end)),
                    MMapPath::Vdso => Backing::Vdso,
                    MMapPath::Anonymous => Backing::Anonymous,
                    other => Backing::Other(format!("{other:?}").to_lowercase()),
                },
            })
            .collect();
        mappings.sort_by_key(|m| m.start);
        // Kept for the process table's life, for every process a busy host ran.
        mappings.shrink_to_fit();
        let owner = std::fs::metadata(format!("/proc/{pid}")).ok().map(|meta| meta.uid());
        let vdso = vdso_of(&mappings);
        ProcessMaps { mappings, owner, vdso }
    }

    /// The process's user (see the field).
    pub fn owner(&self) -> Option<u32> {
        self.owner
    }

    /// From mappings given directly (tests, and processes whose maps were read elsewhere).
    pub fn from_mappings(mut mappings: Vec<Mapping>) -> Self {
        mappings.sort_by_key(|m| m.start);
        let vdso = vdso_of(&mappings);
        ProcessMaps { mappings, owner: None, vdso }
    }

    /// Where the vDSO's code is mapped as of the latest read, 0 when it has none: what the
    /// address space is known by (a new program's is chosen at its exec). Not the kept
    /// mappings' (see `merge_later`): after an exec sysprof did not hear of, they hold the old
    /// program's vDSO beside the new one's.
    pub fn vdso(&self) -> u64 {
        self.vdso
    }

    pub fn is_empty(&self) -> bool {
        self.mappings.is_empty()
    }

    pub fn mappings(&self) -> &[Mapping] {
        &self.mappings
    }

    /// The mapping that contains `addr`.
    pub fn find(&self, addr: u64) -> Option<&Mapping> {
        let index = self.mappings.partition_point(|m| m.start <= addr);
        let candidate = self.mappings.get(index.checked_sub(1)?)?;
        (addr < candidate.end).then_some(candidate)
    }

    /// Folds in a later snapshot of the same address space (libraries loaded since, code
    /// unmapped since): later mappings win where they overlap, earlier ones are kept elsewhere
    /// because samples taken before an unmap still point into them.
    pub fn merge_later(&mut self, later: ProcessMaps) {
        let mut merged: Vec<Mapping> = self
            .mappings
            .drain(..)
            .filter(|old| !later.mappings.iter().any(|new| new.start < old.end && old.start < new.end))
            .collect();
        merged.extend(later.mappings);
        merged.sort_by_key(|m| m.start);
        self.mappings = merged;
        self.owner = later.owner.or(self.owner);
        self.vdso = later.vdso;
    }
}

fn vdso_of(mappings: &[Mapping]) -> u64 {
    mappings.iter().find(|m| matches!(m.backing, Backing::Vdso)).map_or(0, |m| m.start)
}

/// One line of a maps file: procfs reads its numbers, `mmap_path` its name. Line by line, so
/// that a line procfs cannot read costs its own mapping, not all of the process's.
fn parse_line(line: &str) -> Option<procfs::process::MemoryMap> {
    use procfs::FromBufRead as _;
    let mut fields = line.splitn(6, ' ');
    let numbers: Vec<&str> = fields.by_ref().take(5).collect();
    let name = fields.next().unwrap_or_default();
    // The numbers with no name: an anonymous mapping's line.
    let numbers = format!("{} \n", numbers.join(" "));
    let mut map = procfs::process::MemoryMaps::from_buf_read(numbers.as_bytes()).ok()?.0.pop()?;
    map.pathname = mmap_path(name);
    Some(map)
}

/// What a maps name names, as procfs's `MMapPath::from` says, but for the names it slices by
/// byte and panics on: one that starts with `/SYSV` and is not a System V segment's
/// (`/SYSV0000abcd`), and a bracketed one (`[stack:TID]`) that is not ASCII. A user's file
/// shows as `/SYSV` when it is mapped from a mount namespace of theirs that the reader's root
/// does not reach (`unshare -Urm`, then `pivot_root` into a tmpfs holding it): a path.
fn mmap_path(name: &str) -> MMapPath {
    let name = name.trim();
    let key = name.get(5..13).is_some_and(|key| key.bytes().all(|byte| byte.is_ascii_hexdigit()));
    if name.starts_with("/SYSV") && !key {
        return MMapPath::Path(PathBuf::from(name));
    }
    if name.starts_with('[') && !name.is_ascii() {
        return MMapPath::Other(name.to_string());
    }
    MMapPath::from(name).unwrap_or_else(|_| MMapPath::Other(name.to_string()))
}

/// The lines of a maps file whose mappings are executable (`r-xp`: the third permission).
fn executable_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter(|line| {
        line.split_ascii_whitespace().nth(1).is_some_and(|perms| perms.as_bytes().get(2) == Some(&b'x'))
    })
}

/// Where sysprof can open a mapped file: the path itself when it is the same file (same device
/// and inode), else through the process's root (containers) or map_files (deleted files), which
/// only work while the process lives. Whichever it is, it is read only while it is the file
/// `key` names (see `mapped::open`): this is where to look, not a promise of what is there.
fn file_backing(pid: u32, path: PathBuf, key: FileKey, (start, end): (u64, u64)) -> Backing {
    let deleted_suffix = " (deleted)";
    let text = path.to_string_lossy();
    if let Some(original) = text.strip_suffix(deleted_suffix) {
        return Backing::File {
            path: interned(Path::new(original)),
            open: PathBuf::from(format!("/proc/{pid}/map_files/{start:x}-{end:x}")).into(),
            key,
        };
    }
    let path = interned(&path);
    let open = if same_file(&path, key) { None } else { Some(in_process_root(pid, &path).into()) };
    Backing::File { open: open.unwrap_or_else(|| path.clone()), path, key }
}

/// Whether `path` is, in sysprof's view, the file `key` names that a process mapped under that
/// name. Asked once per file and key: every read of a process's maps asks it for each of its
/// mapped files, the same few libraries over and over (a `make -j2` of 16 files read maps 169
/// times and stat'ed 1,247 paths). A file replaced at the path (a package upgrade) has a new
/// inode, which is asked anew; the processes that still map the old one show it deleted, and
/// are read through map_files (see `file_backing`).
fn same_file(path: &Arc<Path>, key: FileKey) -> bool {
    static KNOWN: std::sync::Mutex<BTreeMap<(Arc<Path>, FileKey), bool>> =
        std::sync::Mutex::new(BTreeMap::new());
    let mut known = KNOWN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    *known
        .entry((path.clone(), key))
        .or_insert_with(|| std::fs::metadata(path).is_ok_and(|meta| FileKey::of(&meta) == key))
}

/// The one shared copy of `path` among every process's mappings.
fn interned(path: &Path) -> Arc<Path> {
    static PATHS: std::sync::Mutex<BTreeSet<Arc<Path>>> = std::sync::Mutex::new(BTreeSet::new());
    let mut paths = PATHS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(known) = paths.get(path) {
        return known.clone();
    }
    let path: Arc<Path> = path.into();
    paths.insert(path.clone());
    path
}

fn in_process_root(pid: u32, path: &Path) -> PathBuf {
    let relative = path.strip_prefix("/").unwrap_or(path);
    Path::new(&format!("/proc/{pid}/root")).join(relative)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(start: u64, end: u64, name: &str) -> Mapping {
        Mapping {
            start,
            end,
            file_offset: 0x1000,
            backing: Backing::File {
                path: Path::new(name).into(),
                open: Path::new(name).into(),
                key: FileKey::default(),
            },
        }
    }

    #[test]
    fn finds_the_mapping_of_an_address() {
        let maps = ProcessMaps::from_mappings(vec![
            mapping(0x3000, 0x4000, "/lib/b.so"),
            mapping(0x1000, 0x2000, "/bin/a"),
        ]);
        assert_eq!(maps.find(0x1000).unwrap().module_name(), "a");
        assert_eq!(maps.find(0x1fff).unwrap().module_name(), "a");
        assert!(maps.find(0x2000).is_none());
        assert!(maps.find(0x0fff).is_none());
        assert_eq!(maps.find(0x3abc).unwrap().module_name(), "b.so");
        assert_eq!(maps.find(0x3abc).unwrap().file_offset_of(0x3abc), 0x1abc);
    }

    /// An exec sysprof did not hear of: the old program's mappings are kept beside the new
    /// one's, but the address space is the new one's, known by its vDSO.
    #[test]
    fn the_vdso_is_that_of_the_latest_read() {
        let vdso = |start| Mapping { start, end: start + 0x2000, file_offset: 0, backing: Backing::Vdso };
        let mut maps = ProcessMaps::from_mappings(vec![mapping(0x1000, 0x2000, "/bin/a"), vdso(0x9000)]);
        assert_eq!(maps.vdso(), 0x9000);
        maps.merge_later(ProcessMaps::from_mappings(vec![mapping(0x3000, 0x4000, "/bin/b"), vdso(0x7000)]));
        assert_eq!(maps.mappings().len(), 4);
        assert_eq!(maps.vdso(), 0x7000);
        assert_eq!(ProcessMaps::from_mappings(vec![mapping(0x1000, 0x2000, "/bin/a")]).vdso(), 0);
    }

    #[test]
    fn later_snapshots_win_where_they_overlap() {
        let mut maps = ProcessMaps::from_mappings(vec![
            mapping(0x1000, 0x2000, "/bin/a"),
            mapping(0x5000, 0x6000, "/lib/old.so"),
        ]);
        maps.merge_later(ProcessMaps::from_mappings(vec![
            mapping(0x1000, 0x2000, "/bin/a"),
            mapping(0x5800, 0x7000, "/lib/new.so"),
        ]));
        let names: Vec<String> = maps.mappings().iter().map(Mapping::module_name).collect();
        assert_eq!(names, ["a", "new.so"]);
    }

    /// Both ways of reading a process's mappings give the same ones: sysprof's own (its
    /// libraries, vDSO and anonymous code where it has any) and a Python process's (dozens of
    /// extension modules).
    #[test]
    fn the_query_lists_what_the_text_does() {
        if !query::supported() {
            // The platform's kernel (6.18) has it; an older one reads the text, tested below.
            assert!(std::env::var_os("CI").is_none(), "PROCMAP_QUERY is missing on this kernel");
            eprintln!("PROCMAP_QUERY is not supported here (Linux 6.11+): only the text is read");
            return;
        }
        let mut python = std::process::Command::new("python3")
            .args(["-c", "import json, decimal, sqlite3, ctypes, sys; print(flush=True); sys.stdin.read()"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(python.stdout.take().unwrap()), &mut line)
            .unwrap();
        for pid in [std::process::id(), python.id()] {
            let queried = ProcessMaps::read(pid).unwrap();
            let (mut text, _) = ProcessMaps::read_text_if_changed(pid, None).unwrap().unwrap();
            // The one line of the text the query does not list: `[vsyscall]`, the legacy page
            // of the kernel's, not a mapping of the process (code there runs in the kernel).
            text.mappings.retain(|m| m.backing != Backing::Other("vsyscall".into()));
            assert_eq!(queried, text, "process {pid}");
            assert!(queried.vdso() != 0 && queried.vdso() == text.vdso());
            assert!(queried.mappings().len() >= 3, "{queried:?}");
        }
        let (queried, digest) = ProcessMaps::read_if_changed(python.id(), None).unwrap().unwrap();
        assert!(queried.mappings().iter().any(|m| m.module_name().starts_with("_sqlite3")), "{queried:?}");
        assert_eq!(ProcessMaps::read_if_changed(python.id(), Some(digest)).unwrap(), None);
        python.kill().unwrap();
        python.wait().unwrap();
        assert!(ProcessMaps::read_if_changed(python.id(), None).is_err(), "a process gone has no maps");
    }

    /// A name procfs would slice as a System V segment's key, and panic on, is a path (the
    /// fuzzer's find: `fuzz/regressions/proc_maps/`); a line procfs cannot read costs only
    /// its own mapping.
    #[test]
    fn a_file_named_like_a_sysv_segment_is_a_file_and_a_bad_line_costs_only_itself() {
        assert_eq!(mmap_path("/SYSV"), MMapPath::Path("/SYSV".into()));
        assert_eq!(mmap_path("/SYSVab\u{e9}cdefg"), MMapPath::Path("/SYSVab\u{e9}cdefg".into()));
        assert_eq!(mmap_path("/SYSVnothexok (deleted)"), MMapPath::Path("/SYSVnothexok (deleted)".into()));
        assert_eq!(mmap_path("/SYSV0000abcd (deleted)"), MMapPath::Vsys(0xabcd));
        assert_eq!(mmap_path("[vdso]"), MMapPath::Vdso);
        assert_eq!(mmap_path("[stack:\u{90}"), MMapPath::Other("[stack:\u{90}".into()));
        assert_eq!(mmap_path("   "), MMapPath::Anonymous);
        let text = "1000-2000 r-xp 00000000 00:2a 7                  /SYSV\n\
                    3000-4000 r-xp 00001000 fe:01 8 /usr/lib/a name.so\n\
                    zz-5000 r-xp 00000000 00:00 0 /not/a/line\n\
                    5000-6000 r-xp 00000000 00:00 0 \n";
        let maps = ProcessMaps::parse_text(u32::MAX, text);
        let names: Vec<String> = maps.mappings().iter().map(Mapping::module_name).collect();
        assert_eq!(names, ["SYSV", "a name.so", "[anon]"]);
        assert_eq!(maps.mappings()[1].file_offset, 0x1000);
    }

    #[test]
    fn reads_its_own_maps() {
        let maps = ProcessMaps::read(std::process::id()).unwrap();
        let here = reads_its_own_maps as *const () as u64;
        let mapping = maps.find(here).expect("this function is in an executable mapping");
        assert!(matches!(mapping.backing, Backing::File { .. }));
    }
}
