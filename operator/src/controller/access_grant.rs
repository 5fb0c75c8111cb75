//! AccessGrant status from the selecting Gateways' compiles.

use std::sync::Arc;

use kube::runtime::controller::Action;
use waycast_crds::AccessGrant;

use super::shell::{succeeded, write_status};
use super::statuses::parent_decisions;
use crate::compile::select;
use crate::context::Context;
use crate::error::Error;
use crate::status;

pub(crate) async fn reconcile_access_grant(grant: Arc<AccessGrant>, context: Arc<Context>) -> Result<Action, Error> {
    let now = jiff::Timestamp::now();
    let kind = select::Kind::AccessGrants;
    let decisions = parent_decisions(&context, kind, grant.as_ref(), &grant.spec.parent_refs, |from, id| {
        from.grants.get(id).map(|record| record.verdict.clone())
    });
    let Some(decisions) = decisions.await else { return Ok(Action::await_change()) };
    let mut entries = decisions.refused;
    entries.extend(decisions.decided.into_iter().map(|(gateway, verdict)| waycast_crds::common::GatewayAcceptance {
        gateway,
        accepted: verdict.accepted,
        reason: verdict.reason.to_owned(),
        message: verdict.message.to_string(),
    }));
    let new_status = status::access_grant_status(&grant, entries, decisions.programmed, now);
    write_status(&context, grant.as_ref(), grant.status.as_ref(), &new_status).await?;
    context.metrics.reconciles.with_label_values(&["accessgrant"]).inc();
    succeeded(&context, grant.as_ref());
    // Looked at again on changes, announcements and the periodic resync (`every`).
    Ok(Action::await_change())
}
