//! One provider's key set between fetches, and what an answer does to it,
//! pure: a good document replaces the one held (and says whether it
//! changed), a 304 keeps it, a failure or a bad document keeps it too and
//! records why. The refresher (`refresher.rs`) acts on what
//! [`Slot::settle`] returns: recompile the Gateway when the document or
//! the error changed, an Event when the error changed, nothing else.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::document::{self, MIN_REFRESH};
use super::fetch::{Answer, Etag, FetchError, Want};
use crate::compile::key_source::HeldKeySet;

/// One provider's key set and what its next fetch sends.
#[derive(Debug, Clone)]
pub struct Slot {
    /// What to fetch.
    pub want: Want,
    /// The last good document and the latest fetch's error.
    pub held: HeldKeySet,
    /// `(url, etag)` of the document held, for `If-None-Match`.
    pub etag: Option<Etag>,
    /// When it is next fetched.
    pub due: Instant,
    /// The fetch in flight for it, by number (`refresher.rs`).
    pub in_flight: Option<u64>,
    /// When its latest fetch started: the next starts [`MIN_REFRESH`]
    /// after it at the soonest, whatever asks for it.
    pub started: Option<Instant>,
    /// A pod asked for it while a fetch was in flight: the next is due at
    /// the soonest the rule allows.
    pub nudged: bool,
}

/// The longest error a slot holds: with the provider's name and what it
/// means, an Event's note stays within the 1 KiB the API server takes.
pub const MAX_ERROR_BYTES: usize = 768;

/// What one answer changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// For `waycast_operator_key_set_fetches_total{result}`: `changed`,
    /// `unchanged`, `invalid` or `failed`.
    pub result: &'static str,
    /// The document held is another one now.
    pub document_changed: bool,
    /// The error held is another one now (set, cleared or different).
    pub error_changed: bool,
    /// When to fetch again.
    pub after: Duration,
}

impl Slot {
    /// A slot with nothing held yet, due at `due`.
    pub fn new(want: Want, due: Instant) -> Self {
        let held = HeldKeySet {
            source: want.source.clone(),
            document: None,
            keys: 0,
            fetched_at: None,
            error: None,
            seeded_issuer: None,
        };
        Self { want, held, etag: None, due, in_flight: None, started: None, nudged: false }
    }

    /// The soonest it may be fetched again at `now`: [`MIN_REFRESH`] after
    /// its latest fetch started (now when none has).
    pub fn earliest(&self, now: Instant) -> Instant {
        self.started.map_or(now, |started| (started + MIN_REFRESH).max(now))
    }

    /// Whether the slot fetches what `want` says: a new source starts
    /// afresh (its document is another issuer's); a new CA bundle only
    /// changes how the next fetch is made.
    pub fn same_source(&self, want: &Want) -> bool {
        self.want.source == want.source
    }

    /// Takes in the answer to a fetch at `now`.
    pub fn settle(&mut self, answer: Result<Answer, FetchError>, now: jiff::Timestamp) -> Settled {
        let before = self.held.error.clone();
        let (result, document_changed, after) = match answer {
            Ok(Answer::Document { from, body, etag, cache_control }) => match document::signing_keys(&body) {
                Ok(keys) => {
                    let changed = self.held.document.as_deref().map(str::as_bytes) != Some(body.as_ref());
                    if changed {
                        // Checked UTF-8 by `signing_keys`.
                        let text = String::from_utf8_lossy(&body);
                        self.held.document = Some(Arc::from(text.as_ref()));
                        self.held.keys = keys;
                        self.held.fetched_at = Some(now);
                    }
                    self.etag = etag;
                    self.held.error = None;
                    let result = if changed { "changed" } else { "unchanged" };
                    (result, changed, document::refresh_after(cache_control.as_deref()))
                }
                Err(error) => {
                    // NB: the ETag of a refused document is dropped: a 304
                    // to it would otherwise pass for the good one held.
                    self.etag = None;
                    // Where it was read and what is wrong, never what it says.
                    self.held.error = Some(format!("{from}: {error}"));
                    ("invalid", false, MIN_REFRESH)
                }
            },
            Ok(Answer::NotModified { cache_control }) if self.held.document.is_some() => {
                self.held.error = None;
                ("unchanged", false, document::refresh_after(cache_control.as_deref()))
            }
            Ok(Answer::NotModified { .. }) => {
                // A 304 to a request that named no ETag of ours.
                self.etag = None;
                self.held.error = Some(format!("{}: HTTP 304 with no key set held", self.held.source));
                ("failed", false, MIN_REFRESH)
            }
            Err(error) => {
                self.held.error = Some(error.to_string());
                (error.metric_label(), false, MIN_REFRESH)
            }
        };
        if let Some(error) = self.held.error.as_mut() {
            error.truncate(document::cut(error, MAX_ERROR_BYTES).len());
        }
        Settled { result, document_changed, error_changed: before != self.held.error, after }
    }
}
