//! Who a bearer token says its holder is, once a key of its issuer's set
//! vouches for it: the verification core of sign-in with a company's
//! OpenID provider or a Kubernetes ServiceAccount token.
//!
//! ```text
//! bearer ─► is_token_shaped? ─► unverified_issuer ─► Provider ─► verify ─► Verified
//!                (no: a key)                                    └► Refusal (a stable code)
//! TokenMemo: token digest ─► Verified, until the token's exp (per worker)
//! ```
//!
//! Pure (the clock is passed in, key sets are handed over as bytes): the
//! operator fetches key sets into the config, `snapshot::identity` builds
//! the providers and grants of a config, and `proxy::auth` turns a
//! [`Verified`] into the grant it is served through.
//! A leaf: it imports nothing else of the crate.

mod keys;
mod memo;
mod provider;
mod token;

#[cfg(test)]
mod tests;

pub use keys::{Alg, KeySet, KeySetError, MAX_KEY_SET_BYTES, MAX_KEYS};
pub use memo::{
    REFUSED_CHECKS_BURST_NANOS, REFUSED_CHECKS_NANOS_PER_SECOND, REMEMBERED_TOKENS, TokenMemo, remembered,
    verify_remembered,
};
pub use provider::{
    MAX_CLAIMS, MAX_GROUPS, MAX_KIDLESS_TRIES, MAX_NAME_BYTES, MAX_TOKEN_BYTES, Provider, ProviderError, Refusal,
    SKEW_SECONDS, Verified,
};
pub use token::{is_token_shaped, unverified_issuer, verify};
