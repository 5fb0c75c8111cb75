//! When a request of a model with a capacity goes upstream: at once, after
//! waiting in the model's [`FairQueue`], or not at all. Pure: no clock, no
//! I/O; the gate's task (`gate.rs`) feeds it arrivals, departures and
//! releases and hands the dispatched waiters their turn.
//!
//! ```text
//! arrival ─► nothing waits and in flight < capacity ──────────────────────────► now
//!        └─► in flight < capacity + burst, nothing of its tenant waits in its class,
//!            and its tenant (class) is under its share ───────────────────────► now (headroom)
//!        └─► the queue (full: the newest of a lower class makes room, or a refusal)
//! release ─► while in flight < capacity: the queue's next (the smallest start tag)
//!         └─► while in flight < capacity + burst: the first waiter, in the queue's
//!             order, whose tenant is under its share
//! ```
//!
//! Who goes is the fair queue's: every request sent while others wait is
//! charged on its tenant's virtual finish tag, and a freed place below
//! the capacity goes to the smallest start tag, so over any stretch in
//! which two tenants wait their tokens follow their weights — at a
//! capacity of 2 as at 200, a fractional share included. The headroom
//! only decides *when* a tenant under its share may be sent above the
//! capacity. Inference servers are not preemptible, so a tenant that
//! arrives below its share is sent at once into the headroom (`burst`)
//! above the capacity instead of waiting for another tenant's long
//! generations to end.
//!
//! A tenant is under its share, while another tenant or a lower class is
//! active in the model and no higher class is, when both hold:
//!
//! - it holds fewer requests (in its class and the ones below) than its
//!   share of the capacity and headroom: the places divided among the
//!   tenants active in its class (in flight or waiting) by weight — so a
//!   quiet tenant's requests start at once beside a flood;
//! - its finish tag leads the class's virtual time by less than what it
//!   has in flight plus that share of places at this request's cost
//!   ([`FairQueue::may_lead`]) — so a tenant sent places above the
//!   capacity more often than its weight gives (a fractional share held
//!   at its ceiling, or long requests held in as many places as another
//!   tenant's short ones) soon waits in the queue while the others' turns
//!   catch up, and the headroom never changes the shares.
//!
//! The headroom is bounded, a tenant alone never uses it, and as the other
//! tenants' requests end the model comes back under its capacity.

use std::collections::HashMap;

use super::fair_queue::{Dispatched, FairQueue, Flow, Pushed, Ticket};

/// Why a request was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shed {
    /// The queue was full of requests of its class or higher.
    Full,
    /// A request of a higher class took its place in a full queue.
    Displaced,
}

impl Shed {
    /// The metric's `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Shed::Full => "queue_full",
            Shed::Displaced => "displaced",
        }
    }
}

/// What became of an arrival.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrival<T> {
    /// Sent at once: the waiter, to be woken.
    Now(T),
    /// Waiting under this ticket; a lower-class waiter it displaced, if any.
    Queued(Ticket, Option<T>),
    /// Not queued: its waiter, to be refused.
    Refused(T),
}

/// One model's requests in flight from this pod and its queue.
pub struct Scheduler<T> {
    queue: FairQueue<T>,
    in_flight: u32,
    per_class: Vec<u32>,
    /// (class, tenant) → (in flight, weight).
    per_tenant: HashMap<(usize, u64), (u32, u32)>,
    capacity: u32,
    burst: u32,
}

impl<T> Scheduler<T> {
    /// A scheduler for `classes` priority classes holding at most
    /// `max_queued` waiters, with this pod's `capacity` and `burst`.
    pub fn new(classes: usize, max_queued: usize, capacity: u32, burst: u32) -> Self {
        Self {
            queue: FairQueue::new(classes, max_queued),
            in_flight: 0,
            per_class: vec![0; classes.max(1)],
            per_tenant: HashMap::new(),
            capacity: capacity.max(1),
            burst,
        }
    }

    /// Requests sent and not yet released.
    #[cfg(test)]
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Requests of `class` waiting.
    pub fn queued_in(&self, class: usize) -> usize {
        self.queue.queued_in(class)
    }

    /// Requests waiting.
    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Changes how many may wait.
    pub fn set_max_queued(&mut self, max_queued: usize) {
        self.queue.set_max_queued(max_queued);
    }

    /// A new capacity and headroom (endpoints or pods came or went); what
    /// may now go is returned.
    pub fn resize(&mut self, capacity: u32, burst: u32) -> Vec<Dispatched<T>> {
        self.capacity = capacity.max(1);
        self.burst = burst;
        self.pump()
    }

    /// A request arrives.
    pub fn arrive(&mut self, flow: Flow, waiter: T) -> Arrival<T> {
        let flow = self.clamped(flow);
        let room = self.in_flight < self.capacity && self.queue.is_empty();
        // NB: a tenant with requests of its class waiting sends them first
        // (its keys take turns in the queue), never a newcomer past them.
        let headroom = self.in_flight < self.capacity.saturating_add(self.burst)
            && !self.queue.is_waiting(flow.class, flow.tenant)
            && self.under_share(&flow);
        if room || headroom {
            self.queue.charge(flow);
            self.start(&flow);
            return Arrival::Now(waiter);
        }
        match self.queue.push(flow, waiter) {
            Pushed::Queued(ticket) => Arrival::Queued(ticket, None),
            Pushed::QueuedShedding(ticket, victim) => Arrival::Queued(ticket, Some(victim)),
            Pushed::Full(waiter) => Arrival::Refused(waiter),
        }
    }

    /// A waiting request leaves (its client went, its wait ran out): its
    /// waiter, if it was still waiting.
    pub fn leave(&mut self, ticket: Ticket) -> Option<T> {
        self.queue.remove(ticket)
    }

    /// A request sent upstream has ended, having used `used` tokens; what
    /// may now go is returned.
    pub fn release(&mut self, flow: Flow, used: u64) -> Vec<Dispatched<T>> {
        let flow = self.clamped(flow);
        self.finish(&flow);
        self.queue.settle(flow, used);
        self.pump()
    }

    /// A dispatched request whose client had gone before it was told:
    /// counted out again (nothing was sent).
    pub fn undo(&mut self, flow: Flow) -> Vec<Dispatched<T>> {
        let flow = self.clamped(flow);
        self.finish(&flow);
        self.queue.settle(flow, 0);
        self.pump()
    }

    fn clamped(&self, mut flow: Flow) -> Flow {
        flow.class = flow.class.min(self.per_class.len() - 1);
        flow.weight = flow.weight.max(1);
        flow
    }

    fn start(&mut self, flow: &Flow) {
        self.in_flight += 1;
        self.per_class[flow.class] += 1;
        let entry = self.per_tenant.entry((flow.class, flow.tenant)).or_insert((0, flow.weight));
        entry.0 += 1;
        entry.1 = flow.weight;
    }

    fn finish(&mut self, flow: &Flow) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.per_class[flow.class] = self.per_class[flow.class].saturating_sub(1);
        if let Some(entry) = self.per_tenant.get_mut(&(flow.class, flow.tenant)) {
            entry.0 = entry.0.saturating_sub(1);
            if entry.0 == 0 {
                self.per_tenant.remove(&(flow.class, flow.tenant));
            }
        }
    }

    /// Whether `flow`'s tenant may use the headroom: no higher class is
    /// active, another tenant (or a lower class) is, and `flow`'s tenant
    /// is under its share — it holds fewer requests than its share of the
    /// capacity and headroom (divided by weight among the class's active
    /// tenants, in flight or waiting, `flow`'s own counted), and its finish
    /// tag leads the class's virtual time by less than its requests in
    /// flight and that share at this request's cost. A tenant alone never goes above the capacity: there
    /// is nobody to keep the headroom for; a lower class never uses it
    /// while a higher one is active: it is kept for the higher one.
    fn under_share(&self, flow: &Flow) -> bool {
        if self.burst == 0 {
            return false;
        }
        let classes = self.per_class.len();
        // The headroom is kept for the highest class active: a lower class
        // never takes what a higher one's next request would need.
        let higher_active = self.per_class[..flow.class].iter().any(|held| *held > 0)
            || (0..flow.class).any(|c| self.queue.queued_in(c) > 0);
        if higher_active {
            return false;
        }
        // Another tenant, not another class of the same tenant: a team that
        // fills the capacity in one class does not earn the headroom for its
        // requests of another.
        let others_active = self.per_tenant.keys().any(|(_, tenant)| *tenant != flow.tenant)
            || (0..classes).any(|class| self.queue.waiting_tenants(class).any(|(tenant, _)| tenant != flow.tenant));
        if !others_active {
            return false;
        }
        let places = self.capacity.saturating_add(self.burst);
        let mut weights = u64::from(flow.weight);
        let mut counted: Vec<u64> = vec![flow.tenant];
        for (&(class, tenant), &(_, weight)) in &self.per_tenant {
            if class == flow.class && !counted.contains(&tenant) {
                weights += u64::from(weight);
                counted.push(tenant);
            }
        }
        for (tenant, weight) in self.queue.waiting_tenants(flow.class) {
            if !counted.contains(&tenant) {
                weights += u64::from(weight);
                counted.push(tenant);
            }
        }
        // What the tenant holds in this class and the ones below it counts
        // against its share here.
        let mine: u64 = self
            .per_tenant
            .iter()
            .filter(|((class, tenant), _)| *tenant == flow.tenant && *class >= flow.class)
            .map(|(_, (held, _))| u64::from(*held))
            .sum();
        // mine / places < weight / weights, without division.
        let holds_less = mine * weights < u64::from(places) * u64::from(flow.weight);
        holds_less && self.queue.may_lead(flow.class, flow.tenant, flow.cost, (places, weights))
    }

    /// Sends what may go: below the capacity, the queue's next; in the
    /// headroom, the first waiter (in the queue's order) whose tenant is
    /// under its share.
    fn pump(&mut self) -> Vec<Dispatched<T>> {
        let mut sent = Vec::new();
        loop {
            let dispatched = if self.in_flight < self.capacity {
                self.queue.pop()
            } else if self.in_flight < self.capacity.saturating_add(self.burst) {
                let heads = self.queue.heads();
                let under = heads.into_iter().find(|flow| self.under_share(flow));
                under.and_then(|flow| self.queue.pop_of(flow.class, flow.tenant))
            } else {
                None
            };
            let Some(dispatched) = dispatched else { break };
            self.start(&dispatched.flow);
            sent.push(dispatched);
        }
        sent
    }
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "shares_tests.rs"]
mod shares_tests;
