//! Reading files another user may control: regular files only, opened without blocking, read
//! with a bound, and an error that names the file.
//!
//! sysprof runs as root and reads what users hand it (`report DIR`, `merge`, `tables FILE`,
//! the previous run's `report.json` in `-o`) and what targets leave in `/tmp` (perf maps). A
//! FIFO in one of those places would block an `open` or a `read` for good, `/dev/zero` would be
//! read until memory runs out, and a sparse file can claim gigabytes it never wrote. Every such
//! read goes through [`read_regular`] (or [`open_regular`] for a reader of its own).

use std::{
    fs::File,
    io::Read as _,
    os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// Not a regular file: a FIFO, a device, a socket or a directory.
    #[error("{}: not a regular file ({kind}); sysprof reads only regular files here", path.display())]
    NotRegular { path: PathBuf, kind: &'static str },
    /// Larger than the reader's bound.
    #[error("{}: larger than the {} sysprof reads from such a file", path.display(), crate::report::format::bytes(*limit))]
    TooLarge { path: PathBuf, limit: u64 },
    /// A symbolic link where the caller asked for none.
    #[error("{}: a symbolic link, which sysprof does not follow here", path.display())]
    Link { path: PathBuf },
    /// Opening or reading failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Whether a link in the last component of the path is followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Links {
    Follow,
    Refuse,
}

/// Opens `path` for reading without blocking on a FIFO and returns it only when it is a
/// regular file (checked on the open descriptor, so nothing can be swapped in between).
pub fn open_regular(path: &Path, links: Links) -> Result<File, InputError> {
    let mut flags = libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;
    if links == Links::Refuse {
        flags |= libc::O_NOFOLLOW;
    }
    let file = std::fs::OpenOptions::new().read(true).custom_flags(flags).open(path).map_err(|source| {
        if links == Links::Refuse && source.raw_os_error() == Some(libc::ELOOP) {
            InputError::Link { path: path.to_path_buf() }
        } else {
            InputError::Io { path: path.to_path_buf(), source }
        }
    })?;
    let kind =
        file.metadata().map_err(|source| InputError::Io { path: path.to_path_buf(), source })?.file_type();
    if !kind.is_file() {
        return Err(InputError::NotRegular { path: path.to_path_buf(), kind: kind_name(kind) });
    }
    // Reads of a regular file never block; the flag goes anyway, for readers that poll.
    // SAFETY: fcntl on a descriptor this function owns.
    unsafe {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let status = libc::fcntl(fd, libc::F_GETFL);
        if status >= 0 {
            libc::fcntl(fd, libc::F_SETFL, status & !libc::O_NONBLOCK);
        }
    }
    Ok(file)
}

/// [`open_regular`] for `name` in the directory `dir` (held open: the file is looked up there,
/// whatever the directory's path names by now); `shown` is the path errors name.
pub fn open_regular_at(
    dir: std::os::fd::BorrowedFd<'_>,
    name: &Path,
    links: Links,
    shown: &Path,
) -> Result<File, InputError> {
    let mut flags = nix::fcntl::OFlag::O_RDONLY
        | nix::fcntl::OFlag::O_NONBLOCK
        | nix::fcntl::OFlag::O_CLOEXEC
        | nix::fcntl::OFlag::O_NOCTTY;
    if links == Links::Refuse {
        flags |= nix::fcntl::OFlag::O_NOFOLLOW;
    }
    let file = nix::fcntl::openat(dir, name, flags, nix::sys::stat::Mode::empty()).map(File::from).map_err(
        |errno| {
            if links == Links::Refuse && errno == nix::errno::Errno::ELOOP {
                InputError::Link { path: shown.to_path_buf() }
            } else {
                InputError::Io { path: shown.to_path_buf(), source: errno.into() }
            }
        },
    )?;
    // As `open_regular` checks it, on the descriptor.
    let kind =
        file.metadata().map_err(|source| InputError::Io { path: shown.to_path_buf(), source })?.file_type();
    if !kind.is_file() {
        return Err(InputError::NotRegular { path: shown.to_path_buf(), kind: kind_name(kind) });
    }
    // SAFETY: fcntl on a descriptor this function owns.
    unsafe {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let status = libc::fcntl(fd, libc::F_GETFL);
        if status >= 0 {
            libc::fcntl(fd, libc::F_SETFL, status & !libc::O_NONBLOCK);
        }
    }
    Ok(file)
}

/// The whole of the regular file at `path`, at most `limit` bytes of it.
pub fn read_regular(path: &Path, links: Links, limit: u64) -> Result<Vec<u8>, InputError> {
    read_bounded(open_regular(path, links)?, path, limit)
}

/// The whole of `file` (opened from `path`), at most `limit` bytes of it: what it holds, not
/// what its size claims (a sparse file claims what it never wrote, and a file can grow while
/// it is read).
pub fn read_bounded(file: File, path: &Path, limit: u64) -> Result<Vec<u8>, InputError> {
    let io = |source| InputError::Io { path: path.to_path_buf(), source };
    let claimed = file.metadata().map_err(io)?.len();
    if claimed > limit {
        return Err(InputError::TooLarge { path: path.to_path_buf(), limit });
    }
    let mut bytes = Vec::with_capacity(claimed as usize);
    file.take(limit + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > limit {
        return Err(InputError::TooLarge { path: path.to_path_buf(), limit });
    }
    Ok(bytes)
}

/// [`read_regular`] as UTF-8 text.
pub fn read_regular_text(path: &Path, links: Links, limit: u64) -> Result<String, InputError> {
    let bytes = read_regular(path, links, limit)?;
    String::from_utf8(bytes).map_err(|_| InputError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"),
    })
}

fn kind_name(kind: std::fs::FileType) -> &'static str {
    if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_refused_at_once_and_a_device_too() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("report.json");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let started = std::time::Instant::now();
        let error = read_regular(&fifo, Links::Follow, 1 << 20).unwrap_err();
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "an open of a FIFO blocked");
        assert_eq!(
            error.to_string(),
            format!("{}: not a regular file (a FIFO); sysprof reads only regular files here", fifo.display())
        );
        let error = read_regular(Path::new("/dev/zero"), Links::Follow, 1 << 20).unwrap_err();
        assert!(matches!(error, InputError::NotRegular { kind: "a character device", .. }), "{error}");
    }

    #[test]
    fn a_file_over_the_bound_is_refused_whatever_its_size_claims() {
        let dir = tempfile::tempdir().unwrap();
        let sparse = dir.path().join("sparse");
        let file = File::create(&sparse).unwrap();
        file.set_len(4 << 30).unwrap();
        let error = read_regular(&sparse, Links::Follow, 1 << 20).unwrap_err();
        assert!(matches!(error, InputError::TooLarge { limit: 1_048_576, .. }), "{error}");
        std::fs::write(&sparse, b"12345").unwrap();
        assert_eq!(read_regular(&sparse, Links::Follow, 5).unwrap(), b"12345");
        assert!(matches!(read_regular(&sparse, Links::Follow, 4), Err(InputError::TooLarge { .. })));
    }

    #[test]
    fn links_are_followed_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::write(&real, b"x").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(read_regular(&link, Links::Follow, 10).unwrap(), b"x");
        assert!(matches!(read_regular(&link, Links::Refuse, 10), Err(InputError::Link { .. })));
        let missing = read_regular(&dir.path().join("missing"), Links::Follow, 10).unwrap_err();
        assert!(
            missing.to_string().ends_with("missing: No such file or directory (os error 2)"),
            "{missing}"
        );
    }
}
