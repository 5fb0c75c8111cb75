//! `GatewayConfig`: the compiled, versioned config a gateway serves.
//!
//! ```text
//! operator compile ─► GatewayConfig ─► gzipped JSON in Secret <gw>-config ─┐
//! standalone user  ─► GatewayConfig ─► YAML file ──────────────────────────┴─► gateway
//! ```
//!
//! One format for both: camelCase like Kubernetes, `apiVersion` checked,
//! unknown fields refused (a typo is an error, not a silently ignored line).
//! Parsing lives here; the checks the types cannot express are in
//! [`crate::validate`]. Plaintext API keys never appear in it — only their
//! SHA-256.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::glob::glob_matches;
use crate::problems::Problems;

/// The `apiVersion` of the current config format.
pub const CONFIG_API_VERSION: &str = "waycast.dev/config-v1";
/// The data key of the compiled config in a config Secret (gzipped JSON).
pub const SECRET_KEY_GZIP: &str = "config.json.gz";
/// Data keys a hand-made config Secret may use instead (plain JSON or YAML).
pub const SECRET_KEYS_PLAIN: &[&str] = &["config.json", "config.yaml"];
/// The largest config a gateway reads, uncompressed (a bound against gzip
/// bombs); the operator writes no config larger, whatever it compresses to.
pub const MAX_CONFIG_JSON_BYTES: u64 = 64 * 1024 * 1024;

/// The whole config of one gateway fleet.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GatewayConfig {
    /// Always [`CONFIG_API_VERSION`].
    pub api_version: String,
    /// Models clients can ask for.
    #[serde(default)]
    pub models: Vec<ModelConfig>,
    /// Keys the gateway accepts.
    #[serde(default)]
    pub keys: Vec<KeyConfig>,
    /// Fleet-wide settings.
    #[serde(default)]
    pub settings: Settings,
    /// Token issuers the gateway trusts (`Gateway.spec.identity`). Not yet
    /// served: the gateway reads and checks them, and verifies no token.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<ProviderConfig>,
    /// Who the providers' tokens admit, and to what (AccessGrants). Not
    /// yet served, like `providers`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<GrantConfig>,
}

pub use crate::identity_config::{ClaimsConfig, ConfigMapKeyConfig, GrantConfig, PerUserConfig, ProviderConfig};

/// One model and where it is served.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ModelConfig {
    /// Name clients send in `"model"`.
    pub name: String,
    /// Other names for it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    /// Upstreams, chosen by weight.
    pub backends: Vec<BackendConfig>,
    /// Upstream timeouts.
    #[serde(default)]
    pub timeouts: TimeoutsConfig,
    /// Limits over all keys for this model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsConfig>,
    /// Where this entry came from (`namespace/name` of its ModelEndpoint), for
    /// logs and metrics. Absent in hand-written configs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The team namespace that owns the name: its keys resolve the name
    /// here first; another namespace's keys reach it only by opting in to
    /// it (`namespace/name` in their `models`). Absent: a platform model
    /// (the Gateway's own namespace, or a hand-written config), which every
    /// key resolves after its own namespace's models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The namespaces whose keys may call this model: a key's namespace is
    /// the part of its `id` before the first `/`. Absent: every key. A key
    /// that may not call a model gets the same 404 as for an unknown model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_namespaces: Option<Vec<String>>,
    /// Client headers forwarded to this model's backends besides the
    /// gateway's own allow-list: lowercase names, or a prefix ending in `*`
    /// (`x-session-*`). Client credentials and hop-by-hop headers never are.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forward_headers: Vec<String>,
    /// Query parameters of a client's request sent upstream, by name (e.g.
    /// `api-version`); every other parameter is dropped. The backend URL's
    /// own query is always sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forward_query_parameters: Vec<String>,
    /// Output tokens reserved against token limits for a request that sets
    /// no `max_tokens` (default 1024); settled on the usage afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_token_reservation: Option<u64>,
    /// How requests are spread over the endpoints of backends that name
    /// `endpoints`.
    #[serde(default, skip_serializing_if = "LoadBalancingConfig::is_default")]
    pub load_balancing: LoadBalancingConfig,
    /// When the model is full (then its requests queue fairly in each pod).
    /// Absent: never queued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityConfig>,
    /// What its tokens cost (each request's cost is in its usage record
    /// and counted by key and model). Absent: not priced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing: Option<crate::money::PricingConfig>,
    /// The APIs it offers; `None`: every one its backends serve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apis: Option<Vec<crate::model_api::ModelApi>>,
}

impl ModelConfig {
    /// The model `name`, served by one backend at `url`, with every other
    /// field at its default.
    pub fn to(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            aliases: Vec::new(),
            backends: vec![BackendConfig::to(url)],
            timeouts: TimeoutsConfig::default(),
            limits: None,
            source: None,
            namespace: None,
            key_namespaces: None,
            forward_headers: Vec::new(),
            forward_query_parameters: Vec::new(),
            output_token_reservation: None,
            load_balancing: LoadBalancingConfig::default(),
            capacity: None,
            pricing: None,
            apis: None,
        }
    }

    /// The namespace whose keys resolve this model's names first; `None`
    /// for a platform model.
    pub fn owner_namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }
}

pub use crate::balancing::{LoadBalancingConfig, LoadBalancingPolicy};
pub use crate::common::LimitsConfig;
pub use crate::settings::{ClientTlsConfig, DEFAULT_MAX_REQUEST_BODY_BYTES, RedisConfig, Settings};
pub use crate::sharing::{CapacityConfig, SharingConfig, TenantConfig};

/// One upstream.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackendConfig {
    /// OpenAI-style base URL: a request for `/v1/X` goes to `<url>/X`.
    pub url: String,
    /// Model name sent upstream instead of the client's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Share of requests relative to the other backends; 0 = only as fallback.
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Headers added to every upstream request (credentials, typically).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// A Service whose ready endpoints serve this backend, as
    /// `namespace/name:port` (its key in the endpoints document, see
    /// [`crate::endpoints`]). Each request then goes to one endpoint, picked
    /// by the model's `loadBalancing`; `url` still gives the scheme, path
    /// and `Host`, and is used while no endpoint is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<String>,
    /// Failover tier (lowest first): a tier serves only when every backend
    /// of the tiers before it refused the request.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: u32,
    /// TLS to an `https` backend: a private CA, a client certificate, the
    /// name its certificate carries. Absent: the public web PKI, no client
    /// certificate, the URL's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ClientTlsConfig>,
    /// The API it speaks: what is passed through and what translated.
    #[serde(default, skip_serializing_if = "is_default_format")]
    pub format: crate::backend::BackendFormat,
}

fn is_default_format(format: &crate::backend::BackendFormat) -> bool {
    *format == crate::backend::BackendFormat::OpenAI
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

fn default_weight() -> u32 {
    1
}

// NB: header values are upstream credentials; they must never reach a log.
impl BackendConfig {
    /// A backend at `url` with every other field at its default (weight 1).
    pub fn to(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            model: None,
            weight: default_weight(),
            headers: BTreeMap::new(),
            endpoints: None,
            priority: 0,
            tls: None,
            format: crate::backend::BackendFormat::OpenAI,
        }
    }
}

impl fmt::Debug for BackendConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: BTreeMap<&str, &str> = self.headers.keys().map(|name| (name.as_str(), "<redacted>")).collect();
        f.debug_struct("BackendConfig")
            .field("url", &self.url)
            .field("model", &self.model)
            .field("weight", &self.weight)
            .field("headers", &headers)
            .field("endpoints", &self.endpoints)
            .field("priority", &self.priority)
            .field("tls", &self.tls)
            .field("format", &self.format)
            .finish()
    }
}

/// Upstream timeouts. There is deliberately no total-duration timeout.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TimeoutsConfig {
    /// Establishing the TCP (and TLS) connection.
    #[serde(with = "crate::duration::serde_text", default = "TimeoutsConfig::default_connect")]
    pub connect: Duration,
    /// Request sent → first response byte.
    #[serde(with = "crate::duration::serde_text", default = "TimeoutsConfig::default_first_byte")]
    pub first_byte: Duration,
    /// Longest pause between response chunks.
    #[serde(with = "crate::duration::serde_text", default = "TimeoutsConfig::default_idle")]
    pub idle: Duration,
}

impl TimeoutsConfig {
    fn default_connect() -> Duration {
        Duration::from_secs(5)
    }
    fn default_first_byte() -> Duration {
        Duration::from_secs(300)
    }
    fn default_idle() -> Duration {
        Duration::from_secs(60)
    }
}

impl Default for TimeoutsConfig {
    fn default() -> Self {
        Self { connect: Self::default_connect(), first_byte: Self::default_first_byte(), idle: Self::default_idle() }
    }
}

/// One accepted key.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KeyConfig {
    /// Who the key belongs to, e.g. `namespace/name` of its ApiKey. Appears in
    /// logs and metrics.
    pub id: String,
    /// Lowercase hex SHA-256 of the key text.
    pub sha256: String,
    /// Model names or `*` globs the key may use. Absent: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// When the key stops working.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<jiff::Timestamp>,
    /// A disabled key is refused with 401.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
    /// Limits for this key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsConfig>,
    /// Its priority class (one of `settings.sharing.classes`); absent: the
    /// default class, or the lowest its tenant may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// What it may spend per calendar period.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<crate::spend::BudgetConfig>,
}

impl KeyConfig {
    /// The key `id` with SHA-256 `sha256` (lowercase hex), every other
    /// field at its default.
    pub fn new(id: impl Into<String>, sha256: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            sha256: sha256.into(),
            models: None,
            expires_at: None,
            disabled: false,
            limits: None,
            class: None,
            budgets: Vec::new(),
        }
    }

    /// The namespace of the key: its id up to the first `/` (ids are
    /// `namespace/name` in operator-written configs); a bare id has none.
    pub fn namespace(&self) -> &str {
        self.id.split_once('/').map_or("", |(namespace, _)| namespace)
    }
}

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not valid JSON.
    #[error("config is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// Not valid YAML.
    #[error("config is not valid YAML: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
    /// Parsed, but some values are wrong.
    #[error("config is invalid: {0}")]
    Invalid(Problems),
}

impl GatewayConfig {
    /// An empty config of the current version.
    pub fn empty() -> Self {
        Self {
            api_version: CONFIG_API_VERSION.to_owned(),
            models: Vec::new(),
            keys: Vec::new(),
            settings: Settings::default(),
            providers: Vec::new(),
            grants: Vec::new(),
        }
    }

    /// Parses JSON (text starting with `{`) or YAML, then validates.
    ///
    /// # Errors
    /// [`ConfigError`] naming the syntax error, or every invalid value with
    /// its path.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, ConfigError> {
        let config = Self::parse(bytes)?;
        config.validate().map_err(ConfigError::Invalid)?;
        Ok(config)
    }

    /// Parses JSON (text starting with `{`) or YAML without validating:
    /// for a reader that leaves out invalid entries one by one
    /// ([`GatewayConfig::review`]).
    ///
    /// # Errors
    /// [`ConfigError`] naming the syntax error.
    pub fn parse(bytes: &[u8]) -> Result<Self, ConfigError> {
        let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
        Ok(if first == Some(&b'{') { serde_json::from_slice(bytes)? } else { serde_yaml_ng::from_slice(bytes)? })
    }

    /// Canonical JSON: what the operator writes and hashes. Field order is
    /// the struct order and maps are `BTreeMap`s, so equal configs give equal
    /// bytes.
    ///
    /// # Errors
    /// Only if serialization itself fails (it does not for these types).
    pub fn to_canonical_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_yaml() {
        let yaml = r#"
apiVersion: waycast.dev/config-v1
models:
  - name: llama-3.1-8b
    aliases: [llama3]
    backends:
      - url: http://10.0.12.7:8000/v1
        model: meta-llama/Llama-3.1-8B-Instruct
        weight: 1
        headers: {authorization: "Bearer upstream-secret"}
    timeouts: {connect: 5s, firstByte: 300s, idle: 60s}
keys:
  - id: team-a/alice
    sha256: 2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae
    models: ["llama-*"]
    expiresAt: 2027-01-01T00:00:00Z
    limits: {requestsPerMinute: 600}
settings:
  maxRequestBodyBytes: 10485760
  accessLog: true
"#;
        let config = GatewayConfig::from_slice(yaml.as_bytes()).unwrap();
        assert_eq!(config.models[0].timeouts.first_byte, Duration::from_secs(300));
        assert_eq!(config.keys[0].limits.unwrap().requests_per_minute, Some(600));
        // Round trip through the canonical JSON form the operator writes.
        let json = config.to_canonical_json().unwrap();
        assert_eq!(GatewayConfig::from_slice(&json).unwrap(), config);
        // Upstream credentials never show in Debug output.
        assert!(!format!("{config:?}").contains("upstream-secret"));
    }

    /// Any bytes — a valid config cut short or with bytes flipped — give a
    /// config or an error, never a panic.
    #[test]
    fn property_parsing_never_panics() {
        let yaml = "apiVersion: waycast.dev/config-v1\nmodels:\n  - name: m\n    backends: [{url: http://10.0.0.1/v1, headers: {x-k: v}}]\n    timeouts: {idle: 1m30s}\n    keyNamespaces: [a]\nkeys:\n  - {id: a/k, sha256: 2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae, models: [\"m*\"]}\nsettings: {deniedCIDRs: [10.0.0.0/8]}\n";
        let json = GatewayConfig::from_slice(yaml.as_bytes()).unwrap().to_canonical_json().unwrap();
        let mut random = crate::seeded::Xorshift::new(0x1234_5678_9abc_def1);
        let mut next = move || random.next_u64() as usize;
        for document in [yaml.as_bytes(), &json[..]] {
            for _ in 0..3_000 {
                let _ = GatewayConfig::from_slice(&document[..next() % (document.len() + 1)]);
                let mut flipped = document.to_vec();
                let at = next() % flipped.len();
                flipped[at] ^= 1 << (next() % 8);
                let _ = GatewayConfig::from_slice(&flipped);
            }
        }
    }

    /// The shared seeded generator, with the configs this test draws from it.
    struct Random(crate::seeded::Xorshift);

    impl std::ops::Deref for Random {
        type Target = crate::seeded::Xorshift;
        fn deref(&self) -> &Self::Target {
            &self.0
        }
    }

    impl std::ops::DerefMut for Random {
        fn deref_mut(&mut self) -> &mut Self::Target {
            &mut self.0
        }
    }

    impl Random {
        fn word(&mut self) -> String {
            let letters = ["a", "b", "x", "7", "-", "llama", "gpt", "3.1", "8b", "é"];
            (0..1 + self.below(4)).map(|_| self.pick(&letters)).collect()
        }

        fn duration(&mut self) -> Duration {
            Duration::from_millis(1 + self.below(600_000))
        }

        fn limits(&mut self) -> Option<LimitsConfig> {
            let per_minute = |random: &mut Self| (!random.chance(3)).then(|| 1 + random.below(100_000));
            let limits = LimitsConfig {
                requests_per_minute: per_minute(self),
                tokens_per_minute: per_minute(self),
                max_concurrent: self.chance(3).then(|| 1 + self.below(64)),
            };
            (limits != LimitsConfig::default() && self.chance(2)).then_some(limits)
        }

        fn backend(&mut self) -> BackendConfig {
            let host = self.pick(&["vllm.models", "10.0.12.7", "[fd00::7]", "api.example.com"]);
            let scheme = self.pick(&["http", "https"]);
            let mut backend = BackendConfig::to(format!("{scheme}://{host}:{}/v1", 1 + self.below(65_535)));
            backend.weight = u32::try_from(self.below(4)).unwrap();
            backend.priority = u32::try_from(self.below(3)).unwrap();
            if self.chance(2) {
                backend.model = Some(format!("org/{}", self.word()));
            }
            if self.chance(3) {
                let value = self.pick(&["Bearer sk-123", "v", "a b c"]);
                backend.headers.insert(self.pick(&["authorization", "x-api-key", "api-key"]).into(), value.into());
            }
            if self.chance(3) {
                backend.endpoints = Some(format!("team-{}/vllm:{}", self.below(3), 1 + self.below(65_535)));
            }
            backend
        }

        /// A config every field of which is valid, with names unique per
        /// owner and key ids and digests unique.
        fn config(&mut self) -> GatewayConfig {
            let mut config = GatewayConfig::empty();
            for index in 0..self.below(6) {
                let mut model = ModelConfig::to(format!("{}-{index}", self.word()), "http://placeholder/v1");
                model.backends = (0..1 + self.below(3)).map(|_| self.backend()).collect();
                model.backends[0].weight = 1 + u32::try_from(self.below(3)).unwrap();
                model.aliases = (0..self.below(3)).map(|alias| format!("alias-{index}-{alias}")).collect();
                model.timeouts =
                    TimeoutsConfig { connect: self.duration(), first_byte: self.duration(), idle: self.duration() };
                // A model's concurrency is its capacity, never a limit.
                model.limits = self
                    .limits()
                    .map(|limits| LimitsConfig { max_concurrent: None, ..limits })
                    .filter(|limits| *limits != LimitsConfig::default());
                if self.chance(2) {
                    model.namespace = Some(format!("team-{}", self.below(3)));
                    model.source = Some(format!("{}/{}", model.namespace.as_deref().unwrap_or_default(), model.name));
                }
                if self.chance(3) {
                    model.key_namespaces = Some((0..self.below(3)).map(|n| format!("team-{n}")).collect());
                }
                if self.chance(3) {
                    model.forward_query_parameters = vec!["api-version".into()];
                }
                if self.chance(4) {
                    model.output_token_reservation = Some(self.below(100_000));
                }
                if self.chance(3) {
                    let most = u32::try_from(1 + self.below(64)).unwrap();
                    model.capacity = Some(CapacityConfig { max_in_flight_per_endpoint: most });
                }
                config.models.push(model);
            }
            for index in 0..self.below(8) {
                let mut key = KeyConfig::new(
                    format!("team-{}/key-{index}", self.below(3)),
                    format!("{:016x}{:016x}{:016x}{:016x}", index, self.next_u64(), self.next_u64(), self.next_u64()),
                );
                if self.chance(2) {
                    key.models = Some((0..1 + self.below(3)).map(|_| format!("{}*", self.word())).collect());
                }
                if self.chance(3) {
                    key.expires_at = jiff::Timestamp::from_second(1_700_000_000 + self.below(1 << 30) as i64).ok();
                }
                key.disabled = self.chance(5);
                key.limits = self.limits();
                if self.chance(3) {
                    // The default class: open to every namespace, with a
                    // policy or without.
                    key.class = Some("standard".to_owned());
                }
                config.keys.push(key);
            }
            config.settings.max_request_body_bytes = 1 + self.below(DEFAULT_MAX_REQUEST_BODY_BYTES);
            config.settings.access_log = self.chance(2);
            if self.chance(3) {
                let mut gold = TenantConfig::new("team-0");
                gold.weight = u32::try_from(1 + self.below(1000)).unwrap();
                gold.classes = Some(vec!["interactive".into(), "standard".into()]);
                let mut capped = TenantConfig::new("team-1");
                capped.limits = self.limits();
                config.settings.tenants = vec![gold, capped];
                config.settings.sharing.max_wait = self.duration();
                config.settings.sharing.burst_percent = u32::try_from(self.below(401)).unwrap();
            }
            if self.chance(3) {
                config.settings.denied_cidrs = vec!["192.0.2.0/24".into()];
                config.settings.allowed_hosts = vec!["api.example.com".into(), "*.example.net".into()];
            }
            config
        }
    }

    /// Every generated valid config is valid to the gateway's checks, and
    /// the canonical JSON the operator writes parses back to it exactly.
    #[test]
    fn property_a_valid_config_round_trips_through_its_canonical_json() {
        let mut random = Random(crate::seeded::Xorshift::new(0xbb67_ae85_84ca_a73b));
        for _ in 0..2_000 {
            let config = random.config();
            let review = config.review();
            assert!(review.config.is_empty() && review.models.is_empty() && review.keys.is_empty(), "{review:?}");
            let json = config.to_canonical_json().unwrap();
            assert_eq!(GatewayConfig::from_slice(&json).unwrap(), config);
            let yaml = serde_yaml_ng::to_string(&config).unwrap();
            assert_eq!(GatewayConfig::from_slice(yaml.as_bytes()).unwrap(), config, "{yaml}");
        }
    }

    #[test]
    fn refuses_unknown_fields() {
        let yaml = "apiVersion: waycast.dev/config-v1\nmodels: []\nkeyz: []\n";
        let error = GatewayConfig::from_slice(yaml.as_bytes()).unwrap_err().to_string();
        assert!(error.contains("unknown field `keyz`"), "{error}");
    }

    #[test]
    fn applies_defaults() {
        let config = GatewayConfig::from_slice(b"{\"apiVersion\":\"waycast.dev/config-v1\"}").unwrap();
        assert_eq!(config, GatewayConfig::empty());
    }
}
