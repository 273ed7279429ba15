//! A shard's lock: a read-write lock whose readers, while it is *biased*,
//! announce themselves in a slot of the store's [`Readers`] instead of
//! writing the lock's word, so checks of one hot key on several threads
//! share the shard's cache line instead of passing it from core to core on
//! every check. A writer takes the lock, turns the bias off and waits for the
//! announced readers to leave; the bias comes back, on a read, once
//! [`UNBIASED_MICROS`] have passed, so a shard that is written often stays
//! an ordinary read-write lock and pays for that wait at most once per span.
//! (The scheme is BRAVO's, Dice and Kogan, "BRAVO: Biased Locking for
//! Reader-Writer Locks", USENIX ATC 2019, with a table of slots per store.)
//!
//! Why a biased read is exclusive of every writer (all four accesses below
//! are sequentially consistent, so they fall in one total order):
//!
//! - a reader announces itself (a compare-and-swap on its slot), *then*
//!   loads the bias, and reads the shard only if it is still on;
//! - a writer, holding the lock, turns the bias off, *then* loads every slot,
//!   and waits until none holds its shard.
//!
//! If the reader saw the bias on, its load came before the writer's store in
//! that order, so its announcement did too, and the writer's load of that
//! slot sees it and waits: the writer proceeds only after the reader's
//! release of the slot, which happens-before the writer's own writes. If the
//! reader's load came after the store, it sees the bias off and reads under
//! the lock instead. The bias is turned on only by a reader holding the lock
//! shared (no writer inside), so a writer that finds it off on taking the lock
//! has no biased reader to wait for: every biased reader that saw an earlier
//! "on" was waited for by the writer that turned it off. And what a biased
//! reader reads was written before the bias was turned on, by writers whose
//! release of the lock happens-before the reader that turned it on, whose
//! store the biased reader's load reads.

use std::cell::Cell;
use std::hint::spin_loop;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// How long (µs) a shard stays unbiased after a writer turned its bias off:
/// at most one wait for readers per shard per millisecond.
pub(super) const UNBIASED_MICROS: u64 = 1_000;

/// A read-write lock biased towards readers while nothing writes (see the
/// module's documentation). The bias comes first, then the lock's word and
/// the value, so a biased reader finds the bias on the line it reads anyway.
#[repr(C)]
pub(super) struct ShardLock<T> {
    biased: AtomicBool,
    lock: RwLock<T>,
    /// No reader turns the bias back on before this time (µs).
    unbiased_until: AtomicU64,
}

impl<T> ShardLock<T> {
    pub(super) fn new(value: T) -> Self {
        ShardLock {
            biased: AtomicBool::new(false),
            lock: RwLock::new(value),
            unbiased_until: AtomicU64::new(0),
        }
    }

    /// The value shared with other readers: announced in `readers` (this
    /// lock is the store's shard `id`) while the lock is biased, else under
    /// the lock's read side, turning the bias on when `now` (µs) allows.
    #[inline]
    pub(super) fn read_biased<'a>(
        &'a self,
        id: usize,
        readers: &'a Readers,
        now: u64,
    ) -> BiasedGuard<'a, T> {
        if self.biased.load(Ordering::Relaxed)
            && let Some(announced) = readers.announce(id)
            && self.biased.load(Ordering::SeqCst)
        {
            return BiasedGuard {
                lock: self,
                _held: Held::Slot(announced),
            };
        }
        self.read_locked(now)
    }

    #[inline(never)]
    fn read_locked(&self, now: u64) -> BiasedGuard<'_, T> {
        let guard = self.lock.read();
        if !self.biased.load(Ordering::Relaxed)
            && now >= self.unbiased_until.load(Ordering::Relaxed)
        {
            self.biased.store(true, Ordering::SeqCst);
        }
        BiasedGuard {
            lock: self,
            _held: Held::Lock(guard),
        }
    }

    /// The lock's read side, as a plain read-write lock (never biased).
    pub(super) fn read(&self) -> RwLockReadGuard<'_, T> {
        self.lock.read()
    }

    /// The lock's write side, once no biased reader is left (this lock is
    /// the store's shard `id`); `now` tells the time (µs), read only when
    /// the bias had to be turned off.
    #[inline]
    pub(super) fn write(
        &self,
        id: usize,
        readers: &Readers,
        now: impl FnOnce() -> u64,
    ) -> RwLockWriteGuard<'_, T> {
        let guard = self.lock.write();
        // Only a reader holding the lock turns the bias on, so under the
        // write lock this load sees the latest store.
        if self.biased.load(Ordering::Relaxed) {
            self.unbias(id, readers, now());
        }
        guard
    }

    /// [`write`](Self::write) if no one holds the lock now (this thread
    /// included), else `None` at once.
    pub(super) fn try_write(
        &self,
        id: usize,
        readers: &Readers,
        now: impl FnOnce() -> u64,
    ) -> Option<RwLockWriteGuard<'_, T>> {
        let guard = self.lock.try_write()?;
        if self.biased.load(Ordering::Relaxed) {
            self.unbias(id, readers, now());
        }
        Some(guard)
    }

    /// The lock's read side, as a plain read-write lock, if no writer holds
    /// it now (this thread included), else `None` at once. Leaves the bias
    /// as it is.
    pub(super) fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
        self.lock.try_read()
    }

    #[cold]
    #[inline(never)]
    fn unbias(&self, id: usize, readers: &Readers, now: u64) {
        self.biased.store(false, Ordering::SeqCst);
        readers.wait_for(id);
        self.unbiased_until
            .store(now.saturating_add(UNBIASED_MICROS), Ordering::Relaxed);
    }

    /// Whether readers read without the lock now (for tests).
    #[cfg(test)]
    pub(super) fn is_biased(&self) -> bool {
        self.biased.load(Ordering::SeqCst)
    }
}

/// A store's reader slots: a biased reader of shard `id` on thread `t`
/// holds slot `(t + id) mod len` (`id + 1` in it) while it reads. Threads of
/// consecutive numbers reading one shard never share a slot, nor a cache
/// line; a reader whose slot is taken reads under the lock.
pub(super) struct Readers {
    slots: Box<[Slot]>,
}

// Each slot on its own pair of cache lines (the pair a prefetcher fetches).
#[repr(align(128))]
struct Slot(AtomicUsize);

impl Readers {
    /// Twice as many slots as the machine runs threads at once, rounded up
    /// to a power of two, from 8 to 256 (at most 32 KiB).
    pub(super) fn new() -> Self {
        let threads = std::thread::available_parallelism().map_or(4, usize::from);
        let len = threads.saturating_mul(2).next_power_of_two().clamp(8, 256);
        Readers {
            slots: (0..len).map(|_| Slot(AtomicUsize::new(0))).collect(),
        }
    }

    /// Takes this thread's slot for shard `id`; `None` when another reader
    /// holds it.
    #[inline]
    fn announce(&self, id: usize) -> Option<Announced<'_>> {
        let index = thread_number().wrapping_add(id) & (self.slots.len() - 1);
        let slot = &self.slots[index].0;
        slot.compare_exchange(0, id + 1, Ordering::SeqCst, Ordering::Relaxed)
            .ok()
            .map(|_| Announced(slot))
    }

    /// Returns once no slot holds a reader of shard `id`.
    fn wait_for(&self, id: usize) {
        for slot in &*self.slots {
            let mut spins = 0u32;
            while slot.0.load(Ordering::SeqCst) == id + 1 {
                // A reader's stay is a few loads and one compare-and-swap,
                // unless its thread was preempted: then let it run.
                if spins < 100 {
                    spins += 1;
                    spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }
}

/// Shared access to a [`ShardLock`]'s value, from
/// [`ShardLock::read_biased`]: an announced slot or the lock's read side,
/// released when dropped.
pub(super) struct BiasedGuard<'a, T> {
    lock: &'a ShardLock<T>,
    _held: Held<'a, T>,
}

/// What a [`BiasedGuard`] holds.
enum Held<'a, T> {
    /// A slot, announced while the bias was on.
    Slot(#[allow(dead_code)] Announced<'a>),
    /// The lock's read side.
    Lock(#[allow(dead_code)] RwLockReadGuard<'a, T>),
}

impl<T> std::ops::Deref for BiasedGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock's read side, or a slot announced
        // while the bias was on, and no writer holds the lock or takes it
        // while either is held (see the module's documentation); readers
        // only ever get `&T`.
        #[allow(unsafe_code)]
        unsafe {
            &*self.lock.lock.data_ptr()
        }
    }
}

/// A taken slot, released when dropped.
struct Announced<'a>(&'a AtomicUsize);

impl Drop for Announced<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

/// This thread's number: 1, 2, … in the order threads first ask.
#[inline]
fn thread_number() -> usize {
    thread_local! {
        static NUMBER: Cell<usize> = const { Cell::new(0) };
    }
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    NUMBER.with(|number| {
        let mut n = number.get();
        if n == 0 {
            n = NEXT.fetch_add(1, Ordering::Relaxed);
            number.set(n);
        }
        n
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use super::*;

    /// What a writer keeps equal; a reader that saw them differ read during
    /// a write.
    #[derive(Default)]
    struct Pair {
        a: u64,
        b: u64,
    }

    #[test]
    fn a_read_turns_the_bias_on_and_a_write_turns_it_off_for_a_while() {
        let lock = ShardLock::new(Pair::default());
        let readers = Readers::new();
        assert!(!lock.is_biased());
        drop(lock.read_biased(3, &readers, 10));
        assert!(lock.is_biased());
        drop(lock.write(3, &readers, || 10));
        assert!(!lock.is_biased());
        drop(lock.read_biased(3, &readers, 10 + UNBIASED_MICROS - 1));
        assert!(!lock.is_biased(), "on again before its time");
        drop(lock.read_biased(3, &readers, 10 + UNBIASED_MICROS));
        assert!(lock.is_biased());
    }

    #[test]
    fn a_writer_waits_for_a_biased_reader_to_leave() {
        let lock = ShardLock::new(Pair::default());
        let readers = Readers::new();
        drop(lock.read_biased(0, &readers, 0));
        assert!(lock.is_biased());
        let inside = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let guard = lock.read_biased(0, &readers, 0);
                assert!(lock.is_biased(), "read under the lock, not biased");
                inside.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(50));
                inside.store(false, Ordering::SeqCst);
                drop(guard);
            });
            while !inside.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            let mut pair = lock.write(0, &readers, || 0);
            assert!(!inside.load(Ordering::SeqCst), "wrote while a reader read");
            pair.a += 1;
        });
    }

    /// Two readers and a writer on one lock, the bias turned off by every
    /// write and on again by the next read under the lock. Under Miri
    /// (`cargo +nightly miri test -p ratelimit-core --lib memory::lock`, with
    /// `MIRIFLAGS=-Zmiri-permissive-provenance` for parking_lot) a
    /// read racing a write is reported as a data race; here, as a torn pair.
    #[test]
    fn readers_never_see_a_write_in_progress() {
        let rounds: u64 = if cfg!(miri) { 50 } else { 20_000 };
        let lock = ShardLock::new(Pair::default());
        let readers = Readers::new();
        let biased_reads = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..rounds {
                        // Time past the writer's span: every read under the
                        // lock turns the bias on again.
                        let biased = lock.is_biased();
                        let (a, b) = {
                            let pair = lock.read_biased(0, &readers, UNBIASED_MICROS);
                            (pair.a, pair.b)
                        };
                        assert_eq!(a, b, "a read saw half a write");
                        biased_reads.fetch_add(u64::from(biased), Ordering::Relaxed);
                    }
                });
            }
            s.spawn(|| {
                for _ in 0..rounds {
                    let mut pair = lock.write(0, &readers, || 0);
                    pair.a += 1;
                    std::hint::black_box(&mut *pair);
                    pair.b += 1;
                }
            });
        });
        let pair = lock.read();
        assert_eq!((pair.a, pair.b), (rounds, rounds));
        assert!(
            biased_reads.load(Ordering::Relaxed) > 0,
            "no read was biased"
        );
    }
}
