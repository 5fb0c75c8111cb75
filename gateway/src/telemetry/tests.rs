#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use http::HeaderValue;
use waycast_crds::telemetry::Ratio;

use super::*;

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn destination(adjust: impl FnOnce(&mut TelemetryConfig)) -> Arc<Destination> {
    let mut config = TelemetryConfig { endpoint: "http://collector:4318".into(), ..TelemetryConfig::default() };
    config.trust_client_trace_context = true;
    config.usage_logs = true;
    adjust(&mut config);
    Arc::new(Destination::of(&config).unwrap())
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(*name, HeaderValue::from_str(value).unwrap());
    }
    map
}

#[test]
fn off_without_a_destination() {
    assert!(start(None, &headers(&[("traceparent", PARENT)])).is_none());
}

#[test]
fn a_trusted_client_trace_is_continued_with_its_decision() {
    let on = destination(|config| config.sampling = Ratio(0.0));
    let trace = start(Some(&on), &headers(&[("traceparent", PARENT), ("tracestate", "rojo=1")])).unwrap();
    assert_eq!(trace.context.trace_id[..4], [0x4b, 0xf9, 0x2f, 0x35]);
    assert_eq!(trace.parent, Some([0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]));
    assert!(trace.context.sampled, "the client sampled it: the ratio does not apply");
    assert_eq!(trace.state.as_deref(), Some("rojo=1"));
    assert_ne!(trace.context.span_id, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7], "a span of its own");
}

#[test]
fn an_untrusted_or_doubled_or_bad_traceparent_starts_a_new_trace() {
    let distrusting = destination(|config| config.trust_client_trace_context = false);
    let trusting = destination(|_| {});
    let cases = [
        (&distrusting, headers(&[("traceparent", PARENT)]), "not trusted"),
        (&trusting, headers(&[("traceparent", PARENT), ("traceparent", PARENT)]), "two traceparents"),
        (&trusting, headers(&[("traceparent", "00-zz"), ("tracestate", "rojo=1")]), "not valid"),
    ];
    for (destination, headers, why) in cases {
        let trace = start(Some(destination), &headers).unwrap();
        assert_eq!(trace.parent, None, "{why}");
        assert_ne!(trace.context.trace_id[..4], [0x4b, 0xf9, 0x2f, 0x35], "{why}");
        assert_eq!(trace.state, None, "{why}: no tracestate without the parent it belongs to");
        assert!(trace.context.sampled, "{why}: sampled at the default ratio 1");
    }
}

#[test]
fn an_attempt_names_itself_upstream_and_is_recorded_with_its_retry() {
    let on = destination(|_| {});
    let mut trace = start(Some(&on), &headers(&[("traceparent", PARENT)])).unwrap();
    let first = trace.begin_attempt();
    let sent = first.traceparent.to_str().unwrap().to_owned();
    let parsed = trace_context::parse_traceparent(sent.as_bytes()).unwrap();
    assert_eq!((parsed.trace_id, parsed.span_id, parsed.sampled), (trace.context.trace_id, first.span_id, true));
    trace.end_attempt(first, "10.0.0.7:8000".into(), Some(503), None);
    trace.note_retry("status_503");
    let second = trace.begin_attempt();
    trace.end_attempt(second, "10.0.0.8:8000".into(), Some(200), None);
    assert_eq!(trace.attempts.len(), 2);
    assert_eq!((trace.attempts[0].retried, trace.attempts[1].retried), (Some("status_503"), None));
    assert_ne!(trace.attempts[0].span_id, trace.attempts[1].span_id);
}

fn done(now: Instant) -> Done<'static> {
    Done {
        wall: Duration::from_secs(1_800_000_000),
        started: now,
        ended: now + Duration::from_millis(500),
        first_byte: Some(now + Duration::from_millis(100)),
        method: "POST",
        path: "/v1/chat/completions",
        request_id: "req-1",
        model: "llama",
        key: "team-a/alice",
        tenant: Some("team-a"),
        class: None,
        queued: None,
        stream: true,
        status: 200,
        error: None,
        tokens: (12, 2, 5),
        max_tokens: Some(64),
        cost: Some(("0.000017".into(), "USD")),
        budgeted: false,
        endpoint: Some("10.0.0.8:8000".into()),
    }
}

#[test]
fn a_sampled_request_sends_its_spans_and_its_usage_record() {
    let on = destination(|_| {});
    let mut trace = start(Some(&on), &headers(&[("traceparent", PARENT)])).unwrap();
    let attempt = trace.begin_attempt();
    trace.end_attempt(attempt, "10.0.0.8:8000".into(), Some(200), None);
    let now = Instant::now();
    let items = items(&trace, &done(now));
    let [Item::Span(server), Item::Span(client), Item::Log(record)] = items.as_slice() else {
        panic!("a server span, an attempt span, a record");
    };
    assert_eq!(
        (server.kind, server.name.as_str(), server.parent_span_id),
        (SpanKind::Server, "chat llama", trace.parent)
    );
    assert_eq!(server.end_unix_nanos, 1_800_000_000_000_000_000);
    assert_eq!(server.start_unix_nanos, 1_800_000_000_000_000_000 - 500_000_000);
    assert_eq!(server.events, vec![(1_800_000_000_000_000_000 - 400_000_000, "gen_ai.first_token", Vec::new())]);
    let attribute =
        |span: &Span, name: &str| span.attributes.iter().find(|(key, _)| *key == name).map(|(_, v)| v.clone());
    assert_eq!(attribute(server, "gen_ai.usage.input_tokens"), Some(Value::Int(12)));
    assert_eq!(attribute(server, "gen_ai.usage.output_tokens"), Some(Value::Int(5)));
    assert_eq!(attribute(server, "gen_ai.request.max_tokens"), Some(Value::Int(64)));
    assert_eq!(attribute(server, "waycast.key"), Some(Value::from("team-a/alice")));
    assert_eq!(attribute(server, "waycast.cost"), Some(Value::from("0.000017")));
    assert_eq!((client.kind, client.parent_span_id), (SpanKind::Client, Some(trace.context.span_id)));
    assert_eq!(attribute(client, "server.address"), Some(Value::from("10.0.0.8")));
    assert_eq!(attribute(client, "server.port"), Some(Value::Int(8000)));
    assert_eq!(record.trace, Some((trace.context.trace_id, trace.context.span_id)));
    assert_eq!(record.body, Value::from("req-1"));
}

#[test]
fn an_unsampled_request_sends_its_usage_record_only_and_one_without_a_model_nothing() {
    let unsampled = destination(|config| config.sampling = Ratio(0.0));
    let trace = start(Some(&unsampled), &HeaderMap::new()).unwrap();
    let now = Instant::now();
    let items = items(&trace, &done(now));
    assert!(matches!(items.as_slice(), [Item::Log(record)] if record.trace.is_none()));
    let refused = Done { model: "unknown", ..done(now) };
    assert!(super::items(&trace, &refused).is_empty());
    let no_logs = destination(|config| (config.sampling, config.usage_logs) = (Ratio(0.0), false));
    let quiet = start(Some(&no_logs), &HeaderMap::new()).unwrap();
    assert!(super::items(&quiet, &done(now)).is_empty());
}
