//! Attacks on `RedisStore` behind Redis Sentinel (a module of the
//! `resilience` binary), on a real master, its replica and three
//! `redis-sentinel` processes: failovers that the other fault tests do not
//! make. A master frozen (`SIGSTOP`) rather than killed, then thawed after
//! its replica's promotion, when it still answers as a master with stale
//! data; the same under light traffic; a concurrency permit taken on the old
//! master and released on the new one; and a replica promoted with a lagging
//! copy (what Redis's asynchronous replication loses, and that the store is
//! then exactly as permissive as the promoted data allows, no more).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ratelimit_core::redis::RedisStore;
use ratelimit_core::{Check, Decision, PermitId, Policy, Store, StoreError};
use ratelimit_tests::sentinels::MASTER_NAME;
use ratelimit_tests::{RedisSentinels, RedisServer, named, warm_up};

use super::sentinel::{
    Outcome, counting_policy, sentinel_store, start_counting, start_quorum, window_count,
};
use super::{CALL_TIMEOUT, MARGIN, bounded, ms, start_clients};

/// The promoted replica must decide within this of the sentinels naming it.
const FOLLOW_DEADLINE: Duration = Duration::from_secs(2);

/// The longest the sentinels may take to fail a master over.
const FAILOVER_LIMIT: Duration = Duration::from_secs(15);

/// A store behind the sentinels with `pool_size` connections (also the
/// coalescer's calls in flight at most).
async fn sentinel_store_of(set: &RedisSentinels, pool_size: u32) -> RedisStore {
    RedisStore::sentinel_builder(set.addresses(), MASTER_NAME)
        .call_timeout(CALL_TIMEOUT)
        .pool_size(pool_size)
        .build()
        .await
        .expect("a store behind the sentinels")
}

/// The count of a fixed window's state at `key` on `node` (0 for no key).
fn count_on(node: &RedisServer, key: &str) -> u64 {
    window_count(&node.cli(&["GET", key]))
}

/// Stops the set's master once `key` has reached its replica (on a runtime
/// worker given up for the wait).
fn stop_master_once_replicated(set: &mut RedisSentinels, key: &str) {
    let start = Instant::now();
    tokio::task::block_in_place(|| {
        while set.replica().cli(&["EXISTS", key]) != "1" {
            assert!(start.elapsed() < Duration::from_secs(5), "never replicated");
            std::thread::sleep(Duration::from_millis(10));
        }
        set.master_mut().stop();
    });
}

/// Every key on `node` (but `except`) has a TTL: replicated, or written
/// there after its promotion.
fn assert_every_key_has_a_ttl(node: &RedisServer, except: &[&str]) {
    let keys = node.cli(&["--scan"]);
    let keys: Vec<&str> = keys.lines().filter(|k| !except.contains(k)).collect();
    assert!(!keys.is_empty(), "no key on {}", node.port());
    for key in keys {
        let ttl = node.cli(&["PTTL", key]);
        assert!(
            ttl.parse::<i64>().is_ok_and(|ttl| ttl > 0),
            "{key} on {} has no TTL: {ttl}",
            node.port()
        );
    }
}

/// Blocks (on a runtime worker given up for it) until a sentinel names the
/// node on `port` as the master; returns that moment.
fn until_named(set: &RedisSentinels, port: u16) -> Instant {
    let start = Instant::now();
    tokio::task::block_in_place(|| {
        while set.named_master_port() != Some(port) {
            assert!(
                start.elapsed() < FAILOVER_LIMIT,
                "no sentinel named {port} within {FAILOVER_LIMIT:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    Instant::now()
}

#[derive(Debug, Clone)]
struct Call {
    /// Whether the call was made after a sentinel named the new master (on
    /// the key of that phase).
    after: bool,
    start: Instant,
    end: Instant,
    outcome: Outcome,
}

impl Call {
    /// A call made at `start` that has just returned `result`.
    fn ended(after: bool, start: Instant, result: &Result<Vec<Decision>, StoreError>) -> Call {
        Call {
            after,
            start,
            end: Instant::now(),
            outcome: Outcome::of_all(result),
        }
    }
}

/// Tells a load's tasks to stop (`done`) and gathers their calls.
async fn stop_load<T>(done: &AtomicBool, tasks: Vec<tokio::task::JoinHandle<Vec<T>>>) -> Vec<T> {
    done.store(true, Ordering::Release);
    let mut calls = Vec::new();
    for task in tasks {
        calls.extend(task.await.expect("a load task panicked"));
    }
    calls
}

/// Every call an outage or a decision, none past the call timeout (and
/// [`MARGIN`]).
fn assert_outages_only_and_bounded(calls: &[Call]) {
    for call in calls {
        assert!(
            !matches!(call.outcome, Outcome::Error(_)),
            "a call failed as a mistake, not an outage: {call:?}"
        );
        let took = call.end - call.start;
        assert!(
            took <= CALL_TIMEOUT + MARGIN,
            "a call took {} (call timeout {}): {call:?}",
            ms(took),
            ms(CALL_TIMEOUT)
        );
    }
}

/// The master frozen (`SIGSTOP`: its sockets stay open, it answers
/// nothing) under a load of six clients each calling every 20 ms, each
/// call a check of two limits at once, through a store of one connection
/// (so the coalescer gathers them, one call in flight at a time: a count
/// left behind by a call lost to the freeze would wedge it). Once a sentinel names the promoted
/// replica the load moves to a fresh key, and the old master is thawed: it
/// comes back answering `ROLE` as a master, with stale data, and runs the
/// calls that timed out on it, until the sentinels demote it. Every
/// admission on the fresh key must be counted on the promoted replica, by
/// both limits (all or nothing across the switch), and the limit holds
/// exactly; a decision taken on the thawed old master would be lost there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_master_thawed_after_the_promotion_is_never_decided_on() {
    const LIMIT: u64 = 40;
    let (_turn, set) = start_quorum().await;
    let store = sentinel_store_of(&set, 1).await;
    let tight = counting_policy("frozen-tight", LIMIT);
    let loose = counting_policy("frozen-loose", 1_000_000);
    warm_up("the master answers", || store.ping()).await;
    let replica_port = set.replica().port();

    let calls = bounded(async {
        let after = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let with = (
            store.clone(),
            tight.clone(),
            loose.clone(),
            Arc::clone(&after),
        );
        let tasks = start_clients(6, &done, &with, |(store, tight, loose, after)| async move {
            let phase = after.load(Ordering::Acquire);
            let key: &[u8] = if phase { b"after" } else { b"before" };
            let checks = [Check::new(key, &tight, 1), Check::new(key, &loose, 1)];
            let start = Instant::now();
            let result = tokio::time::timeout(CALL_TIMEOUT * 10, store.check_all(&checks))
                .await
                .unwrap_or(Err(StoreError::Backend("hung".into())));
            let call = Call::ended(phase, start, &result);
            tokio::time::sleep(Duration::from_millis(20)).await;
            Some(call)
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        set.master().freeze();
        let frozen = Instant::now();
        let named = until_named(&set, replica_port);
        after.store(true, Ordering::Release);
        set.master().thaw();
        println!(
            "[attack] master frozen; replica named {} later; old master thawed",
            ms(named - frozen)
        );
        tokio::time::sleep(FOLLOW_DEADLINE + Duration::from_millis(500)).await;
        let calls = stop_load(&done, tasks).await;
        (calls, named)
    })
    .await;
    let (calls, named) = calls;
    assert_outages_only_and_bounded(&calls);
    let coalesced = store.coalescing();

    let after: Vec<&Call> = calls.iter().filter(|c| c.after).collect();
    let admitted = after
        .iter()
        .filter(|c| c.outcome == Outcome::Admitted)
        .count() as u64;
    let first = after
        .iter()
        .filter(|c| c.outcome.decided())
        .map(|c| c.end)
        .min()
        .expect("a decision after the promotion");
    let promoted = set.replica();
    let tight_count = count_on(promoted, &store.state_key(b"after", &tight));
    let loose_count = count_on(promoted, &store.state_key(b"after", &loose));
    println!(
        "[attack] after the promotion: {} calls, {admitted} admitted, first decision {} after \
         the promotion; counted on the promoted replica: {tight_count} and {loose_count}; \
         {} requests in {} calls",
        after.len(),
        ms(first - named),
        coalesced.requests,
        coalesced.calls
    );
    assert!(
        coalesced.requests > coalesced.calls,
        "the coalescer gathered nothing: {coalesced:?}"
    );
    assert!(
        first - named <= FOLLOW_DEADLINE,
        "the first decision came {} after the promotion",
        ms(first - named)
    );
    assert_eq!(
        admitted, LIMIT,
        "the limit of {LIMIT} admitted {admitted} after the promotion"
    );
    assert_eq!(
        (tight_count, loose_count),
        (admitted, admitted),
        "every admission after the promotion is counted on the promoted replica, by both limits"
    );
    assert_every_key_has_a_ttl(promoted, &[]);
}

/// The master frozen under light traffic (one call every 1.5 s): the first
/// call made after a sentinel names the promoted replica decides, however
/// late the last one that timed out on the frozen master.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn light_traffic_follows_a_frozen_master_at_the_first_call_after_the_promotion() {
    let (_turn, set, store, policy) = start_counting("frozen-light", 1_000_000).await;
    warm_up("the master answers", || store.check(b"k", &policy, 1)).await;
    let replica_port = set.replica().port();

    let calls = bounded(async {
        set.master().freeze();
        let frozen = Instant::now();
        let mut calls = Vec::new();
        let mut masters = Vec::new();
        // At most 8 calls (12 s): the failover takes about 2 s.
        for _ in 0..8 {
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            let named =
                tokio::task::block_in_place(|| set.named_master_port()) == Some(replica_port);
            let start = Instant::now();
            let result = store.check(b"k", &policy, 1).await.map(|d| vec![d]);
            let call = Call::ended(named, start, &result);
            println!(
                "[attack] {} after the freeze (replica named: {named}): {:?}",
                ms(start - frozen),
                call.outcome
            );
            let decided = call.outcome.decided();
            if decided {
                masters.push(store.sentinel_master());
            }
            calls.push(call);
            if named || decided {
                break;
            }
        }
        set.master().thaw();
        (calls, masters)
    })
    .await;
    let (calls, masters) = calls;
    assert_outages_only_and_bounded(&calls);
    let last = calls.last().expect("a call");
    assert!(
        last.outcome.decided(),
        "the first call after a sentinel named the replica was not decided: {calls:?}"
    );
    // Decided on the promoted replica, not on the frozen master.
    assert_eq!(
        masters,
        vec![Some(format!("127.0.0.1:{replica_port}"))],
        "decided elsewhere than on the promoted replica: {calls:?}"
    );
}

/// Calls `call` every 20 ms until it gives a decision or an error that is
/// not an outage, within [`FOLLOW_DEADLINE`] of `since`.
async fn decided_after<F, Fut>(since: Instant, mut call: F) -> Result<Decision, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Decision, StoreError>>,
{
    loop {
        match call().await {
            Err(e) if e.is_outage() && since.elapsed() <= FOLLOW_DEADLINE => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
}

/// A failover test's start: its turn (held for the whole test), the
/// quorum, the store behind it, the policy under test and the state key of
/// the one key its requests check.
struct Failover {
    _turn: super::Turn,
    set: RedisSentinels,
    store: RedisStore,
    policy: Policy,
    key: String,
    replica_port: u16,
}

impl Failover {
    /// Starts the quorum while it waits for its turn, then the store; requests
    /// check `key` under `policy`.
    async fn start(policy: Policy, key: &[u8]) -> Self {
        let (turn, set) = start_quorum().await;
        let store = sentinel_store(&set).await;
        let key = store.state_key(key, &policy);
        let replica_port = set.replica().port();
        Failover {
            _turn: turn,
            set,
            store,
            policy,
            key,
            replica_port,
        }
    }

    /// Checks `key` under the policy, at a cost of 1.
    fn check(&self, key: &[u8]) -> <RedisStore as Store>::CheckFuture {
        self.store.check(key, &self.policy, 1)
    }

    /// Releases `permit` of `key` under the policy.
    fn release(&self, key: &[u8], permit: PermitId) -> <RedisStore as Store>::ReleaseFuture {
        self.store.release(key, &self.policy, permit)
    }

    /// A permit test: `p` under a semaphore of one named `name`, whose
    /// lease (ten minutes) outlives the test.
    async fn of_permits(name: &str) -> Self {
        let policy = named(name, Policy::concurrency(1, Duration::from_secs(600)));
        Failover::start(policy, b"p").await
    }

    /// Admits `n` checks of `k` once the master answers (each must be
    /// allowed), and waits (on a runtime worker given up for it) until the
    /// replica counts them.
    async fn admit_replicated(&self, n: u64) {
        warm_up("the master answers", || self.store.ping()).await;
        for _ in 0..n {
            let d = self.check(b"k").await;
            assert!(d.expect("a decision").is_allowed());
        }
        let start = Instant::now();
        tokio::task::block_in_place(|| {
            while count_on(self.set.replica(), &self.key) != n {
                assert!(start.elapsed() < Duration::from_secs(5), "never replicated");
                std::thread::sleep(Duration::from_millis(10));
            }
        });
    }

    /// Checks `k` on the promoted replica, which a sentinel named at
    /// `named`, until a check is denied: the admissions, at most `limit`.
    async fn admitted_after(&self, named: Instant, limit: u64) -> u64 {
        let mut admitted = 0;
        loop {
            let d = decided_after(named, || self.check(b"k"))
                .await
                .expect("a decision on the promoted replica");
            if !d.is_allowed() {
                return admitted;
            }
            admitted += 1;
            assert!(admitted <= limit, "admitted past the limit of {limit}");
        }
    }

    /// Takes the permit on the master, then stops the master once the
    /// replica holds the permit; the permit.
    async fn permit_then_master_stopped(&mut self) -> PermitId {
        let first = warm_up("the master answers", || self.check(b"p")).await;
        assert!(first.is_allowed(), "the first permit: {first:?}");
        let permit = first
            .permit()
            .expect("an admitted check carries its permit");
        stop_master_once_replicated(&mut self.set, &self.key);
        permit
    }
}

/// A concurrency permit (max 1) taken on the old master and replicated,
/// the master killed and its replica promoted: the permit still holds on
/// the promoted replica (the store is no more permissive there) and is
/// renewed there, its release sent to the new master frees it (a renewal
/// then brings nothing back), and the same release sent again frees
/// nothing more (not the permit taken since).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_permit_taken_on_the_old_master_is_released_once_on_the_new_one() {
    let mut test = Failover::of_permits("permit-failover").await;
    bounded(async {
        let old = test.permit_then_master_stopped().await;
        let named = until_named(&test.set, test.replica_port);

        let held = decided_after(named, || test.check(b"p")).await;
        let held = held.expect("a decision on the promoted replica");
        assert!(
            !held.is_allowed() && held.permit().is_none(),
            "the permit taken on the old master no longer held: {held:?}"
        );
        assert_eq!(
            test.store.sentinel_master(),
            Some(format!("127.0.0.1:{}", test.replica_port))
        );

        let renewed = test.store.renew(b"p", &test.policy, old).await;
        assert!(
            matches!(renewed, Ok(true)),
            "the permit taken on the old master renewed on the new one: {renewed:?}"
        );
        test.release(b"p", old)
            .await
            .expect("the release of the old master's permit");
        let renewed = test.store.renew(b"p", &test.policy, old).await;
        assert!(
            matches!(renewed, Ok(false)),
            "a renewal brought a released permit back: {renewed:?}"
        );
        let second = test.check(b"p").await.expect("a decision");
        assert!(
            second.is_allowed() && second.permit().is_some(),
            "the release on the new master freed nothing: {second:?}"
        );

        // The release again, as after a lost reply: nothing more is freed.
        test.release(b"p", old)
            .await
            .expect("the release sent again");
        let third = test.check(b"p").await.expect("a decision");
        assert!(
            !third.is_allowed() && third.permit().is_none(),
            "a release sent again freed the permit taken since: {third:?}"
        );
        println!(
            "[attack] permit: held across the failover, released once on the promoted replica"
        );
        tokio::task::block_in_place(|| assert_every_key_has_a_ttl(test.set.replica(), &[]));
    })
    .await;
}

/// A replica promoted with a lagging copy. The replica is frozen while the
/// master takes a 48 MB write (more than the sockets between them hold)
/// and then five admissions, whose replication waits behind it; the master
/// is killed, the replica thawed and promoted. Redis replicates without
/// waiting (the store sends no `WAIT`), so those five admissions die with
/// the master: this is inherent to Redis replication, not the store's
/// doing, and RELIABILITY.md says so. What the store must do: admit on the
/// promoted replica exactly what its data leaves (limit − count there),
/// never more; so the over-admission is the lag, in decisions, and no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lagging_replica_promoted_loses_only_the_unreplicated_admissions() {
    const LIMIT: u64 = 20;
    const BEFORE: u64 = 5;
    const UNREPLICATED: u64 = 5;
    let mut test = Failover::start(counting_policy("lagging", LIMIT), b"k").await;

    bounded(async {
        test.admit_replicated(BEFORE).await;
        let mut frozen = Instant::now();
        tokio::task::block_in_place(|| {
            test.set.replica().freeze();
            frozen = Instant::now();
            // In pieces of 4 MB: one write of 48 MB would hold the master
            // longer than the sentinels' down-after, and they might start a
            // failover of their own before the test's.
            for _ in 0..12 {
                let piece = test.set.master().cli(&[
                    "EVAL",
                    "redis.call('APPEND', KEYS[1], string.rep('x', tonumber(ARGV[1]))) return 1",
                    "1",
                    "lag-ballast",
                    "4194304",
                ]);
                assert_eq!(piece, "1", "the ballast write");
            }
        });
        for _ in 0..UNREPLICATED {
            let d = test.check(b"k").await.expect("a decision");
            assert!(d.is_allowed());
        }
        let thawed = tokio::task::block_in_place(|| {
            test.set.master_mut().stop();
            test.set.replica().thaw();
            frozen.elapsed()
        });
        let named = until_named(&test.set, test.replica_port);
        // Read before the store writes there: nothing calls it meanwhile.
        let kept = tokio::task::block_in_place(|| count_on(test.set.replica(), &test.key));
        let lost = BEFORE + UNREPLICATED - kept;

        let admitted = test.admitted_after(named, LIMIT).await;
        println!(
            "[attack] lagging replica (frozen {}): old master admitted {}, the promoted \
             replica kept {kept} ({lost} lost), then admitted {admitted} of {LIMIT}",
            ms(thawed),
            BEFORE + UNREPLICATED
        );
        assert_eq!(
            admitted,
            LIMIT - kept,
            "the promoted replica admitted other than its data leaves"
        );
        assert_eq!(
            lost, UNREPLICATED,
            "the admissions whose replication waited behind the ballast"
        );
        assert_eq!(
            count_on(test.set.replica(), &test.key),
            LIMIT,
            "the promoted replica counts every admission made on it"
        );
        tokio::task::block_in_place(|| {
            assert_every_key_has_a_ttl(test.set.replica(), &["lag-ballast"])
        });
    })
    .await;
}

/// Breaks every connection of the store's to `node` (those of clients
/// that are neither a sentinel, a replica, nor this `redis-cli`): the
/// store's next call asks the sentinels for the master. The sentinels'
/// links stay up, so that they see no outage.
fn break_connections(node: &RedisServer) {
    let clients = node.cli(&["CLIENT", "LIST"]);
    for client in clients.lines() {
        let field = |name: &str| {
            client
                .split(' ')
                .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
                .unwrap_or("")
        };
        let ours = !field("name").starts_with("sentinel-")
            && !field("flags").contains(['S', 'M'])
            && field("cmd") != "client|list";
        if ours {
            node.cli(&["CLIENT", "KILL", "ID", field("id")]);
        }
    }
}

/// A sentinel that missed a failover is the only one the store reaches.
/// The old master and one sentinel are cut off (the master frozen, the
/// sentinel stopped); the other two sentinels fail over to the replica,
/// and the store decides there until the limit is reached. Past what the
/// store remembers of the node failed over from (15 s), the old master
/// comes back, still a master with the admissions it had before the
/// failover, and so does the sentinel, which names it (under the old
/// configuration epoch) until it hears of the failover from the others,
/// now out of the store's reach (stopped). Every lookup of the store
/// meanwhile (its connections broken to make it ask) must refuse that
/// answer: deciding on the old master would admit again what the promoted
/// replica already denies. The calls are outages: the failure policy
/// answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sentinel_that_missed_the_failover_never_leads_to_the_old_master() {
    const LIMIT: u64 = 10;
    const BEFORE: u64 = 4;
    let mut test = Failover::start(counting_policy("stale-sentinel", LIMIT), b"k").await;
    let old_port = test.set.master().port();

    tokio::time::timeout(Duration::from_secs(50), async {
        test.admit_replicated(BEFORE).await;
        tokio::task::block_in_place(|| {
            test.set.sentinel_mut(2).stop();
            test.set.master().freeze();
        });
        let named = until_named(&test.set, test.replica_port);
        let admitted = test.admitted_after(named, LIMIT).await;
        assert_eq!(admitted, LIMIT - BEFORE, "on the promoted replica");
        // Past what the store remembers of the failover (15 s).
        tokio::time::sleep_until((named + Duration::from_secs(16)).into()).await;
        tokio::task::block_in_place(|| {
            test.set.sentinel_mut(0).stop();
            test.set.sentinel_mut(1).stop();
            test.set.master().thaw();
            test.set.sentinel_mut(2).restart();
        });
        let back = Instant::now();
        let mut masters = Vec::new();
        let (mut over, mut calls, mut stale) = (0, 0, 0);
        while back.elapsed() < Duration::from_secs(1) {
            let names = tokio::task::block_in_place(|| {
                break_connections(test.set.replica());
                test.set.named_master_port()
            });
            if names == Some(old_port) {
                stale += 1;
            }
            let result = test.check(b"k").await;
            calls += 1;
            assert!(
                result.as_ref().is_ok() || result.as_ref().is_err_and(StoreError::is_outage),
                "a mistake: {result:?}"
            );
            if result.as_ref().is_ok_and(Decision::is_allowed) {
                over += 1;
            }
            if let Some(master) = test.store.sentinel_master()
                && !masters.contains(&master)
            {
                masters.push(master);
            }
        }
        println!(
            "[attack] stale sentinel: {calls} calls, each after a lookup ({stale} while the \
             sentinel named the old master), {over} admitted past the limit; masters followed: \
             {masters:?} (old master 127.0.0.1:{old_port})"
        );
        assert!(stale > 0, "the sentinel never named the old master");
        assert_eq!(
            masters,
            vec![format!("127.0.0.1:{}", test.replica_port)],
            "the store followed a sentinel that missed the failover"
        );
        assert_eq!(over, 0, "admitted past the limit on the old master");
    })
    .await
    .expect("the test did not finish within 50 s");
}

/// A concurrency permit released while the master is down, before its
/// replica is promoted: the release fails as an outage, and the permit,
/// replicated, would hold its slot on the promoted replica for its whole
/// lease (ten minutes here), the limit denying long after the outage.
/// The store keeps releasing it while unreachable: the slot is free again
/// soon after the promotion.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_permit_released_during_the_failover_is_free_after_it() {
    let mut test = Failover::of_permits("permit-gap").await;
    bounded(async {
        let permit = test.permit_then_master_stopped().await;
        let released = test.release(b"p", permit).await;
        assert!(
            released.as_ref().is_err_and(StoreError::is_outage),
            "the release while the master is down: {released:?}"
        );
        let named = until_named(&test.set, test.replica_port);
        // Denied while the permit holds (a denial takes nothing), at most
        // until 3 s after the promotion.
        let mut denied = 0;
        let freed = loop {
            match test.check(b"p").await {
                Ok(d) if d.is_allowed() => break Some(named.elapsed()),
                Ok(_) => denied += 1,
                Err(e) => assert!(e.is_outage(), "a mistake: {e}"),
            }
            if named.elapsed() > Duration::from_secs(3) {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        println!(
            "[attack] permit released during the failover: free {:?} after the promotion \
             ({denied} denials before)",
            freed.map(ms)
        );
        assert!(
            freed.is_some(),
            "the permit released during the failover still held its slot 3 s after the \
             promotion ({denied} denials)"
        );
    })
    .await;
}

/// A `FallbackStore` (three instances, the default breaker) over the store
/// behind the sentinels, under a load of three clients each calling every
/// 20 ms; the master killed once the replica holds all it admitted. In the
/// gap the failure policy alone decides (the fallback, within its share);
/// the promoted replica decides again within the deadline (the breaker's
/// cool-down included), and admits what its count leaves, no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_fallback_alone_decides_in_the_gap_and_redis_after_it() {
    use ratelimit_core::{BreakerState, DecisionSource};

    const LIMIT: u64 = 60;
    let (_turn, mut set) = start_quorum().await;
    let redis = sentinel_store(&set).await;
    let store = super::with_fallback(redis.clone());
    let policy = counting_policy("fallback-gap", LIMIT);
    let key = redis.state_key(b"k", &policy);
    warm_up("the master answers", || redis.ping()).await;
    let replica_port = set.replica().port();

    #[derive(Debug)]
    struct Sourced {
        start: Instant,
        end: Instant,
        result: Result<(bool, DecisionSource), String>,
    }

    let (calls, killed, named) = bounded(async {
        let paused = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let with = (store.clone(), policy.clone(), Arc::clone(&paused));
        let tasks = start_clients(3, &done, &with, |(store, policy, paused)| async move {
            if paused.load(Ordering::Acquire) {
                tokio::time::sleep(Duration::from_millis(5)).await;
                return None;
            }
            let start = Instant::now();
            let result = store.check(b"k", &policy, 1).await;
            let call = Sourced {
                start,
                end: Instant::now(),
                result: result
                    .map(|d| (d.is_allowed(), d.source()))
                    .map_err(|e| e.to_string()),
            };
            tokio::time::sleep(Duration::from_millis(20)).await;
            Some(call)
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        paused.store(true, Ordering::Release);
        tokio::time::sleep(Duration::from_millis(150)).await;
        // The replica holds every admission: the kill loses none.
        let start = Instant::now();
        tokio::task::block_in_place(|| {
            while count_on(set.replica(), &key) != count_on(set.master(), &key) {
                assert!(start.elapsed() < Duration::from_secs(5), "never replicated");
                std::thread::sleep(Duration::from_millis(10));
            }
            set.master_mut().stop();
        });
        let killed = Instant::now();
        paused.store(false, Ordering::Release);
        let named = until_named(&set, replica_port);
        tokio::time::sleep(FOLLOW_DEADLINE + Duration::from_millis(500)).await;
        let calls = stop_load(&done, tasks).await;
        (calls, killed, named)
    })
    .await;

    let errors: Vec<&Sourced> = calls.iter().filter(|c| c.result.is_err()).collect();
    assert!(
        errors.is_empty(),
        "the fallback answers every call: {errors:?}"
    );
    let from =
        |source: DecisionSource| move |c: &&Sourced| matches!(c.result, Ok((_, s)) if s == source);
    let in_gap = |c: &&Sourced| c.start > killed && c.end < named;
    let redis_in_gap = calls
        .iter()
        .filter(in_gap)
        .filter(from(DecisionSource::Store))
        .count();
    let fallback: Vec<&Sourced> = calls
        .iter()
        .filter(from(DecisionSource::Fallback))
        .collect();
    let admitted = |calls: &mut dyn Iterator<Item = &Sourced>| {
        calls.filter(|c| matches!(c.result, Ok((true, _)))).count() as u64
    };
    let fallback_admitted = admitted(&mut fallback.iter().copied());
    let redis_admitted = admitted(&mut calls.iter().filter(from(DecisionSource::Store)));
    let first_redis_after = calls
        .iter()
        .filter(|c| c.start >= named)
        .filter(from(DecisionSource::Store))
        .map(|c| c.end)
        .min()
        .expect("Redis decides again after the promotion");
    let counted = tokio::task::block_in_place(|| count_on(set.replica(), &key));
    println!(
        "[attack] fallback over a failover: {} calls; in the gap {} by the fallback, {redis_in_gap} \
         by Redis; fallback admitted {fallback_admitted}; Redis admitted {redis_admitted} \
         (counted {counted}); Redis decided again {} after the promotion; breaker {:?}",
        calls.len(),
        calls.iter().filter(in_gap).count(),
        ms(first_redis_after - named),
        store.breaker().state()
    );
    assert_eq!(
        redis_in_gap, 0,
        "Redis decided between the kill and the promotion"
    );
    assert!(
        fallback_admitted <= LIMIT / 3,
        "the fallback admitted {fallback_admitted}, over its share of {}",
        LIMIT / 3
    );
    assert!(
        first_redis_after - named <= FOLLOW_DEADLINE,
        "Redis decided again {} after the promotion",
        ms(first_redis_after - named)
    );
    assert_eq!(
        (redis_admitted, counted),
        (LIMIT, LIMIT),
        "Redis admits its limit, all counted on the promoted replica"
    );
    assert_eq!(store.breaker().state(), BreakerState::Closed);
}

/// A store built on a runtime that is then shut down (built at start-up on
/// a runtime of its own, say), and used on another: its watch of the
/// sentinels' failover events must not end with that runtime. An ordered
/// failover (`SENTINEL FAILOVER`: the old master stays up, and takes writes
/// until the sentinels demote it, seconds after the promotion) under a load
/// of three clients each calling every 20 ms: every admission must be held
/// by the promoted replica; one decided on the old master after the
/// promotion is lost, and admitted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_built_on_a_runtime_since_shut_down_still_follows_the_events() {
    let (_turn, set) = start_quorum().await;
    let addresses = set.addresses();
    let store = tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            RedisStore::sentinel_builder(addresses, MASTER_NAME)
                .call_timeout(CALL_TIMEOUT)
                .build()
                .await
                .expect("a store behind the sentinels")
        })
        // The runtime ends here, and every task it ran with it.
    })
    .await
    .expect("building on a runtime of its own");
    let policy = counting_policy("runtime-gone", 1_000_000);
    let key = store.state_key(b"k", &policy);
    warm_up("the master answers", || store.check(b"k", &policy, 1)).await;
    let replica_port = set.replica().port();

    let (calls, named) = bounded(async {
        let done = Arc::new(AtomicBool::new(false));
        let with = (store.clone(), policy.clone());
        let tasks = start_clients(3, &done, &with, |(store, policy)| async move {
            let start = Instant::now();
            let result = store.check(b"k", &policy, 1).await.map(|d| vec![d]);
            let call = Call::ended(false, start, &result);
            tokio::time::sleep(Duration::from_millis(20)).await;
            Some(call)
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        tokio::task::block_in_place(|| {
            let ordered = set.sentinels()[0].cli(&["SENTINEL", "FAILOVER", MASTER_NAME]);
            assert_eq!(ordered, "OK", "SENTINEL FAILOVER");
        });
        let named = until_named(&set, replica_port);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let calls = stop_load(&done, tasks).await;
        (calls, named)
    })
    .await;
    assert_outages_only_and_bounded(&calls);
    // The warm-up's admission, then the load's.
    let admitted = 1 + calls
        .iter()
        .filter(|c| c.outcome == Outcome::Admitted)
        .count() as u64;
    let held = tokio::task::block_in_place(|| count_on(set.replica(), &key));
    let after = calls
        .iter()
        .filter(|c| c.start >= named && c.outcome.decided())
        .count();
    println!(
        "[attack] store built on a runtime since shut down, ordered failover: admitted \
         {admitted}, the promoted replica holds {held} (lost {}); {after} decisions after the \
         promotion, the store on {:?}",
        admitted.saturating_sub(held),
        store.sentinel_master()
    );
    assert!(after > 0, "nothing decided after the promotion");
    assert_eq!(
        admitted, held,
        "admissions decided on the old master after the promotion are lost"
    );
}
