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
/// store's own (not through the cluster client's routing): with two direct
/// connections per master (`pool_size(6)` over 3 masters), two keys of one
/// master whose slots take different connections see their `FCALL`s arrive
/// on two connections, where the cluster client keeps one to each node.
/// When every connection is killed, the next decisions are still answered
/// (the dead direct connections hand their calls to the cluster client,
/// which reconnects) and the limit stays exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_go_straight_to_their_master_and_survive_killed_connections() {
    let cluster = RedisCluster::start();
    let store = build(RedisStore::cluster_builder(cluster.urls()).pool_size(6)).await;
    let limit = 30;
    let policy = fixed_window("direct", limit, HOUR);
    let (master, other) = on_the_other_connection(&cluster, &store, &policy, b"hot");
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += u64::from(admits(&store, b"hot", &policy).await);
        assert!(admits(&store, other.as_bytes(), &policy).await);
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

/// The master of `key`'s state under `policy`, and another key of that
/// master whose slot takes its other direct connection (with two per
/// master, a slot takes the connection of its parity).
fn on_the_other_connection(
    cluster: &RedisCluster,
    store: &RedisStore,
    policy: &ratelimit_core::Policy,
    key: &[u8],
) -> (usize, String) {
    let slot = cluster_slot(store.state_key(key, policy).as_bytes());
    let master = cluster.master_of(slot);
    let other = (0..10_000)
        .map(|n| format!("other-{n}"))
        .find(|k| {
            let s = cluster_slot(store.state_key(k.as_bytes(), policy).as_bytes());
            s % 2 != slot % 2 && cluster.master_of(s) == master
        })
        .expect("a key of the same master on its other connection");
    (master, other)
}

/// The `INFO stats` counter `field` of `node`.
fn stat(cluster: &RedisCluster, node: usize, field: &str) -> u64 {
    let info = cluster.cli(node, &["INFO", "stats"]);
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in INFO stats:\n{info}"))
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

/// Decisions that tasks start in one turn of the runtime, on keys of one
/// master (coalescing off, so each its own call), reach that
/// master in one write: its reads carry many commands each, where a write
/// per call gave it about one. One worker thread, as the runtime's wake
/// order (the connection's task runs right after each caller) is the same
/// on every worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn calls_started_together_go_to_their_master_in_one_write() {
    let cluster = RedisCluster::start();
    let store = build(RedisStore::cluster_builder(cluster.urls()).max_batch(1)).await;
    let policy = fixed_window("together", 100, HOUR);
    let keys = keys_of_master(&cluster, &store, &policy, 0, 40);
    // Warm: every connection open, the functions loaded.
    for key in &keys {
        assert!(admits(&store, key.as_bytes(), &policy).await);
    }
    let (reads, commands) = (
        stat(&cluster, 0, "total_reads_processed"),
        stat(&cluster, 0, "total_commands_processed"),
    );
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(keys.len()));
    let tasks: Vec<_> = keys
        .iter()
        .map(|key| {
            let (store, policy, key) = (store.clone(), policy.clone(), key.clone());
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                store.check(key.as_bytes(), &policy, 1).await
            })
        })
        .collect();
    for task in tasks {
        let decision = task.await.unwrap().expect("a decision");
        assert!(
            decision.is_allowed() && decision.remaining() == 98,
            "{decision:?}"
        );
    }
    // Less the `INFO` that read the counters: one read, one command. (A
    // script's own commands count too: 4 per decision.)
    let reads = stat(&cluster, 0, "total_reads_processed") - reads - 1;
    let commands = stat(&cluster, 0, "total_commands_processed") - commands - 1;
    assert!(commands >= 40, "{commands} commands");
    assert!(
        reads <= 8,
        "40 calls started together took {reads} reads ({commands} commands)"
    );
}

/// A semaphore check whose caller goes away after it was queued, before it
/// was written, holds no permit: the master's connection leaves out a call
/// whose caller is gone, and the release queued after it, on the same
/// connection (a slot keeps to one of its master's two), runs (a check
/// written before its caller went away would run first, and be released).
/// (On one thread, the release is queued before the check's write goes
/// out.)
#[tokio::test(flavor = "current_thread")]
async fn a_check_dropped_before_its_write_is_released_after_it() {
    let cluster = RedisCluster::start();
    let store = build(RedisStore::cluster_builder(cluster.urls()).pool_size(6)).await;
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
/// second), with one call (cost 1 on `k` of `policy`, 99 left) left queued
/// on its master's outbox by another current-thread runtime (returned
/// last): polled once there, so the flush it spawned there has not run.
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
    let store = serving.block_on(build(
        RedisStore::cluster_builder(cluster.urls()).call_timeout(call_timeout),
    ));
    let policy = fixed_window(name, 100, HOUR);
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

/// The next call on `k` is answered at once, and the call left behind was
/// never sent.
fn the_next_call_is_answered_alone(
    serving: &tokio::runtime::Runtime,
    store: &RedisStore,
    policy: &ratelimit_core::Policy,
    call_timeout: Duration,
) {
    let started = Instant::now();
    let next = serving.block_on(store.check(b"k", policy, 1));
    let next = next.unwrap_or_else(|e| panic!("after {:?}: {e}", started.elapsed()));
    assert!(next.is_allowed());
    assert_eq!(next.remaining(), 98, "the lost call was sent: {next:?}");
    assert!(
        started.elapsed() < call_timeout / 2,
        "{:?}",
        started.elapsed()
    );
}

/// A call queued on a master's outbox from a runtime that then shuts down,
/// before the flush it spawned there ran: the flush is dropped with that
/// runtime, and it empties the queue as it goes. The next call, from the
/// runtime that serves the store, is sent and answered, not left behind
/// the lost one waiting for a flush that no one will start (every later
/// call on that connection would time out, an outage, for good).
#[test]
fn a_flush_lost_with_its_runtime_leaves_its_outbox_working() {
    let call_timeout = Duration::from_secs(1);
    let (_cluster, serving, store, policy, doomed) =
        a_call_left_on_another_runtime("lost", call_timeout);
    drop(doomed);
    the_next_call_is_answered_alone(&serving, &store, &policy, call_timeout);
}

/// A call queued from a current-thread runtime that is then kept but no
/// longer driven: the flush it spawned there never runs. Calls behind it
/// wait at most their call timeout; once the lost call's own deadline has
/// passed, the next call starts a flush of its own and is answered, and the
/// lost call is never sent.
#[test]
fn an_outbox_whose_flush_never_runs_recovers_within_a_call_timeout() {
    let call_timeout = Duration::from_millis(300);
    let (_cluster, serving, store, policy, idle) =
        a_call_left_on_another_runtime("idle", call_timeout);
    // `idle` is kept, and never driven again.
    std::thread::sleep(call_timeout + Duration::from_millis(50));
    the_next_call_is_answered_alone(&serving, &store, &policy, call_timeout);
    drop(idle);
}

/// A single-node store given the URL of a cluster's node (`builder`, not
/// `cluster_builder`) meets `MOVED` for every key another master serves: a
/// mistake in the set-up, refused, never an outage that a failure policy
/// would let through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_store_on_a_cluster_node_is_refused_not_failed_open() {
    let cluster = RedisCluster::start();
    let policy = fixed_window("wrong-builder", 10, HOUR);
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
/// TLS only, clients and cluster bus alike. Decisions take the store's own
/// connections to each master there too (redis-rs's multiplexed TLS
/// connections, written through the store's outbox): `FCALL`s arrive on two
/// connections of one master, where the cluster client keeps one. Under 64
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
    let store = build(
        RedisStore::cluster_builder(cluster.urls())
            .tls_root_cert(certs.ca_pem())
            .pool_size(6),
    )
    .await;

    // The direct path: two keys of one master on its two connections.
    let policy = fixed_window("tls-direct", 5, HOUR);
    let (master, other) = on_the_other_connection(&cluster, &store, &policy, b"first");
    assert!(admits(&store, b"first", &policy).await);
    assert!(admits(&store, other.as_bytes(), &policy).await);
    let clients = cluster.cli(master, &["CLIENT", "LIST"]);
    let fcalls = clients.lines().filter(|l| l.contains("cmd=fcall")).count();
    assert!(fcalls >= 2, "FCALL on {fcalls} connection(s):\n{clients}");

    // One hot key and 120 keys over the three masters, 64 tasks at once.
    let hot = fixed_window("tls-hot", 100, HOUR);
    let spread = fixed_window("tls-spread", 3, HOUR);
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
    let one = Policy::concurrency(1, HOUR)
        .unwrap()
        .with_name("tls-permit")
        .unwrap();
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
    let refused = RedisStore::cluster_builder(cluster.urls()).build().await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("volatile-lru") && !e.is_outage()),
        "{:?}",
        refused.err()
    );
    assert!(
        RedisStore::cluster_builder(cluster.urls())
            .allow_eviction()
            .build()
            .await
            .is_ok()
    );
}
