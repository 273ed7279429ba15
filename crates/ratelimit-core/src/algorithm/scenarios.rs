//! The algorithms' admin transitions and edge cases as one table of
//! scenarios, driven by one loop: a scenario runs its steps on one key's
//! state, in order, and each step says what its decision (and the state
//! after it) must be.
//!
//! The properties that a loop checks at every point (the sliding log's
//! bound, the counter read under another window) stay beside their
//! algorithm.

use std::collections::VecDeque;
use std::time::Duration;

use super::fixed_window::FixedWindowState;
use super::gcra::GcraState;
use super::sliding_window_counter::SlidingWindowCounterState;
use super::sliding_window_log::SlidingWindowLogState;
use super::token_bucket::TokenBucketState;
use super::{
    Concurrency, FixedWindow, Gcra, LeakyBucket, Rate, SlidingWindowCounter, SlidingWindowLog,
    TokenBucket,
};
use crate::policy::State;
use crate::{Algorithm, Decision, PermitId};

const S: u64 = 1_000_000;

/// What a step does, at a time in µs.
enum Op {
    /// A request of this cost (a concurrency permit named after the step).
    Decide(u64, u64),
    /// An admin penalty of this amount.
    Penalize(u64, u64),
    /// An admin reward of this amount.
    Reward(u64, u64),
    /// The policy is reloaded with other parameters under the same name.
    Reload(Algorithm),
}

/// What a step's decision, or the state after it, must be.
#[derive(Debug)]
enum Expect {
    Allowed(bool),
    Limit(u64),
    Remaining(u64),
    Reset(u64),
    Retry(u64),
    RetryAtMost(u64),
    Delay(u64),
    /// The whole decision.
    Exactly(Decision),
    /// The whole state after the step.
    StateIs(State),
}

use Expect::*;
use Op::*;

struct Scenario {
    name: &'static str,
    algorithm: Algorithm,
    /// The state before the first step (`None`: a fresh key).
    state: Option<State>,
    steps: Vec<(Op, Vec<Expect>)>,
}

/// The table is written as one chain per scenario, a line per step.
impl Scenario {
    /// A scenario on a fresh key under `algorithm`.
    fn on(algorithm: Algorithm) -> Self {
        Scenario {
            name: "",
            algorithm,
            state: None,
            steps: Vec::new(),
        }
    }

    /// The scenario's name, for its failures.
    fn named(mut self, name: &'static str) -> Self {
        self.name = name;
        self
    }

    /// Starts from `state` rather than a fresh key.
    fn from(mut self, state: State) -> Self {
        self.state = Some(state);
        self
    }

    fn step<const N: usize>(mut self, op: Op, expected: [Expect; N]) -> Self {
        self.steps.push((op, expected.into()));
        self
    }

    fn decide<const N: usize>(self, now: u64, cost: u64, expected: [Expect; N]) -> Self {
        self.step(Decide(now, cost), expected)
    }

    fn penalize<const N: usize>(self, now: u64, amount: u64, expected: [Expect; N]) -> Self {
        self.step(Penalize(now, amount), expected)
    }

    fn reward<const N: usize>(self, now: u64, amount: u64, expected: [Expect; N]) -> Self {
        self.step(Reward(now, amount), expected)
    }

    fn reload(self, algorithm: Algorithm) -> Self {
        self.step(Reload(algorithm), [])
    }
}

fn fixed_window(limit: u64, window_micros: u64) -> Algorithm {
    let window = Duration::from_micros(window_micros);
    Algorithm::FixedWindow(FixedWindow::new(limit, window).expect("valid"))
}

fn sliding_log(limit: u64, window_micros: u64) -> Algorithm {
    let window = Duration::from_micros(window_micros);
    Algorithm::SlidingWindowLog(SlidingWindowLog::new(limit, window).expect("valid"))
}

fn sliding_counter(limit: u64, window_micros: u64) -> Algorithm {
    let window = Duration::from_micros(window_micros);
    Algorithm::SlidingWindowCounter(SlidingWindowCounter::new(limit, window).expect("valid"))
}

/// One unit every `interval_micros`.
fn every(interval_micros: u64) -> Rate {
    Rate::new(1, Duration::from_micros(interval_micros))
}

fn token_bucket(capacity: u64, interval_micros: u64) -> Algorithm {
    Algorithm::TokenBucket(TokenBucket::new(capacity, every(interval_micros)).expect("valid"))
}

fn gcra(burst: u64, interval_micros: u64) -> Algorithm {
    Algorithm::Gcra(Gcra::new(burst, every(interval_micros)).expect("valid"))
}

fn leaky_bucket(capacity: u64, interval_micros: u64) -> Algorithm {
    Algorithm::LeakyBucket(LeakyBucket::new(capacity, every(interval_micros)).expect("valid"))
}

fn concurrency(max: u64, lease_micros: u64) -> Algorithm {
    let lease = Duration::from_micros(lease_micros);
    Algorithm::Concurrency(Concurrency::new(max, lease).expect("valid"))
}

fn fixed_window_state(window_last: u64, count: u64) -> State {
    State::FixedWindow(FixedWindowState { window_last, count })
}

fn sliding_log_state(entries: &[(u64, u64)]) -> State {
    State::SlidingWindowLog(Box::new(SlidingWindowLogState {
        entries: entries.iter().copied().collect::<VecDeque<_>>(),
        total: entries.iter().map(|&(_, cost)| cost).sum(),
    }))
}

fn sliding_counter_state(window_last: u64, previous: u64, current: u64) -> State {
    State::SlidingWindowCounter(SlidingWindowCounterState {
        window_last,
        previous,
        current,
    })
}

fn token_bucket_state(tokens: u64, last: u64) -> State {
    State::TokenBucket(TokenBucketState {
        started: true,
        tokens,
        last,
    })
}

fn tat(tat: u64) -> State {
    State::Gcra(GcraState { tat })
}

fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario::on(fixed_window(4, 1_000))
            .named("fixed window: penalty until the window ends")
            .decide(10_100, 1, [Allowed(true)])
            // Capped at twice the limit; a debt peeks as denied.
            .penalize(
                10_200,
                100,
                [
                    Allowed(false),
                    StateIs(fixed_window_state(10_999, 8)),
                    Remaining(0),
                ],
            )
            .decide(10_300, 1, [Retry(700)])
            // The next window starts from nothing.
            .decide(11_000, 4, [Allowed(true)]),
        Scenario::on(fixed_window(4, 1_000))
            .named("fixed window: reward up to the budget")
            .penalize(10_000, 6, [])
            .reward(10_000, 1, [Allowed(false)])
            .reward(10_000, 2, [Allowed(true), Remaining(1)])
            .reward(
                10_000,
                50,
                [
                    Remaining(4),
                    Reset(0),
                    StateIs(fixed_window_state(10_999, 0)),
                ],
            ),
        // 10 per 60 s filled the window that started at 60 s; now 10 per 45 s.
        Scenario::on(fixed_window(10, 60 * S))
            .named("fixed window: another length")
            .decide(61 * S, 10, [Allowed(true)])
            .reload(fixed_window(10, 45 * S))
            // It belongs to the 45 s window that holds the minute's last µs,
            // [90 s, 135 s): denied until 135 s, and the retry time says so
            // exactly.
            .decide(
                70 * S,
                1,
                [Allowed(false), Remaining(0), Retry(65 * S), Reset(65 * S)],
            )
            .decide(90 * S, 1, [Allowed(false), Retry(45 * S)])
            .decide(135 * S - 1, 1, [Allowed(false)])
            .decide(135 * S, 10, [Allowed(true)]),
        // 5 per hour all used at 59:30; now 5 per minute under the same
        // name: the hour's count holds until the hour ends, in the minute
        // that ends with it.
        Scenario::on(fixed_window(5, 3_600 * S))
            .named("fixed window: an hour, then a minute")
            .decide(3_570 * S, 5, [Allowed(true)])
            .reload(fixed_window(5, 60 * S))
            .decide(3_570 * S, 1, [Allowed(false), Remaining(0), Retry(30 * S)])
            .decide(3_600 * S - 1, 1, [Allowed(false)])
            .decide(3_600 * S, 5, [Allowed(true)]),
        // The same for the sliding counter: the hour's 5 count in full in
        // the last minute of the hour, then weigh into the next one.
        Scenario::on(sliding_counter(5, 3_600 * S))
            .named("sliding counter: an hour, then a minute")
            .decide(3_570 * S, 5, [Allowed(true)])
            .reload(sliding_counter(5, 60 * S))
            .decide(3_570 * S, 1, [Allowed(false), Remaining(0), Retry(42 * S)])
            .decide(3_600 * S, 1, [Allowed(false)])
            .decide(3_612 * S - 1, 1, [Allowed(false)])
            .decide(3_612 * S, 1, [Allowed(true)]),
        Scenario::on(sliding_counter(4, 1_000))
            .named("sliding counter: penalty weighs next window")
            // Capped at twice the limit.
            .penalize(
                10_000,
                1_000,
                [StateIs(sliding_counter_state(10_999, 0, 8)), Allowed(false)],
            )
            // Next window: previous 8 weighs 8 × (1000 - e) / 1000; cost 1
            // passes once that is at most 3, at e = 625.
            .decide(10_000, 1, [Retry(1_625)])
            .decide(11_624, 1, [Allowed(false)])
            .decide(11_625, 1, [Allowed(true)]),
        Scenario::on(sliding_counter(4, 1_000))
            .named("sliding counter: reward current first")
            .decide(10_000, 3, [Allowed(true)])
            .decide(11_000, 1, [Allowed(true)])
            .reward(
                11_000,
                2,
                [StateIs(sliding_counter_state(11_999, 2, 0)), Remaining(2)],
            )
            .reward(11_000, 10, [Remaining(4), Reset(0)]),
        // 2^40 per 4 µs, then 1 per 2^50 µs: the product of the old count and
        // the new window does not fit in 64 bits.
        Scenario::on(sliding_counter(1, 1 << 50))
            .named("sliding counter: lowered limit")
            .from(sliding_counter_state(1 << 50, 1 << 41, 1 << 41))
            .decide(
                (1 << 50) + 1,
                1,
                [Allowed(false), Remaining(0), RetryAtMost(2 << 50)],
            ),
        Scenario::on(sliding_log(3, 1_000))
            .named("sliding log: penalty leaves with window")
            .decide(10_000, 1, [Allowed(true)])
            // Capped at twice the limit.
            .penalize(
                10_400,
                100,
                [
                    StateIs(sliding_log_state(&[(10_000, 1), (10_400, 5)])),
                    Allowed(false),
                    Remaining(0),
                ],
            )
            // The penalty sits at 10_400 and leaves at 11_400.
            .decide(10_500, 1, [Retry(900)])
            .decide(11_400, 3, [Allowed(true)]),
        Scenario::on(sliding_log(3, 1_000))
            .named("sliding log: reward most recent first")
            .decide(10_000, 1, [])
            .decide(10_200, 2, [])
            .reward(
                10_300,
                1,
                [
                    StateIs(sliding_log_state(&[(10_000, 1), (10_200, 1)])),
                    Remaining(1),
                    Reset(900),
                ],
            )
            .reward(
                10_300,
                5,
                [StateIs(sliding_log_state(&[])), Remaining(3), Reset(0)],
            ),
        Scenario::on(token_bucket(4, 100))
            .named("token bucket: penalty into debt")
            .penalize(10_000, 3, [Allowed(true), Remaining(1)])
            // A bucket of debt, then a bucket.
            .penalize(
                10_030,
                100,
                [
                    Allowed(false),
                    Reset(800),
                    StateIs(token_bucket_state(0, 10_430)),
                ],
            )
            .decide(10_030, 1, [Retry(500)])
            .decide(10_529, 1, [Allowed(false)])
            .decide(10_530, 1, [Allowed(true)]),
        Scenario::on(token_bucket(4, 100))
            .named("token bucket: reward pays debt first")
            .penalize(10_000, 6, [])
            .reward(10_000, 2, [Remaining(0), Reset(400)])
            // Level 50 µs of progress + 1 token.
            .reward(10_050, 1, [Remaining(1), Reset(250)])
            // Back to fresh.
            .reward(
                10_050,
                9,
                [
                    Remaining(4),
                    Reset(0),
                    StateIs(State::TokenBucket(TokenBucketState::default())),
                ],
            ),
        // Three tokens as of 50 µs from now (a clock that stepped back): two
        // tokens and 50 µs of progress now.
        Scenario::on(token_bucket(4, 100))
            .named("token bucket: tokens ahead pay debt")
            .from(token_bucket_state(3, 10_050))
            .decide(10_000, 3, [Allowed(false), Retry(50)])
            .decide(10_000, 2, [Allowed(true)]),
        Scenario::on(token_bucket(4, 100))
            .named("token bucket: penalty keeps progress")
            .decide(10_000, 4, [Allowed(true)])
            // 2 tokens and 50 µs of progress at 10_250; take 1.
            .penalize(10_250, 1, [Remaining(1), Reset(250)]),
        // Written by a bucket of 100.
        Scenario::on(token_bucket(4, 100))
            .named("token bucket: lowered capacity")
            .from(token_bucket_state(100, 9_000))
            .decide(10_000, 1, [Allowed(true), Remaining(3), Reset(100)]),
        // The same, with its refill time ahead of now (a clock that stepped
        // back) and a new interval that 2^40 tokens times would overflow.
        Scenario::on(token_bucket(4, 1 << 48))
            .named("token bucket: lowered capacity, ahead")
            .from(token_bucket_state(1 << 40, (1 << 51) + 50))
            .decide(1 << 51, 4, [Allowed(false), Remaining(3), Retry(50)]),
        // Bursts of 4, one unit every 100 µs: a full burst refills in 400 µs.
        Scenario::on(gcra(4, 100))
            .named("gcra: penalty of one more burst")
            .penalize(1_000, 2, [Allowed(true), Remaining(2)])
            // Capped at two bursts ahead.
            .penalize(
                1_000,
                1_000_000,
                [StateIs(tat(1_000 + 800)), Allowed(false), Reset(800)],
            )
            // Cost 1 passes once the TAT is one interval within the burst.
            .decide(1_000, 1, [Retry(500)])
            .decide(1_499, 1, [Allowed(false)])
            .decide(1_500, 1, [Allowed(true)]),
        Scenario::on(gcra(4, 100))
            .named("gcra: reward up to a full burst")
            .decide(1_000, 4, [Allowed(true)])
            .decide(1_000, 1, [Allowed(false)])
            .reward(1_000, 1, [Allowed(true), Remaining(1)])
            // Back to fresh.
            .reward(1_000, u64::MAX, [Remaining(4), Reset(0), StateIs(tat(0))]),
        Scenario::on(gcra(4, 100))
            .named("gcra: penalty then reward undone")
            .decide(1_000, 3, [])
            .decide(1_050, 0, [Exactly(Decision::allow(4, 1, 250))])
            .penalize(1_050, 3, [])
            .reward(1_050, 3, [Exactly(Decision::allow(4, 1, 250))]),
        Scenario::on(leaky_bucket(3, 100))
            .named("leaky bucket: adjustments move the slot")
            .penalize(5_000, 2, [Allowed(true), Remaining(1)])
            // Waits behind the penalty.
            .decide(5_000, 1, [Delay(200)])
            // Capped at two buckets.
            .penalize(5_000, 100, [Reset(600)])
            .reward(5_000, 6, [Remaining(3), Reset(0)]),
        Scenario::on(concurrency(5, 1_000))
            .named("concurrency: lowered max")
            .decide(10_000, 1, [Allowed(true)])
            .decide(10_100, 1, [Allowed(true)])
            .decide(10_200, 1, [Allowed(true)])
            .decide(10_300, 1, [Allowed(true)])
            // Four held (leases ending at 11_000 .. 11_300) under a max of 2.
            .reload(concurrency(2, 500))
            // Three must end before one more fits: the third ends at 11_200.
            .decide(
                10_400,
                1,
                [
                    Allowed(false),
                    Limit(2),
                    Remaining(0),
                    Retry(800),
                    Reset(900),
                ],
            )
            .decide(10_400, 0, [Allowed(false), Remaining(0)])
            .decide(11_199, 1, [Allowed(false)])
            .decide(11_200, 1, [Allowed(true), Remaining(0)]),
    ]
}

impl Expect {
    /// Whether `decision` and `state` (after the step) meet this.
    fn holds(&self, decision: &Decision, state: &State) -> bool {
        match self {
            Allowed(allowed) => decision.is_allowed() == *allowed,
            Limit(limit) => decision.limit() == *limit,
            Remaining(remaining) => decision.remaining() == *remaining,
            Reset(micros) => decision.reset_after_micros() == *micros,
            Retry(micros) => decision.retry_after_micros() == *micros,
            RetryAtMost(micros) => decision.retry_after_micros() <= *micros,
            Delay(micros) => decision.delay_micros() == *micros,
            Exactly(expected) => decision == expected,
            StateIs(expected) => state == expected,
        }
    }
}

#[test]
fn every_scenario_decides_as_written() {
    for scenario in scenarios() {
        let mut algorithm = scenario.algorithm;
        let mut state = scenario.state.unwrap_or_else(|| algorithm.new_state());
        for (i, (op, expected)) in scenario.steps.into_iter().enumerate() {
            let permit = PermitId(i as u128);
            let decision = match op {
                Decide(now, cost) => algorithm.decide(&mut state, now, cost, permit),
                Penalize(now, amount) => algorithm.penalize(&mut state, now, amount),
                Reward(now, amount) => algorithm.reward(&mut state, now, amount),
                Reload(next) => {
                    algorithm = next;
                    continue;
                }
            };
            let decision = decision.expect("the state belongs to the algorithm");
            for expect in &expected {
                assert!(
                    expect.holds(&decision, &state),
                    "{}, step {i}: expected {expect:?}, got {decision:?} and {state:?}",
                    scenario.name,
                );
            }
        }
    }
}

#[test]
fn a_scenario_that_expects_otherwise_fails() {
    // The loop above can fail: each kind of expectation tells a decision
    // apart from another.
    let state = tat(5);
    let decision = Decision::deny(4, 1, 300, 200).with_delay_us(7);
    for wrong in [
        Allowed(true),
        Limit(5),
        Remaining(2),
        Reset(301),
        Retry(199),
        RetryAtMost(199),
        Delay(8),
        Exactly(Decision::deny(4, 1, 300, 201)),
        StateIs(tat(6)),
    ] {
        assert!(!wrong.holds(&decision, &state), "{wrong:?}");
    }
}
