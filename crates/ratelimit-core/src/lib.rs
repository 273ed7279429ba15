//! Rate-limiting algorithms and stores with one set of exact semantics.
//!
//! `ratelimit-core` holds everything that is not HTTP:
//!
//! - [`Policy`]: one of seven algorithms (fixed window, sliding window log,
//!   sliding window counter, token bucket, GCRA, leaky bucket, concurrency) with
//!   validated parameters and a name;
//! - [`algorithm`]: what each algorithm guarantees, and its parameters (each
//!   one a pure state transition in integer microseconds inside, the
//!   reference every store reproduces);
//! - [`Decision`]: allowed or not, limit, remaining, reset and retry times;
//! - [`Store`]: where state lives; [`MemoryStore`] is the embedded default;
//!   costs known only after the response are reserved, then settled
//!   ([`Store::settle`]);
//! - [`AdminStore`]: operator actions on one key (peek, reset, penalize,
//!   reward, block, unblock), on both stores.
//!
//! The tower middleware lives in `ratelimit-tower`, the axum integration in
//! `ratelimit-axum`.
//!
//! # Example
//!
//! ```
//! use ratelimit_core::{MemoryStore, Policy, Rate, Store};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::new();
//! // Bursts of 10, then 5 per second, per client.
//! let policy = Policy::gcra(10, Rate::per_second(5))?.with_name("per-client")?;
//!
//! let decision = store.check(b"203.0.113.7", &policy, 1).await?;
//! assert!(decision.is_allowed());
//! assert_eq!(decision.remaining(), 9);
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

mod admin;
pub mod algorithm;
mod bounded;
mod breaker;
pub mod clock;
mod decision;
mod denied_cache;
mod error;
mod fallback;
pub mod key;
#[cfg(feature = "lease")]
mod lease;
pub mod memory;
pub mod metrics;
#[cfg(feature = "multi-region")]
pub mod multi_region;
mod policy;
#[cfg(feature = "redis")]
pub mod redis;
mod settle;
mod store;

pub use admin::AdminStore;
pub use algorithm::{Period, Rate};
pub use breaker::{BreakerState, CircuitBreaker};
pub use decision::{Decision, DecisionSource, PermitId};
pub use denied_cache::DeniedCache;
pub use error::{PolicyError, StoreError};
pub use fallback::FallbackStore;
#[cfg(feature = "lease")]
pub use lease::{LeasedStore, LeasedStoreBuilder};
pub use memory::{MemoryStore, MemoryStoreBuilder};
pub use policy::{Algorithm, AlgorithmKind, Policy, UnknownAlgorithm};
pub use settle::{Settle, SettleFuture, SettlementId};
pub use store::{Check, RefundFuture, Store};

/// The crate's README, whose examples compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
