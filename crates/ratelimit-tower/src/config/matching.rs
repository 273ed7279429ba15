//! Matching per request: the rules that apply to a request, and its keys.

use std::future::{Ready, ready};

use http::{Method, Request};
use ratelimit_core::Policy;

use super::Config;
use super::routes::Budget;
use super::schema::KeyPart;
use crate::keys::{
    ClientIp, GlobalKey, HeaderKey, Key, KeyExtractor, NoKey, PeerIp, RouteKey, join_keys,
};
use crate::options::MissingKey;
use crate::rules::rule::{Limits, RuleProvider};
use crate::settlement::Settlement;

impl Config {
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
    /// assert_eq!(limits.iter().map(|(_, _, cost)| cost).collect::<Vec<_>>(), [2]);
    ///
    /// let get = http::Request::get("/items").header("x-api-key", "k1").body(()).unwrap();
    /// assert!(config.limits(&get).is_empty());
    /// # Ok::<(), ratelimit_tower::config::ConfigError>(())
    /// ```
    pub fn limits<B>(&self, req: &Request<B>) -> Limits {
        let mut limits = Limits::none();
        // The path is read once, for every rule with routes whose methods
        // match, when the first of them is met.
        let mut routes: Option<Budget> = None;
        for rule in &self.inner.rules {
            if !rule.matches_method(req) {
                continue;
            }
            if let Some(number) = rule.routes {
                let reading = routes.get_or_insert_with(|| self.read_routes(req));
                if !reading.covered(number) {
                    continue;
                }
            }
            match rule.key(req) {
                Ok(key) => match &rule.settlement {
                    None => limits.push(rule.policy.clone(), key, rule.cost),
                    Some(settlement) => limits.push_settlement(
                        rule.policy.clone(),
                        key,
                        rule.cost,
                        settlement.clone(),
                    ),
                },
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

impl Config {
    /// `req`'s path read against the routes of every rule whose methods
    /// match it.
    fn read_routes<B>(&self, req: &Request<B>) -> Budget {
        // The rules with routes are numbered in order (see `compile`).
        let asked = self
            .inner
            .rules
            .iter()
            .filter(|rule| rule.routes.is_some())
            .map(|rule| rule.matches_method(req));
        let reading = Budget::asking(asked);
        self.inner.routes.read(req, &reading);
        reading
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
pub(super) struct ConfiguredRule {
    pub(super) policy: Policy,
    pub(super) key: Box<[KeySource]>,
    /// The key as the configuration writes it, to compare with the rules of
    /// another configuration (a reload's).
    pub(super) written_key: Box<[KeyPart]>,
    /// The cost, or the estimate of a rule that settles.
    pub(super) cost: u64,
    pub(super) settlement: Option<Settlement>,
    /// The rule's number in the configuration's table of routes.
    pub(super) routes: Option<usize>,
    pub(super) methods: Option<Box<[Method]>>,
    pub(super) missing_key: Option<MissingKey>,
}

impl ConfiguredRule {
    fn matches_method<B>(&self, req: &Request<B>) -> bool {
        // A `GET` rule covers `HEAD`: the router runs the `GET` handler.
        self.methods.as_ref().is_none_or(|methods| {
            methods.contains(req.method())
                || methods.contains(crate::path::route_method(req.method()))
        })
    }

    fn key<B>(&self, req: &Request<B>) -> Result<Key, NoKey> {
        let mut parts = self.key.iter();
        let Some(first) = parts.next() else {
            return Err(NoKey::NotApplicable);
        };
        let mut key = first.extract(req)?;
        // Joined as `Composite` joins two keys: the first length-prefixed.
        for part in parts {
            key = join_keys(&key, &part.extract(req)?);
        }
        Ok(key)
    }
}

/// One part of a rule's key.
#[derive(Debug, Clone)]
pub(super) enum KeySource {
    Global,
    Peer,
    Client(ClientIp),
    Header(HeaderKey),
    Route,
}

impl KeySource {
    fn extract<B>(&self, req: &Request<B>) -> Result<Key, NoKey> {
        match self {
            KeySource::Global => GlobalKey::default().try_extract(req),
            KeySource::Peer => PeerIp.try_extract(req),
            KeySource::Client(client_ip) => client_ip.try_extract(req),
            KeySource::Header(header) => header.try_extract(req),
            KeySource::Route => RouteKey.try_extract(req),
        }
    }
}
