//! A model's gate in one pod: its requests in flight, its fair queue, and
//! the task that decides (`scheduler.rs`) — every worker's requests of the
//! model go through it, by channel, so nothing is locked.
//!
//! ```text
//! request ─Arrive(flow, capacity)─► gate task ─► Go now | queued … Go | Shed
//!   Seat (sent upstream) ──drop: Release(flow, tokens used)─► the next waiter's Go
//!   left while waiting (client gone, maxWait) ──Leave──► out of the queue at once
//! ```
//!
//! A waiter that is told Go after it left gives its place back: the task
//! sees that it cannot be told (its channel closed) and counts it out, and
//! a Go that arrived just before it left is released by the waiter itself.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prometheus::{IntGauge, IntGaugeVec};
use tokio::sync::{mpsc, oneshot};

use super::fair_queue::{Dispatched, Flow, Ticket};
use super::scheduler::{Arrival, Scheduler, Shed};

/// The classes a gate has room for (`waycast_crds::sharing::MAX_CLASSES`).
const CLASSES: usize = waycast_crds::sharing::MAX_CLASSES;

/// One model's gate in this pod (kept across configs while the model has
/// a capacity).
pub struct ModelGate {
    commands: mpsc::UnboundedSender<Command>,
    next_token: AtomicU64,
}

impl std::fmt::Debug for ModelGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelGate").finish_non_exhaustive()
    }
}

/// What decides this pod's capacity for a model, and its queue's bounds:
/// a route's part of the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Requests this pod sends at once before the model is full.
    pub capacity: u32,
    /// Requests above it for a tenant (or class) under its share.
    pub burst: u32,
    /// Most requests waiting.
    pub max_queued: usize,
}

enum Command {
    Arrive { token: u64, flow: Flow, bounds: Bounds, classes: Arc<[String]>, reply: oneshot::Sender<Turn> },
    Leave { token: u64 },
    Release { flow: Flow, used: u64 },
}

/// What a waiter is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Send it.
    Go,
    /// Refused: the queue had no room for it.
    Shed(Shed),
}

/// Why a request did not get its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The queue had no room (or a higher class took its place).
    Shed(Shed),
    /// It waited its `maxWait`.
    Timeout,
    /// The gate's task is gone (the model lost its capacity meanwhile):
    /// the request goes on unqueued.
    Closed,
}

impl Refused {
    /// The metric's `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Refused::Shed(shed) => shed.label(),
            Refused::Timeout => "timeout",
            Refused::Closed => "closed",
        }
    }
}

impl ModelGate {
    /// A gate whose task reports its queue's depth per class in `depth`
    /// (labels `model`, `class`) under `model`.
    pub fn start(model: &str, depth: Option<IntGaugeVec>) -> Arc<Self> {
        let (commands, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run(receiver, model.to_owned(), depth));
        Arc::new(Self { commands, next_token: AtomicU64::new(0) })
    }

    /// Waits for `flow`'s turn, at most `max_wait`; `classes` names the
    /// classes (for the depth gauges).
    ///
    /// # Errors
    /// [`Refused`]: shed, timed out, or the gate is gone.
    pub async fn enter(
        self: &Arc<Self>,
        flow: Flow,
        bounds: Bounds,
        classes: &Arc<[String]>,
        max_wait: Duration,
    ) -> Result<Seat, Refused> {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let (reply, turn) = oneshot::channel();
        let arrive = Command::Arrive { token, flow, bounds, classes: classes.clone(), reply };
        if self.commands.send(arrive).is_err() {
            return Err(Refused::Closed);
        }
        let mut waiting = Waiting { gate: self.clone(), token, flow, turn, done: false };
        let outcome = tokio::time::timeout(max_wait, &mut waiting.turn).await;
        let turn = match outcome {
            Ok(Ok(turn)) => turn,
            Ok(Err(_)) => {
                waiting.done = true;
                return Err(Refused::Closed);
            }
            // The turn may have come just as the wait ran out: it is taken.
            Err(_) => {
                waiting.turn.close();
                match waiting.turn.try_recv() {
                    Ok(turn) => turn,
                    Err(_) => return Err(Refused::Timeout),
                }
            }
        };
        waiting.done = true;
        match turn {
            Turn::Go => Ok(Seat { gate: self.clone(), flow, used: std::cell::Cell::new(None) }),
            Turn::Shed(shed) => Err(Refused::Shed(shed)),
        }
    }
}

/// A request waiting for its turn; dropped before it is told (its client
/// left, its wait ran out), it leaves the queue, or gives back a turn that
/// came meanwhile.
struct Waiting {
    gate: Arc<ModelGate>,
    token: u64,
    flow: Flow,
    turn: oneshot::Receiver<Turn>,
    done: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.turn.close();
        let command = match self.turn.try_recv() {
            Ok(Turn::Go) => Command::Release { flow: self.flow, used: 0 },
            _ => Command::Leave { token: self.token },
        };
        let _ = self.gate.commands.send(command);
    }
}

/// A request sent on to the model: its place is given back, with the
/// tokens it used, when the request has ended (this is dropped).
pub struct Seat {
    gate: Arc<ModelGate>,
    flow: Flow,
    used: std::cell::Cell<Option<u64>>,
}

impl std::fmt::Debug for Seat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seat").field("flow", &self.flow).field("used", &self.used.get()).finish()
    }
}

impl Seat {
    /// The tokens the request used, to correct its tenant's share.
    pub fn settle(&self, used: u64) {
        self.used.set(Some(used));
    }

    /// Who the request belongs to.
    pub fn flow(&self) -> &Flow {
        &self.flow
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        // Not settled (a failure before a response): charged as estimated.
        let used = self.used.get().unwrap_or(self.flow.cost);
        let _ = self.gate.commands.send(Command::Release { flow: self.flow, used });
    }
}

/// A waiter as the task holds it.
struct Waiter {
    token: u64,
    reply: oneshot::Sender<Turn>,
}

/// The gate's task: until every handle on the gate (routes, waiters,
/// seats) is gone.
async fn run(mut commands: mpsc::UnboundedReceiver<Command>, model: String, depth: Option<IntGaugeVec>) {
    let mut scheduler: Scheduler<Waiter> = Scheduler::new(CLASSES, 1, 1, 0);
    let mut tickets: HashMap<u64, Ticket> = HashMap::new();
    let mut gauges: Vec<(IntGauge, usize)> = Vec::new();
    let mut classes: Arc<[String]> = Arc::from(Vec::new());
    let started = Instant::now();
    while let Some(command) = commands.recv().await {
        let sent = match command {
            Command::Arrive { token, flow, bounds, classes: names, reply } => {
                if !Arc::ptr_eq(&names, &classes) {
                    // A class renamed or removed shows 0, not its last depth.
                    for (gauge, _) in &gauges {
                        gauge.set(0);
                    }
                    classes = names;
                    gauges = depth.iter().flat_map(|depth| gauges_for(depth, &model, &classes)).collect();
                }
                scheduler.set_max_queued(bounds.max_queued);
                let mut sent = scheduler.resize(bounds.capacity, bounds.burst);
                match scheduler.arrive(flow, Waiter { token, reply }) {
                    Arrival::Now(waiter) => {
                        if waiter.reply.send(Turn::Go).is_err() {
                            sent.extend(scheduler.undo(flow));
                        }
                    }
                    Arrival::Queued(ticket, displaced) => {
                        tickets.insert(token, ticket);
                        if let Some(displaced) = displaced {
                            tickets.remove(&displaced.token);
                            let _ = displaced.reply.send(Turn::Shed(Shed::Displaced));
                        }
                    }
                    Arrival::Refused(waiter) => {
                        let _ = waiter.reply.send(Turn::Shed(Shed::Full));
                    }
                }
                sent
            }
            Command::Leave { token } => {
                if let Some(ticket) = tickets.remove(&token) {
                    scheduler.leave(ticket);
                }
                Vec::new()
            }
            Command::Release { flow, used } => scheduler.release(flow, used),
        };
        deliver(&mut scheduler, &mut tickets, sent);
        for (gauge, class) in &gauges {
            gauge.set(i64::try_from(scheduler.queued_in(*class)).unwrap_or(i64::MAX));
        }
    }
    for (gauge, _) in &gauges {
        gauge.set(0);
    }
    tracing::debug!(model, seconds = started.elapsed().as_secs(), "a model's queue ended");
}

/// Tells each dispatched waiter its turn; one that can no longer be told
/// (gone meanwhile) is counted out, which may send another.
fn deliver(scheduler: &mut Scheduler<Waiter>, tickets: &mut HashMap<u64, Ticket>, mut sent: Vec<Dispatched<Waiter>>) {
    while let Some(dispatched) = sent.pop() {
        tickets.remove(&dispatched.waiter.token);
        if dispatched.waiter.reply.send(Turn::Go).is_err() {
            sent.extend(scheduler.undo(dispatched.flow));
        }
    }
}

fn gauges_for(depth: &IntGaugeVec, model: &str, classes: &[String]) -> Vec<(IntGauge, usize)> {
    classes.iter().enumerate().map(|(index, class)| (depth.with_label_values(&[model, class]), index)).collect()
}
