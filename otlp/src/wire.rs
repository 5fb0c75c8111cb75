//! An independent reading of the protobuf wire format, for tests: what
//! [`crate::proto`] writes is decoded here field by field, so the encoder
//! is never checked against itself. The gateway's and the operator's tests
//! decode their spans with it. Not for input from outside: it panics on
//! anything malformed (a test's loud failure).

#![allow(clippy::unwrap_used, reason = "a test's decoder: it fails loudly on anything unexpected")]
#![allow(clippy::panic, reason = "a test's decoder: it fails loudly on anything unexpected")]

/// A protobuf field as the wire has it: a number or bytes (nested
/// messages are decoded again from their bytes). An independent reading
/// of the wire format, so that the encoder is not checked against itself.
#[derive(Debug, Clone, PartialEq)]
pub enum Wire {
    /// A varint (wire type 0).
    Varint(u64),
    /// An `AnyValue.bool_value` (told apart from an int in `attributes`).
    Flag(u64),
    /// 8 bytes (wire type 1).
    Fixed64(u64),
    /// 4 bytes (wire type 5).
    Fixed32(u32),
    /// Length-delimited bytes (wire type 2): text, ids, nested messages.
    Bytes(Vec<u8>),
}

/// The varint at `at`, moving `at` past it.
pub fn read_varint(bytes: &[u8], at: &mut usize) -> u64 {
    let (mut value, mut shift) = (0_u64, 0);
    loop {
        let byte = bytes[*at];
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return value;
        }
        shift += 7;
    }
}

/// Every field of a message, in order (field number, value).
pub fn decode(bytes: &[u8]) -> Vec<(u64, Wire)> {
    let (mut fields, mut at) = (Vec::new(), 0);
    while at < bytes.len() {
        let tag = read_varint(bytes, &mut at);
        let value = match tag & 7 {
            0 => Wire::Varint(read_varint(bytes, &mut at)),
            1 => {
                let value = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
                at += 8;
                Wire::Fixed64(value)
            }
            2 => {
                let len = usize::try_from(read_varint(bytes, &mut at)).unwrap();
                let value = bytes[at..at + len].to_vec();
                at += len;
                Wire::Bytes(value)
            }
            5 => {
                let value = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
                at += 4;
                Wire::Fixed32(value)
            }
            other => panic!("wire type {other} is not written"),
        };
        fields.push((tag >> 3, value));
    }
    fields
}

/// Every value of `field` in a message.
pub fn all(bytes: &[u8], field: u64) -> Vec<Wire> {
    decode(bytes).into_iter().filter(|(f, _)| *f == field).map(|(_, v)| v).collect()
}

/// The one value of `field` (panics when it is absent or repeated).
pub fn one(bytes: &[u8], field: u64) -> Wire {
    let mut found = all(bytes, field);
    assert_eq!(found.len(), 1, "field {field} once in {:?}", decode(bytes));
    found.remove(0)
}

/// A length-delimited value's bytes (panics on any other).
pub fn bytes_of(wire: Wire) -> Vec<u8> {
    match wire {
        Wire::Bytes(bytes) => bytes,
        other => panic!("not bytes: {other:?}"),
    }
}

/// The one value of `field`, as UTF-8 text.
pub fn text(bytes: &[u8], field: u64) -> String {
    String::from_utf8(bytes_of(one(bytes, field))).unwrap()
}

/// The attributes of a message (repeated KeyValue at `field`) by key.
pub fn attributes(bytes: &[u8], field: u64) -> Vec<(String, Wire)> {
    all(bytes, field)
        .into_iter()
        .map(|kv| {
            let kv = bytes_of(kv);
            let value = decode(&bytes_of(one(&kv, 2)));
            assert_eq!(value.len(), 1, "one of AnyValue's fields");
            let (number, wire) = value.into_iter().next().unwrap();
            let wire = match (number, wire) {
                (1, Wire::Bytes(text)) => Wire::Bytes(text),
                (2, Wire::Varint(n)) => Wire::Flag(n),
                (3, Wire::Varint(n)) => Wire::Varint(n),
                (4, Wire::Fixed64(n)) => Wire::Fixed64(n),
                other => panic!("unexpected AnyValue {other:?}"),
            };
            (text(&kv, 1), wire)
        })
        .collect()
}

/// The value of attribute `key` among a message's attributes at `field`.
pub fn attribute(bytes: &[u8], field: u64, key: &str) -> Option<Wire> {
    attributes(bytes, field).into_iter().find(|(k, _)| k == key).map(|(_, v)| v)
}
