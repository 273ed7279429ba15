//! The decision of a multi-region store as a pure function of the G-counter
//! components it sees: what the Lua script decides in Redis, and what the
//! simulation in the tests replays on a manual clock.
//!
//! A region's view of one key in one window is the sum of every region's
//! component: its own exact count, and each peer's last known count (merged
//! by maximum, so it only grows). A peer that is stale (not heard from for
//! longer than the staleness) counts as at least its conservative share,
//! `ceil(limit / regions)`, in the current window. The decision is then the
//! one-region algorithm ([`FixedWindow`](crate::algorithm::FixedWindow) or
//! [`SlidingWindowCounter`](crate::algorithm::SlidingWindowCounter)) on those
//! sums, so within one region the store is exactly the single-Redis store.

use crate::algorithm::fixed_window::FixedWindowState;
use crate::algorithm::sliding_window_counter::SlidingWindowCounterState;
use crate::policy::Algorithm;
use crate::{Decision, Policy, StoreError};

/// One region's component of a key: its counts in the window before the
/// current one and in the current one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Component {
    /// Cost admitted in the previous window.
    pub previous: u64,
    /// Cost admitted in the current window.
    pub current: u64,
}

impl Component {
    /// A component with these counts.
    pub fn new(previous: u64, current: u64) -> Self {
        Component { previous, current }
    }
}

/// The conservative share of one stale peer: `ceil(limit / regions)`.
/// Rounding up keeps the shares of all regions at least `limit`, so two
/// sides of a partition that each reserve the other's share never admit
/// more than `limit` together.
pub fn conservative_share(limit: u64, regions: u64) -> u64 {
    limit.div_ceil(regions.max(1))
}

/// The global counts a region decides against: `own` plus every peer's
/// known component, a stale peer's current count raised to `share`.
pub fn global(own: Component, peers: &[(Component, bool)], share: u64) -> Component {
    peers.iter().fold(own, |sum, &(peer, stale)| Component {
        previous: sum.previous.saturating_add(peer.previous),
        current: sum.current.saturating_add(if stale {
            peer.current.max(share)
        } else {
            peer.current
        }),
    })
}

/// Whether the multi-region store supports `policy`: the algorithms whose
/// state is a count per window (fixed window, sliding window counter).
pub fn supports(policy: &Policy) -> bool {
    matches!(
        policy.algorithm(),
        Algorithm::FixedWindow(_) | Algorithm::SlidingWindowCounter(_)
    )
}

/// Decides a request of `cost` at `now` (µs) against the `global` counts of
/// the window that starts at `window_start`: the one-region algorithm on
/// the sums. Cost 0 peeks.
///
/// [`StoreError::Unsupported`] for an algorithm whose state is not a count
/// per window.
pub fn decide(
    policy: &Policy,
    window_start: u64,
    now: u64,
    cost: u64,
    global: Component,
) -> Result<Decision, StoreError> {
    match policy.algorithm() {
        Algorithm::FixedWindow(a) => {
            let mut state = FixedWindowState {
                window_last: window_start,
                count: global.current,
            };
            Ok(a.decide(&mut state, now, cost))
        }
        Algorithm::SlidingWindowCounter(a) => {
            let mut state = SlidingWindowCounterState {
                window_last: window_start,
                previous: global.previous,
                current: global.current,
            };
            Ok(a.decide(&mut state, now, cost))
        }
        other => Err(StoreError::Unsupported {
            policy: policy.name().to_owned(),
            algorithm: other.kind(),
            operation: "multi-region",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn shares_round_up_so_they_cover_the_limit() {
        assert_eq!(conservative_share(10, 3), 4);
        assert_eq!(conservative_share(9, 3), 3);
        assert_eq!(conservative_share(1, 3), 1);
        assert!(3 * conservative_share(10, 3) >= 10);
    }

    #[test]
    fn a_stale_peer_counts_at_least_its_share() {
        let own = Component::new(0, 2);
        let peers = [(Component::new(1, 1), true), (Component::new(0, 5), false)];
        assert_eq!(global(own, &peers, 4), Component::new(1, 2 + 4 + 5));
        let peers = [(Component::new(0, 7), true)];
        assert_eq!(global(own, &peers, 4), Component::new(0, 9));
    }

    #[test]
    fn the_decision_is_the_one_region_algorithm_on_the_sums() {
        let policy = Policy::fixed_window(10, Duration::from_secs(1)).expect("valid");
        let d = decide(&policy, 0, 500_000, 2, Component::new(0, 8)).expect("supported");
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 0);
        let d = decide(&policy, 0, 500_000, 1, Component::new(0, 10)).expect("supported");
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after_micros(), 500_000);
        let gcra = Policy::gcra(10, crate::Rate::per_second(1)).expect("valid");
        assert!(matches!(
            decide(&gcra, 0, 0, 1, Component::default()),
            Err(StoreError::Unsupported { .. })
        ));
    }
}
