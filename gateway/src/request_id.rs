//! `X-Request-Id`: the header, and the ids the gateway gives requests that
//! come without a sane one of their own.

use std::sync::atomic::{AtomicU64, Ordering};

use http::header::HeaderName;
use http::{HeaderMap, HeaderValue};

/// `X-Request-Id`.
pub static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// `X-Request-Id`s: the client's when it sent a sane one, else a
/// process-unique `<random prefix + thread><thread's counter>` (no syscall,
/// nothing written that another core reads, per request).
pub struct RequestIds {
    prefix: u64,
}

/// Threads that have made an id so far, in this process (each gets the
/// next number).
static ID_THREADS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's number (0: none yet) and its request counter.
    static THREAD_REQUESTS: std::cell::Cell<(u64, u32)> = const { std::cell::Cell::new((0, 0)) };
}

impl RequestIds {
    pub fn new() -> Self {
        let mut seed = [0_u8; 8];
        // A failing OS RNG only costs uniqueness across restarts.
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut seed);
        Self { prefix: u64::from_le_bytes(seed) }
    }

    /// The id for a request with these headers.
    pub fn for_request(&self, headers: &HeaderMap) -> HeaderValue {
        if let Some(given) = headers.get(&REQUEST_ID)
            && !given.is_empty()
            && given.len() <= 128
            && given.as_bytes().iter().all(|b| b.is_ascii_graphic())
        {
            return given.clone();
        }
        // 16 hex digits of the per-process prefix plus the thread's number,
        // then 8 of the thread's own counter (its low 32 bits: it wraps
        // after 4 billion requests). A counter per thread: one shared by
        // every core would be a cache line they all write per request.
        let (thread, count) = THREAD_REQUESTS.with(|state| {
            let (mut thread, count) = state.get();
            if thread == 0 {
                thread = ID_THREADS.fetch_add(1, Ordering::Relaxed) + 1;
            }
            state.set((thread, count.wrapping_add(1)));
            (thread, count)
        });
        let mut text = [0_u8; 24];
        let (prefix, counter) = text.split_at_mut(16);
        let encoded = hex::encode_to_slice(self.prefix.wrapping_add(thread << 40).to_be_bytes(), prefix)
            .and_then(|()| hex::encode_to_slice(count.to_be_bytes(), counter));
        encoded.ok().and_then(|()| HeaderValue::from_bytes(&text).ok()).unwrap_or_else(|| HeaderValue::from_static("-"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_hex_unique_and_a_clients_id_is_kept() {
        let ids = RequestIds::new();
        let (first, second) = (ids.for_request(&HeaderMap::new()), ids.for_request(&HeaderMap::new()));
        for id in [&first, &second] {
            let text = id.to_str().unwrap();
            assert_eq!(text.len(), 24, "{text}");
            assert!(text.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "{text}");
        }
        assert_ne!(first, second);
        assert_eq!(&first.to_str().unwrap()[..16], &second.to_str().unwrap()[..16], "one prefix per thread");
        let counter = |id: &HeaderValue| u32::from_str_radix(&id.to_str().unwrap()[16..], 16).unwrap();
        assert_eq!(counter(&second), counter(&first) + 1);
        // Another thread counts on its own, under another prefix.
        let elsewhere = std::thread::scope(|scope| scope.spawn(|| ids.for_request(&HeaderMap::new())).join().unwrap());
        assert_ne!(&elsewhere.to_str().unwrap()[..16], &first.to_str().unwrap()[..16]);
        let mut given = HeaderMap::new();
        given.insert(REQUEST_ID.clone(), HeaderValue::from_static("trace-42"));
        assert_eq!(ids.for_request(&given), "trace-42");
    }
}
