//! Tells the programs which architecture's `pt_regs` they read (the host's: BPF programs run on
//! the kernel they are built for here), as aya's own crates do.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(bpf_target_arch, values(\"x86_64\", \"aarch64\"))");
    let host = std::env::var("HOST").unwrap_or_default();
    let arch = host.split('-').next().unwrap_or_default();
    if arch == "x86_64" || arch == "aarch64" {
        println!("cargo:rustc-cfg=bpf_target_arch=\"{arch}\"");
    }
}
