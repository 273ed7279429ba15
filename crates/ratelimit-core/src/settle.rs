//! Settlements ([`Store::settle`](crate::Store::settle)): a request that
//! reserved an estimate before it ran pays what it really cost once it knows.

use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::pin::Pin;
use std::time::Duration;

use crate::store::{Merged, same_policy};
use crate::{Decision, Policy, StoreError};

/// The future returned by [`Store::settle`](crate::Store::settle): what each
/// limit reports after the settlement, in the order of the settlements.
pub type SettleFuture = Pin<Box<dyn Future<Output = Result<Vec<Decision>, StoreError>> + Send>>;

/// One limit of a settlement ([`Store::settle`](crate::Store::settle)): the
/// request reserved `reserved` units of `key` under `policy`, and really
/// cost `actual`.
///
/// `decision` is the reservation's own decision, which store combinators read
/// to settle in the store that decided ([`Decision::source`]). A denied
/// decision consumed nothing, so its `reserved` counts as 0. (A reservation
/// of several limits that was denied as a whole consumed nothing under any of
/// them, even those whose decision allowed: do not settle it.)
///
/// `held`, when known ([`held_for`](Settle::held_for)), is how long ago
/// the reservation was asked of the store. A reservation's units stop
/// counting against the budget once its window ends or the refill has paid
/// them back; given back after that, they would be units a later request
/// consumed. So a settlement below the reservation gives back only what the
/// reservation can still hold after `held`: nothing once the window it was
/// counted in ended (a fixed window or calendar period, the window of a
/// sliding log or of a sliding window counter, whose count of the next
/// window holds later requests' units only), and for a token bucket, GCRA or leaky bucket one unit
/// less per emission interval in which, without the reservation, the bucket
/// could have been full. Settlements of one key and policy in one call are
/// bounded as one reservation (the longest held, the soonest whole again).
/// A settlement without `held` gives the whole difference back.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Settle<'a> {
    /// The user key (an IP address, an API key, ...).
    pub key: &'a [u8],
    /// The policy the reservation was checked against.
    pub policy: &'a Policy,
    /// What the reservation consumed: its cost (the estimate).
    pub reserved: u64,
    /// What the request really cost.
    pub actual: u64,
    /// The reservation's decision.
    pub decision: &'a Decision,
    /// How long ago the reservation was asked of the store, if known: it
    /// bounds what a settlement below the reservation gives back (see
    /// [`Settle`]).
    pub held: Option<Duration>,
}

impl<'a> Settle<'a> {
    /// The settlement of a reservation of `reserved` units of `key` under
    /// `policy` (decided by `decision`) to `actual`.
    pub fn new(
        key: &'a [u8],
        policy: &'a Policy,
        reserved: u64,
        actual: u64,
        decision: &'a Decision,
    ) -> Self {
        Settle {
            key,
            policy,
            reserved,
            actual,
            decision,
            held: None,
        }
    }

    /// The same settlement of a reservation asked of the store `held` ago
    /// (measured from before the request to the store, so never less than
    /// the store saw): a settlement below the reservation then gives back
    /// only the units the reservation still holds (see [`Settle`]).
    #[must_use]
    pub fn held_for(mut self, held: Duration) -> Self {
        self.held = Some(held);
        self
    }

    /// What the reservation consumed: `reserved`, or 0 when its decision
    /// denied it.
    pub(crate) fn consumed(&self) -> u64 {
        if self.decision.is_allowed() {
            self.reserved
        } else {
            0
        }
    }
}

/// The identity of one settlement, the same in every store and every resend
/// of it: a settlement whose id a store has applied already to a key changes
/// nothing there. Draw one per reservation with [`SettlementId::random`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SettlementId(pub u128);

impl SettlementId {
    /// A fresh id, 128 bits that no other id drawn anywhere repeats but by
    /// chance: SipHash under keys of their own (`RandomState`, seeded from the
    /// operating system's randomness once per thread and different for every
    /// call).
    pub fn random() -> Self {
        let keys = RandomState::new();
        let high = keys.hash_one(0_u8);
        let low = keys.hash_one(1_u8);
        SettlementId((u128::from(high) << 64) | u128::from(low))
    }
}

crate::decision::hex_id_fmt!(SettlementId);

/// One limit to settle, merged: what it consumed, what it cost.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Part<'a> {
    pub(crate) key: &'a [u8],
    pub(crate) policy: &'a Policy,
    pub(crate) reserved: u64,
    pub(crate) actual: u64,
}

impl<'a> Merged<Part<'a>> {
    /// Merges the settlements whose `identity` (the state they share) is
    /// equal into one part of their summed reservations and costs. A policy
    /// without settlements (concurrency) is [`StoreError::Unsupported`], and
    /// two policies under one name with other parameters are
    /// [`StoreError::PolicyConflict`], before anything is settled.
    pub(crate) fn settles<K: PartialEq>(
        settles: &[Settle<'a>],
        identity: impl Fn(&Settle<'a>) -> K,
    ) -> Result<Self, StoreError> {
        let supported = |settle: &Settle<'a>| refuse_unsupported(settle.policy);
        let open = |settle: &Settle<'a>| {
            let part = Part {
                key: settle.key,
                policy: settle.policy,
                reserved: settle.consumed(),
                actual: settle.actual,
            };
            let mut held = Held::default();
            held.add(settle);
            (part, held)
        };
        let join = |(first, held): &mut (Part<'a>, Held), settle: &Settle<'a>| {
            same_policy(first.policy, settle.policy)?;
            first.reserved = first.reserved.saturating_add(settle.consumed());
            first.actual = first.actual.saturating_add(settle.actual);
            held.add(settle);
            Ok(())
        };
        let merged = Merged::by(settles, supported, identity, open, join)?;
        Ok(Merged {
            items: merged
                .items
                .into_iter()
                .map(|(part, held)| held.bound(part))
                .collect(),
            of: merged.of,
        })
    }
}

/// How long the reservations merged into one part were held, taken as
/// conservatively as their settlements allow.
#[derive(Default)]
struct Held {
    /// The longest `held`, and the soonest a reservation's decision said
    /// its budget would be whole again, of those that said how long they
    /// were held.
    known: Option<(Duration, u64)>,
    /// Whether a reservation did not say.
    unknown: bool,
}

impl Held {
    fn add(&mut self, settle: &Settle<'_>) {
        if settle.consumed() == 0 {
            return;
        }
        let Some(held) = settle.held else {
            self.unknown = true;
            return;
        };
        let reset = settle.decision.reset_after_micros();
        self.known = Some(match self.known {
            Some((longest, soonest)) => (longest.max(held), soonest.min(reset)),
            None => (held, reset),
        });
    }

    /// `part`, giving back no more than its reservations still hold
    /// ([`Algorithm::refundable`](crate::Algorithm::refundable)); the whole
    /// difference when one of them did not say how long it was held.
    fn bound(self, mut part: Part<'_>) -> Part<'_> {
        if let (Some((held, reset)), false) = (self.known, self.unknown)
            && part.actual < part.reserved
        {
            let held = u64::try_from(held.as_micros()).unwrap_or(u64::MAX);
            let most = part
                .policy
                .algorithm()
                .refundable(part.reserved, reset, held);
            part.actual = part.actual.max(part.reserved - most);
        }
        part
    }
}

/// [`StoreError::Unsupported`] for a policy that cannot be settled (see
/// [`Policy::supports_settlement`]).
pub(crate) fn refuse_unsupported(policy: &Policy) -> Result<(), StoreError> {
    if policy.supports_settlement() {
        Ok(())
    } else {
        Err(unsupported(policy))
    }
}

/// The error of a store or a policy without settlements.
pub(crate) fn unsupported(policy: &Policy) -> StoreError {
    StoreError::unsupported(policy, "settle")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Period, Rate};

    #[test]
    fn ids_are_fresh_and_print_as_32_hex_digits() {
        let ids: std::collections::HashSet<SettlementId> =
            (0..1_000).map(|_| SettlementId::random()).collect();
        assert_eq!(ids.len(), 1_000);
        assert_eq!(SettlementId(0xab).to_string(), format!("{:0>32}", "ab"));
        assert_eq!(SettlementId(u128::MAX).to_string().len(), 32);
        assert_eq!(
            format!("{:?}", SettlementId(0xab)),
            format!("SettlementId({:0>32})", "ab")
        );
    }

    /// What a settlement to 0 of a reservation of 10 held for `held` ms,
    /// whose decision reported `reset` ms, is brought to under `policy`:
    /// the units it keeps.
    fn kept(policy: &Policy, reset: u64, held: u64) -> u64 {
        let decision = Decision::allow(10, 0, reset * 1_000);
        let settles =
            [Settle::new(b"k", policy, 10, 0, &decision).held_for(Duration::from_millis(held))];
        let merged = Merged::settles(&settles, |s| s.key).expect("merged");
        merged.items[0].actual
    }

    #[test]
    fn a_held_reservation_gives_back_only_what_it_still_holds() {
        let minute = Duration::from_secs(60);
        let fixed = Policy::fixed_window(10, minute).unwrap();
        // Reserved a second before its window ended.
        assert_eq!(kept(&fixed, 1_000, 999), 0);
        assert_eq!(kept(&fixed, 1_000, 1_000), 10);
        let log = Policy::sliding_window_log(10, minute).unwrap();
        assert_eq!(kept(&log, 60_000, 59_999), 0);
        assert_eq!(kept(&log, 60_000, 60_000), 10);
        // The counter's reservation is given back until its window ends,
        // a second after it was made, and not from the next window's count.
        let counter = Policy::sliding_window_counter(10, minute).unwrap();
        assert_eq!(kept(&counter, 61_000, 999), 0);
        assert_eq!(kept(&counter, 61_000, 1_000), 10);
        assert_eq!(kept(&counter, 61_000, 31_000), 10);
        // Ten tokens a minute: one every 6 s. Into a full bucket, the
        // reservation is paid back by the refill from the start; into one
        // already 10 tokens down, only after 60 s.
        for bucket in [
            Policy::token_bucket(10, Rate::per_minute(10)).unwrap(),
            Policy::gcra(20, Rate::per_minute(10)).unwrap(),
            Policy::leaky_bucket(20, Rate::per_minute(10)).unwrap(),
        ] {
            assert_eq!(kept(&bucket, 60_000, 5_999), 0, "{}", bucket.name());
            assert_eq!(kept(&bucket, 60_000, 6_000), 1, "{}", bucket.name());
            assert_eq!(kept(&bucket, 60_000, 60_000), 10, "{}", bucket.name());
            assert_eq!(kept(&bucket, 120_000, 60_000), 0, "{}", bucket.name());
            assert_eq!(kept(&bucket, 120_000, 66_000), 1, "{}", bucket.name());
        }
        // Without `held`, the whole difference, as ever.
        let decision = Decision::allow(10, 0, 1);
        let unknown = [Settle::new(b"k", &fixed, 10, 0, &decision)];
        let merged = Merged::settles(&unknown, |s| s.key).expect("merged");
        assert_eq!(merged.items[0].actual, 0);
    }

    #[test]
    fn merged_held_reservations_count_as_one_and_extremes_never_overflow() {
        let bucket = Policy::token_bucket(10, Rate::per_minute(10)).unwrap();
        // Two rules of one request on one key: one reservation of 10 into a
        // full bucket, held 6 s: one token was paid back by the refill.
        let decision = Decision::allow(10, 0, 60_000_000);
        let six = Duration::from_secs(6);
        let settles = [
            Settle::new(b"k", &bucket, 5, 0, &decision).held_for(six),
            Settle::new(b"k", &bucket, 5, 0, &decision).held_for(six),
        ];
        let merged = Merged::settles(&settles, |s| s.key).expect("merged");
        assert_eq!((merged.items[0].reserved, merged.items[0].actual), (10, 1));
        // One of unknown age: the whole difference.
        let settles = [settles[0], Settle::new(b"k", &bucket, 5, 0, &decision)];
        let merged = Merged::settles(&settles, |s| s.key).expect("merged");
        assert_eq!(merged.items[0].actual, 0);

        let extreme = Decision::allow(u64::MAX, 0, u64::MAX);
        for policy in [
            Policy::fixed_window(1 << 40, Duration::from_secs(1 << 20)).unwrap(),
            Policy::sliding_window_log(1 << 40, Duration::from_secs(1 << 20)).unwrap(),
            Policy::sliding_window_counter(1 << 20, Duration::from_secs(3_600)).unwrap(),
            Policy::token_bucket(1 << 20, Rate::new(1, Duration::from_secs(1 << 10))).unwrap(),
            Policy::gcra(1 << 40, Rate::per_second(1_000_000)).unwrap(),
            Policy::calendar(1 << 40, Period::Year.utc_offset(-86_399)).unwrap(),
        ] {
            for held in [Duration::ZERO, Duration::from_secs(1), Duration::MAX] {
                for (reserved, actual) in [(u64::MAX, 0), (u64::MAX, u64::MAX - 1), (1, 0)] {
                    let settles = [
                        Settle::new(b"k", &policy, reserved, actual, &extreme).held_for(held),
                        Settle::new(b"k", &policy, reserved, actual, &extreme).held_for(held),
                    ];
                    let merged = Merged::settles(&settles, |s| s.key).expect("merged");
                    let part = &merged.items[0];
                    assert!(part.actual <= part.reserved, "{}", policy.name());
                }
            }
        }
    }

    #[test]
    fn duplicates_merge_and_concurrency_or_conflicts_are_refused() {
        let a = Policy::fixed_window(10, Duration::from_secs(1))
            .unwrap()
            .with_name("a")
            .unwrap();
        let other_a = Policy::fixed_window(20, Duration::from_secs(1))
            .unwrap()
            .with_name("a")
            .unwrap();
        let allowed = Decision::allow(10, 5, 1);
        let denied = Decision::deny(10, 0, 1, 1);
        let settles = [
            Settle::new(b"k", &a, 3, 5, &allowed),
            Settle::new(b"j", &a, 1, 0, &allowed),
            Settle::new(b"k", &a, 2, 1, &allowed),
            Settle::new(b"k", &a, 4, 4, &denied),
        ];
        let merged = Merged::settles(&settles, |s| (s.key, s.policy.name())).expect("merged");
        assert_eq!(merged.of, [0, 1, 0, 0]);
        // A denied reservation consumed nothing.
        assert_eq!((merged.items[0].reserved, merged.items[0].actual), (5, 10));
        let conflict = [
            Settle::new(b"k", &a, 1, 1, &allowed),
            Settle::new(b"k", &other_a, 1, 1, &allowed),
        ];
        assert!(matches!(
            Merged::settles(&conflict, |s| (s.key, s.policy.name())),
            Err(StoreError::PolicyConflict { .. })
        ));
        let semaphore = Policy::concurrency(2, Duration::from_secs(1)).unwrap();
        let refused = [Settle::new(b"k", &semaphore, 1, 2, &allowed)];
        assert!(matches!(
            Merged::settles(&refused, |s| (s.key, s.policy.name())),
            Err(StoreError::Unsupported {
                operation: "settle",
                ..
            })
        ));
    }

    /// Settlements with several mistakes are refused for the first one met
    /// in their order: a concurrency policy or a conflict, whichever comes
    /// first.
    #[test]
    fn the_first_mistake_in_the_order_of_the_settlements_refuses_them() {
        let named = |limit, name| {
            Policy::fixed_window(limit, Duration::from_secs(1))
                .and_then(|p| p.with_name(name))
                .expect("valid")
        };
        let (a, other_a) = (named(10, "a"), named(20, "a"));
        let semaphore = Policy::concurrency(2, Duration::from_secs(1))
            .and_then(|p| p.with_name("sem"))
            .expect("valid");
        let allowed = Decision::allow(10, 5, 1);
        let [c0, c1] = [
            Settle::new(b"k", &a, 1, 1, &allowed),
            Settle::new(b"k", &other_a, 1, 1, &allowed),
        ];
        let sem = Settle::new(b"k", &semaphore, 1, 1, &allowed);
        let refused = |settles: &[Settle<'_>]| {
            Merged::settles(settles, |s| (s.key, s.policy.name()))
                .err()
                .expect("refused")
        };
        assert!(matches!(
            refused(&[c0, c1, sem]),
            StoreError::PolicyConflict { policy } if policy == "a"
        ));
        assert!(matches!(
            refused(&[c0, sem, c1]),
            StoreError::Unsupported {
                operation: "settle",
                ..
            }
        ));
    }
}
