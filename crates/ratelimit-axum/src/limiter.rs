//! Limits checked inside a handler, once it knows the key.

use std::fmt;

use axum_core::response::{IntoResponse, IntoResponseParts, Response, ResponseParts};
use ratelimit_core::{Policy, Store, StoreError};
use ratelimit_tower::headers::RateLimitHeaders;
use ratelimit_tower::{
    Decisions, FailurePolicy, HttpRejections, Key, PermitGuard, PolicyDecision, Rejection,
};

/// A named limit a handler checks itself, after it has parsed what the key
/// depends on: login attempts per username from the body, emails per
/// recipient. Cheap to clone; put it in your router's state.
///
/// A denial is a [`QuotaExceeded`], which answers `429` with `Retry-After`,
/// the rate-limit headers and a problem+json body, like the layer; an allowed
/// check gives [`Granted`], which adds the headers to your response and
/// holds a concurrency policy's permit until it is dropped.
///
/// When the store fails, [`on_failure`](Limiter::on_failure) decides, for
/// outages only ([`StoreError::is_outage`]), as on the layer; any other error
/// (a policy conflict, a full in-memory store, a reply that does not decode)
/// is refused, `500` (`503` for a full store), and logged.
///
/// Its decisions are recorded as the layer's are, so a handler's limit shows
/// in the same dashboards: `ratelimit_decisions_total` by policy name and
/// outcome, `ratelimit_near_limit_total` and the store call durations (with
/// the feature `metrics`), and a `debug` event per decision (see
/// [`ratelimit_tower::metrics`]; keys never appear, only the policy's name).
///
/// Behind a [`RateLimitLayer`](crate::RateLimitLayer), a response keeps this
/// limiter's rate-limit fields and the layer adds its own, as it does to
/// those of a second limiter's [`Granted`] in the same response (see
/// [`ratelimit_tower::headers`]). A refusal's `Retry-After` stays this
/// limiter's.
///
/// ```
/// use axum_core::response::IntoResponse;
/// use ratelimit_axum::{Limiter, QuotaExceeded};
/// use ratelimit_core::{MemoryStore, Policy};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let logins = Limiter::new(
///     MemoryStore::new(),
///     Policy::sliding_window_log(5, Duration::from_secs(900))?.with_name("login")?,
/// );
///
/// // In a handler, after parsing the username from the body:
/// async fn login(logins: &Limiter<MemoryStore>, username: &str) -> Result<impl IntoResponse, QuotaExceeded> {
///     let granted = logins.check(username.as_bytes(), 1).await?;
///     Ok((granted, "welcome"))
/// }
/// # let _ = login(&logins, "alice").await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Limiter<St> {
    store: St,
    policy: Policy,
    headers: RateLimitHeaders,
    failure: FailurePolicy,
}

impl<St> fmt::Debug for Limiter<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("policy", &self.policy)
            .field("headers", &self.headers)
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}

impl<St: Store + Clone> Limiter<St> {
    /// Checks keys against `policy` in `store`, sending the IETF headers,
    /// granting checks while the store is down ([`FailurePolicy::Open`]), as
    /// the layer does: an outage of the store is not an outage of the
    /// service (see [`FailurePolicy`]). A limit that must hold through an
    /// outage, such as login attempts, says
    /// [`on_failure(FailurePolicy::Closed)`](Limiter::on_failure).
    pub fn new(store: St, policy: Policy) -> Self {
        Limiter {
            store,
            policy,
            headers: RateLimitHeaders::default(),
            failure: FailurePolicy::default(),
        }
    }

    /// Which rate-limit headers to send (default: the IETF fields).
    #[must_use]
    pub fn headers(mut self, headers: RateLimitHeaders) -> Self {
        self.headers = headers;
        self
    }

    /// What to do when the store cannot decide because of an outage
    /// (default [`FailurePolicy::Open`], as on the layer; `Closed` answers
    /// `503`). Errors that are not outages are refused whatever this says.
    #[must_use]
    pub fn on_failure(mut self, failure: FailurePolicy) -> Self {
        self.failure = failure;
        self
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Checks `key` at `cost`, consuming it when allowed. A policy in shadow
    /// mode ([`Policy::with_shadow`]) is checked and consumes, but is always
    /// granted (its decision, denied or not, is in the headers).
    ///
    /// `key` is a value (a username, an email address) and is hashed as the
    /// layer hashes every value ([`Key`]): a `Limiter` and a layer under one
    /// policy and store share the budget of one value, and no store holds
    /// the value itself.
    pub async fn check(&self, key: &[u8], cost: u64) -> Result<Granted, QuotaExceeded> {
        let key = Key::from(key);
        // Through the layer's own recording, so a limit checked here shows
        // in the same metrics and events as the layer's.
        match ratelimit_tower::metrics::recorded_check(&self.store, &key, &self.policy, cost).await
        {
            Ok(decision) => {
                let allowed = decision.is_allowed() || self.policy.is_shadow();
                let mut permit = PermitGuard::default();
                if let Some(id) = decision.permit() {
                    permit.hold(&self.store, &key, &self.policy, id);
                }
                let decisions =
                    Decisions::new(vec![PolicyDecision::new(self.policy.clone(), decision)]);
                if allowed {
                    Ok(Granted {
                        decisions: Some(decisions),
                        headers: self.headers,
                        _permit: permit,
                    })
                } else {
                    Err(self.refuse(Rejection::Limited(decisions)))
                }
            }
            Err(StoreError::CostExceedsLimit { policy, cost, max }) => {
                Err(self.refuse(Rejection::CostTooHigh { policy, cost, max }))
            }
            Err(error) if self.failure.allows(&error) => {
                tracing::warn!(
                    policy = self.policy.name(),
                    error = %error,
                    "rate-limit store could not decide; the failure policy lets the request through"
                );
                Ok(Granted {
                    decisions: None,
                    headers: self.headers,
                    _permit: PermitGuard::default(),
                })
            }
            Err(error) if error.is_outage() || matches!(error, StoreError::Full { .. }) => {
                tracing::warn!(
                    policy = self.policy.name(),
                    error = %error,
                    "rate-limit store could not decide; the request is refused"
                );
                Err(self.refuse(Rejection::Unavailable(std::sync::Arc::new(error))))
            }
            Err(error) => {
                tracing::error!(
                    policy = self.policy.name(),
                    error = %error,
                    kind = error.kind(),
                    "rate-limit store answered with an error that is not an outage; \
                     the request is refused"
                );
                Err(self.refuse(Rejection::Internal(std::sync::Arc::new(error))))
            }
        }
    }

    /// A refusal, answered as the layer would with this limiter's headers.
    fn refuse(&self, rejection: Rejection) -> QuotaExceeded {
        QuotaExceeded {
            rejection,
            rejections: HttpRejections::default().headers(self.headers),
        }
    }
}

/// An allowed check: add it to your response to send the rate-limit headers
/// (merged with those the response already carries, another `Granted`'s).
///
/// Under a concurrency policy it holds the permit it was granted, renewed
/// every third of the policy's lease while it lives (so work that outlasts
/// the lease keeps its slot) and released when it is dropped: keep it for as
/// long as the work it guards runs (adding it to the response drops it once
/// the response is built). If the process dies, the permit ends with its
/// lease.
#[derive(Debug)]
pub struct Granted {
    decisions: Option<Decisions>,
    headers: RateLimitHeaders,
    _permit: PermitGuard,
}

impl Granted {
    /// The decision, unless the store failed and the limiter failed open.
    pub fn decisions(&self) -> Option<&Decisions> {
        self.decisions.as_ref()
    }
}

impl IntoResponseParts for Granted {
    type Error = std::convert::Infallible;

    fn into_response_parts(self, mut res: ResponseParts) -> Result<ResponseParts, Self::Error> {
        if let Some(decisions) = &self.decisions {
            self.headers.apply(decisions, res.headers_mut());
        }
        Ok(res)
    }
}

/// A refused request, as an axum response: `429` with `Retry-After`, the
/// rate-limit headers and an `application/problem+json` body (RFC 9457) of
/// type `https://iana.org/assignments/http-problem-types#quota-exceeded`
/// naming the violated policies and the retry delay; `503` when the store is
/// unavailable. The same response as the layer's ([`HttpRejections`]).
///
/// To answer differently, map it in the handler:
/// `limiter.check(key, 1).await.map_err(|refused| my_response(refused.rejection()))`.
#[derive(Debug, Clone)]
pub struct QuotaExceeded {
    rejection: Rejection,
    rejections: HttpRejections,
}

impl QuotaExceeded {
    /// Why the request was refused.
    pub fn rejection(&self) -> &Rejection {
        &self.rejection
    }
}

impl fmt::Display for QuotaExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.rejection.fmt(f)
    }
}

impl std::error::Error for QuotaExceeded {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.rejection)
    }
}

impl IntoResponse for QuotaExceeded {
    fn into_response(self) -> Response {
        self.rejections
            .response(&self.rejection)
            .map(axum_core::body::Body::from)
    }
}
