//! The launched command's hold at its dynamic loader (sysprof-ebpf `loader.rs`): what the
//! program and userspace agree on.

/// `_r_debug.r_state` once the loader's list of objects is consistent (glibc's `RT_CONSISTENT`).
pub const RT_CONSISTENT: i32 = 0;

/// Where `r_state` lies in `struct r_debug` on 64-bit targets: after `int r_version` (padded
/// to 8), `struct link_map *r_map` and `ElfW(Addr) r_brk`.
pub const R_STATE_OFFSET: u64 = 24;

/// SIGSTOP on Linux (all architectures sysprof runs on).
pub const SIGSTOP: u32 = 19;

/// Entries of `names::LOADER_GATE`: the process to stop (0 once stopped), and the process
/// stopped (until userspace continues it and clears it).
pub const TO_STOP: u32 = 0;
pub const HELD: u32 = 1;
