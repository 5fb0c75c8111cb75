//! JSON and decimal text written and read by hand, without serde or `fmt`,
//! on the paths every request or refusal takes: the access line, the
//! error bodies of every dialect, the upstream request's `Content-Length`, and
//! the counts read from request and response bodies.

/// `value` in decimal digits (two at a time, from a table: the digit-by-digit
/// loop was about 100 instructions a number, six numbers an access line).
pub fn decimal(value: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
}

/// The value of a JSON number's `text` when it is a non-negative integer
/// that fits a `u64`: digits only, no sign, fraction or exponent.
pub fn non_negative_integer(text: &[u8]) -> Option<u64> {
    if text.is_empty() {
        return None;
    }
    text.iter().try_fold(0_u64, |value, &byte| {
        let digit = byte.checked_sub(b'0').filter(|digit| *digit <= 9)?;
        value.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// `text` as a JSON string (quotes, backslashes and control characters escaped).
pub fn json_string(text: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = text.as_bytes();
    if !needs_escape(bytes) {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    let mut start = 0;
    for (at, &byte) in bytes.iter().enumerate() {
        let escaped: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f | 0x7f => &[b'\\', b'u', b'0', b'0', HEX[usize::from(byte >> 4)], HEX[usize::from(byte & 0xf)]],
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..at]);
        out.extend_from_slice(escaped);
        start = at + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// Whether `bytes` hold a control character, `"` or `\`: eight bytes at
/// a time, as most of what is written (ids, paths, names) has none.
fn needs_escape(bytes: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH_BITS: u64 = 0x8080_8080_8080_8080;
    // Some byte of `word` is below `n` (n ≤ 128); exact as to whether any is.
    let any_below = |word: u64, n: u8| word.wrapping_sub(ONES * u64::from(n)) & !word & HIGH_BITS != 0;
    let any_equal = |word: u64, byte: u8| any_below(word ^ (ONES * u64::from(byte)), 1);
    let (words, rest) = bytes.as_chunks::<8>();
    words
        .iter()
        .map(|word| u64::from_le_bytes(*word))
        .any(|word| any_below(word, 0x20) || any_equal(word, b'"') || any_equal(word, b'\\') || any_equal(word, 0x7f))
        || rest.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\' || b == 0x7f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_from_zero_to_the_largest() {
        let mut out = Vec::new();
        decimal(0, &mut out);
        out.push(b' ');
        decimal(u64::MAX, &mut out);
        assert_eq!(String::from_utf8(out).unwrap(), format!("0 {}", u64::MAX));
    }

    /// What the standard parser takes as a `u64` from JSON number text, and
    /// nothing else.
    #[test]
    fn non_negative_integers_as_the_standard_parser_reads_them() {
        let max = u64::MAX.to_string();
        let over = "18446744073709551616";
        for text in ["0", "7", "42", "007", max.as_str(), over, "", "-1", "1.5", "1e3", "-0", "12a", " 1"] {
            let expected = text.parse::<u64>().ok();
            assert_eq!(non_negative_integer(text.as_bytes()), expected, "{text:?}");
        }
        // JSON has no plus sign; the standard parser would take one.
        assert_eq!(non_negative_integer(b"+5"), None);
    }

    #[test]
    fn hostile_text_stays_one_json_string() {
        let hostile = "a\"b\\c\nd\r\u{1}\u{7f}é";
        let mut out = Vec::new();
        json_string(hostile, &mut out);
        let parsed: String = serde_json::from_slice(&out).unwrap();
        assert_eq!(parsed, hostile);
        assert!(!out.contains(&b'\n'));
    }

    #[test]
    fn escapes_are_found_at_every_position() {
        for special in [0_u8, 0x1f, b'"', b'\\', 0x7f] {
            for length in 1..20 {
                for at in 0..length {
                    let mut text = vec![b'a'; length];
                    text[at] = special;
                    assert!(needs_escape(&text), "{special:#x} at {at} of {length}");
                }
            }
        }
        for clean in ["", "req-1", "/v1/chat/completions", "team-a/alice", "é ~ !#$%&'()*+,-./09:;<=>?@AZ[]^_`az{|}"] {
            assert!(!needs_escape(clean.as_bytes()), "{clean}");
        }
    }
}
