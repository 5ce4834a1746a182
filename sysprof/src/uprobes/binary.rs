//! A file to probe, opened once: what sysprof reads of it (its exports, its first
//! instructions, its dynamic section) and where the kernel places its uprobes is the file that
//! was opened, whatever its path names by then.
//!
//! A path a user hands sysprof (`--func PATH:SYMBOL`, `--cuda-lib`), or one found through
//! their program's RUNPATH, is opened once, with their rights ([`Binary::open`] through sudo):
//! opened again by name as root, a link they flip between the two opens would have root read,
//! and probe, a file they cannot read. Everything after goes through the descriptor, by way of
//! `/proc/self/fd/N`: the kernel resolves a uprobe's path itself (for perf-event uprobes and for
//! multi-uprobe links alike), and that path leads to the open file, not to a name.

use std::{
    fs::File,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
    sync::Arc,
};

use crate::{
    input::{InputError, Links, open_regular},
    mapped::{FileKey, MappedError},
    privileges::{InvokingUser, as_user},
};

/// A file named on the command line (`--func PATH:SYMBOL`, `--cuda-lib`, `--nccl-lib`),
/// opened at the start; or its path and why it did not open, for the report.
pub type Named = Result<Binary, (PathBuf, String)>;

/// An open file to probe, and the path it is shown by.
#[derive(Clone, Debug)]
pub struct Binary {
    /// What the report calls it: the path the user gave, or the one the loader would find.
    shown: PathBuf,
    file: Arc<File>,
    /// `/proc/self/fd/N`: the open file, for whatever opens a path (the kernel's attach).
    at: PathBuf,
    /// Whose rights opened it (through sudo, the user's): what its path names later is asked
    /// with the same.
    opened_as: Option<InvokingUser>,
}

impl Binary {
    /// Opens `path` for reading as `user` (as sysprof itself without one): a regular file,
    /// opened without blocking on a FIFO.
    pub fn open(path: &Path, user: Option<&InvokingUser>) -> Result<Self, InputError> {
        let opened = as_user(user, || open_regular(path, Links::Follow))
            .map_err(|source| InputError::Io { path: path.to_path_buf(), source })??;
        let at = PathBuf::from(format!("/proc/self/fd/{}", opened.as_raw_fd()));
        Ok(Binary { shown: path.to_path_buf(), file: Arc::new(opened), at, opened_as: user.cloned() })
    }

    /// Opens the file a target maps from `open` (see `procmaps::Backing::File`): only the very
    /// file it mapped (`key`, see `mapped::open`), as sysprof itself, shown by `open`.
    pub fn mapped(open: &Path, key: FileKey) -> Result<Self, MappedError> {
        let opened = crate::mapped::open(open, Some(key))?;
        let at = PathBuf::from(format!("/proc/self/fd/{}", opened.as_raw_fd()));
        Ok(Binary { shown: open.to_path_buf(), file: Arc::new(opened), at, opened_as: None })
    }

    /// The path it is shown by.
    pub fn shown(&self) -> &Path {
        &self.shown
    }

    /// A path to the open file itself (`/proc/self/fd/N`), valid while this (or a clone) lives:
    /// for an attach, which takes a path.
    pub fn path(&self) -> &Path {
        &self.at
    }

    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The same file opened again, with an offset of its own (readers seek).
    pub fn reopen(&self) -> std::io::Result<File> {
        File::open(&self.at)
    }

    /// (device, inode): the file's identity.
    pub fn id(&self) -> Option<(u64, u64)> {
        self.file.metadata().ok().map(|meta| (meta.dev(), meta.ino()))
    }

    /// The identity of the file its path names now, asked with the rights it was opened with.
    pub fn named_now(&self) -> std::io::Result<(u64, u64)> {
        as_user(self.opened_as.as_ref(), || std::fs::metadata(&self.shown))?
            .map(|meta| (meta.dev(), meta.ino()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_read_is_the_file_opened_whatever_its_name_leads_to_later() {
        let dir = tempfile::tempdir().unwrap();
        let (first, second, link) =
            (dir.path().join("first"), dir.path().join("second"), dir.path().join("link"));
        std::fs::write(&first, "first").unwrap();
        std::fs::write(&second, "second").unwrap();
        std::os::unix::fs::symlink(&first, &link).unwrap();
        let binary = Binary::open(&link, None).unwrap();
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&second, &link).unwrap();
        assert_eq!(std::fs::read_to_string(binary.path()).unwrap(), "first");
        assert_eq!(std::io::read_to_string(binary.reopen().unwrap()).unwrap(), "first");
        assert_eq!(binary.shown(), link);
        let meta = std::fs::metadata(&first).unwrap();
        assert_eq!(binary.id(), Some((meta.dev(), meta.ino())));
    }

    #[test]
    fn a_fifo_is_no_binary() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(matches!(Binary::open(&fifo, None), Err(InputError::NotRegular { .. })));
    }
}
