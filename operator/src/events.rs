//! Kubernetes Events (events.k8s.io/v1) about the objects the operator
//! reconciles: one per condition transition.
//!
//! NB: not kube's `Recorder`. It keeps every Event it published for six
//! minutes, to fold repeats into a series, and sweeps that cache on every
//! publish. At 10,000 ApiKeys the cache was over half the operator's heap
//! (76 of 137 MB at the peak, measured with heaptrack) and every publish
//! walked it. The operator publishes only when a condition's status
//! changes, which does not repeat in quick succession, so each transition
//! is an Event of its own and nothing is remembered.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

/// Whether an Event reports something normal or something to look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Things work (a condition became True).
    Normal,
    /// Something needs attention (a condition became False).
    Warning,
}

/// Publishes Events as one controller instance.
pub struct Publisher {
    client: Client,
    controller: String,
    instance: String,
    /// Makes names unique even for Events created in the same nanosecond.
    sequence: std::sync::atomic::AtomicU64,
}

impl Publisher {
    /// Events from `controller`, as `instance` (the controller's name when
    /// there is only one instance).
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        Self {
            client,
            controller: controller.to_owned(),
            instance: instance.unwrap_or_else(|| controller.to_owned()),
            sequence: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Creates an Event about `regarding`, in its namespace.
    ///
    /// # Errors
    /// The API server refused or could not be reached.
    pub async fn publish(
        &self,
        regarding: ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
        action: &str,
    ) -> Result<(), kube::Error> {
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".to_owned());
        let sequence = self.sequence.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let reporter = Reporter { controller: &self.controller, instance: &self.instance, sequence };
        let event = event(regarding, type_, reason, note, action, &reporter, jiff::Timestamp::now());
        Api::<Event>::namespaced(self.client.clone(), &namespace).create(&PostParams::default(), &event).await?;
        Ok(())
    }
}

/// Who reports an Event, and its number among this reporter's Events.
struct Reporter<'a> {
    controller: &'a str,
    instance: &'a str,
    sequence: u64,
}

fn event(
    regarding: ObjectReference,
    type_: EventType,
    reason: &str,
    note: String,
    action: &str,
    reporter: &Reporter<'_>,
    now: jiff::Timestamp,
) -> Event {
    let Reporter { controller, instance, sequence } = *reporter;
    Event {
        metadata: ObjectMeta {
            name: Some(event_name(regarding.name.as_deref().unwrap_or(controller), now, sequence)),
            namespace: regarding.namespace.clone(),
            ..ObjectMeta::default()
        },
        action: Some(action.to_owned()),
        reason: Some(reason.to_owned()),
        // The API server refuses notes over 1 kB.
        note: Some(truncated(note, 1024)),
        event_time: Some(MicroTime(now)),
        regarding: Some(regarding),
        reporting_controller: Some(controller.to_owned()),
        reporting_instance: Some(instance.to_owned()),
        type_: Some(match type_ {
            EventType::Normal => "Normal".to_owned(),
            EventType::Warning => "Warning".to_owned(),
        }),
        ..Event::default()
    }
}

/// `<object>.<time><sequence>` in hex, as `kubectl` shows Events' names.
/// (`generateName` cannot do it: the API server validates the prefix itself
/// as a name, and `<object>.` ends in a dot.) The object's part is cut so
/// the whole stays within a name's 253 characters.
fn event_name(object: &str, now: jiff::Timestamp, sequence: u64) -> String {
    let object = object.get(..200).unwrap_or(object);
    format!("{object}.{:x}{sequence:x}", now.as_nanosecond())
}

/// `text` cut to at most `limit` bytes, at a character boundary.
fn truncated(mut text: String, limit: usize) -> String {
    if text.len() > limit {
        let mut end = limit;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_carries_what_kubectl_describe_shows() {
        let regarding = ObjectReference {
            api_version: Some("waycast.dev/v1alpha1".into()),
            kind: Some("ApiKey".into()),
            name: Some("alice".into()),
            namespace: Some("team".into()),
            uid: Some("1234".into()),
            ..ObjectReference::default()
        };
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap_or_default();
        let reporter = Reporter { controller: "waycast-operator", instance: "waycast-operator", sequence: 7 };
        let event = event(
            regarding.clone(),
            EventType::Warning,
            "SecretMissing",
            "Ready: no key".into(),
            "Reconcile",
            &reporter,
            now,
        );
        assert_eq!(event.metadata.name.as_deref(), Some("alice.18fae27693b400007"));
        assert_eq!(event.metadata.namespace.as_deref(), Some("team"));
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert_eq!(event.reason.as_deref(), Some("SecretMissing"));
        assert_eq!(event.note.as_deref(), Some("Ready: no key"));
        assert_eq!(event.regarding, Some(regarding));
        assert_eq!(event.event_time, Some(MicroTime(now)));
        assert_eq!(event.reporting_instance.as_deref(), Some("waycast-operator"));
    }

    #[test]
    fn names_are_valid_and_bounded() {
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap_or_default();
        let long = "a".repeat(253);
        for name in [event_name("alice", now, 0), event_name(&long, now, u64::MAX)] {
            assert!(name.len() <= 253, "{} characters", name.len());
            let alphanumeric = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
            assert!(alphanumeric(name.chars().next()) && alphanumeric(name.chars().last()), "{name}");
            assert!(name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'));
        }
        assert_ne!(event_name("alice", now, 1), event_name("alice", now, 2));
    }

    #[test]
    fn long_notes_are_cut_at_a_character_boundary() {
        let note = "é".repeat(600);
        let cut = truncated(note, 1024);
        assert_eq!(cut.len(), 1024);
        assert!(truncated("short".into(), 1024) == "short");
        assert_eq!(truncated("aé".into(), 2), "a");
    }
}
