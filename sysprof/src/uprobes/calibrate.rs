//! What a probe hit costs on this machine: the uprobe trap (a round trip into the kernel at
//! entry and at return) plus sysprof's programs. Measured by timing a function of sysprof's
//! own, bare and then probed exactly as the target's functions are. Each kind of probe has its
//! own function, so one measurement does not include another's probes.

use std::{path::Path, time::Instant};

use anyhow::Context as _;

use super::elf;
use crate::probes::Probes;

/// Cookie id of the calibration function (outside the GPU and `--func` ids).
pub const CALIBRATION_ID: u32 = 0xfffe;

const CALLS: u32 = 2_000;

/// Timed under the call programs (GPU APIs, `--func`): small, so the difference is the probes.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn sysprof_probe_calibration(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_add(1)
}

/// Timed under the allocator programs (`--malloc`), probed as malloc is.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn sysprof_heap_probe_calibration(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_add(1)
}

fn time_calls(function: extern "C" fn(u64) -> u64) -> f64 {
    let start = Instant::now();
    let mut x = 0;
    for _ in 0..CALLS {
        x = function(x);
    }
    std::hint::black_box(x);
    start.elapsed().as_nanos() as f64
}

/// Nanoseconds a call probed by the call programs costs more than a bare one.
pub fn measure_probe_cost(probes: &mut Probes) -> anyhow::Result<f64> {
    measure(probes, "sysprof_probe_calibration", sysprof_probe_calibration, |probes, exe, offset| {
        let links = probes.attach_calls(exe, &[(offset, u64::from(CALIBRATION_ID))])?;
        probes.note_call_probes(
            "sysprof's own sysprof_probe_calibration (measures the cost of a probe hit)",
            links,
        );
        Ok(())
    })
}

/// Nanoseconds an allocator call probed by the heap programs costs more than a bare one.
/// `attach` attaches them as for malloc at `offset` in `exe`.
pub fn measure_heap_probe_cost(
    probes: &mut Probes,
    attach: impl FnOnce(&mut Probes, &Path, u64) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    measure(probes, "sysprof_heap_probe_calibration", sysprof_heap_probe_calibration, attach)
}

/// Times `function` bare and then probed (with sysprof briefly its own target).
fn measure(
    probes: &mut Probes,
    symbol: &str,
    function: extern "C" fn(u64) -> u64,
    attach: impl FnOnce(&mut Probes, &Path, u64) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let exe = std::env::current_exe().context("locating sysprof's own binary")?;
    let offset = *elf::exported_functions(&exe)?
        .get(symbol)
        .with_context(|| format!("sysprof's binary lost its calibration symbol {symbol} (stripped?)"))?;
    let bare = (0..3).map(|_| time_calls(function)).fold(f64::MAX, f64::min);
    let me = std::process::id();
    probes.add_target_process(me)?;
    let probed =
        attach(probes, &exe, offset).map(|()| (0..3).map(|_| time_calls(function)).fold(f64::MAX, f64::min));
    probes.remove_target_process(me)?;
    Ok(((probed? - bare) / f64::from(CALLS)).max(0.0))
}
