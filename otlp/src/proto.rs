//! OTLP/HTTP protobuf bodies (`ExportTraceServiceRequest` for
//! `/v1/traces`, `ExportLogsServiceRequest` for `/v1/logs`), written by
//! hand: the few messages waycast sends are a page of field numbers
//! (opentelemetry-proto's `trace.proto`, `logs.proto`, `common.proto`,
//! `resource.proto`), and the SDK crates would have added an HTTP client
//! and a runtime of their own.
//!
//! A span or record is encoded where it ends (a gateway request, an
//! operator reconcile), straight into one buffer (no value of theirs is
//! copied into a struct first): an attribute's length is computed before it
//! is written, and a message whose length is not known up front (a span) is
//! written in place and its length put in front of it after. The exporter
//! only wraps what was encoded into the resource and scope. The tests decode
//! what is written with an independent decoder ([`crate::wire`]), and a real
//! collector reads it in the gateway's and the operator's tests.

/// Who sends: the resource's attributes and the instrumentation scope.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Source {
    /// The resource's attributes (`service.name` first).
    pub resource: Vec<(String, String)>,
    /// The instrumentation scope's name.
    pub scope_name: &'static str,
    /// The instrumentation scope's version.
    pub scope_version: &'static str,
}

/// `Span.SpanKind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// `SPAN_KIND_INTERNAL`: work of the process's own (an operator's reconcile).
    Internal = 1,
    /// `SPAN_KIND_SERVER`.
    Server = 2,
    /// `SPAN_KIND_CLIENT`.
    Client = 3,
}

/// A span's fields but its attributes.
pub struct SpanHead<'a> {
    /// The trace (16 bytes, never all zero).
    pub trace_id: &'a [u8; 16],
    /// The span (8 bytes, never all zero).
    pub span_id: &'a [u8; 8],
    /// The parent span, when it has one.
    pub parent_span_id: Option<&'a [u8; 8]>,
    /// The W3C `tracestate` passed on, when there is one.
    pub trace_state: Option<&'a str>,
    /// The name, in two parts joined by a space (`chat` `llama`).
    pub name: (&'a str, &'a str),
    /// What kind of span.
    pub kind: SpanKind,
    /// When it started, in nanoseconds since the Unix epoch.
    pub start_unix_nanos: u64,
    /// When it ended, in nanoseconds since the Unix epoch.
    pub end_unix_nanos: u64,
    /// Events without attributes: (when, name).
    pub events: &'a [(u64, &'static str)],
    /// An error's message (`STATUS_CODE_ERROR`), or `None` (unset).
    pub error: Option<&'a str>,
}

/// A log record's fields but its attributes (`SEVERITY_NUMBER_INFO`).
pub struct RecordHead<'a> {
    /// When, in nanoseconds since the Unix epoch.
    pub time_unix_nanos: u64,
    /// The event's name (`waycast.usage`).
    pub event_name: &'static str,
    /// The body, a string.
    pub body: &'a str,
    /// The trace and span it belongs to, when it was traced.
    pub trace: Option<(&'a [u8; 16], &'a [u8; 8])>,
}

/// The attributes of a message being written (repeated `KeyValue` at
/// `field`).
///
/// Each kind of value has a short path, taken whenever every length fits
/// in one byte (keys are literals of at most some 40 bytes; model names,
/// request ids and key names are short): the field's head (tags, lengths,
/// key) is put together on the stack and goes out in one fixed-size copy,
/// a text value in a second. Always inlined, so a literal key's length is
/// a constant and every copy a few moves (a call cost some 40 instructions
/// of its own, and a `memcpy` for the key). The general path (a varint
/// loop and a growing write per part) cost about 150 instructions an
/// attribute, the short one about 30.
pub struct Attributes<'a> {
    out: &'a mut Vec<u8>,
    /// `field << 3 | 2` (the fields used are under 16: one byte).
    tag: u8,
}

/// Keys of at most this many bytes take the short paths (the gateway's and
/// the operator's are literals of at most 36).
const SHORT_KEY: usize = 40;

impl Attributes<'_> {
    /// A `string_value`.
    #[inline(always)]
    pub fn text(&mut self, key: &str, value: &str) {
        let (k, v) = (key.len(), value.len());
        // `KeyValue` is 6 + k + v bytes: one length byte up to 127.
        if k <= SHORT_KEY && k + v <= 121 {
            let mut head = self.head(key, 6 + k + v, 2 + v, 1 << 3 | 2);
            head[7 + k] = v as u8;
            self.out.extend_from_slice(&head[..8 + k]);
            self.out.extend_from_slice(value.as_bytes());
        } else {
            let any = 1 + varint_len(v as u64) + v;
            self.key_value(key, any, |out| bytes_field(out, 1, value.as_bytes()));
        }
    }

    /// An `int_value` (counts beyond `i64` saturate).
    #[inline(always)]
    pub fn int(&mut self, key: &str, value: u64) {
        let value = value.min(i64::MAX as u64);
        let k = key.len();
        if k <= SHORT_KEY {
            // The varint (n bytes, at most 9) after the head, then the
            // lengths it makes (`KeyValue` is 5 + k + n bytes); the whole
            // head goes out and is cut to length.
            let mut head = self.head(key, 0, 0, 3 << 3);
            let (mut n, mut rest) = (0, value);
            while rest >= 0x80 {
                head[7 + k + n] = (rest as u8) | 0x80;
                rest >>= 7;
                n += 1;
            }
            head[7 + k + n] = rest as u8;
            n += 1;
            head[1] = (5 + k + n) as u8;
            head[5 + k] = (1 + n) as u8;
            let start = self.out.len();
            self.out.extend_from_slice(&head[..17 + k]);
            self.out.truncate(start + 7 + k + n);
        } else {
            self.key_value(key, 1 + varint_len(value), |out| varint_field(out, 3, value));
        }
    }

    /// A `bool_value`.
    #[inline(always)]
    pub fn flag(&mut self, key: &str, value: bool) {
        let k = key.len();
        if k <= SHORT_KEY {
            let mut head = self.head(key, 6 + k, 2, 2 << 3);
            head[7 + k] = u8::from(value);
            self.out.extend_from_slice(&head[..8 + k]);
        } else {
            self.key_value(key, 2, |out| varint_field(out, 2, u64::from(value)));
        }
    }

    /// A `double_value`.
    #[inline(always)]
    pub fn double(&mut self, key: &str, value: f64) {
        let k = key.len();
        if k <= SHORT_KEY {
            let mut head = self.head(key, 13 + k, 9, 4 << 3 | 1);
            head[7 + k..15 + k].copy_from_slice(&value.to_le_bytes());
            self.out.extend_from_slice(&head[..15 + k]);
        } else {
            self.key_value(key, 9, |out| fixed64_field(out, 4, value.to_bits()));
        }
    }

    /// The start of a short `KeyValue` of `key_value` bytes whose
    /// `AnyValue` is `any` bytes, its value field's tag `kind` (bytes up to
    /// `7 + key.len()`), on the stack: the caller adds the value and copies
    /// it out in one fixed-size copy (a literal key makes every offset a
    /// constant) instead of one growing write per part.
    #[inline(always)]
    fn head(&self, key: &str, key_value: usize, any: usize, kind: u8) -> [u8; 64] {
        let k = key.len();
        let mut head = [0_u8; 64];
        head[..4].copy_from_slice(&[self.tag, key_value as u8, 1 << 3 | 2, k as u8]);
        head[4..4 + k].copy_from_slice(key.as_bytes());
        head[4 + k..7 + k].copy_from_slice(&[2 << 3 | 2, any as u8, kind]);
        head
    }

    /// Entries written before by [`span_attributes`] (into a span) or
    /// [`record_attributes`] (into a log record), copied in as they are:
    /// what does not change from one message to the next is encoded once.
    pub fn encoded(&mut self, entries: &[u8]) {
        debug_assert!(entries.first().is_none_or(|&tag| tag == self.tag), "entries of this kind of message");
        self.out.extend_from_slice(entries);
    }

    /// `KeyValue { key = 1; value = 2 (AnyValue of `any` bytes) }`, any
    /// lengths.
    fn key_value(&mut self, key: &str, any: usize, value: impl FnOnce(&mut Vec<u8>)) {
        let key_value = 1 + varint_len(key.len() as u64) + key.len() + 1 + varint_len(any as u64) + any;
        let out = &mut *self.out;
        out.push(self.tag);
        varint(out, key_value as u64);
        bytes_field(out, 1, key.as_bytes());
        varint(out, 2 << 3 | 2);
        varint(out, any as u64);
        value(out);
    }
}

/// Appends a span's attributes (`Span.attributes` entries) to `out`, on
/// their own, for [`Attributes::encoded`].
pub fn span_attributes(out: &mut Vec<u8>, attributes: impl FnOnce(&mut Attributes<'_>)) {
    attributes(&mut Attributes { out, tag: 9 << 3 | 2 });
}

/// Appends a log record's attributes (`LogRecord.attributes` entries) to
/// `out`, on their own, for [`Attributes::encoded`].
pub fn record_attributes(out: &mut Vec<u8>, attributes: impl FnOnce(&mut Attributes<'_>)) {
    attributes(&mut Attributes { out, tag: 6 << 3 | 2 });
}

/// Appends a span, as a `ScopeSpans.spans` entry (field 2), to `out`.
///
/// The fixed-size fields go out as whole arrays (the ids; the kind and
/// the times), each one copy.
pub fn span(out: &mut Vec<u8>, head: &SpanHead<'_>, attributes: impl FnOnce(&mut Attributes<'_>)) {
    nested(out, 2, |out| {
        let mut ids = [0_u8; 28];
        ids[..2].copy_from_slice(&[1 << 3 | 2, 16]);
        ids[2..18].copy_from_slice(head.trace_id);
        ids[18..20].copy_from_slice(&[2 << 3 | 2, 8]);
        ids[20..].copy_from_slice(head.span_id);
        out.extend_from_slice(&ids);
        if let Some(state) = head.trace_state {
            bytes_field(out, 3, state.as_bytes());
        }
        if let Some(parent) = head.parent_span_id {
            let mut field = [4 << 3 | 2, 8, 0, 0, 0, 0, 0, 0, 0, 0];
            field[2..].copy_from_slice(parent);
            out.extend_from_slice(&field);
        }
        let (first, second) = head.name;
        let name = first.len() + 1 + second.len();
        if name < 0x80 {
            out.extend_from_slice(&[5 << 3 | 2, name as u8]);
        } else {
            out.push(5 << 3 | 2);
            varint(out, name as u64);
        }
        out.extend_from_slice(first.as_bytes());
        out.push(b' ');
        out.extend_from_slice(second.as_bytes());
        let mut times = [0_u8; 20];
        times[..2].copy_from_slice(&[6 << 3, head.kind as u8]);
        times[2..11].copy_from_slice(&fixed64(7 << 3 | 1, head.start_unix_nanos));
        times[11..].copy_from_slice(&fixed64(8 << 3 | 1, head.end_unix_nanos));
        out.extend_from_slice(&times);
        attributes(&mut Attributes { out, tag: 9 << 3 | 2 });
        for (at, name) in head.events {
            if name.len() < 0x74 {
                // `Event { time = 1; name = 2 }`, its head in one copy.
                let mut event = [0_u8; 13];
                event[..2].copy_from_slice(&[11 << 3 | 2, (11 + name.len()) as u8]);
                event[2..11].copy_from_slice(&fixed64(1 << 3 | 1, *at));
                event[11..].copy_from_slice(&[2 << 3 | 2, name.len() as u8]);
                out.extend_from_slice(&event);
                out.extend_from_slice(name.as_bytes());
            } else {
                out.push(11 << 3 | 2);
                varint(out, (9 + 1 + varint_len(name.len() as u64) + name.len()) as u64);
                fixed64_field(out, 1, *at);
                bytes_field(out, 2, name.as_bytes());
            }
        }
        if let Some(error) = head.error {
            out.push(15 << 3 | 2);
            varint(out, (1 + varint_len(error.len() as u64) + error.len() + 2) as u64);
            bytes_field(out, 2, error.as_bytes());
            out.extend_from_slice(&[3 << 3, 2]);
        }
    });
}

/// Appends a log record, as a `ScopeLogs.log_records` entry (field 2).
pub fn record(out: &mut Vec<u8>, head: &RecordHead<'_>, attributes: impl FnOnce(&mut Attributes<'_>)) {
    nested(out, 2, |out| {
        // time, severity number 9, severity text "INFO".
        let mut start = [0_u8; 17];
        start[..9].copy_from_slice(&fixed64(1 << 3 | 1, head.time_unix_nanos));
        start[9..].copy_from_slice(&[2 << 3, 9, 3 << 3 | 2, 4, b'I', b'N', b'F', b'O']);
        out.extend_from_slice(&start);
        // body: `AnyValue { string_value = 1 }`.
        let body = head.body.len();
        if body < 0x7e {
            out.extend_from_slice(&[5 << 3 | 2, (2 + body) as u8, 1 << 3 | 2, body as u8]);
            out.extend_from_slice(head.body.as_bytes());
        } else {
            out.push(5 << 3 | 2);
            varint(out, (1 + varint_len(body as u64) + body) as u64);
            bytes_field(out, 1, head.body.as_bytes());
        }
        attributes(&mut Attributes { out, tag: 6 << 3 | 2 });
        if let Some((trace_id, span_id)) = head.trace {
            // flags (sampled), trace id, span id.
            let mut trace = [0_u8; 33];
            trace[..7].copy_from_slice(&[8 << 3 | 5, 1, 0, 0, 0, 9 << 3 | 2, 16]);
            trace[7..23].copy_from_slice(trace_id);
            trace[23..25].copy_from_slice(&[10 << 3 | 2, 8]);
            trace[25..].copy_from_slice(span_id);
            out.extend_from_slice(&trace);
        }
        // observed time, event name.
        let event = head.event_name.len();
        if event < 0x80 {
            let mut observed = [0_u8; 11];
            observed[..9].copy_from_slice(&fixed64(11 << 3 | 1, head.time_unix_nanos));
            observed[9..].copy_from_slice(&[12 << 3 | 2, event as u8]);
            out.extend_from_slice(&observed);
            out.extend_from_slice(head.event_name.as_bytes());
        } else {
            out.extend_from_slice(&fixed64(11 << 3 | 1, head.time_unix_nanos));
            bytes_field(out, 12, head.event_name.as_bytes());
        }
    });
}

/// `ExportTraceServiceRequest` with one resource and one scope, around
/// spans [`span`] encoded (in parts, each one or more entries).
pub fn traces(source: &Source, parts: &[&[u8]]) -> Vec<u8> {
    request(source, parts)
}

/// `ExportLogsServiceRequest` with one resource and one scope, around
/// records [`record`] encoded.
pub fn logs(source: &Source, parts: &[&[u8]]) -> Vec<u8> {
    request(source, parts)
}

/// The two requests have one shape: field 1 (`resource_spans` /
/// `resource_logs`) of { resource = 1, `scope_spans` / `scope_logs` = 2 of
/// { scope = 1, entries = 2 } }. The lengths are added up first, so each
/// entry is copied once, into place.
fn request(source: &Source, parts: &[&[u8]]) -> Vec<u8> {
    let mut resource = Vec::new();
    let mut attributes = Attributes { out: &mut resource, tag: 1 << 3 | 2 };
    for (key, value) in &source.resource {
        attributes.text(key, value);
    }
    let mut scope = Vec::new();
    bytes_field(&mut scope, 1, source.scope_name.as_bytes());
    bytes_field(&mut scope, 2, source.scope_version.as_bytes());
    let field_len = |len: usize| 1 + varint_len(len as u64) + len;
    let scoped = field_len(scope.len()) + parts.iter().map(|part| part.len()).sum::<usize>();
    let resourced = field_len(resource.len()) + field_len(scoped);
    let mut out = Vec::with_capacity(field_len(resourced));
    varint(&mut out, 1 << 3 | 2);
    varint(&mut out, resourced as u64);
    bytes_field(&mut out, 1, &resource);
    varint(&mut out, 2 << 3 | 2);
    varint(&mut out, scoped as u64);
    bytes_field(&mut out, 1, &scope);
    for part in parts {
        out.extend_from_slice(part);
    }
    out
}

/// A message whose length is known once written: two bytes are kept
/// for its length, which most (spans and records, 128 bytes to 16 KiB)
/// fill exactly; a shorter or longer one is moved once its length is
/// known.
fn nested(out: &mut Vec<u8>, field: u8, write: impl FnOnce(&mut Vec<u8>)) {
    // The tag (fields under 16: one byte), the two bytes kept.
    out.extend_from_slice(&[field << 3 | 2, 0, 0]);
    let start = out.len() - 2;
    write(out);
    let end = out.len();
    let len = end - start - 2;
    if (0x80..0x4000).contains(&len) {
        out[start..start + 2].copy_from_slice(&[(len as u8) | 0x80, (len >> 7) as u8]);
        return;
    }
    let (mut prefix, mut written, mut value) = ([0_u8; 10], 0, len);
    while value >= 0x80 {
        prefix[written] = (value as u8) | 0x80;
        value >>= 7;
        written += 1;
    }
    prefix[written] = value as u8;
    written += 1;
    if written == 1 {
        out.copy_within(start + 2..end, start + 1);
        out.truncate(end - 1);
    } else {
        out.resize(end + written - 2, 0);
        out.copy_within(start + 2..end, start + written);
    }
    out[start..start + written].copy_from_slice(&prefix[..written]);
}

#[inline]
fn bytes_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    varint(out, u64::from(field) << 3 | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn varint_field(out: &mut Vec<u8>, field: u32, value: u64) {
    varint(out, u64::from(field) << 3);
    varint(out, value);
}

fn fixed64_field(out: &mut Vec<u8>, field: u32, value: u64) {
    varint(out, u64::from(field) << 3 | 1);
    out.extend_from_slice(&value.to_le_bytes());
}

/// A fixed64 field of a one-byte `tag`, as one array (one copy).
#[inline]
fn fixed64(tag: u8, value: u64) -> [u8; 9] {
    let mut field = [tag; 9];
    field[1..].copy_from_slice(&value.to_le_bytes());
    field
}

#[inline]
fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Bytes of `value` as a varint.
#[inline]
fn varint_len(value: u64) -> usize {
    (64 - value.leading_zeros() as usize).max(1).div_ceil(7)
}

#[cfg(test)]
#[path = "proto_tests.rs"]
mod tests;
