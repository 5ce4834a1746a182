//! `--push URL`: the run's pprof profiles sent to a Pyroscope server's ingest API
//! (`POST URL/ingest?name=...&from=...&until=...&format=pprof`), so a fleet's hosts, or every
//! rank of a multi-node job, land in the backend its users already run.
//!
//! Each profile goes as `sysprof.KIND{host=...,service=...,pid=...,rank=...}`: the host, the
//! service (the command's program, else the traced process's name), the target's pid and, when
//! the launcher set one (RANK, LOCAL_RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK), the job's rank.
//! A server that cannot be reached or refuses costs one line; the local files are written
//! first and kept, and the trace's exit code is the command's.

use std::time::{Duration, SystemTime};

use crate::output::Rendered;

/// How long one upload may take before sysprof gives up on the server.
const TIMEOUT: Duration = Duration::from_secs(10);

/// What the profiles are labelled with, and the time they cover.
#[derive(Debug, Clone)]
pub struct Series {
    pub labels: Vec<(&'static str, String)>,
    pub from: SystemTime,
    pub until: SystemTime,
    pub sample_rate_hz: u64,
}

impl Series {
    /// The labels of this run: host, service, pid, and the job's rank when set.
    pub fn of(
        service: &str,
        pid: Option<u32>,
        from: SystemTime,
        until: SystemTime,
        sample_rate_hz: u64,
    ) -> Self {
        let mut labels = vec![("host", hostname()), ("service", service.to_string())];
        if let Some(pid) = pid {
            labels.push(("pid", pid.to_string()));
        }
        if let Some(rank) = rank() {
            labels.push(("rank", rank));
        }
        Series { labels, from, until, sample_rate_hz }
    }

    /// `sysprof.KIND{key=value,...}`, values reduced to what the name syntax allows.
    fn name(&self, kind: &str) -> String {
        let labels: Vec<String> =
            self.labels.iter().map(|(k, v)| format!("{k}={}", label_value(v))).collect();
        format!("sysprof.{kind}{{{}}}", labels.join(","))
    }
}

/// Sends each `(name, gzipped pprof)` profile; what happened, as the lines to print.
pub fn send(url: &str, profiles: &[Rendered], series: &Series) -> Result<Vec<String>, String> {
    let agent: ureq::Agent =
        ureq::Agent::config_builder().timeout_global(Some(TIMEOUT)).http_status_as_error(true).build().into();
    let seconds = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut sent = Vec::new();
    for Rendered { name: file, bytes } in profiles {
        let kind = file.strip_suffix(".pb.gz").unwrap_or(file);
        let boundary = format!("sysprof-{:016x}", bytes.len() as u64 ^ seconds(series.from));
        let query = [
            ("name", series.name(kind)),
            ("from", seconds(series.from).to_string()),
            ("until", seconds(series.until).max(seconds(series.from) + 1).to_string()),
            ("format", "pprof".to_string()),
            ("sampleRate", series.sample_rate_hz.to_string()),
            ("spyName", "sysprof".to_string()),
        ];
        let mut request = agent
            .post(format!("{}/ingest", url.trim_end_matches('/')))
            .header("Content-Type", format!("multipart/form-data; boundary={boundary}"));
        for (key, value) in &query {
            request = request.query(*key, value);
        }
        request.send(multipart(&boundary, bytes)).map_err(|e| format!("{file}: {e}"))?;
        sent.push(kind.to_string());
    }
    Ok(vec![format!("pushed {} to {url}", sent.join(", "))])
}

/// The body Pyroscope's pprof ingestion reads: the profile as the form field `profile`.
fn multipart(boundary: &str, profile: &[u8]) -> Vec<u8> {
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"profile\"; filename=\"profile.pprof\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(profile);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    body
}

pub(crate) fn hostname() -> String {
    // The kernel's node name (uname), which is what gethostname returns on Linux.
    nix::sys::utsname::uname()
        .ok()
        .and_then(|u| u.nodename().to_str().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

/// The job's rank as the launchers set it (torchrun, Slurm, Open MPI).
pub(crate) fn rank() -> Option<String> {
    ["RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "LOCAL_RANK"]
        .iter()
        .find_map(|name| std::env::var(name).ok())
}

/// A label value as the name syntax allows: letters, digits, `_`, `-`, `.` and `/`.
fn label_value(value: &str) -> String {
    value.chars().map(|c| if c.is_ascii_alphanumeric() || "_-./".contains(c) { c } else { '_' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_carries_the_labels_in_pyroscope_syntax() {
        let series = Series {
            labels: vec![("host", "node-1".into()), ("service", "train step".into()), ("rank", "3".into())],
            from: SystemTime::UNIX_EPOCH,
            until: SystemTime::UNIX_EPOCH,
            sample_rate_hz: 99,
        };
        assert_eq!(series.name("cpu"), "sysprof.cpu{host=node-1,service=train_step,rank=3}");
    }

    #[test]
    fn the_profile_is_one_form_field() {
        let body = multipart("b", b"\x1f\x8bdata");
        let text = String::from_utf8_lossy(&body);
        assert!(text.starts_with("--b\r\nContent-Disposition: form-data; name=\"profile\""), "{text}");
        assert!(text.ends_with("\r\n--b--\r\n"), "{text}");
    }
}
