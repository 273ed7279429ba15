//! Policies: an algorithm, its parameters, and a name.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::concurrency::ConcurrencyState;
use crate::algorithm::fixed_window::FixedWindowState;
use crate::algorithm::gcra::GcraState;
use crate::algorithm::sliding_window_counter::SlidingWindowCounterState;
use crate::algorithm::sliding_window_log::{End, SlidingWindowLogState};
use crate::algorithm::token_bucket::TokenBucketState;
use crate::algorithm::{
    Calendar, Concurrency, FixedWindow, Gcra, LeakyBucket, Rate, SlidingWindowCounter,
    SlidingWindowLog, TokenBucket,
};
use crate::{Decision, PermitId, PolicyError, StoreError};

/// One of the seven algorithms with its validated parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// See [`FixedWindow`].
    FixedWindow(FixedWindow),
    /// See [`SlidingWindowLog`].
    SlidingWindowLog(SlidingWindowLog),
    /// See [`SlidingWindowCounter`].
    SlidingWindowCounter(SlidingWindowCounter),
    /// See [`TokenBucket`].
    TokenBucket(TokenBucket),
    /// See [`Gcra`].
    Gcra(Gcra),
    /// See [`LeakyBucket`].
    LeakyBucket(LeakyBucket),
    /// See [`Concurrency`].
    Concurrency(Concurrency),
}

/// Which of the seven algorithms, without its parameters: the one table of
/// their names, as the command line, configuration files, metrics labels and
/// Redis scripts spell them.
///
/// ```
/// use ratelimit_core::AlgorithmKind;
///
/// let kind: AlgorithmKind = "token-bucket".parse()?;
/// assert_eq!(kind, AlgorithmKind::TokenBucket);
/// assert_eq!(kind.to_string(), "token-bucket");
/// assert_eq!(AlgorithmKind::ALL.len(), 7);
/// assert!("nope".parse::<AlgorithmKind>().unwrap_err().to_string().contains("gcra"));
/// # Ok::<(), ratelimit_core::UnknownAlgorithm>(())
/// ```
///
/// Not `#[non_exhaustive]`: code that maps every algorithm (the
/// configuration's compiler, the examples' flags) matches it exhaustively,
/// so an eighth algorithm fails to compile there instead of falling into a
/// catch-all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlgorithmKind {
    /// `fixed-window`: [`FixedWindow`].
    FixedWindow,
    /// `sliding-log`: [`SlidingWindowLog`].
    SlidingLog,
    /// `sliding-window`: [`SlidingWindowCounter`].
    SlidingWindow,
    /// `token-bucket`: [`TokenBucket`].
    TokenBucket,
    /// `gcra`: [`Gcra`].
    Gcra,
    /// `leaky-bucket`: [`LeakyBucket`].
    LeakyBucket,
    /// `concurrency`: [`Concurrency`].
    Concurrency,
}

impl AlgorithmKind {
    /// Every kind, in this order.
    pub const ALL: [AlgorithmKind; 7] = [
        AlgorithmKind::FixedWindow,
        AlgorithmKind::SlidingLog,
        AlgorithmKind::SlidingWindow,
        AlgorithmKind::TokenBucket,
        AlgorithmKind::Gcra,
        AlgorithmKind::LeakyBucket,
        AlgorithmKind::Concurrency,
    ];

    /// The kind's name: `fixed-window`, `sliding-log`, `sliding-window`,
    /// `token-bucket`, `gcra`, `leaky-bucket` or `concurrency`.
    pub const fn name(self) -> &'static str {
        match self {
            AlgorithmKind::FixedWindow => "fixed-window",
            AlgorithmKind::SlidingLog => "sliding-log",
            AlgorithmKind::SlidingWindow => "sliding-window",
            AlgorithmKind::TokenBucket => "token-bucket",
            AlgorithmKind::Gcra => "gcra",
            AlgorithmKind::LeakyBucket => "leaky-bucket",
            AlgorithmKind::Concurrency => "concurrency",
        }
    }
}

/// A name that is not one of [`AlgorithmKind`]'s; its message lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownAlgorithm(String);

crate::algorithm::named_kinds!(AlgorithmKind, UnknownAlgorithm, "algorithm");

/// `Some($body)` with `$a` bound to the parameters of `$algorithm` and `$s`
/// to its state in `$state`, for the six algorithms whose transitions have
/// the same signature (`decide`, `penalize`, `reward`: all but concurrency);
/// `None` when the state belongs to another algorithm, or for concurrency.
///
/// A macro, not a function: `$body` is the same expression in every arm but
/// of another type in each, which a closure cannot be.
macro_rules! with_transitions {
    ($algorithm:expr, $state:expr, |$a:ident, $s:ident| $body:expr) => {
        match ($algorithm, $state) {
            (Algorithm::FixedWindow($a), State::FixedWindow($s)) => Some($body),
            (Algorithm::SlidingWindowLog($a), State::SlidingWindowLog($s)) => Some($body),
            (Algorithm::SlidingWindowCounter($a), State::SlidingWindowCounter($s)) => Some($body),
            (Algorithm::TokenBucket($a), State::TokenBucket($s)) => Some($body),
            (Algorithm::Gcra($a), State::Gcra($s)) => Some($body),
            (Algorithm::LeakyBucket($a), State::Gcra($s)) => Some($body),
            _ => None,
        }
    };
}

impl Algorithm {
    /// The algorithm's short name, as used on the command line and in metrics:
    /// [`AlgorithmKind::name`] of [`Algorithm::algorithm_kind`].
    pub fn kind(&self) -> &'static str {
        self.algorithm_kind().name()
    }

    /// Which algorithm this is, without its parameters.
    pub fn algorithm_kind(&self) -> AlgorithmKind {
        match self {
            Algorithm::FixedWindow(_) => AlgorithmKind::FixedWindow,
            Algorithm::SlidingWindowLog(_) => AlgorithmKind::SlidingLog,
            Algorithm::SlidingWindowCounter(_) => AlgorithmKind::SlidingWindow,
            Algorithm::TokenBucket(_) => AlgorithmKind::TokenBucket,
            Algorithm::Gcra(_) => AlgorithmKind::Gcra,
            Algorithm::LeakyBucket(_) => AlgorithmKind::LeakyBucket,
            Algorithm::Concurrency(_) => AlgorithmKind::Concurrency,
        }
    }

    /// The quota: the most a key can take at once.
    pub fn limit(&self) -> u64 {
        match self {
            Algorithm::FixedWindow(a) => a.limit(),
            Algorithm::SlidingWindowLog(a) => a.limit(),
            Algorithm::SlidingWindowCounter(a) => a.limit(),
            Algorithm::TokenBucket(a) => a.capacity(),
            Algorithm::Gcra(a) => a.burst(),
            Algorithm::LeakyBucket(a) => a.capacity(),
            Algorithm::Concurrency(a) => a.max(),
        }
    }

    /// The time over which the quota applies, in microseconds: the window
    /// (of calendar periods, the longest: 31 days for months), the time to
    /// refill an empty bucket, or the lease of a permit.
    pub fn window_micros(&self) -> u64 {
        match self {
            Algorithm::FixedWindow(a) => a.window_micros(),
            Algorithm::SlidingWindowLog(a) => a.window_micros(),
            Algorithm::SlidingWindowCounter(a) => a.window_micros(),
            Algorithm::TokenBucket(a) => a.capacity() * a.interval_micros(),
            Algorithm::Gcra(a) => a.burst() * a.interval_micros(),
            Algorithm::LeakyBucket(a) => a.capacity() * a.interval_micros(),
            Algorithm::Concurrency(a) => a.lease_micros(),
        }
    }

    /// A fresh state for this algorithm.
    pub(crate) fn new_state(&self) -> State {
        match self {
            Algorithm::FixedWindow(_) => State::FixedWindow(FixedWindowState::default()),
            Algorithm::SlidingWindowLog(_) => State::SlidingWindowLog(Box::default()),
            Algorithm::SlidingWindowCounter(_) => {
                State::SlidingWindowCounter(SlidingWindowCounterState::default())
            }
            Algorithm::TokenBucket(_) => State::TokenBucket(TokenBucketState::default()),
            Algorithm::Gcra(_) | Algorithm::LeakyBucket(_) => State::Gcra(GcraState::default()),
            Algorithm::Concurrency(_) => State::Concurrency(Box::default()),
        }
    }

    /// Applies one request to `state`. Returns `None` when the state belongs to
    /// another algorithm. `permit` names the permit a concurrency policy takes.
    ///
    /// The caller has checked `cost` against [`Policy::max_cost`].
    #[inline]
    pub(crate) fn decide(
        &self,
        state: &mut State,
        now: u64,
        cost: u64,
        permit: PermitId,
    ) -> Option<Decision> {
        match (self, state) {
            (Algorithm::Concurrency(a), State::Concurrency(s)) => {
                Some(a.acquire(s, now, cost, permit))
            }
            (algorithm, state) => {
                with_transitions!(algorithm, state, |a, s| a.decide(s, now, cost))
            }
        }
    }

    /// Applies an admin penalty of `amount` units to `state` (see each
    /// algorithm's `penalize`) and returns what a peek then reports. `None`
    /// when the state belongs to another algorithm, or for concurrency, which
    /// has no penalty.
    pub(crate) fn penalize(&self, state: &mut State, now: u64, amount: u64) -> Option<Decision> {
        with_transitions!(self, state, |a, s| a.penalize(s, now, amount))
    }

    /// Applies an admin reward of `amount` units to `state` (see each
    /// algorithm's `reward`) and returns what a peek then reports. `None`
    /// when the state belongs to another algorithm, or for concurrency.
    pub(crate) fn reward(&self, state: &mut State, now: u64, amount: u64) -> Option<Decision> {
        with_transitions!(self, state, |a, s| a.reward(s, now, amount))
    }

    /// Gives back `amount` units of a request refused after it was admitted:
    /// a [`reward`](Self::reward), but the oldest units of a sliding log
    /// first (its own cannot be told from a later request's).
    pub(crate) fn refund(&self, state: &mut State, now: u64, amount: u64) -> Option<Decision> {
        if let (Algorithm::SlidingWindowLog(log), State::SlidingWindowLog(s)) = (self, &mut *state)
        {
            return Some(log.give_back(s, now, amount, End::Oldest));
        }
        self.reward(state, now, amount)
    }

    /// Whether [`AdminStore::penalize`](crate::AdminStore::penalize) and
    /// [`AdminStore::reward`](crate::AdminStore::reward) apply (every
    /// algorithm but concurrency).
    pub fn supports_adjustments(&self) -> bool {
        !matches!(self, Algorithm::Concurrency(_))
    }

    /// Settles a reservation that consumed `reserved` units to what the
    /// request really cost, `actual` ([`Store::settle`](crate::Store::settle)),
    /// and returns what a peek then reports. `None` when the state belongs to
    /// another algorithm, or for concurrency, which has no settlement.
    ///
    /// - `actual > reserved`: the difference is consumed even past empty, as
    ///   a `penalize` of it: into a debt of at most one more
    ///   full budget, which later requests wait out;
    /// - `actual < reserved`: the difference is given back as a refund
    ///   (a `reward`, but the oldest units of a sliding log
    ///   first), never beyond a full budget;
    /// - `actual == reserved`: nothing changes (a peek).
    ///
    /// A difference above four times the limit changes no state more than
    /// four times the limit does (none holds more), so it is capped there,
    /// which keeps the Redis scripts' arithmetic exact.
    pub(crate) fn settle(
        &self,
        state: &mut State,
        now: u64,
        reserved: u64,
        actual: u64,
    ) -> Option<Decision> {
        let cap = self.limit().saturating_mul(4);
        match actual.cmp(&reserved) {
            std::cmp::Ordering::Greater => self.penalize(state, now, (actual - reserved).min(cap)),
            std::cmp::Ordering::Less => self.refund(state, now, (reserved - actual).min(cap)),
            std::cmp::Ordering::Equal => {
                with_transitions!(self, state, |a, s| a.decide(s, now, 0))
            }
        }
    }

    /// The most a settlement gives back of the `consumed` units of a
    /// reservation asked of the store `held` µs ago, whose decision said
    /// the budget would be whole again after `reset` µs: the units it still
    /// holds. A refund of more would give back units of later requests.
    ///
    /// - A fixed window (or calendar period) counts them until the window
    ///   ends, `reset` after the reservation; a sliding log until they
    ///   leave it, one window later. A sliding window counter gives them
    ///   back until their window ends, one window before `reset`, and
    ///   nothing after: the previous window's count then holds them, and a
    ///   refund (taken from the current window's count first, which holds
    ///   later requests') would free later requests' units in the window
    ///   after.
    /// - A bucket (token bucket, GCRA, leaky bucket) pays a reservation back
    ///   by its refill once, without the reservation, it would have been
    ///   full: not before `reset` less the reservation's own refill time.
    ///   From then on, one unit less per emission interval.
    pub(crate) fn refundable(&self, consumed: u64, reset: u64, held: u64) -> u64 {
        let whole_until = |end: u64| if held < end { consumed } else { 0 };
        let refilled = |interval: u64| {
            let full_after = reset.saturating_sub(consumed.saturating_mul(interval));
            consumed.saturating_sub(held.saturating_sub(full_after) / interval.max(1))
        };
        match self {
            Algorithm::FixedWindow(_) => whole_until(reset),
            Algorithm::SlidingWindowCounter(a) => {
                whole_until(reset.saturating_sub(a.window_micros()))
            }
            Algorithm::SlidingWindowLog(a) => whole_until(a.window_micros()),
            Algorithm::TokenBucket(a) => refilled(a.interval_micros()),
            Algorithm::Gcra(a) => refilled(a.interval_micros()),
            Algorithm::LeakyBucket(a) => refilled(a.interval_micros()),
            Algorithm::Concurrency(_) => 0,
        }
    }
}

/// The state of one key under one algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum State {
    /// Fixed window state.
    FixedWindow(FixedWindowState),
    /// Sliding window log state (boxed: it grows with the limit, up to
    /// `2 ×` [`LOG_SLOTS`](crate::algorithm::sliding_window_log::LOG_SLOTS) entries).
    SlidingWindowLog(Box<SlidingWindowLogState>),
    /// Sliding window counter state.
    SlidingWindowCounter(SlidingWindowCounterState),
    /// Token bucket state.
    TokenBucket(TokenBucketState),
    /// GCRA and leaky bucket state.
    Gcra(GcraState),
    /// Concurrency state (boxed: it grows with the permits held).
    Concurrency(Box<ConcurrencyState>),
}

/// A named, validated rate-limiting policy. Cheap to clone.
///
/// The name is part of every storage key, header and metric: two policies with
/// the same name on one store share their state. New numbers under a name in
/// use (a reload) read the state the old numbers wrote; numbers no looser
/// than the old ones never admit more than they allow from the change on,
/// counting what the old numbers admitted (a count written in a longer
/// window counts until that window would have ended; RELIABILITY.md, section
/// "Parameter changes under one name", says exactly what holds for each
/// algorithm). Each constructor gives a
/// default name that includes the parameters (such as `fixed-window-5-per-10s`);
/// [`with_name`](Policy::with_name) sets your own. A default name obeys the
/// same rules as one given to `with_name` (at most 64 characters): parameters
/// too long to spell out in full end in a hash of their full rendering.
///
/// ```
/// use ratelimit_core::{Policy, Rate};
/// use std::time::Duration;
///
/// let per_ip = Policy::fixed_window(5, Duration::from_secs(10))?;
/// assert_eq!(per_ip.name(), "fixed-window-5-per-10s");
///
/// let api = Policy::gcra(20, Rate::per_second(10))?.with_name("api")?;
/// assert_eq!(api.limit(), 20);
///
/// assert!(Policy::fixed_window(0, Duration::from_secs(1)).is_err());
/// # Ok::<(), ratelimit_core::PolicyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Policy {
    inner: Arc<Inner>,
}

// Aligned to a cache line, so the reference counts in front of it (and a
// policy's fields) share no line with another allocation: every request
// clones its rule's policy, so every core writes those counts.
#[derive(PartialEq, Eq, Hash)]
#[repr(align(64))]
struct Inner {
    name: Box<str>,
    algorithm: Algorithm,
    /// A hash of the name, computed once (stores hash it with the key).
    name_hash: u64,
    /// Shadow mode: decided and counted, never enforced.
    shadow: bool,
}

/// FNV-1a of a policy name: stable and cheap, computed once per policy.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Policy {
    /// A policy from an algorithm, with its default name.
    pub fn new(algorithm: Algorithm) -> Self {
        let name = default_name(&algorithm);
        Policy {
            inner: Arc::new(Inner {
                name_hash: name_hash(&name),
                name: name.into_boxed_str(),
                algorithm,
                shadow: false,
            }),
        }
    }

    /// At most `limit` per aligned `window`. See [`FixedWindow`].
    pub fn fixed_window(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        Ok(Policy::new(Algorithm::FixedWindow(FixedWindow::new(
            limit, window,
        )?)))
    }

    /// At most `limit` per period of the calendar: per day, ISO week
    /// (from Monday), month or year, in UTC or at a fixed offset from it
    /// ([`Period::utc_offset`](crate::Period::utc_offset), less than 24 hours
    /// either way, checked here).
    ///
    /// A fixed window whose edges are the calendar's: a month is 28 to 31
    /// days, from the 1st at 00:00 to the next 1st, a year 365 or 366. The
    /// count starts again at each edge, and [`Decision::reset_after`] counts
    /// to the real end of the period in progress. The stores read their
    /// clock as Unix time: the Redis server's `TIME`, or in memory a
    /// [`MonotonicClock`](crate::clock::MonotonicClock), which starts at the
    /// wall clock's time (a [`ManualClock`](crate::clock::ManualClock) reads
    /// what it is set to). The offset is fixed: no daylight saving time.
    /// [`window`](Policy::window) is the longest period (31 days for a
    /// month); [`FixedWindow::bounds`] gives the period that holds a time.
    ///
    /// The default name spells the period, such as `fixed-window-1000-per-month`
    /// (never the name of a plain fixed window, whose durations have a number:
    /// `fixed-window-1000-per-30d`), and the offset, such as
    /// `fixed-window-1000-per-day-utc-east-2h`.
    ///
    /// ```
    /// use ratelimit_core::{Period, Policy};
    ///
    /// let monthly = Policy::calendar(10_000, Period::Month)?;
    /// assert_eq!(monthly.name(), "fixed-window-10000-per-month");
    /// let daily_in_new_york = Policy::calendar(500, Period::Day.utc_offset(-5 * 3600))?;
    /// assert_eq!(daily_in_new_york.name(), "fixed-window-500-per-day-utc-west-5h");
    ///
    /// assert!(Policy::calendar(1, Period::Day.utc_offset(24 * 3600)).is_err());
    /// # Ok::<(), ratelimit_core::PolicyError>(())
    /// ```
    pub fn calendar(limit: u64, calendar: impl Into<Calendar>) -> Result<Self, PolicyError> {
        Ok(Policy::new(Algorithm::FixedWindow(FixedWindow::calendar(
            limit,
            calendar.into(),
        )?)))
    }

    /// At most `limit` in any interval of length `window`. See [`SlidingWindowLog`].
    pub fn sliding_window_log(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        Ok(Policy::new(Algorithm::SlidingWindowLog(
            SlidingWindowLog::new(limit, window)?,
        )))
    }

    /// About `limit` per sliding `window`. See [`SlidingWindowCounter`].
    pub fn sliding_window_counter(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        Ok(Policy::new(Algorithm::SlidingWindowCounter(
            SlidingWindowCounter::new(limit, window)?,
        )))
    }

    /// Bursts up to `capacity`, refilled at `rate`. See [`TokenBucket`].
    pub fn token_bucket(capacity: u64, rate: Rate) -> Result<Self, PolicyError> {
        Ok(Policy::new(Algorithm::TokenBucket(TokenBucket::new(
            capacity, rate,
        )?)))
    }

    /// Bursts up to `burst`, sustained `rate`, one timestamp per key. See [`Gcra`].
    pub fn gcra(burst: u64, rate: Rate) -> Result<Self, PolicyError> {
        Ok(Policy::new(Algorithm::Gcra(Gcra::new(burst, rate)?)))
    }

    /// Requests leave at `rate`, at most `capacity` in the bucket. See [`LeakyBucket`].
    pub fn leaky_bucket(capacity: u64, rate: Rate) -> Result<Self, PolicyError> {
        Ok(Policy::new(Algorithm::LeakyBucket(LeakyBucket::new(
            capacity, rate,
        )?)))
    }

    /// At most `max` in flight per key, each permit leased for `lease`. See [`Concurrency`].
    pub fn concurrency(max: u64, lease: Duration) -> Result<Self, PolicyError> {
        Ok(Policy::new(Algorithm::Concurrency(Concurrency::new(
            max, lease,
        )?)))
    }

    /// The same policy under another name: 1 to 64 characters from
    /// `[A-Za-z0-9._-]`, so it is safe in storage keys, headers and metrics.
    pub fn with_name(self, name: impl Into<String>) -> Result<Self, PolicyError> {
        let name = name.into();
        if !valid_name(&name) {
            return Err(PolicyError::InvalidName { name });
        }
        Ok(Policy {
            inner: Arc::new(Inner {
                name_hash: name_hash(&name),
                name: name.into_boxed_str(),
                algorithm: self.inner.algorithm,
                shadow: self.inner.shadow,
            }),
        })
    }

    /// The same policy in shadow mode (or not): it is decided, consumes and
    /// is counted like any other, and its headers are set as configured, but
    /// a layer never refuses a request because of it. Use it to dark-launch a
    /// new limit and watch what it would have denied.
    ///
    /// A shadow policy counts every request that reaches the layer, those the
    /// enforced policies refuse included: it answers what it would decide on
    /// the traffic as it arrives, not on what the enforced policies let
    /// through. (Denied requests consume nothing of the enforced limits.)
    ///
    /// Shadow mode does not change the storage key: a shadow policy and an
    /// enforced one with the same name share their state.
    ///
    /// ```
    /// use ratelimit_core::Policy;
    /// use std::time::Duration;
    ///
    /// let trial = Policy::fixed_window(100, Duration::from_secs(60))?.with_shadow(true);
    /// assert!(trial.is_shadow());
    /// # Ok::<(), ratelimit_core::PolicyError>(())
    /// ```
    #[must_use]
    pub fn with_shadow(self, shadow: bool) -> Self {
        if self.inner.shadow == shadow {
            return self;
        }
        Policy {
            inner: Arc::new(Inner {
                name: self.inner.name.clone(),
                algorithm: self.inner.algorithm,
                name_hash: self.inner.name_hash,
                shadow,
            }),
        }
    }

    /// Whether the policy is in shadow mode (see [`with_shadow`](Policy::with_shadow)).
    pub fn is_shadow(&self) -> bool {
        self.inner.shadow
    }

    /// The policy's name.
    #[inline]
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// A hash of the name, computed once when the policy was built.
    #[inline]
    pub(crate) fn name_hash(&self) -> u64 {
        self.inner.name_hash
    }

    /// The algorithm and its parameters.
    #[inline]
    pub fn algorithm(&self) -> &Algorithm {
        &self.inner.algorithm
    }

    /// The quota: the most a key can take at once.
    pub fn limit(&self) -> u64 {
        self.inner.algorithm.limit()
    }

    /// The time over which the quota applies (see [`Algorithm::window_micros`]).
    pub fn window(&self) -> Duration {
        Duration::from_micros(self.inner.algorithm.window_micros())
    }

    /// Whether a reservation under this policy can be settled to its actual
    /// cost ([`Store::settle`](crate::Store::settle)): every algorithm but
    /// concurrency, whose units are permits held and released, not consumed.
    /// A layer or configuration that settles costs after the response checks
    /// this when it is built.
    pub fn supports_settlement(&self) -> bool {
        self.inner.algorithm.supports_adjustments()
    }

    /// How many of the `consumed` units of a decision (`decided`) a give-back
    /// `held` after it was asked of the store may return: those the limit
    /// still counts, not those a window's end or a bucket's refill already
    /// let later requests take (see [`Settle`](crate::Settle)). A store's
    /// settlement bounds itself so; a caller that can only
    /// [`refund`](crate::Store::refund) refunds this many.
    pub fn refundable(&self, consumed: u64, decided: &Decision, held: Duration) -> u64 {
        let held = u64::try_from(held.as_micros()).unwrap_or(u64::MAX);
        self.inner
            .algorithm
            .refundable(consumed, decided.reset_after_micros(), held)
    }

    /// The largest cost a single request can ever be admitted with.
    #[inline]
    pub fn max_cost(&self) -> u64 {
        self.limit()
    }

    /// Returns an error when `cost` can never pass this policy.
    #[inline]
    pub fn check_cost(&self, cost: u64) -> Result<(), StoreError> {
        if cost > self.max_cost() {
            return Err(StoreError::CostExceedsLimit {
                policy: self.name().to_owned(),
                cost,
                max: self.max_cost(),
            });
        }
        Ok(())
    }

    /// The same policy with its quota divided by `instances` (at least 1 unit
    /// and, for rates, the rate divided too), under the same name: the
    /// conservative local limit each of `instances` service instances can
    /// enforce on its own while the shared store is unreachable.
    ///
    /// ```
    /// use ratelimit_core::{Policy, Rate};
    ///
    /// let shared = Policy::gcra(100, Rate::per_second(50))?.with_name("api")?;
    /// let local = shared.divided_among(4)?;
    /// assert_eq!(local.name(), "api");
    /// assert_eq!(local.limit(), 25);
    /// # Ok::<(), ratelimit_core::PolicyError>(())
    /// ```
    pub fn divided_among(&self, instances: u32) -> Result<Policy, PolicyError> {
        let n = u64::from(instances.max(1));
        let share = |limit: u64| (limit / n).max(1);
        // The same amount over an n times longer period: 1/n of the rate.
        let slower = |rate: Rate| {
            Rate::new(
                rate.amount(),
                rate.period().saturating_mul(instances.max(1)),
            )
        };
        let algorithm = match self.algorithm() {
            Algorithm::FixedWindow(a) => Algorithm::FixedWindow(a.with_limit(share(a.limit()))?),
            Algorithm::SlidingWindowLog(a) => Algorithm::SlidingWindowLog(SlidingWindowLog::new(
                share(a.limit()),
                Duration::from_micros(a.window_micros()),
            )?),
            Algorithm::SlidingWindowCounter(a) => {
                Algorithm::SlidingWindowCounter(SlidingWindowCounter::new(
                    share(a.limit()),
                    Duration::from_micros(a.window_micros()),
                )?)
            }
            Algorithm::TokenBucket(a) => {
                Algorithm::TokenBucket(TokenBucket::new(share(a.capacity()), slower(a.rate()))?)
            }
            Algorithm::Gcra(a) => Algorithm::Gcra(Gcra::new(share(a.burst()), slower(a.rate()))?),
            Algorithm::LeakyBucket(a) => {
                Algorithm::LeakyBucket(LeakyBucket::new(share(a.capacity()), slower(a.rate()))?)
            }
            Algorithm::Concurrency(a) => Algorithm::Concurrency(Concurrency::new(
                share(a.max()),
                Duration::from_micros(a.lease_micros()),
            )?),
        };
        Ok(Policy {
            inner: Arc::new(Inner {
                name: self.inner.name.clone(),
                algorithm,
                name_hash: self.inner.name_hash,
                shadow: self.inner.shadow,
            }),
        })
    }

    /// Whether two handles point at the same policy object (cheap).
    #[inline]
    pub fn ptr_eq(&self, other: &Policy) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The address of the policy object: two live handles have the same
    /// address exactly when [`ptr_eq`](Self::ptr_eq).
    #[inline]
    pub(crate) fn addr(&self) -> usize {
        Arc::as_ptr(&self.inner).addr()
    }
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name())
            .field("algorithm", self.algorithm())
            .field("shadow", &self.is_shadow())
            .finish()
    }
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A compact, name-safe rendering of a duration: `10s`, `500ms`, `1h`, `250us`.
pub(crate) fn short_duration(micros: u64) -> String {
    const UNITS: [(u64, &str); 6] = [
        (86_400_000_000, "d"),
        (3_600_000_000, "h"),
        (60_000_000, "m"),
        (1_000_000, "s"),
        (1_000, "ms"),
        (1, "us"),
    ];
    for (size, unit) in UNITS {
        if micros.is_multiple_of(size) {
            return format!("{}{unit}", micros / size);
        }
    }
    format!("{micros}us")
}

fn rate_name(rate: Rate) -> String {
    let micros = u64::try_from(rate.period().as_micros()).unwrap_or(u64::MAX);
    format!("{}-per-{}", rate.amount(), short_duration(micros))
}

/// `fixed-window-<limit>-per-<period>`, then `-utc-east-<offset>` or
/// `-utc-west-<offset>` unless the offset is 0.
fn calendar_name(kind: &str, limit: u64, calendar: Calendar) -> String {
    let offset = calendar.utc_offset_seconds();
    let side = match offset {
        0 => return format!("{kind}-{limit}-per-{}", calendar.period()),
        1.. => "east",
        _ => "west",
    };
    let micros = u64::from(offset.unsigned_abs()) * 1_000_000;
    format!(
        "{kind}-{limit}-per-{}-utc-{side}-{}",
        calendar.period(),
        short_duration(micros)
    )
}

/// The default name of a policy: its kind and parameters (such as
/// `fixed-window-5-per-10s`), held to the same rules as
/// [`with_name`](Policy::with_name). A rendering longer than 64 characters
/// (extreme limits or durations) keeps at most its first 47 characters and
/// ends in `-` and 16 hex digits of the full rendering's hash, so that
/// different parameters still give different names.
fn default_name(algorithm: &Algorithm) -> String {
    let full = full_default_name(algorithm);
    if full.len() <= 64 {
        return full;
    }
    // Every character of the rendering is ASCII, so any byte index is a
    // character boundary.
    let head = full.get(..47).unwrap_or(&full).trim_end_matches('-');
    format!("{head}-{:016x}", name_hash(&full))
}

fn full_default_name(algorithm: &Algorithm) -> String {
    let kind = algorithm.kind();
    match algorithm {
        Algorithm::FixedWindow(a) => match a.calendar_periods() {
            Some(calendar) => calendar_name(kind, a.limit(), calendar),
            None => format!(
                "{kind}-{}-per-{}",
                a.limit(),
                short_duration(a.window_micros())
            ),
        },
        Algorithm::SlidingWindowLog(a) => {
            format!(
                "{kind}-{}-per-{}",
                a.limit(),
                short_duration(a.window_micros())
            )
        }
        Algorithm::SlidingWindowCounter(a) => {
            format!(
                "{kind}-{}-per-{}",
                a.limit(),
                short_duration(a.window_micros())
            )
        }
        Algorithm::TokenBucket(a) => format!("{kind}-{}-at-{}", a.capacity(), rate_name(a.rate())),
        Algorithm::Gcra(a) => format!("{kind}-{}-at-{}", a.burst(), rate_name(a.rate())),
        Algorithm::LeakyBucket(a) => format!("{kind}-{}-at-{}", a.capacity(), rate_name(a.rate())),
        Algorithm::Concurrency(a) => {
            format!(
                "{kind}-{}-lease-{}",
                a.max(),
                short_duration(a.lease_micros())
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithm_kinds_are_listed_in_declaration_order_and_parse_back() {
        for (i, kind) in AlgorithmKind::ALL.into_iter().enumerate() {
            assert_eq!(kind as usize, i, "{kind}");
            assert_eq!(kind.name().parse::<AlgorithmKind>(), Ok(kind));
        }
        let err = "Gcra".parse::<AlgorithmKind>().unwrap_err().to_string();
        assert!(
            err.contains("\"Gcra\"") && err.contains("leaky-bucket"),
            "{err}"
        );
    }

    #[test]
    fn names() {
        let p = Policy::token_bucket(20, Rate::per_second(10)).expect("valid");
        assert_eq!(p.name(), "token-bucket-20-at-10-per-1s");
        assert!(valid_name(p.name()));
        let p = Policy::concurrency(3, Duration::from_millis(1500)).expect("valid");
        assert_eq!(p.name(), "concurrency-3-lease-1500ms");
        assert!(p.clone().with_name("bad name").is_err());
        assert!(p.clone().with_name("").is_err());
        assert!(p.clone().with_name("x".repeat(65)).is_err());
        assert_eq!(p.with_name("ok-1.2_3").expect("valid").name(), "ok-1.2_3");
    }

    #[test]
    fn default_names_are_valid_names_even_for_extreme_parameters() {
        use crate::algorithm::{MAX_HORIZON_MICROS, MAX_LIMIT};
        let horizon = MAX_HORIZON_MICROS;
        let mut policies = Vec::new();
        // The largest accepted values, values just below them (whose
        // durations render in microseconds, the longest way), and values
        // past them that every constructor rejects.
        let limits = [1, 7, MAX_LIMIT - 1, MAX_LIMIT, u64::MAX];
        let windows = [1, 1_000_000, horizon - 1, horizon, u64::MAX].map(Duration::from_micros);
        for limit in limits {
            for window in windows.into_iter().chain([Duration::MAX]) {
                policies.extend(Policy::fixed_window(limit, window));
                policies.extend(Policy::sliding_window_log(limit, window));
                policies.extend(Policy::sliding_window_counter(limit, window));
                policies.extend(Policy::concurrency(limit, window));
                for rate in [
                    Rate::new(1, window),
                    Rate::new(limit, window),
                    Rate::new(horizon - 1, window),
                    Rate::new(u64::MAX, window),
                ] {
                    policies.extend(Policy::token_bucket(limit, rate));
                    policies.extend(Policy::gcra(limit, rate));
                    policies.extend(Policy::leaky_bucket(limit, rate));
                }
            }
        }
        // Calendar periods: each a name of its own, never a plain window's.
        for limit in limits {
            for period in crate::Period::ALL {
                for offset in [-86_399, -19_800, -1, 0, 1, 3_600, 86_399, 86_400] {
                    policies.extend(Policy::calendar(limit, period.utc_offset(offset)));
                }
            }
        }
        let mut kinds = std::collections::BTreeSet::new();
        let mut long = 0;
        let mut names = std::collections::HashMap::new();
        for p in &policies {
            let name = p.name();
            assert!(valid_name(name), "{name:?} ({} chars)", name.len());
            assert!(name.starts_with(p.algorithm().kind()), "{name}");
            // The same name as `with_name` would accept.
            assert!(p.clone().with_name(name).is_ok(), "{name}");
            kinds.insert(p.algorithm().kind());
            let full = full_default_name(p.algorithm());
            if full.len() > 64 {
                long += 1;
                assert!(
                    name.ends_with(&format!("-{:016x}", name_hash(&full))),
                    "{name} for {full}"
                );
            } else {
                assert_eq!(name, full);
            }
            // Different parameters, different names.
            if let Some(other) = names.insert(name.to_owned(), p.algorithm()) {
                assert_eq!(other, p.algorithm(), "{name}");
            }
        }
        assert_eq!(kinds.len(), AlgorithmKind::ALL.len(), "{kinds:?}");
        assert!(long > 0, "no parameters long enough to shorten");
        // A short name is unchanged.
        let p = Policy::fixed_window(5, Duration::from_secs(10)).expect("valid");
        assert_eq!(p.name(), "fixed-window-5-per-10s");
    }

    #[test]
    fn invalid_policies_fail_when_built() {
        let s = Duration::from_secs(1);
        assert_eq!(
            Policy::fixed_window(0, s).unwrap_err(),
            PolicyError::ZeroLimit { what: "limit" }
        );
        assert!(matches!(
            Policy::sliding_window_log(1, Duration::ZERO),
            Err(PolicyError::ZeroWindow { .. })
        ));
        assert!(matches!(
            Policy::sliding_window_log(1, Duration::from_nanos(999)),
            Err(PolicyError::ZeroWindow { .. })
        ));
        assert!(matches!(
            Policy::token_bucket(1, Rate::new(0, s)),
            Err(PolicyError::ZeroLimit { .. })
        ));
        assert!(matches!(
            Policy::gcra(1, Rate::new(2_000_000, s)),
            Err(PolicyError::RateTooHigh { .. })
        ));
        assert!(matches!(
            Policy::gcra(u64::MAX, Rate::per_second(1)),
            Err(PolicyError::Unrepresentable { .. })
        ));
        assert!(matches!(
            Policy::leaky_bucket(1 << 39, Rate::per_hour(1)),
            Err(PolicyError::Unrepresentable { .. })
        ));
        assert!(matches!(
            Policy::sliding_window_counter(1 << 30, Duration::from_secs(3600 * 24)),
            Err(PolicyError::Unrepresentable { .. })
        ));
        assert!(matches!(
            Policy::fixed_window(1, Duration::MAX),
            Err(PolicyError::Unrepresentable { .. })
        ));
        assert!(matches!(
            Policy::concurrency(1, Duration::ZERO),
            Err(PolicyError::ZeroWindow { .. })
        ));
    }

    /// The three algorithms that count within a window check their
    /// parameters alike and in one order: the limit (zero, then too large),
    /// then the window (zero, then too long); the sliding window counter
    /// then their product.
    #[test]
    fn windowed_policies_report_the_limit_then_the_window() {
        use crate::algorithm::{MAX_HORIZON_MICROS, MAX_LIMIT};
        let s = Duration::from_secs(1);
        let too_long = Duration::from_micros(MAX_HORIZON_MICROS + 1);
        let zero_limit = PolicyError::ZeroLimit { what: "limit" };
        let big_limit = PolicyError::Unrepresentable {
            what: "limit",
            max: MAX_LIMIT,
        };
        let zero_window = PolicyError::ZeroWindow { what: "window" };
        let long_window = PolicyError::Unrepresentable {
            what: "window",
            max: MAX_HORIZON_MICROS,
        };
        type Build = fn(u64, Duration) -> Result<Policy, PolicyError>;
        let windowed: [Build; 3] = [
            Policy::fixed_window,
            Policy::sliding_window_log,
            Policy::sliding_window_counter,
        ];
        for (i, build) in windowed.into_iter().enumerate() {
            for (limit, window, error) in [
                (0, s, &zero_limit),
                (0, Duration::ZERO, &zero_limit),
                (0, Duration::MAX, &zero_limit),
                (MAX_LIMIT + 1, s, &big_limit),
                (u64::MAX, Duration::ZERO, &big_limit),
                (u64::MAX, too_long, &big_limit),
                (1, Duration::ZERO, &zero_window),
                (1, Duration::from_nanos(999), &zero_window),
                (MAX_LIMIT, Duration::from_nanos(999), &zero_window),
                (1, too_long, &long_window),
                (MAX_LIMIT, Duration::MAX, &long_window),
            ] {
                assert_eq!(
                    build(limit, window).as_ref().unwrap_err(),
                    error,
                    "algorithm {i}: {limit} per {window:?}"
                );
            }
            let longest = build(1, Duration::from_micros(MAX_HORIZON_MICROS)).expect("valid");
            assert_eq!(longest.window(), Duration::from_micros(MAX_HORIZON_MICROS));
            let largest = build(MAX_LIMIT, Duration::from_micros(1)).expect("valid");
            assert_eq!(largest.limit(), MAX_LIMIT);
        }
        // Both valid alone, but not their product in the counter's floats.
        assert_eq!(
            Policy::sliding_window_counter(MAX_LIMIT, Duration::from_micros(MAX_HORIZON_MICROS))
                .unwrap_err(),
            PolicyError::Unrepresentable {
                what: "limit times window in microseconds",
                max: crate::algorithm::MAX_EXACT / 2,
            }
        );
    }

    #[test]
    fn calendar_policies_validate_their_offset_and_keep_their_periods() {
        use crate::Period;
        use crate::algorithm::Calendar;
        assert_eq!(
            Policy::calendar(5, Period::Month.utc_offset(-86_400)).unwrap_err(),
            PolicyError::UtcOffsetOutOfRange { seconds: -86_400 }
        );
        assert_eq!(
            Policy::calendar(0, Period::Month).unwrap_err(),
            PolicyError::ZeroLimit { what: "limit" }
        );
        let p = Policy::calendar(10, Period::Week.utc_offset(19_800)).expect("valid");
        assert_eq!(p.name(), "fixed-window-10-per-week-utc-east-330m");
        assert_eq!(p.window(), Duration::from_secs(7 * 86_400));
        let Algorithm::FixedWindow(a) = *p.divided_among(4).expect("valid").algorithm() else {
            panic!("a fixed window");
        };
        assert_eq!(a.limit(), 2);
        assert_eq!(
            a.calendar_periods(),
            Some(Calendar::from(Period::Week).utc_offset(19_800))
        );
        // Not the plain fixed window of a day, under its name or its numbers.
        let daily = Policy::calendar(10, Period::Day).expect("valid");
        let day = Policy::fixed_window(10, Duration::from_secs(86_400)).expect("valid");
        assert_eq!(
            (daily.name(), day.name()),
            ("fixed-window-10-per-day", "fixed-window-10-per-1d")
        );
        assert_ne!(daily.algorithm(), day.algorithm());
    }

    #[test]
    fn cost_checks() {
        let p = Policy::fixed_window(5, Duration::from_secs(1)).expect("valid");
        assert!(p.check_cost(5).is_ok());
        assert!(matches!(
            p.check_cost(u64::MAX),
            Err(StoreError::CostExceedsLimit {
                cost: u64::MAX,
                max: 5,
                ..
            })
        ));
    }
}
