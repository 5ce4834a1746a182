//! The write stage: the output directory and one file per format behind the [`Sink`] trait.

mod flamegraph;
mod folded;
mod json;
mod markdown;

use std::path::{Path, PathBuf};

use anyhow::Context as _;

pub use self::{
    flamegraph::Flamegraph,
    folded::Folded,
    json::JsonReport,
    markdown::{MarkdownReport, bytes, render as render_markdown, thousands},
};
use crate::{error::Error, privileges::InvokingUser, profile::StackProfile, report::Report};

/// What the sinks write from.
pub enum Artifact<'a> {
    /// A stack profile under a base name ("cpu" -> cpu.folded, cpu.svg).
    Stacks {
        name: &'a str,
        title: &'a str,
        profile: &'a StackProfile,
    },
    Report(&'a Report),
}

/// One output format.
pub trait Sink {
    /// Writes the file for `artifact` into `dir`, returning its name; `None` when this format
    /// does not apply to the artifact.
    fn write(&self, artifact: &Artifact<'_>, dir: &Path) -> anyhow::Result<Option<String>>;
}

/// The directory the results go to, checked writable before tracing starts so a long trace is
/// never lost to a typo.
#[derive(Debug)]
pub struct OutputDir {
    path: PathBuf,
    owner: Option<InvokingUser>,
}

impl OutputDir {
    /// Creates the directory if needed and checks that a file can be written in it.
    pub fn prepare(path: &Path, owner: Option<InvokingUser>) -> anyhow::Result<Self> {
        let failure = |reason: String| Error::OutputDir { path: path.to_path_buf(), reason };
        if path.exists() && !path.is_dir() {
            return Err(failure("it is a file, not a directory".into()).into());
        }
        let created = !path.exists();
        std::fs::create_dir_all(path).map_err(|e| failure(e.to_string()))?;
        let probe = path.join(".sysprof-write-test");
        std::fs::write(&probe, b"").map_err(|e| failure(e.to_string()))?;
        let _ = std::fs::remove_file(&probe);
        let dir = OutputDir { path: path.to_path_buf(), owner };
        if created {
            dir.give_to_owner(path);
        }
        Ok(dir)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `artifact` with every sink that applies; returns the names written.
    pub fn write(&self, artifact: &Artifact<'_>) -> anyhow::Result<Vec<String>> {
        let sinks: [&dyn Sink; 4] = [&Folded, &Flamegraph, &MarkdownReport, &JsonReport];
        let mut written = Vec::new();
        for sink in sinks {
            if let Some(name) = sink.write(artifact, &self.path)? {
                self.give_to_owner(&self.path.join(&name));
                written.push(name);
            }
        }
        Ok(written)
    }

    /// Files written through sudo belong to the user who ran sudo.
    fn give_to_owner(&self, path: &Path) {
        if let Some(owner) = &self.owner {
            // Best effort: a filesystem without ownership (vfat) keeps root's.
            let _ = owner.give(path);
        }
    }
}

/// Writes `contents` to `dir/name`, naming the file on failure.
fn write_file(dir: &Path, name: &str, contents: &[u8]) -> anyhow::Result<()> {
    let path = dir.join(name);
    std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))
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
    fn missing_directories_are_created() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a/b");
        OutputDir::prepare(&nested, None).unwrap();
        assert!(nested.is_dir());
    }
}
