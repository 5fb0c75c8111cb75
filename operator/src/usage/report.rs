//! One gateway pod's usage report, asked for on its admin port and
//! screened as it arrives (`screen`): the body is never held whole, and
//! reading stops at the first rule it breaks.
//!
//! ```text
//! GET /usage ─► frames ─(channel, a few frames)─► screen (blocking thread) ─► UsageReport | Refusal
//! ```

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf as _, Bytes};
use http_body_util::{BodyExt as _, Empty};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use waycast_crds::usage::UsageReport;

use super::screen::{Refusal, Served, screen};
use crate::render::meta::ADMIN_PORT;

/// How long one pod has to answer, whole.
const ASK_FOR: Duration = Duration::from_secs(3);
/// Frames in flight between the connection and the parser.
const FRAMES_IN_FLIGHT: usize = 4;

/// Why a pod gave no report.
#[derive(Debug)]
pub(super) enum NoReport {
    /// It did not answer (in time, or at all): asked again next round.
    Unanswered(String),
    /// It answered with a report that breaks a rule.
    Refused(Refusal),
}

/// The report of the pod `pod` at `ip` (3 s at most), screened against
/// `served`.
pub(super) async fn ask(
    http: &HttpClient<HttpConnector, Empty<Bytes>>,
    ip: &str,
    pod: &str,
    served: Arc<Served>,
) -> Result<UsageReport, NoReport> {
    let host = if ip.contains(':') { format!("[{ip}]") } else { ip.to_owned() };
    let uri: http::Uri =
        format!("http://{host}:{ADMIN_PORT}/usage").parse().map_err(|e| NoReport::Unanswered(format!("{e}")))?;
    let pod = pod.to_owned();
    let call = async move {
        let response = http.get(uri).await.map_err(|e| NoReport::Unanswered(e.to_string()))?;
        if !response.status().is_success() {
            return Err(NoReport::Unanswered(format!("status {}", response.status())));
        }
        let (frames, received) = tokio::sync::mpsc::channel::<Bytes>(FRAMES_IN_FLIGHT);
        let parsing =
            tokio::task::spawn_blocking(move || screen(Frames { received, frame: Bytes::new() }, &pod, &served));
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(|e| NoReport::Unanswered(e.to_string()))?.into_data() else { continue };
            // The parser stopped (a rule broken, or the cap passed): nothing more is read.
            if frames.send(data).await.is_err() {
                break;
            }
        }
        drop(frames);
        parsing.await.map_err(|e| NoReport::Unanswered(e.to_string()))?.map_err(NoReport::Refused)
    };
    tokio::time::timeout(ASK_FOR, call).await.map_err(|_| NoReport::Unanswered("timed out".to_owned()))?
}

/// The body's frames as one reader, on a blocking thread.
struct Frames {
    received: tokio::sync::mpsc::Receiver<Bytes>,
    frame: Bytes,
}

impl std::io::Read for Frames {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while !self.frame.has_remaining() {
            match self.received.blocking_recv() {
                Some(next) => self.frame = next,
                // The body ended, or the ask was dropped (timed out).
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.frame.len());
        buf[..n].copy_from_slice(&self.frame[..n]);
        self.frame.advance(n);
        Ok(n)
    }
}
