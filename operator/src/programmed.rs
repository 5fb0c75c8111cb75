//! What each Gateway's configs were compiled from and which of them its
//! pods serve: the bookkeeping behind the `Programmed` condition of
//! ApiKeys and ModelEndpoints, and the choice of which statuses to look at
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
    /// ApiKey → what was compiled.
    pub keys: BTreeMap<ObjectKey, Decision>,
    /// ModelEndpoint → what was compiled.
    pub models: BTreeMap<ObjectKey, Decision>,
    /// ApiKey → its verdict. ApiKey statuses read this instead of compiling
    /// again: one compile per Gateway change, not one per key.
    pub key_verdicts: BTreeMap<ObjectKey, KeyVerdict>,
    /// ModelEndpoint → its verdict.
    pub model_verdicts: BTreeMap<ObjectKey, Verdict>,
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
    /// ApiKey decisions.
    pub keys: BTreeMap<ObjectKey, Decision>,
    /// ModelEndpoint decisions.
    pub models: BTreeMap<ObjectKey, Decision>,
    /// ApiKey verdicts.
    pub key_verdicts: BTreeMap<ObjectKey, KeyVerdict>,
    /// ModelEndpoint verdicts.
    pub model_verdicts: BTreeMap<ObjectKey, Verdict>,
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
    let settle = |decisions: BTreeMap<ObjectKey, Decision>, before: &BTreeMap<ObjectKey, Decision>| {
        decisions
            .into_iter()
            .map(|(id, mut decision)| {
                decision.since = match before.get(&id) {
                    Some(old) if old.same_outcome(&decision) => old.since,
                    _ => since,
                };
                (id, decision)
            })
            .collect::<BTreeMap<_, _>>()
    };
    let mut next = CompiledFrom {
        hash: compile.hash,
        seq,
        history,
        served_through: 0,
        keys: settle(compile.keys, &previous.keys),
        models: settle(compile.models, &previous.models),
        key_verdicts: compile.key_verdicts,
        model_verdicts: compile.model_verdicts,
    };
    next.served_through = served_through(&next, pods);
    let moved = Moved {
        keys: moved(previous, &next, |c| &c.keys, |c| &c.key_verdicts),
        models: moved(previous, &next, |c| &c.models, |c| &c.model_verdicts),
    };
    (next, moved)
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
    decisions: impl Fn(&CompiledFrom) -> &BTreeMap<ObjectKey, Decision>,
    verdicts: impl Fn(&CompiledFrom) -> &BTreeMap<ObjectKey, V>,
) -> Vec<ObjectKey> {
    let outcome = |compiled: &CompiledFrom, id: &ObjectKey| {
        decisions(compiled).get(id).map(|d| {
            let programmed = d.as_intended && d.since <= compiled.served_through;
            (d.generation, d.as_intended, d.entry, programmed)
        })
    };
    let mut ids: Vec<&ObjectKey> = decisions(after).keys().chain(decisions(before).keys()).collect();
    ids.sort();
    ids.dedup();
    ids.into_iter()
        .filter(|id| outcome(before, id) != outcome(after, id) || verdicts(before).get(*id) != verdicts(after).get(*id))
        .cloned()
        .collect()
}

/// What `compiled` decided about each object, for the `Programmed`
/// bookkeeping (the verdict maps are moved out of `compiled`: at 10,000
/// keys they are the bulk of it).
pub fn decisions(
    catalog: &crate::catalog::Catalog,
    compiled: &mut crate::compile::Compiled,
    hash: String,
    written: bool,
) -> Compile {
    use std::collections::HashMap;
    use std::fmt::Write as _;
    // Borrowed keys throughout: this runs over every key on every compile.
    let key_generations: HashMap<(&str, &str), Option<i64>> =
        catalog.keys.iter().map(|k| (ObjectKey::sort_key(&k.metadata), k.metadata.generation)).collect();
    let model_generations: HashMap<(&str, &str), Option<i64>> =
        catalog.models.iter().map(|m| (ObjectKey::sort_key(&m.metadata), m.metadata.generation)).collect();
    let key_entries: HashMap<&str, u64> =
        compiled.config.keys.iter().map(|k| (k.id.as_str(), entry_print(k))).collect();
    let model_entries: HashMap<&str, u64> =
        compiled.config.models.iter().filter_map(|m| Some((m.source.as_deref()?, entry_print(m)))).collect();
    let mut id_text = String::new();
    let mut entry_of = |entries: &HashMap<&str, u64>, id: &ObjectKey| {
        id_text.clear();
        let _ = write!(id_text, "{id}");
        entries.get(id_text.as_str()).copied().unwrap_or(0)
    };
    let turned_off = |reason: &str| {
        reason == waycast_crds::condition::reasons::DISABLED || reason == waycast_crds::condition::reasons::EXPIRED
    };
    let mut keys = BTreeMap::new();
    for (id, v) in &compiled.keys {
        let as_intended = v.verdict.accepted || turned_off(v.verdict.reason);
        let generation = key_generations.get(&(id.namespace.as_str(), id.name.as_str())).copied().flatten();
        keys.insert(id.clone(), Decision::new(generation, as_intended, entry_of(&key_entries, id)));
    }
    let mut models = BTreeMap::new();
    for (id, v) in &compiled.models {
        let generation = model_generations.get(&(id.namespace.as_str(), id.name.as_str())).copied().flatten();
        models.insert(id.clone(), Decision::new(generation, v.accepted, entry_of(&model_entries, id)));
    }
    Compile {
        hash,
        written,
        keys,
        models,
        key_verdicts: std::mem::take(&mut compiled.keys),
        model_verdicts: compiled.models.clone(),
    }
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
/// was written.
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
        KeyVerdict { verdict: Verdict::accepted("KeyReady", "the key is served"), key_prefix: None }
    }

    /// A compile of `hash` serving each named key at generation 1.
    fn compile(hash: &str, names: &[&str]) -> Compile {
        Compile {
            hash: hash.into(),
            written: true,
            keys: names.iter().map(|n| (id(n), Decision::new(Some(1), true, entry_print(n)))).collect(),
            models: BTreeMap::new(),
            key_verdicts: names.iter().map(|n| (id(n), served())).collect(),
            model_verdicts: BTreeMap::new(),
        }
    }

    fn pods(reporting: &[String]) -> Pods<'_> {
        Pods { reporting, ready: i32::try_from(reporting.len()).unwrap_or(0) }
    }

    fn programmed(compiled: &CompiledFrom, name: &str) -> bool {
        compiled.programmed(compiled.keys.get(&id(name)), Some(1))
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
        rotated.keys.insert(id("a"), Decision::new(Some(1), true, entry_print(&"new text")));
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
            gateway: None,
            tenants: Vec::new(),
        };
        let report = |entry: &str| {
            ("gw-0".to_owned(), DroppedEntry { entry: entry.into(), reason: "backends[0].tls: bad".into() })
        };
        let reports = [report("model team/vision"), report("key team/a"), report("key other/a"), report("garbage")];
        refuse_dropped(&mut compiled, &reports);
        let model = &compiled.models[&id("vision")];
        assert_eq!((model.accepted, model.reason), (false, "RefusedByGateway"));
        assert!(model.message.contains("gw-0") && model.message.contains("backends[0].tls: bad"), "{}", model.message);
        assert!(!compiled.keys[&id("a")].verdict.accepted);
        assert!(compiled.keys[&id("b")].verdict.accepted);
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
}
