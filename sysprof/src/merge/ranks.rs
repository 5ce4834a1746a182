//! Each rank's figures, side by side, and the straggler: the rank whose collectives start
//! late, so that every other rank waits for it inside its own.
//!
//! Two measures, each from the ranks' timelines:
//! - the time before each collective (from the end of the previous one): a rank that computes
//!   or loads longer between collectives is late to each, whatever the clocks say;
//! - when the runs overlapped in time (the ranks of one job), the arrival lag: how long after
//!   the first rank each one started its i-th collective, on the hosts' wall clocks.
//!
//! The others' NCCL calls then take longer than the straggler's, since they wait in them: that
//! skew is quoted beside.

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use super::{Merged, timeline::HostTimeline};
use crate::{
    latency::format_ns,
    output::markdown::{escape, table},
    report::format::{percent, seconds, thousands},
};

/// One run of the job, as its output directory says.
#[derive(Debug, Serialize)]
pub struct RankRun {
    pub dir: String,
    /// How the merge names it: "rank R (host)", or the host, or the directory.
    pub label: String,
    pub host: String,
    pub rank: Option<String>,
    pub target: String,
    pub duration_s: f64,
    /// The seconds the target's threads were busy, or the command's wall time.
    pub target_time_s: f64,
    pub cpu_samples: u64,
    /// The hottest function on the CPU and its share of the samples.
    pub top_function: Option<(String, f64)>,
    /// Seconds in CUDA runtime and driver calls, and in NCCL calls.
    pub cuda_call_s: f64,
    pub nccl_call_s: f64,
    pub collectives: u64,
    /// From the timeline, with two collectives or more.
    pub mean_before_collective_ns: Option<f64>,
    pub mean_collective_ns: Option<f64>,
    /// How long after the first rank this one starts each collective, on average (when the
    /// runs overlapped).
    pub mean_arrival_lag_ns: Option<f64>,
    /// Each collective's start, wall-clock nanoseconds (for the arrival lags).
    #[serde(skip)]
    starts: Vec<u64>,
}

/// The longest a run can claim to have lasted, in seconds: 146 years of CLOCK_MONOTONIC.
const MAX_RUN_S: f64 = (1u64 << 62) as f64 / 1e9;

/// `report.json`'s bytes as a report the merge can read, or why not. A sysprof report is a
/// JSON object with `sysprof_version` (a string) and a `run` whose `started_at` is a string,
/// `duration_s` a number and `samples` a count: what every sysprof has written. Then what it
/// claims of the figures the merge uses is checked against what a run can have.
pub fn parse_report(bytes: &[u8]) -> Result<Value, String> {
    let not_one = |why: String| format!("report.json is not a sysprof report ({why})");
    let report: Value =
        serde_json::from_slice(bytes).map_err(|error| not_one(format!("not JSON: {error}")))?;
    let run = &report["run"];
    let marked = report["sysprof_version"].is_string()
        && run["started_at"].is_string()
        && run["duration_s"].is_number()
        && run["samples"].is_number();
    if !marked {
        return Err(not_one(
            "one has \"sysprof_version\" and a \"run\" with \"started_at\", \"duration_s\" and \"samples\""
                .into(),
        ));
    }
    let claim = |field: &str, why: &str| format!("report.json's {field} {why}");
    let seconds = |field: &str, value: &Value, most: f64| match value.as_f64() {
        Some(s) if !(0.0..=most).contains(&s) => {
            Err(claim(field, &format!("is {s:?}, not a number of seconds a run can have")))
        }
        _ => Ok(()),
    };
    seconds("run.duration_s", &run["duration_s"], MAX_RUN_S)?;
    // The target's busy seconds: every CPU's whole run at most.
    let cpus = run["cpus"].as_f64().unwrap_or(1.0).max(1.0);
    seconds("run.target_time_s", &run["target_time_s"], MAX_RUN_S * cpus)?;
    if run["samples"].as_u64().is_none() {
        return Err(claim("run.samples", "is not a count"));
    }
    if let Some(share) = report["hotspots"].as_array().and_then(|h| h.first()).map(|h| &h["self_share"])
        && share.as_f64().is_some_and(|share| !(0.0..=1.0).contains(&share))
    {
        return Err(claim("hotspots[0].self_share", &format!("is {share}, where a share is 0 to 1")));
    }
    for (index, function) in report["gpu"]["functions"].as_array().into_iter().flatten().enumerate() {
        seconds(
            &format!("gpu.functions[{index}].latency.total_ns"),
            &function["latency"]["total_ns"],
            f64::MAX,
        )?;
    }
    for (index, op) in report["gpu"]["nccl"].as_array().into_iter().flatten().enumerate() {
        if !op["calls"].is_null() && op["calls"].as_u64().is_none() {
            return Err(claim(&format!("gpu.nccl[{index}].calls"), "is not a count"));
        }
    }
    Ok(report)
}

impl RankRun {
    pub fn of(dir: &Path, report: &Value, timeline: Option<&HostTimeline>) -> Self {
        let run = &report["run"];
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let functions = report["gpu"]["functions"].as_array().map(Vec::as_slice).unwrap_or_default();
        let call_s = |nccl: bool| {
            functions
                .iter()
                .filter(|f| (f["library"] == "Nccl") == nccl)
                .filter_map(|f| f["latency"]["total_ns"].as_f64())
                .fold(0.0, |total, ns| total + ns)
                / 1e9
        };
        let top = report["hotspots"]
            .as_array()
            .and_then(|h| h.first())
            .map(|h| (text(&h["function"]), h["self_share"].as_f64().unwrap_or(0.0)));
        let collectives_in_report: u64 = report["gpu"]["nccl"].as_array().map_or(0, |ops| {
            crate::record::reader::saturating_sum(ops.iter().filter_map(|op| op["calls"].as_u64()))
        });
        let (mut before, mut within, mut starts) = (None, None, Vec::new());
        if let Some(timeline) = timeline {
            let calls = &timeline.collectives;
            starts = calls.iter().map(|(start, _)| timeline.realtime(*start)).collect();
            if calls.len() >= 2 {
                let gaps: Vec<f64> = calls.windows(2).map(|w| w[1].0.saturating_sub(w[0].1) as f64).collect();
                before = Some(gaps.iter().sum::<f64>() / gaps.len() as f64);
                within = Some(
                    calls.iter().map(|(s, e)| e.saturating_sub(*s) as f64).sum::<f64>() / calls.len() as f64,
                );
            }
        }
        RankRun {
            dir: dir.display().to_string(),
            label: String::new(),
            host: text(&run["host"]),
            rank: run["rank"].as_str().map(str::to_string),
            target: text(&run["target"]),
            duration_s: run["duration_s"].as_f64().unwrap_or(0.0),
            target_time_s: run["target_time_s"].as_f64().unwrap_or(0.0),
            cpu_samples: run["samples"].as_u64().unwrap_or(0),
            top_function: top,
            cuda_call_s: call_s(false),
            nccl_call_s: call_s(true),
            collectives: collectives_in_report.max(starts.len() as u64),
            mean_before_collective_ns: before,
            mean_collective_ns: within,
            mean_arrival_lag_ns: None,
            starts,
        }
    }
}

/// Labels every run: "rank R (host)" where the launcher set a rank, else its host, else (two
/// runs on one host, without ranks) its directory.
pub fn name_uniquely(runs: &mut [RankRun]) {
    for run in runs.iter_mut() {
        run.label = match (&run.rank, run.host.is_empty()) {
            (Some(rank), false) => format!("rank {rank} ({})", run.host),
            (Some(rank), true) => format!("rank {rank}"),
            (None, false) => run.host.clone(),
            (None, true) => run.dir.clone(),
        };
    }
    let labels: Vec<String> = runs.iter().map(|r| r.label.clone()).collect();
    for run in runs.iter_mut() {
        if labels.iter().filter(|l| **l == run.label).count() > 1 {
            run.label = format!("{} ({})", run.label, run.dir);
        }
    }
}

/// The arrival lags, when the runs' collectives overlapped in wall-clock time (one job's
/// ranks; runs at different times have none).
pub fn arrival_lags(runs: &mut [RankRun]) {
    let timed: Vec<&RankRun> = runs.iter().filter(|r| !r.starts.is_empty()).collect();
    if timed.len() < 2 {
        return;
    }
    let first_start = timed.iter().map(|r| r.starts[0]).max().unwrap_or(0);
    let last_start = timed.iter().map(|r| *r.starts.last().unwrap()).min().unwrap_or(0);
    if first_start >= last_start {
        return;
    }
    let count = timed.iter().map(|r| r.starts.len()).min().unwrap_or(0);
    let earliest: Vec<u64> =
        (0..count).map(|i| timed.iter().map(|r| r.starts[i]).min().unwrap_or(0)).collect();
    for run in runs.iter_mut().filter(|r| r.starts.len() >= count && count > 0) {
        let lag: f64 = (0..count).map(|i| (run.starts[i] - earliest[i]) as f64).sum();
        run.mean_arrival_lag_ns = Some(lag / count as f64);
    }
}

/// The rank that holds the others up.
#[derive(Debug, Serialize)]
pub struct Straggler {
    pub label: String,
    pub dir: String,
    /// "arrival lag" or "time before each collective".
    pub measure: String,
    /// Its figure and the other ranks' median, in nanoseconds.
    pub its_ns: f64,
    pub others_ns: f64,
    /// What every other rank waits for it per job, in seconds: its excess times its collectives.
    pub seconds_held: f64,
    pub summary: String,
}

/// The straggler, when one rank is late by at least 1 ms and 20% more than the others' median.
pub fn straggler(runs: &[RankRun]) -> Option<Straggler> {
    let by = |measure: fn(&RankRun) -> Option<f64>| -> Option<(usize, f64, f64)> {
        let figures: Vec<(usize, f64)> =
            runs.iter().enumerate().filter_map(|(i, r)| Some((i, measure(r)?))).collect();
        if figures.len() < 2 {
            return None;
        }
        let (worst, its) = figures.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1))?;
        let mut others: Vec<f64> = figures.iter().filter(|(i, _)| *i != worst).map(|(_, f)| *f).collect();
        others.sort_by(f64::total_cmp);
        let median = others[others.len() / 2];
        (its - median >= 1e6_f64.max(0.2 * median)).then_some((worst, its, median))
    };
    let (measure, (index, its, others)) = match by(|r| r.mean_arrival_lag_ns) {
        Some(found) => ("arrival lag", found),
        None => ("time before each collective", by(|r| r.mean_before_collective_ns)?),
    };
    let run = &runs[index];
    let seconds_held = (its - others) * run.collectives as f64 / 1e9;
    // Seen only where the ranks ran together: the others' collectives last longer than its own.
    let waits = {
        let other_collective: Vec<f64> = runs
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != index)
            .filter_map(|(_, r)| r.mean_collective_ns)
            .collect();
        let others_mean = other_collective.iter().sum::<f64>() / other_collective.len().max(1) as f64;
        match run.mean_collective_ns {
            Some(own) if !other_collective.is_empty() && others_mean > own => format!(
                "; the others wait for it inside their collectives: {} each on average against its {}",
                format_ns(others_mean as u64),
                format_ns(own as u64)
            ),
            _ => String::new(),
        }
    };
    let held = match measure {
        "arrival lag" => format!("that holds every other rank up {}", seconds(seconds_held)),
        // Runs at different times: what it would cost the others in one job.
        _ => format!("in one job every other rank would wait {} for it", seconds(seconds_held)),
    };
    let what = match measure {
        "arrival lag" => format!(
            "it starts each collective {} after the first rank on average (the others' median {})",
            format_ns(its as u64),
            format_ns(others as u64)
        ),
        _ => format!(
            "it spends {} before each collective against {} for the others (median)",
            format_ns(its as u64),
            format_ns(others as u64)
        ),
    };
    let summary = format!(
        "{} is the straggler: {what}{waits}. Over its {} collectives {held}: balance its work (data shard, \
         input pipeline, its host's load) or read its own report for what it does before each collective",
        run.label,
        thousands(run.collectives),
    );
    Some(Straggler {
        label: run.label.clone(),
        dir: run.dir.clone(),
        measure: measure.into(),
        its_ns: its,
        others_ns: others,
        seconds_held,
        summary,
    })
}

/// merged.md.
pub fn markdown(merged: &Merged) -> String {
    let mut out = String::from("# sysprof merge\n\n");
    out.push_str(&format!("{} runs, one per host or rank.\n\n", merged.ranks.len()));
    out.push_str("## Stragglers\n\n");
    match &merged.straggler {
        Some(straggler) => out.push_str(&format!("{}.\n\n", escape(&straggler.summary))),
        None => out.push_str(
            "No straggler: no rank starts its collectives later than the others by 1 ms and 20% or more \
             (or the runs made fewer than two collectives each).\n\n",
        ),
    }
    out.push_str("## Ranks side by side\n\n");
    let ns = |v: Option<f64>| v.map_or("-".into(), |v| format_ns(v as u64));
    let rows: Vec<Vec<String>> = merged
        .ranks
        .iter()
        .map(|r| {
            vec![
                escape(&r.label),
                escape(&r.target),
                format!("{:.2} s", r.duration_s),
                format!("{:.2} s", r.target_time_s),
                thousands(r.cpu_samples),
                r.top_function
                    .as_ref()
                    .map_or("-".into(), |(f, share)| format!("`{}` {}", escape(f), percent(*share))),
                format!("{:.3} s", r.cuda_call_s),
                format!("{:.3} s", r.nccl_call_s),
                thousands(r.collectives),
                ns(r.mean_before_collective_ns),
                ns(r.mean_collective_ns),
                ns(r.mean_arrival_lag_ns),
            ]
        })
        .collect();
    table(
        &mut out,
        &[
            "Run",
            "Target",
            "Duration",
            "Target time",
            "CPU samples",
            "Hottest function",
            "CUDA calls",
            "NCCL calls",
            "Collectives",
            "Before each collective",
            "In each collective",
            "Arrival lag",
        ],
        &rows,
    );
    out.push('\n');
    if let Some(file) = &merged.timeline {
        out.push_str(&format!(
            "The timeline of every host: `{file}` (open it at ui.perfetto.dev), one machine per host, on the \
             hosts' wall clocks.\n\n"
        ));
    }
    for note in &merged.notes {
        out.push_str(&format!("- {}\n", escape(note)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_told_from_other_json_and_old_ones_still_are() {
        for json in ["null", "[]", "{\"hello\":1}", "{\"sysprof_version\":\"0.1.0\",\"run\":[]}", "x"] {
            let fault = parse_report(json.as_bytes()).unwrap_err();
            assert!(fault.starts_with("report.json is not a sysprof report ("), "{json}: {fault}");
        }
        // The first sysprof's report: no target_time_s, hosts nor ranks.
        let old = r#"{"sysprof_version":"0.1.0","run":{"target":"pid 1","started_at":"2026-01-01T00:00:00Z",
            "duration_s":1.5,"samples":10,"cpus":2},"hotspots":[{"function":"f","self_share":0.5}]}"#;
        let report = parse_report(old.as_bytes()).unwrap();
        let run = RankRun::of(Path::new("old"), &report, None);
        assert_eq!((run.cpu_samples, run.duration_s, run.target_time_s), (10, 1.5, 0.0));
    }

    #[test]
    fn what_a_report_claims_is_checked() {
        let with = |field: &str, value: &str| {
            let json = r#"{"sysprof_version":"1","run":{"started_at":"t","duration_s":1.0,"samples":1,"cpus":1,
                "target_time_s":0.5},"hotspots":[{"self_share":0.5}],"gpu":{"nccl":[{"calls":1}]}}"#;
            let mut report: Value = serde_json::from_str(json).unwrap();
            let mut at = &mut report;
            for part in field.split('.') {
                at = match part.parse::<usize>() {
                    Ok(index) => &mut at[index],
                    Err(_) => &mut at[part],
                };
            }
            *at = serde_json::from_str(value).unwrap();
            parse_report(report.to_string().as_bytes())
        };
        assert!(with("run.samples", "1").is_ok());
        for (field, value, fault) in [
            ("run.duration_s", "-1", "report.json's run.duration_s is -1.0"),
            ("run.duration_s", "1e300", "report.json's run.duration_s is 1e300"),
            ("run.target_time_s", "-0.5", "report.json's run.target_time_s is -0.5"),
            ("run.samples", "-1", "report.json's run.samples is not a count"),
            ("run.samples", "1.5", "report.json's run.samples is not a count"),
            ("hotspots.0.self_share", "1.5", "report.json's hotspots[0].self_share is 1.5"),
            ("gpu.nccl.0.calls", "-3", "report.json's gpu.nccl[0].calls is not a count"),
        ] {
            let got = with(field, value).unwrap_err();
            assert!(got.starts_with(fault), "{field} = {value}: {got}");
        }
    }

    #[test]
    fn collectives_a_report_claims_add_up_without_wrapping() {
        let json = r#"{"sysprof_version":"1","run":{"started_at":"t","duration_s":1.0,"samples":1},
            "gpu":{"nccl":[{"calls":18446744073709551615},{"calls":18446744073709551615}]}}"#;
        let report = parse_report(json.as_bytes()).unwrap();
        assert_eq!(RankRun::of(Path::new("d"), &report, None).collectives, u64::MAX);
    }

    fn run(label: &str, starts: Vec<u64>, before_ms: f64) -> RankRun {
        RankRun {
            dir: format!("/tmp/{label}"),
            label: label.into(),
            host: label.into(),
            rank: None,
            target: String::new(),
            duration_s: 1.0,
            target_time_s: 1.0,
            cpu_samples: 0,
            top_function: None,
            cuda_call_s: 0.0,
            nccl_call_s: 0.0,
            collectives: starts.len() as u64,
            mean_before_collective_ns: Some(before_ms * 1e6),
            mean_collective_ns: Some(1e6),
            mean_arrival_lag_ns: None,
            starts,
        }
    }

    #[test]
    fn ranks_that_ran_together_are_judged_by_when_they_arrive() {
        // Three ranks of one job, 10 collectives 100 ms apart; c arrives 5 ms after the others
        // though its time before each looks like theirs (its clock runs the same work slower).
        let at = |offset_ms: u64| {
            (0..10).map(|i| 1_000_000_000_000 + i * 100_000_000 + offset_ms * 1_000_000).collect()
        };
        let mut runs = vec![run("a", at(0), 20.0), run("b", at(1), 20.0), run("c", at(5), 20.5)];
        arrival_lags(&mut runs);
        let lag = |i: usize| runs[i].mean_arrival_lag_ns.unwrap() / 1e6;
        assert_eq!((lag(0), lag(1), lag(2)), (0.0, 1.0, 5.0));
        let straggler = straggler(&runs).expect("c is late");
        assert_eq!((straggler.label.as_str(), straggler.measure.as_str()), ("c", "arrival lag"));
        assert!((straggler.seconds_held - 0.04).abs() < 1e-9, "(5 - 1) ms x 10: {}", straggler.seconds_held);
        assert!(straggler.summary.contains("holds every other rank up"), "{}", straggler.summary);
    }

    #[test]
    fn runs_at_different_times_have_no_arrival_lag_and_even_ranks_no_straggler() {
        let mut runs = vec![run("a", vec![10, 20], 20.0), run("b", vec![5_000, 6_000], 20.4)];
        arrival_lags(&mut runs);
        assert!(runs.iter().all(|r| r.mean_arrival_lag_ns.is_none()));
        assert!(straggler(&runs).is_none(), "0.4 ms apart is no straggler");
    }
}
