//! The `ApiKey.status.usage` and `AccessGrant.status.usage` writes: each
//! key's (or grant's, `grant:<id>`) newest usage, once per key however
//! often it changed, written at most [`WRITES_PER_SECOND`]. The collector queues
//! only keys its Gateways serve, so the queue is as long as the keys
//! served, never as long as what a report lists.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams};
use waycast_crds::usage::{GRANT_USAGE_PREFIX, GrantUsageStatus, KeyUsageStatus, UsageTotals};
use waycast_crds::{AccessGrant, ApiKey};

use crate::apply::bounded;
use crate::context::Context;

/// The most `ApiKey.status.usage` writes a second (10,000 keys active:
/// each written about every 8 minutes).
pub const WRITES_PER_SECOND: u32 = 20;
/// The field manager of usage writes.
pub const USAGE_MANAGER: &str = "waycast-usage";

/// The key statuses to write, in the order they changed (each key once,
/// its newest usage), and a digest of what was written (per ApiKey
/// `namespace/name`: 10,000 keys cost a number each, not a status).
#[derive(Default)]
pub(super) struct KeyWrites {
    pub(super) pending: BTreeMap<String, KeyUsage>,
    pub(super) order: std::collections::VecDeque<String>,
    pub(super) written: BTreeMap<String, u64>,
}

/// A key's usage over the Gateways, in the currency and month of the
/// first Gateway that counts it, and when it was collected.
#[derive(Clone, Debug)]
pub(super) struct KeyUsage {
    pub(super) totals: UsageTotals,
    /// A grant's members who spent from their own budgets this period
    /// (`None`: a key, or a grant without `perUser` budgets).
    pub(super) members: Option<u64>,
    pub(super) shown: Arc<(String, String)>,
    pub(super) as_of: Arc<str>,
}

impl KeyUsage {
    /// Equal for equal usage, whenever collected.
    pub(super) fn digest(&self) -> u64 {
        use std::hash::BuildHasher as _;
        // Fixed keys: the digest compares rounds of one process.
        std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one((
            &self.totals,
            self.members,
            &self.shown,
        ))
    }

    fn status(&self) -> KeyUsageStatus {
        let (currency, month) = &*self.shown;
        self.totals.key_status(month, currency, &self.as_of)
    }
}

impl KeyWrites {
    pub(super) fn queue(&mut self, key: String, usage: KeyUsage) {
        if self.pending.insert(key.clone(), usage).is_none() {
            self.order.push_back(key);
        }
    }

    fn next(&mut self) -> Option<(String, KeyUsage)> {
        let key = self.order.pop_front()?;
        let usage = self.pending.remove(&key)?;
        Some((key, usage))
    }
}

/// Writes each key's usage as it changes, at most [`WRITES_PER_SECOND`].
pub(super) async fn write_key_statuses(context: Arc<Context>, writes: Arc<tokio::sync::Mutex<KeyWrites>>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1) / WRITES_PER_SECOND);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let params = PatchParams::apply(USAGE_MANAGER).force();
    loop {
        tick.tick().await;
        let next = writes.lock().await.next();
        let Some((key, usage)) = next else { continue };
        let grant = key.strip_prefix(GRANT_USAGE_PREFIX);
        let Some((namespace, name)) = grant.unwrap_or(&key).split_once('/') else { continue };
        let written = match grant {
            Some(_) => {
                let api: Api<AccessGrant> = Api::namespaced(context.client.clone(), namespace);
                let status = GrantUsageStatus { used: usage.status(), members: usage.members };
                let body = serde_json::json!({
                    "apiVersion": "waycast.dev/v1alpha1", "kind": "AccessGrant", "status": {"usage": status},
                });
                bounded(api.patch_status(name, &params, &Patch::Apply(body))).await.map(drop)
            }
            None => {
                let api: Api<ApiKey> = Api::namespaced(context.client.clone(), namespace);
                let body = serde_json::json!({
                    "apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "status": {"usage": usage.status()},
                });
                bounded(api.patch_status(name, &params, &Patch::Apply(body))).await.map(drop)
            }
        };
        match written {
            Ok(_) => {
                writes.lock().await.written.insert(key, usage.digest());
            }
            // A key or grant gone, or one the Gateway serves under an id no object has: nothing to write.
            Err(crate::error::Error::Kube(kube::Error::Api(refused))) if refused.code == 404 => {
                writes.lock().await.written.insert(key, usage.digest());
            }
            Err(error) => {
                tracing::warn!(%key, %error, "usage: cannot write the key's status; retrying");
                let mut writes = writes.lock().await;
                if !writes.pending.contains_key(&key) {
                    writes.queue(key, usage);
                }
            }
        }
    }
}
