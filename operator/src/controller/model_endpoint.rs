//! ModelEndpoint status from the selecting Gateways' compiles.

use std::sync::Arc;

use kube::runtime::controller::Action;
use waycast_crds::ModelEndpoint;

use super::{parent_decisions, succeeded};
use crate::apply::patch_status;
use crate::compile::select;
use crate::context::{Context, emit_transitions};
use crate::error::Error;
use crate::status;

pub(crate) async fn reconcile_model_endpoint(
    endpoint: Arc<ModelEndpoint>,
    context: Arc<Context>,
) -> Result<Action, Error> {
    let now = jiff::Timestamp::now();
    let kind = select::Kind::ModelEndpoints;
    let decisions = parent_decisions(&context, kind, endpoint.as_ref(), &endpoint.spec.parent_refs, |from, id| {
        from.model_verdicts.get(id).cloned()
    });
    let Some(decisions) = decisions.await else { return Ok(Action::await_change()) };
    let mut entries = decisions.refused;
    entries.extend(decisions.decided.into_iter().map(|(gateway, verdict)| waycast_crds::common::GatewayAcceptance {
        gateway,
        accepted: verdict.accepted,
        reason: verdict.reason.to_owned(),
        message: verdict.message.to_string(),
    }));
    let programmed = decisions.programmed;
    let new_status = status::model_endpoint_status(&endpoint, entries, programmed, now);
    if status::status_changed(endpoint.status.as_ref(), &new_status) {
        patch_status(&context.client, endpoint.as_ref(), serde_json::to_value(&new_status)?).await?;
        let previous = endpoint.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        emit_transitions(&context, endpoint.as_ref(), previous, &new_status.conditions).await;
    }
    context.metrics.reconciles.with_label_values(&["modelendpoint"]).inc();
    succeeded(&context, endpoint.as_ref());
    // Looked at again on changes, announcements and the periodic resync (`every`).
    Ok(Action::await_change())
}
