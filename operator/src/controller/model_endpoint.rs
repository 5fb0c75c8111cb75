//! ModelEndpoint status from the selecting Gateways' compiles.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt as _;
use kube::runtime::controller::Action;
use waycast_crds::ModelEndpoint;

use super::{decided, parents_of, programmed_on, succeeded};
use crate::apply::patch_status;
use crate::compile::{ObjectKey, select};
use crate::context::{Context, emit_transitions};
use crate::error::Error;
use crate::status;

pub(crate) async fn reconcile_model_endpoint(
    endpoint: Arc<ModelEndpoint>,
    context: Arc<Context>,
) -> Result<Action, Error> {
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
    let new_status = status::model_endpoint_status(&endpoint, entries, programmed, now);
    if status::model_endpoint_changed(endpoint.status.as_ref(), &new_status) {
        patch_status(&context.client, endpoint.as_ref(), serde_json::to_value(&new_status)?).await?;
        let previous = endpoint.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        emit_transitions(&context, endpoint.as_ref(), previous, &new_status.conditions).await;
    }
    context.metrics.reconciles.with_label_values(&["modelendpoint"]).inc();
    succeeded(&context, endpoint.as_ref());
    // Looked at again on changes, announcements and the periodic resync (`every`).
    Ok(Action::await_change())
}
