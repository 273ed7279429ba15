//! The bound, checked on what a model admitted.

use std::collections::BTreeMap;

use super::model::{Admitted, Simulation};

/// Checks, for every key and every window of the reference clock (less
/// `margin` at each end) under one policy: admitted <= limit + what the
/// regions other than the last to admit admitted during `d` before its
/// last admission. Windows that hold the reload are left to
/// [`check_reload`].
pub(super) fn check_bound(
    sim: &Simulation,
    admitted: &[Admitted],
    d: u64,
    margin: u64,
) -> Result<(), String> {
    let mut windows: BTreeMap<(u16, u64, u64), Vec<Admitted>> = BTreeMap::new();
    for a in admitted {
        let w = sim.policy_at(a.at).algorithm().window_micros();
        let start = a.at - a.at % w;
        let holds_reload = sim
            .reload
            .as_ref()
            .is_some_and(|(when, _)| (start..start + w).contains(when));
        let inner = a.at >= start + margin && a.at + margin < start + w;
        if !holds_reload && inner {
            windows.entry((a.key, w, start)).or_default().push(*a);
        }
    }
    for ((key, w, start), list) in windows {
        let limit = sim.policy_at(list[0].at).limit();
        let (total, lagging) = total_and_lagging(&list, d);
        if total > limit + lagging {
            return Err(format!(
                "key {key}, window {start}+{w}: {total} > {limit} + {lagging}"
            ));
        }
    }
    Ok(())
}

/// What the admissions of one window (in order) total, and what the
/// regions other than the last to admit admitted during the `d` before its
/// last admission: the slack that lag allows over the limit.
pub(super) fn total_and_lagging(list: &[Admitted], d: u64) -> (u64, u64) {
    let total = list.iter().map(|a| a.cost).sum();
    let last = list[list.len() - 1];
    let lagging = list
        .iter()
        .filter(|a| a.region != last.region && a.at + d >= last.at)
        .map(|a| a.cost)
        .sum();
    (total, lagging)
}

/// Checks, for every key, every region `r` and every window of `r`'s own
/// clock: up to `r`'s last admission in it at `t`, everything admitted
/// since the window started (by every region, whatever its clock) is at
/// most `limit` plus what the other regions admitted during the `d` before
/// `t`. Peers' counts are placed by the receiver's clock, so this holds
/// whatever the skew.
pub(super) fn check_each_region(
    sim: &Simulation,
    admitted: &[Admitted],
    d: u64,
) -> Result<(), String> {
    let mut windows: BTreeMap<(u16, usize, u64, u64), Admitted> = BTreeMap::new();
    for a in admitted {
        let policy = sim.policy_at(a.at);
        let w = policy.algorithm().window_micros();
        let clock = sim.clock(a.region, a.at);
        let start = clock - clock % w;
        // The window's start in reference time.
        let start_ref = a.at - (clock - start);
        let holds_reload = sim
            .reload
            .as_ref()
            .is_some_and(|(when, _)| (start_ref..start_ref + w).contains(when));
        if !holds_reload {
            windows.insert((a.key, a.region, w, start_ref), *a);
        }
    }
    for ((key, region, w, start), last) in windows {
        let limit = sim.policy_at(last.at).limit();
        let same = admitted
            .iter()
            .filter(|a| a.key == key && a.at >= start && a.at <= last.at);
        let total: u64 = same.clone().map(|a| a.cost).sum();
        let lagging: u64 = same
            .filter(|a| a.region != region && a.at + d >= last.at)
            .map(|a| a.cost)
            .sum();
        if total > limit + lagging {
            return Err(format!(
                "key {key}, region {region}'s window {start}+{w}: {total} > {limit} + {lagging}"
            ));
        }
    }
    Ok(())
}

/// At a reload to a shorter window, what the old window admitted before it
/// keeps counting: in each new window inside the old window that holds
/// the reload, admissions after it stay within the new limit less what was
/// admitted before (plus the lag term).
pub(super) fn check_reload(sim: &Simulation, admitted: &[Admitted], d: u64) -> Result<(), String> {
    let Some((when, after)) = &sim.reload else {
        return Ok(());
    };
    let (w_old, w_new) = (
        sim.policy.algorithm().window_micros(),
        after.algorithm().window_micros(),
    );
    if w_new > w_old || sim.offsets.iter().any(|&o| o != 0) {
        return Ok(());
    }
    let old_start = when - when % w_old;
    let mut keys: BTreeMap<u16, (u64, BTreeMap<u64, Vec<Admitted>>)> = BTreeMap::new();
    for a in admitted
        .iter()
        .filter(|a| a.at >= old_start && a.at < old_start + w_old)
    {
        let entry = keys.entry(a.key).or_default();
        if a.at < *when {
            entry.0 += a.cost;
        } else {
            entry.1.entry(a.at - a.at % w_new).or_default().push(*a);
        }
    }
    for (key, (before, windows)) in keys {
        for (start, list) in windows {
            let total: u64 = list.iter().map(|a| a.cost).sum();
            let last = list[list.len() - 1];
            let lagging: u64 = admitted
                .iter()
                .filter(|a| {
                    a.key == key
                        && a.region != last.region
                        && a.at + d >= last.at
                        && a.at <= last.at
                })
                .map(|a| a.cost)
                .sum();
            let allowed = after.limit().saturating_sub(before) + lagging;
            if total > allowed {
                return Err(format!(
                    "key {key}, new window {start}: {total} after the reload > {} - {before} + {lagging}",
                    after.limit()
                ));
            }
        }
    }
    Ok(())
}
