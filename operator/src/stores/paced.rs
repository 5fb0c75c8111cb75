//! A look at every object of a store, handed to a controller a window at a
//! time instead of all at once.
//!
//! NB: kube's `reconcile_all_on` queues every object in the controller's
//! scheduler at once, and the scheduler's tables keep the room they grew
//! to: at 100,000 ApiKeys, the two ApiKey controllers held about 60 MB of
//! them for the rest of the process. Here at most [`WINDOW`] objects of a
//! pass wait in the scheduler; the controller reports each reconcile it
//! finishes (`Window::finished`), and that makes room for the next.
//!
//! ```text
//! trigger ─► pass over store.state() ─► room in the window? ─► ObjectRef ─► controller
//!    ▲ (one more pass if any came meanwhile)      ▲                              │
//!    │                                            └──── finished ◄───────────────┘
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::{FutureExt as _, Stream, StreamExt as _};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::{Notify, mpsc};

/// Objects of one pass that may wait in a controller at once.
pub const WINDOW: usize = 1024;
/// How long a full window waits for a reconcile to finish before taking
/// what it counts as finished. The scheduler merges a request for an object
/// that is already queued, and then reports one reconcile for two.
pub const STALL: Duration = Duration::from_secs(1);

/// What a pass has handed out and the controller has not yet finished.
#[derive(Debug, Default)]
pub struct Window {
    outstanding: AtomicUsize,
    freed: Notify,
}

impl Window {
    /// A reconcile finished (of an object of a pass or any other).
    pub fn finished(&self) {
        let _ = self.outstanding.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        self.freed.notify_one();
    }

    /// Waits until the window has room for one more object, and takes it.
    async fn take(&self, limit: usize, stall: Duration) {
        loop {
            // Registered before the count is read: a finish in between still wakes us.
            let freed = self.freed.notified();
            if self.outstanding.load(Ordering::Acquire) < limit {
                break;
            }
            if tokio::time::timeout(stall, freed).await.is_err() {
                self.outstanding.store(0, Ordering::Release);
                break;
            }
        }
        self.outstanding.fetch_add(1, Ordering::AcqRel);
    }

    /// Objects handed out and not finished.
    #[cfg(test)]
    fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Acquire)
    }
}

/// Every object of `store`, each time `triggers` fires, paced by `window`.
/// Triggers that fire while a pass runs make one more pass after it.
pub(crate) fn paced_all<K>(
    store: Store<K>,
    triggers: impl Stream<Item = ()> + Send + 'static,
    window: Arc<Window>,
) -> impl Stream<Item = ObjectRef<K>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    paced_with(store, triggers, window, WINDOW, STALL)
}

fn paced_with<K>(
    store: Store<K>,
    triggers: impl Stream<Item = ()> + Send + 'static,
    window: Arc<Window>,
    limit: usize,
    stall: Duration,
) -> impl Stream<Item = ObjectRef<K>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let (sender, mut receiver) = mpsc::channel(1);
    tokio::spawn(async move {
        let mut triggers = std::pin::pin!(triggers);
        while triggers.next().await.is_some() {
            loop {
                for object in store.state() {
                    window.take(limit, stall).await;
                    if sender.send(ObjectRef::from_obj(object.as_ref())).await.is_err() {
                        return;
                    }
                }
                // Any trigger since the pass began: its objects may have
                // changed after the pass looked at them.
                let mut again = false;
                while let Some(Some(())) = triggers.next().now_or_never() {
                    again = true;
                }
                if !again {
                    break;
                }
            }
        }
    });
    futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;
    use waycast_crds::{ApiKey, ApiKeySpec};

    use super::*;

    fn store_of(count: usize) -> Store<ApiKey> {
        let (reader, mut writer) = reflector::store();
        for index in 0..count {
            let mut key = ApiKey::new(&format!("key-{index}"), ApiKeySpec::default());
            key.metadata.namespace = Some("team-a".into());
            writer.apply_watcher_event(&Event::Apply(key));
        }
        reader
    }

    /// A pass hands out no more than the window until reconciles finish,
    /// then the rest, each object once.
    #[tokio::test]
    async fn a_pass_waits_for_room_and_hands_out_every_object_once() {
        let window = Arc::new(Window::default());
        let mut pass = std::pin::pin!(paced_with(
            store_of(10),
            futures_util::stream::once(async {}),
            window.clone(),
            3,
            Duration::from_secs(3600),
        ));
        let mut names = Vec::new();
        for _ in 0..3 {
            names.push(pass.next().await.map(|r| r.name));
        }
        tokio::task::yield_now().await;
        assert!(pass.next().now_or_never().is_none(), "a fourth object waits for room");
        assert_eq!(window.outstanding(), 3);
        while names.len() < 10 {
            window.finished();
            names.push(pass.next().await.map(|r| r.name));
        }
        let mut names: Vec<String> = names.into_iter().flatten().collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 10, "every object once");
    }

    /// A window that nothing frees (requests merged in the scheduler) is
    /// taken as finished after the stall, rather than stopping the pass.
    #[tokio::test]
    async fn a_window_nothing_frees_goes_on_after_the_stall() {
        let window = Arc::new(Window::default());
        let mut pass = std::pin::pin!(paced_with(
            store_of(5),
            futures_util::stream::once(async {}),
            window.clone(),
            2,
            Duration::from_millis(50),
        ));
        let started = tokio::time::Instant::now();
        let mut handed = 0;
        while pass.next().await.is_some() {
            handed += 1;
            if handed == 5 {
                break;
            }
        }
        assert_eq!(handed, 5);
        assert!(started.elapsed() >= Duration::from_millis(100), "two full windows waited out a stall each");
    }

    /// Triggers during a pass make exactly one more pass after it.
    #[tokio::test]
    async fn triggers_during_a_pass_make_one_more() {
        let window = Arc::new(Window::default());
        let (fire, fired) = mpsc::unbounded_channel::<()>();
        let triggers =
            futures_util::stream::unfold(fired, |mut fired| async move { fired.recv().await.map(|()| ((), fired)) });
        let mut pass =
            std::pin::pin!(paced_with(store_of(4), triggers, window.clone(), 100, Duration::from_secs(3600)));
        fire.send(()).ok();
        let _first = pass.next().await;
        // Two more triggers while the first pass is still handing out.
        fire.send(()).ok();
        fire.send(()).ok();
        let mut handed = 1;
        while tokio::time::timeout(Duration::from_millis(200), pass.next()).await.ok().flatten().is_some() {
            handed += 1;
        }
        assert_eq!(handed, 8, "the first pass and one more");
    }
}
