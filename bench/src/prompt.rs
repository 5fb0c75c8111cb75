//! The bodies a run sends: a prompt for its API, model and output length,
//! padded to the size asked for, or a spread of sizes.

use bytes::Bytes;

use crate::{Scenario, Workload};

/// A request body of about `scenario.body_bytes` bytes: a padded prompt for
/// its workload, model and output length.
pub fn request_body(scenario: &Scenario) -> Bytes {
    prompt_body(scenario, scenario.body_bytes, 0)
}

/// Bodies of the sizes a run sends: one of `body_bytes`, or with
/// `body_bytes_max` up to 64 sizes spread evenly between the two, each
/// prompt starting with its own number (so a server's prefix cache does not
/// see one prompt over and over). Requests take them in turn.
pub fn request_bodies(scenario: &Scenario) -> Vec<Bytes> {
    let Some(max) = scenario.body_bytes_max.filter(|max| *max > scenario.body_bytes) else {
        return vec![request_body(scenario)];
    };
    let sizes = distinct_bodies(scenario);
    (0..sizes)
        .map(|i| {
            let size = scenario.body_bytes + (max - scenario.body_bytes) * i / (sizes - 1).max(1);
            prompt_body(scenario, size, i + 1)
        })
        .collect()
}

/// How many different bodies a run sends ([`request_bodies`]).
pub fn distinct_bodies(scenario: &Scenario) -> usize {
    match scenario.body_bytes_max.filter(|max| *max > scenario.body_bytes) {
        Some(max) => (max - scenario.body_bytes + 1).min(64),
        None => 1,
    }
}

fn prompt_body(scenario: &Scenario, size: usize, number: usize) -> Bytes {
    let (model, stream) = (&scenario.model, scenario.stream);
    let limit = |field: &str, default: Option<u32>| {
        scenario.max_tokens.or(default).map(|n| format!(r#""{field}":{n},"#)).unwrap_or_default()
    };
    // Servers report a stream's usage at its end only when asked.
    let usage = if stream { r#""stream_options":{"include_usage":true},"# } else { "" };
    let (head, tail) = match scenario.workload {
        Workload::Chat => (
            format!(
                r#"{{"model":"{model}",{}"stream":{stream},{usage}"messages":[{{"role":"user","content":""#,
                limit("max_tokens", None)
            ),
            r#""}]}"#,
        ),
        Workload::Responses => {
            (format!(r#"{{"model":"{model}",{}"stream":{stream},"input":""#, limit("max_output_tokens", None)), r#""}"#)
        }
        Workload::Messages => (
            format!(
                r#"{{"model":"{model}",{}"stream":{stream},"messages":[{{"role":"user","content":""#,
                limit("max_tokens", Some(64))
            ),
            r#""}]}"#,
        ),
    };
    let lead = if number == 0 { String::new() } else { format!("prompt {number}: ") };
    let padding = size.saturating_sub(head.len() + lead.len() + tail.len());
    let mut body = String::with_capacity(head.len() + lead.len() + padding + tail.len());
    body.push_str(&head);
    body.push_str(&lead);
    body.extend(std::iter::repeat_n('x', padding));
    body.push_str(tail);
    Bytes::from(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_spread_from_the_least_to_the_most_and_prompts_differ() {
        let json = serde_json::json!({"target": "http://x", "concurrency": 1, "requests": 1, "bodyBytes": 500, "bodyBytesMax": 4000});
        let bodies = request_bodies(&serde_json::from_value(json).unwrap());
        assert_eq!(bodies.len(), 64);
        assert_eq!((bodies[0].len(), bodies[63].len()), (500, 4000));
        assert!(bodies.windows(2).all(|w| w[0].len() <= w[1].len() && w[0][..100] != w[1][..100]));
        for body in &bodies {
            serde_json::from_slice::<serde_json::Value>(body).unwrap();
        }
    }
}
