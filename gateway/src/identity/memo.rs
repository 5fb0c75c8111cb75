//! Verified tokens remembered per worker thread, so a token's signature is
//! checked once, not per request: built like the key memo
//! (`proxy/key_digests.rs`), a thread-local map no other worker touches.
//!
//! Found by a tag of the token's length and last 32 bytes (its signature's
//! end: random for every token an issuer signs) — SipHash-1-3 with a
//! 128-bit output under a key drawn from the system's random source at
//! start, so no one can aim tokens at one slot — and then compared whole
//! with the token remembered: a hit is the very same token, whatever its
//! tag. NB: tagging the whole token (400–1,500 bytes) cost some 1,000
//! instructions a request, a quarter of what a request with a token cost
//! more than one with a key; the tail and a comparison cost about 100.
//! The price is that a remembered token's text stays in its worker's
//! memory until it expires or makes room (never written anywhere, never
//! logged), as it does in any client's. An entry holds until the
//! token's `exp` (the same skew as [`verify`](super::token::verify)), and only
//! while its provider verifies as it did: a changed key set, issuer,
//! audience or claim name makes every remembered token of that provider
//! verify again. Only verified tokens are remembered: a flood of bad ones
//! neither grows the memo nor evicts the good (each still pays its checks).

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, OnceLock};

use siphasher::sip128::{Hasher128 as _, SipHasher13};

use super::provider::{MAX_TOKEN_BYTES, Provider, Refusal, Verified};
use super::token::{unverified_issuer, verify};

/// Tokens remembered per worker thread (each at most twice its 8 KiB: the
/// token, and its user and groups).
pub const REMEMBERED_TOKENS: usize = 1024;

thread_local! {
    static MEMO: RefCell<TokenMemo> = RefCell::new(TokenMemo::new(REMEMBERED_TOKENS));
}

/// The calling worker's remembered verification of `token`, if it has
/// one still good at `now` for the provider `provider_for` finds now: the
/// request path asks this first, so a remembered token's bytes are never
/// scanned for their shape again (they were when it was verified).
pub fn remembered<'p>(
    token: &[u8],
    now: jiff::Timestamp,
    provider_for: impl Fn(&str) -> Option<&'p Provider>,
) -> Option<Arc<Verified>> {
    MEMO.with_borrow(|memo| memo.remembered(token, now, provider_for))
}

/// [`TokenMemo::verify`] with the calling worker's own memo.
///
/// # Errors
/// The [`Refusal`] of a token not remembered and not verified.
pub fn verify_remembered<'p>(
    token: &str,
    now: jiff::Timestamp,
    provider_for: impl Fn(&str) -> Option<&'p Provider>,
) -> Result<Arc<Verified>, Refusal> {
    MEMO.with_borrow_mut(|memo| memo.verify(token, now, provider_for))
}

/// The CPU time a worker spends a second checking tokens that turn out
/// refused — forged signatures cost 20–60 µs each, a bad key's refusal
/// 0.1 µs (`make bench-tokens`) — past which a token it does not remember
/// waits: a tenth of a worker.
pub const REFUSED_CHECKS_NANOS_PER_SECOND: u64 = 100_000_000;
/// The most of that time a worker may spend at once (after a quiet spell).
pub const REFUSED_CHECKS_BURST_NANOS: u64 = 200_000_000;

/// Verified tokens by tag, bounded.
pub struct TokenMemo {
    entries: HashMap<u128, Remembered, BuildHasherDefault<TagHasher>>,
    capacity: usize,
    refused_checks: RefusedChecks,
}

/// A bucket of the time a worker still spends on checks that end in a
/// refusal: each is charged what it took, so a token refused before any
/// signature is checked (an empty or cut signature, a malformed claim)
/// costs next to nothing and cannot drain it; a forged signature costs its
/// check. While it is empty a token not remembered is refused unchecked
/// (`VerificationBusy`); good tokens take nothing from it, so without a
/// flood nobody is refused by it, and during one the tokens a worker
/// remembers are served as ever.
struct RefusedChecks {
    left_nanos: f64,
    at: Option<std::time::Instant>,
}

impl RefusedChecks {
    fn full() -> Self {
        #[allow(clippy::cast_precision_loss, reason = "a constant well within f64's exact range")]
        let burst = REFUSED_CHECKS_BURST_NANOS as f64;
        Self { left_nanos: burst, at: None }
    }

    #[allow(clippy::cast_precision_loss, reason = "constants well within f64's exact range")]
    fn refill(&mut self, now: std::time::Instant) {
        if let Some(at) = self.at {
            let gained = now.saturating_duration_since(at).as_secs_f64() * REFUSED_CHECKS_NANOS_PER_SECOND as f64;
            self.left_nanos = (self.left_nanos + gained).min(REFUSED_CHECKS_BURST_NANOS as f64);
        }
        self.at = Some(now);
    }

    fn charge(&mut self, took: std::time::Duration) {
        self.left_nanos -= took.as_secs_f64() * 1e9;
    }
}

struct Remembered {
    /// The token, compared whole on every hit.
    token: Box<[u8]>,
    verified: Arc<Verified>,
    /// The issuer it was verified for, to find its provider again.
    issuer: Box<str>,
    /// That provider's fingerprint then.
    fingerprint: [u8; 32],
}

impl TokenMemo {
    /// An empty memo of at most `capacity` tokens (at least one).
    pub fn new(capacity: usize) -> Self {
        Self { entries: HashMap::default(), capacity: capacity.max(1), refused_checks: RefusedChecks::full() }
    }

    /// Tokens remembered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `token`'s remembered verification, if still good at `now` for the
    /// provider as it is now (an entry no longer good is left for
    /// [`verify`](Self::verify) to replace).
    pub fn remembered<'p>(
        &self,
        token: &[u8],
        now: jiff::Timestamp,
        provider_for: impl Fn(&str) -> Option<&'p Provider>,
    ) -> Option<Arc<Verified>> {
        if token.len() > MAX_TOKEN_BYTES {
            return None;
        }
        let entry = self.entries.get(&tag_of(token)?).filter(|entry| *entry.token == *token)?;
        let current = provider_for(&entry.issuer).is_some_and(|provider| *provider.fingerprint() == entry.fingerprint);
        (current && !entry.verified.expired_at(now)).then(|| entry.verified.clone())
    }

    /// Who `token` names at `now`: remembered if it was verified before
    /// against the provider `provider_for` finds for its issuer as it is
    /// now, else verified (the issuer read unverified, to find the
    /// provider) and remembered.
    ///
    /// # Errors
    /// The [`Refusal`] of a token not remembered and not verified.
    pub fn verify<'p>(
        &mut self,
        token: &str,
        now: jiff::Timestamp,
        provider_for: impl Fn(&str) -> Option<&'p Provider>,
    ) -> Result<Arc<Verified>, Refusal> {
        self.verify_with(token, now, provider_for, verify)
    }

    /// [`verify`](Self::verify) with the verification given (tests count it).
    pub(super) fn verify_with<'p>(
        &mut self,
        token: &str,
        now: jiff::Timestamp,
        provider_for: impl Fn(&str) -> Option<&'p Provider>,
        verify: impl FnOnce(&str, &Provider, jiff::Timestamp) -> Result<Verified, Refusal>,
    ) -> Result<Arc<Verified>, Refusal> {
        self.verify_at(token, (now, std::time::Instant::now), provider_for, verify)
    }

    /// [`verify_with`](Self::verify_with), the time a refused check took
    /// read on `clock` (the monotonic clock; tests give their own).
    pub(super) fn verify_at<'p>(
        &mut self,
        token: &str,
        (now, mut clock): (jiff::Timestamp, impl FnMut() -> std::time::Instant),
        provider_for: impl Fn(&str) -> Option<&'p Provider>,
        verify: impl FnOnce(&str, &Provider, jiff::Timestamp) -> Result<Verified, Refusal>,
    ) -> Result<Arc<Verified>, Refusal> {
        // Past the size bound a token is refused unread: no tag either.
        let tag = (token.len() <= MAX_TOKEN_BYTES).then(|| tag_of(token.as_bytes())).flatten();
        if let Some(tag) = tag
            && let Some(entry) = self.entries.get(&tag).filter(|entry| *entry.token == *token.as_bytes())
        {
            let current =
                provider_for(&entry.issuer).is_some_and(|provider| *provider.fingerprint() == entry.fingerprint);
            if current && !entry.verified.expired_at(now) {
                return Ok(entry.verified.clone());
            }
            self.entries.remove(&tag);
        }
        let issuer = unverified_issuer(token)?;
        let provider = provider_for(&issuer).ok_or(Refusal::UnknownIssuer)?;
        // The clock only on this path: a remembered token never reads it.
        let started = clock();
        self.refused_checks.refill(started);
        if self.refused_checks.left_nanos <= 0.0 {
            return Err(Refusal::VerificationBusy);
        }
        let verified = match verify(token, provider, now) {
            Ok(verified) => Arc::new(verified),
            Err(refusal) => {
                self.refused_checks.charge(clock().saturating_duration_since(started));
                return Err(refusal);
            }
        };
        if let Some(tag) = tag {
            self.make_room(now);
            let entry = Remembered {
                token: token.as_bytes().into(),
                verified: verified.clone(),
                issuer: issuer.into(),
                fingerprint: *provider.fingerprint(),
            };
            self.entries.insert(tag, entry);
        }
        Ok(verified)
    }

    /// Full, lets the expired go; still full, the one expiring soonest.
    fn make_room(&mut self, now: jiff::Timestamp) {
        if self.entries.len() < self.capacity {
            return;
        }
        self.entries.retain(|_, entry| !entry.verified.expired_at(now));
        if self.entries.len() < self.capacity {
            return;
        }
        if let Some(soonest) = self.entries.iter().min_by_key(|(_, entry)| entry.verified.exp).map(|(&tag, _)| tag) {
            self.entries.remove(&soonest);
        }
    }
}

/// How many of a token's last bytes its tag reads.
const TAGGED_TAIL: usize = 32;

/// 128 bits finding `token` in this process: of its length and last
/// [`TAGGED_TAIL`] bytes (see the module's docs). `None` when the system
/// gave no randomness for the key: nothing is remembered then.
fn tag_of(token: &[u8]) -> Option<u128> {
    static KEY: OnceLock<Option<[u8; 16]>> = OnceLock::new();
    let key = KEY.get_or_init(|| {
        let mut key = [0; 16];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key).ok().map(|()| key)
    });
    let mut hasher = SipHasher13::new_with_key(key.as_ref()?);
    hasher.write_usize(token.len());
    hasher.write(&token[token.len().saturating_sub(TAGGED_TAIL)..]);
    Some(hasher.finish128().as_u128())
}

/// A tag is already uniformly random: the map uses its low bits as they are.
#[derive(Default)]
struct TagHasher(u64);

impl Hasher for TagHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 ^= u64::from_le_bytes(word);
        }
    }
    fn write_u128(&mut self, tag: u128) {
        self.0 = tag as u64;
    }
}
