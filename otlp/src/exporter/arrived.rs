//! What the export thread takes off its queue while an export waits on
//! the collector.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use super::queue::{Message, QUEUE, Tally};

/// Messages taken off the queue while an export was in flight: a collector
/// that takes its 5 s deadline to answer (or never answers) must not leave
/// the queue full meanwhile, dropping the newest records, when they could
/// be batched and kept for a retry ([`Retries`], larger and dropping the
/// oldest).
#[derive(Default)]
pub(super) struct Arrived {
    messages: VecDeque<Message>,
    /// How many of `messages` still carry spans.
    with_spans: usize,
}

/// Messages kept aside at most (usage records, a few hundred bytes each).
const ARRIVED: usize = 2 * QUEUE;
/// Messages with spans (a few KB each) held at most, aside and queued
/// together, at the time one is taken: the queue's own bound for spans
/// ([`super::Exporter::send`] sheds them past half full), so a slow
/// collector's export sheds spans only when a full half queue of them
/// waits, not while the queue is nearly empty; the queue may fill again
/// after, so spans held stay within [`QUEUE`] messages in all.
const SPANS_HELD: usize = QUEUE / 2;
/// How often the queue is drained while an export is in flight.
const DRAIN_EVERY: Duration = Duration::from_millis(10);

impl Arrived {
    pub(super) fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// The oldest message kept aside.
    pub(super) fn pop(&mut self) -> Option<Message> {
        let message = self.messages.pop_front()?;
        if matches!(&message, Message::Record(_, item) if item.span_count > 0) {
            self.with_spans -= 1;
        }
        Some(message)
    }

    /// Runs `export` to its end, taking what the queue holds every
    /// [`DRAIN_EVERY`] meanwhile.
    pub(super) fn drain_while(
        &mut self,
        runtime: &tokio::runtime::Runtime,
        receiver: &Receiver<Message>,
        queued: &AtomicUsize,
        counts: &Tally,
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
    /// [`SPANS_HELD`], spans are dropped (counted) and usage records kept.
    fn take(&mut self, receiver: &Receiver<Message>, queued: &AtomicUsize, counts: &Tally) {
        while self.messages.len() < ARRIVED
            && let Ok(mut message) = receiver.try_recv()
        {
            if let Message::Record(_, item) = &mut message {
                let still_queued = queued.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
                let spans_full = self.with_spans + still_queued >= SPANS_HELD;
                if item.span_count > 0 && spans_full {
                    counts.dropped("traces", "queue_full", item.span_count as u64);
                    (item.spans, item.span_count) = (Vec::new(), 0);
                }
                // Kept long past the spans' bound (a collector that hangs):
                // the record's own bytes, not its encoder's spare room.
                if spans_full {
                    item.records.shrink_to_fit();
                }
                if item.span_count == 0 && item.records.is_empty() {
                    continue;
                }
                self.with_spans += usize::from(item.span_count > 0);
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
    use super::super::tests::tally;
    use super::*;

    #[test]
    fn spans_are_kept_aside_within_the_queues_bound_for_them_and_records_always() {
        let tally = tally();
        let counts = &tally.counts;
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
        let dropped = || counts.dropped.with_label_values(&["traces", "queue_full"]).get();
        let mut arrived = Arrived::default();
        // A slow export with the queue drained as it goes: two batches'
        // worth and more keep their spans.
        (0..2000).for_each(|_| send(true, true));
        arrived.take(&receiver, &queued, &tally);
        assert_eq!((arrived.messages.len(), arrived.with_spans, dropped()), (2000, 2000, 0));
        // More than the bound at once: spans are shed until those aside
        // and those queued fit it; a message of spans alone then goes.
        (0..10).for_each(|_| send(true, false));
        (0..SPANS_HELD).for_each(|_| send(true, true));
        arrived.take(&receiver, &queued, &tally);
        assert_eq!(arrived.with_spans, SPANS_HELD);
        assert_eq!(arrived.messages.len(), 2000 + SPANS_HELD);
        assert_eq!(dropped(), 2 * (2000 + 10) as u64);
        assert_eq!(queued.load(Ordering::Relaxed), 0);
        // No more than ARRIVED are kept aside; the rest wait in the queue.
        (0..ARRIVED - arrived.messages.len() + 5).for_each(|_| send(false, true));
        arrived.take(&receiver, &queued, &tally);
        assert_eq!(arrived.messages.len(), ARRIVED);
        assert_eq!(queued.load(Ordering::Relaxed), 5);
        assert_eq!(receiver.try_iter().count(), 5);
        while arrived.pop().is_some() {}
        assert_eq!(arrived.with_spans, 0);
    }
}
