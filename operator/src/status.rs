//! Statuses, pure: conditions built with `observedGeneration` and a
//! `lastTransitionTime` that moves only when the status changes, and the
//! Gateway's whole status from the facts a reconcile gathered.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use waycast_crds::condition::{reasons, types};
use waycast_crds::{Gateway, GatewayStatus};

/// A condition of `kind`, carrying over the transition time from `previous`
/// when the status did not change.
pub fn condition(
    previous: &[Condition],
    kind: &str,
    ok: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: jiff::Timestamp,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == kind && c.status == status)
        .map_or(Time(now), |c| c.last_transition_time.clone());
    Condition {
        type_: kind.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time,
    }
}

/// Whether two condition lists differ in more than their times.
pub fn changed(old: &[Condition], new: &[Condition]) -> bool {
    let key =
        |c: &Condition| (c.type_.clone(), c.status.clone(), c.reason.clone(), c.message.clone(), c.observed_generation);
    old.len() != new.len() || old.iter().zip(new).any(|(a, b)| key(a) != key(b))
}

/// A pod of a Gateway that refused the config it was given.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RefusingPod {
    /// The pod.
    pub pod: String,
    /// Why, as it reported.
    pub reason: String,
    /// The config hash it keeps serving instead.
    pub serving: String,
}

/// What a Gateway's status is built from: its compile's verdict, what was
/// written and what its pods and Deployment report.
#[derive(Debug, Clone)]
pub struct GatewayFacts<'a> {
    /// The compile's refusal of the Gateway itself; `None`: accepted.
    pub refused: Option<&'a crate::compile::Verdict>,
    /// The hash of the config the pods are to serve.
    pub hash: &'a str,
    /// The gzipped size of the compiled config.
    pub config_bytes: usize,
    /// Whether it fit in a Secret (and so was written).
    pub config_fits: bool,
    /// Models and keys in the compiled config.
    pub models: usize,
    /// Keys in the compiled config.
    pub keys: usize,
    /// Pods refusing `hash`, sorted.
    pub refusing: &'a [RefusingPod],
    /// Pods reporting `hash`.
    pub up_to_date: usize,
    /// The Deployment's replicas.
    pub replicas: i32,
    /// Its ready replicas.
    pub ready: i32,
    /// The replicas it must have ready to be Ready.
    pub wanted: i32,
    /// `clusterIP:port` of its Service.
    pub address: Option<String>,
}

/// The status of `gateway` given `facts`, at `now`.
pub fn gateway_status(gateway: &Gateway, facts: &GatewayFacts<'_>, now: jiff::Timestamp) -> GatewayStatus {
    let generation = gateway.metadata.generation;
    let previous = gateway.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let hash = facts.hash;
    let accepted = match facts.refused {
        None => condition(previous, types::ACCEPTED, true, reasons::ACCEPTED, "the spec is valid", generation, now),
        Some(refused) => {
            condition(previous, types::ACCEPTED, false, refused.reason, refused.message.to_string(), generation, now)
        }
    };
    let programmed = if !facts.config_fits {
        condition(
            previous,
            types::PROGRAMMED,
            false,
            reasons::CONFIG_ERROR,
            format!(
                "the compiled config is {} bytes gzipped ({} keys, {} models); a Secret holds at most {}: the pods keep the last config",
                facts.config_bytes,
                facts.keys,
                facts.models,
                crate::render::config_secret::MAX_CONFIG_BYTES
            ),
            generation,
            now,
        )
    } else if let Some(first) = facts.refusing.first() {
        condition(
            previous,
            types::PROGRAMMED,
            false,
            reasons::CONFIG_REFUSED,
            format!(
                "{} pod(s) refused config {}; {} keeps serving {}: {}",
                facts.refusing.len(),
                abbreviated(hash),
                first.pod,
                first.serving.get(..12).filter(|s| !s.is_empty()).unwrap_or("no config"),
                first.reason
            ),
            generation,
            now,
        )
    } else {
        condition(
            previous,
            types::PROGRAMMED,
            true,
            reasons::CONFIG_WRITTEN,
            format!("config {} written", abbreviated(hash)),
            generation,
            now,
        )
    };
    let ready = facts.ready >= facts.wanted;
    let ready = condition(
        previous,
        types::READY,
        ready,
        if ready { reasons::REPLICAS_READY } else { reasons::REPLICAS_NOT_READY },
        format!("{} of {} replicas ready", facts.ready, facts.wanted),
        generation,
        now,
    );
    let count = |n: usize| Some(i32::try_from(n).unwrap_or(i32::MAX));
    GatewayStatus {
        conditions: vec![accepted, programmed, ready],
        replicas: Some(facts.replicas),
        ready_replicas: Some(facts.ready),
        up_to_date_replicas: count(facts.up_to_date),
        config_hash: Some(hash.to_owned()),
        model_count: count(facts.models),
        api_key_count: count(facts.keys),
        address: facts.address.clone(),
        observed_generation: generation,
    }
}

/// The status of a Gateway that may not own what it would: every
/// condition False with `NameConflict`, naming the object.
pub fn gateway_name_conflict(gateway: &Gateway, conflict: &str, now: jiff::Timestamp) -> GatewayStatus {
    let generation = gateway.metadata.generation;
    let previous = gateway.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let message = format!(
        "{conflict} already exists and is not controlled by this Gateway; it is left untouched. Rename the Gateway or remove that object"
    );
    let mut status = gateway.status.clone().unwrap_or_default();
    status.conditions = [types::ACCEPTED, types::PROGRAMMED, types::READY]
        .into_iter()
        .map(|kind| condition(previous, kind, false, reasons::NAME_CONFLICT, message.clone(), generation, now))
        .collect();
    status.observed_generation = generation;
    status
}

/// Whether writing `new` over `old` changes anything a reader sees.
pub fn gateway_changed(old: Option<&GatewayStatus>, new: &GatewayStatus) -> bool {
    let Some(old) = old else { return true };
    let mut old_without = old.clone();
    let mut new_without = new.clone();
    old_without.conditions.clear();
    new_without.conditions.clear();
    old_without != new_without || changed(&old.conditions, &new.conditions)
}

/// The first 12 characters of a config hash, as statuses show it.
fn abbreviated(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_with_the_status() {
        let t1 = jiff::Timestamp::from_second(1_000).unwrap();
        let t2 = jiff::Timestamp::from_second(2_000).unwrap();
        let first = condition(&[], "Ready", true, "KeyReady", "ok", Some(1), t1);
        let same = condition(std::slice::from_ref(&first), "Ready", true, "KeyReady", "still ok", Some(2), t2);
        assert_eq!(same.last_transition_time, Time(t1));
        let flipped = condition(&[first], "Ready", false, "Expired", "gone", Some(2), t2);
        assert_eq!(flipped.last_transition_time, Time(t2));
        assert!(changed(std::slice::from_ref(&same), &[flipped]));
        assert!(!changed(std::slice::from_ref(&same), std::slice::from_ref(&same)));
    }

    /// One row: the facts that differ from an accepted, written, ready
    /// Gateway, and the three conditions expected.
    #[test]
    fn gateway_status_table() {
        use crate::compile::Verdict;
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let mut gateway = crate::render::fixtures::gateway(Default::default());
        gateway.metadata.generation = Some(3);
        let refusal = Verdict { accepted: false, reason: reasons::AUTH_SECRET_MISSING, message: "no password".into() };
        let refusing = [RefusingPod { pod: "gw-1".into(), reason: "bad CIDR".into(), serving: "f".repeat(64) }];
        let base = GatewayFacts {
            refused: None,
            hash: "0123456789abcdef",
            config_bytes: 1_000,
            config_fits: true,
            models: 2,
            keys: 3,
            refusing: &[],
            up_to_date: 2,
            replicas: 2,
            ready: 2,
            wanted: 2,
            address: Some("10.96.0.10:80".into()),
        };
        type Row<'a> = (&'a str, GatewayFacts<'a>, [(bool, &'a str, &'a str); 3]);
        let rows: [Row<'_>; 5] = [
            (
                "accepted, written, ready",
                base.clone(),
                [
                    (true, reasons::ACCEPTED, "the spec is valid"),
                    (true, reasons::CONFIG_WRITTEN, "config 0123456789ab written"),
                    (true, reasons::REPLICAS_READY, "2 of 2 replicas ready"),
                ],
            ),
            (
                "refused spec",
                GatewayFacts { refused: Some(&refusal), ..base.clone() },
                [
                    (false, reasons::AUTH_SECRET_MISSING, "no password"),
                    (true, reasons::CONFIG_WRITTEN, "config 0123456789ab written"),
                    (true, reasons::REPLICAS_READY, "2 of 2 replicas ready"),
                ],
            ),
            (
                "config too large",
                GatewayFacts { config_fits: false, config_bytes: 2_000_000, ..base.clone() },
                [
                    (true, reasons::ACCEPTED, "the spec is valid"),
                    (false, reasons::CONFIG_ERROR, "the compiled config is 2000000 bytes gzipped (3 keys, 2 models)"),
                    (true, reasons::REPLICAS_READY, "2 of 2 replicas ready"),
                ],
            ),
            (
                "a pod refuses",
                GatewayFacts { refusing: &refusing, ..base.clone() },
                [
                    (true, reasons::ACCEPTED, "the spec is valid"),
                    (
                        false,
                        reasons::CONFIG_REFUSED,
                        "1 pod(s) refused config 0123456789ab; gw-1 keeps serving ffffffffffff: bad CIDR",
                    ),
                    (true, reasons::REPLICAS_READY, "2 of 2 replicas ready"),
                ],
            ),
            (
                "not enough replicas",
                GatewayFacts { ready: 1, wanted: 3, ..base.clone() },
                [
                    (true, reasons::ACCEPTED, "the spec is valid"),
                    (true, reasons::CONFIG_WRITTEN, "config 0123456789ab written"),
                    (false, reasons::REPLICAS_NOT_READY, "1 of 3 replicas ready"),
                ],
            ),
        ];
        for (name, facts, expected) in rows {
            let status = gateway_status(&gateway, &facts, now);
            for (condition, (ok, reason, message)) in status.conditions.iter().zip(expected) {
                assert_eq!(condition.status, if ok { "True" } else { "False" }, "{name}: {condition:?}");
                assert_eq!(condition.reason, reason, "{name}");
                assert!(condition.message.starts_with(message), "{name}: {}", condition.message);
                assert_eq!(condition.observed_generation, Some(3), "{name}");
            }
            assert_eq!(status.config_hash.as_deref(), Some(facts.hash), "{name}");
            assert_eq!((status.model_count, status.api_key_count), (Some(2), Some(3)), "{name}");
            assert_eq!(status.address, facts.address, "{name}");
        }
    }

    #[test]
    fn a_name_conflict_sets_every_condition_false_and_keeps_the_rest() {
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let mut gateway = crate::render::fixtures::gateway(Default::default());
        gateway.status = Some(GatewayStatus { config_hash: Some("kept".into()), ..GatewayStatus::default() });
        let status = gateway_name_conflict(&gateway, "ServiceAccount team/gw", now);
        assert_eq!(status.conditions.len(), 3);
        assert!(status.conditions.iter().all(|c| c.status == "False" && c.reason == reasons::NAME_CONFLICT));
        assert!(status.conditions[0].message.starts_with("ServiceAccount team/gw already exists"));
        assert_eq!(status.config_hash.as_deref(), Some("kept"));
        assert!(gateway_changed(gateway.status.as_ref(), &status));
        assert!(!gateway_changed(Some(&status), &status.clone()));
    }
}
