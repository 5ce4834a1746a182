//! Mixed stacks: each call of CPython's evaluation function (`_PyEval_EvalFrameDefault`) in the
//! native stack is replaced by the Python frames it was running, so a C extension's frames sit
//! under the Python function that called them and a Python function reads like
//! `train_step (train.py:42)`.

use std::collections::HashMap;

use sysprof_common::python::{
    FRAME_CODE_MASK, FRAME_ENTRY, FRAME_OFFSET_MAX, FRAME_OFFSET_SHIFT, FRAME_PYTHON,
};

use super::{Code, ProcessCode};
use crate::symbolize::Frame;

/// The Python frames made so far for one process's stacks, by code object and line: every
/// stack through a line shares its frame's names (a Python program's stacks are deep, and
/// their frames the same few hundred lines).
#[derive(Default)]
pub struct PythonFrames(HashMap<(*const Code, u32), Frame>);

/// Whether a recorded frame is a Python frame, not a native address.
pub fn is_python_frame(frame: u64) -> bool {
    frame & FRAME_PYTHON != 0
}

/// The stack of `native` frames (outermost first, symbolized) with the Python frames
/// `python` (innermost first, as recorded) in place of the evaluation function's frames.
/// Python frames left over (the native walk ended early) go above the outermost native frame.
pub fn merge(
    native: Vec<Frame>,
    python: &[u64],
    code: Option<&ProcessCode>,
    stack: u32,
    made: &mut PythonFrames,
) -> Vec<Frame> {
    if python.is_empty() {
        return native;
    }
    let mut groups = python.split_inclusive(|frame| frame & FRAME_ENTRY != 0);
    let mut leaf_first = Vec::with_capacity(native.len() + python.len());
    for frame in native.into_iter().rev() {
        if is_evaluation(&frame.function)
            && let Some(group) = groups.next()
        {
            leaf_first.extend(group.iter().map(|&frame| python_frame(frame, code, stack, made)));
        } else {
            leaf_first.push(frame);
        }
    }
    for group in groups {
        leaf_first.extend(group.iter().map(|&frame| python_frame(frame, code, stack, made)));
    }
    leaf_first.reverse();
    leaf_first
}

/// The native frame of one call of the interpreter's evaluation loop.
fn is_evaluation(function: &str) -> bool {
    function
        .strip_prefix("_PyEval_EvalFrameDefault")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

fn python_frame(frame: u64, code: Option<&ProcessCode>, stack: u32, made: &mut PythonFrames) -> Frame {
    let address = frame & FRAME_CODE_MASK;
    let offset = ((frame >> FRAME_OFFSET_SHIFT) & FRAME_OFFSET_MAX) as u32;
    match code.and_then(|code| code.lookup(stack, address)) {
        Some(code) => {
            let line = code.line_at(offset);
            let frame = made.0.entry((code as *const Code, line)).or_insert_with(|| {
                let file = short_file(&code.file);
                Frame::new(format!("{} ({file}:{line})", code.name).into(), file.into())
            });
            frame.clone()
        }
        None => Frame::new("[unknown Python function]".into(), Frame::PYTHON_UNKNOWN.into()),
    }
}

/// A Python file as people name it: from the package down for installed packages and the
/// standard library, else the file name.
fn short_file(path: &str) -> &str {
    for marker in ["site-packages/", "dist-packages/"] {
        if let Some(at) = path.rfind(marker) {
            return &path[at + marker.len()..];
        }
    }
    const STDLIB: &str = "/lib/python3.";
    if let Some(at) = path.find(STDLIB)
        && let Some(slash) = path[at + STDLIB.len()..].find('/')
    {
        return &path[at + STDLIB.len() + slash + 1..];
    }
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(names: &[&str]) -> Vec<Frame> {
        names.iter().map(|name| Frame::new((*name).into(), "python3.12".into())).collect()
    }

    #[test]
    fn python_frames_replace_the_evaluation_calls_that_ran_them() {
        let mut code = ProcessCode::default();
        for (address, name) in [(0x1000, "main"), (0x2000, "outer"), (0x3000, "inner")] {
            let code_object = Code {
                name: name.into(),
                file: "/srv/app/train.py".into(),
                first_line: 10,
                lines: vec![(0, 10), (4, 12)],
            };
            code.code
                .insert(address, vec![(0, crate::python::code::Seen { signature: 0, code: code_object })]);
        }
        // Innermost first: inner and outer ran in one evaluation call, main in the first.
        let python = [
            0x3000 | FRAME_PYTHON | (5 << FRAME_OFFSET_SHIFT),
            0x2000 | FRAME_PYTHON | FRAME_ENTRY,
            0x1000 | FRAME_PYTHON | FRAME_ENTRY | (4 << FRAME_OFFSET_SHIFT),
        ];
        let stack = native(&[
            "_start",
            "Py_RunMain",
            "_PyEval_EvalFrameDefault",
            "builtin_map",
            "_PyEval_EvalFrameDefault",
            "sqrt",
        ]);
        let merged: Vec<String> = merge(stack, &python, Some(&code), 1, &mut PythonFrames::default())
            .into_iter()
            .map(|f| f.function.to_string())
            .collect();
        assert_eq!(
            merged,
            [
                "_start",
                "Py_RunMain",
                "main (train.py:12)",
                "builtin_map",
                "outer (train.py:10)",
                "inner (train.py:12)",
                "sqrt"
            ]
        );
    }

    #[test]
    fn python_frames_the_native_walk_did_not_reach_go_on_top() {
        let python = [0x1000 | FRAME_PYTHON | FRAME_ENTRY];
        let merged =
            merge(native(&["[unknown] python3.12+0x10"]), &python, None, 1, &mut PythonFrames::default());
        assert_eq!(&*merged[0].function, "[unknown Python function]");
        assert_eq!(merged.len(), 2);
    }

    #[test]
    fn files_are_named_from_their_package() {
        assert_eq!(short_file("/usr/lib/python3.11/json/decoder.py"), "json/decoder.py");
        assert_eq!(short_file("/root/.pyenv/versions/3.12.1/lib/python3.12/re/_parser.py"), "re/_parser.py");
        assert_eq!(
            short_file("/venv/lib/python3.12/site-packages/torch/nn/modules/module.py"),
            "torch/nn/modules/module.py"
        );
        assert_eq!(short_file("/srv/app/train.py"), "train.py");
        assert_eq!(short_file("<string>"), "<string>");
    }
}
