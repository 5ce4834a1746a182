//! The profile as a Python program's author reads its advice: the interpreter's own C code
//! under a Python function is that function's time (it is how CPython runs it), and a
//! function's lines are one function. The flamegraphs and folded stacks keep every frame and
//! line; this view is for the hotspots and the ranked recommendations.

use crate::{
    profile::{StackProfile, WeightedStack},
    symbolize::Frame,
};

/// Modules whose frames under a Python frame are the interpreter running it: CPython itself
/// (the `python3.12` executable or `libpython3.12.so`) and the C library it calls.
fn runs_python(frame: &Frame) -> bool {
    ["python", "libpython", "libc.so", "libc-", "libm.so", "ld-linux"]
        .iter()
        .any(|m| frame.module.starts_with(m))
}

/// `profile` with each stack's interpreter frames under its innermost Python frame folded into
/// it, and Python frames named by function (`train_step (train.py)`). A C extension's frames
/// (numpy, torch) and the kernel's stay: their time is theirs.
pub fn by_function(profile: &StackProfile) -> StackProfile {
    let mut merged: std::collections::HashMap<(u32, String, Vec<Frame>), WeightedStack> = Default::default();
    for stack in &profile.stacks {
        let frames = function_frames(&stack.frames);
        let entry = merged
            .entry((stack.pid, stack.process.clone(), frames.clone()))
            .or_insert_with(|| WeightedStack { frames, weight: 0, threads: Vec::new(), ..stack.clone() });
        entry.weight += stack.weight;
        entry.threads.extend(stack.threads.iter().cloned());
    }
    let mut stacks: Vec<WeightedStack> = merged.into_values().collect();
    stacks.sort_by(|a, b| b.weight.cmp(&a.weight).then_with(|| a.frames.cmp(&b.frames)));
    StackProfile { unit: profile.unit.clone(), stacks }
}

fn function_frames(frames: &[Frame]) -> Vec<Frame> {
    let Some(innermost) = frames.iter().rposition(Frame::is_python) else { return frames.to_vec() };
    let mut out: Vec<Frame> = frames[..=innermost].iter().map(without_line).collect();
    let below = &frames[innermost + 1..];
    match below.iter().position(|f| !runs_python(f) && !f.is_kernel()) {
        // A C extension or another library: from there on, its own frames.
        Some(native) => out.extend(below[native..].iter().cloned()),
        None => out.extend(below.iter().filter(|f| f.is_kernel()).cloned()),
    }
    out
}

/// `train_step (train.py:42)` as `train_step (train.py)`.
fn without_line(frame: &Frame) -> Frame {
    if !frame.is_python() {
        return frame.clone();
    }
    let function = match frame.function.rsplit_once(':') {
        Some((head, line))
            if line.ends_with(')') && line[..line.len() - 1].bytes().all(|b| b.is_ascii_digit()) =>
        {
            format!("{head})").into()
        }
        _ => frame.function.clone(),
    };
    Frame::new(function, frame.module.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, module: &str) -> Frame {
        Frame::new(function.into(), module.into())
    }

    #[test]
    fn the_interpreter_under_a_python_function_is_its_time() {
        let stack = [
            frame("_start", "python3.12"),
            frame("main (app.py:9)", "app.py"),
            frame("work (app.py:3)", "app.py"),
            frame("_PyObject_Malloc", "libpython3.12.so.1.0"),
            frame("memset", "libc.so.6"),
            frame("asm_exc_page_fault", Frame::KERNEL_MODULE),
        ];
        let names: Vec<String> =
            function_frames(&stack).into_iter().map(|f| f.function.to_string()).collect();
        assert_eq!(names, ["_start", "main (app.py)", "work (app.py)", "asm_exc_page_fault"]);
        // A C extension keeps its frames under its Python caller.
        let numpy = [
            stack[2].clone(),
            frame("PyObject_Call", "python3.12"),
            frame("DOUBLE_add", "_multiarray_umath.so"),
        ];
        let names: Vec<String> =
            function_frames(&numpy).into_iter().map(|f| f.function.to_string()).collect();
        assert_eq!(names, ["work (app.py)", "DOUBLE_add"]);
    }
}
