//! Rate and concurrency limits: requests and tokens per minute, and
//! requests in flight, per key, per tenant (a namespace's keys together)
//! and per model; budgets and prices; and what a request is charged for
//! all of them once it ended ([`settle`]).
//!
//! ```text
//! request ─► admit(key limits, model limits, shares, reservation) ──refused──► 429 + Retry-After + x-ratelimit-*
//!                │ admitted: the request counted, its tokens reserved; x-ratelimit-* on the response
//!                ▼
//! response ends ─► settle(held, ended) ─► Settled: the token limiters (+ more used, − reserved back), the
//!                                          model's queue, budgets, the key's month, the cost (settle.rs)
//! ```
//!
//! Tokens are reserved at admission — a prompt estimate (body bytes / 4)
//! plus the output bound (`max_tokens`, `max_completion_tokens`,
//! `max_output_tokens`, else the model's `outputTokenReservation`, else
//! [`charge::DEFAULT_OUTPUT_RESERVATION`]) — so parallel requests cannot all pass
//! one remaining budget; at the end the reservation is settled once against
//! what the upstream will bill, by how the request ended
//! ([`Ending`]): the reported usage, capped at what is plausible for
//! the bytes that went each way; without usage, an estimate from what was
//! relayed (a stream cut after its head: the upstream stops on the close),
//! or the prompt estimate plus the output bound (a non-streamed answer left
//! or timed out before its end, a stream before its head: the upstream
//! finishes and bills it); nothing when no upstream took it up.
//!
//! Each pod enforces `1 / shares` of every limit, `shares` being the number
//! of live pods of its Gateway (their heartbeat Leases, see [`fleet`]), so
//! the fleet together admits the configured rate. Limiter state lives in the
//! config snapshot and is carried from one snapshot to the next by key and
//! model id, so a config change does not reset a limit.

mod admission;
pub mod budget;
mod charge;
pub mod clock;
mod decision;
pub mod fleet;
pub mod gcra;
mod in_redis;
pub mod key_usage;
mod limiter;
mod local;
pub mod members;
pub mod period_clock;
mod pricing;
pub mod redis;
mod redis_link;
mod redis_scripts;
pub mod resp;
mod settle;
pub mod spend_reads;

pub use admission::{Counters, Passed};
pub use budget::{Budget, Exhausted};
pub use charge::{Ending, Relayed, Reservation};
pub use decision::{Admitted, RateHeaders, Refusal, Refused, duration_text};
pub use in_redis::{Subject, budget_hash};
pub use limiter::LimitSet;
pub use pricing::{Budgets, CurrencyMismatch, Priced, budgets_asked};
pub use settle::{Ended, Held, Month, Settled, Wall, settle};

#[cfg(test)]
mod tests;
