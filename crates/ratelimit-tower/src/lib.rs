//! Tower middleware for rate limiting, in memory or shared through Redis.
//!
//! [`RateLimitLayer`] checks every request against one or more limits: a
//! [`Policy`](ratelimit_core::Policy) in a [`Store`](ratelimit_core::Store),
//! keyed by a [`KeyExtractor`] and priced by a [`Cost`]. Several rules are all
//! or nothing ([`Rule::and`]); a [`RuleProvider`] can pick the limits per
//! request (tiers per API key, allowlists, routes).
//!
//! - Allowed requests reach the inner service with the [`Decisions`] in their
//!   extensions.
//! - Denied requests are refused ([`Mode::Reject`]) or wait their turn
//!   ([`Mode::Wait`]). HTTP refusals are responses (`429` with `Retry-After`,
//!   or a gRPC trailers-only `RESOURCE_EXHAUSTED`), so the inner error type is
//!   kept; for other request types they are errors ([`ErrorRejections`]).
//! - When the store fails, the [`FailurePolicy`] decides.
//! - Concurrency permits are held until the response body ends.
//! - With the feature `config`, policies and rules come from a TOML or JSON
//!   file and can be reloaded while serving (the `config` module).
//!
//! The decision is made in `call`; `poll_ready` is the inner service's.
//!
//! # Example
//!
//! ```
//! use ratelimit_core::{MemoryStore, Policy};
//! use ratelimit_tower::{PeerIp, RateLimitLayer};
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//!
//! # fn main() -> Result<(), ratelimit_core::PolicyError> {
//! let layer = RateLimitLayer::new(
//!     MemoryStore::new(),
//!     Policy::fixed_window(5, Duration::from_secs(10))?,
//!     PeerIp,
//! );
//! let service = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|_req: http::Request<String>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(String::from("hello")))
//!     });
//! # let _ = service;
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

pub mod body;
mod client_ip;
#[cfg(feature = "config")]
#[cfg_attr(docsrs, doc(cfg(feature = "config")))]
pub mod config;
mod cost;
mod decide;
mod decisions;
pub mod future;
pub mod headers;
mod key;
mod layer;
mod permit;
pub mod problem;
mod reject;
mod rule;
mod service;

pub use client_ip::{Cidr, CidrError, ClientIp, ForwardingHeader, TrustedProxies};
pub use cost::{Constant, Cost};
pub use decisions::{Decisions, PolicyDecision};
pub use key::{Composite, GlobalKey, HeaderKey, Key, KeyExtractor, PeerAddr, PeerIp, RouteKey};
pub use layer::{FailurePolicy, MissingKey, Mode, RateLimitLayer, Stats};
pub use permit::PermitGuard;
pub use reject::{
    BoxError, ErrorRejections, HttpRejections, Reject, Rejection, RejectionBody, is_grpc,
    retry_after_seconds,
};
pub use rule::{And, AndFuture, Limit, Limits, Rule, RuleProvider};
pub use service::RateLimit;
