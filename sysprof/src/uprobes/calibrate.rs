//! What a probe hit costs on this machine: the uprobe trap (a round trip into the kernel at
//! entry and at return) plus sysprof's programs. Measured by timing a function of sysprof's
//! own, bare and then probed exactly as the target's functions are. Each kind of probe has its
//! own function, so one measurement does not include another's probes.

use std::{path::Path, time::Instant};

use anyhow::Context as _;

use sysprof_common::{CallKey, CallStats, names};

use super::{Binary, elf};
use crate::{latency, probes::Probes};

/// Cookie id of the calibration function (outside the GPU and `--func` ids).
pub const CALIBRATION_ID: u32 = 0xfffe;

/// Cookie id of the calibration function whose first instruction is stepped out of line.
pub const CALIBRATION_STEPPED_ID: u32 = 0xfffd;

const CALLS: u32 = 2_000;

/// Timed under the call programs (GPU APIs, `--func`): small, so the difference is the probes.
/// Written out so that its first instruction is a push, as most functions' is (the CUDA
/// runtime's, NCCL's, malloc's; every function that saves a register first): the kernel
/// emulates a probed push, but steps most other instructions out of line, a second trap.
/// Empty programs on the entry and return of a loop's function, by its first instruction
/// (kernel 6.18, a 2-CPU VM): push 0.85-1.04 us a call, nop 0.82-1.16, 5-byte nop 0.48-0.69;
/// lea 5.3-6.8, test 6.9-7.3, endbr64 5.5-6.9 (which begins every function of a CET build;
/// `uprobes::entry_point` probes those that push a register next at the push).
/// Compiled, it began with a store to the stack, and its probes measured 8.1-8.4 us a call
/// where a loop of cudaMemcpy lost 1.7-1.9 us (a 2-CPU VM, where each trap is a VM exit). So
/// the figures are what a typical function's probes cost, and no more than what any function's
/// do.
#[cfg(target_arch = "x86_64")]
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub extern "C" fn sysprof_probe_calibration(x: u64) -> u64 {
    core::arch::naked_asm!("push rbx", "lea rax, [rdi + 1]", "pop rbx", "ret")
}

#[cfg(not(target_arch = "x86_64"))]
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn sysprof_probe_calibration(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_add(1)
}

/// `sysprof_probe_calibration` beginning with an instruction the kernel steps out of line (a
/// `lea`), as a leaf that starts on its work does, or a CET build's function that has no push
/// after its `endbr64` (`uprobes::entry_point` probes the others at the push):
/// only its calls' times are read (`timed_share_ns`), for such functions' share.
#[cfg(target_arch = "x86_64")]
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub extern "C" fn sysprof_probe_calibration_stepped(x: u64) -> u64 {
    core::arch::naked_asm!("lea rax, [rdi + 1]", "ret")
}

/// Timed under the allocator programs (`--malloc`), probed as an allocating function is (entry
/// and return), one per kind of probed instruction: `HeapShape` picks the one like the
/// allocator's own. glibc's malloc, calloc and realloc begin with a push, which the kernel
/// emulates; its free with a test, which it would step out of line, and is probed at the jump
/// after it, which it emulates (`uprobes::entry_point`). One calibration for both, stepped,
/// stated 7.2-10.4 us a call where a malloc and free pair lost 9.5-11.7 us in all (a 2-CPU VM):
/// 1.5 to 1.8 times what the probes cost.
#[cfg(target_arch = "x86_64")]
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub extern "C" fn sysprof_heap_probe_calibration(x: u64) -> u64 {
    core::arch::naked_asm!("push rbx", "lea rax, [rdi + 2]", "pop rbx", "ret")
}

/// `sysprof_heap_probe_calibration`, beginning with an instruction the kernel steps out of line.
#[cfg(target_arch = "x86_64")]
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub extern "C" fn sysprof_heap_probe_calibration_stepped(x: u64) -> u64 {
    core::arch::naked_asm!("lea rax, [rdi + 2]", "ret")
}

/// Timed under the free program (its entry only), one per kind of probed instruction, as
/// above: this one begins as glibc's free does, and is probed as it is, at the jump after the
/// test (`uprobes::entry_point`).
#[cfg(target_arch = "x86_64")]
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub extern "C" fn sysprof_free_probe_calibration(x: u64) -> u64 {
    core::arch::naked_asm!("test rdi, rdi", "je 2f", "2:", "lea rax, [rdi + 3]", "ret")
}

/// `sysprof_free_probe_calibration`, beginning with an instruction the kernel steps out of line.
#[cfg(target_arch = "x86_64")]
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub extern "C" fn sysprof_free_probe_calibration_stepped(x: u64) -> u64 {
    core::arch::naked_asm!("lea rax, [rdi + 3]", "ret")
}

#[cfg(not(target_arch = "x86_64"))]
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn sysprof_heap_probe_calibration(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_add(2)
}

#[cfg(not(target_arch = "x86_64"))]
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn sysprof_free_probe_calibration(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_add(3)
}

/// Which of the heap's calibration functions stands for a probed allocator function: how it
/// is probed, and whether the kernel emulates its first instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapShape {
    /// Probed at its entry only (free), not at its entry and return (the allocating ones).
    pub entry_only: bool,
    /// It is probed at an instruction the kernel steps out of line (on x86-64; elsewhere not
    /// told apart).
    pub stepped: bool,
}

impl HeapShape {
    /// The calibration function (its symbol, and itself) for functions of this shape.
    fn function(self) -> (&'static str, extern "C" fn(u64) -> u64) {
        #[cfg(target_arch = "x86_64")]
        match (self.entry_only, self.stepped) {
            (false, false) => ("sysprof_heap_probe_calibration", sysprof_heap_probe_calibration),
            (false, true) => {
                ("sysprof_heap_probe_calibration_stepped", sysprof_heap_probe_calibration_stepped)
            }
            (true, false) => ("sysprof_free_probe_calibration", sysprof_free_probe_calibration),
            (true, true) => {
                ("sysprof_free_probe_calibration_stepped", sysprof_free_probe_calibration_stepped)
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        match self.entry_only {
            false => ("sysprof_heap_probe_calibration", sysprof_heap_probe_calibration),
            true => ("sysprof_free_probe_calibration", sysprof_free_probe_calibration),
        }
    }
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
    measure(probes, "sysprof_probe_calibration", sysprof_probe_calibration, |probes, exe, exports, offset| {
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut points = vec![(offset, u64::from(CALIBRATION_ID))];
        #[cfg(target_arch = "x86_64")]
        points.extend(
            exports
                .get("sysprof_probe_calibration_stepped")
                .map(|&stepped| (stepped, u64::from(CALIBRATION_STEPPED_ID))),
        );
        #[cfg(not(target_arch = "x86_64"))]
        let _ = exports;
        let links = probes.attach_calls(exe, &points)?;
        probes.note_call_probes(
            "sysprof's own sysprof_probe_calibration (measures the cost of a probe hit)",
            links,
        );
        // Timed by the programs as a target's calls are, for `timed_share_ns`: while sysprof
        // is its own target, which it is only while the attach runs and the timing after it.
        #[cfg(target_arch = "x86_64")]
        time_calls(sysprof_probe_calibration_stepped);
        Ok(())
    })
}

/// How much of each call's time, as the call programs time it, is at least the probes' own:
/// the median time of sysprof's calibration function (a nanosecond's work) over the calls
/// `measure_probe_cost` made, from the kernel's statistics of them. The entry program reads
/// the clock last and the return program first, but what the kernel does between them and
/// the function (the end of the entry's trap, the trap at the return) falls inside every
/// timed call, and more for a function whose first instruction is stepped out of line (see
/// `sysprof_probe_calibration`): `id` is `CALIBRATION_ID`, or `CALIBRATION_STEPPED_ID` for
/// those.
pub fn timed_share_ns(probes: &Probes, id: u32) -> anyhow::Result<Option<u64>> {
    let me = std::process::id();
    let calls: aya::maps::HashMap<_, CallKey, CallStats> =
        aya::maps::HashMap::try_from(probes.map(names::CALLS)?)?;
    let mut timed = latency::empty();
    for entry in calls.iter() {
        let (key, stats) = entry?;
        if key.func == id && key.tgid == me {
            latency::merge(&mut timed, &stats.latency);
        }
    }
    Ok((timed.count > 0).then(|| latency::percentiles(&timed).p50_ns))
}

/// Nanoseconds an allocator call of `shape` costs more under the heap programs than a bare
/// one. `attach` attaches them as for such a function at `offset` in `exe`.
pub fn measure_heap_probe_cost(
    probes: &mut Probes,
    shape: HeapShape,
    attach: impl FnOnce(&mut Probes, &Binary, &'static str, u64) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let (symbol, function) = shape.function();
    measure(probes, symbol, function, |probes, exe, exports, offset| {
        // Probed where the allocator's function would be (past free's test).
        let placed = super::entry_point(exe.path(), offset, exports.size_at(offset), true);
        if !shape.stepped && placed.emulated == Some(false) {
            anyhow::bail!("{symbol} is probed at an instruction the kernel steps out of line");
        }
        attach(probes, exe, symbol, placed.offset)
    })
}

/// sysprof's own exported functions, read from its binary once for the calibrations of a run
/// (up to three: the calls', an allocation's, a free's).
fn own_exports(exe: &Path) -> anyhow::Result<&'static elf::Exports> {
    static EXPORTS: std::sync::OnceLock<elf::Exports> = std::sync::OnceLock::new();
    if let Some(exports) = EXPORTS.get() {
        return Ok(exports);
    }
    let exports = elf::exported_functions(exe)?;
    Ok(EXPORTS.get_or_init(|| exports))
}

/// Times `function` bare and then probed (with sysprof briefly its own target). `attach` gets
/// sysprof's binary, its exported functions (read once, before sysprof is its own target) and
/// `symbol`'s offset.
fn measure(
    probes: &mut Probes,
    symbol: &str,
    function: extern "C" fn(u64) -> u64,
    attach: impl FnOnce(&mut Probes, &Binary, &elf::Exports, u64) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let path = std::env::current_exe().context("locating sysprof's own binary")?;
    let exports = own_exports(&path)?;
    let exe = Binary::open(&path, None)?;
    let offset = *exports
        .get(symbol)
        .with_context(|| format!("sysprof's binary lost its calibration symbol {symbol} (stripped?)"))?;
    let bare = (0..3).map(|_| time_calls(function)).fold(f64::MAX, f64::min);
    let me = std::process::id();
    probes.add_target_process(me)?;
    let probed = attach(probes, &exe, exports, offset)
        .map(|()| (0..3).map(|_| time_calls(function)).fold(f64::MAX, f64::min));
    probes.remove_target_process(me)?;
    Ok(((probed? - bare) / f64::from(CALLS)).max(0.0))
}
