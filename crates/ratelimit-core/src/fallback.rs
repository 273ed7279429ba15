//! [`FallbackStore`]: a shared store, and a local one for when it is down.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::admin::AdminStore;
use crate::breaker::{CircuitBreaker, ProbeGuard, Route};
use crate::store::{Check, Store};
use crate::{Decision, DecisionSource, MemoryStore, PermitId, Policy, StoreError};

/// Permits issued by the fallback carry this bit, so releases find their store.
const FALLBACK_PERMIT: u128 = 1 << 127;

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
        FallbackStore {
            inner: Arc::new(Inner {
                primary,
                fallback,
                instances: instances.max(1),
                breaker,
                fallback_decisions: AtomicU64::new(0),
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

type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send>>;

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

/// A decision of the fallback: its source says so, and its permit carries
/// [`FALLBACK_PERMIT`].
fn mark(decision: Decision) -> Decision {
    let decision = decision.with_source(DecisionSource::Fallback);
    match decision.permit() {
        Some(p) => decision.with_permit(PermitId(p.0 | FALLBACK_PERMIT)),
        None => decision,
    }
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
        self.fallback.check(&key, &local, cost).await.map(mark)
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
            Ok(decisions
                .into_iter()
                .zip(&locals)
                .zip(too_costly)
                .map(|((d, (_, local, _)), too_costly)| {
                    if too_costly {
                        let window = u64::try_from(local.window().as_micros()).unwrap_or(u64::MAX);
                        mark(Decision::deny(local.limit(), d.remaining(), window, window))
                    } else {
                        mark(d)
                    }
                })
                .collect())
        })
    }

    fn release(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::ReleaseFuture {
        if permit.0 & FALLBACK_PERMIT != 0 {
            let local = match self.inner.local(policy) {
                Ok(local) => local,
                Err(e) => return Box::pin(std::future::ready(Err(e))),
            };
            let call =
                self.inner
                    .fallback
                    .release(key, &local, PermitId(permit.0 & !FALLBACK_PERMIT));
            Box::pin(call)
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
