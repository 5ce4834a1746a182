//! sysprof's BPF programs, one file per probe family.
//!
//! Every program is a short entry point: it filters out what is not the target first, then
//! calls its steps, each an `#[inline(always)]` function named for what it does (errors are
//! returned, never panicked: the verifier rejects panic paths). Programs aggregate in maps; only
//! rare, rich events (process life cycle, calls whose arguments matter) go through a ring
//! buffer. Shared types and map names are in
//! `sysprof-common`.
#![no_std]
#![no_main]
// The BPF target has no atomic read-modify-write in `core::sync::atomic`; the intrinsic lowers
// to the BPF atomic add instruction.
#![feature(core_intrinsics)]
#![expect(internal_features, reason = "atomic_xadd: see atomic.rs")]

mod atomic;
mod calls;
mod config;
mod counters;
mod cpu;
mod events;
mod histogram;
mod interrupts;
mod ksyms;
mod loader;
mod maps;
mod memory;
mod nesting;
mod on_cpu;
mod process;
mod python;
mod sched;
mod signals;
mod syscalls;
mod target;
mod task_state;
mod timeline;
mod unwind;
mod window;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable in a verified program; the verifier rejects any path that gets here.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
