//! JSON and decimal text written by hand, without serde or `fmt`, on the
//! paths every request or refusal takes: the access line, the
//! OpenAI-shaped error body and the upstream request's `Content-Length`.

/// `value` in decimal digits.
pub fn decimal(mut value: u64, out: &mut Vec<u8>) {
    let mut digits = [0_u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
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
