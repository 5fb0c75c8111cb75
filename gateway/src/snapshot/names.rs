//! Which route a model name means to a key: names are a team's own.
//!
//! ```text
//! name ─► candidates (every route that has it as name or alias, one per owner)
//!      ─► for the key: its own namespace's route, else the platform's,
//!         else one it opted in to (`namespace/pattern` in its models)
//!      ─► visible to the key's namespace? (`keyNamespaces`) else none
//! ```
//!
//! A team that names a model `llama` never captures another team's
//! requests for `llama`: those resolve in their own namespace, then among
//! the platform's models, and reach the team's model only when their key
//! names it.

use std::collections::HashMap;

/// A namespace as a small number, so that a key's and a route's owner
/// compare as integers per request.
pub type NamespaceId = u32;

/// The owner of a platform model (no namespace).
pub const PLATFORM: NamespaceId = NamespaceId::MAX;

/// Namespaces numbered in the order first seen. Owned: a key's config is
/// dropped as soon as its entry is built.
#[derive(Default, Clone)]
pub struct Namespaces(HashMap<Box<str>, NamespaceId>);

impl Namespaces {
    /// The number of `namespace` (numbered now if new).
    pub fn id(&mut self, namespace: &str) -> NamespaceId {
        if let Some(id) = self.0.get(namespace) {
            return *id;
        }
        let next = NamespaceId::try_from(self.0.len()).unwrap_or(PLATFORM - 1).min(PLATFORM - 1);
        self.0.insert(namespace.into(), next);
        next
    }

    /// The number of `namespace`, if it was seen.
    pub fn get(&self, namespace: &str) -> Option<NamespaceId> {
        self.0.get(namespace).copied()
    }
}

/// The routes one name leads to: nearly always one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Candidates {
    /// One route has the name.
    One(usize),
    /// Several owners' routes have it.
    Many(Box<[usize]>),
}

impl Candidates {
    /// The route indices.
    pub fn as_slice(&self) -> &[usize] {
        match self {
            Self::One(index) => std::slice::from_ref(index),
            Self::Many(indices) => indices,
        }
    }

    /// Adds `index` (routes are added in config order).
    pub fn add(&mut self, index: usize) {
        *self = match std::mem::replace(self, Self::One(0)) {
            Self::One(first) => Self::Many(Box::new([first, index])),
            Self::Many(indices) => Self::Many(indices.iter().copied().chain(std::iter::once(index)).collect()),
        };
    }
}

/// How near a route is to a key, lower first: its own namespace's, the
/// platform's, one it opted in to. `None`: another team's it did not opt
/// in to, which the key cannot reach at all.
pub fn rank(route_owner: NamespaceId, key_namespace: NamespaceId, opted_in: bool) -> Option<u8> {
    if route_owner == key_namespace {
        Some(0)
    } else if route_owner == PLATFORM {
        Some(1)
    } else if opted_in {
        Some(2)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_prefers_its_own_namespace_then_the_platform_then_what_it_opted_in_to() {
        let (own, other) = (3, 7);
        assert_eq!(rank(own, own, false), Some(0));
        assert_eq!(rank(PLATFORM, own, false), Some(1));
        assert_eq!(rank(other, own, true), Some(2));
        assert_eq!(rank(other, own, false), None, "another team's model is out of reach without an opt-in");
        let mut candidates = Candidates::One(4);
        candidates.add(9);
        candidates.add(11);
        assert_eq!(candidates.as_slice(), [4, 9, 11]);
    }

    #[test]
    fn namespaces_are_numbered_once() {
        let mut namespaces = Namespaces::default();
        let a = namespaces.id("team-a");
        let b = namespaces.id("team-b");
        assert_ne!(a, b);
        assert_eq!(namespaces.id("team-a"), a);
        assert_eq!(namespaces.get("team-b"), Some(b));
        assert_eq!(namespaces.get("team-c"), None);
        assert_ne!(a, PLATFORM);
    }
}
