//! OTLP/HTTP protobuf bodies (`ExportTraceServiceRequest` for
//! `/v1/traces`, `ExportLogsServiceRequest` for `/v1/logs`), written by
//! hand: the few messages the gateway sends are a page of field numbers
//! (opentelemetry-proto's `trace.proto`, `logs.proto`, `common.proto`,
//! `resource.proto`), and the SDK crates would have added an HTTP client
//! and a runtime of their own. The tests decode what is written with an
//! independent decoder, and the e2e run has a real collector read it.

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `string_value`.
    Text(String),
    /// `int_value`.
    Int(i64),
    /// `bool_value`.
    Bool(bool),
    /// `double_value`.
    Double(f64),
}

impl From<&str> for Value {
    fn from(text: &str) -> Self {
        Self::Text(text.to_owned())
    }
}
impl From<String> for Value {
    fn from(text: String) -> Self {
        Self::Text(text)
    }
}
impl From<u64> for Value {
    fn from(count: u64) -> Self {
        Self::Int(i64::try_from(count).unwrap_or(i64::MAX))
    }
}
impl From<bool> for Value {
    fn from(flag: bool) -> Self {
        Self::Bool(flag)
    }
}
impl From<f64> for Value {
    fn from(number: f64) -> Self {
        Self::Double(number)
    }
}

/// Attributes: names are the conventions' own (static), values anything.
pub type Attributes = Vec<(&'static str, Value)>;

/// `Span.SpanKind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// `SPAN_KIND_INTERNAL`.
    Internal = 1,
    /// `SPAN_KIND_SERVER`.
    Server = 2,
    /// `SPAN_KIND_CLIENT`.
    Client = 3,
}

/// A finished span.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent_span_id: Option<[u8; 8]>,
    pub trace_state: Option<String>,
    pub name: String,
    pub kind: SpanKind,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    pub attributes: Attributes,
    /// (when, name, attributes).
    pub events: Vec<(u64, &'static str, Attributes)>,
    /// An error's message (`STATUS_CODE_ERROR`), or `None` (unset).
    pub error: Option<String>,
}

/// A log record (`SEVERITY_NUMBER_INFO`).
#[derive(Debug, Clone, PartialEq)]
pub struct LogRecord {
    pub time_unix_nanos: u64,
    /// The event's name (`event_name`).
    pub event_name: &'static str,
    pub body: Value,
    pub attributes: Attributes,
    /// The trace and span it belongs to, when it was traced.
    pub trace: Option<([u8; 16], [u8; 8])>,
}

/// Who sends: the resource's attributes and the instrumentation scope.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Source {
    pub resource: Vec<(String, Value)>,
    pub scope_name: &'static str,
    pub scope_version: &'static str,
}

/// `ExportTraceServiceRequest` with one resource and one scope.
pub fn traces(source: &Source, spans: &[Span]) -> Vec<u8> {
    let mut scope_spans = Vec::new();
    message(&mut scope_spans, 1, |out| scope(out, source));
    for span in spans {
        message(&mut scope_spans, 2, |out| write_span(out, span));
    }
    let mut resource_spans = Vec::new();
    message(&mut resource_spans, 1, |out| resource(out, source));
    bytes_field(&mut resource_spans, 2, &scope_spans);
    let mut request = Vec::with_capacity(resource_spans.len() + 8);
    bytes_field(&mut request, 1, &resource_spans);
    request
}

/// `ExportLogsServiceRequest` with one resource and one scope.
pub fn logs(source: &Source, records: &[LogRecord]) -> Vec<u8> {
    let mut scope_logs = Vec::new();
    message(&mut scope_logs, 1, |out| scope(out, source));
    for record in records {
        message(&mut scope_logs, 2, |out| write_log(out, record));
    }
    let mut resource_logs = Vec::new();
    message(&mut resource_logs, 1, |out| resource(out, source));
    bytes_field(&mut resource_logs, 2, &scope_logs);
    let mut request = Vec::with_capacity(resource_logs.len() + 8);
    bytes_field(&mut request, 1, &resource_logs);
    request
}

fn resource(out: &mut Vec<u8>, source: &Source) {
    for (key, value) in &source.resource {
        message(out, 1, |out| key_value(out, key, value));
    }
}

fn scope(out: &mut Vec<u8>, source: &Source) {
    bytes_field(out, 1, source.scope_name.as_bytes());
    bytes_field(out, 2, source.scope_version.as_bytes());
}

fn write_span(out: &mut Vec<u8>, span: &Span) {
    bytes_field(out, 1, &span.trace_id);
    bytes_field(out, 2, &span.span_id);
    if let Some(state) = &span.trace_state {
        bytes_field(out, 3, state.as_bytes());
    }
    if let Some(parent) = &span.parent_span_id {
        bytes_field(out, 4, parent);
    }
    bytes_field(out, 5, span.name.as_bytes());
    varint_field(out, 6, span.kind as u64);
    fixed64_field(out, 7, span.start_unix_nanos);
    fixed64_field(out, 8, span.end_unix_nanos);
    for (key, value) in &span.attributes {
        message(out, 9, |out| key_value(out, key, value));
    }
    for (at, name, attributes) in &span.events {
        message(out, 11, |out| {
            fixed64_field(out, 1, *at);
            bytes_field(out, 2, name.as_bytes());
            for (key, value) in attributes {
                message(out, 3, |out| key_value(out, key, value));
            }
        });
    }
    if let Some(error) = &span.error {
        message(out, 15, |out| {
            bytes_field(out, 2, error.as_bytes());
            varint_field(out, 3, 2);
        });
    }
}

fn write_log(out: &mut Vec<u8>, record: &LogRecord) {
    fixed64_field(out, 1, record.time_unix_nanos);
    // SEVERITY_NUMBER_INFO.
    varint_field(out, 2, 9);
    bytes_field(out, 3, b"INFO");
    message(out, 5, |out| any_value(out, &record.body));
    for (key, value) in &record.attributes {
        message(out, 6, |out| key_value(out, key, value));
    }
    if let Some((trace_id, span_id)) = &record.trace {
        bytes_field(out, 9, trace_id);
        bytes_field(out, 10, span_id);
    }
    fixed64_field(out, 11, record.time_unix_nanos);
    bytes_field(out, 12, record.event_name.as_bytes());
}

fn key_value(out: &mut Vec<u8>, key: &str, value: &Value) {
    bytes_field(out, 1, key.as_bytes());
    message(out, 2, |out| any_value(out, value));
}

fn any_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Text(text) => bytes_field(out, 1, text.as_bytes()),
        Value::Bool(flag) => varint_field(out, 2, u64::from(*flag)),
        // int64 is a varint of the two's complement.
        Value::Int(number) => varint_field(out, 3, *number as u64),
        Value::Double(number) => {
            out.push(4 << 3 | 1);
            out.extend_from_slice(&number.to_le_bytes());
        }
    }
}

/// A nested message: written after its length, which is only known once
/// it is (a scratch buffer; export runs off the request path).
fn message(out: &mut Vec<u8>, field: u32, write: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = Vec::new();
    write(&mut inner);
    bytes_field(out, field, &inner);
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

#[cfg(test)]
#[path = "otlp_tests.rs"]
mod tests;
