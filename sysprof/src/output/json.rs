//! `report.json`: the report model, serialized as is, for scripts and dashboards.

use super::{Artifact, Rendered, Sink};

pub struct JsonReport;

impl Sink for JsonReport {
    fn render(&self, artifact: &Artifact<'_>) -> anyhow::Result<Option<Rendered>> {
        let Artifact::Report(report) = artifact else {
            return Ok(None);
        };
        let mut json = serde_json::to_vec_pretty(report)?;
        json.push(b'\n');
        Ok(Some(Rendered { name: "report.json".into(), bytes: json }))
    }
}
