//! `report.json`: the report model, serialized as is, for scripts and dashboards.

use std::path::Path;

use super::{Artifact, Sink, write_file};

pub struct JsonReport;

impl Sink for JsonReport {
    fn write(&self, artifact: &Artifact<'_>, dir: &Path) -> anyhow::Result<Option<String>> {
        let Artifact::Report(report) = artifact else {
            return Ok(None);
        };
        let mut json = serde_json::to_vec_pretty(report)?;
        json.push(b'\n');
        write_file(dir, "report.json", &json)?;
        Ok(Some("report.json".into()))
    }
}
