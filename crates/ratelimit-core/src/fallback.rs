//! [`FallbackStore`]: a shared store, and a local one for when it is down.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::admin::AdminStore;
use crate::breaker::{CircuitBreaker, ProbeGuard, Route};
use crate::store::{BoxFuture, Check, Store};
use crate::{Decision, DecisionSource, MemoryStore, PermitId, Policy, StoreError};

/// The most permits of the fallback whose lease is running that a
/// [`FallbackStore`] keeps track of. Past it, the fallback denies further
/// concurrency permits until leases end or permits are released.
pub const MAX_FALLBACK_PERMITS: usize = 65_536;

/// A primary store (Redis) behind a [`CircuitBreaker`], with a local fallback
/// (a [`MemoryStore`]) enforcing a conservative share of each limit while the
/// primary is unreachable.
///
/// - A call goes to the primary while the breaker is closed. If it fails
///   with an outage (a timeout or an unreachable store:
///   [`StoreError::is_outage`]), that call is decided
///   by the fallback and the failure is counted; after the breaker's threshold
///   of consecutive failures it opens, and calls go straight to the fallback
///   for the cool-down. Then one probe goes to the primary; when it answers,
///   the breaker closes and the primary is used again.
/// - The fallback enforces each policy divided among `instances`
///   ([`Policy::divided_among`]): if every instance falls back at once, their
///   sum stays within the shared limit.
/// - Errors that are not outages (a cost above the limit, a policy
///   conflict, a reply that does not decode) are returned as they are: they
///   are mistakes to fix, and neither the fallback nor the breaker hides
///   them. The breaker counts them as answers, not failures.
/// - The fallback's decisions say so: their [`Decision::source`] is
///   [`DecisionSource::Fallback`].
/// - A call to the primary that the caller drops before it answers counts as
///   a failure once it has waited the breaker's
///   [slow-call time](CircuitBreaker::with_slow_call) (a layer timeout
///   shorter than the store's: the store is too slow for its callers), and
///   as nothing sooner (a client that went away, an HTTP/2 reset: a few
///   impatient clients must not open the breaker for everyone; a dropped
///   probe lets the next call probe at once). Still, give the primary its
///   own timeout (`RedisStore`'s call timeout) shorter than the layer's, so
///   the fallback can answer the call.
/// - Permits are released to the store that issued them: the fallback keeps
///   the ids of the permits it issued (until released or their lease ends,
///   at most [`MAX_FALLBACK_PERMITS`]) and releases only those locally;
///   every other id goes to the primary, whatever ids the primary chooses.
///   While the fallback holds that many permits, it denies new ones.
/// - When the primary is an [`AdminStore`], so is this store: admin
///   operations go to the primary, whatever the breaker's state, and are not
///   counted by it. When the primary is unreachable they fail with its error
///   (an operator should know that the change was not made), and the
///   fallback's local state is never touched: a reset or an unblock does not
///   reach the local shares an instance enforces while the primary is down,
///   and a block is not enforced by them.
///
/// ```
/// use std::sync::Arc;
/// use ratelimit_core::{CircuitBreaker, FallbackStore, MemoryStore};
///
/// # fn shared() -> MemoryStore { MemoryStore::new() }
/// // `shared()` would be a RedisStore.
/// let breaker = Arc::new(CircuitBreaker::default());
/// let store = FallbackStore::new(shared(), MemoryStore::new(), 4, breaker.clone());
/// assert_eq!(breaker.state(), ratelimit_core::BreakerState::Closed);
/// # let _ = store;
/// ```
pub struct FallbackStore<P, F = MemoryStore> {
    inner: Arc<Inner<P, F>>,
}

struct Inner<P, F> {
    primary: P,
    fallback: F,
    instances: u32,
    breaker: Arc<CircuitBreaker>,
    fallback_decisions: AtomicU64,
    permits: LocalPermits,
}

/// The permits the fallback issued whose lease has not ended, so that their
/// releases go to the fallback and every other release to the primary.
/// Permit ids are the stores' own: no bit of an id is reserved, since a
/// primary may choose any id.
struct LocalPermits {
    /// Each permit and when its lease ends.
    held: Mutex<hashbrown::HashMap<PermitId, Instant>>,
    capacity: usize,
}

impl LocalPermits {
    fn new(capacity: usize) -> Self {
        LocalPermits {
            held: Mutex::new(hashbrown::HashMap::new()),
            capacity,
        }
    }

    /// Remembers `permit`, leased for `lease`. When `capacity` permits are
    /// held and none has ended, returns how long until the first one ends.
    fn insert(&self, permit: PermitId, lease: Duration) -> Result<(), Duration> {
        let now = Instant::now();
        let mut held = self.held.lock();
        if held.len() >= self.capacity {
            held.retain(|_, ends| *ends > now);
        }
        if held.len() >= self.capacity {
            let first = held.values().min().copied().unwrap_or(now);
            return Err(first.saturating_duration_since(now));
        }
        held.insert(permit, now + lease);
        Ok(())
    }

    /// Forgets `permit`; whether the fallback issued it.
    fn remove(&self, permit: PermitId) -> bool {
        self.held.lock().remove(&permit).is_some()
    }
}

impl<P, F> Clone for FallbackStore<P, F> {
    fn clone(&self) -> Self {
        FallbackStore {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<P, F> fmt::Debug for FallbackStore<P, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FallbackStore")
            .field("instances", &self.inner.instances)
            .field("breaker", &self.inner.breaker)
            .field(
                "fallback_decisions",
                &self.inner.fallback_decisions.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

impl<P: Store, F: Store> FallbackStore<P, F> {
    /// `primary`, with `fallback` enforcing each limit divided among
    /// `instances` while `breaker` keeps calls away from the primary.
    pub fn new(primary: P, fallback: F, instances: u32, breaker: Arc<CircuitBreaker>) -> Self {
        Self::with_permit_capacity(primary, fallback, instances, breaker, MAX_FALLBACK_PERMITS)
    }

    fn with_permit_capacity(
        primary: P,
        fallback: F,
        instances: u32,
        breaker: Arc<CircuitBreaker>,
        permits: usize,
    ) -> Self {
        FallbackStore {
            inner: Arc::new(Inner {
                primary,
                fallback,
                instances: instances.max(1),
                breaker,
                fallback_decisions: AtomicU64::new(0),
                permits: LocalPermits::new(permits),
            }),
        }
    }

    /// The breaker in front of the primary.
    pub fn breaker(&self) -> &Arc<CircuitBreaker> {
        &self.inner.breaker
    }

    /// How many decisions the fallback has made.
    pub fn fallback_decisions(&self) -> u64 {
        self.inner.fallback_decisions.load(Ordering::Relaxed)
    }
}

/// Awaits the primary's answer when the breaker routed the call there, and
/// tells the breaker how it went. `None` means: let the fallback decide (the
/// breaker is open, or the primary is unavailable).
async fn ask_primary<T, Fut>(
    breaker: &CircuitBreaker,
    route: Route,
    call: Option<Fut>,
) -> Option<Result<T, StoreError>>
where
    Fut: Future<Output = Result<T, StoreError>>,
{
    let (Route::Primary { probe }, Some(call)) = (route, call) else {
        return None;
    };
    let guard = ProbeGuard::new(breaker, probe);
    let result = call.await;
    guard.finish();
    match result {
        Err(e) if e.is_outage() => {
            breaker.failed(probe);
            None
        }
        other => {
            breaker.succeeded(probe);
            Some(other)
        }
    }
}

/// A decision of the fallback: its source says so.
fn mark(decision: Decision) -> Decision {
    decision.with_source(DecisionSource::Fallback)
}

impl<P: Store, F: Store> Inner<P, F> {
    fn local(&self, policy: &Policy) -> Result<Policy, StoreError> {
        policy
            .divided_among(self.instances)
            .map_err(|e| StoreError::Backend(Box::new(e)))
    }

    async fn fallback_check(
        &self,
        key: Vec<u8>,
        policy: Policy,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        self.fallback_decisions.fetch_add(1, Ordering::Relaxed);
        let local = self.local(&policy)?;
        // A cost the shared policy admits may exceed the local share: it is
        // then refused for as long as the fallback decides, not an error.
        if cost > local.max_cost() {
            let window = u64::try_from(local.window().as_micros()).unwrap_or(u64::MAX);
            let peek = self.fallback.check(&key, &local, 0).await?;
            return Ok(mark(Decision::deny(
                local.limit(),
                peek.remaining(),
                window,
                window,
            )));
        }
        let decision = self.fallback.check(&key, &local, cost).await?;
        self.track(&key, &local, mark(decision)).await
    }

    /// Remembers the permit of a fallback decision, so that its release goes
    /// to the fallback. When the fallback already holds as many permits as
    /// it tracks, the permit is given back and the request denied.
    async fn track(
        &self,
        key: &[u8],
        local: &Policy,
        decision: Decision,
    ) -> Result<Decision, StoreError> {
        let Some(permit) = decision.permit() else {
            return Ok(decision);
        };
        match self.permits.insert(permit, local.window()) {
            Ok(()) => Ok(decision),
            Err(wait) => {
                self.fallback.release(key, local, permit).await?;
                let retry = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX);
                Ok(mark(Decision::deny(
                    decision.limit(),
                    decision.remaining(),
                    decision.reset_after_micros(),
                    retry,
                )))
            }
        }
    }
}

impl<P: Store, F: Store> Store for FallbackStore<P, F> {
    type CheckFuture = BoxFuture<Decision>;
    type CheckAllFuture = BoxFuture<Vec<Decision>>;
    type ReleaseFuture = BoxFuture<()>;

    fn check(&self, key: &[u8], policy: &Policy, cost: u64) -> Self::CheckFuture {
        if let Err(e) = policy.check_cost(cost) {
            return Box::pin(std::future::ready(Err(e)));
        }
        let inner = Arc::clone(&self.inner);
        let (key, policy) = (key.to_vec(), policy.clone());
        let route = inner.breaker.route();
        let primary = match route {
            Route::Primary { .. } => Some(inner.primary.check(&key, &policy, cost)),
            Route::Elsewhere => None,
        };
        Box::pin(async move {
            if let Some(answer) = ask_primary(&inner.breaker, route, primary).await {
                return answer;
            }
            inner.fallback_check(key, policy, cost).await
        })
    }

    fn check_all(&self, checks: &[Check<'_>]) -> Self::CheckAllFuture {
        for check in checks {
            if let Err(e) = check.policy.check_cost(check.cost) {
                return Box::pin(std::future::ready(Err(e)));
            }
        }
        let inner = Arc::clone(&self.inner);
        let owned: Vec<(Vec<u8>, Policy, u64)> = checks
            .iter()
            .map(|c| (c.key.to_vec(), c.policy.clone(), c.cost))
            .collect();
        let route = inner.breaker.route();
        let primary = match route {
            Route::Primary { .. } => Some(inner.primary.check_all(checks)),
            Route::Elsewhere => None,
        };
        Box::pin(async move {
            if let Some(answer) = ask_primary(&inner.breaker, route, primary).await {
                return answer;
            }
            inner.fallback_decisions.fetch_add(1, Ordering::Relaxed);
            let mut locals = Vec::with_capacity(owned.len());
            for (key, policy, cost) in &owned {
                locals.push((key, inner.local(policy)?, *cost));
            }
            // A cost above a local share is refused while the fallback
            // decides; then nothing is consumed anywhere (the others peek).
            let too_costly: Vec<bool> = locals.iter().map(|(_, p, c)| *c > p.max_cost()).collect();
            let any_too_costly = too_costly.iter().any(|&t| t);
            let local_checks: Vec<Check<'_>> = locals
                .iter()
                .map(|(key, policy, cost)| {
                    Check::new(key, policy, if any_too_costly { 0 } else { *cost })
                })
                .collect();
            let decisions = inner.fallback.check_all(&local_checks).await?;
            let mut out = Vec::with_capacity(decisions.len());
            for ((d, (key, local, _)), too_costly) in
                decisions.into_iter().zip(&locals).zip(too_costly)
            {
                out.push(if too_costly {
                    let window = u64::try_from(local.window().as_micros()).unwrap_or(u64::MAX);
                    mark(Decision::deny(local.limit(), d.remaining(), window, window))
                } else {
                    inner.track(key, local, mark(d)).await?
                });
            }
            Ok(out)
        })
    }

    fn release(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::ReleaseFuture {
        if self.inner.permits.remove(permit) {
            let local = match self.inner.local(policy) {
                Ok(local) => local,
                Err(e) => return Box::pin(std::future::ready(Err(e))),
            };
            Box::pin(self.inner.fallback.release(key, &local, permit))
        } else {
            Box::pin(self.inner.primary.release(key, policy, permit))
        }
    }
}

impl<P: AdminStore, F: Store> AdminStore for FallbackStore<P, F> {
    type DecisionFuture = P::DecisionFuture;
    type UpdateFuture = P::UpdateFuture;

    fn peek(&self, key: &[u8], policy: &Policy) -> Self::DecisionFuture {
        self.inner.primary.peek(key, policy)
    }

    fn reset(&self, key: &[u8], policy: &Policy) -> Self::UpdateFuture {
        self.inner.primary.reset(key, policy)
    }

    fn penalize(&self, key: &[u8], policy: &Policy, amount: u64) -> Self::DecisionFuture {
        self.inner.primary.penalize(key, policy, amount)
    }

    fn reward(&self, key: &[u8], policy: &Policy, amount: u64) -> Self::DecisionFuture {
        self.inner.primary.reward(key, policy, amount)
    }

    fn block(&self, key: &[u8], policy: &Policy, duration: Duration) -> Self::UpdateFuture {
        self.inner.primary.block(key, policy, duration)
    }

    fn unblock(&self, key: &[u8], policy: &Policy) -> Self::UpdateFuture {
        self.inner.primary.unblock(key, policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A primary that is always down.
    struct Down;

    impl Store for Down {
        type CheckFuture = std::future::Ready<Result<Decision, StoreError>>;
        type CheckAllFuture = std::future::Ready<Result<Vec<Decision>, StoreError>>;
        type ReleaseFuture = std::future::Ready<Result<(), StoreError>>;

        fn check(&self, _: &[u8], _: &Policy, _: u64) -> Self::CheckFuture {
            std::future::ready(Err(StoreError::Unavailable("down".into())))
        }

        fn check_all(&self, _: &[Check<'_>]) -> Self::CheckAllFuture {
            std::future::ready(Err(StoreError::Unavailable("down".into())))
        }

        fn release(&self, _: &[u8], _: &Policy, _: PermitId) -> Self::ReleaseFuture {
            panic!("a release of a fallback permit went to the primary")
        }
    }

    #[tokio::test]
    async fn past_its_permit_capacity_the_fallback_denies_and_takes_nothing() {
        let breaker = Arc::new(CircuitBreaker::default());
        let local = MemoryStore::new();
        let store = FallbackStore::with_permit_capacity(Down, local.clone(), 1, breaker, 2);
        let policy = Policy::concurrency(10, Duration::from_secs(60)).unwrap();
        let a = store.check(b"k", &policy, 1).await.unwrap();
        let b = store
            .check_all(&[Check::new(b"k", &policy, 1)])
            .await
            .unwrap()
            .remove(0);
        assert!(a.is_allowed() && b.is_allowed());
        let c = store.check(b"k", &policy, 1).await.unwrap();
        assert!(!c.is_allowed(), "{c:?}");
        assert!(c.retry_after().is_some_and(|r| r > Duration::from_secs(59)));
        // The denied one took nothing locally.
        assert_eq!(local.check_now(b"k", &policy, 0).unwrap().remaining(), 8);
        // Releases go to the fallback (the primary would panic), and free room.
        store
            .release(b"k", &policy, a.permit().unwrap())
            .await
            .unwrap();
        assert_eq!(local.check_now(b"k", &policy, 0).unwrap().remaining(), 9);
        let d = store.check(b"k", &policy, 1).await.unwrap();
        assert!(d.is_allowed(), "{d:?}");
    }
}
