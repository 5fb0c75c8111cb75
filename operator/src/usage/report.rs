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

use super::screen::{Refusal, screen};
use super::served::Served;
use crate::render::meta::ADMIN_PORT;

/// How long one pod has to answer, whole.
pub(super) const ASK_FOR: Duration = Duration::from_secs(3);
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

/// The admin port of the pod at `ip` (`host:port`).
pub(super) fn admin_address(ip: &str) -> String {
    let host = if ip.contains(':') { format!("[{ip}]") } else { ip.to_owned() };
    format!("{host}:{ADMIN_PORT}")
}

/// The report of the pod `pod` at `address` ([`admin_address`]; `within`
/// at most: [`ASK_FOR`]), screened against `served`.
pub(super) async fn ask(
    http: &HttpClient<HttpConnector, Empty<Bytes>>,
    address: &str,
    pod: &str,
    served: Arc<Served>,
    within: Duration,
) -> Result<UsageReport, NoReport> {
    let uri: http::Uri = format!("http://{address}/usage").parse().map_err(|e| NoReport::Unanswered(format!("{e}")))?;
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
    tokio::time::timeout(within, call).await.map_err(|_| NoReport::Unanswered("timed out".to_owned()))?
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

    use hyper_util::rt::TokioExecutor;
    use waycast_mock::forged_usage::{Forger, serve};

    use super::*;

    /// The forged pod of the e2e test, on a socket here: each of its
    /// reports is refused for its own rule, as it streams in (the 33 MB
    /// report at its 100,001st key, the padded one a byte past 16 MiB).
    /// NB: with room beyond the time one pod has: a debug build on a loaded
    /// 2-core machine took longer, and a timeout is not what is tested.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_forged_pods_reports_are_refused_as_they_stream_in() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(serve(listener, Forger { pod: "gw-1".into(), namespace: "team-f".into() }));
        let served = Arc::new(Served::new([("team-f", "own")], []));
        let http = HttpClient::builder(TokioExecutor::new()).build_http();
        for wanted in [Refusal::ForeignKey, Refusal::TooManyKeys, Refusal::TooLarge] {
            let started = std::time::Instant::now();
            let got = ask(&http, &address, "gw-1", served.clone(), 10 * ASK_FOR).await;
            println!("{wanted:?}: {:?}", started.elapsed());
            assert!(matches!(got, Err(NoReport::Refused(refusal)) if refusal == wanted), "{got:?}");
        }
    }
}
