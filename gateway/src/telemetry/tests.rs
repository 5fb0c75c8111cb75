#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::time::Instant;

use http::HeaderValue;
use waycast_crds::telemetry::{Ratio, TelemetryConfig};
use waycast_otlp::{Item, wire};

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

/// The value of an attempt's `traceparent` line.
fn traceparent_of(attempt: &Upstream) -> String {
    let line = String::from_utf8(attempt.traceparent_line().to_vec()).unwrap();
    line.strip_prefix("traceparent: ").unwrap().strip_suffix("\r\n").unwrap().to_owned()
}

#[test]
fn off_without_a_destination() {
    assert!(start(None, &headers(&[("traceparent", PARENT)])).is_none());
}

#[test]
fn a_trusted_client_trace_is_continued_under_the_platforms_ratio() {
    let never = destination(|config| config.sampling = Ratio(0.0));
    let trace = start(Some(&never), &headers(&[("traceparent", PARENT), ("tracestate", "rojo=1")])).unwrap();
    assert_eq!(trace.context.trace_id[..4], [0x4b, 0xf9, 0x2f, 0x35]);
    assert_eq!(trace.parent, Some([0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]));
    assert!(!trace.context.sampled, "the client's flag does not override the ratio");
    assert_eq!(trace.state.as_deref(), Some("rojo=1"), "kept to pass on upstream");
    assert_ne!(trace.context.span_id, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7], "a span of its own");
    let always = destination(|_| {});
    let unsampled = PARENT.replace("-01", "-00");
    let trace = start(Some(&always), &headers(&[("traceparent", &unsampled)])).unwrap();
    assert!(trace.context.sampled, "nor does its unsampled flag");
}

#[test]
fn a_client_cannot_choose_a_trace_id_the_ratio_always_samples() {
    // The ratio reads a trace id's last 8 bytes: ids ending in zeros fall
    // under any ratio above 0. Continued traces are drawn on an id of ours.
    let rare = destination(|config| config.sampling = Ratio(0.01));
    let chosen = "00-0123456789abcdef0000000000000001-00f067aa0ba902b7-01";
    let sampled =
        (0..2000).filter(|_| start(Some(&rare), &headers(&[("traceparent", chosen)])).unwrap().context.sampled).count();
    assert!(sampled < 100, "{sampled} of 2000 sampled at a ratio of 0.01");
}

#[test]
fn a_gateway_that_honours_client_sampling_follows_the_flag() {
    let honouring = destination(|config| {
        config.sampling = Ratio(0.0);
        config.honor_client_sampling = true;
    });
    let trace = start(Some(&honouring), &headers(&[("traceparent", PARENT)])).unwrap();
    assert!(trace.context.sampled, "the client sampled it: the ratio does not apply");
}

#[test]
fn a_trusted_client_that_did_not_sample_is_not_sampled_and_tracestates_join() {
    let always = destination(|config| config.honor_client_sampling = true);
    let unsampled = PARENT.replace("-01", "-00");
    let trace =
        start(Some(&always), &headers(&[("traceparent", &unsampled), ("tracestate", "a=1"), ("tracestate", "b=2")]))
            .unwrap();
    assert!(!trace.context.sampled, "the client's decision, not the ratio");
    assert_eq!(trace.state.as_deref(), Some("a=1,b=2"));
    let attempt = trace.begin_attempt();
    assert!(traceparent_of(&attempt).ends_with("-00"), "upstream told it is not sampled");
    assert!(attempt.trusted, "a trusted client's baggage goes upstream");
}

#[test]
fn an_untrusted_or_doubled_or_bad_traceparent_starts_a_new_trace() {
    let distrusting = destination(|config| config.trust_client_trace_context = false);
    let trusting = destination(|_| {});
    let cases = [
        (&distrusting, headers(&[("traceparent", PARENT), ("tracestate", "rojo=1")]), "not trusted"),
        (&trusting, headers(&[("traceparent", PARENT), ("traceparent", PARENT)]), "two traceparents"),
        (&trusting, headers(&[("traceparent", "00-zz"), ("tracestate", "rojo=1")]), "not valid"),
    ];
    for (destination, headers, why) in cases {
        let trace = start(Some(destination), &headers).unwrap();
        assert_eq!(trace.parent, None, "{why}");
        assert_ne!(trace.context.trace_id[..4], [0x4b, 0xf9, 0x2f, 0x35], "{why}");
        assert_eq!(trace.state, None, "{why}: no tracestate without the parent it belongs to");
        assert!(trace.context.sampled, "{why}: sampled at the default ratio 1");
        assert!(!trace.begin_attempt().trusted, "{why}: the client's baggage is not passed on");
    }
}

#[test]
fn a_traceparent_among_many_headers_is_found_and_a_second_one_still_counts() {
    let on = destination(|_| {});
    let filler: Vec<(&'static str, String)> =
        (0..20).map(|at| (["x-a", "x-b", "x-c", "x-d", "x-e"][at % 5], at.to_string())).collect();
    for many in [false, true] {
        let mut map = headers(&[("traceparent", PARENT)]);
        if many {
            for (name, value) in &filler {
                map.append(*name, HeaderValue::from_str(value).unwrap());
            }
        }
        assert!(start(Some(&on), &map).unwrap().parent.is_some(), "one of {}", map.len());
        map.append("traceparent", HeaderValue::from_static(PARENT));
        assert_eq!(start(Some(&on), &map).unwrap().parent, None, "two of {}", map.len());
    }
}

#[test]
fn an_attempt_names_itself_upstream_and_is_recorded_with_its_retry() {
    let on = destination(|_| {});
    let mut trace = start(Some(&on), &headers(&[("traceparent", PARENT)])).unwrap();
    let first = trace.begin_attempt();
    let sent = traceparent_of(&first).to_owned();
    let parsed = trace_context::parse_traceparent(sent.as_bytes()).unwrap();
    assert_eq!((parsed.trace_id, parsed.span_id, parsed.sampled), (trace.context.trace_id, first.span.span_id, true));
    trace.end_attempt(first, http::uri::Authority::from_static("10.0.0.7:8000"), span(), Some(503), None);
    trace.note_retry("status_503");
    let second = trace.begin_attempt();
    trace.end_attempt(second, http::uri::Authority::from_static("10.0.0.8:8000"), span(), Some(200), None);
    assert_eq!(trace.attempts.len(), 2);
    assert_eq!((trace.attempts[0].retried, trace.attempts[1].retried), (Some("status_503"), None));
    assert_ne!(trace.attempts[0].span_id, trace.attempts[1].span_id);
}

/// An attempt's clock readings: sent, answered.
fn span() -> (Instant, Instant) {
    let now = Instant::now();
    (now, now + Duration::from_millis(1))
}

/// The names a request's `Done` borrows (a worker's own copies).
fn names() -> (Arc<str>, Arc<str>) {
    (Arc::from("llama"), Arc::from("team-a/alice"))
}

fn done<'a>(now: Instant, (model, key): &'a (Arc<str>, Arc<str>)) -> Done<'a> {
    Done {
        wall: Duration::from_secs(1_800_000_000),
        ended: now + Duration::from_millis(500),
        took: Duration::from_millis(500),
        first_byte: Some(Duration::from_millis(100)),
        path: "/v1/chat/completions",
        request_id: "req-1",
        model,
        key,
        user: None,
        client_user: None,
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
        routed: true,
    }
}

/// The spans and the record an item holds, decoded.
fn decoded(item: &Item) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let entries = |bytes: &[u8]| wire::all(bytes, 2).into_iter().map(wire::bytes_of).collect();
    (entries(&item.spans), entries(&item.records))
}

fn attribute(message: &[u8], field: u64, key: &str) -> Option<wire::Wire> {
    wire::attribute(message, field, key)
}

fn text(value: &str) -> Option<wire::Wire> {
    Some(wire::Wire::Bytes(value.as_bytes().to_vec()))
}

#[test]
fn a_sampled_request_sends_its_spans_and_its_usage_record() {
    use wire::{Wire, one, text as field_text};
    let on = destination(|_| {});
    let mut trace = start(Some(&on), &headers(&[("traceparent", PARENT)])).unwrap();
    let attempt = trace.begin_attempt();
    trace.end_attempt(attempt, http::uri::Authority::from_static("10.0.0.8:8000"), span(), Some(200), None);
    let (now, names) = (Instant::now(), names());
    let item = encode::encoded(&trace, &done(now, &names)).unwrap();
    assert_eq!(item.span_count, 2);
    let (spans, records) = decoded(&item);
    let [server, client] = spans.as_slice() else { panic!("a server span and an attempt span") };
    assert_eq!(one(server, 6), Wire::Varint(2));
    assert_eq!(field_text(server, 5), "chat llama");
    assert_eq!(one(server, 4), Wire::Bytes(trace.parent.unwrap().to_vec()));
    assert_eq!(one(server, 8), Wire::Fixed64(1_800_000_000_000_000_000));
    assert_eq!(one(server, 7), Wire::Fixed64(1_800_000_000_000_000_000 - 500_000_000));
    let event = wire::bytes_of(one(server, 11));
    assert_eq!(one(&event, 1), Wire::Fixed64(1_800_000_000_000_000_000 - 400_000_000));
    assert_eq!(attribute(server, 9, "gen_ai.usage.input_tokens"), Some(Wire::Varint(12)));
    assert_eq!(attribute(server, 9, "gen_ai.usage.output_tokens"), Some(Wire::Varint(5)));
    assert_eq!(attribute(server, 9, "gen_ai.request.max_tokens"), Some(Wire::Varint(64)));
    assert_eq!(attribute(server, 9, "waycast.key"), text("team-a/alice"));
    assert_eq!(attribute(server, 9, "waycast.cost"), text("0.000017"));
    assert_eq!(attribute(server, 9, "waycast.tenant"), text("team-a"));
    assert_eq!(attribute(server, 9, "gen_ai.usage.cache_read.input_tokens"), Some(Wire::Varint(2)));
    assert_eq!(attribute(server, 9, "error.type"), None);
    assert_eq!(one(client, 6), Wire::Varint(3));
    assert_eq!(one(client, 4), Wire::Bytes(trace.context.span_id.to_vec()));
    assert_eq!(attribute(client, 9, "server.address"), text("10.0.0.8"));
    assert_eq!(attribute(client, 9, "server.port"), Some(Wire::Varint(8000)));
    let [record] = records.as_slice() else { panic!("one usage record") };
    assert_eq!(one(record, 9), Wire::Bytes(trace.context.trace_id.to_vec()));
    assert_eq!(attribute(record, 6, "waycast.request_id"), text("req-1"));
    assert_eq!(attribute(record, 6, "waycast.backend"), text("10.0.0.8:8000"));
    assert_eq!(attribute(server, 9, "user.id"), None, "a key names no user");
    assert_eq!(attribute(record, 6, "user.id"), None, "a key names no user");
}

#[test]
fn a_token_holder_is_user_id_on_the_span_and_the_record_and_its_grant_beside() {
    let on = destination(|_| {});
    let trace = start(Some(&on), &HeaderMap::new()).unwrap();
    let (now, names) = (Instant::now(), (Arc::from("llama"), Arc::from("team-a/developers")));
    let mut done = done(now, &names);
    done.user = Some("alice@example.com");
    done.client_user = Some("bob");
    let item = encode::encoded(&trace, &done).unwrap();
    let (spans, records) = decoded(&item);
    let [server] = spans.as_slice() else { panic!("a server span") };
    let [record] = records.as_slice() else { panic!("one usage record") };
    assert_eq!(attribute(server, 9, "user.id"), text("alice@example.com"));
    assert_eq!(attribute(server, 9, "waycast.grant"), text("team-a/developers"));
    assert_eq!(attribute(record, 6, "user.id"), text("alice@example.com"));
    assert_eq!(attribute(record, 6, "waycast.grant"), text("team-a/developers"));
    // What the client says is recorded beside, never as user.id.
    assert_eq!(attribute(server, 9, "waycast.client_user"), text("bob"));
    assert_eq!(attribute(record, 6, "waycast.client_user"), text("bob"));
}

/// The body a pipeline de-duplicates by is the gateway's own id, never the
/// request id a client may choose: two requests sent with the same
/// `X-Request-Id` leave records with different bodies.
#[test]
fn a_usage_record_is_known_by_an_id_the_client_cannot_choose() {
    use wire::{Wire, one};
    let on = destination(|_| {});
    let trace = start(Some(&on), &HeaderMap::new()).unwrap();
    let (now, names) = (Instant::now(), names());
    let bodies: Vec<Vec<u8>> = (0..2)
        .map(|_| {
            let item = encode::encoded(&trace, &done(now, &names)).unwrap();
            let (_, records) = decoded(&item);
            let [record] = records.as_slice() else { panic!("one usage record") };
            let body = wire::bytes_of(one(record, 5));
            let Wire::Bytes(id) = one(&body, 1) else { panic!("a string body") };
            assert_eq!(id.len(), 32);
            assert!(id.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)), "{id:?}");
            assert_eq!(attribute(record, 6, "waycast.request_id"), text("req-1"));
            id
        })
        .collect();
    assert_ne!(bodies[0], bodies[1]);
}

#[test]
fn an_unsampled_request_sends_its_usage_record_only_and_one_without_a_model_nothing() {
    let unsampled = destination(|config| config.sampling = Ratio(0.0));
    let trace = start(Some(&unsampled), &HeaderMap::new()).unwrap();
    let (now, names) = (Instant::now(), names());
    let item = encode::encoded(&trace, &done(now, &names)).unwrap();
    let (spans, records) = decoded(&item);
    assert!(spans.is_empty() && item.span_count == 0);
    assert_eq!(records.len(), 1);
    assert!(wire::all(&records[0], 9).is_empty(), "not traced: no trace id");
    let refused = Done { routed: false, ..done(now, &names) };
    assert!(encode::encoded(&trace, &refused).is_none());
    let no_logs = destination(|config| (config.sampling, config.usage_logs) = (Ratio(0.0), false));
    let quiet = start(Some(&no_logs), &HeaderMap::new()).unwrap();
    assert!(encode::encoded(&quiet, &done(now, &names)).is_none());
}

/// A client's error (a 4xx) is not the server's: the server span's status
/// stays unset (its `error.type` still says how it ended); a 5xx sets
/// ERROR.
#[test]
fn only_a_server_error_marks_the_server_span() {
    use wire::{Wire, all, one};
    let on = destination(|_| {});
    let trace = start(Some(&on), &HeaderMap::new()).unwrap();
    let (now, names) = (Instant::now(), names());
    for (status, marked) in [(429, false), (400, false), (502, true)] {
        let done = Done { status, error: Some("upstream_error"), ..done(now, &names) };
        let item = encode::encoded(&trace, &done).unwrap();
        let (spans, _) = decoded(&item);
        let server = &spans[0];
        assert_eq!(!all(server, 15).is_empty(), marked, "status field for {status}");
        assert_eq!(attribute(server, 9, "error.type"), text("upstream_error"), "{status}");
        if marked {
            assert_eq!(one(&wire::bytes_of(one(server, 15)), 3), Wire::Varint(2), "ERROR");
        }
    }
}
