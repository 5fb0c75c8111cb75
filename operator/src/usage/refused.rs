//! The usage reports refused: counted, told in an Event when a pod is
//! newly refused (or for another rule), and listed in the Gateway's
//! `status.usage.refusedReports`.

use std::collections::BTreeMap;

use kube::ResourceExt as _;
use waycast_crds::Gateway;
use waycast_crds::usage::{MAX_STATUS_REFUSED, RefusedUsageReport};

use super::screen::Refusal;
use crate::apply::bounded;
use crate::context::Context;

/// Counts this round's refused reports of `gateway`, and tells of each
/// pod newly refused (or refused for another rule) in an Event.
pub(super) async fn refusals(
    context: &Context,
    gateway: &Gateway,
    held: &mut BTreeMap<String, Refusal>,
    refused: Vec<(String, Refusal)>,
) {
    let now: BTreeMap<String, Refusal> = refused.into_iter().collect();
    let id = format!("{}/{}", gateway.namespace().unwrap_or_default(), gateway.name_any());
    for (pod, refusal) in &now {
        context.metrics.usage_reports_refused.with_label_values(&[refusal.metric_label()]).inc();
        tracing::warn!(gateway = %id, %pod, reason = refusal.reason(), "usage: report refused");
        if held.get(pod) == Some(refusal) {
            continue;
        }
        let note = format!("pod {pod}: {} ({})", refusal.message(), refusal.reason());
        let reason = waycast_crds::condition::reasons::USAGE_REPORT_REFUSED;
        let event = context.events.publish(
            kube::Resource::object_ref(gateway, &()),
            crate::events::EventType::Warning,
            reason,
            note,
            "CollectUsage",
        );
        if let Err(error) = bounded(event).await {
            tracing::debug!(%error, "could not publish an Event");
        }
    }
    *held = now;
}

/// The status lines of the pods refused, sorted by pod, at most [`MAX_STATUS_REFUSED`].
pub(super) fn listed(held: &BTreeMap<String, Refusal>) -> Vec<RefusedUsageReport> {
    held.iter()
        .take(MAX_STATUS_REFUSED)
        .map(|(pod, refusal)| RefusedUsageReport {
            pod: pod.clone(),
            reason: refusal.reason().to_owned(),
            message: refusal.message(),
        })
        .collect()
}
