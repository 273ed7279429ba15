//! Rate limiting for axum: one dependency.
//!
//! ```toml
//! [dependencies]
//! axum = "0.8"
//! tokio = { version = "1", features = ["full"] }
//! ratelimit-axum = "0.1"
//! ```
//!
//! This crate turns on what axum needs in `ratelimit-tower` (the peer address
//! from `ConnectInfo`, routes from `MatchedPath`) and re-exports what a
//! service uses: the layer ([`RateLimitLayer`], [`Rule`], [`Limits`] for
//! limits chosen per request, [`Rejection`] for custom refusals), the key
//! extractors ([`PeerIp`](struct@crate::PeerIp), [`ClientIp`], [`HeaderKey`], ...), the policies
//! ([`Policy`], [`Rate`]), the stores ([`MemoryStore`]; `RedisStore`,
//! `MultiRegionStore` and `LeasedStore` with their features), the decision
//! types, and the types these return or take ([`And`], [`HttpRejections`],
//! [`RuleProvider`], [`Cidr`], [`CidrError`]): import from this crate only.
//! The rest is in the re-exported crates [`ratelimit_core`] and
//! [`ratelimit_tower`] (the `config` module, `for_errors` layers, the
//! service type `RateLimit`).
//!
//! | feature | what it adds |
//! |---|---|
//! | `redis` | `RedisStore`: one limit shared by every instance |
//! | `sentinel` | `RedisStore::sentinel_builder`, for a master behind Redis Sentinel |
//! | `redis-cluster` | `RedisStore::cluster_builder`, for a Redis Cluster |
//! | `tls` | `rediss://` URLs |
//! | `bb8` | `RedisStore::bb8_builder`, on the application's own `bb8` pool |
//! | `multi-region` | `MultiRegionStore`: one limit across regions, each deciding in its own Redis |
//! | `lease` | `LeasedStore`: hot keys decided locally from leased batches (approximate) |
//! | `metrics` | decisions, the layer's and [`Limiter`]'s, counted through the `metrics` facade |
//! | `config` | policies and rules from TOML or JSON, reloadable (`ratelimit_tower::config`) |
//! | `tonic` | tonic's `TcpConnectInfo` as a peer address, for gRPC served beside axum |
//!
//! Each feature turns on the feature of the same name in `ratelimit-tower`,
//! which turns on `ratelimit-core`'s where that crate has one (the store
//! features and `metrics`; `config` and `tonic` are `ratelimit-tower`'s
//! alone), and the stores it adds are named from this crate:
//!
//! ```
//! # #[cfg(feature = "lease")]
//! # fn leased() -> Result<(), ratelimit_axum::PolicyError> {
//! // features = ["lease"]
//! use ratelimit_axum::{LeasedStore, MemoryStore, PeerIp, Policy, Rate, RateLimitLayer};
//!
//! let store = LeasedStore::new(MemoryStore::new());
//! let layer = RateLimitLayer::new(store, Policy::gcra(1_000, Rate::per_second(1_000))?, PeerIp);
//! # let _ = layer;
//! # Ok(())
//! # }
//! # #[cfg(feature = "multi-region")]
//! # fn regions() -> Option<ratelimit_axum::MultiRegionStore> { None }
//! ```
//!
//! In a file that also uses tower's own `tower::limit::RateLimitLayer`, name
//! this crate with a short alias rather than importing both layers:
//!
//! ```
//! use ratelimit_axum as rl;
//! use std::time::Duration;
//! use tower::limit::RateLimitLayer;
//!
//! # fn main() -> Result<(), rl::PolicyError> {
//! let per_client = rl::RateLimitLayer::new(
//!     rl::MemoryStore::new(),
//!     rl::Policy::fixed_window(100, Duration::from_secs(60))?,
//!     rl::PeerIp,
//! );
//! let overall = RateLimitLayer::new(1_000, Duration::from_secs(1));
//! # let _ = (per_client, overall);
//! # Ok(())
//! # }
//! ```
//!
//! What this crate adds to axum:
//!
//! - [`RateLimitInfo`]: an extractor that gives a handler the decisions the
//!   rate-limit layer made for the request (policy, limit, remaining, reset,
//!   and the estimate reserved by a rule that settles its cost after the
//!   response, [`Settlement`]), so it can show a user how much quota is left.
//! - [`Limiter`]: a limit a handler checks itself once it knows the key (login
//!   attempts per username from the body); [`QuotaExceeded`] is its `429`
//!   rejection (problem+json, `Retry-After`, rate-limit headers) and
//!   [`Granted`] adds the headers to an allowed response. For work whose
//!   cost is known only once it is done, [`Limiter::reserve`] an estimate
//!   and settle the [`Reservation`] to the actual cost.
//! - [`RateLimitHeaders`]: which headers the layer and the limiter send (the
//!   IETF `RateLimit-Policy`/`RateLimit` fields by default, the legacy
//!   `X-RateLimit-*` fields on request).
//!
//! Per-route costs from one budget: give each route the same layer (same
//! store, same policy, so the same key) with its own cost, next to the route:
//!
//! ```
//! use axum::{Router, routing::get};
//! use ratelimit_axum::{HeaderKey, MemoryStore, Policy, Rate, RateLimitLayer};
//!
//! # fn main() -> Result<(), ratelimit_axum::PolicyError> {
//! let budget = RateLimitLayer::new(
//!     MemoryStore::new(),
//!     Policy::gcra(100, Rate::per_minute(100))?.with_name("api")?,
//!     HeaderKey::new(http::HeaderName::from_static("x-api-key")),
//! );
//! let app: Router = Router::new()
//!     .route("/search", get(|| async { "results" }).route_layer(budget.clone().cost(1)))
//!     .route("/export", get(|| async { "file" }).route_layer(budget.cost(10)));
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! ```
//! use ratelimit_axum::RateLimitInfo;
//!
//! async fn handler(info: RateLimitInfo) -> String {
//!     match info.tightest() {
//!         Some(entry) => format!(
//!             "{} of {} left under {}",
//!             entry.decision().remaining(),
//!             entry.decision().limit(),
//!             entry.policy().name(),
//!         ),
//!         None => String::from("not limited"),
//!     }
//! }
//! # let _ = handler;
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

mod limiter;
mod reservation;

pub use limiter::{Granted, Limiter, QuotaExceeded};
pub use reservation::{Reservation, SettleFailed};

/// The store and policy crate, whole.
pub use ratelimit_core;
/// The Tower layer crate, whole (with its feature `axum` on).
pub use ratelimit_tower;

// What an axum service uses, so this crate alone is a complete dependency.
// The store that decides hot keys from leased batches (feature `lease`).
#[cfg(feature = "lease")]
#[doc(no_inline)]
pub use ratelimit_core::LeasedStore;
// The store of one limit across regions (feature `multi-region`).
#[cfg(feature = "multi-region")]
#[doc(no_inline)]
pub use ratelimit_core::multi_region::MultiRegionStore;
// The Redis store (feature `redis`).
#[cfg(feature = "redis")]
#[doc(no_inline)]
pub use ratelimit_core::redis::RedisStore;
#[doc(no_inline)]
pub use ratelimit_core::{
    Decision, MemoryStore, Period, Policy, PolicyError, Rate, Store, StoreError,
};
#[doc(no_inline)]
pub use ratelimit_tower::headers::{RateLimitHeaders, ResetFormat};
#[doc(no_inline)]
pub use ratelimit_tower::{
    ActualCost, ClientIp, Composite, Cost, Decisions, FailurePolicy, Fallback, ForwardingHeader,
    GlobalKey, HeaderKey, Key, KeyExtractor, Limits, MissingKey, Mode, NoKey, PeerAddr, PeerIp,
    PolicyDecision, RateLimitLayer, Rejection, RouteKey, Rule, SettleError, Settlement, Stats,
    TrustedProxies,
};
// Named by what the items above return or take: `RateLimitLayer::and`,
// the layer's default refusals, `RateLimitLayer::with_rules`, and
// `TrustedProxies`' networks and their parse error.
#[doc(no_inline)]
pub use ratelimit_tower::{And, Cidr, CidrError, HttpRejections, RuleProvider};

use std::convert::Infallible;
use std::fmt;
use std::ops::Deref;

use axum_core::extract::{FromRequestParts, OptionalFromRequestParts};
use axum_core::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;

/// The rate-limit decisions for this request, put there by
/// `ratelimit_tower::RateLimitLayer`.
///
/// For a limit whose cost is settled after the response ([`Settlement`]),
/// the decision is the reservation's: it reports what is left once the
/// estimate is taken, and [`estimate`](RateLimitInfo::estimate) (or
/// [`PolicyDecision::estimate`] per limit) says what that estimate was. The
/// response's own `RateLimit` fields report what is left after the
/// settlement.
///
/// Extracting it from a request that did not pass through the layer is a
/// [`MissingRateLimitLayer`] rejection (500), a configuration error. Use
/// `Option<RateLimitInfo>` for routes where the layer is optional.
#[derive(Debug, Clone)]
pub struct RateLimitInfo(pub Decisions);

impl RateLimitInfo {
    /// The estimate this request reserved under the limits that settle its
    /// cost after the response (the largest, when several do); `None` when
    /// none does.
    ///
    /// ```
    /// use ratelimit_axum::RateLimitInfo;
    ///
    /// async fn complete(info: RateLimitInfo) -> String {
    ///     match info.estimate() {
    ///         Some(estimate) => format!("{estimate} reserved; the response settles the rest"),
    ///         None => String::from("charged up front"),
    ///     }
    /// }
    /// # let _ = complete;
    /// ```
    pub fn estimate(&self) -> Option<u64> {
        self.0.iter().filter_map(PolicyDecision::estimate).max()
    }
}

impl Deref for RateLimitInfo {
    type Target = Decisions;

    fn deref(&self) -> &Decisions {
        &self.0
    }
}

impl<S: Send + Sync> FromRequestParts<S> for RateLimitInfo {
    type Rejection = MissingRateLimitLayer;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Decisions>()
            .cloned()
            .map(RateLimitInfo)
            .ok_or(MissingRateLimitLayer)
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for RateLimitInfo {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<Decisions>()
            .cloned()
            .map(RateLimitInfo))
    }
}

/// Rejection of [`RateLimitInfo`] when the request did not pass through the
/// rate-limit layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissingRateLimitLayer;

impl fmt::Display for MissingRateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "no rate-limit decision on this request: is RateLimitLayer applied to this route?",
        )
    }
}

impl std::error::Error for MissingRateLimitLayer {}

impl IntoResponse for MissingRateLimitLayer {
    fn into_response(self) -> Response {
        (StatusCode::INTERNAL_SERVER_ERROR, self.to_string()).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::{Decision, Policy};
    use ratelimit_tower::PolicyDecision;
    use std::time::Duration;

    #[tokio::test]
    async fn extracts_or_rejects() {
        let (mut parts, ()) = http::Request::new(()).into_parts();
        let missing = <RateLimitInfo as FromRequestParts<()>>::from_request_parts(&mut parts, &())
            .await
            .unwrap_err();
        assert_eq!(
            missing.into_response().status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        let optional =
            <RateLimitInfo as OptionalFromRequestParts<()>>::from_request_parts(&mut parts, &())
                .await
                .unwrap();
        assert!(optional.is_none());

        let policy = Policy::fixed_window(5, Duration::from_secs(10)).unwrap();
        parts
            .extensions
            .insert(Decisions::new(vec![PolicyDecision::new(
                policy,
                Decision::allow(5, 4, 10_000_000),
            )]));
        let info = <RateLimitInfo as FromRequestParts<()>>::from_request_parts(&mut parts, &())
            .await
            .unwrap();
        assert_eq!(info.tightest().unwrap().decision().remaining(), 4);
    }
}

/// The crate's README, whose examples compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
