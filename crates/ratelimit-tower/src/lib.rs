//! Tower middleware for rate limiting, in memory or shared through Redis.
//!
//! [`RateLimitLayer`] checks every request against a
//! [`Policy`](ratelimit_core::Policy) in a [`Store`](ratelimit_core::Store),
//! keyed by a [`KeyExtractor`] and priced by a [`Cost`]. Allowed requests reach
//! the inner service with the [`Decisions`] in their extensions; denied ones are
//! answered `429 Too Many Requests` with `Retry-After` (delay-seconds, rounded
//! up, never 0).
//!
//! The decision is made in `call`; `poll_ready` is the inner service's. The
//! rejection is a response, not an error, so the inner error type is kept
//! (axum's `Infallible` still works).
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
mod cost;
mod decisions;
pub mod future;
mod key;
mod layer;
mod permit;
mod rejection;
mod service;

pub use cost::{Constant, Cost};
pub use decisions::{Decisions, PolicyDecision};
pub use key::{GlobalKey, HeaderKey, Key, KeyExtractor, PeerAddr, PeerIp};
pub use layer::{FailurePolicy, MissingKey, RateLimitLayer};
pub use permit::PermitGuard;
pub use rejection::retry_after_seconds;
pub use service::RateLimit;
