//! The access log: one JSON line per request on stdout.
//!
//! Formatted here rather than by the tracing formatter, and written in
//! batches by one background thread: profiled with callgrind, the tracing
//! formatter plus one `write(2)` per line cost about 19,000 instructions per
//! request, a fifth of the gateway's whole user-space work; this costs a
//! small fraction of that (docs/performance.md).
//!
//! ```text
//! request ends ─► AccessLine::to_json (no fmt machinery) ─► the worker's batch (≤ 5 ms or 32 KiB)
//!               ─► channel ─► writer thread batches for ≤ 5 ms ─► one write(2)
//! ```
//!
//! Lines are written only when the `waycast::access` target is enabled at
//! info level (the `--log` filter) and the config's `accessLog` is on. On a
//! graceful shutdown [`flush`] writes what is pending; a crash can lose the
//! last few milliseconds of lines.

use std::cell::RefCell;
use std::io::Write as _;
use std::sync::mpsc::{Receiver, Sender, SyncSender, channel, sync_channel};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;

use crate::json_text::{decimal, json_string};

/// How long the writer lets lines gather before one write.
const BATCH_WINDOW: Duration = Duration::from_millis(5);

/// One request, as logged.
#[derive(Debug, Clone, Copy)]
pub struct AccessLine<'a> {
    /// When the request ended, since the Unix epoch (the wall clock is
    /// read once per request, for this line and the key's month).
    pub at: Duration,
    /// `X-Request-Id`.
    pub request_id: &'a str,
    /// HTTP method.
    pub method: &'a str,
    /// Endpoint path (never the client's raw path: one of the known ones, or `other`).
    pub path: &'a str,
    /// Configured model name, or `unknown`.
    pub model: &'a str,
    /// Key id (never key material), or `none`; for a token, the grant's
    /// id (`namespace/name`).
    pub key: &'a str,
    /// Who a verified token names (written only for a token).
    pub user: Option<&'a str>,
    /// Who the client says its end user is (OpenAI's `user`; unverified,
    /// written only when sent).
    pub client_user: Option<&'a str>,
    /// The endpoint (pod address) that answered, for backends that name
    /// `endpoints`.
    pub endpoint: Option<std::net::SocketAddr>,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// Status sent.
    pub status: u16,
    /// Response body bytes.
    pub bytes: u64,
    /// Arrival to last byte, in microseconds.
    pub duration_us: u64,
    /// Request sent upstream to response headers, in microseconds.
    pub upstream_us: u64,
    /// Prompt tokens the response reported.
    pub prompt_tokens: u64,
    /// Completion tokens the response reported.
    pub completion_tokens: u64,
    /// Prompt tokens the server read from its cache, as reported (written
    /// when not 0).
    pub cached_tokens: u64,
    /// What the request cost, and the currency (a priced model's requests).
    pub cost: Option<(waycast_crds::money::Money, &'a str)>,
    /// Why it ended, if not normally.
    pub error: Option<&'a str>,
}

impl AccessLine<'_> {
    /// Appends the line as JSON, with a trailing newline, to `out`.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"ts\":\"");
        rfc3339_micros(self.at, out);
        out.extend_from_slice(b"\",\"level\":\"INFO\",\"log\":\"access\",\"request_id\":");
        json_string(self.request_id, out);
        out.extend_from_slice(b",\"method\":");
        json_string(self.method, out);
        out.extend_from_slice(b",\"path\":");
        json_string(self.path, out);
        out.extend_from_slice(b",\"model\":");
        json_string(self.model, out);
        out.extend_from_slice(b",\"key\":");
        json_string(self.key, out);
        if let Some(user) = self.user {
            out.extend_from_slice(b",\"user\":");
            json_string(user, out);
        }
        if let Some(client_user) = self.client_user {
            out.extend_from_slice(b",\"client_user\":");
            json_string(client_user, out);
        }
        out.extend_from_slice(b",\"endpoint\":");
        match self.endpoint {
            // An address has nothing to escape.
            Some(address) => {
                let _ = write!(out, "\"{address}\"");
            }
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(if self.stream { b",\"stream\":true" } else { b",\"stream\":false" });
        out.extend_from_slice(b",\"status\":");
        decimal(u64::from(self.status), out);
        out.extend_from_slice(b",\"bytes\":");
        decimal(self.bytes, out);
        out.extend_from_slice(b",\"duration_ms\":");
        millis(self.duration_us, out);
        out.extend_from_slice(b",\"upstream_ms\":");
        millis(self.upstream_us, out);
        out.extend_from_slice(b",\"prompt_tokens\":");
        decimal(self.prompt_tokens, out);
        out.extend_from_slice(b",\"completion_tokens\":");
        decimal(self.completion_tokens, out);
        if self.cached_tokens > 0 {
            out.extend_from_slice(b",\"cached_tokens\":");
            decimal(self.cached_tokens, out);
        }
        if let Some((cost, currency)) = self.cost {
            // A decimal string: money is never a float, not even in JSON.
            let _ = write!(out, ",\"cost\":\"{cost}\",\"currency\":");
            json_string(currency, out);
        }
        out.extend_from_slice(b",\"error\":");
        match self.error {
            Some(error) => json_string(error, out),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b"}\n");
    }
}

enum Message {
    Line(Vec<u8>),
    Flush(SyncSender<()>),
}

fn sender() -> Option<&'static Sender<Message>> {
    static SENDER: OnceLock<Option<Sender<Message>>> = OnceLock::new();
    SENDER
        .get_or_init(|| {
            let (sender, receiver) = channel();
            std::thread::Builder::new().name("access-log".into()).spawn(move || write_batches(&receiver)).ok()?;
            Some(sender)
        })
        .as_ref()
}

/// Whether access lines are wanted by the log filter.
pub fn enabled() -> bool {
    tracing::enabled!(target: "waycast::access", tracing::Level::INFO)
}

/// Queues one line for the writer: into the calling worker's own batch
/// (see [`gather_on_this_thread`]), or straight to the writer on any other
/// thread.
pub fn record(line: &AccessLine<'_>) {
    let gathered = GATHERED.with_borrow_mut(|gathered| {
        let Some(gathered) = gathered else { return false };
        let was_empty = gathered.lines.is_empty();
        line.write_json(&mut gathered.lines);
        if gathered.lines.len() >= GATHERED_BYTES {
            send(std::mem::take(&mut gathered.lines));
        } else if was_empty {
            gathered.first.notify_one();
        }
        true
    });
    if !gathered {
        let mut bytes = Vec::with_capacity(320);
        line.write_json(&mut bytes);
        send(bytes);
    }
}

fn send(lines: Vec<u8>) {
    if let Some(sender) = sender() {
        // The writer only stops with the process.
        let _ = sender.send(Message::Line(lines));
    }
}

/// A worker thread's lines not yet handed to the writer.
struct Gathered {
    lines: Vec<u8>,
    /// Told when a line lands in an empty batch.
    first: Arc<Notify>,
}

/// A worker's batch goes to the writer at this size without waiting.
const GATHERED_BYTES: usize = 32 * 1024;

thread_local! {
    static GATHERED: RefCell<Option<Gathered>> = const { RefCell::new(None) };
}

/// Makes the calling thread gather its lines and hand them to the writer
/// [`BATCH_WINDOW`] after the first of each batch (or at
/// [`GATHERED_BYTES`]), for as long as the returned future is polled on
/// this thread; [`send_gathered`] sends the rest. A data-plane worker runs
/// it: its lines then cost no allocation and no write to the channel every
/// worker shares, and an idle worker is never woken for it.
pub async fn gather_on_this_thread() {
    let first = Arc::new(Notify::new());
    GATHERED.set(Some(Gathered { lines: Vec::new(), first: first.clone() }));
    crate::per_worker::publish_batches(first, BATCH_WINDOW, send_gathered).await;
}

/// Hands the calling thread's gathered lines to the writer (a worker does
/// at its end).
pub fn send_gathered() {
    let lines = GATHERED.with_borrow_mut(|gathered| {
        let gathered = gathered.as_mut()?;
        // The next batch is likely the size of this one.
        let size = gathered.lines.len();
        (size > 0).then(|| std::mem::replace(&mut gathered.lines, Vec::with_capacity(size)))
    });
    if let Some(lines) = lines {
        send(lines);
    }
}

/// Writes every queued line before returning (at shutdown, and in tests).
pub fn flush() {
    let Some(sender) = sender() else { return };
    let (done, wait) = sync_channel(1);
    if sender.send(Message::Flush(done)).is_ok() {
        let _ = wait.recv_timeout(Duration::from_secs(2));
    }
}

fn write_batches(receiver: &Receiver<Message>) {
    let mut batch = Vec::with_capacity(64 * 1024);
    let mut waiting = Vec::new();
    while let Ok(first) = receiver.recv() {
        let flush_now = take(first, &mut batch, &mut waiting);
        if !flush_now {
            std::thread::sleep(BATCH_WINDOW);
        }
        while let Ok(message) = receiver.try_recv() {
            take(message, &mut batch, &mut waiting);
        }
        let mut stdout = std::io::stdout().lock();
        // NB: a closed stdout loses log lines, never requests.
        let _ = stdout.write_all(&batch);
        let _ = stdout.flush();
        drop(stdout);
        batch.clear();
        for done in waiting.drain(..) {
            let _ = done.send(());
        }
    }
}

/// Adds `message` to the batch; true when someone waits for it to be written.
fn take(message: Message, batch: &mut Vec<u8>, waiting: &mut Vec<SyncSender<()>>) -> bool {
    match message {
        Message::Line(line) => {
            batch.extend_from_slice(&line);
            false
        }
        Message::Flush(done) => {
            waiting.push(done);
            true
        }
    }
}

/// Microseconds as milliseconds with three decimals.
fn millis(micros: u64, out: &mut Vec<u8>) {
    decimal(micros / 1000, out);
    let fraction = micros % 1000;
    out.extend_from_slice(&[
        b'.',
        b'0' + (fraction / 100) as u8,
        b'0' + (fraction / 10 % 10) as u8,
        b'0' + (fraction % 10) as u8,
    ]);
}

fn two(value: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(&[b'0' + (value / 10 % 10) as u8, b'0' + (value % 10) as u8]);
}

/// `2026-11-22T07:01:14.960129Z`.
fn rfc3339_micros(since: Duration, out: &mut Vec<u8>) {
    let seconds = since.as_secs();
    let (year, month, day) = civil_from_days(seconds / 86_400);
    let of_day = seconds % 86_400;
    decimal(year, out);
    out.push(b'-');
    two(month, out);
    out.push(b'-');
    two(day, out);
    out.push(b'T');
    two(of_day / 3600, out);
    out.push(b':');
    two(of_day / 60 % 60, out);
    out.push(b':');
    two(of_day % 60, out);
    out.push(b'.');
    let micros = u64::from(since.subsec_micros());
    for divisor in [100_000, 10_000, 1000, 100, 10, 1] {
        out.push(b'0' + (micros / divisor % 10) as u8);
    }
    out.push(b'Z');
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian
/// (Howard Hinnant's days-to-civil algorithm, for dates after 1970).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(request_id: &str, error: Option<&str>) -> String {
        line_of(request_id, error, None)
    }

    fn line_of(request_id: &str, error: Option<&str>, user: Option<&str>) -> String {
        let at = Duration::from_micros(1_795_331_274_960_129);
        let line = AccessLine {
            at,
            request_id,
            method: "POST",
            path: "/v1/chat/completions",
            model: "llama-3.1-8b",
            key: "team-a/alice",
            user,
            client_user: user.map(|_| "said-to-be-ceo"),
            endpoint: Some(std::net::SocketAddr::from(([10, 1, 0, 7], 8000))),
            stream: true,
            status: 200,
            bytes: 1234,
            duration_us: 12_345,
            upstream_us: 7,
            prompt_tokens: 16,
            completion_tokens: 0,
            cached_tokens: 12,
            cost: Some((waycast_crds::money::Money(3_200), "USD")),
            error,
        };
        let mut out = Vec::new();
        line.write_json(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_line_is_one_json_object_with_every_field() {
        let text = line("req-1", None);
        assert!(text.ends_with("}\n") && text.matches('\n').count() == 1, "{text}");
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["ts"], "2026-11-22T07:07:54.960129Z");
        assert_eq!(value["request_id"], "req-1");
        assert_eq!(value["key"], "team-a/alice");
        assert_eq!(value["stream"], true);
        assert_eq!(value["status"], 200);
        assert_eq!(value["bytes"], 1234);
        assert_eq!(value["duration_ms"], 12.345);
        assert_eq!(value["upstream_ms"], 0.007);
        assert_eq!(value["prompt_tokens"], 16);
        assert_eq!((value["cached_tokens"].as_u64(), value["cost"].as_str()), (Some(12), Some("0.0000032")));
        assert_eq!(value["currency"], "USD");
        assert_eq!(value["completion_tokens"], 0);
        assert_eq!(value["error"], serde_json::Value::Null);
        assert!(value.get("user").is_none(), "a key's line names no user: {text}");
    }

    #[test]
    fn a_token_holder_is_named_beside_the_grant_and_cannot_break_the_line() {
        let hostile = "mallory\"},\"key\":\"x\n";
        let text = line_of("req-2", None, Some(hostile));
        assert_eq!(text.matches('\n').count(), 1, "{text}");
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!((value["user"].as_str(), value["key"].as_str()), (Some(hostile), Some("team-a/alice")));
        assert_eq!(value["client_user"], "said-to-be-ceo", "beside it, never in its place");
    }

    #[test]
    fn client_supplied_text_cannot_break_the_line() {
        let hostile = "a\"b\\c\nd\r\u{1}\u{7f}é";
        let text = line(hostile, Some("client_closed"));
        assert_eq!(text.matches('\n').count(), 1, "{text}");
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["request_id"], hostile);
        assert_eq!(value["error"], "client_closed");
    }

    #[test]
    fn dates_match_a_calendar() {
        for (days, expected) in
            [(0, (1970, 1, 1)), (59, (1970, 3, 1)), (11_016, (2000, 2, 29)), (20_414, (2025, 11, 22))]
        {
            assert_eq!(civil_from_days(days), expected, "day {days}");
        }
    }
}
