//! The request pipeline: one stage a line in [`serve`], in this order. Each
//! is a function of its own module returning `Result<_, GatewayError>`;
//! the decisions are pure (`route.rs`, `body.rs`), the rest is I/O:
//!
//! ```text
//! endpoint  path + method → what to do                          (404, 405)    route::endpoint
//! snapshot  the worker's own handle on the served snapshot, kept for the whole request   (503 before the first config)
//! admit     framing, then a key: SHA-256 (remembered) → KeyEntry, or a JWT: verified (remembered) → its grant's entry  (431, 400, 401) route::admit
//! count     the key's request limit, before the body            (429, 503)    limit::Counters::count_key_request
//!           (`/v1/usage`: then its tenant's limits, and the budgets' spends read within bounds) respond::budgets_of
//! body      read within maxRequestBodyBytes and a deadline       (413, 408)    request_body::read
//!           (a form: as far as its model part; the rest streams upstream, scanned as it passes) form_upload::read
//! scan      top-level "model"/"stream"/… (the dialect's names)  (400)         body::scan (a form's parts: form_scanner)
//! route     model → Route; visibility and allow-list            (404, 403)    route::route
//! limits    key, tenant and model limits, tokens, concurrency  (429, 503)    limit::Counters::admit
//! queue     a full model's fair queue: wait for a turn          (429)         queue::take_turn
//! forward   pick backend, rewrite, failover, first-byte timeout (502, 504)    forward::send
//! respond   the upstream's head made the client's               (the upstream's status) respond::relay
//! stream    relay frames as they come; idle timeout; usage tap                stream::RelayBody
//! end       settle: token charge, queue seat, budgets, key's month, cost      limit::settle
//!           report: series, span, usage record, access line                   report::report
//! ```
//!
//! A new per-request check is a pure function beside the others, a
//! `GatewayError` variant, and one line here: its refusal is answered,
//! counted and logged like every other. What the stages decide goes into
//! the request's [`Facts`]; what it holds until it ends (token charge,
//! concurrency places, queue seat, budget reservations, the endpoint in
//! flight) and what settling it needs (reservation, prices, the key's
//! month) into its [`Held`]. Once the request has ended the [`Exchange`]
//! settles the one (`limit::settle`) and reports the other with what was
//! settled (`report.rs`); errors are answered in one place
//! (`respond::response`, in the dialect of the path asked for:
//! `crate::dialect`).

pub mod auth;
pub mod body;
pub mod connection;
pub mod exchange;
pub mod facts;
pub mod form;
pub mod form_scanner;
pub mod form_upload;
pub mod forward;
mod key_digests;
pub mod queue;
pub mod report;
pub mod request_body;
pub mod respond;
pub mod route;
pub mod series;
pub mod sse;
pub mod stream;
pub mod translated;
mod upstream_headers;
pub mod usage;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use http::header::HeaderValue;
use http::{Request, Response};
use hyper::body::Incoming;

use crate::dialect::Dialect;
use crate::error::GatewayError;
use crate::limit::{Budgets, Counters, Held, Month, Passed, Priced, Refused, Reservation, Subject};
use crate::per_worker::own_name;
use crate::request_id::REQUEST_ID;
use crate::shared::{Shared, WorkerShared};
use connection::Client;
use exchange::Exchange;
use facts::{Asked, Facts, Tally};
use forward::Outgoing;
use request_body::UnreadBody;
use respond::Answer;
use route::Endpoint;
use stream::ProxyBody;

/// Serves one request. Never fails: errors become responses in the
/// dialect of the path asked for (`crate::dialect`).
pub async fn handle(
    shared: Arc<WorkerShared>,
    client: Client,
    request: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let started = Instant::now();
    client.activity.note_version(request.version());
    let request_id = shared.request_ids.for_request(request.headers());
    let endpoint = Endpoint::of(request.uri().path());
    let path = endpoint.map_or("other", Endpoint::path);
    // Errors are answered in the dialect of the path asked for.
    let dialect = endpoint.map_or(Dialect::OpenAi, Endpoint::dialect);
    let asked = Asked { started, method: request.method().clone(), path, request_id: request_id.clone() };
    let mut exchange = Exchange::new(shared.clone(), client.activity.clone(), asked);
    let answer = serve(&shared, &client, request, (&mut exchange.facts, &mut exchange.held), &request_id).await;
    let mut response = respond::response(answer, exchange, dialect);
    response.headers_mut().insert(REQUEST_ID.clone(), request_id);
    Ok(response)
}

async fn serve(
    shared: &Shared,
    client: &Client,
    request: Request<Incoming>,
    (facts, held): (&mut Facts, &mut Held),
    request_id: &HeaderValue,
) -> Result<Answer, GatewayError> {
    let (parts, body) = request.into_parts();
    // Answered before its body is read (a refusal), the rest of the body is
    // read and thrown away in the background: see `UnreadBody`.
    let mut body = UnreadBody::new(body);
    let endpoint = route::endpoint(&parts.method, parts.uri.path())?;
    if endpoint == Endpoint::Root {
        return Ok(Answer::Own(bytes::Bytes::from_static(br#"{"object":"waycast"}"#)));
    }
    let snapshot = shared.config.current_here().ok_or(GatewayError::NotReady)?;
    facts.access_log = snapshot.settings.access_log;
    let caller = route::admit(&snapshot, &parts.headers, jiff::Timestamp::now)?;
    let (key, member) = (caller.key, caller.member);
    facts.user = caller.user;
    facts.trace = crate::telemetry::start(shared.telemetry.destination(snapshot.telemetry.as_ref()), &parts.headers);
    facts.key = Some(own_name(&key.id));
    let endpoint_index = match endpoint {
        Endpoint::Proxy(index) => Some(index),
        Endpoint::Models => return Ok(respond::models_list(&snapshot, key)),
        Endpoint::Usage => None,
        Endpoint::Root => return Ok(Answer::Own(bytes::Bytes::new())),
    };

    // A key over its request limit costs no body read (nor a Redis read).
    let shares = shared.fleet.shares_at_least(snapshot.settings.minimum_pods);
    let counters = Counters::of(snapshot.redis.as_ref(), shares);
    let counted = passed(facts, counters.count_key_request(key.state_id(), key.limits()).await)?;
    let Some(endpoint_index) = endpoint_index else {
        // A request under its tenant's request rate too (the key's is
        // counted above), reserving no tokens: asking in a loop costs the
        // tenant's rate, not the platform's Redis (`budgets_of` reads
        // within bounds). Asked only of a tenant with a request rate: a
        // tenant with token or concurrency limits alone would otherwise
        // cost an admission call per read and limit nothing.
        let tenant_rate = key.tenant.limits.as_ref().filter(|set| set.requests.is_some());
        let subject = Subject {
            key: (key.state_id(), None),
            tenant: (&key.tenant.namespace, tenant_rate),
            model: ("", None),
            user: ("", None),
            budgets: None,
        };
        let _held = if subject.asks_nothing() {
            None
        } else {
            passed(facts, counters.admit(&subject, Reservation::default(), counted.as_ref()).await)?
        };
        let now = jiff::Timestamp::now();
        return Ok(respond::budgets_of(&snapshot, (key, member.as_deref()), now, &shared.metrics).await);
    };
    let limit = snapshot.settings.max_request_body_bytes;
    let api = &crate::dialect::APIS[endpoint_index];
    // A form is read as far as its model; its file streams upstream after.
    let (body, form_fields, upload) = if api.form {
        let (head, fields, upload) = form_upload::read(&mut body, &parts.headers, limit, shared.body_timeout).await?;
        (head, Some(fields), upload)
    } else {
        (request_body::read(&mut body, &parts.headers, limit, shared.body_timeout).await?, None, None)
    };
    let body_done = Instant::now();
    let fields = match form_fields {
        Some(fields) => fields,
        None => body::scan(&body, endpoint.dialect())?,
    };
    facts.client_user = fields.client_user.as_deref().map(Box::from);
    let route = route::route(&snapshot, key, &fields.model)?.route;
    if !route.offers(endpoint_index) || (route.translates() && route::offers_none(route, endpoint_index)) {
        let path = crate::dialect::APIS[endpoint_index].path;
        return Err(GatewayError::NotOffered(route.name.to_string(), path));
    }
    (facts.model, facts.stream, facts.max_tokens) = (Some(own_name(&route.name)), fields.stream, fields.max_tokens);
    let counted_in = &*snapshot.settings.budgets.currency;
    if let Some(prices) = &route.prices {
        held.priced = Some(Priced::of(prices, counted_in, own_name));
    }

    // A tokenizer's call is never charged tokens: it reserves none and
    // settles none, whatever it reports.
    let charged = api.tokens == crate::dialect::TokenCharge::Used;
    let (output, choices, default_output) = (fields.max_tokens, fields.choices, route.output_token_reservation);
    let reservation = if !charged {
        Reservation::free()
    } else if api.form {
        // A form's bytes are mostly a file: no measure of its prompt tokens.
        let length = body.len() + upload.as_ref().map_or(0, |upload| upload.rest.len() as usize);
        Reservation::for_form(length, output, choices, default_output)
    } else if api.media_answer {
        Reservation::for_request(body.len(), output, choices, default_output).with_media_answer()
    } else {
        Reservation::for_request(body.len(), output, choices, default_output)
    };
    let user_budgets = member.as_ref().map_or(&[][..], |member| &member.budgets);
    let budgets = Budgets {
        key: key.budgets(),
        tenant: &key.tenant.budgets,
        user: user_budgets,
        counted_in,
        zone: &snapshot.zone,
    };
    let subject = Subject {
        key: (key.state_id(), key.limits()),
        tenant: (&key.tenant.namespace, key.tenant.limits.as_ref()),
        model: (&route.state_id, route.limits.as_ref()),
        user: member.as_ref().map_or(("", None), |member| (&*member.id, member.limits.as_ref())),
        budgets: match crate::limit::budgets_asked(&budgets, held.priced.as_ref(), reservation, jiff::Timestamp::now) {
            Ok(asked) => asked,
            Err(mismatch) => return Err(GatewayError::budget_currency(&route.name, mismatch)),
        },
    };
    // Most keys have no limit and no budget: no admission future is made.
    let mut admitted = if subject.asks_nothing() {
        None
    } else {
        passed(facts, counters.admit(&subject, reservation, counted.as_ref()).await)?
    };
    (facts.admitted, held.reservation) = (admitted.is_some(), Some(reservation));
    if let Some(admitted) = admitted.as_mut() {
        held.take_admitted(admitted);
    }
    held.month = Some(Month { counts: key.usage.clone(), zone: snapshot.zone.clone() });
    // A token's holder waits in a line of their own within the tenant.
    let line = facts.user.as_deref().map_or(key.fair_id, |user| key.fair_id.rotate_left(29) ^ user.user_hash);
    if let Some(seat) = queue::take_turn(route, (key, line), reservation, (shared, shares), facts).await? {
        held.seat = Some(seat);
    }
    // A backend that speaks another API: the body made its, once, after
    // the limits admitted it (a parse costs memory a refusal should not).
    // A field it cannot take is the client's 400.
    let translated = if route.translates() {
        let formats = route.backends.iter().map(|backend| backend.format);
        let made = crate::dialect::plan::Translated::of(endpoint_index, formats, &body);
        Some(made.map_err(|why| GatewayError::Untranslatable(route.name.to_string(), why.to_string()))?)
    } else {
        None
    };
    let asked = translated.as_ref().map(|_| translated::ClientAsked {
        model: &fields.model,
        include_usage: asks_stream_usage(&body, &fields),
        request_bytes: body.len(),
    });
    let (body, model_span, strip_usage) = usage::body_to_send(&body, &fields, endpoint_index, held.charge.is_some());

    let outgoing = Outgoing {
        method: &parts.method,
        endpoint: endpoint_index,
        query: parts.uri.query(),
        headers: &parts.headers,
        body: &body,
        model_span,
        request_id,
        client,
        affinity: route.balancing.affinity(&parts.headers, &body, fields.prompt_start),
        inference: forward::Inference::of(&snapshot.settings.sharing, key),
        translated: translated.as_ref(),
        streamed: upload.as_ref().map(|upload| forward::Streamed { rest: &upload.rest, allowance: upload.allowance }),
    };
    facts.forwarded = true;
    let mut forwarded =
        forward::send(route, &outgoing, &shared.endpoints, (&mut facts.tallies, facts.trace.as_deref_mut())).await?;
    let answered = (forwarded.in_flight.take(), forwarded.sent_at.saturating_duration_since(body_done));
    let answer = match asked.filter(|_| forwarded.plan != crate::dialect::plan::Plan::Pass) {
        Some(asked) => {
            let rate_headers = admitted.as_ref().map(|admitted| admitted.headers);
            translated::answer(forwarded, route, rate_headers.as_ref(), asked).await
        }
        None => respond::relay(forwarded, route, admitted.as_ref(), strip_usage),
    };
    answer.inspect(|_| answered_by(answered, (facts, held)))
}

/// Whether a chat client asked for the usage chunk of its stream
/// (`stream_options.include_usage: true`).
fn asks_stream_usage(body: &[u8], fields: &body::RequestFields<'_>) -> bool {
    let options = fields.stream_options.clone().and_then(|span| body.get(span));
    let options = options.and_then(|text| serde_json::from_slice::<serde_json::Value>(text).ok());
    options.is_some_and(|options| options.get("include_usage") == Some(&serde_json::Value::Bool(true)))
}

/// Holds the endpoint that answered (counted in flight until the request
/// ends) and notes the gateway's time `before` the upstream was asked.
fn answered_by(
    (in_flight, before): (Option<crate::upstream::pick::InFlight>, std::time::Duration),
    (facts, held): (&mut Facts, &mut Held),
) {
    facts.overhead_before = before;
    held.endpoint = in_flight;
}

/// An admission that let the request on (a store failure it passed over
/// noted), or the refusal as the error it is answered with.
fn passed<T>(facts: &mut Facts, decided: Result<Passed<T>, Refused>) -> Result<T, GatewayError> {
    let passed = decided?;
    if let Some(label) = passed.store_failure {
        facts.tallies.note(Tally::StoreFailed(label));
    }
    Ok(passed.value)
}
