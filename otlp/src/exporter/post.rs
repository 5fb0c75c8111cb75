//! One POST of a batch to the collector, and what became of it.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};

use super::queue::Tally;
use crate::destination::Destination;

/// The most of a collector's answer read.
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// Longest one export may take.
const DEADLINE: Duration = Duration::from_secs(5);

/// What became of one POST.
pub(super) enum Sent {
    /// The collector took it (counted exported).
    Taken,
    /// The collector refused it for good (counted dropped).
    Refused,
    /// The collector answered and asks for another try (429, 502, 503,
    /// 504), after its `Retry-After` if it gave one (counted by the
    /// caller: kept or dropped).
    Busy(Option<Duration>),
    /// No answer: no connection, or none within the deadline (counted by
    /// the caller).
    Unreached,
}

impl Sent {
    /// When the batch is worth another try, the wait the collector asked
    /// for, if any.
    pub(super) fn again(&self) -> Option<Option<Duration>> {
        match self {
            Self::Busy(after) => Some(*after),
            Self::Unreached => Some(None),
            Self::Taken | Self::Refused => None,
        }
    }
}

pub(super) async fn post(
    http: &crate::client::Http,
    destination: &Destination,
    signal: &'static str,
    body: Bytes,
    count: u64,
    counts: &Tally,
) -> Sent {
    let url = format!("{}/v1/{signal}", destination.endpoint.trim_end_matches('/'));
    let mut request = http::Request::post(&url).header(http::header::CONTENT_TYPE, "application/x-protobuf");
    for (name, value) in &destination.headers {
        request = request.header(name, value);
    }
    let Ok(request) = request.body(Full::new(body)) else {
        counts.dropped(signal, "export_failed", count);
        return Sent::Refused;
    };
    let answered = tokio::time::timeout(DEADLINE, async {
        let response = http.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok()?.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        // The answer is read, bounded (an empty partial success is
        // success; a collector that talks on is cut off).
        let _ = Limited::new(response.into_body(), MAX_ANSWER_BYTES).collect().await;
        Ok::<_, String>((status, retry_after))
    })
    .await
    .unwrap_or_else(|_| Err("timed out".into()));
    match answered {
        Ok((status, _)) if status.is_success() => {
            counts.exported(signal, count);
            Sent::Taken
        }
        Ok((status, retry_after)) if matches!(status.as_u16(), 429 | 502 | 503 | 504) => {
            tracing::debug!(%url, %status, "telemetry: the collector asks for another try");
            Sent::Busy(retry_after)
        }
        Ok((status, _)) => {
            tracing::warn!(%url, %status, "telemetry: the collector refused a batch; its records are dropped");
            counts.dropped(signal, "export_failed", count);
            Sent::Refused
        }
        Err(error) => {
            tracing::debug!(%url, %error, "telemetry: export failed");
            Sent::Unreached
        }
    }
}
