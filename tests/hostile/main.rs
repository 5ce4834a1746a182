//! What another user owns cannot crash, hang, mislead or read through a root trace. Each test
//! plants a hostile file or race as a second user (created by the test, see
//! `support::test_user`), runs sysprof as root or through "sudo" (root with SUDO_UID set), and
//! asserts: no crash, no hang past a bound, the trace's other results complete, the message, and
//! that nothing root-only reached the user's files.

#[path = "../support/mod.rs"]
mod support;

/// Bounds and faults: options at their limits, a process that execs, kernel memory.
mod bounds;
/// A target that execs mid-trace: each sample resolved against the program it ran in.
mod exec;
/// What the fuzz targets found that a user can do to a real trace.
mod fuzz_finds;
/// Files handed to `report`, `merge` and `tables`, and the unwind cache.
mod inputs;
/// Files a target maps or leaves for sysprof to read: its binaries, libraries, perf maps.
mod target_files;
/// Through sudo, root reads nothing the user cannot; as root, nothing is written through a path
/// another user can change.
mod through_sudo;
