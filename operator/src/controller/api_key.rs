//! ApiKeys: their generated key Secrets, and their status from the
//! selecting Gateways' compiles.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt as _};
use waycast_crds::ApiKey;

use super::shell::{CONCURRENCY, RESYNC, error_policy, succeeded, write_status};
use super::statuses::parent_decisions;
use crate::apply::bounded;
use crate::compile::{keys, select};
use crate::context::Context;
use crate::error::Error;
use crate::status;
use crate::stores::{KEY_SECRET_LABEL, once};

/// Generates key Secrets, apart from the status controller: a new ApiKey's
/// key is created at once instead of after a re-check of every other key's
/// status (10,000 of them took tens of seconds).
pub(crate) async fn key_secret_controller(context: Arc<Context>) {
    let keys = context.stores.keys.clone();
    let (objects, paced) = context.stores.feeds.key_secrets.subscribe(keys.clone(), once());
    Controller::for_stream(futures_util::stream::pending(), keys)
        .reconcile_on(objects)
        .with_config(ControllerConfig::default().concurrency(CONCURRENCY))
        .run(reconcile_key_secret, error_policy, context)
        .for_each(|reported| {
            paced.finished(&reported);
            futures_util::future::ready(())
        })
        .await;
}

pub(crate) async fn reconcile_key_secret(api_key: Arc<ApiKey>, context: Arc<Context>) -> Result<Action, Error> {
    ensure_generated_secret(&context, &api_key).await?;
    Ok(Action::await_change())
}

/// Creates `<name>-key` with a fresh key when the ApiKey has no `secretRef`
/// and the Secret does not exist yet. An existing key is never replaced.
pub(crate) async fn ensure_generated_secret(context: &Context, api_key: &ApiKey) -> Result<(), Error> {
    let (client, stores) = (&context.client, &context.stores);
    // NB: a held-back key (no Gateway admits its namespace) gets no Secret
    // yet: a namespace nobody serves costs the API server no write per
    // ApiKey. It comes whole, and gets its Secret, once a Gateway admits it.
    if api_key.spec.secret_ref.is_some() || keys::is_held_back(api_key) {
        return Ok(());
    }
    let namespace = api_key.namespace().ok_or(Error::Incomplete("namespace"))?;
    let name = keys::generated_secret_name(&api_key.name_any());
    // NB: a lookup, not a scan: scanning every key Secret for every ApiKey
    // was 10,000 × 10,000 comparisons (and 150 million string copies) at scale.
    if stores.key_secrets.get(&ObjectRef::new(&name).within(&namespace)).is_some() {
        return Ok(());
    }
    let mut random = [0_u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut random).map_err(|_| Error::Random)?;
    let key = waycast_crds::api_key::key_text_from_bytes(&random);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.clone()),
            labels: Some(BTreeMap::from([(KEY_SECRET_LABEL.to_owned(), "true".to_owned())])),
            owner_references: api_key.controller_owner_ref(&()).map(|owner| vec![owner]),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(keys::GENERATED_DATA_KEY.to_owned(), ByteString(key.into_bytes()))])),
        ..Secret::default()
    };
    match bounded(Api::<Secret>::namespaced(client.clone(), &namespace).create(&PostParams::default(), &secret)).await {
        // Kept at its version: the Gateways' compiles need not read it back.
        Ok(created) => {
            context.secret_data.remember(&created).await;
            Ok(())
        }
        // Created meanwhile (the store lags): keep the existing key.
        Err(Error::Kube(kube::Error::Api(status))) if status.code == 409 => Ok(()),
        Err(error) => Err(error),
    }
}

pub(crate) async fn reconcile_api_key(api_key: Arc<ApiKey>, context: Arc<Context>) -> Result<Action, Error> {
    let now = jiff::Timestamp::now();
    let decisions =
        parent_decisions(&context, select::Kind::ApiKeys, api_key.as_ref(), &api_key.spec.parent_refs, |from, id| {
            from.keys.get(id).map(|record| record.verdict.clone())
        });
    let Some(decisions) = decisions.await else { return Ok(Action::await_change()) };
    let new_status = status::api_key_status(&api_key, decisions.refused, &decisions.decided, decisions.programmed, now);
    write_status(&context, api_key.as_ref(), api_key.status.as_ref(), &new_status).await?;
    context.metrics.reconciles.with_label_values(&["apikey"]).inc();
    succeeded(&context, api_key.as_ref());
    // Come back when the key expires, to mark it Expired.
    let until_expiry = api_key.spec.expires_at.as_ref().and_then(|t| {
        let seconds = t.0.as_second() - now.as_second();
        u64::try_from(seconds).ok().filter(|s| *s > 0)
    });
    Ok(match until_expiry {
        Some(seconds) if seconds < RESYNC.as_secs() => Action::requeue(Duration::from_secs(seconds + 1)),
        // The periodic look at every key (`every`) comes first.
        _ => Action::await_change(),
    })
}
