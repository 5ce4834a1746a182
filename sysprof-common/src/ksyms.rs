//! Kernel addresses named by the kernel itself: a program (never attached) that userspace runs
//! once per batch of addresses, which formats each with `%pS` (the kernel's own symbol lookup,
//! modules and BPF programs included). Reading /proc/kallsyms instead makes the kernel print
//! every one of its 200,000 symbols, and keeping them takes megabytes.

/// Array map of `u64`: the addresses of one batch.
pub const ADDRESSES: &str = "KSYM_ADDRESSES";
/// Array map of [`Name`]: each address's name, `function+0xoffset/0xsize [module]`, or the
/// address in hex when the kernel knows no symbol there.
pub const NAMES: &str = "KSYM_NAMES";
/// Addresses a run names.
pub const BATCH: u32 = 512;
/// Bytes of a name, NUL included (the kernel's own limit is KSYM_NAME_LEN, 512, but names past
/// this are rare and are cut, not lost).
pub const NAME_LEN: usize = 192;

/// One formatted name, NUL-terminated.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Name {
    pub text: [u8; NAME_LEN],
}
shared!(Name, NAME_LEN);
