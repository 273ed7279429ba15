//! [`LeasedStore`]: hot keys decided locally from leased batches of budget.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use crate::admin::AdminStore;
use crate::bounded::KeyShards;
use crate::clock::{Clock, MonotonicClock};
use crate::policy::Algorithm;
use crate::settle::{Settle, SettleFuture, SettlementId};
use crate::store::{BoxFuture, Check, LocalState, Store, forgetting, name_and_key};
use crate::{Decision, PermitId, Policy, StoreError, key};

/// The default number of units an instance leases at once.
pub(crate) const DEFAULT_LEASE_BATCH: u64 = 100;
/// The default bound on keys with a lease.
pub(crate) const DEFAULT_LEASE_ENTRIES: usize = 10_000;

/// A store wrapper that leases a hot key's budget in batches and spends it
/// locally: past one round trip per request. **Approximate and opt-in.**
///
/// When this instance has seen `hot_after` requests for a key in one lease
/// period, its next miss asks the inner store for `batch` units at once (one
/// decision of cost `batch`, which the store consumes like any other). The
/// following requests spend those units locally without a round trip until
/// they run out or the lease expires, after at most one window of the
/// policy (or [`lease_for`](LeasedStoreBuilder::lease_for) if shorter).
/// Unspent units expire with their lease: they are never given back.
/// Requests that arrive while a batch is on its way wait for it, so a hot
/// key costs one round trip per batch. When the store refuses a batch, the
/// wrapper asks for single requests until the denial would have ended, or
/// one lease period at most (a block lifted elsewhere lets it lease again).
///
/// # What it costs in accuracy
///
/// Nothing is admitted that the store did not consume, but units consumed in
/// one window can be spent in the next. A new lease replaces the previous
/// one (its leftovers are dropped), so each instance carries at most one
/// batch across a window boundary: **under a fixed window, at most
/// `limit + instances × batch` requests pass in any window.** For the other
/// windowed and rate-based algorithms the same holds for any interval of one
/// window's length. The other way, units leased and not spent are lost for
/// everyone until they would have been restored: a key can be denied while
/// another instance sits on leased units. Keep `batch` small against the limit
/// (a few percent) and lease only keys that are truly hot.
///
/// Concurrency and leaky-bucket policies, peeks (cost 0), costs above the
/// batch and [`check_all`](Store::check_all) are passed to the inner store
/// unchanged. Decisions spent locally report the store's remaining budget at
/// lease time plus the units still leased. A policy is its parameters, not
/// only its name: a lease taken under other numbers is not spent under new
/// ones.
///
/// # Blocks and penalties
///
/// When the inner store is an [`AdminStore`], so is this one: operations go
/// to the inner store, and a block, penalty, reset, reward or unblock made
/// through this instance also drops its lease of the key, so it takes effect
/// here at once (a batch on its way at the time is not kept either).
///
/// A settlement ([`Store::settle`]) goes to the inner store, where leased
/// units were consumed when their batch was granted; one that leaves a key
/// in debt also drops this instance's lease of it.
///
/// A block or penalty made elsewhere (straight on the inner store, or
/// through another instance) reaches this instance when its lease of the
/// key ends: **at most the units it had leased** (at most `batch`) pass
/// after the operation, and none once the lease has run out, at most
/// [`lease_for`](LeasedStoreBuilder::lease_for) (default: the policy's
/// window) after the batch was asked for. A blocked key's next batch is
/// refused, and no lease is taken while the block lasts. Set `lease_for`
/// to the delay an operator's block may take to reach every instance.
///
/// ```
/// use ratelimit_core::{LeasedStore, MemoryStore, Policy, Store};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // In production the inner store is a `RedisStore` shared by every instance.
/// let store = LeasedStore::builder(MemoryStore::new()).batch(10).hot_after(1).build();
/// let policy = Policy::fixed_window(1_000, Duration::from_secs(1))?;
/// for _ in 0..25 {
///     assert!(store.check(b"hot", &policy, 1).await?.is_allowed());
/// }
/// // 1 cold request, then 3 batches of 10: 24 spent, 6 left on lease.
/// assert_eq!(store.leased_decisions(), 21);
/// # Ok(())
/// # }
/// ```
pub struct LeasedStore<S, C = MonotonicClock> {
    inner: Arc<Inner<S, C>>,
}

struct Inner<S, C> {
    store: S,
    clock: C,
    batch: u64,
    hot_after: u64,
    lease_for: Option<u64>,
    /// Leases, found by the policy's name and the key ([`Inner::forget`]
    /// drops those of every policy under the name).
    leases: KeyShards<Lease>,
    leased: AtomicU64,
    batches: AtomicU64,
}

#[derive(Default)]
struct Lease {
    /// Units left to spend, until `expires_at` (µs of the clock).
    units: u64,
    expires_at: u64,
    /// Requests seen since `counting_since`, to tell hot keys apart.
    seen: u64,
    counting_since: u64,
    /// Until when the store refused a batch: single requests until then.
    refused_until: u64,
    /// What the store reported with the last batch.
    limit: u64,
    remaining: u64,
    reset_at: u64,
    /// Set while a batch is being fetched; waiters are woken when it lands.
    fetching: Option<Arc<Notify>>,
    /// Bumped when an admin operation drops the lease: a batch asked for
    /// before then is not kept (see [`Inner::landed`]).
    generation: u64,
    /// Until when the key counts as proved hot (it was leased within the
    /// last lease period): keys that did not prove hot never take its slot.
    hot_until: u64,
    /// Whether the key was asked for since the clock hand last passed it
    /// (see [`BoundedMap`](crate::bounded::BoundedMap)).
    referenced: bool,
}

impl Lease {
    /// Whether this entry may give its slot to a new key at `now`: not while
    /// a batch is on its way (it lands here) or the key proved hot, and not
    /// the first time the hand finds it used since its last pass.
    fn evictable(&mut self, now: u64) -> bool {
        if self.fetching.is_some() || now < self.hot_until {
            return false;
        }
        !std::mem::replace(&mut self.referenced, false)
    }
}

impl<S, C> Clone for LeasedStore<S, C> {
    fn clone(&self) -> Self {
        LeasedStore {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S, C> fmt::Debug for LeasedStore<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedStore")
            .field("batch", &self.inner.batch)
            .field("hot_after", &self.inner.hot_after)
            .field(
                "leased_decisions",
                &self.inner.leased.load(Ordering::Relaxed),
            )
            .field("batches", &self.inner.batches.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Configures a [`LeasedStore`].
#[must_use]
pub struct LeasedStoreBuilder<S, C = MonotonicClock> {
    store: S,
    clock: C,
    batch: u64,
    hot_after: u64,
    lease_for: Option<Duration>,
    entries: usize,
}

impl<S, C> fmt::Debug for LeasedStoreBuilder<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedStoreBuilder")
            .field("batch", &self.batch)
            .field("hot_after", &self.hot_after)
            .field("lease_for", &self.lease_for)
            .field("entries", &self.entries)
            .finish_non_exhaustive()
    }
}

impl<S: Store> LeasedStore<S> {
    /// Leases from `store` with the defaults: batches of 100, keys hot after
    /// as many requests in one lease period, at most 10,000 keys tracked.
    pub fn new(store: S) -> Self {
        LeasedStore::builder(store).build()
    }

    /// Configures leasing from `store`.
    pub fn builder(store: S) -> LeasedStoreBuilder<S> {
        LeasedStoreBuilder {
            store,
            clock: MonotonicClock::new(),
            batch: DEFAULT_LEASE_BATCH,
            hot_after: DEFAULT_LEASE_BATCH,
            lease_for: None,
            entries: DEFAULT_LEASE_ENTRIES,
        }
    }
}

impl<S, C> LeasedStoreBuilder<S, C> {
    /// Units leased at once (at least 1, default 100);
    /// capped by each policy's limit. Each instance may overshoot a window by
    /// up to this many.
    pub fn batch(mut self, batch: u64) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// How many requests for one key this instance must see in one lease
    /// period before it leases (default: the batch). 1 leases from the first
    /// request on.
    pub fn hot_after(mut self, requests: u64) -> Self {
        self.hot_after = requests.max(1);
        self
    }

    /// The longest a lease lives (default and maximum: the policy's window):
    /// also the longest a block or penalty made on another instance takes to
    /// reach this one (see [`LeasedStore`]).
    pub fn lease_for(mut self, lease_for: Duration) -> Self {
        self.lease_for = Some(lease_for);
        self
    }

    /// The most keys tracked at once (default 10,000).
    /// When full, a new key takes the slot of a key that did not prove hot
    /// and was not asked for lately, among the next few looked at; when it
    /// finds none, it goes to the store unchanged. A key that leased in the
    /// last lease period keeps its slot, whatever the flood of new keys.
    pub fn max_keys(mut self, entries: usize) -> Self {
        self.entries = entries.max(1);
        self
    }

    /// The clock that times leases (a [`ManualClock`](crate::clock::ManualClock) in tests).
    pub fn clock<C2: Clock>(self, clock: C2) -> LeasedStoreBuilder<S, C2> {
        LeasedStoreBuilder {
            store: self.store,
            clock,
            batch: self.batch,
            hot_after: self.hot_after,
            lease_for: self.lease_for,
            entries: self.entries,
        }
    }

    /// Builds the store.
    pub fn build(self) -> LeasedStore<S, C> {
        LeasedStore {
            inner: Arc::new(Inner {
                store: self.store,
                clock: self.clock,
                batch: self.batch,
                hot_after: self.hot_after,
                lease_for: self
                    .lease_for
                    .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)),
                leases: KeyShards::new(self.entries),
                leased: AtomicU64::new(0),
                batches: AtomicU64::new(0),
            }),
        }
    }
}

impl<S, C> LeasedStore<S, C> {
    /// How many decisions were spent from leases, without a round trip.
    pub fn leased_decisions(&self) -> u64 {
        self.inner.leased.load(Ordering::Relaxed)
    }

    /// How many batches were leased from the store.
    pub fn batches(&self) -> u64 {
        self.inner.batches.load(Ordering::Relaxed)
    }

    /// The wrapped store.
    pub fn get_ref(&self) -> &S {
        &self.inner.store
    }
}

/// What to do with one request.
enum Step {
    /// Spent from a lease.
    Spent(Decision),
    /// Ask the store for this request alone.
    Single,
    /// Ask the store for a batch; this task fetches it (for the lease of
    /// this generation).
    Fetch(FetchGuard, u64),
    /// Another task is fetching a batch: wait for it, then look again.
    Wait(Arc<Notify>),
}

/// Clears the fetching mark and wakes the waiters however the fetch ends,
/// cancellation included.
struct FetchGuard {
    notify: Arc<Notify>,
    done: Option<Box<dyn FnOnce() + Send>>,
}

impl Drop for FetchGuard {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            done();
        }
        self.notify.notify_waiters();
    }
}

fn leasable(policy: &Policy, cost: u64, batch: u64) -> bool {
    cost > 0
        && cost <= batch
        && !matches!(
            policy.algorithm(),
            Algorithm::Concurrency(_) | Algorithm::LeakyBucket(_)
        )
}

impl<S, C> LocalState for Inner<S, C> {
    /// Drops this instance's leases of `key` (normalized) under the policy
    /// named `policy`, whatever its parameters (they share the key's state):
    /// nothing more is spent from them, a refused batch no longer holds back
    /// the next one, and a batch on its way is not kept when it lands.
    fn forget(&self, policy: &str, key: &[u8]) {
        let hash = self.leases.hash(policy, key);
        self.leases.shard(hash).lock().for_each_mut(
            hash,
            |(p, k)| p.name() == policy && **k == *key,
            |lease| {
                lease.units = 0;
                lease.expires_at = 0;
                lease.refused_until = 0;
                lease.generation = lease.generation.wrapping_add(1);
            },
        );
    }
}

/// Whether `entry` is the lease of `key` under `policy`.
fn same(entry: &(Policy, Box<[u8]>), policy: &Policy, key: &[u8]) -> bool {
    entry.0 == *policy && *entry.1 == *key
}

impl<S: Store, C: Clock> Inner<S, C> {
    fn lease_micros(&self, policy: &Policy) -> u64 {
        let window = policy.algorithm().window_micros().max(1);
        self.lease_for.map_or(window, |l| l.min(window))
    }

    /// Whether the fetch of a batch for `key` under `policy` that wakes
    /// `notify` is still on its way. Another fetch since (the one awaited
    /// landed, and another task asked for the next batch) wakes other
    /// waiters, not those of `notify`, which would wait forever.
    fn fetching(&self, policy: &Policy, key: &[u8], notify: &Arc<Notify>) -> bool {
        let hash = self.leases.hash(policy.name(), key);
        self.leases
            .shard(hash)
            .lock()
            .get(hash, |e| same(e, policy, key))
            .and_then(|l| l.fetching.as_ref())
            .is_some_and(|n| Arc::ptr_eq(n, notify))
    }

    fn step(self: &Arc<Self>, policy: &Policy, key: &[u8], cost: u64) -> Step {
        let now = self.clock.now();
        let lease_micros = self.lease_micros(policy);
        let hash = self.leases.hash(policy.name(), key);
        let mut shard = self.leases.shard(hash).lock();
        match shard.get_mut(hash, |e| same(e, policy, key)) {
            Some(lease) => lease.referenced = true,
            None => {
                let fresh = Lease {
                    counting_since: now,
                    ..Lease::default()
                };
                let slot = (policy.clone(), Box::<[u8]>::from(key));
                if shard
                    .insert(hash, slot, fresh, |l| l.evictable(now))
                    .is_none()
                {
                    return Step::Single;
                }
            }
        }
        let Some(lease) = shard.get_mut(hash, |e| same(e, policy, key)) else {
            return Step::Single;
        };
        if now < lease.expires_at && lease.units >= cost {
            lease.units -= cost;
            self.leased.fetch_add(1, Ordering::Relaxed);
            let reset_after = lease.reset_at.saturating_sub(now);
            let remaining = lease.remaining.saturating_add(lease.units).min(lease.limit);
            return Step::Spent(Decision::allow(lease.limit, remaining, reset_after));
        }
        if let Some(notify) = &lease.fetching {
            return Step::Wait(Arc::clone(notify));
        }
        if now.saturating_sub(lease.counting_since) >= lease_micros {
            lease.counting_since = now;
            lease.seen = 0;
        }
        lease.seen += 1;
        if lease.seen <= self.hot_after || now < lease.refused_until {
            return Step::Single;
        }
        let notify = Arc::new(Notify::new());
        lease.fetching = Some(Arc::clone(&notify));
        let generation = lease.generation;
        let inner = Arc::clone(self);
        let (policy, key, mine) = (policy.clone(), Box::<[u8]>::from(key), Arc::clone(&notify));
        let done = move || {
            let mut shard = inner.leases.shard(hash).lock();
            if let Some(lease) = shard.get_mut(hash, |e| same(e, &policy, &key))
                && lease
                    .fetching
                    .as_ref()
                    .is_some_and(|n| Arc::ptr_eq(n, &mine))
            {
                lease.fetching = None;
            }
        };
        Step::Fetch(
            FetchGuard {
                notify,
                done: Some(Box::new(done)),
            },
            generation,
        )
    }

    /// Records a batch of `amount` the store answered for (sent at
    /// `sent_at`, for the lease of `generation`), and spends `cost` from it
    /// when granted: the decision of the request that asked for it, or
    /// `None` when the store refused the batch.
    fn landed(
        &self,
        policy: &Policy,
        key: &[u8],
        (sent_at, generation): (u64, u64),
        amount: u64,
        cost: u64,
        batch: &Decision,
    ) -> Option<Decision> {
        let hash = self.leases.hash(policy.name(), key);
        let mut shard = self.leases.shard(hash).lock();
        // An admin operation dropped the lease since the batch was asked
        // for: the store may have granted it before the operation, so its
        // units are not kept. The store consumed them, so the request that
        // asked is admitted from them all the same.
        let lease = shard
            .get_mut(hash, |e| same(e, policy, key))
            .filter(|l| l.generation == generation);
        if !batch.is_allowed() {
            // At most one lease period: a long block lifted elsewhere does
            // not keep the key from leasing for the block's whole length.
            let wait = batch.retry_after_micros().min(self.lease_micros(policy));
            if let Some(lease) = lease {
                lease.refused_until = sent_at.saturating_add(wait);
            }
            return None;
        }
        let mut left = 0;
        if let Some(lease) = lease {
            // Timed from when the batch was asked for, so it never outlives a window.
            let lease_micros = self.lease_micros(policy);
            lease.units = amount.saturating_sub(cost);
            lease.expires_at = sent_at.saturating_add(lease_micros);
            lease.hot_until = lease.expires_at.saturating_add(lease_micros);
            lease.limit = batch.limit();
            lease.remaining = batch.remaining();
            lease.reset_at = sent_at.saturating_add(batch.reset_after_micros());
            left = lease.units;
            self.batches.fetch_add(1, Ordering::Relaxed);
        }
        Some(Decision::allow(
            batch.limit(),
            batch.remaining().saturating_add(left).min(batch.limit()),
            batch.reset_after_micros(),
        ))
    }
}

impl<S: Store, C: Clock> Store for LeasedStore<S, C> {
    type CheckFuture = BoxFuture<Decision>;
    type CheckAllFuture = S::CheckAllFuture;
    type ReleaseFuture = S::ReleaseFuture;
    type RenewFuture = S::RenewFuture;

    fn check(&self, user_key: &[u8], policy: &Policy, cost: u64) -> Self::CheckFuture {
        let batch = self.inner.batch.min(policy.max_cost());
        if !leasable(policy, cost, batch) {
            return Box::pin(self.inner.store.check(user_key, policy, cost));
        }
        let inner = Arc::clone(&self.inner);
        let (policy, user_key) = (policy.clone(), user_key.to_vec());
        Box::pin(async move {
            let normalized = key::normalize(&user_key).into_owned();
            // A waiter looks again after each batch lands; after a few
            // batches that others spent first, it asks for itself.
            for _ in 0..16 {
                match inner.step(&policy, &normalized, cost) {
                    Step::Spent(decision) => return Ok(decision),
                    Step::Single => break,
                    Step::Wait(notify) => {
                        let landed = notify.notified();
                        // The fetch may have ended between the step and now.
                        if inner.fetching(&policy, &normalized, &notify) {
                            landed.await;
                        }
                    }
                    Step::Fetch(guard, generation) => {
                        let sent_at = inner.clock.now();
                        let answer = inner.store.check(&user_key, &policy, batch).await?;
                        let spent = inner.landed(
                            &policy,
                            &normalized,
                            (sent_at, generation),
                            batch,
                            cost,
                            &answer,
                        );
                        drop(guard);
                        match spent {
                            Some(decision) => return Ok(decision),
                            None => break,
                        }
                    }
                }
            }
            inner.store.check(&user_key, &policy, cost).await
        })
    }

    /// Several limits go to the inner store as they are (not leased).
    fn check_all(&self, checks: &[Check<'_>]) -> Self::CheckAllFuture {
        self.inner.store.check_all(checks)
    }

    fn release(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::ReleaseFuture {
        self.inner.store.release(key, policy, permit)
    }

    /// Settles in the inner store, where every leased unit was consumed
    /// when its batch was granted: a reservation spent from a lease
    /// consumed its units there already, so charging or giving back the
    /// difference there counts exactly what the request cost, and the units
    /// still on lease stay counted as consumed. A limit the settlement
    /// leaves in debt (denied even to a peek) also drops this instance's
    /// lease of the key once the store answered, so the debt takes effect
    /// here at once, as a penalty through this instance does; other
    /// instances spend at most their leased units before they see it (see
    /// [`LeasedStore`]).
    fn supports_settlement(&self, policy: &Policy) -> bool {
        self.inner.store.supports_settlement(policy)
    }

    fn settle(&self, id: SettlementId, settles: &[Settle<'_>]) -> SettleFuture {
        let call = self.inner.store.settle(id, settles);
        let keys: Vec<(String, Vec<u8>)> = settles
            .iter()
            .map(|s| name_and_key(s.policy, s.key))
            .collect();
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            let decisions = call.await?;
            for ((policy, key), decision) in keys.iter().zip(&decisions) {
                if !decision.is_allowed() {
                    inner.forget(policy, key);
                }
            }
            Ok(decisions)
        })
    }

    fn renew(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::RenewFuture {
        self.inner.store.renew(key, policy, permit)
    }
}

/// Forwards `call`, an admin operation on `key` under `policy`, dropping
/// this instance's lease of the key before the call and once it answered
/// (whatever it answered), so that a batch granted before the operation is
/// not spent after it.
fn dropping_lease<S, C, T>(
    inner: &Arc<Inner<S, C>>,
    key: &[u8],
    policy: &Policy,
    call: impl Future<Output = Result<T, StoreError>> + Send + 'static,
) -> BoxFuture<T>
where
    S: Send + Sync + 'static,
    C: Send + Sync + 'static,
    T: Send + 'static,
{
    inner.forget(policy.name(), &key::normalize(key));
    forgetting(inner, key, policy, call)
}

/// Every operation goes to the inner store. All but [`peek`](AdminStore::peek)
/// also drop this instance's lease of the key (see [`LeasedStore`]), so
/// that a block, a penalty, a reset or a reward takes effect on this
/// instance at once. A peek reports the store's budget, without the units
/// this instance holds on lease.
impl<S: AdminStore, C: Clock> AdminStore for LeasedStore<S, C> {
    type DecisionFuture = BoxFuture<Decision>;
    type UpdateFuture = BoxFuture<()>;

    fn peek(&self, key: &[u8], policy: &Policy) -> Self::DecisionFuture {
        Box::pin(self.inner.store.peek(key, policy))
    }

    fn reset(&self, key: &[u8], policy: &Policy) -> Self::UpdateFuture {
        let call = self.inner.store.reset(key, policy);
        dropping_lease(&self.inner, key, policy, call)
    }

    fn penalize(&self, key: &[u8], policy: &Policy, amount: u64) -> Self::DecisionFuture {
        let call = self.inner.store.penalize(key, policy, amount);
        dropping_lease(&self.inner, key, policy, call)
    }

    fn reward(&self, key: &[u8], policy: &Policy, amount: u64) -> Self::DecisionFuture {
        let call = self.inner.store.reward(key, policy, amount);
        dropping_lease(&self.inner, key, policy, call)
    }

    fn block(&self, key: &[u8], policy: &Policy, duration: Duration) -> Self::UpdateFuture {
        let call = self.inner.store.block(key, policy, duration);
        dropping_lease(&self.inner, key, policy, call)
    }

    fn unblock(&self, key: &[u8], policy: &Policy) -> Self::UpdateFuture {
        let call = self.inner.store.unblock(key, policy);
        dropping_lease(&self.inner, key, policy, call)
    }
}
