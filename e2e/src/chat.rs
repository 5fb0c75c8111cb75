//! One chat completion to a gateway, answered or not: the probe that tests
//! and [`crate::wait::await_answer`] send to ask whether a key and a model
//! are served.

use std::time::Duration;

use http::StatusCode;

/// How long one probe waits for an answer: longer means the gateway (or
/// the path to it) is not there yet, which a wait treats as "not yet".
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The chat completions URL of a gateway listening at `address` (`ip`,
/// `ip:port` or a socket address).
pub fn url(address: impl std::fmt::Display) -> String {
    format!("http://{address}/v1/chat/completions")
}

/// The status `url` answers a chat for `model` with `key` (an empty
/// message list); `None` when nothing answers within [`PROBE_TIMEOUT`].
pub async fn status(url: &str, key: &str, model: &str) -> Option<StatusCode> {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let body = format!(r#"{{"model":"{model}","messages":[]}}"#);
    let request = waycast_mock::fixtures::post_request(url, Some(key), &body);
    let response = tokio::time::timeout(PROBE_TIMEOUT, http.request(request)).await.ok()?.ok()?;
    Some(response.status())
}
