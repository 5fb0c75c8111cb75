//! What the export thread takes off its queue while an export waits on
//! the collector.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use super::queue::{BATCH, Counts, Message, QUEUE};

/// Messages taken off the queue while an export was in flight: a collector
/// that takes its 5 s deadline to answer (or never answers) must not leave
/// the queue full meanwhile, dropping the newest records, when they could
/// be batched and kept for a retry ([`Retries`], larger and dropping the
/// oldest).
#[derive(Default)]
pub(super) struct Arrived {
    pub(super) messages: VecDeque<Message>,
}

/// Messages kept aside at most (usage records, a few hundred bytes each).
const ARRIVED: usize = 2 * QUEUE;
/// Messages kept aside with their spans at most (a few KB each): a healthy
/// collector's export leaves some tens aside; past two batches, it is
/// slow or gone and the records are what is worth the memory.
const ARRIVED_SPANS: usize = 2 * BATCH;
/// How often the queue is drained while an export is in flight.
const DRAIN_EVERY: Duration = Duration::from_millis(10);

impl Arrived {
    /// Runs `export` to its end, taking what the queue holds every
    /// [`DRAIN_EVERY`] meanwhile.
    pub(super) fn drain_while(
        &mut self,
        runtime: &tokio::runtime::Runtime,
        receiver: &Receiver<Message>,
        queued: &AtomicUsize,
        counts: &Counts,
        mut export: std::pin::Pin<Box<dyn Future<Output = ()> + '_>>,
    ) {
        runtime.block_on(async {
            let mut tick = tokio::time::interval(DRAIN_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            std::future::poll_fn(|context| {
                if export.as_mut().poll(context).is_ready() {
                    return std::task::Poll::Ready(());
                }
                while tick.poll_tick(context).is_ready() {
                    self.take(receiver, queued, counts);
                }
                std::task::Poll::Pending
            })
            .await;
        });
    }

    /// Takes what the queue holds, within [`ARRIVED`]; past
    /// [`ARRIVED_SPANS`], spans are dropped (counted) and usage records
    /// kept.
    fn take(&mut self, receiver: &Receiver<Message>, queued: &AtomicUsize, counts: &Counts) {
        while self.messages.len() < ARRIVED
            && let Ok(mut message) = receiver.try_recv()
        {
            if let Message::Record(_, item) = &mut message {
                queued.fetch_sub(1, Ordering::Relaxed);
                if item.span_count > 0 && self.messages.len() >= ARRIVED_SPANS {
                    counts.dropped.with_label_values(&["traces", "queue_full"]).inc_by(item.span_count as u64);
                    (item.spans, item.span_count) = (Vec::new(), 0);
                }
                // Kept long past the spans' bound (a collector that hangs):
                // the record's own bytes, not its encoder's spare room.
                if self.messages.len() >= ARRIVED_SPANS {
                    item.records.shrink_to_fit();
                }
                if item.span_count == 0 && item.records.is_empty() {
                    continue;
                }
            }
            self.messages.push_back(message);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::mpsc::sync_channel;

    use super::super::Destination;
    use super::super::queue::Item;
    use super::super::tests::counts;
    use super::*;

    #[test]
    fn messages_kept_aside_past_their_bound_lose_their_spans_and_keep_their_records() {
        let counts = counts();
        let (queue, receiver) = sync_channel(ARRIVED + 10);
        let queued = AtomicUsize::new(0);
        let destination =
            Arc::new(Destination::new("http://127.0.0.1:9", &Default::default(), &Default::default(), "test"));
        let send = |spans: bool, records: bool| {
            let (spans, span_count) = if spans { (vec![1, 2], 2) } else { (Vec::new(), 0) };
            let item = Item { spans, span_count, records: if records { vec![1] } else { Vec::new() } };
            queued.fetch_add(1, Ordering::Relaxed);
            queue.try_send(Message::Record(destination.clone(), item)).unwrap();
        };
        // Whole up to the spans' bound, then ten spans only and ten with a
        // record too.
        (0..ARRIVED_SPANS).for_each(|_| send(true, true));
        (0..10).for_each(|_| send(true, false));
        (0..10).for_each(|_| send(true, true));
        let mut arrived = Arrived::default();
        arrived.take(&receiver, &queued, &counts);
        assert_eq!(arrived.messages.len(), ARRIVED_SPANS + 10);
        let with_spans = arrived.messages.iter().filter(|m| matches!(m, Message::Record(_, i) if i.span_count > 0));
        assert_eq!(with_spans.count(), ARRIVED_SPANS);
        assert_eq!(counts.dropped.with_label_values(&["traces", "queue_full"]).get(), 40);
        assert_eq!(queued.load(Ordering::Relaxed), 0);
        // No more than ARRIVED are kept aside; the rest wait in the queue.
        (0..ARRIVED).for_each(|_| send(false, true));
        arrived.take(&receiver, &queued, &counts);
        assert_eq!(arrived.messages.len(), ARRIVED);
        let left = ARRIVED - (ARRIVED - ARRIVED_SPANS - 10);
        assert_eq!(queued.load(Ordering::Relaxed), left);
        assert_eq!(receiver.try_iter().count(), left);
    }
}
