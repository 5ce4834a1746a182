//! Kernel struct layouts read from BTF.
//!
//! Rust BPF programs cannot emit CO-RE relocations, so the few `task_struct` fields they read
//! get their offsets from the running kernel's BTF here and reach the programs as globals.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use btf_rs::{Btf, Type};

/// Where the running kernel publishes its BTF. `SYSPROF_BTF` overrides it, which is how the
/// tests play a kernel without BTF.
pub fn vmlinux_btf_path() -> PathBuf {
    std::env::var_os("SYSPROF_BTF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/sys/kernel/btf/vmlinux"))
}

/// Offsets of the `task_struct` fields the process programs read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskOffsets {
    pub pid: u32,
    pub tgid: u32,
    /// `thread.fsbase` (x86_64): 3.10's Python threads are known by it. 0 where the kernel
    /// has no such field.
    pub fsbase: u32,
}

impl TaskOffsets {
    /// Reads the offsets from the kernel BTF at `path`.
    pub fn from_btf(path: &Path) -> anyhow::Result<Self> {
        // Parsing from memory is several times faster than btf-rs's seek-per-type file reader.
        let bytes = std::fs::read(path).with_context(|| format!("reading BTF {}", path.display()))?;
        let btf = Btf::from_bytes(&bytes).with_context(|| format!("parsing BTF {}", path.display()))?;
        Ok(TaskOffsets {
            pid: member_offset(&btf, "task_struct", "pid")?,
            tgid: member_offset(&btf, "task_struct", "tgid")?,
            fsbase: member_offset(&btf, "task_struct", "thread")
                .and_then(|thread| Ok(thread + member_offset(&btf, "thread_struct", "fsbase")?))
                .unwrap_or(0),
        })
    }
}

/// Byte offset of `field` in `struct name`, looking through anonymous structs and unions
/// (randomized layouts wrap fields in one).
pub fn member_offset(btf: &Btf, name: &str, field: &str) -> anyhow::Result<u32> {
    for candidate in btf.resolve_types_by_name(name)? {
        if let Type::Struct(layout) = candidate
            && let Some(bits) = find_member(btf, &layout, field)?
        {
            if bits % 8 != 0 {
                bail!("{name}.{field} is a bitfield");
            }
            return Ok(bits / 8);
        }
    }
    bail!("struct {name} has no field {field} in kernel BTF")
}

fn find_member(btf: &Btf, layout: &btf_rs::Struct, field: &str) -> anyhow::Result<Option<u32>> {
    for member in &layout.members {
        let member_name = btf.resolve_name(member).unwrap_or_default();
        if member_name == field {
            return Ok(Some(member.bit_offset()));
        }
        if member_name.is_empty() {
            let nested = match btf.resolve_chained_type(member)? {
                Type::Struct(inner) | Type::Union(inner) => find_member(btf, &inner, field)?,
                _ => None,
            };
            if let Some(bits) = nested {
                return Ok(Some(member.bit_offset() + bits));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_struct_offsets_from_the_running_kernel() {
        let path = vmlinux_btf_path();
        if !path.exists() && std::env::var_os("CI").is_none() {
            eprintln!("skipped: no kernel BTF at {}", path.display());
            return;
        }
        let offsets = TaskOffsets::from_btf(&path).unwrap();
        // pid and tgid are adjacent pid_t fields in every kernel since 2.6.
        assert_eq!(offsets.tgid, offsets.pid + 4);
        assert!(offsets.pid > 0);
    }
}
