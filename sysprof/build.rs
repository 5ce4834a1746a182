//! Builds the BPF object from `../sysprof-ebpf` and embeds it, so that a userspace build never
//! carries a stale or missing object: cargo reruns this script whenever the BPF sources change,
//! and the nested build is a no-op when they have not.
//!
//! The BPF crate needs nightly, rust-src and bpf-linker. When one is missing this script fails
//! with the command that installs them (`cargo xtask build-ebpf`) instead of embedding nothing.
//! `SYSPROF_BPF_SKIP=1` (as aya-build's `AYA_BUILD_SKIP`) embeds an empty object instead, for
//! `cargo check`/`clippy` on a machine without the BPF toolchain: such a binary says it cannot
//! trace.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let ebpf_dir = manifest_dir.join("../sysprof-ebpf");
    let common_dir = manifest_dir.join("../sysprof-common");
    for path in [
        ebpf_dir.join("src"),
        ebpf_dir.join("Cargo.toml"),
        ebpf_dir.join("Cargo.lock"),
        ebpf_dir.join(".cargo/config.toml"),
        ebpf_dir.join("rust-toolchain.toml"),
        common_dir.join("src"),
        common_dir.join("Cargo.toml"),
    ] {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rerun-if-env-changed=PATH");
    println!("cargo:rerun-if-env-changed=SYSPROF_BPF_SKIP");

    let out = PathBuf::from(env::var("OUT_DIR")?).join("sysprof.bpf.o");
    if env::var_os("SYSPROF_BPF_SKIP").is_some_and(|v| v != "0") {
        println!(
            "cargo:warning=SYSPROF_BPF_SKIP: no BPF object embedded; this build checks and lints, it cannot trace"
        );
        std::fs::write(&out, b"").with_context(|| format!("writing {}", out.display()))?;
        println!("cargo:rustc-env=SYSPROF_BPF_OBJECT={}", out.display());
        return Ok(());
    }
    let object = build_bpf_object(&ebpf_dir)?;
    std::fs::copy(&object, &out)
        .with_context(|| format!("copying {} to {}", object.display(), out.display()))?;
    println!("cargo:rustc-env=SYSPROF_BPF_OBJECT={}", out.display());
    Ok(())
}

/// Runs the BPF crate's own build (its `.cargo/config.toml` and `rust-toolchain.toml` set the
/// target, build-std and nightly) and returns the object's path.
fn build_bpf_object(ebpf_dir: &Path) -> anyhow::Result<PathBuf> {
    const FIX: &str = "run `cargo xtask build-ebpf` (it installs what is missing), then build again";
    if which("bpf-linker").is_none() {
        bail!("bpf-linker is not installed, so the BPF object cannot be built: {FIX}");
    }
    let target_dir = ebpf_dir.join("target");
    let mut cargo = Command::new("cargo");
    cargo.current_dir(ebpf_dir).args(["build", "--release", "--target-dir"]).arg(&target_dir);
    // This script runs under the userspace toolchain's cargo, whose environment would override
    // the BPF crate's toolchain file, target and flags.
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy();
        let inherited_build_setting = (key.starts_with("CARGO_") && key != "CARGO_HOME")
            || key.starts_with("RUSTC")
            || key.starts_with("RUSTDOC")
            || key == "RUSTFLAGS"
            || key == "RUSTUP_TOOLCHAIN";
        if inherited_build_setting {
            cargo.env_remove(key.as_ref());
        }
    }
    let output = cargo.output().with_context(|| format!("running cargo in {}: {FIX}", ebpf_dir.display()))?;
    if !output.status.success() {
        let log = String::from_utf8_lossy(&output.stderr);
        for line in log.lines() {
            println!("cargo:warning={line}");
        }
        bail!("building the BPF object failed ({}): {FIX}", output.status);
    }
    let object = target_dir.join("bpfel-unknown-none/release/sysprof");
    if !object.is_file() {
        bail!("the BPF build left no object at {}: {FIX}", object.display());
    }
    Ok(object)
}

fn which(program: &str) -> Option<PathBuf> {
    env::split_paths(&env::var_os("PATH")?).map(|dir| dir.join(program)).find(|candidate| candidate.is_file())
}
