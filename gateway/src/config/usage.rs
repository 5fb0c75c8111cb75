//! Where the fleet's budget spend comes from (the operator's usage
//! ConfigMap, or a file: `--usage-configmap`, `--usage-file`), and how it
//! reaches the budgets (`crate::usage::Ledger::apply`).

use std::sync::Arc;

use jiff::Timestamp;
use tokio::sync::mpsc;
use waycast_crds::usage::UsageBaseline;

use super::{ConfigStore, Update};
use crate::usage::Ledger;

/// Hands each baseline document to the current snapshot's budgets, and
/// keeps it for the snapshots after (a budget the config adds gets the
/// fleet's spend at once). A document that does not parse is logged and
/// the last good one stays.
pub async fn apply_updates<S>(mut updates: mpsc::Receiver<Update>, serving: Arc<S>)
where
    S: AsRef<ConfigStore> + AsRef<Ledger> + Send + Sync + 'static,
{
    let (store, ledger): (&ConfigStore, &Ledger) = ((*serving).as_ref(), (*serving).as_ref());
    while let Some(Update { source, bytes }) = updates.recv().await {
        let baseline = match bytes.map_err(|error| error.to_string()).and_then(|bytes| {
            UsageBaseline::from_slice(&bytes).map_err(|error| format!("not a usage baseline: {error}"))
        }) {
            Ok(baseline) => baseline,
            Err(error) => {
                tracing::warn!(%source, %error, "usage baseline refused; the last one stays");
                continue;
            }
        };
        if let Some(snapshot) = store.current() {
            ledger.apply(&snapshot, &baseline, Timestamp::now());
        }
        ledger.keep(baseline);
    }
}
