//! A model's route: its backends parsed once (scheme, authority, the
//! upstream path of every proxied endpoint, the `Host`, the credential
//! headers, the rewritten model name), its failover tiers and the clients
//! the registry lent it. Built per model: one that cannot be built is left
//! out alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use http::uri::{Authority, Scheme};
use http::{HeaderMap, HeaderName, HeaderValue};
use waycast_crds::config::{ModelConfig, TimeoutsConfig};

use super::names::NamespaceId;
#[cfg(doc)]
use super::names::PLATFORM;
use crate::limit::LimitSet;
use crate::registry::Resources;
use crate::upstream::UpstreamClient;

/// A model and its backends.
pub struct Route {
    /// What metrics and logs call it: its name, or `namespace/name` for a
    /// team's model (two teams may both have a `llama`).
    pub name: Arc<str>,
    /// What its state is kept under (`registry::state_id`): its limiters,
    /// its queue, its Redis keys.
    pub state_id: Arc<str>,
    /// Name and aliases, as clients ask for it and `/v1/models` lists them.
    pub names: Vec<String>,
    /// The namespace whose keys resolve its names first ([`PLATFORM`]: none).
    pub owner: NamespaceId,
    /// The namespaces whose keys may see it; `None`: every namespace.
    pub key_namespaces: Option<Vec<String>>,
    /// Upstreams.
    pub backends: Vec<Backend>,
    /// Timeouts towards the upstreams.
    pub timeouts: TimeoutsConfig,
    /// Its rate limits over all keys, if any.
    pub limits: Option<Arc<LimitSet>>,
    /// Client headers forwarded besides the gateway's allow-list: exact
    /// names, and prefixes (from patterns ending in `*`).
    pub forward_headers: ForwardHeaders,
    /// Query parameters of the client's request sent upstream (by name);
    /// every other one is dropped.
    pub forward_query: Box<[String]>,
    /// Output tokens reserved when a request names no bound.
    pub output_token_reservation: Option<u64>,
    /// How requests are spread over the endpoints of `endpoints` backends.
    pub balancing: crate::upstream::balancing::Balancing,
    /// Retries to other endpoints against requests, so retries stay a
    /// small share of the load when a fleet is failing.
    pub retry_budget: crate::upstream::balancing::RetryBudget,
    /// Its fair queue and capacity, when it has one.
    pub gate: Option<crate::sharing::Gated>,
    /// What its tokens cost, and in which currency, when it is priced.
    pub prices: Option<(waycast_crds::money::TokenPrices, Arc<str>)>,
    /// The APIs it offers, one bit per index of `crate::dialect::APIS`.
    pub offered: u32,
    /// Index ranges of `backends` (sorted by priority) with one priority each.
    tiers: Vec<std::ops::Range<usize>>,
    next: AtomicU64,
}

/// The extra client headers a model forwards.
#[derive(Debug, Default, Clone)]
pub struct ForwardHeaders {
    names: Vec<String>,
    prefixes: Vec<String>,
}

impl ForwardHeaders {
    fn from_patterns(patterns: &[String]) -> Self {
        let mut headers = Self::default();
        for pattern in patterns {
            match pattern.strip_suffix('*') {
                Some(prefix) => headers.prefixes.push(prefix.to_owned()),
                None => headers.names.push(pattern.clone()),
            }
        }
        headers
    }

    /// Whether the model forwards `name` (the gateway's own allow-list and
    /// its credential guard are checked separately).
    ///
    /// NB: a provider's own headers (`openai-*`, `anthropic-*`: which
    /// organisation or project is billed, priced beta features) pass only
    /// when named whole: a prefix such as `openai-*` or `o*` written for
    /// something else must not re-open billing to the client.
    pub fn allows(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
            || (!is_provider_header(name) && self.prefixes.iter().any(|p| name.starts_with(p.as_str())))
    }
}

/// A provider's own header namespace: what it bills, to whom, and how.
fn is_provider_header(name: &str) -> bool {
    name.starts_with("openai-") || name.starts_with("anthropic-")
}

#[cfg(test)]
#[test]
fn a_prefix_never_forwards_a_providers_billing_header() {
    let patterns = ["openai-*", "o*", "anthropic-*", "x-team-*", "openai-project"].map(String::from);
    let forwarded = ForwardHeaders::from_patterns(&patterns);
    assert!(!forwarded.allows("openai-organization"), "covered only by prefixes");
    assert!(!forwarded.allows("anthropic-beta"), "covered only by a prefix");
    assert!(forwarded.allows("openai-project"), "named whole");
    assert!(forwarded.allows("x-team-id") && forwarded.allows("other"), "other prefixes still work");
}

/// One upstream, pre-parsed.
pub struct Backend {
    /// `http` or `https`.
    pub scheme: Scheme,
    /// Host and port.
    pub authority: Authority,
    /// Path prefix without a trailing slash (`/v1`, or empty).
    pub base_path: String,
    /// The upstream path of each proxied endpoint (`base_path` + the part
    /// after `/v1`), parsed once here instead of once per request.
    pub paths: Vec<http::uri::PathAndQuery>,
    /// The `Host` header, set here so the client need not format it per request.
    pub host: HeaderValue,
    /// The rewritten model as a JSON string literal, quotes included.
    pub model_json: Option<bytes::Bytes>,
    /// Headers added upstream.
    pub headers: HeaderMap,
    /// Share of requests.
    pub weight: u32,
    /// The pooled clients (one per worker) with the model's connect timeout
    /// and this backend's TLS settings.
    pub client: UpstreamClient,
    /// Failover tier (lowest first).
    pub priority: u32,
    /// The Service (`namespace/name:port`) whose endpoints serve it, for
    /// `http` backends; `None`: the URL's host.
    pub endpoints: Option<Arc<str>>,
    /// A `url` backend (a team's choice of address): its connects are held
    /// to the egress policy. A Service backend (the model's own namespace's
    /// Service, as the operator resolves it) is held to the fixed guard.
    pub guarded: bool,
    /// The API it speaks (`crate::dialect::plan`).
    pub format: waycast_crds::backend::BackendFormat,
}

impl Route {
    /// Whether it offers `APIS[endpoint]` (its ModelEndpoint's `apis`).
    pub fn offers(&self, endpoint: usize) -> bool {
        self.offered & (1 << endpoint) != 0
    }

    /// Whether a backend speaks other than OpenAI's API as it is (the
    /// default): only then may a request be translated
    /// (`crate::dialect::plan`).
    pub fn translates(&self) -> bool {
        self.backends.iter().any(|backend| backend.format != waycast_crds::backend::BackendFormat::OpenAI)
    }

    /// Backend indices in the order to try them, tier by tier (lowest
    /// `priority` first): within a tier a weighted round-robin pick first,
    /// then the tier's others (weight-0 fallbacks last).
    pub fn backend_order(&self) -> impl Iterator<Item = usize> + '_ {
        self.tiers.iter().flat_map(move |tier| self.tier_order(tier.clone()))
    }

    fn tier_order(&self, tier: std::ops::Range<usize>) -> impl Iterator<Item = usize> + '_ {
        let (start, count) = (tier.start, tier.len());
        let total_weight: u64 = self.backends[tier.clone()].iter().map(|b| u64::from(b.weight)).sum();
        let first = if total_weight == 0 || count == 1 {
            0
        } else {
            let mut ticket = self.next.fetch_add(1, Ordering::Relaxed) % total_weight;
            let mut chosen = 0;
            for (offset, backend) in self.backends[tier].iter().enumerate() {
                if ticket < u64::from(backend.weight) {
                    chosen = offset;
                    break;
                }
                ticket -= u64::from(backend.weight);
            }
            chosen
        };
        let weighted =
            (1..count).map(move |step| (first + step) % count).filter(move |&i| self.backends[start + i].weight > 0);
        let fallbacks = (0..count).filter(move |&i| self.backends[start + i].weight == 0 && i != first);
        std::iter::once(first).chain(weighted).chain(fallbacks).map(move |offset| start + offset)
    }
}

/// The route of `model` (owned by `owner`), or why it cannot be built (a
/// path within the entry and what is wrong, never a header value).
pub(super) fn build_route(model: &ModelConfig, owner: NamespaceId, lent: &Resources) -> Result<Route, String> {
    let mut backends = Vec::with_capacity(model.backends.len());
    for (backend_index, backend) in model.backends.iter().enumerate() {
        let bad_url = |reason: &str| format!("backends[{backend_index}].url: {reason}");
        let uri: http::Uri = backend.url.parse().map_err(|_| bad_url("not a URL"))?;
        let scheme = uri.scheme().cloned().ok_or_else(|| bad_url("no scheme"))?;
        let authority = uri.authority().cloned().ok_or_else(|| bad_url("no host"))?;
        let base_path = uri.path().trim_end_matches('/').to_owned();
        let mut headers = HeaderMap::with_capacity(backend.headers.len());
        for (name, value) in &backend.headers {
            let bad_header = |reason| format!("backends[{backend_index}].headers: {reason}");
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad_header("invalid header name"))?;
            let mut value = HeaderValue::from_str(value).map_err(|_| bad_header("invalid header value"))?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let model_json =
            backend.model.as_ref().map(|name| bytes::Bytes::from(serde_json::Value::from(name.as_str()).to_string()));
        // A query in the base URL (Azure's `?api-version=`) goes with every request.
        let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
        // The upstream path of every API the gateway forwards
        // (`crate::dialect::APIS`), in its order.
        let paths = crate::dialect::APIS
            .iter()
            .map(|api| http::uri::PathAndQuery::try_from(format!("{}{query}", api.upstream_path(&base_path))))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| bad_url("the path does not form valid request paths"))?;
        let default_port = if scheme == Scheme::HTTPS { 443 } else { 80 };
        let host = match authority.port_u16() {
            Some(port) if port != default_port => HeaderValue::from_str(authority.as_str()),
            _ => HeaderValue::from_str(authority.host()),
        }
        .map_err(|_| bad_url("the host is not a valid header value"))?;
        let tls = crate::upstream::effective_tls(backend);
        let client = lent
            .client(model.timeouts.connect, tls.as_ref())
            .map_err(|reason| format!("backends[{backend_index}].{reason}"))?
            .clone();
        // NB: an https backend goes to its endpoints only with a name to
        // check their certificates against (`effective_tls`).
        let https_named = tls.as_ref().is_some_and(|tls| tls.server_name.is_some());
        let endpoints = backend.endpoints.as_deref().filter(|_| scheme == Scheme::HTTP || https_named).map(Arc::from);
        backends.push(Backend {
            scheme,
            authority,
            base_path,
            paths,
            host,
            model_json,
            headers,
            weight: backend.weight,
            client,
            priority: backend.priority,
            endpoints,
            guarded: backend.endpoints.is_none(),
            format: backend.format,
        });
    }
    // Sorted (stably) by priority, so each tier is one range.
    backends.sort_by_key(|b| b.priority);
    let mut tiers: Vec<std::ops::Range<usize>> = Vec::new();
    for (index, backend) in backends.iter().enumerate() {
        match tiers.last_mut() {
            Some(tier) if backends[tier.start].priority == backend.priority => tier.end = index + 1,
            _ => tiers.push(index..index + 1),
        }
    }
    let mut names = vec![model.name.clone()];
    names.extend(model.aliases.iter().cloned());
    Ok(Route {
        name: Arc::from(crate::registry::model_id(model).as_ref()),
        state_id: Arc::from(crate::registry::state_id(model)),
        names,
        owner,
        key_namespaces: model.key_namespaces.clone(),
        backends,
        timeouts: model.timeouts,
        limits: None,
        forward_headers: ForwardHeaders::from_patterns(&model.forward_headers),
        forward_query: model.forward_query_parameters.clone().into(),
        output_token_reservation: model.output_token_reservation,
        balancing: crate::upstream::balancing::Balancing::from_config(&model.load_balancing),
        retry_budget: crate::upstream::balancing::RetryBudget::default(),
        gate: None,
        prices: match &model.pricing {
            None => None,
            Some(pricing) => Some((
                pricing.prices().map_err(|(field, error)| format!("pricing.{field}: {error}"))?,
                Arc::from(pricing.currency.as_str()),
            )),
        },
        offered: offered(model.apis.as_deref()),
        tiers,
        next: AtomicU64::new(0),
    })
}

/// One bit per API of `crate::dialect::APIS` that `apis` names (every
/// one when it names none).
fn offered(apis: Option<&[waycast_crds::model_api::ModelApi]>) -> u32 {
    const _: () = assert!(crate::dialect::APIS.len() <= 32, "one bit per API");
    let Some(apis) = apis else { return u32::MAX };
    let paths = apis.iter().flat_map(|api| api.paths());
    paths.filter_map(|path| crate::dialect::api_at(path)).fold(0, |bits, index| bits | 1 << index)
}
