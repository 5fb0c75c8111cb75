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
    /// The bytes its prompt estimate is made of: the request body's size
    /// (0 for a form, whose bytes are mostly a file).
    pub request_bytes: u64,
    /// The whole request body's size: the most prompt a reported usage
    /// may claim, less the allowance (a form's file included).
    pub body_bytes: u64,
    /// Its answer is media (audio, images): without a reported usage it is
    /// charged no output, its bytes being no measure of tokens.
    pub media_answer: bool,
    /// The output bound in it, for every choice asked for.
    pub output: u64,
    /// A call charged no tokens whatever it reports (a tokenizer's:
    /// `crate::dialect::TokenCharge::Never`).
    pub free: bool,
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
        Self {
            tokens: request_bytes.div_ceil(4).saturating_add(output),
            request_bytes,
            body_bytes: request_bytes,
            output,
            free: false,
            media_answer: false,
        }
    }

    /// For a form of `body_bytes` (an audio file and its fields): no prompt
    /// estimate from its bytes, which still cap what its usage may claim.
    pub fn for_form(body_bytes: usize, max_tokens: Option<u64>, choices: u64, default_output: Option<u64>) -> Self {
        let body_bytes = u64::try_from(body_bytes).unwrap_or(u64::MAX);
        Self { body_bytes, ..Self::for_request(0, max_tokens, choices, default_output) }
    }

    /// The same, its answer media (see [`Self::media_answer`]).
    pub fn with_media_answer(self) -> Self {
        Self { media_answer: true, ..self }
    }

    /// For a call charged no tokens: it reserves none and settles none.
    pub fn free() -> Self {
        Self { free: true, ..Self::default() }
    }

    /// The tokens a finished response is charged when it was read to its
    /// end ([`Ending::Whole`]): see [`Reservation::charged`].
    #[cfg(test)]
    pub fn used(&self, usage: Option<(u64, u64)>, relayed: Relayed) -> u64 {
        let usage = usage.map(|(prompt, completion)| (prompt, 0, completion));
        let charged = self.charged(Ending::Whole, usage, relayed);
        charged.prompt.saturating_add(charged.completion)
    }

    /// What a request that ended as `ending` is charged, by kind: prompt
    /// tokens (of which `cached` the server read from its cache, at most
    /// the prompt), completion tokens. The one charging decision: budgets,
    /// token limits, the fair queue's seat, the cost and the usage record
    /// all take it.
    ///
    /// - [`Ending::Unserved`], or a free call: charged nothing.
    /// - Otherwise its reported `usage` (prompt, cached, completion), capped
    ///   at what is plausible — a prompt token per request byte plus
    ///   [`PROMPT_ALLOWANCE`], a completion token per byte relayed — and,
    ///   for a stream cut short, at least a token per event counted.
    /// - Without usage, the prompt estimate (a token per four request
    ///   bytes) and as completion: what was relayed (a token per event of
    ///   a counted stream, else per four bytes) for [`Ending::Whole`] and
    ///   [`Ending::Cancelled`]; for [`Ending::Unfinished`] the output bound
    ///   it reserved (`max_tokens` for every choice, or the reservation
    ///   made when it named none), or what was relayed if that is more.
    ///
    /// Never capped at the reservation: a client that reads more than it
    /// reserved and leaves pays for what it read.
    pub fn charged(&self, ending: Ending, usage: Option<(u64, u64, u64)>, relayed: Relayed) -> Charged {
        if ending == Ending::Unserved || self.free {
            return Charged::default();
        }
        if let Some((prompt, cached, completion)) = usage {
            let prompt = prompt.min(self.body_bytes.max(self.request_bytes).saturating_add(PROMPT_ALLOWANCE));
            let mut completion = completion.min(relayed.bytes);
            if ending == Ending::Cancelled {
                // A stream's usage read before its end may be a partial
                // one (Anthropic's `message_start`): never less than the
                // events counted.
                completion = completion.max(relayed.events.unwrap_or(0));
            }
            return Charged { prompt, cached: cached.min(prompt), completion };
        }
        let sent = if self.media_answer { 0 } else { relayed.events.unwrap_or_else(|| relayed.bytes.div_ceil(4)) };
        let completion = match ending {
            Ending::Unfinished => sent.max(self.output),
            _ => sent,
        };
        Charged { prompt: self.request_bytes.div_ceil(4), cached: 0, completion }
    }
}

/// How a request ended, as far as its charge goes: what the upstream did
/// with it, and so will bill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// No upstream took it up (refused or left before it was forwarded, no
    /// upstream reachable, the connection failed before an answer), or the
    /// upstream answered with an error status: nothing is charged.
    Unserved,
    /// Its answer was read to its end.
    Whole,
    /// A stream cut short after its head (the client left, the upstream
    /// idled out or broke): closing the upstream connection stops the
    /// generation, so what was relayed is what was produced.
    Cancelled,
    /// Cut short where the upstream finishes and bills the whole answer
    /// anyway (a non-streamed answer: the client left before its head or
    /// during its body, or it timed out), or may have produced any part of
    /// it unseen (a stream before its head).
    Unfinished,
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
