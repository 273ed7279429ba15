//! Fixed tables, one per algorithm, run against a [`MemoryStore`] on a manual
//! clock.
//!
//! Every expected value was worked out by hand from the algorithm's definition
//! (the arithmetic is in the comments), never copied from a run. Each table
//! covers a peek (cost 0), a cost above the limit (an error), a denial (which
//! consumes nothing), the exact retry time, and recovery once time passes.
//!
//! Step times are offsets in µs from the table's `t0`; the clock never goes
//! back. `t0` is deliberately not a multiple of any window.

use std::time::Duration;

use ratelimit_core::clock::{Clock, ManualClock};
use ratelimit_core::{Algorithm, Decision, MemoryStore, Policy, Rate, Store, StoreError};
use ratelimit_tests::every_algorithm;

const KEY: &[u8] = b"client-1";

/// A start time that is not aligned on any window used below.
const T0: u64 = 1_234_567;

/// What one step does.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// `store.check` with this cost.
    Check(u64),
    /// `store.release` of the permit taken at step `n` (0-based) of the table.
    Release(usize),
}

/// What one step must answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Decision {
        allowed: bool,
        remaining: u64,
        reset_us: u64,
        retry_us: Option<u64>,
        delay_us: u64,
    },
    CostExceedsLimit,
    /// A release returns nothing to check.
    Released,
}

#[derive(Debug, Clone, Copy)]
struct Step {
    at: u64,
    op: Op,
    expect: Expect,
}

/// A check of `cost` at `t0 + at`.
fn check(at: u64, cost: u64, expect: Expect) -> Step {
    Step {
        at,
        op: Op::Check(cost),
        expect,
    }
}

/// A release, at `t0 + at`, of the permit taken at step `step`.
fn release(at: u64, step: usize) -> Step {
    Step {
        at,
        op: Op::Release(step),
        expect: Expect::Released,
    }
}

fn allow(remaining: u64, reset_us: u64) -> Expect {
    Expect::Decision {
        allowed: true,
        remaining,
        reset_us,
        retry_us: None,
        delay_us: 0,
    }
}

fn deny(remaining: u64, reset_us: u64, retry_us: u64) -> Expect {
    Expect::Decision {
        allowed: false,
        remaining,
        reset_us,
        retry_us: Some(retry_us),
        delay_us: 0,
    }
}

fn too_costly() -> Expect {
    Expect::CostExceedsLimit
}

impl Expect {
    /// The same allowed decision, with a leaky-bucket delay.
    fn delay(self, delay: u64) -> Expect {
        match self {
            Expect::Decision {
                allowed: true,
                remaining,
                reset_us,
                retry_us,
                ..
            } => Expect::Decision {
                allowed: true,
                remaining,
                reset_us,
                retry_us,
                delay_us: delay,
            },
            other => panic!("a delay only goes with an allowed decision, not {other:?}"),
        }
    }
}

/// Runs `steps` against a fresh store whose clock starts at `t0`, checking
/// every answer. Returns the decision of each check step (`None` for errors
/// and releases).
fn run(policy: &Policy, t0: u64, steps: &[Step]) -> Vec<Option<Decision>> {
    let clock = ManualClock::new(t0);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let concurrency = matches!(policy.algorithm(), Algorithm::Concurrency(_));
    let mut decisions: Vec<Option<Decision>> = Vec::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        let now = t0 + step.at;
        assert!(
            now >= clock.now(),
            "{}: step {i} goes back in time",
            policy.name()
        );
        clock.set(now);
        let what = format!(
            "{} step {i} at t0+{} ({:?})",
            policy.name(),
            step.at,
            step.op
        );
        match step.op {
            Op::Check(cost) => {
                let result = store.check(KEY, policy, cost).into_inner();
                match (step.expect, result) {
                    (
                        Expect::Decision {
                            allowed,
                            remaining,
                            reset_us,
                            retry_us,
                            delay_us,
                        },
                        Ok(d),
                    ) => {
                        assert_eq!(d.is_allowed(), allowed, "{what}: allowed; got {d:?}");
                        assert_eq!(d.limit(), policy.limit(), "{what}: limit");
                        assert_eq!(d.remaining(), remaining, "{what}: remaining; got {d:?}");
                        assert_eq!(
                            d.reset_after(),
                            Duration::from_micros(reset_us),
                            "{what}: reset_after; got {d:?}"
                        );
                        assert_eq!(
                            d.retry_after(),
                            retry_us.map(Duration::from_micros),
                            "{what}: retry_after; got {d:?}"
                        );
                        assert_eq!(
                            d.delay(),
                            Duration::from_micros(delay_us),
                            "{what}: delay; got {d:?}"
                        );
                        assert_eq!(
                            d.permit().is_some(),
                            concurrency && allowed && cost > 0,
                            "{what}: only an allowed concurrency acquisition takes a permit"
                        );
                        decisions.push(Some(d));
                    }
                    (Expect::CostExceedsLimit, Err(e)) => {
                        match e {
                            StoreError::CostExceedsLimit {
                                policy: name,
                                cost: c,
                                max,
                            } => {
                                assert_eq!(name, policy.name(), "{what}");
                                assert_eq!(c, cost, "{what}");
                                assert_eq!(max, policy.max_cost(), "{what}");
                                assert_eq!(max, policy.limit(), "{what}");
                            }
                            other => panic!("{what}: expected CostExceedsLimit, got {other:?}"),
                        }
                        decisions.push(None);
                    }
                    (expect, got) => panic!("{what}: expected {expect:?}, got {got:?}"),
                }
            }
            Op::Release(j) => {
                let permit = decisions[j]
                    .as_ref()
                    .and_then(Decision::permit)
                    .unwrap_or_else(|| panic!("{what}: step {j} took no permit"));
                store
                    .release(KEY, policy, permit)
                    .into_inner()
                    .unwrap_or_else(|e| panic!("{what}: release failed: {e}"));
                decisions.push(None);
            }
        }
    }
    decisions
}

#[test]
fn fixed_window() {
    // 3 per 1 s window, windows aligned on the clock's origin: t0 = 1_234_567
    // falls in [1_000_000, 2_000_000), which ends 765_433 µs after t0.
    let policy = Policy::fixed_window(3, Duration::from_secs(1)).expect("valid policy");
    let steps = [
        // Fresh key: a peek sees the full limit and nothing to reset.
        check(0, 0, allow(3, 0)),
        // count 1; reset = window end - now = 2_000_000 - 1_234_567.
        check(0, 1, allow(2, 765_433)),
        check(0, 4, too_costly()),
        // t = 1_334_567: count 2, window end 665_433 away.
        check(100_000, 1, allow(1, 665_433)),
        // 2 + 2 > 3: denied until the window ends; nothing consumed...
        check(100_000, 2, deny(1, 665_433, 665_433)),
        // ...as a peek and a cost-1 request show.
        check(100_000, 0, allow(1, 665_433)),
        check(100_000, 1, allow(0, 665_433)),
        // t = 1_999_999: one µs before the boundary.
        check(765_432, 1, deny(0, 1, 1)),
        // t = 2_000_000: a new window, the whole limit again (3 + 3 within 1 µs:
        // the documented 2x across a boundary).
        check(765_433, 3, allow(0, 1_000_000)),
        check(765_433, 1, deny(0, 1_000_000, 1_000_000)),
        // t = 3_500_000: the count from window [2 s, 3 s) is stale.
        check(2_265_433, 0, allow(3, 0)),
        // Window [3 s, 4 s) ends 500_000 µs later.
        check(2_265_433, 1, allow(2, 500_000)),
    ];
    run(&policy, T0, &steps);
}

#[test]
fn fixed_window_aligned_start() {
    // The same policy started exactly on a boundary: the first window is whole.
    let policy = Policy::fixed_window(2, Duration::from_millis(10)).expect("valid policy");
    let steps = [
        check(0, 2, allow(0, 10_000)),
        check(9_999, 1, deny(0, 1, 1)),
        check(10_000, 1, allow(1, 10_000)),
    ];
    run(&policy, 50_000, &steps);
    // And from 0, the clock's origin.
    run(&policy, 0, &steps);
}

#[test]
fn sliding_window_log() {
    // 3 in any 1 s: an entry admitted at t counts during [t, t + 1_000_000).
    // Offsets below are from t0 = 1_234_567 (alignment plays no part).
    let policy = Policy::sliding_window_log(3, Duration::from_secs(1)).expect("valid policy");
    let steps = [
        check(0, 0, allow(3, 0)),
        // log [(0,1)]; reset = 0 + 1 s - 0.
        check(0, 1, allow(2, 1_000_000)),
        check(0, 4, too_costly()),
        // log [(0,1), (200k,1)]; reset from the newest entry = 200k + 1 s - 200k.
        check(200_000, 1, allow(1, 1_000_000)),
        // total 2 + 2 > 3: one unit must leave; the oldest, (0,1), leaves at
        // 1_000_000, so retry = 1_000_000 - 300_000. reset = 1_200_000 - 300_000.
        check(300_000, 2, deny(1, 900_000, 700_000)),
        // log [(0,1), (200k,1), (300k,1)].
        check(300_000, 1, allow(0, 1_000_000)),
        // (0,1) still counts at 999_999 (it leaves at 1_000_000).
        // reset = 1_300_000 - 999_999.
        check(999_999, 1, deny(0, 300_001, 1)),
        // (0,1) has left: total 2; cost 2 needs one more unit gone, (200k,1) at
        // 1_200_000: retry 200_000; reset = 1_300_000 - 1_000_000.
        check(1_000_000, 2, deny(1, 300_000, 200_000)),
        // log [(200k,1), (300k,1), (1M,1)].
        check(1_000_000, 1, allow(0, 1_000_000)),
        // (200k,1) left at 1_200_000; reset = 2_000_000 - 1_200_000.
        check(1_200_000, 0, allow(1, 800_000)),
        // total 2, cost 3: both entries must leave, the later at 2_000_000.
        check(1_250_000, 3, deny(1, 750_000, 750_000)),
        // Both gone at 2_000_000 exactly.
        check(2_000_000, 3, allow(0, 1_000_000)),
        check(2_000_000, 0, allow(0, 1_000_000)),
        // The 3 units of one microsecond share one entry, leaving together at
        // 3_000_000.
        check(2_500_000, 1, deny(0, 500_000, 500_000)),
    ];
    run(&policy, T0, &steps);
}

#[test]
fn sliding_window_counter() {
    // 10 per 1 s, windows aligned on the origin. With w = 1_000_000 µs, a
    // request of cost c at e µs into a window passes when
    //   previous * (w - e) + (current + c) * w <= 10 * w,
    // remaining = floor((10w - previous (w - e) - current w) / w), and reset is
    // the end of the window after next if current > 0, of this window if only
    // previous > 0. Steps give absolute times (t0 = 1_234_567); offsets are
    // absolute - t0.
    let policy = Policy::sliding_window_counter(10, Duration::from_secs(1)).expect("valid policy");
    let steps = [
        // 1_234_567, window [1 s, 2 s).
        check(0, 0, allow(10, 0)),
        // current 4: remaining 6; reset = 3_000_000 - 1_234_567.
        check(0, 4, allow(6, 1_765_433)),
        check(0, 11, too_costly()),
        // 1_500_000: current 10; reset = 3_000_000 - 1_500_000.
        check(265_433, 6, allow(0, 1_500_000)),
        // current + 1 > 10: only the next window can take it, where previous =
        // 10: 10 (w - e) + 1 w <= 10 w  <=>  e >= 100_000, i.e. 2_100_000:
        // retry = 2_100_000 - 1_500_000.
        check(265_433, 1, deny(0, 1_500_000, 600_000)),
        // 2_000_000: previous 10 weighs 10 w: nothing left; only previous
        // counts, reset at 3_000_000.
        check(765_433, 0, allow(0, 1_000_000)),
        // 2_250_000: 10 * 750_000 + 2 w = 9.5 w <= 10 w; remaining floor(0.5).
        // reset = 4_000_000 - 2_250_000.
        check(1_015_433, 2, allow(0, 1_750_000)),
        // 10 (w - e) + 3 w <= 10 w  <=>  e >= 300_000: retry 50_000.
        check(1_015_433, 1, deny(0, 1_750_000, 50_000)),
        // 2_300_000: exactly at the retry time; 10 * 700_000 + 3 w = 10 w.
        check(1_065_433, 1, allow(0, 1_700_000)),
        // 2_600_000: 10 * 400_000 + 3 w = 7 w: remaining 3.
        check(1_365_433, 0, allow(3, 1_400_000)),
        // 4 w + 8 w > 10 w; passes once 10 (w - e) <= 2 w, e >= 800_000.
        check(1_365_433, 5, deny(3, 1_400_000, 200_000)),
        // 3_600_000: previous 3 (window [2 s, 3 s)), e = 600_000:
        // 3 * 400_000 = 1.2 w: remaining floor(8.8) = 8; reset at 4_000_000.
        check(2_365_433, 0, allow(8, 400_000)),
        // 3 (w - e) + 9 w <= 10 w  <=>  w - e <= 333_333 (floor of w / 3)
        // <=>  e >= 666_667: retry = 666_667 - 600_000.
        check(2_365_433, 9, deny(8, 400_000, 66_667)),
        // 3_666_667: 3 * 333_333 + 9 w = 9_999_999 <= 10 w; remaining 0;
        // reset = 5_000_000 - 3_666_667.
        check(2_432_100, 9, allow(0, 1_333_333)),
        // 5_000_000: the last count was in [3 s, 4 s), two windows ago.
        check(3_765_433, 0, allow(10, 0)),
        check(3_765_433, 1, allow(9, 2_000_000)),
        // current + 10 > 10, and in the next window previous = 1 weighs until
        // its very end: passes at 7_000_000.
        check(3_765_433, 10, deny(9, 2_000_000, 2_000_000)),
    ];
    run(&policy, T0, &steps);
}

#[test]
fn token_bucket() {
    // Capacity 4, 3 per second: one token every ceil(1_000_000 / 3) = 333_334
    // µs, so a full refill takes 4 * 333_334 = 1_333_336 µs. Times are offsets
    // from t0 = 1_234_567; the bucket's fractional progress toward the next
    // token is now - (time of the last whole token).
    let policy = Policy::token_bucket(4, Rate::per_second(3)).expect("valid policy");
    let steps = [
        // A fresh bucket is full.
        check(0, 0, allow(4, 0)),
        check(0, 5, too_costly()),
        // 1 token left; reset = 3 * 333_334.
        check(0, 3, allow(1, 1_000_002)),
        // progress 100_000: the 2nd token comes in 333_334 - 100_000; the
        // bucket is full in 1_000_002 - 100_000.
        check(100_000, 2, deny(1, 900_002, 233_334)),
        // One µs before the token.
        check(333_333, 2, deny(1, 666_669, 1)),
        // The token: 2, both taken; 0 left, last refill now, reset 4 intervals.
        check(333_334, 2, allow(0, 1_333_336)),
        // progress 166_666.
        check(500_000, 0, allow(0, 1_166_670)),
        check(500_000, 1, deny(0, 1_166_670, 166_668)),
        // 333_334 + 2 * 333_334 = 1_000_002: two tokens, progress 0.
        check(1_000_002, 0, allow(2, 666_668)),
        // progress 199_998; 4 tokens need 2 more intervals minus the progress,
        // which is also when the bucket is full.
        check(1_200_000, 4, deny(2, 466_670, 466_670)),
        // 1_000_002 + 666_668: full again; take all 4.
        check(1_666_670, 4, allow(0, 1_333_336)),
        // Much later: full, the surplus is not kept.
        check(10_000_000, 0, allow(4, 0)),
        check(10_000_000, 4, allow(0, 1_333_336)),
    ];
    run(&policy, T0, &steps);
}

#[test]
fn gcra() {
    // Burst 3, 10 per second: interval T = 100_000 µs, tolerance 3T = 300_000.
    // A request of cost c at `now` passes when max(TAT, now) + cT - now <= 3T,
    // and sets TAT = max(TAT, now) + cT. reset = TAT - now, remaining =
    // floor((3T - reset) / T), retry = max(TAT, now) + cT - now - 3T.
    // Offsets from t0 = 1_234_567; TAT below is relative to t0 too.
    let policy = Policy::gcra(3, Rate::per_second(10)).expect("valid policy");
    let steps = [
        check(0, 0, allow(3, 0)),
        check(0, 4, too_costly()),
        // TAT 200_000.
        check(0, 2, allow(1, 200_000)),
        // 200k + 200k - 50k = 350k > 300k: retry 50_000; reset 150_000,
        // remaining floor(1.5).
        check(50_000, 2, deny(1, 150_000, 50_000)),
        // 300k - 50k = 250k <= 300k: TAT 300_000.
        check(50_000, 1, allow(0, 250_000)),
        check(50_000, 1, deny(0, 250_000, 50_000)),
        // 400k - 99_999 = 300_001: one µs too early.
        check(99_999, 1, deny(0, 200_001, 1)),
        // TAT 400_000.
        check(100_000, 1, allow(0, 300_000)),
        check(250_000, 0, allow(1, 150_000)),
        // 400k + 300k - 250k = 450k: retry 150_000.
        check(250_000, 3, deny(1, 150_000, 150_000)),
        // 700k - 400k = 300k: the whole burst again; TAT 700_000.
        check(400_000, 3, allow(0, 300_000)),
        // TAT long past: as fresh.
        check(2_000_000, 0, allow(3, 0)),
    ];
    run(&policy, T0, &steps);
}

#[test]
fn leaky_bucket() {
    // Capacity 3, 10 per second: slots of T = 100_000 µs. Admission is GCRA's
    // (the next free slot plus cT at most 3T ahead); an admitted request's slot
    // starts at max(next free slot, now), and delay = slot start - now.
    // Offsets from t0 = 1_234_567; slots below are relative to t0 too.
    let policy = Policy::leaky_bucket(3, Rate::per_second(10)).expect("valid policy");
    let steps = [
        check(0, 0, allow(3, 0)),
        // Three requests at once get slots 0, 100k, 200k.
        check(0, 1, allow(2, 100_000)),
        check(0, 1, allow(1, 200_000).delay(100_000)),
        check(0, 1, allow(0, 300_000).delay(200_000)),
        // A fourth would need slot 300k, ending 400k > 3T ahead.
        check(0, 1, deny(0, 300_000, 100_000)),
        check(0, 4, too_costly()),
        // A peek reports the wait until the next free slot (300k - 30k), and
        // takes no slot.
        check(30_000, 0, allow(0, 270_000).delay(270_000)),
        // Slot 300k: waits 200_000.
        check(100_000, 1, allow(0, 300_000).delay(200_000)),
        // Slots 400k and 500k (cost 2): waits 50_000; next free 600k.
        check(350_000, 2, allow(0, 250_000).delay(50_000)),
        // The bucket drained: served at once.
        check(1_000_000, 2, allow(1, 200_000)),
    ];
    let decisions = run(&policy, T0, &steps);

    // Admitted requests start one interval per unit apart: each start is at
    // least the previous start plus the previous cost times T.
    let starts: Vec<(u64, u64)> = steps
        .iter()
        .zip(&decisions)
        .filter_map(|(step, d)| match (step.op, d) {
            (Op::Check(cost), Some(d)) if d.is_allowed() && cost > 0 => {
                Some((step.at + d.delay_micros(), cost))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        starts,
        [
            (0, 1),
            (100_000, 1),
            (200_000, 1),
            (300_000, 1),
            (400_000, 2),
            (1_000_000, 2)
        ]
    );
    for pair in starts.windows(2) {
        let ((previous, cost), (next, _)) = (pair[0], pair[1]);
        assert!(next >= previous + cost * 100_000, "slots overlap: {pair:?}");
    }
}

#[test]
fn concurrency() {
    // At most 3 units in flight, leases of 10 s. A lease taken at t counts
    // while now < t + 10_000_000. reset = the last lease's expiry - now; retry =
    // the expiry of the lease that frees enough units, oldest expiry first.
    // Offsets from t0 = 1_234_567.
    let policy = Policy::concurrency(3, Duration::from_secs(10)).expect("valid policy");
    // Releases name the step whose permit they return (steps count from 0).
    let steps = [
        check(0, 0, allow(3, 0)),
        check(0, 4, too_costly()),
        // Step 2, permit A: 2 units, expires at 10_000_000.
        check(0, 2, allow(1, 10_000_000)),
        // Step 3, permit B: 1 unit, expires at 11_000_000.
        check(1_000_000, 1, allow(0, 10_000_000)),
        // Full. One unit is needed: A's expiry frees 2 at 10_000_000.
        check(2_000_000, 1, deny(0, 9_000_000, 8_000_000)),
        // Three units: A then B, at 11_000_000.
        check(2_000_000, 3, deny(0, 9_000_000, 9_000_000)),
        // B is released early: A alone holds 2, until 10_000_000.
        release(3_000_000, 3),
        check(3_000_000, 0, allow(1, 7_000_000)),
        // Step 8, permit C: 1 unit, expires at 13_000_000.
        check(3_000_000, 1, allow(0, 10_000_000)),
        // A (never released: its holder died) still counts one µs before its
        // expiry.
        check(9_999_999, 1, deny(0, 3_000_001, 1)),
        // Step 10: A has expired: 1 held (C) + 2. Permit D expires at
        // 20_000_000.
        check(10_000_000, 2, allow(0, 10_000_000)),
        // Releasing the expired A changes nothing.
        release(10_000_000, 2),
        check(10_000_000, 0, allow(0, 10_000_000)),
        // C is released: D alone holds 2, until 20_000_000.
        release(10_000_000, 8),
        check(10_000_000, 0, allow(1, 10_000_000)),
        release(10_000_000, 10),
        check(10_000_000, 0, allow(3, 0)),
        // Releasing twice is harmless.
        release(10_000_000, 10),
        check(10_000_000, 3, allow(0, 10_000_000)),
    ];
    let decisions = run(&policy, T0, &steps);
    let mut permits: Vec<_> = decisions
        .iter()
        .flatten()
        .filter_map(Decision::permit)
        .collect();
    assert_eq!(permits.len(), 5, "permits A, B, C, D and the last one");
    permits.sort_unstable();
    permits.dedup();
    assert_eq!(permits.len(), 5, "every permit is distinct");
}

#[test]
fn concurrency_lease_expiry_recovers_leaked_permits() {
    // Holders that die never release; their leases (500 ms) run out.
    let policy = Policy::concurrency(2, Duration::from_millis(500)).expect("valid policy");
    let steps = [
        check(0, 1, allow(1, 500_000)),
        check(100_000, 1, allow(0, 500_000)),
        // The first lease ends at 500_000: retry 500_000 - 250_000.
        check(250_000, 1, deny(0, 350_000, 250_000)),
        // Both units: the second lease ends at 600_000.
        check(250_000, 2, deny(0, 350_000, 350_000)),
        check(499_999, 1, deny(0, 100_001, 1)),
        check(500_000, 1, allow(0, 500_000)),
        // The second lease ended at 600_000; the third runs until 1_000_000.
        check(600_000, 0, allow(1, 400_000)),
        check(1_000_000, 0, allow(2, 0)),
    ];
    run(&policy, T0, &steps);
}

#[test]
fn every_policy_rejects_a_cost_above_its_limit() {
    for policy in every_algorithm(5, Duration::from_secs(1), Rate::per_second(1)) {
        assert_eq!(policy.max_cost(), 5);
        let steps = [
            check(0, 6, too_costly()),
            check(0, u64::MAX, too_costly()),
            // Nothing was consumed by the errors.
            check(0, 0, allow(5, 0)),
        ];
        run(&policy, T0, &steps);
        let steps = [check(0, 5, allow_all_taken(&policy))];
        run(&policy, T0, &steps);
    }
}

/// The decision for a first request that takes the whole limit (5 per second
/// or per 5 s of refill): nothing remains, and the reset is the window end or
/// the full refill.
fn allow_all_taken(policy: &Policy) -> Expect {
    match policy.algorithm() {
        // The window [1 s, 2 s) ends 765_433 µs after t0.
        Algorithm::FixedWindow(_) => allow(0, 765_433),
        // The current count becomes the previous one next window: [1 s, 3 s).
        Algorithm::SlidingWindowCounter(_) => allow(0, 1_765_433),
        // 5 units at 1 per second take 5 s to drain.
        Algorithm::TokenBucket(_) | Algorithm::Gcra(_) | Algorithm::LeakyBucket(_) => {
            allow(0, 5_000_000)
        }
        // The log entry and the lease last one window.
        _ => allow(0, 1_000_000),
    }
}
