//! A `RedisStore` on a Redis Cluster (its direct path to each master, and
//! redis-rs's cluster client behind it): a slot that moves to another master
//! while decisions run on it (`ASK`, `TRYAGAIN`, then `MOVED`), a master
//! that stops, and connections that are killed.

use std::time::{Duration, Instant};

use ratelimit_core::AdminStore;
use ratelimit_core::key::cluster_slot;
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{Store, StoreError};
use ratelimit_tests::fixtures::fixed_window;
use ratelimit_tests::{RedisCluster, admits, build};
use ratelimit_tower::FailurePolicy;

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
    let store = build(RedisStore::cluster_builder(cluster.urls()).call_timeout(call_timeout)).await;
    let limit = 40;
    let policy = fixed_window("moving", limit, HOUR);
    let key = store.state_key(b"hot", &policy);
    let slot = cluster_slot(key.as_bytes());
    let source = cluster.master_of(slot);
    let target = (source + 1) % 3;
    let ids: Vec<String> = (0..3)
        .map(|i| cluster.cli(i, &["CLUSTER", "MYID"]).trim().to_owned())
        .collect();
    let slot_arg = slot.to_string();
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += u64::from(admits(&store, b"hot", &policy).await);
    }
    assert_eq!(admitted, 10);

    let setslot = |node: usize, state: &str, other: usize| {
        let reply = cluster.cli(node, &["CLUSTER", "SETSLOT", &slot_arg, state, &ids[other]]);
        assert_eq!(reply.trim(), "OK", "SETSLOT {state} on node {node}");
    };
    setslot(target, "IMPORTING", source);
    setslot(source, "MIGRATING", target);
    // A command on one key the source lacks (the unblock's DEL of the block
    // key) is asked of the target, which serves it.
    store.unblock(b"hot", &policy).await.unwrap();
    let port = cluster.nodes()[target].port().to_string();
    let migrated = cluster.cli(
        source,
        &["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS", &key],
    );
    assert_eq!(migrated.trim(), "OK");

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
    for node in [target, source, 3 - target - source] {
        setslot(node, "NODE", target);
    }
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
    let store = build(RedisStore::cluster_builder(cluster.urls()).call_timeout(call_timeout)).await;
    let policy = fixed_window("stopped", 5, HOUR);
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
        assert!(
            took < call_timeout * 3 / 4,
            "attempt {attempt}: a refused master failed after {took:?}"
        );
        for user in &users[1..] {
            let started = Instant::now();
            assert!(admits(&store, user.as_bytes(), &policy).await);
            assert!(started.elapsed() < call_timeout / 4, "{user}");
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

/// Decisions go straight to the master of their slot, on connections of the
/// store's own (not through the cluster client's routing): the master of a
/// key sees its `FCALL`s arrive on more than the one connection the cluster
/// client keeps to it. When every connection is killed, the next decisions
/// are still answered (the dead direct connections hand their calls to the
/// cluster client, which reconnects) and the limit stays exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_go_straight_to_their_master_and_survive_killed_connections() {
    let cluster = RedisCluster::start();
    let store = build(RedisStore::cluster_builder(cluster.urls())).await;
    let limit = 30;
    let policy = fixed_window("direct", limit, HOUR);
    let key = store.state_key(b"hot", &policy);
    let master = cluster.master_of(cluster_slot(key.as_bytes()));
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += u64::from(admits(&store, b"hot", &policy).await);
    }
    let clients = cluster.cli(master, &["CLIENT", "LIST"]);
    let fcalls = clients.lines().filter(|l| l.contains("cmd=fcall")).count();
    assert!(fcalls >= 2, "FCALL on {fcalls} connection(s):\n{clients}");

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
