//! Limits checked inside a handler, once it knows the key.

use std::fmt;

use axum_core::response::{IntoResponse, IntoResponseParts, Response, ResponseParts};
use ratelimit_core::{Decision, Policy, Store, StoreError};
use ratelimit_tower::headers::RateLimitHeaders;
use ratelimit_tower::metrics::Recorder;
use ratelimit_tower::{
    Decisions, FailurePolicy, HttpRejections, Key, PermitGuard, PolicyDecision, Rejection,
};

use crate::reservation::Reservation;

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
/// Work whose cost is known only once it is done (tokens generated, bytes
/// sent) goes in two phases: [`reserve`](Limiter::reserve) an estimate
/// (refused like a check when it does not fit), do the work, then
/// [`settle`](crate::Reservation::settle) the [`Reservation`] to the actual
/// cost. A cost above the estimate is charged even past the limit, a debt
/// the key's next requests wait out; one below is given back. A reservation
/// dropped unsettled costs its estimate. [`peek`](Limiter::peek) reads what
/// a key has left without consuming anything.
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
    /// Records each check as a layer does, hashing keys in logs with a seed
    /// drawn when the limiter is made.
    recorder: Recorder,
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
            recorder: Recorder::default(),
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
    /// `key` is made into a [`Key`] as the layer makes its keys: a value (a
    /// username, an email address, as bytes or text) is hashed, so a
    /// `Limiter` and a layer under one policy and store share the budget of
    /// one value and no store holds the value itself; a client's address
    /// (an [`IpAddr`](std::net::IpAddr), such as `ConnectInfo`'s) is keyed
    /// as [`PeerIp`](struct@ratelimit_tower::PeerIp) keys it, an IPv6 client
    /// by its /64, so it cannot take a fresh budget with each address of it.
    ///
    /// ```
    /// use ratelimit_axum::{Limiter, MemoryStore, Policy};
    /// use std::net::IpAddr;
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let per_client = Limiter::new(
    ///     MemoryStore::new(),
    ///     Policy::fixed_window(1, Duration::from_secs(60))?.with_name("logins-per-client")?,
    /// );
    /// let first: IpAddr = "2001:db8:1:2::1".parse()?;
    /// let second: IpAddr = "2001:db8:1:2::2".parse()?;
    /// assert!(per_client.check(first, 1).await.is_ok());
    /// // Another address of the same /64: the same client.
    /// assert!(per_client.check(second, 1).await.is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn check(&self, key: impl Into<Key>, cost: u64) -> Result<Granted, QuotaExceeded> {
        let key = key.into();
        let decision = self.decide(&key, cost).await?;
        let mut permit = PermitGuard::default();
        if let Some(id) = decision.as_ref().and_then(Decision::permit) {
            permit.hold(&self.store, &key, &self.policy, id);
        }
        Ok(Granted {
            decisions: decision.map(|d| decisions_of(&self.policy, d)),
            headers: self.headers,
            _permit: permit,
        })
    }

    /// Reserves `estimate` of `key` (made into a [`Key`] as [`check`](Self::check)
    /// makes it) for work whose cost is known only once it is done (tokens
    /// generated, bytes sent): consumed now, and refused
    /// as [`check`](Self::check) refuses when the estimate does not fit. Then
    /// [`settle`](Reservation::settle) it to the actual cost, which charges
    /// a cost above the estimate even past the limit (a debt, which the
    /// key's next requests wait out) and gives back one below it;
    /// [`refund`](Reservation::refund) it if the work did not happen; or
    /// drop it when it cost the estimate, which needs nothing more.
    ///
    /// A concurrency policy holds permits, which are not consumed and
    /// cannot be settled, and a store without settlements
    /// ([`Store::supports_settlement`]: a `MultiRegionStore`) could never
    /// charge a cost above the estimate: their reservations are refused
    /// (`500`, logged), as any other configuration mistake. Check
    /// [`Policy::supports_settlement`] and [`Store::supports_settlement`]
    /// when the limiter is built.
    ///
    /// ```
    /// use ratelimit_axum::{Limiter, MemoryStore, Policy, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // 10,000 tokens an hour per tenant, in bursts of up to 10,000.
    /// let tokens = Limiter::new(
    ///     MemoryStore::new(),
    ///     Policy::token_bucket(10_000, Rate::per_hour(10_000))?.with_name("tokens")?,
    /// );
    /// let reservation = tokens.reserve(b"tenant-7", 500).await?;
    /// // ... the work, which turns out to cost 1,200 tokens ...
    /// let granted = reservation.settle(1_200).await?;
    /// let left = granted.decisions().and_then(|d| d.tightest()).map(|d| d.decision().remaining());
    /// assert_eq!(left, Some(8_800));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reserve(
        &self,
        key: impl Into<Key>,
        estimate: u64,
    ) -> Result<Reservation<St>, QuotaExceeded> {
        if !self.store.supports_settlement(&self.policy) {
            let error = StoreError::Unsupported {
                policy: self.policy.name().to_owned(),
                algorithm: self.policy.algorithm().kind(),
                operation: "settle",
            };
            tracing::error!(
                policy = self.policy.name(),
                error = %error,
                "a reservation the store cannot settle under this policy; the request is refused"
            );
            return Err(self.refuse(Rejection::Internal(std::sync::Arc::new(error))));
        }
        let key = key.into();
        let asked = tokio::time::Instant::now();
        let decision = self.decide(&key, estimate).await?;
        Ok(Reservation::new(
            self.store.clone(),
            self.policy.clone(),
            key.as_bytes().to_vec(),
            estimate,
            (decision, asked),
            self.headers,
        ))
    }

    /// What `key` (made into a [`Key`] as [`check`](Self::check) makes it)
    /// has left under the policy, consuming nothing: the decision a request
    /// of cost 0 gets (denied only while the key is blocked or in debt), on
    /// every store.
    pub async fn peek(&self, key: impl Into<Key>) -> Result<Decision, StoreError> {
        self.store
            .check(key.into().as_bytes(), &self.policy, 0)
            .await
    }

    /// Decides `key` at `cost`: the decision when the request may go on
    /// (allowed, or denied under a shadow policy), `None` when the store
    /// failed and the failure policy lets it through, else the refusal.
    async fn decide(&self, key: &Key, cost: u64) -> Result<Option<Decision>, QuotaExceeded> {
        // Through the layer's own recording, so a limit checked here shows
        // in the same metrics and events as the layer's.
        match self
            .recorder
            .check(&self.store, key, &self.policy, cost)
            .await
        {
            Ok(decision) if decision.is_allowed() || self.policy.is_shadow() => Ok(Some(decision)),
            Ok(decision) => {
                Err(self.refuse(Rejection::Limited(decisions_of(&self.policy, decision))))
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
                Ok(None)
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

/// One decision under `policy`, as the headers and rejections take it.
pub(crate) fn decisions_of(policy: &Policy, decision: Decision) -> Decisions {
    Decisions::new(vec![PolicyDecision::new(policy.clone(), decision)])
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
    pub(crate) decisions: Option<Decisions>,
    pub(crate) headers: RateLimitHeaders,
    pub(crate) _permit: PermitGuard,
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
