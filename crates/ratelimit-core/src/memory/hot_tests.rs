//! Attacks on the hot key: a store that uses it against one that never
//! starts an operation with a hot key (its hot key is written back before
//! each), on random operations; and threads hammering hot keys while others
//! penalize, reward, settle, block, sweep and add keys, checked by the
//! units they account for.

use std::sync::atomic::AtomicBool;
use std::thread;

use proptest::prelude::*;

use super::*;
use crate::admin::Adjustment;
use crate::clock::ManualClock;
use crate::{Rate, Settle, SettlementId};

/// A store of one shard: every key competes for that shard's hot key.
pub(super) fn one_shard(clock: ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::builder().shards(1).clock(clock).build()
}

/// The policies the operations pick from: two GCRA policies under one name
/// with different numbers, a leaky bucket and a fixed window under that
/// name too, and two GCRA policies of their own names (one with the
/// longest refill a policy can have).
fn policies() -> Vec<Policy> {
    let named = |p: Result<Policy, crate::PolicyError>, name: &str| {
        p.expect("valid").with_name(name).expect("valid name")
    };
    vec![
        named(Policy::gcra(3, Rate::per_second(10)), "x"),
        named(Policy::gcra(5, Rate::per_second(4)), "x"),
        named(Policy::gcra(2, Rate::per_hour(1)), "y"),
        named(Policy::leaky_bucket(3, Rate::per_second(10)), "x"),
        named(Policy::fixed_window(3, Duration::from_secs(1)), "x"),
        // The longest refill there is: 2 units of 2^49 µs each.
        named(
            Policy::gcra(2, Rate::new(1, Duration::from_micros(1 << 49))),
            "z",
        ),
    ]
}

/// Keys of 0, 1, 15 (two, one byte apart) and 16 bytes.
const KEYS: [&[u8]; 5] = [
    b"",
    b"k",
    b"aaaaaaaaaaaaaaa",
    b"aaaaaaaaaaaaaab",
    b"aaaaaaaaaaaaaaaa",
];

#[derive(Debug, Clone)]
enum Op {
    Check(usize, usize, u64),
    Peek(usize, usize),
    Adjust(usize, usize, u8, u64),
    Block(usize, usize, u64),
    Unblock(usize, usize),
    Reset(usize, usize),
    Settle(usize, usize, u64, u64),
    CheckAll(usize, usize, u64, usize, usize, u64),
    Advance(u64),
    Back(u64),
    /// A new object for policy `i`, the old handle dropped.
    Recreate(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS.len();
    let policy = 0..6usize;
    // Small numbers, and the largest.
    let cost = prop_oneof![9 => 0..4u64, 1 => Just(u64::MAX)];
    let amount = prop_oneof![9 => 0..8u64, 1 => Just(u64::MAX)];
    let block = prop_oneof![9 => 0..3_000_000u64, 1 => Just(u64::MAX)];
    prop_oneof![
        8 => (key.clone(), policy.clone(), cost).prop_map(|(k, p, c)| Op::Check(k, p, c)),
        2 => (key.clone(), policy.clone()).prop_map(|(k, p)| Op::Peek(k, p)),
        2 => (key.clone(), policy.clone(), 0..3u8, amount)
            .prop_map(|(k, p, a, n)| Op::Adjust(k, p, a, n)),
        1 => (key.clone(), policy.clone(), block).prop_map(|(k, p, d)| Op::Block(k, p, d)),
        1 => (key.clone(), policy.clone()).prop_map(|(k, p)| Op::Unblock(k, p)),
        1 => (key.clone(), policy.clone()).prop_map(|(k, p)| Op::Reset(k, p)),
        1 => (key.clone(), policy.clone(), 0..4u64, 0..6u64)
            .prop_map(|(k, p, r, a)| Op::Settle(k, p, r, a)),
        1 => (key.clone(), policy.clone(), 0..3u64, key, policy, 0..3u64)
            .prop_map(|(k, p, c, k2, p2, c2)| Op::CheckAll(k, p, c, k2, p2, c2)),
        3 => (0..600_000u64).prop_map(Op::Advance),
        1 => (0..400_000u64).prop_map(Op::Back),
        1 => (0..6usize).prop_map(Op::Recreate),
    ]
}

/// Applies `op` to `store`; what it returned, as text.
fn apply(store: &MemoryStore<ManualClock>, policies: &[Policy], op: &Op) -> String {
    match *op {
        Op::Check(k, p, c) => format!("{:?}", store.check_now(KEYS[k], &policies[p], c)),
        Op::Peek(k, p) => format!("{:?}", store.peek(KEYS[k], &policies[p]).into_inner()),
        Op::Adjust(k, p, a, n) => {
            let adjustment =
                [Adjustment::Penalize, Adjustment::Reward, Adjustment::Refund][usize::from(a)];
            format!("{:?}", store.adjust(KEYS[k], &policies[p], adjustment, n))
        }
        Op::Block(k, p, d) => {
            let duration = Duration::from_micros(d);
            format!(
                "{:?}",
                store.block(KEYS[k], &policies[p], duration).into_inner()
            )
        }
        Op::Unblock(k, p) => format!("{:?}", store.unblock(KEYS[k], &policies[p]).into_inner()),
        Op::Reset(k, p) => format!("{:?}", store.reset(KEYS[k], &policies[p]).into_inner()),
        Op::Settle(k, p, reserved, actual) => {
            let decision = Decision::allow(3, 0, 1_000_000);
            let settles = [Settle::new(
                KEYS[k],
                &policies[p],
                reserved,
                actual,
                &decision,
            )];
            format!("{:?}", store.settle_now(SettlementId(7), &settles))
        }
        Op::CheckAll(k, p, c, k2, p2, c2) => {
            let checks = [
                Check::new(KEYS[k], &policies[p], c),
                Check::new(KEYS[k2], &policies[p2], c2),
            ];
            format!("{:?}", store.check_all_now(&checks))
        }
        Op::Advance(_) | Op::Back(_) | Op::Recreate(_) => String::new(),
    }
}

/// A store as `store` was built, with the same hasher: each key in the
/// shard it has there.
fn same_hasher(store: &MemoryStore<ManualClock>) -> MemoryStore<ManualClock> {
    let shared = &store.shared;
    MemoryStore {
        shared: Arc::new(Shared {
            shards: (0..shared.shards.len())
                .map(|_| Shard::new(shared.hasher.clone()))
                .collect(),
            shard_mask: shared.shard_mask,
            held: CacheLine(AtomicUsize::new(0)),
            max_keys: shared.max_keys,
            clock: shared.clock.clone(),
            hasher: shared.hasher.clone(),
            permit_ids: crate::decision::PermitIds::new(),
        }),
    }
}

/// A store of `shards` shards that holds at most `max_keys` keys, on a
/// manual clock at a recent time, and its clock.
fn clocked_store(shards: usize, max_keys: usize) -> (ManualClock, MemoryStore<ManualClock>) {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let store = MemoryStore::builder()
        .shards(shards)
        .max_keys(max_keys)
        .clock(clock.clone())
        .build();
    (clock, store)
}

fn hot_keys(store: &MemoryStore<ManualClock>) -> usize {
    store
        .shared
        .shards
        .iter()
        .filter(|s| s.hot_hash.load(Ordering::Relaxed) != 0)
        .count()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Every operation decides, and leaves as many keys, on a store whose
    /// keys become hot as on one whose hot key is written back before each
    /// operation (so every decision there is made on the shard's tables).
    #[test]
    fn a_hot_key_changes_no_decision(
        ops in proptest::collection::vec(op(), 1..120),
        shards in prop_oneof![Just(1usize), Just(2)],
        max_keys in 3..12usize,
    ) {
        let (clock, hot) = clocked_store(shards, max_keys);
        let cold = same_hasher(&hot);
        let mut policies = policies();
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Advance(d) => clock.advance(Duration::from_micros(d)),
                Op::Back(d) => clock.set(clock.now().saturating_sub(d)),
                Op::Recreate(p) => {
                    let old = &policies[p];
                    let new = Policy::new(*old.algorithm())
                        .with_name(old.name())
                        .expect("valid name");
                    policies[p] = new;
                }
                _ => {}
            }
            for index in 0..cold.shared.shards.len() {
                drop(cold.write_shard(index));
            }
            let from_hot = apply(&hot, &policies, op);
            let from_cold = apply(&cold, &policies, op);
            prop_assert_eq!(&from_hot, &from_cold, "step {}: {:?}", i, op);
            prop_assert_eq!(hot.len(), cold.len(), "step {}: {:?}", i, op);
        }
        for key in KEYS {
            for policy in &policies {
                let from_hot = format!("{:?}", hot.peek(key, policy).into_inner());
                let from_cold = format!("{:?}", cold.peek(key, policy).into_inner());
                prop_assert_eq!(from_hot, from_cold);
            }
        }
    }
}

/// The units a hot key took and was given, from several threads at once.
#[derive(Default)]
struct Units {
    /// Admitted by checks.
    admitted: AtomicU64,
    /// Penalties and settlements above the reservation.
    added: AtomicU64,
    /// Rewards and refunds.
    given_back: AtomicU64,
}

/// Two hot keys of 15 bytes, one per shard, are hammered by two threads
/// each (checks of cost 1 to 3, some through a new policy object of the
/// same name, some through one of the same name and half the burst), while another thread penalizes, rewards, refunds, settles,
/// blocks, unblocks and checks them through `check_all`, and moves the
/// clock; another adds, resets and sweeps keys in both shards (the store
/// holds 8) and one peeks. Every unit is accounted for: each key ends at
/// its first TAT plus one interval per unit admitted or added, less one
/// per unit given back (its TAT never reaches the clock, so each moves it
/// by exactly that), and full.
#[test]
fn hammered_hot_keys_account_for_every_unit() {
    const BURST: u64 = 1_000;
    const INTERVAL: u64 = 1_000;
    let (clock, store) = clocked_store(2, 8);
    let policy = || {
        Policy::gcra(BURST, Rate::per_second(1_000))
            .expect("valid")
            .with_name("hot")
            .expect("valid name")
    };
    let hot_policy = policy();
    // The same name and rate, half the burst: it reads and moves the same
    // state.
    let half = Policy::gcra(BURST / 2, Rate::per_second(1_000))
        .expect("valid")
        .with_name("hot")
        .expect("valid name");
    let shard_of = |key: &[u8]| store.shard_index(store.hash(&hot_policy, &MemoryKey::new(key)));
    let first = b"hot-key-0000000".to_vec();
    let second = (1..)
        .map(|n| format!("hot-key-{n:07}").into_bytes())
        .find(|key| shard_of(key) != shard_of(&first))
        .expect("a key in the other shard");
    let keys = [first, second];
    let t0 = clock.now();
    for key in &keys {
        assert!(store.check_now(key, &hot_policy, 500).unwrap().is_allowed());
    }
    let units = [Units::default(), Units::default()];
    let done = AtomicBool::new(false);
    let seen_hot = AtomicUsize::new(0);
    thread::scope(|s| {
        for (key, units) in keys.iter().zip(&units) {
            for worker in 0..2u64 {
                let (store, done, hot_policy, half) = (&store, &done, &hot_policy, &half);
                s.spawn(move || {
                    let mut denied_after_done = false;
                    let mut n = worker;
                    while !denied_after_done {
                        n += 1;
                        let stop = done.load(Ordering::SeqCst);
                        let cost = if stop { 1 } else { 1 + n % 3 };
                        let fresh;
                        let policy = if n % 16 == 0 {
                            fresh = policy();
                            &fresh
                        } else if n % 5 == 0 && !stop {
                            half
                        } else {
                            hot_policy
                        };
                        let decision = store.check_now(key, policy, cost).unwrap();
                        if decision.is_allowed() {
                            units.admitted.fetch_add(cost, Ordering::Relaxed);
                        } else {
                            denied_after_done = stop;
                        }
                    }
                });
            }
        }
        {
            let (store, done, hot_policy) = (&store, &done, &hot_policy);
            s.spawn(move || {
                let mut n = 0u64;
                while !done.load(Ordering::SeqCst) {
                    n += 1;
                    let key = format!("c{}", n % 40);
                    // A full store refuses new keys: that is the sweep's cue.
                    let _ = store.check_now(key.as_bytes(), hot_policy, 1 + n % 5);
                    if n.is_multiple_of(3) {
                        store
                            .reset(key.as_bytes(), hot_policy)
                            .into_inner()
                            .expect("reset");
                    }
                    if n.is_multiple_of(7) {
                        let _ = store
                            .block(key.as_bytes(), hot_policy, Duration::from_millis(5))
                            .into_inner();
                    }
                }
            });
        }
        {
            let (store, done, keys, seen_hot) = (&store, &done, &keys, &seen_hot);
            s.spawn(move || {
                while !done.load(Ordering::SeqCst) {
                    seen_hot.fetch_add(hot_keys(store), Ordering::Relaxed);
                    for key in keys {
                        let peek = store.peek(key, &policy()).into_inner().unwrap();
                        assert!(peek.remaining() <= BURST);
                        // Every TAT and every time is a whole number of
                        // intervals from `t0`.
                        assert_eq!(peek.reset_after_micros() % INTERVAL, 0, "{peek:?}");
                    }
                }
            });
        }
        // Stops the other threads however this one ends, a failure too.
        let _stop = Stop(&done);
        // At least 1,200 operations, and on until the watcher has seen a
        // hot key: on a busy machine the workers may not have spent a
        // burst by then.
        for i in 0u64.. {
            if i >= 1_200 && seen_hot.load(Ordering::Relaxed) > 0 {
                break;
            }
            assert!(i < 2_000_000, "no key was ever seen hot");
            let key = &keys[usize::try_from(i % 2).expect("small")];
            let units = &units[usize::try_from(i % 2).expect("small")];
            let amount = 1 + i / 2 % 2;
            match i / 2 % 8 {
                0 => {
                    store
                        .penalize(key, &hot_policy, amount)
                        .into_inner()
                        .unwrap();
                    units.added.fetch_add(amount, Ordering::Relaxed);
                }
                1 => {
                    store.reward(key, &hot_policy, amount).into_inner().unwrap();
                    units.given_back.fetch_add(amount, Ordering::Relaxed);
                }
                2 => {
                    store
                        .adjust(key, &policy(), Adjustment::Refund, amount)
                        .unwrap();
                    units.given_back.fetch_add(amount, Ordering::Relaxed);
                }
                3 => {
                    let reservation = Decision::allow(BURST, 0, BURST * INTERVAL);
                    let settles = [Settle::new(key, &hot_policy, 1, 1 + amount, &reservation)];
                    store.settle_now(SettlementId::random(), &settles).unwrap();
                    units.added.fetch_add(amount, Ordering::Relaxed);
                }
                4 => {
                    // A full store may refuse the block; either way it ends here.
                    let blocked = store
                        .block(key, &hot_policy, Duration::from_secs(3_600))
                        .into_inner()
                        .is_ok();
                    let decision = store.check_now(key, &hot_policy, 1).unwrap();
                    assert!(!(blocked && decision.is_allowed()), "{decision:?}");
                    if decision.is_allowed() {
                        units.admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    store
                        .unblock(key, &hot_policy)
                        .into_inner()
                        .expect("unblock");
                }
                5 => {
                    let checks = [Check::new(key, &hot_policy, amount)];
                    let decisions = store.check_all_now(&checks).unwrap();
                    if decisions[0].is_allowed() {
                        units.admitted.fetch_add(amount, Ordering::Relaxed);
                    }
                }
                6 => clock.advance(Duration::from_micros(INTERVAL)),
                _ => thread::yield_now(),
            }
        }
    });
    let now = clock.now();
    for (key, units) in keys.iter().zip(&units) {
        let units_in =
            500 + units.admitted.load(Ordering::Relaxed) + units.added.load(Ordering::Relaxed)
                - units.given_back.load(Ordering::Relaxed);
        let peek = store.peek(key, &hot_policy).into_inner().unwrap();
        assert_eq!(
            peek.reset_after_micros(),
            t0 + units_in * INTERVAL - now,
            "{peek:?}"
        );
        assert_eq!(peek.remaining(), 0, "{peek:?}");
    }
    assert!(seen_hot.load(Ordering::Relaxed) > 0);
}

/// A real TAT of `u64::MAX` (a clock 2 s before its end, a full burst
/// taken) is the key's own state, not the hot key's: its peek reads its own
/// TAT while another key of its shard is hot. (Its next check of a positive
/// cost would overflow, as it did before there were hot keys.)
#[test]
fn a_tat_of_u64_max_is_not_the_hot_key() {
    let clock = ManualClock::new(u64::MAX - 2_000_000);
    let store = one_shard(clock.clone());
    let policy = Policy::gcra(2, Rate::per_second(1)).expect("valid");
    let full = store.check_now(b"max", &policy, 2).unwrap();
    assert_eq!(full, Decision::allow(2, 0, 2_000_000));
    // Another key, under a burst of 1 (its denial stays within `u64`).
    let small = Policy::gcra(1, Rate::per_second(1)).expect("valid");
    assert!(store.check_now(b"other", &small, 1).unwrap().is_allowed());
    assert!(!store.check_now(b"other", &small, 1).unwrap().is_allowed());
    assert_eq!(hot_keys(&store), 1);
    let peek = store.peek(b"max", &policy).into_inner().unwrap();
    assert_eq!(peek, Decision::allow(2, 0, 2_000_000));
    let other = store.peek(b"other", &small).into_inner().unwrap();
    assert_eq!(other, Decision::allow(1, 0, 1_000_000));
}

/// Sets its flag when dropped.
struct Stop<'a>(&'a AtomicBool);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Two keys of one shard take turns at being its hot key: in each of many
/// rounds the clock stands still while threads check both keys until both
/// deny (then check on, every check denied), another penalizes one of them
/// (while the penalty stays under its cap) and another adds and resets keys
/// of the shard; between rounds the clock moves by whole intervals, often
/// past both keys' TATs, and at times back. Each round ends with each key
/// full, at the TAT the units it admitted and was penalized make, from
/// where it started.
#[test]
fn keys_of_one_shard_take_turns_at_being_hot_and_lose_no_unit() {
    const BURST: u64 = 5;
    const INTERVAL: u64 = 1_000;
    const WORKERS: usize = 3;
    let (clock, store) = clocked_store(1, 6);
    let policy = Policy::gcra(BURST, Rate::per_second(1_000)).expect("valid");
    let keys: [&[u8]; 2] = [b"fifteen-bytes-a", b"fifteen-bytes-b"];
    let admitted = [AtomicU64::new(0), AtomicU64::new(0)];
    let penalized = AtomicU64::new(0);
    let penalize = AtomicBool::new(true);
    let admitted_after_denial = AtomicU64::new(0);
    let start = std::sync::Barrier::new(WORKERS + 2);
    let end = std::sync::Barrier::new(WORKERS + 2);
    let done = AtomicBool::new(false);
    let mut tats = [0u64; 2];
    let (mut switches, mut last_hot) = (0, 0);
    // A failed round stops the rounds (the threads wait at the barriers, so
    // the test asserts after them).
    let mut failure = None;
    thread::scope(|s| {
        for worker in 0..WORKERS {
            let (store, policy, admitted) = (&store, &policy, &admitted);
            let (start, end, done) = (&start, &end, &done);
            let admitted_after_denial = &admitted_after_denial;
            s.spawn(move || {
                loop {
                    start.wait();
                    if done.load(Ordering::SeqCst) {
                        return;
                    }
                    let mut denied = [0u32; 2];
                    let mut n = worker;
                    while denied.iter().any(|&d| d < 20) {
                        n += 1;
                        let k = n % 2;
                        let cost = if denied[k] > 0 {
                            1
                        } else {
                            1 + (n / 2 % 2) as u64
                        };
                        let decision = store.check_now(keys[k], policy, cost).unwrap();
                        if decision.is_allowed() {
                            if denied[k] > 0 {
                                admitted_after_denial.fetch_add(1, Ordering::Relaxed);
                            }
                            admitted[k].fetch_add(cost, Ordering::Relaxed);
                        } else if cost == 1 || denied[k] > 0 {
                            denied[k] += 1;
                        }
                    }
                    end.wait();
                }
            });
        }
        {
            let (store, policy, penalized, penalize) = (&store, &policy, &penalized, &penalize);
            let (start, end, done) = (&start, &end, &done);
            s.spawn(move || {
                loop {
                    start.wait();
                    if done.load(Ordering::SeqCst) {
                        return;
                    }
                    if penalize.load(Ordering::SeqCst) {
                        store.penalize(keys[0], policy, 1).into_inner().unwrap();
                        penalized.fetch_add(1, Ordering::Relaxed);
                    }
                    let key = format!("new-{}", penalized.load(Ordering::Relaxed) % 9);
                    let _ = store.check_now(key.as_bytes(), policy, 1);
                    store
                        .reset(key.as_bytes(), policy)
                        .into_inner()
                        .expect("reset");
                    end.wait();
                }
            });
        }
        for round in 0..2_000u64 {
            let t = clock.now();
            // A penalty moves the TAT by its whole interval while that
            // stays within two bursts of now.
            let highest = tats[0].saturating_sub(t).max(BURST * INTERVAL);
            penalize.store(highest + INTERVAL <= 2 * BURST * INTERVAL, Ordering::SeqCst);
            let before = [0, 1].map(|k| admitted[k].load(Ordering::Relaxed));
            let penalties = penalized.load(Ordering::Relaxed);
            start.wait();
            end.wait();
            let hot = store.shared.shards[0].hot_hash.load(Ordering::Relaxed);
            for k in 0..2 {
                let mut units = admitted[k].load(Ordering::Relaxed) - before[k];
                if k == 0 {
                    units += penalized.load(Ordering::Relaxed) - penalties;
                }
                let tat = tats[k].max(t) + units * INTERVAL;
                let peek = store.peek(keys[k], &policy).into_inner().unwrap();
                if peek.reset_after_micros() != tat - t || tat - t < BURST * INTERVAL {
                    failure = Some(format!(
                        "round {round}, key {k}: {peek:?}, TAT {tat}, now {t}"
                    ));
                }
                tats[k] = tat;
            }
            if failure.is_some() {
                break;
            }
            switches += usize::from(hot != 0 && hot != last_hot);
            last_hot = hot;
            // Past both TATs, or into them by some intervals, or back.
            if round % 5 == 4 {
                clock.set(clock.now() - 3 * INTERVAL);
            } else {
                clock.advance(Duration::from_micros(INTERVAL * (round * 7 % 13)));
            }
        }
        done.store(true, Ordering::SeqCst);
        start.wait();
    });
    assert_eq!(failure, None);
    assert_eq!(admitted_after_denial.load(Ordering::Relaxed), 0);
    assert!(switches > 0);
}

/// Policies made and dropped in turn under two names, so that a new one
/// may take the address of the last (the hot key is known by its policy's
/// address): each makes the key hot under its name, which leaves the key
/// fresh under the other name, and its state goes with its reset.
#[test]
fn a_policy_at_a_dropped_policys_address_is_not_the_hot_key() {
    let store = one_shard(ManualClock::new(1_700_000_000_000_000));
    let fresh = Decision::allow(1, 1, 0);
    let mut addresses = std::collections::HashSet::new();
    let mut reused = 0;
    for i in 0..400 {
        let [name, other] = if i % 2 == 0 { ["p", "q"] } else { ["q", "p"] };
        let policy = Policy::gcra(1, Rate::per_hour(1))
            .expect("valid")
            .with_name(name)
            .expect("valid name");
        reused += usize::from(!addresses.insert(policy.addr()));
        assert!(store.check_now(b"k", &policy, 1).unwrap().is_allowed());
        assert!(!store.check_now(b"k", &policy, 1).unwrap().is_allowed());
        assert_eq!(hot_keys(&store), 1, "round {i}");
        let peek = store.peek(b"k", &policy).into_inner().unwrap();
        assert_eq!(peek, Decision::allow(1, 0, 3_600_000_000));
        let other = Policy::gcra(1, Rate::per_hour(1))
            .expect("valid")
            .with_name(other)
            .expect("valid name");
        assert_eq!(
            store.peek(b"k", &other).into_inner().unwrap(),
            fresh,
            "round {i}"
        );
        assert!(store.check_now(b"k", &other, 1).unwrap().is_allowed());
        store.reset(b"k", &other).into_inner().expect("reset");
        store.reset(b"k", &policy).into_inner().expect("reset");
        assert_eq!(store.len(), 0);
    }
    // The allocator did hand a dropped policy's address to a new one.
    assert!(reused > 0, "no address reused");
}
