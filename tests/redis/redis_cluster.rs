//! A `RedisStore` on a Redis Cluster, through redis-rs's cluster client: a
//! slot that moves to another master while decisions run on it (`ASK`,
//! `TRYAGAIN`, then `MOVED`), slots resharded under load, a master that
//! stops, a master that hangs while its replica takes over, and connections
//! that are killed.

use std::time::{Duration, Instant};

use ratelimit_core::AdminStore;
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{Store, StoreError};
use ratelimit_tests::cluster_slot;
use ratelimit_tests::fixtures::fixed_window;
use ratelimit_tests::{
    Boxed, NO_EDGE, RedisCluster, admits, assert_counts_down, build, cluster_store, join_in_order,
    named,
};
use ratelimit_tower::FailurePolicy;

use crate::shared::{SlotMove, keys_in_slot, started_cluster, store_timing_out_after};

const HOUR: Duration = Duration::from_secs(3600);

/// The slot of a live key moves from its master to another (`CLUSTER
/// SETSLOT ... IMPORTING/MIGRATING`, `MIGRATE`, `SETSLOT ... NODE`) while
/// decisions run on it: every decision is answered, through `ASK` (the key
/// is on the importing node), `TRYAGAIN` (the block key beside it is on
/// neither) and `MOVED` (the slot has its new owner), and exactly the limit
/// is admitted over the whole move. The call timeout (1 s) is far longer
/// than the half-moved slot lasts, and shorter than redis-rs's own default
/// wait between retries (1.28 s), which the store must not keep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moving_under_live_decisions_keeps_deciding_and_the_limit_exact() {
    let cluster = RedisCluster::start();
    let call_timeout = Duration::from_secs(1);
    let store = store_timing_out_after(&cluster, call_timeout).await;
    let limit = 40;
    let policy = fixed_window("moving", limit, NO_EDGE);
    let key = store.state_key(b"hot", &policy);
    let slot = cluster_slot(key.as_bytes());
    let slot_move = SlotMove::of(&cluster, slot);
    let target = slot_move.target;
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += u64::from(admits(&store, b"hot", &policy).await);
    }
    assert_eq!(admitted, 10);

    slot_move.begin();
    // A command on one key the source lacks (the unblock's DEL of the block
    // key) is asked of the target, which serves it.
    store.unblock(b"hot", &policy).await.unwrap();
    let port = cluster.nodes()[target].port().to_string();
    let migrated = cluster.cli(
        slot_move.source,
        &["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS", &key],
    );
    assert_eq!(migrated, "OK");

    // Decisions while the slot is half moved: they wait out `TRYAGAIN`
    // until the slot has its new owner, then follow `MOVED`.
    let during: Vec<_> = (0..20)
        .map(|_| {
            let store = store.clone();
            let policy = policy.clone();
            tokio::spawn(async move { store.check(b"hot", &policy, 1).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(30)).await;
    slot_move.finish();
    for call in during {
        let decision = call.await.unwrap().expect("a decision during the move");
        admitted += u64::from(decision.is_allowed());
    }
    for _ in 0..30 {
        admitted += u64::from(admits(&store, b"hot", &policy).await);
    }
    assert_eq!(admitted, limit, "60 requests, the limit admitted exactly");
    assert_eq!(cluster.master_of(slot), target);
    assert_eq!(cluster.cli(target, &["EXISTS", &key]).trim(), "1");
}

/// A slot given to another master (no key in it yet) behind the store's
/// back: the first decision on it meets `MOVED` and is answered all the
/// same, on the master named; the store sends that slot's calls to that
/// master from then on and reads the slot map again, so the old master
/// answers `MOVED` about once per connection that was under way to it
/// (the store's own connections carry the coalescer's pipelines and the
/// calls of their own), not once per call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_slot_is_read_once_and_the_next_calls_go_to_its_new_master() {
    let cluster = RedisCluster::start();
    let store = cluster_store(&cluster).await;
    let policy = fixed_window("moved-once", 100, NO_EDGE);
    let slot = cluster_slot(store.state_key(b"mover", &policy).as_bytes());
    let slot_move = SlotMove::of(&cluster, slot);
    let (source, target) = (slot_move.source, slot_move.target);
    // Warm: both connections open, the functions loaded on every master.
    assert!(admits(&store, b"warm", &policy).await);
    store.ping().await.unwrap();
    slot_move.give_empty();
    let moved = || errors(&cluster, source, "MOVED");
    let before = moved();
    assert_counts_down(&store, b"mover", &policy, 20, 99, "after the move").await;
    let redirected = moved() - before;
    assert!(
        (1..=6).contains(&redirected),
        "the old master answered MOVED {redirected} times to 20 calls"
    );
    assert_eq!(keys_of_slot_on(&cluster, target, slot).len(), 1);
}

/// A master that stops: a decision on its slots is an outage (its
/// connection is refused) well before the call timeout, which the failure
/// policy decides, not a call that hangs until it times out; the other
/// masters keep deciding and answer `ping`; once it is back, its slots
/// decide again. (redis-rs retries a refused master as it retries a
/// `TRYAGAIN`, and the store spreads those retries over the call timeout,
/// so the refused master fails after about half of it, not at once.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_master_is_an_outage_before_the_call_timeout_and_the_others_keep_deciding() {
    let mut cluster = RedisCluster::start();
    let call_timeout = Duration::from_secs(1);
    let store = store_timing_out_after(&cluster, call_timeout).await;
    let policy = fixed_window("stopped", 5, NO_EDGE);
    let users: Vec<String> = (0..3)
        .map(|node| {
            (0..10_000)
                .map(|i| format!("user-{i}"))
                .find(|u| {
                    let key = store.state_key(u.as_bytes(), &policy);
                    cluster.master_of(cluster_slot(key.as_bytes())) == node
                })
                .unwrap()
        })
        .collect();
    for user in &users {
        assert!(admits(&store, user.as_bytes(), &policy).await);
    }
    cluster.node_mut(0).stop();
    // The cluster still answers, through the masters that are up.
    store
        .ping()
        .await
        .expect("a ping with two masters of three up");
    for attempt in 0..3 {
        let started = Instant::now();
        let error = store
            .check(users[0].as_bytes(), &policy, 1)
            .await
            .expect_err("the master is stopped");
        let took = started.elapsed();
        assert!(error.is_outage(), "attempt {attempt}: {error}");
        assert!(
            !matches!(error, StoreError::Timeout(_)),
            "attempt {attempt}: the refused master hung until the call timeout"
        );
        assert!(FailurePolicy::Open.allows(&error), "{error}");
        assert!(!FailurePolicy::Closed.allows(&error), "{error}");
        // A refusal spreads its retries over about half the call timeout;
        // the whole timeout is the bound that tells it from a hang.
        assert!(
            took < call_timeout,
            "attempt {attempt}: a refused master failed after {took:?}"
        );
        for user in &users[1..] {
            let started = Instant::now();
            assert!(admits(&store, user.as_bytes(), &policy).await);
            // Waiting on the stopped master would take the call timeout.
            assert!(started.elapsed() < call_timeout / 2, "{user}");
        }
    }
    // Back (same address, data lost): its slots decide again on new connections.
    cluster.node_mut(0).restart();
    let mut back = false;
    for _ in 0..50 {
        if store.check(users[0].as_bytes(), &policy, 1).await.is_ok() {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(back, "the restarted master decides again within 5 s");
}

/// When every connection of every node is killed, the next decisions are
/// still answered (a call whose connection broke goes again through the
/// cluster client, which reconnects) and the limit stays exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_survive_killed_connections_and_keep_the_limit_exact() {
    let cluster = RedisCluster::start();
    let store = cluster_store(&cluster).await;
    let limit = 30;
    let policy = fixed_window("killed", limit, NO_EDGE);
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += u64::from(admits(&store, b"hot", &policy).await);
    }
    for node in 0..3 {
        cluster.cli(node, &["CLIENT", "KILL", "TYPE", "normal"]);
    }
    for i in 0..25 {
        let decision = store
            .check(b"hot", &policy, 1)
            .await
            .unwrap_or_else(|e| panic!("check {i} after the kill: {e}"));
        admitted += u64::from(decision.is_allowed());
    }
    assert_eq!(admitted, limit, "35 requests, the limit admitted exactly");
}

/// `n` keys whose state keys under `policy` live on `master`.
fn keys_of_master(
    cluster: &RedisCluster,
    store: &RedisStore,
    policy: &ratelimit_core::Policy,
    master: usize,
    n: usize,
) -> Vec<String> {
    let mut owners = std::collections::HashMap::new();
    (0..100_000)
        .map(|i| format!("user-{i}"))
        .filter(|k| {
            let slot = cluster_slot(store.state_key(k.as_bytes(), policy).as_bytes());
            *owners
                .entry(slot)
                .or_insert_with(|| cluster.master_of(slot))
                == master
        })
        .take(n)
        .collect()
}

/// A semaphore check whose caller goes away after it was queued, before it
/// was written, holds no permit: the cluster client leaves out a call whose
/// caller is gone, and the release queued after it, on the same connection,
/// runs (a check written before its caller went away would run first, and
/// be released). (On one thread, the release is queued before the check's
/// write goes out.)
#[tokio::test(flavor = "current_thread")]
async fn a_check_dropped_before_its_write_is_released_after_it() {
    let cluster = RedisCluster::start();
    let store = cluster_store(&cluster).await;
    let policy = ratelimit_tests::named(
        "sem",
        ratelimit_core::Policy::concurrency(5, Duration::from_secs(3600)),
    );
    let master = cluster.master_of(cluster_slot(store.state_key(b"gone", &policy).as_bytes()));
    // Warm: the connection open, the functions loaded.
    assert_eq!(
        store.check(b"gone", &policy, 0).await.unwrap().remaining(),
        5
    );
    let calls = || {
        let stats = cluster.cli(master, &["INFO", "commandstats"]);
        stats
            .lines()
            .filter(|l| l.starts_with("cmdstat_fcall:") || l.starts_with("cmdstat_evalsha:"))
            .filter_map(|l| {
                l.split_once("calls=")?
                    .1
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum::<u64>()
    };
    let before = calls();
    // Polled once (queued), then dropped.
    let mut check = Box::pin(store.check(b"gone", &policy, 1));
    let polled = std::future::poll_fn(|cx| std::task::Poll::Ready(check.as_mut().poll(cx))).await;
    assert!(polled.is_pending(), "{polled:?}");
    drop(check);
    // The release runs; the check, whose caller was gone before its write,
    // does not.
    let start = Instant::now();
    while calls() < before + 1 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the release did not run"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(calls(), before + 1, "the abandoned check was sent");
    let peek = store.check(b"gone", &policy, 0).await.unwrap();
    assert_eq!(peek.remaining(), 5, "a permit is held: {peek:?}");
}

/// A store on a new cluster, served by a current-thread runtime (returned
/// second), with one call (cost 1 on `k` of `policy`, 99 left) polled once
/// by another current-thread runtime (returned last) and dropped there.
fn a_call_left_on_another_runtime(
    name: &str,
    call_timeout: Duration,
) -> (
    RedisCluster,
    tokio::runtime::Runtime,
    RedisStore,
    ratelimit_core::Policy,
    tokio::runtime::Runtime,
) {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    };
    let cluster = RedisCluster::start();
    let serving = runtime();
    let store = serving.block_on(store_timing_out_after(&cluster, call_timeout));
    let policy = fixed_window(name, 100, NO_EDGE);
    // Warm: the master's connection open, the functions loaded.
    let warm = serving.block_on(store.check(b"k", &policy, 1)).unwrap();
    assert_eq!(warm.remaining(), 99);
    let other = runtime();
    other.block_on(async {
        let mut check = Box::pin(store.check(b"k", &policy, 1));
        let polled =
            std::future::poll_fn(|cx| std::task::Poll::Ready(check.as_mut().poll(cx))).await;
        assert!(polled.is_pending(), "{polled:?}");
    });
    (cluster, serving, store, policy, other)
}

/// A call polled once from a runtime that then shuts down, and dropped with
/// it before it went out: it is never sent, and the next call, from the
/// runtime that serves the store, is answered at once.
#[test]
fn a_call_dropped_with_its_runtime_before_it_went_out_is_never_sent() {
    // A next call stuck behind the lost one would take all of it: long, so
    // that half of it leaves a loaded machine plenty of slack.
    let call_timeout = Duration::from_secs(4);
    let (_cluster, serving, store, policy, doomed) =
        a_call_left_on_another_runtime("lost", call_timeout);
    drop(doomed);
    let started = Instant::now();
    let next = serving.block_on(store.check(b"k", &policy, 1));
    let next = next.unwrap_or_else(|e| panic!("after {:?}: {e}", started.elapsed()));
    assert!(next.is_allowed());
    assert_eq!(next.remaining(), 98, "the lost call was sent: {next:?}");
    assert!(
        started.elapsed() < call_timeout / 2,
        "{:?}",
        started.elapsed()
    );
}

/// A single-node store given the URL of a cluster's node (`builder`, not
/// `cluster_builder`) meets `MOVED` for every key another master serves: a
/// mistake in the set-up, refused, never an outage that a failure policy
/// would let through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_store_on_a_cluster_node_is_refused_not_failed_open() {
    let cluster = RedisCluster::start();
    let policy = fixed_window("wrong-builder", 10, NO_EDGE);
    let mut refused = 0;
    for url in cluster.urls() {
        let store = build(RedisStore::builder(url)).await;
        for i in 0..20 {
            match store.check(format!("k{i}").as_bytes(), &policy, 1).await {
                Ok(decision) => assert!(decision.is_allowed()),
                Err(e) => {
                    assert!(!e.is_outage(), "{e:?}");
                    refused += 1;
                }
            }
        }
    }
    assert!(refused > 0, "no key met another master");
}

/// A TLS cluster behind a private CA (`tls_root_cert`): every node speaks
/// TLS only, clients and cluster bus alike. Under 64
/// tasks, one hot key admits exactly its limit and keys over every master
/// exactly theirs; checks of a concurrency limit (a lease of an hour) cut
/// short by a timeout, some after they were sent, leave no permit held
/// within seconds, as a release queued behind its check never overtakes it.
/// Without the CA the store is refused, as a mistake (not an outage).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_with_a_private_ca_keeps_every_limit_exact() {
    use ratelimit_core::Policy;
    use ratelimit_tests::Certificates;

    let certs = Certificates::make();
    let cluster = RedisCluster::start_tls(&certs);
    assert!(cluster.urls()[0].starts_with("rediss://"));
    let store =
        build(RedisStore::cluster_builder(cluster.urls()).tls_root_cert(certs.ca_pem())).await;

    // One hot key and 120 keys over the three masters, 64 tasks at once.
    let hot = fixed_window("tls-hot", 100, NO_EDGE);
    let spread = fixed_window("tls-spread", 3, NO_EDGE);
    let tasks: Vec<_> = (0..64)
        .map(|task| {
            let (store, hot, spread) = (store.clone(), hot.clone(), spread.clone());
            tokio::spawn(async move {
                let mut admitted = (0u64, std::collections::HashMap::<u64, u64>::new());
                for i in 0..10u64 {
                    let hot_check = store.check(b"hot", &hot, 1).await.unwrap();
                    admitted.0 += u64::from(hot_check.is_allowed());
                    let k = (task * 10 + i) % 120;
                    let key = format!("spread-{k}");
                    let d = store.check(key.as_bytes(), &spread, 1).await.unwrap();
                    *admitted.1.entry(k).or_default() += u64::from(d.is_allowed());
                }
                admitted
            })
        })
        .collect();
    let mut hot_admitted = 0;
    let mut per_key = std::collections::HashMap::<u64, u64>::new();
    for task in tasks {
        let (h, keys) = task.await.unwrap();
        hot_admitted += h;
        for (k, n) in keys {
            *per_key.entry(k).or_default() += n;
        }
    }
    assert_eq!(hot_admitted, 100, "640 checks of one key, limit 100");
    assert_eq!(per_key.len(), 120);
    for (k, n) in &per_key {
        // 640 checks over 120 keys: at least 5 per key, limit 3.
        assert_eq!(*n, 3, "key spread-{k}");
    }
    let masters: std::collections::HashSet<usize> = (0..120)
        .map(|k| {
            let key = store.state_key(format!("spread-{k}").as_bytes(), &spread);
            cluster.master_of(cluster_slot(key.as_bytes()))
        })
        .collect();
    assert_eq!(masters.len(), 3, "the keys span every master");

    // Checks cut short leave no permit behind.
    let one = named("tls-permit", Policy::concurrency(1, HOUR));
    for i in 0..40u64 {
        let cut = Duration::from_micros(50 * (i % 8));
        // A check cut short releases what it may have taken in the
        // background, so the next one may still find the permit held.
        if let Ok(Ok(decision)) = tokio::time::timeout(cut, store.check(b"worker", &one, 1)).await
            && let Some(permit) = decision.permit()
        {
            store.release(b"worker", &one, permit).await.unwrap();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let decision = store.check(b"worker", &one, 1).await.unwrap();
        if decision.is_allowed() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a check cut short kept its permit: {decision:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Without the CA, the nodes' certificate is not trusted.
    let untrusting = RedisStore::cluster_builder(cluster.urls())
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await;
    let refused = untrusting.expect_err("a cluster store without the CA was built");
    assert!(
        !refused.is_outage(),
        "a mistake, not an outage: {refused:?}"
    );
}

/// A cluster whose masters may evict keys (a memory bound under
/// `volatile-lru`) is refused at build, as a single node is: an evicted key
/// would start again with a full budget. `allow_eviction()` builds.
#[tokio::test]
async fn a_cluster_that_may_evict_keys_is_refused_at_build() {
    let cluster = RedisCluster::start();
    for index in 0..cluster.nodes().len() {
        assert_eq!(
            cluster.cli(index, &["CONFIG", "SET", "maxmemory", "100mb"]),
            "OK"
        );
        assert_eq!(
            cluster.cli(
                index,
                &["CONFIG", "SET", "maxmemory-policy", "volatile-lru"]
            ),
            "OK"
        );
    }
    ratelimit_tests::stores::assert_refused_while_evicting(|| {
        RedisStore::cluster_builder(cluster.urls())
    })
    .await;
}

/// Two slots move from one master to another key by key (`CLUSTER SETSLOT
/// ... IMPORTING` and `MIGRATING`, a `MIGRATE` of one key at a time, then
/// `SETSLOT ... NODE` on every master) while 64 tasks check the keys of
/// those slots as fast as they can, in batches: no key admits more than its
/// limit (a request redirected in a batch is sent again alone, and a batch
/// declares every key it touches, so Redis never serves a key of a
/// half-moved slot as fresh on the node that lacks it), no `MIGRATE` finds
/// a copy already on the target, and afterwards each key lives on one node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_under_load_admits_no_key_past_its_limit() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let (cluster, store) = started_cluster().await;
    let limit = 2;
    let policy = fixed_window("resharded", limit, NO_EDGE);
    let first = cluster_slot(store.state_key(b"k0", &policy).as_bytes());
    let source = cluster.master_of(first);
    let second = (0..16_384u16)
        .map(|s| (first + 1 + s) % 16_384)
        .find(|&s| cluster.master_of(s) == source)
        .expect("another slot of the source");
    let mut keys = keys_in_slot(&store, &policy, first, 8);
    keys.extend(keys_in_slot(&store, &policy, second, 8));
    let moves = [
        SlotMove::of(&cluster, first),
        SlotMove::of(&cluster, second),
    ];
    let target = moves[0].target;

    let admitted: Arc<Vec<AtomicU64>> = Arc::new(keys.iter().map(|_| AtomicU64::new(0)).collect());
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..64)
        .map(|task| {
            let (store, policy, keys) = (store.clone(), policy.clone(), keys.clone());
            let (admitted, errors, stop) = (admitted.clone(), errors.clone(), stop.clone());
            tokio::spawn(async move {
                for j in 0..5_000usize {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let k = (task * 7 + j) % keys.len();
                    match store.check(keys[k].as_bytes(), &policy, 1).await {
                        Ok(d) => {
                            admitted[k].fetch_add(u64::from(d.is_allowed()), Ordering::Relaxed);
                        }
                        Err(e) => {
                            assert!(e.is_outage(), "{e}");
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    for slot_move in &moves {
        slot_move.begin();
        let in_slot: Vec<&String> = keys
            .iter()
            .filter(|k| {
                cluster_slot(store.state_key(k.as_bytes(), &policy).as_bytes()) == slot_move.slot
            })
            .collect();
        for key in in_slot {
            tokio::time::sleep(Duration::from_millis(20)).await;
            slot_move.migrate_if_any(&store.state_key(key.as_bytes(), &policy));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        slot_move.finish();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    for (key, admitted) in keys.iter().zip(admitted.iter()) {
        let admitted = admitted.load(Ordering::Relaxed);
        assert!(
            admitted <= limit,
            "{key} admitted {admitted}, limit {limit}"
        );
        let state = store.state_key(key.as_bytes(), &policy);
        assert_eq!(
            nodes_holding(&cluster, &state),
            [target],
            "{state} lives on"
        );
    }
    assert_eq!(cluster.master_of(first), target);
    assert_eq!(cluster.master_of(second), target);
}

/// A batch on a slot whose first key has moved to the importing master
/// while another of its keys has not (`MIGRATE` of one key): Redis answers
/// the batch `TRYAGAIN` or `ASK`, and each request goes again on its own to
/// where its key lives. A key already spent is denied wherever it is, and
/// the key still on the source is never written fresh on the target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_first_key_moved_admits_no_key_afresh() {
    let (cluster, store) = started_cluster().await;
    let policy = fixed_window("first-moved", 1, NO_EDGE);
    let slot = cluster_slot(store.state_key(b"k0", &policy).as_bytes());
    let keys = keys_in_slot(&store, &policy, slot, 4);
    for key in &keys {
        assert!(admits(&store, key.as_bytes(), &policy).await, "{key}");
    }
    let slot_move = SlotMove::of(&cluster, slot);
    let (source, target) = (slot_move.source, slot_move.target);
    slot_move.begin();
    let states: Vec<String> = keys
        .iter()
        .map(|k| store.state_key(k.as_bytes(), &policy))
        .collect();
    slot_move.migrate(&states[2]);
    // The first two go alone and fill the slot's lane; the last two wait
    // and go as one batch, the moved key first.
    let calls: Vec<Boxed<Result<ratelimit_core::Decision, StoreError>>> = keys
        .iter()
        .map(|k| Box::pin(store.check(k.as_bytes(), &policy, 1)) as Boxed<_>)
        .collect();
    for (key, decision) in keys.iter().zip(join_in_order(calls).await) {
        let decision = decision.unwrap_or_else(|e| panic!("{key}: {e}"));
        assert!(!decision.is_allowed(), "{key}, already spent: {decision:?}");
    }
    // The target holds the moved key alone.
    assert_eq!(keys_of_slot_on(&cluster, target, slot), [states[2].clone()]);
    for state in [&states[0], &states[1], &states[3]] {
        slot_move.migrate(state);
    }
    slot_move.finish();
    for key in &keys {
        assert!(!admits(&store, key.as_bytes(), &policy).await, "{key}");
    }
    assert!(keys_of_slot_on(&cluster, source, slot).is_empty());
}

/// One pipeline to a master carries a call per slot, and one of its slots
/// is half moved to another master (`CLUSTER SETSLOT ... IMPORTING` and
/// `MIGRATING`, one of its two keys migrated): Redis answers that call
/// `TRYAGAIN` and runs the pipeline's other calls, each once; the two
/// requests of the half-moved slot go again on their own, the migrated key
/// to the target (through `ASK`), the other on the source. Every request is
/// counted exactly once, and every key lives on one node, the moving slot's
/// on the target once the move ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_with_a_call_on_a_moving_slot_counts_every_request_once() {
    let (cluster, store) = started_cluster().await;
    let limit = 10;
    let policy = fixed_window("piped", limit, NO_EDGE);
    let slot_of = |key: &str| cluster_slot(store.state_key(key.as_bytes(), &policy).as_bytes());
    let moving = slot_of("k0");
    let slot_move = SlotMove::of(&cluster, moving);
    let (source, target) = (slot_move.source, slot_move.target);
    // The moving slot's two keys, then six keys of other slots of the source.
    let mut keys = keys_in_slot(&store, &policy, moving, 2);
    keys.extend(
        keys_of_master(&cluster, &store, &policy, source, 7)
            .into_iter()
            .filter(|k| slot_of(k) != moving)
            .take(6),
    );
    assert_eq!(keys.len(), 8);
    for key in &keys {
        let d = store.check(key.as_bytes(), &policy, 1).await.unwrap();
        assert_eq!(d.remaining(), limit - 1, "{key}: {d:?}");
    }
    let states: Vec<String> = keys
        .iter()
        .map(|k| store.state_key(k.as_bytes(), &policy))
        .collect();
    slot_move.begin();
    slot_move.migrate(&states[0]);
    let tryagain = || errors(&cluster, source, "TRYAGAIN");
    let (before, tryagain_before) = (store.coalescing(), tryagain());

    // The lead request (the last key) fills the master's lane, held there
    // while the source pauses its writes; the eight that follow wait and
    // go as one pipeline: the moving slot's two requests as one call, each
    // other key's as a call of its own.
    assert_eq!(
        cluster.cli(source, &["CLIENT", "PAUSE", "300", "WRITE"]),
        "OK"
    );
    let order = std::iter::once(7).chain(0..8);
    let calls: Vec<Boxed<Result<ratelimit_core::Decision, StoreError>>> = order
        .clone()
        .map(|i| Box::pin(store.check(keys[i].as_bytes(), &policy, 1)) as Boxed<_>)
        .collect();
    for (i, decision) in order.zip(join_in_order(calls).await) {
        let decision = decision.unwrap_or_else(|e| panic!("{}: {e}", keys[i]));
        assert!(decision.is_allowed(), "{}: {decision:?}", keys[i]);
    }
    let after = store.coalescing();
    assert_eq!(
        (after.calls - before.calls, after.requests - before.requests),
        (4, 9),
        "the lead, one pipeline of eight, two requests again alone: {after:?}"
    );
    assert!(tryagain() > tryagain_before, "no call met TRYAGAIN");

    slot_move.migrate(&states[1]);
    slot_move.finish();
    // The key checked twice in the round counts 3; every other, 2.
    for (i, key) in keys.iter().enumerate() {
        let spent = if i == 7 { 3 } else { 2 };
        let peek = store.check(key.as_bytes(), &policy, 0).await.unwrap();
        assert_eq!(peek.remaining(), limit - spent, "{key}: {peek:?}");
        let home = if i < 2 { target } else { source };
        assert_eq!(
            nodes_holding(&cluster, &states[i]),
            [home],
            "{key} lives on"
        );
    }
}

/// How many `code` errors (`MOVED`, `TRYAGAIN`...) node `node` answered
/// (`INFO errorstats`).
fn errors(cluster: &RedisCluster, node: usize, code: &str) -> u64 {
    let stats = cluster.cli(node, &["INFO", "errorstats"]);
    let prefix = format!("errorstat_{code}:count=");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// The nodes that hold the key `state` (in its slot, whoever owns it).
fn nodes_holding(cluster: &RedisCluster, state: &str) -> Vec<usize> {
    let slot = cluster_slot(state.as_bytes());
    (0..3)
        .filter(|&node| {
            keys_of_slot_on(cluster, node, slot)
                .iter()
                .any(|k| k == state)
        })
        .collect()
}

/// The keys node `node` holds in `slot`, whoever owns it, sorted.
fn keys_of_slot_on(cluster: &RedisCluster, node: usize, slot: u16) -> Vec<String> {
    let reply = cluster.cli(
        node,
        &["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "1000"],
    );
    let mut keys: Vec<String> = reply.lines().map(str::to_owned).collect();
    keys.sort();
    keys
}

/// One user's two limits (one hash tag, so one slot) while one of their two
/// keys has moved to the importing master and the other has not: Redis
/// serves the request nowhere (`TRYAGAIN`) until the slot has moved whole,
/// and the requests made in between, in batches and alone, are decided
/// then, all or nothing: the spent limit denies every one, and the other
/// limit gives nothing away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_limit_request_on_a_half_moved_slot_waits_and_stays_all_or_nothing() {
    use ratelimit_core::Check;

    let (cluster, store) = started_cluster().await;
    let spent = fixed_window("half-spent", 1, NO_EDGE);
    let spare = fixed_window("half-spare", 100, NO_EDGE);
    let checks = [
        Check::new(b"user", &spent, 1),
        Check::new(b"user", &spare, 1),
    ];
    let first = store.check_all(&checks).await.unwrap();
    assert!(first.iter().all(|d| d.is_allowed()), "{first:?}");
    let (spent_key, spare_key) = (
        store.state_key(b"user", &spent),
        store.state_key(b"user", &spare),
    );
    let slot = cluster_slot(spent_key.as_bytes());
    assert_eq!(slot, cluster_slot(spare_key.as_bytes()));
    let slot_move = SlotMove::of(&cluster, slot);
    let (source, target) = (slot_move.source, slot_move.target);
    slot_move.begin();
    slot_move.migrate(&spare_key);
    // Six requests at once: two go alone, four in a batch, all meet
    // `TRYAGAIN` while the spent limit's key is still on the source.
    let calls: Vec<_> = (0..6)
        .map(|_| {
            let (store, spent, spare) = (store.clone(), spent.clone(), spare.clone());
            tokio::spawn(async move {
                let checks = [
                    Check::new(b"user", &spent, 1),
                    Check::new(b"user", &spare, 1),
                ];
                store.check_all(&checks).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    slot_move.migrate(&spent_key);
    slot_move.finish();
    for call in calls {
        let decisions = call.await.unwrap().expect("decided once the slot moved");
        assert!(!decisions[0].is_allowed(), "{decisions:?}");
        assert_eq!(decisions[1].remaining(), 99, "{decisions:?}");
    }
    let peek = store.check(b"user", &spare, 0).await.unwrap();
    assert_eq!(
        peek.remaining(),
        99,
        "the spare limit gave something away: {peek:?}"
    );
    assert_eq!(keys_of_slot_on(&cluster, target, slot).len(), 2);
    assert!(keys_of_slot_on(&cluster, source, slot).is_empty());
}

/// A user whose state under `policy` lives on node `master`.
fn user_on(
    cluster: &RedisCluster,
    store: &RedisStore,
    policy: &ratelimit_core::Policy,
    master: usize,
) -> String {
    (0..10_000)
        .map(|i| format!("user-{i}"))
        .find(|u| {
            let key = store.state_key(u.as_bytes(), policy);
            cluster.master_of(cluster_slot(key.as_bytes())) == master
        })
        .expect("a user of the master")
}

/// A master hangs (`SIGSTOP`: its connections stay open and answer
/// nothing), and its replica takes over (`CLUSTER FAILOVER TAKEOVER`):
/// with one call every `gap`, decisions on the hung master's slots resume
/// within 2 s of the promotion, each call until then failing as an outage
/// that the failure policy decides, and the other masters decide throughout.
async fn a_failover_is_followed(gap: Duration) {
    let cluster = RedisCluster::start_with_replica();
    let call_timeout = Duration::from_millis(200);
    let store = build(
        RedisStore::cluster_builder(cluster.urls())
            .call_timeout(call_timeout)
            .connect_timeout(Duration::from_millis(300)),
    )
    .await;
    let policy = fixed_window("failover", 1_000_000, NO_EDGE);
    let hung = user_on(&cluster, &store, &policy, 0);
    let healthy = user_on(&cluster, &store, &policy, 1);
    assert!(admits(&store, hung.as_bytes(), &policy).await);
    cluster.nodes()[0].freeze();
    // Calls while the master hangs: outages, until the replica is promoted
    // 700 ms after the master hung, between two calls at the slower rate
    // (after the first of them timed out, so that a store that read the
    // slot map again only then found nothing new).
    let frozen = Instant::now();
    let promote_at = frozen + Duration::from_millis(700);
    let mut promoted: Option<Instant> = None;
    let mut resumed = None;
    let mut calls = 0;
    while resumed.is_none() {
        let next = Instant::now() + gap;
        match store.check(hung.as_bytes(), &policy, 1).await {
            Ok(d) if promoted.is_some() => {
                assert!(d.is_allowed(), "{d:?}");
                resumed = Some(Instant::now());
            }
            Ok(d) => panic!("a hung master decided: {d:?}"),
            Err(e) => {
                assert!(e.is_outage(), "call {calls}: {e}");
                assert!(FailurePolicy::Open.allows(&e), "{e}");
            }
        }
        calls += 1;
        assert!(
            promoted.is_none_or(|p| p.elapsed() < Duration::from_secs(5)),
            "no decision within 5 s of the promotion ({calls} calls)"
        );
        if resumed.is_some() {
            break;
        }
        assert!(admits(&store, healthy.as_bytes(), &policy).await);
        if promoted.is_none() && next >= promote_at {
            tokio::time::sleep_until(promote_at.into()).await;
            let reply = cluster.cli(3, &["CLUSTER", "FAILOVER", "TAKEOVER"]);
            assert_eq!(reply, "OK", "TAKEOVER");
            while !cluster.cli(3, &["ROLE"]).starts_with("master") {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            promoted = Some(Instant::now());
        }
        tokio::time::sleep_until(next.into()).await;
    }
    let (promoted, resumed) = (promoted.unwrap(), resumed.unwrap());
    let after = resumed.saturating_duration_since(promoted);
    assert!(
        after <= Duration::from_secs(2),
        "decisions resumed {after:?} after the promotion ({calls} calls, one every {gap:?})"
    );
    for _ in 0..5 {
        assert!(admits(&store, hung.as_bytes(), &policy).await);
    }
    cluster.nodes()[0].thaw();
}

/// [`a_failover_is_followed`] with one call every 1.5 s: each call after
/// the master hung timed out, and no call comes to show the store the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_is_followed_at_one_call_every_1500_ms() {
    a_failover_is_followed(Duration::from_millis(1500)).await;
}

/// [`a_failover_is_followed`] with one call every 20 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_is_followed_at_one_call_every_20_ms() {
    a_failover_is_followed(Duration::from_millis(20)).await;
}

/// A cluster store built on a runtime that then shuts down, with the
/// cluster client's own tasks on it: calls from another runtime find that
/// client gone (an outage, which the failure policy decides), the store
/// opens its connections again on their runtime, and they decide again
/// within a second.
#[test]
fn a_cluster_store_outlives_the_runtime_that_built_it() {
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime")
    };
    let cluster = RedisCluster::start();
    let building = runtime();
    let store = building.block_on(store_timing_out_after(&cluster, Duration::from_millis(500)));
    let policy = fixed_window("outlived", 1_000, NO_EDGE);
    assert!(building.block_on(admits(&store, b"k", &policy)));
    drop(building);
    let serving = runtime();
    serving.block_on(async {
        let started = Instant::now();
        let mut failed = 0;
        loop {
            match store.check(b"k", &policy, 1).await {
                Ok(d) => {
                    assert!(d.is_allowed(), "{d:?}");
                    break;
                }
                Err(e) => {
                    assert!(e.is_outage(), "{e}");
                    failed += 1;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(1),
                "no decision within 1 s ({failed} calls failed)"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for _ in 0..10 {
            assert!(admits(&store, b"k", &policy).await);
        }
    });
}

/// The decisions node `index` has run since it started (`calls` of
/// `FCALL`, `EVALSHA` and `EVAL`, which the store sends after `NOSCRIPT`),
/// and the calls it answered with a redirection instead (`rejected_calls`:
/// `MOVED` once it serves the slot no more). A replica applies its
/// master's effects (`MULTI`, the script's writes, `EXEC`), not these
/// commands, so it runs none.
fn decisions_run(cluster: &RedisCluster, index: usize) -> (u64, u64) {
    let stats = cluster.cli(index, &["INFO", "commandstats"]);
    let count = |field: &str| -> u64 {
        stats
            .lines()
            .filter(|l| {
                ["cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"]
                    .iter()
                    .any(|command| l.starts_with(command))
            })
            .filter_map(|l| {
                l.split([':', ','])
                    .find_map(|f| f.strip_prefix(field)?.strip_prefix('='))
            })
            .map(|n| n.trim().parse::<u64>().expect("a count of calls"))
            .sum()
    };
    (count("calls"), count("rejected_calls"))
}

/// A master hangs, its replica takes over, and the old master comes back
/// (`SIGCONT`) at once, while 8 tasks decide on its slot as fast as they
/// can, one call per decision. The exception Redis Cluster leaves (it has
/// no fencing): the old master answers the calls that reach it before it
/// hears of its demotion, on the count it had before the failover (the
/// calls on their way when it wakes, and any the store sends before then
/// on the slot map it read before the promotion). Every admission the new
/// master does not count is one of those, which the old master's own
/// command counts show; and once the store has read the new slot map it
/// sends the old master nothing (RELIABILITY.md, "Redis Cluster").
///
/// The replica has every earlier write before the master hangs, so the
/// new master starts from the old one's count.
///
/// No call may time out on the frozen master: one that did would still
/// run there when it wakes, unseen by the store, and each such decision
/// would let one admission the store made up pass as the old master's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thawed_old_master_decides_only_the_calls_that_reached_it_before_its_demotion() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let cluster = RedisCluster::start_with_replica();
    // Longer than the freeze: half a second, and the promotion, bounded
    // at 5 s below.
    let call_timeout = Duration::from_secs(10);
    let store = build(
        RedisStore::cluster_builder(cluster.urls())
            .call_timeout(call_timeout)
            .connect_timeout(Duration::from_millis(300))
            .max_batch(1),
    )
    .await;
    let limit = 1_000_000;
    // Windows are aligned on the clock, and the count starts again at an
    // edge: an hour's edge may fall within the test (then about a quarter
    // of the admissions were counted in the window before it). A thousand
    // days' edge is years away, checked below.
    let policy = fixed_window("thawed", limit, Duration::from_secs(1_000 * 24 * 3_600));
    let user = user_on(&cluster, &store, &policy, 0);
    for _ in 0..5 {
        assert!(admits(&store, user.as_bytes(), &policy).await);
    }
    let window_left = store
        .check(user.as_bytes(), &policy, 0)
        .await
        .unwrap()
        .reset_after();
    assert!(
        window_left > Duration::from_secs(600),
        "the window ends within the test: {window_left:?}"
    );
    cluster.nodes()[0].wait_replicated(&cluster.nodes()[3]);
    let (before_freeze, _) = decisions_run(&cluster, 0);
    cluster.nodes()[0].freeze();
    let admitted = Arc::new(AtomicU64::new(5));
    let failed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let in_flight = 8;
    let tasks: Vec<_> = (0..in_flight)
        .map(|_| {
            let (store, policy, user) = (store.clone(), policy.clone(), user.clone());
            let (admitted, failed, stop) = (admitted.clone(), failed.clone(), stop.clone());
            tokio::spawn(async move {
                for _ in 0..100_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    match store.check(user.as_bytes(), &policy, 1).await {
                        Ok(d) => {
                            assert!(d.is_allowed(), "{d:?}");
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            assert!(e.is_outage(), "{e}");
                            failed.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reply = cluster.cli(3, &["CLUSTER", "FAILOVER", "TAKEOVER"]);
    assert_eq!(reply, "OK", "TAKEOVER");
    let start = Instant::now();
    while !cluster.cli(3, &["ROLE"]).starts_with("master") {
        assert!(start.elapsed() < Duration::from_secs(5), "not promoted");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cluster.nodes()[0].thaw();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let failed = failed.load(Ordering::Relaxed);
    assert_eq!(failed, 0, "calls failed, within {call_timeout:?}");
    let peek = store.check(user.as_bytes(), &policy, 0).await.unwrap();
    let counted = limit - peek.remaining();
    let admitted = admitted.load(Ordering::Relaxed);
    assert!(
        admitted > 1_000,
        "decisions did not resume after the failover: {admitted} admitted"
    );
    // Every decision the old master ran after its freeze was answered to
    // the store (none failed): an admission neither master counts is
    // over this bound.
    let (on_the_old_master, _) = decisions_run(&cluster, 0);
    let on_the_old_master = on_the_old_master - before_freeze;
    assert!(
        counted + on_the_old_master >= admitted,
        "{admitted} admitted, {counted} counted on the new master, \
         {on_the_old_master} decided on the old one"
    );
    // The store has read the new slot map: nothing more for the old
    // master, not even a call it would answer with `MOVED`.
    let settled = decisions_run(&cluster, 0);
    for _ in 0..100 {
        assert!(admits(&store, user.as_bytes(), &policy).await);
    }
    assert_eq!(
        decisions_run(&cluster, 0),
        settled,
        "calls sent to the old master (run, redirected)"
    );
    assert!(
        cluster.cli(0, &["ROLE"]).starts_with("slave"),
        "the old master follows the new one"
    );
}
