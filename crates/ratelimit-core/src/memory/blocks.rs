//! A shard's admin blocks ([`AdminStore::block`]).

use super::keys::*;
use super::shard::same_key;
use super::*;

/// Every check of `key` under `policy` is denied until `until` (µs).
pub(super) struct Block {
    pub(super) hash: u64,
    pub(super) policy: Policy,
    pub(super) key: Box<[u8]>,
    /// Whether `key` is a hash ([`MemoryKey::hashed`]).
    pub(super) hashed: bool,
    pub(super) until: u64,
}

impl Block {
    #[inline]
    fn matches(&self, hash: u64, policy: &Policy, key: &MemoryKey<'_>) -> bool {
        same_key(
            self.hash,
            &self.policy,
            (self.hashed, &self.key),
            hash,
            policy,
            key,
        )
    }
}

/// A shard's blocks: no table at all while it holds none (`Some` only when
/// not empty), so that a check learns there is no block from one word on
/// the shard lock's cache line rather than from a table header of its own.
#[derive(Default)]
pub(super) struct Blocks(Option<Box<HashTable<Block>>>);

impl Blocks {
    /// Blocks held.
    pub(super) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |table| table.len())
    }

    /// The end (µs) of `key`'s block under `policy`, if it has one.
    #[inline]
    pub(super) fn until(&self, hash: u64, policy: &Policy, key: &MemoryKey<'_>) -> Option<u64> {
        let table = self.0.as_ref()?;
        table
            .find(hash, |b| b.matches(hash, policy, key))
            .map(|b| b.until)
    }

    /// Moves the end of `key`'s block to `until`; false when it has none.
    pub(super) fn extend(
        &mut self,
        hash: u64,
        policy: &Policy,
        key: &MemoryKey<'_>,
        until: u64,
    ) -> bool {
        let found = self
            .0
            .as_mut()
            .and_then(|table| table.find_mut(hash, |b| b.matches(hash, policy, key)));
        match found {
            Some(block) => {
                block.until = until;
                true
            }
            None => false,
        }
    }

    /// Adds a block of a key that has none (the caller made room).
    pub(super) fn insert(&mut self, block: Block) {
        self.0
            .get_or_insert_with(Box::default)
            .insert_unique(block.hash, block, |b| b.hash);
    }

    /// Drops `key`'s block, if any.
    pub(super) fn remove(&mut self, hash: u64, policy: &Policy, key: &MemoryKey<'_>) {
        if let Some(table) = self.0.as_mut()
            && let Ok(block) = table.find_entry(hash, |b| b.matches(hash, policy, key))
        {
            block.remove();
        }
        self.drop_if_empty();
    }

    /// Keeps the blocks that end after `now`.
    pub(super) fn retain_after(&mut self, now: u64) {
        if let Some(table) = self.0.as_mut() {
            table.retain(|b| b.until > now);
        }
        self.drop_if_empty();
    }

    /// The blocks' ends.
    pub(super) fn ends(&self) -> impl Iterator<Item = u64> + '_ {
        self.0
            .iter()
            .flat_map(|table| table.iter().map(|b| b.until))
    }

    fn drop_if_empty(&mut self) {
        if self.0.as_ref().is_some_and(|table| table.is_empty()) {
            self.0 = None;
        }
    }
}
