//! ModelEndpoint status from the selecting Gateways' compiles.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt as _;
use kube::runtime::controller::Action;
use waycast_crds::condition::{reasons, types};
use waycast_crds::{ModelEndpoint, ModelEndpointStatus};

use super::{decided, parents_of, programmed_condition, programmed_on, succeeded};
use crate::apply::patch_status;
use crate::compile::{ObjectKey, select};
use crate::context::{Context, emit_transitions};
use crate::error::Error;
use crate::status;

pub(crate) async fn reconcile_model_endpoint(
    endpoint: Arc<ModelEndpoint>,
    context: Arc<Context>,
) -> Result<Action, Error> {
    let client = &context.client;
    let id = ObjectKey::of(&endpoint.metadata);
    let now = jiff::Timestamp::now();
    let namespaces: Vec<Arc<Namespace>> = context.stores.namespaces.state();
    let namespaces: Vec<&Namespace> = namespaces.iter().map(AsRef::as_ref).collect();
    let mut programmed = (0, true);
    let gateways = context.stores.gateways.state();
    let parents =
        parents_of(&gateways, select::Kind::ModelEndpoints, endpoint.as_ref(), &endpoint.spec.parent_refs, &namespaces);
    let mut entries = parents.refused;
    for gateway in parents.admitted {
        programmed.0 += 1;
        programmed.1 &= programmed_on(&context, gateway, &id, endpoint.metadata.generation, true).await;
        let Some(verdict) = decided(&context, gateway, |from| {
            from.models.get(&id).filter(|d| d.generation == endpoint.metadata.generation)?;
            from.model_verdicts.get(&id).cloned()
        })
        .await
        else {
            // Not compiled at this generation yet: announced when it is.
            return Ok(Action::await_change());
        };
        entries.push(waycast_crds::model_endpoint::GatewayAcceptance {
            gateway: format!("{}/{}", gateway.namespace().unwrap_or_default(), gateway.name_any()),
            accepted: verdict.accepted,
            reason: verdict.reason.to_owned(),
            message: verdict.message.to_string(),
        });
    }
    entries.sort_by(|a, b| a.gateway.cmp(&b.gateway));
    let generation = endpoint.metadata.generation;
    let previous = endpoint.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
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
    let resolved = status::condition(
        &previous,
        types::RESOLVED_REFS,
        unresolved.is_none(),
        unresolved.map_or(reasons::RESOLVED, |e| e.reason.as_str()),
        unresolved.map_or_else(|| "every reference resolved".to_owned(), |e| e.message.clone()),
        generation,
        now,
    );
    let new_status = ModelEndpointStatus {
        conditions: vec![
            status::condition(&previous, types::ACCEPTED, accepted, reason, message, generation, now),
            resolved,
            programmed_condition(&previous, programmed, generation, now),
        ],
        gateways: entries,
        backend_count: Some(i32::try_from(endpoint.spec.backends.len()).unwrap_or(i32::MAX)),
        observed_generation: generation,
    };
    let old = endpoint.status.clone().unwrap_or_default();
    let changed = status::changed(&old.conditions, &new_status.conditions)
        || (old.gateways, old.backend_count, old.observed_generation)
            != (new_status.gateways.clone(), new_status.backend_count, new_status.observed_generation);
    if changed {
        patch_status(client, endpoint.as_ref(), serde_json::to_value(&new_status)?).await?;
        emit_transitions(&context, endpoint.as_ref(), &previous, &new_status.conditions).await;
    }
    context.metrics.reconciles.with_label_values(&["modelendpoint"]).inc();
    succeeded(&context, endpoint.as_ref());
    // Looked at again on changes, announcements and the periodic resync (`every`).
    Ok(Action::await_change())
}
