//! Tower middleware for rate limiting, in memory or shared through Redis.
//!
//! [`RateLimitLayer`] checks every request against one or more limits: a
//! [`Policy`] in a [`Store`](ratelimit_core::Store),
//! keyed by a [`KeyExtractor`] and priced by a [`Cost`]. Several rules are all
//! or nothing ([`Rule::and`]); a [`RuleProvider`] (a closure returning
//! [`Limits`]) can pick the limits per
//! request (tiers per API key, allowlists, routes).
//!
//! - Allowed requests reach the inner service with the [`Decisions`] in their
//!   extensions.
//! - Denied requests are refused ([`Mode::Reject`]) or wait their turn
//!   ([`Mode::Wait`]). HTTP refusals are responses (`429` with `Retry-After`,
//!   or a gRPC trailers-only `RESOURCE_EXHAUSTED`), so the inner error type is
//!   kept ([`HttpRejections`], see [`RateLimitLayer::on_rejection`]); for
//!   other request types, and for an HTTP client, they are errors
//!   ([`RateLimitLayer::for_errors`], [`RateLimitLayer::for_http_client`]).
//! - When the store fails, the [`FailurePolicy`] decides (open by default).
//! - Keys are hashed alike whichever way they come ([`Key`]): a value (an
//!   API key from a header, a tenant id from a rule provider) is one budget
//!   and never reaches a store as it is; addresses stay readable.
//! - Concurrency permits are held until the response body ends (with
//!   [`for_errors`](RateLimitLayer::for_errors), whose responses need not be
//!   HTTP and are not wrapped, until the inner service answers).
//! - A cost known only after the response (tokens generated, rows scanned)
//!   is reserved as an estimate and settled when the response head arrives
//!   ([`Settlement`], see [below](#costs-known-after-the-response)).
//! - With the feature `config`, policies and rules come from a TOML or JSON
//!   file and can be reloaded while serving (the `config` module).
//! - A policy in [shadow mode](ratelimit_core::Policy::with_shadow) is
//!   decided and counted but never refuses (see [below](#shadow-policies)).
//! - With the `metrics` feature, every decision is counted through the
//!   `metrics` facade; every decision is a `tracing` event at `debug` (see
//!   [`metrics`] for the names, a contract).
//!
//! The decision is made in `call`; `poll_ready` is the inner service's.
//!
//! # One dependency
//!
//! This crate re-exports what a layer needs from `ratelimit-core`
//! ([`MemoryStore`], [`Policy`], [`Period`], [`Rate`]; `RedisStore`, `MultiRegionStore`
//! and `LeasedStore` with the features `redis`, `multi-region` and `lease`),
//! and the crate itself as [`ratelimit_core`]. A tonic server needs only this
//! crate, with the feature `tonic` (the peer address from tonic's
//! `TcpConnectInfo`):
//!
//! ```toml
//! [dependencies]
//! ratelimit-tower = { version = "0.1", features = ["tonic"] }
//! # Redis: features = ["tonic", "redis"] ("sentinel", "redis-cluster", "tls",
//! # "bb8", "multi-region" as well; "lease" for LeasedStore)
//! ```
//!
//! axum users depend on `ratelimit-axum` instead, which turns on this
//! crate's feature `axum` and re-exports what a service uses.
//!
//! One feature per integration:
//!
//! | feature | what it adds |
//! |---|---|
//! | `axum` | the integration with axum: the peer address from `ConnectInfo`, routes from `MatchedPath` |
//! | `tonic` | the peer address from tonic's `TcpConnectInfo` |
//! | `config` | policies and rules from TOML or JSON, reloadable (the `config` module) |
//! | `metrics` | decisions counted through the `metrics` facade |
//! | `redis`, `redis-cluster`, `sentinel`, `tls`, `bb8` | `RedisStore` and its deployments (`ratelimit-core`'s features of the same names) |
//! | `multi-region` | `MultiRegionStore` |
//! | `lease` | `LeasedStore` |
//!
//! In a file that also uses tower's own `tower::limit::RateLimitLayer` (a
//! fixed rate for the whole service, no keys), name this crate with an alias
//! rather than importing both layers:
//!
//! ```
//! use ratelimit_tower as rl;
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
//! # gRPC (tonic)
//!
//! The layer goes in front of a tonic server (`Server::builder().layer(..)`,
//! feature `tonic` for the peer address): a refusal is a trailers-only
//! response with `grpc-status: 8` (`RESOURCE_EXHAUSTED`) and
//! `grpc-retry-pushback-ms`, never an HTTP `429`. The layer sees HTTP
//! requests, not gRPC messages, so:
//!
//! - **A call is charged once, when it starts**: a unary call and a
//!   streaming call (client, server or both) cost the rule's cost once, not
//!   once per message. A stream of a million messages costs what one request
//!   costs.
//! - **A concurrency permit is held for the call's whole life**: from the
//!   call's start until its response body ends (the trailers are sent) or is
//!   dropped (the client cancels, the connection breaks), renewed while the
//!   stream runs. A long-lived stream holds its slot for as long as it is open.
//! - **Per-message limits belong in the handler**: check each message against
//!   the store there, with the caller's key, and end the stream with
//!   `Status::resource_exhausted` when it is denied (what
//!   `ratelimit_axum::Limiter` does for an axum handler):
//!
//! ```
//! use ratelimit_core::{MemoryStore, Policy, Rate, Store};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::new();
//! let messages = Policy::gcra(100, Rate::per_second(100))?.with_name("messages")?;
//! // In the streaming handler, for each message of the caller `key`:
//! # let key = b"caller";
//! let decision = store.check(key, &messages, 1).await?;
//! if !decision.is_allowed() {
//!     // return Err(tonic::Status::resource_exhausted("too many messages"));
//! }
//! # Ok(())
//! # }
//! ```
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
//!
//! # Costs known after the response
//!
//! A rule with a [`Settlement`] ([`Rule::settle`], [`RateLimitLayer::settle`],
//! `settle` in a configuration file) decides in two phases:
//!
//! 1. **Reserve** before the call: the rule's cost is an estimate, checked
//!    and consumed with the request's other limits, all or nothing, as any
//!    cost is. A request whose estimate does not fit is refused, and
//!    consumes nothing.
//! 2. **Settle** when the response head arrives: the layer reads the actual
//!    cost (a response header, which it then removes, or an [`ActualCost`]
//!    in the response's extensions) and brings every settling limit of the
//!    request from its estimate to that cost in one
//!    [`Store::settle`](ratelimit_core::Store::settle) call (all or nothing;
//!    one [`SettlementId`](ratelimit_core::SettlementId) per request, so a
//!    resend counts once). More than the estimate is charged even past the
//!    limit, into a debt of at most one full budget that later requests
//!    wait out; less gives the difference back, as long as the
//!    reservation still holds it (see below). The response's
//!    `RateLimit` fields report what is left after the settlement.
//!
//! A response classified as a failure (`5xx` by default) gives the whole
//! reservation back; so does a request dropped before its response head, or
//! whose service fails, unless the rule says otherwise. What is given back
//! is what the reservation still holds when it settles: nothing once the
//! window it was counted in ended (a fixed window or calendar period, a
//! sliding log's or a sliding window counter's window), and for a bucket one unit less per emission interval in
//! which the bucket, without the reservation, could have been full. Units
//! that already left the budget are not given back again, so a client that
//! keeps requests in flight across a window's edge and cancels them (or
//! makes them fail) after spending the next window gets no more than that
//! window. A missing or
//! invalid cost keeps the estimate (1 for an estimate of 0: a cost unknown
//! is never free), and a cost above twice the limit is
//! charged as twice the limit; both are logged and counted, and neither ever
//! lifts a limit. A settlement can take a budget at most one budget into
//! debt, so bound what one request may use in the service (a model's
//! `max_tokens`, a query's row limit) at or below a budget: the limiter
//! charges what a request used, it cannot stop a request already running.
//! When the store cannot settle (an outage), the request has
//! already run: the reservation stays as it was taken, and the failure is
//! logged and counted ([`Stats::settle_failed`]); the failure policy does
//! not apply.
//!
//! The estimate is the rule's cost: a number, a function of the request
//! ([`Cost`]), or **0**. An estimate of 0 reserves nothing: it is a peek,
//! which admits the request unless the key is in debt (or blocked), so
//! clients are admitted while their budget is not below zero and refused,
//! with `Retry-After` until the debt is paid, once a settlement took it
//! there. Per algorithm, a zero estimate admits while: a token bucket holds
//! zero tokens or more; a GCRA's or leaky bucket's theoretical arrival time
//! lies at most one full burst ahead (nothing owed beyond the burst); a
//! fixed window, sliding window counter or sliding log counts at most its
//! limit in its window. So every request in flight at once passes before
//! any is charged: use an estimate of 0 only where something else bounds
//! the requests in flight (a concurrency limit); a configuration file
//! refuses it. A larger estimate keeps more
//! requests from running at once on one budget: each in flight holds its
//! estimate until it settles, so the debt that requests in flight can run
//! up together is their actual costs beyond their estimates, and at most one
//! full budget.
//!
//! A shadow policy that settles is settled with the others when its group
//! was allowed (a request an enforced limit refuses has no response to
//! settle from: its shadow estimate stays, as any shadow consumption does). On a Redis Cluster, limits whose keys lie in different hash
//! slots are reserved and settled slot by slot, each slot all or nothing
//! (the weaker guarantee `RedisStore` documents for several slots). A
//! layer built [`for_errors`](RateLimitLayer::for_errors) sees no response
//! head: it keeps the estimate of every response (counted as a missing
//! cost) and gives back the reservation of a request whose service fails
//! (one built [`for_http_client`](RateLimitLayer::for_http_client) settles
//! as the HTTP layer does).
//!
//! Concurrency limits have no settlement: a rule that would settle one is
//! refused when it is built ([`SettleError`]).
//!
//! ```
//! use ratelimit_tower::{HeaderKey, MemoryStore, Policy, Rate, RateLimitLayer, Settlement};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let tokens = Policy::token_bucket(1_000, Rate::per_minute(1_000))?.with_name("tokens")?;
//! let layer = RateLimitLayer::new(MemoryStore::new(), tokens, HeaderKey::from_static("x-api-key"))
//!     .cost(1)
//!     .settle(Settlement::from_static_header("x-tokens-used"))?;
//! let service = ServiceBuilder::new().layer(layer).service_fn(|_req: http::Request<String>| async {
//!     let mut response = http::Response::new(String::from("generated"));
//!     response.headers_mut().insert("x-tokens-used", http::HeaderValue::from(400_u64));
//!     Ok::<_, std::convert::Infallible>(response)
//! });
//! let request = || http::Request::post("/v1/complete").header("x-api-key", "k1").body(String::new());
//! let response = service.clone().oneshot(request()?).await?;
//! // 400 taken (1 reserved, 399 settled), and the header stays inside.
//! assert_eq!(response.headers()["ratelimit"], r#""tokens";r=600;t=24"#);
//! assert!(response.headers().get("x-tokens-used").is_none());
//! # Ok(())
//! # }
//! ```
//!
//! # Shadow policies
//!
//! A policy built with [`Policy::with_shadow(true)`](ratelimit_core::Policy::with_shadow)
//! is decided, consumes, is counted (`ratelimit_decisions_total` with outcome
//! `allowed` or `shadow_denied`) and appears in the [`Decisions`] and the
//! rate-limit headers like any other, but a layer never refuses, nor delays,
//! a request because of it: dark-launch a new limit and watch what it would
//! deny.
//!
//! Several limits on one request are all or nothing, so the shadow policies
//! cannot simply join the others: a shadow denial would keep the enforced
//! limits from consuming, and an enforced denial would hide what the shadow
//! policies decide. The layer splits a request's limits into an enforced and a
//! shadow group, and asks the store for both at once (two concurrent calls,
//! so no added latency but one more store call per request). Each group is
//! all or nothing on its own. What follows:
//!
//! - A shadow policy consumes for every request it allows, even one an
//!   enforced policy refuses; the enforced limits consume even when a shadow
//!   policy denies. A shadow policy's numbers are those it would give alone
//!   in front of the enforced ones; enforced together with them, all or
//!   nothing, it would deny somewhat fewer requests (the refused ones would no
//!   longer use up its quota).
//! - In [`Mode::Wait`], shadow policies are decided once, on the first
//!   attempt; their denials and leaky-bucket slots never make a request wait.
//! - Their concurrency permits are held like any other, until the response
//!   body ends, and released at once when the request is refused.
//! - When the store cannot decide the shadow group, that is logged and counted
//!   (`error`) and nothing else happens: the [`FailurePolicy`] applies to the
//!   enforced limits only.
//! - A `429`'s `Retry-After` and problem details name the enforced policies
//!   only; [`Decisions::allowed`] and [`PolicyDecision::refuses`] ignore
//!   shadow denials.
//!
//! ```
//! use ratelimit_core::{MemoryStore, Policy};
//! use ratelimit_tower::{PeerIp, RateLimitLayer, Rule};
//! use std::time::Duration;
//!
//! // Enforced: 100 per minute per client. On trial: 20 per minute.
//! let enforced = Policy::fixed_window(100, Duration::from_secs(60))?.with_name("per-ip")?;
//! let trial = Policy::fixed_window(20, Duration::from_secs(60))?
//!     .with_name("per-ip-strict")?
//!     .with_shadow(true);
//! let layer = RateLimitLayer::new(MemoryStore::new(), enforced, PeerIp)
//!     .and(Rule::new(trial, PeerIp));
//! # let _ = layer;
//! # Ok::<(), ratelimit_core::PolicyError>(())
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

pub mod body;
#[cfg(feature = "config")]
pub mod config;
mod decide;
mod decisions;
pub mod future;
mod keys;
mod layer;
pub mod metrics;
mod options;
mod path;
mod permit;
mod responses;
mod rules;
mod service;
mod settlement;

/// The store and policy crate, whole, for what this crate does not re-export.
pub use ratelimit_core;
// What a layer needs besides this crate, so `ratelimit-tower` alone is a
// complete dependency (for tonic, with the feature `tonic`).
// The store that decides hot keys from leased batches (feature `lease`).
#[cfg(feature = "lease")]
#[doc(no_inline)]
pub use ratelimit_core::LeasedStore;
// The store of one limit across regions (feature `multi-region`).
#[cfg(feature = "multi-region")]
#[doc(no_inline)]
pub use ratelimit_core::multi_region::MultiRegionStore;
// The Redis store (feature `redis`; `sentinel`, `redis-cluster`, `tls` and
// `bb8` forward to `ratelimit-core`'s features of the same names).
#[cfg(feature = "redis")]
#[doc(no_inline)]
pub use ratelimit_core::redis::RedisStore;
#[doc(no_inline)]
pub use ratelimit_core::{MemoryStore, Period, Policy, PolicyError, Rate, StoreError};

pub use decisions::{Decisions, PolicyDecision};
pub use keys::{
    Cidr, CidrError, ClientIp, Composite, Fallback, ForwardingHeader, GlobalKey, HeaderKey, Key,
    KeyExtractor, NoKey, PeerAddr, PeerIp, RouteKey, TrustedProxies,
};
pub use layer::RateLimitLayer;
pub use options::{FailurePolicy, MissingKey, Mode, Stats};
pub use permit::PermitGuard;
pub use responses::{
    ClientRejections, ErrorRejections, HttpRejections, Reject, Rejection, headers,
};
pub use rules::{And, Cost, Limits, Rule, RuleProvider};
pub use service::RateLimit;
pub use settlement::{ActualCost, SettleError, Settlement};

/// The crate's README, whose examples compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
