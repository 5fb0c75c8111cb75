//! Checks on a [`GatewayConfig`] that its types cannot express. Every problem
//! is reported with the path to it, not just the first, so one edit fixes a
//! hand-written config.
//!
//! ```text
//! ModelConfig::validate ─┐   (one object: the operator runs these on every
//! KeyConfig::validate ───┤    ModelEndpoint and ApiKey before it enters a config)
//!                        └─► GatewayConfig::validate (+ names claimed twice,
//!                            duplicate ids and hashes, settings): the gateway
//! ```
//!
//! NB: the operator leaves out each object these refuse, so a config it
//! writes passes `GatewayConfig::validate` as long as every check on one
//! object lives in the per-object functions.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::common::check_limits;
use crate::common::{RESERVED_HEADERS, is_forbidden_in_name};
use crate::config::{BackendConfig, CONFIG_API_VERSION, GatewayConfig, KeyConfig, ModelConfig};
use crate::egress::{self, Cidr};
use crate::problems::Collector;
pub use crate::problems::{Problem, Problems};

/// Largest request body a config may allow: 1 GiB.
pub const MAX_REQUEST_BODY_LIMIT: u64 = 1024 * 1024 * 1024;

/// A config as a gateway reads it: the problems that refuse it whole
/// (its version, its settings), and each entry left out with its own.
///
/// # Guarantees
/// An entry is refused only for problems of its own or a name, id or key
/// an earlier entry kept: what another entry says never refuses it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Review {
    /// Problems with the config as a whole.
    pub config: Vec<Problem>,
    /// Model entries left out (index in `models`) and why.
    pub models: BTreeMap<usize, Vec<Problem>>,
    /// Key entries left out (index in `keys`) and why.
    pub keys: BTreeMap<usize, Vec<Problem>>,
    /// Provider entries left out (index in `providers`) and why.
    pub providers: BTreeMap<usize, Vec<Problem>>,
    /// Grant entries left out (index in `grants`) and why (a grant whose
    /// provider is left out or unknown is left out too).
    pub grants: BTreeMap<usize, Vec<Problem>>,
}

impl Review {
    /// Every problem, as one error; `Ok` when there is none.
    ///
    /// # Errors
    /// [`Problems`] listing them all.
    pub fn into_result(self) -> Result<(), Problems> {
        let all: Vec<Problem> = self
            .config
            .into_iter()
            .chain(self.models.into_values().flatten())
            .chain(self.keys.into_values().flatten())
            .chain(self.providers.into_values().flatten())
            .chain(self.grants.into_values().flatten())
            .collect();
        if all.is_empty() { Ok(()) } else { Err(Problems(all)) }
    }
}

impl GatewayConfig {
    /// Checks the whole config: any problem refuses it.
    ///
    /// # Errors
    /// [`Problems`] listing every invalid value with its path.
    pub fn validate(&self) -> Result<(), Problems> {
        self.review().into_result()
    }

    /// Checks the config entry by entry (see [`Review`]). A model's names
    /// are claimed within its owner namespace: a team's `llama` and the
    /// platform's `llama` are two models; a second `llama` of one owner is
    /// left out. A second entry with a key id or key text already kept is
    /// left out.
    pub fn review(&self) -> Review {
        let mut review = Review::default();
        let mut settings = Collector::default();
        if self.api_version != CONFIG_API_VERSION {
            settings.add("apiVersion", format!("must be {CONFIG_API_VERSION:?}, found {:?}", self.api_version));
        }
        check_settings(&self.settings, &mut settings);
        review.config = settings.0;

        let mut claimed: BTreeMap<(Option<&str>, &str), String> = BTreeMap::new();
        for (index, model) in self.models.iter().enumerate() {
            let path = format!("models[{index}]");
            let mut problems = Collector::default();
            check_model(&path, model, &mut problems);
            let names = std::iter::once((format!("{path}.name"), &model.name))
                .chain(model.aliases.iter().enumerate().map(|(i, alias)| (format!("{path}.aliases[{i}]"), alias)));
            let owner = model.owner_namespace();
            let mut names_here: Vec<&str> = Vec::new();
            for (name_path, name) in names {
                if let Some(first) = claimed.get(&(owner, name.as_str())) {
                    problems.add(&name_path, format!("{name:?} is already claimed by {first}"));
                } else if names_here.contains(&name.as_str()) {
                    problems.add(&name_path, format!("{name:?} is named twice"));
                } else {
                    names_here.push(name);
                }
            }
            if problems.0.is_empty() {
                for (offset, name) in names_here.into_iter().enumerate() {
                    let name_path =
                        if offset == 0 { format!("{path}.name") } else { format!("{path}.aliases[{}]", offset - 1) };
                    claimed.insert((owner, name), name_path);
                }
            } else {
                review.models.insert(index, problems.0);
            }
        }
        review.keys = review_keys(&self.settings, &self.keys);
        review.providers = crate::identity_config::review_providers(&self.providers);
        let kept: HashMap<&str, bool> = (self.providers.iter().enumerate())
            .filter(|(index, _)| !review.providers.contains_key(index))
            .map(|(_, provider)| (provider.name.as_str(), provider.service_accounts))
            .collect();
        review.grants = crate::identity_config::review_grants(&self.settings, &kept, &self.grants);
        review
    }
}

/// The key entries of `keys` left out under `settings` (by index in
/// `keys`) and why, as [`GatewayConfig::review`] finds them: a reader that
/// takes keys a batch at a time (a changed shard) checks each batch alone,
/// and the key text of one batch against the others itself.
pub fn review_keys(settings: &crate::config::Settings, keys: &[KeyConfig]) -> BTreeMap<usize, Vec<Problem>> {
    let mut left_out = BTreeMap::new();
    // Hashed, sized once: at 100,000 keys two ordered maps of their
    // ids and digests were most of a pod's check of its config.
    let mut ids: HashMap<&str, usize> = HashMap::with_capacity(keys.len());
    let mut hashes: HashMap<&str, usize> = HashMap::with_capacity(keys.len());
    for (index, key) in keys.iter().enumerate() {
        let path = format!("keys[{index}]");
        let mut problems = Collector::default();
        check_key(&path, key, &mut problems);
        let tenant = settings.tenant(key.namespace());
        if let Err(message) = crate::sharing::key_class(&settings.sharing, tenant, key.class.as_deref()) {
            problems.add(format!("{path}.class"), message);
        }
        if let Some(first) = ids.get(key.id.as_str()) {
            problems.add(format!("{path}.id"), format!("{:?} is also the id of keys[{first}]", key.id));
        }
        if let Some(first) = hashes.get(key.sha256.as_str()) {
            problems.add(format!("{path}.sha256"), format!("same key as keys[{first}]"));
        }
        if problems.0.is_empty() {
            ids.insert(&key.id, index);
            hashes.insert(&key.sha256, index);
        } else {
            left_out.insert(index, problems.0);
        }
    }
    left_out
}

fn check_settings(settings: &crate::config::Settings, problems: &mut Collector) {
    let body_limit = settings.max_request_body_bytes;
    if body_limit == 0 || body_limit > MAX_REQUEST_BODY_LIMIT {
        problems.add("settings.maxRequestBodyBytes", format!("must be between 1 and {MAX_REQUEST_BODY_LIMIT}"));
    }
    if let Some(redis) = &settings.redis {
        let port = redis.address.rsplit_once(':').and_then(|(host, port)| (!host.is_empty()).then_some(port));
        if port.and_then(|p| p.parse::<u16>().ok()).is_none_or(|p| p == 0) {
            problems.add("settings.redis.address", "must be host:port");
        }
        if redis.timeout.is_zero() {
            problems.add("settings.redis.timeout", "must be more than 0");
        }
        if redis.username.is_some() && redis.password.is_none() {
            problems.add("settings.redis.username", "needs a password");
        }
        if let Some(tls) = &redis.tls
            && tls.client_cert_pem.is_some() != tls.client_key_pem.is_some()
        {
            problems.add("settings.redis.tls", "clientCertPem and clientKeyPem go together");
        }
        if redis.key_prefix.as_ref().is_some_and(|prefix| {
            prefix.is_empty() || prefix.len() > 256 || prefix.chars().any(|c| c.is_whitespace() || c.is_control())
        }) {
            problems.add("settings.redis.keyPrefix", "must be 1 to 256 characters without whitespace");
        }
    }
    for (field, ranges) in [
        ("deniedCIDRs", &settings.denied_cidrs),
        ("closedCIDRs", &settings.closed_cidrs),
        ("allowedCIDRs", &settings.allowed_cidrs),
    ] {
        for (index, range) in ranges.iter().enumerate() {
            if let Err(error) = range.parse::<Cidr>() {
                problems.add(format!("settings.{field}[{index}]"), error.to_string());
            }
        }
    }
    if let Some(telemetry) = &settings.telemetry {
        for problem in telemetry.problems() {
            problems.add("settings.telemetry", problem);
        }
    }
    for (index, host) in settings.allowed_hosts.iter().enumerate() {
        let name = host.strip_prefix("*.").unwrap_or(host);
        if crate::tls::server_name_problem(name).is_some() {
            problems.add(format!("settings.allowedHosts[{index}]"), "must be a host name or *.suffix");
        }
    }
    check_sharing(settings, problems);
}

impl ModelConfig {
    /// Checks one model entry on its own (everything but names claimed by
    /// another entry); paths are relative to the entry (`backends[0].url`).
    ///
    /// # Errors
    /// [`Problems`] listing every invalid value with its path.
    pub fn validate(&self) -> Result<(), Problems> {
        let mut problems = Collector::default();
        check_model("", self, &mut problems);
        problems.into_result()
    }
}

impl KeyConfig {
    /// Checks one key entry on its own (everything but duplicates); paths
    /// are relative to the entry (`models[0]`).
    ///
    /// # Errors
    /// [`Problems`] listing every invalid value with its path.
    pub fn validate(&self) -> Result<(), Problems> {
        let mut problems = Collector::default();
        check_key("", self, &mut problems);
        problems.into_result()
    }
}

/// `parent.child`, or `child` at the top.
fn join(parent: &str, child: &str) -> String {
    if parent.is_empty() { child.to_owned() } else { format!("{parent}.{child}") }
}

fn check_model(path: &str, model: &ModelConfig, problems: &mut Collector) {
    let names = std::iter::once((join(path, "name"), &model.name))
        .chain(model.aliases.iter().enumerate().map(|(i, alias)| (join(path, &format!("aliases[{i}]")), alias)));
    for (name_path, name) in names {
        if let Some(message) = model_name_problem(name) {
            problems.add(&name_path, message);
        }
    }
    if model.backends.is_empty() {
        problems.add(join(path, "backends"), "needs at least one backend");
    } else if model.backends.iter().all(|backend| backend.weight == 0) {
        problems.add(join(path, "backends"), "at least one backend needs a weight above 0");
    }
    for (index, backend) in model.backends.iter().enumerate() {
        check_backend(&join(path, &format!("backends[{index}]")), backend, problems);
    }
    let timeouts =
        [("connect", model.timeouts.connect), ("firstByte", model.timeouts.first_byte), ("idle", model.timeouts.idle)];
    for (name, value) in timeouts {
        if value == Duration::ZERO {
            problems.add(join(path, &format!("timeouts.{name}")), "must be longer than 0");
        }
    }
    if let Some(limits) = &model.limits {
        check_limits(&join(path, "limits"), limits, problems);
        if limits.max_concurrent.is_some() {
            problems.add(join(path, "limits.maxConcurrent"), "a model's concurrency is its capacity, not a limit");
        }
    }
    if let Some(capacity) = &model.capacity
        && !(1..=100_000).contains(&capacity.max_in_flight_per_endpoint)
    {
        problems.add(join(path, "capacity.maxInFlightPerEndpoint"), "must be from 1 to 100000");
    }
    if let Some(pricing) = &model.pricing {
        if !crate::money::is_currency_code(&pricing.currency) {
            problems.add(join(path, "pricing.currency"), "must be an ISO 4217 code such as USD");
        }
        if let Err((field, error)) = pricing.prices() {
            problems.add(join(path, &format!("pricing.{field}")), error.to_string());
        }
    }
    for (index, pattern) in model.forward_headers.iter().enumerate() {
        if let Some(message) = crate::common::forward_header_problem(pattern) {
            problems.add(join(path, &format!("forwardHeaders[{index}]")), message);
        }
    }
    for (index, parameter) in model.forward_query_parameters.iter().enumerate() {
        let valid = !parameter.is_empty()
            && parameter.len() <= 128
            && parameter.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.~".contains(&b));
        if !valid {
            problems.add(join(path, &format!("forwardQueryParameters[{index}]")), "must be a query parameter name");
        }
    }
    for (index, namespace) in model.key_namespaces.iter().flatten().enumerate() {
        if namespace.is_empty() || namespace.contains('/') {
            problems.add(join(path, &format!("keyNamespaces[{index}]")), "must be a namespace name");
        }
    }
    let balancing = &model.load_balancing;
    if !(1..=65_536).contains(&balancing.prefix_bytes) {
        problems.add(join(path, "loadBalancing.prefixBytes"), "must be from 1 to 65536");
    }
    if !(100..=1_000).contains(&balancing.load_factor_percent) {
        problems.add(join(path, "loadBalancing.loadFactorPercent"), "must be from 100 to 1000");
    }
    for (index, status) in balancing.retry_on_status.iter().enumerate() {
        if !crate::balancing::RETRYABLE_STATUSES.contains(status) {
            problems.add(
                join(path, &format!("loadBalancing.retryOnStatus[{index}]")),
                "must be one of 429, 500, 502, 503, 504",
            );
        }
    }
    if let Some(header) = &balancing.session_header {
        let valid = http::HeaderName::from_bytes(header.as_bytes()).is_ok_and(|h| h.as_str() == header);
        if !valid {
            problems.add(join(path, "loadBalancing.sessionHeader"), "must be a lowercase header name");
        }
    }
}

fn model_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("must not be empty")
    } else if name.len() > 256 {
        Some("must be at most 256 characters")
    } else if name.chars().any(is_forbidden_in_name) {
        Some("must not contain whitespace or control characters")
    } else if name.contains('*') {
        Some("must not contain '*' (globs belong in key allow-lists)")
    } else {
        None
    }
}

fn check_backend(path: &str, backend: &BackendConfig, problems: &mut Collector) {
    if let Some(message) = base_url_problem(&backend.url) {
        problems.add(join(path, "url"), message);
    }
    if backend.model.as_deref() == Some("") {
        problems.add(join(path, "model"), "must not be empty when set");
    }
    if let Some(key) = &backend.endpoints
        && crate::endpoints::parse_service_key(key).is_none()
    {
        problems.add(join(path, "endpoints"), "must be namespace/name:port");
    }
    for (name, value) in &backend.headers {
        let header_path = join(path, &format!("headers.{name}"));
        match http::HeaderName::from_bytes(name.as_bytes()) {
            Err(_) => problems.add(&header_path, "is not a valid header name"),
            Ok(header) if RESERVED_HEADERS.contains(&header.as_str()) => {
                problems.add(&header_path, "is set by the gateway itself and cannot be configured")
            }
            Ok(_) => {}
        }
        // NB: never echo the value: it is usually a credential.
        if http::HeaderValue::from_str(value).is_err() {
            problems.add(&header_path, "value has characters not allowed in a header");
        }
    }
    if let Some(tls) = &backend.tls {
        for (field, message) in crate::tls::client_tls_problems(tls) {
            problems.add(join(path, &format!("tls.{field}")), message);
        }
    }
}

/// Why `url` is not an absolute http(s) base URL a backend may use, if it
/// is not. A query is allowed (it is sent with every request); a host that
/// is a link-local or metadata IP address is not.
pub fn base_url_problem(url: &str) -> Option<String> {
    let Ok(uri) = url.parse::<http::Uri>() else {
        return Some("is not a valid URL".into());
    };
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Some("must start with http:// or https://".into()),
    }
    let Some(host) = uri.host().filter(|h| !h.is_empty()) else {
        return Some("must name a host".into());
    };
    if url.contains('#') {
        return Some("must not have a fragment".into());
    }
    if let Some(address) = egress::ip_literal(host) {
        return egress::forbidden(address, &[]).map(|why| format!("must not point here: {why}"));
    }
    None
}

fn check_key(path: &str, key: &KeyConfig, problems: &mut Collector) {
    if key.id.is_empty() {
        problems.add(join(path, "id"), "must not be empty");
    }
    let is_hex_sha256 = key.sha256.len() == 64 && key.sha256.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !is_hex_sha256 {
        problems.add(join(path, "sha256"), "must be 64 lowercase hex characters (the SHA-256 of the key)");
    }
    for (index, pattern) in key.models.iter().flatten().enumerate() {
        if pattern.is_empty() || pattern.chars().any(is_forbidden_in_name) {
            problems.add(
                join(path, &format!("models[{index}]")),
                "must be a model name or a glob without whitespace or control characters",
            );
        }
    }
    if let Some(limits) = &key.limits {
        check_limits(&join(path, "limits"), limits, problems);
    }
    if let Some(class) = &key.class
        && let Some(message) = class_name_problem(class)
    {
        problems.add(join(path, "class"), message);
    }
    if !key.budgets.is_empty() {
        crate::spend::check_budgets(&join(path, "budgets"), &key.budgets, problems);
    }
}

/// Why `class` cannot name a priority class (a DNS label), if it cannot.
fn class_name_problem(class: &str) -> Option<&'static str> {
    let label = !class.is_empty()
        && class.len() <= 63
        && class.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !class.starts_with('-')
        && !class.ends_with('-');
    (!label).then_some("must be a lowercase DNS label (a-z, 0-9, '-'), at most 63 characters")
}

/// The checks of `settings.sharing` and `settings.tenants`.
fn check_sharing(settings: &crate::config::Settings, problems: &mut Collector) {
    let sharing = &settings.sharing;
    if sharing.classes.is_empty() || sharing.classes.len() > crate::sharing::MAX_CLASSES {
        problems.add("settings.sharing.classes", format!("must name 1 to {} classes", crate::sharing::MAX_CLASSES));
    }
    for (index, class) in sharing.classes.iter().enumerate() {
        if let Some(message) = class_name_problem(class) {
            problems.add(format!("settings.sharing.classes[{index}]"), message);
        } else if sharing.classes[..index].contains(class) {
            problems.add(format!("settings.sharing.classes[{index}]"), format!("{class:?} is named twice"));
        }
    }
    if sharing.class_index(&sharing.default_class).is_none() {
        problems.add("settings.sharing.defaultClass", "must be one of the classes");
    }
    if sharing.max_wait.is_zero() || sharing.max_wait > Duration::from_secs(3600) {
        problems.add("settings.sharing.maxWait", "must be more than 0 and at most 1h");
    }
    if sharing.max_queued == 0 || sharing.max_queued > 1_000_000 {
        problems.add("settings.sharing.maxQueued", "must be from 1 to 1000000");
    }
    if sharing.burst_percent > 400 {
        problems.add("settings.sharing.burstPercent", "must be from 0 to 400");
    }
    let mut seen = std::collections::BTreeSet::new();
    for (index, tenant) in settings.tenants.iter().enumerate() {
        let path = format!("settings.tenants[{index}]");
        if tenant.namespace.is_empty() || tenant.namespace.contains('/') {
            problems.add(format!("{path}.namespace"), "must be a namespace name");
        } else if !seen.insert(tenant.namespace.as_str()) {
            problems.add(format!("{path}.namespace"), format!("{:?} has a policy already", tenant.namespace));
        }
        if !(1..=1000).contains(&tenant.weight) {
            problems.add(format!("{path}.weight"), "must be from 1 to 1000");
        }
        for (at, class) in tenant.classes.iter().flatten().enumerate() {
            if sharing.class_index(class).is_none() {
                problems.add(format!("{path}.classes[{at}]"), format!("{class:?} is not one of the classes"));
            }
        }
        if let Some(limits) = &tenant.limits {
            check_limits(&format!("{path}.limits"), limits, problems);
        }
        crate::spend::check_budgets(&format!("{path}.budgets"), &tenant.budgets, problems);
    }
    settings.budgets.check(problems);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LimitsConfig;
    use crate::config::Settings;

    fn backend(url: &str) -> BackendConfig {
        BackendConfig::to(url)
    }

    fn model(name: &str, aliases: &[&str]) -> ModelConfig {
        ModelConfig {
            aliases: aliases.iter().map(|a| (*a).into()).collect(),
            ..ModelConfig::to(name, "http://10.0.0.1:8000/v1")
        }
    }

    fn key(id: &str, sha256: &str) -> KeyConfig {
        KeyConfig::new(id, sha256)
    }

    const HASH_A: &str = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";

    #[test]
    fn a_good_config_passes() {
        let mut config = GatewayConfig::empty();
        config.models = vec![model("llama", &["llama3"]), model("mistral", &[])];
        config.keys = vec![key("team-a/alice", HASH_A)];
        assert_eq!(config.validate(), Ok(()));
    }

    #[test]
    fn reports_every_problem_with_its_path() {
        let mut broken_backend = model("mistral", &["llama3"]);
        broken_backend.backends =
            vec![backend("ftp://example.com/v1"), backend("http:///v1"), backend("http://169.254.169.254/v1")];
        broken_backend.backends[0].headers.insert("bad header".into(), "secret-value\n".into());
        broken_backend.timeouts.idle = Duration::ZERO;
        broken_backend.limits = Some(LimitsConfig::requests(0));
        broken_backend.load_balancing.retry_on_status = vec![503, 404];
        let config = GatewayConfig {
            api_version: "waycast.dev/v0".into(),
            models: vec![model("llama", &["llama3"]), broken_backend, model("", &[]), model("a b", &[])],
            keys: vec![key("", "ABC"), key("team-a/alice", HASH_A), key("team-a/alice", HASH_A)],
            settings: Settings {
                max_request_body_bytes: 0,
                access_log: true,
                redis: Some(crate::config::RedisConfig {
                    address: "redis".into(),
                    password: None,
                    username: None,
                    timeout: Duration::ZERO,
                    fail_closed: false,
                    key_prefix: None,
                    tls: Some(crate::config::ClientTlsConfig {
                        client_cert_pem: Some("-----BEGIN CERTIFICATE-----".into()),
                        ..Default::default()
                    }),
                }),
                denied_cidrs: vec!["10.0.0.0/8".into(), "10.0.0.0".into()],
                ..Settings::default()
            },
            ..GatewayConfig::empty()
        };
        let problems = config.validate().unwrap_err();
        let paths: Vec<&str> = problems.0.iter().map(|p| p.path.as_str()).collect();
        for expected in [
            "apiVersion",
            "models[1].aliases[0]",
            "models[1].backends[0].url",
            "models[1].backends[0].headers.bad header",
            "models[1].backends[1].url",
            "models[1].backends[2].url",
            "models[1].timeouts.idle",
            "models[1].limits.requestsPerMinute",
            "models[1].loadBalancing.retryOnStatus[1]",
            "models[2].name",
            "models[3].name",
            "keys[0].id",
            "keys[0].sha256",
            "keys[2].id",
            "keys[2].sha256",
            "settings.maxRequestBodyBytes",
            "settings.redis.address",
            "settings.redis.timeout",
            "settings.redis.tls",
            "settings.deniedCIDRs[1]",
        ] {
            assert!(paths.contains(&expected), "missing {expected} in {paths:?}");
        }
        let text = problems.to_string();
        assert!(text.contains("\"llama3\" is already claimed by models[0].aliases[0]"), "{text}");
        assert!(!text.contains("secret-value"), "a header value leaked: {text}");
    }

    #[test]
    fn all_zero_weights_are_refused() {
        let mut only_fallbacks = model("llama", &[]);
        only_fallbacks.backends[0].weight = 0;
        let mut config = GatewayConfig::empty();
        config.models = vec![only_fallbacks];
        let problems = config.validate().unwrap_err();
        assert_eq!(problems.0[0].path, "models[0].backends");
    }

    #[test]
    fn base_urls() {
        assert_eq!(base_url_problem("https://api.openai.com/v1"), None);
        assert_eq!(base_url_problem("http://10.96.0.12:8000"), None);
        let azure = "https://res.openai.azure.com/openai/deployments/gpt4o?api-version=2024-06-01";
        assert_eq!(base_url_problem(azure), None);
        assert!(base_url_problem("api.openai.com/v1").is_some());
        assert!(base_url_problem("not a url").is_some());
        assert!(base_url_problem("http://169.254.169.254/latest").is_some());
        assert!(base_url_problem("http://[fe80::1]:80/v1").is_some());
        assert!(base_url_problem("http://[fd00:ec2::254]/v1").is_some());
        assert!(base_url_problem("http://example.com/v1#x").is_some());
    }

    /// Each case the issue tracker saw freeze a shared Gateway is refused
    /// by the one-object check, with a path naming the field.
    #[test]
    fn one_object_checks_name_the_field() {
        type Breaks = fn(&mut ModelConfig);
        let cases: [(&str, Breaks); 8] = [
            ("backends[0].tls.serverName", |m| {
                m.backends[0].tls =
                    Some(crate::config::ClientTlsConfig { server_name: Some("a..b".into()), ..Default::default() });
            }),
            ("backends[0].tls.serverName", |m| {
                m.backends[0].tls =
                    Some(crate::config::ClientTlsConfig { server_name: Some("ünï".into()), ..Default::default() });
            }),
            ("backends[0].tls.caPem", |m| {
                m.backends[0].tls =
                    Some(crate::config::ClientTlsConfig { ca_pem: Some("garbage".into()), ..Default::default() });
            }),
            ("timeouts.idle", |m| m.timeouts.idle = Duration::ZERO),
            ("name", |m| m.name = "llama\u{a0}3".into()),
            ("aliases[0]", |m| m.aliases = vec!["a\u{2003}b".into()]),
            ("backends[0].headers.host", |m| {
                m.backends[0].headers.insert("host".into(), "x".into());
            }),
            ("backends[0].headers.authorization", |m| {
                m.backends[0].headers.insert("authorization".into(), "Bearer a\u{7}b".into());
            }),
        ];
        for (path, break_it) in cases {
            let mut entry = model("llama", &[]);
            assert_eq!(entry.validate(), Ok(()));
            break_it(&mut entry);
            let problems = entry.validate().unwrap_err();
            assert_eq!(problems.0[0].path, path, "{problems}");
        }
        let mut forwarding = model("llama", &[]);
        forwarding.forward_headers = vec!["x-session-id".into(), "x-trace-*".into()];
        assert_eq!(forwarding.validate(), Ok(()));
        for bad in ["*", "x-*", "authorization", "Cookie", "a*"] {
            forwarding.forward_headers = vec![bad.into()];
            assert_eq!(forwarding.validate().unwrap_err().0[0].path, "forwardHeaders[0]", "{bad}");
        }
        let mut glob = key("team-a/alice", HASH_A);
        glob.models = Some(vec!["llama-*\u{85}".into()]);
        assert_eq!(glob.validate().unwrap_err().0[0].path, "models[0]");
    }

    /// A gateway leaves out exactly the entries with problems of their
    /// own, and the later of two that claim one name in one owner
    /// namespace; settings problems refuse the config whole.
    #[test]
    fn a_review_leaves_out_each_bad_entry_alone() {
        let mut config = GatewayConfig::empty();
        let team = |name: &str, namespace: &str| ModelConfig { namespace: Some(namespace.into()), ..model(name, &[]) };
        let mut bad_tls = team("vision", "team-b");
        bad_tls.backends[0].tls =
            Some(crate::config::ClientTlsConfig { server_name: Some("a..b".into()), ..Default::default() });
        config.models = vec![
            model("llama", &[]),
            team("llama", "team-a"),
            team("llama", "team-b"),
            team("llama-alias", "team-a"),
            ModelConfig { aliases: vec!["llama".into()], ..team("second", "team-a") },
            bad_tls,
            model("a b", &[]),
        ];
        // A bad entry claims nothing: the good one after it, of the same
        // name (or id, or hash), is served.
        let mut bad_first = team("x", "team-c");
        bad_first.backends[0].tls =
            Some(crate::config::ClientTlsConfig { server_name: Some("a..b".into()), ..Default::default() });
        config.models.extend([bad_first, team("x", "team-c")]);
        let other = "0".repeat(64);
        config.keys = vec![
            key("team-a/k1", HASH_A),
            key("team-b/k2", HASH_A),
            key("team-a/k1", &other),
            key("", &"1".repeat(64)),
            key("team-c/k3", "not-a-digest"),
            key("team-c/k3", &"2".repeat(64)),
            key("", &"3".repeat(64)),
            key("team-c/k4", &"3".repeat(64)),
        ];
        let review = config.review();
        assert_eq!(review.config, Vec::new());
        assert_eq!(review.models.keys().copied().collect::<Vec<_>>(), [4, 5, 6, 7], "{review:?}");
        assert!(review.models[&4][0].message.contains("already claimed by models[1].name"), "{review:?}");
        assert_eq!(review.models[&5][0].path, "models[5].backends[0].tls.serverName");
        assert_eq!(review.keys.keys().copied().collect::<Vec<_>>(), [1, 2, 3, 4, 6], "{review:?}");
        config.settings.max_request_body_bytes = 0;
        assert_eq!(config.review().config[0].path, "settings.maxRequestBodyBytes");
        assert!(config.validate().is_err());
    }

    /// Sharing and tenant settings are the platform's: a value the gateway
    /// cannot use refuses the config with its path; a key or model whose
    /// own class, capacity or limits cannot be served is left out alone.
    #[test]
    fn sharing_tenants_classes_and_capacities_are_checked() {
        use crate::config::{CapacityConfig, TenantConfig};
        let paths =
            |config: &GatewayConfig| -> Vec<String> { config.review().config.into_iter().map(|p| p.path).collect() };
        let mut config = GatewayConfig::empty();
        assert_eq!(paths(&config), Vec::<String>::new());
        let sharing = &mut config.settings.sharing;
        sharing.classes = vec!["gold".into(), "Bad Name".into(), "gold".into()];
        sharing.default_class = "standard".into();
        sharing.max_wait = Duration::ZERO;
        sharing.max_queued = 0;
        sharing.burst_percent = 500;
        let mut weighed = TenantConfig::new("team-a");
        weighed.weight = 0;
        weighed.classes = Some(vec!["silver".into()]);
        weighed.limits = Some(LimitsConfig::concurrent(0));
        config.settings.tenants =
            vec![weighed, TenantConfig::new("team-a"), TenantConfig::new("a/b"), TenantConfig::new("")];
        assert_eq!(
            paths(&config),
            [
                "settings.sharing.classes[1]",
                "settings.sharing.classes[2]",
                "settings.sharing.defaultClass",
                "settings.sharing.maxWait",
                "settings.sharing.maxQueued",
                "settings.sharing.burstPercent",
                "settings.tenants[0].weight",
                "settings.tenants[0].classes[0]",
                "settings.tenants[0].limits.maxConcurrent",
                "settings.tenants[1].namespace",
                "settings.tenants[2].namespace",
                "settings.tenants[3].namespace",
            ]
        );
        config.settings.sharing.classes = Vec::new();
        assert!(paths(&config).contains(&"settings.sharing.classes".to_owned()));
        config.settings.sharing.classes = (0..9).map(|i| format!("c{i}")).collect();
        assert!(paths(&config).contains(&"settings.sharing.classes".to_owned()), "at most 8 classes");
        config.settings.sharing.max_wait = Duration::from_secs(3601);
        assert!(paths(&config).contains(&"settings.sharing.maxWait".to_owned()));

        // Entries: a key's class, a model's capacity and concurrency.
        let mut config = GatewayConfig::empty();
        let mut gold = TenantConfig::new("team-a");
        gold.classes = Some(vec!["interactive".into()]);
        config.settings.tenants = vec![gold];
        let class = |id: &str, sha: &str, class: &str| KeyConfig { class: Some(class.into()), ..key(id, sha) };
        config.keys = vec![
            class("team-a/chat", HASH_A, "interactive"),
            class("team-a/bulk", &"1".repeat(64), "batch"),
            class("team-b/chat", &"2".repeat(64), "interactive"),
            class("team-b/plain", &"3".repeat(64), "standard"),
            class("team-b/odd", &"4".repeat(64), "Not A Label"),
        ];
        let mut zero = model("zero", &[]);
        zero.capacity = Some(CapacityConfig { max_in_flight_per_endpoint: 0 });
        let mut concurrent = model("concurrent", &[]);
        concurrent.limits = Some(LimitsConfig::concurrent(4));
        let mut sized = model("sized", &[]);
        sized.capacity = Some(CapacityConfig { max_in_flight_per_endpoint: 32 });
        config.models = vec![zero, concurrent, sized];
        let review = config.review();
        assert_eq!(review.config, Vec::new());
        assert_eq!(review.models.keys().copied().collect::<Vec<_>>(), [0, 1], "{review:?}");
        assert_eq!(review.models[&0][0].path, "models[0].capacity.maxInFlightPerEndpoint");
        assert_eq!(review.models[&1][0].path, "models[1].limits.maxConcurrent");
        // team-a may use interactive only; team-b has no policy: the
        // default class only.
        assert_eq!(review.keys.keys().copied().collect::<Vec<_>>(), [1, 2, 4], "{review:?}");
        assert!(review.keys[&2].iter().any(|p| p.message.contains("no tenant policy")), "{review:?}");
        assert_eq!(review.keys[&4][0].path, "keys[4].class");
    }
}
