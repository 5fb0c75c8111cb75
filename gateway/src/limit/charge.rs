//! Token reservations: what a request reserves at admission, and how it is
//! settled — locally or in Redis — once the response has ended.

use std::sync::Arc;

use super::clock::now_nanos;
use super::gcra;
use super::limiter::LimitSet;
use super::redis::RedisCounter;

/// The output reserved for a request that names no bound and whose model
/// sets no `outputTokenReservation`.
pub const DEFAULT_OUTPUT_RESERVATION: u64 = 1024;

/// Prompt tokens a response may report beyond one per request byte (images
/// and tool definitions count more tokens than their bytes).
pub const PROMPT_ALLOWANCE: u64 = 8192;

/// What a request reserves against token limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reservation {
    /// Tokens reserved: prompt estimate + output bound.
    pub tokens: u64,
    /// The request body's size.
    pub request_bytes: u64,
    /// The output bound in it, for every choice asked for.
    pub output: u64,
}

/// What a response sent the client, for an estimate of its tokens when it
/// reported none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Relayed {
    /// Body bytes relayed.
    pub bytes: u64,
    /// Server-sent events relayed, where counted (streams under a token
    /// limit answered as `text/event-stream`): each carries at least one
    /// token. `None`: the bytes relayed are the estimate.
    pub events: Option<u64>,
}

impl Reservation {
    /// For a body of `request_bytes` asking for at most `max_tokens` (or,
    /// without, the model's `default_output`) in each of `choices`
    /// completions (`n`, `best_of`; at least one).
    pub fn for_request(
        request_bytes: usize,
        max_tokens: Option<u64>,
        choices: u64,
        default_output: Option<u64>,
    ) -> Self {
        let request_bytes = u64::try_from(request_bytes).unwrap_or(u64::MAX);
        let each = max_tokens.or(default_output).unwrap_or(DEFAULT_OUTPUT_RESERVATION);
        let output = each.saturating_mul(choices.max(1));
        Self { tokens: request_bytes.div_ceil(4).saturating_add(output), request_bytes, output }
    }

    /// The tokens a finished response is charged: its reported `usage`
    /// (prompt, completion) capped at what is plausible — a prompt token per
    /// request byte plus [`PROMPT_ALLOWANCE`], a completion token per byte
    /// relayed — or, without usage (a client that left before the usage
    /// chunk), an estimate of what went out: the prompt estimate plus a
    /// token per event relayed (streams) or per four bytes. Never capped at
    /// the reservation: a client that reads more than it reserved and
    /// leaves pays for what it read.
    #[cfg(test)]
    pub fn used(&self, usage: Option<(u64, u64)>, relayed: Relayed) -> u64 {
        let charged = self.charged(usage.map(|(prompt, completion)| (prompt, 0, completion)), relayed);
        charged.prompt.saturating_add(charged.completion)
    }

    /// [`Reservation::used`], by kind: prompt tokens (of which `cached` the
    /// server read from its cache, at most the prompt), completion tokens.
    pub fn charged(&self, usage: Option<(u64, u64, u64)>, relayed: Relayed) -> Charged {
        match usage {
            Some((prompt, cached, completion)) => {
                let prompt = prompt.min(self.request_bytes.saturating_add(PROMPT_ALLOWANCE));
                Charged { prompt, cached: cached.min(prompt), completion: completion.min(relayed.bytes) }
            }
            None => Charged {
                prompt: self.request_bytes.div_ceil(4),
                cached: 0,
                completion: relayed.events.unwrap_or_else(|| relayed.bytes.div_ceil(4)),
            },
        }
    }
}

/// The tokens a finished request is charged, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Charged {
    /// Prompt tokens.
    pub prompt: u64,
    /// Of them, read from the server's cache.
    pub cached: u64,
    /// Completion tokens.
    pub completion: u64,
}

/// The token limiters an admitted request reserved its tokens with, to
/// settle once the response has ended.
#[derive(Debug, Clone)]
pub struct Charge {
    /// Each local token limiter and the window (ns) reserved in it.
    pub(super) reserved: Vec<(Arc<LimitSet>, u64)>,
    pub(super) shares: u32,
    /// What was reserved, in tokens.
    pub reservation: Reservation,
    /// Counted in Redis: the counter and the token limiters' Redis keys
    /// with their limits (the reservation is the same in each).
    pub(super) redis: Option<RedisCharge>,
}

/// The counter and the token limiters (Redis key, limit) to charge in it.
pub(super) type RedisCharge = (Arc<RedisCounter>, Vec<(String, u64)>);

impl Charge {
    /// Settles the reservation: charges what `used` (tokens) exceeds it
    /// by, or gives back what was not used. Returns the tokens charged in all.
    pub fn settle(&self, used: u64) -> u64 {
        if let Some((counter, limiters)) = &self.redis {
            let limiters: Vec<(&str, u64)> = limiters.iter().map(|(key, limit)| (key.as_str(), *limit)).collect();
            let delta = i128::from(used) - i128::from(self.reservation.tokens);
            counter.settle(&limiters, delta);
            return used;
        }
        let now = now_nanos();
        for (set, reserved_cost) in &self.reserved {
            let Some(limiter) = &set.tokens else { continue };
            let unit = gcra::unit_cost(limiter.per_minute, self.shares);
            let used_cost = unit.saturating_mul(used);
            if used_cost >= *reserved_cost {
                let more = (used_cost - reserved_cost) / unit;
                limiter.charge(now, more, self.shares);
            } else {
                limiter.refund(reserved_cost - used_cost);
            }
        }
        used
    }
}
