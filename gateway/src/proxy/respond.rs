//! The last stage: a request's answer made the client's response — the
//! gateway's own (`/v1/models`), an error, or the upstream's answer
//! prepared for the relay (an error page that is not JSON replaced, hop and
//! internal headers dropped, the rate-limit headers added, the usage
//! tapped).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};

use super::exchange::Exchange;
use super::forward::{self, Forwarded};
use super::stream::{ProxyBody, RelayBody, UsageWatch};
use crate::dialect::Dialect;
use crate::error::GatewayError;
use crate::limit::Admitted;
use crate::snapshot::{KeyEntry, Route, Snapshot};
use crate::upstream::UpstreamBody;

/// How a request is answered when it is not an error.
#[allow(
    clippy::large_enum_variant,
    reason = "Relay is the common case and lives only until the response is made; boxing it costs an allocation per request"
)]
pub enum Answer {
    /// By the gateway itself (`/v1/models`).
    Own(Bytes),
    /// By relaying an upstream response.
    Relay(Relayed),
    /// By an upstream answer read whole and translated for the client
    /// (`super::translated`).
    Whole(Whole),
}

/// An answer read whole and translated.
pub struct Whole {
    pub(super) head: http::response::Parts,
    pub(super) body: Bytes,
    pub(super) usage: Option<super::usage::Usage>,
    pub(super) upstream_took: Duration,
    pub(super) ending: crate::limit::Ending,
}

impl Whole {
    /// The client's response; the request ends now.
    pub(super) fn respond(self, exchange: Exchange) -> Response<ProxyBody> {
        let status = self.head.status.as_u16();
        exchange.finish(super::facts::Outcome {
            status,
            bytes: self.body.len() as u64,
            events: None,
            first_byte: Some(Instant::now()),
            upstream: Some(self.upstream_took),
            usage: self.usage,
            error: None,
            ended: None,
            ending: self.ending,
        });
        Response::from_parts(self.head, ProxyBody::from(self.body))
    }
}

/// An upstream response ready to relay, and what the relay needs.
pub struct Relayed {
    pub(super) head: http::response::Parts,
    pub(super) body: UpstreamBody,
    pub(super) idle_timeout: Duration,
    pub(super) usage_watch: UsageWatch,
    /// Request sent → response headers.
    pub(super) upstream_took: Duration,
    pub(super) headers_at: Instant,
    /// Makes a stream the client's dialect's, when the backend speaks another.
    pub(super) translator: Option<Box<crate::dialect::translate::answer::StreamTranslator>>,
}

/// The response for `answer`, an error in `dialect`; the exchange is
/// finished now, or by the relay when the relayed body ends.
pub fn response(answer: Result<Answer, GatewayError>, exchange: Exchange, dialect: Dialect) -> Response<ProxyBody> {
    match answer {
        Ok(Answer::Own(body)) => {
            exchange.finish_without_body(200, None);
            json_response(body)
        }
        Ok(Answer::Relay(relayed)) => {
            let relay = RelayBody::new(
                relayed.body,
                exchange,
                &relayed.head,
                relayed.idle_timeout,
                relayed.usage_watch,
                (relayed.upstream_took, relayed.headers_at),
                relayed.translator,
            );
            Response::from_parts(relayed.head, ProxyBody::Relay(relay))
        }
        Ok(Answer::Whole(whole)) => whole.respond(exchange),
        Err(error) => {
            exchange.finish_without_body(error.status().as_u16(), Some(&error));
            dialect.error_response(&error)
        }
    }
}

/// The upstream's answer, made ready to relay.
///
/// # Errors
/// An error status whose body is not JSON (a proxy's HTML 502): an error
/// in the client's dialect with the same status, so the client's SDK can
/// read it.
pub fn relay(
    forwarded: Forwarded,
    route: &Route,
    admitted: Option<&Admitted>,
    strip_usage: bool,
) -> Result<Answer, GatewayError> {
    let upstream_status = forwarded.response.status();
    if !upstream_status.is_success() && !is_json(forwarded.response.headers()) {
        return Err(GatewayError::UpstreamNotJson(route.name.to_string(), upstream_status.as_u16()));
    }
    let (mut head, body) = forwarded.response.into_parts();
    prepare_head(&mut head.headers, admitted.map(|admitted| &admitted.headers));
    let usage_watch = match (head.status.is_success(), strip_usage) {
        (false, _) => UsageWatch::Off,
        (true, false) => UsageWatch::Tap,
        (true, true) => UsageWatch::TapAndStripChunk,
    };
    if usage_watch == UsageWatch::TapAndStripChunk {
        // The relayed body is shorter than the upstream's by the chunk taken out.
        head.headers.remove(header::CONTENT_LENGTH);
    }
    Ok(Answer::Relay(Relayed {
        head,
        body,
        idle_timeout: route.timeouts.idle,
        usage_watch,
        upstream_took: forwarded.headers_at - forwarded.sent_at,
        headers_at: forwarded.headers_at,
        translator: None,
    }))
}

/// The upstream's response headers made the client's: hop-by-hop ones
/// dropped, the rate-limit headers of the admission added.
pub(super) fn prepare_head(headers: &mut HeaderMap, rate_headers: Option<&crate::limit::RateHeaders>) {
    let hop: Vec<_> = headers.keys().filter(|name| !forward::returnable(name)).cloned().collect();
    for name in hop {
        headers.remove(name);
    }
    if let Some(rate_headers) = rate_headers {
        rate_headers.apply(headers);
    }
}

/// The models a key may use, in OpenAI's list format: each name as the
/// key resolves it, listed once.
pub fn models_list(snapshot: &Snapshot, key: &KeyEntry) -> Answer {
    let data: Vec<serde_json::Value> = snapshot
        .routes()
        .iter()
        .enumerate()
        .filter(|(index, _)| key.allows(*index))
        .flat_map(|(index, route)| route.names.iter().filter(move |name| snapshot.resolve(key, name) == Some(index)))
        .map(|name| serde_json::json!({"id": name, "object": "model", "created": 0, "owned_by": "waycast"}))
        .collect();
    Answer::Own(Bytes::from(serde_json::json!({"object": "list", "data": data}).to_string()))
}

/// `GET /v1/usage`: each budget of the key (a token's holder: their own,
/// then their grant's) and of its namespace, as of
/// `now` — its period, when it starts over, its limits, what the fleet
/// spent (this pod's count beside the rest of the fleet's as the operator
/// last collected it; in Redis mode what Redis held at most a second ago,
/// or a little older under a flood of these requests) and what is left.
/// Nothing of any other key.
pub async fn budgets_of(
    snapshot: &Snapshot,
    (key, member): (&KeyEntry, Option<&crate::limit::members::Member>),
    now: jiff::Timestamp,
    metrics: &crate::metrics::Metrics,
) -> Answer {
    use crate::limit::budget::BudgetOwner;
    let owned = [
        (BudgetOwner::User, member.map_or("", |member| &*member.id), member.map_or(&[][..], |member| &member.budgets)),
        (BudgetOwner::Key, key.state_id(), key.budgets()),
        (BudgetOwner::Tenant, &*key.tenant.namespace, &*key.tenant.budgets),
    ];
    let listed: Vec<_> =
        owned.iter().flat_map(|(owner, id, list)| list.iter().map(move |b| (*owner, *id, b))).collect();
    // Counted in Redis: what it holds, read at most once a second per
    // budget and within bounds of its own (`limit::spend_reads`; unknown
    // while it does not answer); else this pod's view of the fleet.
    let read = match &snapshot.redis {
        Some(counter) => {
            let prefix = counter.config.key_prefix();
            let hashes: Vec<String> = listed
                .iter()
                .map(|(owner, id, budget)| {
                    let window = budget.period.window(now, &snapshot.zone);
                    crate::limit::budget_hash(prefix, *owner, id, budget.period, &window.key)
                })
                .collect();
            let (spends, sources) = counter.budgets_spent(&hashes).await;
            for source in sources {
                metrics.usage_spend_reads.with_label_values(&[source.label()]).inc();
            }
            Some(spends)
        }
        None => None,
    };
    let mut budgets: Vec<serde_json::Value> = Vec::new();
    for (place, (owner, _, budget)) in listed.into_iter().enumerate() {
        let window = budget.period.window(now, &snapshot.zone);
        let spent = match &read {
            Some(read) => read.get(place).copied().flatten(),
            None => Some(budget.state.spent_in_fleet(budget.period, now, &snapshot.zone)),
        };
        let money = |nanos: u64| waycast_crds::money::Money(nanos).to_string();
        let owner = match owner {
            BudgetOwner::User => "user",
            BudgetOwner::Key if key.is_grant() => "grant",
            BudgetOwner::Key => "key",
            BudgetOwner::Tenant => "namespace",
        };
        let mut entry = serde_json::json!({
            "owner": owner,
            "period": budget.period,
            "window": window.key,
            "resets_at": window.end.to_string(),
        });
        if let Some(limit) = budget.tokens {
            entry["tokens"] = limit.into();
        }
        if let Some(limit) = budget.cost {
            entry["cost"] = money(limit).into();
        }
        // Unknown (the store did not answer): said so, never "all left".
        entry["spent_tokens"] = spent.map(|(tokens, _)| tokens).into();
        entry["spent_cost"] = spent.map(|(_, cost)| money(cost)).into();
        if let (Some(limit), Some((tokens, _))) = (budget.tokens, spent) {
            entry["remaining_tokens"] = limit.saturating_sub(tokens).into();
        }
        if let (Some(limit), Some((_, cost))) = (budget.cost, spent) {
            entry["remaining_cost"] = money(limit.saturating_sub(cost)).into();
        }
        budgets.push(entry);
    }
    let body = serde_json::json!({
        "object": "usage",
        "key": &*key.id,
        "currency": snapshot.settings.budgets.currency,
        "budgets": budgets,
    });
    Answer::Own(Bytes::from(body.to_string()))
}

/// Whether a response says its body is JSON (`application/json`, or a
/// `+json` type such as `application/problem+json`).
fn is_json(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|value| {
        let essence = value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
        essence == "application/json" || essence.ends_with("+json")
    })
}

pub(super) fn json_response(body: Bytes) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::from(body));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
