//! The bound on a manual clock: a model of the whole protocol, deciding
//! with [`counts`](super::counts) (the functions the store's script is
//! checked against on every decision), and the bound checked in every
//! window.
//!
//! Regions each have a Redis (fields of each key's hash, the outbox with
//! its sequence numbers and one cursor per peer, what was heard of each
//! peer) and a clock off the reference by up to a skew. Each region runs
//! several instances; every `sync` each instance runs a round to each peer
//! as `round.rs` does: a ticket of the peer's clock first if it has none,
//! then one read of the outbox after the shared cursor, landing one lag
//! later (merged by the receiver's clock, marked with the ticket), and the
//! answer one lag after that (the next ticket, the cursor moved). A round
//! of an instance cut off from the peer fails. Requests go to a region
//! (decisions are the region's Redis's; instances only push), on many keys,
//! and the policy may change under its name at a reload.

mod bound;
mod model;

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;

use super::counts;
use crate::Policy;
use bound::{check_bound, check_each_region, check_reload, total_and_lagging};
use model::{Admitted, BASE, Cut, Simulation, WINDOW};

fn policy(sliding: bool, limit: u64, window: u64) -> Policy {
    let window = Duration::from_micros(window);
    let policy = if sliding {
        Policy::sliding_window_counter(limit, window)
    } else {
        Policy::fixed_window(limit, window)
    };
    policy.and_then(|p| p.with_name("sim")).expect("valid")
}

/// Requests (reference time, region, key, cost) over three windows, sorted.
fn requests(
    regions: usize,
    keys: u16,
    most: usize,
) -> impl Strategy<Value = Vec<(u64, usize, u16, u64)>> {
    prop::collection::vec(
        (BASE..BASE + 3 * WINDOW, 0..regions, 0..keys, 1..=3u64),
        1..most,
    )
    .prop_map(|mut r| {
        r.sort_by_key(|&(at, _, _, _)| at);
        r
    })
}

/// The lag `D` of a model whose every region keeps an instance in touch
/// with every peer: the next round reads within `sync + 2 x lag` of any
/// admission (it starts at the first tick after the previous round's
/// answer, a round trip after it started), and lands one lag later; at
/// the start, one more `sync` while an instance asks its first ticket.
fn lag_d(sync: u64, lags: &[u64]) -> u64 {
    let lag = lags.iter().max().copied().unwrap_or(0);
    2 * sync + 3 * lag
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Many keys, two or three instances per region, some of them cut off
    /// from a peer for a while (never every instance of a region at once),
    /// clocks skewed within the allowed skew, and a reload of the policy:
    /// in every window (less the skew at each end), admitted <= limit +
    /// what the other regions admitted during `D` before the last
    /// admission; and a reload to a shorter window keeps the old window's
    /// count.
    #[test]
    fn admitted_stays_within_the_bound(
        sliding in any::<bool>(),
        limit in 3..30u64,
        regions in 2..5usize,
        instances in 2..4usize,
        sync in 5_000..100_000u64,
        lags in prop::collection::vec(0..60_000u64, 1..5),
        offsets in prop_oneof![
            Just(vec![0i64; 4]),
            prop::collection::vec(-50_000..50_000i64, 4),
        ],
        cuts in prop::collection::vec((0..4usize, 0..4usize, BASE..BASE + 3 * WINDOW, 0..WINDOW), 0..6),
        reload in prop::option::of((BASE..BASE + 3 * WINDOW, 2..30u64, prop::sample::select(vec![WINDOW / 4, WINDOW / 2, WINDOW, 2 * WINDOW]))),
        staleness in 1..12u64,
        reqs in requests(4, 6, 400),
    ) {
        let d = lag_d(sync, &lags);
        // From a quarter of `D` (peers often stale) to three times it.
        let staleness = staleness * d / 4;
        let sim = Simulation {
            reload: reload.map(|(at, l, w)| (at, policy(sliding, l, w))),
            staleness,
            offsets: offsets[..regions].to_vec(),
            // Instance 0 of a region is never cut: one always reaches a peer.
            cuts: cuts
                .into_iter()
                .map(|(r, p, from, long)| Cut {
                    region: r % regions,
                    instance: 1 + (r + p) % (instances - 1),
                    peer: p % regions,
                    during: from..from + long,
                })
                .collect(),
            ..Simulation::new(policy(sliding, limit, WINDOW), regions, instances, sync, lags)
        };
        let reqs: Vec<_> = reqs.into_iter().map(|(at, r, k, c)| (at, r % regions, k, c)).collect();
        let (admitted, _) = sim.run(&reqs);
        // Every region's windows start within `skew` of the reference's.
        let skew = sim.offsets.iter().map(|o| o.unsigned_abs()).max().unwrap_or(0);
        prop_assert_eq!(check_bound(&sim, &admitted, d, skew), Ok(()));
        prop_assert_eq!(check_each_region(&sim, &admitted, d), Ok(()));
        prop_assert_eq!(check_reload(&sim, &admitted, d), Ok(()));
    }

    /// A region cut off from the others from the start (every instance,
    /// both ways), each side counting the other's regions at their
    /// conservative share once stale: each side admits at most `limit`
    /// less the other side's shares (plus its own lag term and what it
    /// admitted before the staleness passed).
    #[test]
    fn each_side_of_a_partition_stays_within_its_share(
        sliding in any::<bool>(),
        limit in 3..40u64,
        sync in 5_000..50_000u64,
        lags in prop::collection::vec(0..30_000u64, 1..4),
        isolated in 0..3usize,
        reqs in requests(3, 3, 300),
    ) {
        let d = lag_d(sync, &lags);
        let staleness = 3 * d;
        let cuts = (0..3usize)
            .flat_map(|r| (0..3usize).map(move |p| (r, p)))
            .filter(|&(r, p)| r != p && (r == isolated || p == isolated))
            .flat_map(|(r, p)| (0..2).map(move |i| Cut { region: r, instance: i, peer: p, during: 0..u64::MAX }))
            .collect();
        let sim = Simulation {
            staleness,
            cuts,
            ..Simulation::new(policy(sliding, limit, WINDOW), 3, 2, sync, lags)
        };
        let share = counts::conservative_share(limit, 3);
        let (admitted, _) = sim.run(&reqs);
        // Never heard: every peer counts at its share from the start, on
        // both sides.
        for (side, others) in [(true, 2u64), (false, 1u64)] {
            let mut per_window: BTreeMap<(u16, u64), Vec<Admitted>> = BTreeMap::new();
            for a in admitted.iter().filter(|a| (a.region == isolated) == side) {
                per_window.entry((a.key, a.at - a.at % WINDOW)).or_default().push(*a);
            }
            for ((key, start), list) in per_window {
                let (total, lagging) = total_and_lagging(&list, d);
                prop_assert!(
                    total <= limit.saturating_sub(others * share) + lagging,
                    "side {side}, key {key}, window {start}: {total} > {limit} - {others} x {share} + {lagging}"
                );
            }
        }
    }
}

/// The bound is reached: every region bursts at once, before any push
/// lands, and each admits the whole limit (`limit + (regions - 1) x limit`,
/// all of it within one `D`).
#[test]
fn the_worst_case_reaches_the_bound() {
    let limit = 10;
    let sim = Simulation {
        staleness: 10 * WINDOW,
        ..Simulation::new(policy(false, limit, WINDOW), 3, 1, 100_000, vec![50_000])
    };
    // Fresh first: one window of quiet, then the burst.
    let at = BASE + WINDOW + 1_000;
    let mut reqs: Vec<(u64, usize, u16, u64)> = (0..3)
        .flat_map(|r| (0..limit + 5).map(move |i| (at + i, r, 0, 1)))
        .collect();
    reqs.sort_by_key(|&(at, _, _, _)| at);
    let (admitted, _) = sim.run(&reqs);
    let total: u64 = admitted.iter().map(|a| a.cost).sum();
    assert_eq!(total, 3 * limit);
    assert_eq!(
        check_bound(&sim, &admitted, lag_d(100_000, &[50_000]), 0),
        Ok(())
    );
}

/// Requests further apart than `D` admit the limit exactly, however they
/// are spread over the regions (here 80/10/10), with two instances per
/// region, one of each cut off from every peer.
#[test]
fn spaced_requests_admit_the_limit_exactly() {
    for sliding in [false, true] {
        let limit = 20;
        let sim = Simulation {
            offsets: vec![0, 20_000, -20_000],
            cuts: (0..3)
                .flat_map(|r| (0..3).map(move |p| (r, p)))
                .map(|(region, peer)| Cut {
                    region,
                    instance: 1,
                    peer,
                    during: 0..u64::MAX,
                })
                .collect(),
            ..Simulation::new(
                policy(sliding, limit, WINDOW),
                3,
                2,
                5_000,
                vec![1_000, 3_000],
            )
        };
        // 60 requests 14 ms apart, in the middle of one window of every clock.
        let reqs: Vec<(u64, usize, u16, u64)> = (0..60u64)
            .map(|i| {
                let region = match i % 10 {
                    0 => 1,
                    1 => 2,
                    _ => 0,
                };
                (BASE + WINDOW + 50_000 + i * 14_000, region, 0, 1)
            })
            .collect();
        let (admitted, _) = sim.run(&reqs);
        let total: u64 = admitted.iter().map(|a| a.cost).sum();
        assert_eq!(total, limit, "sliding: {sliding}");
    }
}

/// Many keys: 3,000 keys each spent in one region are all refused in the
/// others once `D` has passed, and the outbox holds one entry per key.
#[test]
fn many_keys_reach_every_peer_within_d() {
    let sim = Simulation {
        cuts: vec![Cut {
            region: 0,
            instance: 0,
            peer: 1,
            during: 0..u64::MAX,
        }],
        ..Simulation::new(policy(false, 1, WINDOW), 3, 2, 20_000, vec![5_000, 15_000])
    };
    let at = BASE + WINDOW / 10;
    let d = lag_d(20_000, &[5_000, 15_000]);
    let mut reqs: Vec<(u64, usize, u16, u64)> = (0..3_000u16).map(|k| (at, 0, k, 1)).collect();
    reqs.extend((0..3_000u16).map(|k| (at + d, 1 + usize::from(k % 2), k, 1)));
    let (admitted, redis) = sim.run(&reqs);
    assert_eq!(admitted.len(), 3_000, "each key admitted once, in region 0");
    assert!(admitted.iter().all(|a| a.region == 0));
    assert_eq!(redis[0].outbox.len(), 3_000);
}

/// A peer whose clock is off by more than the skew allowed is found out at
/// its first marked round, and counted at its share.
#[test]
fn a_skew_beyond_the_allowed_is_found_and_counted_at_the_share() {
    let sim = Simulation {
        offsets: vec![0, 200_000, 0],
        ..Simulation::new(policy(false, 9, WINDOW), 3, 1, 10_000, vec![2_000])
    };
    let at = BASE + WINDOW + WINDOW / 2;
    let reqs: Vec<(u64, usize, u16, u64)> = (0..12).map(|i| (at + i, 0, 0, 1)).collect();
    let (admitted, redis) = sim.run(&reqs);
    assert!(redis[0].heard[1].as_ref().is_some_and(|h| h.skewed));
    assert!(redis[0].heard[2].as_ref().is_some_and(|h| !h.skewed));
    // Region 1 counted at its share, 3 of 9: region 0 admits 6.
    assert_eq!(admitted.len(), 6);
}
