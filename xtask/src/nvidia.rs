//! NVIDIA's real CUDA runtime and NCCL libraries for the GPU tests, from their PyPI wheels
//! (nvidia-cuda-runtime-cu12, nvidia-nccl-cu12), cached outside the repository. They run on a
//! machine without a GPU: every call fails, but the probes see the real entry points.

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, bail};

use crate::run;

const WHEELS: [&str; 2] = ["nvidia-cuda-runtime-cu12", "nvidia-nccl-cu12"];
const LIBRARIES: [&str; 2] = ["libcudart.so.12", "libnccl.so.2"];

/// The cache: `$XDG_CACHE_HOME/sysprof/nvidia`, or `~/.cache/sysprof/nvidia`.
fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"))
        .join("sysprof/nvidia")
}

/// The directory holding libcudart.so.12 and libnccl.so.2, downloading them once.
pub fn ensure() -> anyhow::Result<PathBuf> {
    let lib = cache_dir().join("lib");
    if LIBRARIES.iter().all(|name| lib.join(name).is_file()) {
        return Ok(lib);
    }
    let wheels = cache_dir().join("wheels");
    std::fs::create_dir_all(&wheels)?;
    std::fs::create_dir_all(&lib)?;
    eprintln!(
        "xtask: downloading NVIDIA's CUDA runtime and NCCL wheels (about 330 MB, once) into {}",
        wheels.display()
    );
    run(Command::new("python3")
        .args(["-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d"])
        .arg(&wheels)
        .args(WHEELS))
    .context("pip download of the NVIDIA wheels")?;
    // A wheel is a zip file: take the shared libraries out of it.
    let extract = format!(
        "import glob, os, zipfile\n\
         for wheel in glob.glob(os.path.join({wheels:?}, '*.whl')):\n\
         \x20   archive = zipfile.ZipFile(wheel)\n\
         \x20   for name in archive.namelist():\n\
         \x20       base = os.path.basename(name)\n\
         \x20       if base in {libs:?}:\n\
         \x20           with open(os.path.join({lib:?}, base), 'wb') as out:\n\
         \x20               out.write(archive.read(name))\n",
        wheels = wheels.display().to_string(),
        lib = lib.display().to_string(),
        libs = LIBRARIES.to_vec(),
    );
    run(Command::new("python3").arg("-c").arg(extract)).context("extracting the NVIDIA libraries")?;
    if !LIBRARIES.iter().all(|name| lib.join(name).is_file()) {
        bail!("the NVIDIA wheels did not contain {LIBRARIES:?}");
    }
    Ok(lib)
}
