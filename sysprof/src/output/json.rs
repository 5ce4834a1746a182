//! `report.json`: the report model, serialized as is, for scripts and dashboards. It is written
//! straight into its file, never rendered in memory first: a trace of thousands of processes
//! has a row for each in several sections (28.6 MB of JSON for a command that started 16,984),
//! and the rendered copy beside the report itself doubled sysprof's memory at the end of such a
//! trace (35 MB while tracing, 73-76 MB at the end).

use std::io::{self, Write};

use serde::Serialize;

/// The file's name.
pub const FILE: &str = "report.json";

/// Writes `report` as report.json's contents into `out` (buffer it: this is many small writes).
pub fn write(report: &impl Serialize, out: &mut dyn Write) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, report)?;
    out.write_all(b"\n")
}

/// How many bytes `write` writes, counted without keeping them (for the room on the disk).
pub fn size(report: &impl Serialize) -> io::Result<u64> {
    let mut counted = Counted(0);
    write(report, &mut counted)?;
    Ok(counted.0)
}

/// A writer that only counts.
struct Counted(u64);

impl Write for Counted {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0 += bytes.len() as u64;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_size_is_what_is_written() {
        let report = serde_json::json!({"run": {"outputs": ["report.md"]}, "rows": [1, 2, 3]});
        let mut bytes = Vec::new();
        write(&report, &mut bytes).unwrap();
        assert_eq!(size(&report).unwrap(), bytes.len() as u64);
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert!(value.is_object(), "{value}");
    }
}
