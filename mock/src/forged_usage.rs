//! A forged gateway pod: what a Gateway's author could run as
//! `spec.image` (or one compromised pod), answering the operator's usage
//! collection with reports meant to write other teams' usage or exhaust the
//! operator. The mock binary runs it when started as a gateway pod (the
//! operator's `WAYCAST_GATEWAY` is set); e2e tests use it to check that the
//! operator refuses them.
//!
//! ```text
//! GET /usage (admin port), in turn:
//!   0 ─► another team's key (`<namespace>-victim/victim`) with a cost of 9e18
//!   1 ─► the Gateway's own key `<namespace>/own` listed 1,100,000 times (~33 MB)
//!   2 ─► a genuine-looking report followed by 17 MiB of white space
//! GET /readyz, /healthz ─► 200 (the pod is Ready, so it is asked)
//! ```
//!
//! Bodies are written as they are made, never held whole.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// What the forged pod knows of itself (from the operator's environment).
#[derive(Debug, Clone)]
pub struct Forger {
    /// Its pod's name (a report's instance must start with it).
    pub pod: String,
    /// Its namespace.
    pub namespace: String,
}

/// Keys the oversized-key report lists.
pub const FORGED_KEYS: usize = 1_100_000;
/// White space after the padded report.
pub const PADDING_BYTES: usize = 17 * 1024 * 1024;

/// Serves the forged admin port on `listener` until the process ends.
///
/// # Errors
/// Accepting failed.
pub async fn serve(listener: TcpListener, forger: Forger) -> std::io::Result<()> {
    let forger = Arc::new(forger);
    let asked = Arc::new(AtomicU64::new(0));
    loop {
        let (stream, _) = listener.accept().await?;
        let (forger, asked) = (forger.clone(), asked.clone());
        tokio::spawn(async move {
            let _ = answer(stream, &forger, &asked).await;
        });
    }
}

async fn answer(mut stream: TcpStream, forger: &Forger, asked: &AtomicU64) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0_u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    if path != "/usage" {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok";
        return stream.write_all(ok).await;
    }
    let turn = asked.fetch_add(1, Ordering::Relaxed);
    stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n").await?;
    let start = format!(
        r#"{{"instance":"{}-forged","sequence":{},"month":"{}","budgets":[],"keys":{{"#,
        forger.pod,
        turn + 1,
        month_now()
    );
    stream.write_all(start.as_bytes()).await?;
    match turn % 3 {
        0 => {
            let victim =
                format!(r#""{}-victim/victim":{{"requests":1,"costNanos":9000000000000000000}}"#, forger.namespace);
            stream.write_all(victim.as_bytes()).await?;
        }
        1 => {
            let own = format!(r#""{}/own":{{"requests":1,"costNanos":1}}"#, forger.namespace);
            let mut batch = String::new();
            for i in 0..FORGED_KEYS {
                if i > 0 {
                    batch.push(',');
                }
                batch.push_str(&own);
                if batch.len() > 64 * 1024 {
                    stream.write_all(batch.as_bytes()).await?;
                    batch.clear();
                }
            }
            stream.write_all(batch.as_bytes()).await?;
        }
        _ => {
            let own = format!(r#""{}/own":{{"requests":1}}"#, forger.namespace);
            stream.write_all(own.as_bytes()).await?;
            let spaces = vec![b' '; 64 * 1024];
            for _ in 0..PADDING_BYTES / spaces.len() {
                stream.write_all(&spaces).await?;
            }
        }
    }
    stream.write_all(b"}}").await?;
    stream.shutdown().await
}

/// This month in UTC (`2026-11`), from the system clock.
fn month_now() -> String {
    let seconds = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = i64::try_from(seconds / 86_400).unwrap_or(0);
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_month_is_a_month() {
        let month = super::month_now();
        assert_eq!(month.len(), 7, "{month}");
        assert!(month.starts_with("20") && month.as_bytes()[4] == b'-', "{month}");
    }
}
