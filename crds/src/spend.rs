//! What a Gateway's traffic costs (DESIGN "Sharing capacity and spend"):
//! a model's prices (`ModelEndpoint.spec.pricing`), decimal strings that
//! become whole nano-units ([`crate::money`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A decimal amount: digits, and up to 9 decimals after a point.
pub const DECIMAL_PATTERN: &str = r"^[0-9]{1,9}(\.[0-9]{1,9})?$";

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
    #[schemars(length(min = 1, max = 21), pattern(r"^[0-9]{1,9}(\.[0-9]{1,9})?$"))]
    pub input_per_million_tokens: String,
    /// Per million completion tokens, as a decimal string (`"0.60"`).
    #[schemars(length(min = 1, max = 21), pattern(r"^[0-9]{1,9}(\.[0-9]{1,9})?$"))]
    pub output_per_million_tokens: String,
    /// Per million prompt tokens the server read from its prefix cache (as
    /// the upstream reports them: OpenAI's `cached_tokens`, Anthropic's
    /// `cache_read_input_tokens`). Absent: the input price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 21), pattern(r"^[0-9]{1,9}(\.[0-9]{1,9})?$"))]
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

/// A budget: what a key (or a namespace's keys together) may spend in one
/// calendar period, in tokens, in money, or both. Reserved at admission
/// (the request's worst case), settled on its usage; past it, 429
/// `insufficient_quota` until the period starts over.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, kube::KubeSchema)]
#[x_kube(validation = kube::core::Rule::new("has(self.tokens) || has(self.cost)").message("a budget sets tokens, cost or both"))]
#[serde(rename_all = "camelCase")]
pub struct Budget {
    /// `Day`, `Week` (ISO, Monday first) or `Month`, in the Gateway's time
    /// zone (`spec.budgets.timeZone`).
    pub period: crate::period::Period,
    /// Tokens (prompt + completion) in the period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000_000_000_000_i64))]
    pub tokens: Option<i64>,
    /// Money in the period, as a decimal string in the Gateway's budget
    /// currency (`spec.budgets.currency`), counted at the models' prices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 21), pattern(r"^[0-9]{1,9}(\.[0-9]{1,9})?$"))]
    pub cost: Option<String>,
}

/// How a Gateway counts budgets.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayBudgets {
    /// The IANA time zone periods start in (`UTC`, `Europe/Berlin`): a day
    /// starts at local midnight. Default UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), pattern(r"^[A-Za-z0-9_+/-]+$"))]
    pub time_zone: Option<String>,
    /// The currency cost budgets count in (ISO 4217). A key with a cost
    /// budget is refused (403) on a model priced in another currency, whose
    /// cost cannot be counted against it. Default USD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 3), pattern(r"^[A-Z]{3}$"))]
    pub currency: Option<String>,
}

/// A budget as compiled.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BudgetConfig {
    /// The calendar period.
    pub period: crate::period::Period,
    /// Tokens in the period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Money in the period, as a decimal string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<String>,
}

impl Budget {
    /// The compiled form (checked by the config's validation).
    pub fn config(&self) -> BudgetConfig {
        BudgetConfig {
            period: self.period,
            tokens: self.tokens.and_then(|t| u64::try_from(t).ok()),
            cost: self.cost.clone(),
        }
    }
}

/// `settings.budgets`: the time zone and currency of every budget.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BudgetSettings {
    /// IANA time zone.
    #[serde(default = "BudgetSettings::utc")]
    pub time_zone: String,
    /// ISO 4217 code.
    #[serde(default = "BudgetSettings::usd")]
    pub currency: String,
}

impl BudgetSettings {
    fn utc() -> String {
        "UTC".to_owned()
    }
    fn usd() -> String {
        "USD".to_owned()
    }

    /// Whether both are the defaults (then they are not written).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl BudgetSettings {
    /// The zone is one the bundled database knows; the currency a code.
    pub(crate) fn check(&self, problems: &mut crate::problems::Collector) {
        if let Err(error) = crate::period::time_zone(&self.time_zone) {
            problems.add("settings.budgets.timeZone", error.to_string());
        }
        if !crate::money::is_currency_code(&self.currency) {
            problems.add("settings.budgets.currency", "must be an ISO 4217 code such as USD");
        }
    }
}

/// A key's or a tenant's budgets: each a token count or an amount (or both),
/// at most [`crate::spend::MAX_BUDGETS`].
pub(crate) fn check_budgets(
    path: &str,
    budgets: &[crate::spend::BudgetConfig],
    problems: &mut crate::problems::Collector,
) {
    if budgets.len() > crate::spend::MAX_BUDGETS {
        problems.add(path, format!("at most {} budgets", crate::spend::MAX_BUDGETS));
    }
    for (index, budget) in budgets.iter().enumerate() {
        let at = format!("{path}[{index}]");
        if budget.tokens.is_none() && budget.cost.is_none() {
            problems.add(&at, "a budget sets tokens, cost or both");
        }
        if budget.tokens == Some(0) {
            problems.add(format!("{at}.tokens"), "must be at least 1");
        }
        if let Some(cost) = &budget.cost
            && let Err(error) = crate::money::Money::parse(cost)
        {
            problems.add(format!("{at}.cost"), error.to_string());
        }
    }
}

impl Default for BudgetSettings {
    fn default() -> Self {
        Self { time_zone: Self::utc(), currency: Self::usd() }
    }
}

/// The most budgets a key or a namespace may have.
pub const MAX_BUDGETS: usize = 4;
