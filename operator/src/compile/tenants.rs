//! The platform's policy per team: `spec.sharing` (classes, the queue)
//! and `spec.tenants[]` compiled into `settings.sharing` and one
//! `settings.tenants[]` entry per namespace of a served key, with the
//! first policy that selects the namespace. A key's class is checked here
//! against both (`ClassNotAllowed`), and its place under the policy's
//! `maxApiKeys` (`TenantKeyLimit`: keys are decided oldest first).
//!
//! ```text
//! spec.sharing ─► SharingConfig (a value it cannot use: the Gateway's Accepted=False; the default is used)
//! spec.tenants[] + namespace of each served key ─► TenantConfig per namespace + what each policy matched
//! ```

use std::collections::{BTreeMap, BTreeSet};

use waycast_crds::condition::reasons;
use waycast_crds::config::{SharingConfig, TenantConfig};
use waycast_crds::sharing::{TenantPolicyStatus, default_class_of};

use super::inputs::Inputs;
use super::models::key_limits;
use super::select;
use super::verdict::Verdict;

/// Namespaces a policy's status lists (the count says how many in all).
pub const STATUS_NAMESPACES: usize = 100;

/// `spec.sharing` as compiled, and why it is not served as written, if it
/// is not (the defaults stand in for what cannot be used).
pub fn sharing(inputs: &Inputs<'_>) -> (SharingConfig, Option<Verdict>) {
    let mut sharing = SharingConfig::default();
    let Some(spec) = inputs.gateway.spec.sharing.as_ref() else { return (sharing, None) };
    let mut refused = None;
    if !spec.classes.is_empty() {
        let unique: BTreeSet<&String> = spec.classes.iter().collect();
        if unique.len() == spec.classes.len() {
            sharing.classes = spec.classes.clone();
        } else {
            refused = Some(invalid("spec.sharing.classes: a class is named twice; the default classes are used"));
        }
    }
    let default = default_class_of(&sharing.classes, spec.default_class.as_deref());
    if sharing.class_index(&default).is_some() {
        sharing.default_class = default;
    } else {
        sharing.default_class = default_class_of(&sharing.classes, None);
        refused = Some(invalid(format!("spec.sharing.defaultClass: {default:?} is not one of the classes")));
    }
    if let Some(queue) = &spec.queue {
        if let Some(text) = &queue.max_wait {
            match waycast_crds::duration::parse(text) {
                Ok(wait) if !wait.is_zero() && wait <= std::time::Duration::from_secs(3600) => sharing.max_wait = wait,
                _ => refused = Some(invalid(format!("spec.sharing.queue.maxWait: {text:?} is not from 1ms to 1h"))),
            }
        }
        if let Some(most) = queue.max_queued.and_then(|n| u32::try_from(n).ok()) {
            sharing.max_queued = most.max(1);
        }
    }
    if let Some(percent) = spec.burst_percent.and_then(|n| u32::try_from(n).ok()) {
        sharing.burst_percent = percent.min(400);
    }
    sharing.inference_headers = spec.inference_headers.unwrap_or(false);
    (sharing, refused)
}

fn invalid(message: impl Into<String>) -> Verdict {
    Verdict::refused(reasons::INVALID, message.into())
}

/// Which policy applies to each namespace, decided once per namespace.
pub struct Tenants<'i> {
    inputs: &'i Inputs<'i>,
    sharing: SharingConfig,
    decided: BTreeMap<String, Option<(usize, TenantConfig)>>,
    /// Keys served so far per namespace (for `maxApiKeys`).
    served: BTreeMap<String, u32>,
}

impl<'i> Tenants<'i> {
    /// The policies of `inputs.gateway`, with the classes of `sharing`.
    pub fn new(inputs: &'i Inputs<'i>, sharing: SharingConfig) -> Self {
        Self { inputs, sharing, decided: BTreeMap::new(), served: BTreeMap::new() }
    }

    /// The compiled sharing settings.
    pub fn sharing(&self) -> &SharingConfig {
        &self.sharing
    }

    /// The policy of `namespace` (the first that selects it) as compiled,
    /// with its index; `None`: no policy selects it. A class of the policy
    /// that the Gateway does not have is dropped from it (see
    /// [`policy_problems`]).
    pub fn of(&mut self, namespace: &str) -> Option<&TenantConfig> {
        if !self.decided.contains_key(namespace) {
            let decided = self.decide(namespace);
            self.decided.insert(namespace.to_owned(), decided);
        }
        self.decided.get(namespace).and_then(|d| d.as_ref()).map(|(_, tenant)| tenant)
    }

    fn decide(&self, namespace: &str) -> Option<(usize, TenantConfig)> {
        let gateway = self.inputs.gateway;
        let home = gateway.metadata.namespace.as_deref().unwrap_or_default();
        let (index, policy) = gateway.spec.tenants.iter().enumerate().find(|(_, policy)| {
            select::namespace_admitted(Some(&policy.namespaces), home, namespace, self.inputs.namespaces)
        })?;
        let mut tenant = TenantConfig::new(namespace);
        tenant.weight = policy.weight.and_then(|w| u32::try_from(w).ok()).unwrap_or(1).clamp(1, 1000);
        if !policy.classes.is_empty() {
            let mut known: Vec<String> =
                policy.classes.iter().filter(|class| self.sharing.class_index(class).is_some()).cloned().collect();
            // None of them the Gateway's (it says so): the default class,
            // what a namespace without a policy gets.
            if known.is_empty() {
                known.push(self.sharing.default_class.clone());
            }
            tenant.classes = Some(known);
        }
        tenant.limits = policy.limits.as_ref().map(key_limits);
        tenant.budgets = policy.budgets.iter().map(waycast_crds::spend::Budget::config).collect();
        Some((index, tenant))
    }

    /// The class a key of `namespace` asking for `wanted` is served in.
    ///
    /// # Errors
    /// A `ClassNotAllowed` verdict naming the class.
    pub fn key_class(&mut self, namespace: &str, wanted: Option<&str>) -> Result<(), Verdict> {
        let tenant = self.of(namespace).cloned();
        waycast_crds::sharing::key_class(&self.sharing, tenant.as_ref(), wanted)
            .map(|_| ())
            .map_err(|message| Verdict::refused(reasons::CLASS_NOT_ALLOWED, message))
    }

    /// Whether one more key of `namespace` may be served under its
    /// policy's `maxApiKeys`. Keys are decided oldest first, so the newest
    /// are the ones left out.
    ///
    /// # Errors
    /// A `TenantKeyLimit` verdict naming the cap.
    pub fn key_room(&mut self, namespace: &str) -> Result<(), Verdict> {
        self.of(namespace);
        let Some(Some((index, _))) = self.decided.get(namespace) else { return Ok(()) };
        let Some(most) = self.inputs.gateway.spec.tenants.get(*index).and_then(|policy| policy.max_api_keys) else {
            return Ok(());
        };
        let served = self.served.get(namespace).copied().unwrap_or(0);
        if i64::from(served) < i64::from(most) {
            return Ok(());
        }
        Err(Verdict::refused(
            reasons::TENANT_KEY_LIMIT,
            format!(
                "namespace {namespace} already has {most} ApiKeys served by this Gateway (spec.tenants[{index}].maxApiKeys); the newest are left out"
            ),
        ))
    }

    /// Counts one served key of `namespace` against its `maxApiKeys`.
    pub fn count_key(&mut self, namespace: &str) {
        if let Some(served) = self.served.get_mut(namespace) {
            *served = served.saturating_add(1);
        } else {
            self.served.insert(namespace.to_owned(), 1);
        }
    }

    /// The `settings.tenants` entries for the namespaces of `served` keys
    /// (sorted), and what each policy matched, for the Gateway's status.
    pub fn compile<'n>(
        mut self,
        served: impl IntoIterator<Item = &'n str>,
    ) -> (Vec<TenantConfig>, Vec<TenantPolicyStatus>) {
        let namespaces: BTreeSet<&str> = served.into_iter().collect();
        let mut matched: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        let mut tenants = Vec::new();
        for namespace in namespaces {
            self.of(namespace);
            if let Some(Some((index, tenant))) = self.decided.get(namespace) {
                matched.entry(*index).or_default().push(namespace.to_owned());
                tenants.push(tenant.clone());
            }
        }
        let statuses = (0..self.inputs.gateway.spec.tenants.len())
            .map(|index| {
                let namespaces = matched.remove(&index).unwrap_or_default();
                TenantPolicyStatus {
                    index: i32::try_from(index).unwrap_or(i32::MAX),
                    namespace_count: i32::try_from(namespaces.len()).unwrap_or(i32::MAX),
                    namespaces: namespaces.into_iter().take(STATUS_NAMESPACES).collect(),
                }
            })
            .collect();
        (tenants, statuses)
    }
}

/// `spec.budgets` as compiled, and why it is not served as written (an
/// unknown time zone: UTC stands in).
pub fn budgets(inputs: &Inputs<'_>) -> (waycast_crds::spend::BudgetSettings, Option<Verdict>) {
    let mut settings = waycast_crds::spend::BudgetSettings::default();
    let Some(spec) = inputs.gateway.spec.budgets.as_ref() else { return (settings, None) };
    let mut refused = None;
    if let Some(zone) = &spec.time_zone {
        match waycast_crds::period::time_zone(zone) {
            Ok(_) => settings.time_zone = zone.clone(),
            Err(error) => refused = Some(invalid(format!("spec.budgets.timeZone: {error}; UTC stands in"))),
        }
    }
    if let Some(currency) = &spec.currency {
        settings.currency = currency.clone();
    }
    (settings, refused)
}

/// What the Gateway's tenant policies say that cannot be served as
/// written: a class the Gateway does not have (it is ignored).
pub fn policy_problems(inputs: &Inputs<'_>, sharing: &SharingConfig) -> Option<Verdict> {
    for (index, policy) in inputs.gateway.spec.tenants.iter().enumerate() {
        for (at, class) in policy.classes.iter().enumerate() {
            if sharing.class_index(class).is_none() {
                return Some(invalid(format!(
                    "spec.tenants[{index}].classes[{at}]: {class:?} is not one of the Gateway's classes {:?}; it is ignored",
                    sharing.classes
                )));
            }
        }
    }
    None
}
