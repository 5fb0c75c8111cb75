//! Each member of a grant counted on their own: a token's holder gets
//! limits and budgets of their own (the grant's `perUser`) beside the
//! grant's for all members together, made on their first request and kept
//! across configs (continued when the grant's `perUser` changes).
//!
//! A member is known by a digest of who the token names, never the name
//! itself: no person's name is a Redis key or a metric label. Bounded: a
//! grant holds [`MAX_MEMBERS`] members at once; when full, members who
//! count nothing (limits full again, budgets untouched this period) make
//! room, and while none does a new member is refused (429), never served
//! past the limits of the others.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use waycast_crds::config::PerUserConfig;

use waycast_crds::period::Period;

use super::budget::{Budget, FleetSpend};
use super::limiter::LimitSet;

/// Most members of one grant counted at once, per pod.
pub use waycast_crds::usage::MAX_MEMBERS_PER_GRANT as MAX_MEMBERS;

/// Per member (by state id), what the fleet spent of each of their
/// budgets, as the operator last collected it.
pub type MembersFleet = HashMap<Arc<str>, Vec<(Period, FleetSpend)>>;

/// The members of one grant.
pub struct Members {
    /// The grant's id (`namespace/name`).
    grant: Arc<str>,
    config: PerUserConfig,
    /// Read by every request of a member, written once per new member
    /// (copied: members come far less often than their requests).
    by_user: ArcSwap<HashMap<Box<str>, Arc<Member>>>,
    capacity: usize,
    /// The fleet's spend of members' budgets (without Redis): handed to a
    /// member when they are made, so one first seen by this process after
    /// a restart starts from what the fleet spent, not from nothing.
    fleet: ArcSwap<MembersFleet>,
}

/// One member's own state.
#[derive(Debug)]
pub struct Member {
    /// `user:<grant>:<digest of the user>`: their limiters' and budgets'
    /// state id (Redis keys, budget scope).
    pub id: Arc<str>,
    /// Their own limits, if the grant sets any.
    pub limits: Option<Arc<LimitSet>>,
    /// Their own budgets (one per period).
    pub budgets: Box<[Budget]>,
}

/// The grant holds as many members as it may, none of them idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MembersFull(pub usize);

impl Members {
    /// The members of grant `grant` under `config`.
    pub fn new(grant: &str, config: PerUserConfig) -> Self {
        Self::with_capacity(grant, config, MAX_MEMBERS)
    }

    /// As [`Members::new`], holding at most `capacity` (tests).
    pub fn with_capacity(grant: &str, config: PerUserConfig, capacity: usize) -> Self {
        Self {
            grant: Arc::from(grant),
            config,
            by_user: ArcSwap::default(),
            capacity: capacity.max(1),
            fleet: ArcSwap::default(),
        }
    }

    /// These members under `config` (the grant's `perUser` changed): each
    /// member held keeps what their budgets counted in the periods
    /// `config` still has, and their limiters continue from where they
    /// were, so raising a budget mid-month neither starts anyone's month
    /// over (nor makes this process report less than it had, which the
    /// operator's ledger would take as the fleet spending less) nor lets
    /// a burst through; the fleet's spend stays for members made later.
    pub fn continued(&self, config: PerUserConfig) -> Self {
        let next = Self {
            grant: self.grant.clone(),
            config,
            by_user: ArcSwap::default(),
            capacity: self.capacity,
            fleet: ArcSwap::new(self.fleet.load_full()),
        };
        let members: HashMap<Box<str>, Arc<Member>> = self
            .by_user
            .load()
            .iter()
            .map(|(user, before)| {
                let limits = next.config.limits.as_ref().map(|l| Arc::new(LimitSet::new(l, before.limits.as_deref())));
                let budgets = Budget::merged(&next.config.budgets, |period| {
                    before.budgets.iter().find(|b| b.period == period).map_or_else(Arc::default, |b| b.state.clone())
                });
                (user.clone(), Arc::new(Member { id: before.id.clone(), limits, budgets }))
            })
            .collect();
        next.by_user.store(Arc::new(members));
        next
    }

    /// The per-member settings these members were made under.
    pub fn config(&self) -> &PerUserConfig {
        &self.config
    }

    /// Members held now.
    pub fn len(&self) -> usize {
        self.by_user.load().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `user`'s state, made on their first request.
    ///
    /// # Errors
    /// [`MembersFull`]: the grant holds [`MAX_MEMBERS`] members, none idle.
    pub fn member(&self, user: &str, now: jiff::Timestamp) -> Result<Arc<Member>, MembersFull> {
        if let Some(member) = self.by_user.load().get(user) {
            return Ok(member.clone());
        }
        let made = Arc::new(self.make(user));
        let mut outcome = Err(MembersFull(self.capacity));
        // Another worker may add the same member meanwhile: theirs is kept.
        self.by_user.rcu(|members| {
            if let Some(member) = members.get(user) {
                outcome = Ok(member.clone());
                return Arc::clone(members);
            }
            let mut next = HashMap::clone(members);
            if next.len() >= self.capacity {
                next.retain(|_, member| !member.idle(now));
                if next.len() >= self.capacity {
                    outcome = Err(MembersFull(self.capacity));
                    return Arc::new(next);
                }
            }
            next.insert(Box::from(user), made.clone());
            outcome = Ok(made.clone());
            Arc::new(next)
        });
        outcome
    }

    fn make(&self, user: &str) -> Member {
        let id: Arc<str> = Arc::from(waycast_crds::usage::BudgetScope::member_of(&self.grant, user));
        let limits = self.config.limits.as_ref().map(|limits| Arc::new(LimitSet::new(limits, None)));
        let budgets = Budget::merged(&self.config.budgets, |_| Arc::default());
        let member = Member { id, limits, budgets };
        if let Some(spends) = self.fleet.load().get(&member.id) {
            member.set_fleet(spends);
        }
        member
    }

    /// The members held now (to report what each spent).
    pub fn held(&self) -> Arc<HashMap<Box<str>, Arc<Member>>> {
        self.by_user.load_full()
    }

    /// Hands each member, held now or made later, what the fleet spent of
    /// their budgets (`fleet`, by member id).
    pub fn set_fleet(&self, fleet: MembersFleet) {
        let fleet = Arc::new(fleet);
        self.fleet.store(fleet.clone());
        for member in self.by_user.load().values() {
            if let Some(spends) = fleet.get(&member.id) {
                member.set_fleet(spends);
            }
        }
    }

    /// The grant's id.
    pub fn grant(&self) -> &str {
        &self.grant
    }
}

impl Member {
    fn set_fleet(&self, spends: &[(Period, FleetSpend)]) {
        for budget in &self.budgets {
            if let Some((_, spend)) = spends.iter().find(|(period, _)| *period == budget.period) {
                budget.state.set_fleet(*spend);
            }
        }
    }

    /// Whether letting it go loses nothing: its limiters are full again,
    /// no request of it is in flight, its budgets counted nothing in a
    /// period not over.
    fn idle(&self, now: jiff::Timestamp) -> bool {
        self.limits.as_ref().is_none_or(|limits| limits.is_idle())
            && self.budgets.iter().all(|budget| budget.state.counted() == (0, 0) || budget.state.ended(now))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

    use waycast_crds::config::LimitsConfig;

    use super::*;

    fn per_user(max_concurrent: u64) -> PerUserConfig {
        let limits =
            LimitsConfig { requests_per_minute: None, tokens_per_minute: None, max_concurrent: Some(max_concurrent) };
        PerUserConfig { limits: Some(limits), budgets: Vec::new() }
    }

    fn now() -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_800_000_000).unwrap()
    }

    #[test]
    fn a_member_is_one_state_known_by_a_digest_never_the_name() {
        let members = Members::new("team-a/developers", per_user(2));
        let alice = members.member("alice@example.com", now()).unwrap();
        assert!(Arc::ptr_eq(&alice, &members.member("alice@example.com", now()).unwrap()), "the same state again");
        let bob = members.member("bob@example.com", now()).unwrap();
        assert_ne!(alice.id, bob.id);
        assert!(alice.id.starts_with("user:team-a/developers:") && !alice.id.contains("alice"), "{}", alice.id);
        // Another grant's member of the same name is another state.
        let elsewhere = Members::new("team-b/ops", per_user(2)).member("alice@example.com", now()).unwrap();
        assert_ne!(alice.id, elsewhere.id);
    }

    #[test]
    fn a_changed_per_user_keeps_what_each_member_counted_in_the_periods_it_keeps() {
        use waycast_crds::spend::BudgetConfig;
        let budget = |period, tokens| BudgetConfig { period, tokens: Some(tokens), cost: None };
        let mut config = per_user(2);
        config.budgets = vec![budget(Period::Day, 100), budget(Period::Month, 1_000)];
        let members = Members::new("team-a/developers", config.clone());
        let alice = members.member("alice", now()).unwrap();
        let fleet: MembersFleet = [(alice.id.clone(), Vec::new())].into();
        members.set_fleet(fleet);
        // The day's budget raised, the month's dropped, a week's added.
        config.budgets = vec![budget(Period::Day, 500), budget(Period::Week, 2_000)];
        let next = members.continued(config.clone());
        assert_eq!(next.config(), &config);
        let continued = next.member("alice", now()).unwrap();
        assert_eq!(continued.id, alice.id, "the same member");
        let state =
            |member: &Member, period| member.budgets.iter().find(|b| b.period == period).map(|b| b.state.clone());
        assert!(
            Arc::ptr_eq(&state(&continued, Period::Day).unwrap(), &state(&alice, Period::Day).unwrap()),
            "the day's count goes on"
        );
        assert_eq!(continued.budgets.iter().find(|b| b.period == Period::Day).map(|b| b.tokens), Some(Some(500)));
        assert!(state(&continued, Period::Month).is_none() && state(&continued, Period::Week).is_some());
        assert!(continued.limits.is_some(), "limits continue");
        assert!(Arc::ptr_eq(&next.fleet.load_full(), &members.fleet.load_full()), "the fleet's spend is kept");
    }

    #[test]
    fn a_full_grant_lets_idle_members_go_and_refuses_while_none_is() {
        let members = Members::with_capacity("team-a/developers", per_user(1), 2);
        let alice = members.member("alice", now()).unwrap();
        let held = alice.limits.as_ref().unwrap().concurrent.as_ref().unwrap().take(1).unwrap();
        let _bob = members.member("bob", now()).unwrap();
        // Bob holds nothing: he makes room for Carol. Alice has a request
        // in flight: she stays.
        let _carol = members.member("carol", now()).unwrap();
        assert_eq!(members.len(), 2);
        assert!(Arc::ptr_eq(&alice, &members.member("alice", now()).unwrap()), "Alice kept her state");
        let carol_held = members.member("carol", now()).unwrap();
        let carol_place = carol_held.limits.as_ref().unwrap().concurrent.as_ref().unwrap().take(1).unwrap();
        assert_eq!(members.member("dave", now()).unwrap_err(), MembersFull(2), "both in flight: no room");
        drop((held, carol_place));
        assert!(members.member("dave", now()).is_ok(), "room once one is idle");
    }
}
