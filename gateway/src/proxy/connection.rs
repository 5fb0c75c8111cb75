//! What a request knows of the client connection it came on: the peer, as
//! the upstream is told of it, and the connection's activity (requests in
//! flight, the last one's end), which its idle timeout reads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::HeaderValue;

use crate::limit::clock::{nanos_at, now_nanos};

/// The client end of a connection, as the upstream is told of it
/// (`X-Forwarded-For`, `X-Forwarded-Proto`).
#[derive(Debug, Clone)]
pub struct Client {
    /// The peer's address.
    pub forwarded_for: HeaderValue,
    /// `http` or `https`.
    pub forwarded_proto: HeaderValue,
    /// The connection's requests in flight and when the last one ended.
    pub activity: Arc<ConnectionActivity>,
}

impl Client {
    /// For a connection from `address`, over TLS or not.
    pub fn new(address: std::net::IpAddr, tls: bool) -> Self {
        let forwarded_for = HeaderValue::try_from(address.to_string()).unwrap_or(HeaderValue::from_static("unknown"));
        let forwarded_proto = HeaderValue::from_static(if tls { "https" } else { "http" });
        Self { forwarded_for, forwarded_proto, activity: Arc::default() }
    }
}

/// One client connection's requests: how many are in flight (until their
/// response has ended) and when the last one ended, for the idle timeout.
#[derive(Debug)]
pub struct ConnectionActivity {
    started: AtomicBool,
    /// The connection speaks HTTP/2 (known from its first request).
    http2: AtomicBool,
    active: AtomicUsize,
    /// Nanoseconds on [`now_nanos`]'s clock.
    last_end: AtomicU64,
}

impl Default for ConnectionActivity {
    fn default() -> Self {
        Self {
            started: AtomicBool::new(false),
            http2: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            last_end: AtomicU64::new(now_nanos()),
        }
    }
}

impl ConnectionActivity {
    pub(super) fn began(&self) {
        self.started.store(true, Ordering::Relaxed);
        self.active.fetch_add(1, Ordering::Relaxed);
    }

    /// Notes the version of a request on the connection.
    pub fn note_version(&self, version: http::Version) {
        if version == http::Version::HTTP_2 && !self.http2.load(Ordering::Relaxed) {
            self.http2.store(true, Ordering::Relaxed);
        }
    }

    /// Whether the connection speaks HTTP/2.
    pub fn is_http2(&self) -> bool {
        self.http2.load(Ordering::Relaxed)
    }

    /// Whether a request has begun on the connection.
    pub fn has_started(&self) -> bool {
        self.started.load(Ordering::Relaxed)
    }

    pub(super) fn ended(&self, at: Instant) {
        self.last_end.store(nanos_at(at), Ordering::Relaxed);
        self.active.fetch_sub(1, Ordering::Relaxed);
    }

    /// How long the connection has had no request in flight (zero while it has one).
    pub fn idle_for(&self) -> Duration {
        if self.active.load(Ordering::Relaxed) > 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(now_nanos().saturating_sub(self.last_end.load(Ordering::Relaxed)))
    }
}
