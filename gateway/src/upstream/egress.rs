//! The egress guard at connect time: host names resolve as usual
//! (getaddrinfo on the blocking pool, like hyper's own resolver), then every
//! address that is link-local, a cloud metadata address or in the config's
//! `deniedCIDRs` is dropped. A name left with no address fails the connect
//! with [`EgressDenied`], which `proxy::forward::send` turns into a 502
//! `egress_denied` (counted in `waycast_gateway_upstream_errors_total`).
//!
//! IP literals in backend URLs never reach a resolver: config validation
//! refuses link-local/metadata literals, and the operator checks literals
//! in `url` backends against the Gateway's denied ranges.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::dns::Name;
use waycast_crds::egress::{self, Cidr};

/// A resolver that drops the addresses a backend may not reach.
#[derive(Clone, Debug)]
pub struct GuardedResolver {
    /// Ranges denied on top of the fixed link-local/metadata guard.
    pub denied: Arc<[Cidr]>,
}

/// Every address of a host name was refused by the egress guard.
#[derive(Debug, thiserror::Error)]
#[error("{host} resolves only to addresses the gateway may not reach ({why})")]
pub struct EgressDenied {
    host: String,
    why: String,
}

type Resolving = Pin<Box<dyn Future<Output = Result<std::vec::IntoIter<SocketAddr>, std::io::Error>> + Send>>;

impl tower_service::Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = Resolving;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let denied = self.denied.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            // Port 0: the connector sets the URL's port on each address.
            let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let (allowed, why) = allowed_addresses(resolved, &denied);
            if allowed.is_empty() {
                let why = why.unwrap_or_else(|| "no address".to_owned());
                return Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, EgressDenied { host, why }));
            }
            Ok(allowed.into_iter())
        })
    }
}

/// The addresses a backend may reach, and why the first refused one was
/// refused.
fn allowed_addresses(resolved: Vec<SocketAddr>, denied: &[Cidr]) -> (Vec<SocketAddr>, Option<String>) {
    let mut why = None;
    let allowed = resolved
        .into_iter()
        .filter(|address| match egress::forbidden(address.ip(), denied) {
            None => true,
            Some(reason) => {
                why.get_or_insert(reason);
                false
            }
        })
        .collect();
    (allowed, why)
}

/// Whether a client error was the egress guard refusing every address.
pub fn egress_denied(error: &hyper_util::client::legacy::Error) -> bool {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if cause.is::<EgressDenied>() {
            return true;
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && io.get_ref().is_some_and(|inner| inner.is::<EgressDenied>())
        {
            return true;
        }
        source = cause.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_refused_addresses_and_says_why() {
        let addresses: Vec<SocketAddr> =
            ["169.254.169.254:0", "10.1.2.3:0", "93.184.216.34:0"].iter().map(|a| a.parse().unwrap()).collect();
        let ten: Cidr = "10.0.0.0/8".parse().unwrap();
        let (allowed, why) = allowed_addresses(addresses.clone(), &[ten]);
        assert_eq!(allowed, vec![addresses[2]]);
        assert!(why.unwrap().contains("169.254.169.254"));
        let (allowed, _) = allowed_addresses(addresses[..1].to_vec(), &[]);
        assert!(allowed.is_empty());
    }
}
