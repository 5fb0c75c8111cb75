//! What a provider is to the verifier, what a verified token yields, why
//! a token is refused, and the bounds every check keeps.

use std::sync::Arc;

use super::keys::KeySet;

/// Longest token verified: real ones are 1–3 KiB; one past this is refused
/// before anything in it is decoded.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// Most claims a token may carry (providers send 10–30).
pub const MAX_CLAIMS: usize = 64;

/// Most groups a token may name.
pub const MAX_GROUPS: usize = 128;

/// Longest user name or group name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// Clock skew allowed between the issuer and the gateway on `exp`, `nbf`
/// and `iat`, in seconds.
pub const SKEW_SECONDS: i64 = 30;

/// Kid-less tokens are tried against at most this many keys of their
/// algorithm, so a set of many keys cannot multiply a token's cost.
pub const MAX_KIDLESS_TRIES: usize = 4;

/// An issuer the platform trusts: what a token of it must say, which
/// claims name the person, and the keys it signs with.
#[derive(Debug)]
pub struct Provider {
    pub(super) name: Arc<str>,
    pub(super) issuer: Box<str>,
    pub(super) audiences: Box<[Box<str>]>,
    pub(super) user_claim: Box<str>,
    pub(super) groups_claim: Option<Box<str>>,
    pub(super) keys: KeySet,
    pub(super) fingerprint: [u8; 32],
}

/// Claims a provider may not name as the user's or the groups': they are
/// read for what they are.
const REGISTERED_CLAIMS: [&str; 5] = ["iss", "aud", "exp", "nbf", "iat"];

/// The user claim whose tokens must not say the address is unverified.
pub(super) const EMAIL_CLAIM: &str = "email";
/// OpenID Connect Core 1.0 §5.1: whether the issuer verified `email`.
pub(super) const EMAIL_VERIFIED_CLAIM: &str = "email_verified";

/// Why a provider cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// No issuer.
    #[error("provider {0}: the issuer is empty")]
    NoIssuer(String),
    /// No audience: no token could be for this gateway.
    #[error("provider {0}: no audiences")]
    NoAudience(String),
    /// The user or groups claim is one read for another meaning, or both
    /// are the same claim.
    #[error("provider {provider}: claim {claim:?} cannot name the user or the groups")]
    ReservedClaim {
        /// The provider.
        provider: String,
        /// The claim.
        claim: String,
    },
}

impl Provider {
    /// A provider named `name` trusting tokens of `issuer` for any of
    /// `audiences`, the person named by claim `user_claim` and their
    /// groups by `groups_claim`, signed by a key of `keys`.
    ///
    /// # Errors
    /// An empty issuer, no audience, or a claim name that cannot serve.
    pub fn new(
        name: &str,
        issuer: &str,
        audiences: &[&str],
        user_claim: &str,
        groups_claim: Option<&str>,
        keys: KeySet,
    ) -> Result<Self, ProviderError> {
        if issuer.is_empty() {
            return Err(ProviderError::NoIssuer(name.to_owned()));
        }
        if audiences.is_empty() {
            return Err(ProviderError::NoAudience(name.to_owned()));
        }
        let reserved = |claim: &str| REGISTERED_CLAIMS.contains(&claim) || claim.is_empty();
        for claim in std::iter::once(user_claim).chain(groups_claim) {
            if reserved(claim) || groups_claim == Some(user_claim) {
                return Err(ProviderError::ReservedClaim { provider: name.to_owned(), claim: claim.to_owned() });
            }
        }
        // What a remembered token was verified against: the same bytes make
        // the same fingerprint, so a key set fetched again unchanged keeps
        // every remembered token, and any change forgets them.
        let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
        let mut field = |bytes: &[u8]| {
            digest.update(&(bytes.len() as u64).to_le_bytes());
            digest.update(bytes);
        };
        field(name.as_bytes());
        field(issuer.as_bytes());
        field(&(audiences.len() as u64).to_le_bytes());
        audiences.iter().for_each(|audience| field(audience.as_bytes()));
        field(user_claim.as_bytes());
        field(groups_claim.map_or(&[0xff][..], str::as_bytes));
        field(keys.digest());
        let mut fingerprint = [0; 32];
        fingerprint.copy_from_slice(digest.finish().as_ref());
        Ok(Self {
            name: name.into(),
            issuer: issuer.into(),
            audiences: audiences.iter().map(|&audience| audience.into()).collect(),
            user_claim: user_claim.into(),
            groups_claim: groups_claim.map(Into::into),
            keys,
            fingerprint,
        })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `iss` its tokens carry.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Its key set.
    pub fn keys(&self) -> &KeySet {
        &self.keys
    }

    /// A digest of everything a verification depends on.
    pub fn fingerprint(&self) -> &[u8; 32] {
        &self.fingerprint
    }
}

/// A token that passed every check: who it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The provider that vouched for it.
    pub provider: Arc<str>,
    /// The person (or workload): the provider's user claim.
    pub user: Box<str>,
    /// Their groups: the provider's groups claim, empty when it names none.
    pub groups: Box<[Box<str>]>,
    /// The token's `exp`: seconds since the Unix epoch.
    pub exp: i64,
    /// A keyed hash of `provider` and `user`, the same for every token of
    /// the person in this process (their line in a full model's queue),
    /// taken once when the token is verified, not per request.
    pub user_hash: u64,
}

/// A keyed hash of a provider and a user name: the same in this process
/// for the same pair, not one a caller can aim at.
pub fn user_hash(provider: &str, user: &str) -> u64 {
    use std::hash::BuildHasher as _;
    static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> = std::sync::OnceLock::new();
    KEYS.get_or_init(std::collections::hash_map::RandomState::new).hash_one((provider, user))
}

impl Verified {
    /// Whether the token has expired at `now` (the skew allowed).
    pub fn expired_at(&self, now: jiff::Timestamp) -> bool {
        expired(self.exp, now)
    }
}

/// Whether a token of `exp` has expired at `now`, the skew allowed.
pub(super) fn expired(exp: i64, now: jiff::Timestamp) -> bool {
    now.as_second() >= exp.saturating_add(SKEW_SECONDS)
}

/// Why a token is refused. Each has a stable [`code`](Refusal::code): the
/// code a 401 will carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Its `exp` has passed.
    #[error("the token has expired")]
    TokenExpired,
    /// Its `nbf` (or `iat`) is still to come.
    #[error("the token is not valid yet")]
    TokenNotYetValid,
    /// None of its audiences is one of the provider's.
    #[error("the token is not meant for this gateway")]
    WrongAudience,
    /// No provider trusted here issued it.
    #[error("the token's issuer is not trusted here")]
    UnknownIssuer,
    /// The issuer's key set has no key of its `kid` for its algorithm.
    #[error("the token names a key its issuer's set does not have")]
    UnknownKey,
    /// The signature does not verify.
    #[error("the token's signature does not verify")]
    BadSignature,
    /// Not a JWS compact token, or its header or claims are not what they
    /// must be.
    #[error("the token is malformed")]
    MalformedToken,
    /// Longer than accepted, or too many claims or groups, or a name too
    /// long.
    #[error("the token is larger than accepted")]
    TokenTooLarge,
    /// Its algorithm is not an accepted one (`none`, an HMAC, ...).
    #[error("the token's algorithm is not accepted")]
    DisallowedAlgorithm,
    /// A claim that must be there is not (`iss`, `aud`, `exp`, the user).
    #[error("the token lacks a required claim")]
    MissingClaim,
    /// The user claim is `email` and the token says the address is not
    /// verified (`email_verified` present and not true).
    #[error("the token's email address is not verified by its issuer")]
    EmailNotVerified,
    /// This worker spent its share of time on tokens it refused (a flood of
    /// forged signatures): a token it has not verified before waits
    /// (tokens it remembers are served as ever).
    #[error("too many forged tokens arrive: a new token is checked again in a second")]
    VerificationBusy,
}

impl Refusal {
    /// The code a client sees.
    pub fn code(self) -> &'static str {
        match self {
            Self::TokenExpired => "token_expired",
            Self::TokenNotYetValid => "token_not_yet_valid",
            Self::WrongAudience => "wrong_audience",
            Self::UnknownIssuer => "unknown_issuer",
            Self::UnknownKey => "unknown_key",
            Self::BadSignature => "bad_signature",
            Self::MalformedToken => "malformed_token",
            Self::TokenTooLarge => "token_too_large",
            Self::DisallowedAlgorithm => "disallowed_algorithm",
            Self::MissingClaim => "missing_claim",
            Self::EmailNotVerified => "email_not_verified",
            Self::VerificationBusy => "token_verification_busy",
        }
    }
}
