//! What compile says of each object: whether the Gateway serves it and
//! why not, by the object's `namespace/name`.

/// `namespace/name` of an object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ObjectKey {
    /// The key of a namespaced object.
    pub fn of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Self {
        Self { namespace: meta.namespace.clone().unwrap_or_default(), name: meta.name.clone().unwrap_or_default() }
    }

    /// This key as `(namespace, name)`, borrowed (a look-up in a map keyed
    /// by [`sort_key`](Self::sort_key)).
    pub fn as_pair(&self) -> (&str, &str) {
        (&self.namespace, &self.name)
    }

    /// `(namespace, name)`, borrowed: sorts objects in `ObjectKey` order
    /// without allocating (sorting 10,000 keys by owned keys made over half
    /// a million small allocations).
    pub fn sort_key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (&str, &str) {
        (meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default())
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Whether the Gateway serves an object, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Served.
    pub accepted: bool,
    /// A reason from `waycast_crds::condition::reasons`.
    pub reason: &'static str,
    /// For a person. Borrowed when constant: 10,000 served keys share
    /// one "the key is served".
    pub message: std::borrow::Cow<'static, str>,
}

impl Verdict {
    /// Served.
    pub fn accepted(reason: &'static str, message: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        Self { accepted: true, reason, message: message.into() }
    }

    /// Not served, because `reason`.
    pub fn refused(reason: &'static str, message: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        Self { accepted: false, reason, message: message.into() }
    }
}
