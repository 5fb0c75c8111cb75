#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use super::*;
use crate::wire::{Wire, all, attributes, bytes_of, decode, one, read_varint, text};

fn source() -> Source {
    Source {
        resource: vec![("service.name".into(), "waycast-gateway".into())],
        scope_name: "waycast",
        scope_version: "0.1.0",
    }
}

#[test]
fn a_span_is_written_with_every_field_in_its_place() {
    let mut spans = Vec::new();
    let head = SpanHead {
        trace_id: &[1; 16],
        span_id: &[2; 8],
        parent_span_id: Some(&[3; 8]),
        trace_state: Some("rojo=1"),
        name: ("chat", "llama"),
        kind: SpanKind::Server,
        start_unix_nanos: 1_800_000_000_000_000_000,
        end_unix_nanos: 1_800_000_000_500_000_000,
        events: &[(1_800_000_000_100_000_000, "gen_ai.first_token")],
        error: Some("upstream_timeout"),
    };
    span(&mut spans, &head, |attributes| {
        attributes.text("gen_ai.request.model", "llama");
        attributes.int("gen_ai.usage.input_tokens", u64::MAX);
        attributes.flag("waycast.streamed", true);
        attributes.double("waycast.cost", 0.25);
        attributes.text("long", &"x".repeat(300));
    });
    let request = traces(&source(), &[&spans]);
    let resource_spans = bytes_of(one(&request, 1));
    let resource = bytes_of(one(&resource_spans, 1));
    assert_eq!(attributes(&resource, 1), vec![("service.name".into(), Wire::Bytes(b"waycast-gateway".to_vec()))]);
    let scope_spans = bytes_of(one(&resource_spans, 2));
    let scope = bytes_of(one(&scope_spans, 1));
    assert_eq!((text(&scope, 1), text(&scope, 2)), ("waycast".into(), "0.1.0".into()));
    let written = bytes_of(one(&scope_spans, 2));
    assert_eq!(one(&written, 1), Wire::Bytes(vec![1; 16]));
    assert_eq!(one(&written, 2), Wire::Bytes(vec![2; 8]));
    assert_eq!(text(&written, 3), "rojo=1");
    assert_eq!(one(&written, 4), Wire::Bytes(vec![3; 8]));
    assert_eq!(text(&written, 5), "chat llama");
    assert_eq!(one(&written, 6), Wire::Varint(2));
    assert_eq!(one(&written, 7), Wire::Fixed64(1_800_000_000_000_000_000));
    assert_eq!(one(&written, 8), Wire::Fixed64(1_800_000_000_500_000_000));
    assert_eq!(
        attributes(&written, 9),
        vec![
            ("gen_ai.request.model".into(), Wire::Bytes(b"llama".to_vec())),
            ("gen_ai.usage.input_tokens".into(), Wire::Varint(i64::MAX as u64)),
            ("waycast.streamed".into(), Wire::Flag(1)),
            ("waycast.cost".into(), Wire::Fixed64(0.25_f64.to_bits())),
            ("long".into(), Wire::Bytes(vec![b'x'; 300])),
        ]
    );
    let event = bytes_of(one(&written, 11));
    assert_eq!(one(&event, 1), Wire::Fixed64(1_800_000_000_100_000_000));
    assert_eq!(text(&event, 2), "gen_ai.first_token");
    let status = bytes_of(one(&written, 15));
    assert_eq!((text(&status, 2), one(&status, 3)), ("upstream_timeout".into(), Wire::Varint(2)));
}

#[test]
fn spans_without_parent_state_or_error_leave_those_fields_out_and_add_up() {
    let head = SpanHead {
        trace_id: &[1; 16],
        span_id: &[2; 8],
        parent_span_id: None,
        trace_state: None,
        name: ("chat", "m"),
        kind: SpanKind::Client,
        start_unix_nanos: 1,
        end_unix_nanos: 2,
        events: &[],
        error: None,
    };
    let mut spans = Vec::new();
    span(&mut spans, &head, |_| {});
    span(&mut spans, &head, |attributes| attributes.text("k", "v"));
    let request = traces(&source(), &[&spans]);
    let scope_spans = bytes_of(one(&bytes_of(one(&request, 1)), 2));
    let spans = all(&scope_spans, 2);
    assert_eq!(spans.len(), 2, "entries written apart are one list");
    let written = bytes_of(spans[0].clone());
    for absent in [3, 4, 9, 11, 15] {
        assert!(all(&written, absent).is_empty(), "field {absent}");
    }
    assert_eq!(one(&written, 6), Wire::Varint(3));
    assert_eq!(attributes(&bytes_of(spans[1].clone()), 9), vec![("k".into(), Wire::Bytes(b"v".to_vec()))]);
}

#[test]
fn a_log_record_carries_its_trace_and_attributes() {
    let mut records = Vec::new();
    let head = RecordHead {
        time_unix_nanos: 1_800_000_000_000_000_000,
        event_name: "waycast.usage",
        body: "req-1",
        trace: Some((&[4; 16], &[5; 8])),
    };
    record(&mut records, &head, |attributes| {
        attributes.text("waycast.request_id", "req-1");
        attributes.int("gen_ai.usage.output_tokens", 7);
    });
    let request = logs(&source(), &[&records]);
    let scope_logs = bytes_of(one(&bytes_of(one(&request, 1)), 2));
    let written = bytes_of(one(&scope_logs, 2));
    assert_eq!(one(&written, 1), Wire::Fixed64(1_800_000_000_000_000_000));
    assert_eq!(one(&written, 2), Wire::Varint(9));
    assert_eq!(text(&written, 3), "INFO");
    assert_eq!(decode(&bytes_of(one(&written, 5))), vec![(1, Wire::Bytes(b"req-1".to_vec()))]);
    assert_eq!(
        attributes(&written, 6),
        vec![
            ("waycast.request_id".into(), Wire::Bytes(b"req-1".to_vec())),
            ("gen_ai.usage.output_tokens".into(), Wire::Varint(7)),
        ]
    );
    assert_eq!((one(&written, 9), one(&written, 10)), (Wire::Bytes(vec![4; 16]), Wire::Bytes(vec![5; 8])));
    assert_eq!(one(&written, 8), Wire::Fixed32(1), "flags: sampled");
    assert_eq!(one(&written, 11), Wire::Fixed64(1_800_000_000_000_000_000));
    assert_eq!(text(&written, 12), "waycast.usage");
}

#[test]
fn varints_and_nested_lengths_across_their_byte_boundaries() {
    for value in [0, 1, 127, 128, 16_383, 16_384, u64::from(u32::MAX), u64::MAX] {
        let mut out = Vec::new();
        varint(&mut out, value);
        assert_eq!(read_varint(&out, &mut 0), value);
        assert_eq!(out.len(), varint_len(value));
    }
    // A message of 127, 128 and 16,384 bytes: its length in one, two and
    // three bytes in front of it.
    for size in [127, 128, 16_384] {
        let mut out = Vec::new();
        nested(&mut out, 2, |out| out.extend(std::iter::repeat_n(7, size)));
        assert_eq!(decode(&out), vec![(2, Wire::Bytes(vec![7; size]))]);
    }
}

#[test]
fn the_short_paths_write_what_the_general_one_does_at_every_length() {
    let general = |key: &str, any: usize, value: &dyn Fn(&mut Vec<u8>)| {
        let mut out = Vec::new();
        Attributes { out: &mut out, tag: 9 << 3 | 2 }.key_value(key, any, value);
        out
    };
    let short = |write: &dyn Fn(&mut Attributes<'_>)| {
        let mut out = Vec::new();
        write(&mut Attributes { out: &mut out, tag: 9 << 3 | 2 });
        out
    };
    // Around each short path's bounds (a key of 40 bytes, a key and value
    // of 121 bytes together) and well past them.
    for k in [0, 1, 36, 40, 41, 112, 113, 114, 115, 121, 122, 200] {
        let key = "k".repeat(k);
        for v in [0, 1, 20, 85, 86, 120, 121, 122, 127, 128, 300] {
            let value = "v".repeat(v);
            let written = short(&|a| a.text(&key, &value));
            let any = 1 + varint_len(v as u64) + v;
            assert_eq!(written, general(&key, any, &|out| bytes_field(out, 1, value.as_bytes())), "text {k}+{v}");
            assert_eq!(attributes(&written, 9), vec![(key.clone(), Wire::Bytes(value.clone().into_bytes()))]);
        }
        for value in [0, 1, 127, 128, 16_384, u64::from(u32::MAX), i64::MAX as u64, u64::MAX] {
            let written = short(&|a| a.int(&key, value));
            let kept = value.min(i64::MAX as u64);
            let any = 1 + varint_len(kept);
            assert_eq!(written, general(&key, any, &|out| varint_field(out, 3, kept)), "int {k}: {value}");
            assert_eq!(attributes(&written, 9), vec![(key.clone(), Wire::Varint(kept))]);
        }
        for value in [false, true] {
            let written = short(&|a| a.flag(&key, value));
            assert_eq!(written, general(&key, 2, &|out| varint_field(out, 2, u64::from(value))), "flag {k}");
        }
        let written = short(&|a| a.double(&key, 0.125));
        assert_eq!(written, general(&key, 9, &|out| fixed64_field(out, 4, 0.125_f64.to_bits())), "double {k}");
        assert_eq!(attributes(&written, 9), vec![(key.clone(), Wire::Fixed64(0.125_f64.to_bits()))]);
    }
}

#[test]
fn nested_messages_of_every_length_class_read_back() {
    for size in [0, 1, 126, 127, 128, 129, 16_383, 16_384, 2_097_151, 2_097_152] {
        let mut out = vec![9];
        nested(&mut out, 2, |out| out.extend((0..size).map(|at| at as u8)));
        assert_eq!(decode(&out[1..]), vec![(2, Wire::Bytes((0..size).map(|at| at as u8).collect()))], "{size}");
    }
}

#[test]
fn attributes_encoded_apart_read_back_in_their_message() {
    let (mut for_span, mut for_record) = (Vec::new(), Vec::new());
    span_attributes(&mut for_span, |attributes| attributes.text("gen_ai.request.model", "llama"));
    record_attributes(&mut for_record, |attributes| attributes.int("http.response.status_code", 200));
    let head = SpanHead {
        trace_id: &[1; 16],
        span_id: &[2; 8],
        parent_span_id: None,
        trace_state: None,
        name: ("chat", "llama"),
        kind: SpanKind::Server,
        start_unix_nanos: 1,
        end_unix_nanos: 2,
        events: &[],
        error: None,
    };
    let mut spans = Vec::new();
    span(&mut spans, &head, |attributes| {
        attributes.encoded(&for_span);
        attributes.flag("waycast.stream", false);
    });
    let written = bytes_of(one(&spans, 2));
    assert_eq!(
        attributes(&written, 9),
        vec![("gen_ai.request.model".into(), Wire::Bytes(b"llama".to_vec())), ("waycast.stream".into(), Wire::Flag(0)),]
    );
    let mut records = Vec::new();
    let head = RecordHead { time_unix_nanos: 1, event_name: "waycast.usage", body: "req-1", trace: None };
    record(&mut records, &head, |attributes| attributes.encoded(&for_record));
    let written = bytes_of(one(&records, 2));
    assert_eq!(attributes(&written, 6), vec![("http.response.status_code".into(), Wire::Varint(200))]);
}

#[test]
fn long_names_and_bodies_take_the_general_path_and_read_back() {
    let long: &'static str = Box::leak("e".repeat(150).into_boxed_str());
    let name = "m".repeat(130);
    for (event, body) in [("gen_ai.first_token", "req-1".to_owned()), (long, "b".repeat(200))] {
        let head = SpanHead {
            trace_id: &[1; 16],
            span_id: &[2; 8],
            parent_span_id: None,
            trace_state: None,
            name: ("chat", &name),
            kind: SpanKind::Server,
            start_unix_nanos: 1,
            end_unix_nanos: 2,
            events: &[(7, event)],
            error: None,
        };
        let mut spans = Vec::new();
        span(&mut spans, &head, |_| {});
        let written = bytes_of(one(&spans, 2));
        assert_eq!(text(&written, 5), format!("chat {name}"));
        let written_event = bytes_of(one(&written, 11));
        assert_eq!((one(&written_event, 1), text(&written_event, 2)), (Wire::Fixed64(7), event.to_owned()));
        let mut records = Vec::new();
        record(&mut records, &RecordHead { time_unix_nanos: 3, event_name: event, body: &body, trace: None }, |_| {});
        let written = bytes_of(one(&records, 2));
        assert_eq!(decode(&bytes_of(one(&written, 5))), vec![(1, Wire::Bytes(body.clone().into_bytes()))]);
        assert_eq!((one(&written, 11), text(&written, 12)), (Wire::Fixed64(3), event.to_owned()));
    }
}
