//! What a user asks of their own stack: one load (fixed concurrency, or a
//! fixed arrival rate) in rounds, or a rate sweep, against the target and,
//! when the scenario names one, against the baseline (the same server
//! reached without the gateway) with the same load.
//!
//! ```text
//! rounds:  round 1: target, baseline   round 2: baseline, target   ...   (same arrivals on both sides of a round)
//!          → each side pooled over rounds; per round and percentile, target − baseline;
//!            the gateway's added time = the median of those, with their min and max (the spread)
//! sweep:   rate 1: target, baseline   rate 2: baseline, target   ...   → the curve, and where the target saturated
//! ```

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::source;
use crate::tally::Measured;
use crate::{RunResult, Scenario, Summary};

/// Everything a run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The target, pooled over every round (absent for a sweep).
    pub target: Option<RunResult>,
    /// The baseline, pooled over every round, when the scenario named one.
    pub baseline: Option<RunResult>,
    /// What the target added over the baseline, per figure and percentile.
    pub added: Vec<Added>,
    /// Each round's figures (without plot points).
    pub rounds: Vec<Round>,
    /// A sweep's steps and saturation.
    pub sweep: Option<SweepReport>,
}

/// One round: both sides under the same load.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Round {
    /// Which side ran first: `target` or `baseline` (they alternate).
    pub first: String,
    /// The target's figures.
    pub target: RunResult,
    /// The baseline's, when there is one.
    pub baseline: Option<RunResult>,
}

/// What the target added to one figure at one percentile, in milliseconds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Added {
    /// `timeToFirstToken`, `interTokenLatency`, `timePerOutputToken` or `latency`.
    pub figure: String,
    /// `p50`, `p90` or `p99`.
    pub percentile: String,
    /// The median over rounds of (target − baseline) in each round.
    pub median_ms: f64,
    /// The smallest of the rounds' differences.
    pub min_ms: f64,
    /// The largest.
    pub max_ms: f64,
    /// Pooled target − pooled baseline.
    pub pooled_ms: f64,
}

/// A sweep's curve and where it bent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepReport {
    /// One step per offered rate, in order.
    pub steps: Vec<SweepStep>,
    /// Where the target saturated; absent when no step did.
    pub saturation: Option<Saturation>,
    /// Where the baseline saturated.
    pub baseline_saturation: Option<Saturation>,
}

/// One offered rate's figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepStep {
    /// The rate asked for, requests per second.
    pub rate: f64,
    /// The target's figures at it.
    pub target: RunResult,
    /// The baseline's.
    pub baseline: Option<RunResult>,
}

/// The point past which more offered load is not served.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Saturation {
    /// The most requests per second sustained at any step: the capacity.
    pub requests_per_second: f64,
    /// The first rate asked for at which the target fell behind.
    pub first_saturated_rate: f64,
    /// At that rate, more than a hundredth of the requests started late
    /// because every worker was busy: the load generator's concurrency may
    /// be what saturated, not the target (raise `concurrency` and rerun).
    pub limited_by_concurrency: bool,
}

/// A step is saturated when what it sustained fell below this share of
/// what was offered, or more than a hundredth of its requests failed.
pub const SATURATED_BELOW: f64 = 0.9;

/// Runs `scenario` as its baseline, rounds and sweep ask; `progress` hears
/// what runs now.
///
/// # Errors
/// The scenario is invalid; failed requests are counted, not returned.
pub async fn run(scenario: Scenario, progress: impl Fn(String)) -> Result<Report, String> {
    scenario.validate()?;
    // By default every connection opens and every prompt is sent once
    // before anything counts: otherwise the side that runs first in round
    // one pays for the server's cold prefix cache.
    let every_prompt = source::distinct_bodies(&scenario) as u64;
    let warmup = scenario.warmup.unwrap_or(u64::from(scenario.concurrency).max(every_prompt));
    if warmup > 0 {
        progress(format!("warming up: {warmup} requests a side, not counted"));
        let warm = Scenario { requests: warmup, rate: None, sweep: None, rounds: 1, ..scenario.clone() };
        both_sides(&warm, 0, 0).await?;
    }
    match scenario.sweep {
        Some(sweep) => {
            let mut steps = Vec::new();
            let rates = sweep.rates();
            for (index, rate) in rates.iter().copied().enumerate() {
                progress(format!("sweep step {} of {}: {rate:.1} requests per second", index + 1, rates.len()));
                let step = Scenario { rate: Some(rate), sweep: None, rounds: 1, ..scenario.clone() };
                let (target, baseline) = both_sides(&step, index, index as u64 + 1).await?;
                steps.push(SweepStep { rate, target: target.result(), baseline: baseline.map(Measured::result) });
            }
            let target_saturation = saturation(steps.iter().map(|s| (s.rate, &s.target)));
            let baseline_saturation = if scenario.baseline.is_some() {
                saturation(steps.iter().filter_map(|s| s.baseline.as_ref().map(|b| (s.rate, b))))
            } else {
                None
            };
            Ok(Report {
                target: None,
                baseline: None,
                added: Vec::new(),
                rounds: Vec::new(),
                sweep: Some(SweepReport { steps, saturation: target_saturation, baseline_saturation }),
            })
        }
        None => {
            let (mut target, mut baseline) =
                (Measured::default(), scenario.baseline.as_ref().map(|_| Measured::default()));
            let mut rounds = Vec::new();
            for round in 0..scenario.rounds {
                progress(format!("round {} of {}", round + 1, scenario.rounds));
                let share = Scenario { requests: round_requests(&scenario, round), rounds: 1, ..scenario.clone() };
                let (mut this, mut other) = both_sides(&share, round as usize, u64::from(round) + 1).await?;
                let first = if other.is_some() && round % 2 == 1 { "baseline" } else { "target" };
                rounds.push(Round {
                    first: first.to_owned(),
                    target: without_points(this.summary()),
                    baseline: other.as_mut().map(|b| without_points(b.summary())),
                });
                target.pool(this);
                if let (Some(pooled), Some(other)) = (baseline.as_mut(), other) {
                    pooled.pool(other);
                }
            }
            let (target, baseline) = (target.result(), baseline.map(Measured::result));
            let added = baseline.as_ref().map(|b| added(&target, b, &rounds)).unwrap_or_default();
            Ok(Report { target: Some(target), baseline, added, rounds, sweep: None })
        }
    }
}

/// Round `round`'s share of the requests (the first rounds take the rest).
fn round_requests(scenario: &Scenario, round: u32) -> u64 {
    let rounds = u64::from(scenario.rounds);
    scenario.requests / rounds + u64::from(u64::from(round) < scenario.requests % rounds)
}

/// The target and then the baseline, or the other way round when `turn` is
/// odd, with the same arrivals (`seed`).
async fn both_sides(scenario: &Scenario, turn: usize, seed: u64) -> Result<(Measured, Option<Measured>), String> {
    let baseline = scenario.baseline.as_ref().map(|url| Scenario {
        target: url.clone(),
        key: scenario.baseline_key.clone(),
        baseline: None,
        ..scenario.clone()
    });
    let target = Scenario { baseline: None, ..scenario.clone() };
    match baseline {
        None => Ok((source::measure(target, seed).await?, None)),
        Some(baseline) if turn % 2 == 1 => {
            let other = source::measure(baseline, seed).await?;
            Ok((source::measure(target, seed).await?, Some(other)))
        }
        Some(baseline) => {
            let this = source::measure(target, seed).await?;
            Ok((this, Some(source::measure(baseline, seed).await?)))
        }
    }
}

fn without_points(mut result: RunResult) -> RunResult {
    result.percentiles = Vec::new();
    result.ttft_percentiles = Vec::new();
    result
}

/// Per figure and percentile: the median, min and max over rounds of
/// target − baseline, and pooled target − pooled baseline.
pub fn added(target: &RunResult, baseline: &RunResult, rounds: &[Round]) -> Vec<Added> {
    type Pick = fn(&RunResult) -> Option<&Summary>;
    type Value = fn(&Summary) -> f64;
    let figures: [(&str, Pick); 4] = [
        ("timeToFirstToken", |r| r.time_to_first_token.as_ref()),
        ("interTokenLatency", |r| r.inter_token_latency.as_ref()),
        ("timePerOutputToken", |r| r.time_per_output_token.as_ref()),
        ("latency", |r| r.latency.as_ref()),
    ];
    let percentiles: [(&str, Value); 3] = [("p50", |s| s.p50), ("p90", |s| s.p90), ("p99", |s| s.p99)];
    let mut list = Vec::new();
    for (figure, pick) in figures {
        for (percentile, value) in percentiles {
            let Some(pooled) = pick(target).zip(pick(baseline)).map(|(t, b)| value(t) - value(b)) else { continue };
            let mut per_round: Vec<f64> = rounds
                .iter()
                .filter_map(|round| {
                    let baseline = round.baseline.as_ref()?;
                    pick(&round.target).zip(pick(baseline)).map(|(t, b)| value(t) - value(b))
                })
                .collect();
            per_round.sort_by(f64::total_cmp);
            let (Some(min), Some(max)) = (per_round.first().copied(), per_round.last().copied()) else { continue };
            list.push(Added {
                figure: figure.to_owned(),
                percentile: percentile.to_owned(),
                median_ms: median(&per_round),
                min_ms: min,
                max_ms: max,
                pooled_ms: pooled,
            });
        }
    }
    list
}

fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => f64::midpoint(sorted[n / 2 - 1], sorted[n / 2]),
    }
}

/// Where a side of a sweep saturated: the first step that fell behind the
/// rate it was offered, and the most any step sustained.
pub fn saturation<'a>(steps: impl Iterator<Item = (f64, &'a RunResult)> + Clone) -> Option<Saturation> {
    let behind = |result: &RunResult, rate: f64| {
        let offered = result.offered_requests_per_second.unwrap_or(rate);
        result.sustained_requests_per_second < SATURATED_BELOW * offered
            || result.errors as f64 > result.requests as f64 / 100.0
    };
    let (first_saturated_rate, first) = steps.clone().find(|(rate, result)| behind(result, *rate))?;
    let limited_by_concurrency = first.late_starts as f64 > first.requests as f64 / 100.0;
    let requests_per_second = steps.map(|(_, result)| result.sustained_requests_per_second).fold(0.0, f64::max);
    Some(Saturation { requests_per_second, first_saturated_rate, limited_by_concurrency })
}

/// Failed requests over the whole report.
pub fn errors(report: &Report) -> u64 {
    let sides =
        |target: &RunResult, baseline: &Option<RunResult>| target.errors + baseline.as_ref().map_or(0, |b| b.errors);
    let pooled = report.target.as_ref().map_or(0, |t| sides(t, &report.baseline));
    let steps =
        report.sweep.as_ref().map_or(0, |s| s.steps.iter().map(|step| sides(&step.target, &step.baseline)).sum());
    pooled + steps
}

/// The report as a table for a terminal.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let ms = |s: &Option<Summary>, pick: fn(&Summary) -> f64| {
        s.as_ref().map_or_else(|| "-".to_owned(), |s| format!("{:.2}", pick(s)))
    };
    let row = |out: &mut String, label: &str, r: &RunResult| {
        let _ = writeln!(
            out,
            "{label:<16} {:>8} {:>7} {:>9.1} {:>9.1} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            r.ok,
            r.errors,
            r.sustained_requests_per_second,
            r.output_tokens_per_second,
            ms(&r.time_to_first_token, |s| s.p50),
            ms(&r.time_to_first_token, |s| s.p99),
            ms(&r.inter_token_latency, |s| s.p50),
            ms(&r.inter_token_latency, |s| s.p99),
            ms(&r.time_per_output_token, |s| s.p50),
            ms(&r.latency, |s| s.p50),
            ms(&r.latency, |s| s.p99),
        );
        if r.late_starts > 0 {
            let _ = writeln!(
                out,
                "{:<16} {} requests started late, every worker busy: raise --concurrency",
                "", r.late_starts
            );
        }
        if !r.errors_by_kind.is_empty() {
            let kinds: Vec<String> = r.errors_by_kind.iter().map(|(kind, n)| format!("{kind}: {n}")).collect();
            let _ = writeln!(out, "{:<16} errors by kind: {}", "", kinds.join(", "));
        }
    };
    let _ = writeln!(
        out,
        "{:<16} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "",
        "ok",
        "errors",
        "req/s",
        "out tok/s",
        "TTFT p50",
        "TTFT p99",
        "ITL p50",
        "ITL p99",
        "TPOT p50",
        "lat p50",
        "lat p99"
    );
    for (label, result) in [("target", &report.target), ("baseline", &report.baseline)] {
        if let Some(result) = result {
            row(&mut out, label, result);
        }
    }
    if let Some(sweep) = &report.sweep {
        for step in &sweep.steps {
            row(&mut out, &format!("target @{:.1}/s", step.rate), &step.target);
            if let Some(baseline) = &step.baseline {
                row(&mut out, &format!("baseline @{:.1}/s", step.rate), baseline);
            }
        }
        for (side, point) in [("target", &sweep.saturation), ("baseline", &sweep.baseline_saturation)] {
            match point {
                Some(point) => {
                    let _ = writeln!(
                        out,
                        "{side} saturated: {:.1} requests per second sustained at most; first behind at {:.1}/s offered{}",
                        point.requests_per_second,
                        point.first_saturated_rate,
                        if point.limited_by_concurrency {
                            " — but every worker was busy there: raise --concurrency, the limit may be this tool's"
                        } else {
                            ""
                        }
                    );
                }
                None if side == "target"
                    || report.baseline.is_some()
                    || sweep.steps.iter().any(|s| s.baseline.is_some()) =>
                {
                    let _ = writeln!(out, "{side} kept up with every rate of the sweep: raise its top rate");
                }
                None => {}
            }
        }
    }
    if !report.added.is_empty() {
        let _ = writeln!(
            out,
            "added by the target over the baseline, ms: median over {} rounds [min, max]",
            report.rounds.len()
        );
        for added in &report.added {
            let _ = writeln!(
                out,
                "  {:<20} {:<4} {:>+8.3} [{:+.3}, {:+.3}]",
                added.figure, added.percentile, added.median_ms, added.min_ms, added.max_ms
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(latency_p50: f64, ttft_p99: Option<f64>) -> RunResult {
        let summary = |p50: f64, p99: f64| Summary { avg: p50, p50, p90: p99, p99, p999: p99, max: p99 };
        RunResult {
            requests: 10,
            ok: 10,
            errors: 0,
            error_samples: Vec::new(),
            duration_seconds: 1.0,
            requests_per_second: 10.0,
            offered_requests_per_second: None,
            latency: Some(summary(latency_p50, latency_p50 * 2.0)),
            time_to_first_byte: None,
            time_to_first_token: ttft_p99.map(|p99| summary(p99 / 2.0, p99)),
            inter_token_latency: None,
            time_per_output_token: None,
            output_tokens: 0,
            output_tokens_per_second: 0.0,
            sustained_requests_per_second: 10.0,
            late_starts: 0,
            errors_by_kind: std::collections::BTreeMap::new(),
            percentiles: Vec::new(),
            ttft_percentiles: Vec::new(),
        }
    }

    #[test]
    fn the_added_time_is_the_median_of_the_rounds_differences_with_their_spread() {
        let rounds: Vec<Round> = [(10.0, 9.0), (10.0, 7.0), (12.0, 9.5), (10.0, 10.5)]
            .into_iter()
            .map(|(target, baseline)| Round {
                first: "target".to_owned(),
                target: result(target, Some(target)),
                baseline: Some(result(baseline, Some(baseline))),
            })
            .collect();
        let added = added(&result(10.5, Some(10.5)), &result(9.0, Some(9.0)), &rounds);
        let ttft_p99 = added.iter().find(|a| a.figure == "timeToFirstToken" && a.percentile == "p99").unwrap();
        // Differences 1, 3, 2.5, −0.5: median 1.75, from −0.5 to 3.
        assert_eq!((ttft_p99.median_ms, ttft_p99.min_ms, ttft_p99.max_ms, ttft_p99.pooled_ms), (1.75, -0.5, 3.0, 1.5));
        let latency_p99 = added.iter().find(|a| a.figure == "latency" && a.percentile == "p99").unwrap();
        assert_eq!((latency_p99.median_ms, latency_p99.min_ms, latency_p99.max_ms), (3.5, -1.0, 6.0));
        // A figure one side lacks (not streamed) is not compared.
        assert!(added.iter().all(|a| a.figure != "interTokenLatency"));
        let without_ttft = super::added(&result(1.0, None), &result(1.0, Some(1.0)), &rounds);
        assert!(without_ttft.iter().all(|a| a.figure == "latency"), "{without_ttft:?}");
    }

    #[test]
    fn a_sweep_saturates_where_it_first_falls_behind() {
        let step = |rate: f64, sustained: f64, errors: u64| RunResult {
            offered_requests_per_second: Some(rate * 1.02),
            sustained_requests_per_second: sustained,
            errors,
            ..result(1.0, None)
        };
        let kept_up = [step(10.0, 10.1, 0), step(20.0, 19.0, 0)];
        assert_eq!(saturation(kept_up.iter().enumerate().map(|(i, r)| (10.0 * (i + 1) as f64, r))), None);
        let bent =
            [step(10.0, 10.1, 0), step(20.0, 20.3, 0), step(30.0, 24.0, 0), step(40.0, 25.5, 0), step(50.0, 25.0, 0)];
        let found = saturation(bent.iter().enumerate().map(|(i, r)| (10.0 * (i + 1) as f64, r))).unwrap();
        assert_eq!(
            found,
            Saturation { requests_per_second: 25.5, first_saturated_rate: 30.0, limited_by_concurrency: false }
        );
        // Requests held back by busy workers say the tool may be the limit.
        let held = [step(10.0, 10.1, 0), RunResult { late_starts: 2, ..step(20.0, 15.0, 0) }];
        let found = saturation(held.iter().enumerate().map(|(i, r)| (10.0 * (i + 1) as f64, r))).unwrap();
        assert!(found.limited_by_concurrency, "{found:?}");
        // Failing requests saturate a step that otherwise kept up.
        let failing = [step(10.0, 10.1, 0), step(20.0, 20.3, 1)];
        let found = saturation(failing.iter().enumerate().map(|(i, r)| (10.0 * (i + 1) as f64, r))).unwrap();
        assert_eq!(found.first_saturated_rate, 20.0);
    }

    #[test]
    fn rounds_share_the_requests_and_every_one_is_sent() {
        let scenario = |requests, rounds| Scenario {
            requests,
            rounds,
            ..serde_json::from_value(serde_json::json!({"target": "http://x", "concurrency": 1, "requests": 1}))
                .unwrap()
        };
        for (requests, rounds) in [(10, 3), (9, 3), (100, 7), (5, 5)] {
            let shares: Vec<u64> = (0..rounds).map(|r| round_requests(&scenario(requests, rounds), r)).collect();
            assert_eq!(shares.iter().sum::<u64>(), requests, "{shares:?}");
            assert!(shares.iter().max().unwrap() - shares.iter().min().unwrap() <= 1, "{shares:?}");
        }
    }
}
