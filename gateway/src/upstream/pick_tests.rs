//! The picker: each policy's spread, the bound on prefix affinity,
//! ejection and its backoff, and endpoint state kept across updates.

use std::net::SocketAddr;

use super::*;

fn addresses(count: u16) -> Vec<SocketAddr> {
    (0..count).map(|i| SocketAddr::from(([10, 0, 0, 1 + i as u8], 8000))).collect()
}

const SECOND: u64 = 1_000_000_000;

/// A handle on `set`, through which requests start.
fn handle(set: EndpointSet) -> Arc<SetHandle> {
    SetHandle::new(Arc::new(set))
}

#[test]
fn round_robin_takes_each_in_turn() {
    let set = EndpointSet::new(&addresses(3), None);
    let picks: Vec<usize> = (0..6).map(|_| set.pick(Policy::RoundRobin, None, &[], 0).unwrap()).collect();
    assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
}

/// Each worker keeps its own turn: every one takes the endpoints in turn
/// (so all of them together do), starting apart, and no worker's picks
/// move another's turn.
#[test]
fn each_worker_takes_the_endpoints_in_its_own_turn() {
    let set = Arc::new(EndpointSet::new(&addresses(3), None));
    let workers: Vec<Vec<usize>> = (1..=2)
        .map(|worker| {
            let set = set.clone();
            std::thread::spawn(move || {
                crate::per_worker::become_worker(worker);
                (0..6).map(|_| set.pick(Policy::RoundRobin, None, &[], 0).unwrap()).collect()
            })
            .join()
            .unwrap()
        })
        .collect();
    for picks in &workers {
        assert!(picks[..3].iter().all(|p| picks[..3].iter().filter(|q| *q == p).count() == 1), "{picks:?}");
        assert_eq!(picks[..3], picks[3..], "{picks:?}");
    }
    assert_ne!(workers[0][0], workers[1][0], "workers start apart: {workers:?}");
    let turns: Vec<u64> = set.turns.all().map(|turn| turn.load(Ordering::Relaxed)).collect();
    assert_eq!(turns[..3], [0, 6, 6], "each worker moved only its own turn");
    // This thread (worker 0) still starts at the first endpoint.
    assert_eq!(set.pick(Policy::RoundRobin, None, &[], 0), Some(0));
}

#[test]
fn least_request_never_picks_the_busiest_of_several() {
    let set = handle(EndpointSet::new(&addresses(3), None));
    let _busy: Vec<InFlight> = (0..10).map(|_| set.start(1)).collect();
    let mut counts = [0; 3];
    for _ in 0..3_000 {
        counts[set.pick(Policy::LeastRequest, None, &[], 0).unwrap()] += 1;
    }
    assert_eq!(counts[1], 0, "the busy one always loses: {counts:?}");
    assert!(counts[0] > 1_000 && counts[2] > 1_000, "the others share evenly: {counts:?}");
}

/// Requests of mixed lengths (1 to 400 ticks, as LLM requests run from
/// milliseconds to minutes), one arriving per tick, over 4 endpoints (about
/// 50 in flight each): least-request keeps the busiest endpoint near the
/// mean on average over time, where round-robin lets a queue build behind
/// the long requests.
#[test]
fn least_request_keeps_the_busiest_endpoint_near_the_mean() {
    let mean_ratio = |policy: Policy| {
        let set = handle(EndpointSet::new(&addresses(4), None));
        let mut running: Vec<(u64, InFlight)> = Vec::new();
        let (mut sum, mut samples) = (0.0, 0_u32);
        for tick in 0..40_000_u64 {
            running.retain(|(ends, _)| *ends > tick);
            let length = 1 + mix(tick) % 400;
            let index = set.pick(policy, None, &[], 0).unwrap();
            running.push((tick + length, set.start(index)));
            if tick > 2_000 {
                let loads: Vec<u32> = set.endpoints().iter().map(|e| e.inflight()).collect();
                let mean = f64::from(loads.iter().sum::<u32>()) / 4.0;
                sum += f64::from(*loads.iter().max().unwrap()) / mean;
                samples += 1;
            }
        }
        sum / f64::from(samples)
    };
    let least = mean_ratio(Policy::LeastRequest);
    let round_robin = mean_ratio(Policy::RoundRobin);
    println!("max/mean in flight, averaged over time: least-request {least:.3}, round-robin {round_robin:.3}");
    assert!(least <= 1.3, "least-request max/mean in flight {least:.2}");
    assert!(least < round_robin, "least-request {least:.2} vs round-robin {round_robin:.2}");
}

#[test]
fn a_prefix_sticks_to_one_endpoint_until_it_carries_more_than_its_bound() {
    let set = handle(EndpointSet::new(&addresses(4), None));
    let policy = Policy::PrefixAffinity { load_factor: 1.25 };
    let hash = affinity_hash(b"You are a helpful assistant. Answer briefly.");
    let home = set.pick(policy, Some(hash), &[], 0).unwrap();
    for _ in 0..20 {
        assert_eq!(set.pick(policy, Some(hash), &[], 0), Some(home), "same prefix, same pod while idle");
    }
    // The home pod busy above 1.25 × the mean: the prefix spills over.
    let _load: Vec<InFlight> = (0..4).map(|_| set.start(home)).collect();
    let spilled = set.pick(policy, Some(hash), &[], 0).unwrap();
    assert_ne!(spilled, home);
    // Distinct prefixes spread over every pod.
    let mut counts = [0; 4];
    drop(_load);
    for prefix in 0..4_000_u64 {
        counts[set.pick(policy, Some(mix(prefix)), &[], 0).unwrap()] += 1;
    }
    assert!(counts.iter().all(|c| *c > 500), "{counts:?}");
}

#[test]
fn prefix_affinity_without_a_prefix_balances_by_load() {
    let set = handle(EndpointSet::new(&addresses(2), None));
    let _busy = set.start(0);
    let policy = Policy::PrefixAffinity { load_factor: 1.25 };
    assert_eq!(set.pick(policy, None, &[], 0), Some(1));
}

#[test]
fn five_failures_in_a_row_eject_for_a_backoff_that_doubles() {
    let set = EndpointSet::new(&addresses(2), None);
    let flaky = &set.endpoints()[0];
    for _ in 0..CONSECUTIVE_FAILURES - 1 {
        assert!(!flaky.record_failure(0));
    }
    flaky.record_success();
    for _ in 0..CONSECUTIVE_FAILURES - 1 {
        assert!(!flaky.record_failure(0), "a success started the count over");
    }
    assert!(flaky.record_failure(0), "the fifth failure in a row ejects");
    assert!(flaky.is_ejected(4 * SECOND) && !flaky.is_ejected(5 * SECOND));
    for _ in 0..100 {
        assert_eq!(set.pick(Policy::RoundRobin, None, &[], SECOND), Some(1), "an ejected endpoint is skipped");
    }
    // Back after 5 s; failing again ejects it for 10 s.
    let back = 5 * SECOND;
    for _ in 0..CONSECUTIVE_FAILURES {
        flaky.record_failure(back);
    }
    assert!(flaky.is_ejected(back + 9 * SECOND) && !flaky.is_ejected(back + 10 * SECOND));
}

#[test]
fn ejection_never_empties_the_set_and_retries_go_elsewhere() {
    let set = EndpointSet::new(&addresses(2), None);
    for endpoint in set.endpoints() {
        for _ in 0..CONSECUTIVE_FAILURES {
            endpoint.record_failure(0);
        }
    }
    assert!(set.pick(Policy::LeastRequest, None, &[], SECOND).is_some(), "all ejected: all eligible again");
    assert_eq!(set.pick(Policy::LeastRequest, None, &[0], 0), Some(1), "a retry skips what it tried");
    assert_eq!(set.pick(Policy::LeastRequest, None, &[0, 1], 0), None, "nothing left to try");
    assert_eq!(EndpointSet::default().pick(Policy::RoundRobin, None, &[], 0), None);
}

#[test]
fn an_update_keeps_the_state_of_endpoints_that_stay() {
    let before = handle(EndpointSet::new(&addresses(2), None));
    let streaming = before.start(1);
    let mut next = addresses(3);
    next.remove(0);
    let after = EndpointSet::new(&next, Some(&before));
    assert_eq!(after.endpoints().len(), 2);
    assert!(Arc::ptr_eq(&after.endpoints()[0], streaming.endpoint()), "same address, same state");
    assert_eq!(after.endpoints()[0].inflight(), 1);
    drop(streaming);
    assert_eq!(after.endpoints()[0].inflight(), 0, "a stream that ends is counted off the kept endpoint");
}

#[test]
fn two_random_choices_beyond_a_handful_of_endpoints() {
    let set = handle(EndpointSet::new(&addresses(12), None));
    let _busy: Vec<InFlight> = (0..10).map(|_| set.start(3)).collect();
    let mut counts = [0; 12];
    for _ in 0..12_000 {
        counts[set.pick(Policy::LeastRequest, None, &[], 0).unwrap()] += 1;
    }
    assert_eq!(counts[3], 0, "two distinct choices: the busy one always loses: {counts:?}");
    assert!(counts.iter().enumerate().all(|(i, c)| i == 3 || *c > 600), "the rest share: {counts:?}");
}

/// Other threads start and end requests while one picks (the gateway's
/// workers share the endpoint counters): a pick always finds an endpoint.
/// Reading the loads twice, once for the least and once to find it, once
/// found none — and failed the request with no endpoint tried.
#[test]
fn a_pick_always_finds_an_endpoint_while_other_threads_move_the_loads() {
    let set = handle(EndpointSet::new(&addresses(3), None));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let movers: Vec<_> = (0..2)
        .map(|seed| {
            let (set, stop) = (set.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut held = Vec::new();
                let mut turn = seed;
                while !stop.load(Ordering::Relaxed) {
                    turn += 1;
                    held.push(set.start(turn % 3));
                    if held.len() > 4 {
                        held.remove(turn % held.len());
                    }
                }
            })
        })
        .collect();
    let mut none = 0;
    for _ in 0..200_000 {
        for policy in [Policy::LeastRequest, Policy::RoundRobin, Policy::PrefixAffinity { load_factor: 1.25 }] {
            if set.pick(policy, Some(7), &[], 0).is_none() {
                none += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for mover in movers {
        mover.join().unwrap();
    }
    assert_eq!(none, 0, "picks that found no endpoint among 3 healthy ones");
}
