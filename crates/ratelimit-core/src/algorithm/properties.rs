//! Property tests: every algorithm against a naive reference model.
//!
//! For random sequences of (time step, cost) a [`MemoryStore`] on a manual
//! clock, the pure transition in [`algorithm`](super) and a reference
//! model written here must give the same decision, field by field. The models
//! are deliberately simple and independent of the implementation: they keep
//! the admitted history (or one textbook quantity) and answer one question,
//! "would a request of cost `c` pass at time `s` if nothing else happened?".
//! Everything else is derived from that single predicate:
//!
//! - `remaining` is the largest cost that would pass now;
//! - `reset_after` is the first `r >= 0` at which the whole limit would pass;
//! - `retry_after` is the first `r >= 1` at which the same request would pass.
//!
//! (Both are found by binary search: with nothing consumed, "would pass" only
//! ever turns from false to true as time goes on.)
//!
//! On top of the agreement, each test checks the algorithm's guarantee
//! directly on the admitted history, that `retry_after` is exact (on a clone
//! of the pure state, the request is still denied one µs before it and allowed
//! at it), and that a denial changes nothing observable.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::clock::ManualClock;
use crate::policy::State;
use crate::{Algorithm, Decision, MemoryStore, PermitId, Policy, Rate, Store, StoreError};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

const KEY: &[u8] = b"prop-key";

// ---------------------------------------------------------------------------
// Reference models
// ---------------------------------------------------------------------------

/// A naive model of one algorithm for one key.
trait Model: Clone + std::fmt::Debug {
    /// The policy's limit (capacity, maximum).
    fn limit(&self) -> u64;
    /// An upper bound on any reset or retry time.
    fn horizon(&self) -> u64;
    /// Whether a request of `cost` would pass at `now` (not consuming it).
    fn allows(&self, now: u64, cost: u64) -> bool;
    /// Consumes `cost` (> 0) at `now`; `id` names a concurrency permit.
    fn admit(&mut self, now: u64, cost: u64, id: u64);
    /// For the leaky bucket, the wait of a request allowed at `now`.
    fn delay(&self, _now: u64) -> u64 {
        0
    }
    /// Releases a concurrency permit.
    fn release(&mut self, _id: u64) {}
}

/// Fixed window: the admitted history, counted per aligned window.
#[derive(Debug, Clone)]
struct FixedWindowModel {
    limit: u64,
    window: u64,
    admitted: Vec<(u64, u64)>,
}

impl Model for FixedWindowModel {
    fn limit(&self) -> u64 {
        self.limit
    }
    fn horizon(&self) -> u64 {
        self.window
    }
    fn allows(&self, now: u64, cost: u64) -> bool {
        let index = now / self.window;
        let count: u64 = self
            .admitted
            .iter()
            .filter(|&&(t, _)| t / self.window == index)
            .map(|&(_, c)| c)
            .sum();
        count + cost <= self.limit
    }
    fn admit(&mut self, now: u64, cost: u64, _id: u64) {
        self.admitted.push((now, cost));
    }
}

/// Sliding window log: a plain list of admitted timestamps, scanned each time.
#[derive(Debug, Clone)]
struct SlidingLogModel {
    limit: u64,
    window: u64,
    admitted: Vec<(u64, u64)>,
}

impl Model for SlidingLogModel {
    fn limit(&self) -> u64 {
        self.limit
    }
    fn horizon(&self) -> u64 {
        self.window
    }
    fn allows(&self, now: u64, cost: u64) -> bool {
        // A unit admitted at t counts during [t, t + window).
        let in_window: u64 = self
            .admitted
            .iter()
            .filter(|&&(t, _)| t <= now && now < t + self.window)
            .map(|&(_, c)| c)
            .sum();
        in_window + cost <= self.limit
    }
    fn admit(&mut self, now: u64, cost: u64, _id: u64) {
        self.admitted.push((now, cost));
    }
}

/// Sliding window counter: per-window counts; the previous window weighs in
/// proportion to how much of it the sliding window still covers.
#[derive(Debug, Clone)]
struct SlidingCounterModel {
    limit: u64,
    window: u64,
    counts: BTreeMap<u64, u64>,
}

impl Model for SlidingCounterModel {
    fn limit(&self) -> u64 {
        self.limit
    }
    fn horizon(&self) -> u64 {
        2 * self.window
    }
    fn allows(&self, now: u64, cost: u64) -> bool {
        let w = self.window;
        let index = now / w;
        let into = now % w;
        let current = self.counts.get(&index).copied().unwrap_or(0);
        let previous = match index.checked_sub(1) {
            Some(p) => self.counts.get(&p).copied().unwrap_or(0),
            None => 0,
        };
        // previous * (w - into) / w + current + cost <= limit, times w.
        u128::from(previous) * u128::from(w - into) + u128::from(current + cost) * u128::from(w)
            <= u128::from(self.limit) * u128::from(w)
    }
    fn admit(&mut self, now: u64, cost: u64, _id: u64) {
        *self.counts.entry(now / self.window).or_default() += cost;
    }
}

/// Token bucket as a straightforward simulation: the level in "token-µs"
/// (one token = `interval` µs of refill), refilled one per µs, capped at
/// `capacity * interval`. A whole token is `interval` of level.
#[derive(Debug, Clone)]
struct TokenBucketModel {
    capacity: u64,
    interval: u64,
    level: u64,
    at: u64,
}

impl TokenBucketModel {
    fn new(capacity: u64, interval: u64) -> Self {
        TokenBucketModel {
            capacity,
            interval,
            level: capacity * interval,
            at: 0,
        }
    }
    fn level_at(&self, now: u64) -> u64 {
        (self.level + (now - self.at)).min(self.capacity * self.interval)
    }
}

impl Model for TokenBucketModel {
    fn limit(&self) -> u64 {
        self.capacity
    }
    fn horizon(&self) -> u64 {
        self.capacity * self.interval
    }
    fn allows(&self, now: u64, cost: u64) -> bool {
        self.level_at(now) / self.interval >= cost
    }
    fn admit(&mut self, now: u64, cost: u64, _id: u64) {
        self.level = self.level_at(now) - cost * self.interval;
        self.at = now;
    }
}

/// GCRA, textbook: the theoretical arrival time, with a tolerance of
/// `burst * interval`.
#[derive(Debug, Clone)]
struct GcraModel {
    burst: u64,
    interval: u64,
    tat: u64,
}

impl Model for GcraModel {
    fn limit(&self) -> u64 {
        self.burst
    }
    fn horizon(&self) -> u64 {
        self.burst * self.interval
    }
    fn allows(&self, now: u64, cost: u64) -> bool {
        self.tat.max(now) + cost * self.interval <= now + self.burst * self.interval
    }
    fn admit(&mut self, now: u64, cost: u64, _id: u64) {
        self.tat = self.tat.max(now) + cost * self.interval;
    }
}

/// Leaky bucket as a queue: each admitted request occupies the slot
/// `[start, end)` (`interval` per unit) after the previous one; the work still
/// queued (or in service) plus the new request must fit in `capacity` units.
#[derive(Debug, Clone)]
struct LeakyBucketModel {
    capacity: u64,
    interval: u64,
    slots: Vec<(u64, u64)>,
}

impl LeakyBucketModel {
    /// Microseconds of service still owed at `now`.
    fn pending(&self, now: u64) -> u64 {
        self.slots
            .iter()
            .filter(|&&(_, end)| end > now)
            .map(|&(start, end)| end - start.max(now))
            .sum()
    }
    fn next_start(&self, now: u64) -> u64 {
        self.slots.last().map_or(now, |&(_, end)| end.max(now))
    }
}

impl Model for LeakyBucketModel {
    fn limit(&self) -> u64 {
        self.capacity
    }
    fn horizon(&self) -> u64 {
        self.capacity * self.interval
    }
    fn allows(&self, now: u64, cost: u64) -> bool {
        self.pending(now) + cost * self.interval <= self.capacity * self.interval
    }
    fn admit(&mut self, now: u64, cost: u64, _id: u64) {
        let start = self.next_start(now);
        self.slots.push((start, start + cost * self.interval));
    }
    fn delay(&self, now: u64) -> u64 {
        self.next_start(now) - now
    }
}

/// Concurrency: the list of leases (permit, expiry, units).
#[derive(Debug, Clone)]
struct ConcurrencyModel {
    max: u64,
    lease: u64,
    leases: Vec<(u64, u64, u64)>,
}

impl Model for ConcurrencyModel {
    fn limit(&self) -> u64 {
        self.max
    }
    fn horizon(&self) -> u64 {
        self.lease
    }
    fn allows(&self, now: u64, cost: u64) -> bool {
        let held: u64 = self
            .leases
            .iter()
            .filter(|&&(_, expires, _)| expires > now)
            .map(|&(_, _, units)| units)
            .sum();
        held + cost <= self.max
    }
    fn admit(&mut self, now: u64, cost: u64, id: u64) {
        self.leases.push((id, now + self.lease, cost));
    }
    fn release(&mut self, id: u64) {
        self.leases.retain(|&(i, _, _)| i != id);
    }
}

/// The first `x` in `[lo, hi]` with `f(x)`, for `f` false then true.
fn first_true(lo: u64, hi: u64, f: impl Fn(u64) -> bool) -> u64 {
    assert!(f(hi), "the model never passes within its horizon");
    let (mut lo, mut hi) = (lo, hi);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if f(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// A decision reduced to the fields the semantics define.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Observed {
    allowed: bool,
    limit: u64,
    remaining: u64,
    reset_us: u64,
    retry_us: Option<u64>,
    delay_us: u64,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).expect("fits in u64")
}

fn observe(d: &Decision) -> Observed {
    Observed {
        allowed: d.is_allowed(),
        limit: d.limit(),
        remaining: d.remaining(),
        reset_us: micros(d.reset_after()),
        retry_us: d.retry_after().map(micros),
        delay_us: micros(d.delay()),
    }
}

/// What the model says of a request of `cost` at `now`; consumes it if allowed.
fn model_decide<M: Model>(model: &mut M, now: u64, cost: u64, id: u64) -> Observed {
    let allowed = model.allows(now, cost);
    let delay_us = if allowed { model.delay(now) } else { 0 };
    if allowed && cost > 0 {
        model.admit(now, cost, id);
    }
    let limit = model.limit();
    let remaining = (0..=limit)
        .rev()
        .find(|&c| model.allows(now, c))
        .expect("a peek always passes");
    let reset_us = first_true(0, model.horizon(), |r| model.allows(now + r, limit));
    let retry_us =
        (!allowed).then(|| first_true(1, model.horizon(), |r| model.allows(now + r, cost)));
    Observed {
        allowed,
        limit,
        remaining,
        reset_us,
        retry_us,
        delay_us,
    }
}

// ---------------------------------------------------------------------------
// The harness
// ---------------------------------------------------------------------------

/// When the next operation happens, relative to the previous one.
#[derive(Debug, Clone, Copy)]
enum When {
    /// This many µs later.
    After(u64),
    /// At the last denial's retry time plus this offset (-1, 0 or 1), measured
    /// from that denial.
    AtRetry(i8),
    /// At the last decision's reset time, measured from that decision.
    AtReset,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Check {
        when: When,
        cost: u64,
    },
    /// Releases one of the permits still recorded as held (concurrency only).
    Release {
        when: When,
        pick: usize,
    },
}

/// One admitted request, from the store's decisions.
#[derive(Debug, Clone, Copy)]
struct Admission {
    step: usize,
    at: u64,
    cost: u64,
    delay: u64,
    /// The step at which its permit was released, if it was.
    released: Option<usize>,
}

/// A peek on a copy of `state` at `now`, through the pure transition.
fn pure_peek(algorithm: &Algorithm, state: &State, now: u64) -> Observed {
    let mut copy = state.clone();
    let d = algorithm
        .decide(&mut copy, now, 0, PermitId(u128::MAX))
        .expect("state matches algorithm");
    observe(&d)
}

/// Runs `ops` on a store, on the pure transition and on `model`, checking that
/// they agree and the per-denial properties. Returns the admitted history.
fn run<M: Model>(
    policy: &Policy,
    mut model: M,
    t0: u64,
    ops: &[Op],
) -> Result<Vec<Admission>, TestCaseError> {
    let clock = ManualClock::new(t0);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let algorithm = *policy.algorithm();
    let concurrency = matches!(algorithm, Algorithm::Concurrency(_));
    let mut state = algorithm.new_state();
    let mut history: Vec<Admission> = Vec::new();
    // Permits held: (index into history, the store's permit).
    let mut held: Vec<(usize, PermitId)> = Vec::new();
    let mut now = t0;
    // (when, retry) of the last denial, and (when, reset) of the last decision.
    let mut last_retry: Option<(u64, u64)> = None;
    let mut last_reset = (t0, 0);

    for (step, op) in ops.iter().enumerate() {
        let when = match *op {
            Op::Check { when, .. } | Op::Release { when, .. } => when,
        };
        now = match when {
            When::After(dt) => now + dt,
            When::AtRetry(offset) => match last_retry {
                Some((at, retry)) => (at + retry).saturating_add_signed(offset.into()).max(now),
                None => now,
            },
            When::AtReset => (last_reset.0 + last_reset.1).max(now),
        };
        clock.set(now);
        let at = format!("step {step} at t0+{} ({op:?})", now - t0);

        let cost = match *op {
            Op::Check { cost, .. } => cost,
            Op::Release { pick, .. } => {
                if !held.is_empty() {
                    let (index, permit) = held.remove(pick % held.len());
                    store
                        .release(KEY, policy, permit)
                        .into_inner()
                        .map_err(|e| TestCaseError::fail(format!("{at}: release failed: {e}")))?;
                    if let (Algorithm::Concurrency(c), State::Concurrency(s)) =
                        (&algorithm, &mut state)
                    {
                        c.release(s, now, PermitId(index as u128));
                    }
                    model.release(index as u64);
                    history[index].released = Some(step);
                }
                continue;
            }
        };

        if cost > policy.max_cost() {
            let result = store.check(KEY, policy, cost).into_inner();
            let ok = matches!(
                result,
                Err(StoreError::CostExceedsLimit { cost: c, max, .. }) if c == cost && max == policy.limit()
            );
            prop_assert!(ok, "{at}: expected CostExceedsLimit, got {result:?}");
            continue;
        }

        let before = state.clone();
        let id = history.len();
        let from_store = store
            .check(KEY, policy, cost)
            .into_inner()
            .map_err(|e| TestCaseError::fail(format!("{at}: store failed: {e}")))?;
        let from_pure = algorithm
            .decide(&mut state, now, cost, PermitId(id as u128))
            .expect("state matches algorithm");
        let expected = model_decide(&mut model, now, cost, id as u64);

        prop_assert_eq!(&observe(&from_store), &expected, "{}: store vs model", at);
        prop_assert_eq!(&observe(&from_pure), &expected, "{}: pure vs model", at);
        prop_assert_eq!(
            from_store.retry_after_micros(),
            expected.retry_us.unwrap_or(0),
            "{}: retry_after_micros",
            at
        );
        prop_assert_eq!(
            from_store.permit().is_some(),
            concurrency && expected.allowed && cost > 0,
            "{}: permit",
            at
        );

        if expected.allowed {
            if cost > 0 {
                if let Some(permit) = from_store.permit() {
                    held.push((id, permit));
                }
                history.push(Admission {
                    step,
                    at: now,
                    cost,
                    delay: expected.delay_us,
                    released: None,
                });
            }
        } else {
            let retry = expected.retry_us.expect("a denial has a retry time");
            // retry_after is exact: still denied one µs before, allowed at it.
            let mut probe = before.clone();
            let early = algorithm
                .decide(&mut probe, now + retry - 1, cost, PermitId(u128::MAX - 1))
                .expect("state matches algorithm");
            prop_assert!(
                !early.is_allowed(),
                "{at}: allowed at retry_after - 1 µs: {early:?}"
            );
            let mut probe = before.clone();
            let on_time = algorithm
                .decide(&mut probe, now + retry, cost, PermitId(u128::MAX - 1))
                .expect("state matches algorithm");
            prop_assert!(
                on_time.is_allowed(),
                "{at}: denied at retry_after: {on_time:?}"
            );

            // A denial consumes nothing: peeks before and after it agree, now
            // and later.
            for later in [0, retry - 1, retry, expected.reset_us] {
                prop_assert_eq!(
                    pure_peek(&algorithm, &before, now + later),
                    pure_peek(&algorithm, &state, now + later),
                    "{}: a denial changed what a peek sees {} µs later",
                    at,
                    later
                );
            }
            let store_peek = store
                .check(KEY, policy, 0)
                .into_inner()
                .map_err(|e| TestCaseError::fail(format!("{at}: store peek failed: {e}")))?;
            prop_assert_eq!(
                observe(&store_peek),
                pure_peek(&algorithm, &before, now),
                "{}: store peek after a denial",
                at
            );
            last_retry = Some((now, retry));
        }
        last_reset = (now, expected.reset_us);
    }
    Ok(history)
}

// ---------------------------------------------------------------------------
// Guarantees, checked on the admitted history
// ---------------------------------------------------------------------------

/// At most `limit` admitted per aligned window.
fn check_per_aligned_window(
    history: &[Admission],
    limit: u64,
    window: u64,
) -> Result<(), TestCaseError> {
    let mut per_window: BTreeMap<u64, u64> = BTreeMap::new();
    for a in history {
        *per_window.entry(a.at / window).or_default() += a.cost;
    }
    for (index, total) in per_window {
        prop_assert!(total <= limit, "window {index} admitted {total} > {limit}");
    }
    Ok(())
}

/// At most `limit` admitted in any interval of length `window`. The worst
/// intervals start at an admission.
fn check_every_interval(
    history: &[Admission],
    limit: u64,
    window: u64,
) -> Result<(), TestCaseError> {
    for a in history {
        let total: u64 = history
            .iter()
            .filter(|b| a.at <= b.at && b.at < a.at + window)
            .map(|b| b.cost)
            .sum();
        prop_assert!(
            total <= limit,
            "[{}, +{window}) admitted {total} > {limit}",
            a.at
        );
    }
    Ok(())
}

/// Within any `[t0, t1]`, at most `capacity + floor((t1 - t0) / interval)`
/// admitted. The worst intervals start and end at admissions.
fn check_rate(history: &[Admission], capacity: u64, interval: u64) -> Result<(), TestCaseError> {
    for a in history {
        for b in history.iter().filter(|b| b.at >= a.at) {
            let total: u64 = history
                .iter()
                .filter(|c| a.at <= c.at && c.at <= b.at)
                .map(|c| c.cost)
                .sum();
            let bound = capacity + (b.at - a.at) / interval;
            prop_assert!(
                total <= bound,
                "[{}, {}] admitted {total} > {bound}",
                a.at,
                b.at
            );
        }
    }
    Ok(())
}

/// Leaky bucket slots: each admitted request starts (at + delay) no earlier
/// than the previous start plus its cost in intervals, and never waits longer
/// than the bucket holds.
fn check_slots(history: &[Admission], capacity: u64, interval: u64) -> Result<(), TestCaseError> {
    for a in history {
        prop_assert!(
            a.delay + a.cost * interval <= capacity * interval,
            "a request waits {} µs with {} units in a bucket of {capacity}",
            a.delay,
            a.cost
        );
    }
    for pair in history.windows(2) {
        let (p, n) = (pair[0], pair[1]);
        prop_assert!(
            n.at + n.delay >= p.at + p.delay + p.cost * interval,
            "slots overlap: {p:?} then {n:?}"
        );
    }
    Ok(())
}

/// At every admission, the units held (admitted, not expired, not released)
/// are at most `max`.
fn check_held(history: &[Admission], max: u64, lease: u64) -> Result<(), TestCaseError> {
    for a in history {
        let held: u64 = history
            .iter()
            .filter(|b| {
                b.step <= a.step && b.at + lease > a.at && b.released.is_none_or(|r| r > a.step)
            })
            .map(|b| b.cost)
            .sum();
        prop_assert!(held <= max, "{held} units held > {max} at step {}", a.step);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------

/// A start time: the origin, a small one, or a large arbitrary one.
fn start() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 0..2_000_000u64, 0..(1u64 << 44)]
}

/// Time steps scaled to `horizon` (the time the whole limit takes to come
/// back) and `limit`: often none, often about one unit's worth, sometimes up
/// to two horizons; sometimes exactly at the last retry or reset time.
fn when(horizon: u64, limit: u64) -> impl Strategy<Value = When> {
    let unit = (horizon / limit).max(1);
    prop_oneof![
        3 => Just(When::After(0)),
        5 => (0..=2 * unit).prop_map(When::After),
        2 => (0..=2 * horizon).prop_map(When::After),
        2 => (-1i8..=1).prop_map(When::AtRetry),
        1 => Just(When::AtReset),
    ]
}

/// Costs: mostly 1..=limit, some peeks, some above the limit.
fn cost(limit: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => Just(0u64),
        8 => 1..=limit,
        1 => (limit + 1)..=(limit + 3),
    ]
}

fn checks(horizon: u64, limit: u64) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        (when(horizon, limit), cost(limit)).prop_map(|(when, cost)| Op::Check { when, cost }),
        1..48,
    )
}

fn checks_and_releases(horizon: u64, limit: u64) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        4 => (when(horizon, limit), cost(limit)).prop_map(|(when, cost)| Op::Check { when, cost }),
        1 => (when(horizon, limit), 0..64usize).prop_map(|(when, pick)| Op::Release { when, pick }),
    ];
    prop::collection::vec(op, 1..48)
}

/// (limit, window in µs, t0, ops) for the window algorithms.
fn window_case(windows: u64) -> impl Strategy<Value = (u64, u64, u64, Vec<Op>)> {
    (1..=20u64, 1..=1000u64).prop_flat_map(move |(limit, ms)| {
        let window = ms * 1000;
        (
            Just(limit),
            Just(window),
            start(),
            checks(windows * window, limit),
        )
    })
}

/// (capacity, rate, t0, ops) for the bucket algorithms.
fn bucket_case() -> impl Strategy<Value = (u64, Rate, u64, Vec<Op>)> {
    (1..=20u64, 1..=20u64, 1..=1000u64).prop_flat_map(|(capacity, amount, ms)| {
        let rate = Rate::new(amount, Duration::from_millis(ms));
        let interval = (ms * 1000).div_ceil(amount);
        (
            Just(capacity),
            Just(rate),
            start(),
            checks(capacity * interval, capacity),
        )
    })
}

fn interval_of(rate: Rate) -> u64 {
    micros(rate.period()).div_ceil(rate.amount())
}

// ---------------------------------------------------------------------------
// The properties
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn fixed_window_matches_model((limit, window, t0, ops) in window_case(1)) {
        let policy = Policy::fixed_window(limit, Duration::from_micros(window)).expect("valid");
        let model = FixedWindowModel { limit, window, admitted: Vec::new() };
        let history = run(&policy, model, t0, &ops)?;
        check_per_aligned_window(&history, limit, window)?;
    }

    #[test]
    fn sliding_window_log_matches_model((limit, window, t0, ops) in window_case(1)) {
        let policy = Policy::sliding_window_log(limit, Duration::from_micros(window)).expect("valid");
        let model = SlidingLogModel { limit, window, admitted: Vec::new() };
        let history = run(&policy, model, t0, &ops)?;
        check_every_interval(&history, limit, window)?;
    }

    #[test]
    fn sliding_window_counter_matches_model((limit, window, t0, ops) in window_case(2)) {
        let policy = Policy::sliding_window_counter(limit, Duration::from_micros(window)).expect("valid");
        let model = SlidingCounterModel { limit, window, counts: BTreeMap::new() };
        let history = run(&policy, model, t0, &ops)?;
        check_per_aligned_window(&history, limit, window)?;
    }

    #[test]
    fn token_bucket_matches_model((capacity, rate, t0, ops) in bucket_case()) {
        let policy = Policy::token_bucket(capacity, rate).expect("valid");
        let interval = interval_of(rate);
        let history = run(&policy, TokenBucketModel::new(capacity, interval), t0, &ops)?;
        check_rate(&history, capacity, interval)?;
    }

    #[test]
    fn gcra_matches_model((burst, rate, t0, ops) in bucket_case()) {
        let policy = Policy::gcra(burst, rate).expect("valid");
        let interval = interval_of(rate);
        let model = GcraModel { burst, interval, tat: 0 };
        let history = run(&policy, model, t0, &ops)?;
        check_rate(&history, burst, interval)?;
    }

    #[test]
    fn leaky_bucket_matches_model((capacity, rate, t0, ops) in bucket_case()) {
        let policy = Policy::leaky_bucket(capacity, rate).expect("valid");
        let interval = interval_of(rate);
        let model = LeakyBucketModel { capacity, interval, slots: Vec::new() };
        let history = run(&policy, model, t0, &ops)?;
        check_rate(&history, capacity, interval)?;
        check_slots(&history, capacity, interval)?;
    }

    #[test]
    fn concurrency_matches_model(
        (max, lease, t0, ops) in (1..=20u64, 1..=1000u64).prop_flat_map(|(max, ms)| {
            let lease = ms * 1000;
            (Just(max), Just(lease), start(), checks_and_releases(lease, max))
        })
    ) {
        let policy = Policy::concurrency(max, Duration::from_micros(lease)).expect("valid");
        let model = ConcurrencyModel { max, lease, leases: Vec::new() };
        let history = run(&policy, model, t0, &ops)?;
        check_held(&history, max, lease)?;
    }

    /// A token bucket and GCRA with the same parameters are the same limiter.
    #[test]
    fn token_bucket_and_gcra_agree((capacity, rate, t0, ops) in bucket_case()) {
        let bucket = Policy::token_bucket(capacity, rate).expect("valid");
        let gcra = Policy::gcra(capacity, rate).expect("valid");
        let (mut bucket_state, mut gcra_state) = (bucket.algorithm().new_state(), gcra.algorithm().new_state());
        let mut now = t0;
        for op in &ops {
            let Op::Check { when, cost } = *op else { continue };
            if let When::After(dt) = when {
                now += dt;
            }
            let cost = cost.min(capacity);
            let a = bucket.algorithm().decide(&mut bucket_state, now, cost, PermitId(0)).expect("state");
            let b = gcra.algorithm().decide(&mut gcra_state, now, cost, PermitId(0)).expect("state");
            prop_assert_eq!(observe(&a), observe(&b), "at t0+{} cost {}", now - t0, cost);
        }
    }
}
