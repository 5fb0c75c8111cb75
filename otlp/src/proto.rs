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
pub struct Attributes<'a> {
    out: &'a mut Vec<u8>,
    field: u32,
}

impl Attributes<'_> {
    /// A `string_value`.
    pub fn text(&mut self, key: &str, value: &str) {
        let any = 1 + varint_len(value.len() as u64) + value.len();
        self.key_value(key, any, |out| bytes_field(out, 1, value.as_bytes()));
    }

    /// An `int_value` (counts beyond `i64` saturate).
    pub fn int(&mut self, key: &str, value: u64) {
        let value = i64::try_from(value).unwrap_or(i64::MAX);
        let any = 1 + varint_len(value as u64);
        self.key_value(key, any, |out| varint_field(out, 3, value as u64));
    }

    /// A `bool_value`.
    pub fn flag(&mut self, key: &str, value: bool) {
        self.key_value(key, 2, |out| varint_field(out, 2, u64::from(value)));
    }

    /// A `double_value`.
    pub fn double(&mut self, key: &str, value: f64) {
        self.key_value(key, 9, |out| {
            out.push(4 << 3 | 1);
            out.extend_from_slice(&value.to_le_bytes());
        });
    }

    /// `KeyValue { key = 1; value = 2 (AnyValue of `any` bytes) }`.
    fn key_value(&mut self, key: &str, any: usize, value: impl FnOnce(&mut Vec<u8>)) {
        let key_value = 1 + varint_len(key.len() as u64) + key.len() + 1 + varint_len(any as u64) + any;
        let out = &mut *self.out;
        varint(out, u64::from(self.field) << 3 | 2);
        varint(out, key_value as u64);
        bytes_field(out, 1, key.as_bytes());
        varint(out, 2 << 3 | 2);
        varint(out, any as u64);
        value(out);
    }
}

/// Appends a span, as a `ScopeSpans.spans` entry (field 2), to `out`.
pub fn span(out: &mut Vec<u8>, head: &SpanHead<'_>, attributes: impl FnOnce(&mut Attributes<'_>)) {
    nested(out, 2, |out| {
        bytes_field(out, 1, head.trace_id);
        bytes_field(out, 2, head.span_id);
        if let Some(state) = head.trace_state {
            bytes_field(out, 3, state.as_bytes());
        }
        if let Some(parent) = head.parent_span_id {
            bytes_field(out, 4, parent);
        }
        let (first, second) = head.name;
        varint(out, 5 << 3 | 2);
        varint(out, (first.len() + 1 + second.len()) as u64);
        out.extend_from_slice(first.as_bytes());
        out.push(b' ');
        out.extend_from_slice(second.as_bytes());
        varint_field(out, 6, head.kind as u64);
        fixed64_field(out, 7, head.start_unix_nanos);
        fixed64_field(out, 8, head.end_unix_nanos);
        attributes(&mut Attributes { out, field: 9 });
        for (at, name) in head.events {
            varint(out, 11 << 3 | 2);
            varint(out, (9 + 1 + varint_len(name.len() as u64) + name.len()) as u64);
            fixed64_field(out, 1, *at);
            bytes_field(out, 2, name.as_bytes());
        }
        if let Some(error) = head.error {
            varint(out, 15 << 3 | 2);
            varint(out, (1 + varint_len(error.len() as u64) + error.len() + 2) as u64);
            bytes_field(out, 2, error.as_bytes());
            varint_field(out, 3, 2);
        }
    });
}

/// Appends a log record, as a `ScopeLogs.log_records` entry (field 2).
pub fn record(out: &mut Vec<u8>, head: &RecordHead<'_>, attributes: impl FnOnce(&mut Attributes<'_>)) {
    nested(out, 2, |out| {
        fixed64_field(out, 1, head.time_unix_nanos);
        varint_field(out, 2, 9);
        bytes_field(out, 3, b"INFO");
        varint(out, 5 << 3 | 2);
        varint(out, (1 + varint_len(head.body.len() as u64) + head.body.len()) as u64);
        bytes_field(out, 1, head.body.as_bytes());
        attributes(&mut Attributes { out, field: 6 });
        if let Some((trace_id, span_id)) = head.trace {
            // flags: sampled.
            out.push(8 << 3 | 5);
            out.extend_from_slice(&1_u32.to_le_bytes());
            bytes_field(out, 9, trace_id);
            bytes_field(out, 10, span_id);
        }
        fixed64_field(out, 11, head.time_unix_nanos);
        bytes_field(out, 12, head.event_name.as_bytes());
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
    let mut attributes = Attributes { out: &mut resource, field: 1 };
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

/// A message whose length is known once written: written in place, then
/// its length put in front of it (most are under 128 bytes: one byte
/// moves them).
fn nested(out: &mut Vec<u8>, field: u32, write: impl FnOnce(&mut Vec<u8>)) {
    varint(out, u64::from(field) << 3 | 2);
    let start = out.len();
    write(out);
    let end = out.len();
    let mut prefix = [0_u8; 10];
    let written = {
        let mut value = (end - start) as u64;
        let mut at = 0;
        while value >= 0x80 {
            prefix[at] = (value as u8) | 0x80;
            value >>= 7;
            at += 1;
        }
        prefix[at] = value as u8;
        at + 1
    };
    out.resize(end + written, 0);
    out.copy_within(start..end, start + written);
    out[start..start + written].copy_from_slice(&prefix[..written]);
}

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

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Bytes of `value` as a varint.
fn varint_len(value: u64) -> usize {
    (64 - value.leading_zeros() as usize).max(1).div_ceil(7)
}

#[cfg(test)]
#[path = "proto_tests.rs"]
mod tests;
