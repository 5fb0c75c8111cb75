//! The part of Redis's wire protocol (RESP2) the limiter speaks: commands
//! out as arrays of bulk strings, replies in as any RESP2 value.

use bytes::{BufMut as _, BytesMut};

/// A reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`.
    Status(String),
    /// `-ERR ...`.
    Error(String),
    /// `:42`.
    Integer(i64),
    /// `$3\r\nabc` (`None`: the null bulk string).
    Bulk(Option<Vec<u8>>),
    /// `*2\r\n...` (`None`: the null array).
    Array(Option<Vec<Reply>>),
}

/// The server sent something that is not RESP2.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed reply from Redis: {0}")]
pub struct ProtocolError(&'static str);

/// Appends `args` as one command.
pub fn encode(out: &mut BytesMut, args: &[&[u8]]) {
    out.put_u8(b'*');
    out.extend_from_slice(args.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    for arg in args {
        out.put_u8(b'$');
        out.extend_from_slice(arg.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// The first complete reply in `bytes` and its length, or `None` if more
/// bytes are needed.
///
/// # Errors
/// Bytes that cannot be RESP2.
pub fn parse(bytes: &[u8]) -> Result<Option<(Reply, usize)>, ProtocolError> {
    let Some(line_end) = memchr::memmem::find(bytes, b"\r\n") else { return Ok(None) };
    let Some((&kind, line)) = bytes[..line_end].split_first() else { return Err(ProtocolError("empty line")) };
    let text = std::str::from_utf8(line).map_err(|_| ProtocolError("line is not text"))?;
    let after = line_end + 2;
    let number = || text.parse::<i64>().map_err(|_| ProtocolError("bad number"));
    match kind {
        b'+' => Ok(Some((Reply::Status(text.to_owned()), after))),
        b'-' => Ok(Some((Reply::Error(text.to_owned()), after))),
        b':' => Ok(Some((Reply::Integer(number()?), after))),
        b'$' => {
            let Ok(length) = usize::try_from(number()?) else { return Ok(Some((Reply::Bulk(None), after))) };
            let end = after + length;
            if bytes.len() < end + 2 {
                return Ok(None);
            }
            if &bytes[end..end + 2] != b"\r\n" {
                return Err(ProtocolError("bulk string not terminated"));
            }
            Ok(Some((Reply::Bulk(Some(bytes[after..end].to_vec())), end + 2)))
        }
        b'*' => {
            let Ok(count) = usize::try_from(number()?) else { return Ok(Some((Reply::Array(None), after))) };
            let mut items = Vec::with_capacity(count.min(64));
            let mut at = after;
            for _ in 0..count {
                let Some((item, used)) = parse(&bytes[at..])? else { return Ok(None) };
                items.push(item);
                at += used;
            }
            Ok(Some((Reply::Array(Some(items)), at)))
        }
        _ => Err(ProtocolError("unknown reply type")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut out = BytesMut::new();
        encode(&mut out, &[b"GET", b"key"]);
        assert_eq!(&out[..], b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n");
    }

    #[test]
    fn every_reply_type_and_partial_input() {
        let replies =
            b"+OK\r\n-NOSCRIPT No matching script\r\n:42\r\n$3\r\nabc\r\n$-1\r\n*2\r\n:1\r\n$1\r\nx\r\n*-1\r\n";
        let mut at = 0;
        let mut seen = Vec::new();
        while let Some((reply, used)) = parse(&replies[at..]).unwrap() {
            seen.push(reply);
            at += used;
        }
        assert_eq!(at, replies.len());
        assert_eq!(
            seen,
            vec![
                Reply::Status("OK".into()),
                Reply::Error("NOSCRIPT No matching script".into()),
                Reply::Integer(42),
                Reply::Bulk(Some(b"abc".to_vec())),
                Reply::Bulk(None),
                Reply::Array(Some(vec![Reply::Integer(1), Reply::Bulk(Some(b"x".to_vec()))])),
                Reply::Array(None),
            ]
        );
        for cut in 1..12 {
            assert_eq!(parse(&b"*2\r\n:1\r\n$1\r\nx\r\n"[..cut]).unwrap(), None, "cut at {cut}");
        }
        assert!(parse(b"?what\r\n").is_err());
        assert!(parse(b"$1\r\nxy\r\n").is_err());
    }
}
