//! The egress guard at connect time: host names resolve as usual
//! (getaddrinfo on the blocking pool), IP literals are taken as they are,
//! then every address that is link-local or a cloud metadata address is
//! dropped, and for a `url` backend every address its [`EgressPolicy`]
//! refuses (the Gateway's `deniedCIDRs`, and the closed ranges — loopback,
//! the cluster's, the API server — it did not open). A host left with no
//! address fails the connect with [`EgressDenied`], which
//! `proxy::forward::send` turns into a 502 `egress_denied` (counted in
//! `waycast_gateway_upstream_errors_total`).
//!
//! NB: literals are checked here too, not only by the operator: a
//! standalone config is checked the same way, and `::ffff:127.0.0.1` is
//! loopback.

use std::net::SocketAddr;

use waycast_crds::egress::{self, EgressPolicy};

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

/// The addresses a backend may reach as `host`, under `egress` when it is
/// a `url` backend, and why the first refused one was refused.
pub(super) fn allowed_addresses(
    resolved: Vec<SocketAddr>,
    host: &str,
    egress: Option<&EgressPolicy>,
) -> (Vec<SocketAddr>, Option<String>) {
    let mut why = None;
    let allowed = resolved
        .into_iter()
        .filter(|address| {
            let refused = match egress {
                Some(policy) => policy.refuses(host, address.ip()),
                None => egress::forbidden(address.ip(), &[]),
            };
            match refused {
                None => true,
                Some(reason) => {
                    why.get_or_insert(reason);
                    false
                }
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
        let addresses: Vec<SocketAddr> = ["169.254.169.254:0", "10.1.2.3:0", "93.184.216.34:0", "[::ffff:127.0.0.1]:0"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let policy = EgressPolicy {
            denied: vec!["10.0.0.0/8".parse().unwrap()],
            closed: vec!["127.0.0.0/8".parse().unwrap()],
            ..EgressPolicy::default()
        };
        let (allowed, why) = allowed_addresses(addresses.clone(), "upstream", Some(&policy));
        assert_eq!(allowed, vec![addresses[2]]);
        assert!(why.unwrap().contains("169.254.169.254"));
        // A model's own Service: the fixed guard only.
        let (allowed, _) = allowed_addresses(addresses.clone(), "upstream", None);
        assert_eq!(allowed, addresses[1..].to_vec());
    }
}
