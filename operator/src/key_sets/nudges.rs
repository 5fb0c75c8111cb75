//! The pods' nudges: a gateway pod that refused a token `unknown_key` (a
//! `kid` its provider's key set lacks, as right after the issuer rotated)
//! names the provider in its heartbeat Lease
//! (`waycast_crds::heartbeat::UNKNOWN_KEY_ANNOTATION`), and the refresher
//! fetches that key set sooner than its 10–30 s round.
//!
//! ```text
//! Lease store (every second) ─► new version, genuine heartbeat of Gateway G? ─► names G's own providers
//!   ─► (G, provider) ─► Refresher::nudge (at most once per 10 s a slot, whatever is asked)
//! ```
//!
//! Why the heartbeat: the pods write it anyway (every 5 s, and it is what
//! the operator already watches), so a nudge costs no new channel, port or
//! permission; a pod writes one for a nudge alone at most every 10 s. A
//! pod is untrusted: what it says is read as text of bounded length, only
//! from a genuine heartbeat of the Gateway (`heartbeats::is_genuine`),
//! only for that Gateway's own providers, each Lease version once — and
//! however often it asks, the refresher fetches a slot at most once per
//! 10 s.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use waycast_crds::Gateway;
use waycast_crds::heartbeat::{GATEWAY_LABEL, UNKNOWN_KEY_ANNOTATION, unknown_key_providers};

use super::SlotKey;
use crate::compile::ObjectKey;
use crate::heartbeats::is_genuine;

/// The Lease versions already read, by namespace and name: a version is
/// read once however often the store is looked at.
#[derive(Debug, Default)]
pub struct Nudges {
    read: HashMap<(String, String), String>,
}

impl Nudges {
    /// The slots the heartbeats in `leases` ask for, each new version's
    /// once: genuine heartbeats (`pods`) of Gateways in `gateways`, naming
    /// their own providers.
    pub fn read(
        &mut self,
        leases: &[Arc<Lease>],
        gateways: &Store<Gateway>,
        pods: &Store<PartialObjectMeta<Pod>>,
    ) -> Vec<SlotKey> {
        let mut asked = Vec::new();
        let mut seen = HashMap::with_capacity(self.read.len());
        for lease in leases {
            let Some(listed) = lease.annotations().get(UNKNOWN_KEY_ANNOTATION).filter(|listed| !listed.is_empty())
            else {
                continue;
            };
            let (Some(namespace), version) = (lease.namespace(), lease.resource_version().unwrap_or_default()) else {
                continue;
            };
            let at = (namespace.clone(), lease.name_any());
            let new = self.read.get(&at) != Some(&version);
            seen.insert(at, version);
            if !new {
                continue;
            }
            let Some(name) = lease.labels().get(GATEWAY_LABEL) else { continue };
            let Some(gateway) = gateways.get(&ObjectRef::new(name).within(&namespace)) else { continue };
            if !is_genuine(lease, &gateway, pods) {
                continue;
            }
            let providers = gateway.spec.identity.iter().flat_map(|identity| &identity.providers);
            let key = ObjectKey::of(&gateway.metadata);
            for provider in providers.filter(|provider| unknown_key_providers(listed).any(|n| n == provider.name)) {
                asked.push((key.clone(), provider.name.clone()));
            }
        }
        // Only the Leases that still name providers are remembered.
        self.read = seen;
        asked
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
    use waycast_crds::identity::{GatewayIdentity, IdentityProvider};

    use super::*;
    use crate::render::selector_labels;

    fn gateway() -> Gateway {
        let mut gateway = waycast_mock::fixtures::objects::gateway("platform", "gw");
        let provider = |name: &str| IdentityProvider {
            name: name.into(),
            issuer: Some(format!("https://{name}.example.com")),
            audiences: vec!["waycast".into()],
            ..IdentityProvider::default()
        };
        gateway.spec.identity = Some(GatewayIdentity { providers: vec![provider("corp"), provider("partner")] });
        gateway
    }

    /// A pod of the Gateway's Deployment.
    fn pod(name: &str) -> PartialObjectMeta<Pod> {
        let owner = OwnerReference {
            kind: "ReplicaSet".into(),
            name: "gw-5d9f".into(),
            controller: Some(true),
            ..Default::default()
        };
        PartialObjectMeta::<Pod> {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("platform".into()),
                uid: Some(format!("uid-{name}")),
                labels: Some(selector_labels(&gateway())),
                owner_references: Some(vec![owner]),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// The heartbeat of pod `owner` (by the UID `uid`), at `version`, naming `listed`.
    fn lease(owner: &str, uid: &str, version: &str, listed: &str) -> Arc<Lease> {
        let owner = OwnerReference { kind: "Pod".into(), name: owner.into(), uid: uid.into(), ..Default::default() };
        Arc::new(Lease {
            metadata: ObjectMeta {
                name: owner.name.clone().into(),
                namespace: Some("platform".into()),
                resource_version: Some(version.into()),
                labels: Some([(GATEWAY_LABEL.to_owned(), "gw".to_owned())].into()),
                annotations: Some([(UNKNOWN_KEY_ANNOTATION.to_owned(), listed.to_owned())].into()),
                owner_references: Some(vec![owner]),
                ..Default::default()
            },
            spec: None,
        })
    }

    fn store<K: kube::Resource<DynamicType = ()> + Clone + 'static>(objects: Vec<K>) -> Store<K> {
        let (reader, mut writer) = kube::runtime::reflector::store();
        for object in objects {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(object));
        }
        reader
    }

    fn slot(provider: &str) -> SlotKey {
        (ObjectKey { namespace: "platform".into(), name: "gw".into() }, provider.into())
    }

    #[test]
    fn a_genuine_heartbeat_asks_for_its_gateways_own_providers_once_a_version() {
        let (gateways, pods) = (store(vec![gateway()]), store(vec![pod("gw-5d9f-a")]));
        let mut nudges = Nudges::default();
        let beat = |version: &str, listed: &str| vec![lease("gw-5d9f-a", "uid-gw-5d9f-a", version, listed)];
        // Another Gateway's provider and nonsense are not asked for.
        let asked = nudges.read(&beat("1", "corp,someone-elses,,partner"), &gateways, &pods);
        assert_eq!(asked, [slot("corp"), slot("partner")]);
        assert!(nudges.read(&beat("1", "corp"), &gateways, &pods).is_empty(), "a version is read once");
        assert!(nudges.read(&beat("2", ""), &gateways, &pods).is_empty(), "a renewal naming none");
        assert_eq!(nudges.read(&beat("3", "corp"), &gateways, &pods), [slot("corp")], "a later note");
        assert!(nudges.read(&[], &gateways, &pods).is_empty() && nudges.read.is_empty(), "a Lease gone is forgotten");
    }

    /// Anyone who may write Leases in the namespace can label one for the
    /// Gateway: only a live pod's own heartbeat counts.
    #[test]
    fn only_a_genuine_heartbeat_asks() {
        let (gateways, pods) = (store(vec![gateway()]), store(vec![pod("gw-5d9f-a")]));
        let mut nudges = Nudges::default();
        let forged =
            [lease("gw-5d9f-a", "uid-another", "1", "corp"), lease("no-such-pod", "uid-no-such-pod", "1", "corp")];
        assert!(nudges.read(&forged, &gateways, &pods).is_empty());
        let no_gateway = store(Vec::new());
        assert!(nudges.read(&[lease("gw-5d9f-a", "uid-gw-5d9f-a", "2", "corp")], &no_gateway, &pods).is_empty());
    }
}
