//! The decision of a multi-region store as a pure function of the G-counter
//! components it sees: what the Lua script decides in Redis, and what the
//! simulation in the tests replays on a manual clock.
//!
//! A region's view of one key is the sum of every region's `Count`s (see
//! `view`): its own exact count, and what each peer's pushes added, in the
//! window of this region's clock in which they arrived. A peer that is
//! stale (no complete push marked within the staleness) or whose clock is
//! too far off counts as at least its conservative share,
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
#[cfg(any(test, ratelimit_test_hooks))]
pub fn conservative_share(limit: u64, regions: u64) -> u64 {
    limit.div_ceil(regions.max(1))
}

/// One region's count in one window, as a key's state hash holds it: the
/// cost `region` admitted in (for this region) or that arrived from
/// `region` in (for a peer) the window of `window` µs starting at `start`.
#[cfg(any(test, ratelimit_test_hooks))]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Count {
    /// The region the count is of.
    pub region: String,
    /// The start of its window (µs).
    pub start: u64,
    /// The length of its window (µs); another policy's after a reload.
    pub window: u64,
    /// The cost counted.
    pub value: u64,
}

#[cfg(any(test, ratelimit_test_hooks))]
impl Count {
    /// A count of `value` for `region` in the window `[start, start + window)`.
    pub fn new(region: impl Into<String>, start: u64, window: u64, value: u64) -> Self {
        Count {
            region: region.into(),
            start,
            window,
            value,
        }
    }

    /// The start of the window of length `window` that holds this count's
    /// last microsecond: where it counts under that window.
    fn mapped(&self, window: u64) -> u64 {
        let last = self.start.saturating_add(self.window.max(1) - 1);
        last - last % window
    }
}

/// The window start and global counts that region `own` decides against at
/// `now` (µs), under a window of `window` µs, from a key's `counts` (what
/// `decide.lua` computes in Redis):
///
/// - a count lasts until the window after its own ends, under any window
///   length (as a single-region state lasts as long as the decision that
///   wrote it said), and counts in the window of this length that holds
///   its last microsecond (a count written under a longer window thus
///   counts in full until that window would have ended);
/// - counts mapped to the current window or later are the current count
///   (the window start is the latest of them); counts mapped to the window
///   before, or followed by a count of their own region and window length
///   that is current, are the previous count;
/// - a peer in `conservative` (stale, or its clock too far off) counts at
///   least `share` in the current window.
///
/// Within one region and one window length this reads the fields as the
/// single-region algorithms read their state; across a reload it counts at
/// least what they do.
#[cfg(any(test, ratelimit_test_hooks))]
pub fn view(
    own: &str,
    counts: &[Count],
    window: u64,
    now: u64,
    conservative: &[&str],
    share: u64,
) -> (u64, Component) {
    let window = window.max(1);
    let aligned = now - now % window;
    let live: Vec<&Count> = counts
        .iter()
        .filter(|c| c.start.saturating_add(c.window.saturating_mul(2)) > now)
        .collect();
    let mut start = aligned;
    let mut current_of: Vec<(&str, u64)> = Vec::new();
    let mut previous = 0u64;
    for count in &live {
        let mapped = count.mapped(window);
        if mapped >= aligned {
            match current_of.iter_mut().find(|(r, _)| *r == count.region) {
                Some((_, sum)) => *sum = sum.saturating_add(count.value),
                None => current_of.push((count.region.as_str(), count.value)),
            }
            start = start.max(mapped);
        } else {
            let followed = live.iter().any(|next| {
                next.region == count.region
                    && next.window == count.window
                    && next.start == count.start.saturating_add(count.window)
                    && next.mapped(window) >= aligned
            });
            if mapped.saturating_add(window) == aligned || followed {
                previous = previous.saturating_add(count.value);
            }
        }
    }
    let mut current = 0u64;
    for (region, sum) in &current_of {
        let sum = if *region != own && conservative.contains(region) {
            (*sum).max(share)
        } else {
            *sum
        };
        current = current.saturating_add(sum);
    }
    for region in conservative {
        if *region != own && !current_of.iter().any(|(r, _)| r == region) {
            current = current.saturating_add(share);
        }
    }
    (start, Component::new(previous, current))
}

/// Whether the multi-region store supports `policy`: the algorithms whose
/// state is a count per window of a fixed length (fixed window, sliding
/// window counter; not calendar periods).
pub(crate) fn supports(policy: &Policy) -> bool {
    match policy.algorithm() {
        Algorithm::FixedWindow(a) => a.calendar_periods().is_none(),
        Algorithm::SlidingWindowCounter(_) => true,
        _ => false,
    }
}

/// Decides a request of `cost` at `now` (µs) against the `global` counts of
/// the window that starts at `window_start`: the one-region algorithm on
/// the sums. Cost 0 peeks.
///
/// [`StoreError::Unsupported`] for an algorithm whose state is not a count
/// per window of a fixed length.
pub fn decide(
    policy: &Policy,
    window_start: u64,
    now: u64,
    cost: u64,
    global: Component,
) -> Result<Decision, StoreError> {
    match policy.algorithm() {
        Algorithm::FixedWindow(a) if a.calendar_periods().is_none() => {
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
        _ => Err(StoreError::unsupported(policy, "multi-region")),
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
        let w = 1_000_000;
        let counts = [
            Count::new("eu", w, w, 2),
            Count::new("us", w, w, 1),
            Count::new("us", 0, w, 1),
            Count::new("ap", w, w, 5),
        ];
        let (start, global) = view("eu", &counts, w, w + 10, &["us"], 4);
        assert_eq!((start, global), (w, Component::new(1, 2 + 4 + 5)));
        let (_, global) = view("eu", &counts[..1], w, w + 10, &["us", "ap"], 4);
        assert_eq!(global, Component::new(0, 2 + 4 + 4));
    }

    #[test]
    fn counts_of_another_window_length_count_until_their_window_would_end() {
        let hour = 3_600_000_000;
        let seven = 420_000_000;
        // 5 spent in the hour [0, 1 h), read under 7 min at 10 s: they
        // count, in the 7-min window that holds the hour's end.
        let counts = [Count::new("eu", 0, hour, 5)];
        let (start, global) = view("eu", &counts, seven, 10_000_000, &[], 1);
        assert_eq!(start, (hour - 1) / seven * seven);
        assert_eq!(global, Component::new(0, 5));
        // And nothing of it remains two hours on.
        let (_, global) = view("eu", &counts, seven, 2 * hour, &[], 1);
        assert_eq!(global, Component::default());
        // The hour before weighs as the previous count while the hour is
        // current (as a single-region state holds it), and counts in full
        // in the 7-min window that holds its end.
        let counts = [
            Count::new("eu", 0, hour, 3),
            Count::new("eu", hour, hour, 5),
        ];
        let (_, global) = view("eu", &counts, seven, hour + 600_000_000, &[], 1);
        assert_eq!(global, Component::new(3, 5));
        let (_, global) = view("eu", &counts, seven, hour + 10_000_000, &[], 1);
        assert_eq!(global, Component::new(0, 8));
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
        let monthly = Policy::calendar(10, crate::Period::Month).expect("valid");
        assert!(!supports(&monthly));
        assert!(matches!(
            decide(&monthly, 0, 0, 1, Component::default()),
            Err(StoreError::Unsupported { .. })
        ));
    }
}
