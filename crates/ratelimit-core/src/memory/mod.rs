//! [`MemoryStore`]: the embedded, in-process store.

use std::borrow::Cow;
use std::fmt;
use std::future::{Ready, ready};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use hashbrown::HashTable;
use parking_lot::{RwLock, RwLockWriteGuard};

use crate::admin::{Adjustment, AdminStore, block_micros, blocked, blocked_decision};
use crate::algorithm::concurrency::{Concurrency, ConcurrencyState};
use crate::algorithm::gcra::GcraState;
use crate::clock::{Clock, MonotonicClock};
use crate::policy::{Algorithm, State};
use crate::settle::{Part, Settle, SettleFuture, SettlementId};
use crate::store::{Check, Merged, RefundFuture, Store};
use crate::{Decision, PermitId, Policy, StoreError, key};

mod blocks;
mod hot;
#[cfg(test)]
mod hot_tests;
mod keys;
#[cfg(test)]
mod settle_tests;
mod shard;

use blocks::*;
use hot::*;
use keys::*;
use shard::*;

/// The default bound on the number of keys a [`MemoryStore`] holds.
pub(crate) const DEFAULT_MAX_KEYS: usize = 1_000_000;

const DEFAULT_SHARDS: usize = 64;

/// An in-process store: no server, exact decisions, safe under many threads.
///
/// State is split into shards, each behind its own short-lived lock, so threads
/// deciding for different keys rarely meet; one decision is one hash lookup and
/// one state update under one shard lock. A GCRA check of a key that has its
/// state already takes the lock's shared side and updates the key's state
/// with one compare-and-swap, so threads checking one hot key do not queue
/// behind each other; a denied GCRA key of up to 15 bytes becomes its
/// shard's hot key (one per shard), whose denials are decided with no lock
/// at all, so they write nothing that other cores read.
///
/// # Bounded memory
///
/// The store holds at most [`max_keys`](MemoryStoreBuilder::max_keys) keys
/// (default 1,000,000): the shards share one budget of `max_keys`,
/// so any `max_keys` distinct keys are held whichever shards they fall in,
/// and never one more. There is no background task:
///
/// - a key whose state is back to fresh (its window passed, its bucket refilled)
///   is worth nothing and is dropped as soon as it is seen, and expired keys are
///   swept (from the key's own shard first, then from the others) whenever the
///   store is full;
/// - when the store is full and nothing in it has expired, a request for a
///   **new** key gets [`StoreError::Full`]; existing keys keep being served
///   exactly.
///   Evicting live state instead would hand its owner a fresh budget (a bypass),
///   so the store refuses and lets the caller's failure policy decide (the
///   tower layer fails open, fails closed or falls back as configured);
/// - blocks ([`AdminStore::block`]) count as keys too, expire when they end,
///   and a block of a new key in a full store is [`StoreError::Full`];
/// - the state inside a key is bounded too: a sliding log holds at most
///   `2 × 1024` entries of 16 bytes (32 KiB) whatever its limit (see
///   [`sliding_window_log`](crate::algorithm::sliding_window_log)), and a
///   concurrency key one lease per held permit, at most `max`.
///
/// # Example
///
/// ```
/// use ratelimit_core::{MemoryStore, Policy, Store};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let policy = Policy::fixed_window(2, Duration::from_secs(10))?;
/// assert!(store.check(b"alice", &policy, 1).await?.is_allowed());
/// assert!(store.check(b"alice", &policy, 1).await?.is_allowed());
/// let third = store.check(b"alice", &policy, 1).await?;
/// assert!(!third.is_allowed());
/// assert!(third.retry_after().is_some());
/// # Ok(())
/// # }
/// ```
pub struct MemoryStore<C = MonotonicClock> {
    shared: Arc<Shared<C>>,
}

impl<C> Clone for MemoryStore<C> {
    fn clone(&self) -> Self {
        MemoryStore {
            shared: Arc::clone(&self.shared),
        }
    }
}

struct Shared<C> {
    shards: Box<[Shard]>,
    shard_mask: u64,
    /// Keys held in every shard, plus room reserved by writers (see
    /// [`ShardInner::counted`]); never above `max_keys`. On a line of its
    /// own: writers of new keys write it, and every check reads the fields
    /// around it.
    held: CacheLine<AtomicUsize>,
    max_keys: usize,
    clock: C,
    hasher: foldhash::fast::RandomState,
    permit_ids: crate::decision::PermitIds,
}

/// Configures a [`MemoryStore`].
#[derive(Debug)]
pub struct MemoryStoreBuilder<C = MonotonicClock> {
    max_keys: usize,
    shards: usize,
    clock: C,
}

impl MemoryStoreBuilder<MonotonicClock> {
    fn new() -> Self {
        MemoryStoreBuilder {
            max_keys: DEFAULT_MAX_KEYS,
            shards: DEFAULT_SHARDS,
            clock: MonotonicClock::new(),
        }
    }
}

impl<C: Clock> MemoryStoreBuilder<C> {
    /// The most keys the store holds (at least 1, default 1,000,000). See
    /// [`MemoryStore`] for what happens at the bound.
    #[must_use]
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// The number of shards, rounded up to a power of two (default 64). Never
    /// more than `max_keys`.
    #[must_use]
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards.clamp(1, 1 << 16);
        self
    }

    /// The clock decisions are made with (default: [`MonotonicClock`]). A
    /// reading past `u64::MAX / 4` µs counts as that one: time stops there,
    /// and no state's time overflows.
    pub fn clock<C2: Clock>(self, clock: C2) -> MemoryStoreBuilder<C2> {
        MemoryStoreBuilder {
            max_keys: self.max_keys,
            shards: self.shards,
            clock,
        }
    }

    /// Builds the store.
    pub fn build(self) -> MemoryStore<C> {
        let mut shards = self.shards.next_power_of_two();
        while shards > self.max_keys {
            shards /= 2;
        }
        let shards = shards.max(1);
        let hasher = foldhash::fast::RandomState::default();
        MemoryStore {
            shared: Arc::new(Shared {
                shards: (0..shards).map(|_| Shard::new(hasher.clone())).collect(),
                shard_mask: (shards - 1) as u64,
                held: CacheLine(AtomicUsize::new(0)),
                max_keys: self.max_keys,
                clock: self.clock,
                hasher,
                permit_ids: crate::decision::PermitIds::new(),
            }),
        }
    }
}

impl MemoryStore<MonotonicClock> {
    /// A store with the defaults: at most 1,000,000 keys, the monotonic clock.
    pub fn new() -> Self {
        MemoryStoreBuilder::new().build()
    }

    /// Configures a store.
    pub fn builder() -> MemoryStoreBuilder<MonotonicClock> {
        MemoryStoreBuilder::new()
    }
}

impl Default for MemoryStore<MonotonicClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C> fmt::Debug for MemoryStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.shared.shards.len())
            .field("max_keys", &self.shared.max_keys)
            .finish_non_exhaustive()
    }
}

impl<C: Clock> MemoryStore<C> {
    /// The number of keys held now (live or not yet reclaimed), each state
    /// and each block ([`AdminStore::block`]) counting as one.
    pub fn len(&self) -> usize {
        self.shared.shards.iter().map(|s| s.lock.read().len()).sum()
    }

    /// Whether the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The configured bound on keys.
    pub fn max_keys(&self) -> usize {
        self.shared.max_keys
    }

    /// The store's clock.
    pub fn clock(&self) -> &C {
        &self.shared.clock
    }

    fn hash(&self, policy: &Policy, key: &MemoryKey<'_>) -> u64 {
        key_hash(&self.shared.hasher, policy.name_hash(), key)
    }

    fn shard_index(&self, hash: u64) -> usize {
        // The table uses the low bits and the top seven; shard on the middle.
        ((hash >> 32) & self.shared.shard_mask) as usize
    }

    /// Shard `index`'s lock, exclusively.
    fn write_shard(&self, index: usize) -> ShardGuard<'_> {
        let shard = &self.shared.shards[index];
        ShardGuard::new(shard, shard.lock.write(), &self.shared.held.0)
    }

    /// Reserves room for `extra` new keys in `shard` (held exclusively):
    /// within the store's budget as it is, else after sweeping expired keys
    /// from `shard`, else after sweeping them from the other shards (those
    /// no other thread holds). False when the store is still full.
    fn make_room(&self, shard: &mut ShardGuard<'_>, now: u64, extra: usize) -> bool {
        if shard.reserve(extra, self.shared.max_keys) {
            return true;
        }
        if shard.sweep(now) {
            shard.settle();
            if shard.reserve(extra, self.shared.max_keys) {
                return true;
            }
        }
        self.sweep_others(now) && shard.reserve(extra, self.shared.max_keys)
    }

    /// Sweeps expired keys from every shard that has some and that no one
    /// holds now (the caller's own shards are held, so they are skipped);
    /// true when any was swept.
    #[cold]
    #[inline(never)]
    fn sweep_others(&self, now: u64) -> bool {
        let mut swept = false;
        for shard in &*self.shared.shards {
            let due = shard.lock.try_read().is_some_and(|s| now >= s.next_expiry);
            if !due {
                continue;
            }
            if let Some(inner) = shard.lock.try_write() {
                let mut guard = ShardGuard::new(shard, inner, &self.shared.held.0);
                swept |= guard.sweep(now);
            }
        }
        swept
    }

    fn permit_for(&self, policy: &Policy) -> PermitId {
        self.shared.permit_ids.next_for(policy)
    }

    fn full(&self) -> StoreError {
        StoreError::Full {
            max_keys: self.shared.max_keys,
        }
    }

    /// [`Store::check`], synchronously.
    // Inlined into the caller, so the decision of the shared path (below) is
    // written where the caller keeps it; every other path is out of line.
    #[inline]
    pub fn check_now(
        &self,
        key: &[u8],
        policy: &Policy,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        policy.check_cost(cost)?;
        let key = MemoryKey::new(key);
        let hash = self.hash(policy, &key);
        let early = read_clock(&self.shared.clock);
        let shard = &self.shared.shards[self.shard_index(hash)];
        if let Some(decision) = check_shared(shard, hash, policy, &key, early, cost) {
            return Ok(decision);
        }
        self.check_exclusive(hash, policy, &key, early, cost)
    }

    /// [`check_now`](Self::check_now) under the shard's exclusive lock:
    /// every check [`check_shared`] does not decide.
    #[inline(never)]
    fn check_exclusive(
        &self,
        hash: u64,
        policy: &Policy,
        key: &MemoryKey<'_>,
        early: u64,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let permit = self.permit_for(policy);
        let mut shard = self.write_shard(self.shard_index(hash));
        let now = shard.now(&self.shared.clock, Some(early));
        let left = shard.block_left(hash, policy, key, now);
        if left > 0 {
            return shard.blocked_check(hash, policy, key, now, cost, left);
        }
        if let Some(tat) = shard.tat_mut(hash, policy, key) {
            let mut state = GcraState { tat: *tat };
            let decision = decide_word(policy, &mut state, now, cost)?;
            shard.set_word(hash, policy, key, state.tat, now);
            return Ok(decision);
        }
        match shard
            .table
            .find_entry(hash, |e| e.matches(hash, policy, key))
        {
            Ok(mut occupied) => {
                let entry = occupied.get_mut();
                forget_if_expired(entry, policy, now);
                let decision = policy
                    .algorithm()
                    .decide(&mut entry.state, now, cost, permit)
                    .ok_or_else(|| conflict(policy))?;
                let reset = decision.reset_after_micros();
                let wrote = decision.is_allowed() && cost > 0;
                if let Some(expires_at) = keep_until(wrote, entry.expires_at, now, reset) {
                    entry.expires_at = expires_at;
                    shard.next_expiry = shard.next_expiry.min(expires_at);
                } else {
                    occupied.remove();
                }
                Ok(decision)
            }
            Err(_) => {
                let mut state = policy.algorithm().new_state();
                let decision = policy
                    .algorithm()
                    .decide(&mut state, now, cost, permit)
                    .ok_or_else(|| conflict(policy))?;
                let reset = decision.reset_after_micros();
                if reset > 0 {
                    if !self.make_room(&mut shard, now, 1) {
                        return Err(self.full());
                    }
                    shard.put_state(hash, policy, key, state, true, now, reset);
                }
                Ok(decision)
            }
        }
    }

    /// [`Store::check_all`], synchronously.
    pub fn check_all_now(&self, checks: &[Check<'_>]) -> Result<Vec<Decision>, StoreError> {
        // Duplicates are one check of their summed cost, as on every store.
        let merged = Merged::checks(checks, |c| (c.policy.name(), key::normalize(c.key)))?;
        if !merged.is_distinct() {
            let decisions = self.check_all_now(&merged.items)?;
            return crate::store::spread(&merged.of, &decisions);
        }
        struct Item<'a> {
            hash: u64,
            shard: usize,
            key: MemoryKey<'a>,
            policy: &'a Policy,
            /// Index of the working state this check uses (shared by duplicates).
            slot: usize,
        }
        struct Slot {
            state: State,
            original: Option<State>,
            existed: bool,
            reset: u64,
            /// Whether a check of a positive cost decided on it.
            wrote: bool,
        }

        let mut items = Vec::with_capacity(checks.len());
        for check in checks {
            check.policy.check_cost(check.cost)?;
            let key = MemoryKey::new(check.key);
            let hash = self.hash(check.policy, &key);
            items.push(Item {
                hash,
                shard: self.shard_index(hash),
                key,
                policy: check.policy,
                slot: usize::MAX,
            });
        }
        let mut order: Vec<usize> = items.iter().map(|i| i.shard).collect();
        order.sort_unstable();
        order.dedup();
        // Locks are always taken in shard order, so two multi-checks never deadlock.
        let mut guards: Vec<(usize, ShardGuard<'_>)> =
            order.iter().map(|&i| (i, self.write_shard(i))).collect();
        let guard_of = |shard: usize| order.binary_search(&shard).unwrap_or(0);
        let now = read_clock(&self.shared.clock);
        for (_, guard) in &mut guards {
            guard.latest = guard.latest.max(now);
        }
        // How long each check's key stays blocked (0: not blocked).
        let blocked_for: Vec<u64> = items
            .iter()
            .map(|item| {
                guards[guard_of(item.shard)]
                    .1
                    .block_left(item.hash, item.policy, &item.key, now)
            })
            .collect();

        let mut slots: Vec<Slot> = Vec::with_capacity(items.len());
        for i in 0..items.len() {
            let earlier = (0..i).find(|&j| {
                items[j].hash == items[i].hash
                    && items[j].policy.name() == items[i].policy.name()
                    && items[j].key == items[i].key
            });
            items[i].slot = match earlier {
                Some(j) => items[j].slot,
                None => {
                    let item = &items[i];
                    let guard = &guards[guard_of(item.shard)].1;
                    let (state, existed) = guard.state_of(item.hash, item.policy, &item.key, now);
                    slots.push(Slot {
                        original: Some(state.clone()),
                        state,
                        existed,
                        reset: 0,
                        wrote: false,
                    });
                    slots.len() - 1
                }
            };
        }

        let mut decisions = Vec::with_capacity(items.len());
        for ((item, check), &left) in items.iter().zip(checks).zip(&blocked_for) {
            let permit = self.permit_for(item.policy);
            let slot = &mut slots[item.slot];
            let algorithm = item.policy.algorithm();
            // A blocked key is denied (so nothing at all is consumed) and
            // its state is left as it is.
            let decision = if left > 0 {
                blocked_decision(algorithm, &slot.state, now, check.cost, left)
            } else {
                algorithm.decide(&mut slot.state, now, check.cost, permit)
            }
            .ok_or_else(|| conflict(item.policy))?;
            slot.reset = decision.reset_after_micros();
            slot.wrote |= check.cost > 0;
            decisions.push(decision);
        }

        if !crate::store::all_allowed(&decisions) {
            // Nothing is consumed; the limits that would have allowed report a peek.
            for ((item, decision), _) in items.iter().zip(decisions.iter_mut()).zip(checks) {
                if decision.is_allowed() {
                    let mut state = slots[item.slot]
                        .original
                        .clone()
                        .unwrap_or_else(|| item.policy.algorithm().new_state());
                    if let Some(peek) =
                        item.policy
                            .algorithm()
                            .decide(&mut state, now, 0, PermitId(0))
                    {
                        *decision = peek;
                    }
                }
            }
            return Ok(decisions);
        }

        // Room first, so that a full store fails the whole request before any write.
        let mut inserts = vec![0usize; order.len()];
        let mut first_of_slot = vec![usize::MAX; slots.len()];
        for (i, item) in items.iter().enumerate() {
            if first_of_slot[item.slot] == usize::MAX {
                first_of_slot[item.slot] = i;
                let slot = &slots[item.slot];
                if !slot.existed && slot.reset > 0 {
                    inserts[guard_of(item.shard)] += 1;
                }
            }
        }
        for (g, extra) in inserts.iter().enumerate() {
            if *extra > 0 && !self.make_room(&mut guards[g].1, now, *extra) {
                return Err(self.full());
            }
        }
        for (slot_index, &i) in first_of_slot.iter().enumerate() {
            let item = &items[i];
            let slot = &mut slots[slot_index];
            let guard = &mut guards[guard_of(item.shard)].1;
            let state = std::mem::replace(&mut slot.state, State::Gcra(Default::default()));
            guard.put_state(
                item.hash,
                item.policy,
                &item.key,
                state,
                slot.wrote,
                now,
                slot.reset,
            );
        }
        Ok(decisions)
    }

    /// [`Store::settle`], synchronously: every limit is settled under the
    /// locks of all their shards at once (taken in shard order, as
    /// [`check_all_now`](Self::check_all_now) takes them), or none is.
    ///
    /// Each shard remembers the newest 256 settlements applied to its keys
    /// (by key and id), so the same settlement sent again changes nothing
    /// while it is remembered. (This store never sends anything twice
    /// itself; a caller may.)
    pub fn settle_now(
        &self,
        id: SettlementId,
        settles: &[Settle<'_>],
    ) -> Result<Vec<Decision>, StoreError> {
        struct Item<'a> {
            hash: u64,
            shard: usize,
            key: MemoryKey<'a>,
            part: Part<'a>,
        }
        struct Outcome {
            state: State,
            existed: bool,
            peek: Decision,
            /// Whether the settlement changes the state (not a replay, and
            /// the cost differs from the reservation).
            changes: bool,
        }

        let merged = Merged::settles(settles, |s| (s.policy.name(), key::normalize(s.key)))?;
        let items: Vec<Item<'_>> = merged
            .items
            .iter()
            .map(|part| {
                let key = MemoryKey::new(part.key);
                let hash = self.hash(part.policy, &key);
                Item {
                    hash,
                    shard: self.shard_index(hash),
                    key,
                    part: *part,
                }
            })
            .collect();
        let mut order: Vec<usize> = items.iter().map(|i| i.shard).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<ShardGuard<'_>> = order.iter().map(|&i| self.write_shard(i)).collect();
        let guard_of = |shard: usize| order.binary_search(&shard).unwrap_or(0);
        let now = read_clock(&self.shared.clock);
        for guard in &mut guards {
            guard.latest = guard.latest.max(now);
        }

        // Every transition first, on copies of the states: a conflict fails
        // the call before anything is written.
        let mut outcomes = Vec::with_capacity(items.len());
        for item in &items {
            let guard = &guards[guard_of(item.shard)];
            let policy = item.part.policy;
            let (mut state, existed) = guard.state_of(item.hash, policy, &item.key, now);
            let (reserved, actual) = if guard.was_settled(item.hash, id.0) {
                (0, 0)
            } else {
                (item.part.reserved, item.part.actual)
            };
            let peek = policy
                .algorithm()
                .settle(&mut state, now, reserved, actual)
                .ok_or_else(|| conflict(policy))?;
            outcomes.push(Outcome {
                state,
                existed,
                peek,
                changes: reserved != actual,
            });
        }

        // Room next, so that a full store fails the whole call before any write.
        let mut inserts = vec![0usize; order.len()];
        for (item, outcome) in items.iter().zip(&outcomes) {
            if outcome.changes && !outcome.existed && outcome.peek.reset_after_micros() > 0 {
                inserts[guard_of(item.shard)] += 1;
            }
        }
        for (guard, &extra) in guards.iter_mut().zip(&inserts) {
            if extra > 0 && !self.make_room(guard, now, extra) {
                return Err(self.full());
            }
        }

        let mut decisions = Vec::with_capacity(items.len());
        for (item, outcome) in items.iter().zip(outcomes) {
            let guard = &mut guards[guard_of(item.shard)];
            let policy = item.part.policy;
            if outcome.changes {
                let reset = outcome.peek.reset_after_micros();
                guard.put_state(
                    item.hash,
                    policy,
                    &item.key,
                    outcome.state,
                    true,
                    now,
                    reset,
                );
                guard.remember_settled(item.hash, id.0);
            }
            let left = guard.block_left(item.hash, policy, &item.key, now);
            decisions.push(if left > 0 {
                blocked(&outcome.peek, &outcome.peek, left)
            } else {
                outcome.peek
            });
        }
        crate::store::spread(&merged.of, &decisions)
    }

    /// [`Store::release`], synchronously.
    pub fn release_now(&self, key: &[u8], policy: &Policy, permit: PermitId) {
        self.change_leases(key, policy, |algorithm, state, now| {
            algorithm.release(state, now, permit);
        });
    }

    /// [`Store::renew`], synchronously: whether the permit was still held.
    pub fn renew_now(&self, key: &[u8], policy: &Policy, permit: PermitId) -> bool {
        self.change_leases(key, policy, |algorithm, state, now| {
            algorithm.renew(state, now, permit)
        })
        .unwrap_or(false)
    }

    /// Applies `change` to the leases of a concurrency key, then drops the
    /// key when none is left, or makes it expire with its last lease (later
    /// after a renewal; sooner after a release, or when expired leases left
    /// with the change). `None` when the key holds no leases.
    fn change_leases<T>(
        &self,
        key: &[u8],
        policy: &Policy,
        change: impl FnOnce(&Concurrency, &mut ConcurrencyState, u64) -> T,
    ) -> Option<T> {
        let Algorithm::Concurrency(algorithm) = policy.algorithm() else {
            return None;
        };
        let key = MemoryKey::new(key);
        let hash = self.hash(policy, &key);
        let mut shard = self.write_shard(self.shard_index(hash));
        let now = shard.now(&self.shared.clock, None);
        let Ok(mut occupied) = shard
            .table
            .find_entry(hash, |e| e.matches(hash, policy, &key))
        else {
            return None;
        };
        let State::Concurrency(state) = &mut occupied.get_mut().state else {
            return None;
        };
        let changed = change(algorithm, state, now);
        let reset = algorithm.reset_after(state, now);
        if reset == 0 {
            occupied.remove();
        } else {
            occupied.get_mut().expires_at = now + reset;
            shard.next_expiry = shard.next_expiry.min(now + reset);
        }
        Some(changed)
    }
}

/// The admin operations' work; [`AdminStore`] answers with it at once.
impl<C: Clock> MemoryStore<C> {
    fn reset_key(&self, key: &[u8], policy: &Policy) {
        let key = MemoryKey::new(key);
        let hash = self.hash(policy, &key);
        let mut shard = self.write_shard(self.shard_index(hash));
        if let Ok(entry) = shard
            .table
            .find_entry(hash, |e| e.matches(hash, policy, &key))
        {
            entry.remove();
        }
        shard.remove_word(hash, policy, &key);
        shard.blocks.remove(hash, policy, &key);
    }

    fn block_key(&self, key: &[u8], policy: &Policy, duration: Duration) -> Result<(), StoreError> {
        let micros = block_micros(duration);
        if micros == 0 {
            self.unblock_key(key, policy);
            return Ok(());
        }
        let key = MemoryKey::new(key);
        let hash = self.hash(policy, &key);
        let mut shard = self.write_shard(self.shard_index(hash));
        let now = shard.now(&self.shared.clock, None);
        let until = now + micros;
        if !shard.blocks.extend(hash, policy, &key, until) {
            if !self.make_room(&mut shard, now, 1) {
                return Err(self.full());
            }
            shard.blocks.insert(Block {
                hash,
                policy: policy.clone(),
                hashed: key.hashed,
                key: key.bytes.into_owned().into_boxed_slice(),
                until,
            });
        }
        shard.next_expiry = shard.next_expiry.min(until);
        Ok(())
    }

    fn unblock_key(&self, key: &[u8], policy: &Policy) {
        let key = MemoryKey::new(key);
        let hash = self.hash(policy, &key);
        let mut shard = self.write_shard(self.shard_index(hash));
        shard.blocks.remove(hash, policy, &key);
    }

    fn adjust(
        &self,
        key: &[u8],
        policy: &Policy,
        adjustment: Adjustment,
        amount: u64,
    ) -> Result<Decision, StoreError> {
        adjustment.check(policy)?;
        let algorithm = policy.algorithm();
        let key = MemoryKey::new(key);
        let hash = self.hash(policy, &key);
        let mut shard = self.write_shard(self.shard_index(hash));
        let now = shard.now(&self.shared.clock, None);
        if let Some(tat) = shard.word(hash, policy, &key) {
            let mut state = State::Gcra(GcraState { tat });
            let peek = adjustment
                .apply(algorithm, &mut state, now, amount)
                .ok_or_else(|| conflict(policy))?;
            shard.put_state(
                hash,
                policy,
                &key,
                state,
                true,
                now,
                peek.reset_after_micros(),
            );
            let left = shard.block_left(hash, policy, &key, now);
            return Ok(if left > 0 {
                blocked(&peek, &peek, left)
            } else {
                peek
            });
        }
        let peek = match shard
            .table
            .find_entry(hash, |e| e.matches(hash, policy, &key))
        {
            Ok(mut occupied) => {
                let entry = occupied.get_mut();
                forget_if_expired(entry, policy, now);
                let peek = adjustment
                    .apply(algorithm, &mut entry.state, now, amount)
                    .ok_or_else(|| conflict(policy))?;
                let reset = peek.reset_after_micros();
                if reset == 0 {
                    occupied.remove();
                } else {
                    entry.expires_at = now + reset;
                    shard.next_expiry = shard.next_expiry.min(now + reset);
                }
                peek
            }
            Err(_) => {
                let mut state = algorithm.new_state();
                let peek = adjustment
                    .apply(algorithm, &mut state, now, amount)
                    .ok_or_else(|| conflict(policy))?;
                let reset = peek.reset_after_micros();
                if reset > 0 {
                    if !self.make_room(&mut shard, now, 1) {
                        return Err(self.full());
                    }
                    shard.put_state(hash, policy, &key, state, true, now, reset);
                }
                peek
            }
        };
        let left = shard.block_left(hash, policy, &key, now);
        Ok(if left > 0 {
            blocked(&peek, &peek, left)
        } else {
            peek
        })
    }
}

/// A GCRA check of a key that already has its state, under the shard's
/// shared lock: one load when denied, one compare-and-swap when allowed, so
/// checks of one key on several threads do not queue; of the shard's hot
/// key, a check that writes nothing takes no lock at all, and a denied key
/// becomes the hot key when the shard has none. `None` sends the
/// check to the exclusive path: another algorithm, no entry yet (an insert),
/// a block on the shard's key, or a peek at an expired state (the exclusive
/// path drops the entry).
///
/// Not the leaky bucket, although it keeps the same state: its decision
/// carries a delay, `slot - now`, which the caller sleeps from the real time
/// it gets the decision. At a `now` older than another thread's decision
/// (below) that delay would be too long by the difference, and the next
/// request's slot, taken from the TAT, would then come too soon after it:
/// the spacing it promises would break. The exclusive path decides at a time
/// never older than the shard's latest decision (`ShardInner::now`).
///
/// Time: `now` was read before the lock and is not ordered with the other
/// checks of the shard (the exclusive path keeps `ShardInner::latest`, this
/// one does not). That is safe for a TAT: at an earlier `now` the same TAT
/// is never more permissive (admitted when `max(tat, now) + cost × interval
/// - now <= burst × interval`, which only grows as `now` falls while
/// `tat > now`, and does not depend on `now` otherwise), the TAT only ever
/// moves later here (`max(tat, now) + cost × interval`), and each admission
/// moves it at least `cost` intervals past the time it was decided at, so
/// over any span of clock readings at most `burst + span / interval` units
/// are admitted, as in order. No field underflows: when allowed,
/// `new_tat - now <= burst × interval`; when denied, `new_tat - now` exceeds
/// it; and `reset` saturates at 0.
#[inline]
fn check_shared(
    shard: &Shard,
    hash: u64,
    policy: &Policy,
    key: &MemoryKey<'_>,
    now: u64,
    cost: u64,
) -> Option<Decision> {
    let Algorithm::Gcra(gcra) = policy.algorithm() else {
        return None;
    };
    // The hot key: a check that writes nothing is decided from one reading
    // of its TAT, without the lock (see the `hot` module). The same reading
    // under the lock would decide the same. One decision below for both, so
    // it is written once, where the caller keeps it.
    let tat = match key.short {
        Some(short) => match shard.hot_tat(hash, policy, short) {
            Some(tat) if !(cost == 0 && tat <= now) && gcra.next_tat(tat, now, cost).is_none() => {
                tat
            }
            _ => transition_shared(shard, gcra, hash, policy, key, now, cost, |inner| {
                let entry = inner.short_words.find(hash, |e| e.matches(policy, short))?;
                Some((&entry.tat, entry.policy.addr()))
            })?,
        },
        None => transition_shared(shard, gcra, hash, policy, key, now, cost, |inner| {
            let entry = inner.words.find(hash, |e| e.matches(hash, policy, key))?;
            Some((&entry.tat, 0))
        })?,
    };
    Some(gcra.decide(&mut GcraState { tat }, now, cost))
}

/// The transition of [`check_shared`] under the shard's shared lock: the
/// TAT the decision is made on. Only the TAT's transition is made under the
/// lock; the decision, a pure function of the TAT it was made on, is
/// written after the lock is released, so the lock's word is held as
/// briefly as it can be. A denied key is hot: it becomes the shard's hot
/// key, unless another is. `find` is where the key's TAT is kept, and the
/// address of its entry's policy (0 for a key that is not short), one
/// closure per table, so each caller's code knows its key's kind.
#[inline]
#[allow(clippy::too_many_arguments)] // one check's inputs and where its state is
fn transition_shared(
    shard: &Shard,
    gcra: &crate::algorithm::gcra::Gcra,
    hash: u64,
    policy: &Policy,
    key: &MemoryKey<'_>,
    now: u64,
    cost: u64,
    find: impl for<'a> FnOnce(&'a ShardInner) -> Option<(&'a AtomicU64, usize)>,
) -> Option<u64> {
    let inner = shard.lock.read();
    if inner.blocks.until(hash, policy, key).is_some() {
        return None;
    }
    let (mut stored, owner) = find(&inner)?;
    let mut tat = stored.load(Ordering::Acquire);
    // A real TAT can be `HOT` too (a clock at the end of `u64`): the entry
    // is the hot key's only if the hot key is this entry.
    if tat == HOT
        && let Some(short) = key.short
        && shard.hot.is(short, owner)
    {
        stored = &shard.hot.tat;
        tat = stored.load(Ordering::Acquire);
    }
    loop {
        if cost == 0 && tat <= now {
            return None;
        }
        let Some(next) = gcra.next_tat(tat, now, cost) else {
            drop(inner);
            if cost > 0
                && let Some(short) = key.short
                && shard.hot_is_free(now)
            {
                shard.promote(hash, policy, key, short, now);
            }
            return Some(tat);
        };
        match stored.compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(tat),
            Err(current) => tat = current,
        }
    }
}

/// Decides a request on a one-word state with `policy`: a policy conflict
/// when its algorithm is neither GCRA nor the leaky bucket.
#[inline]
fn decide_word(
    policy: &Policy,
    state: &mut GcraState,
    now: u64,
    cost: u64,
) -> Result<Decision, StoreError> {
    match policy.algorithm() {
        Algorithm::Gcra(a) => Ok(a.decide(state, now, cost)),
        Algorithm::LeakyBucket(a) => Ok(a.decide(state, now, cost)),
        _ => Err(conflict(policy)),
    }
}

/// A state past the lifetime its last write gave it is no state, as a Redis
/// key past its TTL (it may still be in the table until a sweep): under the
/// numbers that wrote it, it is back to fresh; under other numbers it would
/// not always read so.
fn forget_if_expired(entry: &mut Entry, policy: &Policy, now: u64) {
    if entry.expires_at <= now {
        entry.state = policy.algorithm().new_state();
    }
}

/// Until when an entry is kept after a decision that reports `reset`
/// (`None`: drop it now), as Redis keeps a key: a decision that wrote the
/// state sets its lifetime (and drops it when back to fresh); any other
/// keeps the lifetime the last write set. A state written under other
/// numbers (the same policy name) may look fresh to the numbers reading it
/// and still count under those that wrote it, so it stays as long as they
/// said, on both stores.
fn keep_until(wrote: bool, expires_at: u64, now: u64, reset: u64) -> Option<u64> {
    if wrote {
        (reset > 0).then(|| now + reset)
    } else if reset == 0 && expires_at <= now {
        None
    } else {
        Some(expires_at)
    }
}

fn conflict(policy: &Policy) -> StoreError {
    StoreError::PolicyConflict {
        policy: policy.name().to_owned(),
    }
}

impl<C: Clock> Store for MemoryStore<C> {
    type CheckFuture = Ready<Result<Decision, StoreError>>;
    type CheckAllFuture = Ready<Result<Vec<Decision>, StoreError>>;
    type ReleaseFuture = Ready<Result<(), StoreError>>;
    type RenewFuture = Ready<Result<bool, StoreError>>;

    fn check(&self, key: &[u8], policy: &Policy, cost: u64) -> Self::CheckFuture {
        ready(self.check_now(key, policy, cost))
    }

    fn check_at_once(&self, check: Check<'_>) -> Option<Result<Decision, StoreError>> {
        Some(self.check_now(check.key, check.policy, check.cost))
    }

    fn check_all(&self, checks: &[Check<'_>]) -> Self::CheckAllFuture {
        ready(self.check_all_now(checks))
    }

    fn release(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::ReleaseFuture {
        self.release_now(key, policy, permit);
        ready(Ok(()))
    }

    /// A [`reward`](AdminStore::reward) of `cost`, but the oldest
    /// units of a sliding log first (nothing for a concurrency policy, whose
    /// permits are released).
    fn refund(&self, key: &[u8], policy: &Policy, cost: u64, _: &Decision) -> RefundFuture {
        if cost == 0 || matches!(policy.algorithm(), Algorithm::Concurrency(_)) {
            return Box::pin(ready(Ok(())));
        }
        Box::pin(ready(
            self.adjust(key, policy, Adjustment::Refund, cost).map(drop),
        ))
    }

    /// [`settle_now`](MemoryStore::settle_now): every limit under the
    /// locks of its shards, all or nothing.
    fn settle(&self, id: SettlementId, settles: &[Settle<'_>]) -> SettleFuture {
        Box::pin(ready(self.settle_now(id, settles)))
    }

    fn supports_settlement(&self, policy: &Policy) -> bool {
        policy.supports_settlement()
    }

    fn renew(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::RenewFuture {
        ready(Ok(self.renew_now(key, policy, permit)))
    }
}

/// Every operation is done when called: its future is
/// [`std::future::Ready`], whose `into_inner` gives the answer without a
/// runtime (`store.penalize(key, &policy, 5).into_inner()`).
impl<C: Clock> AdminStore for MemoryStore<C> {
    type DecisionFuture = Ready<Result<Decision, StoreError>>;
    type UpdateFuture = Ready<Result<(), StoreError>>;

    fn peek(&self, key: &[u8], policy: &Policy) -> Self::DecisionFuture {
        ready(self.check_now(key, policy, 0))
    }

    fn reset(&self, key: &[u8], policy: &Policy) -> Self::UpdateFuture {
        self.reset_key(key, policy);
        ready(Ok(()))
    }

    fn penalize(&self, key: &[u8], policy: &Policy, amount: u64) -> Self::DecisionFuture {
        ready(self.adjust(key, policy, Adjustment::Penalize, amount))
    }

    fn reward(&self, key: &[u8], policy: &Policy, amount: u64) -> Self::DecisionFuture {
        ready(self.adjust(key, policy, Adjustment::Reward, amount))
    }

    fn block(&self, key: &[u8], policy: &Policy, duration: Duration) -> Self::UpdateFuture {
        ready(self.block_key(key, policy, duration))
    }

    fn unblock(&self, key: &[u8], policy: &Policy) -> Self::UpdateFuture {
        self.unblock_key(key, policy);
        ready(Ok(()))
    }
}

/// The last clock reading the store decides at: a later one (a manual
/// clock set near the end of `u64`) counts as this one, so that a state's
/// times (a reading plus at most a policy's span or a block's length)
/// never overflow. About 146,000 years of microseconds.
const LAST_READING: u64 = u64::MAX / 4;

/// The clock's reading, at most [`LAST_READING`].
#[inline]
fn read_clock<C: Clock>(clock: &C) -> u64 {
    clock.now().min(LAST_READING)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clock read near the end of `u64` (a manual clock set there) never
    /// makes a decision panic or wrap around: what would take a state past
    /// the end is denied, and nothing is admitted past the limit.
    #[test]
    fn a_clock_near_its_end_never_panics_nor_wraps() {
        use crate::Rate;
        use crate::clock::ManualClock;

        let second = Duration::from_secs(1);
        let policies = [
            Policy::gcra(2, Rate::per_second(1)),
            Policy::leaky_bucket(2, Rate::per_second(1)),
            Policy::token_bucket(2, Rate::per_second(1)),
            Policy::fixed_window(2, second),
            Policy::sliding_window_log(2, second),
            Policy::sliding_window_counter(2, second),
            Policy::concurrency(2, second),
        ]
        .map(|p| p.expect("valid"));
        for back in [0, 1, 1_000_000, 2_000_000, 3_000_000] {
            for policy in &policies {
                let clock = ManualClock::new(u64::MAX - back);
                let store = MemoryStore::builder().shards(1).clock(clock).build();
                let admitted = (0..4)
                    .filter(|_| {
                        store
                            .check_now(b"k", policy, 1)
                            .is_ok_and(|d| d.is_allowed())
                    })
                    .count();
                assert!(admitted <= 2, "{policy:?} {back}: admitted {admitted}");
                let _ = store.check_now(b"k", policy, 2);
                // Refused for the algorithms without adjustments, never a panic.
                let _ = store.penalize(b"k", policy, 5).into_inner();
                let _ = store.reward(b"k", policy, 1).into_inner();
                let _ = store.check_now(b"k", policy, 1);
            }
        }
    }

    #[test]
    fn a_short_key_packs_its_length_then_its_bytes() {
        for len in 0..=SHORT_KEY {
            for seed in [0u8, 7, 0x80, 0xff] {
                let key: Vec<u8> = (0..len)
                    .map(|i| seed.wrapping_add(u8::try_from(i).expect("small").wrapping_mul(37)))
                    .collect();
                let mut expected = [0; 16];
                expected[0] = u8::try_from(len).expect("small");
                expected[1..=len].copy_from_slice(&key);
                assert_eq!(
                    pack_short(&key),
                    Some(u128::from_le_bytes(expected)),
                    "{key:?}"
                );
            }
        }
        assert_eq!(pack_short(&[0; SHORT_KEY + 1]), None);
    }
}
