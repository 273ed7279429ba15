//! Rules: which limits apply to a request.
//!
//! A [`RuleProvider`] turns a request into [`Limits`]: a list of (policy, key,
//! cost) to check together, all or nothing. The common cases are static:
//! one [`Rule`] (a policy, a key extractor and a cost), or several joined with
//! [`Rule::and`]. A closure returning a future is a provider too, for limits
//! that depend on the request in ways only known at run time: tiers looked up
//! per API key, allowlisted keys that bypass, different limits per route.

use std::future::{Future, Ready, ready};

use ratelimit_core::Policy;

use crate::decisions::PolicyDecision;
use crate::keys::{Key, KeyExtractor, NoKey};
use crate::options::MissingKey;
use crate::rules::cost::Cost;
use crate::settlement::{SettleError, Settlement};

/// One limit to apply to one request: a policy, the key, and the cost (an
/// estimate, when the limit settles after the response).
#[derive(Debug, Clone)]
pub(crate) struct Limit {
    policy: Policy,
    key: Key,
    cost: u64,
    settlement: Option<Settlement>,
}

impl Limit {
    /// Checks `key` against `policy` at `cost`.
    pub(crate) fn new(policy: Policy, key: Key, cost: u64) -> Self {
        Limit {
            policy,
            key,
            cost,
            settlement: None,
        }
    }

    /// How the limit settles after the response, if it does.
    pub(crate) fn settlement(&self) -> Option<&Settlement> {
        self.settlement.as_ref()
    }

    /// The limit's decision, with its estimate when it settles.
    pub(crate) fn decided(&self, decision: ratelimit_core::Decision) -> PolicyDecision {
        PolicyDecision::new(self.policy.clone(), decision)
            .with_estimate(self.settlement.as_ref().map(|_| self.cost))
    }

    /// The policy.
    pub(crate) fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The key.
    pub(crate) fn key(&self) -> &Key {
        &self.key
    }

    /// The cost.
    pub(crate) fn cost(&self) -> u64 {
        self.cost
    }

    /// The policy, the key and the cost, taken apart.
    #[inline]
    pub(crate) fn into_parts(self) -> (Policy, Key, u64) {
        (self.policy, self.key, self.cost)
    }
}

impl From<Limit> for Limits {
    fn from(limit: Limit) -> Self {
        Limits {
            first: Some(limit),
            ..Limits::default()
        }
    }
}

/// A rule that found no key for a request: the layer counts and logs it.
#[derive(Debug, Clone)]
pub(crate) struct Missed {
    pub(crate) policy: Policy,
    pub(crate) cause: NoKey,
    pub(crate) action: MissingKey,
}

/// The limits that apply to one request: each a policy, a key and a cost,
/// checked together, all or nothing. What a [`RuleProvider`] gives.
///
/// Empty limits let the request through unchecked (an allowlisted key, a
/// route without limits). [`Limits::reject`] refuses the request outright
/// (a rule whose key is missing, configured with [`MissingKey::Reject`]);
/// [`Limits::no_peer_address`] refuses it with `500` (the server gives no
/// peer address).
///
/// ```
/// use ratelimit_tower::{Limits, Policy};
/// use std::time::Duration;
///
/// let per_user = Policy::fixed_window(100, Duration::from_secs(60))?.with_name("per-user")?;
/// let per_day = Policy::fixed_window(1_000, Duration::from_secs(86_400))?.with_name("per-day")?;
/// // Both, for this user, at cost 1: all or nothing.
/// let limits = Limits::one(per_user, "alice", 1).with(per_day, "alice", 1);
/// assert_eq!(limits.len(), 2);
/// # Ok::<(), ratelimit_tower::PolicyError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Limits {
    // The first limit apart, so the common case (one limit) allocates
    // nothing; `rest` holds the others and the rules without a key, boxed
    // and absent while there are none, so the limits of a request (made,
    // moved and dropped on every request) are small enough to move without
    // a call to `memcpy`. No other limit while `first` is `None`.
    first: Option<Limit>,
    rest: Option<Box<Rest>>,
    reject: bool,
    no_peer: bool,
}

/// The limits after the first, and the rules that found no key.
#[derive(Debug, Clone, Default)]
struct Rest {
    more: Vec<Limit>,
    missed: Vec<Missed>,
}

impl Limits {
    /// No limit: the request passes unchecked.
    pub fn none() -> Self {
        Limits::default()
    }

    /// One limit: `key` checked against `policy` at `cost`. A value (bytes,
    /// text, a number) is hashed as every value is ([`Key`]), so the budget
    /// of `Limits::one(policy, api_key, 1)` is that of a [`HeaderKey`](crate::HeaderKey)
    /// reading the same value under `policy`. A `HeaderKey` writes some
    /// values one way first (a `-bin` header's base64 decoded, the scheme
    /// of `Authorization` in lowercase): for a header's raw value,
    /// [`HeaderKey::key_for`](crate::HeaderKey::key_for) gives the key it
    /// reads.
    pub fn one(policy: Policy, key: impl Into<Key>, cost: u64) -> Self {
        Limits {
            first: Some(Limit::new(policy, key.into(), cost)),
            ..Limits::default()
        }
    }

    /// Refuses the request without asking the store
    /// ([`Rejection::MissingKey`](crate::Rejection::MissingKey)).
    pub fn reject() -> Self {
        Limits {
            reject: true,
            ..Limits::default()
        }
    }

    /// Refuses the request with `500`: the server gives the layer no peer
    /// address to key it by, a wiring mistake
    /// ([`Rejection::NoPeerAddress`](crate::Rejection::NoPeerAddress)).
    pub fn no_peer_address() -> Self {
        Limits {
            no_peer: true,
            ..Limits::default()
        }
    }

    /// A rule under `policy` found no key, for `cause`; `action` is what its
    /// configuration does about it (a peer address missing always refuses).
    pub(crate) fn missed(policy: &Policy, cause: NoKey, action: MissingKey) -> Self {
        Limits {
            first: None,
            rest: Some(Box::new(Rest {
                more: Vec::new(),
                missed: vec![Missed {
                    policy: policy.clone(),
                    cause,
                    action,
                }],
            })),
            reject: cause != NoKey::NoPeerAddress && action == MissingKey::Reject,
            no_peer: cause == NoKey::NoPeerAddress,
        }
    }

    /// These limits and `key` checked against `policy` at `cost`.
    #[must_use]
    pub fn with(mut self, policy: Policy, key: impl Into<Key>, cost: u64) -> Self {
        self.push(policy, key, cost);
        self
    }

    /// These limits and `key` checked against `policy`, reserving
    /// `estimate` before the call and settled after the response as
    /// `settlement` says.
    ///
    /// A concurrency policy cannot settle ([`Policy::supports_settlement`]):
    /// a request given one is refused with `500` (a configuration mistake,
    /// logged and counted as [`Stats::refused_on_error`](crate::Stats::refused_on_error)).
    /// Static rules refuse it when they are built ([`Rule::settle`]).
    ///
    /// ```
    /// use ratelimit_tower::{Limits, Policy, Rate, Settlement};
    ///
    /// let tokens = Policy::token_bucket(1_000, Rate::per_minute(1_000))?.with_name("tokens")?;
    /// let limits = Limits::none()
    ///     .with_settlement(tokens, "alice", 1, Settlement::from_static_header("x-tokens-used"));
    /// assert_eq!(limits.len(), 1);
    /// # Ok::<(), ratelimit_tower::PolicyError>(())
    /// ```
    #[must_use]
    pub fn with_settlement(
        mut self,
        policy: Policy,
        key: impl Into<Key>,
        estimate: u64,
        settlement: Settlement,
    ) -> Self {
        self.push_settlement(policy, key, estimate, settlement);
        self
    }

    /// Adds `key` checked against `policy`, reserving `estimate` and settled
    /// as `settlement` says (see [`with_settlement`](Limits::with_settlement)).
    pub fn push_settlement(
        &mut self,
        policy: Policy,
        key: impl Into<Key>,
        estimate: u64,
        settlement: Settlement,
    ) {
        let mut limit = Limit::new(policy, key.into(), estimate);
        limit.settlement = Some(settlement);
        self.push_limit(limit);
    }

    /// Adds `key` checked against `policy` at `cost`.
    pub fn push(&mut self, policy: Policy, key: impl Into<Key>, cost: u64) {
        self.push_limit(Limit::new(policy, key.into(), cost));
    }

    fn push_limit(&mut self, limit: Limit) {
        if self.first.is_none() {
            self.first = Some(limit);
        } else {
            self.rest.get_or_insert_default().more.push(limit);
        }
    }

    /// Adds every limit of `other` (and its refusal, if any).
    pub fn extend(&mut self, other: Limits) {
        let (more, missed) = other
            .rest
            .map_or_else(Default::default, |rest| (rest.more, rest.missed));
        if self.first.is_none() {
            // No limit here: `other`'s, in order, with the rules without a
            // key of both.
            self.first = other.first;
            if !more.is_empty() || !missed.is_empty() {
                let rest = self.rest.get_or_insert_default();
                rest.more = more;
                rest.missed.extend(missed);
            }
        } else if other.first.is_some() || !more.is_empty() || !missed.is_empty() {
            let rest = self.rest.get_or_insert_default();
            rest.more.extend(other.first);
            rest.more.extend(more);
            rest.missed.extend(missed);
        }
        self.reject |= other.reject;
        self.no_peer |= other.no_peer;
    }

    /// The limits after the first.
    fn more(&self) -> &[Limit] {
        self.rest.as_ref().map_or(&[], |rest| &rest.more)
    }

    /// The limits, as (policy, key, cost), in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = (&Policy, &Key, u64)> {
        self.first
            .iter()
            .chain(self.more())
            .map(|l| (l.policy(), l.key(), l.cost()))
    }

    /// Whether the request is refused outright (for a missing key, or a
    /// missing peer address).
    pub fn is_reject(&self) -> bool {
        self.reject || self.no_peer
    }

    /// Whether the request is refused because the server gives no peer address.
    pub fn is_no_peer_address(&self) -> bool {
        self.no_peer
    }

    pub(crate) fn missed_rules(&self) -> &[Missed] {
        self.rest.as_ref().map_or(&[], |rest| &rest.missed)
    }

    /// The number of limits to check.
    pub fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.more().len()
    }

    /// Whether there is no limit to check.
    pub fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    pub(crate) fn into_vec(self) -> Vec<Limit> {
        let mut limits = Vec::with_capacity(self.len());
        limits.extend(self.first);
        limits.extend(self.rest.map(|rest| rest.more).unwrap_or_default());
        limits
    }

    /// Takes the one limit to check, when there is exactly one and nothing
    /// else to do (no refusal, no rule without a key); else leaves these
    /// limits as they are.
    pub(crate) fn take_single(&mut self) -> Option<Limit> {
        let alone = self
            .rest
            .as_ref()
            .is_none_or(|rest| rest.more.is_empty() && rest.missed.is_empty());
        if alone && !self.reject && !self.no_peer {
            self.first.take()
        } else {
            None
        }
    }
}

/// Decides which limits apply to a request.
///
/// The future is `'static`: take what you need from the request synchronously,
/// then move it into the future (see the example on [`RateLimitLayer::with_rules`](crate::RateLimitLayer::with_rules)).
///
/// Implemented by [`Rule`], by [`And`] (several rules), and by closures
/// `Fn(&Req) -> impl Future<Output = Limits>`.
pub trait RuleProvider<Req>: Clone + Send + Sync + 'static {
    /// The future of the limits.
    type Future: Future<Output = Limits> + Send + 'static;

    /// The limits for `req`.
    fn limits(&self, req: &Req) -> Self::Future;

    /// The limits for `req` when they are known without waiting (static
    /// rules), so the layer can decide without a future of its own; `None`
    /// (the default) when they are not, and then the layer calls
    /// [`limits`](RuleProvider::limits).
    fn limits_at_once(&self, req: &Req) -> Option<Limits> {
        let _ = req;
        None
    }
}

impl<F, Fut, Req> RuleProvider<Req> for F
where
    F: Fn(&Req) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Limits> + Send + 'static,
{
    type Future = Fut;

    fn limits(&self, req: &Req) -> Fut {
        self(req)
    }
}

/// A static rule: `policy` for the key `key` extracts, at the cost `cost` gives.
#[derive(Debug, Clone)]
pub struct Rule<K, C = u64> {
    policy: Policy,
    key: K,
    cost: C,
    missing_key: Option<MissingKey>,
    settlement: Option<Settlement>,
}

impl<K> Rule<K> {
    /// Limits requests by `key` under `policy`, at cost 1.
    pub fn new(policy: Policy, key: K) -> Self {
        Rule {
            policy,
            key,
            cost: 1,
            missing_key: None,
            settlement: None,
        }
    }
}

impl<K, C> Rule<K, C> {
    /// Prices requests with `cost`: a number for a fixed price, or a closure
    /// over the request ([`Cost`]).
    ///
    /// ```
    /// use ratelimit_tower::{PeerIp, Policy, Rule};
    /// use std::time::Duration;
    ///
    /// let policy = Policy::fixed_window(100, Duration::from_secs(60))?;
    /// let exports = Rule::new(policy.clone(), PeerIp).cost(10);
    /// let by_path = Rule::new(policy, PeerIp)
    ///     .cost(|req: &http::Request<()>| if req.uri().path() == "/export" { 10 } else { 1 });
    /// # let _ = (exports, by_path);
    /// # Ok::<(), ratelimit_tower::PolicyError>(())
    /// ```
    pub fn cost<C2>(self, cost: C2) -> Rule<K, C2> {
        Rule {
            policy: self.policy,
            key: self.key,
            cost,
            missing_key: self.missing_key,
            settlement: self.settlement,
        }
    }

    /// Settles each request's cost after its response, as `settlement`
    /// says: the rule's [`cost`](Rule::cost) is then the estimate reserved
    /// before the call (a number, a function of the request, or 0: see
    /// [Costs known after the response](crate#costs-known-after-the-response)).
    ///
    /// # Errors
    ///
    /// [`SettleError::Unsupported`] for a concurrency policy, whose units
    /// are permits, not consumed.
    ///
    /// ```
    /// use ratelimit_tower::{HeaderKey, Policy, Rate, Rule, Settlement};
    /// use std::time::Duration;
    ///
    /// let tokens = Policy::token_bucket(1_000, Rate::per_minute(1_000))?.with_name("tokens")?;
    /// let rule = Rule::new(tokens, HeaderKey::from_static("x-api-key"))
    ///     .cost(1)
    ///     .settle(Settlement::from_static_header("x-tokens-used"))?;
    /// # let _ = rule;
    ///
    /// let in_flight = Policy::concurrency(4, Duration::from_secs(30))?;
    /// let refused = Rule::new(in_flight, HeaderKey::from_static("x-api-key"))
    ///     .settle(Settlement::from_static_header("x-tokens-used"));
    /// assert!(refused.is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn settle(mut self, settlement: Settlement) -> Result<Self, SettleError> {
        SettleError::check(&self.policy)?;
        self.settlement = Some(settlement);
        Ok(self)
    }

    /// What to do with requests for which `key` finds no key. The default
    /// depends on why there is none ([`NoKey`]): a closure's `None` lets the
    /// request pass this rule, a missing header refuses it, and a missing
    /// peer address always answers `500`, whatever this says.
    #[must_use]
    pub fn on_missing_key(mut self, missing_key: MissingKey) -> Self {
        self.missing_key = Some(missing_key);
        self
    }

    /// This rule and `other`, checked together, all or nothing.
    pub fn and<R>(self, other: R) -> And<Self, R> {
        And(self, other)
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub(crate) fn limit_for<Req>(&self, req: &Req) -> Limits
    where
        K: KeyExtractor<Req>,
        C: Cost<Req>,
    {
        match self.key.try_extract(req) {
            Ok(key) => match &self.settlement {
                None => Limits::one(self.policy.clone(), key, self.cost.cost(req)),
                Some(settlement) => Limits::none().with_settlement(
                    self.policy.clone(),
                    key,
                    self.cost.cost(req),
                    settlement.clone(),
                ),
            },
            Err(cause) => Limits::missed(
                &self.policy,
                cause,
                self.missing_key.unwrap_or(cause.default_action()),
            ),
        }
    }
}

impl<K, C, Req> RuleProvider<Req> for Rule<K, C>
where
    K: KeyExtractor<Req>,
    C: Cost<Req>,
{
    type Future = Ready<Limits>;

    fn limits(&self, req: &Req) -> Ready<Limits> {
        ready(self.limit_for(req))
    }

    fn limits_at_once(&self, req: &Req) -> Option<Limits> {
        Some(self.limit_for(req))
    }
}

/// Two rule providers, checked together, all or nothing. Built by [`Rule::and`]
/// and [`And::and`].
#[derive(Debug, Clone)]
pub struct And<A, B>(pub A, pub B);

impl<A, B> And<A, B> {
    /// These rules and `other`.
    pub fn and<R>(self, other: R) -> And<Self, R> {
        And(self, other)
    }
}

pin_project_lite::pin_project! {
    /// The future of [`And`]'s limits.
    pub struct AndFuture<FA, FB> {
        #[pin]
        a: FA,
        #[pin]
        b: FB,
        first: Option<Limits>,
    }
}

impl<FA, FB> Future for AndFuture<FA, FB>
where
    FA: Future<Output = Limits>,
    FB: Future<Output = Limits>,
{
    type Output = Limits;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Limits> {
        let this = self.project();
        if this.first.is_none() {
            *this.first = Some(std::task::ready!(this.a.poll(cx)));
        }
        let second = std::task::ready!(this.b.poll(cx));
        let mut limits = this.first.take().unwrap_or_default();
        limits.extend(second);
        std::task::Poll::Ready(limits)
    }
}

impl<A, B, Req> RuleProvider<Req> for And<A, B>
where
    A: RuleProvider<Req>,
    B: RuleProvider<Req>,
{
    type Future = AndFuture<A::Future, B::Future>;

    fn limits(&self, req: &Req) -> Self::Future {
        AndFuture {
            a: self.0.limits(req),
            b: self.1.limits(req),
            first: None,
        }
    }

    fn limits_at_once(&self, req: &Req) -> Option<Limits> {
        let mut limits = self.0.limits_at_once(req)?;
        limits.extend(self.1.limits_at_once(req)?);
        Some(limits)
    }
}
