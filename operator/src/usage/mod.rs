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
//! are) and only for a process of that pod: a pod cannot report for
//! another. Usage is written under a field manager of its own, so the
//! reconcilers' status writes neither own nor compare it.

pub mod ledger;

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt as _};
use waycast_crds::heartbeat::is_gateway_pod;
use waycast_crds::period::Period;
use waycast_crds::usage::{
    BASELINE_DATA_KEY, GatewayUsageStatus, KeyUsageStatus, MAX_STATUS_NAMESPACES, UsageReport, UsageTotals,
};
use waycast_crds::{ApiKey, Gateway};

use crate::apply::bounded;
use crate::context::Context;
use crate::render::meta::{ADMIN_PORT, owned_meta, usage_config_map_name, usage_ledger_name};
use crate::render::selector_labels;
use ledger::Ledger;

/// How often the pods are asked. A budget without Redis is passed by at
/// most what the fleet spends beyond its reservations in flight (each
/// process keeps to its share of what was left at the last collection);
/// this sets how stale `status.usage` may be.
pub const COLLECT_EVERY: Duration = Duration::from_secs(5);
/// The most `ApiKey.status.usage` writes a second (10,000 keys active:
/// each written about every 8 minutes).
pub const WRITES_PER_SECOND: u32 = 20;
/// The field manager of usage writes.
pub const USAGE_MANAGER: &str = "waycast-usage";
/// The largest report taken from a pod.
const MAX_REPORT_BYTES: usize = 16 * 1024 * 1024;
/// Gateways whose pods are asked at the same time.
const ASK_GATEWAYS_AT_ONCE: usize = 4;
/// The ledger's data key in its ConfigMap.
const LEDGER_DATA_KEY: &str = "ledger.json.gz";

/// What the collector holds between rounds: per Gateway
/// (`namespace/name`), its ledger and what of it was last written.
#[derive(Default)]
struct Books {
    gateways: BTreeMap<String, GatewayBook>,
}

/// The key statuses to write, in the order they changed (each key once,
/// its newest status), and those written (per ApiKey `namespace/name`).
#[derive(Default)]
struct KeyWrites {
    pending: BTreeMap<String, KeyUsageStatus>,
    order: std::collections::VecDeque<String>,
    written: BTreeMap<String, KeyUsageStatus>,
}

impl KeyWrites {
    fn queue(&mut self, key: String, status: KeyUsageStatus) {
        if self.pending.insert(key.clone(), status).is_none() {
            self.order.push_back(key);
        }
    }

    fn next(&mut self) -> Option<(String, KeyUsageStatus)> {
        let key = self.order.pop_front()?;
        let status = self.pending.remove(&key)?;
        Some((key, status))
    }
}

struct GatewayBook {
    ledger: Ledger,
    baseline: Option<String>,
    persisted: Option<Ledger>,
    /// False when the persisted ledger could not be read: it is never
    /// overwritten by this process (a person may recover it).
    writable: bool,
    status: Option<GatewayUsageStatus>,
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
            let keys = collect_round(&context, &http, &mut books).await;
            let mut writes = writes.lock().await;
            // Keys no Gateway counts any more (deleted, or a new month) are
            // forgotten: one made again under the name gets its own status.
            writes.written.retain(|key, _| keys.contains_key(key));
            // The sum of keys past what a report lists has no ApiKey.
            for (key, status) in keys.into_iter().filter(|(key, _)| key.contains('/')) {
                if writes.written.get(&key).is_none_or(|held| !same_usage(held, &status)) {
                    writes.queue(key, status);
                }
            }
        }
    };
    tokio::join!(writer, collector);
}

/// Equal but for when it was collected.
fn same_usage(a: &KeyUsageStatus, b: &KeyUsageStatus) -> bool {
    KeyUsageStatus { as_of: String::new(), ..a.clone() } == KeyUsageStatus { as_of: String::new(), ..b.clone() }
}

/// One round over every Gateway; each key's usage over them all.
async fn collect_round(
    context: &Context,
    http: &HttpClient<HttpConnector, Empty<Bytes>>,
    books: &mut Books,
) -> BTreeMap<String, KeyUsageStatus> {
    let now = jiff::Timestamp::now();
    let as_of = now.to_string();
    let mut keys: BTreeMap<String, KeyUsageStatus> = BTreeMap::new();
    let mut gateways = context.stores.gateways.state();
    // In name order: a key served by several Gateways shows the cost of
    // the first's currency.
    gateways.sort_by_key(|gateway| gateway_id(gateway));
    books.gateways.retain(|id, _| gateways.iter().any(|gateway| gateway_id(gateway) == *id));
    // Several Gateways' pods asked at once (one whose pods do not answer
    // holds up only its own turn), their reports taken in order.
    let mut answered = futures_util::stream::iter(gateways)
        .map(|gateway| async move {
            let answers = reports(context, http, &gateway).await;
            (gateway, answers)
        })
        .buffered(ASK_GATEWAYS_AT_ONCE);
    while let Some((gateway, answers)) = answered.next().await {
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
            let Ok(loaded) = load_ledger(context, &gateway).await else { continue };
            let writable = loaded.is_some();
            let ledger = loaded.unwrap_or_default();
            let book = GatewayBook { persisted: Some(ledger.clone()), ledger, baseline: None, writable, status: None };
            books.gateways.insert(id.clone(), book);
        }
        let Some(book) = books.gateways.get_mut(&id) else { continue };
        match answers {
            Ok((live, reports)) => {
                for (pod, report) in reports {
                    book.ledger.record(&pod, report);
                }
                book.ledger.keep_pods(&live);
            }
            // The keys' totals still count what this Gateway's ledger holds.
            Err(error) => tracing::warn!(gateway = %id, %error, "usage: cannot list the gateway pods; retrying"),
        }
        let month = Period::Month.window(now, &zone).key;
        let current: Vec<(Period, String)> =
            [Period::Day, Period::Week, Period::Month].into_iter().map(|p| (p, p.window(now, &zone).key)).collect();
        book.ledger.forget_past(&month, &current);
        write_gateway(context, &gateway, book, &month, &currency, &as_of).await;
        for (key, mut used) in book.ledger.key_totals(&month) {
            let held = keys.entry(key).or_insert_with(|| UsageTotals::default().key_status(&month, &currency, &as_of));
            if held.currency != currency {
                // Money in another currency is not added as if one: that
                // Gateway's cost shows in its own status.usage lines.
                used.cost_nanos = 0;
            }
            let shown = held.currency.clone();
            let sum = parse_status(held).plus(used);
            *held = sum.key_status(&month, &shown, &as_of);
        }
    }
    keys
}

/// The totals a status line shows (cost parsed back to nano-units).
fn parse_status(status: &KeyUsageStatus) -> UsageTotals {
    UsageTotals {
        requests: status.requests,
        input_tokens: status.input_tokens,
        output_tokens: status.output_tokens,
        cached_input_tokens: status.cached_input_tokens,
        cost_nanos: waycast_crds::money::Money::parse(&status.cost).map_or(0, |money| money.0),
    }
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
) -> Result<(Vec<String>, Vec<(String, UsageReport)>), crate::error::Error> {
    let namespace = gateway.namespace().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(context.client.clone(), &namespace);
    let selector = selector_labels(gateway).iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
    let pods = bounded(api.list(&ListParams::default().labels(&selector))).await?;
    let live: Vec<(String, String)> = pods
        .items
        .iter()
        .filter(|pod| {
            // A pod draining (deletion asked) still serves, and what it
            // spends is counted until it is gone.
            let mut meta = pod.metadata.clone();
            meta.deletion_timestamp = None;
            let uid = meta.uid.clone().unwrap_or_default();
            let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            running && is_gateway_pod(&meta, &uid, &namespace, &gateway.name_any())
        })
        .filter_map(|pod| Some((pod.name_any(), pod.status.as_ref()?.pod_ip.clone()?)))
        .collect();
    let asked = live.iter().map(|(pod, ip)| async move {
        let report = ask(http, ip).await;
        if let Err(error) = &report {
            tracing::debug!(%pod, %error, "usage: no report from a gateway pod; asking again next round");
        }
        (pod.clone(), report.ok())
    });
    let answers = futures_util::future::join_all(asked).await;
    let reports = answers
        .into_iter()
        .filter_map(|(pod, report)| Some((pod.clone(), report?)))
        // A pod reports for its own processes only.
        .filter(|(pod, report)| report.instance.strip_prefix(pod.as_str()).is_some_and(|rest| rest.starts_with('-')))
        .collect();
    Ok((live.into_iter().map(|(pod, _)| pod).collect(), reports))
}

async fn ask(http: &HttpClient<HttpConnector, Empty<Bytes>>, ip: &str) -> Result<UsageReport, String> {
    let host = if ip.contains(':') { format!("[{ip}]") } else { ip.to_owned() };
    let uri: http::Uri = format!("http://{host}:{ADMIN_PORT}/usage").parse().map_err(|e| format!("{e}"))?;
    let call = async {
        let response = http.get(uri).await.map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("status {}", response.status()));
        }
        let body = Limited::new(response.into_body(), MAX_REPORT_BYTES).collect().await.map_err(|e| e.to_string())?;
        serde_json::from_slice::<UsageReport>(&body.to_bytes()).map_err(|e| format!("not a usage report: {e}"))
    };
    tokio::time::timeout(Duration::from_secs(3), call).await.map_err(|_| "timed out".to_owned())?
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
        .take(u64::try_from(MAX_REPORT_BYTES).unwrap_or(u64::MAX))
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
    month: &str,
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
    if book.writable && book.persisted.as_ref() != Some(&book.ledger) {
        match persist(&maps, &params, gateway, &book.ledger).await {
            Ok(()) => book.persisted = Some(book.ledger.clone()),
            Err(error) => tracing::warn!(gateway = %id, %error, "usage: cannot persist the ledger; retrying"),
        }
    }
    let namespaces: Vec<_> = ledger::by_namespace(&book.ledger.key_totals(month))
        .iter()
        .take(MAX_STATUS_NAMESPACES)
        .map(|(namespace, used)| used.namespace_status(namespace))
        .collect();
    let status = GatewayUsageStatus {
        period: month.to_owned(),
        currency: currency.to_owned(),
        as_of: as_of.to_owned(),
        namespaces,
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
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(&serde_json::to_vec(ledger)?)?;
    let map = ConfigMap {
        metadata: owned_meta(gateway, usage_ledger_name(gateway)),
        binary_data: Some([(LEDGER_DATA_KEY.to_owned(), ByteString(encoder.finish()?))].into()),
        ..ConfigMap::default()
    };
    bounded(maps.patch(&usage_ledger_name(gateway), params, &Patch::Apply(&map))).await?;
    Ok(())
}

/// Writes each key's usage as it changes, at most [`WRITES_PER_SECOND`].
async fn write_key_statuses(context: Arc<Context>, writes: Arc<tokio::sync::Mutex<KeyWrites>>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1) / WRITES_PER_SECOND);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let params = PatchParams::apply(USAGE_MANAGER).force();
    loop {
        tick.tick().await;
        let next = writes.lock().await.next();
        let Some((key, status)) = next else { continue };
        let Some((namespace, name)) = key.split_once('/') else { continue };
        let api: Api<ApiKey> = Api::namespaced(context.client.clone(), namespace);
        let body = serde_json::json!({
            "apiVersion": "waycast.dev/v1alpha1", "kind": "ApiKey", "status": {"usage": &status},
        });
        match bounded(api.patch_status(name, &params, &Patch::Apply(body))).await {
            Ok(_) => drop(writes.lock().await.written.insert(key, status)),
            // A key gone, or one the Gateway serves under an id no ApiKey has: nothing to write.
            Err(crate::error::Error::Kube(kube::Error::Api(refused))) if refused.code == 404 => {
                drop(writes.lock().await.written.insert(key, status));
            }
            Err(error) => {
                tracing::warn!(%key, %error, "usage: cannot write the key's status; retrying");
                let mut writes = writes.lock().await;
                if !writes.pending.contains_key(&key) {
                    writes.queue(key, status);
                }
            }
        }
    }
}
