//! Settlements ([`Store::settle`](crate::Store::settle)): a request that
//! reserved an estimate before it ran pays what it really cost once it knows.

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::pin::Pin;

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
        }
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

impl fmt::Debug for SettlementId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SettlementId({:032x})", self.0)
    }
}

impl fmt::Display for SettlementId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// One limit to settle, merged: what it consumed, what it cost.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Part<'a> {
    pub(crate) key: &'a [u8],
    pub(crate) policy: &'a Policy,
    pub(crate) reserved: u64,
    pub(crate) actual: u64,
}

/// The settlements of one call with each key and policy once: two of one
/// key under one policy are one settlement of their summed reservations and
/// costs, and both get its decision (as [`Merged`](crate::store::Merged)
/// does for checks). Every store settles this way.
pub(crate) struct MergedSettles<'a> {
    /// One part per key and policy, in the order of their first appearance.
    pub(crate) parts: Vec<Part<'a>>,
    /// For each settlement asked for, the index of its part.
    pub(crate) of: Vec<usize>,
}

impl<'a> MergedSettles<'a> {
    /// Merges the settlements whose `identity` (the state they share) is
    /// equal. A policy without settlements (concurrency) is
    /// [`StoreError::Unsupported`], and two policies under one name with
    /// other parameters are [`StoreError::PolicyConflict`], before anything
    /// is settled.
    pub(crate) fn new<K: PartialEq>(
        settles: &[Settle<'a>],
        identity: impl Fn(&Settle<'a>) -> K,
    ) -> Result<Self, StoreError> {
        let mut merged: Vec<(K, Part<'a>)> = Vec::with_capacity(settles.len());
        let mut of = Vec::with_capacity(settles.len());
        for settle in settles {
            refuse_unsupported(settle.policy)?;
            let id = identity(settle);
            match merged.iter().position(|(other, _)| *other == id) {
                Some(i) => {
                    let first = &mut merged[i].1;
                    if first.policy != settle.policy {
                        return Err(StoreError::PolicyConflict {
                            policy: settle.policy.name().to_owned(),
                        });
                    }
                    first.reserved = first.reserved.saturating_add(settle.consumed());
                    first.actual = first.actual.saturating_add(settle.actual);
                    of.push(i);
                }
                None => {
                    of.push(merged.len());
                    let part = Part {
                        key: settle.key,
                        policy: settle.policy,
                        reserved: settle.consumed(),
                        actual: settle.actual,
                    };
                    merged.push((id, part));
                }
            }
        }
        Ok(MergedSettles {
            parts: merged.into_iter().map(|(_, p)| p).collect(),
            of,
        })
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
    StoreError::Unsupported {
        policy: policy.name().to_owned(),
        algorithm: policy.algorithm().kind(),
        operation: "settle",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn ids_are_fresh_and_print_as_32_hex_digits() {
        let ids: std::collections::HashSet<SettlementId> =
            (0..1_000).map(|_| SettlementId::random()).collect();
        assert_eq!(ids.len(), 1_000);
        assert_eq!(SettlementId(0xab).to_string(), format!("{:0>32}", "ab"));
        assert_eq!(SettlementId(u128::MAX).to_string().len(), 32);
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
        let merged = MergedSettles::new(&settles, |s| (s.key, s.policy.name())).expect("merged");
        assert_eq!(merged.of, [0, 1, 0, 0]);
        // A denied reservation consumed nothing.
        assert_eq!((merged.parts[0].reserved, merged.parts[0].actual), (5, 10));
        let conflict = [
            Settle::new(b"k", &a, 1, 1, &allowed),
            Settle::new(b"k", &other_a, 1, 1, &allowed),
        ];
        assert!(matches!(
            MergedSettles::new(&conflict, |s| (s.key, s.policy.name())),
            Err(StoreError::PolicyConflict { .. })
        ));
        let semaphore = Policy::concurrency(2, Duration::from_secs(1)).unwrap();
        let refused = [Settle::new(b"k", &semaphore, 1, 2, &allowed)];
        assert!(matches!(
            MergedSettles::new(&refused, |s| (s.key, s.policy.name())),
            Err(StoreError::Unsupported {
                operation: "settle",
                ..
            })
        ));
    }
}
