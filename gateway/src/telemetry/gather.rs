//! A worker's finished requests' records, gathered for up to [`WINDOW`]
//! and handed to the exporter together.
//!
//! The exporter's thread sleeps while its queue is empty: a record handed
//! over alone wakes it, and it goes back to sleep after (some 900
//! instructions a request at one request at a time, callgrind, more than
//! encoding the record). Handed over together, a worker's records of some
//! milliseconds cost it one wake. The exporter batches for up to 5 s
//! anyway, so the wait adds nothing a collector sees; a graceful stop
//! hands over what is gathered before the exporter's last flush
//! ([`send_gathered`] at a worker's end), as the access log does with its
//! lines.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use waycast_otlp::{Exporter, Item};

/// Longest a record waits on its worker: the exporter batches for up to
/// 5 s, so a collector sees no difference, and each wake (and the timer
/// behind it) is shared by more records.
const WINDOW: Duration = Duration::from_millis(20);

/// Records a worker hands over at once without waiting (bounded memory
/// under load: some 128 KiB; the exporter's queue takes them in one go).
const MOST: usize = 128;

/// A worker's records not yet handed over.
struct Gathered {
    items: Vec<(Arc<waycast_otlp::Destination>, Item)>,
    /// Told when a record lands in an empty batch.
    first: Arc<Notify>,
}

thread_local! {
    static GATHERED: RefCell<Option<Gathered>> = const { RefCell::new(None) };
}

/// Queues `item` for `destination`: into the calling worker's batch, or
/// straight to `exporter` on a thread that gathers none.
pub(super) fn send(exporter: &Exporter, destination: &Arc<waycast_otlp::Destination>, item: Item) {
    let gathered = GATHERED.with_borrow_mut(|gathered| {
        let Some(gathered) = gathered else { return Err(item) };
        if gathered.items.is_empty() {
            gathered.first.notify_one();
        }
        gathered.items.push((destination.clone(), item));
        Ok((gathered.items.len() >= MOST).then(|| std::mem::take(&mut gathered.items)))
    });
    match gathered {
        Err(item) => exporter.send(destination, item),
        Ok(full) => {
            for (destination, item) in full.into_iter().flatten() {
                exporter.send(&destination, item);
            }
        }
    }
}

/// Makes the calling thread gather its records and hand them over
/// [`WINDOW`] after the first of each batch, for as long as the returned
/// future is polled on this thread; `exporter` finds the gateway's
/// exporter in `owner` (asked only when there is something to send: it
/// starts the exporter's thread). A data-plane worker runs it.
pub async fn gather_on_this_thread<S>(owner: Arc<S>, exporter: fn(&S) -> Option<&Exporter>) {
    let first = Arc::new(Notify::new());
    GATHERED.set(Some(Gathered { items: Vec::new(), first: first.clone() }));
    loop {
        first.notified().await;
        tokio::time::sleep(WINDOW).await;
        send_gathered(|| exporter(&owner));
    }
}

/// Hands the calling thread's gathered records to the exporter (a worker
/// does at its end, before the exporter's last flush).
pub fn send_gathered<'a>(exporter: impl FnOnce() -> Option<&'a Exporter>) {
    // The next batch is likely the size of this one.
    let items = GATHERED.with_borrow_mut(|gathered| {
        let gathered = gathered.as_mut()?;
        let size = gathered.items.len();
        Some(std::mem::replace(&mut gathered.items, Vec::with_capacity(size)))
    });
    let Some(items) = items.filter(|items| !items.is_empty()) else { return };
    if let Some(exporter) = exporter() {
        for (destination, item) in items {
            exporter.send(&destination, item);
        }
    }
}
