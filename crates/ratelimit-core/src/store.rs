//! The [`Store`] trait: where decisions are made and state is kept.

use std::future::Future;
use std::sync::Arc;

use crate::settle::{Settle, SettleFuture, SettlementId};
use crate::{Decision, PermitId, Policy, StoreError};

/// The boxed future of the stores whose calls are `async` blocks.
pub(crate) type BoxFuture<T> =
    std::pin::Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send>>;

/// `call`, then `then` once it answered, whatever it answered: what a
/// wrapping store does after the inner store's call (drop what it cached of
/// the key).
pub(crate) fn answered_then<T: Send + 'static>(
    call: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    then: impl FnOnce() + Send + 'static,
) -> BoxFuture<T> {
    Box::pin(async move {
        let result = call.await;
        then();
        result
    })
}

/// What a wrapping store keeps locally of keys (denials it cached, budget
/// it leased), which an operation on a key through the wrapper can make
/// stale.
pub(crate) trait LocalState {
    /// Drops the local state of `key` (normalized) under the policy named
    /// `policy`, whatever the policy's parameters (they share the key's
    /// state).
    fn forget(&self, policy: &str, key: &[u8]);
}

/// `call`, an operation on `key` under `policy`, then `state`'s
/// [`forget`](LocalState::forget) of the key once it answered, whatever it
/// answered.
pub(crate) fn forgetting<L, T>(
    state: &Arc<L>,
    key: &[u8],
    policy: &Policy,
    call: impl Future<Output = Result<T, StoreError>> + Send + 'static,
) -> BoxFuture<T>
where
    L: LocalState + Send + Sync + 'static,
    T: Send + 'static,
{
    let state = Arc::clone(state);
    let (policy, key) = name_and_key(policy, key);
    answered_then(call, move || state.forget(&policy, &key))
}

/// The policy's name and the normalized key, owned: what a wrapper
/// forgets once a call has answered.
pub(crate) fn name_and_key(policy: &Policy, key: &[u8]) -> (String, Vec<u8>) {
    (
        policy.name().to_owned(),
        crate::key::normalize(key).into_owned(),
    )
}

/// The future returned by [`Store::refund`].
pub type RefundFuture = std::pin::Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;

/// One limit to check as part of [`Store::check_all`].
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Check<'a> {
    /// The user key (an IP address, an API key, ...).
    pub key: &'a [u8],
    /// The policy to check it against.
    pub policy: &'a Policy,
    /// What the request costs under this policy.
    pub cost: u64,
}

impl<'a> Check<'a> {
    /// A check of `key` against `policy` at `cost`.
    pub fn new(key: &'a [u8], policy: &'a Policy, cost: u64) -> Self {
        Check { key, policy, cost }
    }
}

/// A place where rate-limit state lives and decisions are made atomically.
///
/// Implemented by [`MemoryStore`](crate::MemoryStore) (in process) and, with the
/// `redis` feature, by the Redis store. Futures are `'static` so services can
/// hold them across `await` points without borrowing the store.
///
/// Every implementation follows the semantics of [`Decision`]: denied requests
/// consume nothing, cost 0 peeks, a cost above [`Policy::max_cost`] is
/// [`StoreError::CostExceedsLimit`]. Stores with an admin API
/// ([`AdminStore`](crate::AdminStore)) also deny every check of a blocked key.
///
/// # Costs known after the response
///
/// A request whose cost is known only once it ran (tokens generated, bytes
/// sent) is decided in two phases: it **reserves** an estimate with
/// [`check`](Store::check) or [`check_all`](Store::check_all) (denied, and
/// nothing consumed, when the estimate does not fit), runs, then
/// [**settles**](Store::settle) every limit to its actual cost at once. A
/// cost above the estimate is charged even past the limit (a debt that
/// later requests wait out); one below gives the difference back. A
/// request that ends up costing its estimate needs no settlement at all.
pub trait Store: Send + Sync + 'static {
    /// The future returned by [`check`](Store::check).
    type CheckFuture: Future<Output = Result<Decision, StoreError>> + Send + 'static;
    /// The future returned by [`check_all`](Store::check_all).
    type CheckAllFuture: Future<Output = Result<Vec<Decision>, StoreError>> + Send + 'static;
    /// The future returned by [`release`](Store::release).
    type ReleaseFuture: Future<Output = Result<(), StoreError>> + Send + 'static;
    /// The future returned by [`renew`](Store::renew).
    type RenewFuture: Future<Output = Result<bool, StoreError>> + Send + 'static;

    /// Decides one request of `cost` for `key` under `policy`, and consumes the
    /// cost when allowed.
    fn check(&self, key: &[u8], policy: &Policy, cost: u64) -> Self::CheckFuture;

    /// Decides `check` as [`check`](Store::check) does when the store can
    /// decide without waiting (in memory), so a caller on a hot path needs
    /// no future; `None` when it cannot (the default), having consumed
    /// nothing: then ask [`check`](Store::check).
    fn check_at_once(&self, check: Check<'_>) -> Option<Result<Decision, StoreError>> {
        let _ = check;
        None
    }

    /// Decides several limits for one request, all or nothing: the request is
    /// allowed when every decision allows it, and then every cost is consumed;
    /// otherwise nothing is consumed, and the decisions that would have allowed
    /// report the current state as a peek would.
    ///
    /// Decisions come back in the order of `checks`.
    fn check_all(&self, checks: &[Check<'_>]) -> Self::CheckAllFuture;

    /// Releases a concurrency permit taken by an earlier decision. Releasing a
    /// permit that already expired or was released is not an error.
    fn release(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::ReleaseFuture;

    /// Gives back the `cost` units that `decision`, an allowed decision for
    /// `key` under `policy`, consumed, for a caller that refuses the request
    /// after all (the Tower layer in wait mode, when a leaky bucket's slot
    /// lies beyond the wait it allows, or when the waiting request is
    /// dropped). A store combinator reads the decision's
    /// [`source`](Decision::source) to refund the store that decided.
    ///
    /// Both stores give back as an admin
    /// [`reward`](crate::AdminStore::reward) does: never beyond a full
    /// budget; a leaky bucket or GCRA slot is given back by moving the next
    /// free slot one cost earlier. A sliding log gives back its oldest units
    /// (a reward, its newest): the refund cannot tell its own from a later
    /// request's, and giving back a later request's newer units would let
    /// the log admit past its limit once the refunded, older ones left. A concurrency permit is not refunded but
    /// [released](Store::release): this is a no-op for concurrency policies.
    /// The refund is best effort: a refund after the consumption's window
    /// ended, or one that another request's consumption overtook, may give
    /// back units of a later request, so a caller refunds at once. One call
    /// gives back once, however often the store sends it (a store that sends
    /// it again after its connection broke makes the resend change nothing);
    /// two calls give back twice.
    ///
    /// The default gives nothing back and answers
    /// [`StoreError::Unsupported`]: the consumption stays, which errs
    /// towards denying.
    fn refund(&self, key: &[u8], policy: &Policy, cost: u64, decision: &Decision) -> RefundFuture {
        let _ = (key, cost, decision);
        Box::pin(std::future::ready(Err(StoreError::unsupported(
            policy, "refund",
        ))))
    }

    /// Settles reservations to what their request really cost: for each
    /// limit, a reservation that consumed [`reserved`](Settle::reserved)
    /// units (with [`check`](Store::check) or [`check_all`](Store::check_all))
    /// is brought to [`actual`](Settle::actual), all limits at once. Answers,
    /// in the order of `settles`, what a peek of each limit reports
    /// afterwards (for the response's rate-limit headers).
    ///
    /// Per limit (the same transitions on every store):
    ///
    /// - `actual > reserved` charges the difference even past the limit,
    ///   into a **debt** of at most one more full budget (as an admin
    ///   [`penalize`](crate::AdminStore::penalize) does): a token bucket goes
    ///   below empty and a GCRA or leaky bucket's next free slot moves
    ///   later, so later requests wait until the refill has paid it; a fixed
    ///   window, a sliding window counter and a sliding log count over the
    ///   limit (up to twice it), so the key is denied until those units
    ///   leave the window. A key in debt is denied even to a peek.
    /// - `actual < reserved` gives the difference back as
    ///   [`refund`](Store::refund) does, never beyond a full budget. A
    ///   settlement that says how long its reservation was held
    ///   ([`Settle::held_for`], as the Tower layer's and `Limiter::reserve`'s
    ///   do) gives back only the units the reservation still holds: none
    ///   once the window it was counted in ended, fewer once the refill
    ///   could have paid them back (see [`Settle`]). Without it the whole
    ///   difference comes back, which may be units of later requests once
    ///   the reservation's window ended.
    /// - `actual == reserved` changes nothing.
    ///
    /// **All or nothing**: every limit is settled, or none is (a policy
    /// conflict on one key fails the whole call before anything changes).
    /// Concurrency policies have no settlement: a call that names one is
    /// [`StoreError::Unsupported`] and settles nothing (check
    /// [`Policy::supports_settlement`] when a layer is built). Two
    /// settlements of one key under one policy are one of their summed
    /// reservations and costs.
    ///
    /// **Counted once**: a store remembers `id` beside each state it
    /// settled, so the same settlement sent again (by the store after a
    /// broken connection, or by a caller retrying a call that failed)
    /// changes nothing more. The memory is bounded: `RedisStore` keeps the
    /// newest 128 ids of each key (settlements, refunds and admin
    /// adjustments) for as long as its state lives, `MemoryStore` the newest
    /// 256 settlements of each shard. A settlement sent again after as many
    /// others reached its key (or shard) is applied again, so send it again
    /// at once or not at all. Draw one id per reservation
    /// ([`SettlementId::random`]).
    ///
    /// The default settles nothing and answers [`StoreError::Unsupported`]:
    /// the reservations stay as they were consumed.
    fn settle(&self, id: SettlementId, settles: &[Settle<'_>]) -> SettleFuture {
        let _ = id;
        let error = match settles.first() {
            Some(first) => crate::settle::unsupported(first.policy),
            None => return Box::pin(std::future::ready(Ok(Vec::new()))),
        };
        Box::pin(std::future::ready(Err(error)))
    }

    /// Whether [`settle`](Store::settle) settles reservations under
    /// `policy`. The default, with the default `settle`, is `false`; a
    /// store that settles says so (both stores and the combinators over
    /// them do, for every policy but concurrency). A reservation a store
    /// could never settle would run whatever it really costs at its
    /// estimate, so the Tower layer and `Limiter::reserve` refuse it.
    fn supports_settlement(&self, policy: &Policy) -> bool {
        let _ = policy;
        false
    }

    /// Renews the lease of a concurrency permit taken by an earlier decision
    /// and still held: the permit `permit`, and only it, then expires a whole
    /// lease of `policy` from now (never sooner than it would have).
    ///
    /// Answers whether the permit was still held. A permit that was released
    /// or whose lease ended is gone for good: its renewal answers `false`
    /// and takes nothing, so a renewal never brings a permit back over the
    /// max (its units may be someone else's by then). A policy that is not a
    /// concurrency limit holds no permit: `false`.
    ///
    /// A holder renews every fraction of a lease while it lives (the Tower
    /// layer's permit guard does), so a permit lasts as long as its holder,
    /// and a holder that dies stops renewing and frees its units one lease
    /// later at most.
    fn renew(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::RenewFuture;
}

impl<S: Store> Store for Arc<S> {
    type CheckFuture = S::CheckFuture;
    type CheckAllFuture = S::CheckAllFuture;
    type ReleaseFuture = S::ReleaseFuture;
    type RenewFuture = S::RenewFuture;

    fn check(&self, key: &[u8], policy: &Policy, cost: u64) -> Self::CheckFuture {
        (**self).check(key, policy, cost)
    }

    fn check_at_once(&self, check: Check<'_>) -> Option<Result<Decision, StoreError>> {
        (**self).check_at_once(check)
    }

    fn check_all(&self, checks: &[Check<'_>]) -> Self::CheckAllFuture {
        (**self).check_all(checks)
    }

    fn release(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::ReleaseFuture {
        (**self).release(key, policy, permit)
    }

    fn refund(&self, key: &[u8], policy: &Policy, cost: u64, decision: &Decision) -> RefundFuture {
        (**self).refund(key, policy, cost, decision)
    }

    fn settle(&self, id: SettlementId, settles: &[Settle<'_>]) -> SettleFuture {
        (**self).settle(id, settles)
    }

    fn supports_settlement(&self, policy: &Policy) -> bool {
        (**self).supports_settlement(policy)
    }

    fn renew(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::RenewFuture {
        (**self).renew(key, policy, permit)
    }
}

/// Whether every decision allows the request.
pub(crate) fn all_allowed(decisions: &[Decision]) -> bool {
    decisions.iter().all(Decision::is_allowed)
}

/// The checks, or the settlements, of one request with each key and policy
/// once: two of the same key under the same policy are merged into one,
/// and both get its decision. Every store decides and settles duplicates
/// this way (see [`checks`](Merged::checks) and [`settles`](Merged::settles)).
pub(crate) struct Merged<T> {
    /// One merged item per key and policy, in the order of their first
    /// appearance.
    pub(crate) items: Vec<T>,
    /// For each item asked for, the index of its merged item.
    pub(crate) of: Vec<usize>,
}

impl<T> Merged<T> {
    /// Merges the `items` whose `identity` (the state they share) is equal,
    /// each first passed by `admit`: `open` makes the merged item of an
    /// identity first seen, and `join` adds an item to the merged one of its
    /// identity. The first error, in the order of the items, refuses them
    /// all.
    pub(crate) fn by<I, K: PartialEq>(
        items: &[I],
        admit: impl Fn(&I) -> Result<(), StoreError>,
        identity: impl Fn(&I) -> K,
        mut open: impl FnMut(&I) -> T,
        mut join: impl FnMut(&mut T, &I) -> Result<(), StoreError>,
    ) -> Result<Self, StoreError> {
        let mut merged: Vec<(K, T)> = Vec::with_capacity(items.len());
        let mut of = Vec::with_capacity(items.len());
        for item in items {
            admit(item)?;
            let id = identity(item);
            match merged.iter().position(|(other, _)| *other == id) {
                Some(i) => {
                    join(&mut merged[i].1, item)?;
                    of.push(i);
                }
                None => {
                    of.push(merged.len());
                    merged.push((id, open(item)));
                }
            }
        }
        let items = merged.into_iter().map(|(_, item)| item).collect();
        Ok(Merged { items, of })
    }

    /// Whether every item was distinct.
    pub(crate) fn is_distinct(&self) -> bool {
        self.items.len() == self.of.len()
    }
}

impl<'a> Merged<Check<'a>> {
    /// Merges the checks whose `identity` (the state they share) is equal
    /// into one check of their summed cost (and one permit for the sum,
    /// which each may release, harmlessly twice): two rules of overlapping
    /// routes. Two policies under one name with other parameters in one
    /// request are [`StoreError::PolicyConflict`]; a sum above what the
    /// policy admits is [`StoreError::CostExceedsLimit`].
    pub(crate) fn checks<K: PartialEq>(
        checks: &[Check<'a>],
        identity: impl Fn(&Check<'a>) -> K,
    ) -> Result<Self, StoreError> {
        let cost = |check: &Check<'a>| check.policy.check_cost(check.cost);
        let join = |first: &mut Check<'a>, check: &Check<'a>| {
            same_policy(first.policy, check.policy)?;
            first.cost = first.cost.saturating_add(check.cost);
            Ok(())
        };
        let merged = Merged::by(checks, cost, identity, |check| *check, join)?;
        for check in &merged.items {
            check.policy.check_cost(check.cost)?;
        }
        Ok(merged)
    }
}

/// Refuses two policies under one name with other parameters in one
/// request: [`StoreError::PolicyConflict`].
pub(crate) fn same_policy(first: &Policy, other: &Policy) -> Result<(), StoreError> {
    if first == other {
        Ok(())
    } else {
        Err(StoreError::PolicyConflict {
            policy: other.name().to_owned(),
        })
    }
}

/// The decisions of merged checks, one per check asked for (see [`Merged`]).
pub(crate) fn spread(of: &[usize], decisions: &[Decision]) -> Result<Vec<Decision>, StoreError> {
    of.iter()
        .map(|&i| {
            decisions
                .get(i)
                .cloned()
                .ok_or_else(|| StoreError::Backend("fewer decisions than merged checks".into()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{AdminStore, MemoryStore};

    fn fixed(name: &str, limit: u64) -> Policy {
        Policy::fixed_window(limit, Duration::from_secs(60))
            .and_then(|p| p.with_name(name))
            .expect("valid")
    }

    /// The checks of a request merged by key and policy name.
    fn merged<'a>(checks: &[Check<'a>]) -> Result<Merged<Check<'a>>, StoreError> {
        Merged::checks(checks, |c| (c.key, c.policy.name()))
    }

    #[test]
    fn duplicates_merge_into_their_first_appearance() {
        let (p, q) = (fixed("p", 10), fixed("q", 10));
        let checks = [
            Check::new(b"a", &p, 1),
            Check::new(b"b", &p, 2),
            Check::new(b"a", &q, 0),
            Check::new(b"a", &p, 3),
            Check::new(b"a", &q, 4),
            Check::new(b"b", &p, 0),
        ];
        let merged = merged(&checks).expect("merged");
        assert_eq!(merged.of, [0, 1, 2, 0, 2, 1]);
        let items: Vec<_> = merged
            .items
            .iter()
            .map(|c| (c.key, c.policy.name(), c.cost))
            .collect();
        assert_eq!(
            items,
            [
                (&b"a"[..], "p", 4),
                (&b"b"[..], "p", 2),
                (&b"a"[..], "q", 4)
            ]
        );
        assert!(!merged.is_distinct());
        let distinct = [Check::new(b"a", &p, 1), Check::new(b"b", &p, 1)];
        assert!(self::merged(&distinct).expect("merged").is_distinct());
    }

    /// A request with several mistakes is refused for the first one met in
    /// the order of its checks; a sum too large is met only once every
    /// check passed on its own, and then in the order the keys first came.
    #[test]
    fn the_first_mistake_in_the_order_of_the_checks_refuses_the_request() {
        let (small, other) = (fixed("small", 2), fixed("other", 3));
        let (a, b) = (fixed("shared", 5), fixed("shared", 7));
        let over = Check::new(b"x", &small, 3);
        let [c0, c1] = [Check::new(b"k", &a, 1), Check::new(b"k", &b, 1)];
        let [s0, s1] = [Check::new(b"x", &small, 2), Check::new(b"x", &small, 1)];
        let cost = |e: &StoreError| match e {
            StoreError::CostExceedsLimit { policy, cost, max } => {
                Some((policy.clone(), *cost, *max))
            }
            _ => None,
        };
        let conflict = |e: &StoreError| matches!(e, StoreError::PolicyConflict { policy } if policy == "shared");
        let refused = |checks: &[Check<'_>]| merged(checks).err().expect("refused");

        assert_eq!(
            cost(&refused(&[over, c0, c1])),
            Some(("small".into(), 3, 2))
        );
        assert!(conflict(&refused(&[c0, c1, over])));
        assert!(conflict(&refused(&[s0, s1, c0, c1])));
        let alone = Check::new(b"y", &other, 4);
        assert_eq!(
            cost(&refused(&[s0, s1, alone])),
            Some(("other".into(), 4, 3))
        );
        let [o0, o1] = [Check::new(b"y", &other, 2), Check::new(b"y", &other, 2)];
        assert_eq!(
            cost(&refused(&[o0, s0, s1, o1])),
            Some(("other".into(), 4, 3))
        );
        assert_eq!(
            cost(&refused(&[s0, o0, o1, s1])),
            Some(("small".into(), 3, 2))
        );
    }

    /// Each of those requests, refused by a memory store, leaves every
    /// limit it named as it was, with another limit that would admit.
    #[test]
    fn a_request_refused_for_its_duplicates_consumes_nothing() {
        let store = MemoryStore::new();
        let (small, bystander) = (fixed("small", 2), fixed("bystander", 5));
        let (a, b) = (fixed("shared", 5), fixed("shared", 7));
        let by = Check::new(b"y", &bystander, 1);
        let requests = [
            vec![by, Check::new(b"x", &small, 2), Check::new(b"x", &small, 1)],
            vec![by, Check::new(b"k", &a, 1), Check::new(b"k", &b, 1)],
            vec![
                by,
                Check::new(b"x", &small, 1),
                Check::new(b"k", &a, 1),
                Check::new(b"x", &small, 1),
                Check::new(b"k", &b, 1),
            ],
        ];
        for checks in &requests {
            let error = store.check_all_now(checks).expect_err("refused");
            assert!(
                matches!(
                    error,
                    StoreError::CostExceedsLimit { .. } | StoreError::PolicyConflict { .. }
                ),
                "{error:?}"
            );
        }
        for (key, policy) in [(&b"y"[..], &bystander), (b"x", &small), (b"k", &a)] {
            let left = store
                .peek(key, policy)
                .into_inner()
                .expect("peek")
                .remaining();
            assert_eq!(left, policy.limit(), "{}", policy.name());
        }
    }
}
