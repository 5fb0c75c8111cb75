//! The usage collector: every [`COLLECT_EVERY`], each Gateway's pods' usage
//! reports (`GET /usage` on their admin port, `waycast_crds::usage`) into
//! the Gateway's ledger, and from it:
//!
//! ```text
//! pods ──GET /usage──► Ledger (per Gateway; persisted: ConfigMap <gw>-usage-ledger)
//!                        ├─► ConfigMap <gw>-usage: the baseline the pods count budgets on
//!                        ├─► Gateway.status.usage: this month per namespace
//!                        └─► ApiKey.status.usage: this month per key, summed over
//!                            Gateways, written at most WRITES_PER_SECOND
//! ```
//!
//! Only the leader runs it (it runs with the controllers). A report is
//! taken only from a genuine gateway pod of the Gateway (as heartbeats
//! are), only for a process of that pod, and only when it passes
//! `screen`: within a byte and a key cap, naming only keys the Gateway
//! serves (or its ledger counted this month), every number within
//! bounds. A report past any rule is refused whole: counted, shown in
//! `Gateway.status.usage.refusedReports`, an Event. Only keys the
//! Gateway serves in its current config get a status written, one
//! pending write per key. Usage is written under a field manager of its
//! own, so the reconcilers' status writes neither own nor compare it.

mod key_writes;
pub mod ledger;
mod refused;
mod report;
pub mod screen;
pub mod served;

use std::collections::BTreeMap;
use std::io::Read as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use http_body_util::Empty;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt as _};
use waycast_crds::Gateway;
use waycast_crds::heartbeat::is_gateway_pod;
use waycast_crds::period::Period;
use waycast_crds::usage::{BASELINE_DATA_KEY, GatewayUsageStatus, MAX_STATUS_NAMESPACES, UsageReport, UsageTotals};

use crate::apply::bounded;
use crate::compile::ObjectKey;
use crate::context::Context;
use crate::render::meta::{owned_meta, usage_config_map_name, usage_ledger_name};
use crate::render::selector_labels;
use key_writes::{KeyUsage, KeyWrites, write_key_statuses};
pub use key_writes::{USAGE_MANAGER, WRITES_PER_SECOND};
use ledger::Ledger;
use screen::Refusal;
use served::{Served, served_by};

/// How often the pods are asked. A budget without Redis is passed by at
/// most what the fleet spends beyond its reservations in flight (each
/// process keeps to its share of what was left at the last collection);
/// this sets how stale `status.usage` may be.
pub const COLLECT_EVERY: Duration = Duration::from_secs(5);
/// Gateways whose pods are asked at the same time.
const ASK_GATEWAYS_AT_ONCE: usize = 4;
/// Pods of one Gateway asked at the same time.
const ASK_PODS_AT_ONCE: usize = 4;
/// The longest one Gateway's pods are asked for in a round (each pod has
/// `report::ASK_FOR`): a Gateway whose pods are slow or silent (its
/// author's image, a NetworkPolicy dropping the admin port) gives up its
/// own round, and holds one of the `ASK_GATEWAYS_AT_ONCE` places no longer.
const ASK_GATEWAY_FOR: Duration = Duration::from_secs(15);
/// The ledger's data key in its ConfigMap.
const LEDGER_DATA_KEY: &str = "ledger.json.gz";

/// What the collector holds between rounds: per Gateway
/// (`namespace/name`), its ledger and what of it was last written.
#[derive(Default)]
struct Books {
    gateways: BTreeMap<String, GatewayBook>,
    /// Rounds this process has collected.
    rounds: u32,
}

/// Rounds after the operator starts in which a Gateway not compiled yet
/// holds every key's write back (its keys' sums would be short); after
/// them, such a Gateway (one whose reconcile keeps failing) is left out
/// alone, so it cannot stop every other team's usage.
const WARM_UP_ROUNDS: u32 = 12;

struct GatewayBook {
    /// The budgets' totals of the baseline found when this book was
    /// opened, until the ledger has been raised to them.
    floor: Option<Vec<waycast_crds::usage::BudgetSpend>>,
    ledger: Ledger,
    baseline: Option<String>,
    /// The digest of the ledger as last persisted (or read).
    persisted: Option<u64>,
    /// False when the persisted ledger could not be read: it is never
    /// overwritten by this process (a person may recover it).
    writable: bool,
    status: Option<GatewayUsageStatus>,
    /// The pods whose report was refused in the last round, and why.
    refused: BTreeMap<String, Refusal>,
}

/// Runs the collector and the status writer until the process ends.
pub async fn run(context: Arc<Context>) {
    let writes: Arc<tokio::sync::Mutex<KeyWrites>> = Arc::default();
    let writer = write_key_statuses(context.clone(), writes.clone());
    let collector = async {
        let http: HttpClient<HttpConnector, Empty<Bytes>> = HttpClient::builder(TokioExecutor::new()).build_http();
        let mut books = Books::default();
        let mut tick = tokio::time::interval(COLLECT_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(keys) = collect_round(&context, &http, &mut books).await else { continue };
            let mut writes = writes.lock().await;
            // Keys no Gateway counts any more (deleted, or a new month) are
            // forgotten: one made again under the name gets its own status.
            writes.written.retain(|key, _| keys.contains_key(key));
            // The sum of keys past what a report lists has no ApiKey.
            for (key, usage) in keys.into_iter().filter(|(key, _)| key.contains('/')) {
                if writes.written.get(&key) != Some(&usage.digest()) {
                    writes.queue(key, usage);
                }
            }
        }
    };
    tokio::join!(writer, collector);
}

/// One round over every Gateway; each key's usage over them all, or
/// `None` when a Gateway's ledger could not be read this round (its keys'
/// sums would be short: nothing is written for the keys then).
async fn collect_round(
    context: &Arc<Context>,
    http: &HttpClient<HttpConnector, Empty<Bytes>>,
    books: &mut Books,
) -> Option<BTreeMap<String, KeyUsage>> {
    let now = jiff::Timestamp::now();
    let as_of = now.to_string();
    let as_of_shared: Arc<str> = Arc::from(as_of.as_str());
    // Per key: the sum in nano-units, in the currency and month of the
    // first Gateway (by namespace and name) that counts it.
    let mut keys: BTreeMap<String, KeyUsage> = BTreeMap::new();
    let mut complete = true;
    let mut gateways: Vec<_> = context
        .stores
        .gateways
        .state()
        .into_iter()
        // A Gateway being deleted, or one whose objects' names belong to
        // someone else, gets no usage objects written in its name.
        .filter(|gateway| gateway.metadata.deletion_timestamp.is_none() && !name_conflict(gateway))
        .collect();
    gateways.sort_by_key(|gateway| gateway_id(gateway));
    books.gateways.retain(|id, _| gateways.iter().any(|gateway| gateway_id(gateway) == *id));
    // Per Gateway, the keys its reports may name: none until it has
    // compiled in this process (its pods are asked next round).
    let memory = context.gateways.read().await;
    let gateways: Vec<(Arc<Gateway>, Option<Arc<Served>>)> = gateways
        .into_iter()
        .map(|gateway| {
            let object = ObjectKey { namespace: gateway.namespace().unwrap_or_default(), name: gateway.name_any() };
            let compiled = memory.get(&object).and_then(|memory| memory.compiled.as_ref());
            let ledger = books.gateways.get(&gateway_id(&gateway)).map(|book| &book.ledger);
            let served = compiled.map(|compiled| Arc::new(served_by(compiled, ledger)));
            (gateway, served)
        })
        .collect();
    drop(memory);
    books.rounds = books.rounds.saturating_add(1);
    let (gateways, uncompiled): (Vec<_>, Vec<_>) = gateways.into_iter().partition(|(_, served)| served.is_some());
    if !uncompiled.is_empty() && books.rounds <= WARM_UP_ROUNDS {
        complete = false;
    }
    // Several Gateways' pods asked at once, each ask a task of its own (so
    // it runs on while other Gateways are written), taken as they finish:
    // NB: in order, one Gateway with slow pods held back every one after it.
    let mut answered = futures_util::stream::iter(gateways)
        .map(|(gateway, served)| {
            let (context, http) = (context.clone(), http.clone());
            let asked = tokio::spawn(async move {
                let served = served?;
                let asking = reports(&context, &http, &gateway, served.clone());
                // Out of time counts as a listing that failed: the Gateway's
                // keys still count what its ledger holds, and the round
                // (every other team's writes) goes on.
                let answers = tokio::time::timeout(ASK_GATEWAY_FOR, asking)
                    .await
                    .unwrap_or(Err(crate::error::Error::Timeout(ASK_GATEWAY_FOR)));
                Some((gateway, answers, served))
            });
            async move { asked.await.ok().flatten() }
        })
        .buffer_unordered(ASK_GATEWAYS_AT_ONCE);
    while let Some(answered) = answered.next().await {
        let Some((gateway, answers, served)) = answered else {
            complete = false;
            continue;
        };
        let id = gateway_id(&gateway);
        let budgets = gateway.spec.budgets.as_ref();
        let zone = budgets
            .and_then(|b| b.time_zone.as_deref())
            .and_then(|name| waycast_crds::period::time_zone(name).ok())
            .unwrap_or(jiff::tz::TimeZone::UTC);
        let currency = budgets.and_then(|b| b.currency.clone()).unwrap_or_else(|| "USD".to_owned());
        if !books.gateways.contains_key(&id) {
            // Not read (the API server did not answer): not started from
            // nothing either, which would write over the month; next round.
            let (Ok(loaded), Ok(floor)) = (load_ledger(context, &gateway).await, load_floor(context, &gateway).await)
            else {
                complete = false;
                continue;
            };
            let writable = loaded.is_some();
            let ledger = loaded.unwrap_or_default();
            let persisted = Some(ledger.digest());
            let refused = BTreeMap::new();
            let book = GatewayBook { persisted, ledger, baseline: None, writable, status: None, floor, refused };
            books.gateways.insert(id.clone(), book);
        }
        let Some(book) = books.gateways.get_mut(&id) else { continue };
        match answers {
            Ok((listed, reports, refused)) => {
                refused::refusals(context, &gateway, &mut book.refused, refused).await;
                let everyone = listed.iter().all(|pod| reports.iter().any(|(reported, _)| reported == pod));
                for (pod, report) in reports {
                    book.ledger.record(&pod, report);
                }
                book.ledger.keep_pods(&listed);
                // A ledger lost or behind never tells the pods less than
                // they were last told (once every live pod has reported).
                if everyone && let Some(floor) = book.floor.take() {
                    book.ledger.raise_to(&floor);
                }
            }
            // The keys' totals still count what this Gateway's ledger holds.
            Err(error) => {
                tracing::warn!(gateway = %id, %error, "usage: no reports from the gateway pods this round; retrying")
            }
        }
        let month = Period::Month.window(now, &zone).key;
        let current: Vec<(Period, String)> =
            [Period::Day, Period::Week, Period::Month].into_iter().map(|p| (p, p.window(now, &zone).key)).collect();
        book.ledger.forget_past(&month, &current);
        let mut totals = book.ledger.key_totals(&month);
        // Only keys the Gateway serves now are shown or written: what a
        // ledger holds of anything else (a key gone) stays in the ledger.
        totals.retain(|key, _| match key.strip_prefix(waycast_crds::usage::GRANT_USAGE_PREFIX) {
            Some(grant) => served.serves_grant(grant),
            None => served.serves(key),
        });
        write_gateway(context, &gateway, book, (&totals, &month), &currency, &as_of).await;
        let shown = Arc::new((currency, month));
        let members = book.ledger.members_by_grant();
        for (key, mut used) in totals {
            let grant = key.strip_prefix(waycast_crds::usage::GRANT_USAGE_PREFIX);
            let counted = grant.and_then(|grant| members.get(grant).copied());
            let held = keys.entry(key).or_insert_with(|| KeyUsage {
                totals: UsageTotals::default(),
                members: None,
                shown: shown.clone(),
                as_of: as_of_shared.clone(),
            });
            held.members = counted.map(|n| n.saturating_add(held.members.unwrap_or(0))).or(held.members);
            if held.shown.0 != shown.0 {
                // Money in another currency is not added as if one: that
                // Gateway's cost shows in its own status.usage lines.
                used.cost_nanos = 0;
            }
            held.totals = held.totals.plus(used);
        }
    }
    complete.then_some(keys)
}

/// Whether the Gateway says an object it would own belongs to someone else.
fn name_conflict(gateway: &Gateway) -> bool {
    gateway.status.as_ref().is_some_and(|status| {
        status.conditions.iter().any(|c| c.reason == waycast_crds::condition::reasons::NAME_CONFLICT)
    })
}

fn gateway_id(gateway: &Gateway) -> String {
    format!("{}/{}", gateway.namespace().unwrap_or_default(), gateway.name_any())
}

/// The live genuine pods of `gateway` (names), and the reports of those
/// that answered.
async fn reports(
    context: &Context,
    http: &HttpClient<HttpConnector, Empty<Bytes>>,
    gateway: &Gateway,
    served: Arc<Served>,
) -> Result<Answers, crate::error::Error> {
    let namespace = gateway.namespace().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(context.client.clone(), &namespace);
    let selector = selector_labels(gateway).iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
    let pods = bounded(api.list(&ListParams::default().labels(&selector))).await?;
    let phase = |pod: &Pod| pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
    // Genuine pods whose process may still run: a pod briefly Unknown or
    // Pending keeps its processes in the ledger (retired and then reporting
    // again, a process would count twice); one that ended does not.
    let listed: Vec<&Pod> = pods
        .items
        .iter()
        .filter(|pod| {
            // A pod draining (deletion asked) still serves, and what it
            // spends is counted until it is gone.
            let mut meta = pod.metadata.clone();
            meta.deletion_timestamp = None;
            let uid = meta.uid.clone().unwrap_or_default();
            let ended = matches!(phase(pod).as_str(), "Succeeded" | "Failed");
            !ended && is_gateway_pod(&meta, &uid, &namespace, &gateway.name_any())
        })
        .collect();
    let running: Vec<(String, String)> = listed
        .iter()
        .filter(|pod| phase(pod) == "Running")
        .filter_map(|pod| Some((pod.name_any(), pod.status.as_ref()?.pod_ip.clone()?)))
        .collect();
    let answers: Vec<(String, Result<UsageReport, report::NoReport>)> = futures_util::stream::iter(running)
        .map(|(pod, ip)| {
            let served = served.clone();
            async move {
                let report = report::ask(http, &report::admin_address(&ip), &pod, served, report::ASK_FOR).await;
                if let Err(report::NoReport::Unanswered(error)) = &report {
                    tracing::debug!(%pod, %error, "usage: no report from a gateway pod; asking again next round");
                }
                (pod, report)
            }
        })
        // A few pods at a time: each report is screened as it streams in.
        .buffer_unordered(ASK_PODS_AT_ONCE)
        .collect()
        .await;
    let (mut reports, mut refused) = (Vec::new(), Vec::new());
    for (pod, answer) in answers {
        match answer {
            Ok(report) => reports.push((pod, report)),
            Err(report::NoReport::Refused(refusal)) => refused.push((pod, refusal)),
            Err(report::NoReport::Unanswered(_)) => {}
        }
    }
    Ok((listed.iter().map(|pod| pod.name_any()).collect(), reports, refused))
}

/// The live genuine pods, the reports taken, and the pods whose report was refused.
type Answers = (Vec<String>, Vec<(String, UsageReport)>, Vec<(String, Refusal)>);

/// The budgets' totals of the pods' baseline as written last (`None`
/// when there is none or it does not parse).
///
/// # Errors
/// The API server failing.
async fn load_floor(
    context: &Context,
    gateway: &Gateway,
) -> Result<Option<Vec<waycast_crds::usage::BudgetSpend>>, crate::error::Error> {
    let maps: Api<ConfigMap> = Api::namespaced(context.client.clone(), &gateway.namespace().unwrap_or_default());
    let map = bounded(maps.get_opt(&usage_config_map_name(gateway))).await?;
    let text = map.and_then(|map| map.data).and_then(|mut data| data.remove(BASELINE_DATA_KEY));
    Ok(text.and_then(|text| waycast_crds::usage::UsageBaseline::from_slice(text.as_bytes()).ok()).map(|b| b.budgets))
}

/// The ledger persisted for `gateway`: empty when there is none yet,
/// `None` when it cannot be read (never written over).
///
/// # Errors
/// The API server did not answer.
async fn load_ledger(context: &Context, gateway: &Gateway) -> Result<Option<Ledger>, crate::error::Error> {
    let api: Api<ConfigMap> = Api::namespaced(context.client.clone(), &gateway.namespace().unwrap_or_default());
    let Some(map) = bounded(api.get_opt(&usage_ledger_name(gateway))).await? else {
        return Ok(Some(Ledger::default()));
    };
    let Some(ByteString(compressed)) = map.binary_data.as_ref().and_then(|data| data.get(LEDGER_DATA_KEY)).cloned()
    else {
        return Ok(Some(Ledger::default()));
    };
    let mut text = Vec::new();
    let read = flate2::read::GzDecoder::new(compressed.as_slice())
        .take(u64::try_from(screen::MAX_REPORT_BYTES).unwrap_or(u64::MAX))
        .read_to_end(&mut text);
    let ledger = read.ok().and_then(|_| serde_json::from_slice(&text).ok());
    if ledger.is_none() {
        tracing::error!(
            gateway = %gateway_id(gateway),
            "usage: the persisted ledger is unreadable; counting anew and leaving it as it is"
        );
    }
    Ok(ledger)
}

/// Writes what changed of `gateway`'s usage: the pods' baseline, the
/// persisted ledger, the Gateway's status — each on its own (one that
/// fails, say a document past what a ConfigMap holds, stops none of the
/// others), retried at the next round.
async fn write_gateway(
    context: &Context,
    gateway: &Gateway,
    book: &mut GatewayBook,
    (totals, month): (&BTreeMap<String, UsageTotals>, &str),
    currency: &str,
    as_of: &str,
) {
    let id = gateway_id(gateway);
    let namespace = gateway.namespace().unwrap_or_default();
    let maps: Api<ConfigMap> = Api::namespaced(context.client.clone(), &namespace);
    let params = PatchParams::apply(USAGE_MANAGER).force();
    let baseline = serde_json::to_string(&book.ledger.baseline()).unwrap_or_default();
    if book.baseline.as_deref() != Some(&baseline) {
        let map = ConfigMap {
            metadata: owned_meta(gateway, usage_config_map_name(gateway)),
            data: Some([(BASELINE_DATA_KEY.to_owned(), baseline.clone())].into()),
            ..ConfigMap::default()
        };
        match bounded(maps.patch(&usage_config_map_name(gateway), &params, &Patch::Apply(&map))).await {
            Ok(_) => book.baseline = Some(baseline),
            Err(error) => tracing::warn!(gateway = %id, %error, "usage: cannot write the pods' baseline; retrying"),
        }
    }
    if book.writable && book.persisted != Some(book.ledger.digest()) {
        match persist(&maps, &params, gateway, &book.ledger).await {
            Ok(()) => book.persisted = Some(book.ledger.digest()),
            Err(error) => tracing::warn!(gateway = %id, %error, "usage: cannot persist the ledger; retrying"),
        }
    }
    let namespaces: Vec<_> = ledger::by_namespace(totals)
        .iter()
        .take(MAX_STATUS_NAMESPACES)
        .map(|(namespace, used)| used.namespace_status(namespace))
        .collect();
    let refused_reports = refused::listed(&book.refused);
    let status = GatewayUsageStatus {
        period: month.to_owned(),
        currency: currency.to_owned(),
        as_of: as_of.to_owned(),
        namespaces,
        refused_reports,
    };
    let unchanged = book.status.as_ref().is_some_and(|held| {
        GatewayUsageStatus { as_of: String::new(), ..held.clone() }
            == GatewayUsageStatus { as_of: String::new(), ..status.clone() }
    });
    if !unchanged {
        let gateways: Api<Gateway> = Api::namespaced(context.client.clone(), &namespace);
        let body = serde_json::json!({
            "apiVersion": "waycast.dev/v1alpha1", "kind": "Gateway", "status": {"usage": status},
        });
        match bounded(gateways.patch_status(&gateway.name_any(), &params, &Patch::Apply(body))).await {
            Ok(_) => book.status = Some(status),
            Err(error) => tracing::warn!(gateway = %id, %error, "usage: cannot write the Gateway's status; retrying"),
        }
    }
}

async fn persist(
    maps: &Api<ConfigMap>,
    params: &PatchParams,
    gateway: &Gateway,
    ledger: &Ledger,
) -> Result<(), crate::error::Error> {
    // Written into the compressor as it is made: the whole JSON of 10,000
    // keys was never needed at once.
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    serde_json::to_writer(&mut encoder, ledger)?;
    let map = ConfigMap {
        metadata: owned_meta(gateway, usage_ledger_name(gateway)),
        binary_data: Some([(LEDGER_DATA_KEY.to_owned(), ByteString(encoder.finish()?))].into()),
        ..ConfigMap::default()
    };
    bounded(maps.patch(&usage_ledger_name(gateway), params, &Patch::Apply(&map))).await?;
    Ok(())
}
