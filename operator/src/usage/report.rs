//! One gateway pod's usage report, asked for on its admin port.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use waycast_crds::usage::UsageReport;

use crate::render::meta::ADMIN_PORT;

/// The largest report taken from a pod (and ledger read back).
pub(super) const MAX_REPORT_BYTES: usize = 16 * 1024 * 1024;

/// The report of the pod at `ip` (3 s at most).
pub(super) async fn ask(http: &HttpClient<HttpConnector, Empty<Bytes>>, ip: &str) -> Result<UsageReport, String> {
    let host = if ip.contains(':') { format!("[{ip}]") } else { ip.to_owned() };
    let uri: http::Uri = format!("http://{host}:{ADMIN_PORT}/usage").parse().map_err(|e| format!("{e}"))?;
    let call = async {
        let response = http.get(uri).await.map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("status {}", response.status()));
        }
        // Read into one buffer sized by the report's length: collecting
        // the frames and then joining them held a large report twice.
        let length = response.headers().get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
        let mut body = Limited::new(response.into_body(), MAX_REPORT_BYTES);
        let mut read = Vec::with_capacity(length.unwrap_or(0).min(MAX_REPORT_BYTES));
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.map_err(|e| e.to_string())?.into_data() {
                read.extend_from_slice(&data);
            }
        }
        serde_json::from_slice::<UsageReport>(&read).map_err(|e| format!("not a usage report: {e}"))
    };
    tokio::time::timeout(Duration::from_secs(3), call).await.map_err(|_| "timed out".to_owned())?
}
