//! The heartbeat contract between gateway pods and the operator: one Lease
//! per pod, named after it, owned by it, labelled with its Gateway.
//!
//! ```text
//! gateway pod ──SSA──► Lease <pod>  holderIdentity = hash of the config it serves
//!                                   annotations: the config it refused, and why
//! operator ◄──watch── Leases labelled waycast.dev/gateway ─► Gateway.status, Programmed
//! ```

/// The label carrying the Gateway's name on heartbeat Leases.
pub const GATEWAY_LABEL: &str = "waycast.dev/gateway";
/// Annotation: the hash of the newest config the pod refused (absent when
/// the pod serves the newest config it was given).
pub const REFUSED_HASH_ANNOTATION: &str = "waycast.dev/refused-config-hash";
/// Annotation: why the pod refused it (at most [`MAX_REASON_BYTES`]).
pub const REFUSED_REASON_ANNOTATION: &str = "waycast.dev/refused-config-reason";
/// Longest refusal reason a pod reports.
pub const MAX_REASON_BYTES: usize = 1024;
/// Annotation: the entries of the config the pod serves (`holderIdentity`)
/// that it left out, as a JSON list of [`DroppedEntry`]; absent when none.
pub const DROPPED_ENTRIES_ANNOTATION: &str = "waycast.dev/dropped-entries";
/// The most entries a heartbeat lists (the rest are counted in
/// `waycast_gateway_config_entries_dropped`).
pub const MAX_DROPPED_LISTED: usize = 128;
/// Longest reason of one listed entry.
pub const MAX_DROPPED_REASON_BYTES: usize = 256;

/// Annotation: the providers (names, comma-separated) whose tokens the
/// pod refused for `unknown_key` since its previous heartbeat — a `kid`
/// their key set lacks, as right after the issuer rotated its keys. The
/// operator fetches those key sets sooner (at most once per 10 s each,
/// whatever a pod says). Empty when there was none.
pub const UNKNOWN_KEY_ANNOTATION: &str = "waycast.dev/unknown-key-providers";
/// The most providers that annotation lists (a config trusts at most as
/// many).
pub const MAX_UNKNOWN_KEY_LISTED: usize = crate::identity::MAX_PROVIDERS;
/// Longest provider name read from it (a DNS label).
pub const MAX_PROVIDER_NAME_BYTES: usize = 63;

/// The providers an [`UNKNOWN_KEY_ANNOTATION`] lists, read as untrusted
/// text: at most [`MAX_UNKNOWN_KEY_LISTED`] names, each non-empty and at
/// most [`MAX_PROVIDER_NAME_BYTES`] long (longer ones are no name).
pub fn unknown_key_providers(annotation: &str) -> impl Iterator<Item = &str> {
    annotation
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty() && name.len() <= MAX_PROVIDER_NAME_BYTES)
        .take(MAX_UNKNOWN_KEY_LISTED)
}

/// The annotation listing `providers`, as a pod writes it.
pub fn unknown_key_annotation<'a>(providers: impl IntoIterator<Item = &'a str>) -> String {
    let listed: Vec<&str> = providers.into_iter().take(MAX_UNKNOWN_KEY_LISTED).collect();
    listed.join(",")
}

/// One entry a pod left out of the config it serves.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DroppedEntry {
    /// `model <namespace/name>` or `key <namespace/name>` (the config's
    /// `source` or key `id`).
    pub entry: String,
    /// Why, at most [`MAX_DROPPED_REASON_BYTES`].
    pub reason: String,
}

/// The dropped entries a heartbeat annotation lists, read as untrusted
/// text: at most [`MAX_DROPPED_LISTED`], each field cut to
/// [`MAX_DROPPED_REASON_BYTES`]; nothing when it is not such a list (an
/// empty annotation: the pod left nothing out).
pub fn dropped_entries(annotation: &str) -> Vec<DroppedEntry> {
    let listed: Vec<DroppedEntry> = serde_json::from_str(annotation).unwrap_or_default();
    listed
        .into_iter()
        .take(MAX_DROPPED_LISTED)
        .map(|DroppedEntry { entry, reason }| DroppedEntry {
            entry: truncate(&entry, MAX_DROPPED_REASON_BYTES).to_owned(),
            reason: truncate(&reason, MAX_DROPPED_REASON_BYTES).to_owned(),
        })
        .collect()
}

/// The label every gateway pod carries, with [`GATEWAY_POD_NAME`].
pub const POD_NAME_LABEL: &str = "app.kubernetes.io/name";
/// The value of [`POD_NAME_LABEL`] on gateway pods.
pub const GATEWAY_POD_NAME: &str = "waycast-gateway";
/// The label carrying a gateway pod's Gateway (its Deployment is named
/// after the Gateway too).
pub const POD_INSTANCE_LABEL: &str = "app.kubernetes.io/instance";

/// Whether `pod` is a live pod of the Gateway `gateway` in `namespace`
/// with `uid`: not going away, labelled as its pods are, and controlled by
/// a ReplicaSet of its Deployment. A heartbeat counts only when its Lease
/// is named after, and owned by, such a pod.
pub fn is_gateway_pod(
    pod: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    uid: &str,
    namespace: &str,
    gateway: &str,
) -> bool {
    let labels = pod.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
    let deployment_prefix = format!("{gateway}-");
    let from_deployment = pod.owner_references.iter().flatten().any(|owner| {
        owner.controller == Some(true) && owner.kind == "ReplicaSet" && owner.name.starts_with(&deployment_prefix)
    });
    pod.uid.as_deref() == Some(uid)
        && pod.deletion_timestamp.is_none()
        && pod.namespace.as_deref() == Some(namespace)
        && label(POD_NAME_LABEL) == Some(GATEWAY_POD_NAME)
        && label(POD_INSTANCE_LABEL) == Some(gateway)
        && from_deployment
}

/// `text` cut to at most `max` bytes on a character boundary.
pub fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A heartbeat is anyone's text: the list is bounded in length and in
    /// the size of each field, and anything else reads as no list.
    #[test]
    fn dropped_entries_are_read_within_bounds() {
        let long = "x".repeat(10 * MAX_REASON_BYTES);
        let many: Vec<DroppedEntry> =
            (0..300).map(|i| DroppedEntry { entry: format!("key team/k{i}"), reason: long.clone() }).collect();
        let read = dropped_entries(&serde_json::to_string(&many).unwrap());
        assert_eq!(read.len(), MAX_DROPPED_LISTED);
        assert!(read.iter().all(|d| d.reason.len() == MAX_DROPPED_REASON_BYTES));
        assert_eq!(read[0].entry, "key team/k0");
        for garbage in ["", "{", "[1,2]", "{\"entry\":\"x\"}", "null"] {
            assert_eq!(dropped_entries(garbage), Vec::new(), "{garbage}");
        }
    }

    /// Anyone's text too: at most as many names as a config has providers,
    /// none empty or past a DNS label's length.
    #[test]
    fn unknown_key_providers_are_read_within_bounds() {
        let listed = unknown_key_annotation(["corp", "cluster"]);
        assert_eq!(listed, "corp,cluster");
        assert_eq!(unknown_key_providers(&listed).collect::<Vec<_>>(), ["corp", "cluster"]);
        let hostile = format!("{}, ,{},{}", "a".repeat(64), "b".repeat(63), "c,".repeat(100));
        let read: Vec<&str> = unknown_key_providers(&hostile).collect();
        assert_eq!(read.len(), MAX_UNKNOWN_KEY_LISTED);
        assert_eq!(read[0].len(), 63, "the 64-byte name is no name");
        assert_eq!(unknown_key_providers("").count(), 0);
    }

    #[test]
    fn truncates_on_char_boundaries() {
        assert_eq!(super::truncate("abc", 5), "abc");
        assert_eq!(super::truncate("aé", 2), "a");
        assert_eq!(super::truncate("abcdef", 3), "abc");
    }
}
