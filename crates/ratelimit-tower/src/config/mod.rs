//! Policies and rules from a configuration file (TOML or JSON), reloadable at
//! run time (feature `config`).
//!
//! Operators change limits without a rebuild: [`Config`] reads named
//! policies and the rules that apply them, checks every field, and is itself a
//! [`RuleProvider`]; [`ReloadableRules`] holds one behind an atomic swap, so a
//! new file takes effect for the next request while requests in flight finish
//! under the limits they started with. A file that does not load leaves the
//! configuration in force untouched, and says which field is wrong; so does
//! one that would drop rules or policies in force (an empty or truncated
//! file, unless the reloader allows it: see [`ReloadableRules`]).
//!
//! # Example
//!
//! ```
//! use ratelimit_core::MemoryStore;
//! use ratelimit_tower::config::{Config, Format, ReloadableRules};
//! use ratelimit_tower::{PeerAddr, RateLimitLayer};
//! use std::net::SocketAddr;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! const CONFIG: &str = r#"
//! [policies.api]
//! algorithm = "fixed-window"
//! limit = 2
//! window = "1m"
//!
//! [[rules]]
//! policy = "api"
//! key = "ip"
//! routes = ["/api/"]
//! "#;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let rules = ReloadableRules::new(Config::from_toml(CONFIG)?);
//! let service = ServiceBuilder::new()
//!     .layer(RateLimitLayer::with_rules(MemoryStore::new(), rules.clone()))
//!     .service_fn(|_req: http::Request<String>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
//!     });
//! let request = || {
//!     let mut req = http::Request::get("/api/users").body(String::new()).unwrap();
//!     req.extensions_mut().insert(PeerAddr(SocketAddr::from(([192, 0, 2, 1], 4000))));
//!     req
//! };
//! for expected in [200, 200, 429] {
//!     let response = service.clone().oneshot(request()).await?;
//!     assert_eq!(response.status(), expected);
//! }
//!
//! // More room, same policy name: the count so far is kept.
//! rules.reload_from_str(&CONFIG.replace("limit = 2", "limit = 3"), Format::Toml)?;
//! assert_eq!(service.clone().oneshot(request()).await?.status(), 200);
//!
//! // A bad configuration is refused, and the one in force stays.
//! let error = rules
//!     .reload_from_str(&CONFIG.replace("limit = 2", "limit = 0"), Format::Toml)
//!     .unwrap_err();
//! assert_eq!(error.to_string(), "policies.api.limit: must be at least 1");
//! assert_eq!(rules.current().policy("api").unwrap().limit(), 3);
//! # Ok(())
//! # }
//! ```
//!
//! # The schema
//!
//! The same in TOML and JSON. Unknown fields are errors.
//!
//! ```toml
//! # Named policies. The name is the policy's name in stores, headers and
//! # metrics: 1 to 64 characters from [A-Za-z0-9._-].
//! [policies.api]
//! algorithm = "gcra"   # fixed-window | sliding-log | sliding-window |
//!                      # token-bucket | gcra | leaky-bucket | concurrency
//! limit = 20           # the limit, burst, capacity or maximum in flight
//! rate = "10/s"        # token-bucket, gcra, leaky-bucket: amount per period
//! shadow = false       # optional: decide and count, never refuse
//!
//! [policies.login]
//! algorithm = "sliding-log"
//! limit = 5
//! window = "1m"        # fixed-window, sliding-log, sliding-window
//!
//! [policies.monthly]
//! algorithm = "fixed-window"
//! limit = 10000
//! period = "month"     # fixed-window, instead of window: day | week | month |
//!                      # year, with the calendar's edges (Policy::calendar)
//! utc_offset = "+02:00"  # optional, with period: a fixed offset from UTC
//!                      # (default: UTC; no daylight saving time)
//!
//! [policies.uploads]
//! algorithm = "concurrency"
//! limit = 2
//! lease = "30s"        # concurrency: how long a permit outlives a dead holder
//!
//! # Rules: every rule that matches a request applies, all or nothing.
//! [[rules]]
//! policy = "api"
//! key = "ip"           # global | ip | client-ip | route | header:<name>,
//!                      # or a list of them joined into one key: ["route", "ip"]
//! cost = 1             # optional, default 1; 0 only reports (a policy
//!                      # asked only at cost 0 is refused: nothing spends it)
//! routes = ["/api/"]   # optional path prefixes; absent: every path
//! methods = ["POST"]   # optional; absent: every method
//! missing_key = "reject"  # or "allow": requests without the header
//!                      # (default: reject for header keys; see below)
//!
//! # A cost known only after the response (tokens generated): the rule
//! # reserves an estimate before the call and settles it to the response
//! # header's value (any algorithm but concurrency).
//! [policies.tokens]
//! algorithm = "token-bucket"
//! limit = 1000
//! rate = "1000/m"
//!
//! [[rules]]
//! policy = "tokens"
//! key = "header:x-api-key"
//! settle = { header = "x-tokens-used", estimate = 1, refund_on = "5xx" }
//!                      # estimate: optional, default 1 (no `cost` beside
//!                      # `settle`); 0 is refused: every request in flight
//!                      # at once would pass before any is charged.
//!                      # The header is removed from the response unless
//!                      # keep_header = true. refund_on: "5xx" (default),
//!                      # "4xx-5xx" or "never": responses that give the
//!                      # reservation back; so does a request cancelled
//!                      # before its response, unless refund_cancelled = false
//!
//! # Optional, for the ip key: the network IPv6 peers are keyed by.
//! [ip]
//! ipv6_prefix = 64     # optional, default 64 (0 to 128); IPv4 peers are
//!                      # keyed by their address
//!
//! # Needed by the client-ip key: the proxies whose forwarding headers are believed.
//! [client_ip]
//! trusted_proxies = ["10.0.0.0/8"]   # a network holding every address
//!                      # (0.0.0.0/0, ::/0, ::ffff:0:0/96) is refused
//! header = "x-forwarded-for"  # required with trusted_proxies: the header
//!                      # they write, x-forwarded-for | forwarded
//! ipv6_prefix = 64     # optional, default 64: key IPv6 clients by network
//! max_hops = 64        # optional
//! ```
//!
//! - Durations are read by [`humantime`](https://docs.rs/humantime): numbers
//!   with units `us`, `ms`, `s`, `m`, `h`, `d` (or their long names,
//!   `minutes`), possibly combined (`1h30m`, `1h 30m`) or fractional
//!   (`1.5s`). Rates are an amount per period: `10/s`, `100/m`, `5/10s`.
//! - A calendar `period` counts per day (midnight to midnight), ISO week
//!   (from Monday), month (from the 1st: 28 to 31 days) or year, at
//!   `utc_offset` (`+HH:MM` or `-HH:MM`, sign required); see
//!   [`Policy::calendar`]. A fixed window takes a `window` or a `period`,
//!   never both, and no other algorithm takes either field.
//! - A route prefix matches whole path segments: `/api` matches `/api` and
//!   `/api/users` but not `/apiary`; `/api/` matches only below `/api/`. A
//!   rule applies when its prefix covers any reading of the path that a
//!   router, a proxy in front of it, or a handler under a wildcard may
//!   make: its segments each decoded as axum's `Path` decodes them (`/%61pi`
//!   is `/api`, `a%2Fb` one segment), as sent or with repeated slashes
//!   merged and dot segments resolved (`/api//x`, `/api/./x` and
//!   `/api/y/../x` are all `/api/x`), and with a wildcard's tail decoded and
//!   cleaned below each root it may have, between segments or inside one (a
//!   handler that cleans it from its own root, of `/files/{*path}` or
//!   `/download-{*path}`); with axum, also the route the router chose
//!   (`MatchedPath`), the path below its wildcard, and the path before
//!   nesting (`OriginalUri`). Case is kept (SECURITY.md). A prefix with
//!   escapes is also matched with them decoded. A segment may be a
//!   parameter as axum writes routes: `/users/{id}` covers `/users/7`,
//!   `/users//posts` and below, `/files/{*path}` everything below
//!   `/files/`. A prefix with `//`, a `.` or `..` segment, an encoded
//!   unreserved byte (`%2e`), a brace outside a whole parameter segment or
//!   more than 32 segments could never match, or match too slowly: it is
//!   refused.
//! - `methods = ["GET"]` covers `HEAD` too: routers answer `HEAD` with the
//!   `GET` handler.
//! - Keys: `global` is one key for every request; `ip` the TCP peer
//!   ([`PeerIp`]: an IPv6 peer by its /64, or the `ipv6_prefix` of `[ip]`);
//!   `client-ip` the client behind the trusted proxies of `[client_ip]`
//!   ([`ClientIp`]), read from the one `header` they write (there is no
//!   default: a proxy passes the other header through as the client wrote
//!   it, see [`ForwardingHeader`]); `route` the route
//!   ([`RouteKey`]); `header:x-api-key` the header's value, hashed
//!   ([`HeaderKey`]; a `-bin` header's value is base64-decoded first). A
//!   list joins its parts as [`Composite`](crate::Composite) does, and has a
//!   key only when every part does.
//! - A header's value is keyed alike whichever header brings it (the same
//!   value through a [`Limits`](crate::Limits) or a handler's `Limiter` too,
//!   see [`Key`](crate::Key)), so one policy keyed by two headers (`x-tenant`
//!   on one route, `x-api-key` on another) would let a client spend a
//!   tenant's budget by sending its id as an API key: such a file is
//!   refused (a [`ConfigErrorKind::Rule`] error), and so is a reload that
//!   keys a policy in force by another header (instances sharing a store
//!   reload one after the other, so both headers would key it meanwhile).
//!   Give each header its own policy.
//! - A header's value is the client's to choose: a client sending a new
//!   value with every request gets a new budget each time, and so does one
//!   under a list holding a header (`["ip", "header:x-api-key"]`). Unless
//!   the service checks the value first, add a rule keyed by `ip` (or
//!   `client-ip`) beside the header's, on the same routes: every rule that
//!   matches applies, all or nothing.
//! - A request no rule matches passes unchecked. When a matching rule finds
//!   no key, as [`MissingKey`] describes: without its header a request is
//!   refused, unless the rule says `missing_key = "allow"` (then that rule
//!   does not apply to it); `ip` and `client-ip` without a peer address
//!   answer `500` whatever `missing_key` says (the server is not wired to
//!   give one). Each such request is counted and logged.
//!
//! - `settle` works as [`Settlement`](crate::Settlement) describes (see
//!   [Costs known after the response](crate#costs-known-after-the-response)):
//!   a missing or invalid header keeps the estimate, a value above twice the
//!   policy's limit is charged as twice the limit, and a store that cannot
//!   settle leaves the reservation as it was taken; all are logged and
//!   counted.
//!
//! Every field is checked when the configuration is loaded; the error names
//! the field ([`ConfigError::path`]): policies' numbers as [`Policy`]
//! validates them, rules naming unknown policies or costs a policy can never
//! admit, settlements of a concurrency policy or with a `cost` beside them,
//! durations, rates, header names, CIDR blocks, methods and routes.
//!
//! # Reloading and stored state
//!
//! Stores keep state per policy *name* and key, not per configuration. So:
//!
//! - Changing a policy's numbers (limit, rate, window) under the same name
//!   keeps counting: what clients consumed before the reload still counts,
//!   against the new numbers.
//! - Renaming a policy starts every key afresh, under the new name (the old
//!   name's state expires on its own).
//! - Changing a policy's *algorithm* needs a new name. The stored state of
//!   one algorithm means nothing to another: both
//!   [`MemoryStore`](crate::MemoryStore) and `RedisStore` answer
//!   [`StoreError::PolicyConflict`](ratelimit_core::StoreError::PolicyConflict)
//!   for every key that still has state of the old algorithm (GCRA and the
//!   leaky bucket excepted: they share one state). That is not an outage:
//!   the layer refuses those requests (`500`, counted as `invalid`) whatever
//!   its [`FailurePolicy`](crate::FailurePolicy) says, until that state
//!   expires. So [`ReloadableRules`] refuses a reload that gives
//!   a name in force another algorithm
//!   ([`ConfigErrorKind::AlgorithmChanged`]). It only knows the configuration
//!   in force: removing a policy and bringing it back with another algorithm
//!   before its old state expired, or restarting with a shared Redis, is not
//!   refused, and meets that `PolicyConflict` instead.
//!
//! [`RuleProvider`]: crate::RuleProvider
//! [`PeerIp`]: struct@crate::PeerIp
//! [`ForwardingHeader`]: crate::ForwardingHeader
//! [`ClientIp`]: crate::ClientIp
//! [`RouteKey`]: crate::RouteKey
//! [`HeaderKey`]: crate::HeaderKey
//! [`MissingKey`]: crate::MissingKey
//! [`Policy`]: crate::Policy
//! [`Policy::calendar`]: crate::Policy::calendar

mod compile;
mod error;
mod load;
mod matching;
mod parse;
mod reload;
mod routes;
mod schema;
mod trusted;
mod values;

pub use error::{ConfigError, ConfigErrorKind};
pub use load::{Config, Format};
pub use reload::ReloadableRules;
