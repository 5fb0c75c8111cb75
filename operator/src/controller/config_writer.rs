//! One writer per Gateway: a task that owns what was written of the
//! Gateway's config (the config kept to patch, the parts' digests, the
//! key log position its patches reached) and makes every write of its
//! config Secrets. Two sources hand it work and neither holds a lock
//! across its own:
//!
//! ```text
//! Gateway reconcile ── Whole { parts, kept-to-be, read at p } ──► mailbox ─┐
//! key lane ── the key log reached q (watch: the latest only) ──────────────┼─► the Gateway's writer:
//!                                                                          │   write_order decides,
//!                                                                          │   patches, writes, replies
//! a name conflict ── Forget ──────────────────────────────────────────────┘
//! ```
//!
//! A whole write and a patch never run at once for a Gateway: the writer
//! does one thing at a time, and decides from what it wrote whether a
//! whole config read at `p` may be written (`write_order::whole_step`).
//! Writers of different Gateways run side by side. A writer ends when its
//! Gateway is gone; the next whole reconcile of a Gateway of that name
//! starts a new one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube::ResourceExt as _;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::{Mutex, mpsc, oneshot, watch};
use tokio::time::Instant;
use waycast_crds::Gateway;

use super::key_compile::{NotAlone, changed_keys, compile_keys};
use super::memory::{gateway_exists, remember, verified_as};
use super::write_order::{self, KeepFrom, KeysLogged, LaneStep, Refused, WholeArrives, WholeStep};
use super::written_parts::WrittenParts;
use crate::compile::ObjectKey;
use crate::compile::keys::KeyVerdict;
use crate::config_plan;
use crate::context::{Context, Written};
use crate::error::Error;
use crate::render::config_parts::ConfigParts;
use crate::render::key_patch::Kept;

/// The least time between two lane patches of a Gateway: a burst of keys
/// is a few patches of many keys, not one patch per key (each is a swap in
/// every pod).
const BETWEEN_PATCHES: Duration = Duration::from_millis(500);

/// The least time between two lane rounds of a Gateway that did work: a
/// tenant annotating key Secrets in a loop costs a round a tenth of a
/// second at most.
const BETWEEN_ROUNDS: Duration = Duration::from_millis(100);

/// How often an idle writer looks whether its Gateway is still there
/// (what it keeps is megabytes at 100,000 keys).
const LOOK_FOR_GATEWAY: Duration = Duration::from_secs(30);

/// Jobs waiting for one writer: a whole reconcile waits for its reply, so
/// a Gateway has one or two at most.
const MAILBOX: usize = 8;

/// Every Gateway's writer, started on first use.
pub(crate) struct Writers {
    context: Arc<Context>,
    mailboxes: Mutex<HashMap<ObjectKey, Mailbox>>,
    logged: watch::Sender<u64>,
}

/// A whole reconcile's config, for its Gateway's writer.
pub(crate) struct Whole {
    /// The Gateway as the reconcile read it.
    pub gateway: Arc<Gateway>,
    /// Its config's Secrets.
    pub parts: Arc<ConfigParts>,
    /// The same parts kept to patch (`None`: they cannot be patched).
    pub kept: Option<Kept>,
    /// The key log position the reconcile read its inputs at.
    pub read_at: u64,
    /// When it began to read them (before it noted `read_at`).
    pub read_started: std::time::Instant,
    /// The config Secrets it found absent or its own before it applied
    /// anything (`plan.unseen` then): any other the writer would write for
    /// the first time is looked up for another owner first.
    pub checked_unseen: Vec<String>,
}

/// A whole config as its writer wrote it.
#[derive(Debug)]
pub(crate) struct WholeWritten {
    /// Its hash (the reconcile's, or after the keys changed since were
    /// patched in).
    pub hash: String,
    /// The verdicts of the ApiKeys patched in, compiled again.
    pub verdicts: BTreeMap<ObjectKey, KeyVerdict>,
    /// The data bytes written.
    pub bytes: usize,
}

/// Why a whole config was not written.
#[derive(Debug)]
pub(crate) enum NotWritten {
    /// It would undo what the key lane wrote since its inputs were read.
    CompileAgain,
    /// A config Secret it would write belongs to someone else (named).
    Conflict(String),
    /// A write failed (what the Secrets hold is then not known: the next
    /// whole write writes them whatever the store shows).
    Failed(Error),
}

enum Job {
    Whole(Box<Whole>, oneshot::Sender<Result<WholeWritten, NotWritten>>),
    Forget,
}

/// A writer's mailbox, and its flag that stops its patches at once when
/// the Gateway's objects are found not all its own (before the writer
/// reads its `Forget`).
#[derive(Clone)]
struct Mailbox {
    jobs: mpsc::Sender<Job>,
    forgotten: Arc<AtomicBool>,
}

impl Writers {
    pub(crate) fn new(context: Arc<Context>) -> Self {
        Self { context, mailboxes: Mutex::default(), logged: watch::channel(0).0 }
    }

    /// Writes a whole reconcile's config through its Gateway's writer.
    ///
    /// # Errors
    /// [`NotWritten`].
    pub(crate) async fn write_whole(&self, whole: Whole) -> Result<WholeWritten, NotWritten> {
        let id = ObjectKey::of(&whole.gateway.metadata);
        let (reply, replied) = oneshot::channel();
        let mailbox = self.mailbox(&id).await;
        // A writer that ended before this job reached its mailbox (its
        // Gateway looked gone) hands the job back: the next one is started
        // for it. One that ends with the job in its mailbox drops it: the
        // reconcile fails and is retried.
        let job = match mailbox.jobs.send(Job::Whole(Box::new(whole), reply)).await {
            Ok(()) => return replied.await.map_err(|_| ended())?,
            Err(mpsc::error::SendError(job)) => job,
        };
        self.mailbox(&id).await.jobs.send(job).await.map_err(|_| ended())?;
        replied.await.map_err(|_| ended())?
    }

    /// Lets go of what the Gateway's writer keeps to patch: its objects are
    /// not all its own, and nothing of it is written until a whole
    /// reconcile writes again.
    pub(crate) async fn forget(&self, id: &ObjectKey) {
        let mailboxes = self.mailboxes.lock().await;
        if let Some(mailbox) = mailboxes.get(id) {
            mailbox.forgotten.store(true, Ordering::Release);
            // A full mailbox holds a whole job, which replaces the kept config anyway.
            let _ = mailbox.jobs.try_send(Job::Forget);
        }
    }

    /// The key log reached `position`: every writer with a kept config
    /// looks at what changed.
    pub(crate) fn logged(&self, position: u64) {
        self.logged.send_replace(position);
    }

    /// The Gateway's writer's mailbox, its writer started when there is
    /// none (or it ended).
    async fn mailbox(&self, id: &ObjectKey) -> Mailbox {
        let mut mailboxes = self.mailboxes.lock().await;
        mailboxes.retain(|_, mailbox| !mailbox.jobs.is_closed());
        if let Some(mailbox) = mailboxes.get(id) {
            return mailbox.clone();
        }
        let (sender, jobs) = mpsc::channel(MAILBOX);
        let mailbox = Mailbox { jobs: sender, forgotten: Arc::new(AtomicBool::new(false)) };
        let writer = Writer {
            id: id.clone(),
            context: self.context.clone(),
            kept: None,
            written: WrittenParts::default(),
            uid: None,
            lane_read_by: None,
            forgotten: mailbox.forgotten.clone(),
            last_patch: None,
            last_round: None,
        };
        tokio::spawn(writer.run(jobs, self.logged.subscribe()));
        mailboxes.insert(id.clone(), mailbox.clone());
        mailbox
    }
}

fn ended() -> NotWritten {
    NotWritten::Failed(Error::Incomplete("the Gateway's config writer ended"))
}

/// One Gateway's writer: what was written of its config.
struct Writer {
    id: ObjectKey,
    context: Arc<Context>,
    /// Its config as last written, while a patch of it can be.
    kept: Option<Kept>,
    /// Its config Secrets' digests as last written.
    written: WrittenParts,
    /// The uid of the Gateway this was written for.
    uid: Option<String>,
    /// When the last lane patch written had read its inputs: a whole
    /// config whose reconcile began to read before that may not hold
    /// what the patch wrote.
    lane_read_by: Option<std::time::Instant>,
    /// Set by [`Writers::forget`]: no patch until a whole write.
    forgotten: Arc<AtomicBool>,
    last_patch: Option<Instant>,
    last_round: Option<Instant>,
}

impl Writer {
    async fn run(mut self, mut jobs: mpsc::Receiver<Job>, mut logged: watch::Receiver<u64>) {
        let mut look = tokio::time::interval(LOOK_FOR_GATEWAY);
        look.tick().await;
        // When a lane round is due (paced), if one is.
        let mut lane_due: Option<Instant> = None;
        loop {
            let due = lane_due.unwrap_or_else(|| Instant::now() + LOOK_FOR_GATEWAY);
            tokio::select! {
                job = jobs.recv() => match job {
                    Some(Job::Whole(whole, reply)) => {
                        let written = self.whole(*whole).await;
                        // The reconcile may have been cancelled meanwhile.
                        let _ = reply.send(written);
                        // Kept from its read position: what was logged since is
                        // the lane's to patch now, not at the next change.
                        let behind = self.kept.as_ref().is_some_and(|kept| kept.basis.position < *logged.borrow());
                        if behind && lane_due.is_none() {
                            lane_due = Some(Instant::now());
                        }
                    }
                    Some(Job::Forget) => self.kept = None,
                    None => return,
                },
                moved = logged.changed(), if lane_due.is_none() && self.kept.is_some() => {
                    if moved.is_err() {
                        return;
                    }
                    let mut at = Instant::now();
                    at = self.last_patch.map_or(at, |last| at.max(last + BETWEEN_PATCHES));
                    at = self.last_round.map_or(at, |last| at.max(last + BETWEEN_ROUNDS));
                    lane_due = Some(at);
                }
                () = tokio::time::sleep_until(due), if lane_due.is_some() => {
                    lane_due = None;
                    let position = *logged.borrow_and_update();
                    self.lane_round(position).await;
                }
                _ = look.tick() => {}
            }
            if !gateway_exists(&self.context.stores, &self.id) {
                // A job that comes meanwhile finds the mailbox closed and
                // starts the next writer.
                return;
            }
        }
    }

    /// Writes a whole reconcile's config, with the keys changed since it
    /// read its inputs patched in, unless it would undo a lane patch.
    async fn whole(&mut self, whole: Whole) -> Result<WholeWritten, NotWritten> {
        let Whole { gateway, parts, kept, read_at, read_started, checked_unseen } = whole;
        self.forgotten.store(false, Ordering::Release);
        let uid = gateway.uid().unwrap_or_default();
        if self.uid.as_deref() != Some(uid.as_str()) {
            // The Gateway was made again: nothing written for the old one holds.
            self.written.clear();
            self.lane_read_by = None;
            self.uid = Some(uid.clone());
        }
        // The old kept config is let go now, not held beside the new one
        // through the writes (megabytes at 100,000 keys).
        self.kept = None;
        let (changed, now) = {
            let log = self.context.stores.key_log.drained().await;
            (log.changed_between(read_at, log.position()), log.position())
        };
        let keys = changed.map(|changed| changed_keys(&self.context, changed));
        let step = write_order::whole_step(WholeArrives {
            keepable: kept.is_some(),
            lane_wrote_since_read: write_order::lane_wrote_since(self.lane_read_by, read_started),
            changed_since_read: keys.as_ref().map(BTreeSet::len),
        });
        let (parts, kept, verdicts) = match (step, kept) {
            (WholeStep::CompileAgain, _) => return Err(NotWritten::CompileAgain),
            (WholeStep::Write(keep), kept) => {
                let kept = kept.filter(|_| keep != KeepFrom::Nothing).map(|mut kept| {
                    kept.basis.position = if keep == KeepFrom::Now { now } else { read_at };
                    kept
                });
                (parts, kept, BTreeMap::new())
            }
            (WholeStep::PatchIn { otherwise }, Some(mut kept)) => {
                match self.patch_in(&gateway, &mut kept, &keys.unwrap_or_default(), now).await {
                    Ok(verdicts) => (kept.parts.clone(), Some(kept), verdicts),
                    Err(_) if otherwise == Refused::CompileAgain => return Err(NotWritten::CompileAgain),
                    // Written as the reconcile compiled it (`kept` may be half patched).
                    Err(_) => (parts, None, BTreeMap::new()),
                }
            }
            (WholeStep::PatchIn { .. }, None) => unreachable!("whole_step patches only a keepable config"),
        };
        let plan = self.plan(&gateway, &parts);
        if let Some(conflict) = self.foreign(&gateway, &plan, &checked_unseen).await? {
            return Err(NotWritten::Conflict(conflict));
        }
        let written = crate::apply::write_config(&self.context.client, &parts, &plan).await;
        let wrote_at = std::time::Instant::now();
        self.written.note(plan.write.iter().map(String::as_str), written.as_ref().ok().map(|_| &*parts), wrote_at);
        // Emptied: no digest a desired part could match.
        self.written.note(plan.retire.iter().map(String::as_str), None, wrote_at);
        let bytes = written.map_err(NotWritten::Failed)?;
        self.kept = kept;
        Ok(WholeWritten { hash: parts.hash.clone(), verdicts, bytes })
    }

    /// The keys changed since the read compiled alone and patched into
    /// `kept`, which then includes the log up to `now`; their verdicts.
    async fn patch_in(
        &self,
        gateway: &Gateway,
        kept: &mut Kept,
        keys: &BTreeSet<ObjectKey>,
        now: u64,
    ) -> Result<BTreeMap<ObjectKey, KeyVerdict>, NotAlone> {
        let (changes, verdicts) = compile_keys(&self.context, gateway, keys).await?;
        kept.patch(changes)?;
        kept.basis.position = now;
        Ok(verdicts)
    }

    /// Which of `parts` to write and retire: what the store shows, with
    /// what this writer wrote moments ago over it.
    fn plan(&self, gateway: &Gateway, parts: &ConfigParts) -> config_plan::Plan {
        let fresh = self.written.fresh(std::time::Instant::now());
        let namespace = gateway.namespace();
        let store = self.context.stores.config_secrets.state();
        let existing: Vec<_> = store
            .iter()
            .filter(|secret| secret.metadata.namespace == namespace)
            .filter_map(|secret| config_plan::Existing::of(&secret.metadata))
            .map(|mut existing| {
                if let Some(digest) = fresh.get(existing.name) {
                    existing.digest = *digest;
                }
                existing
            })
            .collect();
        config_plan::plan(parts, &existing, gateway.metadata.uid.as_deref().unwrap_or_default())
    }

    /// A config Secret `plan` writes for the first time, not checked by
    /// the reconcile, that belongs to someone else (it may have been made
    /// since the check).
    async fn foreign(
        &self,
        gateway: &Gateway,
        plan: &config_plan::Plan,
        checked: &[String],
    ) -> Result<Option<String>, NotWritten> {
        let unchecked: Vec<String> = plan.unseen.iter().filter(|name| !checked.contains(name)).cloned().collect();
        if unchecked.is_empty() {
            return Ok(None);
        }
        let namespace = gateway.namespace().unwrap_or_default();
        let uid = gateway.metadata.uid.as_deref().unwrap_or_default();
        crate::ownership::first_foreign_secret(&self.context.client, &namespace, &unchecked, uid)
            .await
            .map_err(NotWritten::Failed)
    }

    /// What the key log holds past the kept config, patched and written
    /// when it can be; else the kept config is let go.
    async fn lane_round(&mut self, position: u64) {
        if self.forgotten.load(Ordering::Acquire) {
            self.kept = None;
        }
        let Some(kept) = self.kept.as_ref() else { return };
        let context = self.context.clone();
        let gateway = context.stores.gateways.get(&ObjectRef::new(&self.id.name).within(&self.id.namespace));
        let gateway_now = gateway.as_deref().map(verified_as);
        let keys = match kept.basis.position < position {
            true => {
                let log = context.stores.key_log.drained().await;
                log.changed_between(kept.basis.position, position).map(|changed| changed_keys(&context, changed))
            }
            false => Some(BTreeSet::new()),
        };
        let step = write_order::lane_step(&KeysLogged {
            kept_for: &kept.basis.gateway,
            kept_at: kept.basis.position,
            gateway_now: gateway_now.as_ref(),
            logged_at: position,
            changed: keys.as_ref().map(BTreeSet::len),
        });
        let (gateway, keys) = match (step, gateway, keys) {
            (LaneStep::Nothing, ..) => return,
            (LaneStep::Advance, ..) => {
                if let Some(kept) = self.kept.as_mut() {
                    kept.basis.position = position;
                }
                return;
            }
            (LaneStep::Patch, Some(gateway), Some(keys)) => (gateway, keys),
            (LaneStep::Drop(why), ..) => return self.let_go(&why),
            (LaneStep::Patch, ..) => unreachable!("lane_step patches only a Gateway there, with keys known"),
        };
        self.last_round = Some(Instant::now());
        match self.patch_and_write(&gateway, &keys, position).await {
            Ok(true) => self.last_patch = Some(Instant::now()),
            Ok(false) => {}
            Err(left) => self.let_go(&left),
        }
    }

    fn let_go(&mut self, why: &dyn std::fmt::Debug) {
        tracing::debug!(gateway = %self.id, reason = ?why, "key change left to the whole reconcile");
        self.context.metrics.key_patches.with_label_values(&["left"]).inc();
        self.kept = None;
    }

    /// Patches the kept config with the ApiKeys `keys` as the stores hold
    /// them and writes the shards that changed, then the manifest; whether
    /// it wrote.
    async fn patch_and_write(
        &mut self,
        gateway: &Gateway,
        keys: &BTreeSet<ObjectKey>,
        position: u64,
    ) -> Result<bool, LaneLeft> {
        let started = std::time::Instant::now();
        let (changes, _) = compile_keys(&self.context, gateway, keys).await?;
        let inputs_read = std::time::Instant::now();
        if self.forgotten.load(Ordering::Acquire) {
            return Err(LaneLeft::Forgotten);
        }
        let Some(kept) = self.kept.as_mut() else { return Ok(false) };
        let touched = kept.patch(changes).map_err(NotAlone::from)?;
        kept.basis.position = position;
        if touched.is_empty() {
            return Ok(false);
        }
        let parts = kept.parts.clone();
        let names: Vec<&str> = touched
            .iter()
            .filter_map(|index| parts.shards.get(*index)?.name.as_deref())
            .chain(parts.manifest.metadata.name.as_deref())
            .collect();
        // Only Secrets the store shows as this Gateway's own: one made or
        // taken over by someone else meanwhile is the whole reconcile's to
        // refuse.
        let uid = gateway.metadata.uid.as_deref().unwrap_or_default();
        let stores = &self.context.stores;
        let own = |name: &&str| {
            let secret = stores.config_secrets.get(&ObjectRef::new(name).within(&self.id.namespace));
            secret.is_some_and(|secret| !crate::ownership::foreign(&secret.metadata, uid))
        };
        if !names.iter().all(own) {
            return Err(LaneLeft::NotOwned);
        }
        self.lane_read_by = Some(inputs_read);
        let written = crate::apply::write_patch(&self.context.client, &parts, &touched).await;
        // A failed write leaves what those Secrets hold unknown: the next
        // whole write writes them whatever the store shows.
        self.written.note(names, written.as_ref().ok().map(|_| &*parts), std::time::Instant::now());
        let bytes = written.map_err(NotAlone::from)?;
        let name = self.id.to_string();
        let metrics = &self.context.metrics;
        metrics.key_patches.with_label_values(&["written"]).inc();
        metrics.config_bytes_written.with_label_values(&[&name]).inc_by(bytes as u64);
        metrics.config_writes.with_label_values(&[&name]).inc();
        let hash = parts.hash.clone();
        tracing::info!(gateway = %self.id, config.hash = %hash, keys = keys.len(), shards = touched.len(), "key change written as a patch");
        remember(&self.context, &self.id, |memory| {
            memory.written = Some(Written { hash, at: started, measured: false })
        })
        .await;
        Ok(true)
    }
}

/// Why the lane left a change to the whole reconcile.
#[derive(Debug, thiserror::Error)]
enum LaneLeft {
    #[error(transparent)]
    NotAlone(#[from] NotAlone),
    #[error("a config Secret it would write is not the Gateway's own")]
    NotOwned,
    #[error("the Gateway's objects are not all its own")]
    Forgotten,
}
