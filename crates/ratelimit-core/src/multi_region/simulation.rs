//! The bound on a manual clock: simulated regions, each with its exact own
//! component (its Redis), a view of its peers that syncs every `sync` and
//! lands after a replication lag of up to `lag` (so pushes may arrive out of
//! order), deciding with [`counts`](super::counts), the function the
//! store's script is checked against on every decision.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;

use super::counts::{self, Component};
use crate::Policy;

const WINDOW: u64 = 1_000_000;

/// A push from `from` to `to` of `from`'s components, landing at `at`.
#[derive(Debug, Clone)]
struct Push {
    at: u64,
    from: usize,
    to: usize,
    values: BTreeMap<u64, u64>,
}

/// One admitted request.
#[derive(Debug, Clone, Copy)]
struct Admitted {
    at: u64,
    region: usize,
    cost: u64,
}

struct Simulation {
    policy: Policy,
    regions: usize,
    sync: u64,
    /// The replication lag of each push, in turn (reordering when they differ).
    lags: Vec<u64>,
    /// Regions on side A of a partition from the start (the rest on side B),
    /// each counting the other side as stale; `None`: no partition.
    side_a: Option<Vec<bool>>,
}

impl Simulation {
    /// Runs `requests` (time, region, cost), sorted by time, and returns the
    /// admitted ones.
    fn run(&self, requests: &[(u64, usize, u64)]) -> Vec<Admitted> {
        let n = self.regions;
        // own[r][window start] and known[r][s][window start]
        let mut own: Vec<BTreeMap<u64, u64>> = vec![BTreeMap::new(); n];
        let mut known: Vec<Vec<BTreeMap<u64, u64>>> = vec![vec![BTreeMap::new(); n]; n];
        let mut in_flight: Vec<Push> = Vec::new();
        let mut next_sync = self.sync;
        let mut pushes = 0usize;
        let mut admitted = Vec::new();
        let share = counts::conservative_share(self.policy.limit(), n as u64);
        let apart =
            |r: usize, s: usize| self.side_a.as_ref().is_some_and(|side| side[r] != side[s]);
        for &(now, region, cost) in requests {
            // Sync ticks up to now: every region pushes its components.
            while next_sync <= now {
                for (from, values) in own.iter().enumerate() {
                    for to in (0..n).filter(|&to| to != from && !apart(from, to)) {
                        let lag = self.lags[pushes % self.lags.len()];
                        pushes += 1;
                        in_flight.push(Push {
                            at: next_sync + lag,
                            from,
                            to,
                            values: values.clone(),
                        });
                    }
                }
                next_sync += self.sync;
            }
            // Pushes that landed by now, merged by maximum.
            in_flight.retain(|push| {
                if push.at > now {
                    return true;
                }
                let view = &mut known[push.to][push.from];
                for (&start, &value) in &push.values {
                    let entry = view.entry(start).or_insert(0);
                    *entry = (*entry).max(value);
                }
                false
            });
            let start = now - now % WINDOW;
            let component = |m: &BTreeMap<u64, u64>| {
                Component::new(
                    start
                        .checked_sub(WINDOW)
                        .and_then(|p| m.get(&p))
                        .copied()
                        .unwrap_or(0),
                    m.get(&start).copied().unwrap_or(0),
                )
            };
            let peers: Vec<(Component, bool)> = (0..n)
                .filter(|&s| s != region)
                .map(|s| (component(&known[region][s]), apart(region, s)))
                .collect();
            let global = counts::global(component(&own[region]), &peers, share);
            let decision =
                counts::decide(&self.policy, start, now, cost, global).expect("supported");
            if decision.is_allowed() {
                *own[region].entry(start).or_insert(0) += cost;
                admitted.push(Admitted {
                    at: now,
                    region,
                    cost,
                });
            }
        }
        admitted
    }
}

/// Per window: the total admitted, and the bound `limit + what the regions
/// other than the last to admit admitted during the `d` up to its last
/// admission`, over the regions `among`.
fn totals(
    admitted: &[Admitted],
    d: u64,
    among: impl Fn(usize) -> bool,
) -> BTreeMap<u64, (u64, u64)> {
    let mut windows: BTreeMap<u64, Vec<Admitted>> = BTreeMap::new();
    for a in admitted.iter().filter(|a| among(a.region)) {
        windows.entry(a.at / WINDOW).or_default().push(*a);
    }
    windows
        .into_iter()
        .map(|(window, list)| {
            let total = list.iter().map(|a| a.cost).sum();
            let last = list[list.len() - 1];
            let lagging: u64 = list
                .iter()
                .filter(|a| a.region != last.region && a.at + d >= last.at)
                .map(|a| a.cost)
                .sum();
            (window, (total, lagging))
        })
        .collect()
}

fn policy(sliding: bool, limit: u64) -> Policy {
    let window = Duration::from_micros(WINDOW);
    if sliding {
        Policy::sliding_window_counter(limit, window).expect("valid")
    } else {
        Policy::fixed_window(limit, window).expect("valid")
    }
}

fn requests(regions: usize) -> impl Strategy<Value = Vec<(u64, usize, u64)>> {
    prop::collection::vec((0..3 * WINDOW, 0..regions, 1..=3u64), 1..300).prop_map(|mut r| {
        r.sort_by_key(|&(at, _, _)| at);
        r
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// In every window, admitted <= limit + what the other regions admitted
    /// during one sync interval plus one replication lag before the last
    /// admission, for 2 to 4 regions.
    #[test]
    fn admitted_stays_within_the_bound(
        sliding in any::<bool>(),
        limit in 3..40u64,
        regions in 2..5usize,
        sync in 1_000..200_000u64,
        lags in prop::collection::vec(0..150_000u64, 1..6),
        reqs in requests(4),
    ) {
        let d = sync + lags.iter().max().copied().unwrap_or(0);
        let reqs: Vec<_> = reqs.into_iter().map(|(at, r, c)| (at, r % regions, c)).collect();
        let runner = Simulation { policy: policy(sliding, limit), regions, sync, lags, side_a: None };
        let admitted = runner.run(&reqs);
        for (total, lagging) in totals(&admitted, d, |_| true).into_values() {
            prop_assert!(total <= limit + lagging, "{total} > {limit} + {lagging}");
        }
    }

    /// Partitioned from the start, each side counting the other's regions
    /// at their conservative share: each side admits at most `limit` less
    /// the other side's shares (plus its own lag term), and both together
    /// at most `limit` plus the two lag terms.
    #[test]
    fn each_side_of_a_partition_stays_within_its_share(
        sliding in any::<bool>(),
        limit in 3..40u64,
        sync in 1_000..200_000u64,
        lags in prop::collection::vec(0..150_000u64, 1..6),
        side_a in prop::collection::vec(any::<bool>(), 3),
        reqs in requests(3),
    ) {
        let d = sync + lags.iter().max().copied().unwrap_or(0);
        let share = counts::conservative_share(limit, 3);
        let a_count = side_a.iter().filter(|&&a| a).count() as u64;
        let runner = Simulation {
            policy: policy(sliding, limit), regions: 3, sync, lags, side_a: Some(side_a.clone()),
        };
        let admitted = runner.run(&reqs);
        let mut windows: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for (in_a, others) in [(true, 3 - a_count), (false, a_count)] {
            let side = side_a.clone();
            for (window, (total, lagging)) in totals(&admitted, d, move |r| side[r] == in_a) {
                prop_assert!(
                    total <= limit.saturating_sub(others * share) + lagging,
                    "side {in_a}: {total} > {limit} - {others} x {share} + {lagging}"
                );
                let both = windows.entry(window).or_default();
                both.0 += total;
                both.1 += lagging;
            }
        }
        for (total, lagging) in windows.into_values() {
            prop_assert!(total <= limit + lagging, "{total} > {limit} + {lagging}");
        }
    }
}

/// The bound is reached: every region bursts at once, before any sync, and
/// each admits the whole limit (`limit + (regions - 1) x limit`, all of it
/// within one `d`).
#[test]
fn the_worst_case_reaches_the_bound() {
    let limit = 10;
    let runner = Simulation {
        policy: policy(false, limit),
        regions: 3,
        sync: 100_000,
        lags: vec![50_000],
        side_a: None,
    };
    let reqs: Vec<(u64, usize, u64)> = (0..3)
        .flat_map(|r| (0..limit + 5).map(move |i| (1_000 + i, r, 1)))
        .collect::<Vec<_>>();
    let mut reqs = reqs;
    reqs.sort_by_key(|&(at, _, _)| at);
    let admitted = runner.run(&reqs);
    let total: u64 = admitted.iter().map(|a| a.cost).sum();
    assert_eq!(total, 3 * limit);
    let bound: Vec<_> = totals(&admitted, 150_000, |_| true).into_values().collect();
    assert_eq!(bound, vec![(3 * limit, 2 * limit)]);
}

/// Requests further apart than one sync plus one lag admit the limit
/// exactly, however they are spread over the regions (here 80/10/10).
#[test]
fn spaced_requests_admit_the_limit_exactly() {
    for sliding in [false, true] {
        let limit = 20;
        let runner = Simulation {
            policy: policy(sliding, limit),
            regions: 3,
            sync: 10_000,
            lags: vec![3_000, 7_000],
            side_a: None,
        };
        // 60 requests 15 ms apart in the first 900 ms of one window.
        let reqs: Vec<(u64, usize, u64)> = (0..60u64)
            .map(|i| {
                let region = match i % 10 {
                    0 => 1,
                    1 => 2,
                    _ => 0,
                };
                (WINDOW + i * 15_000, region, 1)
            })
            .collect();
        let admitted = runner.run(&reqs);
        let total: u64 = admitted.iter().map(|a| a.cost).sum();
        assert_eq!(total, limit, "sliding: {sliding}");
    }
}
