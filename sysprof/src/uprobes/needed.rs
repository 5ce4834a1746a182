//! The shared libraries a program will load at start (its DT_NEEDED closure), resolved as the
//! dynamic loader resolves them. A launched command's libraries (CUDA, NCCL, its allocator, a
//! `--func` library) can then be probed before it runs its first instruction: a short program
//! may make all its calls before any memory-map rescan would notice the libraries.
//!
//! The search runs with the rights of the user the command runs as (through sudo): a RUNPATH
//! into a directory only root can read finds nothing there, as the command's own loader finds
//! nothing. And where sysprof loads a library into itself as root (NVML), [`trusted_location`]
//! finds it as the loader would with no caller's library path at all.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    fs::File,
    path::{Path, PathBuf},
};

use object::read::elf::{Dyn as _, FileHeader as _};

use crate::{
    input::{Links, open_regular},
    mapped::{self, Bounded},
    privileges::{InvokingUser, as_user},
};

/// Libraries the closure may hold before the search stops (a large framework has hundreds).
const MAX_LIBRARIES: usize = 512;

/// Every library `program` needs, directly or through its libraries, that `user` (sysprof
/// itself without one) can open: the files the command's loader, running as them, would load.
/// Probe one by opening it as `user` again (`Binary::open`): a file found here is one they
/// can read, whatever its path names by then.
pub fn needed_libraries(program: &Path, user: Option<&InvokingUser>) -> Vec<PathBuf> {
    // As root: ldconfig is root's program, run with a clean environment.
    let cache = LD_SO_CACHE.get_or_init(ld_so_cache);
    as_user(user, || closure(program, cache)).unwrap_or_default()
}

fn closure(program: &Path, cache: &HashMap<String, PathBuf>) -> Vec<PathBuf> {
    let env_dirs: Vec<PathBuf> =
        std::env::var_os("LD_LIBRARY_PATH").map(|v| std::env::split_paths(&v).collect()).unwrap_or_default();
    let mut found = Vec::new();
    let mut seen: HashSet<PathBuf> = HashSet::new();
    // Each file's dynamic section is read as it is found, from the file that was opened: no
    // descriptor waits in the queue.
    let Some(first) = read_dynamic(program) else { return found };
    let mut queue: VecDeque<(PathBuf, Dynamic)> = VecDeque::from([(program.to_path_buf(), first)]);
    while let Some((file, dynamic)) = queue.pop_front() {
        if found.len() >= MAX_LIBRARIES {
            break;
        }
        let origin = file.parent().map(Path::to_path_buf).unwrap_or_default();
        let expand = |dirs: &[String]| -> Vec<PathBuf> {
            dirs.iter()
                .flat_map(|d| d.split(':'))
                .filter(|d| !d.is_empty())
                .map(|d| {
                    PathBuf::from(
                        d.replace("$ORIGIN", &origin.to_string_lossy())
                            .replace("${ORIGIN}", &origin.to_string_lossy()),
                    )
                })
                .collect()
        };
        // The loader's order: RPATH (when there is no RUNPATH), LD_LIBRARY_PATH, RUNPATH,
        // ld.so.cache, the default directories. The first that opens is the one: a file the
        // user cannot open is passed over, as their loader passes it over.
        let mut dirs = Vec::new();
        if dynamic.runpath.is_empty() {
            dirs.extend(expand(&dynamic.rpath));
        }
        dirs.extend(env_dirs.iter().cloned());
        dirs.extend(expand(&dynamic.runpath));
        for name in dynamic.needed {
            let candidates: Vec<PathBuf> = if name.contains('/') {
                vec![PathBuf::from(&name)]
            } else {
                dirs.iter()
                    .map(|dir| dir.join(&name))
                    .chain(cache.get(&name).cloned())
                    .chain(default_dirs().map(|dir| Path::new(dir).join(&name)))
                    .collect()
            };
            let Some((path, file)) = candidates
                .into_iter()
                .find_map(|path| open_regular(&path, Links::Follow).ok().map(|file| (path, file)))
            else {
                continue;
            };
            if !seen.insert(path.clone()) {
                continue;
            }
            found.push(path.clone());
            if let Some(dynamic) = read_dynamic_of(file) {
                queue.push_back((path, dynamic));
            }
        }
    }
    found
}

struct Dynamic {
    needed: Vec<String>,
    rpath: Vec<String>,
    runpath: Vec<String>,
}

fn read_dynamic(path: &Path) -> Option<Dynamic> {
    // Without blocking on a FIFO, and within a bound: a library a user put on the search path
    // may be anything.
    read_dynamic_of(open_regular(path, Links::Follow).ok()?)
}

fn read_dynamic_of(file: File) -> Option<Dynamic> {
    let cache = Bounded::new(file, mapped::READ_LIMIT);
    let elf = object::read::elf::ElfFile64::<object::Endianness, _>::parse(&cache).ok()?;
    let endian = elf.endian();
    let header = elf.elf_header();
    let data = elf.data();
    let sections = header.sections(endian, data).ok()?;
    let (dynamic, link) = sections.dynamic(endian, data).ok()??;
    let strings = sections.strings(endian, data, link).ok()?;
    let mut out = Dynamic { needed: Vec::new(), rpath: Vec::new(), runpath: Vec::new() };
    for entry in dynamic {
        let tag = entry.d_tag(endian);
        let text = || {
            let offset = entry.d_val(endian) as u32;
            strings.get(offset).ok().map(|s| String::from_utf8_lossy(s).into_owned())
        };
        match tag {
            object::elf::DT_NEEDED => out.needed.extend(text()),
            object::elf::DT_RPATH => out.rpath.extend(text()),
            object::elf::DT_RUNPATH => out.runpath.extend(text()),
            _ => {}
        }
    }
    Some(out)
}

fn default_dirs() -> impl Iterator<Item = &'static str> {
    [
        "/lib64",
        "/usr/lib64",
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib/aarch64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/lib",
        "/usr/lib",
    ]
    .into_iter()
}

/// Where the loader finds library `name` with no library path of the caller's (no
/// LD_LIBRARY_PATH, no RUNPATH): the loader's cache, then the standard directories. For what
/// sysprof loads into itself as root (NVML), which must still pass `privileges::trusted_library`.
pub fn trusted_location(name: &str) -> Option<PathBuf> {
    let cache = LD_SO_CACHE.get_or_init(ld_so_cache);
    cache
        .get(name)
        .cloned()
        .filter(|path| path.is_file())
        .or_else(|| default_dirs().map(|dir| Path::new(dir).join(name)).find(|path| path.is_file()))
}

/// What `library` needs (its DT_NEEDED names), in order.
pub fn needed_names(library: &Path) -> Vec<String> {
    read_dynamic(library).map(|dynamic| dynamic.needed).unwrap_or_default()
}

/// Where distributions install ldconfig. Never looked up on PATH: as root (through sudo, or with
/// a user's environment kept) a PATH entry another user can write would run their program.
const LDCONFIG: [&str; 2] = ["/sbin/ldconfig", "/usr/sbin/ldconfig"];

/// The loader's cache, read once per run: every probe family that looks for libraries asks.
static LD_SO_CACHE: std::sync::OnceLock<HashMap<String, PathBuf>> = std::sync::OnceLock::new();

/// soname -> path, from the loader's cache as `ldconfig -p` prints it (nothing when no trusted
/// ldconfig is found: the default directories are searched still).
fn ld_so_cache() -> HashMap<String, PathBuf> {
    let Some(ldconfig) = LDCONFIG.iter().map(Path::new).find(|path| path.is_file()) else {
        return HashMap::new();
    };
    let ldconfig = if crate::privileges::is_root() {
        match crate::privileges::trusted_library(ldconfig) {
            Ok(path) => path,
            Err(_) => return HashMap::new(),
        }
    } else {
        ldconfig.to_path_buf()
    };
    // A clean environment: no LD_PRELOAD or locale of the caller's, and the output in C's words.
    let Ok(output) = std::process::Command::new(ldconfig).arg("-p").env_clear().output() else {
        return HashMap::new();
    };
    let native = if cfg!(target_arch = "x86_64") { "x86-64" } else { "AArch64" };
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let (left, path) = line.trim().split_once(" => ")?;
            let (name, flags) = left.split_once(' ')?;
            // 32-bit libraries sit beside the 64-bit ones: keep the native ones.
            (flags.contains(native) || !flags.contains(',')).then(|| (name.to_string(), PathBuf::from(path)))
        })
        .fold(HashMap::new(), |mut map, (name, path)| {
            map.entry(name).or_insert(path);
            map
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_needs_libc() {
        let exe = std::env::current_exe().unwrap();
        let needed = needed_libraries(&exe, None);
        assert!(
            needed.iter().any(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))),
            "{needed:?}"
        );
        assert!(needed.iter().all(|p| p.is_file()));
    }

    #[test]
    fn the_loaders_cache_comes_from_ldconfig_at_its_fixed_place() {
        let cache = ld_so_cache();
        assert!(cache.get("libc.so.6").is_some_and(|path| path.is_file()), "{} entries", cache.len());
    }
}
