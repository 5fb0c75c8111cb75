//! Shares over many rounds: closed-loop users of two or more teams keep a
//! model saturated, requests run for as long as they generate, and the
//! tokens each team is served are compared with its weight — at the small
//! capacities where a held-count threshold rounds a fractional share up
//! (capacity 2, 3, 5, 12 with 50 % headroom), and across two pods.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::*;

/// A deterministic generator (xorshift64*): the same run every time.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// A team of the run: its weight, its users (each a key, or a person, of
/// its own), the tokens its requests generate and how long a user thinks
/// before asking again.
#[derive(Clone, Copy)]
struct Team {
    weight: u32,
    users: usize,
    /// Output tokens of a request: uniform in this range.
    output: (u64, u64),
    /// Ticks between an answer and the user's next request, plus 0 to 3
    /// (the network between: other users' requests come and go meanwhile).
    think: u64,
    /// Its requests' output bound: the most they generate, or up to eight
    /// times that (clients that ask for far more than they use).
    bound: Bound,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Bound {
    Tight,
    Loose,
}

impl Team {
    fn new(weight: u32, users: usize) -> Self {
        Self { weight, users, output: (20, 60), think: 0, bound: Bound::Tight }
    }
}

/// What a run measured, per team: tokens served after the first tenth of
/// it, and requests that had to wait in the queue.
struct Outcome {
    served: Vec<u64>,
    queued: Vec<u64>,
}

/// One request's place in the run.
#[derive(Clone, Copy, Debug)]
struct Job {
    team: usize,
    user: usize,
    flow: Flow,
    /// Tokens it uses: its prompt plus what it generates (a token a tick).
    used: u64,
}

/// Prompt tokens of every request, and what the gateway estimates for it
/// before it is sent (an estimate from the prompt's bytes runs high).
const PROMPT: u64 = 100;
const PROMPT_ESTIMATE: u64 = 160;

/// What happens next in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A user asks (team, user).
    Ask(usize, usize),
    /// A request ends (pod, index of its job).
    End(usize, usize),
}

/// A run in progress.
struct Sim<'a> {
    teams: &'a [Team],
    rng: Rng,
    pods: Vec<Scheduler<Job>>,
    /// (when, order of scheduling, what): earliest first.
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    scheduled: u64,
    jobs: Vec<Job>,
    queued: Vec<u64>,
}

impl Sim<'_> {
    fn at(&mut self, when: u64, event: Event) {
        self.scheduled += 1;
        self.events.push(Reverse((when, self.scheduled, event)));
    }

    /// `user` of `team` asks at `now` (a user stays on one pod, as a
    /// client's connection does).
    fn ask(&mut self, now: u64, team: usize, user: usize) {
        let spec = self.teams[team];
        let (low, high) = spec.output;
        let output = low + self.rng.below(high - low + 1);
        let max_tokens = match spec.bound {
            Bound::Tight => high,
            Bound::Loose => high * (1 + self.rng.below(8)),
        };
        let flow = Flow {
            class: 1,
            tenant: team as u64 + 1,
            weight: spec.weight,
            key: (team * 1_000 + user) as u64,
            cost: PROMPT_ESTIMATE + max_tokens,
        };
        let pod = user % self.pods.len();
        match self.pods[pod].arrive(flow, Job { team, user, flow, used: PROMPT + output }) {
            Arrival::Now(job) => self.start(now, pod, job),
            Arrival::Queued(..) => self.queued[team] += 1,
            Arrival::Refused(_) => panic!("the queue holds every user"),
        }
    }

    /// `job` goes upstream at `now`: a token a tick, after a prefill of a
    /// tick per 50 prompt tokens.
    fn start(&mut self, now: u64, pod: usize, job: Job) {
        self.jobs.push(job);
        self.at(now + job.used - PROMPT + PROMPT / 50, Event::End(pod, self.jobs.len() - 1));
    }
}

/// Runs `teams` against `pods` schedulers of `capacity` and `burst` each
/// for `ticks`. Checks, throughout, that no pod holds more than its
/// capacity and headroom.
fn run(teams: &[Team], pods: usize, capacity: u32, burst: u32, ticks: u64) -> Outcome {
    let mut sim = Sim {
        teams,
        rng: Rng(0x9E37_79B9_7F4A_7C15),
        pods: (0..pods).map(|_| Scheduler::new(3, 100_000, capacity, burst)).collect(),
        events: BinaryHeap::new(),
        scheduled: 0,
        jobs: Vec::new(),
        queued: vec![0; teams.len()],
    };
    for (team, spec) in teams.iter().enumerate() {
        for user in 0..spec.users {
            let when = sim.rng.below(50);
            sim.at(when, Event::Ask(team, user));
        }
    }
    let mut served = vec![0; teams.len()];
    while let Some(Reverse((now, _, event))) = sim.events.pop() {
        if now >= ticks {
            break;
        }
        match event {
            Event::Ask(team, user) => sim.ask(now, team, user),
            Event::End(pod, index) => {
                let job = sim.jobs[index];
                if now >= ticks / 10 {
                    served[job.team] += job.used;
                }
                for dispatched in sim.pods[pod].release(job.flow, job.used) {
                    sim.start(now, pod, dispatched.waiter);
                }
                assert!(sim.pods[pod].in_flight() <= capacity + burst, "a pod above its capacity and headroom");
                let delay = teams[job.team].think + sim.rng.below(4);
                sim.at(now + delay, Event::Ask(job.team, job.user));
            }
        }
    }
    Outcome { served, queued: sim.queued }
}

fn ratio(served: &[u64]) -> f64 {
    served[0] as f64 / served[1].max(1) as f64
}

/// The weight-3 team's requests generate 20 to 60 tokens, the weight-1
/// team's three times as many: a share is of tokens, not of places.
fn three_to_one() -> [Team; 2] {
    [Team::new(3, 0), Team { output: (60, 180), ..Team::new(1, 0) }]
}

/// Both teams with more users than their share of the pod's places (so
/// both always have requests waiting), at `capacity` with 50 % headroom,
/// for `ticks` (a request runs 20 to 200): the served tokens within
/// `within` of `weights[0] : weights[1]`.
fn shares_hold_at(teams: [Team; 2], capacity: u32, ticks: u64, within: f64) {
    let burst = capacity / 2;
    let users = (capacity + burst) as usize + 4;
    let teams = teams.map(|team| Team { users, ..team });
    let served = run(&teams, 1, capacity, burst, ticks).served;
    let ratio = ratio(&served);
    let expected = f64::from(teams[0].weight) / f64::from(teams[1].weight);
    assert!(
        (ratio / expected - 1.0).abs() <= within,
        "capacity {capacity} + {burst}: served {served:?}, {ratio:.3} : 1, not {expected} : 1"
    );
}

#[test]
fn weights_hold_at_capacity_twelve_with_headroom() {
    shares_hold_at(three_to_one(), 12, 300_000, 0.02);
}

#[test]
fn weights_hold_at_capacity_two() {
    shares_hold_at(three_to_one(), 2, 300_000, 0.02);
}

#[test]
fn weights_hold_at_capacity_three() {
    shares_hold_at(three_to_one(), 3, 300_000, 0.02);
}

#[test]
fn weights_hold_at_capacity_five() {
    shares_hold_at(three_to_one(), 5, 300_000, 0.02);
}

/// Clients that ask for up to eight times the tokens they use: each
/// request is charged its bound when it is sent and corrected when it
/// ends, so the shares are of what was used.
#[test]
fn weights_hold_when_clients_reserve_far_more_than_they_use() {
    for capacity in [3, 12] {
        shares_hold_at(three_to_one().map(|team| Team { bound: Bound::Loose, ..team }), capacity, 300_000, 0.02);
    }
}

/// Requests of one size for both teams, at every capacity from 1 to 16:
/// a fractional share of the places (4.5 of 18 at capacity 12) is held
/// on average, neither rounded up nor down.
#[test]
fn weights_hold_at_every_small_capacity_for_requests_alike() {
    for capacity in 1..=16 {
        shares_hold_at([Team::new(3, 0), Team::new(1, 0)], capacity, 100_000, 0.015);
    }
}

/// Capacity 64 over two pods (32 and 16 of headroom each), each team's
/// users spread over both: the fleet's tokens within 2 % of 3 : 1.
#[test]
fn weights_hold_across_two_pods() {
    let teams = three_to_one().map(|team| Team { users: 120, ..team });
    let served = run(&teams, 2, 32, 16, 100_000).served;
    let ratio = ratio(&served);
    assert!((2.94..=3.06).contains(&ratio), "served {served:?}, {ratio:.3} : 1");
}

/// Three teams, weights 2 : 1 : 1 at capacity 5: each its part of the
/// tokens.
#[test]
fn three_teams_share_by_weight() {
    let served = run(&[Team::new(2, 12), Team::new(1, 12), Team::new(1, 12)], 1, 5, 2, 300_000).served;
    let total: u64 = served.iter().sum();
    for (team, part) in [0.5, 0.25, 0.25].into_iter().enumerate() {
        let got = served[team] as f64 / total as f64;
        assert!((got - part).abs() <= 0.01, "team {team}: {got:.3} of the tokens, not {part}: {served:?}");
    }
}

/// Equal weights, one team generating about four times as much per
/// request: the other is served as many tokens (by sending about four
/// times the requests), at a capacity of 4.
#[test]
fn shares_are_in_tokens_at_a_small_capacity() {
    let long = Team { output: (150, 210), ..Team::new(1, 0) };
    shares_hold_at([long, Team::new(1, 0)], 4, 300_000, 0.02);
}

/// A quiet team beside a flood — a few users who think between requests,
/// far under its share in tokens — never waits in the queue: each of its
/// requests goes at once, into the headroom when the flood holds the
/// capacity, whatever the weights.
#[test]
fn a_quiet_team_is_never_queued_behind_a_flood() {
    for (capacity, quiet_weight, noisy_weight, bound) in [
        (8, 1, 1, Bound::Tight),
        (8, 1, 3, Bound::Tight),
        (8, 1, 3, Bound::Loose),
        (12, 3, 1, Bound::Loose),
        (5, 1, 1, Bound::Tight),
        (3, 1, 1, Bound::Loose),
    ] {
        let quiet_users = (capacity as usize * 3).div_ceil(10);
        let quiet = Team { think: 40, bound, ..Team::new(quiet_weight, quiet_users) };
        let noisy = Team::new(noisy_weight, capacity as usize * 3);
        let outcome = run(&[quiet, noisy], 1, capacity, capacity / 2, 100_000);
        assert_eq!(outcome.queued[0], 0, "capacity {capacity}, weights {quiet_weight} : {noisy_weight}");
        assert!(outcome.queued[1] > 0, "the flood waits");
        assert!(outcome.served[0] > 0);
    }
}
