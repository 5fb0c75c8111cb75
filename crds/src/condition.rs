//! The condition vocabulary: types and reasons as constants, so the operator,
//! the docs and ArgoCD health checks agree on spelling.
//!
//! Each condition is a standard `metav1.Condition`. Reasons are CamelCase and
//! stable: tooling matches on them.

/// Condition types.
pub mod types {
    /// The object is valid and taken into the compiled config of its Gateway(s).
    pub const ACCEPTED: &str = "Accepted";
    /// Every reference (Services, Secrets) the object makes resolved.
    pub const RESOLVED_REFS: &str = "ResolvedRefs";
    /// Every ready gateway pod that serves the object has applied a config
    /// that reflects it.
    pub const PROGRAMMED: &str = "Programmed";
    /// The object is usable: for an ApiKey the key works; for a Gateway enough
    /// replicas are ready.
    pub const READY: &str = "Ready";
}

/// Condition reasons.
pub mod reasons {
    // === shared ===
    /// All is well.
    pub const ACCEPTED: &str = "Accepted";
    /// References resolved.
    pub const RESOLVED: &str = "Resolved";
    /// Every ready pod serves a config with this object.
    pub const PROGRAMMED: &str = "Programmed";
    /// Waiting for gateway pods to apply the newest config.
    pub const PENDING: &str = "Pending";
    /// No Gateway selects the object.
    pub const NO_GATEWAY: &str = "NoGateway";
    /// The spec is valid for the schema but cannot be served (the message says why).
    pub const INVALID: &str = "Invalid";

    // === ModelEndpoint ===
    /// Another, older ModelEndpoint already claims the model name or an alias.
    pub const MODEL_NAME_CONFLICT: &str = "ModelNameConflict";
    /// A backend Service does not exist or has no such port.
    pub const BACKEND_NOT_FOUND: &str = "BackendNotFound";
    /// A backend's upstream credential Secret or key is missing.
    pub const AUTH_SECRET_MISSING: &str = "AuthSecretMissing";

    // === ApiKey ===
    /// The key is served.
    pub const KEY_READY: &str = "KeyReady";
    /// The referenced Secret, or its key, does not exist.
    pub const SECRET_MISSING: &str = "SecretMissing";
    /// The user-supplied key is shorter than the minimum length.
    pub const KEY_TOO_SHORT: &str = "KeyTooShort";
    /// `spec.expiresAt` has passed.
    pub const EXPIRED: &str = "Expired";
    /// `spec.disabled` is true.
    pub const DISABLED: &str = "Disabled";
    /// Another, older ApiKey on the same Gateway holds the same key text.
    pub const DUPLICATE_KEY: &str = "DuplicateKey";
    /// The key Secret `<name>-key` exists but is not owned by this ApiKey.
    pub const SECRET_NOT_OWNED: &str = "SecretNotOwned";
    /// `spec.class` is not a class of the Gateway, or not one its
    /// namespace's policy allows.
    pub const CLASS_NOT_ALLOWED: &str = "ClassNotAllowed";
    /// The key's namespace already has as many served keys on this Gateway
    /// as its tenant policy's `maxApiKeys` allows; this key is newer.
    pub const TENANT_KEY_LIMIT: &str = "TenantKeyLimit";
    /// An AccessGrant names a provider the Gateway does not trust (none of
    /// its `spec.identity.providers`, or one left out as invalid).
    pub const UNKNOWN_PROVIDER: &str = "UnknownProvider";

    // === ModelEndpoint and ApiKey parents ===
    /// The object names the Gateway, but the Gateway's namespace rules (or
    /// egress rules) do not admit it.
    pub const NOT_ALLOWED_BY_GATEWAY: &str = "NotAllowedByGateway";
    /// `parentRefs` names a Gateway that does not exist.
    pub const GATEWAY_NOT_FOUND: &str = "GatewayNotFound";
    /// A credential Secret lacks the label `waycast.dev/credential: "true"`.
    pub const SECRET_NOT_LABELLED: &str = "SecretNotLabelled";

    // === Gateway ===
    /// The gateway Deployment has enough ready replicas.
    pub const REPLICAS_READY: &str = "ReplicasReady";
    /// Fewer replicas are ready than desired.
    pub const REPLICAS_NOT_READY: &str = "ReplicasNotReady";
    /// The config Secret was written.
    pub const CONFIG_WRITTEN: &str = "ConfigWritten";
    /// The compiled config does not fit, or could not be written.
    pub const CONFIG_ERROR: &str = "ConfigError";
    /// The TLS Secret is missing or not a kubernetes.io/tls Secret.
    pub const TLS_SECRET_INVALID: &str = "TLSSecretInvalid";
    /// An object the Gateway would own already exists and belongs to
    /// someone else; it is left untouched.
    pub const NAME_CONFLICT: &str = "NameConflict";
    /// Gateway pods refused the config the operator wrote; they keep
    /// serving their last good one.
    pub const CONFIG_REFUSED: &str = "ConfigRefused";
    /// The Gateway's config would outgrow its Secret with this object: the
    /// Gateway namespace's objects and older objects are served first.
    pub const CONFIG_TOO_LARGE: &str = "ConfigTooLarge";
    /// A Secret the object references holds more data than the operator
    /// reads (see the message for the limit).
    pub const SECRET_TOO_LARGE: &str = "SecretTooLarge";
    /// A gateway pod left this object's entry out of the config it serves
    /// (it could not build it); the rest of the config is served.
    pub const REFUSED_BY_GATEWAY: &str = "RefusedByGateway";
    /// A gateway pod's usage report broke a rule and was refused whole
    /// (an Event on the Gateway; the rule is in `status.usage.refusedReports`).
    pub const USAGE_REPORT_REFUSED: &str = "UsageReportRefused";
    /// An identity provider's key set could not be fetched, or was not a
    /// key set (a Warning Event on the Gateway, once per new error; the
    /// last good key set keeps serving).
    pub const KEY_SET_FETCH_FAILED: &str = "KeySetFetchFailed";
    /// An identity provider's key set is fetched again after failures (a
    /// Normal Event on the Gateway).
    pub const KEY_SET_FETCHED: &str = "KeySetFetched";
}

/// The minimum length of a user-supplied key (see `ApiKey.spec.secretRef`).
pub const MIN_KEY_LENGTH: usize = 32;
