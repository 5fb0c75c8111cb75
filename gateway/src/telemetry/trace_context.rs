//! W3C Trace Context (`traceparent`, `tracestate`): read from a client's
//! request when the Gateway trusts it, made afresh otherwise, and sent
//! upstream so the inference server's own spans join the trace. Parsing
//! is strict where the recommendation is (lower-case hex, no all-zero id,
//! version `ff` invalid) and lenient where it asks to be (a later version
//! may carry more fields after the four we read).

pub use waycast_otlp::ids::{new_span_id, new_trace_id, sampled_at};

/// A usage record's own id: 128 bits the gateway draws, as 32 lower-case
/// hex digits. It is the record's body, what a pipeline de-duplicates a
/// batch sent twice by; the request id cannot be, for a client may set it
/// (`X-Request-Id`) and so make its other records look like copies.
pub fn new_record_id() -> [u8; 32] {
    let mut text = [0; 32];
    hex_into(&waycast_otlp::ids::new_record_id(), &mut text);
    text
}

/// The longest `tracestate` passed on (the recommendation's 32 members of
/// at most 256 characters would be 8 KB; vendors keep it far shorter).
pub const MAX_TRACE_STATE: usize = 512;

/// A span's place in a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanContext {
    /// The trace, 16 bytes, never all zero.
    pub trace_id: [u8; 16],
    /// The span, 8 bytes, never all zero.
    pub span_id: [u8; 8],
    /// Whether the trace is recorded (`traceparent`'s sampled flag).
    pub sampled: bool,
}

impl SpanContext {
    /// `traceparent` of version 00 naming this span as the parent.
    #[cfg(test)]
    pub fn traceparent(&self) -> String {
        String::from_utf8_lossy(&self.traceparent_bytes()).into_owned()
    }

    /// The same, on the stack (ASCII).
    pub fn traceparent_bytes(&self) -> [u8; 55] {
        let mut text = [b'-'; 55];
        text[..2].copy_from_slice(b"00");
        let (high, low) = self.trace_id.split_at(8);
        for (at, half) in [(3, high), (19, low), (36, &self.span_id[..])] {
            let mut eight = [0; 8];
            eight.copy_from_slice(half);
            text[at..at + 16].copy_from_slice(&hex(&eight));
        }
        text[53..].copy_from_slice(if self.sampled { b"01" } else { b"00" });
        text
    }
}

/// Each byte's two lower-case hex digits.
const PAIRS: [[u8; 2]; 256] = {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut pairs = [[0; 2]; 256];
    let mut byte = 0;
    while byte < 256 {
        pairs[byte] = [DIGITS[byte >> 4], DIGITS[byte & 15]];
        byte += 1;
    }
    pairs
};

/// `bytes` as 16 lower-case hex digits: each attempt of each request
/// writes a `traceparent`, and a digit a step (two lookups, shifts and
/// place arithmetic) cost some 300 instructions where a pair a byte costs
/// about 30 for eight bytes.
fn hex(bytes: &[u8; 8]) -> [u8; 16] {
    let mut text = [0; 16];
    hex_into(bytes, &mut text);
    text
}

/// `bytes` as lower-case hex digits into `text` (twice as long).
fn hex_into(bytes: &[u8], text: &mut [u8]) {
    for (pair, &byte) in text.chunks_exact_mut(2).zip(bytes) {
        pair.copy_from_slice(&PAIRS[usize::from(byte)]);
    }
}

/// The parent a `traceparent` header names, or `None` when it is not a
/// valid one (the request then starts a trace of its own).
pub fn parse_traceparent(value: &[u8]) -> Option<SpanContext> {
    // version "-" trace-id "-" parent-id "-" flags: 2+1+32+1+16+1+2 = 55.
    if value.len() < 55 {
        return None;
    }
    let version = hex_byte(&value[0..2])?;
    if version == 0xff || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return None;
    }
    // Version 00 is exactly 55 characters; a later one may go on, after a dash.
    if (version == 0 && value.len() != 55) || (value.len() > 55 && value[55] != b'-') {
        return None;
    }
    let mut trace_id = [0; 16];
    for (at, byte) in trace_id.iter_mut().enumerate() {
        *byte = hex_byte(&value[3 + 2 * at..5 + 2 * at])?;
    }
    let mut span_id = [0; 8];
    for (at, byte) in span_id.iter_mut().enumerate() {
        *byte = hex_byte(&value[36 + 2 * at..38 + 2 * at])?;
    }
    let flags = hex_byte(&value[53..55])?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(SpanContext { trace_id, span_id, sampled: flags & 1 == 1 })
}

/// Two lower-case hex digits.
fn hex_byte(pair: &[u8]) -> Option<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(digit(pair[0])? << 4 | digit(*pair.get(1)?)?)
}

/// `tracestate` passed on as it came when it is printable ASCII within
/// [`MAX_TRACE_STATE`]; dropped otherwise (never an error for the request).
pub fn usable_trace_state(value: &[u8]) -> Option<&str> {
    (!value.is_empty() && value.len() <= MAX_TRACE_STATE && value.iter().all(|&b| (0x20..0x7f).contains(&b)))
        .then(|| std::str::from_utf8(value).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_reads_back_as_it_was_written() {
        let parent = parse_traceparent(GOOD.as_bytes()).unwrap();
        assert_eq!(parent.span_id, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
        assert!(parent.sampled);
        assert_eq!(parent.traceparent(), GOOD);
        let unsampled = GOOD.replace("-01", "-00");
        assert!(!parse_traceparent(unsampled.as_bytes()).unwrap().sampled);
    }

    #[test]
    fn hex_digits_are_those_of_a_plain_formatter() {
        let mut value = 0x0123_4567_89ab_cdef_u64;
        for _ in 0..1_000 {
            assert_eq!(std::str::from_utf8(&hex(&value.to_be_bytes())).unwrap(), format!("{value:016x}"));
            value = value.rotate_left(7) ^ value.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
        for value in [0, u64::MAX, 0xa0a0_a0a0_a0a0_a0a0, 0x9999_9999_9999_9999] {
            assert_eq!(std::str::from_utf8(&hex(&value.to_be_bytes())).unwrap(), format!("{value:016x}"));
        }
    }

    #[test]
    fn invalid_traceparents_start_a_trace_of_their_own() {
        let cases = [
            ("", "empty"),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", "no flags"),
            ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "version ff"),
            ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", "all-zero trace id"),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "all-zero span id"),
            ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "upper-case hex"),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", "version 00 with more"),
            ("00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "wrong separator"),
            ("00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", "not hex"),
            ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", "later version, no dash after"),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g", "flags not hex"),
            ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0", "later version, too short"),
        ];
        for (value, why) in cases {
            assert_eq!(parse_traceparent(value.as_bytes()), None, "{why}");
        }
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more-fields";
        assert!(parse_traceparent(later.as_bytes()).is_some(), "a later version's extra fields are ignored");
    }

    #[test]
    fn trace_state_is_passed_on_only_when_printable_and_short() {
        assert_eq!(
            usable_trace_state(b"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
        );
        assert_eq!(usable_trace_state(&vec![b'a'; MAX_TRACE_STATE + 1]), None);
        assert_eq!(usable_trace_state(b"a=b\nc=d"), None);
        assert_eq!(usable_trace_state(b""), None);
    }
}
