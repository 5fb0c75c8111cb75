//! Token usage from responses, without delaying them: the relay copies the
//! start of the response's first frame and keeps a copy of its last few KB, and the
//! usage object is parsed once, after the last byte went out. The last
//! frame itself is read where it lies, so a one-frame answer is copied
//! nowhere. Copies, not
//! references: a frame's `Bytes` shares the connection's read buffer (8 KiB
//! or more), so keeping the last few KB of small SSE chunks by reference
//! kept one such buffer per chunk alive — 160 KiB for a 20-chunk stream.
//!
//! The counts of a `"usage"` object are named by the dialects
//! ([`crate::dialect::usage_count`]: OpenAI's `prompt_tokens` and
//! `completion_tokens`, its Responses' and Anthropic's `input_tokens` and
//! `output_tokens`, the cache's counts of both). For SSE the final chunk
//! carries usage; Anthropic streams put input tokens in the first event
//! (`message_start`) and output tokens in the last.

use std::ops::Range;

use bytes::Bytes;

use crate::dialect::{APIS, StreamUsage, UsageCount, openai};

/// How much of the response's first frame is kept (Anthropic streams report
/// input tokens in their first event, `message_start`, a few hundred bytes).
const HEAD_BYTES: usize = 2 * 1024;
/// How much of the response's end is kept for the usage search (between
/// this and twice this, to move bytes only now and then): the last usage
/// object and what follows it.
const TAIL_BYTES: usize = 4 * 1024;

/// Token counts of one response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt (input) tokens, those read from the server's cache included.
    pub prompt: u64,
    /// Completion (output) tokens.
    pub completion: u64,
    /// Prompt tokens the server read from its cache (OpenAI's
    /// `*_tokens_details.cached_tokens`, Anthropic's
    /// `cache_read_input_tokens`), at most `prompt`.
    pub cached: u64,
}

/// Watches a response body go by.
#[derive(Debug, Default)]
pub struct UsageTap {
    head: Vec<u8>,
    tail: Vec<u8>,
}

impl UsageTap {
    /// Notes a data frame: copies the first [`HEAD_BYTES`] of the first
    /// one, and what of each may be in the last [`TAIL_BYTES`] of the
    /// response.
    pub fn observe(&mut self, data: &[u8]) {
        if self.head.is_empty() && self.tail.is_empty() {
            self.head.extend_from_slice(&data[..data.len().min(HEAD_BYTES)]);
        }
        let keep = &data[data.len().saturating_sub(TAIL_BYTES)..];
        if self.tail.len() + keep.len() > 2 * TAIL_BYTES {
            let surplus = (self.tail.len() + keep.len() - TAIL_BYTES).min(self.tail.len());
            self.tail.drain(..surplus);
        }
        self.tail.extend_from_slice(keep);
    }

    /// The usage the response reported, if any.
    pub fn usage(&self) -> Option<Usage> {
        usage_in(&self.head, &self.tail)
    }

    /// The usage the response reported, `last` being its final frame (not
    /// observed). A response that came in one frame, as most answers that
    /// are not streams do, is read where it lies: no copies.
    pub fn usage_ending_with(&mut self, last: &[u8]) -> Option<Usage> {
        if self.head.is_empty() && self.tail.is_empty() {
            let head = &last[..last.len().min(HEAD_BYTES)];
            return usage_in(head, &last[last.len().saturating_sub(TAIL_BYTES)..]);
        }
        self.observe(last);
        self.usage()
    }
}

/// The usage reported in a response whose start is `head` and whose end
/// is `tail`.
fn usage_in(head: &[u8], tail: &[u8]) -> Option<Usage> {
    let last = last_usage(tail).or_else(|| last_usage(head));
    // The first event matters only when the last lacks a count (Anthropic
    // streams put input tokens in message_start, output in message_delta).
    let complete = last.is_some_and(|l| l.prompt().is_some() && l.completion().is_some());
    let first = if complete { None } else { first_usage(head) };
    match (first, last) {
        (None, None) => None,
        (first, last) => {
            let first = first.unwrap_or_default();
            let last = last.unwrap_or_default();
            let prompt = last.prompt().or(first.prompt()).unwrap_or(0);
            Some(Usage {
                prompt,
                completion: last.completion().or(first.completion()).unwrap_or(0),
                cached: last.cached().or(first.cached()).unwrap_or(0).min(prompt),
            })
        }
    }
}

/// The body to send upstream, the model's span in it, and whether the
/// usage chunk of the stream is the gateway's to take out again: a request
/// charged by tokens that streams from an endpoint (an index into
/// [`APIS`]) whose streams carry usage only when asked gets
/// `stream_options.include_usage` (token limits need the usage of streams
/// too); any other goes as the client sent it.
pub fn body_to_send(
    body: &Bytes,
    fields: &super::body::RequestFields<'_>,
    endpoint: usize,
    charged: bool,
) -> (Bytes, Range<usize>, bool) {
    if charged && fields.stream && APIS[endpoint].stream_usage == StreamUsage::WhenAsked {
        openai::with_stream_usage(body, fields.stream_options.clone(), fields.model_span.clone())
    } else {
        (body.clone(), fields.model_span.clone(), false)
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct UsageFields {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    /// Anthropic: prompt tokens read from, and written to, its cache (not
    /// in its `input_tokens`).
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    /// OpenAI: `prompt_tokens_details` / `input_tokens_details`
    /// `.cached_tokens` (in its prompt count).
    cached_tokens: Option<u64>,
}

impl UsageFields {
    fn prompt(&self) -> Option<u64> {
        self.prompt_tokens.or_else(|| {
            let input = self.input_tokens?;
            let cache =
                self.cache_read_input_tokens.unwrap_or(0).saturating_add(self.cache_creation_input_tokens.unwrap_or(0));
            Some(input.saturating_add(cache))
        })
    }
    fn cached(&self) -> Option<u64> {
        self.cached_tokens.or(self.cache_read_input_tokens)
    }
    fn completion(&self) -> Option<u64> {
        self.completion_tokens.or(self.output_tokens)
    }
    fn is_empty(&self) -> bool {
        self.prompt().is_none() && self.completion().is_none()
    }
}

const NEEDLE: &[u8] = b"\"usage\"";

/// The needle's forward searcher, built once: building one per search cost
/// more than the search.
fn needle_finder() -> &'static memchr::memmem::Finder<'static> {
    static FINDER: std::sync::OnceLock<memchr::memmem::Finder<'static>> = std::sync::OnceLock::new();
    FINDER.get_or_init(|| memchr::memmem::Finder::new(NEEDLE))
}

/// Where the last needle in `bytes` starts: a backward scan for its first
/// letter. The usage object is near the end, and on such short distances
/// the two-way reverse searcher cost more than the parse that follows.
fn last_needle(bytes: &[u8]) -> Option<usize> {
    memchr::memrchr_iter(NEEDLE[1], bytes)
        .map(|letter| letter.wrapping_sub(1))
        .find(|&start| bytes.get(start..).is_some_and(|rest| rest.starts_with(NEEDLE)))
}

fn last_usage(bytes: &[u8]) -> Option<UsageFields> {
    let mut end = bytes.len();
    while let Some(at) = last_needle(&bytes[..end]) {
        if let Some(fields) = parse_after(&bytes[at + NEEDLE.len()..]) {
            return Some(fields);
        }
        end = at;
    }
    None
}

fn first_usage(bytes: &[u8]) -> Option<UsageFields> {
    let finder = needle_finder();
    let mut start = 0;
    while let Some(found) = finder.find(&bytes[start..]) {
        let at = start + found;
        if let Some(fields) = parse_after(&bytes[at + NEEDLE.len()..]) {
            return Some(fields);
        }
        start = at + NEEDLE.len();
    }
    None
}

/// Parses `: { ... }` right after a `"usage"` key: an object whose counts
/// are non-negative integers or `null`, each named once. Anything else
/// (a float, a string, a repeated count) disqualifies the object, as the
/// upstream's own report is then not one we can trust.
fn parse_after(bytes: &[u8]) -> Option<UsageFields> {
    let rest = bytes.trim_ascii_start().strip_prefix(b":")?.trim_ascii_start();
    if !rest.starts_with(b"{") {
        return None;
    }
    let mut fields = UsageFields::default();
    let mut trusted = true;
    let mut named = [false; 7];
    super::body::object_members(rest, |key, value| {
        let (slot, index) = match crate::dialect::usage_count(key) {
            Some(UsageCount::Prompt) => (&mut fields.prompt_tokens, 0),
            Some(UsageCount::Completion) => (&mut fields.completion_tokens, 1),
            Some(UsageCount::Input) => (&mut fields.input_tokens, 2),
            Some(UsageCount::Output) => (&mut fields.output_tokens, 3),
            Some(UsageCount::CacheRead) => (&mut fields.cache_read_input_tokens, 4),
            Some(UsageCount::CacheCreation) => (&mut fields.cache_creation_input_tokens, 5),
            Some(UsageCount::CachedDetails) => {
                trusted &= !std::mem::replace(&mut named[6], true);
                // `{"cached_tokens": N, ...}`, or null; anything else is
                // not a report we can read a cached count from.
                if value.starts_with(b"{") {
                    let nested = super::body::object_members(value, |inner, count| {
                        if inner == b"cached_tokens" && count != b"null" {
                            fields.cached_tokens = crate::json_text::non_negative_integer(count);
                        }
                    });
                    trusted &= nested.is_ok();
                }
                return;
            }
            None => return,
        };
        trusted &= !std::mem::replace(&mut named[index], true);
        if value != b"null" {
            match crate::json_text::non_negative_integer(value) {
                Some(count) => *slot = Some(count),
                None => trusted = false,
            }
        }
    })
    .ok()?;
    (trusted && !fields.is_empty()).then_some(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tap(frames: &[&str]) -> UsageTap {
        let mut tap = UsageTap::default();
        for frame in frames {
            tap.observe(frame.as_bytes());
        }
        tap
    }

    #[test]
    fn cached_prompt_tokens_are_read_from_each_shape() {
        let openai =
            r#"{"usage":{"prompt_tokens":100,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":60}}}"#;
        assert_eq!(tap(&[openai]).usage(), Some(Usage { prompt: 100, completion: 5, cached: 60 }));
        let responses =
            r#"{"usage":{"input_tokens":80,"input_tokens_details":{"cached_tokens":64},"output_tokens":7}}"#;
        assert_eq!(tap(&[responses]).usage(), Some(Usage { prompt: 80, completion: 7, cached: 64 }));
        // Anthropic counts cache reads and writes beside its input tokens.
        let anthropic = [
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"cache_read_input_tokens\":90,\"cache_creation_input_tokens\":5,\"output_tokens\":1}}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n",
        ];
        assert_eq!(tap(&anthropic).usage(), Some(Usage { prompt: 105, completion: 15, cached: 90 }));
        // More cached than prompt tokens: capped; details of another shape: no cached count.
        let odd = r#"{"usage":{"prompt_tokens":3,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":9}}}"#;
        assert_eq!(tap(&[odd]).usage(), Some(Usage { prompt: 3, completion: 1, cached: 3 }));
        let other = r#"{"usage":{"prompt_tokens":3,"completion_tokens":1,"prompt_tokens_details":"x"}}"#;
        assert_eq!(tap(&[other]).usage(), Some(Usage { prompt: 3, completion: 1, cached: 0 }));
    }

    #[test]
    fn openai_non_streaming() {
        let body = r#"{"id":"x","choices":[{"message":{"content":"the \"usage\" is"}}],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}"#;
        assert_eq!(tap(&[body]).usage(), Some(Usage { prompt: 12, completion: 34, cached: 0 }));
    }

    #[test]
    fn openai_stream_with_include_usage() {
        let frames = [
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}],\"usage\":null}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n",
        ];
        assert_eq!(tap(&frames).usage(), Some(Usage { prompt: 5, completion: 2, cached: 0 }));
    }

    #[test]
    fn anthropic_stream_splits_input_and_output() {
        let frames = [
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n",
            "event: content_block_delta\ndata: {\"delta\":{\"text\":\"hi\"}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        ];
        assert_eq!(tap(&frames).usage(), Some(Usage { prompt: 25, completion: 15, cached: 0 }));
    }

    #[test]
    fn usage_objects_are_read_strictly() {
        let usage = |object: &str| tap(&[&format!("{{\"choices\":[],\"usage\":{object}}}\n\n")]).usage();
        // Nested details and unknown members are skipped.
        assert_eq!(
            usage(
                r#"{"prompt_tokens":7,"prompt_tokens_details":{"cached_tokens":2,"x":[1,{"y":null}]},"completion_tokens":9}"#
            ),
            Some(Usage { prompt: 7, completion: 9, cached: 2 })
        );
        // `null` is no count; escaped keys are keys.
        assert_eq!(
            usage(r#"{"prompt_tokens":null,"\u0063ompletion_tokens":3}"#),
            Some(Usage { prompt: 0, completion: 3, cached: 0 })
        );
        // Not integers, negative, repeated or malformed: not a usage report.
        for untrusted in [
            r#"{"prompt_tokens":1.5,"completion_tokens":2}"#,
            r#"{"prompt_tokens":-1,"completion_tokens":2}"#,
            r#"{"prompt_tokens":"1","completion_tokens":2}"#,
            r#"{"prompt_tokens":1,"prompt_tokens":100,"completion_tokens":2}"#,
            r#"{"prompt_tokens":1,"completion_tokens":99999999999999999999999}"#,
            r#"{"prompt_tokens":1,"completion_tokens":2,"#,
            r#"{"prompt_tokens":1 "completion_tokens":2}"#,
        ] {
            assert_eq!(usage(untrusted), None, "{untrusted}");
        }
    }

    #[test]
    fn responses_api_and_no_usage() {
        let body = r#"{"object":"response","output":[],"usage":{"input_tokens":3,"output_tokens":4,"total_tokens":7}}"#;
        assert_eq!(tap(&[body]).usage(), Some(Usage { prompt: 3, completion: 4, cached: 0 }));
        assert_eq!(tap(&["{\"data\":[]}"]).usage(), None);
        assert_eq!(tap(&[]).usage(), None);
    }

    #[test]
    fn keeps_only_the_tail_of_long_responses() {
        let mut tap = UsageTap::default();
        let chunk = Bytes::from(vec![b'x'; 1000]);
        for _ in 0..1000 {
            tap.observe(&chunk);
        }
        assert!(tap.tail.len() <= 2 * TAIL_BYTES && tap.head.len() == 1000, "{}", tap.tail.len());
        tap.observe(b"\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}");
        assert_eq!(tap.usage(), Some(Usage { prompt: 1, completion: 2, cached: 0 }));
    }

    /// The backward scan finds what a plain search from the end does.
    #[test]
    fn the_last_needle_is_found_wherever_it_is() {
        let naive = |bytes: &[u8]| bytes.windows(NEEDLE.len()).rposition(|window| window == NEEDLE);
        let cases: [&[u8]; 8] = [
            b"",
            b"\"usage\"",
            b"u\"usage\"u",
            b"\"usage\":{},\"usage\":{}",
            b"uuuuuuuuuuuuuuuu",
            b"\"usag\"usage\"",
            b"usage\"",
            b"{\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\n",
        ];
        for bytes in cases {
            assert_eq!(last_needle(bytes), naive(bytes), "{:?}", String::from_utf8_lossy(bytes));
        }
    }

    /// The last frame read where it lies gives what observing it would,
    /// for one-frame answers, streams and long responses alike.
    #[test]
    fn last_frame_read_in_place_matches_observing_it() {
        let long_head = format!("{{\"usage\":{{\"input_tokens\":9}}}}{}", "x".repeat(3 * HEAD_BYTES));
        let long_tail =
            format!("{}\"usage\":{{\"prompt_tokens\":1,\"completion_tokens\":2}}}}", "y".repeat(3 * TAIL_BYTES));
        let cases: [&[&str]; 6] = [
            &[r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34}}"#],
            &[
                "data: {\"usage\":null}\n\n",
                "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n",
            ],
            &[
                "data: {\"message\":{\"usage\":{\"input_tokens\":25}}}\n\n",
                "data: {\"usage\":{\"output_tokens\":15}}\n\n",
            ],
            &[&long_head, "{\"usage\":{\"output_tokens\":4}}"],
            &[&long_head],
            &[&long_tail],
        ];
        for frames in cases {
            let (last, before) = frames.split_last().unwrap();
            let expected = tap(frames).usage();
            assert!(expected.is_some(), "{frames:?}");
            assert_eq!(tap(before).usage_ending_with(last.as_bytes()), expected, "{frames:?}");
        }
    }

    /// A frame shares its connection's read buffer; the tap must not keep
    /// it alive (it did, one buffer per small SSE chunk).
    #[test]
    fn keeps_no_reference_to_the_connections_read_buffer() {
        let mut read_buffer = bytes::BytesMut::with_capacity(8 * 1024);
        let mut tap = UsageTap::default();
        for _ in 0..20 {
            read_buffer.extend_from_slice(b"data: {\"choices\":[{\"delta\":{\"content\":\"token\"}}]}\n\n");
            let frame = read_buffer.split().freeze();
            tap.observe(&frame);
            drop(frame);
            assert!(read_buffer.try_reclaim(8 * 1024), "a frame's buffer is still referenced");
        }
        read_buffer
            .extend_from_slice(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":20}}\n\n");
        tap.observe(&read_buffer.split().freeze());
        assert_eq!(tap.usage(), Some(Usage { prompt: 3, completion: 20, cached: 0 }));
    }
}
