//! Conditions: built with `observedGeneration`, and a `lastTransitionTime`
//! that moves only when the status changes. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

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
}
