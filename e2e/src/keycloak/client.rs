//! The HTTPS client the harness speaks to Keycloak with: trusting only the
//! instance's CA, every request and answer bounded in time.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::Value;

/// One admin or token request.
const REQUEST_WITHIN: Duration = Duration::from_secs(30);

/// An HTTPS client trusting only one CA.
pub(super) struct Http {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl Http {
    /// A client trusting only the CA in `ca_pem`.
    pub(super) fn trusting(ca_pem: &str) -> anyhow::Result<Self> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject as _;
        let mut roots = rustls::RootCertStore::empty();
        for certificate in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(certificate.context("the CA's PEM")?)?;
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector =
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config).https_only().enable_http1().build();
        Ok(Self { client: Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector) })
    }

    pub(super) async fn expect(
        &self,
        method: Method,
        url: &str,
        token: Option<&str>,
        body: Option<Payload>,
        wanted: StatusCode,
    ) -> anyhow::Result<Value> {
        let (status, body) = self.send(method.clone(), url, token, body).await?;
        ensure!(status == wanted, "{method} {url} answered {status}: {}", String::from_utf8_lossy(&body));
        if body.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&body).with_context(|| format!("{method} {url}'s answer"))
    }

    pub(super) async fn send(
        &self,
        method: Method,
        url: &str,
        token: Option<&str>,
        body: Option<Payload>,
    ) -> anyhow::Result<(StatusCode, Bytes)> {
        let response = self.request(method, url, token, body).await?;
        let status = response.status();
        let body = tokio::time::timeout(REQUEST_WITHIN, response.into_body().collect())
            .await
            .with_context(|| format!("{url}: no whole answer within {REQUEST_WITHIN:?}"))??
            .to_bytes();
        Ok((status, body))
    }

    pub(super) async fn request(
        &self,
        method: Method,
        url: &str,
        token: Option<&str>,
        body: Option<Payload>,
    ) -> anyhow::Result<http::Response<hyper::body::Incoming>> {
        let mut request = Request::builder().method(method).uri(url).header(header::ACCEPT, "application/json");
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let body = match body {
            None => Bytes::new(),
            Some(Payload { content_type, bytes }) => {
                request = request.header(header::CONTENT_TYPE, content_type);
                bytes
            }
        };
        let request = request.body(Full::new(body)).with_context(|| format!("a request to {url}"))?;
        tokio::time::timeout(REQUEST_WITHIN, self.client.request(request))
            .await
            .with_context(|| format!("{url}: no answer within {REQUEST_WITHIN:?}"))?
            .with_context(|| url.to_owned())
    }
}

/// A request body and its content type.
pub(super) struct Payload {
    content_type: &'static str,
    bytes: Bytes,
}

impl Payload {
    pub(super) fn json(value: &Value) -> Self {
        Self { content_type: "application/json", bytes: Bytes::from(value.to_string()) }
    }

    pub(super) fn form(fields: &[(&str, &str)]) -> Self {
        let text = fields.iter().map(|(k, v)| format!("{}={}", form_encode(k), form_encode(v))).collect::<Vec<_>>();
        Self { content_type: "application/x-www-form-urlencoded", bytes: Bytes::from(text.join("&")) }
    }
}

/// `application/x-www-form-urlencoded` for one name or value: unreserved
/// bytes as they are, every other byte percent-encoded.
fn form_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_values_are_percent_encoded_except_unreserved_bytes() {
        assert_eq!(form_encode("a-Z_0.9~"), "a-Z_0.9~");
        assert_eq!(form_encode("p@ss word&x=1/é"), "p%40ss%20word%26x%3D1%2F%C3%A9");
    }
}
