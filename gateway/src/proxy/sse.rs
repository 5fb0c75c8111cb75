//! Removes the usage-only chunk from a chat/completions stream whose client
//! did not ask for it: the gateway adds `stream_options.include_usage` to
//! charge token limits, and the client should see the stream it asked for.
//!
//! Frames pass through untouched (no copy) unless they hold a usage object
//! or end inside an event. An incomplete event is held until its end
//! arrives — an SSE client cannot use half an event, so nothing it could
//! read is delayed.

use bytes::{Bytes, BytesMut};

/// The filter's state between frames.
#[derive(Debug, Default)]
pub struct UsageChunkFilter {
    held: BytesMut,
}

const USAGE_OBJECT: &[u8] = br#""usage":{"#;
const NO_CHOICES: &[u8] = br#""choices":[]"#;

impl UsageChunkFilter {
    /// The part of `data` the client gets now.
    pub fn pass(&mut self, data: &Bytes) -> Bytes {
        if self.held.is_empty() && data.ends_with(b"\n\n") && memchr::memmem::find(data, USAGE_OBJECT).is_none() {
            return data.clone();
        }
        self.held.extend_from_slice(data);
        let Some(end) = last_event_end(&self.held) else { return Bytes::new() };
        let complete = self.held.split_to(end).freeze();
        if memchr::memmem::find(&complete, USAGE_OBJECT).is_none() {
            return complete;
        }
        let mut kept = BytesMut::with_capacity(complete.len());
        for event in events(&complete) {
            if !is_usage_only(event) {
                kept.extend_from_slice(event);
            }
        }
        kept.freeze()
    }

    /// Nothing is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// What is held when the stream ends (an unterminated last event).
    pub fn finish(&mut self) -> Bytes {
        self.held.split().freeze()
    }
}

/// The end of the last complete event (after its blank line).
fn last_event_end(bytes: &[u8]) -> Option<usize> {
    let lf = memchr::memmem::rfind(bytes, b"\n\n").map(|at| at + 2);
    let crlf = memchr::memmem::rfind(bytes, b"\r\n\r\n").map(|at| at + 4);
    lf.max(crlf)
}

/// Complete events, each with its terminating blank line.
fn events(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = bytes;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = first_event_end(rest).unwrap_or(rest.len());
        let (event, tail) = rest.split_at(end);
        rest = tail;
        Some(event)
    })
}

fn first_event_end(bytes: &[u8]) -> Option<usize> {
    let lf = memchr::memmem::find(bytes, b"\n\n").map(|at| at + 2);
    let crlf = memchr::memmem::find(bytes, b"\r\n\r\n").map(|at| at + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn is_usage_only(event: &[u8]) -> bool {
    memchr::memmem::find(event, USAGE_OBJECT).is_some() && memchr::memmem::find(event, NO_CHOICES).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONTENT: &str =
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n";
    const USAGE: &str = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    fn run(frames: &[&str]) -> (String, usize) {
        let mut filter = UsageChunkFilter::default();
        let mut out = String::new();
        let mut sent = 0;
        for frame in frames {
            let passed = filter.pass(&Bytes::copy_from_slice(frame.as_bytes()));
            sent += usize::from(!passed.is_empty());
            out.push_str(std::str::from_utf8(&passed).unwrap());
        }
        out.push_str(std::str::from_utf8(&filter.finish()).unwrap());
        (out, sent)
    }

    #[test]
    fn content_frames_pass_untouched_and_the_usage_chunk_goes() {
        let (out, sent) = run(&[CONTENT, CONTENT, USAGE, DONE]);
        assert_eq!(out, format!("{CONTENT}{CONTENT}{DONE}"));
        assert_eq!(sent, 3);
    }

    #[test]
    fn usage_and_done_in_one_frame() {
        let (out, _) = run(&[CONTENT, &format!("{USAGE}{DONE}")]);
        assert_eq!(out, format!("{CONTENT}{DONE}"));
    }

    #[test]
    fn an_event_split_across_frames_is_held_until_complete() {
        let (head, tail) = USAGE.split_at(30);
        let mut filter = UsageChunkFilter::default();
        assert!(filter.pass(&Bytes::from_static(head.as_bytes())).is_empty());
        assert!(filter.pass(&Bytes::from_static(tail.as_bytes())).is_empty(), "the usage chunk is dropped whole");
        assert_eq!(filter.pass(&Bytes::from_static(DONE.as_bytes())), DONE.as_bytes());
        let (head, tail) = CONTENT.split_at(12);
        let (out, _) = run(&[head, tail, DONE]);
        assert_eq!(out, format!("{CONTENT}{DONE}"));
    }

    #[test]
    fn a_usage_object_inside_content_is_kept() {
        let content =
            "data: {\"choices\":[{\"delta\":{\"content\":\"\\\"usage\\\":{\"}}],\"usage\":{\"total_tokens\":1}}\n\n";
        let (out, _) = run(&[content, DONE]);
        assert_eq!(out, format!("{content}{DONE}"));
    }

    #[test]
    fn crlf_events_and_an_unterminated_end() {
        let usage = USAGE.replace("\n\n", "\r\n\r\n");
        let (out, _) = run(&[&usage, "data: [DONE]"]);
        assert_eq!(out, "data: [DONE]");
    }
}
