//! Which addresses a backend may reach. Pure; shared by the operator (IP
//! addresses written in URLs, checked when compiling) and the gateway (every
//! address a host name resolves to, checked when connecting).
//!
//! ```text
//! url host ──► IP literal? ──yes──► forbidden()  (operator compile + config validation)
//!                └──no──► DNS ──► every address ──► forbidden()  (gateway, at connect)
//! ```
//!
//! The fixed guard ([`is_metadata_address`]) holds for every backend and
//! cannot be configured away. `url` backends (a team's choice of address)
//! are held to an [`EgressPolicy`] besides: the Gateway's `deniedCIDRs`,
//! and the ranges closed by default — loopback, the cluster's Service and
//! Pod ranges, the API server — unless the Gateway opens them
//! (`allowedCIDRs`, `allowedHosts`).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An address range such as `10.0.0.0/8` or `fd00::/8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

/// Why a text is not a CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a CIDR such as 10.0.0.0/8 or fd00::/8")]
pub struct BadCidr(pub String);

impl FromStr for Cidr {
    type Err = BadCidr;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || BadCidr(text.to_owned());
        let (address, prefix) = text.split_once('/').ok_or_else(bad)?;
        let network: IpAddr = address.parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().map_err(|_| bad())?;
        let bits = if network.is_ipv4() { 32 } else { 128 };
        if prefix > bits {
            return Err(bad());
        }
        Ok(Self { network, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl Cidr {
    /// Whether `address` is in this range. An IPv4-mapped IPv6 address
    /// (`::ffff:10.1.2.3`) counts as the IPv4 address it carries.
    pub fn contains(&self, address: IpAddr) -> bool {
        match (self.network, canonical(address)) {
            (IpAddr::V4(network), IpAddr::V4(address)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(network) & mask == u32::from(address) & mask
            }
            (IpAddr::V6(network), IpAddr::V6(address)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(network) & mask == u128::from(address) & mask
            }
            _ => false,
        }
    }
}

/// `::ffff:a.b.c.d` (IPv4-mapped) and `64:ff9b::a.b.c.d` (NAT64's
/// well-known prefix, which a NAT64 gateway turns into `a.b.c.d`) as
/// `a.b.c.d`; everything else as it is.
fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => {
            let segments = v6.segments();
            if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let [.., high, low] = segments;
                return IpAddr::V4(Ipv4Addr::from((u32::from(high) << 16) | u32::from(low)));
            }
            v6.to_ipv4_mapped().map_or(address, IpAddr::V4)
        }
        IpAddr::V4(_) => address,
    }
}

/// The AWS IMDS address over IPv6.
const AWS_METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254);

/// Link-local addresses (169.254.0.0/16, where every cloud's metadata
/// service lives, and fe80::/10) and AWS's IPv6 metadata address: never a
/// backend, whatever the config says.
pub fn is_metadata_address(address: IpAddr) -> bool {
    match canonical(address) {
        IpAddr::V4(v4) => v4.is_link_local() || v4 == Ipv4Addr::UNSPECIFIED,
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80 || v6 == AWS_METADATA_V6 || v6.is_unspecified(),
    }
}

/// Why a backend may not connect to `address`, if it may not.
pub fn forbidden(address: IpAddr, denied: &[Cidr]) -> Option<String> {
    if is_metadata_address(address) {
        return Some(format!("{address} is a link-local or cloud metadata address"));
    }
    denied.iter().find(|range| range.contains(address)).map(|range| format!("{address} is in the denied range {range}"))
}

/// Where `url` backends may connect: an address is refused when it is a
/// link-local or metadata address, in `denied`, or in `closed` and opened
/// neither by `allowed` nor by its host being in `allowed_hosts`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    /// Refused whatever else is allowed (the Gateway's `deniedCIDRs`).
    pub denied: Vec<Cidr>,
    /// Refused unless opened: loopback, the cluster's ranges, the API server.
    pub closed: Vec<Cidr>,
    /// Opens `closed` for these addresses.
    pub allowed: Vec<Cidr>,
    /// Opens `closed` for these hosts (exact names only; a `*.suffix`
    /// pattern restricts which hosts may be named, and opens nothing).
    pub allowed_hosts: Vec<String>,
}

impl EgressPolicy {
    /// The policy of a config's settings; an entry that does not parse is
    /// skipped (validation refuses such a config).
    pub fn from_settings(settings: &crate::config::Settings) -> Self {
        let parsed = |ranges: &[String]| ranges.iter().filter_map(|range| range.parse().ok()).collect();
        Self {
            denied: parsed(&settings.denied_cidrs),
            closed: parsed(&settings.closed_cidrs),
            allowed: parsed(&settings.allowed_cidrs),
            allowed_hosts: settings.allowed_hosts.clone(),
        }
    }

    /// Why a `url` backend may not connect to `address`, reached as `host`
    /// (a name, or the address itself), if it may not.
    pub fn refuses(&self, host: &str, address: IpAddr) -> Option<String> {
        if is_metadata_address(address) {
            return forbidden(address, &[]);
        }
        if let Some(range) = self.denied.iter().find(|range| range.contains(address)) {
            return Some(format!("{address} is in the denied range {range} (the Gateway's spec.egress.deniedCIDRs)"));
        }
        // NB: only an exact name opens a closed range: a `*.suffix` pattern
        // would open every name anyone can make resolve under it.
        let exact = |pattern: &String| !pattern.starts_with("*.") && host_allowed(host, std::slice::from_ref(pattern));
        let opened = self.allowed.iter().any(|range| range.contains(address)) || self.allowed_hosts.iter().any(exact);
        match self.closed.iter().find(|range| range.contains(address)) {
            Some(range) if !opened => Some(format!(
                "{address} is in {range}, closed to url backends unless the Gateway opens it (spec.egress.allowedCIDRs or allowedHosts)"
            )),
            _ => None,
        }
    }
}

/// The ranges closed to `url` backends whatever the cluster: loopback and
/// the unspecified network.
pub const ALWAYS_CLOSED: &[&str] = &["127.0.0.0/8", "::1/128", "0.0.0.0/8"];

/// The ranges closed when the cluster's own cannot be found: every private,
/// shared and unique-local range.
pub const PRIVATE_RANGES: &[&str] = &["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7"];

/// The IP address a URL host names, if it is an IP literal (`10.0.0.1`,
/// `[fd00::1]`).
pub fn ip_literal(host: &str) -> Option<IpAddr> {
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    host.parse().ok()
}

/// Whether `host` is allowed by `patterns`: each is a host name, matched
/// without regard to case, or `*.suffix` for any subdomain of `suffix`.
pub fn host_allowed(host: &str, patterns: &[String]) -> bool {
    let host = host.trim_end_matches('.');
    patterns.iter().any(|pattern| match pattern.strip_prefix("*.") {
        Some(suffix) => {
            host.len() > suffix.len() + 1
                && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
                && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
        }
        None => host.eq_ignore_ascii_case(pattern),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn metadata_addresses() {
        for address in [
            "169.254.169.254",
            "169.254.0.1",
            "fe80::1",
            "febf::1",
            "fd00:ec2::254",
            "::ffff:169.254.169.254",
            "0.0.0.0",
        ] {
            assert!(is_metadata_address(ip(address)), "{address}");
        }
        for address in ["10.0.0.1", "8.8.8.8", "fec0::1", "fd00:ec2::253", "::1", "127.0.0.1"] {
            assert!(!is_metadata_address(ip(address)), "{address}");
        }
    }

    #[test]
    fn cidr_ranges() {
        let ten: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(ten.contains(ip("10.200.1.1")));
        assert!(ten.contains(ip("::ffff:10.1.1.1")));
        assert!(ten.contains(ip("64:ff9b::10.1.1.1")), "NAT64 reaches the IPv4 address it carries");
        assert!(!ten.contains(ip("11.0.0.1")));
        assert!(!ten.contains(ip("fd00::1")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("1.2.3.4")));
        let ula: Cidr = "fd00::/8".parse().unwrap();
        assert!(ula.contains(ip("fd12::1")));
        assert!(!ula.contains(ip("fe80::1")));
        let host: Cidr = "192.168.1.7/32".parse().unwrap();
        assert!(host.contains(ip("192.168.1.7")) && !host.contains(ip("192.168.1.8")));
        for bad in ["10.0.0.0", "10.0.0.0/33", "x/8", "fd00::/129", "10.0.0.0/-1"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        assert_eq!(forbidden(ip("10.1.2.3"), &[ten]).as_deref(), Some("10.1.2.3 is in the denied range 10.0.0.0/8"));
        assert!(forbidden(ip("169.254.169.254"), &[]).is_some());
        assert_eq!(forbidden(ip("1.1.1.1"), &[ten]), None);
    }

    #[test]
    fn closed_ranges_open_only_by_address_or_host_and_denied_ranges_never() {
        let policy = EgressPolicy {
            denied: vec!["10.9.0.0/16".parse().unwrap()],
            closed: vec!["10.0.0.0/8".parse().unwrap(), "127.0.0.0/8".parse().unwrap()],
            allowed: vec!["10.1.0.0/16".parse().unwrap()],
            allowed_hosts: vec!["vllm.shared.svc".into(), "*.internal.example".into()],
        };
        assert!(policy.refuses("10.96.0.1", ip("10.96.0.1")).is_some(), "closed");
        assert!(policy.refuses("localhost", ip("127.0.0.1")).is_some());
        assert!(policy.refuses("x", ip("::ffff:127.0.0.1")).is_some(), "an IPv4-mapped address counts as IPv4");
        assert_eq!(policy.refuses("10.1.2.3", ip("10.1.2.3")), None, "opened by allowedCIDRs");
        assert_eq!(policy.refuses("vllm.shared.svc", ip("10.96.5.5")), None, "opened by allowedHosts");
        assert!(policy.refuses("a.internal.example", ip("10.96.5.5")).is_some(), "a wildcard opens nothing");
        assert!(policy.refuses("vllm.shared.svc", ip("10.9.1.1")).is_some(), "deniedCIDRs are never opened");
        assert!(policy.refuses("vllm.shared.svc", ip("169.254.169.254")).is_some(), "nor is metadata");
        assert_eq!(policy.refuses("api.openai.com", ip("104.18.1.1")), None);
    }

    #[test]
    fn literals_and_hosts() {
        assert_eq!(ip_literal("[fe80::1]"), Some(ip("fe80::1")));
        assert_eq!(ip_literal("10.0.0.1"), Some(ip("10.0.0.1")));
        assert_eq!(ip_literal("api.openai.com"), None);
        let allowed = vec!["api.openai.com".to_owned(), "*.openai.azure.com".to_owned()];
        assert!(host_allowed("api.openai.com", &allowed));
        assert!(host_allowed("API.OpenAI.com.", &allowed));
        assert!(host_allowed("res.openai.azure.com", &allowed));
        assert!(!host_allowed("openai.azure.com", &allowed));
        assert!(!host_allowed("evilopenai.azure.com", &allowed));
        assert!(!host_allowed("api.openai.com.evil.io", &allowed));
    }
}
