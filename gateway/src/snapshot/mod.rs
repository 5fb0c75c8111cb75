//! `Snapshot`: one validated config, pre-indexed for the request path.
//!
//! ```text
//! GatewayConfig ──Snapshot::build──► Snapshot (immutable)
//!   keys    → HashMap<sha256, KeyEntry>   (allow-lists pre-resolved to route bitsets)
//!   models  → HashMap<name|alias, route>  (backends with pre-parsed URIs and headers)
//! ```
//!
//! Built once per config, published with one `ArcSwap::store`, read by each
//! request with one atomic load. Nothing here is mutated after build except
//! the per-route round-robin counter. What must outlive one config (pools,
//! limiter state, the Redis connection) is lent by [`crate::registry`];
//! building is pure.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use http::uri::{Authority, Scheme};
use http::{HeaderMap, HeaderName, HeaderValue};
use waycast_crds::config::{GatewayConfig, KeyConfig, ModelConfig, Settings, TimeoutsConfig, glob_matches};

use crate::limit::LimitSet;
use crate::limit::redis::RedisCounter;
use crate::registry::{Registry, Resources};
use crate::upstream::UpstreamClient;

/// The inference endpoints forwarded to a model's backends; a backend's
/// upstream paths are built for each, in this order, when a config loads.
pub const PROXIED_PATHS: [&str; 5] =
    ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages"];

/// A built config.
pub struct Snapshot {
    /// SHA-256 (hex) of the config bytes this was built from.
    pub hash: String,
    /// Fleet-wide settings.
    pub settings: Settings,
    keys: HashMap<[u8; 32], KeyEntry, BuildHasherDefault<DigestHasher>>,
    routes: Vec<Route>,
    by_name: HashMap<Box<str>, usize>,
    /// Counts the rate limits for the whole fleet, when the config says Redis.
    pub redis: Option<Arc<RedisCounter>>,
}

/// An accepted key.
#[derive(Debug)]
pub struct KeyEntry {
    /// `namespace/name` (or the id a standalone config gives).
    pub id: Arc<str>,
    /// Bit `i` set: route `i` allowed. `None`: every route.
    allowed_routes: Option<Vec<u64>>,
    /// Bit `i` set: route `i` is shared with the key's namespace
    /// (`keyNamespaces`). `None`: every route. Shared by the keys of a namespace.
    visible_routes: Option<Arc<[u64]>>,
    /// When it stops working.
    pub expires_at: Option<jiff::Timestamp>,
    /// Refused with 401.
    pub disabled: bool,
    /// Its rate limits, if any.
    pub limits: Option<Arc<LimitSet>>,
}

impl KeyEntry {
    /// Whether the key's own allow-list (`models`) lets it use route `index`.
    pub fn allows(&self, index: usize) -> bool {
        self.allowed_routes.as_deref().is_none_or(|bits| bit_set(bits, index))
    }

    /// Whether route `index` is shared with the key's namespace at all. A
    /// route it cannot see is, to the key, a model that does not exist.
    pub fn sees(&self, index: usize) -> bool {
        self.visible_routes.as_deref().is_none_or(|bits| bit_set(bits, index))
    }
}

fn bit_set(bits: &[u64], index: usize) -> bool {
    bits.get(index / 64).is_some_and(|word| word & (1 << (index % 64)) != 0)
}

/// The namespace of a key: its id up to the first `/` (ids are
/// `namespace/name` in operator-written configs). A bare id has none.
fn key_namespace(id: &str) -> &str {
    id.split_once('/').map_or("", |(namespace, _)| namespace)
}

/// The routes `namespace`'s keys may see; `None` when every route is open
/// to every key (no model restricts by namespace).
fn visible_routes(models: &[ModelConfig], namespace: &str) -> Option<Arc<[u64]>> {
    if models.iter().all(|m| m.key_namespaces.is_none()) {
        return None;
    }
    let mut bits = vec![0_u64; models.len().div_ceil(64)];
    for (index, model) in models.iter().enumerate() {
        if model.key_namespaces.as_ref().is_none_or(|allowed| allowed.iter().any(|n| n == namespace)) {
            bits[index / 64] |= 1 << (index % 64);
        }
    }
    Some(bits.into())
}

/// A model and its backends.
pub struct Route {
    /// Canonical name (metrics, logs).
    pub name: Arc<str>,
    /// Name and aliases, as `/v1/models` lists them.
    pub names: Vec<String>,
    /// Upstreams.
    pub backends: Vec<Backend>,
    /// Timeouts towards the upstreams.
    pub timeouts: TimeoutsConfig,
    /// Its rate limits over all keys, if any.
    pub limits: Option<Arc<LimitSet>>,
    /// Client headers forwarded besides the gateway's allow-list: exact
    /// names, and prefixes (from patterns ending in `*`).
    pub forward_headers: ForwardHeaders,
    /// Output tokens reserved when a request names no bound.
    pub output_token_reservation: Option<u64>,
    /// How requests are spread over the endpoints of `endpoints` backends.
    pub balancing: crate::upstream::balancing::Balancing,
    /// Retries to other endpoints against requests, so retries stay a
    /// small share of the load when a fleet is failing.
    pub retry_budget: crate::upstream::balancing::RetryBudget,
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
    pub fn allows(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name) || self.prefixes.iter().any(|p| name.starts_with(p.as_str()))
    }
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
}

/// Why a snapshot could not be built from a config that passed validation.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A backend URL did not split into scheme, authority and path.
    #[error("models[{model}].backends[{backend}].url: {reason}")]
    BadUrl {
        /// Model index.
        model: usize,
        /// Backend index.
        backend: usize,
        /// What was wrong.
        reason: String,
    },
    /// A header name or value was refused.
    #[error("models[{model}].backends[{backend}].headers: {reason}")]
    BadHeader {
        /// Model index.
        model: usize,
        /// Backend index.
        backend: usize,
        /// What was wrong (never the value).
        reason: &'static str,
    },
    /// A key's hash was not hex.
    #[error("keys[{0}].sha256: not a hex SHA-256")]
    BadHash(usize),
    /// A TLS setup (upstreams, Redis) failed.
    #[error("cannot set up TLS: {0}")]
    Tls(String),
    /// The resources lent were not made for this config (a bug).
    #[error("internal: {0} was not lent for this config")]
    NotLent(&'static str),
}

impl Snapshot {
    /// Builds a snapshot from a validated config and the resources the
    /// registry lent for it.
    ///
    /// # Errors
    /// [`BuildError`] for what validation cannot catch.
    pub fn build(config: &GatewayConfig, hash: String, lent: &Resources) -> Result<Self, BuildError> {
        let mut routes = Vec::with_capacity(config.models.len());
        let mut by_name = HashMap::new();
        for (model_index, model) in config.models.iter().enumerate() {
            let mut route = build_route(model_index, model, lent)?;
            if model.limits.is_some() {
                route.limits = Some(lent.model_limits(&model.name).ok_or(BuildError::NotLent("model limits"))?);
            }
            for name in &route.names {
                by_name.insert(name.clone().into_boxed_str(), model_index);
            }
            routes.push(route);
        }
        let mut keys = HashMap::with_capacity_and_hasher(config.keys.len(), BuildHasherDefault::default());
        // What each namespace's keys may see, computed once per namespace.
        let mut visible: HashMap<&str, Option<Arc<[u64]>>> = HashMap::new();
        for (index, key) in config.keys.iter().enumerate() {
            let digest = waycast_crds::digest::parse_sha256_hex(&key.sha256).ok_or(BuildError::BadHash(index))?;
            let mut entry = build_key(key, &routes);
            let namespace = key_namespace(&key.id);
            entry.visible_routes =
                visible.entry(namespace).or_insert_with(|| visible_routes(&config.models, namespace)).clone();
            if key.limits.is_some() {
                entry.limits = Some(lent.key_limits(&key.id).ok_or(BuildError::NotLent("key limits"))?);
            }
            keys.insert(digest, entry);
        }
        let redis = match config.settings.redis {
            Some(_) => Some(lent.redis().ok_or(BuildError::NotLent("a Redis counter"))?),
            None => None,
        };
        Ok(Self { hash, settings: config.settings.clone(), keys, routes, by_name, redis })
    }

    /// A snapshot of `config` with resources of its own (tests, tools).
    ///
    /// # Errors
    /// As [`Snapshot::build`] and [`Registry::lend`].
    pub fn standalone(config: &GatewayConfig, hash: String) -> Result<Self, BuildError> {
        Self::build(config, hash, &Registry::default().lend(config)?)
    }

    /// The key with this SHA-256 digest.
    pub fn key(&self, digest: &[u8; 32]) -> Option<&KeyEntry> {
        self.keys.get(digest)
    }

    /// The route index for a model name or alias.
    pub fn route_index(&self, model: &str) -> Option<usize> {
        self.by_name.get(model).copied()
    }

    /// Route by index.
    pub fn route(&self, index: usize) -> &Route {
        &self.routes[index]
    }

    /// Every route, in config order.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// Number of keys.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }
}

impl Route {
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

fn build_route(model_index: usize, model: &ModelConfig, lent: &Resources) -> Result<Route, BuildError> {
    let mut backends = Vec::with_capacity(model.backends.len());
    for (backend_index, backend) in model.backends.iter().enumerate() {
        let bad_url =
            |reason: &str| BuildError::BadUrl { model: model_index, backend: backend_index, reason: reason.into() };
        let uri: http::Uri = backend.url.parse().map_err(|_| bad_url("not a URL"))?;
        let scheme = uri.scheme().cloned().ok_or_else(|| bad_url("no scheme"))?;
        let authority = uri.authority().cloned().ok_or_else(|| bad_url("no host"))?;
        let base_path = uri.path().trim_end_matches('/').to_owned();
        let mut headers = HeaderMap::with_capacity(backend.headers.len());
        for (name, value) in &backend.headers {
            let bad_header = |reason| BuildError::BadHeader { model: model_index, backend: backend_index, reason };
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad_header("invalid header name"))?;
            let mut value = HeaderValue::from_str(value).map_err(|_| bad_header("invalid header value"))?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let model_json =
            backend.model.as_ref().map(|name| bytes::Bytes::from(serde_json::Value::from(name.as_str()).to_string()));
        // A query in the base URL (Azure's `?api-version=`) goes with every request.
        let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
        let paths = PROXIED_PATHS
            .iter()
            .map(|path| http::uri::PathAndQuery::try_from(format!("{base_path}{}{query}", &path["/v1".len()..])))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| bad_url("the path does not form valid request paths"))?;
        let default_port = if scheme == Scheme::HTTPS { 443 } else { 80 };
        let host = match authority.port_u16() {
            Some(port) if port != default_port => HeaderValue::from_str(authority.as_str()),
            _ => HeaderValue::from_str(authority.host()),
        }
        .map_err(|_| bad_url("the host is not a valid header value"))?;
        let tls = crate::upstream::effective_tls(backend);
        let client =
            lent.client(model.timeouts.connect, tls.as_ref()).ok_or(BuildError::NotLent("an upstream client"))?.clone();
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
        name: Arc::from(model.name.as_str()),
        names,
        backends,
        timeouts: model.timeouts,
        limits: None,
        forward_headers: ForwardHeaders::from_patterns(&model.forward_headers),
        output_token_reservation: model.output_token_reservation,
        balancing: crate::upstream::balancing::Balancing::from_config(&model.load_balancing),
        retry_budget: crate::upstream::balancing::RetryBudget::default(),
        tiers,
        next: AtomicU64::new(0),
    })
}

fn build_key(key: &KeyConfig, routes: &[Route]) -> KeyEntry {
    let allowed_routes = key.models.as_ref().map(|patterns| {
        let mut bits = vec![0_u64; routes.len().div_ceil(64)];
        for (index, route) in routes.iter().enumerate() {
            // A key that may use a model may use it under any of its names.
            let allowed = route.names.iter().any(|name| patterns.iter().any(|p| glob_matches(p, name)));
            if allowed {
                bits[index / 64] |= 1 << (index % 64);
            }
        }
        bits
    });
    KeyEntry {
        id: Arc::from(key.id.as_str()),
        allowed_routes,
        visible_routes: None,
        expires_at: key.expires_at,
        disabled: key.disabled,
        limits: None,
    }
}

/// Hashes SHA-256 digests by their first 8 bytes: they are already uniformly
/// distributed, so running SipHash over them again buys nothing.
#[derive(Default)]
pub struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8).take(1) {
            let mut word = [0_u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 ^= u64::from_le_bytes(word);
        }
    }

    fn write_usize(&mut self, _length: usize) {}
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
