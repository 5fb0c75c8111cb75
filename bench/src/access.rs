//! Who may use `waycast-bench serve`'s `/runs`, and where its runs may go.
//! It owns the tokens (generated or read from a file, kept only as SHA-256
//! digests) and the target allow-list; it does not read requests' bodies
//! or serve anything ([`crate::server`] asks it).
//!
//! ```text
//! Authorization: Bearer T ──► SHA-256(T) ──► compared with every known digest, in constant time ──► Identity
//! scenario target / baseline ──► HOST[:PORT] ──► loopback, or an allowed target? ──► run, or 403 before any connection
//! ```
//!
//! An [`Identity`] is the digest of the token that was shown: a run records
//! the identity that started it, and only that identity sees or cancels it.
//! A server started without `--token-file` has one generated token, so one
//! identity: whoever started it. A token file with one token a line gives
//! each holder an identity of their own.

use std::net::IpAddr;

use ring::digest::{SHA256, digest};
use ring::rand::{SecureRandom as _, SystemRandom};

/// The shortest token accepted from a file (a generated one has 68 characters).
pub const MIN_TOKEN_CHARS: usize = 32;
/// The longest `Authorization` value looked at; a longer one is no token.
const MAX_HEADER_BYTES: usize = 1024;
/// Tokens a file may hold.
const MAX_TOKENS: usize = 1024;
/// What a generated token starts with, so a scanner of leaked secrets can tell it.
const TOKEN_PREFIX: &str = "wcb_";

/// Why a token or an allowed target cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// The operating system's random source failed.
    #[error("cannot draw a random token from the operating system")]
    Random,
    /// The token file names no token.
    #[error("the token file holds no token")]
    NoToken,
    /// A line of the token file is not a usable token.
    #[error(
        "line {line} of the token file is not a token: {MIN_TOKEN_CHARS} to {MAX_HEADER_BYTES} visible ASCII characters"
    )]
    BadToken {
        /// The line, from 1.
        line: usize,
    },
    /// The token file holds too many tokens.
    #[error("the token file holds more than {MAX_TOKENS} tokens")]
    TooManyTokens,
    /// An `--allowed-target` is not `HOST[:PORT]`.
    #[error("--allowed-target {0:?} is not HOST or HOST:PORT")]
    BadTarget(String),
}

/// Who showed a known token: its SHA-256 digest.
#[derive(Clone, Copy)]
pub struct Identity([u8; 32]);

impl Identity {
    /// Whether `self` and `other` are the same, in time that does not depend on where they differ.
    pub fn same(&self, other: &Identity) -> bool {
        equal(&self.0, &other.0)
    }
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Identity(..)")
    }
}

/// The tokens `/runs` accepts, as digests.
pub struct Tokens {
    digests: Vec<[u8; 32]>,
}

impl Tokens {
    /// One new token from the operating system's random source (256
    /// bits, `wcb_` and 64 hex digits), and the set holding it.
    ///
    /// # Errors
    /// The random source failed.
    pub fn generate() -> Result<(Self, String), AccessError> {
        let mut bytes = [0u8; 32];
        SystemRandom::new().fill(&mut bytes).map_err(|_| AccessError::Random)?;
        let token = format!("{TOKEN_PREFIX}{}", hex::encode(bytes));
        Ok((Self { digests: vec![sha256(&token)] }, token))
    }

    /// The tokens in `text`, one a line (blank lines and surrounding
    /// spaces ignored): a Secret's file, each holder's token a line.
    ///
    /// # Errors
    /// No token, too many, or a line that is not a token.
    pub fn from_text(text: &str) -> Result<Self, AccessError> {
        let mut digests = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let token = line.trim();
            if token.is_empty() {
                continue;
            }
            if !(MIN_TOKEN_CHARS..=MAX_HEADER_BYTES).contains(&token.len())
                || !token.bytes().all(|b| b.is_ascii_graphic())
            {
                return Err(AccessError::BadToken { line: index + 1 });
            }
            if digests.len() == MAX_TOKENS {
                return Err(AccessError::TooManyTokens);
            }
            digests.push(sha256(token));
        }
        if digests.is_empty() {
            return Err(AccessError::NoToken);
        }
        Ok(Self { digests })
    }

    /// The identity of a request's `Authorization: Bearer TOKEN`, when
    /// the token is one of these. Every known digest is compared, each in
    /// constant time, whichever matches.
    pub fn identify(&self, headers: &http::HeaderMap) -> Option<Identity> {
        let value = headers.get(http::header::AUTHORIZATION)?.as_bytes();
        if value.len() > MAX_HEADER_BYTES || value.len() < 7 || !value[..7].eq_ignore_ascii_case(b"bearer ") {
            return None;
        }
        let shown = sha256_bytes(value[7..].trim_ascii());
        let mut found = None;
        for known in &self.digests {
            if equal(known, &shown) {
                found = Some(Identity(*known));
            }
        }
        found
    }
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} known)", self.digests.len())
    }
}

fn sha256(text: &str) -> [u8; 32] {
    sha256_bytes(text.as_bytes())
}

fn sha256_bytes(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, bytes).as_ref());
    out
}

/// Equal digests, compared without an early exit.
fn equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

// === impl Targets ===

/// Where runs may go: loopback, and the hosts (any port) or `HOST:PORT`s
/// the server was started with. Names are compared as written (no DNS
/// look-up before the check), so a name outside the list is refused
/// before anything is resolved or connected to.
#[derive(Debug, Clone, Default)]
pub struct Targets {
    allowed: Vec<(String, Option<u16>)>,
}

impl Targets {
    /// Loopback and `allowed` (`HOST` or `HOST:PORT`, an IPv6 address in brackets).
    ///
    /// # Errors
    /// An entry is not `HOST[:PORT]`.
    pub fn new(allowed: &[String]) -> Result<Self, AccessError> {
        let allowed = allowed
            .iter()
            .map(|entry| {
                split_authority(entry.trim())
                    .filter(|(host, _)| !host.is_empty())
                    .map(|(host, port)| (normal(host), port))
                    .ok_or_else(|| AccessError::BadTarget(entry.clone()))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { allowed })
    }

    /// Whether a run may send requests to `url` (`http://HOST[:PORT]/...`).
    ///
    /// # Errors
    /// Why not, in words for the user (the same whatever is listening there).
    pub fn check(&self, url: &str) -> Result<(), String> {
        let refused = || {
            format!(
                "{url} is not a target this server may load: it runs only against loopback and the targets it was started with (--allowed-target HOST[:PORT])"
            )
        };
        let rest = url.strip_prefix("http://").ok_or_else(refused)?;
        // NB: the load generator takes everything up to the first `/` as the
        // authority it connects to (`source::request_target`), so the check
        // reads the same span and refuses what no host name holds (`?`, `#`,
        // `\`, spaces): `http://127.0.0.1#.evil:80/` is not loopback.
        let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
        if !authority.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._:[]@".contains(&b)) {
            return Err(refused());
        }
        let (host, port) = split_authority(authority).ok_or_else(refused)?;
        let host = normal(host);
        let port = port.unwrap_or(80);
        let loopback = host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.to_canonical().is_loopback());
        let listed = self.allowed.iter().any(|(name, only)| *name == host && only.is_none_or(|only| only == port));
        if loopback || listed { Ok(()) } else { Err(refused()) }
    }
}

/// `HOST[:PORT]` split; None for user info, an empty or bad port, or an unclosed bracket.
fn split_authority(authority: &str) -> Option<(&str, Option<u16>)> {
    if authority.contains('@') {
        return None;
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':')?)),
        }
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(port) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => Some(port.parse().ok()?),
        Some(_) => return None,
        None => None,
    };
    Some((host, port))
}

/// A host as compared: lower case, without the root's dot, an IP address in its canonical text.
fn normal(host: &str) -> String {
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    host.parse::<IpAddr>().map_or(host, |ip| ip.to_canonical().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_loopback_or_listed_by_name_and_port() {
        let targets = Targets::new(&["gateway".into(), "vllm.team-a.svc:8000".into(), "[fd00::1]:80".into()]).unwrap();
        for allowed in [
            "http://127.0.0.1:8080",
            "http://127.9.9.9/v1",
            "http://[::1]:9",
            "http://[::ffff:127.0.0.1]:9",
            "http://localhost:1",
            "http://LocalHost.:1",
            "http://gateway",
            "http://gateway:8080/v1",
            "http://Gateway./x",
            "http://vllm.team-a.svc:8000/v1",
            "http://[fd00::1]/v1",
        ] {
            assert!(targets.check(allowed).is_ok(), "{allowed}");
        }
        for refused in [
            "http://10.0.0.1:8080",
            "http://vllm.team-a.svc:8001",
            "http://vllm.team-a.svc",
            "http://gateway.evil",
            "http://evil/gateway",
            "http://gateway@evil:80",
            "http://127.0.0.1@evil",
            "http://127.1:80",
            "http://0.0.0.0:80",
            "http://[fd00::1]:81",
            "http://gateway:80x",
            "http://gateway:",
            "http://[::1",
            "https://127.0.0.1",
            "http://",
            "http://127.0.0.1#.evil.example:8080/",
            "http://localhost?.evil.example:9/",
            "http://127.0.0.1\\@evil/",
            "http://127.0.0.1 .evil/",
        ] {
            let message = targets.check(refused).unwrap_err();
            assert!(message.contains("--allowed-target"), "{refused}: {message}");
        }
        assert!(Targets::new(&["a:b".into()]).is_err());
        assert!(Targets::new(&[":80".into()]).is_err());
        assert!(Targets::default().check("http://gateway").is_err(), "only loopback without flags");
    }

    #[test]
    fn a_request_is_identified_only_by_a_known_token() {
        let (generated, token) = Tokens::generate().unwrap();
        assert!(token.starts_with("wcb_") && token.len() == 68, "{token}");
        assert_ne!(Tokens::generate().unwrap().1, token, "drawn anew each time");
        let headers = |value: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert(http::header::AUTHORIZATION, value.parse().unwrap());
            headers
        };
        assert!(generated.identify(&headers(&format!("Bearer {token}"))).is_some());
        assert!(generated.identify(&headers(&format!("bearer  {token} "))).is_some());
        assert!(generated.identify(&headers(&format!("Basic {token}"))).is_none());
        assert!(generated.identify(&headers(&format!("Bearer {token}x"))).is_none());
        assert!(generated.identify(&headers("Bearer")).is_none());
        assert!(generated.identify(&http::HeaderMap::new()).is_none());

        let (a, b) = ("a".repeat(32), "b".repeat(40));
        let file = Tokens::from_text(&format!("\n  {a}\n{b}\n\n")).unwrap();
        let ida = file.identify(&headers(&format!("Bearer {a}"))).unwrap();
        let idb = file.identify(&headers(&format!("Bearer {b}"))).unwrap();
        assert!(!ida.same(&idb) && ida.same(&ida));
        assert!(matches!(Tokens::from_text(" \n"), Err(AccessError::NoToken)));
        assert!(matches!(Tokens::from_text(&format!("{a}\nshort")), Err(AccessError::BadToken { line: 2 })));
        assert!(matches!(Tokens::from_text(&format!("{a} {a}")), Err(AccessError::BadToken { line: 1 })));
    }
}
