//! Names for probed calls: the call site (the caller, read from the return address at the
//! call, or else the first frame of the program's own code on the stack, past the CUDA, NCCL and
//! C libraries) and the kernels behind launches (their host stub symbols).

use std::collections::HashMap;

use sysprof_common::{CallKey, CallStats, stack};

use crate::{
    gpu::{
        functions::{self, Kind},
        state::GpuState,
    },
    procs::{ImageOf, ProcessTable},
    profile::{ResolvedStacks, StackSample},
    symbolize::{Frame, Symbolizer},
};

/// Resolves call sites and launched kernels to names.
pub trait Names {
    /// Where a call came from: its caller (the return address), or the first frame outside
    /// the CUDA/NCCL/C libraries on its stack; both taken in process `tgid`'s image `image`.
    fn call_site(&self, tgid: u32, image: ImageOf, stack: i32, caller: u64) -> String;
    /// The symbol at `address` in process `tgid`'s image `image` (a kernel's host stub).
    fn symbol(&self, tgid: u32, image: ImageOf, address: u64) -> String;
}

/// Libraries whose frames are the mechanism of a call, not its caller.
const RUNTIME_MODULES: [&str; 11] = [
    "libcudart",
    "libcuda.",
    "libnccl",
    "libc.so",
    "libc-",
    "libstdc++",
    "libpthread",
    "ld-linux",
    "libjemalloc",
    "libtcmalloc",
    "libmimalloc",
];

fn is_mechanism(frame: &Frame) -> bool {
    frame.is_kernel()
        || frame.module.is_empty()
        || RUNTIME_MODULES.iter().any(|m| frame.module.starts_with(m))
}

/// Resolved call sites and kernel names.
pub struct CallNames {
    stacks: ResolvedStacks,
    /// (process, image, address) -> innermost frame there: callers and launched kernels.
    symbols: HashMap<(u32, u32, u64), Frame>,
}

impl CallNames {
    /// The calls' stacks, resolved.
    pub fn stacks(&self) -> &ResolvedStacks {
        &self.stacks
    }

    /// Resolves every stack, caller and launched kernel the calls and the GPU state refer to.
    pub fn new(
        calls: &[(CallKey, CallStats)],
        gpu: Option<&GpuState>,
        stacks: &HashMap<u32, Vec<u64>>,
        processes: &mut ProcessTable,
        symbolizer: &mut Symbolizer,
    ) -> Self {
        let generation = |key: &CallKey| ImageOf::Generation(key.exec_id);
        let mut sites: Vec<(u32, ImageOf, i32, u64)> =
            calls.iter().map(|(key, _)| (key.tgid, generation(key), key.user_stack_id, key.caller)).collect();
        if let Some(gpu) = gpu {
            sites.extend(
                gpu.live().map(|((tgid, _), a)| (*tgid, ImageOf::At(a.at_ns), a.user_stack_id, a.caller)),
            );
            sites.extend(gpu.h2d.iter().map(|c| (c.tgid, ImageOf::At(c.at_ns), c.user_stack_id, c.caller)));
        }
        let samples: Vec<StackSample> =
            sites.iter().map(|&(tgid, image, stack, _)| sample(tgid, image, stack)).collect();
        let resolved = ResolvedStacks::resolve(&samples, stacks, processes, symbolizer);

        // A return address points after the call: one byte back is inside it.
        let images = resolved.images();
        let mut addresses: HashMap<(u32, u32), Vec<u64>> = HashMap::new();
        for &(tgid, image, _, caller) in &sites {
            if caller != 0 {
                addresses.entry((tgid, images.index(tgid, image))).or_default().push(caller - 1);
            }
        }
        for (key, _) in calls {
            let launch = functions::by_id(key.func).is_some_and(|f| matches!(f.kind, Kind::Launch));
            if launch && key.detail != 0 {
                addresses
                    .entry((key.tgid, images.index(key.tgid, generation(key))))
                    .or_default()
                    .push(key.detail);
            }
        }
        let mut symbols = HashMap::new();
        for ((tgid, image), mut addrs) in addresses {
            addrs.sort_unstable();
            addrs.dedup();
            let maps = processes.get(tgid).and_then(|p| p.image(image as usize).maps);
            for (addr, frames) in symbolizer.user(tgid, image, maps, &addrs) {
                if let Some(frame) = frames.last() {
                    symbols.insert((tgid, image, addr), frame.clone());
                }
            }
        }
        CallNames { stacks: resolved, symbols }
    }
}

/// A call's user stack, taken in image `image` of its process, as a sample, weighing nothing
/// until the caller says.
pub(crate) fn sample(tgid: u32, image: ImageOf, user_stack_id: i32) -> StackSample {
    StackSample {
        tgid,
        tid: tgid,
        user_stack_id,
        kernel_stack_id: stack::NONE,
        comm: None,
        weight: 0,
        tag: 0,
        image,
    }
}

/// The innermost frame of the program's own code in a stack (outermost first): where it called
/// into the libraries. In a Python program that is its innermost Python line, above the C
/// extensions and the FFI between it and the library.
pub fn own_frame(frames: &[Frame]) -> Option<&Frame> {
    frames.iter().rev().find(|f| f.is_python()).or_else(|| frames.iter().rev().find(|f| !is_mechanism(f)))
}

/// A frame as a call site: `function (module)`, or a Python frame's `function (file:line)`.
pub fn describe(frame: &Frame) -> String {
    if frame.is_python() {
        return frame.function.to_string();
    }
    format!("{} ({})", frame.function, frame.module)
}

impl Names for CallNames {
    fn call_site(&self, tgid: u32, image: ImageOf, user_stack_id: i32, caller: u64) -> String {
        let stack = sample(tgid, image, user_stack_id);
        // A Python program's call is named at its Python line, whatever C code the caller is.
        if user_stack_id >= 0
            && let Some(frame) = self.stacks.user_frames(&stack).iter().rev().find(|f| f.is_python())
        {
            return describe(frame);
        }
        let image = self.stacks.image_of(&stack);
        if let Some(frame) = caller.checked_sub(1).and_then(|addr| self.symbols.get(&(tgid, image, addr)))
            && !is_mechanism(frame)
        {
            return describe(frame);
        }
        if user_stack_id < 0 {
            return "[no user stack]".into();
        }
        let frames = self.stacks.frames(&stack);
        own_frame(&frames).or_else(|| frames.last()).map(describe).unwrap_or_else(|| "[no user stack]".into())
    }

    fn symbol(&self, tgid: u32, image: ImageOf, address: u64) -> String {
        let image = self.stacks.images().index(tgid, image);
        self.symbols
            .get(&(tgid, image, address))
            .map(|f| f.function.to_string())
            .unwrap_or_else(|| format!("{address:#x}"))
    }
}
