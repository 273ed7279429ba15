//! A shard's hot key: the GCRA state of one short key held beside the
//! shard's lock, so that a check of it that writes nothing (a denial, a
//! peek) is decided from atomic loads alone, without the lock.
//!
//! Why: a shared lock is still a write to the lock's word, twice per check,
//! so threads checking one key pass that word's cache line from core to core
//! on every check, denials included. A denial of the hot key reads a line
//! that no one writes until the next admission.
//!
//! Invariants (`Shard` keeps them):
//!
//! - the hot key still has its entry in `short_words` (the key budget, the
//!   sweep and every other path see it as before), but while it is hot its
//!   state is [`Hot::tat`] and the entry's TAT is [`HOT`], which sends the
//!   shared lock's path there at no cost to other keys;
//! - the hot key is set and cleared only under the shard's exclusive lock,
//!   and every exclusive holder clears it first (`ShardGuard::new` via
//!   [`Shard::flush_hot`]), writing its TAT back to the entry, so no path
//!   that holds the lock exclusively ever sees a stale entry;
//! - under the shared lock the hot key cannot change, so admissions move
//!   [`Hot::tat`] by compare-and-swap there, as they move an entry's TAT;
//! - lock-free readers validate what they read with [`Hot::seq`] (a
//!   sequence lock made of atomics): a key and a TAT read between two equal,
//!   even readings of it were the hot key and its state at one instant.

use std::sync::atomic::fence;

use super::*;

/// The TAT an entry holds while its key is hot: its state is then
/// [`Hot::tat`]. A real TAT only reaches it on a clock at the end of `u64`,
/// so an entry holding it is the hot key's only when [`Hot::is`] says so.
pub(super) const HOT: u64 = u64::MAX;

/// The hot key's identity and state (see the module's documentation).
/// Every field is an atomic, so readers need no lock.
#[repr(C, align(64))]
#[derive(Default)]
pub(super) struct Hot {
    /// Even while the fields below are at rest, odd while an exclusive
    /// holder writes them; it moves by two per change and never wraps in
    /// practice, so a reader that sees the same even value before and after
    /// its reads read one consistent state.
    seq: AtomicU64,
    /// The key's hash (to find its entry when the key is cleared).
    hash: AtomicU64,
    /// The packed key ([`MemoryKey::short`]), low then high half.
    key: [AtomicU64; 2],
    /// The address of the entry's policy object (0: no hot key). The entry
    /// keeps that policy alive while the key is hot, so no other live policy
    /// has this address.
    policy: AtomicUsize,
    /// The hot key's TAT: its state while it is hot.
    pub(super) tat: AtomicU64,
}

impl Hot {
    /// The hot key's TAT if it is `short` under the policy at `policy`,
    /// read without the lock.
    #[inline]
    fn read(&self, short: u128, policy: usize) -> Option<u64> {
        let seq = self.seq.load(Ordering::Acquire);
        let low = self.key[0].load(Ordering::Relaxed);
        let high = self.key[1].load(Ordering::Relaxed);
        let stored_policy = self.policy.load(Ordering::Relaxed);
        let tat = self.tat.load(Ordering::Relaxed);
        // Orders the loads above before the second reading of `seq`: if any
        // of them saw a write made after a writer made `seq` odd, this
        // reading sees that odd value or a later one.
        fence(Ordering::Acquire);
        let unchanged = seq & 1 == 0 && self.seq.load(Ordering::Relaxed) == seq;
        let same = [low, high] == halves(short) && stored_policy == policy;
        (unchanged && same).then_some(tat)
    }

    /// Whether the hot key is `short` under the policy at `policy`. Under
    /// the shard's lock, where the hot key does not change.
    #[inline]
    pub(super) fn is(&self, short: u128, policy: usize) -> bool {
        self.policy.load(Ordering::Relaxed) == policy
            && [
                self.key[0].load(Ordering::Relaxed),
                self.key[1].load(Ordering::Relaxed),
            ] == halves(short)
    }

    /// Makes `short` under the policy at `policy` the hot key, with `tat`
    /// (`policy` 0: no hot key). Only under the shard's exclusive lock.
    fn set(&self, hash: u64, short: u128, policy: usize, tat: u64) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq + 1, Ordering::Relaxed);
        // A reader that sees any write below sees the odd `seq` after it.
        fence(Ordering::Release);
        self.hash.store(hash, Ordering::Relaxed);
        let [low, high] = halves(short);
        self.key[0].store(low, Ordering::Relaxed);
        self.key[1].store(high, Ordering::Relaxed);
        self.policy.store(policy, Ordering::Relaxed);
        self.tat.store(tat, Ordering::Relaxed);
        self.seq.store(seq + 2, Ordering::Release);
    }
}

/// The low and high halves of a packed key.
#[inline]
#[allow(clippy::cast_possible_truncation)] // each half on purpose
fn halves(short: u128) -> [u64; 2] {
    [short as u64, (short >> 64) as u64]
}

impl Shard {
    /// A shard with no hot key.
    pub(super) fn new(hasher: foldhash::fast::RandomState) -> Self {
        Shard {
            hot_hash: AtomicU64::new(0),
            lock: RwLock::new(ShardInner::new(hasher)),
            hot: Hot::default(),
        }
    }

    /// The TAT of the short key `short` under `policy` if it is the hot key,
    /// read without the lock. Any other key learns it is not from
    /// [`hot_hash`](Shard::hot_hash), on the line its check reads anyway.
    #[inline]
    pub(super) fn hot_tat(&self, hash: u64, policy: &Policy, short: u128) -> Option<u64> {
        if self.hot_hash.load(Ordering::Relaxed) != hash | 1 {
            return None;
        }
        self.hot.read(short, policy.addr())
    }

    /// Whether a key denied at `now` may become the hot key: there is none,
    /// or the one there is back to fresh (no longer hot). A hint, read
    /// without the lock; [`promote`](Self::promote) decides under it.
    #[inline]
    pub(super) fn hot_is_free(&self, now: u64) -> bool {
        self.hot_hash.load(Ordering::Relaxed) == 0 || self.hot.tat.load(Ordering::Relaxed) <= now
    }

    /// Makes `key` (short, `short` packed) under `policy` the hot key, if
    /// the lock is free now, the key has its state and no block, and the
    /// hot key there is (if any) back to fresh at `now`. Out of line: once
    /// per key that becomes hot.
    #[cold]
    #[inline(never)]
    pub(super) fn promote(
        &self,
        hash: u64,
        policy: &Policy,
        key: &MemoryKey<'_>,
        short: u128,
        now: u64,
    ) {
        let Some(mut inner) = self.lock.try_write() else {
            return;
        };
        if self.hot_hash.load(Ordering::Relaxed) != 0 {
            if self.hot.tat.load(Ordering::Relaxed) > now {
                return;
            }
            self.flush_hot(&mut inner);
        }
        if inner.blocks.until(hash, policy, key).is_some() {
            return;
        }
        let Some(entry) = inner
            .short_words
            .find_mut(hash, |e| e.matches(policy, short))
        else {
            return;
        };
        let tat = std::mem::replace(entry.tat.get_mut(), HOT);
        self.hot.set(hash, short, entry.policy.addr(), tat);
        self.hot_hash.store(hash | 1, Ordering::Relaxed);
    }

    /// Clears the hot key, writing its TAT back to its entry. Under the
    /// shard's exclusive lock (`inner` is its value), before anything else
    /// reads or writes the shard's states.
    pub(super) fn flush_hot(&self, inner: &mut ShardInner) {
        if self.hot_hash.load(Ordering::Relaxed) == 0 {
            return;
        }
        let hash = self.hot.hash.load(Ordering::Relaxed);
        let short = u128::from(self.hot.key[0].load(Ordering::Relaxed))
            | u128::from(self.hot.key[1].load(Ordering::Relaxed)) << 64;
        let policy = self.hot.policy.load(Ordering::Relaxed);
        let tat = self.hot.tat.load(Ordering::Relaxed);
        self.hot_hash.store(0, Ordering::Relaxed);
        self.hot.set(0, 0, 0, 0);
        let entry = inner
            .short_words
            .find_mut(hash, |e| e.key == short && e.policy.addr() == policy);
        debug_assert!(entry.is_some(), "the hot key keeps its entry");
        if let Some(entry) = entry {
            *entry.tat.get_mut() = tat;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rate;
    use crate::clock::ManualClock;
    use crate::memory::hot_tests::one_shard;

    fn is_hot(store: &MemoryStore<ManualClock>) -> bool {
        store.shared.shards[0].hot_hash.load(Ordering::Relaxed) != 0
    }

    /// A denied key becomes its shard's hot key; its checks then decide
    /// as the algorithm does on its own state, and an exclusive holder (a
    /// new key, an operator's penalty) hands that state back to its entry
    /// exactly, whatever the interleaving.
    #[test]
    fn a_hot_key_decides_as_the_algorithm_through_promotions_and_flushes() {
        let clock = ManualClock::new(1_000_000_007);
        let store = one_shard(clock.clone());
        let policy = Policy::gcra(3, Rate::per_second(1_000)).unwrap();
        let Algorithm::Gcra(gcra) = policy.algorithm() else {
            unreachable!("a GCRA policy")
        };
        let mut state = GcraState { tat: 0 };
        let (mut hot_checks, mut flushes) = (0, 0);
        for i in 0u64..400 {
            clock.advance(Duration::from_micros(i * 37 % 1_500));
            let now = clock.now();
            match i % 11 {
                3 => {
                    let was_hot = is_hot(&store);
                    let key = format!("k{i}");
                    assert!(
                        store
                            .check_now(key.as_bytes(), &policy, 1)
                            .unwrap()
                            .is_allowed()
                    );
                    assert!(!is_hot(&store));
                    flushes += u64::from(was_hot);
                }
                7 => {
                    let store_peek = store.penalize(b"hot", &policy, 2).into_inner().unwrap();
                    let peek = gcra.penalize(&mut state, now, 2);
                    assert_eq!(store_peek, peek, "penalty at step {i}");
                    assert!(!is_hot(&store));
                }
                _ => {
                    let cost = i % 3;
                    hot_checks += u64::from(is_hot(&store));
                    let decision = store.check_now(b"hot", &policy, cost).unwrap();
                    assert_eq!(decision, gcra.decide(&mut state, now, cost), "step {i}");
                }
            }
        }
        assert!(hot_checks > 100, "{hot_checks} checks of the hot key");
        assert!(flushes > 10, "{flushes} flushes");
    }

    /// A block on the hot key is seen by its next check, which is decided
    /// as blocked and not from the hot key's TAT.
    #[test]
    fn a_block_on_the_hot_key_denies_its_next_check() {
        let store = one_shard(ManualClock::new(1_000_000_007));
        let policy = Policy::gcra(1, Rate::per_hour(1)).unwrap();
        assert!(store.check_now(b"hot", &policy, 1).unwrap().is_allowed());
        assert!(!store.check_now(b"hot", &policy, 1).unwrap().is_allowed());
        assert!(is_hot(&store));
        let before = store.check_now(b"hot", &policy, 1).unwrap();
        store
            .block(b"hot", &policy, Duration::from_secs(7_200))
            .into_inner()
            .unwrap();
        let blocked = store.check_now(b"hot", &policy, 1).unwrap();
        assert!(!blocked.is_allowed());
        assert!(blocked.retry_after_micros() > before.retry_after_micros());
        assert_eq!(blocked.retry_after_micros(), 7_200_000_000);
    }
}
