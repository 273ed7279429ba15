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
use crate::{Algorithm, Decision, PermitId, State};

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

fn fixed_window_state(window_start: u64, count: u64) -> State {
    State::FixedWindow(FixedWindowState {
        window_start,
        count,
    })
}

fn sliding_log_state(entries: &[(u64, u64)]) -> State {
    State::SlidingWindowLog(Box::new(SlidingWindowLogState {
        entries: entries.iter().copied().collect::<VecDeque<_>>(),
        total: entries.iter().map(|&(_, cost)| cost).sum(),
    }))
}

fn sliding_counter_state(window_start: u64, previous: u64, current: u64) -> State {
    State::SlidingWindowCounter(SlidingWindowCounterState {
        window_start,
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
        Scenario {
            name: "fixed window: a penalty denies until the window ends and is capped",
            algorithm: fixed_window(4, 1_000),
            state: None,
            steps: vec![
                (Decide(10_100, 1), vec![Allowed(true)]),
                // Capped at twice the limit; a debt peeks as denied.
                (
                    Penalize(10_200, 100),
                    vec![
                        Allowed(false),
                        StateIs(fixed_window_state(10_000, 8)),
                        Remaining(0),
                    ],
                ),
                (Decide(10_300, 1), vec![Retry(700)]),
                // The next window starts from nothing.
                (Decide(11_000, 4), vec![Allowed(true)]),
            ],
        },
        Scenario {
            name: "fixed window: a reward undoes a penalty and never exceeds the budget",
            algorithm: fixed_window(4, 1_000),
            state: None,
            steps: vec![
                (Penalize(10_000, 6), vec![]),
                (Reward(10_000, 1), vec![Allowed(false)]),
                (Reward(10_000, 2), vec![Allowed(true), Remaining(1)]),
                (
                    Reward(10_000, 50),
                    vec![
                        Remaining(4),
                        Reset(0),
                        StateIs(fixed_window_state(10_000, 0)),
                    ],
                ),
            ],
        },
        Scenario {
            name: "fixed window: a window start of another length counts until its new window ends",
            // 10 per 60 s filled the window that started at 60 s; now 10 per 45 s.
            algorithm: fixed_window(10, 60 * S),
            state: None,
            steps: vec![
                (Decide(61 * S, 10), vec![Allowed(true)]),
                (Reload(fixed_window(10, 45 * S)), vec![]),
                // It belongs to the 45 s window [45 s, 90 s): denied until
                // 90 s, and the retry time says so exactly.
                (
                    Decide(70 * S, 1),
                    vec![Allowed(false), Remaining(0), Retry(20 * S), Reset(20 * S)],
                ),
                (Decide(90 * S - 1, 1), vec![Allowed(false)]),
                (Decide(90 * S, 10), vec![Allowed(true)]),
            ],
        },
        Scenario {
            name: "sliding counter: a penalty weighs into the next window",
            algorithm: sliding_counter(4, 1_000),
            state: None,
            steps: vec![
                // Capped at twice the limit.
                (
                    Penalize(10_000, 1_000),
                    vec![StateIs(sliding_counter_state(10_000, 0, 8)), Allowed(false)],
                ),
                // Next window: previous 8 weighs 8 × (1000 - e) / 1000; cost 1
                // passes once that is at most 3, at e = 625.
                (Decide(10_000, 1), vec![Retry(1_625)]),
                (Decide(11_624, 1), vec![Allowed(false)]),
                (Decide(11_625, 1), vec![Allowed(true)]),
            ],
        },
        Scenario {
            name: "sliding counter: a reward takes from the current window, then the previous",
            algorithm: sliding_counter(4, 1_000),
            state: None,
            steps: vec![
                (Decide(10_000, 3), vec![Allowed(true)]),
                (Decide(11_000, 1), vec![Allowed(true)]),
                (
                    Reward(11_000, 2),
                    vec![StateIs(sliding_counter_state(11_000, 2, 0)), Remaining(2)],
                ),
                (Reward(11_000, 10), vec![Remaining(4), Reset(0)]),
            ],
        },
        Scenario {
            name: "sliding counter: counts above twice a lowered limit count as twice the limit",
            // 2^40 per 4 µs, then 1 per 2^50 µs: the product of the old count
            // and the new window does not fit in 64 bits.
            algorithm: sliding_counter(1, 1 << 50),
            state: Some(sliding_counter_state(1 << 50, 1 << 41, 1 << 41)),
            steps: vec![(
                Decide((1 << 50) + 1, 1),
                vec![Allowed(false), Remaining(0), RetryAtMost(2 << 50)],
            )],
        },
        Scenario {
            name: "sliding log: penalty units leave with the window",
            algorithm: sliding_log(3, 1_000),
            state: None,
            steps: vec![
                (Decide(10_000, 1), vec![Allowed(true)]),
                // Capped at twice the limit.
                (
                    Penalize(10_400, 100),
                    vec![
                        StateIs(sliding_log_state(&[(10_000, 1), (10_400, 5)])),
                        Allowed(false),
                        Remaining(0),
                    ],
                ),
                // The penalty sits at 10_400 and leaves at 11_400.
                (Decide(10_500, 1), vec![Retry(900)]),
                (Decide(11_400, 3), vec![Allowed(true)]),
            ],
        },
        Scenario {
            name: "sliding log: a reward removes the most recent units",
            algorithm: sliding_log(3, 1_000),
            state: None,
            steps: vec![
                (Decide(10_000, 1), vec![]),
                (Decide(10_200, 2), vec![]),
                (
                    Reward(10_300, 1),
                    vec![
                        StateIs(sliding_log_state(&[(10_000, 1), (10_200, 1)])),
                        Remaining(1),
                        Reset(900),
                    ],
                ),
                (
                    Reward(10_300, 5),
                    vec![StateIs(sliding_log_state(&[])), Remaining(3), Reset(0)],
                ),
            ],
        },
        Scenario {
            name: "token bucket: a penalty empties, then goes into a debt of at most a bucket",
            algorithm: token_bucket(4, 100),
            state: None,
            steps: vec![
                (Penalize(10_000, 3), vec![Allowed(true), Remaining(1)]),
                // A bucket of debt, then a bucket.
                (
                    Penalize(10_030, 100),
                    vec![
                        Allowed(false),
                        Reset(800),
                        StateIs(token_bucket_state(0, 10_430)),
                    ],
                ),
                (Decide(10_030, 1), vec![Retry(500)]),
                (Decide(10_529, 1), vec![Allowed(false)]),
                (Decide(10_530, 1), vec![Allowed(true)]),
            ],
        },
        Scenario {
            name: "token bucket: a reward pays back a debt, then refills to full at most",
            algorithm: token_bucket(4, 100),
            state: None,
            steps: vec![
                (Penalize(10_000, 6), vec![]),
                (Reward(10_000, 2), vec![Remaining(0), Reset(400)]),
                // Level 50 µs of progress + 1 token.
                (Reward(10_050, 1), vec![Remaining(1), Reset(250)]),
                // Back to fresh.
                (
                    Reward(10_050, 9),
                    vec![
                        Remaining(4),
                        Reset(0),
                        StateIs(State::TokenBucket(TokenBucketState::default())),
                    ],
                ),
            ],
        },
        Scenario {
            name: "token bucket: tokens held ahead of now pay the debt first",
            algorithm: token_bucket(4, 100),
            // Three tokens as of 50 µs from now (a clock that stepped back):
            // two tokens and 50 µs of progress now.
            state: Some(token_bucket_state(3, 10_050)),
            steps: vec![
                (Decide(10_000, 3), vec![Allowed(false), Retry(50)]),
                (Decide(10_000, 2), vec![Allowed(true)]),
            ],
        },
        Scenario {
            name: "token bucket: a penalty keeps the progress toward the next token",
            algorithm: token_bucket(4, 100),
            state: None,
            steps: vec![
                (Decide(10_000, 4), vec![Allowed(true)]),
                // 2 tokens and 50 µs of progress at 10_250; take 1.
                (Penalize(10_250, 1), vec![Remaining(1), Reset(250)]),
            ],
        },
        Scenario {
            name: "token bucket: tokens above a lowered capacity are a full bucket",
            algorithm: token_bucket(4, 100),
            // Written by a bucket of 100.
            state: Some(token_bucket_state(100, 9_000)),
            steps: vec![(
                Decide(10_000, 1),
                vec![Allowed(true), Remaining(3), Reset(100)],
            )],
        },
        Scenario {
            name: "token bucket: tokens above a lowered capacity, refilled ahead of now",
            // The same, with its refill time ahead of now (a clock that
            // stepped back) and a new interval that 2^40 tokens times would
            // overflow.
            algorithm: token_bucket(4, 1 << 48),
            state: Some(token_bucket_state(1 << 40, (1 << 51) + 50)),
            steps: vec![(
                Decide(1 << 51, 4),
                vec![Allowed(false), Remaining(3), Retry(50)],
            )],
        },
        Scenario {
            name: "gcra: a penalty goes into a debt capped at one more burst",
            // Bursts of 4, one unit every 100 µs: a full burst refills in 400 µs.
            algorithm: gcra(4, 100),
            state: None,
            steps: vec![
                (Penalize(1_000, 2), vec![Allowed(true), Remaining(2)]),
                // Capped at two bursts ahead.
                (
                    Penalize(1_000, 1_000_000),
                    vec![StateIs(tat(1_000 + 800)), Allowed(false), Reset(800)],
                ),
                // Cost 1 passes once the TAT is one interval within the burst.
                (Decide(1_000, 1), vec![Retry(500)]),
                (Decide(1_499, 1), vec![Allowed(false)]),
                (Decide(1_500, 1), vec![Allowed(true)]),
            ],
        },
        Scenario {
            name: "gcra: a reward gives back, never beyond a full burst",
            algorithm: gcra(4, 100),
            state: None,
            steps: vec![
                (Decide(1_000, 4), vec![Allowed(true)]),
                (Decide(1_000, 1), vec![Allowed(false)]),
                (Reward(1_000, 1), vec![Allowed(true), Remaining(1)]),
                // Back to fresh.
                (
                    Reward(1_000, u64::MAX),
                    vec![Remaining(4), Reset(0), StateIs(tat(0))],
                ),
            ],
        },
        Scenario {
            name: "gcra: a penalty then a reward of the same amount is undone",
            algorithm: gcra(4, 100),
            state: None,
            steps: vec![
                (Decide(1_000, 3), vec![]),
                (Decide(1_050, 0), vec![Exactly(Decision::allow(4, 1, 250))]),
                (Penalize(1_050, 3), vec![]),
                (Reward(1_050, 3), vec![Exactly(Decision::allow(4, 1, 250))]),
            ],
        },
        Scenario {
            name: "leaky bucket: a penalty and a reward move the next slot",
            algorithm: leaky_bucket(3, 100),
            state: None,
            steps: vec![
                (Penalize(5_000, 2), vec![Allowed(true), Remaining(1)]),
                // Waits behind the penalty.
                (Decide(5_000, 1), vec![Delay(200)]),
                // Capped at two buckets.
                (Penalize(5_000, 100), vec![Reset(600)]),
                (Reward(5_000, 6), vec![Remaining(3), Reset(0)]),
            ],
        },
        Scenario {
            name: "concurrency: a lowered max denies with nothing remaining until enough leases end",
            algorithm: concurrency(5, 1_000),
            state: None,
            steps: vec![
                (Decide(10_000, 1), vec![Allowed(true)]),
                (Decide(10_100, 1), vec![Allowed(true)]),
                (Decide(10_200, 1), vec![Allowed(true)]),
                (Decide(10_300, 1), vec![Allowed(true)]),
                // Four held (leases ending at 11_000 .. 11_300) under a max of 2.
                (Reload(concurrency(2, 500)), vec![]),
                // Three must end before one more fits: the third ends at 11_200.
                (
                    Decide(10_400, 1),
                    vec![
                        Allowed(false),
                        Limit(2),
                        Remaining(0),
                        Retry(800),
                        Reset(900),
                    ],
                ),
                (Decide(10_400, 0), vec![Allowed(false), Remaining(0)]),
                (Decide(11_199, 1), vec![Allowed(false)]),
                (Decide(11_200, 1), vec![Allowed(true), Remaining(0)]),
            ],
        },
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
