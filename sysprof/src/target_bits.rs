//! The in-kernel target set as bits by process id (`names::TARGET_BITS`), which is what the
//! programs test on every event. Userspace changes it through a shared mapping of the map, an
//! atomic OR or AND per change: a map update writes a whole word, and would undo a bit that a
//! program (following a target's new child) set in the same word at the same moment.

use std::{
    os::fd::{AsFd as _, AsRawFd as _},
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering},
};

use anyhow::{Context as _, bail};
use aya::maps::Map;
use sysprof_common::{capacity, names};

/// `TARGET_BITS`, mapped into this process.
pub struct TargetBits {
    words: NonNull<AtomicU64>,
}

// SAFETY: the mapping is shared memory written only with atomic operations.
unsafe impl Send for TargetBits {}

/// Bytes of the mapping: every word of the map (a whole number of pages).
const BYTES: usize = capacity::TARGET_BITS_WORDS as usize * 8;

impl TargetBits {
    /// Maps the object's `TARGET_BITS` array (created memory-mappable).
    pub fn map(map: &Map) -> anyhow::Result<Self> {
        let Map::Array(data) = map else {
            bail!("map {} is not an array", names::TARGET_BITS);
        };
        let fd = data.fd().as_fd().as_raw_fd();
        // SAFETY: a fresh shared mapping of the map's memory, of its exact size; nothing else
        // in this process aliases it.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if address == libc::MAP_FAILED {
            let error = std::io::Error::last_os_error();
            if let Some(limited) =
                crate::limits::mapping_failed(format!("the BPF array {}", names::TARGET_BITS), &error)
            {
                return Err(limited.into());
            }
            return Err(error).with_context(|| format!("mapping {} into memory", names::TARGET_BITS));
        }
        let words = NonNull::new(address.cast::<AtomicU64>()).context("mmap returned null")?;
        Ok(TargetBits { words })
    }

    /// Puts `pid` in the set, or takes it out.
    pub fn set(&self, pid: u32, member: bool) {
        let index = pid as usize / 64;
        if index >= capacity::TARGET_BITS_WORDS as usize {
            return;
        }
        let bit = 1u64 << (pid % 64);
        // SAFETY: `index` is within the mapping, whose words are 8-byte aligned.
        let word = unsafe { self.words.add(index).as_ref() };
        if member {
            word.fetch_or(bit, Ordering::SeqCst);
        } else {
            word.fetch_and(!bit, Ordering::SeqCst);
        }
    }
}

impl Drop for TargetBits {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.words.as_ptr().cast(), BYTES) };
    }
}
