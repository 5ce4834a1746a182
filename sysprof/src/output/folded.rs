//! Folded stacks (`cpu.folded`), the format inferno and FlameGraph read: one line per distinct
//! stack, `process;outer;...;inner count`.

use super::{Artifact, Rendered, Sink};
use crate::profile::StackProfile;

pub struct Folded;

impl Sink for Folded {
    fn render(&self, artifact: &Artifact<'_>) -> anyhow::Result<Option<Rendered>> {
        let Artifact::Stacks { name, profile, .. } = artifact else {
            return Ok(None);
        };
        Ok(Some(Rendered {
            name: format!("{name}.folded"),
            bytes: folded_lines(profile).join("\n").into_bytes(),
        }))
    }
}

/// The folded lines of a profile, heaviest first.
pub fn folded_lines(profile: &StackProfile) -> Vec<String> {
    profile
        .stacks
        .iter()
        .filter(|stack| stack.weight > 0)
        .map(|stack| {
            let mut line = frame_text(&stack.process);
            for frame in &stack.frames {
                line.push(';');
                line.push_str(&frame_text(&frame.function));
            }
            line.push(' ');
            line.push_str(&stack.weight.to_string());
            line
        })
        .collect()
}

/// `;` separates frames and the last space separates the count: neither may appear inside one.
fn frame_text(name: &str) -> String {
    name.replace(';', ":").replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{profile::WeightedStack, symbolize::Frame};

    #[test]
    fn folds_process_then_frames_then_count() {
        let frame = |f: &str| Frame { function: f.into(), module: "m".into() };
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
        assert_eq!(folded_lines(&profile), ["busy;main;burn 75", "busy;a:b<c> 3"]);
    }
}
