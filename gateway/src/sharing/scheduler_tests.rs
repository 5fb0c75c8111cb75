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
    // Two tenants of weight 1: the quiet one's share is 2 of the 4.
    now(scheduler.arrive(flow(BATCH, QUIET, 1), "quiet-1"));
    now(scheduler.arrive(flow(BATCH, QUIET, 1), "quiet-2"));
    assert_eq!(scheduler.in_flight(), 6, "the headroom is bounded by the burst");
    queued(scheduler.arrive(flow(BATCH, QUIET, 1), "quiet-3"));
    // Above the capacity a freed place is not refilled...
    assert!(scheduler.release(flow(BATCH, NOISY, 1), 100).is_empty());
    assert!(scheduler.release(flow(BATCH, NOISY, 1), 100).is_empty());
    // ...until the model is back under it: then in the fair queue's order
    // (by tokens dispatched from it: the two are even, the older waiter
    // first), taking turns.
    assert_eq!(names(scheduler.release(flow(BATCH, NOISY, 1), 100)), ["noisy-waiting"]);
    // Then the quiet one's; the noisy one, down to one in flight, is under
    // its share of two again and takes the headroom left.
    assert_eq!(names(scheduler.release(flow(BATCH, NOISY, 1), 100)), ["quiet-3", "noisy-waiting"]);
    assert_eq!(scheduler.in_flight(), 5);
    for _ in 0..2 {
        scheduler.release(flow(BATCH, NOISY, 1), 100);
        assert!(scheduler.in_flight() <= 6, "never above capacity + burst");
    }
}

#[test]
fn weights_size_the_shares() {
    let mut scheduler = Scheduler::new(3, 100, 8, 8);
    for _ in 0..8 {
        now(scheduler.arrive(flow(BATCH, NOISY, 1), "noisy"));
    }
    queued(scheduler.arrive(flow(BATCH, NOISY, 1), "noisy-waiting"));
    // Weight 3 against 1: a share of 6 of the 8.
    for _ in 0..6 {
        now(scheduler.arrive(flow(BATCH, QUIET, 3), "gold"));
    }
    queued(scheduler.arrive(flow(BATCH, QUIET, 3), "gold"));
}

#[test]
fn a_higher_class_is_not_held_behind_a_lower_one() {
    let mut scheduler = Scheduler::new(3, 100, 4, 2);
    // Batch takes all of the capacity while nothing else wants it.
    for _ in 0..4 {
        now(scheduler.arrive(flow(BATCH, NOISY, 1), "batch"));
    }
    queued(scheduler.arrive(flow(BATCH, NOISY, 1), "batch-waiting"));
    // Interactive is entitled to the whole capacity: it goes at once.
    now(scheduler.arrive(flow(INTERACTIVE, QUIET, 1), "chat-1"));
    now(scheduler.arrive(flow(INTERACTIVE, QUIET, 1), "chat-2"));
    let chat = queued(scheduler.arrive(flow(INTERACTIVE, QUIET, 1), "chat-3"));
    // The first place batch frees goes to interactive (still under its
    // share: the whole capacity), none to batch while interactive holds
    // what the classes above it leave (4 − 3 = 1 for batch, which holds 2).
    assert_eq!(names(scheduler.release(flow(BATCH, NOISY, 1), 100)), ["chat-3"]);
    assert_eq!(scheduler.leave(chat), None, "dispatched already");
    assert!(scheduler.release(flow(BATCH, NOISY, 1), 100).is_empty());
    assert!(scheduler.release(flow(BATCH, NOISY, 1), 100).is_empty());
    assert_eq!(scheduler.queued_in(BATCH), 1);
    // Interactive done: batch gets the capacity back.
    for _ in 0..3 {
        scheduler.release(flow(INTERACTIVE, QUIET, 1), 100);
    }
    assert_eq!(scheduler.queued_in(BATCH), 0);
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
