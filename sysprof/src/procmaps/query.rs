//! A process's executable mappings asked of the kernel one by one with `PROCMAP_QUERY`
//! (Linux 6.11+), instead of its whole maps file formatted as text and parsed back.
//!
//! sysprof reads the maps of every process it follows at its exec and again as it maps
//! libraries: a `make -j2` of 16 files read them 169 times, and that was 27% of sysprof's own
//! CPU time during the build, most of it the kernel writing out every mapping of the process
//! (a Python process has 170, of which 32 are code) and sysprof parsing them back. Here the
//! kernel walks to the executable mappings only and hands them over as numbers: 21 us for that
//! Python process against 115 for its text, before any parsing. It also holds the target's
//! memory map lock for less time, which its own page faults wait on.
//!
//! The text lists one line the query does not: `[vsyscall]`, the kernel's legacy page at a
//! fixed address, which is no mapping of the process (a call there traps into the kernel).
//! Kernels before 6.11 answer `ENOTTY`; from then on every read is the text's.

use std::{
    fs::File,
    hash::{Hash as _, Hasher as _},
    io,
    os::fd::AsRawFd as _,
    sync::atomic::{AtomicBool, Ordering},
};

/// `_IOWR('f', 17, struct procmap_query)`, from `include/uapi/linux/fs.h`.
const PROCMAP_QUERY: libc::c_ulong = 0xC068_6611;
/// Only mappings with execute permission.
const VMA_EXECUTABLE: u64 = 0x04;
/// The mapping at the address asked, or the next one above it: a walk over the address space.
const COVERING_OR_NEXT_VMA: u64 = 0x10;

/// `struct procmap_query` as Linux 6.11 defined it; the kernel takes its size from `size`.
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    /// In: the name buffer's size; out: the name's length with its NUL, 0 for none.
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// Set at the first `ENOTTY`: the kernel has no `PROCMAP_QUERY`.
static UNSUPPORTED: AtomicBool = AtomicBool::new(false);

/// One executable mapping, as the kernel describes it.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct Listed {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    /// The mapped file's device (as `stat` gives it) and inode; 0 for anonymous memory.
    pub device: u64,
    pub inode: u64,
    /// The maps file's name of it: a path (with " (deleted)" after a file removed since),
    /// `[vdso]`, or empty for anonymous memory.
    pub name: String,
}

/// The executable mappings of `pid`, by address; `None` where this way cannot tell and the
/// text must be read: a kernel without `PROCMAP_QUERY`, or a mapping it could not name (a
/// path longer than `PATH_MAX`).
pub(super) fn executable_mappings(pid: u32) -> Option<io::Result<Vec<Listed>>> {
    if UNSUPPORTED.load(Ordering::Relaxed) {
        return None;
    }
    let file = match File::open(format!("/proc/{pid}/maps")) {
        Ok(file) => file,
        Err(error) => return Some(Err(error)),
    };
    let mut name = vec![0u8; libc::PATH_MAX as usize];
    let mut listed = Vec::new();
    let mut address = 0;
    loop {
        let mut query = ProcmapQuery {
            size: size_of::<ProcmapQuery>() as u64,
            query_flags: VMA_EXECUTABLE | COVERING_OR_NEXT_VMA,
            query_addr: address,
            vma_name_addr: name.as_mut_ptr() as u64,
            vma_name_size: name.len() as u32,
            ..Default::default()
        };
        // SAFETY: the query is a `struct procmap_query` of the size it states, and the name
        // buffer it points to is as long as it says, and lives past the call.
        if unsafe { libc::ioctl(file.as_raw_fd(), PROCMAP_QUERY, &raw mut query) } != 0 {
            let error = io::Error::last_os_error();
            return match error.raw_os_error() {
                // No mapping at or above the address: the walk is over.
                Some(libc::ENOENT) => Some(Ok(listed)),
                Some(libc::ENOTTY) => {
                    UNSUPPORTED.store(true, Ordering::Relaxed);
                    None
                }
                // The process is gone, or was never a user process (a kernel thread).
                Some(libc::ESRCH) => Some(Err(error)),
                _ => None,
            };
        }
        let length = (query.vma_name_size as usize).saturating_sub(1).min(name.len());
        let Ok(text) = std::str::from_utf8(&name[..length]) else {
            return Some(Err(io::Error::new(io::ErrorKind::InvalidData, "a mapped path that is not UTF-8")));
        };
        listed.push(Listed {
            start: query.vma_start,
            end: query.vma_end,
            offset: query.vma_offset,
            device: libc::makedev(query.dev_major, query.dev_minor),
            inode: query.inode,
            name: text.to_owned(),
        });
        if query.vma_end <= address {
            // The kernel never answers below the address asked; stop rather than loop.
            return Some(Ok(listed));
        }
        address = query.vma_end;
    }
}

/// What tells one listing of a process's executable mappings from another.
pub(super) fn digest(listed: &[Listed]) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    listed.hash(&mut hasher);
    hasher.finish()
}

/// Whether this kernel answers `PROCMAP_QUERY` (asked of sysprof's own maps).
#[cfg(test)]
pub(super) fn supported() -> bool {
    executable_mappings(std::process::id()).is_some()
}
