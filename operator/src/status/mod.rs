//! Statuses, pure: conditions built with `observedGeneration` and a
//! `lastTransitionTime` that moves only when the status changes, and the
//! Gateway's whole status from the facts a reconcile gathered.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use waycast_crds::common::GatewayAcceptance;
use waycast_crds::condition::{reasons, types};
use waycast_crds::{
    AccessGrant, AccessGrantStatus, ApiKey, ApiKeyStatus, Gateway, GatewayStatus, ModelEndpoint, ModelEndpointStatus,
};

use crate::compile::keys::KeyVerdict;

/// A condition of `kind`, carrying over the transition time from `previous`
/// when the status did not change.
pub fn condition(
    previous: &[Condition],
    kind: &str,
    ok: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: jiff::Timestamp,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == kind && c.status == status)
        .map_or(Time(now), |c| c.last_transition_time.clone());
    Condition {
        type_: kind.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time,
    }
}

/// Whether two condition lists differ in more than their times.
pub fn changed(old: &[Condition], new: &[Condition]) -> bool {
    let key =
        |c: &Condition| (c.type_.clone(), c.status.clone(), c.reason.clone(), c.message.clone(), c.observed_generation);
    old.len() != new.len() || old.iter().zip(new).any(|(a, b)| key(a) != key(b))
}

/// A pod of a Gateway that refused the config it was given.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RefusingPod {
    /// The pod.
    pub pod: String,
    /// Why, as it reported.
    pub reason: String,
    /// The config hash it keeps serving instead.
    pub serving: String,
}

/// What a Gateway's status is built from: its compile's verdict, what was
/// written and what its pods and Deployment report.
#[derive(Debug, Clone)]
pub struct GatewayFacts<'a> {
    /// The compile's refusal of the Gateway itself; `None`: accepted.
    pub refused: Option<&'a crate::compile::Verdict>,
    /// The hash of the config the pods are to serve.
    pub hash: &'a str,
    /// Why the compiled config does not fit its Secrets (and so was not
    /// written); `None`: it fits.
    pub too_large: Option<&'a crate::render::config_parts::TooLarge>,
    /// Objects left out so that it fits (`ConfigTooLarge` on each).
    pub left_out: usize,
    /// Models and keys in the compiled config.
    pub models: usize,
    /// Keys in the compiled config.
    pub keys: usize,
    /// Pods refusing `hash`, sorted.
    pub refusing: &'a [RefusingPod],
    /// Pods reporting `hash`.
    pub up_to_date: usize,
    /// The Deployment's replicas.
    pub replicas: i32,
    /// Its ready replicas.
    pub ready: i32,
    /// The replicas it must have ready to be Ready.
    pub wanted: i32,
    /// `clusterIP:port` of its Service.
    pub address: Option<String>,
    /// What each tenant policy matched.
    pub tenants: &'a [waycast_crds::sharing::TenantPolicyStatus],
    /// Where each identity provider's key set stands (`key_sets`).
    pub identity: Option<waycast_crds::identity::GatewayIdentityStatus>,
}

/// The status of `gateway` given `facts`, at `now`.
pub fn gateway_status(gateway: &Gateway, facts: &GatewayFacts<'_>, now: jiff::Timestamp) -> GatewayStatus {
    let generation = gateway.metadata.generation;
    let previous = gateway.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let hash = facts.hash;
    let accepted = match facts.refused {
        None => condition(previous, types::ACCEPTED, true, reasons::ACCEPTED, "the spec is valid", generation, now),
        Some(refused) => {
            condition(previous, types::ACCEPTED, false, refused.reason, refused.message.to_string(), generation, now)
        }
    };
    let programmed = if let Some(too_large) = facts.too_large {
        condition(
            previous,
            types::PROGRAMMED,
            false,
            reasons::CONFIG_ERROR,
            format!(
                "the compiled config ({} keys, {} models) does not fit its Secrets: {too_large}; the pods keep the last config",
                facts.keys, facts.models,
            ),
            generation,
            now,
        )
    } else if let Some(first) = facts.refusing.first() {
        condition(
            previous,
            types::PROGRAMMED,
            false,
            reasons::CONFIG_REFUSED,
            format!(
                "{} pod(s) refused config {}; {} keeps serving {}: {}",
                facts.refusing.len(),
                abbreviated(hash),
                first.pod,
                first.serving.get(..12).filter(|s| !s.is_empty()).unwrap_or("no config"),
                first.reason
            ),
            generation,
            now,
        )
    } else {
        condition(
            previous,
            types::PROGRAMMED,
            true,
            reasons::CONFIG_WRITTEN,
            match facts.left_out {
                0 => format!("config {} written", abbreviated(hash)),
                left_out => format!(
                    "config {} written without the {left_out} newest object(s): with them it would outgrow its Secrets (each says ConfigTooLarge)",
                    abbreviated(hash)
                ),
            },
            generation,
            now,
        )
    };
    let ready = facts.ready >= facts.wanted;
    let ready = condition(
        previous,
        types::READY,
        ready,
        if ready { reasons::REPLICAS_READY } else { reasons::REPLICAS_NOT_READY },
        format!("{} of {} replicas ready", facts.ready, facts.wanted),
        generation,
        now,
    );
    let count = |n: usize| Some(i32::try_from(n).unwrap_or(i32::MAX));
    GatewayStatus {
        conditions: vec![accepted, programmed, ready],
        replicas: Some(facts.replicas),
        ready_replicas: Some(facts.ready),
        up_to_date_replicas: count(facts.up_to_date),
        config_hash: Some(hash.to_owned()),
        model_count: count(facts.models),
        api_key_count: count(facts.keys),
        address: facts.address.clone(),
        tenants: facts.tenants.to_vec(),
        identity: facts.identity.clone(),
        // The usage collector's own to write.
        usage: None,
        observed_generation: generation,
    }
}

/// The status of a Gateway that may not own what it would: every
/// condition False with `NameConflict`, naming the object.
pub fn gateway_name_conflict(gateway: &Gateway, conflict: &str, now: jiff::Timestamp) -> GatewayStatus {
    let generation = gateway.metadata.generation;
    let previous = gateway.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let message = format!(
        "{conflict} already exists and is not controlled by this Gateway; it is left untouched. Rename the Gateway or remove that object"
    );
    let mut status = gateway.status.clone().unwrap_or_default();
    status.conditions = [types::ACCEPTED, types::PROGRAMMED, types::READY]
        .into_iter()
        .map(|kind| condition(previous, kind, false, reasons::NAME_CONFLICT, message.clone(), generation, now))
        .collect();
    status.observed_generation = generation;
    status.usage = None;
    status
}

/// `Programmed`: every selecting Gateway serves the object's current
/// generation on every pod (`(selecting gateways, all programmed)`).
pub fn programmed_condition(
    previous: &[Condition],
    (gateways, all): (usize, bool),
    generation: Option<i64>,
    now: jiff::Timestamp,
) -> Condition {
    let (ok, reason, message) = match (gateways, all) {
        (0, _) => (false, reasons::NO_GATEWAY, "no Gateway selects it".to_owned()),
        (n, true) => (true, reasons::PROGRAMMED, format!("every pod of {n} Gateway(s) serves its current version")),
        (n, false) => {
            (false, reasons::PENDING, format!("waiting for the pods of {n} Gateway(s) to apply the new config"))
        }
    };
    condition(previous, types::PROGRAMMED, ok, reason, message, generation, now)
}

/// The reason constant equal to `text` (status entries carry owned text;
/// conditions want the constant).
fn reason_of(text: &str) -> &'static str {
    [reasons::NOT_ALLOWED_BY_GATEWAY, reasons::GATEWAY_NOT_FOUND]
        .into_iter()
        .find(|r| *r == text)
        .unwrap_or(reasons::INVALID)
}

/// The status of `api_key` from its parents: `refused` (Gateways it names
/// that do not take it), `decided` (each admitting Gateway's id and
/// verdict, in the order they were looked at) and `programmed`.
pub fn api_key_status(
    api_key: &ApiKey,
    mut entries: Vec<GatewayAcceptance>,
    decided: &[(String, KeyVerdict)],
    programmed: (usize, bool),
    now: jiff::Timestamp,
) -> ApiKeyStatus {
    let mut served_by = Vec::new();
    let mut verdict: Option<&KeyVerdict> = None;
    for (gateway, found) in decided {
        if found.verdict.accepted {
            served_by.push(gateway.clone());
        }
        entries.push(GatewayAcceptance {
            gateway: gateway.clone(),
            accepted: found.verdict.accepted,
            reason: found.verdict.reason.to_owned(),
            message: found.verdict.message.to_string(),
        });
        // The first verdict, unless a later Gateway serves the key.
        if verdict.is_none() || found.verdict.accepted {
            verdict = Some(found);
        }
    }
    entries.sort_by(|a, b| a.gateway.cmp(&b.gateway));
    served_by.sort();
    let (secret_name, _) = crate::compile::keys::key_source(api_key);
    let (ready, reason, message, prefix) = match (verdict, entries.first()) {
        (Some(found), _) => {
            (found.verdict.accepted, found.verdict.reason, found.verdict.message.to_string(), found.key_prefix.clone())
        }
        (None, Some(entry)) => (false, reason_of(&entry.reason), format!("{}: {}", entry.gateway, entry.message), None),
        (None, None) => (false, reasons::NO_GATEWAY, "no Gateway selects this key".to_owned(), None),
    };
    let generation = api_key.metadata.generation;
    let previous = api_key.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    ApiKeyStatus {
        conditions: vec![
            condition(previous, types::READY, ready, reason, message, generation, now),
            programmed_condition(previous, programmed, generation, now),
        ],
        secret_name: Some(secret_name),
        key_prefix: prefix,
        limits: if ready { api_key.spec.limits.clone().map(Box::new) } else { None },
        gateways: served_by,
        parents: entries,
        usage: None,
        observed_generation: generation,
        compared_digest: None,
    }
}

/// The status of `endpoint` from one entry per parent Gateway (refused or
/// decided) and `programmed`.
pub fn model_endpoint_status(
    endpoint: &ModelEndpoint,
    mut entries: Vec<GatewayAcceptance>,
    programmed: (usize, bool),
    now: jiff::Timestamp,
) -> ModelEndpointStatus {
    entries.sort_by(|a, b| a.gateway.cmp(&b.gateway));
    let generation = endpoint.metadata.generation;
    let previous = endpoint.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let refused = entries.iter().find(|e| !e.accepted);
    let (accepted, reason, message) = match (entries.is_empty(), refused) {
        (true, _) => (false, reasons::NO_GATEWAY, "no Gateway selects this ModelEndpoint".to_owned()),
        (false, Some(entry)) => (false, entry.reason.as_str(), format!("{}: {}", entry.gateway, entry.message)),
        (false, None) => (true, reasons::ACCEPTED, format!("served by {} Gateway(s)", entries.len())),
    };
    let unresolved = entries.iter().find(|e| {
        [reasons::BACKEND_NOT_FOUND, reasons::AUTH_SECRET_MISSING, reasons::SECRET_NOT_LABELLED]
            .contains(&e.reason.as_str())
    });
    let resolved = condition(
        previous,
        types::RESOLVED_REFS,
        unresolved.is_none(),
        unresolved.map_or(reasons::RESOLVED, |e| e.reason.as_str()),
        unresolved.map_or_else(|| "every reference resolved".to_owned(), |e| e.message.clone()),
        generation,
        now,
    );
    let conditions = vec![
        condition(previous, types::ACCEPTED, accepted, reason, message, generation, now),
        resolved,
        programmed_condition(previous, programmed, generation, now),
    ];
    ModelEndpointStatus {
        conditions,
        gateways: entries,
        backend_count: Some(i32::try_from(endpoint.spec.backends.len()).unwrap_or(i32::MAX)),
        observed_generation: generation,
    }
}

/// The status of `grant` from one entry per parent Gateway (refused or
/// decided) and `programmed`, as a ModelEndpoint's: `Accepted` is False
/// while any parent refuses it (the first such, by Gateway, says why), so a
/// grant one of its Gateways cannot serve is never shown as fine.
pub fn access_grant_status(
    grant: &AccessGrant,
    mut parents: Vec<GatewayAcceptance>,
    programmed: (usize, bool),
    now: jiff::Timestamp,
) -> AccessGrantStatus {
    parents.sort_by(|a, b| a.gateway.cmp(&b.gateway));
    let generation = grant.metadata.generation;
    let previous = grant.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let refused = parents.iter().find(|e| !e.accepted);
    let (accepted, reason, message) = match (parents.is_empty(), refused) {
        (true, _) => (false, reasons::NO_GATEWAY, "no Gateway selects this AccessGrant".to_owned()),
        (false, Some(entry)) => (false, entry.reason.as_str(), format!("{}: {}", entry.gateway, entry.message)),
        (false, None) => (true, reasons::ACCEPTED, format!("served by {} Gateway(s)", parents.len())),
    };
    let conditions = vec![
        condition(previous, types::ACCEPTED, accepted, reason, message, generation, now),
        programmed_condition(previous, programmed, generation, now),
    ];
    // `usage`: the usage collector's own to write.
    AccessGrantStatus { conditions, parents, usage: None, observed_generation: generation }
}

/// A status with conditions: the four kinds' statuses.
pub trait WithConditions: Clone + PartialEq + serde::Serialize {
    /// Its conditions, to compare without their transition times.
    fn conditions(&self) -> &[Condition];
    /// The same status without conditions, to compare the rest exactly.
    fn without_conditions(&self) -> Self;
    /// The digest a cache keeps in place of what `status_changed` compares
    /// (`compared_digest`); `None`: the status is held whole.
    fn kept_digest(&self) -> Option<u64> {
        None
    }
}

macro_rules! with_conditions {
    ($status:ty $(, $apart:ident)* $(; kept as $digest:ident)?) => {
        impl WithConditions for $status {
            fn conditions(&self) -> &[Condition] {
                &self.conditions
            }

            // What another writer keeps (`usage`: the usage collector's,
            // under a field manager of its own) is not this writer's to compare.
            fn without_conditions(&self) -> Self {
                Self { conditions: Vec::new(), $($apart: None,)* ..self.clone() }
            }

            $(fn kept_digest(&self) -> Option<u64> {
                self.$digest
            })?
        }
    };
}

with_conditions!(GatewayStatus, usage);
with_conditions!(ApiKeyStatus, usage, compared_digest; kept as compared_digest);
with_conditions!(ModelEndpointStatus);
with_conditions!(AccessGrantStatus, usage);

/// Whether writing `new` over `old` changes anything a reader sees: the
/// conditions apart from their times, or anything else. An `old` kept as a
/// digest (`kept_form`) is compared by its digest.
pub fn status_changed<S: WithConditions>(old: Option<&S>, new: &S) -> bool {
    let Some(old) = old else { return true };
    if let Some(digest) = old.kept_digest() {
        return digest != compared_digest(new);
    }
    changed(old.conditions(), new.conditions()) || old.without_conditions() != new.without_conditions()
}

/// One digest of what `status_changed` compares of `status`: its
/// conditions without their times, and the rest as JSON. Keyed per
/// process: no one who may write a status can aim at a digest.
pub fn compared_digest<S: WithConditions>(status: &S) -> u64 {
    use std::hash::{BuildHasher as _, Hash as _, Hasher as _};
    static KEYS: std::sync::LazyLock<std::hash::RandomState> = std::sync::LazyLock::new(std::hash::RandomState::new);
    let mut hasher = KEYS.build_hasher();
    for c in status.conditions() {
        (&c.type_, &c.status, &c.reason, &c.message, c.observed_generation).hash(&mut hasher);
    }
    // Serializing a status of plain fields cannot fail; a failure would
    // only hash as empty, and the status be written again.
    serde_json::to_vec(&status.without_conditions()).unwrap_or_default().hash(&mut hasher);
    hasher.finish()
}

/// An ApiKey's status as the operator's cache keeps it: the type, status
/// and transition time of its own conditions (what the next status carries
/// over and what an Event is emitted on), and a digest of the rest. At
/// 100,000 keys the whole statuses were about 100 MB of the operator's memory.
pub fn kept_form(status: &ApiKeyStatus) -> ApiKeyStatus {
    let conditions = status
        .conditions
        .iter()
        .filter(|c| [types::READY, types::PROGRAMMED].contains(&c.type_.as_str()))
        .map(|c| Condition {
            type_: c.type_.clone(),
            status: c.status.clone(),
            last_transition_time: c.last_transition_time.clone(),
            reason: String::new(),
            message: String::new(),
            observed_generation: None,
        })
        .collect();
    ApiKeyStatus { conditions, compared_digest: Some(compared_digest(status)), ..ApiKeyStatus::default() }
}

/// The first 12 characters of a config hash, as statuses show it.
fn abbreviated(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

#[cfg(test)]
mod tests;
