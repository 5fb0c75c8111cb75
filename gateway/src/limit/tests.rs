//! The limiters' arithmetic: GCRA shares, reservations and settlement,
//! refusals and their headers.

use std::sync::Arc;

use http::HeaderMap;
use waycast_crds::config::LimitsConfig;

use super::charge::{Charge, Charged, DEFAULT_OUTPUT_RESERVATION, PROMPT_ALLOWANCE};
use super::decision::{Admitted, Counted, Owner, Unit};
use super::local::{self, count_key_request};
use super::*;

fn set(requests: Option<u64>, tokens: Option<u64>) -> Arc<LimitSet> {
    let limits = LimitsConfig { requests_per_minute: requests, tokens_per_minute: tokens, max_concurrent: None };
    Arc::new(LimitSet::new(&limits, None))
}

fn concurrent(most: u64) -> Arc<LimitSet> {
    Arc::new(LimitSet::new(&LimitsConfig::concurrent(most), None))
}

/// A key's and a model's limits, no tenant's.
fn admit(
    key: Option<&Arc<LimitSet>>,
    model: Option<&Arc<LimitSet>>,
    shares: u32,
    reservation: Reservation,
    counted: Option<&Counted>,
) -> Result<Admitted, Refusal> {
    local::admit(local::Sets { key, tenant: None, model, user: None }, shares, reservation, counted)
}

#[test]
fn a_key_gets_its_limit_and_then_a_refusal_with_headers() {
    let key = set(Some(3), None);
    for left in [2, 1, 0] {
        let admitted = admit(Some(&key), None, 1, Reservation::default(), None).unwrap();
        assert_eq!(admitted.headers.requests.map(|(l, v)| (l, v.remaining)), Some((3, left)));
        assert!(admitted.charge.is_none(), "no token limit: nothing to charge");
    }
    let refusal = admit(Some(&key), None, 1, Reservation::default(), None).unwrap_err();
    assert_eq!((refusal.owner, refusal.unit, refusal.limit), (Owner::Key, Unit::Requests, 3));
    assert!(refusal.retry_after_nanos > 19_000_000_000 && refusal.retry_after_nanos <= 20_000_000_000);
    let mut headers = HeaderMap::new();
    refusal.apply(&mut headers);
    assert_eq!(headers["retry-after"], "20");
    assert_eq!(headers["x-ratelimit-limit-requests"], "3");
    assert_eq!(headers["x-ratelimit-remaining-requests"], "0");
    assert!(headers["x-ratelimit-reset-requests"].to_str().unwrap().ends_with('s'));
}

#[test]
fn a_refusal_by_the_model_does_not_use_up_the_key() {
    let key = set(Some(2), None);
    let model = set(Some(1), None);
    let none = Reservation::default();
    admit(Some(&key), Some(&model), 1, none, None).unwrap();
    let refusal = admit(Some(&key), Some(&model), 1, none, None).unwrap_err();
    assert_eq!(refusal.owner, Owner::Model);
    // The key still has its second request.
    assert_eq!(admit(Some(&key), None, 1, none, None).unwrap().headers.requests.map(|(_, v)| v.remaining), Some(0));
}

fn reserve(tokens: u64) -> Reservation {
    Reservation { tokens, request_bytes: 0, body_bytes: 0, output: tokens, free: false, media_answer: false }
}

#[test]
fn tokens_are_reserved_then_settled() {
    let key = set(None, Some(100));
    let admitted = admit(Some(&key), None, 1, reserve(40), None).unwrap();
    assert_eq!(admitted.headers.tokens.map(|(_, v)| v.remaining), Some(60), "reserved at admission");
    let charge = admitted.charge.expect("a token limit wants the usage");
    charge.settle(10);
    let after = admit(Some(&key), None, 1, reserve(0), None).unwrap();
    assert_eq!(after.headers.tokens.map(|(_, v)| v.remaining), Some(90), "30 of the 40 given back");
    after.charge.unwrap().settle(150);
    let refusal = admit(Some(&key), None, 1, reserve(1), None).unwrap_err();
    assert_eq!(refusal.unit, Unit::Tokens);
    assert_eq!(refusal.headers.tokens.map(|(l, v)| (l, v.remaining)), Some((100, 0)));
}

/// Twenty parallel requests on a 1,000-tokens-per-minute key, each
/// reserving 100 and using 500: only what fits is admitted, so the
/// overshoot is bounded by what the admitted ones use beyond their
/// reservations, not by the number of requests.
#[test]
fn parallel_requests_cannot_all_pass_one_budget() {
    let key = set(None, Some(1000));
    let admitted: Vec<Charge> =
        (0..20).filter_map(|_| admit(Some(&key), None, 1, reserve(100), None).ok()?.charge).collect();
    assert_eq!(admitted.len(), 10, "1,000 tokens hold ten reservations of 100");
    let with_max_tokens: Vec<_> = (0..20).filter_map(|_| admit(Some(&key), None, 1, reserve(100), None).ok()).collect();
    assert!(with_max_tokens.is_empty(), "nothing left until they settle");
    for charge in &admitted {
        charge.settle(100);
    }
    assert!(admit(Some(&key), None, 1, reserve(1), None).is_err(), "used as reserved: still full");
}

/// The key's request is counted before the body is read; a later
/// refusal (here the model's) gives it back.
#[test]
fn a_request_counted_early_is_merged_or_given_back() {
    let key = set(Some(2), None);
    let model = set(Some(1), None);
    let counted = count_key_request(Some(&key), 1).unwrap().expect("a request limit");
    let admitted = admit(Some(&key), Some(&model), 1, Reservation::default(), Some(&counted)).unwrap();
    assert_eq!(admitted.headers.requests.map(|(_, v)| v.remaining), Some(0), "the model's, the tighter");
    let counted = count_key_request(Some(&key), 1).unwrap().expect("the key's second request");
    let refusal = admit(Some(&key), Some(&model), 1, Reservation::default(), Some(&counted)).unwrap_err();
    assert_eq!(refusal.owner, Owner::Model);
    assert!(count_key_request(Some(&key), 1).is_ok(), "the key's second request was given back");
    assert_eq!(count_key_request(Some(&key), 1).unwrap_err().owner, Owner::Key);
    assert!(count_key_request(None, 1).unwrap().is_none());
}

#[test]
fn a_reservation_larger_than_the_limit_is_admitted_on_a_full_bucket() {
    let key = set(None, Some(100));
    assert!(admit(Some(&key), None, 1, reserve(10_000), None).is_ok());
    assert!(admit(Some(&key), None, 1, reserve(1), None).is_err());
}

#[test]
fn usage_is_capped_and_estimated() {
    let reservation = Reservation::for_request(400, Some(50), 1, None);
    assert_eq!(reservation.tokens, 150);
    assert_eq!(Reservation::for_request(400, None, 1, Some(7)).output, 7);
    assert_eq!(Reservation::for_request(400, None, 0, None).output, DEFAULT_OUTPUT_RESERVATION);
    let bytes = |bytes| Relayed { bytes, events: None };
    // Reported: taken as it is when plausible, capped when not.
    assert_eq!(reservation.used(Some((90, 40)), bytes(2000)), 130);
    assert_eq!(reservation.used(Some((u64::MAX, u64::MAX)), bytes(2000)), 400 + PROMPT_ALLOWANCE + 2000);
    // Not reported: the prompt estimate and what went out — a token per 4
    // bytes, or per event of a stream — never capped at the reservation.
    assert_eq!(reservation.used(None, bytes(80)), 100 + 20);
    assert_eq!(reservation.used(None, bytes(1_000_000)), 100 + 250_000);
    let stream = Relayed { bytes: 450_000, events: Some(3_002) };
    assert_eq!(reservation.used(None, stream), 100 + 3_002);
}

/// Every way of ending, and what it is charged (the table in
/// docs/budgets.md): nothing unless an upstream took the request up; the
/// usage when it was read; else the prompt estimate and what was relayed,
/// or — where the upstream finishes and bills the answer anyway — the
/// output bound (`max_tokens` for every choice, or the reservation made
/// without one), at least what was relayed.
#[test]
fn each_way_of_ending_is_charged_what_the_upstream_bills() {
    let asked = Reservation::for_request(400, Some(4_000), 1, None);
    let unbounded = Reservation::for_request(400, None, 1, None);
    let two_choices = Reservation::for_request(400, Some(50), 2, None);
    let none = Relayed::default();
    let bytes = |bytes| Relayed { bytes, events: None };
    let events = |events| Relayed { bytes: 9_000, events: Some(events) };
    let usage = Some((90, 10, 40));
    let charged = |prompt, completion| Charged { prompt, cached: 0, completion };
    let with_usage = |completion| Charged { prompt: 90, cached: 10, completion };
    let table = [
        // Refused, left in the queue, no upstream reached, an error status.
        ("unserved", asked, Ending::Unserved, None, bytes(2_000), Charged::default()),
        ("unserved with usage", asked, Ending::Unserved, usage, bytes(2_000), Charged::default()),
        // Completed: its usage, else what was relayed.
        ("whole, usage", asked, Ending::Whole, usage, bytes(2_000), Charged { prompt: 90, cached: 10, completion: 40 }),
        ("whole, no usage", asked, Ending::Whole, None, bytes(80), charged(100, 20)),
        ("whole stream, no usage", asked, Ending::Whole, None, events(7), charged(100, 7)),
        // A stream cut after its head: what was relayed.
        ("stream left mid-way", asked, Ending::Cancelled, None, events(7), charged(100, 7)),
        ("stream left, nothing relayed", asked, Ending::Cancelled, None, none, charged(100, 0)),
        (
            "stream left after its usage",
            asked,
            Ending::Cancelled,
            usage,
            bytes(2_000),
            Charged { prompt: 90, cached: 10, completion: 40 },
        ),
        ("stream left after a partial usage", asked, Ending::Cancelled, usage, events(70), with_usage(70)),
        // Left before the head, during a non-streamed body, timed out.
        ("left before the head", asked, Ending::Unfinished, None, none, charged(100, 4_000)),
        (
            "left before the head, no bound",
            unbounded,
            Ending::Unfinished,
            None,
            none,
            charged(100, DEFAULT_OUTPUT_RESERVATION),
        ),
        ("left before the head, two choices", two_choices, Ending::Unfinished, None, none, charged(100, 100)),
        ("left during the body", asked, Ending::Unfinished, None, bytes(300), charged(100, 4_000)),
        ("left during the body, more relayed", asked, Ending::Unfinished, None, bytes(40_000), charged(100, 10_000)),
        (
            "left after the body's usage",
            asked,
            Ending::Unfinished,
            usage,
            bytes(2_000),
            Charged { prompt: 90, cached: 10, completion: 40 },
        ),
    ];
    for (case, reservation, ending, usage, relayed, expected) in table {
        assert_eq!(reservation.charged(ending, usage, relayed), expected, "{case}");
    }
}

/// `n` and `best_of` completions each have the output bound: reserved for all.
#[test]
fn every_choice_reserves_its_output() {
    assert_eq!(Reservation::for_request(400, Some(50), 4, None).tokens, 100 + 200);
    assert_eq!(Reservation::for_request(400, None, 3, Some(10)).output, 30);
    assert_eq!(Reservation::for_request(0, Some(u64::MAX), 2, None).tokens, u64::MAX);
}

#[test]
fn a_pods_share_is_its_part_of_the_limit() {
    let key = set(Some(30), None);
    let admitted = (0..30).filter(|_| admit(Some(&key), None, 3, Reservation::default(), None).is_ok()).count();
    assert_eq!(admitted, 10);
}

#[test]
fn state_carries_over_to_the_next_snapshot() {
    let key = set(Some(1), None);
    admit(Some(&key), None, 1, Reservation::default(), None).unwrap();
    let next = Arc::new(LimitSet::new(&LimitsConfig::requests(1), Some(&key)));
    assert!(admit(Some(&next), None, 1, Reservation::default(), None).is_err());
}

/// A tenant's cap is shared by all its keys: ten keys with their own
/// generous limits still get the tenant's count between them.
#[test]
fn a_tenants_cap_holds_across_its_keys() {
    let tenant = set(Some(60), None);
    let keys: Vec<Arc<LimitSet>> = (0..10).map(|_| set(Some(600), None)).collect();
    let sets = |key| local::Sets { key: Some(key), tenant: Some(&tenant), model: None, user: None };
    let admitted =
        (0..600).filter(|i| local::admit(sets(&keys[i % 10]), 1, Reservation::default(), None).is_ok()).count();
    assert_eq!(admitted, 60, "the tenant's 60, not 10 × 600");
    let refusal = local::admit(sets(&keys[0]), 1, Reservation::default(), None).unwrap_err();
    assert_eq!((refusal.owner, refusal.unit, refusal.label()), (Owner::Tenant, Unit::Requests, "tenant_requests"));
    // The keys' own counts were given back with each refusal: a key's
    // limit is not used up by requests its tenant refused.
    let fresh_tenant = set(Some(1_000), None);
    let key_only = local::Sets { key: Some(&keys[0]), tenant: Some(&fresh_tenant), model: None, user: None };
    let more = (0..600).filter(|_| local::admit(key_only, 1, Reservation::default(), None).is_ok()).count();
    assert_eq!(more, 600 - 6, "the key's six admitted requests, and no more, were counted");
}

/// Concurrency counts requests until their holds drop; each pod holds its
/// share (at least one), and a refusal by it gives back what was counted.
#[test]
fn concurrency_is_held_until_the_request_ends() {
    let key = concurrent(4);
    let first: Vec<Admitted> =
        (0..4).map(|_| admit(Some(&key), None, 1, Reservation::default(), None).unwrap()).collect();
    let refusal = admit(Some(&key), None, 1, Reservation::default(), None).unwrap_err();
    assert_eq!((refusal.owner, refusal.unit, refusal.label()), (Owner::Key, Unit::Concurrent, "key_concurrent"));
    assert_eq!(refusal.describe(), "the API key's limit of 4 concurrent requests");
    let mut headers = HeaderMap::new();
    refusal.apply(&mut headers);
    assert_eq!(headers["retry-after"], "1");
    drop(first);
    assert_eq!(key.concurrent.as_ref().unwrap().held(), 0);
    // Two pods: two each.
    let held: Vec<Admitted> =
        (0..2).map(|_| admit(Some(&key), None, 2, Reservation::default(), None).unwrap()).collect();
    assert!(admit(Some(&key), None, 2, Reservation::default(), None).is_err());
    drop(held);
    // A rate limit admits, the tenant's concurrency refuses: the rate
    // limit's charge is given back.
    let rate = set(Some(1), None);
    let full_tenant = concurrent(1);
    let _holding =
        local::admit(local::Sets { tenant: Some(&full_tenant), ..Default::default() }, 1, Reservation::default(), None)
            .unwrap();
    let refused = local::admit(
        local::Sets { key: Some(&rate), tenant: Some(&full_tenant), model: None, user: None },
        1,
        Reservation::default(),
        None,
    );
    assert_eq!(refused.unwrap_err().owner, Owner::Tenant);
    assert!(admit(Some(&rate), None, 1, Reservation::default(), None).is_ok(), "the key's one request is still there");
    // A new config's set continues the count of the streams still open.
    let before = concurrent(3);
    let open = admit(Some(&before), None, 1, Reservation::default(), None).unwrap();
    let after = Arc::new(LimitSet::new(&LimitsConfig::concurrent(1), Some(&before)));
    assert!(admit(Some(&after), None, 1, Reservation::default(), None).is_err());
    drop(open);
    assert!(admit(Some(&after), None, 1, Reservation::default(), None).is_ok());
}

#[test]
fn durations_read_like_openais() {
    assert_eq!(duration_text(20_000_000), "20ms");
    assert_eq!(duration_text(1_000_000_000), "1s");
    assert_eq!(duration_text(1_000_000_001), "2s");
    assert_eq!(duration_text(360_000_000_000), "6m0s");
}

/// A form's file is no prompt estimate (nothing reserved for it, nothing
/// charged for it without a usage) yet caps what a reported usage may
/// claim; a media answer's bytes are no output tokens.
#[test]
fn a_forms_file_is_no_prompt_estimate_and_a_media_answer_no_output() {
    let form = Reservation::for_form(4_000_000, None, 1, Some(100));
    assert_eq!(form.tokens, 100, "only the output bound is reserved");
    let relayed = Relayed { bytes: 1_000_000, events: None };
    assert_eq!(form.charged(Ending::Whole, Some((900_000, 0, 5)), relayed).prompt, 900_000, "the audio's own count");
    assert_eq!(form.charged(Ending::Whole, None, relayed).prompt, 0);
    let speech = Reservation::for_request(400, None, 1, Some(100)).with_media_answer();
    let charged = speech.charged(Ending::Whole, None, relayed);
    assert_eq!((charged.prompt, charged.completion), (100, 0), "the text asked for, not the audio's bytes");
    let chat = Reservation::for_request(400, None, 1, Some(100));
    assert_eq!(chat.charged(Ending::Whole, None, relayed).completion, 250_000, "text: a token per four bytes");
}
