//! The BPF toolchain: nightly with rust-src, and a bpf-linker built against nightly's own
//! libLLVM (no prebuilt one matches that LLVM). Installs what is missing, says what it does,
//! and is quick when everything is present.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::run;

/// The bpf-linker release verified with aya 0.14 (PLATFORM.md).
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Makes sure the toolchain is there, then builds the BPF object; returns its path.
pub fn build_ebpf(root: &Path) -> anyhow::Result<PathBuf> {
    ensure_nightly()?;
    ensure_rust_src()?;
    ensure_bpf_linker()?;
    let ebpf_dir = root.join("sysprof-ebpf");
    let target_dir = ebpf_dir.join("target");
    let mut cargo = nightly_cargo();
    cargo.current_dir(&ebpf_dir).args(["build", "--release", "--target-dir"]).arg(&target_dir);
    run(&mut cargo).context("building the BPF object")?;
    Ok(target_dir.join("bpfel-unknown-none/release/sysprof"))
}

/// `cargo` as the BPF crate's rust-toolchain.toml selects it: without the variables through
/// which the cargo running xtask would impose its own toolchain, target or flags.
fn nightly_cargo() -> Command {
    let mut cargo = Command::new("cargo");
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if (key.starts_with("CARGO_") && key != "CARGO_HOME")
            || key.starts_with("RUSTC")
            || key == "RUSTFLAGS"
            || key == "RUSTUP_TOOLCHAIN"
        {
            cargo.env_remove(key.as_ref());
        }
    }
    cargo
}

fn ensure_nightly() -> anyhow::Result<()> {
    let list = output(Command::new("rustup").args(["toolchain", "list"]))
        .context("rustup is needed to build the BPF programs (https://rustup.rs)")?;
    if list.lines().any(|line| line.starts_with("nightly")) {
        return Ok(());
    }
    eprintln!("xtask: installing the nightly toolchain (BPF programs need build-std)");
    run(Command::new("rustup").args([
        "toolchain",
        "install",
        "nightly",
        "--profile",
        "minimal",
        "--component",
        "rust-src",
    ]))
}

fn ensure_rust_src() -> anyhow::Result<()> {
    let installed =
        output(Command::new("rustup").args(["component", "list", "--toolchain", "nightly", "--installed"]))?;
    if installed.lines().any(|line| line.starts_with("rust-src")) {
        return Ok(());
    }
    eprintln!("xtask: adding rust-src to nightly (build-std compiles core for the BPF target)");
    run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
}

/// A bpf-linker that starts: one built against a nightly that was since updated in place has
/// lost its libLLVM and must be rebuilt.
fn ensure_bpf_linker() -> anyhow::Result<()> {
    let works = Command::new("bpf-linker").arg("--version").output().is_ok_and(|out| out.status.success());
    if works {
        return Ok(());
    }
    let sysroot =
        PathBuf::from(output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?.trim());
    let lib_dir = sysroot.join("lib");
    let llvm_lib = find_libllvm(&lib_dir)?;
    let version = output(Command::new("rustc").args(["+nightly", "-vV"]))?;
    let llvm_major = llvm_major(&version).context("rustc +nightly -vV reports no LLVM version")?;
    eprintln!(
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against nightly's {llvm_lib} (LLVM {llvm_major}); \
         about a minute, once"
    );
    let rustflags = format!(
        "-L native={dir} -l dylib:+verbatim={llvm_lib} -C link-arg=-Wl,-rpath,{dir}",
        dir = lib_dir.display()
    );
    let mut install = nightly_cargo();
    install.env("RUSTFLAGS", rustflags).args([
        "+nightly",
        "install",
        &format!("bpf-linker@{BPF_LINKER_VERSION}"),
        "--locked",
        "--force",
        "--no-default-features",
        "--features",
        &format!("llvm-{llvm_major},no-llvm-linking"),
    ]);
    run(&mut install).context("installing bpf-linker")?;
    let works = Command::new("bpf-linker").arg("--version").output().is_ok_and(|out| out.status.success());
    if !works {
        bail!("bpf-linker was installed but does not start: is ~/.cargo/bin on PATH?");
    }
    Ok(())
}

/// The shared library itself (`libLLVM.so.22.1-rust-1.97.0-nightly`), not the linker script
/// (`libLLVM-22-rust-...so`) beside it.
fn find_libllvm(lib_dir: &Path) -> anyhow::Result<String> {
    let entries = std::fs::read_dir(lib_dir).with_context(|| format!("listing {}", lib_dir.display()))?;
    let mut candidates: Vec<String> = entries
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("libLLVM.so.") && name.contains("-rust-"))
        .collect();
    candidates.sort();
    candidates
        .pop()
        .with_context(|| format!("no libLLVM.so.*-rust-* in {}: reinstall nightly", lib_dir.display()))
}

/// "LLVM version: 22.1.4" -> 22.
fn llvm_major(version_output: &str) -> Option<u32> {
    let line = version_output.lines().find_map(|line| line.strip_prefix("LLVM version:"))?;
    line.trim().split('.').next()?.parse().ok()
}

fn output(command: &mut Command) -> anyhow::Result<String> {
    let out = command.output().with_context(|| format!("starting {command:?}"))?;
    if !out.status.success() {
        bail!("{command:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llvm_major_from_rustc_version() {
        let text = "rustc 1.97.0-nightly (e50aa6fba 2026-05-19)\nhost: x86_64-unknown-linux-gnu\nLLVM version: 22.1.4\n";
        assert_eq!(llvm_major(text), Some(22));
        assert_eq!(llvm_major("rustc 1.0"), None);
    }

    #[test]
    fn libllvm_is_the_library_not_the_linker_script() {
        let dir = std::env::temp_dir().join(format!("xtask-llvm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in
            ["libLLVM-22-rust-1.97.0-nightly.so", "libLLVM.so.22.1-rust-1.97.0-nightly", "librustc_driver.so"]
        {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        assert_eq!(find_libllvm(&dir).unwrap(), "libLLVM.so.22.1-rust-1.97.0-nightly");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
