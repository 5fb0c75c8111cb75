//! The SHA-256 of each presented key, remembered per worker thread for the
//! keys a snapshot knows: a key's hash was about 2,500 instructions of
//! every request (a twentieth of a proxied one), and the same few keys
//! come back request after request.
//!
//! The memo is keyed by a 128-bit tag of the presented bytes — SipHash-1-3
//! with a 128-bit output under a key drawn from the system's random source
//! at start — never by the key itself, so no plaintext outlives its
//! request. It holds only digests: every request is still looked up in the
//! current snapshot, so a key revoked or changed since is refused as
//! before. Unknown keys are never remembered, so a flood of bad keys
//! neither grows the memo nor evicts the good ones (each still pays its
//! hash, as before).

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::OnceLock;

use siphasher::sip128::{Hasher128 as _, SipHasher13};

use crate::snapshot::{KeyEntry, Snapshot};

/// Digests remembered per worker thread (about 100 KB a worker); when
/// full, one is let go for each new one.
const REMEMBERED_KEYS: usize = 1024;

/// Presented values longer than this are not remembered (no key is this
/// long; a bogus one pays only its hash, not a tag as well).
const LONGEST_REMEMBERED: usize = 256;

thread_local! {
    static MEMO: RefCell<HashMap<u128, [u8; 32], BuildHasherDefault<TagHasher>>> = RefCell::default();
}

/// The snapshot's entry for `presented`, if it has one.
pub fn find<'s>(snapshot: &'s Snapshot, presented: &[u8]) -> Option<&'s KeyEntry> {
    // The length first: a value no key is this long costs no tag.
    let Some(tag) = (presented.len() <= LONGEST_REMEMBERED).then(|| tag_of(presented)).flatten() else {
        return snapshot.key(&waycast_crds::digest::sha256(presented));
    };
    let remembered = MEMO.with_borrow(|memo| memo.get(&tag).copied());
    if let Some(entry) = remembered.and_then(|digest| snapshot.key(&digest)) {
        return Some(entry);
    }
    let digest = waycast_crds::digest::sha256(presented);
    let Some(entry) = snapshot.key(&digest) else {
        if remembered.is_some() {
            // Revoked since it was remembered.
            MEMO.with_borrow_mut(|memo| memo.remove(&tag));
        }
        return None;
    };
    MEMO.with_borrow_mut(|memo| {
        // Tags are random: the first one found is as good as any to let go.
        if memo.len() >= REMEMBERED_KEYS
            && let Some(&old) = memo.keys().next()
        {
            memo.remove(&old);
        }
        memo.insert(tag, digest);
    });
    Some(entry)
}

/// 128 bits naming `presented` in this process: SipHash-1-3's 128-bit
/// output under a secret key (a keyed PRF: an accidental or forced
/// collision is a 2^-128 chance per pair). `None` when the system gave no
/// randomness for the key: nothing is remembered then.
fn tag_of(presented: &[u8]) -> Option<u128> {
    static KEY: OnceLock<Option<[u8; 16]>> = OnceLock::new();
    let key = KEY.get_or_init(|| {
        let mut key = [0; 16];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key).ok().map(|()| key)
    });
    let mut hasher = SipHasher13::new_with_key(key.as_ref()?);
    hasher.write(presented);
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

/// How many digests this thread remembers.
#[cfg(test)]
fn remembered() -> usize {
    MEMO.with_borrow(HashMap::len)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

    use waycast_crds::config::{GatewayConfig, KeyConfig};

    use super::*;

    fn snapshot(keys: &[(&str, &str)]) -> Snapshot {
        let keys = keys
            .iter()
            .map(|(id, text)| KeyConfig::new(*id, waycast_crds::digest::sha256_hex(text.as_bytes())))
            .collect();
        Snapshot::standalone(&GatewayConfig { keys, ..GatewayConfig::empty() }, "h".into()).unwrap()
    }

    #[test]
    fn a_found_key_is_remembered_and_a_revoked_one_refused_though_remembered() {
        let before = remembered();
        let served = snapshot(&[("t/alice", "alice-key"), ("t/bob", "bob-key")]);
        assert_eq!(&*find(&served, b"alice-key").unwrap().id, "t/alice");
        assert_eq!(remembered(), before + 1, "a found key's digest is remembered");
        assert_eq!(&*find(&served, b"alice-key").unwrap().id, "t/alice", "found again from the memo");
        assert_eq!(remembered(), before + 1);
        // What the memo names is what is found: a tag remembered with
        // alice's digest finds alice without hashing what was presented.
        let alias = tag_of(b"an-alias").unwrap();
        let alice = waycast_crds::digest::sha256(b"alice-key");
        MEMO.with_borrow_mut(|memo| memo.insert(alias, alice));
        assert_eq!(&*find(&served, b"an-alias").unwrap().id, "t/alice");
        MEMO.with_borrow_mut(|memo| memo.remove(&alias));
        // The next config revokes alice: the memo does not let her in.
        let revoked = snapshot(&[("t/bob", "bob-key")]);
        assert!(find(&revoked, b"alice-key").is_none());
        assert_eq!(remembered(), before, "a revoked key is forgotten");
        // A key given another id is found under its new one.
        let renamed = snapshot(&[("t/bob-2", "bob-key")]);
        assert_eq!(&*find(&served, b"bob-key").unwrap().id, "t/bob");
        assert_eq!(&*find(&renamed, b"bob-key").unwrap().id, "t/bob-2");
    }

    #[test]
    fn unknown_keys_are_never_remembered_and_the_memo_is_bounded() {
        let served = snapshot(&[("t/alice", "alice-key")]);
        let before = remembered();
        for n in 0..5_000 {
            assert!(find(&served, format!("bad-key-{n}").as_bytes()).is_none());
        }
        assert_eq!(remembered(), before, "a flood of bad keys leaves the memo as it was");
        let many: Vec<(String, String)> =
            (0..REMEMBERED_KEYS + 10).map(|n| (format!("t/k{n}"), format!("key-{n}"))).collect();
        let pairs: Vec<(&str, &str)> = many.iter().map(|(id, text)| (id.as_str(), text.as_str())).collect();
        let large = snapshot(&pairs);
        for (id, text) in &pairs {
            assert_eq!(&*find(&large, text.as_bytes()).unwrap().id, *id);
        }
        assert_eq!(remembered(), REMEMBERED_KEYS, "full, it lets one go for each new one");
        // A value longer than any key is looked up, never remembered.
        let long = "k".repeat(LONGEST_REMEMBERED + 1);
        let with_long = snapshot(&[("t/long", long.as_str())]);
        assert_eq!(&*find(&with_long, long.as_bytes()).unwrap().id, "t/long");
        assert_eq!(remembered(), REMEMBERED_KEYS);
    }

    #[test]
    fn tags_differ_for_keys_that_differ_by_one_byte_or_length() {
        let tags = [tag_of(b"key"), tag_of(b"kez"), tag_of(b"key "), tag_of(b"ke"), tag_of(b"")].map(Option::unwrap);
        for (i, a) in tags.iter().enumerate() {
            for b in &tags[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(tag_of(b"key"), tag_of(b"key"), "stable within the process");
        let tag = tags[0];
        assert_ne!(tag >> 64, tag & u128::from(u64::MAX), "128 bits, not one 64-bit value twice");
    }
}
