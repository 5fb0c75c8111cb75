use super::*;

const INTERACTIVE: usize = 0;
const BATCH: usize = 2;
const NOISY: u64 = 1;
const QUIET: u64 = 2;

fn flow(class: usize, tenant: u64, weight: u32) -> Flow {
    Flow { class, tenant, weight, key: tenant * 100, cost: 100 }
}

fn now<T: std::fmt::Debug>(arrival: Arrival<T>) -> T {
    match arrival {
        Arrival::Now(waiter) => waiter,
        other => panic!("expected Now, got {other:?}"),
    }
}

fn queued<T: std::fmt::Debug>(arrival: Arrival<T>) -> Ticket {
    match arrival {
        Arrival::Queued(ticket, None) => ticket,
        other => panic!("expected Queued, got {other:?}"),
    }
}

fn names(sent: Vec<Dispatched<&'static str>>) -> Vec<&'static str> {
    sent.into_iter().map(|d| d.waiter).collect()
}

#[test]
fn work_conserving_one_tenant_gets_the_whole_capacity_then_queues() {
    let mut scheduler = Scheduler::new(3, 100, 4, 2);
    for name in ["a1", "a2", "a3", "a4"] {
        now(scheduler.arrive(flow(BATCH, NOISY, 1), name));
    }
    // Alone, it is never under its share of 4: no headroom for it.
    let ticket = queued(scheduler.arrive(flow(BATCH, NOISY, 1), "a5"));
    queued(scheduler.arrive(flow(BATCH, NOISY, 1), "a6"));
    assert_eq!(scheduler.in_flight(), 4);
    assert_eq!(scheduler.leave(ticket), Some("a5"), "a departure leaves at once");
    assert_eq!(names(scheduler.release(flow(BATCH, NOISY, 1), 100)), ["a6"], "a freed place goes to the next");
    assert_eq!(scheduler.queued(), 0);
    assert_eq!(scheduler.in_flight(), 4);
}

#[test]
fn a_quiet_tenant_under_its_share_goes_at_once_into_the_headroom() {
    let mut scheduler = Scheduler::new(3, 100, 4, 2);
    for _ in 0..4 {
        now(scheduler.arrive(flow(BATCH, NOISY, 1), "noisy"));
    }
    for _ in 0..10 {
        queued(scheduler.arrive(flow(BATCH, NOISY, 1), "noisy-waiting"));
    }
    // Two tenants of weight 1: the quiet one's share is 3 of the 6.
    now(scheduler.arrive(flow(BATCH, QUIET, 1), "quiet-1"));
    now(scheduler.arrive(flow(BATCH, QUIET, 1), "quiet-2"));
    assert_eq!(scheduler.in_flight(), 6, "the headroom is bounded by the burst");
    queued(scheduler.arrive(flow(BATCH, QUIET, 1), "quiet-3"));
    // A freed place goes to the first waiter under its share: the quiet
    // one's (the noisy one holds its 3, though its waiter is older); then,
    // the noisy one back under its share, the noisy one's.
    assert_eq!(names(scheduler.release(flow(BATCH, NOISY, 1), 100)), ["quiet-3"]);
    assert_eq!(names(scheduler.release(flow(BATCH, NOISY, 1), 100)), ["noisy-waiting"]);
    assert_eq!(scheduler.in_flight(), 6);
    for _ in 0..3 {
        scheduler.release(flow(BATCH, NOISY, 1), 100);
        assert!(scheduler.in_flight() <= 6, "never above capacity + burst");
    }
    assert!(scheduler.queued_in(BATCH) >= 6, "the noisy tenant's backlog waits");
}

#[test]
fn weights_size_the_shares() {
    // Capacity 8 and 4 above it: shares of 12, 9 for weight 3 and 3 for weight 1.
    let mut scheduler = Scheduler::new(3, 100, 8, 4);
    for _ in 0..8 {
        now(scheduler.arrive(flow(BATCH, NOISY, 1), "noisy"));
    }
    for _ in 0..20 {
        queued(scheduler.arrive(flow(BATCH, NOISY, 1), "noisy-waiting"));
    }
    // Gold takes the headroom at once, then waits.
    for _ in 0..4 {
        now(scheduler.arrive(flow(BATCH, QUIET, 3), "gold"));
    }
    for _ in 0..20 {
        queued(scheduler.arrive(flow(BATCH, QUIET, 3), "gold-waiting"));
    }
    // As the noisy tenant's requests end, gold's waiters take the places
    // until each holds its share: 9 and 3.
    let mut gold = 4;
    for _ in 0..5 {
        gold += names(scheduler.release(flow(BATCH, NOISY, 1), 100)).iter().filter(|n| **n == "gold-waiting").count();
    }
    assert_eq!(gold, 9, "gold holds its share of 9");
    assert_eq!(scheduler.in_flight(), 12);
}

#[test]
fn a_higher_class_is_not_held_behind_a_lower_one() {
    let mut scheduler = Scheduler::new(3, 100, 4, 2);
    // Batch takes all of the capacity while nothing else wants it, and no
    // more (alone, it has nobody to leave the headroom for).
    for _ in 0..4 {
        now(scheduler.arrive(flow(BATCH, NOISY, 1), "batch"));
    }
    queued(scheduler.arrive(flow(BATCH, NOISY, 1), "batch-waiting"));
    // Interactive is entitled to the capacity and headroom: it goes at once.
    now(scheduler.arrive(flow(INTERACTIVE, QUIET, 1), "chat-1"));
    now(scheduler.arrive(flow(INTERACTIVE, QUIET, 1), "chat-2"));
    let chat = queued(scheduler.arrive(flow(INTERACTIVE, QUIET, 1), "chat-3"));
    // The first place batch frees goes to interactive, though batch's
    // waiter is older.
    assert_eq!(names(scheduler.release(flow(BATCH, NOISY, 1), 100)), ["chat-3"]);
    assert_eq!(scheduler.leave(chat), None, "dispatched already");
    // Batch never takes the headroom while interactive is active (it is
    // kept for interactive's next request): it waits for the capacity.
    assert!(scheduler.release(flow(BATCH, NOISY, 1), 100).is_empty());
    assert!(scheduler.release(flow(BATCH, NOISY, 1), 100).is_empty());
    assert_eq!(names(scheduler.release(flow(BATCH, NOISY, 1), 100)), ["batch-waiting"]);
    assert_eq!(scheduler.in_flight(), 4);
    // Interactive done: batch, alone, takes the capacity back, no more.
    for _ in 0..3 {
        scheduler.release(flow(INTERACTIVE, QUIET, 1), 100);
    }
    for _ in 0..3 {
        now(scheduler.arrive(flow(BATCH, NOISY, 1), "batch"));
    }
    queued(scheduler.arrive(flow(BATCH, NOISY, 1), "batch-waiting"));
    assert_eq!((scheduler.in_flight(), scheduler.queued_in(BATCH)), (4, 1));
}

#[test]
fn without_headroom_everyone_waits_in_turn() {
    let mut scheduler = Scheduler::new(3, 100, 2, 0);
    now(scheduler.arrive(flow(BATCH, NOISY, 1), "noisy"));
    now(scheduler.arrive(flow(BATCH, NOISY, 1), "noisy"));
    queued(scheduler.arrive(flow(INTERACTIVE, QUIET, 1), "chat"));
    assert_eq!(names(scheduler.release(flow(BATCH, NOISY, 1), 100)), ["chat"]);
}

#[test]
fn a_full_queue_sheds_the_lowest_class_first() {
    let mut scheduler = Scheduler::new(3, 2, 1, 0);
    now(scheduler.arrive(flow(BATCH, NOISY, 1), "running"));
    queued(scheduler.arrive(flow(BATCH, NOISY, 1), "batch-1"));
    queued(scheduler.arrive(flow(BATCH, NOISY, 1), "batch-2"));
    assert!(matches!(scheduler.arrive(flow(BATCH, NOISY, 1), "batch-3"), Arrival::Refused("batch-3")));
    match scheduler.arrive(flow(INTERACTIVE, QUIET, 1), "chat") {
        Arrival::Queued(_, Some(displaced)) => assert_eq!(displaced, "batch-2", "the newest of the lowest class"),
        other => panic!("expected a displacement, got {other:?}"),
    }
    assert_eq!(names(scheduler.release(flow(BATCH, NOISY, 1), 100)), ["chat"]);
}

#[test]
fn more_capacity_sends_waiters_and_an_undo_frees_a_place() {
    let mut scheduler = Scheduler::new(3, 100, 1, 0);
    now(scheduler.arrive(flow(BATCH, NOISY, 1), "a"));
    queued(scheduler.arrive(flow(BATCH, NOISY, 1), "b"));
    queued(scheduler.arrive(flow(BATCH, NOISY, 1), "c"));
    assert_eq!(names(scheduler.resize(2, 0)), ["b"]);
    // `b`'s client had gone: its place goes to `c`.
    assert_eq!(names(scheduler.undo(flow(BATCH, NOISY, 1))), ["c"]);
    assert_eq!(scheduler.in_flight(), 2);
}

/// A team that fills the capacity with one class does not take the
/// headroom with another: the headroom is for other teams.
#[test]
fn a_team_cannot_take_the_headroom_by_using_two_classes() {
    const STANDARD: usize = 1;
    let mut scheduler = Scheduler::new(3, 100, 4, 2);
    for _ in 0..4 {
        now(scheduler.arrive(flow(BATCH, NOISY, 1), "noisy-batch"));
    }
    queued(scheduler.arrive(flow(STANDARD, NOISY, 1), "noisy-standard"));
    assert_eq!(scheduler.in_flight(), 4, "alone, even in another class: no headroom");
    // Another team arrives: its request goes at once into the headroom; the
    // noisy team's standard request, counted with its batch ones, does not.
    now(scheduler.arrive(flow(STANDARD, QUIET, 1), "quiet"));
    assert_eq!((scheduler.in_flight(), scheduler.queued_in(STANDARD)), (5, 1));
}

/// A newcomer of a tenant with requests of its class waiting does not pass
/// them into the headroom: they go first, in their turn.
#[test]
fn an_arrival_does_not_pass_its_own_tenants_waiting_requests() {
    let mut scheduler = Scheduler::new(3, 100, 2, 4);
    now(scheduler.arrive(flow(BATCH, NOISY, 1), "n1"));
    now(scheduler.arrive(flow(BATCH, NOISY, 1), "n2"));
    // Alone, it waits; the quiet tenant arrives and goes into the headroom.
    queued(scheduler.arrive(flow(BATCH, NOISY, 1), "n-waiting"));
    now(scheduler.arrive(flow(BATCH, QUIET, 1), "quiet"));
    // The noisy tenant holds 2 of its share of 3 now, but its newcomer
    // waits behind its older request…
    queued(scheduler.arrive(flow(BATCH, NOISY, 1), "n-new"));
    // … and the next release sends both, the older first.
    assert_eq!(names(scheduler.release(flow(BATCH, NOISY, 1), 100)), ["n-waiting", "n-new"]);
}

/// A tenant that holds less than its share but was sent more than its
/// turns (its requests used far more than estimated) waits in the queue
/// for its turn instead of going into the headroom.
#[test]
fn a_tenant_ahead_of_its_turns_waits_though_it_holds_less_than_its_share() {
    let mut scheduler = Scheduler::new(3, 100, 4, 2);
    for _ in 0..4 {
        now(scheduler.arrive(flow(BATCH, NOISY, 1), "noisy"));
    }
    queued(scheduler.arrive(flow(BATCH, NOISY, 1), "noisy-waiting"));
    now(scheduler.arrive(flow(BATCH, QUIET, 1), "quiet"));
    now(scheduler.arrive(flow(BATCH, QUIET, 1), "quiet"));
    // Both used 2,000 tokens where 100 were estimated: the quiet tenant is
    // 3,800 ahead of the virtual time with nothing in flight.
    scheduler.release(flow(BATCH, QUIET, 1), 2_000);
    scheduler.release(flow(BATCH, QUIET, 1), 2_000);
    assert_eq!(scheduler.in_flight(), 4);
    // Holding none of its share of 3, it still waits for the capacity…
    let ticket = queued(scheduler.arrive(flow(BATCH, QUIET, 1), "quiet-ahead"));
    // … and the noisy tenant, behind it in virtual time, goes first.
    assert_eq!(names(scheduler.release(flow(BATCH, NOISY, 1), 100)), ["noisy-waiting"]);
    assert_eq!(scheduler.leave(ticket), Some("quiet-ahead"));
}
