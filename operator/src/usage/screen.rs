//! A pod's usage report is untrusted input: a Gateway's author chooses its
//! pods' image, and one compromised pod may send anything. This screens a
//! report as it is parsed, so a report past a rule costs the operator what
//! it read up to the rule, never the whole report:
//!
//! ```text
//! bytes (a stream) ─► at most MAX_REPORT_BYTES ─► keys: each one this Gateway
//!   counts, at most MAX_REPORTED_KEYS ─► numbers within bounds ─► UsageReport
//!                   └─ any rule broken: the whole report is refused (Refusal)
//! ```
//!
//! Pure: no I/O, no clock. The collector (`mod.rs`) feeds it the body and
//! the keys the Gateway counts ([`Served`]).

use std::cell::Cell;
use std::collections::BTreeMap;
use std::io::Read;

use serde::de::{DeserializeSeed, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Number;
use waycast_crds::period::Period;
use waycast_crds::usage::{
    BudgetScope, BudgetSpend, MAX_REPORTED_BUDGETS, MAX_REPORTED_GRANTS, MAX_REPORTED_KEYS, MAX_REPORTED_MEMBERS,
    OTHER_KEYS, UsageReport, UsageTotals,
};

use super::served::Served;

/// The largest report taken from a pod (and ledger read back). A genuine
/// report of [`MAX_REPORTED_KEYS`] keys is some 12 MB.
pub const MAX_REPORT_BYTES: usize = 16 * 1024 * 1024;
/// The largest count (requests, tokens) one process reports for a key or
/// budget in a month: a million tokens a second for a whole month is
/// under 3·10¹².
pub const MAX_COUNT: u64 = 1_000_000_000_000_000;
/// The largest cost one process reports for a key or budget: a billion
/// units of the currency, in nano-units.
pub const MAX_COST_NANOS: u64 = 1_000_000_000_000_000_000;
/// Longest process instance name (a pod name and a suffix).
const MAX_INSTANCE_BYTES: usize = 253 + 32;
/// Longest budget window (`2026-11-26`, `2026-W48`).
const MAX_WINDOW_BYTES: usize = 16;

/// Why a report was refused whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refusal {
    /// Past [`MAX_REPORT_BYTES`].
    TooLarge,
    /// Past [`MAX_REPORTED_KEYS`] keys or [`MAX_REPORTED_BUDGETS`] budgets.
    TooManyKeys,
    /// Names a key (or a budget of a key or tenant) the Gateway does not count.
    ForeignKey,
    /// A count or cost past its bound, negative or not a whole number.
    OutOfBounds,
    /// Reports for a process of another pod.
    ForeignInstance,
    /// Not a usage report.
    Malformed,
}

impl Refusal {
    /// The CamelCase reason shown in the Gateway's status and Events.
    pub fn reason(self) -> &'static str {
        match self {
            Self::TooLarge => "ReportTooLarge",
            Self::TooManyKeys => "TooManyKeys",
            Self::ForeignKey => "ForeignKey",
            Self::OutOfBounds => "OutOfBounds",
            Self::ForeignInstance => "ForeignInstance",
            Self::Malformed => "Malformed",
        }
    }

    /// The metric label (bounded).
    pub fn metric_label(self) -> &'static str {
        match self {
            Self::TooLarge => "too_large",
            Self::TooManyKeys => "too_many_keys",
            Self::ForeignKey => "foreign_key",
            Self::OutOfBounds => "out_of_bounds",
            Self::ForeignInstance => "foreign_instance",
            Self::Malformed => "malformed",
        }
    }

    /// For a person; never names another team's object.
    pub fn message(self) -> String {
        match self {
            Self::TooLarge => format!("the usage report is larger than {MAX_REPORT_BYTES} bytes"),
            Self::TooManyKeys => format!(
                "the usage report lists more than {MAX_REPORTED_KEYS} keys or {MAX_REPORTED_BUDGETS} budget spends"
            ),
            Self::ForeignKey => "the usage report names a key, tenant or grant this Gateway does not serve".to_owned(),
            Self::OutOfBounds => {
                format!("the usage report holds a count past {MAX_COUNT} or a cost past {MAX_COST_NANOS} nano-units")
            }
            Self::ForeignInstance => "the usage report is for a process of another pod".to_owned(),
            Self::Malformed => "the response is not a usage report".to_owned(),
        }
    }
}

/// The report `body` holds, from the pod `pod`, screened against what the
/// Gateway counts (`served`); read as it comes, stopping at the first rule
/// broken.
///
/// # Errors
/// The rule the report broke; the report is refused whole.
pub fn screen(body: impl Read, pod: &str, served: &Served) -> Result<UsageReport, Refusal> {
    let broken = Cell::new(None);
    let mut capped = Capped { inner: body, left: MAX_REPORT_BYTES, over: false };
    let mut parser = serde_json::Deserializer::from_reader(&mut capped);
    let parsed = ReportSeed { served, broken: &broken }.deserialize(&mut parser).and_then(|report| {
        parser.end()?;
        Ok(report)
    });
    drop(parser);
    if capped.over {
        return Err(Refusal::TooLarge);
    }
    let report = parsed.map_err(|_| broken.get().unwrap_or(Refusal::Malformed))?;
    let ours = report.instance.strip_prefix(pod).is_some_and(|rest| rest.starts_with('-'));
    if !ours || report.instance.len() > MAX_INSTANCE_BYTES {
        return Err(Refusal::ForeignInstance);
    }
    if !is_month(&report.month) {
        return Err(Refusal::Malformed);
    }
    Ok(report)
}

/// `YYYY-MM`.
fn is_month(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == 7 && bytes[4] == b'-' && bytes.iter().enumerate().all(|(i, b)| i == 4 || b.is_ascii_digit())
}

/// A reader that fails past its byte budget, and says so.
struct Capped<R> {
    inner: R,
    left: usize,
    over: bool,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // One byte past the budget is asked for, to tell "exactly at" from "past".
        let want = buf.len().min(self.left.saturating_add(1));
        let read = self.inner.read(&mut buf[..want])?;
        if read > self.left {
            self.over = true;
            return Err(std::io::Error::other("past the byte cap"));
        }
        self.left -= read;
        Ok(read)
    }
}

// === the report's parts, checked as they are read ===

struct ReportSeed<'a> {
    served: &'a Served,
    broken: &'a Cell<Option<Refusal>>,
}

impl<'a> ReportSeed<'a> {
    fn refuse<E: serde::de::Error>(&self, refusal: Refusal) -> E {
        self.broken.set(Some(refusal));
        E::custom(refusal.reason())
    }
}

impl<'de> DeserializeSeed<'de> for ReportSeed<'_> {
    type Value = UsageReport;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<UsageReport, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ReportSeed<'_> {
    type Value = UsageReport;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a usage report")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UsageReport, A::Error> {
        let mut report = UsageReport::default();
        let (mut instance, mut month) = (false, false);
        while let Some(field) = map.next_key::<String>()? {
            match field.as_str() {
                "instance" => (report.instance, instance) = (map.next_value()?, true),
                "sequence" => report.sequence = map.next_value()?,
                "month" => (report.month, month) = (map.next_value()?, true),
                "keys" => report.keys = map.next_value_seed(KeysSeed(&self, Listed::Keys))?,
                "grants" => report.grants = map.next_value_seed(KeysSeed(&self, Listed::Grants))?,
                "budgets" => report.budgets = map.next_value_seed(BudgetsSeed(&self))?,
                // A newer gateway may say more: what is not read is not kept.
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if !(instance && month) {
            return Err(A::Error::custom("instance and month are required"));
        }
        Ok(report)
    }
}

/// Which usage map a [`KeysSeed`] reads.
#[derive(Clone, Copy)]
enum Listed {
    /// `keys`: keys' ids, and the total of keys past the cap.
    Keys,
    /// `grants`: AccessGrants' ids.
    Grants,
}

struct KeysSeed<'s, 'a>(&'s ReportSeed<'a>, Listed);

impl<'de> DeserializeSeed<'de> for KeysSeed<'_, '_> {
    type Value = BTreeMap<String, UsageTotals>;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for KeysSeed<'_, '_> {
    type Value = BTreeMap<String, UsageTotals>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("usage per key")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut keys = BTreeMap::new();
        let mut listed = 0_usize;
        // The one total past the listed keys comes on top of them.
        let most = match self.1 {
            Listed::Keys => MAX_REPORTED_KEYS + 1,
            Listed::Grants => MAX_REPORTED_GRANTS,
        };
        while let Some(id) = map.next_key::<String>()? {
            listed += 1;
            if listed > most {
                return Err(self.0.refuse(Refusal::TooManyKeys));
            }
            let counted = match self.1 {
                Listed::Keys => id == OTHER_KEYS || self.0.served.counts(&id),
                Listed::Grants => self.0.served.counts_grant(&id),
            };
            if !counted {
                return Err(self.0.refuse(Refusal::ForeignKey));
            }
            let raw: RawTotals = map.next_value()?;
            let totals = raw.checked().ok_or_else(|| self.0.refuse(Refusal::OutOfBounds))?;
            keys.insert(id, totals);
        }
        Ok(keys)
    }
}

struct BudgetsSeed<'s, 'a>(&'s ReportSeed<'a>);

impl<'de> DeserializeSeed<'de> for BudgetsSeed<'_, '_> {
    type Value = Vec<BudgetSpend>;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for BudgetsSeed<'_, '_> {
    type Value = Vec<BudgetSpend>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("budget spends")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut budgets = Vec::new();
        // NB: a gateway reports one window per scope and period (the
        // current one). A second, or a window that is no calendar key,
        // would let a report carry budgets the ledger keeps and rewrites
        // every round without bound, so it refuses the report.
        let mut seen = std::collections::BTreeSet::new();
        // A member's digest is any 32 hex digits: this bound is what keeps
        // the members a report can invent (and the baseline every budget
        // shares) small.
        let mut members = 0_usize;
        while let Some(raw) = seq.next_element::<RawBudget>()? {
            if budgets.len() >= MAX_REPORTED_BUDGETS {
                return Err(self.0.refuse(Refusal::TooManyKeys));
            }
            let scoped = match BudgetScope::parse(&raw.scope) {
                Some(BudgetScope::Key(id)) => self.0.served.counts(id),
                Some(BudgetScope::Tenant(namespace)) => self.0.served.tenant(namespace),
                Some(BudgetScope::Grant(id)) => self.0.served.grant(id),
                Some(BudgetScope::Member { grant, .. }) => {
                    members += 1;
                    if members > MAX_REPORTED_MEMBERS {
                        return Err(self.0.refuse(Refusal::TooManyKeys));
                    }
                    self.0.served.grant(grant)
                }
                None => false,
            };
            if !scoped {
                return Err(self.0.refuse(Refusal::ForeignKey));
            }
            if raw.window.len() > MAX_WINDOW_BYTES
                || !raw.window.bytes().all(|b| b.is_ascii_digit() || b == b'-' || b == b'W')
                || !seen.insert((raw.scope.clone(), raw.period))
            {
                return Err(self.0.refuse(Refusal::Malformed));
            }
            let (Some(tokens), Some(cost_nanos)) =
                (count(&raw.tokens, MAX_COUNT), count(&raw.cost_nanos, MAX_COST_NANOS))
            else {
                return Err(self.0.refuse(Refusal::OutOfBounds));
            };
            budgets.push(BudgetSpend { scope: raw.scope, period: raw.period, window: raw.window, tokens, cost_nanos });
        }
        Ok(budgets)
    }
}

/// A key's totals as sent: any JSON number, checked after.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawTotals {
    requests: Option<Number>,
    input_tokens: Option<Number>,
    output_tokens: Option<Number>,
    cached_input_tokens: Option<Number>,
    cost_nanos: Option<Number>,
}

impl RawTotals {
    /// Within bounds (an absent count is zero), or `None`.
    fn checked(&self) -> Option<UsageTotals> {
        let zero = Number::from(0_u64);
        let get = |field: &Option<Number>, max| count(field.as_ref().unwrap_or(&zero), max);
        Some(UsageTotals {
            requests: get(&self.requests, MAX_COUNT)?,
            input_tokens: get(&self.input_tokens, MAX_COUNT)?,
            output_tokens: get(&self.output_tokens, MAX_COUNT)?,
            cached_input_tokens: get(&self.cached_input_tokens, MAX_COUNT)?,
            cost_nanos: get(&self.cost_nanos, MAX_COST_NANOS)?,
        })
    }
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawBudget {
    scope: String,
    period: Period,
    window: String,
    tokens: Number,
    cost_nanos: Number,
}

/// A whole number from 0 to `max`.
fn count(number: &Number, max: u64) -> Option<u64> {
    number.as_u64().filter(|n| *n <= max)
}

#[cfg(test)]
#[path = "screen_tests.rs"]
mod tests;
