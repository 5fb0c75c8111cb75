//! The egress guard at connect time: host names resolve as usual
//! (getaddrinfo on the blocking pool), then every address that is
//! link-local, a cloud metadata address or in the config's `deniedCIDRs` is
//! dropped. A name left with no address fails the connect with
//! [`EgressDenied`], which `proxy::forward::send` turns into a 502
//! `egress_denied` (counted in `waycast_gateway_upstream_errors_total`).
//!
//! IP literals in backend URLs never reach a resolver: config validation
//! refuses link-local/metadata literals, and the operator checks literals
//! in `url` backends against the Gateway's denied ranges.

use std::net::SocketAddr;

use waycast_crds::egress::{self, Cidr};

/// Every address of a host name was refused by the egress guard.
#[derive(Debug, thiserror::Error)]
#[error("{host} resolves only to addresses the gateway may not reach ({why})")]
pub struct EgressDenied {
    host: String,
    why: String,
}

impl EgressDenied {
    /// `host` had no address left; `why` the first was refused, if any was.
    pub fn new(host: &str, why: Option<String>) -> Self {
        Self { host: host.to_owned(), why: why.unwrap_or_else(|| "no address".to_owned()) }
    }
}

/// The addresses a backend may reach, and why the first refused one was
/// refused.
pub(super) fn allowed_addresses(resolved: Vec<SocketAddr>, denied: &[Cidr]) -> (Vec<SocketAddr>, Option<String>) {
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
