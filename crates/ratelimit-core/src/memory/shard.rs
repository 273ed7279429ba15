//! A shard: its lock, its tables (states of several words, one-word states
//! by key length, blocks) and what it does under its lock.

use super::keys::*;
use super::*;

/// A shard: a `parking_lot` read-write lock around its tables, and its hot
/// key beside the lock (see the `hot` module). GCRA checks of keys that
/// exist already decide on the lock's shared side (see `check_shared`), or
/// without the lock when they are of the hot key and write nothing; every
/// other path takes it exclusively.
///
/// Each shard starts a pair of cache lines of its own (the pair a
/// prefetcher fetches), so a check never contends with a neighbouring
/// shard's lock. Whether there is a hot key comes first, then the lock's
/// word and `ShardInner` right after it, so these and all a check of a short
/// key reads before its entry (the short table's header, whether there are
/// blocks) share one cache line: on many keys, where shards fall out of the
/// first-level cache, a check misses on one line of its shard, not on two.
#[repr(C, align(128))]
pub(super) struct Shard {
    /// `hash | 1` of the hot key, 0 when there is none.
    pub(super) hot_hash: AtomicU64,
    pub(super) lock: RwLock<ShardInner>,
    /// The hot key, on lines of its own.
    pub(super) hot: Hot,
}

/// A shard's table.
pub(super) type Table<T> = HashTable<T>;

/// A value on a cache line of its own, so that writing it does not evict
/// what other threads read next to it.
#[repr(align(64))]
pub(super) struct CacheLine<T>(pub(super) T);

#[repr(C)]
pub(super) struct ShardInner {
    /// The states of one word, GCRA's and the leaky bucket's (their TAT),
    /// of keys up to [`SHORT_KEY`] bytes: 32-byte entries. First: on the
    /// lock's cache line.
    pub(super) short_words: Table<ShortWordEntry>,
    /// Admin blocks, apart from the states so that a check looks here only
    /// while the shard holds a block at all (one word on the lock's line).
    pub(super) blocks: Blocks,
    /// The latest time (µs) any decision in this shard was made at. A check
    /// reads the clock before taking the lock (the read then overlaps the
    /// lock's atomic instead of waiting behind it) and uses that time only
    /// if it is not before this one; otherwise it reads the clock again under
    /// the lock, as every other path does. So the times a shard sees never go
    /// back because two threads raced to its lock.
    pub(super) latest: u64,
    /// No entry or block expires before this time (µs), so a full shard with
    /// `now < next_expiry` has nothing to sweep.
    pub(super) next_expiry: u64,
    /// The same as `short_words` for longer keys: 64-byte entries.
    pub(super) words: Table<WordEntry>,
    /// The states of more than one word (every algorithm but GCRA and the
    /// leaky bucket).
    pub(super) table: Table<Entry>,
    /// The store's hasher (`short_words` keeps no hash: it is computed
    /// again when the table grows).
    pub(super) hasher: foldhash::fast::RandomState,
    /// What the store's key budget counts for this shard: its length when
    /// its last writer let go, plus the room its writer reserved since.
    pub(super) counted: usize,
    /// The settlements applied here lately, by key hash and settlement id,
    /// oldest first: at most [`SETTLED_IDS`] (see [`MemoryStore::settle_now`]).
    pub(super) settled: std::collections::VecDeque<(u64, u128)>,
}

/// The most settlements a shard remembers, so that a settlement sent again
/// changes nothing (a few kilobytes per shard that settles at all).
pub(super) const SETTLED_IDS: usize = 256;

impl ShardInner {
    pub(super) fn new(hasher: foldhash::fast::RandomState) -> Self {
        ShardInner {
            short_words: Table::new(),
            blocks: Blocks::default(),
            latest: 0,
            next_expiry: u64::MAX,
            words: Table::new(),
            table: Table::new(),
            hasher,
            counted: 0,
            settled: std::collections::VecDeque::new(),
        }
    }

    /// Whether the settlement `id` was applied to the key of `hash` here.
    pub(super) fn was_settled(&self, hash: u64, id: u128) -> bool {
        self.settled.contains(&(hash, id))
    }

    /// Remembers that the settlement `id` was applied to the key of
    /// `hash`, forgetting the oldest beyond [`SETTLED_IDS`].
    pub(super) fn remember_settled(&mut self, hash: u64, id: u128) {
        if self.settled.len() >= SETTLED_IDS {
            self.settled.pop_front();
        }
        self.settled.push_back((hash, id));
    }
}

pub(super) struct Entry {
    pub(super) hash: u64,
    pub(super) policy: Policy,
    pub(super) key: StoredKey,
    pub(super) state: State,
    pub(super) expires_at: u64,
}

/// The state of a key under GCRA or the leaky bucket, in one cache line: its
/// theoretical arrival time (TAT), in an atomic so that a check updates it
/// under the shard's *shared* lock, by compare-and-swap
/// ([`MemoryStore::check_now`]). The TAT is its own expiry: the state is
/// fresh once the TAT is not after now, so the fast path writes one word.
///
/// Paths holding the shard's exclusive lock read and write the TAT as a plain
/// value (`get_mut`).
#[repr(align(64))]
pub(super) struct WordEntry {
    pub(super) hash: u64,
    pub(super) tat: AtomicU64,
    pub(super) policy: Policy,
    pub(super) key: StoredKey,
}

// One cache line: the first load of an entry brings all a check reads.
const _: () = assert!(std::mem::size_of::<WordEntry>() == 64);

/// Keys up to this long have their one-word state in a [`ShortWordEntry`]
/// (IPv4 addresses as text, short ids).
pub(super) const SHORT_KEY: usize = 15;

/// A [`WordEntry`] of a key up to [`SHORT_KEY`] bytes, in half a cache line
/// (twice as many entries per cache and TLB reach, as governor's slots):
/// the key packed in one `u128` (see [`MemoryKey::short`]) and compared in
/// one go; no hash kept (computed again when the table grows).
#[repr(C, align(32))]
pub(super) struct ShortWordEntry {
    pub(super) tat: AtomicU64,
    pub(super) policy: Policy,
    pub(super) key: u128,
}

const _: () = assert!(std::mem::size_of::<ShortWordEntry>() == 32);

impl ShortWordEntry {
    #[inline]
    pub(super) fn matches(&self, policy: &Policy, short: u128) -> bool {
        self.key == short && same_policy(&self.policy, policy)
    }
}

impl WordEntry {
    #[inline]
    pub(super) fn matches(&self, hash: u64, policy: &Policy, key: &MemoryKey<'_>) -> bool {
        same_stored_key(self.hash, &self.policy, &self.key, hash, policy, key)
    }
}

impl Entry {
    #[inline]
    pub(super) fn matches(&self, hash: u64, policy: &Policy, key: &MemoryKey<'_>) -> bool {
        same_stored_key(self.hash, &self.policy, &self.key, hash, policy, key)
    }
}

#[inline]
pub(super) fn same_key(
    stored_hash: u64,
    stored_policy: &Policy,
    (stored_hashed, stored_key): (bool, &[u8]),
    hash: u64,
    policy: &Policy,
    key: &MemoryKey<'_>,
) -> bool {
    stored_hash == hash
        && same_policy(stored_policy, policy)
        && *stored_key == *key.bytes
        && stored_hashed == key.hashed
}

/// [`same_key`] for the entries that keep their key as a [`StoredKey`] (both
/// tables of states of several words and of one word).
#[inline]
fn same_stored_key(
    stored_hash: u64,
    stored_policy: &Policy,
    stored_key: &StoredKey,
    hash: u64,
    policy: &Policy,
    key: &MemoryKey<'_>,
) -> bool {
    let stored_key = (stored_key.hashed(), stored_key.as_slice());
    same_key(stored_hash, stored_policy, stored_key, hash, policy, key)
}

/// Whether a state kept under `stored` is the state of `policy`: the same
/// name (parameters may differ: see `tests/redis/parameter_changes.rs`).
#[inline]
pub(super) fn same_policy(stored: &Policy, policy: &Policy) -> bool {
    stored.ptr_eq(policy) || stored.name() == policy.name()
}

/// The hash of `key` under the policy whose name hashes to `name_hash`:
/// where its entries sit in a shard and which shard. A short key hashes its
/// packed form (two multiplies, no branch on its length and no load of its
/// bytes), any other key its bytes; a key is short or not by its length
/// alone, so each key has one hash.
#[inline]
pub(super) fn key_hash(
    hasher: &foldhash::fast::RandomState,
    name_hash: u64,
    key: &MemoryKey<'_>,
) -> u64 {
    match key.short {
        Some(short) => short_key_hash(hasher, name_hash, short),
        None => hasher.hash_one((name_hash, &*key.bytes)),
    }
}

/// [`key_hash`] of a short key, from its packed form.
#[inline]
pub(super) fn short_key_hash(
    hasher: &foldhash::fast::RandomState,
    name_hash: u64,
    short: u128,
) -> u64 {
    hasher.hash_one((name_hash, short))
}

impl ShardInner {
    /// Drops the entries and blocks expired at `now`; false when nothing in
    /// the shard could have expired yet (nothing was swept).
    pub(super) fn sweep(&mut self, now: u64) -> bool {
        if now < self.next_expiry {
            return false;
        }
        self.table.retain(|e| e.expires_at > now);
        self.words.retain(|e| *e.tat.get_mut() > now);
        self.short_words.retain(|e| *e.tat.get_mut() > now);
        self.blocks.retain_after(now);
        // A TAT only moves later under the shared lock, so a bound taken
        // from it stays a lower bound of the entry's expiry.
        self.next_expiry = self
            .table
            .iter()
            .map(|e| e.expires_at)
            .chain(self.words.iter().map(|e| e.tat.load(Ordering::Relaxed)))
            .chain(
                self.short_words
                    .iter()
                    .map(|e| e.tat.load(Ordering::Relaxed)),
            )
            .chain(self.blocks.ends())
            .min()
            .unwrap_or(u64::MAX);
        true
    }

    /// Entries and blocks held.
    pub(super) fn len(&self) -> usize {
        self.table.len() + self.words.len() + self.short_words.len() + self.blocks.len()
    }

    /// The one-word state of `key` (its TAT; `None` when the key has no
    /// one-word state).
    pub(super) fn word(&self, hash: u64, policy: &Policy, key: &MemoryKey<'_>) -> Option<u64> {
        self.tat(hash, policy, key)
            .map(|tat| tat.load(Ordering::Relaxed))
    }

    /// The TAT of `key`'s one-word state, in whichever table holds it.
    #[inline]
    pub(super) fn tat(
        &self,
        hash: u64,
        policy: &Policy,
        key: &MemoryKey<'_>,
    ) -> Option<&AtomicU64> {
        match key.short {
            Some(short) => self
                .short_words
                .find(hash, |e| e.matches(policy, short))
                .map(|e| &e.tat),
            None => self
                .words
                .find(hash, |e| e.matches(hash, policy, key))
                .map(|e| &e.tat),
        }
    }

    /// [`tat`](Self::tat), to write under the exclusive lock.
    pub(super) fn tat_mut(
        &mut self,
        hash: u64,
        policy: &Policy,
        key: &MemoryKey<'_>,
    ) -> Option<&mut u64> {
        match key.short {
            Some(short) => self
                .short_words
                .find_mut(hash, |e| e.matches(policy, short))
                .map(|e| e.tat.get_mut()),
            None => self
                .words
                .find_mut(hash, |e| e.matches(hash, policy, key))
                .map(|e| e.tat.get_mut()),
        }
    }

    /// Drops `key`'s one-word state, if any.
    pub(super) fn remove_word(&mut self, hash: u64, policy: &Policy, key: &MemoryKey<'_>) {
        match key.short {
            Some(short) => {
                if let Ok(entry) = self
                    .short_words
                    .find_entry(hash, |e| e.matches(policy, short))
                {
                    entry.remove();
                }
            }
            None => {
                if let Ok(entry) = self
                    .words
                    .find_entry(hash, |e| e.matches(hash, policy, key))
                {
                    entry.remove();
                }
            }
        }
    }

    /// Sets `key`'s one-word state after a decision at `now`: a TAT is its
    /// own expiry, so the entry is kept (or made) while it is after `now`.
    /// The caller made room for a new entry.
    pub(super) fn set_word(
        &mut self,
        hash: u64,
        policy: &Policy,
        key: &MemoryKey<'_>,
        tat: u64,
        now: u64,
    ) {
        if tat <= now {
            self.remove_word(hash, policy, key);
            return;
        }
        self.next_expiry = self.next_expiry.min(tat);
        if let Some(stored) = self.tat_mut(hash, policy, key) {
            *stored = tat;
            return;
        }
        match key.short {
            Some(short) => {
                let entry = ShortWordEntry {
                    tat: AtomicU64::new(tat),
                    policy: policy.clone(),
                    key: short,
                };
                let hasher = &self.hasher;
                self.short_words.insert_unique(hash, entry, |e| {
                    short_key_hash(hasher, e.policy.name_hash(), e.key)
                });
            }
            None => {
                let entry = WordEntry {
                    hash,
                    tat: AtomicU64::new(tat),
                    policy: policy.clone(),
                    key: StoredKey::new(key),
                };
                self.words.insert_unique(hash, entry, |e| e.hash);
            }
        }
    }

    /// The state of `key` (fresh when it has none or it expired) and
    /// whether an entry holds it.
    pub(super) fn state_of(
        &self,
        hash: u64,
        policy: &Policy,
        key: &MemoryKey<'_>,
        now: u64,
    ) -> (State, bool) {
        if let Some(tat) = self.word(hash, policy, key) {
            return (State::Gcra(GcraState { tat }), true);
        }
        match self.table.find(hash, |e| e.matches(hash, policy, key)) {
            Some(e) if e.expires_at > now => (e.state.clone(), true),
            Some(_) => (policy.algorithm().new_state(), true),
            None => (policy.algorithm().new_state(), false),
        }
    }

    /// Keeps `state` as the state of `key` after a decision that reported
    /// `reset` and wrote it (`wrote`) or not, as [`keep_until`] says; a new
    /// entry only when `reset > 0` (the caller made room).
    #[allow(clippy::too_many_arguments)] // one key's identity and one decision's outcome
    pub(super) fn put_state(
        &mut self,
        hash: u64,
        policy: &Policy,
        key: &MemoryKey<'_>,
        state: State,
        wrote: bool,
        now: u64,
        reset: u64,
    ) {
        if let State::Gcra(GcraState { tat }) = state {
            self.set_word(hash, policy, key, tat, now);
            return;
        }
        match self
            .table
            .find_entry(hash, |e| e.matches(hash, policy, key))
        {
            Ok(mut occupied) => {
                let entry = occupied.get_mut();
                if let Some(expires_at) = keep_until(wrote, entry.expires_at, now, reset) {
                    entry.state = state;
                    entry.expires_at = expires_at;
                    self.next_expiry = self.next_expiry.min(expires_at);
                } else {
                    occupied.remove();
                }
            }
            Err(_) if reset > 0 => self.insert(Entry {
                hash,
                policy: policy.clone(),
                key: StoredKey::new(key),
                state,
                expires_at: now + reset,
            }),
            Err(_) => {}
        }
    }

    /// How long `key` stays blocked under `policy`, in µs (0: not blocked).
    /// A block found expired is dropped.
    #[inline]
    pub(super) fn block_left(
        &mut self,
        hash: u64,
        policy: &Policy,
        key: &MemoryKey<'_>,
        now: u64,
    ) -> u64 {
        match self.blocks.until(hash, policy, key) {
            Some(until) if until > now => until - now,
            Some(_) => {
                self.blocks.remove(hash, policy, key);
                0
            }
            None => 0,
        }
    }

    /// The decision for a check of `key` blocked for `left` more µs.
    pub(super) fn blocked_check(
        &self,
        hash: u64,
        policy: &Policy,
        key: &MemoryKey<'_>,
        now: u64,
        cost: u64,
        left: u64,
    ) -> Result<Decision, StoreError> {
        let (state, _) = self.state_of(hash, policy, key, now);
        blocked_decision(policy.algorithm(), &state, now, cost, left)
            .ok_or_else(|| conflict(policy))
    }

    /// The time a decision in this shard is made at: `early` (read before
    /// the lock was taken) unless an earlier decision here used a later
    /// time, then the clock read now.
    #[inline]
    pub(super) fn now<C: Clock>(&mut self, clock: &C, early: Option<u64>) -> u64 {
        let now = match early {
            Some(early) if early >= self.latest => early,
            _ => read_clock(clock),
        };
        self.latest = self.latest.max(now);
        now
    }

    pub(super) fn insert(&mut self, entry: Entry) {
        self.next_expiry = self.next_expiry.min(entry.expires_at);
        self.table.insert_unique(entry.hash, entry, |e| e.hash);
    }
}

/// A shard held exclusively. The shards share the store's budget of keys
/// ([`MemoryStoreBuilder::max_keys`]): room for a new key is reserved in it
/// first ([`reserve`](Self::reserve)), and what the shard's length gained or
/// lost is settled with it when the guard is dropped.
pub(super) struct ShardGuard<'a> {
    pub(super) inner: RwLockWriteGuard<'a, ShardInner>,
    /// The store's count of keys held and reserved.
    pub(super) held: &'a AtomicUsize,
}

impl<'a> ShardGuard<'a> {
    /// `shard` held exclusively (`inner`), its hot key cleared first, so
    /// that every state is in the shard's tables while it is held.
    pub(super) fn new(
        shard: &Shard,
        mut inner: RwLockWriteGuard<'a, ShardInner>,
        held: &'a AtomicUsize,
    ) -> Self {
        shard.flush_hot(&mut inner);
        ShardGuard { inner, held }
    }

    /// Brings the store's count up to the shard's length now: keys added or
    /// removed since, and room reserved and not used, are settled.
    pub(super) fn settle(&mut self) {
        let len = self.inner.len();
        let counted = self.inner.counted;
        if len > counted {
            self.held.fetch_add(len - counted, Ordering::Relaxed);
        } else if len < counted {
            self.held.fetch_sub(counted - len, Ordering::Relaxed);
        }
        self.inner.counted = len;
    }

    /// Reserves room for `extra` more keys in this shard if the store then
    /// holds at most `max_keys`; false (nothing reserved) otherwise.
    pub(super) fn reserve(&mut self, extra: usize, max_keys: usize) -> bool {
        self.settle();
        let reserved = self
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                held.checked_add(extra).filter(|&n| n <= max_keys)
            })
            .is_ok();
        if reserved {
            self.inner.counted += extra;
        }
        reserved
    }
}

impl std::ops::Deref for ShardGuard<'_> {
    type Target = ShardInner;

    fn deref(&self) -> &ShardInner {
        &self.inner
    }
}

impl std::ops::DerefMut for ShardGuard<'_> {
    fn deref_mut(&mut self) -> &mut ShardInner {
        &mut self.inner
    }
}

impl Drop for ShardGuard<'_> {
    fn drop(&mut self) {
        self.settle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_word_shares_a_line_with_what_a_short_check_reads() {
        let shard = Shard::new(Default::default());
        let start = std::ptr::from_ref(&shard) as usize;
        assert_eq!(start % 64, 0);
        assert_eq!(std::ptr::from_ref(&shard.hot_hash) as usize, start);
        let hot = std::ptr::from_ref(&shard.hot) as usize;
        assert!(hot.is_multiple_of(64) && hot - start >= 64);
        let inner = shard.lock.read();
        let end = std::ptr::from_ref(&inner.blocks) as usize + std::mem::size_of::<Blocks>();
        assert!(std::ptr::from_ref(&inner.short_words) as usize >= start);
        assert!(end - start <= 64, "{} bytes", end - start);
    }
}
