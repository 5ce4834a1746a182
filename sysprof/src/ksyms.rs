//! Kernel addresses named by the kernel itself, before the probes go: the `kernel_symbols`
//! program (`sysprof-ebpf/src/ksyms.rs`, never attached) formats a batch of addresses with
//! `%pS` each time it is run. Naming a few thousand addresses this way takes milliseconds;
//! reading /proc/kallsyms makes the kernel print all of its symbols (some 40 ms of CPU here)
//! and keeping them takes megabytes. Where the kernel cannot (no `bpf_snprintf` before 5.13),
//! the symbolizer reads /proc/kallsyms as before.

use std::collections::{BTreeSet, HashMap};

use aya::{
    maps::{Array, MapData},
    programs::{RawTracePoint, RawTracePointRunOptions, TestRun as _},
};
use sysprof_common::ksyms::{self, Name};

use crate::{
    probes::{Probes, program_mut, rejected},
    symbolize::{Frame, Frames},
};

/// Whether an address is the kernel's: the upper half of the address space, on x86-64 and
/// arm64 alike.
pub fn is_kernel(address: u64) -> bool {
    address >> 63 == 1
}

impl Probes {
    /// The frames of each kernel address, as the kernel names it: its function (and module),
    /// or none where it knows no symbol.
    pub fn kernel_frames(&mut self, addresses: &BTreeSet<u64>) -> anyhow::Result<HashMap<u64, Frames>> {
        let mut frames = HashMap::with_capacity(addresses.len());
        if addresses.is_empty() {
            return Ok(frames);
        }
        let program: &mut RawTracePoint = program_mut(&mut self.ebpf, "kernel_symbols")?.try_into()?;
        if program.fd().is_err() {
            program.load().map_err(|e| rejected("kernel_symbols", e))?;
        }
        let addresses: Vec<u64> = addresses.iter().copied().collect();
        for batch in addresses.chunks(ksyms::BATCH as usize) {
            let mut requests: Array<&mut MapData, u64> = Array::try_from(self.map_mut(ksyms::ADDRESSES)?)?;
            for (index, &address) in batch.iter().enumerate() {
                requests.set(index as u32, &address, 0)?;
            }
            let program: &mut RawTracePoint = program_mut(&mut self.ebpf, "kernel_symbols")?.try_into()?;
            let mut options = RawTracePointRunOptions::new();
            options.args[0] = batch.len() as u64;
            program.test_run(options)?;
            let names: Array<&MapData, Name> = Array::try_from(self.map(ksyms::NAMES)?)?;
            for (index, &address) in batch.iter().enumerate() {
                let name = names.get(&(index as u32), 0)?;
                let end = name.text.iter().position(|&b| b == 0).unwrap_or(name.text.len());
                let text = String::from_utf8_lossy(&name.text[..end]);
                let frame = frame_of(&text).unwrap_or_else(|| Frame::unknown(Frame::KERNEL_MODULE, address));
                frames.insert(address, vec![frame]);
            }
        }
        Ok(frames)
    }
}

/// `function+0x1a/0x40` or `function+0x1a/0x40 [module]` as a frame; `None` for a bare
/// address (`0xffffffff81234567`: no symbol there).
fn frame_of(text: &str) -> Option<Frame> {
    let (symbol, module) = match text.split_once(" [") {
        Some((symbol, module)) => (symbol, Some(module.trim_end_matches(']'))),
        None => (text, None),
    };
    let (function, _offset) = symbol.split_once('+')?;
    if function.is_empty() {
        return None;
    }
    Some(Frame::new(
        function.into(),
        module.map_or_else(|| Frame::KERNEL_MODULE.into(), |module| format!("[{module}]").into()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_names_become_frames() {
        let frame = frame_of("do_syscall_64+0x82/0x190").unwrap();
        assert_eq!((&*frame.function, &*frame.module), ("do_syscall_64", "[kernel]"));
        let frame = frame_of("nft_do_chain+0x7c/0x430 [nf_tables]").unwrap();
        assert_eq!((&*frame.function, &*frame.module), ("nft_do_chain", "[nf_tables]"));
        assert!(frame_of("0xffffffffc0a1b2c3").is_none());
        assert!(is_kernel(0xffff_ffff_8100_0000) && !is_kernel(0x7fff_1234_5678));
    }
}
