#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use super::*;

fn served() -> Served {
    Served::new([("team-a", "alice"), ("team-a", "bob")], ["team-a/old"])
}

fn body(keys: &str, budgets: &str) -> String {
    format!(r#"{{"instance":"gw-1-abcd","sequence":3,"month":"2026-11","keys":{{{keys}}},"budgets":[{budgets}]}}"#)
}

fn screened(text: &str) -> Result<UsageReport, Refusal> {
    screen(text.as_bytes(), "gw-1", &served())
}

#[test]
fn a_genuine_report_is_taken_whole() {
    let text = body(
        r#""team-a/alice":{"requests":2,"inputTokens":10,"costNanos":500},"team-a/old":{"requests":1},"-":{"requests":4}"#,
        r#"{"scope":"key:team-a/alice","period":"Day","window":"2026-11-26","tokens":10,"costNanos":500},
           {"scope":"tenant:team-a","period":"Month","window":"2026-11","tokens":10,"costNanos":0}"#,
    );
    let report = screened(&text).unwrap();
    assert_eq!(report.instance, "gw-1-abcd");
    assert_eq!(report.sequence, 3);
    assert_eq!(report.keys.len(), 3);
    assert_eq!(
        report.keys["team-a/alice"],
        UsageTotals { requests: 2, input_tokens: 10, cost_nanos: 500, ..UsageTotals::default() }
    );
    assert_eq!(report.budgets.len(), 2);
    // It reads back as the gateway writes it: the contract's own type.
    let written = serde_json::to_string(&report).unwrap();
    assert_eq!(screened(&written).unwrap(), report);
    // A newer gateway's extra field is read past, not kept.
    let extra = text.replacen("{\"instance\"", "{\"later\":[1,{\"x\":2}],\"instance\"", 1);
    assert_eq!(screened(&extra).unwrap(), report);
}

#[test]
fn a_key_or_tenant_the_gateway_does_not_count_refuses_the_whole_report() {
    for text in [
        body(r#""team-a/alice":{"requests":1},"team-b/carol":{"costNanos":9000000000000000000}"#, ""),
        body(r#""team-a":{"requests":1}"#, ""),
        body("", r#"{"scope":"key:team-b/carol","period":"Day","window":"2026-11-26","tokens":1,"costNanos":0}"#),
        body("", r#"{"scope":"tenant:team-b","period":"Day","window":"2026-11-26","tokens":1,"costNanos":0}"#),
        body("", r#"{"scope":"team-a","period":"Day","window":"2026-11-26","tokens":1,"costNanos":0}"#),
    ] {
        assert_eq!(screened(&text), Err(Refusal::ForeignKey), "{text}");
    }
    // Served now: status is written; counted this month only: listed, not written.
    let served = served();
    assert!(served.serves("team-a/alice") && !served.serves("team-a/old") && !served.serves("team-b/carol"));
}

#[test]
fn a_report_past_the_key_cap_is_refused() {
    let many: Vec<(String, String)> = (0..=MAX_REPORTED_KEYS).map(|i| ("team-a".to_owned(), format!("k{i}"))).collect();
    let served = Served::new(many.iter().map(|(ns, name)| (ns.as_str(), name.as_str())), []);
    let mut keys: Vec<String> = many.iter().map(|(ns, name)| format!(r#""{ns}/{name}":{{"requests":1}}"#)).collect();
    keys.push(r#""-":{"requests":1}"#.to_owned());
    let at_cap = body(&keys[1..].join(","), "");
    assert_eq!(screen(at_cap.as_bytes(), "gw-1", &served).map(|r| r.keys.len()), Ok(MAX_REPORTED_KEYS + 1));
    let past = body(&keys.join(","), "");
    assert_eq!(screen(past.as_bytes(), "gw-1", &served), Err(Refusal::TooManyKeys));
    // A key listed twice counts twice: the cap is on what is sent.
    let repeated = body(&vec![r#""team-a/k0":{"requests":1}"#; MAX_REPORTED_KEYS + 2].join(","), "");
    assert_eq!(screen(repeated.as_bytes(), "gw-1", &served), Err(Refusal::TooManyKeys));
}

/// A body past the byte cap is refused after reading one byte more than
/// the cap, whatever it would parse to, and a reader that never ends is
/// never read to its end.
#[test]
fn a_report_past_the_byte_cap_is_refused_unread() {
    let padding = " ".repeat(MAX_REPORT_BYTES);
    let text = format!("{}{padding}", body(r#""team-a/alice":{"requests":1}"#, ""));
    assert_eq!(screened(&text), Err(Refusal::TooLarge));
    let endless = std::io::repeat(b' ');
    assert_eq!(screen(endless, "gw-1", &served()), Err(Refusal::TooLarge));
    let mut counted = std::io::repeat(b' ').take(u64::MAX);
    let _ = screen(&mut counted, "gw-1", &served());
    assert!(u64::MAX - counted.limit() <= MAX_REPORT_BYTES as u64 + 1, "read past the cap");
    // Exactly at the cap is taken.
    let genuine = body(r#""team-a/alice":{"requests":1}"#, "");
    let at_cap = format!("{genuine}{}", " ".repeat(MAX_REPORT_BYTES - genuine.len()));
    assert!(screened(&at_cap).is_ok());
}

#[test]
fn negative_fractional_and_huge_numbers_are_refused() {
    for totals in [
        r#"{"requests":-1}"#,
        r#"{"inputTokens":1.5}"#,
        r#"{"costNanos":9000000000000000000}"#,
        r#"{"outputTokens":18446744073709551615}"#,
        r#"{"cachedInputTokens":1e30}"#,
        r#"{"requests":100000000000000000000000}"#,
    ] {
        let text = body(&format!(r#""team-a/alice":{totals}"#), "");
        assert_eq!(screened(&text), Err(Refusal::OutOfBounds), "{totals}");
    }
    let budget = r#"{"scope":"key:team-a/alice","period":"Day","window":"2026-11-26","tokens":-5,"costNanos":0}"#;
    assert_eq!(screened(&body("", budget)), Err(Refusal::OutOfBounds));
    // The bounds themselves are taken.
    let text = body(&format!(r#""team-a/alice":{{"requests":{MAX_COUNT},"costNanos":{MAX_COST_NANOS}}}"#), "");
    assert_eq!(screened(&text).unwrap().keys["team-a/alice"].cost_nanos, MAX_COST_NANOS);
}

#[test]
fn another_pods_process_or_anything_else_is_refused() {
    let theirs = body("", "").replace("gw-1-abcd", "gw-2-abcd");
    assert_eq!(screened(&theirs), Err(Refusal::ForeignInstance));
    let prefix_only = body("", "").replace("gw-1-abcd", "gw-1x-abcd");
    assert_eq!(screened(&prefix_only), Err(Refusal::ForeignInstance));
    for garbage in ["", "{", "[]", "null", r#"{"instance":"gw-1-a"}"#, &body("", "").replace("2026-11", "november")] {
        assert_eq!(screened(garbage), Err(Refusal::Malformed), "{garbage}");
    }
    let trailing = format!("{}{{}}", body("", ""));
    assert_eq!(screened(&trailing), Err(Refusal::Malformed));
}

#[test]
fn ids_hash_the_same_split_or_whole() {
    let served = Served::new([("a", "b/c")], []);
    assert!(served.serves("a/b/c"));
    assert!(!served.serves("a/b") && !served.serves("ab/c"));
}

#[test]
fn a_second_window_for_one_budget_or_a_window_that_is_no_calendar_key_refuses_the_report() {
    let spend = |window: &str| {
        format!(r#"{{"scope":"tenant:team-a","period":"Day","window":"{window}","tokens":0,"costNanos":0}}"#)
    };
    let two = body("", &format!("{},{}", spend("2026-11-26"), spend("2026-11-27")));
    assert_eq!(screened(&two), Err(Refusal::Malformed), "a made-up window per entry would be kept without bound");
    assert_eq!(screened(&body("", &spend("../../etc"))), Err(Refusal::Malformed));
    let day_and_month = body(
        "",
        &format!(
            "{},{}",
            spend("2026-11-26"),
            r#"{"scope":"tenant:team-a","period":"Month","window":"2026-11","tokens":0,"costNanos":0}"#
        ),
    );
    assert_eq!(screened(&day_and_month).unwrap().budgets.len(), 2, "one window per period is genuine");
}

#[test]
fn grants_and_their_members_budgets_are_taken_for_grants_the_gateway_counts_only() {
    let served = served().with_grants(["team-a/devs"]);
    let spend =
        |scope: &str| format!(r#"{{"scope":"{scope}","period":"Day","window":"2026-11-26","tokens":5,"costNanos":0}}"#);
    let alice = BudgetScope::member_of("team-a/devs", "alice@example.com");
    let text = body("", &[spend("grant:team-a/devs"), spend(&alice)].join(","));
    let report = screen(text.as_bytes(), "gw-1", &served).unwrap();
    assert_eq!(report.budgets.len(), 2);
    let stranger = BudgetScope::member_of("team-b/ops", "alice@example.com");
    let not_hex = format!("user:team-a/devs:{}", "z".repeat(32));
    for scope in ["grant:team-b/ops", stranger.as_str(), not_hex.as_str(), "user:team-a/devs"] {
        let text = body("", &spend(scope));
        assert_eq!(screen(text.as_bytes(), "gw-1", &served), Err(Refusal::ForeignKey), "{scope}");
    }
    // A grant the Gateway does not count is foreign whatever its members.
    assert_eq!(screened(&body("", &spend(&alice))), Err(Refusal::ForeignKey));
}

#[test]
fn a_report_naming_more_members_than_a_pod_reports_is_refused() {
    let served = served().with_grants(["team-a/devs", "team-a/ops"]);
    let spend = |n: usize| {
        let grant = if n.is_multiple_of(2) { "team-a/devs" } else { "team-a/ops" };
        format!(r#"{{"scope":"user:{grant}:{n:032x}","period":"Day","window":"2026-11-26","tokens":5,"costNanos":0}}"#)
    };
    let at_cap: Vec<String> = (0..MAX_REPORTED_MEMBERS).map(spend).collect();
    let text = body("", &at_cap.join(","));
    assert_eq!(screen(text.as_bytes(), "gw-1", &served).map(|r| r.budgets.len()), Ok(MAX_REPORTED_MEMBERS));
    // One more, of any grant: refused whole.
    let past: Vec<String> = (0..=MAX_REPORTED_MEMBERS).map(spend).collect();
    let text = body("", &past.join(","));
    assert_eq!(screen(text.as_bytes(), "gw-1", &served), Err(Refusal::TooManyKeys));
}

#[test]
fn grants_usage_is_taken_for_grants_the_gateway_counts_only_and_within_the_cap() {
    let served = served().with_grants(["team-a/devs"]);
    let with_grants =
        |grants: &str| body("", "").replacen(r#""budgets""#, &format!(r#""grants":{{{grants}}},"budgets""#), 1);
    let text = with_grants(r#""team-a/devs":{"requests":3,"inputTokens":30,"costNanos":70}"#);
    let report = screen(text.as_bytes(), "gw-1", &served).unwrap();
    assert_eq!(
        report.grants["team-a/devs"],
        UsageTotals { requests: 3, input_tokens: 30, cost_nanos: 70, ..UsageTotals::default() }
    );
    // Written as the gateway writes it, read back the same.
    assert_eq!(screen(serde_json::to_string(&report).unwrap().as_bytes(), "gw-1", &served).unwrap(), report);
    // A grant it does not count, or a key's id in the grants' map: refused whole.
    for grants in [r#""team-b/ops":{"requests":1}"#, r#""team-a/alice":{"requests":1}"#, r#""-":{"requests":1}"#] {
        let text = with_grants(grants);
        assert_eq!(screen(text.as_bytes(), "gw-1", &served), Err(Refusal::ForeignKey), "{grants}");
    }
    // Numbers past the bounds, as a key's.
    let text = with_grants(r#""team-a/devs":{"requests":-1}"#);
    assert_eq!(screen(text.as_bytes(), "gw-1", &served), Err(Refusal::OutOfBounds));
    // A grant its ledger still counts (served earlier this month) may be
    // listed; only one served now gets a status written.
    let counted = Served::new([], ["grant:team-a/gone"]).with_counted_grants(["team-a/old"]);
    let text = with_grants(r#""team-a/gone":{"requests":1},"team-a/old":{"requests":1}"#);
    assert!(screen(text.as_bytes(), "gw-1", &counted).is_ok());
    assert!(served.serves_grant("team-a/devs"));
    assert!(!counted.serves_grant("team-a/gone") && !counted.serves_grant("team-a/old"));
    // More grants than a pod reports: refused whole.
    let ids: Vec<String> = (0..=MAX_REPORTED_GRANTS).map(|i| format!("team-a/g{i}")).collect();
    let many = Served::new([], []).with_grants(ids.iter().map(String::as_str));
    let listed: Vec<String> = ids.iter().map(|id| format!(r#""{id}":{{"requests":1}}"#)).collect();
    let text = with_grants(&listed.join(","));
    assert_eq!(screen(text.as_bytes(), "gw-1", &many), Err(Refusal::TooManyKeys));
    let text = with_grants(&listed[..MAX_REPORTED_GRANTS].join(","));
    assert_eq!(screen(text.as_bytes(), "gw-1", &many).map(|report| report.grants.len()), Ok(MAX_REPORTED_GRANTS));
}
