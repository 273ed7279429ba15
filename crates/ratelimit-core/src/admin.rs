//! [`AdminStore`]: what operators do to one key, beside deciding requests.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::MAX_HORIZON_MICROS;
use crate::policy::{Algorithm, State};
use crate::store::Store;
use crate::{Decision, PermitId, Policy, StoreError};

/// Operator actions on one key under one policy: look at it, forget it,
/// penalise it, reward it, block it.
///
/// Implemented by [`MemoryStore`](crate::MemoryStore), the Redis store (with
/// the `redis` feature), and forwarded by [`DeniedCache`](crate::DeniedCache),
/// [`FallbackStore`](crate::FallbackStore), `LeasedStore` (with the `lease`
/// feature, dropping its lease of the key) and `Arc<S>`. Both stores share
/// the semantics below, since the transitions are the pure functions of
/// [`algorithm`](crate::algorithm).
///
/// - [`peek`](AdminStore::peek): the decision a request of cost 0 gets now;
///   consumes nothing.
/// - [`reset`](AdminStore::reset): forgets the key's state and any block: a
///   full budget again. For a concurrency policy this drops every permit held
///   (releasing them later is a no-op).
/// - [`penalize`](AdminStore::penalize): consumes `amount` units even past
///   empty, into a debt of at most one more full budget, so the key is
///   denied at most about one window longer than if it had emptied its
///   budget (a penalty larger than that is capped). Per algorithm:
///   - fixed window: the window's count rises by `amount`, to at most
///     `2 × limit`; denied until the window ends at most, nothing carries
///     over into the next window;
///   - sliding window counter: the current window's count rises, to at most
///     `2 × limit`, and weighs in the next window as its previous count;
///   - sliding window log: `amount` units are logged now, as if admitted (the
///     log holds at most `2 × limit`); they leave one window later;
///   - token bucket: the bucket goes below empty, to at most one full bucket
///     of debt, which the refill pays back before any token is earned;
///   - GCRA and leaky bucket: the TAT (next free slot) moves `amount`
///     intervals later, to at most two full bursts ahead of now;
///   - concurrency: not supported, [`StoreError::Unsupported`].
///
///   A key in debt is over its limit: even a peek (cost 0) reports it denied,
///   with the time until the debt is paid as `retry_after`.
/// - [`reward`](AdminStore::reward): gives back `amount` units, never beyond
///   a full budget: the count drops (the sliding window counter takes from
///   the current window first, then the previous one), the log loses its most
///   recent units, the bucket refills (a debt first), the TAT moves earlier.
///   Concurrency: [`StoreError::Unsupported`].
/// - [`block`](AdminStore::block): until `duration` from now, every check of
///   the key under the policy ([`Store::check`], and [`Store::check_all`]
///   where one blocked key denies the whole request) is denied and consumes
///   nothing, peeks included. A denial reports nothing remaining and a
///   `retry_after` of the time left in the block, or longer when the
///   algorithm itself would still deny the request then. Blocking again
///   replaces the block's end (it may shorten it); a zero duration unblocks.
///   Durations are capped at about 35 years
///   ([`MAX_HORIZON_MICROS`](crate::algorithm::MAX_HORIZON_MICROS)). The
///   algorithm's state keeps refilling during the block.
/// - [`unblock`](AdminStore::unblock): ends a block at once.
///
/// Penalties and rewards return what a peek reports afterwards (blocked
/// keys included). The time is the store's clock, as for decisions (the
/// Redis server's `TIME`).
///
/// # Example
///
/// ```
/// use ratelimit_core::{AdminStore, MemoryStore, Policy, Rate, Store};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let policy = Policy::gcra(10, Rate::per_hour(10))?.with_name("api")?;
///
/// store.check(b"tenant-7", &policy, 4).await?;
/// assert_eq!(store.peek(b"tenant-7", &policy).await?.remaining(), 6);
/// assert_eq!(store.peek(b"tenant-7", &policy).await?.remaining(), 6);
///
/// // Abuse: take 6 more, then give 2 back.
/// assert_eq!(store.penalize(b"tenant-7", &policy, 6).await?.remaining(), 0);
/// assert_eq!(store.reward(b"tenant-7", &policy, 2).await?.remaining(), 2);
///
/// // Blocked for an hour: denied, whatever the budget says.
/// store.block(b"tenant-7", &policy, Duration::from_secs(3600)).await?;
/// let denied = store.check(b"tenant-7", &policy, 1).await?;
/// assert!(!denied.is_allowed());
/// assert!(denied.retry_after() > Some(Duration::from_secs(3590)));
///
/// store.unblock(b"tenant-7", &policy).await?;
/// assert!(store.check(b"tenant-7", &policy, 1).await?.is_allowed());
///
/// // Forgotten: a full budget again.
/// store.reset(b"tenant-7", &policy).await?;
/// assert_eq!(store.peek(b"tenant-7", &policy).await?.remaining(), 10);
/// # Ok(())
/// # }
/// ```
pub trait AdminStore: Store {
    /// The future returned by [`peek`](AdminStore::peek),
    /// [`penalize`](AdminStore::penalize) and [`reward`](AdminStore::reward).
    type DecisionFuture: Future<Output = Result<Decision, StoreError>> + Send + 'static;
    /// The future returned by [`reset`](AdminStore::reset),
    /// [`block`](AdminStore::block) and [`unblock`](AdminStore::unblock).
    type UpdateFuture: Future<Output = Result<(), StoreError>> + Send + 'static;

    /// The current state of `key` under `policy`, as a request of cost 0
    /// sees it (denied while blocked or in debt). Consumes nothing.
    fn peek(&self, key: &[u8], policy: &Policy) -> Self::DecisionFuture;

    /// Forgets the state of `key` under `policy` and any block: a full
    /// budget again.
    fn reset(&self, key: &[u8], policy: &Policy) -> Self::UpdateFuture;

    /// Consumes `amount` units even past empty, into a debt of at most one
    /// more full budget; returns what a peek reports afterwards. Concurrency
    /// policies: [`StoreError::Unsupported`].
    fn penalize(&self, key: &[u8], policy: &Policy, amount: u64) -> Self::DecisionFuture;

    /// Gives back `amount` units, never beyond a full budget; returns what a
    /// peek reports afterwards. Concurrency policies:
    /// [`StoreError::Unsupported`].
    fn reward(&self, key: &[u8], policy: &Policy, amount: u64) -> Self::DecisionFuture;

    /// Denies every check of `key` under `policy` until `duration` from now,
    /// consuming nothing. Replaces an earlier block; a zero duration unblocks.
    fn block(&self, key: &[u8], policy: &Policy, duration: Duration) -> Self::UpdateFuture;

    /// Ends a block of `key` under `policy` (nothing happens when there is none).
    fn unblock(&self, key: &[u8], policy: &Policy) -> Self::UpdateFuture;
}

impl<S: AdminStore> AdminStore for Arc<S> {
    type DecisionFuture = S::DecisionFuture;
    type UpdateFuture = S::UpdateFuture;

    fn peek(&self, key: &[u8], policy: &Policy) -> Self::DecisionFuture {
        (**self).peek(key, policy)
    }

    fn reset(&self, key: &[u8], policy: &Policy) -> Self::UpdateFuture {
        (**self).reset(key, policy)
    }

    fn penalize(&self, key: &[u8], policy: &Policy, amount: u64) -> Self::DecisionFuture {
        (**self).penalize(key, policy, amount)
    }

    fn reward(&self, key: &[u8], policy: &Policy, amount: u64) -> Self::DecisionFuture {
        (**self).reward(key, policy, amount)
    }

    fn block(&self, key: &[u8], policy: &Policy, duration: Duration) -> Self::UpdateFuture {
        (**self).block(key, policy, duration)
    }

    fn unblock(&self, key: &[u8], policy: &Policy) -> Self::UpdateFuture {
        (**self).unblock(key, policy)
    }
}

/// Which adjustment: a penalty, a reward, or the refund of a request
/// refused after it was admitted ([`Store::refund`](crate::Store::refund)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Adjustment {
    Penalize,
    Reward,
    Refund,
}

impl Adjustment {
    /// The operation's name, as in [`StoreError::Unsupported`] and the Redis script.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Adjustment::Penalize => "penalize",
            Adjustment::Reward => "reward",
            Adjustment::Refund => "refund",
        }
    }

    /// Applies the adjustment to `state`; see [`Algorithm::penalize`].
    pub(crate) fn apply(
        self,
        algorithm: &Algorithm,
        state: &mut State,
        now: u64,
        amount: u64,
    ) -> Option<Decision> {
        match self {
            Adjustment::Penalize => algorithm.penalize(state, now, amount),
            Adjustment::Reward => algorithm.reward(state, now, amount),
            Adjustment::Refund => algorithm.refund(state, now, amount),
        }
    }

    /// The error for a policy whose algorithm has no adjustments.
    pub(crate) fn check(self, policy: &Policy) -> Result<(), StoreError> {
        if policy.algorithm().supports_adjustments() {
            Ok(())
        } else {
            Err(StoreError::unsupported(policy, self.name()))
        }
    }
}

/// A block's duration in whole microseconds, capped at [`MAX_HORIZON_MICROS`].
pub(crate) fn block_micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros())
        .unwrap_or(u64::MAX)
        .min(MAX_HORIZON_MICROS)
}

/// The decision for a blocked key, `left` µs before the block ends:
/// denied, nothing remaining, full again when both the block and the state
/// allow (`peek`: the algorithm's decision at cost 0), and retried when both
/// the block and the algorithm allow the request (`request`: the algorithm's
/// decision for it, which is not applied).
pub(crate) fn blocked(request: &Decision, peek: &Decision, left: u64) -> Decision {
    let retry = if request.is_allowed() {
        left
    } else {
        left.max(request.retry_after_micros())
    };
    Decision::deny(
        request.limit(),
        0,
        peek.reset_after_micros().max(left),
        retry,
    )
}

/// [`blocked`] for a request of `cost` on `state` (left unchanged). `None`
/// when the state belongs to another algorithm.
pub(crate) fn blocked_decision(
    algorithm: &Algorithm,
    state: &State,
    now: u64,
    cost: u64,
    left: u64,
) -> Option<Decision> {
    let request = algorithm.decide(&mut state.clone(), now, cost, PermitId(0))?;
    let peek = if request.is_allowed() && cost > 0 {
        algorithm.decide(&mut state.clone(), now, 0, PermitId(0))?
    } else {
        // A denial consumed nothing: it already reports the current state.
        request.clone()
    };
    Some(blocked(&request, &peek, left))
}
