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
    #[test]
    fn truncates_on_char_boundaries() {
        assert_eq!(super::truncate("abc", 5), "abc");
        assert_eq!(super::truncate("aé", 2), "a");
        assert_eq!(super::truncate("abcdef", 3), "abc");
    }
}
