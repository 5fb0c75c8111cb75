//! The export headers as the OpenTelemetry variable gives them
//! (`OTEL_EXPORTER_OTLP_HEADERS`, and the binaries' `--otlp-headers`):
//! `name=value,name=value`, values percent-decoded. They carry the
//! collector's token, so the text is never shown and no error quotes it.

use std::collections::BTreeMap;

/// A flag's text that is never shown (`--help`, Debug, errors): the OTLP
/// headers carry the collector's token.
#[derive(Clone, Default)]
pub struct HiddenText(pub String);

impl std::str::FromStr for HiddenText {
    type Err = std::convert::Infallible;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(Self(text.to_owned()))
    }
}

impl std::fmt::Debug for HiddenText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<hidden>")
    }
}

/// `name=value,name=value`, names lower-cased, values percent-decoded as
/// the OTLP exporter specification says (`%20` for a space).
///
/// # Errors
/// Which entry or header is malformed, by its place or name, never its value.
pub fn parse_headers(text: &str) -> Result<BTreeMap<String, String>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .enumerate()
        .map(|(index, pair)| {
            let (name, value) = pair.split_once('=').ok_or_else(|| format!("entry {} is not name=value", index + 1))?;
            let name = name.trim().to_ascii_lowercase();
            let value = percent_decoded(value.trim()).map_err(|why| format!("header {name:?}: {why}"))?;
            Ok((name, value))
        })
        .collect()
}

fn percent_decoded(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = text.get(at + 1..at + 3).ok_or("a % without two hex digits")?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| "a % without two hex digits".to_owned())?);
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "not UTF-8 once decoded".to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

    use super::*;

    #[test]
    fn headers_are_read_decoded_and_named_in_lower_case() {
        let read = parse_headers(" Authorization=Bearer%20s3cret , x-scope=team-a,,").unwrap();
        assert_eq!(
            read,
            BTreeMap::from([
                ("authorization".to_owned(), "Bearer s3cret".to_owned()),
                ("x-scope".to_owned(), "team-a".to_owned()),
            ])
        );
        assert!(parse_headers("").unwrap().is_empty());
    }

    #[test]
    fn errors_name_the_entry_or_header_and_never_a_value() {
        assert_eq!(parse_headers("a=1,s3cret").unwrap_err(), "entry 2 is not name=value");
        for bad in ["authorization=s3cret%2", "authorization=s3cret%zz", "authorization=s3cret%ff"] {
            let error = parse_headers(bad).unwrap_err();
            assert!(error.starts_with("header \"authorization\""), "{error}");
            assert!(!error.contains("s3cret"), "{error}");
        }
        assert_eq!(format!("{:?}", HiddenText("authorization=s3cret".into())), "<hidden>");
    }
}
