//! What each Gateway's configs were compiled from and which of them its
//! pods serve: the bookkeeping behind the `Programmed` condition of
//! ApiKeys, ModelEndpoints and AccessGrants, and the choice of which statuses to look at
//! again after a compile.
//!
//! Every config a Gateway writes takes the next sequence number. Each
//! object's decision remembers `since`, the first config that carried it as
//! it is now (same generation, same outcome, same served entry). An object
//! is programmed once every pod reports a config at or after its `since`.
//! So a config written for one new key leaves the other 10,000 programmed —
//! the new config carries them unchanged — and only the objects whose
//! decision or programmed state moved are announced for a status update,
//! instead of every status of every kind being looked at after every
//! compile (which cost 10,000 reconciles per key added and, with pods
//! reporting, flipped every key's `Programmed` to False and back).

use std::collections::{BTreeMap, VecDeque};
use std::hash::{Hash, Hasher as _};

use crate::compile::keys::KeyVerdict;
use crate::compile::{ObjectKey, Verdict};

/// How many recent configs of a Gateway are remembered: a pod reporting an
/// older one is taken to serve nothing current.
pub const HISTORY: usize = 64;

/// The `since` of a decision no written config carries yet (the compiled
/// config did not fit in a Secret).
pub const NEVER: u64 = u64::MAX;

/// One object's compiled decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The object's generation compiled.
    pub generation: Option<i64>,
    /// Whether the config carries it as the user meant: served, or absent
    /// because the user turned it off (disabled, expired).
    pub as_intended: bool,
    /// A fingerprint of the object's entry in the config (0: none): a
    /// rotated key text changes it without a new generation.
    pub entry: u64,
    /// The sequence number of the first config that carried this decision.
    pub since: u64,
}

impl Decision {
    /// A decision as compile made it; `since` is settled by [`next`].
    pub fn new(generation: Option<i64>, as_intended: bool, entry: u64) -> Self {
        Self { generation, as_intended, entry, since: NEVER }
    }

    fn same_outcome(&self, other: &Self) -> bool {
        (self.generation, self.as_intended, self.entry) == (other.generation, other.as_intended, other.entry)
    }
}

/// A fingerprint of a config entry, for [`Decision::entry`].
pub fn entry_print(entry: &impl Hash) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    entry.hash(&mut hasher);
    hasher.finish()
}

/// What a Gateway's configs were compiled from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CompiledFrom {
    /// The current config's hash.
    pub hash: String,
    /// The current config's sequence number (from 1).
    pub seq: u64,
    /// Recent configs, oldest first: (hash, sequence number).
    pub history: VecDeque<(String, u64)>,
    /// Every pod serves a config at or after this sequence number (0: some
    /// pod serves none we remember, or not every ready pod reports yet).
    pub served_through: u64,
    /// ApiKey → what was compiled, and its verdict. ApiKey statuses read
    /// this instead of compiling again: one compile per Gateway change,
    /// not one per key.
    pub keys: BTreeMap<ObjectKey, Record<KeyVerdict>>,
    /// ModelEndpoint → what was compiled, and its verdict.
    pub models: BTreeMap<ObjectKey, Record<Verdict>>,
    /// AccessGrant → what was compiled, and its verdict.
    pub grants: BTreeMap<ObjectKey, Record<Verdict>>,
}

/// What one compile made of an object: its decision and its verdict, kept
/// under one id (at 100,000 keys, a second map of the same ids was some
/// 10 MB and a copy of every id on every compile).
#[derive(Debug, Clone, PartialEq)]
pub struct Record<V> {
    /// The decision, for `Programmed`.
    pub decision: Decision,
    /// The verdict, for `Accepted`/`Ready`.
    pub verdict: V,
}

impl CompiledFrom {
    /// Whether `decision` is for `generation`, as intended, and in a config
    /// every pod serves.
    pub fn programmed(&self, decision: Option<&Decision>, generation: Option<i64>) -> bool {
        decision.is_some_and(|d| d.generation == generation && d.as_intended && d.since <= self.served_through)
    }

    /// The sequence number of the newest config with `hash`.
    fn seq_of(&self, hash: &str) -> Option<u64> {
        self.history.iter().rev().find(|(known, _)| known == hash).map(|(_, seq)| *seq)
    }
}

/// One compile's outcome, for [`next`].
pub struct Compile {
    /// The hash of the config the pods are to serve.
    pub hash: String,
    /// Whether that config was written (a config too large for a Secret is
    /// not: its decisions are carried by no config).
    pub written: bool,
    /// ApiKey decisions and verdicts.
    pub keys: BTreeMap<ObjectKey, Record<KeyVerdict>>,
    /// ModelEndpoint decisions and verdicts.
    pub models: BTreeMap<ObjectKey, Record<Verdict>>,
    /// AccessGrant decisions and verdicts.
    pub grants: BTreeMap<ObjectKey, Record<Verdict>>,
}

/// Marks the objects a pod reports it left out of the config it serves
/// (`reports`: pod name and entry, from heartbeats of the current config)
/// as refused: such an object is in the config but not served, so it is
/// neither accepted nor programmed, and its status says which pod and why.
pub fn refuse_dropped(
    compiled: &mut crate::compile::Compiled,
    reports: &[(String, waycast_crds::heartbeat::DroppedEntry)],
) {
    use waycast_crds::condition::reasons::REFUSED_BY_GATEWAY;
    for (pod, dropped) in reports {
        let Some((kind, id)) = dropped.entry.split_once(' ') else { continue };
        let Some((namespace, name)) = id.split_once('/') else { continue };
        let key = ObjectKey { namespace: namespace.to_owned(), name: name.to_owned() };
        let message = format!("gateway pod {pod} left it out of the config it serves: {}", dropped.reason);
        match kind {
            "model" => {
                if let Some(verdict) = compiled.models.get_mut(&key).filter(|v| v.accepted) {
                    *verdict = Verdict::refused(REFUSED_BY_GATEWAY, message);
                }
            }
            "key" => {
                if let Some(verdict) = compiled.keys.get_mut(&key).filter(|v| v.verdict.accepted) {
                    verdict.verdict = Verdict::refused(REFUSED_BY_GATEWAY, message);
                }
            }
            "grant" => {
                if let Some(verdict) = compiled.grants.get_mut(&key).filter(|v| v.accepted) {
                    *verdict = Verdict::refused(REFUSED_BY_GATEWAY, message);
                }
            }
            _ => {}
        }
    }
}

/// The Gateway's pods as the operator sees them.
pub struct Pods<'a> {
    /// The config hash each pod's heartbeat reports.
    pub reporting: &'a [String],
    /// Ready replicas: every one of them must report.
    pub ready: i32,
}

/// Objects whose status may read differently now.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// ApiKeys.
    pub keys: Vec<ObjectKey>,
    /// ModelEndpoints.
    pub models: Vec<ObjectKey>,
    /// AccessGrants.
    pub grants: Vec<ObjectKey>,
}

/// The bookkeeping after `compile`, given the previous one, and the objects
/// whose decision, verdict or programmed state changed.
pub fn next(previous: Option<&CompiledFrom>, compile: Compile, pods: &Pods<'_>) -> (CompiledFrom, Moved) {
    let empty = CompiledFrom::default();
    let previous = previous.unwrap_or(&empty);
    let seq = if previous.seq > 0 && previous.hash == compile.hash { previous.seq } else { previous.seq + 1 };
    let mut history = previous.history.clone();
    if history.back().is_none_or(|(hash, _)| *hash != compile.hash) {
        history.push_back((compile.hash.clone(), seq));
    }
    while history.len() > HISTORY {
        history.pop_front();
    }
    let since = if compile.written { seq } else { NEVER };
    let mut next = CompiledFrom {
        hash: compile.hash,
        seq,
        history,
        served_through: 0,
        keys: carried_since(compile.keys, &previous.keys, since),
        models: carried_since(compile.models, &previous.models, since),
        grants: carried_since(compile.grants, &previous.grants, since),
    };
    next.served_through = served_through(&next, pods);
    let moved = Moved {
        keys: moved(previous, &next, |c| &c.keys),
        models: moved(previous, &next, |c| &c.models),
        grants: moved(previous, &next, |c| &c.grants),
    };
    (next, moved)
}

/// `records` with each decision's `since`: its previous one's when the
/// outcome is the same, else `since`. Both maps are in id order and walked
/// at once (a look-up of each of 100,000 ids in the other map was most of
/// [`next`]).
fn carried_since<V>(
    records: BTreeMap<ObjectKey, Record<V>>,
    before: &BTreeMap<ObjectKey, Record<V>>,
    since: u64,
) -> BTreeMap<ObjectKey, Record<V>> {
    let mut before = before.iter().peekable();
    records
        .into_iter()
        .map(|(id, mut record)| {
            while before.next_if(|(old_id, _)| **old_id < id).is_some() {}
            let old = before.next_if(|(old_id, _)| **old_id == id).map(|(_, old)| &old.decision);
            record.decision.since = match old {
                Some(old) if old.same_outcome(&record.decision) => old.since,
                _ => since,
            };
            (id, record)
        })
        .collect()
}

/// The oldest config any pod serves, if every ready pod reports one we know.
fn served_through(compiled: &CompiledFrom, pods: &Pods<'_>) -> u64 {
    let reporting = i32::try_from(pods.reporting.len()).unwrap_or(i32::MAX);
    if pods.reporting.is_empty() || reporting < pods.ready {
        return 0;
    }
    pods.reporting.iter().map(|hash| compiled.seq_of(hash).unwrap_or(0)).min().unwrap_or(0)
}

/// Objects in either `before` or `after` whose decision, verdict or
/// programmed state differs between them.
fn moved<V: PartialEq>(
    before: &CompiledFrom,
    after: &CompiledFrom,
    records: impl Fn(&CompiledFrom) -> &BTreeMap<ObjectKey, Record<V>>,
) -> Vec<ObjectKey> {
    // What a status shows of a record: its decision's outcome, whether it
    // is programmed, and its verdict.
    let shown = |compiled: &CompiledFrom, record: &Record<V>| {
        let d = &record.decision;
        let programmed = d.as_intended && d.since <= compiled.served_through;
        (d.generation, d.as_intended, d.entry, programmed)
    };
    joined(records(before).iter(), records(after).iter())
        .filter(|(_, was, is)| {
            let was = was.map(|record| (shown(before, record), &record.verdict));
            let is = is.map(|record| (shown(after, record), &record.verdict));
            was != is
        })
        .map(|(id, _, _)| id.clone())
        .collect()
}

/// Two sequences in ascending id order (each id at most once in each),
/// walked at once: every id of either, with what each holds of it.
fn joined<'a, A, B>(
    left: impl Iterator<Item = (&'a ObjectKey, A)>,
    right: impl Iterator<Item = (&'a ObjectKey, B)>,
) -> impl Iterator<Item = (&'a ObjectKey, Option<A>, Option<B>)> {
    let (mut left, mut right) = (left.peekable(), right.peekable());
    std::iter::from_fn(move || {
        let order = match (left.peek(), right.peek()) {
            (None, None) => return None,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some((l, _)), Some((r, _))) => l.cmp(r),
        };
        Some(match order {
            std::cmp::Ordering::Less => left.next().map(|(id, a)| (id, Some(a), None))?,
            std::cmp::Ordering::Greater => right.next().map(|(id, b)| (id, None, Some(b)))?,
            std::cmp::Ordering::Equal => {
                let (id, a) = left.next()?;
                let (_, b) = right.next()?;
                (id, Some(a), Some(b))
            }
        })
    })
}

/// What `compiled` decided about each object, for the `Programmed`
/// bookkeeping. Its verdicts are moved out: `compiled.keys`,
/// `compiled.models` and `compiled.grants` are empty after. A key's
/// generation is the one its verdict was compiled at; `catalog` gives the
/// models' and the grants' (the catalog `compiled` came from).
pub fn decisions(
    catalog: &crate::catalog::Catalog,
    compiled: &mut crate::compile::Compiled,
    hash: String,
    written: bool,
) -> Compile {
    use std::collections::HashMap;
    let model_generations: HashMap<(&str, &str), Option<i64>> =
        catalog.models.iter().map(|m| (ObjectKey::sort_key(&m.metadata), m.metadata.generation)).collect();
    let model_entries: HashMap<(&str, &str), u64> = compiled
        .config
        .models
        .iter()
        .filter_map(|m| Some((m.source.as_deref()?.split_once('/')?, entry_print(m))))
        .collect();
    // The config's keys by id, in the verdicts' order (compile lists them
    // so: the sort finds them sorted in one pass), walked beside them: a
    // map of 100,000 entries built and looked up on every compile was
    // most of this function.
    let mut key_entries: Vec<((&str, &str), &waycast_crds::config::KeyConfig)> =
        compiled.config.keys.iter().filter_map(|k| Some((k.id.split_once('/')?, k))).collect();
    key_entries.sort_unstable_by_key(|(at, _)| *at);
    let mut key_entries = key_entries.into_iter().peekable();
    let turned_off = |reason: &str| {
        reason == waycast_crds::condition::reasons::DISABLED || reason == waycast_crds::condition::reasons::EXPIRED
    };
    // The verdicts are moved in, not copied: at 100,000 keys they are the
    // bulk of a compile's result.
    let keys = std::mem::take(&mut compiled.keys)
        .into_iter()
        .map(|(id, verdict)| {
            let as_intended = verdict.verdict.accepted || turned_off(verdict.verdict.reason);
            while key_entries.next_if(|(at, _)| *at < id.as_pair()).is_some() {}
            let entry = key_entries.next_if(|(at, _)| *at == id.as_pair()).map_or(0, |(_, key)| entry_print(key));
            let decision = Decision::new(verdict.generation, as_intended, entry);
            (id, Record { decision, verdict })
        })
        .collect();
    let models = std::mem::take(&mut compiled.models)
        .into_iter()
        .map(|(id, verdict)| {
            let generation = model_generations.get(&id.as_pair()).copied().flatten();
            let entry = model_entries.get(&id.as_pair()).copied().unwrap_or(0);
            let decision = Decision::new(generation, verdict.accepted, entry);
            (id, Record { decision, verdict })
        })
        .collect();
    let grant_generations: HashMap<(&str, &str), Option<i64>> =
        catalog.grants.iter().map(|g| (ObjectKey::sort_key(&g.metadata), g.metadata.generation)).collect();
    let grant_entries: HashMap<(&str, &str), u64> =
        compiled.config.grants.iter().filter_map(|g| Some((g.id.split_once('/')?, entry_print(g)))).collect();
    let grants = std::mem::take(&mut compiled.grants)
        .into_iter()
        .map(|(id, verdict)| {
            let generation = grant_generations.get(&id.as_pair()).copied().flatten();
            let entry = grant_entries.get(&id.as_pair()).copied().unwrap_or(0);
            // A grant is as intended only when served: it has no switch
            // that turns it off as a key's `disabled` does.
            let decision = Decision::new(generation, verdict.accepted, entry);
            (id, Record { decision, verdict })
        })
        .collect();
    Compile { hash, written, keys, models, grants }
}

/// What a reconcile learned from its pods, between apply and status: the
/// objects some pod left out of the served config marked refused, the
/// decisions to keep, and the figures the Gateway's status shows.
pub struct Settled {
    /// The decisions to keep (see [`next`]).
    pub decisions: Compile,
    /// The config hash each genuine heartbeat reports.
    pub reporting: Vec<String>,
    /// Pods refusing the config `hash`.
    pub refusing: Vec<crate::status::RefusingPod>,
    /// Pods serving `hash`.
    pub up_to_date: usize,
}

/// The pure step after a Gateway's apply: `beats` are its pods' genuine
/// heartbeats, `hash` the config they are to serve, `written` whether it
/// was written. The verdicts move from `compiled` into the decisions
/// ([`decisions`]).
pub fn settle(
    catalog: &crate::catalog::Catalog,
    compiled: &mut crate::compile::Compiled,
    beats: &[crate::heartbeats::Heartbeat],
    hash: &str,
    written: bool,
) -> Settled {
    use crate::heartbeats::{dropping, refusing, reporting};
    refuse_dropped(compiled, &dropping(beats, hash));
    let reporting = reporting(beats);
    let up_to_date = reporting.iter().filter(|serving| *serving == hash).count();
    Settled {
        decisions: decisions(catalog, compiled, hash.to_owned(), written),
        refusing: refusing(beats, hash),
        reporting,
        up_to_date,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> ObjectKey {
        ObjectKey { namespace: "team".into(), name: name.into() }
    }

    fn served() -> KeyVerdict {
        KeyVerdict {
            verdict: Verdict::accepted("KeyReady", "the key is served"),
            key_prefix: None,
            generation: Some(1),
        }
    }

    /// A compile of `hash` serving each named key at generation 1.
    fn compile(hash: &str, names: &[&str]) -> Compile {
        Compile {
            hash: hash.into(),
            written: true,
            keys: names.iter().map(|n| (id(n), record(entry_print(n)))).collect(),
            models: BTreeMap::new(),
            grants: BTreeMap::new(),
        }
    }

    /// A served key's record at generation 1 with entry `entry`.
    fn record(entry: u64) -> Record<KeyVerdict> {
        Record { decision: Decision::new(Some(1), true, entry), verdict: served() }
    }

    fn pods(reporting: &[String]) -> Pods<'_> {
        Pods { reporting, ready: i32::try_from(reporting.len()).unwrap_or(0) }
    }

    fn programmed(compiled: &CompiledFrom, name: &str) -> bool {
        compiled.programmed(compiled.keys.get(&id(name)).map(|r| &r.decision), Some(1))
    }

    #[test]
    fn a_new_key_leaves_the_others_programmed_and_moves_only_itself() {
        let (first, moved) = next(None, compile("h1", &["a", "b"]), &pods(&["h1".into()]));
        assert_eq!(moved.keys, [id("a"), id("b")]);
        assert!(programmed(&first, "a") && programmed(&first, "b"));

        // The pods still serve h1 while h2 (with c) is being loaded.
        let (second, moved) = next(Some(&first), compile("h2", &["a", "b", "c"]), &pods(&["h1".into()]));
        assert_eq!(moved.keys, [id("c")]);
        assert!(programmed(&second, "a") && programmed(&second, "b"));
        assert!(!programmed(&second, "c"));

        // Every pod reports h2: c alone becomes programmed.
        let (third, moved) = next(Some(&second), compile("h2", &["a", "b", "c"]), &pods(&["h2".into(), "h2".into()]));
        assert_eq!(moved.keys, [id("c")]);
        assert!(programmed(&third, "c"));
    }

    #[test]
    fn one_pod_behind_keeps_newer_decisions_unprogrammed() {
        let (first, _) = next(None, compile("h1", &["a"]), &pods(&["h1".into()]));
        let (second, _) = next(Some(&first), compile("h2", &["a", "b"]), &pods(&["h2".into(), "h1".into()]));
        assert!(programmed(&second, "a"));
        assert!(!programmed(&second, "b"));
        // A ready pod that does not report yet holds everything back.
        let (third, moved) =
            next(Some(&second), compile("h2", &["a", "b"]), &Pods { reporting: &["h2".into()], ready: 2 });
        assert!(!programmed(&third, "a"));
        assert_eq!(moved.keys, [id("a")]);
        // A pod reporting a config nobody remembers serves nothing current.
        let (fourth, _) = next(Some(&third), compile("h2", &["a", "b"]), &pods(&["h0".into()]));
        assert!(!programmed(&fourth, "a"));
    }

    #[test]
    fn a_changed_entry_without_a_new_generation_waits_for_the_pods() {
        let (first, _) = next(None, compile("h1", &["a"]), &pods(&["h1".into()]));
        let mut rotated = compile("h2", &["a"]);
        rotated.keys.insert(id("a"), record(entry_print(&"new text")));
        let (second, moved) = next(Some(&first), rotated, &pods(&["h1".into()]));
        assert_eq!(moved.keys, [id("a")]);
        assert!(!programmed(&second, "a"));
    }

    #[test]
    fn removed_objects_move_and_an_unwritten_config_programs_nothing_new() {
        let (first, _) = next(None, compile("h1", &["a", "b"]), &pods(&["h1".into()]));
        let (second, moved) = next(Some(&first), compile("h2", &["a"]), &pods(&["h1".into()]));
        assert_eq!(moved.keys, [id("b")]);
        let mut too_large = compile("h2", &["a", "c"]);
        too_large.written = false;
        let (third, _) = next(Some(&second), too_large, &pods(&["h2".into()]));
        assert!(programmed(&third, "a"));
        assert!(!programmed(&third, "c"));
    }

    /// An entry a pod could not build is refused with the pod's reason;
    /// reports of objects the config does not serve, or not `kind ns/name`,
    /// change nothing.
    #[test]
    fn an_entry_a_pod_left_out_is_refused_with_its_reason() {
        use waycast_crds::heartbeat::DroppedEntry;
        let mut compiled = crate::compile::Compiled {
            config: waycast_crds::GatewayConfig::empty(),
            models: [(id("vision"), Verdict::accepted("Accepted", "served"))].into(),
            keys: [(id("a"), served()), (id("b"), served())].into(),
            grants: [(id("ml"), Verdict::accepted("Accepted", "the grant is served"))].into(),
            gateway: None,
            tenants: Vec::new(),
        };
        let report = |entry: &str| {
            ("gw-0".to_owned(), DroppedEntry { entry: entry.into(), reason: "backends[0].tls: bad".into() })
        };
        let reports = [
            report("model team/vision"),
            report("key team/a"),
            report("key other/a"),
            report("grant team/ml"),
            report("garbage"),
        ];
        refuse_dropped(&mut compiled, &reports);
        let model = &compiled.models[&id("vision")];
        assert_eq!((model.accepted, model.reason), (false, "RefusedByGateway"));
        assert!(model.message.contains("gw-0") && model.message.contains("backends[0].tls: bad"), "{}", model.message);
        assert!(!compiled.keys[&id("a")].verdict.accepted);
        assert!(compiled.keys[&id("b")].verdict.accepted);
        let grant = &compiled.grants[&id("ml")];
        assert_eq!((grant.accepted, grant.reason), (false, "RefusedByGateway"));
    }

    /// A grant of `team` at `generation`, for the catalog.
    fn access_grant(name: &str, generation: i64) -> std::sync::Arc<waycast_crds::AccessGrant> {
        let spec = waycast_crds::AccessGrantSpec { provider: "corp".into(), ..Default::default() };
        let mut grant = waycast_crds::AccessGrant::new(name, spec);
        grant.metadata.namespace = Some("team".into());
        grant.metadata.generation = Some(generation);
        std::sync::Arc::new(grant)
    }

    /// Grants are recorded as models are: each with its object's
    /// generation and its own config entry's fingerprint, served ones as
    /// intended and refused ones not; a grant whose entry changed is the
    /// one announced, and it is programmed once every pod serves it.
    #[test]
    fn grants_are_recorded_and_announced_as_models_are() {
        use waycast_crds::config::GrantConfig;
        let catalog = crate::catalog::Catalog {
            grants: vec![access_grant("ml", 2), access_grant("unknown", 3)],
            ..crate::catalog::Catalog::default()
        };
        let compiled = |groups: &[&str]| {
            let mut entry = GrantConfig::new("team/ml", "corp");
            entry.groups = groups.iter().map(|g| (*g).to_owned()).collect();
            let mut config = waycast_crds::GatewayConfig::empty();
            config.grants = vec![entry];
            crate::compile::Compiled {
                config,
                models: BTreeMap::new(),
                keys: BTreeMap::new(),
                grants: [
                    (id("ml"), Verdict::accepted("Accepted", "the grant is served")),
                    (id("unknown"), Verdict::refused("UnknownProvider", "no such provider")),
                ]
                .into(),
                gateway: None,
                tenants: Vec::new(),
            }
        };
        let mut first = compiled(&["ml"]);
        let decided = decisions(&catalog, &mut first, "h1".into(), true);
        assert!(first.grants.is_empty(), "the verdicts are moved, not copied");
        let ml = decided.grants[&id("ml")].decision;
        assert_eq!((ml.generation, ml.as_intended), (Some(2), true));
        assert_eq!(ml.entry, entry_print(&first.config.grants[0]));
        let unknown = decided.grants[&id("unknown")].decision;
        assert_eq!((unknown.generation, unknown.as_intended, unknown.entry), (Some(3), false, 0));

        let (one, moved) = next(None, decided, &pods(&["h1".into()]));
        assert_eq!(moved.grants, [id("ml"), id("unknown")]);
        assert!(moved.keys.is_empty() && moved.models.is_empty());
        let grant_programmed = |from: &CompiledFrom, name: &str, generation| {
            from.programmed(from.grants.get(&id(name)).map(|r| &r.decision), Some(generation))
        };
        assert!(grant_programmed(&one, "ml", 2));
        assert!(!grant_programmed(&one, "unknown", 3), "a refused grant is never programmed");

        // Its members changed: only it moves, and waits for the pods.
        let mut second = compiled(&["ml", "research"]);
        let decided = decisions(&catalog, &mut second, "h2".into(), true);
        let (two, moved) = next(Some(&one), decided, &pods(&["h1".into()]));
        assert_eq!(moved.grants, [id("ml")]);
        assert!(!grant_programmed(&two, "ml", 2));
        let decided = decisions(&catalog, &mut compiled(&["ml", "research"]), "h2".into(), true);
        let (three, moved) = next(Some(&two), decided, &pods(&["h2".into()]));
        assert_eq!(moved.grants, [id("ml")]);
        assert!(grant_programmed(&three, "ml", 2));
    }

    #[test]
    fn a_config_returning_to_an_earlier_hash_counts_as_the_newest() {
        let (first, _) = next(None, compile("h1", &["a"]), &pods(&["h1".into()]));
        let (second, _) = next(Some(&first), compile("h2", &["a", "b"]), &pods(&["h1".into()]));
        let (third, _) = next(Some(&second), compile("h1", &["a"]), &pods(&["h1".into()]));
        assert_eq!(third.seq, 3);
        assert_eq!(third.served_through, 3);
        assert!(programmed(&third, "a"));
    }

    /// Each key's decision takes its own config entry's fingerprint and its
    /// verdict's generation, with namespaces that sort differently as
    /// `namespace/name` text than as pairs (`a-b/x` < `a/x`, yet `a` < `a-b`),
    /// and a refused key (no entry) between served ones.
    #[test]
    fn decisions_take_each_key_its_own_entry() {
        use waycast_crds::config::KeyConfig;
        let key = |namespace: &str, name: &str| ObjectKey { namespace: namespace.into(), name: name.into() };
        let entry = |id: &str, sha: char| KeyConfig::new(id, sha.to_string().repeat(64));
        let mut config = waycast_crds::GatewayConfig::empty();
        // Compile's order: by (namespace, name).
        config.keys = vec![entry("a/x", '1'), entry("a/z", '3'), entry("a-b/x", '2')];
        let refused = KeyVerdict {
            verdict: Verdict::refused("Disabled", "spec.disabled is true"),
            key_prefix: None,
            generation: Some(4),
        };
        let served_at = |generation| KeyVerdict { generation: Some(generation), ..served() };
        let mut compiled = crate::compile::Compiled {
            config: config.clone(),
            models: BTreeMap::new(),
            keys: [
                (key("a", "x"), served_at(1)),
                (key("a", "y"), refused),
                (key("a", "z"), served_at(3)),
                (key("a-b", "x"), served_at(2)),
            ]
            .into(),
            grants: BTreeMap::new(),
            gateway: None,
            tenants: Vec::new(),
        };
        let decided = decisions(&crate::catalog::Catalog::default(), &mut compiled, "h".into(), true);
        let decision = |namespace: &str, name: &str| decided.keys[&key(namespace, name)].decision;
        for (at, (namespace, name)) in [("a/x", ("a", "x")), ("a/z", ("a", "z")), ("a-b/x", ("a-b", "x"))] {
            let own = config.keys.iter().find(|k| k.id == at).map(entry_print);
            assert_eq!(Some(decision(namespace, name).entry), own, "{at}");
        }
        assert_eq!(decision("a", "y").entry, 0, "a refused key has no entry");
        assert!(decision("a", "y").as_intended, "disabled is as intended");
        let generations: Vec<_> = decided.keys.values().map(|r| r.decision.generation).collect();
        assert_eq!(generations, [Some(1), Some(4), Some(3), Some(2)]);
        assert!(compiled.keys.is_empty(), "the verdicts are moved, not copied");
    }

    /// Two id-ordered sequences walked at once give every id of either,
    /// once, in order, with what each side holds.
    #[test]
    fn joined_walks_both_sides_in_order() {
        let ids = [id("a"), id("b"), id("c"), id("d")];
        let left = [(&ids[0], 1), (&ids[2], 3)];
        let right = [(&ids[1], 'b'), (&ids[2], 'c'), (&ids[3], 'd')];
        let walked: Vec<_> =
            joined(left.into_iter(), right.into_iter()).map(|(id, l, r)| (id.name.as_str(), l, r)).collect();
        assert_eq!(
            walked,
            [("a", Some(1), None), ("b", None, Some('b')), ("c", Some(3), Some('c')), ("d", None, Some('d'))]
        );
    }
}
