//! Folded stacks (`cpu.folded`), the format inferno and FlameGraph read: one line per distinct
//! stack, `process;outer;...;inner count`.

use super::Rendered;
use crate::profile::StackProfile;

/// Profile `name`'s folded file, from its folded text, which it takes over: the text is the
/// file, and a busy machine's page-fault profile is megabytes of it, so it is not copied.
pub fn file(name: &str, mut text: String) -> Rendered {
    text.shrink_to_fit();
    Rendered { name: format!("{name}.{}", super::FOLDED), bytes: text.into_bytes() }
}

/// The folded lines of a profile, heaviest first, as one text: built once per profile, for
/// this file and the flamegraph both (`output::render_profile`), straight into one buffer.
pub fn folded_text(profile: &StackProfile) -> String {
    use std::fmt::Write as _;
    let mut text = String::new();
    for stack in profile.stacks.iter().filter(|stack| stack.weight > 0) {
        if !text.is_empty() {
            text.push('\n');
        }
        push_frame(&mut text, &stack.process);
        for frame in &stack.frames {
            text.push(';');
            push_frame(&mut text, &frame.function);
        }
        // Writing into a String cannot fail.
        let _ = write!(text, " {}", stack.weight);
    }
    text
}

/// `;` separates frames and the last space separates the count: neither may appear inside one.
fn push_frame(text: &mut String, name: &str) {
    if !name.contains([';', '\n', '\r']) {
        text.push_str(name);
        return;
    }
    text.extend(name.chars().map(|c| match c {
        ';' => ':',
        '\n' | '\r' => ' ',
        c => c,
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{profile::WeightedStack, symbolize::Frame};

    #[test]
    fn folds_process_then_frames_then_count() {
        let frame = |f: &str| Frame::new(f.into(), "m".into());
        let profile = StackProfile {
            unit: "samples".into(),
            stacks: vec![
                WeightedStack {
                    pid: 7,
                    process: "busy".into(),
                    frames: vec![frame("main"), frame("burn")],
                    weight: 75,
                    threads: vec![],
                },
                WeightedStack {
                    pid: 7,
                    process: "busy".into(),
                    frames: vec![frame("a;b<c>")],
                    weight: 3,
                    threads: vec![],
                },
                WeightedStack { pid: 7, process: "busy".into(), frames: vec![], weight: 0, threads: vec![] },
            ],
        };
        assert_eq!(folded_text(&profile), "busy;main;burn 75\nbusy;a:b<c> 3");
    }
}
