//! When requests start: as fast as answers come, evenly spaced at a rate,
//! or as a Poisson process (exponential gaps with the rate's mean, drawn
//! from a seeded generator, so a round's arrivals can be repeated for the
//! other side of a comparison).

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Mutex;

use crate::{Arrival, Scenario};

/// Hands out tickets and, at a fixed rate, each one's scheduled start
/// (seconds after the run's start).
pub(crate) enum Dispenser {
    AsFastAsAnswered(AtomicU64),
    Uniform { next: AtomicU64, rate: f64 },
    Poisson(Mutex<PoissonClock>),
}

pub(crate) struct PoissonClock {
    next: u64,
    at: f64,
    rate: f64,
    random: SplitMix,
    /// When the run's last ticket is due.
    last_due: f64,
    requests: u64,
}

impl Dispenser {
    pub(crate) fn new(scenario: &Scenario, seed: u64) -> Self {
        match (scenario.rate, scenario.arrival) {
            (None, _) => Self::AsFastAsAnswered(AtomicU64::new(0)),
            (Some(rate), Arrival::Uniform) => Self::Uniform { next: AtomicU64::new(0), rate },
            (Some(rate), Arrival::Poisson) => {
                let random = SplitMix(seed);
                let requests = scenario.requests;
                Self::Poisson(Mutex::new(PoissonClock { next: 0, at: 0.0, rate, random, last_due: 0.0, requests }))
            }
        }
    }

    /// When the run's last ticket was due (seconds after the start); none
    /// when not at a fixed rate.
    pub(crate) async fn last_due(&self, requests: u64) -> Option<f64> {
        match self {
            Self::AsFastAsAnswered(_) => None,
            Self::Uniform { rate, .. } => Some(requests.saturating_sub(1) as f64 / rate),
            Self::Poisson(clock) => Some(clock.lock().await.last_due),
        }
    }

    /// The next ticket and when it is due, if any.
    pub(crate) async fn take(&self) -> (u64, Option<f64>) {
        match self {
            Self::AsFastAsAnswered(next) => (next.fetch_add(1, Ordering::Relaxed), None),
            Self::Uniform { next, rate } => {
                let ticket = next.fetch_add(1, Ordering::Relaxed);
                (ticket, Some(ticket as f64 / rate))
            }
            Self::Poisson(clock) => {
                let mut clock = clock.lock().await;
                let (ticket, at) = (clock.next, clock.at);
                if ticket + 1 == clock.requests {
                    clock.last_due = at;
                }
                clock.next += 1;
                // An exponential gap with mean 1 / rate.
                let uniform = clock.random.unit();
                clock.at += -(1.0 - uniform).ln() / clock.rate;
                (ticket, Some(at))
            }
        }
    }
}

/// A small seeded generator (SplitMix64): arrival gaps and body picks that
/// a run can repeat.
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1_u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_rate(rate: f64, arrival: Arrival, requests: u64) -> Scenario {
        let json = serde_json::json!({"target": "http://x", "concurrency": 1, "requests": requests});
        Scenario { rate: Some(rate), arrival, ..serde_json::from_value(json).unwrap() }
    }

    #[tokio::test]
    async fn poisson_gaps_have_the_rates_mean_and_an_exponentials_spread() {
        let (requests, rate) = (20_000, 50.0);
        let dispenser = Dispenser::new(&at_rate(rate, Arrival::Poisson, requests), 7);
        let mut dues = Vec::new();
        for _ in 0..requests {
            dues.push(dispenser.take().await.1.unwrap());
        }
        let gaps: Vec<f64> = dues.windows(2).map(|w| w[1] - w[0]).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let deviation = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
        assert!((mean * rate - 1.0).abs() < 0.03, "mean gap {mean}");
        // An exponential's deviation equals its mean; evenly spaced has none.
        assert!((deviation / mean - 1.0).abs() < 0.05, "deviation {deviation}, mean {mean}");
        let offered = (requests - 1) as f64 / dispenser.last_due(requests).await.unwrap();
        assert!((offered / rate - 1.0).abs() < 0.03, "{offered}");
        // The same seed, the same arrivals; another seed, others.
        let again = Dispenser::new(&at_rate(rate, Arrival::Poisson, requests), 7);
        let other = Dispenser::new(&at_rate(rate, Arrival::Poisson, requests), 8);
        let firsts = async |d: &Dispenser, n: usize| {
            let mut firsts = Vec::new();
            for _ in 0..n {
                firsts.push(d.take().await.1.unwrap());
            }
            firsts
        };
        assert_eq!(firsts(&again, 5).await, dues[..5]);
        assert_ne!(firsts(&other, 5).await, dues[..5]);

        let even = Dispenser::new(&at_rate(rate, Arrival::Uniform, requests), 7);
        assert_eq!(firsts(&even, 3).await, [0.0, 0.02, 0.04]);
    }
}
