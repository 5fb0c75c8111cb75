//! Money without floating point: amounts are whole nano-units of a currency
//! (10⁻⁹ of a dollar, say), parsed from and written as decimal strings
//! (`"0.20"`, `"2000.00"`). A price per million tokens with up to 9
//! decimals gives an exact price per token (`"0.20"` per million is 200
//! nano-units a token), so a request's cost is an exact integer, and sums
//! of records equal the totals to the last nano-unit.

use std::fmt;

/// Nano-units in one unit of a currency.
pub const NANOS_PER_UNIT: u64 = 1_000_000_000;
/// The largest amount a config may name: a billion units (far above any
/// budget, far below `u64::MAX` nano-units, so sums of a period stay exact).
pub const MAX_UNITS: u64 = 1_000_000_000;

/// An amount of money, in nano-units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Money(pub u64);

/// Why a decimal string is not an amount.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    /// Not `digits[.digits]`.
    #[error("{0:?} is not a decimal amount such as \"12.50\"")]
    NotDecimal(String),
    /// More than 9 decimals.
    #[error("{0:?} has more than 9 decimals")]
    TooPrecise(String),
    /// Above [`MAX_UNITS`].
    #[error("{0:?} is more than {MAX_UNITS}")]
    TooLarge(String),
}

impl Money {
    /// Zero.
    pub const ZERO: Money = Money(0);

    /// Parses `"12"`, `"12.5"`, `"0.000000001"`: digits, an optional point
    /// and up to 9 decimals; no sign, no exponent, no separators.
    ///
    /// # Errors
    /// [`MoneyError`] naming the text.
    pub fn parse(text: &str) -> Result<Self, MoneyError> {
        let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
        let digits = |part: &str| part.bytes().all(|b| b.is_ascii_digit());
        if whole.is_empty() || !digits(whole) || !digits(fraction) || (text.contains('.') && fraction.is_empty()) {
            return Err(MoneyError::NotDecimal(text.to_owned()));
        }
        if fraction.len() > 9 {
            return Err(MoneyError::TooPrecise(text.to_owned()));
        }
        // Digits only: a failed parse is an overflow.
        let whole: u64 = whole
            .parse()
            .ok()
            .filter(|units| *units <= MAX_UNITS)
            .ok_or_else(|| MoneyError::TooLarge(text.to_owned()))?;
        let mut nanos: u64 = 0;
        for (position, digit) in fraction.bytes().enumerate() {
            nanos += u64::from(digit - b'0') * 10_u64.pow(8 - u32::try_from(position).unwrap_or(8));
        }
        let total = whole * NANOS_PER_UNIT + nanos;
        if total > MAX_UNITS * NANOS_PER_UNIT {
            return Err(MoneyError::TooLarge(text.to_owned()));
        }
        Ok(Self(total))
    }

    /// `self + other`, saturating.
    pub fn plus(self, other: Money) -> Money {
        Money(self.0.saturating_add(other.0))
    }
}

/// At least two decimals, at most nine, trailing zeros beyond two dropped:
/// `12.34`, `0.0000002`, `2000.00`.
impl fmt::Display for Money {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / NANOS_PER_UNIT;
        let fraction = format!("{:09}", self.0 % NANOS_PER_UNIT);
        let kept = fraction.trim_end_matches('0');
        let kept = if kept.len() < 2 { &fraction[..2] } else { kept };
        write!(f, "{whole}.{kept}")
    }
}

/// Prices of a model, per token, in nano-units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TokenPrices {
    /// A prompt token.
    pub input: u64,
    /// A completion token.
    pub output: u64,
    /// A prompt token the server read from its cache.
    pub cached_input: u64,
}

impl TokenPrices {
    /// From prices per million tokens. A price per million in nano-units is
    /// a price per token in femto-units: it is kept per million and divided
    /// once per request, rounding the request's cost up.
    pub fn per_million(input: Money, output: Money, cached_input: Money) -> Self {
        Self { input: input.0, output: output.0, cached_input: cached_input.0 }
    }

    /// What `input` prompt tokens (of which `cached` read from the
    /// server's cache) and `output` completion tokens cost, rounded up to
    /// a whole nano-unit.
    pub fn cost(&self, input: u64, cached: u64, output: u64) -> Money {
        let cached = cached.min(input);
        let per_million = u128::from(input - cached) * u128::from(self.input)
            + u128::from(cached) * u128::from(self.cached_input)
            + u128::from(output) * u128::from(self.output);
        Money(u64::try_from(per_million.div_ceil(1_000_000)).unwrap_or(u64::MAX))
    }
}

/// A model's prices as a config writes them: decimal strings per million
/// tokens, and the currency they are in.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PricingConfig {
    /// ISO 4217 code, e.g. `USD`.
    pub currency: String,
    /// Per million prompt tokens, e.g. `"0.20"`.
    pub input_per_million_tokens: String,
    /// Per million completion tokens.
    pub output_per_million_tokens: String,
    /// Per million prompt tokens the server read from its cache; absent:
    /// the input price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_per_million_tokens: Option<String>,
}

impl PricingConfig {
    /// The prices per token.
    ///
    /// # Errors
    /// The first price that is not a decimal amount, with its field.
    pub fn prices(&self) -> Result<TokenPrices, (&'static str, MoneyError)> {
        let input = Money::parse(&self.input_per_million_tokens).map_err(|e| ("inputPerMillionTokens", e))?;
        let output = Money::parse(&self.output_per_million_tokens).map_err(|e| ("outputPerMillionTokens", e))?;
        let cached = match &self.cached_input_per_million_tokens {
            Some(text) => Money::parse(text).map_err(|e| ("cachedInputPerMillionTokens", e))?,
            None => input,
        };
        Ok(TokenPrices::per_million(input, output, cached))
    }
}

/// Whether `code` is written like an ISO 4217 currency code (three capital letters).
pub fn is_currency_code(code: &str) -> bool {
    code.len() == 3 && code.bytes().all(|b| b.is_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_strings_parse_exactly_and_print_back() {
        let cases = [
            ("0", 0, "0.00"),
            ("12", 12 * NANOS_PER_UNIT, "12.00"),
            ("0.20", 200_000_000, "0.20"),
            ("12.34", 12_340_000_000, "12.34"),
            ("0.000000001", 1, "0.000000001"),
            ("2000.5", 2_000_500_000_000, "2000.50"),
            ("1000000000", MAX_UNITS * NANOS_PER_UNIT, "1000000000.00"),
        ];
        for (text, nanos, shown) in cases {
            let money = Money::parse(text).unwrap();
            assert_eq!(money, Money(nanos), "{text}");
            assert_eq!(money.to_string(), shown, "{text}");
            assert_eq!(Money::parse(shown).unwrap(), money, "{shown} reads back");
        }
        for bad in ["", ".5", "5.", "-1", "1e3", "1,5", " 1", "0x10", "1.2.3", "١"] {
            assert!(matches!(Money::parse(bad), Err(MoneyError::NotDecimal(_))), "{bad:?}");
        }
        assert!(matches!(Money::parse("0.0000000001"), Err(MoneyError::TooPrecise(_))));
        assert!(matches!(Money::parse("1000000000.01"), Err(MoneyError::TooLarge(_))));
        assert!(matches!(Money::parse("99999999999999999999999"), Err(MoneyError::TooLarge(_))));
    }

    #[test]
    fn a_requests_cost_is_exact_and_rounded_up_once() {
        let money = |text| Money::parse(text).unwrap();
        let prices = TokenPrices::per_million(money("0.20"), money("0.60"), money("0.05"));
        // 1,000 prompt tokens (200 of them cached) and 500 completion tokens:
        // 800 × 0.20 + 200 × 0.05 + 500 × 0.60 per million = 0.00047.
        assert_eq!(prices.cost(1_000, 200, 500), money("0.00047"));
        // A price per million below a nano-unit a token still costs: rounded up.
        let cheap = TokenPrices::per_million(money("0.0001"), Money::ZERO, Money::ZERO);
        assert_eq!(cheap.cost(1, 0, 0), Money(1));
        // 0.0001 per million is a tenth of a nano-unit a token.
        assert_eq!(cheap.cost(10, 0, 0), Money(1));
        assert_eq!(cheap.cost(11, 0, 0), Money(2));
        assert_eq!(cheap.cost(10_000, 0, 0), Money(1_000));
        // More cached than prompt tokens (a confused upstream): capped.
        assert_eq!(prices.cost(10, 50, 0), prices.cost(10, 10, 0));
        // Sums of records equal the total: costs are integers.
        let total: u64 = (0..1_000).map(|i| prices.cost(i, i / 3, i * 2).0).sum();
        assert_eq!(total, (0..1_000).map(|i| prices.cost(i, i / 3, i * 2)).fold(Money::ZERO, Money::plus).0);
        assert_eq!(TokenPrices::default().cost(u64::MAX, 0, u64::MAX), Money::ZERO);
        let dear = TokenPrices::per_million(money("1000000000"), money("1000000000"), Money::ZERO);
        assert_eq!(dear.cost(u64::MAX, 0, u64::MAX), Money(u64::MAX), "saturates, never wraps");
    }
}
