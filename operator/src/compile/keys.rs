//! ApiKeys → key entries: the key text read from its Secret (generated or
//! user-supplied), checked (length, expiry, disabled, duplicates) and
//! reduced to its SHA-256. The plaintext goes no further: the operator
//! keeps a key Secret as a [`KeySecret`] (its digests), never its text.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt as _;
use waycast_crds::ApiKey;
use waycast_crds::condition::{MIN_KEY_LENGTH, reasons};
use waycast_crds::config::KeyConfig;

use super::inputs::Inputs;
pub use super::key_secret::{KeySecret, KeyText, is_key_secret};
use super::models::key_limits;
use super::secrets::index;
use super::select;
use super::tenants::Tenants;
use super::verdict::{ObjectKey, Verdict};

pub use waycast_crds::api_key::GENERATED_DATA_KEY;

/// The Secret holding a generated key: `<apikey>-key`.
pub fn generated_secret_name(api_key: &str) -> String {
    format!("{api_key}-key")
}

/// The annotation the operator sets on its own copy of a held-back ApiKey
/// (`stores::admitted`: no Gateway admitted its namespace when the store
/// saw it); never written to the API server, and dropped from a key that
/// carries it.
pub const HELD_BACK_ANNOTATION: &str = "operator.waycast.dev/held-back";

/// Whether the store holds `key` held back: its name and parents only.
pub fn is_held_back(key: &ApiKey) -> bool {
    key.metadata.annotations.as_ref().is_some_and(|annotations| annotations.contains_key(HELD_BACK_ANNOTATION))
}

/// A key's verdict and what its status may show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyVerdict {
    /// Served or not, and why.
    pub verdict: Verdict,
    /// The key's first characters, when it was found.
    pub key_prefix: Option<String>,
    /// The ApiKey's generation compiled.
    pub generation: Option<i64>,
}

/// Where an ApiKey's key comes from: a key Secret as kept, or a Secret
/// with its data (tests, and Secrets known only by their metadata).
#[derive(Clone, Copy)]
enum Source<'a> {
    Kept(&'a KeySecret),
    Read(&'a Secret),
}

impl<'a> Source<'a> {
    fn controlled_by(self, uid: Option<&String>) -> bool {
        match self {
            Source::Kept(kept) => kept.controller.is_some() && kept.controller.as_ref() == uid,
            Source::Read(secret) => {
                secret.owner_references().iter().any(|owner| owner.controller == Some(true) && Some(&owner.uid) == uid)
            }
        }
    }

    fn text(self, data_key: &str) -> Option<Cow<'a, KeyText>> {
        match self {
            Source::Kept(kept) => kept.text(data_key).map(Cow::Borrowed),
            Source::Read(secret) => KeyText::of(&secret.data.as_ref()?.get(data_key)?.0).map(Cow::Owned),
        }
    }
}

/// The Secret name and data key an ApiKey reads its key from.
pub fn key_source(api_key: &ApiKey) -> (String, String) {
    match &api_key.spec.secret_ref {
        Some(reference) => (reference.name.clone(), reference.key.clone()),
        None => (generated_secret_name(&api_key.name_any()), GENERATED_DATA_KEY.to_owned()),
    }
}

/// The ApiKeys the Gateway serves (both sides consent), in namespace/name order.
fn selected<'a>(inputs: &Inputs<'a>) -> Vec<&'a ApiKey> {
    let gateway = inputs.gateway;
    let gateway_namespace = gateway.namespace().unwrap_or_default();
    let name = gateway.name_any();
    let gateway_ref =
        select::GatewayRef { namespace: &gateway_namespace, name: &name, policy: gateway.spec.api_keys.as_ref() };
    let mut selected: Vec<&ApiKey> = inputs
        .api_keys
        .iter()
        .copied()
        .filter(|key| key.metadata.deletion_timestamp.is_none())
        // NB: a key held back (its namespace was admitted by no Gateway
        // when the store saw it) has no spec to serve yet: it comes whole
        // with the re-list its admission starts.
        .filter(|key| !is_held_back(key))
        .filter(|key| {
            let namespace = key.metadata.namespace.as_deref().unwrap_or_default();
            select::parent(&gateway_ref, namespace, key.labels(), &key.spec.parent_refs, inputs.namespaces)
                == select::Parent::Admitted
        })
        .collect();
    // No two ApiKeys share a namespace and name: an unstable sort is the
    // same order, without a stable sort's scratch copy.
    selected.sort_unstable_by(|a, b| ObjectKey::sort_key(&a.metadata).cmp(&ObjectKey::sort_key(&b.metadata)));
    selected
}

/// The key Secrets of the ApiKeys the Gateway serves, as
/// `(namespace, name)`: the only key Secrets whose data is read.
pub fn key_secrets(inputs: &Inputs<'_>) -> impl Iterator<Item = (String, String)> {
    selected(inputs).into_iter().map(|api_key| (api_key.namespace().unwrap_or_default(), key_source(api_key).0))
}

/// Compiles every selected ApiKey (in namespace/name order); `tenants`
/// decides which classes each namespace's keys may use.
pub fn compile(
    inputs: &Inputs<'_>,
    now: jiff::Timestamp,
    tenants: &mut Tenants<'_>,
) -> (Vec<KeyConfig>, BTreeMap<ObjectKey, KeyVerdict>) {
    // NB: decided oldest first, so that two ApiKeys with one key text keep
    // the older one served (a name sorting first takes nothing over); the
    // config lists the keys in namespace/name order all the same.
    let mut selected: Vec<(usize, &ApiKey)> = selected(inputs).into_iter().enumerate().collect();
    let created = |key: &ApiKey| key.metadata.creation_timestamp.as_ref().map(|t| t.0);
    selected.sort_by(|(a_order, a), (b_order, b)| created(a).cmp(&created(b)).then(a_order.cmp(b_order)));
    // Sized once: growing by doubling held the old and the new copy of
    // 10,000 entries at once, on every compile.
    let mut entries: Vec<(usize, KeyConfig)> = Vec::with_capacity(selected.len());
    // Each verdict at its key's place in namespace/name order: the map is
    // then built from sorted entries at once, not by 100,000 inserts in
    // creation order.
    let mut verdicts: Vec<Option<(ObjectKey, KeyVerdict)>> = (0..selected.len()).map(|_| None).collect();
    // Each served key's SHA-256 → the ApiKey serving it (its id is made
    // only for a duplicate's message).
    let mut hashes: std::collections::HashMap<String, &ApiKey> =
        std::collections::HashMap::with_capacity(selected.len());
    let secrets = index::<Secret>(inputs.secrets);
    let kept: std::collections::HashMap<(&str, &str), &KeySecret> =
        inputs.key_secrets.iter().map(|kept| ((kept.namespace.as_str(), kept.name.as_str()), *kept)).collect();
    for (order, api_key) in selected {
        let id = ObjectKey::of(&api_key.metadata);
        let generation = api_key.metadata.generation;
        let (secret_name, data_key) = key_source(api_key);
        let at = (id.namespace.as_str(), secret_name.as_str());
        let source = kept.get(&at).map(|k| Source::Kept(k)).or_else(|| secrets.get(&at).map(|s| Source::Read(s)));
        // NB: a generated key's Secret must be this ApiKey's own: an ApiKey
        // named after someone else's `<name>-key` Secret must not serve it.
        let foreign = api_key.spec.secret_ref.is_none()
            && source.is_some_and(|source| !source.controlled_by(api_key.metadata.uid.as_ref()));
        if foreign {
            let message = format!(
                "Secret {}/{secret_name} exists and is not owned by this ApiKey: it is left untouched and not used; rename the ApiKey or remove the Secret",
                id.namespace
            );
            verdicts[order] = Some((
                id,
                KeyVerdict {
                    verdict: Verdict::refused(reasons::SECRET_NOT_OWNED, message),
                    key_prefix: None,
                    generation,
                },
            ));
            continue;
        }
        if !inputs.too_large.is_empty() && inputs.too_large.contains(&(id.namespace.clone(), secret_name.clone())) {
            let message = format!("Secret {}/{secret_name} {}", id.namespace, super::secrets::TOO_LARGE);
            verdicts[order] = Some((
                id,
                KeyVerdict {
                    verdict: Verdict::refused(reasons::SECRET_TOO_LARGE, message),
                    key_prefix: None,
                    generation,
                },
            ));
            continue;
        }
        let Some(text) = source.and_then(|source| source.text(&data_key)) else {
            let message = format!("Secret {}/{secret_name} has no key {data_key:?}", id.namespace);
            verdicts[order] = Some((
                id,
                KeyVerdict {
                    verdict: Verdict::refused(reasons::SECRET_MISSING, message),
                    key_prefix: None,
                    generation,
                },
            ));
            continue;
        };
        let key_prefix = Some(text.prefix.clone());
        let verdict = if text.chars < MIN_KEY_LENGTH {
            Verdict::refused(reasons::KEY_TOO_SHORT, format!("the key is shorter than {MIN_KEY_LENGTH} characters"))
        } else if api_key.spec.disabled {
            Verdict::refused(reasons::DISABLED, "spec.disabled is true")
        } else if api_key.spec.expires_at.as_ref().is_some_and(|expires| expires.0 <= now) {
            Verdict::refused(reasons::EXPIRED, "spec.expiresAt has passed")
        } else if let Err(refused) = tenants.key_class(&id.namespace, api_key.spec.class.as_deref()) {
            refused
        } else if let Err(refused) = tenants.key_room(&id.namespace) {
            // NB: decided oldest first (creation time, then name): the
            // cap leaves out the newest, the same ones on every compile.
            refused
        } else {
            let sha256 = text.sha256.clone();
            match hashes.get(&sha256).map(|owner| ObjectKey::of(&owner.metadata)) {
                // NB: another team's object is never named, nor that one exists.
                Some(owner) if owner.namespace == id.namespace => {
                    Verdict::refused(reasons::DUPLICATE_KEY, format!("{owner} already uses the same key"))
                }
                Some(_) => Verdict::refused(reasons::DUPLICATE_KEY, "another ApiKey already uses the same key text"),
                None => {
                    let mut entry = KeyConfig::new(id.to_string(), sha256);
                    entry.models = api_key.spec.models.clone();
                    entry.expires_at = api_key.spec.expires_at.as_ref().map(|t| t.0);
                    entry.limits = api_key.spec.limits.as_ref().map(key_limits);
                    entry.class = api_key.spec.class.clone();
                    entry.budgets = api_key.spec.budgets.iter().map(waycast_crds::spend::Budget::config).collect();
                    // The gateway's own check on this entry alone.
                    match entry.validate() {
                        Ok(()) => {
                            hashes.insert(entry.sha256.clone(), api_key);
                            tenants.count_key(&id.namespace);
                            entries.push((order, entry));
                            Verdict::accepted(reasons::KEY_READY, "the key is served")
                        }
                        Err(problems) => {
                            let fields: Vec<String> =
                                problems.0.iter().map(|p| format!("spec.{}: {}", p.path, p.message)).collect();
                            Verdict::refused(reasons::INVALID, format!("not servable: {}", fields.join("; ")))
                        }
                    }
                }
            }
        };
        verdicts[order] = Some((id, KeyVerdict { verdict, key_prefix, generation }));
    }
    // The orders are distinct: an unstable sort is the same order, without
    // a stable sort's scratch copy of half the entries.
    entries.sort_unstable_by_key(|(order, _)| *order);
    (entries.into_iter().map(|(_, entry)| entry).collect(), verdicts.into_iter().flatten().collect())
}
