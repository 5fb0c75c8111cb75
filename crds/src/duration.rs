//! Human durations (`500ms`, `5s`, `1m30s`, `2h`) as used in ModelEndpoint
//! timeouts and in the compiled config.

use std::time::Duration;

/// Why a duration text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Nothing to parse.
    #[error("empty duration")]
    Empty,
    /// A number without a unit, a unit without a number, or another character.
    #[error("invalid duration {0:?}: use a number and a unit (ms, s, m, h), e.g. 5s or 1m30s")]
    Malformed(String),
    /// More than `u64::MAX` seconds.
    #[error("duration {0:?} is too long")]
    Overflow(String),
}

/// Parses `<number><unit>` runs, units `ms`, `s`, `m`, `h`; numbers may have
/// a fraction (`1.5s`).
///
/// # Errors
/// [`DurationError`] when the text is empty, malformed or absurdly long.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    let malformed = || DurationError::Malformed(text.to_owned());
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(malformed)?;
        let (number, after) = rest.split_at(number_len);
        if number.is_empty() || number.starts_with('.') || number.ends_with('.') || number.matches('.').count() > 1 {
            return Err(malformed());
        }
        let unit_len = after.find(|c: char| c.is_ascii_digit()).unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let unit_seconds = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(malformed()),
        };
        let value: f64 = number.parse().map_err(|_| malformed())?;
        let part =
            Duration::try_from_secs_f64(value * unit_seconds).map_err(|_| DurationError::Overflow(text.to_owned()))?;
        total = total.checked_add(part).ok_or_else(|| DurationError::Overflow(text.to_owned()))?;
        rest = next;
    }
    Ok(total)
}

/// Formats a duration the way [`parse`] reads it, shortest exact form first
/// (`5s`, `300ms`, `1.5s`).
pub fn format(duration: Duration) -> String {
    let millis = duration.as_millis();
    if !duration.subsec_nanos().is_multiple_of(1_000_000) {
        return format!("{}s", duration.as_secs_f64());
    }
    if !millis.is_multiple_of(1000) {
        return format!("{millis}ms");
    }
    let seconds = duration.as_secs();
    if seconds != 0 && seconds.is_multiple_of(3600) {
        format!("{}h", seconds / 3600)
    } else if seconds != 0 && seconds.is_multiple_of(60) {
        format!("{}m", seconds / 60)
    } else {
        format!("{seconds}s")
    }
}

/// Serde adapter: a [`Duration`] as its text form.
pub mod serde_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Serializes as `5s`, `300ms`, ...
    ///
    /// # Errors
    /// Those of the serializer.
    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&super::format(*duration))
    }

    /// Deserializes from `5s`, `300ms`, `1m30s`, ...
    ///
    /// # Errors
    /// A text [`super::parse`] refuses.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        super::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_fractions_and_runs() {
        let cases = [
            ("5s", Duration::from_secs(5)),
            ("300ms", Duration::from_millis(300)),
            ("1m30s", Duration::from_secs(90)),
            ("2h", Duration::from_secs(7200)),
            ("1.5s", Duration::from_millis(1500)),
            ("0s", Duration::ZERO),
        ];
        for (text, expected) in cases {
            assert_eq!(parse(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn refuses_malformed_text() {
        for text in ["5", "s", "5x", "1.s", ".5s", "5 s", "-5s", "1..2s", "5sm"] {
            assert!(matches!(parse(text), Err(DurationError::Malformed(_))), "{text}");
        }
        assert_eq!(parse(""), Err(DurationError::Empty));
        assert!(matches!(parse("99999999999999999999h"), Err(DurationError::Overflow(_))));
    }

    #[test]
    fn format_round_trips() {
        for text in ["5s", "300ms", "2m", "3h", "1.5s", "0s", "90s"] {
            let parsed = parse(text).unwrap();
            assert_eq!(parse(&format(parsed)).unwrap(), parsed, "{text}");
        }
        assert_eq!(format(Duration::from_secs(60)), "1m");
        assert_eq!(format(Duration::from_millis(1500)), "1500ms");
    }
}
