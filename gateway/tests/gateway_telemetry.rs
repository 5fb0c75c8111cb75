//! Traces and usage records through a real OpenTelemetry Collector (built
//! from the Go module proxy by `e2e/scripts/build-otelcol.sh`; `make test`
//! builds it first): a streamed chat request continuing a client's trace
//! arrives as a server span with the GenAI attributes and a span per
//! upstream attempt (two after a retry), the upstream received the
//! attempt's `traceparent`, the usage record arrives as a log record with
//! the request's id; and a collector that is down costs requests nothing
//! but dropped, counted records.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{Fixture, FixtureOptions};
use waycast_crds::telemetry::TelemetryConfig;
use waycast_mock::collector::{Collector, attribute};
use waycast_mock::fixtures::{ALICE_KEY, free_port};
use waycast_mock::upstream::{self as mock_upstream, MockOptions, MockUpstream};

const SERVICE: &str = "models/vllm:8000";
const MODEL: &str = "mistral-7b";
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
const CLIENT_STATE: &str = "rojo=00f067aa0ba902b7";

fn loopback_port() -> u16 {
    free_port(std::net::Ipv4Addr::LOCALHOST.into()).unwrap()
}

fn telemetry(endpoint: &str) -> TelemetryConfig {
    TelemetryConfig {
        endpoint: endpoint.to_owned(),
        trust_client_trace_context: true,
        usage_logs: true,
        ..TelemetryConfig::default()
    }
}

async fn pods(count: usize) -> Vec<MockUpstream> {
    let mut pods = Vec::new();
    for _ in 0..count {
        pods.push(mock_upstream::start(SocketAddr::from(([127, 0, 0, 1], 0)), MockOptions::default()).await.unwrap());
    }
    pods
}

#[tokio::test]
async fn a_streamed_request_reaches_the_collector_as_spans_and_a_usage_record() {
    let collector = Collector::start(std::net::Ipv4Addr::LOCALHOST.into()).unwrap();
    let options = FixtureOptions {
        endpoints_file: true,
        telemetry: Some(telemetry(&collector.endpoint)),
        ..FixtureOptions::default()
    };
    let fixture = Fixture::start(options, |config, _| {
        let model = config.models.iter_mut().find(|m| m.name == MODEL).unwrap();
        model.backends[0].endpoints = Some(SERVICE.into());
    })
    .await;
    // One pod answers 503 (retried on the other), one serves.
    let pods = pods(2).await;
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let status = http_body_util::Full::new(bytes::Bytes::new());
    let put = http::Request::put(format!("{}/_mock/status/503", pods[0].base_url().trim_end_matches("/v1")))
        .body(status)
        .unwrap();
    assert!(http.request(put).await.unwrap().status().is_success());
    let document = serde_json::json!({
        "apiVersion": "waycast.dev/endpoints-v1",
        "services": {SERVICE: pods.iter().map(|p| p.addr.to_string()).collect::<Vec<_>>()},
    });
    fixture.write_endpoints(document.to_string().as_bytes());
    let deadline = Instant::now() + Duration::from_secs(5);
    while fixture.metric("waycast_gateway_endpoints").await != Some(2.0) {
        assert!(Instant::now() < deadline, "the gateway did not take the endpoints document");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let body =
        format!(r#"{{"model":"{MODEL}","stream":true,"max_tokens":32,"messages":[{{"role":"user","content":"hi"}}]}}"#);
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let mut request_ids = Vec::new();
    // Until one request was retried (the first pick is the 503 pod).
    for _ in 0..40 {
        let context = [("traceparent", traceparent.as_str()), ("tracestate", CLIENT_STATE)];
        let request = fixture.request("/v1/chat/completions", Some(ALICE_KEY), &body, &context);
        let (status, headers, answer) = fixture.send(request).await;
        assert_eq!(status, 200, "{answer:?}");
        request_ids.push(headers["x-request-id"].to_str().unwrap().to_owned());
        if !pods[0].recorder.requests().await.is_empty() {
            break;
        }
    }
    assert!(!pods[0].recorder.requests().await.is_empty(), "no request was sent to the 503 pod first");

    let spans = collector
        .until("traces", "a server span with two attempts", |spans| {
            spans.iter().filter(|s| s["kind"] == 3).count() > request_ids.len()
        })
        .await;
    for span in &spans {
        assert_eq!(span["traceId"], CLIENT_TRACE, "every span continues the client's trace: {span:#}");
        assert!(!span.to_string().contains("rojo"), "the client's tracestate is never written in our spans: {span:#}");
    }
    let servers: Vec<&Value> = spans.iter().filter(|s| s["kind"] == 2).collect();
    assert_eq!(servers.len(), request_ids.len());
    let server = servers[0];
    assert_eq!(server["parentSpanId"], CLIENT_SPAN);
    assert_eq!(server["name"], format!("chat {MODEL}"));
    assert_eq!(attribute(server, "gen_ai.operation.name").unwrap(), "chat");
    assert_eq!(attribute(server, "gen_ai.request.model").unwrap(), MODEL);
    assert_eq!(attribute(server, "gen_ai.response.model").unwrap(), MODEL);
    assert_eq!(attribute(server, "gen_ai.request.max_tokens").unwrap(), "32");
    assert_ne!(attribute(server, "gen_ai.usage.input_tokens").unwrap(), "0");
    assert_ne!(attribute(server, "gen_ai.usage.output_tokens").unwrap(), "0");
    assert_eq!(attribute(server, "waycast.key").unwrap(), "team-a/alice");
    assert_eq!(attribute(server, "waycast.stream").unwrap(), true);
    assert!(server["events"].as_array().unwrap().iter().any(|e| e["name"] == "gen_ai.first_token"), "{server:#}");
    assert!(!server.to_string().contains(ALICE_KEY), "the key itself never leaves");

    // The retried request: two attempt spans under its server span, the
    // first a 503 retried, and the pod that served got the second's id.
    let retried =
        servers.iter().find(|s| spans.iter().filter(|c| c["parentSpanId"] == s["spanId"]).count() == 2).unwrap();
    let attempts: Vec<&Value> = spans.iter().filter(|c| c["parentSpanId"] == retried["spanId"]).collect();
    let first =
        attempts.iter().find(|a| attribute(a, "http.response.status_code") == Some(&Value::from("503"))).unwrap();
    assert!(attribute(first, "waycast.retry_reason").is_some(), "{first:#}");
    let second =
        attempts.iter().find(|a| attribute(a, "http.response.status_code") == Some(&Value::from("200"))).unwrap();
    let seen_upstream: Vec<String> = pods[1]
        .recorder
        .requests()
        .await
        .iter()
        .filter_map(|r| r.headers.get("traceparent").map(|v| v.to_str().unwrap().to_owned()))
        .collect();
    let expected = format!("00-{CLIENT_TRACE}-{}-01", second["spanId"].as_str().unwrap());
    assert!(seen_upstream.contains(&expected), "{expected} not among {seen_upstream:?}");
    assert!(
        !seen_upstream.iter().any(|t| t.contains(CLIENT_SPAN)),
        "the client's own span is not passed on as the parent"
    );

    let records =
        collector.until("logs", "a usage record per request", |records| records.len() >= request_ids.len()).await;
    for id in &request_ids {
        let record = usage_record(&records, id);
        assert_eq!(record["eventName"], "waycast.usage");
        assert_eq!(record["traceId"], CLIENT_TRACE);
    }
    assert!(fixture.metric("waycast_gateway_telemetry_exported_total{signal=\"traces\"}").await.unwrap() >= 3.0);

    // Two requests a client gave the same X-Request-Id: two records, each
    // known by an id of the gateway's (what a pipeline de-duplicates by),
    // so one cannot be taken for a copy of the other.
    let chosen = "the-same-id-twice";
    for _ in 0..2 {
        let request = fixture.request("/v1/chat/completions", Some(ALICE_KEY), &body, &[("x-request-id", chosen)]);
        let (status, headers, answer) = fixture.send(request).await;
        assert_eq!(status, 200, "{answer:?}");
        assert_eq!(headers["x-request-id"], chosen);
    }
    let records = collector
        .until("logs", "both records of the chosen id", |records| {
            records.iter().filter(|r| attribute(r, "waycast.request_id") == Some(&Value::from(chosen))).count() == 2
        })
        .await;
    let bodies: Vec<&Value> = records
        .iter()
        .filter(|r| attribute(r, "waycast.request_id") == Some(&Value::from(chosen)))
        .map(|r| &r["body"]["stringValue"])
        .collect();
    assert_ne!(bodies[0], bodies[1], "records of one chosen request id share a body");
}

/// At `sampling: 0` a client's sampled flag records nothing: the Gateway
/// did not opt in to `honorClientSampling`. The requests' usage records
/// arrive (the exporter ran), no span does, and the upstream still gets the
/// client's trace id and `tracestate`.
#[tokio::test]
async fn a_clients_sampled_flag_does_not_override_the_platforms_ratio() {
    let collector = Collector::start(std::net::Ipv4Addr::LOCALHOST.into()).unwrap();
    let mut settings = telemetry(&collector.endpoint);
    settings.sampling = waycast_crds::telemetry::Ratio(0.0);
    let options = FixtureOptions { telemetry: Some(settings), ..FixtureOptions::default() };
    let fixture = Fixture::start(options, |_, _| {}).await;
    let body = format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let context = [("traceparent", traceparent.as_str()), ("tracestate", CLIENT_STATE)];
    for _ in 0..50 {
        let (status, _, answer) =
            fixture.send(fixture.request("/v1/chat/completions", Some(ALICE_KEY), &body, &context)).await;
        assert_eq!(status, 200, "{answer:?}");
    }
    let records = collector.until("logs", "every request's usage record", |records| records.len() >= 50).await;
    for record in &records {
        assert!(!record.to_string().contains("rojo"), "{record:#}");
        assert!(record.get("traceId").is_none_or(|id| id == ""), "no trace was recorded: {record:#}");
    }
    assert!(collector.received("traces").is_empty(), "a client's flag had spans exported");
    let exported = fixture.metric("waycast_gateway_telemetry_exported_total{signal=\"traces\"}").await;
    assert_eq!(exported.unwrap_or(0.0), 0.0);
    let seen = fixture.mock.recorder.last().await.unwrap().headers;
    assert_eq!(seen.get("tracestate").unwrap(), CLIENT_STATE, "passed on upstream");
    let sent = seen.get("traceparent").unwrap().to_str().unwrap();
    assert!(sent.starts_with(&format!("00-{CLIENT_TRACE}-")) && sent.ends_with("-00"), "{sent}");
}

/// The usage record of a request, found by its request id attribute; its
/// body is the gateway's record id, never the request id.
fn usage_record<'a>(records: &'a [Value], request_id: &str) -> &'a Value {
    let record = records
        .iter()
        .find(|r| attribute(r, "waycast.request_id") == Some(&Value::from(request_id)))
        .unwrap_or_else(|| panic!("no usage record of request {request_id}"));
    let body = record["body"]["stringValue"].as_str().unwrap();
    assert!(body.len() == 32 && body.bytes().all(|b| b.is_ascii_hexdigit()), "{record:#}");
    assert_ne!(body, request_id);
    record
}

/// A collector down costs requests nothing: the spans are dropped and
/// counted, the usage records kept and sent again until it is back, then
/// every one arrives (at least once: by request id) and none is counted
/// dropped.
#[tokio::test]
async fn a_collector_that_is_down_costs_requests_nothing_and_loses_no_usage_record() {
    // Nothing listens there, yet.
    let port = loopback_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let options = FixtureOptions { telemetry: Some(telemetry(&endpoint)), ..FixtureOptions::default() };
    let fixture = Fixture::start(options, |_, _| {}).await;
    let body = format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    let mut request_ids = Vec::new();
    for _ in 0..20 {
        let (status, headers, answer) = fixture.post("/v1/chat/completions", Some(ALICE_KEY), &body).await;
        assert_eq!(status, 200, "{answer:?}");
        request_ids.push(headers["x-request-id"].to_str().unwrap().to_owned());
    }
    let dropped = "waycast_gateway_telemetry_dropped_total{reason=\"export_failed\",signal=\"traces\"}";
    let deadline = Instant::now() + Duration::from_secs(15);
    while fixture.metric(dropped).await.unwrap_or(0.0) < 20.0 {
        assert!(Instant::now() < deadline, "the spans were not counted as dropped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let logs_dropped = "waycast_gateway_telemetry_dropped_total{reason=\"export_failed\",signal=\"logs\"}";
    assert_eq!(fixture.metric(logs_dropped).await, None, "usage records were dropped, not kept");

    // The collector comes back where it was: the kept records reach it.
    let collector = Collector::start_at(IpAddr::from([127, 0, 0, 1]), port).unwrap();
    let records = collector
        .until("logs", "every usage record, sent again", |records| {
            request_ids
                .iter()
                .all(|id| records.iter().any(|r| attribute(r, "waycast.request_id") == Some(&Value::from(id.as_str()))))
        })
        .await;
    assert!(records.len() >= request_ids.len());
    let exported = "waycast_gateway_telemetry_exported_total{signal=\"logs\"}";
    assert_eq!(fixture.metric(exported).await, Some(20.0));
    assert_eq!(fixture.metric(logs_dropped).await, None);
}
