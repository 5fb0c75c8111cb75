//! How many pods share each rate limit: each pod enforces `1 / shares` of
//! every limit. Counted by `cluster::fleet` from the Gateway's live
//! heartbeats; 1 outside a cluster.

use std::sync::atomic::{AtomicU32, Ordering};

/// The number of pods sharing each limit (1 until known).
#[derive(Debug)]
pub struct Fleet {
    pods: AtomicU32,
}

impl Default for Fleet {
    fn default() -> Self {
        Self { pods: AtomicU32::new(1) }
    }
}

impl Fleet {
    /// Pods sharing each limit, at least 1.
    pub fn shares(&self) -> u32 {
        self.pods.load(Ordering::Relaxed).max(1)
    }

    /// Pods sharing each limit, at least `minimum` (the pods the Gateway
    /// runs at least: a pod that has not yet seen its siblings' heartbeats
    /// does not take itself for the only one).
    pub fn shares_at_least(&self, minimum: u32) -> u32 {
        self.shares().max(minimum)
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
    }
}
