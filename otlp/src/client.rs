//! The HTTP client exports go through: hyper's, over rustls for `https`
//! endpoints (the public roots), plain for `http`.

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// A pooled client for the collector.
pub struct Http(Client<HttpsConnector<HttpConnector>, Full<Bytes>>);

impl Http {
    /// A client over rustls with the public roots (webpki-roots), HTTP/1.
    pub fn new() -> Self {
        let connector =
            hyper_rustls::HttpsConnectorBuilder::new().with_webpki_roots().https_or_http().enable_http1().build();
        Self(Client::builder(TokioExecutor::new()).build(connector))
    }

    /// Sends `request`.
    ///
    /// # Errors
    /// The connection or the exchange failed.
    pub async fn request(
        &self,
        request: http::Request<Full<Bytes>>,
    ) -> Result<http::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error> {
        self.0.request(request).await
    }
}
