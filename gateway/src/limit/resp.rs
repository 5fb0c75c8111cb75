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

/// Deepest nesting of arrays accepted (the scripts reply one level deep).
pub const MAX_DEPTH: usize = 4;
/// Largest bulk string accepted: a reply the limiter waits for is never
/// larger, so a server (or anyone in its place) cannot make it buffer more.
pub const MAX_BULK: usize = 64 * 1024;
/// Most items in one array.
pub const MAX_ITEMS: usize = 1024;

/// The first complete reply in `bytes` and its length, or `None` if more
/// bytes are needed.
///
/// # Errors
/// Bytes that cannot be RESP2, or a reply deeper, longer or larger than
/// [`MAX_DEPTH`], [`MAX_ITEMS`] and [`MAX_BULK`] allow.
pub fn parse(bytes: &[u8]) -> Result<Option<(Reply, usize)>, ProtocolError> {
    parse_at(bytes, 0)
}

fn parse_at(bytes: &[u8], depth: usize) -> Result<Option<(Reply, usize)>, ProtocolError> {
    let Some(line_end) = memchr::memmem::find(bytes, b"\r\n") else {
        // A line longer than any reply we expect is not going to end well.
        return if bytes.len() > MAX_BULK { Err(ProtocolError("line too long")) } else { Ok(None) };
    };
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
            if length > MAX_BULK {
                return Err(ProtocolError("bulk string too large"));
            }
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
            if count > MAX_ITEMS {
                return Err(ProtocolError("array too long"));
            }
            if depth >= MAX_DEPTH {
                return Err(ProtocolError("arrays nested too deeply"));
            }
            let mut items = Vec::with_capacity(count.min(64));
            let mut at = after;
            for _ in 0..count {
                let Some((item, used)) = parse_at(&bytes[at..], depth + 1)? else { return Ok(None) };
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
    use waycast_crds::seeded::Xorshift;

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

    #[test]
    fn hostile_replies_are_bounded() {
        let deep = "*1\r\n".repeat(100_000);
        assert_eq!(parse(deep.as_bytes()), Err(ProtocolError("arrays nested too deeply")));
        assert!(parse(b"$18446744073709551615\r\n").is_err(), "not even an i64");
        assert_eq!(parse(b"$9223372036854775807\r\n"), Err(ProtocolError("bulk string too large")));
        assert_eq!(parse(b"*99999999\r\n"), Err(ProtocolError("array too long")));
        assert!(parse(&vec![b'+'; MAX_BULK + 1]).is_err(), "an endless line");
    }

    /// Whatever bytes arrive, the parser answers without panicking, and a
    /// reply it accepts re-parses to the same value from its own length.
    #[test]
    fn never_panics_on_any_input() {
        let alphabet: &[u8] = b"*$:+-\r\n0123456789-1abc";
        let mut random = Xorshift::new(0x9e37_79b9_7f4a_7c15);
        for _ in 0..20_000 {
            let mut input = Vec::new();
            let seed = random.next_u64();
            let length = (seed % 40) as usize;
            for step in 0..length {
                let mixed = seed.rotate_left(step as u32 * 7);
                input.push(alphabet[(mixed % alphabet.len() as u64) as usize]);
            }
            if let Ok(Some((reply, used))) = parse(&input) {
                assert_eq!(parse(&input[..used]).unwrap().map(|(r, _)| r), Some(reply));
            }
        }
    }

    /// The shared seeded generator, with the replies this test draws from it.
    struct Random(Xorshift);

    impl std::ops::Deref for Random {
        type Target = Xorshift;
        fn deref(&self) -> &Xorshift {
            &self.0
        }
    }

    impl std::ops::DerefMut for Random {
        fn deref_mut(&mut self) -> &mut Xorshift {
            &mut self.0
        }
    }

    impl Random {
        /// Text a status or error line may hold: anything but CR and LF.
        fn line(&mut self) -> String {
            let alphabet = ["a", "Z", "0", " ", "-", ":", "+", "*", "$", "é", "☃", "\t"];
            (0..self.below(24)).map(|_| alphabet[self.below(alphabet.len() as u64) as usize]).collect()
        }

        /// A bulk string's bytes: any, CR and LF included.
        fn bulk(&mut self) -> Vec<u8> {
            let length = match self.below(8) {
                0 => 0,
                1 => self.below(MAX_BULK as u64 + 1),
                _ => self.below(64),
            };
            (0..length).map(|_| self.next_u64() as u8).collect()
        }

        fn reply(&mut self, depth: usize) -> Reply {
            match self.below(if depth + 1 >= MAX_DEPTH { 6 } else { 8 }) {
                0 => Reply::Status(self.line()),
                1 => Reply::Error(self.line()),
                2 => Reply::Integer(self.next_u64() as i64),
                3 => Reply::Bulk(None),
                4 | 5 => Reply::Bulk(Some(self.bulk())),
                6 => Reply::Array(None),
                _ => Reply::Array(Some((0..self.below(6)).map(|_| self.reply(depth + 1)).collect())),
            }
        }
    }

    /// RESP2 as a server writes it: the reference the parser is held to.
    fn write(reply: &Reply, out: &mut Vec<u8>) {
        match reply {
            Reply::Status(text) => out.extend_from_slice(format!("+{text}\r\n").as_bytes()),
            Reply::Error(text) => out.extend_from_slice(format!("-{text}\r\n").as_bytes()),
            Reply::Integer(number) => out.extend_from_slice(format!(":{number}\r\n").as_bytes()),
            Reply::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
            Reply::Bulk(Some(bytes)) => {
                out.extend_from_slice(format!("${}\r\n", bytes.len()).as_bytes());
                out.extend_from_slice(bytes);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Array(None) => out.extend_from_slice(b"*-1\r\n"),
            Reply::Array(Some(items)) => {
                out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                for item in items {
                    write(item, out);
                }
            }
        }
    }

    /// Any reply within the bounds, written as a server writes it, parses
    /// back to itself with its exact length; every proper prefix asks for
    /// more; two in a row parse one after the other. A command the client
    /// encodes parses as the array of bulk strings it is.
    #[test]
    fn property_replies_round_trip_whatever_the_split() {
        let mut random = Random(Xorshift::new(0x51_7cc1_b727_220a));
        for _ in 0..3_000 {
            let (first, second) = (random.reply(0), random.reply(0));
            let mut wire = Vec::new();
            write(&first, &mut wire);
            let first_length = wire.len();
            write(&second, &mut wire);
            assert_eq!(parse(&wire), Ok(Some((first.clone(), first_length))), "{first:?}");
            assert_eq!(parse(&wire[first_length..]), Ok(Some((second.clone(), wire.len() - first_length))));
            for _ in 0..8 {
                let cut = random.below(first_length as u64) as usize;
                assert_eq!(parse(&wire[..cut]), Ok(None), "cut at {cut} of {first:?}");
            }
            let args: Vec<Vec<u8>> = (0..random.below(5)).map(|_| random.bulk()).collect();
            let parts: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let mut command = BytesMut::new();
            encode(&mut command, &parts);
            let expected = Reply::Array(Some(args.iter().map(|a| Reply::Bulk(Some(a.clone()))).collect()));
            assert_eq!(parse(&command), Ok(Some((expected, command.len()))));
        }
    }
}
