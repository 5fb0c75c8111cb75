//! What a run measured, worker by worker, and how it sums up: latencies,
//! first bytes and tokens, gaps between tokens (a uniform sample past a
//! bound), failures by kind, and the window the sustained rate is counted in.

use std::collections::BTreeMap;

use crate::arrival::SplitMix;
use crate::{RunResult, Summary, plot_points};

/// What one worker measured (nanoseconds).
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) latencies: Vec<u64>,
    pub(crate) first_bytes: Vec<u64>,
    pub(crate) first_tokens: Vec<u64>,
    /// Gaps between output tokens: every one up to the worker's share of
    /// [`GAPS_KEPT`], then a uniform sample of them (a run of millions of
    /// long streams would hold gigabytes otherwise).
    pub(crate) token_gaps: Vec<u64>,
    pub(crate) gaps_seen: u64,
    pub(crate) per_token: Vec<u64>,
    /// When each successful request ended, since the run started.
    pub(crate) ends: Vec<u64>,
    pub(crate) output_tokens: u64,
    /// Requests that started later than scheduled because every worker was
    /// busy: the load generator's concurrency, not the target, held them.
    pub(crate) late_starts: u64,
    pub(crate) errors_by_kind: BTreeMap<String, u64>,
    pub(crate) error_samples: Vec<String>,
}

/// Token gaps a run keeps in all (8 bytes each); past it, a uniform sample.
pub(crate) const GAPS_KEPT: usize = 4_000_000;
/// Gaps one stream may add; a stream of more (a hostile or broken server
/// sending endless tiny events) adds its first ones only.
pub(crate) const GAPS_PER_STREAM: usize = 100_000;

/// The share of `seen` gaps that `kept` of them are (all of none).
fn share(kept: usize, seen: u64) -> f64 {
    if seen == 0 { 1.0 } else { kept as f64 / seen as f64 }
}

/// Keeps `keep` of `gaps`, each as likely as another.
fn thin(gaps: &mut Vec<u64>, keep: usize, random: &mut SplitMix) {
    if gaps.len() <= keep {
        return;
    }
    for at in 0..keep {
        let left = (gaps.len() - at) as u64;
        let pick = at + usize::try_from(random.next_u64() % left).unwrap_or(0);
        gaps.swap(at, pick);
    }
    gaps.truncate(keep);
}

impl Tally {
    /// Adds `other` gaps (a sample of `other_seen`) to these so that what
    /// is kept stays a uniform sample of every gap seen, at most
    /// [`GAPS_KEPT`]: both sides thinned to the smaller of their shares
    /// (a worker that saw more is not outweighed by one that saw less).
    pub(crate) fn merge_gaps(&mut self, mut other: Vec<u64>, other_seen: u64, random: &mut SplitMix) {
        let seen = self.gaps_seen + other_seen;
        let kept = share(self.token_gaps.len(), self.gaps_seen)
            .min(share(other.len(), other_seen))
            .min(share(GAPS_KEPT, seen))
            .min(1.0);
        thin(&mut self.token_gaps, (self.gaps_seen as f64 * kept).round() as usize, random);
        thin(&mut other, (other_seen as f64 * kept).round() as usize, random);
        self.token_gaps.extend(other);
        self.gaps_seen = seen;
    }

    /// Keeps `gaps` within `room` by reservoir sampling (each gap seen is
    /// kept with the same chance); `random` picks.
    pub(crate) fn keep_gaps(&mut self, gaps: &[u64], room: usize, random: &mut SplitMix) {
        for &gap in gaps {
            self.gaps_seen += 1;
            if self.token_gaps.len() < room {
                self.token_gaps.push(gap);
            } else {
                let slot = random.next_u64() % self.gaps_seen;
                if let Some(kept) = usize::try_from(slot).ok().and_then(|slot| self.token_gaps.get_mut(slot)) {
                    *kept = gap;
                }
            }
        }
    }

    pub(crate) fn error(&mut self, failure: Failure) {
        *self.errors_by_kind.entry(failure.kind).or_default() += 1;
        if self.error_samples.len() < 5 {
            self.error_samples.push(failure.detail);
        }
    }

    pub(crate) fn absorb(&mut self, other: Self, random: &mut SplitMix) {
        self.latencies.extend(other.latencies);
        self.first_bytes.extend(other.first_bytes);
        self.first_tokens.extend(other.first_tokens);
        self.merge_gaps(other.token_gaps, other.gaps_seen, random);
        self.per_token.extend(other.per_token);
        self.ends.extend(other.ends);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.late_starts += other.late_starts;
        for (kind, count) in other.errors_by_kind {
            *self.errors_by_kind.entry(kind).or_default() += count;
        }
        for sample in other.error_samples {
            if self.error_samples.len() < 5 {
                self.error_samples.push(sample);
            }
        }
    }
}

/// A failed request: its kind (the key of `errorsByKind`) and what happened.
pub(crate) struct Failure {
    pub(crate) kind: String,
    pub(crate) detail: String,
}

pub(crate) fn failure(kind: &str, detail: String) -> Failure {
    Failure { kind: kind.to_owned(), detail }
}

/// What a run measured, before it is summed up: runs of the same target
/// (rounds) pool into one with [`Measured::pool`].
#[derive(Default)]
pub struct Measured {
    pub(crate) requests: u64,
    pub(crate) offered: Option<f64>,
    pub(crate) streamed: bool,
    pub(crate) seconds: f64,
    /// Completions counted toward the sustained rate, and the seconds they
    /// were counted over (see [`completion_window`]).
    pub(crate) window: (f64, f64),
    pub(crate) tally: Tally,
}

impl Measured {
    /// Adds another run's figures (its requests and wall time too).
    pub fn pool(&mut self, other: Self) {
        // Pooled runs at a rate offered it for their summed spans.
        self.offered = match (self.offered, other.offered) {
            (Some(a), Some(b)) => {
                let (n, m) = (self.requests as f64, other.requests as f64);
                Some((n + m) / (n / a + m / b))
            }
            (a, b) => a.or(b),
        };
        self.requests += other.requests;
        self.streamed |= other.streamed;
        self.seconds += other.seconds;
        self.window = (self.window.0 + other.window.0, self.window.1 + other.window.1);
        let mut random = SplitMix(self.requests);
        self.tally.absorb(other.tally, &mut random);
    }

    /// The figures.
    pub fn result(mut self) -> RunResult {
        self.summary()
    }

    /// The figures so far (sorting what it holds in place, so it can still
    /// be pooled after).
    pub fn summary(&mut self) -> RunResult {
        let tally = &mut self.tally;
        for list in [
            &mut tally.latencies,
            &mut tally.first_bytes,
            &mut tally.first_tokens,
            &mut tally.token_gaps,
            &mut tally.per_token,
        ] {
            list.sort_unstable();
        }
        let ok = tally.latencies.len() as u64;
        let per_second = |count: f64| if self.seconds > 0.0 { count / self.seconds } else { 0.0 };
        let streamed = |list: &[u64]| if self.streamed { Summary::of_sorted(list) } else { None };
        let (counted, over) = self.window;
        let sustained = if over > 0.0 { counted / over } else { per_second(ok as f64) };
        RunResult {
            requests: self.requests,
            ok,
            errors: tally.errors_by_kind.values().sum(),
            error_samples: tally.error_samples.clone(),
            duration_seconds: self.seconds,
            requests_per_second: per_second(ok as f64),
            offered_requests_per_second: self.offered,
            latency: Summary::of_sorted(&tally.latencies),
            time_to_first_byte: streamed(&tally.first_bytes),
            time_to_first_token: streamed(&tally.first_tokens),
            inter_token_latency: streamed(&tally.token_gaps),
            time_per_output_token: streamed(&tally.per_token),
            output_tokens: tally.output_tokens,
            output_tokens_per_second: per_second(tally.output_tokens as f64),
            sustained_requests_per_second: sustained,
            late_starts: tally.late_starts,
            errors_by_kind: tally.errors_by_kind.clone(),
            percentiles: plot_points(&tally.latencies),
            ttft_percentiles: if self.streamed { plot_points(&tally.first_tokens) } else { Vec::new() },
        }
    }
}

/// The completions that count toward what a target sustained, and the
/// seconds they came in: at a fixed rate, those after the first completion
/// while requests were still arriving (so neither the ramp at the start
/// nor the drain at the end dilutes it); otherwise, or when that window
/// holds fewer than two, those after the first until the last.
/// `ends` are sorted nanoseconds since the run started.
pub fn completion_window(ends: &[u64], last_due: Option<f64>) -> (f64, f64) {
    let (Some(&first), Some(&last)) = (ends.first(), ends.last()) else { return (0.0, 0.0) };
    if let Some(due) = last_due.map(|seconds| (seconds * 1e9) as u64).filter(|due| *due > first) {
        let counted = ends.iter().filter(|end| **end > first && **end <= due).count();
        if counted >= 2 {
            return (counted as f64, (due - first) as f64 / 1e9);
        }
    }
    if last > first { ((ends.len() - 1) as f64, (last - first) as f64 / 1e9) } else { (0.0, 0.0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_gaps_stay_a_uniform_sample_within_the_cap() {
        let mut random = SplitMix(3);
        // One worker saw 1,000 gaps of 1 and kept 100; another saw 100 of 2 and kept all.
        let mut busy = Tally { token_gaps: vec![1; 100], gaps_seen: 1_000, ..Tally::default() };
        busy.merge_gaps(vec![2; 100], 100, &mut random);
        assert_eq!(busy.gaps_seen, 1_100);
        let twos = busy.token_gaps.iter().filter(|gap| **gap == 2).count();
        // Both kept at a tenth: 100 of the first, 10 of the second.
        assert_eq!((busy.token_gaps.len(), twos), (110, 10));
        // Past the cap, everything is thinned to it.
        let mut many = Tally { token_gaps: vec![1; GAPS_KEPT], gaps_seen: GAPS_KEPT as u64, ..Tally::default() };
        many.merge_gaps(vec![2; GAPS_KEPT], GAPS_KEPT as u64, &mut random);
        assert_eq!(many.token_gaps.len(), GAPS_KEPT);
        let twos = many.token_gaps.iter().filter(|gap| **gap == 2).count();
        assert!(twos.abs_diff(GAPS_KEPT / 2) < GAPS_KEPT / 100, "{twos}");
    }

    #[test]
    fn the_sustained_rate_counts_completions_while_requests_arrived() {
        let second = 1_000_000_000_u64;
        // Ten a second for two seconds, then a tail of stragglers.
        let mut ends: Vec<u64> = (1..=20).map(|i| i * second / 10).collect();
        ends.extend([3 * second, 5 * second]);
        let (counted, over) = completion_window(&ends, Some(2.0));
        assert!((counted / over - 10.0).abs() < 1e-9, "{counted} over {over}");
        // As fast as answered: first to last completion.
        let (counted, over) = completion_window(&ends, None);
        assert_eq!((counted, over), (21.0, 4.9));
        assert_eq!(completion_window(&[], None), (0.0, 0.0));
        assert_eq!(completion_window(&[5], Some(1.0)), (0.0, 0.0));
    }
}
