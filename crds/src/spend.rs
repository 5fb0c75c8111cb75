//! What a Gateway's traffic costs (DESIGN "Sharing capacity and spend"):
//! a model's prices (`ModelEndpoint.spec.pricing`), decimal strings that
//! become whole nano-units ([`crate::money`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A decimal amount: digits, and up to 9 decimals after a point.
pub const DECIMAL_PATTERN: &str = r"^[0-9]{1,10}(\.[0-9]{1,9})?$";

/// What a model's tokens cost, per million, in one currency. Each request's
/// cost (prompt tokens less those read from the server's cache at the
/// input price, cached ones at the cached price, completion tokens at the
/// output price) is in its usage record and counted by key and model.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pricing {
    /// ISO 4217 code, e.g. `USD`.
    #[schemars(length(min = 3, max = 3), pattern(r"^[A-Z]{3}$"))]
    pub currency: String,
    /// Per million prompt tokens, as a decimal string (`"0.20"`): money is
    /// never floating point.
    #[schemars(length(min = 1, max = 21), pattern(r"^[0-9]{1,10}(\.[0-9]{1,9})?$"))]
    pub input_per_million_tokens: String,
    /// Per million completion tokens, as a decimal string (`"0.60"`).
    #[schemars(length(min = 1, max = 21), pattern(r"^[0-9]{1,10}(\.[0-9]{1,9})?$"))]
    pub output_per_million_tokens: String,
    /// Per million prompt tokens the server read from its prefix cache (as
    /// the upstream reports them: OpenAI's `cached_tokens`, Anthropic's
    /// `cache_read_input_tokens`). Absent: the input price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 21), pattern(r"^[0-9]{1,10}(\.[0-9]{1,9})?$"))]
    pub cached_input_per_million_tokens: Option<String>,
}

impl Pricing {
    /// The compiled form (the same strings, checked by the config's
    /// validation).
    pub fn config(&self) -> crate::money::PricingConfig {
        crate::money::PricingConfig {
            currency: self.currency.clone(),
            input_per_million_tokens: self.input_per_million_tokens.clone(),
            output_per_million_tokens: self.output_per_million_tokens.clone(),
            cached_input_per_million_tokens: self.cached_input_per_million_tokens.clone(),
        }
    }
}
