//! A report as CSV: one row per side of each pooled result, round and
//! sweep step, then the gateway's added time (median, min and max over
//! rounds) in the same columns, for a spreadsheet or a plotting script.

use std::fmt::Write as _;

use crate::study::{Added, Report};
use crate::{RunResult, Summary};

const COLUMNS: &str = "row,side,round,rate,requests,ok,errors,requests_per_second,sustained_requests_per_second,\
output_tokens_per_second,latency_p50_ms,latency_p90_ms,latency_p99_ms,ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,\
itl_p50_ms,itl_p90_ms,itl_p99_ms,tpot_p50_ms,tpot_p90_ms,tpot_p99_ms";

/// `report` as CSV text, a header line first.
pub fn report(report: &Report) -> String {
    let mut out = String::from(COLUMNS);
    out.push('\n');
    let mut run = |row: &str, side: &str, round: Option<usize>, rate: Option<f64>, result: &RunResult| {
        let summary = |s: &Option<Summary>| {
            s.as_ref().map_or_else(|| ",,".to_owned(), |s| format!("{:.3},{:.3},{:.3}", s.p50, s.p90, s.p99))
        };
        let _ = writeln!(
            out,
            "{row},{side},{},{},{},{},{},{:.3},{:.3},{:.3},{},{},{},{}",
            round.map(|r| (r + 1).to_string()).unwrap_or_default(),
            rate.map(|r| format!("{r:.3}")).unwrap_or_default(),
            result.requests,
            result.ok,
            result.errors,
            result.requests_per_second,
            result.sustained_requests_per_second,
            result.output_tokens_per_second,
            summary(&result.latency),
            summary(&result.time_to_first_token),
            summary(&result.inter_token_latency),
            summary(&result.time_per_output_token),
        );
    };
    for (side, result) in [("target", &report.target), ("baseline", &report.baseline)] {
        if let Some(result) = result {
            run("pooled", side, None, None, result);
        }
    }
    for (index, round) in report.rounds.iter().enumerate() {
        run("round", "target", Some(index), None, &round.target);
        if let Some(baseline) = &round.baseline {
            run("round", "baseline", Some(index), None, baseline);
        }
    }
    if let Some(sweep) = &report.sweep {
        for step in &sweep.steps {
            run("step", "target", None, Some(step.rate), &step.target);
            if let Some(baseline) = &step.baseline {
                run("step", "baseline", None, Some(step.rate), baseline);
            }
        }
    }
    if !report.added.is_empty() {
        for (side, value) in [
            ("median", (|a: &Added| a.median_ms) as fn(&Added) -> f64),
            ("min", |a| a.min_ms),
            ("max", |a| a.max_ms),
            ("pooled", |a| a.pooled_ms),
        ] {
            let cell = |figure: &str| {
                ["p50", "p90", "p99"]
                    .iter()
                    .map(|p| {
                        report
                            .added
                            .iter()
                            .find(|a| a.figure == figure && a.percentile == *p)
                            .map(|a| format!("{:.3}", value(a)))
                            .unwrap_or_default()
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let _ = writeln!(
                out,
                "added,{side},,,,,,,,,{},{},{},{}",
                cell("latency"),
                cell("timeToFirstToken"),
                cell("interTokenLatency"),
                cell("timePerOutputToken")
            );
        }
    }
    out
}
