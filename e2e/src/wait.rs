//! Waiting on a condition, the one way the e2e harness and its tests wait
//! (never a bare `sleep`): look, and look again every so often until what
//! is waited for is seen or the time is up; then fail naming what was
//! waited for and what the last look saw.
//!
//! ```text
//! await_condition(what, Patience, look)
//!   look ─► Seen::Done(value) ─────────────────────────────► Ok(value)
//!     ▲     Seen::NotYet(what it saw) ─► time up? ─ yes ───► Err("{what}: … the last look saw …")
//!     └──────────── sleep `every` ◄───────────── no
//!   (a look that returns Err ends the wait at once with that error)
//! ```
//!
//! The friends are the same loop around one look each: an object's
//! condition ([`await_object_condition`]), any check of an object
//! ([`await_object`]), its absence ([`await_absent`]), an HTTP answer from
//! every pod ([`await_answer`]), and the converse, a condition that must
//! hold throughout a while ([`holds_for`]). [`await_condition_blocking`] is
//! the loop for code without a runtime.
//!
//! An object look that fails at the API server is a look that did not see
//! it yet (the error is what it saw): the API server restarts in some tests,
//! and a transient error should not decide a wait.
//!
//! NB: a wait inside `tokio::spawn` does not compile today: rustc cannot
//! prove an async closure's future `Send` for every lifetime it borrows.
//! Wait in the test's own task; a spawned load worker keeps its own loop.

use std::fmt::{Debug, Display};
use std::time::{Duration, Instant};

use anyhow::bail;
use http::StatusCode;
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// How often a wait looks unless told otherwise.
pub const DEFAULT_EVERY: Duration = Duration::from_millis(100);

/// How long a wait lasts and how often it looks.
#[derive(Debug, Clone, Copy)]
pub struct Patience {
    limit: Limit,
    every: Duration,
}

#[derive(Debug, Clone, Copy)]
enum Limit {
    Within(Duration),
    By(Instant),
}

impl Patience {
    /// Up to `timeout` from the first look.
    pub const fn within(timeout: Duration) -> Self {
        Self { limit: Limit::Within(timeout), every: DEFAULT_EVERY }
    }

    /// Up to `deadline` (shared by several waits of one step).
    pub const fn by(deadline: Instant) -> Self {
        Self { limit: Limit::By(deadline), every: DEFAULT_EVERY }
    }

    /// Looking every `every` instead of [`DEFAULT_EVERY`].
    #[must_use]
    pub const fn every(self, every: Duration) -> Self {
        Self { every, ..self }
    }

    fn deadline(&self, started: Instant) -> Instant {
        match self.limit {
            Limit::Within(timeout) => started + timeout,
            Limit::By(deadline) => deadline,
        }
    }
}

/// Shorthand for [`Patience::within`].
pub const fn within(timeout: Duration) -> Patience {
    Patience::within(timeout)
}

/// What one look saw: what was waited for (with a value), or not yet (what
/// was seen instead, for the message when the wait gives up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen<T> {
    /// What was waited for, and what the wait returns.
    Done(T),
    /// Not yet: what the look saw.
    NotYet(String),
}

impl Seen<()> {
    /// Done when `done`, else not yet, having seen `seen`.
    pub fn when(done: bool, seen: impl Debug) -> Self {
        if done { Self::Done(()) } else { Self::NotYet(format!("{seen:?}")) }
    }
}

/// What a look may return: a [`Seen`], a `bool` (done or not), an `Option`
/// (`Some(value)`: done), or an `anyhow::Result` of one (an error ends the
/// wait at once).
pub trait Look<T> {
    /// The look as a [`Seen`].
    ///
    /// # Errors
    /// The look failed in a way that ends the wait.
    fn into_seen(self) -> anyhow::Result<Seen<T>>;
}

impl<T> Look<T> for Seen<T> {
    fn into_seen(self) -> anyhow::Result<Seen<T>> {
        Ok(self)
    }
}

impl Look<()> for bool {
    fn into_seen(self) -> anyhow::Result<Seen<()>> {
        Ok(if self { Seen::Done(()) } else { Seen::NotYet("not so".into()) })
    }
}

impl<T> Look<T> for Option<T> {
    fn into_seen(self) -> anyhow::Result<Seen<T>> {
        Ok(self.map_or_else(|| Seen::NotYet("nothing yet".into()), Seen::Done))
    }
}

impl<T, L: Look<T>> Look<T> for anyhow::Result<L> {
    fn into_seen(self) -> anyhow::Result<Seen<T>> {
        self?.into_seen()
    }
}

/// Looks with `look` until it sees what is waited for; returns its value.
///
/// # Errors
/// The time is up (the message names `what`, how long it waited and what
/// the last look saw), or a look failed.
pub async fn await_condition<T, L: Look<T>>(
    what: impl Display,
    patience: Patience,
    mut look: impl AsyncFnMut() -> L,
) -> anyhow::Result<T> {
    let started = Instant::now();
    let deadline = patience.deadline(started);
    loop {
        match look().await.into_seen()? {
            Seen::Done(value) => return Ok(value),
            Seen::NotYet(seen) if Instant::now() >= deadline => {
                bail!("{what}: not so after {:?}; the last look saw {seen}", started.elapsed())
            }
            Seen::NotYet(_) => tokio::time::sleep(patience.every).await,
        }
    }
}

/// [`await_condition`] for code without a runtime: `look` is plain and the
/// wait sleeps the thread.
///
/// # Errors
/// As [`await_condition`].
pub fn await_condition_blocking<T, L: Look<T>>(
    what: impl Display,
    patience: Patience,
    mut look: impl FnMut() -> L,
) -> anyhow::Result<T> {
    let started = Instant::now();
    let deadline = patience.deadline(started);
    loop {
        match look().into_seen()? {
            Seen::Done(value) => return Ok(value),
            Seen::NotYet(seen) if Instant::now() >= deadline => {
                bail!("{what}: not so after {:?}; the last look saw {seen}", started.elapsed())
            }
            Seen::NotYet(_) => std::thread::sleep(patience.every),
        }
    }
}

/// Looks with `look` every `every` for `duration`: each look must see the
/// condition hold (the converse of a wait: "nothing changes for a while").
///
/// # Errors
/// The first look that does not see it (with what it saw), or a look that
/// failed.
pub async fn holds_for<L: Look<()>>(
    what: impl Display,
    duration: Duration,
    every: Duration,
    mut look: impl AsyncFnMut() -> L,
) -> anyhow::Result<()> {
    let started = Instant::now();
    while started.elapsed() < duration {
        if let Seen::NotYet(seen) = look().await.into_seen()? {
            bail!("{what}: stopped holding after {:?}; the look saw {seen}", started.elapsed());
        }
        tokio::time::sleep(every).await;
    }
    Ok(())
}

/// `Kind namespace/name` of an object of `api`, for messages.
fn object_name<K: Resource<DynamicType = ()>>(api: &Api<K>, name: &str) -> String {
    match api.namespace() {
        Some(namespace) => format!("{} {namespace}/{name}", K::kind(&())),
        None => format!("{} {name}", K::kind(&())),
    }
}

/// Waits until `check` sees what it waits for in the object `name` (an
/// absent object, or a failed read, is not yet); returns the check's value.
///
/// # Errors
/// The time is up (with what the last look saw), or the check failed.
pub async fn await_object<K, T, L>(
    api: &Api<K>,
    name: &str,
    what: impl Display,
    patience: Patience,
    check: impl Fn(&K) -> L,
) -> anyhow::Result<T>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    L: Look<T>,
{
    let what = format!("{}: {what}", object_name(api, name));
    await_condition(what, patience, async || match api.get_opt(name).await {
        Ok(Some(object)) => check(&object).into_seen(),
        Ok(None) => Ok(Seen::NotYet("no such object".into())),
        Err(error) => Ok(Seen::NotYet(format!("an error reading it: {error}"))),
    })
    .await
}

/// Waits until the object `name` is gone.
///
/// # Errors
/// It is still there when the time is up.
pub async fn await_absent<K>(api: &Api<K>, name: &str, patience: Patience) -> anyhow::Result<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let what = format!("{} is gone", object_name(api, name));
    await_condition(what, patience, async || match api.get_opt(name).await {
        Ok(None) => Seen::Done(()),
        Ok(Some(_)) => Seen::NotYet("it is there".into()),
        Err(error) => Seen::NotYet(format!("an error reading it: {error}")),
    })
    .await
}

/// A condition an object's `status.conditions` is waited for: its type,
/// status and, where it matters, reason and observed generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionIs {
    type_: String,
    status: String,
    reason: Option<String>,
    generation: Option<i64>,
}

/// The condition `type_` with status `True` (any reason, any generation).
pub fn condition(type_: &str) -> ConditionIs {
    ConditionIs { type_: type_.into(), status: "True".into(), reason: None, generation: None }
}

impl ConditionIs {
    /// With status `status` instead of `True`.
    #[must_use]
    pub fn is(self, status: &str) -> Self {
        Self { status: status.into(), ..self }
    }

    /// With reason `reason`.
    #[must_use]
    pub fn because(self, reason: &str) -> Self {
        Self { reason: Some(reason.into()), ..self }
    }

    /// Observed at generation `generation` (`None`: any).
    #[must_use]
    pub fn at_generation(self, generation: Option<i64>) -> Self {
        Self { generation, ..self }
    }

    /// Whether `object` (any object with meta/v1 conditions in its status,
    /// as JSON) holds it; not yet with what it holds instead.
    pub fn look(&self, object: &serde_json::Value) -> Seen<()> {
        let conditions = object["status"]["conditions"].as_array();
        let Some(found) = conditions.into_iter().flatten().find(|c| c["type"] == self.type_.as_str()) else {
            return Seen::NotYet(format!("no {} condition", self.type_));
        };
        let matches = found["status"] == self.status.as_str()
            && self.reason.as_ref().is_none_or(|reason| found["reason"] == reason.as_str())
            && self.generation.is_none_or(|generation| found["observedGeneration"] == generation);
        Seen::when(
            matches,
            format_args!(
                "{} {}/{} at generation {} ({})",
                self.type_, found["status"], found["reason"], found["observedGeneration"], found["message"]
            ),
        )
    }
}

impl Display for ConditionIs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} is {}", self.type_, self.status)?;
        if let Some(reason) = &self.reason {
            write!(f, "/{reason}")?;
        }
        if let Some(generation) = self.generation {
            write!(f, " at generation {generation}")?;
        }
        Ok(())
    }
}

/// Waits until the object `name`'s status holds `wanted`.
///
/// # Errors
/// The time is up (with the condition the last look saw).
pub async fn await_object_condition<K>(
    api: &Api<K>,
    name: &str,
    wanted: &ConditionIs,
    patience: Patience,
) -> anyhow::Result<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
{
    await_object(api, name, wanted, patience, |object| {
        serde_json::to_value(object).map(|value| wanted.look(&value)).map_err(anyhow::Error::from)
    })
    .await
}

/// An object kind a namespaced wait can name by `namespace/name`: every
/// waycast kind and the Kubernetes kinds tests wait on.
pub trait Namespaced:
    Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope> + Clone + DeserializeOwned + Serialize + Debug
{
}

impl<K> Namespaced for K where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Serialize
        + Debug
{
}

/// [`await_object_condition`] for the `K` named `namespace/name`.
///
/// # Errors
/// As [`await_object_condition`].
pub async fn await_condition_of<K: Namespaced>(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    wanted: &ConditionIs,
    patience: Patience,
) -> anyhow::Result<()> {
    await_object_condition(&Api::<K>::namespaced(client.clone(), namespace), name, wanted, patience).await
}

/// Waits until every one of `urls` (chat completions URLs, see
/// [`crate::chat::url`]) answers `wanted` to a chat for `model` with `key`,
/// all in one round of looks (each round starts again at the first).
///
/// # Errors
/// The time is up (naming the URL that answered otherwise, and what).
pub async fn await_answer(
    urls: &[String],
    key: &str,
    model: &str,
    wanted: StatusCode,
    patience: Patience,
) -> anyhow::Result<()> {
    let what = format!("every pod answers {model} with {wanted}");
    await_condition(what, patience, async || {
        for url in urls {
            let got = crate::chat::status(url, key, model).await;
            if got != Some(wanted) {
                return Seen::NotYet(format!("{url} answered {got:?}"));
            }
        }
        Seen::Done(())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wait_returns_the_value_once_seen_and_looks_until_then() {
        let mut looks = 0;
        let found =
            await_condition("the third look", within(Duration::from_secs(5)).every(Duration::ZERO), async || {
                looks += 1;
                (looks == 3).then_some(looks * 10)
            })
            .await
            .unwrap();
        assert_eq!((found, looks), (30, 3));
    }

    #[tokio::test]
    async fn a_wait_that_times_out_names_what_and_the_last_look() {
        let mut looks = 0;
        let error = await_condition("the sky is green", within(Duration::from_millis(30)), async || {
            looks += 1;
            Seen::<()>::NotYet(format!("blue, look {looks}"))
        })
        .await
        .unwrap_err()
        .to_string();
        assert!(error.starts_with("the sky is green: not so after"), "{error}");
        assert!(error.ends_with(&format!("the last look saw blue, look {looks}")), "{error}");
    }

    #[tokio::test]
    async fn a_failed_look_ends_the_wait_at_once() {
        let mut looks = 0;
        let error = await_condition("never", within(Duration::from_secs(60)), async || {
            looks += 1;
            anyhow::Result::<bool>::Err(anyhow::anyhow!("the process died"))
        })
        .await
        .unwrap_err();
        assert_eq!((error.to_string(), looks), ("the process died".into(), 1));
    }

    #[test]
    fn a_deadline_is_shared_and_a_timeout_starts_at_the_first_look() {
        let now = Instant::now();
        let later = now + Duration::from_secs(7);
        assert_eq!(Patience::by(later).deadline(now + Duration::from_secs(3)), later);
        assert_eq!(within(Duration::from_secs(7)).deadline(now), later);
        assert_eq!(within(Duration::from_secs(1)).every(Duration::from_secs(2)).every, Duration::from_secs(2));
    }

    #[test]
    fn blocking_waits_look_like_async_ones() {
        let mut looks = 0;
        let seen = await_condition_blocking("second", within(Duration::from_secs(5)).every(Duration::ZERO), || {
            looks += 1;
            looks >= 2
        });
        assert!(seen.is_ok() && looks == 2);
        let error = await_condition_blocking("never", within(Duration::ZERO), || false).unwrap_err().to_string();
        assert!(error.contains("never: not so after") && error.ends_with("saw not so"), "{error}");
    }

    #[tokio::test]
    async fn a_hold_fails_at_the_first_look_that_does_not_see_it() {
        let mut looks = 0;
        let error = holds_for("steady", Duration::from_secs(60), Duration::ZERO, async || {
            looks += 1;
            Seen::when(looks < 3, format_args!("look {looks}"))
        })
        .await
        .unwrap_err()
        .to_string();
        assert!(error.starts_with("steady: stopped holding") && error.ends_with("saw look 3"), "{error}");
        holds_for("always", Duration::from_millis(20), Duration::from_millis(5), async || true).await.unwrap();
    }

    #[test]
    fn conditions_match_type_status_reason_and_generation() {
        let object = serde_json::json!({"status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KeyReady", "observedGeneration": 2, "message": "ok"},
            {"type": "Programmed", "status": "False", "reason": "Pending", "observedGeneration": 1, "message": "wait"},
        ]}});
        let rows = [
            (condition("Ready"), true),
            (condition("Ready").because("KeyReady"), true),
            (condition("Ready").because("KeyReady").at_generation(Some(2)), true),
            (condition("Ready").at_generation(Some(3)), false),
            (condition("Ready").because("Other"), false),
            (condition("Ready").is("False"), false),
            (condition("Programmed"), false),
            (condition("Programmed").is("False").because("Pending"), true),
            (condition("Accepted"), false),
        ];
        for (wanted, holds) in rows {
            assert_eq!(wanted.look(&object) == Seen::Done(()), holds, "{wanted}");
        }
        assert_eq!(condition("Accepted").look(&object), Seen::NotYet("no Accepted condition".into()));
        let Seen::NotYet(seen) = condition("Programmed").look(&object) else { panic!("not so") };
        assert!(seen.contains("\"False\"/\"Pending\" at generation 1 (\"wait\")"), "{seen}");
        assert_eq!(condition("Ready").is("False").because("KeyTooShort").to_string(), "Ready is False/KeyTooShort");
    }
}
