//! [`DeniedCache`]: answer known denials locally, without a round trip.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::admin::AdminStore;
use crate::bounded::KeyShards;
use crate::policy::Algorithm;
use crate::settle::{Settle, SettleFuture, SettlementId};
use crate::store::{
    BoxFuture, Check, LocalState, RefundFuture, Store, answered_then, forgetting, name_and_key,
};
use crate::{Decision, DecisionSource, PermitId, Policy, key};

/// The default bound on cached denials.
pub(crate) const DEFAULT_CACHE_ENTRIES: usize = 10_000;

/// A store wrapper that remembers denials: once the inner store denies key K
/// under policy P for a request of cost c, with `retry_after` R, requests for
/// K under P costing c or more are denied locally until R has passed, without
/// asking the inner store. An abusive client hammering one key then costs
/// nothing but a hash lookup.
///
/// It is exact: it only ever denies, and only what the inner store would deny.
/// A request costing at least c cannot pass before R, and other requests (from
/// any instance) can only push that time further. The expiry is measured from
/// when the request was *sent*, which is no later than when the store decided,
/// so the cache never outlives the denial. A policy is its parameters, not
/// only its name: a limit raised (or an algorithm changed) under the same
/// name is another policy, which no denial of the old numbers answers.
/// Concurrency denials are not cached (a release may end them early), nor
/// those of a [`FallbackStore`](crate::FallbackStore)'s fallback
/// ([`DecisionSource::Fallback`]): they are the local share of an outage,
/// not what the primary denies once it answers again. Its memory is
/// bounded: at most 10,000 denials ([`with_capacity`](Self::with_capacity)
/// sets another bound); when full, a new denial takes the place of an expired one among the next few
/// it looks at, or is not cached, so that making room costs a few steps
/// whatever the cache's size.
///
/// Denials answered from the cache have [`DecisionSource::DeniedCache`] as
/// their [`Decision::source`].
///
/// When the inner store is an [`AdminStore`], so is the cache: every
/// operation is forwarded, and a [`reset`](AdminStore::reset),
/// [`reward`](AdminStore::reward) or [`unblock`](AdminStore::unblock), which
/// can end a denial early (as can a [`refund`](Store::refund), or a
/// [`settle`](Store::settle) below the reservation), also drops
/// the cached denials of that key under the policy's name, whatever their
/// numbers (once the store has answered, whatever it answered); denials of
/// requests sent before then are not cached afterwards, so a reply in
/// flight cannot bring it back.
/// Penalties and blocks only ever lengthen denials and leave the cache as it
/// is. This holds for one cache: other instances' caches keep their denials
/// of the key until they expire.
pub struct DeniedCache<S> {
    inner: Arc<Inner<S>>,
}

struct Inner<S> {
    store: S,
    /// Cached denials, found by the policy's name and the key
    /// ([`Inner::forget`] drops those of every policy under the name).
    denials: KeyShards<Entry>,
    origin: Instant,
    hits: AtomicU64,
    /// Denials of requests sent before this time (µs) are not cached: an
    /// admin operation may have ended them (see [`Inner::forget`]).
    forgotten_at: AtomicU64,
}

#[derive(Clone, Copy)]
struct Entry {
    cost: u64,
    until_micros: u64,
    limit: u64,
    remaining: u64,
}

impl<S> Clone for DeniedCache<S> {
    fn clone(&self) -> Self {
        DeniedCache {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S> fmt::Debug for DeniedCache<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeniedCache")
            .field("hits", &self.inner.hits.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<S: Store> DeniedCache<S> {
    /// Caches the denials of `store`, at most 10,000.
    pub fn new(store: S) -> Self {
        DeniedCache::with_capacity(store, DEFAULT_CACHE_ENTRIES)
    }

    /// Caches at most `entries` denials of `store`.
    pub fn with_capacity(store: S, entries: usize) -> Self {
        DeniedCache {
            inner: Arc::new(Inner {
                store,
                denials: KeyShards::new(entries),
                origin: Instant::now(),
                hits: AtomicU64::new(0),
                forgotten_at: AtomicU64::new(0),
            }),
        }
    }

    /// How many decisions were answered from the cache.
    pub fn hits(&self) -> u64 {
        self.inner.hits.load(Ordering::Relaxed)
    }

    /// How many denials are cached now (live or not yet reclaimed).
    pub fn len(&self) -> usize {
        self.inner.denials.len()
    }

    /// Whether no denial is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The wrapped store.
    pub fn get_ref(&self) -> &S {
        &self.inner.store
    }
}

impl<S> Inner<S> {
    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// A cached denial for this request, if one still holds.
    fn lookup(&self, policy: &Policy, key: &[u8], cost: u64) -> Option<Decision> {
        let now = self.now();
        let hash = self.denials.hash(policy.name(), key);
        let shard = self.denials.shard(hash).lock();
        let entry = shard.get(hash, |(p, k)| p == policy && **k == *key)?;
        (cost >= entry.cost && now < entry.until_micros).then(|| {
            let retry = entry.until_micros - now;
            Decision::deny(entry.limit, entry.remaining, retry, retry)
                .with_source(DecisionSource::DeniedCache)
        })
    }

    fn remember(&self, policy: &Policy, key: &[u8], cost: u64, sent_at: u64, decision: &Decision) {
        if decision.is_allowed()
            || decision.source() == DecisionSource::Fallback
            || matches!(policy.algorithm(), Algorithm::Concurrency(_))
        {
            return;
        }
        let hash = self.denials.hash(policy.name(), key);
        let mut shard = self.denials.shard(hash).lock();
        // Read under the shard lock that `forget` takes for this key, so a
        // denial is either dropped by it or not cached at all.
        if sent_at < self.forgotten_at.load(Ordering::Relaxed) {
            return;
        }
        let entry = Entry {
            cost,
            until_micros: sent_at.saturating_add(decision.retry_after_micros()),
            limit: decision.limit(),
            remaining: decision.remaining(),
        };
        if let Some(cached) = shard.get_mut(hash, |(p, k)| p == policy && **k == *key) {
            *cached = entry;
            return;
        }
        let now = self.now();
        shard.insert(hash, (policy.clone(), key.into()), entry, |e| {
            e.until_micros <= now
        });
    }
}

impl<S> LocalState for Inner<S> {
    /// Drops the cached denials of `key` (normalized) under the policy named
    /// `policy`, whatever its parameters (they share the key's state), after
    /// an admin operation that may have ended them. A check sent before now
    /// may still bring back an old denial: those are not cached any more.
    fn forget(&self, policy: &str, key: &[u8]) {
        let hash = self.denials.hash(policy, key);
        let mut shard = self.denials.shard(hash).lock();
        self.forgotten_at
            .fetch_max(self.now().saturating_add(1), Ordering::Relaxed);
        shard.remove_all(hash, |(p, k)| p.name() == policy && **k == *key);
    }
}

impl<S: Store> Store for DeniedCache<S> {
    type CheckFuture = BoxFuture<Decision>;
    type CheckAllFuture = S::CheckAllFuture;
    type ReleaseFuture = S::ReleaseFuture;
    type RenewFuture = S::RenewFuture;

    fn check(&self, user_key: &[u8], policy: &Policy, cost: u64) -> Self::CheckFuture {
        // A cost the policy can never admit is the caller's mistake, whatever
        // the cache holds.
        if let Err(e) = policy.check_cost(cost) {
            return Box::pin(std::future::ready(Err(e)));
        }
        let normalized = key::normalize(user_key);
        if cost > 0
            && let Some(denied) = self.inner.lookup(policy, &normalized, cost)
        {
            self.inner.hits.fetch_add(1, Ordering::Relaxed);
            return Box::pin(std::future::ready(Ok(denied)));
        }
        let sent_at = self.inner.now();
        let call = self.inner.store.check(user_key, policy, cost);
        let inner = Arc::clone(&self.inner);
        let (policy, normalized) = (policy.clone(), normalized.into_owned());
        Box::pin(async move {
            let decision = call.await?;
            inner.remember(&policy, &normalized, cost, sent_at, &decision);
            Ok(decision)
        })
    }

    /// Several limits go to the inner store as they are (not cached).
    fn check_all(&self, checks: &[Check<'_>]) -> Self::CheckAllFuture {
        self.inner.store.check_all(checks)
    }

    fn release(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::ReleaseFuture {
        self.inner.store.release(key, policy, permit)
    }

    /// Refunds in the inner store, then drops the cached denials of the key
    /// under the policy's name, as a [`reward`](AdminStore::reward) does:
    /// the units given back may end a denial before its retry time, and
    /// the cache denies only what the store would.
    fn refund(&self, key: &[u8], policy: &Policy, cost: u64, decision: &Decision) -> RefundFuture {
        let call = self.inner.store.refund(key, policy, cost, decision);
        forgetting(&self.inner, key, policy, call)
    }

    fn supports_settlement(&self, policy: &Policy) -> bool {
        self.inner.store.supports_settlement(policy)
    }

    /// Settles in the inner store, then, for each limit settled below its
    /// reservation, drops the cached denials of the key under the policy's
    /// name, as a refund does (the units given back may end a denial
    /// early). A settlement above the reservation only lengthens denials.
    fn settle(&self, id: SettlementId, settles: &[Settle<'_>]) -> SettleFuture {
        let call = self.inner.store.settle(id, settles);
        let given_back: Vec<(String, Vec<u8>)> = settles
            .iter()
            .filter(|s| s.actual < s.reserved)
            .map(|s| name_and_key(s.policy, s.key))
            .collect();
        if given_back.is_empty() {
            return call;
        }
        let inner = Arc::clone(&self.inner);
        answered_then(call, move || {
            for (policy, key) in &given_back {
                inner.forget(policy, key);
            }
        })
    }

    fn renew(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::RenewFuture {
        self.inner.store.renew(key, policy, permit)
    }
}

impl<S: AdminStore> AdminStore for DeniedCache<S> {
    type DecisionFuture = BoxFuture<Decision>;
    type UpdateFuture = BoxFuture<()>;

    /// Asks the inner store (a peek is never answered from the cache).
    fn peek(&self, key: &[u8], policy: &Policy) -> Self::DecisionFuture {
        Box::pin(self.inner.store.peek(key, policy))
    }

    fn reset(&self, key: &[u8], policy: &Policy) -> Self::UpdateFuture {
        let call = self.inner.store.reset(key, policy);
        forgetting(&self.inner, key, policy, call)
    }

    fn penalize(&self, key: &[u8], policy: &Policy, amount: u64) -> Self::DecisionFuture {
        Box::pin(self.inner.store.penalize(key, policy, amount))
    }

    fn reward(&self, key: &[u8], policy: &Policy, amount: u64) -> Self::DecisionFuture {
        let call = self.inner.store.reward(key, policy, amount);
        forgetting(&self.inner, key, policy, call)
    }

    fn block(&self, key: &[u8], policy: &Policy, duration: Duration) -> Self::UpdateFuture {
        Box::pin(self.inner.store.block(key, policy, duration))
    }

    fn unblock(&self, key: &[u8], policy: &Policy) -> Self::UpdateFuture {
        let call = self.inner.store.unblock(key, policy);
        forgetting(&self.inner, key, policy, call)
    }
}
