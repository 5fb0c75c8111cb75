//! How many pods share each rate limit: each pod enforces `1 / shares` of
//! every limit. Counted by `cluster::fleet` from the Gateway's live
//! heartbeats; 1 outside a cluster.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// The number of pods sharing each limit (1 until known).
#[derive(Debug)]
pub struct Fleet {
    pods: AtomicU32,
    /// While the count may not yet hold every sibling (a pod that just
    /// started): the Gateway's fewest pods count as a floor.
    counting: AtomicBool,
}

impl Default for Fleet {
    fn default() -> Self {
        Self { pods: AtomicU32::new(1), counting: AtomicBool::new(true) }
    }
}

impl Fleet {
    /// Pods sharing each limit, at least 1.
    pub fn shares(&self) -> u32 {
        self.pods.load(Ordering::Relaxed).max(1)
    }

    /// Pods sharing each limit; at least `minimum` (the pods the Gateway
    /// runs at least) until the count is known: a pod that has not yet seen
    /// its siblings' heartbeats does not take itself for the only one, and
    /// a fleet running fewer than its minimum later (pods lost) does not
    /// cut each survivor's share.
    pub fn shares_at_least(&self, minimum: u32) -> u32 {
        let pods = self.shares();
        if self.counting.load(Ordering::Relaxed) { pods.max(minimum) } else { pods }
    }

    /// The count is known from here on (the Lease watch: once it has seen
    /// the Gateway's fewest pods, or after a while in any case).
    pub fn counted(&self) {
        self.counting.store(false, Ordering::Relaxed);
    }

    /// Sets the count (tests and the Lease watch).
    pub fn set(&self, pods: u32) {
        self.pods.store(pods.max(1), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_never_zero() {
        let fleet = Fleet::default();
        fleet.set(0);
        assert_eq!(fleet.shares(), 1);
        fleet.set(3);
        assert_eq!(fleet.shares(), 3);
        assert_eq!((fleet.shares_at_least(2), fleet.shares_at_least(5)), (3, 5));
        fleet.counted();
        assert_eq!(fleet.shares_at_least(5), 3, "once counted, the Leases alone");
    }
}
