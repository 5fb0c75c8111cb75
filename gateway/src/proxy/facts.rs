//! What a request's report is made of: what the client asked ([`Asked`]),
//! what the pipeline's stages decided ([`Facts`], with the events counted
//! on the way: [`Tally`]) and how the request ended ([`Outcome`]). Plain
//! data: what the request holds until it ends is its `limit::Held`, and
//! the exchange (`exchange.rs`) ends it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderValue, Method};

use super::usage::Usage;
use crate::error::GatewayError;
use crate::limit::{Ended, Ending, Relayed};

/// What the client asked, as the report names it.
pub struct Asked {
    /// When the request arrived.
    pub started: Instant,
    /// Its method.
    pub method: Method,
    /// Its endpoint's path (`other` for none).
    pub path: &'static str,
    /// Its request id.
    pub request_id: HeaderValue,
}

/// What the pipeline decided about a request, noted as each stage decides
/// it; read once, when the request ends, to report it (with the
/// [`Outcome`] and what was settled). What the request holds — and what
/// settling it needs — is its `limit::Held`, not here.
pub struct Facts {
    /// Configured model name, once known.
    pub model: Option<Arc<str>>,
    /// Key id (a grant's id for a token), once known.
    pub key: Option<Arc<str>>,
    /// Who a verified token names (never a metric label).
    pub user: Option<Arc<crate::identity::Verified>>,
    /// Who the client says its end user is (OpenAI's `user`): unverified,
    /// recorded beside `user`, never in its place.
    pub client_user: Option<Box<str>>,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// Log this request (the config's `accessLog`).
    pub access_log: bool,
    /// The rate limits admitted it (counted in its series).
    pub admitted: bool,
    /// The key's namespace, where a model's queue counts it.
    pub tenant: Option<Arc<str>>,
    /// How long it waited for a model's queue, and in which class (index
    /// into the names).
    pub queued: Option<(Arc<[String]>, usize, Duration)>,
    /// Gateway time before the upstream was asked; once a relayed
    /// response has ended, the gateway's time in all (what the overhead
    /// histogram records).
    pub overhead_before: Duration,
    /// Events counted besides the request itself.
    pub tallies: Tallies,
    /// Its trace, when telemetry is on (`crate::telemetry`).
    pub trace: Option<Box<crate::telemetry::RequestTrace>>,
    /// The output bound the client asked for.
    pub max_tokens: Option<u64>,
    /// Handed to the upstream client: a client that leaves before the
    /// answer's head from here on leaves a request the upstream may finish
    /// and bill.
    pub forwarded: bool,
}

impl Default for Facts {
    fn default() -> Self {
        Self {
            model: None,
            key: None,
            user: None,
            client_user: None,
            stream: false,
            access_log: true,
            admitted: false,
            tenant: None,
            queued: None,
            overhead_before: Duration::ZERO,
            tallies: Tallies::default(),
            trace: None,
            max_tokens: None,
            forwarded: false,
        }
    }
}

/// An event of a request counted in a metric of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tally {
    /// A limit refused the request (its `limit` label).
    RateLimited(&'static str),
    /// The rate-limit store failed (its label), the request refused or let on.
    StoreFailed(&'static str),
    /// The upstream failed the request, or sent what could not be relayed (why).
    UpstreamError(&'static str),
    /// Another endpoint was tried (why).
    Retry(&'static str),
    /// An endpoint was ejected after failures in a row.
    Ejection,
    /// A full model's queue refused the request (why).
    QueueShed(&'static str),
}

impl Tally {
    /// What an error the gateway answers with counts as, besides its status.
    pub fn of_error(error: &GatewayError) -> Option<Self> {
        match error {
            GatewayError::RateLimited(refusal) => Some(Self::RateLimited(refusal.label())),
            GatewayError::RateLimitUnavailable(failure) => Some(Self::StoreFailed(failure.label())),
            GatewayError::ModelBusy { reason, .. } => Some(Self::QueueShed(reason.label())),
            GatewayError::InsufficientQuota(exhausted) => Some(Self::RateLimited(exhausted.label())),
            GatewayError::UpstreamNotJson(..) => Some(Self::UpstreamError("not_json")),
            GatewayError::UpstreamUnreachable(_)
            | GatewayError::UpstreamFailed(_)
            | GatewayError::EgressDenied(_)
            | GatewayError::UpstreamTimeout(_) => Some(Self::UpstreamError(error.code())),
            _ => None,
        }
    }
}

/// A request's [`Tally`]s, in the order they happened (most requests have
/// none, and then nothing is allocated).
#[derive(Debug, Default)]
pub struct Tallies(Vec<Tally>);

impl Tallies {
    /// Notes one.
    pub fn note(&mut self, tally: Tally) {
        self.0.push(tally);
    }

    /// Each, in order.
    pub fn each(&self) -> impl Iterator<Item = Tally> + '_ {
        self.0.iter().copied()
    }
}

/// How a request ended.
pub struct Outcome {
    /// Status sent (or `exchange::CLIENT_CLOSED_REQUEST`).
    pub status: u16,
    /// Response body bytes relayed.
    pub bytes: u64,
    /// Server-sent events relayed, where counted (see [`crate::limit::Relayed`]).
    pub events: Option<u64>,
    /// When the first body byte went out.
    pub first_byte: Option<Instant>,
    /// Upstream time: request sent → response headers.
    pub upstream: Option<Duration>,
    /// Tokens the response reported.
    pub usage: Option<Usage>,
    /// Why it ended, if not normally.
    pub error: Option<&'static str>,
    /// What the upstream did with it, for its charge.
    pub ending: Ending,
    /// When it ended, where the caller has read the clock already (the
    /// relay, at the last frame); else it is read here.
    pub ended: Option<Instant>,
}

impl Outcome {
    /// How the request ended, as its accounts see it.
    pub fn for_accounts(&self) -> Ended {
        Ended {
            ending: self.ending,
            usage: self.usage.map(|u| (u.prompt, u.cached, u.completion)),
            relayed: Relayed { bytes: self.bytes, events: self.events },
        }
    }
}
