//! Concurrency (a distributed semaphore): at most `max` units in flight per key.
//!
//! Each admitted request holds a permit with a lease. Releasing the permit frees
//! its units at once; a live holder renews its lease (the Tower layer's
//! permit guard does, every third of a lease), so a permit lasts as long as
//! its holder; a holder that dies without releasing stops renewing and loses
//! its permit when the lease expires, so a crash never leaks capacity for
//! longer than a lease.

use std::time::Duration;

use super::{check_limit, window_micros};
use crate::{Decision, PermitId, PolicyError};

/// The largest `max` of a concurrency limit.
///
/// Every held permit is one entry in the key's state (46 bytes of one string
/// in Redis, which every decision reads and an admission writes whole):
/// bounding `max` bounds the entries, so every Redis call on a semaphore
/// stays short and never stalls the other decisions. For more in flight,
/// split the key (for example by a hash of the request into several keys,
/// each with its share).
pub(crate) const MAX_CONCURRENCY: u64 = 1024;

/// Parameters of a concurrency limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Concurrency {
    max: u64,
    lease: u64,
}

/// One held permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease {
    /// The permit's identity.
    pub(crate) id: PermitId,
    /// When the lease expires, in µs.
    pub(crate) expires_at: u64,
    /// How many units the permit holds.
    pub(crate) units: u64,
}

/// State of a concurrency limit for one key: the permits held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ConcurrencyState {
    /// The permits currently held, in the order they were taken.
    pub(crate) leases: Vec<Lease>,
}

impl ConcurrencyState {
    fn held(&self) -> u64 {
        self.leases.iter().map(|l| l.units).sum()
    }

    fn expire(&mut self, now: u64) {
        self.leases.retain(|l| l.expires_at > now);
    }
}

impl Concurrency {
    /// At most `max` units in flight, each permit leased for `lease`.
    ///
    /// `max` is at most 1,024 ([`PolicyError::TooLarge`]): every held permit
    /// is one entry in the key's state, which every decision reads, so the
    /// bound keeps every call on a semaphore short. For more in flight,
    /// split the key (by a hash of the request into several keys, each with
    /// its share).
    pub fn new(max: u64, lease: Duration) -> Result<Self, PolicyError> {
        if max > MAX_CONCURRENCY {
            return Err(PolicyError::TooLarge {
                what: "the max of a concurrency limit",
                max: MAX_CONCURRENCY,
            });
        }
        Ok(Concurrency {
            max: check_limit(max, "max")?,
            lease: window_micros(lease, "lease")?,
        })
    }

    /// The most units in flight.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The lease in microseconds.
    pub fn lease_micros(&self) -> u64 {
        self.lease
    }

    /// Tries to take a permit of `cost` units at `now` (µs), named `id`.
    ///
    /// A cost of 0 peeks and takes no permit. A permit `id` still held is
    /// this acquisition made again (a store sends a check again when its
    /// reply was lost): allowed, holding `id`, and nothing more is taken.
    pub(crate) fn acquire(
        &self,
        state: &mut ConcurrencyState,
        now: u64,
        cost: u64,
        id: PermitId,
    ) -> Decision {
        state.expire(now);
        let held = state.held();
        if cost > 0 && state.leases.iter().any(|l| l.id == id) {
            return Decision::allow(
                self.max,
                self.max.saturating_sub(held),
                reset_after(state, now),
            )
            .with_permit(id);
        }
        if held + cost <= self.max {
            if cost == 0 {
                return Decision::allow(self.max, self.max - held, reset_after(state, now));
            }
            state.leases.push(Lease {
                id,
                expires_at: now + self.lease,
                units: cost,
            });
            Decision::allow(self.max, self.max - held - cost, reset_after(state, now))
                .with_permit(id)
        } else {
            let need = held + cost - self.max;
            let mut by_expiry: Vec<(u64, u64)> = state
                .leases
                .iter()
                .map(|l| (l.expires_at, l.units))
                .collect();
            by_expiry.sort_unstable();
            let mut freed = 0;
            let mut retry = self.lease;
            for (expires_at, units) in by_expiry {
                freed += units;
                if freed >= need {
                    retry = expires_at - now;
                    break;
                }
            }
            // Permits taken under a larger max (a reload that lowered it)
            // may hold more than this max: nothing remains until they end.
            Decision::deny(
                self.max,
                self.max.saturating_sub(held),
                reset_after(state, now),
                retry,
            )
        }
    }

    /// Releases the permit `id`. Returns whether it was still held (it may
    /// have expired).
    pub(crate) fn release(&self, state: &mut ConcurrencyState, now: u64, id: PermitId) -> bool {
        state.expire(now);
        let before = state.leases.len();
        state.leases.retain(|l| l.id != id);
        state.leases.len() != before
    }

    /// Renews the lease of the permit `id` at `now`: it then ends a whole
    /// lease after `now` (never sooner than it did). Returns whether it was
    /// still held. A permit released or expired stays gone: a renewal never
    /// takes back a unit another request may hold by now.
    pub(crate) fn renew(&self, state: &mut ConcurrencyState, now: u64, id: PermitId) -> bool {
        state.expire(now);
        let expires_at = now + self.lease;
        let mut held = false;
        for lease in state.leases.iter_mut().filter(|l| l.id == id) {
            lease.expires_at = lease.expires_at.max(expires_at);
            held = true;
        }
        held
    }

    /// The time until the state is empty, in µs.
    pub(crate) fn reset_after(&self, state: &ConcurrencyState, now: u64) -> u64 {
        reset_after(state, now)
    }
}

fn reset_after(state: &ConcurrencyState, now: u64) -> u64 {
    state
        .leases
        .iter()
        .map(|l| l.expires_at.saturating_sub(now))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An acquisition made again under the id of a permit it holds (a check
    /// sent again) is allowed and takes nothing more; a released permit's id
    /// takes a new one.
    #[test]
    fn an_acquisition_made_again_takes_nothing_more() {
        let limit = Concurrency::new(1, Duration::from_secs(60)).unwrap();
        let mut state = ConcurrencyState::default();
        let id = PermitId(7);
        let first = limit.acquire(&mut state, 1_000, 1, id);
        assert_eq!(first.permit(), Some(id));
        let again = limit.acquire(&mut state, 2_000, 1, id);
        assert!(again.is_allowed(), "{again:?}");
        assert_eq!((again.permit(), again.remaining()), (Some(id), 0));
        assert_eq!(state.leases.len(), 1);
        let other = limit.acquire(&mut state, 2_000, 1, PermitId(8));
        assert!(!other.is_allowed(), "{other:?}");
        assert!(limit.release(&mut state, 3_000, id));
        assert!(state.leases.is_empty());
        let peek = limit.acquire(&mut state, 3_000, 0, id);
        assert_eq!((peek.permit(), peek.remaining()), (None, 1));
    }
}
