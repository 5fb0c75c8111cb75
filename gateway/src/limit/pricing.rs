//! A request at its model's prices: what it asks of its budgets at
//! admission (its worst case in tokens and in money), and what it cost
//! once it was charged. Pure: the prices come from the route, the budgets
//! from the key and its namespace, the clock from the caller.
//!
//! ```text
//! admission  reservation ─► budgets_asked: tokens, prompt estimate × input + output bound × output ─► admit
//! the end    Charged     ─► Priced::cost (prompt, cached, completion at their prices)            ─► settle
//! ```

use std::sync::Arc;

use jiff::Timestamp;
use jiff::tz::TimeZone;
use waycast_crds::money::{Money, TokenPrices};

use super::budget::{Budget, Need};
use super::charge::{Charged, Reservation};
use super::in_redis::BudgetAsk;

/// A model's prices as a request is charged at them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Priced {
    /// Per million tokens of each kind.
    pub prices: TokenPrices,
    /// Their currency.
    pub currency: Arc<str>,
    /// Whether they are in the currency the budgets count in: only then
    /// does a request's cost count in its key's month.
    pub in_budget_currency: bool,
}

impl Priced {
    /// `prices` (as a route holds them, in `currency`) for budgets that
    /// count in `counted_in`; `currency` is kept as `own` copies it (the
    /// request path keeps a worker's own copy of a shared name).
    pub fn of(
        (prices, currency): &(TokenPrices, Arc<str>),
        counted_in: &str,
        own: impl FnOnce(&Arc<str>) -> Arc<str>,
    ) -> Self {
        Self { prices: *prices, currency: own(currency), in_budget_currency: **currency == *counted_in }
    }

    /// What `charged` costs.
    pub fn cost(&self, charged: Charged) -> Money {
        self.prices.cost(charged.prompt, charged.cached, charged.completion)
    }

    /// What a request's worst case costs: its prompt estimate at the input
    /// price, its output bound at the output price.
    pub fn worst_case(&self, reservation: Reservation) -> Money {
        self.prices.cost(reservation.request_bytes.div_ceil(4), 0, reservation.output)
    }
}

/// A cost budget applies and the model is priced in another currency than
/// the budgets count in: its cost cannot be counted against them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrencyMismatch {
    /// The model's prices' currency.
    pub currency: String,
    /// The budgets' currency.
    pub counted_in: String,
}

/// The budgets a request's key is under: its own and its namespace's,
/// the currency they count cost in, the zone their periods start in.
#[derive(Clone, Copy)]
pub struct Budgets<'a> {
    /// The key's.
    pub key: &'a [Budget],
    /// Its namespace's.
    pub tenant: &'a [Budget],
    /// A grant member's own (none for a key).
    pub user: &'a [Budget],
    /// The currency cost budgets count in.
    pub counted_in: &'a str,
    /// The zone periods start in.
    pub zone: &'a TimeZone,
}

/// What a request asks of `budgets` at `now()` — the clock is read only
/// when one has a budget: its token reservation, and its worst case at the
/// model's prices ([`Priced::worst_case`]; nothing when the model is not
/// priced). `None` when there is no budget.
///
/// # Errors
/// [`CurrencyMismatch`]: a cost budget applies and the model is priced in
/// another currency than the budgets count in.
#[inline]
pub fn budgets_asked<'a>(
    budgets: &Budgets<'a>,
    priced: Option<&Priced>,
    reservation: Reservation,
    now: impl FnOnce() -> Timestamp,
) -> Result<Option<BudgetAsk<'a>>, CurrencyMismatch> {
    let Budgets { key, tenant, user, counted_in, zone } = *budgets;
    if key.is_empty() && tenant.is_empty() && user.is_empty() {
        return Ok(None);
    }
    if let Some(priced) = priced.filter(|priced| !priced.in_budget_currency)
        && key.iter().chain(tenant).chain(user).any(|budget| budget.cost.is_some())
    {
        return Err(CurrencyMismatch { currency: priced.currency.to_string(), counted_in: counted_in.to_owned() });
    }
    let cost = priced.map_or(0, |priced| priced.worst_case(reservation).0);
    Ok(Some(BudgetAsk { key, tenant, user, need: Need { tokens: reservation.tokens, cost }, zone, now: now() }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

    use waycast_crds::period::Period;
    use waycast_crds::spend::BudgetConfig;

    use super::*;

    fn budget(tokens: Option<u64>, cost: Option<&str>) -> Budget {
        let config = BudgetConfig { period: Period::Day, tokens, cost: cost.map(str::to_owned) };
        Budget::new(&config, Arc::default())
    }

    /// $1 per million input tokens, $2 per million output tokens, $0.50
    /// per million cached.
    fn priced(currency: &str, counted_in: &str) -> Priced {
        let prices = TokenPrices { input: 1_000_000_000, output: 2_000_000_000, cached_input: 500_000_000 };
        Priced::of(&(prices, Arc::from(currency)), counted_in, Arc::clone)
    }

    #[test]
    fn what_a_request_asks_of_its_budgets() {
        let now = || "2026-11-26T10:00:00Z".parse::<Timestamp>().unwrap();
        let zone = TimeZone::UTC;
        // 400 request bytes (100 prompt tokens estimated), 50 output.
        let reservation = Reservation {
            tokens: 150,
            request_bytes: 400,
            body_bytes: 400,
            output: 50,
            free: false,
            media_answer: false,
        };
        let tokens = [budget(Some(1_000), None)];
        let money = [budget(None, Some("5.00"))];
        let none: [Budget; 0] = [];
        let usd = priced("USD", "USD");
        let eur = priced("EUR", "USD");
        type Row<'a> = (&'a str, [&'a [Budget]; 2], Option<&'a Priced>, Result<Option<Need>, &'a str>);
        let rows: [Row<'_>; 6] = [
            ("no budget: nothing asked", [&none, &none], Some(&usd), Ok(None)),
            ("a token budget, unpriced model", [&tokens, &none], None, Ok(Some(Need { tokens: 150, cost: 0 }))),
            // 100 × $1/M + 50 × $2/M = $0.0002.
            ("the tenant's cost budget", [&none, &money], Some(&usd), Ok(Some(Need { tokens: 150, cost: 200_000 }))),
            ("a cost budget, another currency", [&money, &none], Some(&eur), Err("EUR")),
            // Only a cost budget cannot count a foreign price.
            (
                "a token budget, another currency",
                [&tokens, &none],
                Some(&eur),
                Ok(Some(Need { tokens: 150, cost: 200_000 })),
            ),
            ("a cost budget, unpriced model", [&money, &tokens], None, Ok(Some(Need { tokens: 150, cost: 0 }))),
        ];
        for (name, budgets, priced, expected) in rows {
            let [key, tenant] = budgets;
            let budgets = Budgets { key, tenant, user: &[], counted_in: "USD", zone: &zone };
            let got = budgets_asked(&budgets, priced, reservation, now).map(|asked| asked.map(|ask| ask.need)).map_err(
                |mismatch| {
                    assert_eq!(mismatch.counted_in, "USD");
                    mismatch.currency
                },
            );
            assert_eq!(got.as_ref().map(|need| *need).map_err(String::as_str), expected, "{name}");
        }
    }

    #[test]
    fn a_charge_costs_each_kind_at_its_price() {
        let usd = priced("USD", "USD");
        assert!(usd.in_budget_currency && !priced("EUR", "USD").in_budget_currency);
        // 900 uncached prompt tokens at $1/M, 100 cached at $0.50/M, 10 output at $2/M.
        let charged = Charged { prompt: 1_000, cached: 100, completion: 10 };
        assert_eq!(usd.cost(charged), Money(900_000 + 50_000 + 20_000));
        assert_eq!(usd.cost(Charged::default()), Money(0));
    }
}
