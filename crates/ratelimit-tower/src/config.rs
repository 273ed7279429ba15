//! Policies and rules from a configuration file (TOML or JSON), reloadable at
//! run time (feature `config`).
//!
//! Operators change limits without a rebuild: [`Config`] reads named
//! policies and the rules that apply them, checks every field, and is itself a
//! [`RuleProvider`]; [`ReloadableRules`] holds one behind an atomic swap, so a
//! new file takes effect for the next request while requests in flight finish
//! under the limits they started with. A file that does not load leaves the
//! configuration in force untouched, and says which field is wrong.
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
//! cost = 1             # optional, default 1; 0 only reports
//! routes = ["/api/"]   # optional path prefixes; absent: every path
//! methods = ["POST"]   # optional; absent: every method
//! missing_key = "reject"  # or "allow": requests without the header
//!                      # (default: reject for header keys; see below)
//!
//! # Needed by the client-ip key: the proxies whose forwarding headers are believed.
//! [client_ip]
//! trusted_proxies = ["10.0.0.0/8"]
//! header = "auto"      # optional: auto | forwarded | x-forwarded-for
//! ipv6_prefix = 64     # optional: key IPv6 clients by their network
//! max_hops = 64        # optional
//! ```
//!
//! - Durations are whole numbers with units `us`, `ms`, `s`, `m`, `h`, `d`,
//!   and may be combined (`1h30m`). Rates are an amount per period: `10/s`,
//!   `100/m`, `5/10s`.
//! - A route prefix matches whole path segments: `/api` matches `/api` and
//!   `/api/users` but not `/apiary`; `/api/` matches only below `/api/`. The
//!   path is the request's as the layer sees it (inside a nested axum router,
//!   without the nesting prefix), with repeated slashes merged and dot
//!   segments resolved (`/api//x`, `/api/./x` and `/api/y/../x` are all
//!   `/api/x`); case and other percent-encoded bytes are kept (SECURITY.md).
//! - Keys: `global` is one key for every request; `ip` the TCP peer
//!   ([`PeerIp`]); `client-ip` the client behind the trusted proxies of
//!   `[client_ip]` ([`ClientIp`]); `route` the method and route
//!   ([`RouteKey`]); `header:x-api-key` the header's value, hashed
//!   ([`HeaderKey`]). A list joins its parts as [`Composite`](crate::Composite)
//!   does, and has a key only when every part does.
//! - A request no rule matches passes unchecked. When a matching rule finds
//!   no key, as [`MissingKey`] describes: without its header a request is
//!   refused, unless the rule says `missing_key = "allow"` (then that rule
//!   does not apply to it); `ip` and `client-ip` without a peer address
//!   answer `500` whatever `missing_key` says (the server is not wired to
//!   give one). Each such request is counted and logged.
//!
//! Every field is checked when the configuration is loaded; the error names
//! the field ([`ConfigError::path`]): policies' numbers as [`Policy`]
//! validates them, rules naming unknown policies or costs a policy can never
//! admit, durations, rates, header names, CIDR blocks, methods and routes.
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
//!   leaky bucket excepted: they share one state), so the layer's
//!   [`FailurePolicy`](crate::FailurePolicy) decides those requests until
//!   that state expires. So [`ReloadableRules`] refuses a reload that gives
//!   a name in force another algorithm
//!   ([`ConfigErrorKind::AlgorithmChanged`]). It only knows the configuration
//!   in force: removing a policy and bringing it back with another algorithm
//!   before its old state expired, or restarting with a shared Redis, is not
//!   refused, and meets that `PolicyConflict` instead.

mod error;
mod reload;
mod schema;

use std::fmt;
use std::future::{Ready, ready};
use std::path::Path;
use std::sync::Arc;

use http::{Method, Request};
use ratelimit_core::{Policy, PolicyError};

pub use error::{ConfigError, ConfigErrorKind};
pub use reload::ReloadableRules;

use crate::keys::{ClientIp, TrustedProxies};
use crate::keys::{HeaderKey, Key, KeyExtractor, NoKey, PeerIp, RouteKey};
use crate::options::MissingKey;
use crate::rule::{Limit, Limits, RuleProvider};
use schema::{AlgorithmKind, ClientIpSpec, ConfigSpec, KeyPart, Period, PolicySpec, RuleSpec};

/// The syntax of a configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Format {
    /// TOML (files ending in `.toml`).
    Toml,
    /// JSON (files ending in `.json`).
    Json,
}

impl Format {
    /// The format a file's extension names (`.toml` or `.json`, in any case).
    ///
    /// ```
    /// use ratelimit_tower::config::Format;
    ///
    /// assert_eq!(Format::from_path("limits/ratelimit.TOML".as_ref()), Some(Format::Toml));
    /// assert_eq!(Format::from_path("ratelimit.yaml".as_ref()), None);
    /// ```
    pub fn from_path(path: &Path) -> Option<Format> {
        let extension = path.extension()?.to_str()?;
        if extension.eq_ignore_ascii_case("toml") {
            Some(Format::Toml)
        } else if extension.eq_ignore_ascii_case("json") {
            Some(Format::Json)
        } else {
            None
        }
    }
}

/// Named policies and the rules that apply them, read from TOML or JSON and
/// checked field by field (see the [module docs](self) for the schema).
///
/// A `Config` is a [`RuleProvider`] for `http::Request`s: give it to
/// [`RateLimitLayer::with_rules`](crate::RateLimitLayer::with_rules) as it is,
/// or wrap it in [`ReloadableRules`] to replace it at run time. Cheap to clone.
#[derive(Clone, Default)]
pub struct Config {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    policies: Vec<Policy>,
    rules: Vec<ConfiguredRule>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("policies", &self.inner.policies)
            .field("rules", &self.inner.rules)
            .finish()
    }
}

impl Config {
    /// Reads a configuration in `format`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field at fault.
    pub fn parse(text: &str, format: Format) -> Result<Config, ConfigError> {
        let spec = match format {
            Format::Toml => parse_toml(text)?,
            Format::Json => parse_json(text)?,
        };
        compile(spec)
    }

    /// Reads a TOML configuration.
    ///
    /// ```
    /// use ratelimit_tower::config::Config;
    ///
    /// let config = Config::from_toml(r#"
    ///     [policies.login]
    ///     algorithm = "sliding-log"
    ///     limit = 5
    ///     window = "1m"
    /// "#)?;
    /// assert_eq!(config.policy("login").unwrap().limit(), 5);
    ///
    /// let error = Config::from_toml(r#"
    ///     [policies.login]
    ///     algorithm = "sliding-log"
    ///     limit = 5
    ///     window = "1 minute"
    /// "#).unwrap_err();
    /// assert_eq!(error.path(), "policies.login.window");
    /// # Ok::<(), ratelimit_tower::config::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field at fault.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Format::Toml)
    }

    /// Reads a JSON configuration.
    ///
    /// ```
    /// use ratelimit_tower::config::Config;
    ///
    /// let error = Config::from_json(r#"{
    ///     "policies": { "api": { "algorithm": "gcra", "limit": 10, "rate": "5/s" } },
    ///     "rules": [ { "policy": "apii", "key": "ip" } ]
    /// }"#).unwrap_err();
    /// assert_eq!(error.to_string(), r#"rules[0].policy: unknown policy "apii" (defined: api)"#);
    /// ```
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field at fault.
    pub fn from_json(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Format::Json)
    }

    /// Reads a configuration file, TOML or JSON by its extension
    /// ([`Format::from_path`]).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the file and the field at fault; when the
    /// file cannot be read, [`ConfigErrorKind::Io`] with the I/O error as its
    /// source.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let format = Format::from_path(path).ok_or_else(|| {
            ConfigError::new(
                ConfigErrorKind::UnknownFormat,
                "",
                "unknown configuration format: name the file *.toml or *.json",
            )
            .in_file(path)
        })?;
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new(
                ConfigErrorKind::Io,
                "",
                format!("cannot read the file: {e}"),
            )
            .with_source(e)
            .in_file(path)
        })?;
        Config::parse(&text, format).map_err(|e| e.in_file(path))
    }

    /// The policy named `name`.
    pub fn policy(&self, name: &str) -> Option<&Policy> {
        let policies = &self.inner.policies;
        let index = policies.binary_search_by(|p| p.name().cmp(name)).ok()?;
        policies.get(index)
    }

    /// Every policy, by name.
    pub fn policies(&self) -> std::slice::Iter<'_, Policy> {
        self.inner.policies.iter()
    }

    /// How many rules there are.
    pub fn rule_count(&self) -> usize {
        self.inner.rules.len()
    }

    /// The limits of every rule that matches `req`, to be checked together.
    ///
    /// ```
    /// use ratelimit_tower::config::Config;
    ///
    /// let config = Config::from_toml(r#"
    ///     [policies.writes]
    ///     algorithm = "token-bucket"
    ///     limit = 10
    ///     rate = "1/s"
    ///
    ///     [[rules]]
    ///     policy = "writes"
    ///     key = "header:x-api-key"
    ///     methods = ["POST", "PUT"]
    ///     cost = 2
    /// "#)?;
    /// let post = http::Request::post("/items").header("x-api-key", "k1").body(()).unwrap();
    /// let limits = config.limits(&post);
    /// assert_eq!(limits.iter().map(|l| l.cost()).collect::<Vec<_>>(), [2]);
    ///
    /// let get = http::Request::get("/items").header("x-api-key", "k1").body(()).unwrap();
    /// assert!(config.limits(&get).is_empty());
    /// # Ok::<(), ratelimit_tower::config::ConfigError>(())
    /// ```
    pub fn limits<B>(&self, req: &Request<B>) -> Limits {
        let mut limits = Limits::none();
        for rule in &self.inner.rules {
            if !rule.matches(req) {
                continue;
            }
            match rule.key(req) {
                Ok(key) => limits.push(Limit::new(rule.policy.clone(), key, rule.cost)),
                Err(cause) => {
                    let action = rule.missing_key.unwrap_or(cause.default_action());
                    limits.extend(Limits::missed(&rule.policy, cause, action));
                    if limits.is_reject() {
                        return limits;
                    }
                }
            }
        }
        limits
    }
}

impl<B> RuleProvider<Request<B>> for Config {
    type Future = Ready<Limits>;

    fn limits(&self, req: &Request<B>) -> Ready<Limits> {
        ready(Config::limits(self, req))
    }
}

/// One rule, ready to apply.
#[derive(Debug, Clone)]
struct ConfiguredRule {
    policy: Policy,
    key: Box<[KeySource]>,
    cost: u64,
    routes: Option<Box<[String]>>,
    methods: Option<Box<[Method]>>,
    missing_key: Option<MissingKey>,
}

impl ConfiguredRule {
    fn matches<B>(&self, req: &Request<B>) -> bool {
        if let Some(methods) = &self.methods
            && !methods.contains(req.method())
        {
            return false;
        }
        match &self.routes {
            Some(routes) => {
                let path = crate::path::normalize(req.uri().path());
                routes.iter().any(|prefix| route_matches(prefix, &path))
            }
            None => true,
        }
    }

    fn key<B>(&self, req: &Request<B>) -> Result<Key, NoKey> {
        let mut parts = self.key.iter();
        let Some(first) = parts.next() else {
            return Err(NoKey::NotApplicable);
        };
        let mut key = first.extract(req)?;
        // Joined as `Composite` joins two keys: the first length-prefixed.
        for part in parts {
            let next = part.extract(req)?;
            let (a, b) = (key.as_bytes(), next.as_bytes());
            let mut joined = Vec::with_capacity(a.len() + b.len() + 8);
            joined.extend_from_slice(a.len().to_string().as_bytes());
            joined.push(b':');
            joined.extend_from_slice(a);
            joined.extend_from_slice(b);
            key = Key::from(joined);
        }
        Ok(key)
    }
}

/// Whether the route prefix `prefix` covers `path`, by whole segments.
fn route_matches(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// One part of a rule's key.
#[derive(Debug, Clone)]
enum KeySource {
    Global,
    Peer,
    Client(ClientIp),
    Header(HeaderKey),
    Route,
}

impl KeySource {
    fn extract<B>(&self, req: &Request<B>) -> Result<Key, NoKey> {
        match self {
            KeySource::Global => Ok(Key::from("global")),
            KeySource::Peer => PeerIp.try_extract(req),
            KeySource::Client(client_ip) => client_ip.try_extract(req),
            KeySource::Header(header) => header.try_extract(req),
            KeySource::Route => RouteKey.try_extract(req),
        }
    }
}

fn parse_toml(text: &str) -> Result<ConfigSpec, ConfigError> {
    let parse_error = |path: String, error: toml::de::Error| {
        let location = error.span().and_then(|span| line_column(text, span.start));
        ConfigError::new(ConfigErrorKind::Parse, path, error.message().trim_end())
            .at(location)
            .with_source(error)
    };
    let deserializer =
        toml::Deserializer::parse(text).map_err(|e| parse_error(String::new(), e))?;
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = path_text(e.path());
        parse_error(path, e.into_inner())
    })
}

fn parse_json(text: &str) -> Result<ConfigSpec, ConfigError> {
    let parse_error = |path: String, error: serde_json::Error| {
        let location = (error.line() > 0).then(|| (error.line(), error.column()));
        // serde_json appends the position to its message; it is shown apart.
        let mut message = error.to_string();
        let suffix = format!(" at line {} column {}", error.line(), error.column());
        if let Some(stripped) = message.strip_suffix(&suffix) {
            message = stripped.to_owned();
        }
        ConfigError::new(ConfigErrorKind::Parse, path, message)
            .at(location)
            .with_source(error)
    };
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let spec = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let path = path_text(e.path());
        parse_error(path, e.into_inner())
    })?;
    deserializer
        .end()
        .map_err(|e| parse_error(String::new(), e))?;
    Ok(spec)
}

/// `policies.api.limit`, `rules[2].policy`; empty for the document itself.
fn path_text(path: &serde_path_to_error::Path) -> String {
    if path.iter().next().is_none() {
        String::new()
    } else {
        path.to_string()
    }
}

/// The line and column (from 1, in characters) of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> Option<(usize, usize)> {
    let before = text.get(..offset)?;
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    Some((line, column))
}

fn compile(spec: ConfigSpec) -> Result<Config, ConfigError> {
    let mut policies = Vec::with_capacity(spec.policies.len());
    for (name, policy) in spec.policies {
        policies.push(build_policy(&name, policy)?);
    }
    policies.sort_by(|a: &Policy, b: &Policy| a.name().cmp(b.name()));
    let client_ip = spec.client_ip.map(build_client_ip).transpose()?;
    let mut rules = Vec::with_capacity(spec.rules.len());
    for (index, rule) in spec.rules.into_iter().enumerate() {
        rules.push(build_rule(index, rule, &policies, client_ip.as_ref())?);
    }
    Ok(Config {
        inner: Arc::new(Inner { policies, rules }),
    })
}

fn build_policy(name: &str, spec: PolicySpec) -> Result<Policy, ConfigError> {
    let base = format!("policies.{name}");
    let algorithm = spec.algorithm;
    let period = algorithm.period();
    let given = [
        (Period::Rate, spec.rate.is_some()),
        (Period::Window, spec.window.is_some()),
        (Period::Lease, spec.lease.is_some()),
    ];
    for (field, present) in given {
        if present && field != period {
            return Err(ConfigError::new(
                ConfigErrorKind::Policy,
                format!("{base}.{}", field.field()),
                format!(
                    "{} takes no {}: write {}",
                    algorithm.name(),
                    field.field(),
                    period.example()
                ),
            ));
        }
    }
    let missing = || {
        ConfigError::new(
            ConfigErrorKind::Policy,
            format!("{base}.{}", period.field()),
            format!(
                "missing: {} needs a {}, such as {}",
                algorithm.name(),
                period.field(),
                period.example()
            ),
        )
    };
    let limit = spec.limit;
    let built = match algorithm {
        AlgorithmKind::FixedWindow => {
            Policy::fixed_window(limit, spec.window.ok_or_else(missing)?.0)
        }
        AlgorithmKind::SlidingLog => {
            Policy::sliding_window_log(limit, spec.window.ok_or_else(missing)?.0)
        }
        AlgorithmKind::SlidingWindow => {
            Policy::sliding_window_counter(limit, spec.window.ok_or_else(missing)?.0)
        }
        AlgorithmKind::TokenBucket => Policy::token_bucket(limit, spec.rate.ok_or_else(missing)?.0),
        AlgorithmKind::Gcra => Policy::gcra(limit, spec.rate.ok_or_else(missing)?.0),
        AlgorithmKind::LeakyBucket => Policy::leaky_bucket(limit, spec.rate.ok_or_else(missing)?.0),
        AlgorithmKind::Concurrency => Policy::concurrency(limit, spec.lease.ok_or_else(missing)?.0),
    };
    let policy = built.map_err(|e| policy_error(&base, period, e))?;
    let policy = policy
        .with_name(name)
        .map_err(|e| policy_error(&base, period, e))?;
    Ok(policy.with_shadow(spec.shadow))
}

/// A [`PolicyError`] as an error on the field it is about.
fn policy_error(base: &str, period: Period, error: PolicyError) -> ConfigError {
    let period_field = period.field();
    let (field, message) = match &error {
        PolicyError::ZeroLimit { what: "rate" } => {
            ("rate", String::from("the amount must be at least 1"))
        }
        PolicyError::ZeroLimit { .. } => ("limit", String::from("must be at least 1")),
        PolicyError::ZeroWindow { what: "period" } => (
            "rate",
            String::from("the period must be at least one microsecond"),
        ),
        PolicyError::ZeroWindow { .. } => (
            period_field,
            String::from("must be at least one microsecond"),
        ),
        PolicyError::RateTooHigh { .. } => ("rate", error.to_string()),
        PolicyError::Unrepresentable { what, max }
            if matches!(*what, "limit" | "burst" | "capacity" | "max") =>
        {
            ("limit", format!("is too large (at most {max})"))
        }
        PolicyError::Unrepresentable { what: "period", .. } => ("rate", error.to_string()),
        PolicyError::Unrepresentable { what, .. } if *what == period_field => {
            (period_field, error.to_string())
        }
        _ => ("", error.to_string()),
    };
    let path = if field.is_empty() {
        base.to_owned()
    } else {
        format!("{base}.{field}")
    };
    ConfigError::new(ConfigErrorKind::Policy, path, message).with_source(error)
}

fn build_client_ip(spec: ClientIpSpec) -> Result<ClientIp, ConfigError> {
    let proxies: TrustedProxies = spec.trusted_proxies.into_iter().map(|c| c.0).collect();
    let mut client_ip = ClientIp::trusting(proxies).header(spec.header.into());
    if let Some(len) = spec.ipv6_prefix {
        client_ip = client_ip.ipv6_prefix(len).map_err(|e| {
            ConfigError::new(
                ConfigErrorKind::Parse,
                "client_ip.ipv6_prefix",
                e.to_string(),
            )
            .with_source(e)
        })?;
    }
    if let Some(max_hops) = spec.max_hops {
        client_ip = client_ip.max_hops(max_hops);
    }
    Ok(client_ip)
}

fn build_rule(
    index: usize,
    spec: RuleSpec,
    policies: &[Policy],
    client_ip: Option<&ClientIp>,
) -> Result<ConfiguredRule, ConfigError> {
    let base = format!("rules[{index}]");
    let rule_error = |field: &str, message: String| {
        ConfigError::new(ConfigErrorKind::Rule, format!("{base}.{field}"), message)
    };
    let policy = policies
        .iter()
        .find(|p| p.name() == spec.policy)
        .cloned()
        .ok_or_else(|| {
            let defined: Vec<&str> = policies.iter().map(Policy::name).collect();
            let defined = if defined.is_empty() {
                String::from("no policy is defined")
            } else {
                format!("defined: {}", defined.join(", "))
            };
            rule_error(
                "policy",
                format!("unknown policy {:?} ({defined})", spec.policy),
            )
        })?;
    if spec.cost > policy.max_cost() {
        return Err(rule_error(
            "cost",
            format!(
                "{} is more than policy {:?} can ever admit ({})",
                spec.cost,
                policy.name(),
                policy.max_cost()
            ),
        ));
    }
    let routes = match spec.routes {
        Some(routes) if routes.is_empty() => {
            return Err(rule_error(
                "routes",
                String::from("must not be empty: leave it out to match every path"),
            ));
        }
        Some(routes) => Some(routes.into_iter().map(|r| r.0.0).collect()),
        None => None,
    };
    let methods = match spec.methods {
        Some(methods) if methods.is_empty() => {
            return Err(rule_error(
                "methods",
                String::from("must not be empty: leave it out to match every method"),
            ));
        }
        Some(methods) => Some(methods.into_iter().map(|m| m.0).collect()),
        None => None,
    };
    let key = spec
        .key
        .0
        .into_iter()
        .map(|part| {
            Ok(match part {
                KeyPart::Global => KeySource::Global,
                KeyPart::PeerIp => KeySource::Peer,
                KeyPart::Route => KeySource::Route,
                KeyPart::Header(name) => KeySource::Header(HeaderKey::new(name)),
                KeyPart::ClientIp => match client_ip {
                    Some(c) if !c.trusted_proxies().is_empty() => KeySource::Client(c.clone()),
                    _ => {
                        return Err(rule_error(
                            "key",
                            String::from(
                                "\"client-ip\" needs trusted proxies in [client_ip] trusted_proxies \
                                 (without them the client is the TCP peer: use \"ip\")",
                            ),
                        ));
                    }
                },
            })
        })
        .collect::<Result<Box<[KeySource]>, ConfigError>>()?;
    Ok(ConfiguredRule {
        policy,
        key,
        cost: spec.cost,
        routes,
        methods,
        missing_key: spec.missing_key.map(MissingKey::from),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_match_whole_segments() {
        assert!(route_matches("/api", "/api"));
        assert!(route_matches("/api", "/api/users"));
        assert!(!route_matches("/api", "/apiary"));
        assert!(route_matches("/api/", "/api/users"));
        assert!(!route_matches("/api/", "/api"));
        assert!(route_matches("/", "/anything"));
    }

    #[test]
    fn positions() {
        assert_eq!(line_column("a\nbc\nd", 3), Some((2, 2)));
        assert_eq!(line_column("é\nx", 0), Some((1, 1)));
        assert_eq!(line_column("ab", 9), None);
    }
}
