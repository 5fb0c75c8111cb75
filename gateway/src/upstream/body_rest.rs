//! The rest of a request body, written upstream as it arrives from the
//! client rather than read whole first (an audio upload): the request's
//! own bytes go first, then these, and the `Content-Length` sent counts
//! both.
//!
//! A rest can be sent once. Every attempt at the request (failover to
//! another backend or endpoint) shares it; one that finds it begun fails
//! rather than sending a body it no longer has. Its length is held to:
//! a source that gives more or fewer bytes than it said fails the request
//! and closes the connection, so no byte of one request is ever read
//! upstream as part of another.

use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use tokio::io::AsyncWriteExt as _;

use super::io::Io;

/// A failure of the rest's source: the client's, told back to the caller.
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

/// Where the rest comes from.
pub type RestSource = Pin<Box<dyn http_body::Body<Data = Bytes, Error = SourceError> + Send>>;

/// The rest of a request's body: cheap to clone, sent at most once.
#[derive(Clone)]
pub struct BodyRest {
    length: u64,
    source: Arc<tokio::sync::Mutex<Source>>,
}

impl std::fmt::Debug for BodyRest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodyRest").field("length", &self.length).finish_non_exhaustive()
    }
}

struct Source {
    /// A byte of it was taken: it cannot be sent again.
    begun: bool,
    body: RestSource,
}

/// How sending a rest failed.
#[derive(Debug, thiserror::Error)]
pub enum RestError {
    /// The source failed (the client's body broke off, idled or was
    /// refused as it came).
    #[error("the request body's source failed: {0}")]
    Source(#[source] SourceError),
    /// The source gave another length than it said.
    #[error("the request body has {0} bytes where {1} were declared")]
    Length(&'static str, u64),
    /// An earlier attempt began sending it.
    #[error("the request body was begun on an earlier attempt")]
    Begun,
    /// Writing the connection failed.
    #[error("writing the request body upstream: {0}")]
    Write(#[source] std::io::Error),
}

impl BodyRest {
    /// A rest of exactly `length` bytes, taken from `body`.
    pub fn new(length: u64, body: RestSource) -> Self {
        Self { length, source: Arc::new(tokio::sync::Mutex::new(Source { begun: false, body })) }
    }

    /// How many bytes it has.
    pub fn len(&self) -> u64 {
        self.length
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// Whether an attempt began sending it (or is sending it now).
    pub fn is_begun(&self) -> bool {
        self.source.try_lock().map_or(true, |source| source.begun)
    }

    /// Writes it to `io`, chunk by chunk as its source gives them.
    ///
    /// # Errors
    /// See [`RestError`]; after any, the connection must not be used again.
    pub(super) async fn send(&self, io: &mut Io) -> Result<(), RestError> {
        let mut source = self.source.lock().await;
        if source.begun {
            return Err(RestError::Begun);
        }
        let mut left = self.length;
        while let Some(frame) = source.body.frame().await {
            source.begun = true;
            let frame = frame.map_err(RestError::Source)?;
            let Ok(data) = frame.into_data() else { continue };
            let size = data.len() as u64;
            if size > left {
                return Err(RestError::Length("more", self.length));
            }
            left -= size;
            io.write_all(&data).await.map_err(RestError::Write)?;
        }
        source.begun = true;
        if left > 0 {
            return Err(RestError::Length("fewer", self.length));
        }
        Ok(())
    }
}
