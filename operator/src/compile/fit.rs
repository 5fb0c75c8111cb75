//! A config that outgrows its Secrets (`render::config_parts::fits`: its
//! models and settings too large for one, a key too large for any shard,
//! or more than a gateway reads) still gets written: the newest
//! objects are left out until it fits, the platform's last.
//!
//! ```text
//! compiled config ─fits?─ yes ─► as it is
//!                   └─ no ─► entries ranked: the Gateway namespace's first, then oldest first
//!                            ─► the fewest newest ones left out that make it fit (binary search)
//!                            ─► each refused: ConfigTooLarge
//! ```
//!
//! NB: without this, one team adding large objects (CA bundles, thousands
//! of keys) stopped every config write — and with them every other team's
//! key revocations. Leaving out entries only ever shrinks the config, so a
//! revocation (an entry gone) always fits.

use std::collections::BTreeSet;

use waycast_crds::GatewayConfig;
use waycast_crds::condition::reasons;

use super::Compiled;
use super::verdict::{ObjectKey, Verdict};

/// Which kind of entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A model entry (its ModelEndpoint).
    Model,
    /// A key entry (its ApiKey).
    Key,
}

/// Leaves out the fewest newest entries of `compiled` that make `fits`
/// true, ranking the Gateway namespace's objects before every other and
/// older objects before newer (`created`: an object's creation time, in
/// seconds). Returns how many were left out.
pub fn fit(
    compiled: &mut Compiled,
    gateway_namespace: &str,
    created: impl Fn(Kind, &ObjectKey) -> Option<i64>,
    fits: impl Fn(&GatewayConfig) -> bool,
) -> usize {
    if fits(&compiled.config) {
        return 0;
    }
    // Every entry, the first to leave out first.
    let mut ranked: Vec<(bool, i64, Kind, ObjectKey)> = compiled
        .config
        .models
        .iter()
        .filter_map(|model| Some((Kind::Model, parse(model.source.as_deref()?)?)))
        .chain(compiled.config.keys.iter().filter_map(|key| Some((Kind::Key, parse(&key.id)?))))
        .map(|(kind, id)| {
            let platform = id.namespace == gateway_namespace;
            (platform, created(kind, &id).unwrap_or(i64::MAX), kind, id)
        })
        .collect();
    ranked.sort_by(|a, b| (a.0, std::cmp::Reverse(a.1), a.2, &a.3).cmp(&(b.0, std::cmp::Reverse(b.1), b.2, &b.3)));
    let without = |count: usize| {
        let dropped: BTreeSet<(Kind, &ObjectKey)> =
            ranked[..count].iter().map(|(_, _, kind, id)| (*kind, id)).collect();
        let mut config = compiled.config.clone();
        config
            .models
            .retain(|m| m.source.as_deref().and_then(parse).is_none_or(|id| !dropped.contains(&(Kind::Model, &id))));
        config.keys.retain(|k| parse(&k.id).is_none_or(|id| !dropped.contains(&(Kind::Key, &id))));
        config
    };
    // The fewest: dropping more only ever shrinks the config.
    let (mut low, mut high) = (0, ranked.len());
    while low < high {
        let middle = (low + high) / 2;
        if fits(&without(middle)) { high = middle } else { low = middle + 1 }
    }
    let fitting = without(low);
    compiled.config = fitting;
    let message = "left out of the Gateway's config, which would outgrow its Secrets with it: the Gateway's own \
                   namespace's objects and older objects are served first";
    for (_, _, kind, id) in ranked.drain(..low) {
        match kind {
            Kind::Model => {
                compiled.models.insert(id, Verdict::refused(reasons::CONFIG_TOO_LARGE, message));
            }
            Kind::Key => {
                if let Some(verdict) = compiled.keys.get_mut(&id) {
                    verdict.verdict = Verdict::refused(reasons::CONFIG_TOO_LARGE, message);
                }
            }
        }
    }
    low
}

/// `namespace/name`.
fn parse(id: &str) -> Option<ObjectKey> {
    let (namespace, name) = id.split_once('/')?;
    Some(ObjectKey { namespace: namespace.to_owned(), name: name.to_owned() })
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use waycast_crds::config::{KeyConfig, ModelConfig};

    use super::*;
    use crate::compile::keys::KeyVerdict;

    fn compiled(models: &[&str], keys: &[&str]) -> Compiled {
        let served = Verdict::accepted("Accepted", "served");
        let key_served =
            KeyVerdict { verdict: Verdict::accepted("KeyReady", "served"), key_prefix: None, generation: None };
        Compiled {
            config: GatewayConfig {
                models: models
                    .iter()
                    .map(|id| {
                        let mut model = ModelConfig::to(*id, "http://10.0.0.1/v1");
                        model.source = Some((*id).into());
                        model
                    })
                    .collect(),
                keys: keys.iter().map(|id| KeyConfig::new(*id, "0".repeat(64))).collect(),
                ..GatewayConfig::empty()
            },
            models: models.iter().map(|id| (parse(id).unwrap(), served.clone())).collect(),
            keys: keys.iter().map(|id| (parse(id).unwrap(), key_served.clone())).collect::<BTreeMap<_, _>>(),
            grants: BTreeMap::new(),
            gateway: None,
            tenants: Vec::new(),
        }
    }

    /// The newest team objects go first, the Gateway namespace's last; a
    /// config that fits is left as it is.
    #[test]
    fn the_newest_team_objects_are_left_out_until_the_config_fits() {
        let ages: HashMap<&str, i64> = [
            ("platform/llama", 1),
            ("team-a/old", 2),
            ("team-b/new", 9),
            ("team-a/k1", 3),
            ("team-b/k2", 8),
            ("platform/admin", 10),
        ]
        .into();
        let created = |_: Kind, id: &ObjectKey| ages.get(format!("{id}").as_str()).copied();
        let entries = |config: &GatewayConfig| config.models.len() + config.keys.len();
        let mut fitting =
            compiled(&["platform/llama", "team-a/old", "team-b/new"], &["team-a/k1", "team-b/k2", "platform/admin"]);
        assert_eq!(fit(&mut fitting, "platform", created, |c| entries(c) <= 6), 0);
        let mut over = fitting.clone();
        assert_eq!(fit(&mut over, "platform", created, |c| entries(c) <= 3), 3);
        let kept: Vec<String> = over
            .config
            .models
            .iter()
            .filter_map(|m| m.source.clone())
            .chain(over.config.keys.iter().map(|k| k.id.clone()))
            .collect();
        assert_eq!(kept, ["platform/llama", "team-a/old", "platform/admin"]);
        let refused = &over.models[&parse("team-b/new").unwrap()];
        assert_eq!((refused.accepted, refused.reason), (false, reasons::CONFIG_TOO_LARGE));
        assert!(!over.keys[&parse("team-b/k2").unwrap()].verdict.accepted);
        assert!(over.keys[&parse("platform/admin").unwrap()].verdict.accepted, "the platform's are served first");
    }
}
