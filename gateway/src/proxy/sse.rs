//! Removes the usage-only chunk from a chat/completions stream whose client
//! did not ask for it: the gateway adds `stream_options.include_usage` to
//! charge token limits, and the client should see the stream it asked for.
//! Which event is that chunk is OpenAI's say
//! ([`openai::is_usage_only_event`]); the holding of events is here.
//!
//! Frames pass through untouched (no copy) unless they hold a usage object
//! or end inside an event. An incomplete event is held until its end
//! arrives — an SSE client cannot use half an event, so nothing it could
//! read is delayed.
//!
//! Bounded: at most [`MAX_HELD`] bytes of one event are held, and each byte
//! is searched for an event end once. An upstream that never ends an event
//! makes the filter give up on that stream: what it held and everything
//! after passes through unfiltered (the usage chunk may reach the client),
//! and the charge falls back to an estimate.

use bytes::{Bytes, BytesMut};

use crate::dialect::openai;

/// The most of one incomplete event the filter holds (64 KiB; a chat
/// chunk is a few hundred bytes).
pub const MAX_HELD: usize = 64 * 1024;

/// The filter's state between frames.
#[derive(Debug, Default)]
pub struct UsageChunkFilter {
    held: BytesMut,
    gave_up: bool,
}

impl UsageChunkFilter {
    /// The part of `data` the client gets now.
    pub fn pass(&mut self, data: &Bytes) -> Bytes {
        if self.gave_up || (self.held.is_empty() && data.ends_with(b"\n\n") && !openai::may_hold_usage(data)) {
            return data.clone();
        }
        // What is held ends inside an event: only the new bytes (and the
        // three before them, for a blank line split across frames) can
        // hold an event end. Rescanning all of it made an endless line
        // quadratic.
        let searched_from = self.held.len().saturating_sub(3);
        self.held.extend_from_slice(data);
        let Some(end) = last_event_end(&self.held[searched_from..]).map(|end| end + searched_from) else {
            if self.held.len() > MAX_HELD {
                self.gave_up = true;
                return self.held.split().freeze();
            }
            return Bytes::new();
        };
        let complete = self.held.split_to(end).freeze();
        if !openai::may_hold_usage(&complete) {
            return complete;
        }
        let mut kept = BytesMut::with_capacity(complete.len());
        for event in events(&complete) {
            if !openai::is_usage_only_event(event) {
                kept.extend_from_slice(event);
            }
        }
        kept.freeze()
    }

    /// Nothing is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The filter gave up on this stream (an event longer than [`MAX_HELD`]).
    pub fn gave_up(&self) -> bool {
        self.gave_up
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

    /// Any stream of events, cut into frames anywhere: the client gets every
    /// event but the usage-only ones, in order, and the filter never holds
    /// more than one event (and never over [`MAX_HELD`]).
    #[test]
    fn property_only_usage_chunks_go_whatever_the_framing() {
        let mut random = waycast_crds::seeded::Xorshift::new(0x853c_49e6_748f_ea9b);
        let mut next = move || random.next_u64();
        let crlf_content = CONTENT.replace("\n\n", "\r\n\r\n");
        let kinds = [CONTENT, USAGE, DONE, crlf_content.as_str()];
        for _ in 0..2_000 {
            let events: Vec<&str> = (0..(next() % 8)).map(|_| kinds[(next() % 4) as usize]).collect();
            let whole: String = events.concat();
            let expected: String = events.iter().filter(|e| **e != USAGE).copied().collect();
            let mut filter = UsageChunkFilter::default();
            let mut out = Vec::new();
            let mut at = 0;
            while at < whole.len() {
                let end = (at + 1 + (next() % 300) as usize).min(whole.len());
                out.extend_from_slice(&filter.pass(&Bytes::copy_from_slice(&whole.as_bytes()[at..end])));
                assert!(filter.held.len() <= CONTENT.len().max(USAGE.len()) + 4, "held {}", filter.held.len());
                at = end;
            }
            out.extend_from_slice(&filter.finish());
            assert_eq!(String::from_utf8(out).unwrap(), expected);
        }
    }

    #[test]
    fn an_endless_event_is_bounded_and_then_passed_through() {
        let mut filter = UsageChunkFilter::default();
        let line = Bytes::from(vec![b'x'; 1024]);
        let mut passed = 0;
        for _ in 0..(MAX_HELD / 1024) {
            passed += filter.pass(&line).len();
        }
        assert_eq!(passed, 0, "held while it might still end");
        passed += filter.pass(&line).len();
        assert!(filter.gave_up());
        assert_eq!(passed, MAX_HELD + 1024, "everything held goes out at once");
        assert_eq!(filter.pass(&Bytes::from_static(USAGE.as_bytes())), USAGE.as_bytes(), "unfiltered from then on");
    }

    #[test]
    fn an_event_end_split_across_frames_is_found() {
        let (out, _) = run(&["data: {\"choices\":[]}\n", "\ndata: [DONE]\n\n"]);
        assert_eq!(out, "data: {\"choices\":[]}\n\ndata: [DONE]\n\n");
        let (out, _) = run(&["data: x\r\n\r", "\ndata: [DONE]\r\n\r\n"]);
        assert_eq!(out, "data: x\r\n\r\ndata: [DONE]\r\n\r\n");
    }

    #[test]
    fn crlf_events_and_an_unterminated_end() {
        let usage = USAGE.replace("\n\n", "\r\n\r\n");
        let (out, _) = run(&[&usage, "data: [DONE]"]);
        assert_eq!(out, "data: [DONE]");
    }
}
