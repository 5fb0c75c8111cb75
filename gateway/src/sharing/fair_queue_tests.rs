use super::*;

const INTERACTIVE: usize = 0;
const STANDARD: usize = 1;
const BATCH: usize = 2;

fn flow(class: usize, tenant: u64, weight: u32, key: u64, cost: u64) -> Flow {
    Flow { class, tenant, weight, key, cost }
}

/// Pops `n` requests (or until empty), returning the waiters in order.
fn drain<T>(queue: &mut FairQueue<T>, n: usize) -> Vec<T> {
    std::iter::from_fn(|| queue.pop()).take(n).map(|d| d.waiter).collect()
}

fn queued(pushed: Pushed<&'static str>) -> Ticket {
    match pushed {
        Pushed::Queued(ticket) => ticket,
        other => panic!("expected Queued, got {other:?}"),
    }
}

#[test]
fn one_key_is_first_in_first_out() {
    let mut queue = FairQueue::new(3, 100);
    for name in ["a1", "a2", "a3"] {
        queued(queue.push(flow(STANDARD, 1, 1, 10, 100), name));
    }
    assert_eq!(drain(&mut queue, 10), ["a1", "a2", "a3"]);
    assert!(queue.is_empty());
    assert!(queue.pop().is_none());
}

#[test]
fn a_tenants_keys_take_turns() {
    let mut queue = FairQueue::new(3, 100);
    // Key 10 queues three before key 11 queues any: round-robin still
    // alternates them, so one chatty key cannot starve its team's others.
    for name in ["k10-1", "k10-2", "k10-3"] {
        queued(queue.push(flow(STANDARD, 1, 1, 10, 100), name));
    }
    for name in ["k11-1", "k11-2"] {
        queued(queue.push(flow(STANDARD, 1, 1, 11, 100), name));
    }
    assert_eq!(drain(&mut queue, 10), ["k10-1", "k11-1", "k10-2", "k11-2", "k10-3"]);
}

#[test]
fn weights_share_tokens_three_to_one_while_both_wait() {
    let mut queue = FairQueue::new(3, 10_000);
    for i in 0..400 {
        queued(queue.push(flow(STANDARD, 1, 3, 10, 100 + i % 7), "gold"));
        queued(queue.push(flow(STANDARD, 2, 1, 20, 100 + i % 5), "bronze"));
    }
    let mut tokens = [0u64; 2];
    for _ in 0..400 {
        let dispatched = queue.pop().expect("both tenants still wait");
        tokens[dispatched.flow.tenant as usize - 1] += dispatched.flow.cost;
    }
    let ratio = tokens[0] as f64 / tokens[1] as f64;
    assert!((2.9..=3.1).contains(&ratio), "served tokens {tokens:?}, ratio {ratio:.3}");
}

#[test]
fn shares_are_by_tokens_not_requests() {
    let mut queue = FairQueue::new(3, 10_000);
    // Equal weights; tenant 1 sends requests ten times as large.
    for _ in 0..200 {
        queued(queue.push(flow(STANDARD, 1, 1, 10, 1_000), "large"));
        queued(queue.push(flow(STANDARD, 2, 1, 20, 100), "small"));
    }
    let served = drain(&mut queue, 110);
    let large = served.iter().filter(|w| **w == "large").count();
    let small = served.len() - large;
    assert!((9..=11).contains(&large) && small >= 99, "large {large}, small {small}");
}

#[test]
fn classes_go_in_strict_order_whatever_the_weights_and_arrival() {
    let mut queue = FairQueue::new(3, 100);
    queued(queue.push(flow(BATCH, 1, 100, 10, 1), "batch"));
    queued(queue.push(flow(STANDARD, 2, 1, 20, 100_000), "standard"));
    queued(queue.push(flow(INTERACTIVE, 3, 1, 30, 100_000), "interactive"));
    queued(queue.push(flow(BATCH, 1, 100, 10, 1), "batch2"));
    queued(queue.push(flow(INTERACTIVE, 2, 1, 20, 100_000), "interactive2"));
    assert_eq!(drain(&mut queue, 10), ["interactive", "interactive2", "standard", "batch", "batch2"]);
}

#[test]
fn a_class_beyond_the_configured_ones_counts_as_the_lowest() {
    let mut queue = FairQueue::new(2, 100);
    queued(queue.push(flow(7, 1, 1, 10, 100), "unknown"));
    queued(queue.push(flow(1, 1, 1, 11, 100), "lowest"));
    queued(queue.push(flow(0, 1, 1, 12, 100), "highest"));
    assert_eq!(queue.queued_in(1), 2);
    assert_eq!(drain(&mut queue, 10), ["highest", "unknown", "lowest"]);
}

#[test]
fn work_conserving_a_lone_tenant_takes_everything() {
    let mut queue = FairQueue::new(3, 1_000);
    for _ in 0..50 {
        queued(queue.push(flow(BATCH, 2, 1, 20, 500), "batch"));
    }
    // The heavier tenant and the higher classes are idle: nothing is held
    // back for them.
    assert_eq!(drain(&mut queue, 100).len(), 50);
}

#[test]
fn an_idle_tenant_banks_no_credit() {
    let mut queue = FairQueue::new(3, 10_000);
    // Tenant 1 alone for a long while.
    for _ in 0..1_000 {
        queued(queue.push(flow(STANDARD, 1, 1, 10, 100), "busy"));
    }
    assert_eq!(drain(&mut queue, 900).len(), 900);
    // Tenant 2 arrives with a backlog: it shares from now on, it does not
    // get the 900 requests it "missed" in a row.
    for _ in 0..100 {
        queued(queue.push(flow(STANDARD, 2, 1, 20, 100), "late"));
    }
    let next = drain(&mut queue, 40);
    let late = next.iter().filter(|w| **w == "late").count();
    assert!((19..=21).contains(&late), "late got {late} of 40: {next:?}");
}

#[test]
fn a_client_that_leaves_leaves_the_queue_at_once() {
    let mut queue = FairQueue::new(3, 100);
    let first = queued(queue.push(flow(STANDARD, 1, 1, 10, 100), "first"));
    let gone = queued(queue.push(flow(STANDARD, 1, 1, 10, 100), "gone"));
    let other = queued(queue.push(flow(STANDARD, 2, 1, 20, 100), "only-of-its-key"));
    assert_eq!(queue.remove(gone), Some("gone"));
    assert_eq!(queue.remove(gone), None, "a ticket leaves once");
    assert_eq!(queue.remove(other), Some("only-of-its-key"));
    assert_eq!(queue.len(), 1);
    assert_eq!(queue.queued_in(STANDARD), 1);
    let dispatched = queue.pop().expect("one waits");
    assert_eq!((dispatched.ticket, dispatched.waiter), (first, "first"));
    assert!(queue.pop().is_none());
    assert_eq!(queue.remove(first), None, "a dispatched request cannot be removed");
}

#[test]
fn a_full_queue_sheds_the_newest_of_the_lowest_class_first() {
    let mut queue = FairQueue::new(3, 3);
    queued(queue.push(flow(BATCH, 1, 1, 10, 100), "batch-old"));
    queued(queue.push(flow(STANDARD, 1, 1, 11, 100), "standard"));
    queued(queue.push(flow(BATCH, 2, 1, 20, 100), "batch-new"));
    match queue.push(flow(INTERACTIVE, 3, 1, 30, 100), "interactive") {
        Pushed::QueuedShedding(_, shed) => assert_eq!(shed, "batch-new"),
        other => panic!("expected a shed, got {other:?}"),
    }
    // A batch arrival finds nothing lower to shed.
    assert_eq!(queue.push(flow(BATCH, 2, 1, 20, 100), "batch-late"), Pushed::Full("batch-late"));
    // A standard one sheds the remaining batch request.
    assert!(matches!(queue.push(flow(STANDARD, 2, 1, 20, 100), "standard-2"), Pushed::QueuedShedding(_, "batch-old")));
    // Now only equal or higher classes wait: a standard arrival is refused.
    assert_eq!(queue.push(flow(STANDARD, 4, 1, 40, 100), "standard-3"), Pushed::Full("standard-3"));
    assert_eq!(queue.len(), 3);
    assert_eq!(drain(&mut queue, 10), ["interactive", "standard", "standard-2"]);
}

#[test]
fn settling_charges_what_was_used_not_what_was_guessed() {
    let mut queue = FairQueue::new(3, 10_000);
    // Both estimate 100 tokens a request; tenant 1's really use 300.
    for _ in 0..400 {
        queued(queue.push(flow(STANDARD, 1, 1, 10, 100), "heavy"));
        queued(queue.push(flow(STANDARD, 2, 1, 20, 100), "light"));
    }
    let mut tokens = [0u64; 2];
    for _ in 0..200 {
        let dispatched = queue.pop().expect("both wait");
        let used = if dispatched.flow.tenant == 1 { 300 } else { 100 };
        queue.settle(dispatched.flow, used);
        tokens[dispatched.flow.tenant as usize - 1] += used;
    }
    let ratio = tokens[0] as f64 / tokens[1] as f64;
    assert!((0.9..=1.1).contains(&ratio), "used tokens {tokens:?}, ratio {ratio:.3}");
}

#[test]
fn a_weight_of_zero_counts_as_one() {
    let mut queue = FairQueue::new(1, 100);
    queued(queue.push(flow(0, 1, 0, 10, 100), "zero"));
    queued(queue.push(flow(0, 2, 1, 20, 100), "one"));
    queued(queue.push(flow(0, 1, 0, 10, 100), "zero-2"));
    queued(queue.push(flow(0, 2, 1, 20, 100), "one-2"));
    assert_eq!(drain(&mut queue, 10), ["zero", "one", "zero-2", "one-2"]);
}

#[test]
fn tenants_are_forgotten_when_their_class_empties() {
    let mut queue = FairQueue::new(1, 10_000);
    for tenant in 0..1_000 {
        queued(queue.push(flow(0, tenant, 1, tenant, 10), "once"));
    }
    assert_eq!(drain(&mut queue, 2_000).len(), 1_000);
    assert!(queue.classes[0].tenants.is_empty(), "{} tenants kept", queue.classes[0].tenants.len());
    // And the next busy period starts even: a tenant that used much before
    // is not behind one that used nothing.
    queued(queue.push(flow(0, 5, 1, 5, 10), "used-before"));
    queued(queue.push(flow(0, 2_000, 1, 2_000, 10), "new"));
    assert_eq!(drain(&mut queue, 2), ["used-before", "new"]);
}

/// A request naming an absurd output bound is charged at most `MAX_COST`:
/// once it has gone, the shares by weight hold again (the tags were
/// neither pushed to the end of time nor left there).
#[test]
fn a_huge_request_does_not_break_the_shares() {
    let mut queue = FairQueue::new(3, 10_000);
    queued(queue.push(flow(STANDARD, 9, 1, 90, u64::MAX / 2), "huge"));
    assert_eq!(drain(&mut queue, 1), ["huge"]);
    queue.settle(flow(STANDARD, 9, 1, 90, u64::MAX / 2), 10);
    for _ in 0..200 {
        queued(queue.push(flow(STANDARD, 1, 3, 10, 100), "gold"));
        queued(queue.push(flow(STANDARD, 2, 1, 20, 100), "bronze"));
    }
    let served = drain(&mut queue, 200);
    let gold = served.iter().filter(|w| **w == "gold").count();
    assert!((145..=155).contains(&gold), "3 : 1 again: {gold} of 200");
}

/// A full queue refuses nobody's request while one tenant holds more of it
/// than its weight gives: its newest waiter makes room.
#[test]
fn one_tenant_cannot_fill_the_queue_against_the_others() {
    let mut queue = FairQueue::new(3, 4);
    for _ in 0..4 {
        queued(queue.push(flow(STANDARD, 1, 1, 10, 100), "flood"));
    }
    match queue.push(flow(STANDARD, 2, 1, 20, 100), "quiet") {
        Pushed::QueuedShedding(_, shed) => assert_eq!(shed, "flood"),
        other => panic!("expected the flood to make room, got {other:?}"),
    }
    assert!(matches!(queue.push(flow(STANDARD, 2, 1, 20, 100), "quiet"), Pushed::QueuedShedding(_, "flood")));
    // Two each now: neither holds more than the other would with one more.
    assert!(matches!(queue.push(flow(STANDARD, 2, 1, 20, 100), "quiet"), Pushed::Full("quiet")));
    assert!(matches!(queue.push(flow(STANDARD, 1, 1, 10, 100), "flood"), Pushed::Full("flood")));
}

/// A request sent at once (into the headroom) while another tenant waits
/// is charged like one that left the queue: the waiting tenant's turns
/// come first until it has caught up.
#[test]
fn a_request_sent_at_once_is_charged_while_others_wait() {
    let mut queue = FairQueue::new(3, 100);
    for _ in 0..4 {
        queued(queue.push(flow(STANDARD, 1, 1, 10, 100), "waiting"));
    }
    for _ in 0..3 {
        queue.charge(flow(STANDARD, 2, 1, 20, 100));
    }
    queued(queue.push(flow(STANDARD, 2, 1, 20, 100), "sent-three-already"));
    assert_eq!(drain(&mut queue, 5), ["waiting", "waiting", "waiting", "waiting", "sent-three-already"]);
}

/// With nothing of its class waiting, a request sent at once is charged
/// nothing: there was nobody to be fair to.
#[test]
fn a_request_sent_into_an_empty_class_is_not_charged() {
    let mut queue = FairQueue::new(3, 100);
    for _ in 0..3 {
        queue.charge(flow(STANDARD, 2, 1, 20, 100));
    }
    queued(queue.push(flow(STANDARD, 2, 1, 20, 100), "second"));
    queued(queue.push(flow(STANDARD, 1, 1, 10, 100), "first"));
    assert_eq!(drain(&mut queue, 2), ["second", "first"], "oldest first at equal tags");
}

/// Requests taken out of turn (the headroom's `pop_of`) do not move the
/// virtual time past a tenant still waiting: it keeps every turn it is
/// owed.
#[test]
fn a_request_sent_out_of_turn_takes_nothing_from_those_waiting() {
    let mut queue = FairQueue::new(3, 100);
    for _ in 0..4 {
        queued(queue.push(flow(STANDARD, 1, 1, 10, 100), "passed"));
        queued(queue.push(flow(STANDARD, 2, 1, 20, 100), "out-of-turn"));
    }
    for _ in 0..2 {
        assert_eq!(queue.pop_of(STANDARD, 2).map(|d| d.waiter), Some("out-of-turn"));
    }
    assert_eq!(drain(&mut queue, 6), ["passed", "passed", "passed", "out-of-turn", "passed", "out-of-turn"]);
}

/// A waiting tenant refunded what its requests did not use keeps the whole
/// refund, even behind the virtual time: it was charged that much.
#[test]
fn a_waiting_tenant_keeps_all_of_a_refund() {
    let mut queue = FairQueue::new(3, 100);
    queued(queue.push(flow(STANDARD, 1, 1, 10, 400), "over-estimated"));
    for _ in 0..6 {
        queued(queue.push(flow(STANDARD, 1, 1, 10, 100), "refunded"));
        queued(queue.push(flow(STANDARD, 2, 1, 20, 100), "other"));
    }
    let first = queue.pop().expect("one waits");
    assert_eq!(first.waiter, "over-estimated");
    assert_eq!(drain(&mut queue, 4), ["other", "other", "other", "other"]);
    // It used 100 of the 400 it was charged: 300 back, three turns, though
    // the virtual time has moved on to 300 meanwhile.
    queue.settle(first.flow, 100);
    assert_eq!(drain(&mut queue, 3), ["refunded", "refunded", "refunded"]);
}

/// A request that was never charged (sent before the class's busy period)
/// earns its tenant nothing when it settles under its estimate.
#[test]
fn a_request_never_charged_is_not_refunded() {
    let mut queue = FairQueue::new(3, 100);
    for _ in 0..3 {
        queued(queue.push(flow(STANDARD, 1, 1, 10, 100), "a"));
        queued(queue.push(flow(STANDARD, 2, 1, 20, 100), "b"));
    }
    queue.settle(flow(STANDARD, 2, 1, 20, 10_000), 0);
    assert_eq!(drain(&mut queue, 6), ["a", "b", "a", "b", "a", "b"]);
}

/// A tenant may lead the virtual time by what it has in flight plus its
/// share of the places at the request's cost, and no more.
#[test]
fn a_tenant_may_lead_by_its_requests_in_flight_and_its_share() {
    let mut queue: FairQueue<&str> = FairQueue::new(3, 100);
    queued(queue.push(flow(STANDARD, 1, 1, 10, 100), "waiting"));
    // Two tenants of weight 1, 6 places: a share of 3 requests of 100.
    let share = (6, 2);
    assert!(queue.may_lead(STANDARD, 2, 100, share), "a tenant the queue does not know leads by nothing");
    for _ in 0..3 {
        queue.charge(flow(STANDARD, 2, 1, 20, 100));
    }
    assert!(queue.may_lead(STANDARD, 2, 100, share), "ahead only by what it holds");
    // Its three requests end having used twice their estimate: 600 ahead
    // with nothing in flight, its share of 3 requests of 200.
    for _ in 0..3 {
        queue.settle(flow(STANDARD, 2, 1, 20, 100), 200);
    }
    assert!(!queue.may_lead(STANDARD, 2, 100, share));
    assert!(!queue.may_lead(STANDARD, 2, 200, share));
    assert!(queue.may_lead(STANDARD, 2, 201, share), "a larger request's share is larger");
    assert!(!queue.may_lead(STANDARD, 2, 201, (6, 3)), "more tenants, a smaller share");
}
