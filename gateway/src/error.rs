//! The gateway's own errors: every error it answers a request with
//! ([`GatewayError`]: its status, code and headers here, its body in the
//! client's dialect, `crate::dialect`),
//! and why a config is refused as a whole ([`BuildError`]).
//!
//! Upstream errors are not here: an upstream's own 4xx/5xx passes through
//! unchanged. These are the gateway's own decisions and failures.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, StatusCode, header};
use waycast_crds::validate::Problems;

/// An error the gateway answers itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GatewayError {
    /// No `Authorization: Bearer` or `x-api-key` header.
    #[error("missing API key: send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'")]
    MissingKey,
    /// The key is not known.
    #[error("invalid API key")]
    InvalidKey,
    /// The key's `expiresAt` has passed.
    #[error("API key expired")]
    ExpiredKey,
    /// The key is disabled.
    #[error("API key disabled")]
    DisabledKey,
    /// A bearer token (a JWT) that is refused: its code says why.
    #[error("{0}")]
    TokenRefused(crate::identity::Refusal),
    /// A verified token whose holder no grant of this Gateway admits
    /// (`true`: not the grant they named in `x-waycast-grant`).
    #[error("{}", if *.0 { "the access grant named in x-waycast-grant does not admit you" } else { "no access grant of this gateway admits you" })]
    NoGrant(bool),
    /// Grants of several teams admit the token's holder and the request
    /// names none of them.
    #[error(
        "access grants of more than one namespace admit you: name the one to use in x-waycast-grant (namespace/name)"
    )]
    AmbiguousGrant,
    /// The grant holds as many members as it counts at once, none idle.
    #[error("this access grant serves at most {0} people at once on this gateway; try again shortly")]
    GrantFull(usize),
    /// The key may not use this model.
    #[error("this API key may not use model '{0}'")]
    ModelNotAllowed(String),
    /// No route for the model.
    #[error("model '{0}' does not exist or you do not have access to it")]
    UnknownModel(String),
    /// The body is larger than `maxRequestBodyBytes`.
    #[error("request body larger than {0} bytes")]
    BodyTooLarge(u64),
    /// The body is not valid JSON.
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(&'static str),
    /// The body is JSON but not an object.
    #[error("request body must be a JSON object")]
    NotAnObject,
    /// No `"model"` field.
    #[error("request body has no 'model' field")]
    MissingModel,
    /// `"model"` is not a string.
    #[error("'model' must be a string")]
    ModelNotString,
    /// A top-level field has the wrong type or value (`"stream": 1`,
    /// `"model": ""`).
    #[error("'{0}' {1}")]
    InvalidField(&'static str, &'static str),
    /// A `multipart/form-data` body that is not one (what is wrong).
    #[error("request body is not a valid multipart form: {0}")]
    InvalidForm(&'static str),
    /// `"model"` appears more than once.
    #[error("'model' appears more than once")]
    DuplicateModel,
    /// Request headers are larger than allowed.
    #[error("request headers larger than {0} bytes")]
    HeadersTooLarge(usize),
    /// Both Content-Length and Transfer-Encoding: a request-smuggling shape.
    #[error("request has both Content-Length and Transfer-Encoding")]
    AmbiguousLength,
    /// The client did not send its body in time.
    #[error("request body not received in time")]
    BodyTimeout,
    /// The client's body could not be read (connection broke, bad chunking).
    #[error("request body could not be read")]
    BodyRead,
    /// No such endpoint.
    #[error("unknown path {0}")]
    NotFound(String),
    /// The endpoint exists, the method does not.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// No backend could be connected to.
    #[error("upstream for model '{0}' is unreachable")]
    UpstreamUnreachable(String),
    /// Every address the backend's host name resolved to is refused by the
    /// egress guard (link-local/metadata, or the Gateway's denied ranges).
    #[error("upstream for model '{0}' resolves only to addresses the gateway may not reach")]
    EgressDenied(String),
    /// The upstream failed after connecting (reset, bad response).
    #[error("upstream for model '{0}' failed")]
    UpstreamFailed(String),
    /// The upstream answered an error whose body is not JSON (an HTML page
    /// from a proxy, a plain-text 502): replaced by an error in the
    /// client's dialect with the upstream's status, so SDKs can parse it.
    #[error("the upstream for model '{0}' answered HTTP {1} without a JSON error body")]
    UpstreamNotJson(String, u16),
    /// The request cannot be translated for the model's backend (a field
    /// with no counterpart in the backend's API: its path and why).
    #[error("this request cannot be sent to model '{0}': {1}")]
    Untranslatable(String, String),
    /// The model's backends do not offer the API asked for (a path of
    /// OpenAI's on an Anthropic-format backend, `/v1/responses` on a
    /// chat-only one).
    #[error("model '{0}' does not offer {1}: its backends do not serve it")]
    NotOffered(String, &'static str),
    /// The upstream did not answer in time.
    #[error("upstream for model '{0}' did not respond in time")]
    UpstreamTimeout(String),
    /// No config has been loaded yet.
    #[error("gateway is starting: no configuration loaded yet")]
    NotReady,
    /// A rate limit refused the request (429 with `Retry-After`).
    #[error("rate limit reached: {}; try again in {}", .0.describe(), crate::limit::duration_text(.0.retry_after_nanos))]
    RateLimited(crate::limit::Refusal),
    /// The rate-limit store did not answer and the Gateway fails closed.
    #[error("rate limits cannot be checked right now ({0}); try again shortly")]
    RateLimitUnavailable(crate::limit::redis::StoreError),
    /// A budget of the key or its namespace is spent for its period (429
    /// `insufficient_quota`, with `Retry-After` until the period starts over).
    #[error("budget reached: {} is spent; it starts over at {}", .0.describe(), .0.resets_at)]
    InsufficientQuota(crate::limit::Exhausted),
    /// A cost budget applies and the model is priced in another currency
    /// than the budgets count in (403: no spend of it can be counted).
    #[error(
        "model '{model}' is priced in {currency} and this key's budgets count {counted_in}: its cost cannot be counted against them"
    )]
    BudgetCurrency {
        /// The model.
        model: String,
        /// Its prices' currency.
        currency: String,
        /// The budgets' currency.
        counted_in: String,
    },
    /// The model is full and its queue refused the request (429 with
    /// `Retry-After`, in seconds).
    #[error("model '{model}' is at capacity: {}; try again in {retry_after}s", busy_text(*.reason))]
    ModelBusy {
        /// The model.
        model: String,
        /// Why the queue refused.
        reason: crate::sharing::Refused,
        /// Seconds to wait before trying again.
        retry_after: u64,
    },
}

fn busy_text(reason: crate::sharing::Refused) -> &'static str {
    use crate::sharing::{Refused, scheduler::Shed};
    match reason {
        Refused::Shed(Shed::Full) => "its queue is full",
        Refused::Shed(Shed::Displaced) => {
            "another request took this one's place in its full queue (a higher class's, or a team's holding less of it)"
        }
        Refused::Timeout | Refused::Closed => "the request waited in its queue for as long as the gateway allows",
    }
}

impl GatewayError {
    /// `model` is priced in another currency than the budgets that apply
    /// count in (`crate::limit::budgets_asked`).
    pub fn budget_currency(model: &str, mismatch: crate::limit::CurrencyMismatch) -> Self {
        Self::BudgetCurrency { model: model.to_owned(), currency: mismatch.currency, counted_in: mismatch.counted_in }
    }
}

impl From<crate::limit::Refused> for GatewayError {
    fn from(refused: crate::limit::Refused) -> Self {
        match refused {
            crate::limit::Refused::Limit(refusal) => Self::RateLimited(refusal),
            crate::limit::Refused::StoreFailed(failure) => Self::RateLimitUnavailable(failure),
            crate::limit::Refused::Budget(exhausted) => Self::InsufficientQuota(exhausted),
        }
    }
}

impl GatewayError {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        use GatewayError::*;
        match self {
            TokenRefused(crate::identity::Refusal::VerificationBusy) => StatusCode::TOO_MANY_REQUESTS,
            MissingKey | InvalidKey | ExpiredKey | DisabledKey | TokenRefused(_) | NoGrant(_) | AmbiguousGrant => {
                StatusCode::UNAUTHORIZED
            }
            ModelNotAllowed(_) | BudgetCurrency { .. } => StatusCode::FORBIDDEN,
            UnknownModel(_) | NotFound(_) | NotOffered(..) => StatusCode::NOT_FOUND,
            BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            InvalidJson(_) | NotAnObject | MissingModel | ModelNotString | InvalidField(..) | DuplicateModel
            | AmbiguousLength | BodyRead | Untranslatable(..) | InvalidForm(_) => StatusCode::BAD_REQUEST,
            HeadersTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            UpstreamUnreachable(_) | UpstreamFailed(_) | EgressDenied(_) => StatusCode::BAD_GATEWAY,
            UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            UpstreamNotJson(_, status) => StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY),
            NotReady => StatusCode::SERVICE_UNAVAILABLE,
            RateLimited(_) | ModelBusy { .. } | InsufficientQuota(_) | GrantFull(_) => StatusCode::TOO_MANY_REQUESTS,
            RateLimitUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The gateway's code for it: the metric label, and OpenAI's
    /// `error.code`.
    pub fn code(&self) -> &'static str {
        use GatewayError::*;
        match self {
            MissingKey => "missing_api_key",
            InvalidKey => "invalid_api_key",
            ExpiredKey => "expired_api_key",
            DisabledKey => "disabled_api_key",
            TokenRefused(refusal) => refusal.code(),
            NoGrant(_) => "no_grant",
            AmbiguousGrant => "ambiguous_grant",
            GrantFull(_) => "grant_full",
            ModelNotAllowed(_) => "model_not_allowed",
            UnknownModel(_) => "model_not_found",
            BodyTooLarge(_) => "request_too_large",
            InvalidJson(_) => "invalid_json",
            NotAnObject => "invalid_body",
            MissingModel => "missing_model",
            ModelNotString => "invalid_model",
            InvalidField("model", _) => "invalid_model",
            InvalidField(..) => "invalid_type",
            DuplicateModel => "duplicate_model",
            InvalidForm(_) => "invalid_form",
            HeadersTooLarge(_) => "headers_too_large",
            AmbiguousLength => "ambiguous_length",
            BodyTimeout => "body_timeout",
            BodyRead => "body_read_error",
            NotFound(_) => "unknown_url",
            MethodNotAllowed => "method_not_allowed",
            UpstreamUnreachable(_) => "upstream_unreachable",
            EgressDenied(_) => "egress_denied",
            UpstreamNotJson(..) => "upstream_error",
            UpstreamFailed(_) => "upstream_failed",
            UpstreamTimeout(_) => "upstream_timeout",
            Untranslatable(..) => "untranslatable_request",
            NotOffered(..) => "unsupported_endpoint",
            NotReady => "not_ready",
            RateLimited(_) => "rate_limit_exceeded",
            RateLimitUnavailable(_) => "rate_limit_unavailable",
            ModelBusy { .. } => "model_at_capacity",
            InsufficientQuota(_) => "insufficient_quota",
            BudgetCurrency { .. } => "model_priced_in_another_currency",
        }
    }

    /// The full response with `body` (the error in the client's dialect,
    /// `crate::dialect`), with `Connection: close` where the connection
    /// state cannot be trusted any more.
    pub fn response<B: From<Bytes>>(&self, body: Bytes) -> Response<B> {
        let mut response = Response::new(B::from(body));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if matches!(self, GatewayError::AmbiguousLength | GatewayError::BodyRead | GatewayError::BodyTimeout) {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if matches!(
            self,
            GatewayError::MissingKey | GatewayError::InvalidKey | GatewayError::ExpiredKey | GatewayError::DisabledKey
        ) {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if matches!(self, GatewayError::TokenRefused(crate::identity::Refusal::VerificationBusy)) {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(1));
        } else if matches!(
            self,
            GatewayError::TokenRefused(_) | GatewayError::NoGrant(_) | GatewayError::AmbiguousGrant
        ) {
            // RFC 6750: a token presented and refused.
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer error=\"invalid_token\""));
        }
        match self {
            GatewayError::RateLimited(refusal) => refusal.apply(headers),
            GatewayError::RateLimitUnavailable(_) => drop(headers.insert(header::RETRY_AFTER, HeaderValue::from(1))),
            GatewayError::InsufficientQuota(exhausted) => {
                let seconds = exhausted.retry_after_seconds(jiff::Timestamp::now());
                drop(headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds)));
                // The OpenAI SDKs retry a 429 at once unless told not to;
                // a spent budget comes back only with its period.
                drop(headers.insert(HeaderName::from_static("x-should-retry"), HeaderValue::from_static("false")));
            }
            GatewayError::ModelBusy { retry_after, .. } => {
                drop(headers.insert(header::RETRY_AFTER, HeaderValue::from(*retry_after)));
            }
            _ => {}
        }
        response
    }
}

/// Why a config was refused as a whole.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Its version or settings are invalid.
    #[error("config is invalid: {0}")]
    Invalid(Problems),
    /// A TLS setup of the config's own (Redis) failed.
    #[error("cannot set up TLS: {0}")]
    Tls(String),
    /// The resources lent were not made for this config (a bug).
    #[error("internal: {0} was not lent for this config")]
    NotLent(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_design() {
        let cases = [
            (GatewayError::MissingKey, 401),
            (GatewayError::ExpiredKey, 401),
            (GatewayError::ModelNotAllowed("m".into()), 403),
            (GatewayError::UnknownModel("m".into()), 404),
            (GatewayError::BodyTooLarge(1), 413),
            (GatewayError::InvalidJson("x"), 400),
            (GatewayError::HeadersTooLarge(1), 431),
            (GatewayError::UpstreamUnreachable("m".into()), 502),
            (GatewayError::EgressDenied("m".into()), 502),
            (GatewayError::UpstreamTimeout("m".into()), 504),
        ];
        for (error, status) in cases {
            assert_eq!(error.status().as_u16(), status, "{error:?}");
        }
    }
}
