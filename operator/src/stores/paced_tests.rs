use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use waycast_crds::ApiKey;

use super::*;

fn store_of(count: usize) -> Store<ApiKey> {
    let (reader, mut writer) = reflector::store();
    for index in 0..count {
        let key = waycast_mock::fixtures::objects::api_key("team-a", &format!("key-{index}"));
        writer.apply_watcher_event(&Event::Apply(key));
    }
    reader
}

type Reported = Result<(ObjectRef<ApiKey>, Action), controller::Error<std::io::Error, std::io::Error>>;

fn reconciled(object: &ObjectRef<ApiKey>) -> Reported {
    Ok((object.clone(), Action::await_change()))
}

/// Passes fired by hand.
fn fired() -> (mpsc::UnboundedSender<()>, impl Stream<Item = ()> + Send + 'static) {
    let (fire, fired) = mpsc::unbounded_channel::<()>();
    (fire, futures_util::stream::unfold(fired, |mut fired| async move { fired.recv().await.map(|()| ((), fired)) }))
}

async fn next_within(
    stream: &mut (impl Stream<Item = ObjectRef<ApiKey>> + Unpin),
    wait: Duration,
) -> Option<ObjectRef<ApiKey>> {
    tokio::time::timeout(wait, stream.next()).await.ok().flatten()
}

/// The names handed out until none comes for 200 ms, each reported
/// reconciled as it comes (a window of one moves on that way).
async fn reporting_each(stream: &mut (impl Stream<Item = ObjectRef<ApiKey>> + Unpin), paced: &Paced) -> Vec<String> {
    let mut names = Vec::new();
    while let Some(object) = next_within(stream, Duration::from_millis(200)).await {
        paced.finished(&reconciled(&object));
        names.push(object.name);
    }
    names
}

fn name(text: &str) -> Name {
    (Some(Box::from("team-a")), Box::from(text))
}

/// A pass hands out no more than the window until the controller reports
/// its objects, then the rest, each object once; a report of an object
/// not handed out frees nothing.
#[tokio::test]
async fn a_pass_waits_for_room_and_hands_out_every_object_once() {
    let passes = futures_util::stream::once(async {});
    let (out, paced) = handed_out(store_of(10), passes, 3, Duration::from_secs(30));
    let mut out = std::pin::pin!(out);
    let mut handed = Vec::new();
    for _ in 0..3 {
        handed.extend(out.next().await);
    }
    let wait = Duration::from_millis(100);
    assert!(next_within(&mut out, wait).await.is_none(), "a fourth waits for room");
    paced.finished(&reconciled(&ObjectRef::new("someone-else").within("team-a")));
    // The name of one handed out, in another namespace: another object.
    paced.finished(&reconciled(&ObjectRef::new(&handed[0].name).within("team-b")));
    assert!(next_within(&mut out, wait).await.is_none(), "only the objects handed out leave");
    let mut reported = 0;
    while handed.len() < 10 {
        paced.finished(&reconciled(&handed[reported]));
        reported += 1;
        // Well within the stall: room comes from the report.
        handed.push(next_within(&mut out, Duration::from_secs(5)).await.expect("room after a report"));
    }
    let mut names: Vec<String> = handed.into_iter().map(|object| object.name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 10, "every object once");
}

/// A changed object goes before the rest of a pass, and one announced
/// twice while it waits is handed out once.
#[tokio::test]
async fn a_changed_object_goes_before_a_pass() {
    let (fire, passes) = fired();
    let (out, paced) = handed_out(store_of(5), passes, 1, Duration::from_secs(30));
    let mut out = std::pin::pin!(out);
    fire.send(()).ok();
    let first = out.next().await.unwrap();
    paced.announce(Some("team-b"), "new-key");
    paced.announce(Some("team-b"), "new-key");
    // The window of one is full until reported: report each as it comes.
    paced.finished(&reconciled(&first));
    let names = reporting_each(&mut out, &paced).await;
    assert_eq!(names.first().map(String::as_str), Some("new-key"), "{names:?}");
    assert_eq!(names.iter().filter(|name| *name == "new-key").count(), 1);
    assert_eq!(names.len(), 5, "the new key and the pass's other four: {names:?}");
}

/// An object reported failed or gone leaves the window too; reported twice
/// (a retry), it frees one place only.
#[tokio::test]
async fn a_failed_or_missing_object_leaves_the_window_once() {
    let (out, paced) = handed_out(store_of(0), futures_util::stream::pending(), 2, Duration::from_secs(30));
    let mut out = std::pin::pin!(out);
    for name in ["failed", "gone", "third"] {
        paced.announce(Some("team-a"), name);
    }
    let (failed, gone) = (out.next().await.unwrap(), out.next().await.unwrap());
    let wait = Duration::from_millis(100);
    assert!(next_within(&mut out, wait).await.is_none(), "the window of two is full");
    let failed: Reported =
        Err(controller::Error::ReconcilerFailed(std::io::Error::other("patch refused"), Box::new(failed.erase())));
    paced.finished(&failed);
    paced.finished(&failed);
    assert_eq!(next_within(&mut out, wait).await.map(|object| object.name).as_deref(), Some("third"));
    paced.announce(Some("team-a"), "fourth");
    assert!(next_within(&mut out, wait).await.is_none(), "the retry's report freed nothing more");
    paced.finished(&Reported::Err(controller::Error::ObjectNotFound(Box::new(gone.erase()))));
    assert_eq!(next_within(&mut out, wait).await.map(|object| object.name).as_deref(), Some("fourth"));
}

/// A window the controller never reports on counts itself empty after a
/// stall, rather than stopping.
#[tokio::test]
async fn a_window_nothing_frees_goes_on_after_the_stall() {
    let passes = futures_util::stream::once(async {});
    let (out, _paced) = handed_out(store_of(5), passes, 2, Duration::from_millis(50));
    let mut out = std::pin::pin!(out);
    let started = tokio::time::Instant::now();
    let mut handed = 0;
    while handed < 5 && next_within(&mut out, Duration::from_secs(5)).await.is_some() {
        handed += 1;
    }
    assert_eq!(handed, 5, "the stall let each one in");
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(100), "two full windows waited out a stall each");
    assert!(elapsed < Duration::from_secs(10), "the stall given, not another: {elapsed:?}");
}

/// The stall's clock runs from when the window filled, whatever else
/// comes meanwhile: announcements arriving all the time do not restart it.
#[tokio::test]
async fn the_stall_runs_out_under_a_stream_of_announcements() {
    let (out, paced) = handed_out(store_of(0), futures_util::stream::pending(), 1, Duration::from_millis(50));
    let mut out = std::pin::pin!(out);
    let announcing = tokio::spawn({
        let paced = paced.clone();
        async move {
            for index in 0.. {
                paced.announce(Some("team-a"), &format!("key-{index}"));
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    });
    let mut handed = 0;
    while handed < 3 && next_within(&mut out, Duration::from_secs(5)).await.is_some() {
        handed += 1;
    }
    announcing.abort();
    assert_eq!(handed, 3, "the first, then one after each of two stalls");
}

/// While changed objects keep coming, one in four handed out is a pass's.
#[test]
fn a_pass_gets_its_share_while_changes_keep_coming() {
    let mut queues = Queues::default();
    queues.pass((0..6).map(|index| name(&format!("key-{index}"))).collect());
    for index in 0..6 {
        queues.announce(name(&format!("changed-{index}")));
    }
    let order: Vec<bool> = (0..8).filter_map(|_| queues.hand_out()).map(|(_, name)| name.starts_with("key-")).collect();
    assert_eq!(order, [false, false, false, true, false, false, false, true]);
}

/// A pass while one runs queues again only the objects already handed
/// out: those still waiting are not queued twice.
#[tokio::test]
async fn a_pass_during_a_pass_queues_again_only_what_was_handed_out() {
    let (fire, passes) = fired();
    let (out, paced) = handed_out(store_of(4), passes, 1, Duration::from_secs(30));
    let mut out = std::pin::pin!(out);
    fire.send(()).ok();
    let first = out.next().await.unwrap();
    fire.send(()).ok();
    fire.send(()).ok();
    paced.finished(&reconciled(&first));
    let mut handed = vec![first.name];
    handed.extend(reporting_each(&mut out, &paced).await);
    assert_eq!(handed.len(), 5, "four, and the first again: {handed:?}");
    assert_eq!(handed[0], handed[4]);
}

/// Queues that grew for a large pass give their room back once drained.
#[test]
fn drained_queues_give_back_their_room() {
    let mut queues = Queues::default();
    queues.pass((0..3000).map(|index| name(&format!("key-{index}"))).collect());
    queues.announce(name("new-key"));
    assert_eq!(queues.hand_out().map(|(_, name)| name).as_deref(), Some("new-key"), "changed first");
    while queues.hand_out().is_some() {}
    assert_eq!(queues.handed.len(), 3001);
    assert!(queues.pass.capacity() <= KEPT_ROOM && queues.in_pass.capacity() <= KEPT_ROOM);
    assert!(queues.in_pass.is_empty() && queues.in_changed.is_empty());
    for index in 0..3000 {
        queues.announce(name(&format!("changed-{index}")));
    }
    while queues.hand_out().is_some() {}
    assert!(queues.changed.capacity() <= KEPT_ROOM && queues.in_changed.capacity() <= KEPT_ROOM);
}

/// Room: below the limit, or an object already in the controller; nothing
/// waiting, nothing to hand out.
#[test]
fn an_object_may_go_with_room_or_when_already_in_the_controller() {
    let mut queues = Queues::default();
    assert_eq!(queues.ready(1), (false, false));
    queues.announce(name("a"));
    assert_eq!(queues.ready(1), (true, true));
    queues.hand_out();
    queues.announce(name("b"));
    assert_eq!(queues.ready(1), (true, false), "the window of one is full");
    queues.announce(name("a"));
    queues.changed.swap(0, 1);
    assert_eq!(queues.ready(1), (true, true), "a is in the controller already");
}
