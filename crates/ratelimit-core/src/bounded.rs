//! [`BoundedMap`]: at most a fixed number of entries, room for a new one
//! found in bounded work; [`KeyShards`], the sharded maps of
//! [`DeniedCache`](crate::DeniedCache) and of `LeasedStore` built on it.

use std::hash::{BuildHasher, RandomState};

use hashbrown::HashTable;
use parking_lot::Mutex;

use crate::Policy;

/// How many entries a new entry may look at for room before it gives up:
/// the work of an insertion into a full map is bounded by this, not by the
/// map's size.
pub(crate) const ROOM_STEPS: usize = 8;

/// Entries in a vector, found through a table of their indexes by hash.
///
/// When the map is full, a clock hand walks the entries in turn, from where
/// it last stopped, and the first one the caller's `evict` agrees to give
/// up makes room (the hand is the CLOCK algorithm's: `evict` may also age
/// the entry it looks at, so an entry used since the hand last passed it
/// gets a second chance). Over many insertions each looks at a few entries
/// on average, and never more than [`ROOM_STEPS`].
///
/// Keys are compared by the caller's `eq`: entries under one hash may be
/// several (several policies' parameters under one name and key), and one
/// hash's entries can be dropped together ([`remove_all`](Self::remove_all)).
pub(crate) struct BoundedMap<K, V> {
    index: HashTable<usize>,
    slots: Vec<Slot<K, V>>,
    hand: usize,
    capacity: usize,
}

struct Slot<K, V> {
    hash: u64,
    key: K,
    value: V,
}

impl<K, V> BoundedMap<K, V> {
    /// An empty map of at most `capacity` entries (at least 1).
    pub(crate) fn new(capacity: usize) -> Self {
        BoundedMap {
            index: HashTable::new(),
            slots: Vec::new(),
            hand: 0,
            capacity: capacity.max(1),
        }
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    fn find(&self, hash: u64, eq: impl Fn(&K) -> bool) -> Option<usize> {
        let slots = &self.slots;
        self.index
            .find(hash, |&i| slots[i].hash == hash && eq(&slots[i].key))
            .copied()
    }

    /// The value of the entry under `hash` whose key `eq` accepts.
    pub(crate) fn get(&self, hash: u64, eq: impl Fn(&K) -> bool) -> Option<&V> {
        self.find(hash, eq).map(|i| &self.slots[i].value)
    }

    /// [`get`](Self::get), to change the value.
    pub(crate) fn get_mut(&mut self, hash: u64, eq: impl Fn(&K) -> bool) -> Option<&mut V> {
        self.find(hash, eq).map(|i| &mut self.slots[i].value)
    }

    /// Adds an entry whose key is not in the map (the caller looked). When
    /// the map is full, the hand offers `evict` up to [`ROOM_STEPS`]
    /// entries, and the first it agrees to give up is replaced; `None` when
    /// it agreed to none (nothing is added).
    pub(crate) fn insert(
        &mut self,
        hash: u64,
        key: K,
        value: V,
        mut evict: impl FnMut(&mut V) -> bool,
    ) -> Option<&mut V> {
        let slot = Slot { hash, key, value };
        if self.slots.len() < self.capacity {
            let i = self.slots.len();
            self.slots.push(slot);
            let slots = &self.slots;
            self.index.insert_unique(hash, i, |&j| slots[j].hash);
            return Some(&mut self.slots[i].value);
        }
        for _ in 0..ROOM_STEPS.min(self.slots.len()) {
            let i = self.hand % self.slots.len();
            self.hand = i + 1;
            if evict(&mut self.slots[i].value) {
                self.unindex(i);
                self.slots[i] = slot;
                let slots = &self.slots;
                self.index.insert_unique(hash, i, |&j| slots[j].hash);
                return Some(&mut self.slots[i].value);
            }
        }
        None
    }

    /// Calls `f` on the value of every entry under `hash` whose key `eq`
    /// accepts.
    #[cfg(feature = "lease")]
    pub(crate) fn for_each_mut(
        &mut self,
        hash: u64,
        eq: impl Fn(&K) -> bool,
        mut f: impl FnMut(&mut V),
    ) {
        for &i in self.index.iter_hash(hash) {
            let slot = &mut self.slots[i];
            if slot.hash == hash && eq(&slot.key) {
                f(&mut slot.value);
            }
        }
    }

    /// Removes every entry under `hash` whose key `eq` accepts.
    pub(crate) fn remove_all(&mut self, hash: u64, eq: impl Fn(&K) -> bool) {
        while let Some(i) = self.find(hash, &eq) {
            self.remove_at(i);
        }
    }

    /// Removes the entry in slot `i`: the last entry moves into its place.
    fn remove_at(&mut self, i: usize) {
        self.unindex(i);
        let last = self.slots.len() - 1;
        self.slots.swap_remove(i);
        if i != last {
            let slots = &self.slots;
            if let Some(moved) = self.index.find_mut(slots[i].hash, |&j| j == last) {
                *moved = i;
            }
        }
    }

    /// Drops the index of slot `i` (the slot stays).
    fn unindex(&mut self, i: usize) {
        if let Ok(entry) = self.index.find_entry(self.slots[i].hash, |&j| j == i) {
            entry.remove();
        }
    }
}

/// How many shards a [`KeyShards`] has, each behind its own lock.
const SHARDS: usize = 16;

/// One shard of a [`KeyShards`]: entries by policy (its name and
/// parameters) and normalized key.
pub(crate) type KeyShard<V> = BoundedMap<(Policy, Box<[u8]>), V>;

/// What a store wrapper keeps locally per policy and normalized key, in
/// shards behind their own locks. Entries are hashed by the policy's name
/// and the key alone, so that an admin operation on a key finds the entries
/// of every policy under the name.
pub(crate) struct KeyShards<V> {
    shards: [Mutex<KeyShard<V>>; SHARDS],
    hasher: RandomState,
}

impl<V> KeyShards<V> {
    /// Empty shards for `entries` entries in all: each holds at most its
    /// share, rounded up.
    pub(crate) fn new(entries: usize) -> Self {
        KeyShards {
            shards: std::array::from_fn(|_| Mutex::new(BoundedMap::new(entries.div_ceil(SHARDS)))),
            hasher: RandomState::new(),
        }
    }

    /// The hash of `key` under the policy named `policy`.
    pub(crate) fn hash(&self, policy: &str, key: &[u8]) -> u64 {
        self.hasher.hash_one((policy, key))
    }

    /// The shard of the entries under `hash`.
    pub(crate) fn shard(&self, hash: u64) -> &Mutex<KeyShard<V>> {
        // Bits the shard's own table does not use to place its entries.
        let index = usize::try_from((hash >> 32) % SHARDS as u64).unwrap_or(0);
        &self.shards[index]
    }

    /// Entries held in all shards.
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(key: u32) -> u64 {
        // Few distinct hashes: keys share them, as several policies under
        // one name and key do.
        u64::from(key % 7)
    }

    /// Against a model (a plain vector), through random inserts, evictions
    /// and removals: every key held is found with its value, nothing else
    /// is, and the map never holds more than its capacity.
    #[test]
    fn holds_what_a_model_holds_and_never_more_than_its_capacity() {
        // Values: (key, a counter); entries whose counter is even may go.
        let mut map: BoundedMap<u32, (u32, u32)> = BoundedMap::new(5);
        let mut model: Vec<(u32, u32)> = Vec::new();
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for step in 0..20_000u32 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let key = u32::try_from(seed % 23).unwrap();
            let found = map.get(hash(key), |k| *k == key).map(|v| v.1);
            let modelled = model.iter().find(|(k, _)| *k == key).map(|e| e.1);
            assert_eq!(found, modelled, "step {step}, key {key}");
            if seed.is_multiple_of(3) {
                map.remove_all(hash(key), |k| *k == key);
                model.retain(|(k, _)| *k != key);
            } else if found.is_none() {
                let mut gone = None;
                let added = map
                    .insert(hash(key), key, (key, step), |v| {
                        let even = v.1.is_multiple_of(2);
                        if even {
                            gone = Some(v.0);
                        }
                        even
                    })
                    .is_some();
                if let Some(k) = gone {
                    model.retain(|e| e.0 != k);
                }
                if added {
                    model.push((key, step));
                } else {
                    assert_eq!(model.len(), 5);
                }
            } else if let Some(v) = map.get_mut(hash(key), |k| *k == key) {
                v.1 += 1;
                for e in &mut model {
                    if e.0 == key {
                        e.1 += 1;
                    }
                }
            }
            assert!(map.len() <= 5);
            assert_eq!(map.len(), model.len());
        }
    }

    /// A full map whose entries all refuse to go looks at no more than
    /// [`ROOM_STEPS`] of them, and adds nothing.
    #[test]
    fn a_full_map_looks_at_a_bounded_number_of_entries() {
        let mut map = BoundedMap::new(1_000);
        for key in 0..1_000u32 {
            assert!(map.insert(u64::from(key), key, (), |_| true).is_some());
        }
        let mut looked = 0;
        let added = map.insert(5_000, 5_000, (), |_| {
            looked += 1;
            false
        });
        assert!(added.is_none());
        assert_eq!(looked, ROOM_STEPS);
        assert_eq!(map.len(), 1_000);
        // The hand moved on: the next insertion looks at the next entries,
        // and takes the first it may.
        let added = map.insert(5_001, 5_001, (), |_| true);
        assert!(added.is_some());
        let next = u32::try_from(ROOM_STEPS).unwrap();
        assert!(map.get(u64::from(next), |k| *k == next).is_none());
        assert!(map.get(5_001, |k| *k == 5_001).is_some());
    }
}
