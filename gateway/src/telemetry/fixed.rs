//! The parts of a request's spans and usage record that only its
//! operation, model, key and endpoint decide, encoded once per worker and
//! copied into each request's messages after.
//!
//! A traced request writes some 30 attributes; ten of them (the GenAI
//! names, the key, the endpoint's address and port, the backend) are the
//! same for every request of one route, key and endpoint. Written one by
//! one they cost about 30 instructions each; copied, one copy for all.
//! The table is direct-mapped and bounded ([`SLOTS`] per worker, found by
//! the addresses of the worker's own copies of the names); an entry holds
//! what it was made from, so an address it is found by is not reused while
//! it lives, and equal addresses mean equal text.

use std::cell::RefCell;
use std::sync::Arc;

use http::uri::Authority;
use waycast_otlp::proto::{self as otlp, Attributes};

/// Entries per worker.
const SLOTS: usize = 16;

/// One combination's encoded parts.
pub(super) struct Fixed {
    operation: &'static str,
    model: Arc<str>,
    key: Arc<str>,
    /// The endpoint that answered last (the usage record's backend).
    endpoint: Option<Authority>,
    /// The server span's attributes, the attempt span's (for `endpoint`),
    /// the record's, one after another.
    bytes: Vec<u8>,
    /// Where the server span's and the attempt span's end in `bytes`.
    ends: [usize; 2],
}

impl Fixed {
    fn new(operation: &'static str, model: &Arc<str>, key: &Arc<str>, endpoint: Option<&Authority>) -> Self {
        let mut bytes = Vec::with_capacity(256);
        otlp::span_attributes(&mut bytes, |attributes| server_attributes(attributes, operation, model, key));
        let server = bytes.len();
        if let Some(endpoint) = endpoint {
            otlp::span_attributes(&mut bytes, |attributes| endpoint_attributes(attributes, operation, endpoint));
        }
        let attempt = bytes.len();
        otlp::record_attributes(&mut bytes, |attributes| record_attributes(attributes, model, key, endpoint));
        Self {
            operation,
            model: model.clone(),
            key: key.clone(),
            endpoint: endpoint.cloned(),
            bytes,
            ends: [server, attempt],
        }
    }

    fn is(&self, operation: &'static str, model: &Arc<str>, key: &Arc<str>, endpoint: Option<&Authority>) -> bool {
        std::ptr::eq(self.operation, operation)
            && Arc::ptr_eq(&self.model, model)
            && Arc::ptr_eq(&self.key, key)
            && match (&self.endpoint, endpoint) {
                (None, None) => true,
                (Some(held), Some(asked)) => same(held, asked),
                _ => false,
            }
    }

    pub fn operation(&self) -> &'static str {
        self.operation
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// `gen_ai.operation.name`, `.provider.name`, `.request.model`,
    /// `.response.model`, `waycast.key`, for a span.
    pub fn server(&self) -> &[u8] {
        &self.bytes[..self.ends[0]]
    }

    /// `gen_ai.operation.name`, `server.address`, `server.port`, for a
    /// span, when `endpoint` is the one these parts were made for.
    pub fn attempt(&self, endpoint: &Authority) -> Option<&[u8]> {
        let held = self.endpoint.as_ref()?;
        same(held, endpoint).then(|| &self.bytes[self.ends[0]..self.ends[1]])
    }

    /// `waycast.key`, `gen_ai.request.model` and `waycast.backend`, for a
    /// log record.
    pub fn record(&self) -> &[u8] {
        &self.bytes[self.ends[1]..]
    }
}

/// The same bytes: `held` keeps its own alive, so another authority at
/// the same address and length holds the same text (reference-counted
/// bytes are never written).
fn same(held: &Authority, asked: &Authority) -> bool {
    std::ptr::eq(held.as_str(), asked.as_str())
}

thread_local! {
    static TABLE: RefCell<Vec<Option<Fixed>>> = RefCell::new((0..SLOTS).map(|_| None).collect());
}

/// Runs `write` with the fixed parts of `operation`, `model`, `key` and
/// `endpoint` (the worker's own copies of the names), encoding them on a
/// miss.
pub(super) fn with<R>(
    operation: &'static str,
    model: &Arc<str>,
    key: &Arc<str>,
    endpoint: Option<&Authority>,
    write: impl FnOnce(&Fixed) -> R,
) -> R {
    let address = |text: &str| text.as_ptr() as usize as u64;
    let mixed =
        address(model) ^ address(key).rotate_left(21) ^ endpoint.map_or(0, |e| address(e.as_str())).rotate_left(42);
    // Allocations are 16-byte aligned; a multiply spreads the rest.
    let slot = ((mixed >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60) as usize % SLOTS;
    TABLE.with_borrow_mut(|table| {
        let entry = &mut table[slot];
        if let Some(fixed) = entry
            && fixed.is(operation, model, key, endpoint)
        {
            return write(fixed);
        }
        write(entry.insert(Fixed::new(operation, model, key, endpoint)))
    })
}

/// The server span's attributes that only its operation, model and key
/// decide (encoded once per worker, [`fixed`]).
pub(super) fn server_attributes(attributes: &mut Attributes<'_>, operation: &str, model: &str, key: &str) {
    attributes.text("gen_ai.operation.name", operation);
    attributes.text("gen_ai.provider.name", "waycast");
    attributes.text("gen_ai.request.model", model);
    attributes.text("gen_ai.response.model", model);
    attributes.text("waycast.key", key);
}

/// An attempt span's attributes that only its operation and endpoint
/// decide.
pub(super) fn endpoint_attributes(attributes: &mut Attributes<'_>, operation: &str, endpoint: &http::uri::Authority) {
    // `host:port` (an address in brackets for IPv6), as picked.
    let endpoint = endpoint.as_str();
    let (address, port) = endpoint.rsplit_once(':').unwrap_or((endpoint, ""));
    attributes.text("gen_ai.operation.name", operation);
    attributes.text("server.address", address.trim_start_matches('[').trim_end_matches(']'));
    if let Some(port) = crate::json_text::non_negative_integer(port.as_bytes()) {
        attributes.int("server.port", port);
    }
}

/// The usage record's attributes that only its model, key and backend
/// decide.
pub(super) fn record_attributes(
    attributes: &mut Attributes<'_>,
    model: &str,
    key: &str,
    backend: Option<&http::uri::Authority>,
) {
    attributes.text("waycast.key", key);
    attributes.text("gen_ai.request.model", model);
    if let Some(backend) = backend {
        attributes.text("waycast.backend", backend.as_str());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_made_once_and_found_by_the_same_names_only() {
        let (model, key): (Arc<str>, Arc<str>) = (Arc::from("llama"), Arc::from("team-a/alice"));
        let endpoint = Authority::from_static("10.0.0.8:8000");
        let first = with("chat", &model, &key, Some(&endpoint), |fixed| fixed.bytes.as_ptr());
        assert_eq!(with("chat", &model, &key, Some(&endpoint), |fixed| fixed.bytes.as_ptr()), first, "found again");
        // Equal text in another allocation is another entry, made anew.
        let other: Arc<str> = Arc::from("llama");
        with("chat", &other, &key, Some(&endpoint), |fixed| {
            assert!(fixed.is("chat", &other, &key, Some(&endpoint)));
            assert!(fixed.attempt(&endpoint).is_some());
            assert!(fixed.attempt(&Authority::from_static("10.0.0.9:8000")).is_none(), "another endpoint");
        });
        with("embeddings", &model, &key, None, |fixed| {
            assert_eq!(fixed.operation(), "embeddings");
            assert!(fixed.attempt(&endpoint).is_none(), "no endpoint: no attempt part");
        });
    }
}
