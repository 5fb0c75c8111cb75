//! What can go wrong in a reconcile: each error knows its metric label
//! (`waycast_operator_reconcile_errors_total`) and whether retrying can
//! help (a transient error is retried with backoff, another waits for a
//! change).

/// What can go wrong in a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The API server did not answer a request in time.
    #[error("Kubernetes API: no answer within {0:?}")]
    Timeout(std::time::Duration),
    /// An object could not be serialized (a bug, not user input).
    #[error("serialization: {0}")]
    Serialize(#[from] serde_json::Error),
    /// Local I/O: compressing the config, binding the admin listener.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The OS random number generator failed.
    #[error("the OS random number generator failed")]
    Random,
    /// An object lacks a namespace or name (the API server always sets them).
    #[error("object without {0}")]
    Incomplete(&'static str),
}

impl Error {
    /// Bounded label for `waycast_operator_reconcile_errors_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(status)) if status.code == 409 => "conflict",
            Error::Kube(kube::Error::Api(status)) if status.code == 422 => "invalid",
            Error::Kube(_) => "api",
            Error::Timeout(_) => "timeout",
            Error::Serialize(_) => "serialize",
            Error::Io(_) => "io",
            Error::Random => "random",
            Error::Incomplete(_) => "incomplete",
        }
    }

    /// Whether a retry may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Kube(_) | Error::Timeout(_) | Error::Random)
    }
}
