//! The per-model fair queue: which waiting request goes next when a model
//! is full.
//!
//! ```text
//! classes in strict priority ─► tenants by weighted fair queueing on tokens ─► a tenant's keys round-robin ─► FIFO per key
//! ```
//!
//! Within a class, tenants share by start-time fair queueing: each tenant
//! carries a virtual finish tag; its next request's start tag is the larger
//! of the class's virtual time and that finish tag, the smallest start tag
//! goes first, and dispatching it moves the class's virtual time to the tag
//! and the tenant's finish tag on by `cost / weight`. A tenant that was idle
//! re-enters at the class's virtual time, so idleness banks no credit; a
//! tenant whose request used more (or fewer) tokens than estimated is
//! charged the difference when it settles ([`FairQueue::settle`]).
//!
//! Every request sent while others wait is charged, whether it left the
//! queue or went at once into the headroom ([`FairQueue::charge`]): the
//! shares are the tags', so they hold at any capacity — a place held for
//! a while longer by one tenant is paid back by the next turns going to
//! the others. The virtual time never moves past the start tag of a tenant
//! still waiting, so a request sent out of turn (into the headroom) takes
//! nothing from the tenants it passed.
//!
//! The queue holds no clock and does no I/O: the caller owns the waiters
//! (a channel per request), their deadlines and the capacity that decides
//! when to [`FairQueue::pop`] (`scheduler.rs`).

use std::collections::{HashMap, VecDeque};

/// One waiting request's handle: [`FairQueue::remove`] takes it out when
/// its client leaves or its wait runs out.
pub type Ticket = u64;

/// Virtual time per token at weight 1: tags stay integers, and a weight up
/// to this value still moves a tag by at least 1 per token.
const TAG_SCALE: u64 = 1 << 16;
/// The most tokens one request is charged in the queue (above any model's
/// context): a client's `max_tokens` of 10¹⁴ must not push its tenant's
/// tag to the end of time.
pub const MAX_COST: u64 = 1 << 22;

/// Who a request belongs to and how much it is expected to cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow {
    /// Index of the priority class: 0 is the highest.
    pub class: usize,
    /// The tenant (the key's namespace), by a number that stays across configs.
    pub tenant: u64,
    /// The tenant's weight, at least 1.
    pub weight: u32,
    /// The key, by a number that stays across configs.
    pub key: u64,
    /// Estimated tokens (prompt estimate + output reservation).
    pub cost: u64,
}

/// What [`FairQueue::push`] did with an arrival.
#[derive(Debug, PartialEq, Eq)]
pub enum Pushed<T> {
    /// Waiting, under this ticket.
    Queued(Ticket),
    /// Waiting, under this ticket; the queue was full, so the newest
    /// request of a lower class made room and is handed back to be refused.
    QueuedShedding(Ticket, T),
    /// The queue is full of requests of this class or higher: the arrival's
    /// waiter comes back, to be refused.
    Full(T),
}

/// A request leaving the queue to be sent.
#[derive(Debug, PartialEq, Eq)]
pub struct Dispatched<T> {
    /// The ticket it waited under.
    pub ticket: Ticket,
    /// Who it belongs to.
    pub flow: Flow,
    /// The caller's waiter, to be woken.
    pub waiter: T,
}

struct Waiting<T> {
    flow: Flow,
    waiter: T,
}

/// One key's requests, oldest first.
struct KeyLine {
    key: u64,
    tickets: VecDeque<Ticket>,
}

#[derive(Default)]
struct Tenant {
    weight: u32,
    /// Virtual finish tag of its last dispatched request (plus corrections).
    finish: u64,
    /// Tokens charged for its requests sent and not yet settled: a request
    /// is corrected once, and only when it was charged (not one sent
    /// before the class's busy period began).
    charged: u64,
    queued: usize,
    /// Keys with requests waiting; the front one goes next.
    keys: VecDeque<KeyLine>,
}

impl Tenant {
    /// Its oldest waiting ticket at the front of the line: equal tags go
    /// oldest first.
    fn head(&self) -> Ticket {
        self.keys.front().and_then(|line| line.tickets.front()).copied().unwrap_or(Ticket::MAX)
    }
}

#[derive(Default)]
struct Class {
    virtual_time: u64,
    queued: usize,
    tenants: HashMap<u64, Tenant>,
}

impl Class {
    /// A request of `cost` tokens of `tenant_id` is sent, from the queue
    /// (`waited`) or at once: its start tag is the tenant's finish tag —
    /// for one that did not wait, at least the virtual time — and the
    /// finish tag moves on by `cost / weight`. The virtual time moves up to
    /// that start tag, but never past a waiting tenant's: a request sent
    /// out of turn does not cost the tenants it passed their place.
    fn send(&mut self, tenant_id: u64, weight: u32, cost: u64, waited: bool) {
        let virtual_time = self.virtual_time;
        let tenant =
            self.tenants.entry(tenant_id).or_insert_with(|| Tenant { finish: virtual_time, ..Tenant::default() });
        tenant.weight = weight.max(1);
        let start = if waited { tenant.finish } else { tenant.finish.max(virtual_time) };
        tenant.finish = start.saturating_add(tag_span(cost, tenant.weight));
        tenant.charged = tenant.charged.saturating_add(cost);
        let waiting = self.tenants.values().filter(|t| t.queued > 0).map(|t| t.finish).min();
        self.virtual_time = waiting.map_or(start, |waiting| start.min(waiting)).max(virtual_time);
    }
}

/// Requests waiting for a full model, dispatched by class, tenant weight,
/// key and age. Bounded: at most `max_queued` wait.
pub struct FairQueue<T> {
    classes: Vec<Class>,
    waiting: HashMap<Ticket, Waiting<T>>,
    next_ticket: Ticket,
    max_queued: usize,
}

impl<T> FairQueue<T> {
    /// A queue for `classes` priority classes holding at most `max_queued`
    /// requests.
    pub fn new(classes: usize, max_queued: usize) -> Self {
        Self {
            classes: (0..classes.max(1)).map(|_| Class::default()).collect(),
            waiting: HashMap::new(),
            next_ticket: 0,
            max_queued,
        }
    }

    /// Changes how many may wait (those waiting beyond it stay).
    pub fn set_max_queued(&mut self, max_queued: usize) {
        self.max_queued = max_queued.max(1);
    }

    /// Requests waiting.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Requests of `class` waiting.
    pub fn queued_in(&self, class: usize) -> usize {
        self.classes.get(class).map_or(0, |c| c.queued)
    }

    /// Queues a request. A class beyond the configured ones counts as the
    /// lowest.
    pub fn push(&mut self, mut flow: Flow, waiter: T) -> Pushed<T> {
        flow.class = flow.class.min(self.classes.len() - 1);
        flow.weight = flow.weight.max(1);
        flow.cost = flow.cost.min(MAX_COST);
        let mut shed = None;
        if self.waiting.len() >= self.max_queued {
            // A lower class makes room first; else, in the newcomer's class,
            // a tenant holding more of the queue than the newcomer's would
            // with one more (by weight): one tenant cannot fill the queue and
            // have every other tenant's requests refused.
            match self.newest_below(flow.class).or_else(|| self.newest_of_the_greediest(&flow)) {
                Some(victim) => shed = self.remove(victim),
                None => return Pushed::Full(waiter),
            }
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let class = &mut self.classes[flow.class];
        let tenant = class.tenants.entry(flow.tenant).or_default();
        tenant.weight = flow.weight;
        if tenant.queued == 0 {
            // Back from idle: no credit for the time it waited for nothing.
            tenant.finish = tenant.finish.max(class.virtual_time);
        }
        match tenant.keys.iter_mut().find(|line| line.key == flow.key) {
            Some(line) => line.tickets.push_back(ticket),
            None => tenant.keys.push_back(KeyLine { key: flow.key, tickets: VecDeque::from([ticket]) }),
        }
        tenant.queued += 1;
        class.queued += 1;
        self.waiting.insert(ticket, Waiting { flow, waiter });
        match shed {
            Some(shed) => Pushed::QueuedShedding(ticket, shed),
            None => Pushed::Queued(ticket),
        }
    }

    /// Each waiting tenant's next request, in the order [`FairQueue::pop`]
    /// would reach them: classes highest first, within a class by start
    /// tag (then age).
    pub fn heads(&self) -> Vec<Flow> {
        let mut heads = Vec::new();
        for class in &self.classes {
            let mut tenants: Vec<&Tenant> = class.tenants.values().filter(|tenant| tenant.queued > 0).collect();
            tenants.sort_by_key(|tenant| (tenant.finish, tenant.head()));
            heads.extend(tenants.iter().filter_map(|tenant| self.waiting.get(&tenant.head()).map(|w| w.flow)));
        }
        heads
    }

    /// The tenants with requests of `class` waiting, and their weights.
    pub fn waiting_tenants(&self, class: usize) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.classes
            .get(class)
            .into_iter()
            .flat_map(|c| c.tenants.iter().filter(|(_, t)| t.queued > 0).map(|(id, t)| (*id, t.weight)))
    }

    /// Whether `tenant` has requests of `class` waiting.
    pub fn is_waiting(&self, class: usize, tenant: u64) -> bool {
        self.classes.get(class).and_then(|c| c.tenants.get(&tenant)).is_some_and(|t| t.queued > 0)
    }

    /// The class and tenant whose request goes next.
    fn next(&self) -> Option<(usize, u64)> {
        let index = self.classes.iter().position(|class| class.queued > 0)?;
        let class = &self.classes[index];
        // A waiting tenant's finish tag is its start tag: it came back from
        // idle at least at the virtual time, and may have fallen behind it
        // since only by being refunded what its requests did not use.
        let (&tenant, _) = class
            .tenants
            .iter()
            .filter(|(_, tenant)| tenant.queued > 0)
            .min_by_key(|(_, tenant)| (tenant.finish, tenant.head()))?;
        Some((index, tenant))
    }

    /// The next request to send: the highest class with one waiting, in it
    /// the tenant with the smallest start tag, its next key in turn, that
    /// key's oldest request.
    pub fn pop(&mut self) -> Option<Dispatched<T>> {
        let (index, tenant_id) = self.next()?;
        self.pop_of(index, tenant_id)
    }

    /// The next request of tenant `tenant_id` in class `index` (its next
    /// key in turn, that key's oldest), passing those before it.
    pub fn pop_of(&mut self, index: usize, tenant_id: u64) -> Option<Dispatched<T>> {
        let class = self.classes.get_mut(index)?;
        let tenant = class.tenants.get_mut(&tenant_id)?;
        let mut line = tenant.keys.pop_front()?;
        let ticket = line.tickets.pop_front()?;
        if !line.tickets.is_empty() {
            tenant.keys.push_back(line);
        }
        let waiting = self.waiting.remove(&ticket)?;
        tenant.queued -= 1;
        class.queued -= 1;
        class.send(tenant_id, waiting.flow.weight, waiting.flow.cost, true);
        forget_caught_up(class);
        Some(Dispatched { ticket, flow: waiting.flow, waiter: waiting.waiter })
    }

    /// Charges a request sent without waiting (the model had room, or its
    /// tenant went into the headroom) as if it had left the queue: its
    /// tenant's next turn comes that much later. While nothing of its
    /// class waits there is nobody to be fair to, and nothing is kept.
    pub fn charge(&mut self, mut flow: Flow) {
        let index = flow.class.min(self.classes.len() - 1);
        flow.weight = flow.weight.max(1);
        let Some(class) = self.classes.get_mut(index) else { return };
        if class.queued > 0 {
            class.send(flow.tenant, flow.weight, flow.cost.min(MAX_COST), false);
        }
    }

    /// Whether `tenant` may be sent a request of `cost` tokens out of turn
    /// (above the capacity), its share being `places × weight / weights`
    /// places: while its finish tag leads `class`'s virtual time by less
    /// than what it has in flight plus that share of places at this
    /// request's cost, in tokens. A tenant that was sent more than that
    /// waits for its turn in the queue, so places above the capacity move
    /// a tenant's turns earlier by a bounded amount and never change its
    /// share; a quiet tenant, ahead of the virtual time by no more than
    /// what it holds, is never held back by it.
    pub fn may_lead(&self, class: usize, tenant: u64, cost: u64, (places, weights): (u32, u64)) -> bool {
        let Some(class) = self.classes.get(class) else { return true };
        let Some(tenant) = class.tenants.get(&tenant) else { return true };
        let lead = u128::from(tenant.finish.saturating_sub(class.virtual_time));
        let (weight, weights) = (u128::from(tenant.weight.max(1)), u128::from(weights.max(1)));
        // lead × weight / TAG_SCALE < charged + places × weight / weights × cost,
        // without division (weights are at most 1,000 each: no overflow).
        let share = u128::from(places).saturating_mul(weight).saturating_mul(u128::from(cost.min(MAX_COST)));
        let tokens = u128::from(tenant.charged).saturating_mul(weights).saturating_add(share);
        lead.saturating_mul(weight).saturating_mul(weights) < tokens.saturating_mul(u128::from(TAG_SCALE))
    }

    /// Takes a waiting request out (its client left, or its wait ran out);
    /// `None` when it is no longer waiting.
    pub fn remove(&mut self, ticket: Ticket) -> Option<T> {
        let waiting = self.waiting.remove(&ticket)?;
        let class = &mut self.classes[waiting.flow.class];
        if let Some(tenant) = class.tenants.get_mut(&waiting.flow.tenant) {
            if let Some(index) = tenant.keys.iter().position(|line| line.key == waiting.flow.key) {
                let line = &mut tenant.keys[index];
                line.tickets.retain(|t| *t != ticket);
                if line.tickets.is_empty() {
                    tenant.keys.remove(index);
                }
            }
            tenant.queued -= 1;
        }
        class.queued -= 1;
        forget_caught_up(class);
        Some(waiting.waiter)
    }

    /// Corrects a dispatched request's charge once its real token count is
    /// known: the tenant's finish tag moves by the difference, so estimates
    /// that are too low (or too high) do not shift the shares. A tenant
    /// still waiting keeps all of a refund, even behind the virtual time:
    /// it was charged that much while it waited. A request that was never
    /// charged (sent before its class's busy period began) changes nothing.
    pub fn settle(&mut self, mut flow: Flow, used: u64) {
        flow.cost = flow.cost.min(MAX_COST);
        let used = used.min(MAX_COST);
        let index = flow.class.min(self.classes.len() - 1);
        let Some(class) = self.classes.get_mut(index) else { return };
        let Some(tenant) = class.tenants.get_mut(&flow.tenant) else { return };
        if tenant.charged < flow.cost {
            return;
        }
        tenant.charged -= flow.cost;
        let weight = flow.weight.max(1);
        if used > flow.cost {
            tenant.finish = tenant.finish.saturating_add(tag_span(used - flow.cost, weight));
        } else {
            tenant.finish = tenant.finish.saturating_sub(tag_span(flow.cost - used, weight));
        }
        forget_caught_up(class);
    }

    /// In `flow`'s class, the newest request of the tenant with the most
    /// waiting by weight, if that is another tenant holding more than
    /// `flow`'s would with `flow` added.
    fn newest_of_the_greediest(&self, flow: &Flow) -> Option<Ticket> {
        let class = self.classes.get(flow.class)?;
        let share = |queued: usize, weight: u32| (queued as u128) * 1_000_000 / u128::from(weight.max(1));
        let own = class.tenants.get(&flow.tenant).map_or(0, |tenant| tenant.queued) + 1;
        let (_, greediest) = class
            .tenants
            .iter()
            .filter(|(id, tenant)| **id != flow.tenant && tenant.queued > 0)
            .max_by_key(|(_, tenant)| share(tenant.queued, tenant.weight))?;
        if share(greediest.queued, greediest.weight) <= share(own, flow.weight) {
            return None;
        }
        greediest.keys.iter().filter_map(|line| line.tickets.back().copied()).max()
    }

    /// The newest request of the lowest class below `class` that has one.
    fn newest_below(&self, class: usize) -> Option<Ticket> {
        let lowest = (class + 1..self.classes.len()).rev().find(|c| self.classes[*c].queued > 0)?;
        self.waiting.iter().filter(|(_, w)| w.flow.class == lowest).map(|(ticket, _)| *ticket).max()
    }
}

fn tag_span(tokens: u64, weight: u32) -> u64 {
    tokens.saturating_mul(TAG_SCALE) / u64::from(weight.max(1))
}

/// Drops idle tenants whose finish tag the class has caught up with and
/// that have nothing charged in flight: they would re-enter at the
/// virtual time anyway, so the map holds only tenants with requests
/// waiting, sent, or a charge still ahead. When nothing
/// waits, the busy period is over: every tenant starts the next one even
/// at virtual time 0 (no credit and no debt carried across an idle class,
/// and tags never grow without end).
fn forget_caught_up(class: &mut Class) {
    if class.queued == 0 {
        class.virtual_time = 0;
        class.tenants.clear();
        return;
    }
    let virtual_time = class.virtual_time;
    class.tenants.retain(|_, tenant| tenant.queued > 0 || tenant.charged > 0 || tenant.finish > virtual_time);
}

#[cfg(test)]
#[path = "fair_queue_tests.rs"]
mod tests;
