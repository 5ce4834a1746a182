//! Flamegraph SVG (`cpu.svg`) drawn by inferno from the folded lines.

use anyhow::Context as _;
use inferno::flamegraph::{self, Options};

use super::{Artifact, Rendered, Sink};

pub struct Flamegraph;

impl Sink for Flamegraph {
    fn render(&self, artifact: &Artifact<'_>) -> anyhow::Result<Option<Rendered>> {
        let Artifact::Stacks { name, title, profile, folded, .. } = artifact else {
            return Ok(None);
        };
        let mut options = Options::default();
        options.title = title.to_string();
        options.count_name = profile.unit.clone();
        let mut svg = Vec::new();
        if folded.is_empty() {
            // inferno refuses empty input; an empty profile still gets a file that says so.
            svg = empty_svg(title).into_bytes();
        } else if profile.stacks.iter().map(|s| u128::from(s.weight)).sum::<u128>() > u128::from(u64::MAX) {
            // inferno adds the weights up in 64 bits.
            anyhow::bail!("the {name} profile's weights add up past 2^64: no flamegraph of it");
        } else {
            flamegraph::from_lines(&mut options, folded.lines(), &mut svg)
                .with_context(|| format!("drawing the {name} flamegraph"))?;
        }
        Ok(Some(Rendered { name: format!("{name}.{}", super::FLAMEGRAPH), bytes: svg }))
    }
}

fn empty_svg(title: &str) -> String {
    format!(
        "<?xml version=\"1.0\" standalone=\"no\"?>\n<svg version=\"1.1\" width=\"1200\" height=\"60\" \
         xmlns=\"http://www.w3.org/2000/svg\"><text x=\"600\" y=\"30\" text-anchor=\"middle\">{title}: \
         no samples</text></svg>\n"
    )
}
