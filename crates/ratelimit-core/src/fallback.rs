//! [`FallbackStore`]: a shared store, and a local one for when it is down.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::admin::AdminStore;
use crate::breaker::{Call, CircuitBreaker};
use crate::settle::{Settle, SettleFuture, SettlementId};
use crate::store::{BoxFuture, Check, RefundFuture, Store};
use crate::{Decision, DecisionSource, MemoryStore, PermitId, Policy, StoreError};

/// The most permits of the fallback whose lease is running that a
/// [`FallbackStore`] keeps track of. Past it, the fallback denies further
/// concurrency permits until leases end or permits are released.
pub(crate) const MAX_FALLBACK_PERMITS: usize = 65_536;

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
///   at most 65,536) and releases only those locally;
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
    held: Mutex<Held>,
    capacity: usize,
}

struct Held {
    /// Each permit and when its lease ends.
    leases: hashbrown::HashMap<PermitId, Instant>,
    /// Room promised to decisions still being made.
    reserved: usize,
}

/// Room for `left` more permits in a [`LocalPermits`], taken before the
/// decisions that may issue them, so that a batch never finds the table
/// full after it consumed. What is not filled is given back when dropped.
struct Reservation<'a> {
    permits: &'a LocalPermits,
    left: usize,
}

impl LocalPermits {
    fn new(capacity: usize) -> Self {
        LocalPermits {
            held: Mutex::new(Held {
                leases: hashbrown::HashMap::new(),
                reserved: 0,
            }),
            capacity,
        }
    }

    /// Room for `n` permits. When the permits held and the room promised
    /// leave less than `n`, returns how long until the first lease ends.
    fn reserve(&self, n: usize) -> Result<Reservation<'_>, Duration> {
        if n > 0 {
            let now = Instant::now();
            let mut held = self.held.lock();
            let fits = |held: &Held| {
                held.leases
                    .len()
                    .saturating_add(held.reserved)
                    .saturating_add(n)
                    <= self.capacity
            };
            if !fits(&held) {
                held.leases.retain(|_, ends| *ends > now);
            }
            if !fits(&held) {
                let first = held.leases.values().min().copied().unwrap_or(now);
                return Err(first.saturating_duration_since(now));
            }
            held.reserved += n;
        }
        Ok(Reservation {
            permits: self,
            left: n,
        })
    }

    /// Forgets `permit`; whether the fallback issued it.
    fn remove(&self, permit: PermitId) -> bool {
        self.held.lock().leases.remove(&permit).is_some()
    }

    /// Whether the fallback issued `permit`; if so, it is remembered until
    /// `lease` from now (or later), as its renewal keeps it held that long.
    fn renew(&self, permit: PermitId, lease: Duration) -> bool {
        let ends = Instant::now() + lease;
        match self.held.lock().leases.get_mut(&permit) {
            Some(until) => {
                *until = (*until).max(ends);
                true
            }
            None => false,
        }
    }
}

impl Reservation<'_> {
    /// Remembers `permit`, leased for `lease`, in room reserved for it.
    fn fill(&mut self, permit: PermitId, lease: Duration) {
        debug_assert!(self.left > 0, "a permit the reservation left no room for");
        let mut held = self.permits.held.lock();
        if self.left > 0 {
            self.left -= 1;
            held.reserved -= 1;
        }
        held.leases.insert(permit, Instant::now() + lease);
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.left > 0 {
            self.permits.held.lock().reserved -= self.left;
        }
    }
}

/// How many of `checks` may issue a concurrency permit.
fn permits_issued<'a>(checks: impl IntoIterator<Item = (&'a Policy, u64)>) -> usize {
    checks
        .into_iter()
        .filter(|(policy, cost)| {
            *cost > 0 && policy.algorithm().algorithm_kind() == crate::AlgorithmKind::Concurrency
        })
        .count()
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

/// Awaits the primary's answer when the breaker routed the call there
/// (`call`, taken when the store's call was made), and tells the breaker
/// how it went. `None` means: let the fallback decide (the breaker is open,
/// or the primary is unavailable).
async fn ask_primary<T, Fut>(route: Option<(Call, Fut)>) -> Option<Result<T, StoreError>>
where
    Fut: Future<Output = Result<T, StoreError>>,
{
    let (call, primary) = route?;
    match primary.await {
        Err(e) if e.is_outage() => {
            call.failed();
            None
        }
        other => {
            call.succeeded();
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

    /// `call` on the fallback store under the local share of `policy` (see
    /// [`local`](Self::local)), boxed.
    fn on_fallback<T: Send + 'static, Fut>(
        &self,
        policy: &Policy,
        call: impl FnOnce(&F, &Policy) -> Fut,
    ) -> BoxFuture<T>
    where
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        match self.local(policy) {
            Ok(local) => Box::pin(call(&self.fallback, &local)),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }

    async fn fallback_check(
        &self,
        key: Vec<u8>,
        policy: Policy,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let mut out = self.fallback_check_all(vec![(key, policy, cost)]).await?;
        out.pop()
            .ok_or_else(|| StoreError::Backend("the fallback gave no decision".into()))
    }

    /// Decides `checks` on the fallback, all or nothing. Room for the
    /// permits they may issue is reserved first: when the fallback already
    /// holds as many as it tracks, nothing is consumed and the request is
    /// denied until the first lease ends.
    async fn fallback_check_all(
        &self,
        checks: Vec<(Vec<u8>, Policy, u64)>,
    ) -> Result<Vec<Decision>, StoreError> {
        self.fallback_decisions.fetch_add(1, Ordering::Relaxed);
        let mut locals = Vec::with_capacity(checks.len());
        for (key, policy, cost) in &checks {
            locals.push((key, self.local(policy)?, *cost));
        }
        // A cost the shared policy admits may exceed a local share: it is
        // then refused for as long as the fallback decides (not an error),
        // and nothing is consumed anywhere (the others peek).
        let too_costly: Vec<bool> = locals.iter().map(|(_, p, c)| *c > p.max_cost()).collect();
        let any_too_costly = too_costly.iter().any(|&t| t);
        let issued = if any_too_costly {
            0
        } else {
            permits_issued(locals.iter().map(|(_, p, c)| (p, *c)))
        };
        let reservation = self.permits.reserve(issued);
        let consume = !any_too_costly && reservation.is_ok();
        let local_checks: Vec<Check<'_>> = locals
            .iter()
            .map(|(key, policy, cost)| Check::new(key, policy, if consume { *cost } else { 0 }))
            .collect();
        let decisions = self.fallback.check_all(&local_checks).await?;
        let mut reservation = match reservation {
            Ok(reservation) => reservation,
            Err(wait) => {
                // No room for a permit: the checks that would take one are
                // denied until the first lease ends; the others peeked.
                let retry = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX);
                return Ok(decisions
                    .into_iter()
                    .zip(&locals)
                    .map(|(d, (_, local, cost))| {
                        if permits_issued([(local, *cost)]) > 0 {
                            mark(Decision::deny(
                                d.limit(),
                                d.remaining(),
                                d.reset_after_micros(),
                                retry,
                            ))
                        } else {
                            mark(d)
                        }
                    })
                    .collect());
            }
        };
        Ok(decisions
            .into_iter()
            .zip(&locals)
            .zip(too_costly)
            .map(|((d, (_, local, _)), too_costly)| {
                if too_costly {
                    let window = u64::try_from(local.window().as_micros()).unwrap_or(u64::MAX);
                    mark(Decision::deny(local.limit(), d.remaining(), window, window))
                } else {
                    if let Some(permit) = d.permit() {
                        reservation.fill(permit, local.window());
                    }
                    mark(d)
                }
            })
            .collect())
    }
}

impl<P: Store, F: Store> Store for FallbackStore<P, F> {
    type CheckFuture = BoxFuture<Decision>;
    type CheckAllFuture = BoxFuture<Vec<Decision>>;
    type ReleaseFuture = BoxFuture<()>;
    type RenewFuture = BoxFuture<bool>;

    fn check(&self, key: &[u8], policy: &Policy, cost: u64) -> Self::CheckFuture {
        if let Err(e) = policy.check_cost(cost) {
            return Box::pin(std::future::ready(Err(e)));
        }
        let inner = Arc::clone(&self.inner);
        let (key, policy) = (key.to_vec(), policy.clone());
        // Routed now: a future dropped before its first poll gives a probe back.
        let route = inner
            .breaker
            .route()
            .map(|call| (call, inner.primary.check(&key, &policy, cost)));
        Box::pin(async move {
            if let Some(answer) = ask_primary(route).await {
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
        let route = inner
            .breaker
            .route()
            .map(|call| (call, inner.primary.check_all(checks)));
        Box::pin(async move {
            if let Some(answer) = ask_primary(route).await {
                return answer;
            }
            inner.fallback_check_all(owned).await
        })
    }

    fn release(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::ReleaseFuture {
        if self.inner.permits.remove(permit) {
            self.inner
                .on_fallback(policy, |store, local| store.release(key, local, permit))
        } else {
            Box::pin(self.inner.primary.release(key, policy, permit))
        }
    }

    /// Refunds the store that decided ([`Decision::source`]): the local
    /// store, under the local share of the policy, for a decision made
    /// while the primary was unreachable; else the primary.
    fn refund(&self, key: &[u8], policy: &Policy, cost: u64, decision: &Decision) -> RefundFuture {
        if decision.source() == DecisionSource::Fallback {
            self.inner.on_fallback(policy, |store, local| {
                store.refund(key, local, cost, decision)
            })
        } else {
            self.inner.primary.refund(key, policy, cost, decision)
        }
    }

    /// Whether both stores settle `policy`: a reservation is settled in
    /// whichever decided it.
    fn supports_settlement(&self, policy: &Policy) -> bool {
        self.inner.primary.supports_settlement(policy)
            && self.inner.fallback.supports_settlement(policy)
    }

    /// Settles each limit in the store that decided its reservation
    /// ([`Decision::source`]), as [`refund`](Store::refund) does: the local
    /// store, under the local share of the policy, for a reservation made
    /// while the primary was unreachable; else the primary, whatever the
    /// breaker says (a settlement corrects what was consumed there; when
    /// the primary is down it fails with its error, and the local shares
    /// are not charged in its place). The fallback's decisions say so.
    ///
    /// One reservation's limits are decided by one store (a `check_all` goes
    /// to the primary or to the fallback as a whole), so a settlement is
    /// all or nothing in that store. A call that mixes reservations of both
    /// settles each store's part, all or nothing there, whatever the other
    /// answered, and fails with the error of either (the primary's first);
    /// sent again under its id, it changes nothing where it was settled.
    fn settle(&self, id: SettlementId, settles: &[Settle<'_>]) -> SettleFuture {
        let (local, shared): (Vec<usize>, Vec<usize>) = (0..settles.len())
            .partition(|&i| settles[i].decision.source() == DecisionSource::Fallback);
        if local.is_empty() {
            return self.inner.primary.settle(id, settles);
        }
        let mut locals = Vec::with_capacity(local.len());
        for &i in &local {
            match self.inner.local(settles[i].policy) {
                Ok(policy) => locals.push(policy),
                Err(e) => return Box::pin(std::future::ready(Err(e))),
            }
        }
        let local_settles: Vec<Settle<'_>> = local
            .iter()
            .zip(&locals)
            .map(|(&i, policy)| Settle {
                policy,
                ..settles[i]
            })
            .collect();
        let fallback = self.inner.fallback.settle(id, &local_settles);
        let primary = (!shared.is_empty()).then(|| {
            let shared_settles: Vec<Settle<'_>> = shared.iter().map(|&i| settles[i]).collect();
            self.inner.primary.settle(id, &shared_settles)
        });
        let n = settles.len();
        Box::pin(async move {
            let mut decisions: Vec<Option<Decision>> = vec![None; n];
            if let Some(primary) = primary {
                for (&i, d) in shared.iter().zip(primary.await?) {
                    decisions[i] = Some(d);
                }
            }
            for (&i, d) in local.iter().zip(fallback.await?) {
                decisions[i] = Some(mark(d));
            }
            decisions
                .into_iter()
                .map(|d| d.ok_or_else(|| StoreError::Backend("fewer settlements answered".into())))
                .collect()
        })
    }

    /// Renews a permit in the store that issued it, as
    /// [`release`](Store::release) releases it there.
    fn renew(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::RenewFuture {
        // A local policy keeps the lease of the shared one.
        if self.inner.permits.renew(permit, policy.window()) {
            self.inner
                .on_fallback(policy, |store, local| store.renew(key, local, permit))
        } else {
            Box::pin(self.inner.primary.renew(key, policy, permit))
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
        type RenewFuture = std::future::Ready<Result<bool, StoreError>>;

        fn check(&self, _: &[u8], _: &Policy, _: u64) -> Self::CheckFuture {
            std::future::ready(Err(StoreError::Unavailable("down".into())))
        }

        fn check_all(&self, _: &[Check<'_>]) -> Self::CheckAllFuture {
            std::future::ready(Err(StoreError::Unavailable("down".into())))
        }

        fn release(&self, _: &[u8], _: &Policy, _: PermitId) -> Self::ReleaseFuture {
            panic!("a release of a fallback permit went to the primary")
        }

        fn renew(&self, _: &[u8], _: &Policy, _: PermitId) -> Self::RenewFuture {
            panic!("a renewal of a fallback permit went to the primary")
        }
    }

    /// A store whose primary is down, its fallback (returned too) tracking
    /// at most two permits.
    fn falling_back_with_room_for_two() -> (FallbackStore<Down>, MemoryStore) {
        let breaker = Arc::new(CircuitBreaker::default());
        let local = MemoryStore::new();
        let store = FallbackStore::with_permit_capacity(Down, local.clone(), 1, breaker, 2);
        (store, local)
    }

    #[tokio::test]
    async fn past_its_permit_capacity_the_fallback_denies_and_takes_nothing() {
        let (store, local) = falling_back_with_room_for_two();
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

    /// A settlement goes to the store that decided its reservation: the
    /// fallback, under its local share, for its own decisions (and says
    /// so); the primary for the others (this one has no settlements: the
    /// error is its own). A call that mixes both settles the fallback's
    /// part whatever the primary answered, once however often it is sent.
    #[tokio::test]
    async fn settlements_go_to_the_store_that_decided() {
        let breaker = Arc::new(CircuitBreaker::default());
        let local = MemoryStore::new();
        let store = FallbackStore::new(Down, local.clone(), 2, breaker);
        // 1,000 days: no window edge of the real clock between the checks.
        let policy = Policy::fixed_window(20, Duration::from_secs(86_400_000))
            .unwrap()
            .with_name("per-minute")
            .unwrap();
        let share = policy.divided_among(2).unwrap();
        let reserved = store
            .check_all(&[Check::new(b"k", &policy, 2)])
            .await
            .unwrap();
        assert_eq!(reserved[0].source(), DecisionSource::Fallback);
        assert_eq!(reserved[0].remaining(), 8);
        let settles = [Settle::new(b"k", &policy, 2, 5, &reserved[0])];
        let settled = store
            .settle(SettlementId::random(), &settles)
            .await
            .unwrap();
        assert_eq!(settled[0].remaining(), 5);
        assert_eq!(settled[0].source(), DecisionSource::Fallback);
        assert_eq!(local.check_now(b"k", &share, 0).unwrap().remaining(), 5);

        let primary = Decision::allow(20, 18, 1);
        let settles = [
            Settle::new(b"k", &policy, 2, 0, &reserved[0]),
            Settle::new(b"j", &policy, 2, 0, &primary),
        ];
        let id = SettlementId::random();
        for _ in 0..2 {
            let refused = store.settle(id, &settles).await;
            assert!(
                matches!(refused, Err(StoreError::Unsupported { .. })),
                "{refused:?}"
            );
            // The fallback's part, once.
            assert_eq!(local.check_now(b"k", &share, 0).unwrap().remaining(), 7);
        }
    }

    /// A call that took the probe and was dropped before its first poll (the
    /// losing branch of a `select!`) gives the probe back: the next call
    /// probes the primary, and the breaker closes.
    #[tokio::test]
    async fn a_probe_dropped_unpolled_hands_the_probe_on() {
        let policy = Policy::fixed_window(10, Duration::from_secs(60)).unwrap();
        for all in [false, true] {
            let breaker = Arc::new(
                CircuitBreaker::new(1, Duration::ZERO).with_slow_call(Duration::from_secs(3600)),
            );
            let store =
                FallbackStore::new(MemoryStore::new(), MemoryStore::new(), 1, breaker.clone());
            breaker.failed(false);
            assert_eq!(breaker.state(), crate::BreakerState::Open);
            // Taken when the call is made, and dropped unpolled.
            if all {
                let probe = store.check_all(&[Check::new(b"k", &policy, 1)]);
                assert_eq!(breaker.state(), crate::BreakerState::HalfOpen);
                drop(probe);
            } else {
                let probe = store.check(b"k", &policy, 1);
                assert_eq!(breaker.state(), crate::BreakerState::HalfOpen);
                drop(probe);
            }
            assert_eq!(breaker.state(), crate::BreakerState::Open, "all: {all}");
            let d = store.check(b"k", &policy, 1).await.unwrap();
            assert_eq!(d.source(), DecisionSource::Store, "all: {all}: {d:?}");
            assert_eq!(breaker.state(), crate::BreakerState::Closed, "all: {all}");
        }
    }

    /// A batch that needs more room for permits than the fallback has left
    /// takes nothing at all: not the permit that would have fit, not the
    /// other limits' costs.
    #[tokio::test]
    async fn a_batch_past_the_permit_capacity_consumes_nothing() {
        let (store, local) = falling_back_with_room_for_two();
        let slots = Policy::concurrency(10, Duration::from_secs(60)).unwrap();
        // 1,000 days: no window edge of the real clock between the checks.
        let per_minute = Policy::fixed_window(10, Duration::from_secs(86_400_000))
            .unwrap()
            .with_name("per-minute")
            .unwrap();
        let first = store.check(b"a", &slots, 1).await.unwrap();
        assert!(first.is_allowed(), "{first:?}");
        let batch = [
            Check::new(b"b", &slots, 1),
            Check::new(b"c", &per_minute, 3),
            Check::new(b"d", &slots, 1),
        ];
        let out = store.check_all(&batch).await.unwrap();
        assert!(!out[0].is_allowed() && !out[2].is_allowed(), "{out:?}");
        assert!(
            out[0]
                .retry_after()
                .is_some_and(|r| r > Duration::from_secs(59))
        );
        assert!(out.iter().all(|d| d.source() == DecisionSource::Fallback));
        assert_eq!(local.check_now(b"b", &slots, 0).unwrap().remaining(), 10);
        assert_eq!(local.check_now(b"d", &slots, 0).unwrap().remaining(), 10);
        assert_eq!(
            local.check_now(b"c", &per_minute, 0).unwrap().remaining(),
            10
        );
        // With the first permit released there is room for two: the same
        // batch passes and takes everything, and then the table is full.
        store
            .release(b"a", &slots, first.permit().unwrap())
            .await
            .unwrap();
        let out = store.check_all(&batch).await.unwrap();
        assert!(out.iter().all(Decision::is_allowed), "{out:?}");
        assert_eq!(
            local.check_now(b"c", &per_minute, 0).unwrap().remaining(),
            7
        );
        let third = store.check(b"e", &slots, 1).await.unwrap();
        assert!(!third.is_allowed(), "{third:?}");
        assert_eq!(local.check_now(b"e", &slots, 0).unwrap().remaining(), 10);
    }
}
