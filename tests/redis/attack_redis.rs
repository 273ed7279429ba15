//! Attacks on `RedisStore`'s claims, each against real servers: a store
//! shared by several tokio runtimes, one of which shuts down while it runs
//! another runtime's calls (a single node and a cluster), a cluster
//! resharded under mixed, partly cancelled load and under every algorithm,
//! a master failed over under load, every master's functions flushed, and
//! a cluster's pipelines (single checks answered as text) decided against
//! one node's, at the largest numbers. Over-admission is measured
//! by counting admissions per key against a limit whose window cannot roll
//! over during the test (a fixed window of an hour); a call that fails
//! while every server is up is a failure too, as a failure policy would
//! answer it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ratelimit_core::redis::RedisStore;
use ratelimit_core::{Check, Decision, Policy, Store, StoreError};
use ratelimit_tests::fault_proxy::FaultProxy;
use ratelimit_tests::fixtures::{Rng, fixed_window};
use ratelimit_tests::{Boxed, NO_EDGE, RedisCluster, RedisServer, build, cluster_slot};

use crate::shared::{SlotMove, keys_in_slot, started_cluster, store_timing_out_after};

const HOUR: Duration = Duration::from_secs(3600);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn runtime(threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Two runtimes share a store on one connection, every reply 200 ms late.
/// A call of the doomed runtime goes out alone and fills the lane; a call
/// of the serving runtime queues behind it, and the doomed runtime's
/// caller, answered, starts the batch that carries it, in a task on the
/// doomed runtime. That runtime shuts down while the batch is in flight.
/// Redis is up all along: the serving runtime's call is decided (sent
/// again if need be: counted twice at worst), never an outage that a
/// failure policy would answer.
#[test]
fn a_call_carried_by_a_runtime_that_shuts_down_is_decided_not_failed() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let serving = runtime(1);
    let store = serving.block_on(async {
        build(
            RedisStore::builder(proxy.redis_url())
                .pool_size(1)
                .call_timeout(Duration::from_secs(3)),
        )
        .await
    });
    let limit = 10;
    let policy = fixed_window("carried", limit, NO_EDGE);
    // Loads the functions, so the calls below are one round trip each.
    serving.block_on(async {
        let d = store.check(b"warm", &policy, 1).await.expect("warm-up");
        assert!(d.is_allowed());
    });
    proxy.set_latency(ms(200));
    let doomed = runtime(1);
    let lead = {
        let (store, policy) = (store.clone(), policy.clone());
        doomed.spawn(async move { store.check(b"lead", &policy, 1).await })
    };
    std::thread::sleep(ms(50));
    let carried = {
        let (store, policy) = (store.clone(), policy.clone());
        serving.spawn(async move { store.check(b"carried", &policy, 1).await })
    };
    // The lead is answered at about 200 ms, and the batch carrying the
    // serving runtime's call goes out then, on the doomed runtime, to be
    // answered at about 400 ms.
    std::thread::sleep(ms(300));
    assert!(lead.is_finished(), "the lead call is still in flight");
    drop(doomed);
    let decided: Result<Decision, StoreError> = serving
        .block_on(carried)
        .expect("the serving runtime's task");
    let decided = decided.unwrap_or_else(|e| {
        panic!("Redis is up, yet the call failed (a failure policy would answer it): {e}")
    });
    assert!(decided.is_allowed(), "{decided:?}");
    proxy.set_latency(Duration::ZERO);
    serving.block_on(async {
        let peek = store.check(b"carried", &policy, 0).await.unwrap();
        // Counted once, or twice when it ran before its task went away.
        assert!(
            (limit - 2..=limit - 1).contains(&peek.remaining()),
            "{peek:?}"
        );
    });
}

/// The keys node `node` holds in `slot`, whoever owns it.
fn keys_of_slot_on(cluster: &RedisCluster, node: usize, slot: u16) -> Vec<String> {
    let reply = cluster.cli(
        node,
        &["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "1000"],
    );
    reply.lines().map(str::to_owned).collect()
}

/// A reshard around the slot of user `u0` under `policy`: the master of
/// that slot (the source), the master the moves go to (the target), the
/// two slots of the source to move (`u0`'s and another), and users of each
/// of them and of a slot of the third master, which no move touches,
/// listed slot by slot, as many as `counts` says.
fn reshard_around(
    cluster: &RedisCluster,
    store: &RedisStore,
    policy: &Policy,
    counts: [usize; 3],
) -> (usize, usize, [u16; 2], Vec<String>) {
    let first = cluster_slot(store.state_key(b"u0", policy).as_bytes());
    let source = cluster.master_of(first);
    let target = (source + 1) % 3;
    let other = 3 - source - target;
    let second = (0..16_384u16)
        .map(|s| (first + 1 + s) % 16_384)
        .find(|&s| cluster.master_of(s) == source)
        .expect("another slot of the source");
    // The masters own ranges of slots: a few samples find the third's.
    let third = (0..16u16)
        .map(|i| i * 1_024)
        .find(|&s| cluster.master_of(s) == other)
        .expect("a slot of the third master");
    let users = [first, second, third]
        .into_iter()
        .zip(counts)
        .flat_map(|(slot, n)| keys_in_slot(store, policy, slot, n))
        .collect();
    (source, target, [first, second], users)
}

/// Two slots of one master move to another key by key (`SETSLOT ...
/// IMPORTING` / `MIGRATING`, one `MIGRATE` per state key, so one user's
/// two limits are split between the nodes for a while, then `SETSLOT ...
/// NODE`) while 48 tasks decide, in batches: single checks, one user's two
/// limits at once, two users' limits in different slots (decided slot by
/// slot and refunded on a denial), some of each dropped after a random
/// 0 to 2 ms (cancelled at whatever await they reached). No limit of any
/// user admits more than its limit, and no call fails: every node is up,
/// the split windows are far shorter than the call timeout, and an error
/// would be answered by a failure policy. Every key ends on one node.
/// (Through redis-rs's retries, calls redirected by `ASK` met `MOVED` back
/// from the importing master, their `ASKING` taken by another call, until
/// the retries ran out: outages, or calls hung for the whole call timeout.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_under_mixed_load_with_cancellations_fails_nothing_and_admits_nothing_past_a_limit()
 {
    let (cluster, store) = started_cluster().await;
    let policies = [
        fixed_window("mix-a", 3, NO_EDGE),
        fixed_window("mix-b", 2, NO_EDGE),
    ];
    let slot_of =
        |user: &str| cluster_slot(store.state_key(user.as_bytes(), &policies[0]).as_bytes());
    let (source, target, [first, second], users) =
        reshard_around(&cluster, &store, &policies[0], [6, 6, 6]);
    for user in &users {
        // One hash tag: a user's limits share a slot.
        let b = cluster_slot(store.state_key(user.as_bytes(), &policies[1]).as_bytes());
        assert_eq!(slot_of(user), b, "{user}");
    }
    let moves = [
        SlotMove::of(&cluster, first),
        SlotMove::of(&cluster, second),
    ];

    // admitted[user * 2 + policy]
    let (tally, dropped) = (Tally::new(users.len() * 2), Arc::new(AtomicU64::new(0)));
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..48u64)
        .map(|task| {
            let (store, policies, users) = (store.clone(), policies.clone(), users.clone());
            let (tally, dropped) = (tally.clone(), dropped.clone());
            tokio::spawn(async move {
                let mut rng = Rng(task + 1);
                for _ in 0..3_000 {
                    if tally.stopping() {
                        break;
                    }
                    let u = rng.index(users.len());
                    let v = (u + 1 + rng.index(users.len() - 1)) % users.len();
                    let (checked, call): (Vec<usize>, Boxed<Result<Vec<Decision>, StoreError>>) =
                        match rng.below(3) {
                            0 => {
                                let p = rng.index(2);
                                let call = store.check(users[u].as_bytes(), &policies[p], 1);
                                (
                                    vec![u * 2 + p],
                                    Box::pin(async move { call.await.map(|d| vec![d]) }),
                                )
                            }
                            1 => {
                                let checks = [
                                    Check::new(users[u].as_bytes(), &policies[0], 1),
                                    Check::new(users[u].as_bytes(), &policies[1], 1),
                                ];
                                (vec![u * 2, u * 2 + 1], Box::pin(store.check_all(&checks)))
                            }
                            _ => {
                                let checks = [
                                    Check::new(users[u].as_bytes(), &policies[0], 1),
                                    Check::new(users[v].as_bytes(), &policies[1], 1),
                                ];
                                (vec![u * 2, v * 2 + 1], Box::pin(store.check_all(&checks)))
                            }
                        };
                    let what = format!("{checked:?} at {:?}", started.elapsed());
                    let Some(result) = maybe_dropped(call, &mut rng, 4, 2_000, &dropped).await
                    else {
                        continue;
                    };
                    if let Err(e) = &result {
                        assert!(e.is_outage(), "{e}");
                    }
                    tally.record(&checked, result, || {
                        format!("[attack] {:?}, {what}", started.elapsed())
                    });
                }
            })
        })
        .collect();
    tokio::time::sleep(ms(30)).await;
    for slot_move in &moves {
        slot_move.begin();
        for user in users.iter().filter(|u| slot_of(u) == slot_move.slot) {
            for policy in &policies {
                tokio::time::sleep(ms(10)).await;
                slot_move.migrate_if_any(&store.state_key(user.as_bytes(), policy));
            }
        }
        // Keys the tasks created on the source meanwhile (none should be
        // left: a missing key is served by the target while importing).
        for state in keys_of_slot_on(&cluster, source, slot_move.slot) {
            slot_move.migrate_if_any(&state);
        }
        slot_move.finish();
    }
    println!("[attack] resharded after {:?}", started.elapsed());
    tokio::time::sleep(ms(100)).await;
    tally.stop_and_join(tasks).await;
    println!(
        "[attack] joined after {:?}: errors {}, dropped {}",
        started.elapsed(),
        tally.errors(),
        dropped.load(Ordering::Relaxed)
    );
    // Every node was up: an error would have been answered by a failure
    // policy, admitting under fail open.
    assert_eq!(tally.errors(), 0, "outages while every node was up");
    for (u, user) in users.iter().enumerate() {
        for (p, policy) in policies.iter().enumerate() {
            let admitted = tally.admitted(u * 2 + p);
            let limit = if p == 0 { 3 } else { 2 };
            assert!(
                admitted <= limit,
                "{user} under {} admitted {admitted}, limit {limit}",
                policy.name()
            );
            let state = store.state_key(user.as_bytes(), policy);
            let slot = cluster_slot(state.as_bytes());
            let copies: Vec<usize> = (0..3)
                .filter(|&node| keys_of_slot_on(&cluster, node, slot).contains(&state))
                .collect();
            assert!(copies.len() <= 1, "{state} lives on {copies:?}");
        }
    }
    assert_eq!(cluster.master_of(first), target);
    assert_eq!(cluster.master_of(second), target);
}

/// The admissions a load of tasks was told of, per index (a user, or a user
/// under a policy), and how the load went: the calls that failed, the
/// tasks that saw the order to stop.
struct Tally {
    admitted: Vec<AtomicU64>,
    errors: AtomicU64,
    stopped: AtomicU64,
    stop: AtomicBool,
}

impl Tally {
    /// A tally of `len` indexes, all at 0.
    fn new(len: usize) -> Arc<Self> {
        Arc::new(Tally {
            admitted: (0..len).map(|_| AtomicU64::new(0)).collect(),
            errors: AtomicU64::new(0),
            stopped: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        })
    }

    /// Whether the tasks were told to stop (counting the task that asks).
    fn stopping(&self) -> bool {
        let stop = self.stop.load(Ordering::Relaxed);
        if stop {
            self.stopped.fetch_add(1, Ordering::Relaxed);
        }
        stop
    }

    /// Counts one call of the indexes `checked`: each admitted once when
    /// every decision allowed; an error counted, the first five printed
    /// after `what`.
    fn record(
        &self,
        checked: &[usize],
        result: Result<Vec<Decision>, StoreError>,
        what: impl FnOnce() -> String,
    ) {
        match result {
            Ok(decisions) if decisions.iter().all(Decision::is_allowed) => {
                for &i in checked {
                    self.admitted[i].fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(_) => {}
            Err(e) => {
                if self.errors.fetch_add(1, Ordering::Relaxed) < 5 {
                    println!("{}: {e:?}", what());
                }
            }
        }
    }

    /// Spawns `tasks` tasks, each making up to `calls` calls until told to
    /// stop: `call` picks each from the task's random numbers (seeded with
    /// `seed` plus the task's index) and names the indexes it checks; every
    /// result is recorded, an error printed after `label`.
    fn spawn_load<F>(
        self: &Arc<Self>,
        tasks: u64,
        seed: u64,
        calls: usize,
        label: &'static str,
        call: F,
    ) -> Vec<tokio::task::JoinHandle<()>>
    where
        F: Fn(&mut Rng) -> (Vec<usize>, Boxed<Result<Vec<Decision>, StoreError>>)
            + Clone
            + Send
            + 'static,
    {
        (0..tasks)
            .map(|task| {
                let (tally, call) = (Arc::clone(self), call.clone());
                tokio::spawn(async move {
                    let mut rng = Rng(task + seed);
                    for _ in 0..calls {
                        if tally.stopping() {
                            break;
                        }
                        let (checked, result) = call(&mut rng);
                        let result = result.await;
                        tally.record(&checked, result, || format!("[{label}] {checked:?}"));
                    }
                })
            })
            .collect()
    }

    /// Tells the tasks to stop and waits for them.
    async fn stop_and_join(&self, tasks: Vec<tokio::task::JoinHandle<()>>) {
        self.stop.store(true, Ordering::Relaxed);
        for task in tasks {
            task.await.unwrap();
        }
    }

    /// Checks `key` under `policy` `times` times more (every call must
    /// succeed), counting the admissions under `i`.
    async fn check_to_the_end(
        &self,
        store: &RedisStore,
        i: usize,
        key: &str,
        policy: &Policy,
        times: u64,
    ) {
        for _ in 0..times {
            if store
                .check(key.as_bytes(), policy, 1)
                .await
                .unwrap()
                .is_allowed()
            {
                self.admitted[i].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// What was admitted under `i`.
    fn admitted(&self, i: usize) -> u64 {
        self.admitted[i].load(Ordering::Relaxed)
    }

    /// Calls that failed.
    fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
}

/// A store, a policy and the keys a load's tasks check under it, with what
/// each key admitted: each task holds a clone.
#[derive(Clone)]
struct CountedKeys {
    store: RedisStore,
    policy: Policy,
    keys: Arc<[String]>,
    admitted: Arc<[AtomicU64]>,
}

impl CountedKeys {
    /// `keys` under `policy` on `store`, none admitted yet.
    fn new(store: &RedisStore, policy: &Policy, keys: Vec<String>) -> Self {
        CountedKeys {
            store: store.clone(),
            policy: policy.clone(),
            admitted: keys.iter().map(|_| AtomicU64::new(0)).collect(),
            keys: keys.into(),
        }
    }

    /// Checks the key at `k` once, counting it admitted when allowed.
    async fn check(&self, k: usize) -> Result<Decision, StoreError> {
        let decision = self
            .store
            .check(self.keys[k].as_bytes(), &self.policy, 1)
            .await?;
        if decision.is_allowed() {
            self.admitted[k].fetch_add(1, Ordering::Relaxed);
        }
        Ok(decision)
    }

    /// What the key at `k` admitted.
    fn admitted(&self, k: usize) -> u64 {
        self.admitted[k].load(Ordering::Relaxed)
    }
}

/// A store on `cluster`, built on `serving` (the runtime that lives on),
/// whose calls time out after 3 s.
fn cluster_store_on(serving: &tokio::runtime::Runtime, cluster: &RedisCluster) -> RedisStore {
    serving.block_on(store_timing_out_after(cluster, Duration::from_secs(3)))
}

/// Shuts `doomed` down `after` its tasks started, while `callers` (tasks
/// of `serving`, each answering the errors it met) go on, and asserts that
/// every call of theirs was decided: every node is up.
fn shut_down_midway(
    serving: &tokio::runtime::Runtime,
    doomed: tokio::runtime::Runtime,
    callers: Vec<tokio::task::JoinHandle<Vec<String>>>,
    after: Duration,
) {
    std::thread::sleep(after);
    drop(doomed);
    let failed: Vec<String> = serving.block_on(async {
        let mut failed = Vec::new();
        for caller in callers {
            failed.extend(caller.await.expect("a caller"));
        }
        failed
    });
    assert!(
        failed.is_empty(),
        "{} calls failed while every node was up, first: {:?}",
        failed.len(),
        failed.first()
    );
}

/// A cluster store shared by two runtimes, both deciding on keys of every
/// master, one of which shuts down mid-flight: its tasks carried the other
/// runtime's requests too (a master's lane runs its pipelines in a task of
/// the runtime that started it). Every node is up: every call of the
/// runtime that lives on is decided, none fails.
#[test]
fn a_cluster_store_decides_every_call_of_a_runtime_that_outlives_another() {
    let cluster = RedisCluster::start();
    let serving = runtime(1);
    let store = cluster_store_on(&serving, &cluster);
    let policy = fixed_window("two-runtimes", 1_000_000, NO_EDGE);
    serving.block_on(async {
        assert!(store.check(b"warm", &policy, 1).await.unwrap().is_allowed());
    });
    let doomed = runtime(1);
    for task in 0..32 {
        let (store, policy) = (store.clone(), policy.clone());
        doomed.spawn(async move {
            for i in 0..10_000 {
                let key = format!("doomed-{task}-{}", i % 64);
                let _ = store.check(key.as_bytes(), &policy, 1).await;
            }
        });
    }
    let callers: Vec<_> = (0..32)
        .map(|task| {
            let (store, policy) = (store.clone(), policy.clone());
            serving.spawn(async move {
                let mut failed = Vec::new();
                for i in 0..300 {
                    let key = format!("serving-{task}-{}", i % 64);
                    if let Err(e) = store.check(key.as_bytes(), &policy, 1).await {
                        failed.push(e.to_string());
                    }
                }
                failed
            })
        })
        .collect();
    shut_down_midway(&serving, doomed, callers, ms(100));
}

/// A semaphore of 3, 24 tasks each taking a permit, holding it for a moment
/// and releasing it, a third of their checks dropped after a random 0 to
/// 3 ms (before they went out, while queued, or in flight). At no moment
/// do callers hold more than 3 permits, and once every task is done every
/// permit is free again (those of dropped checks released, none left to
/// its lease of an hour).
async fn cancelled_semaphore_checks(store: &RedisStore) {
    let max = 3;
    let policy = Policy::concurrency(max, HOUR)
        .and_then(|p| p.with_name("attack-sem"))
        .unwrap();
    assert!(store.check(b"sem", &policy, 0).await.unwrap().is_allowed());
    let holding = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let (admitted, dropped) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let tasks: Vec<_> = (0..24u64)
        .map(|task| {
            let (store, policy) = (store.clone(), policy.clone());
            let (holding, most) = (holding.clone(), most.clone());
            let (admitted, dropped) = (admitted.clone(), dropped.clone());
            tokio::spawn(async move {
                let mut rng = Rng(task + 7);
                for _ in 0..60 {
                    let call = store.check(b"sem", &policy, 1);
                    let Some(decision) = maybe_dropped(call, &mut rng, 3, 3_000, &dropped).await
                    else {
                        continue;
                    };
                    let decision = decision.expect("Redis is up");
                    let Some(permit) = decision.permit().filter(|_| decision.is_allowed()) else {
                        continue;
                    };
                    admitted.fetch_add(1, Ordering::Relaxed);
                    let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_micros(rng.below(2_000))).await;
                    holding.fetch_sub(1, Ordering::SeqCst);
                    store
                        .release(b"sem", &policy, permit)
                        .await
                        .expect("a release");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    println!(
        "[attack] admitted {}, dropped {}, most held {most}",
        admitted.load(Ordering::Relaxed),
        dropped.load(Ordering::Relaxed)
    );
    assert!(
        most <= max,
        "{most} callers held permits at once, max {max}"
    );
    assert!(admitted.load(Ordering::Relaxed) > 0, "nothing was admitted");
    // The releases of dropped checks run in tasks: moments, not a lease.
    let mut free = 0;
    for _ in 0..100 {
        free = store.check(b"sem", &policy, 0).await.unwrap().remaining();
        if free == max {
            break;
        }
        tokio::time::sleep(ms(20)).await;
    }
    assert_eq!(free, max, "permits left held");
}

/// [`cancelled_semaphore_checks`] on one connection through a proxy
/// (replies 1 ms late, so that calls are dropped in flight), coalescing on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_semaphore_checks_never_let_more_than_max_hold_on_a_node() {
    let (_server, proxy) = FaultProxy::with_new_server();
    let store = build(
        RedisStore::builder(proxy.redis_url())
            .pool_size(2)
            .call_timeout(Duration::from_secs(3)),
    )
    .await;
    proxy.set_latency(ms(1));
    cancelled_semaphore_checks(&store).await;
}

/// [`cancelled_semaphore_checks`] on a cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_semaphore_checks_never_let_more_than_max_hold_on_a_cluster() {
    let cluster = RedisCluster::start();
    let store = store_timing_out_after(&cluster, Duration::from_secs(3)).await;
    cancelled_semaphore_checks(&store).await;
}

/// `call`, or, one time in `one_in` (by `rng`), dropped if it has not
/// finished within a random time under `max_micros` µs (then `None`, and
/// `dropped` counts it).
async fn maybe_dropped<T>(
    call: impl std::future::Future<Output = T>,
    rng: &mut Rng,
    one_in: u64,
    max_micros: u64,
    dropped: &AtomicU64,
) -> Option<T> {
    if rng.below(one_in) != 0 {
        return Some(call.await);
    }
    let after = Duration::from_micros(rng.below(max_micros));
    let result = tokio::time::timeout(after, call).await.ok();
    if result.is_none() {
        dropped.fetch_add(1, Ordering::Relaxed);
    }
    result
}

/// Every algorithm decides the same sequence of checks alike on a cluster,
/// where each check goes alone in its master's pipeline and is answered as
/// one line of text, and on one node, where it is answered as integers:
/// at the largest limit and the longest window (the numbers the text
/// carries near their largest), at small ones, with costs from 1 to the
/// limit, the clock moving by nothing, a microsecond, half a window and
/// more, on keys with hash tags, empty tags and none, some blocked,
/// penalized (up to `u64::MAX`) or rewarded before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_pipeline_decides_every_algorithm_as_one_node_does() {
    use ratelimit_core::clock::ManualClock;
    use ratelimit_core::{AdminStore, Rate};
    use ratelimit_tests::{
        MAX_LIMIT, NOW_MICROS, named, observable, redis_store_on_clock, try_every_algorithm,
    };

    use crate::shared::cluster_store_on_clock;

    let cluster = RedisCluster::start();
    let server = RedisServer::start();
    let clock = ManualClock::new(NOW_MICROS);
    let on_cluster = cluster_store_on_clock(&cluster, &clock).await;
    let on_node = redis_store_on_clock(server.url(), &clock).await;
    let longest = Duration::from_micros(1 << 50);
    let mut policies = Vec::new();
    for (limit, window) in [
        (MAX_LIMIT, longest),
        (MAX_LIMIT, HOUR),
        (MAX_LIMIT, Duration::from_micros(1 << 12)),
        (MAX_LIMIT, Duration::from_micros(1)),
        (5, HOUR),
        (1, longest),
    ] {
        let candidates = try_every_algorithm(limit, window, Rate::new(limit, window));
        // Every algorithm but concurrency, the last.
        for (i, policy) in candidates.into_iter().take(6).enumerate() {
            // Some algorithms refuse the largest numbers together.
            if policy.is_ok() {
                policies.push(named(format!("p{}-{limit}-{i}", policies.len()), policy));
            }
        }
    }
    let keys = [
        "plain", "{}empty", "{tag}a", "{tag}b", "x{}{y}", "{y}", "{", "}{",
    ];
    let mut rng = Rng(7);
    let mut blocks = 0;
    for (p, policy) in policies.iter().enumerate() {
        let limit = policy.limit();
        let window = policy.algorithm().window_micros();
        for step in 0..40 {
            let key = keys[rng.index(keys.len())];
            let cost = match rng.below(6) {
                0 => 1,
                1 => limit,
                2 => limit.saturating_sub(1).max(1),
                3 => (limit / 2).max(1),
                4 => 1 + rng.below(limit),
                _ => 0,
            };
            let by = match rng.below(5) {
                0 | 1 => 0,
                2 => 1,
                3 => window / 2,
                _ => window + 1,
            };
            clock.advance(Duration::from_micros(by));
            // Now and then an administrator's block, penalty or reward
            // first: the checks then meet blocks and debts, large ones too.
            let admin = rng.below(8);
            let amount = match rng.below(3) {
                0 => 1,
                1 => limit,
                _ => u64::MAX,
            };
            let block = Duration::from_micros(match rng.below(3) {
                0 => 1,
                1 => window,
                _ => u64::MAX,
            });
            let mut done = Vec::new();
            for store in [&on_node, &on_cluster] {
                let result = match admin {
                    0 => store
                        .block(key.as_bytes(), policy, block)
                        .await
                        .map(|()| None),
                    1 => store
                        .penalize(key.as_bytes(), policy, amount)
                        .await
                        .map(Some),
                    2 => store.reward(key.as_bytes(), policy, amount).await.map(Some),
                    _ => Ok(None),
                };
                done.push(
                    result
                        .map(|d| d.as_ref().map(observable))
                        .map_err(|e| e.to_string()),
                );
            }
            assert_eq!(done[0], done[1], "policy {p}, step {step}, admin {admin}");
            blocks += u64::from(admin == 0 && done[0].is_ok());
            let want = on_node.check(key.as_bytes(), policy, cost).await;
            let got = on_cluster.check(key.as_bytes(), policy, cost).await;
            let want = want.as_ref().map(observable).map_err(|e| e.to_string());
            let got = got.as_ref().map(observable).map_err(|e| e.to_string());
            assert_eq!(
                want,
                got,
                "policy {p} ({}), step {step}, key {key}, cost {cost}",
                policy.name()
            );
        }
    }
    assert!(blocks > 20, "{blocks} blocks");
}

/// Two slots of one master move to another key by key while 32 tasks
/// decide, under every algorithm but the semaphore, with limits of 1 to 5
/// that nothing refills during the test: single checks, one user's two
/// limits together, and two users' limits whose hash tags differ but hash
/// to one slot (one slot: one script, all or nothing; limits of several
/// slots are refunded on a denial, which a request between may keep from
/// giving back, so they are left out). No call fails (every node
/// is up) and each user admits exactly its limit under each policy: never
/// more, and, as nothing was lost and sent again, never fewer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_under_every_algorithm_admits_each_limit_exactly() {
    use ratelimit_core::Rate;
    use ratelimit_tests::named;

    // A call whose keys a move has split between the two masters waits out
    // `TRYAGAIN` until the slot's last key has moved: its timeout outlasts
    // a move, one `redis-cli` per key (up to 3 s on a busy 2-core machine).
    let cluster = RedisCluster::start();
    let store = store_timing_out_after(&cluster, Duration::from_secs(10)).await;
    let slow = Rate::per_hour(1);
    let policies = [
        named("ra-fw", Policy::fixed_window(1, NO_EDGE)),
        named("ra-log", Policy::sliding_window_log(2, HOUR)),
        named("ra-swc", Policy::sliding_window_counter(3, NO_EDGE)),
        named("ra-tb", Policy::token_bucket(4, slow)),
        named("ra-gcra", Policy::gcra(5, slow)),
        named("ra-lb", Policy::leaky_bucket(3, slow)),
    ];
    let slot_of =
        |user: &str| cluster_slot(store.state_key(user.as_bytes(), &policies[0]).as_bytes());
    let (source, target, [first, second], users) =
        reshard_around(&cluster, &store, &policies[0], [16, 8, 4]);
    let n = policies.len();
    let tally = Tally::new(users.len() * n);
    let tasks = tally.spawn_load(32, 11, 2_000, "reshard", {
        let (store, policies, users) = (store.clone(), policies.clone(), users.clone());
        move |rng| {
            let u = rng.index(users.len());
            let p = rng.index(n);
            let q = (p + 1 + rng.index(n - 1)) % n;
            // Another user of the same slot (the users are listed slot by
            // slot: 16, 8, then 4): other hash tags, one script.
            let (start, len) = match u {
                0..16 => (0, 16),
                16..24 => (16, 8),
                _ => (24, 4),
            };
            let w = start + (u - start + 1 + rng.index(len - 1)) % len;
            match rng.below(3) {
                0 => {
                    let call = store.check(users[u].as_bytes(), &policies[p], 1);
                    (
                        vec![u * n + p],
                        Box::pin(async move { call.await.map(|d| vec![d]) }),
                    )
                }
                1 => {
                    let checks = [
                        Check::new(users[u].as_bytes(), &policies[p], 1),
                        Check::new(users[u].as_bytes(), &policies[q], 1),
                    ];
                    (
                        vec![u * n + p, u * n + q],
                        Box::pin(store.check_all(&checks)),
                    )
                }
                _ => {
                    let checks = [
                        Check::new(users[u].as_bytes(), &policies[p], 1),
                        Check::new(users[w].as_bytes(), &policies[q], 1),
                    ];
                    (
                        vec![u * n + p, w * n + q],
                        Box::pin(store.check_all(&checks)),
                    )
                }
            }
        }
    });
    tokio::time::sleep(ms(20)).await;
    // The moves block on `redis-cli`: off the workers, which keep serving
    // the load.
    tokio::task::block_in_place(|| {
        for slot_move in [
            SlotMove::of(&cluster, first),
            SlotMove::of(&cluster, second),
        ] {
            slot_move.begin();
            for user in users.iter().filter(|u| slot_of(u) == slot_move.slot) {
                for policy in &policies {
                    slot_move.migrate_if_any(&store.state_key(user.as_bytes(), policy));
                }
            }
            for state in keys_of_slot_on(&cluster, source, slot_move.slot) {
                slot_move.migrate_if_any(&state);
            }
            slot_move.finish();
        }
    });
    tokio::time::sleep(ms(50)).await;
    tally.stop_and_join(tasks).await;
    // Every user is then checked to the end, once the slots have moved:
    // what the load left is taken now, and nothing more.
    for (u, user) in users.iter().enumerate() {
        for (p, policy) in policies.iter().enumerate() {
            tally
                .check_to_the_end(&store, u * n + p, user, policy, 6)
                .await;
        }
    }
    assert_eq!(tally.errors(), 0, "outages while every node was up");
    for (u, user) in users.iter().enumerate() {
        for (p, policy) in policies.iter().enumerate() {
            assert_eq!(
                tally.admitted(u * n + p),
                policy.limit(),
                "{user} under {}",
                policy.name()
            );
        }
    }
    assert_eq!(cluster.master_of(first), target);
    assert_eq!(cluster.master_of(second), target);
}

/// Users of a master and of another one, limits of 3, decided by 16 tasks
/// in three rounds: before the master hangs (`SIGSTOP`, after `WAIT` has
/// seen its writes on its replica), while it hangs and its replica is
/// promoted (`CLUSTER FAILOVER TAKEOVER`), and after. The other master's
/// users never fail; the hung master's fail only as outages; and each user
/// admits exactly its limit in all: the promoted replica held every count,
/// and nothing the hung master was sent counts as admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_load_admits_each_limit_exactly() {
    let cluster = RedisCluster::start_with_replica();
    let store = build(
        RedisStore::cluster_builder(cluster.urls())
            .call_timeout(ms(200))
            .connect_timeout(ms(300)),
    )
    .await;
    let limit = 3;
    let policy = fixed_window("fo-load", limit, NO_EDGE);
    let of_master = |master: usize, n: usize| -> Vec<String> {
        (0..100_000)
            .map(|i| format!("fo-{i}"))
            .filter(|u| {
                let key = store.state_key(u.as_bytes(), &policy);
                cluster.master_of(cluster_slot(key.as_bytes())) == master
            })
            .take(n)
            .collect()
    };
    let hung = of_master(0, 24);
    let healthy = of_master(1, 12);
    // The users before `on_hung` are on the master that hangs.
    let on_hung = hung.len();
    let load = CountedKeys::new(&store, &policy, [hung, healthy].concat());
    let round = |seed: u64, calls: usize| {
        let tasks: Vec<_> = (0..16u64)
            .map(|task| {
                let load = load.clone();
                tokio::spawn(async move {
                    let mut rng = Rng(seed * 100 + task + 1);
                    let mut outages = 0;
                    for _ in 0..calls {
                        let u = rng.index(load.keys.len());
                        if let Err(e) = load.check(u).await {
                            assert!(u < on_hung, "{} failed: {e}", load.keys[u]);
                            assert!(e.is_outage(), "{e}");
                            outages += 1;
                        }
                    }
                    outages
                })
            })
            .collect::<Vec<_>>();
        async move {
            let mut outages = 0;
            for task in tasks {
                outages += task.await.unwrap();
            }
            outages
        }
    };
    assert_eq!(round(1, 3).await, 0, "outages before the failover");
    cluster.nodes()[0].wait_replicated(&cluster.nodes()[3]);
    cluster.nodes()[0].freeze();
    let during = round(2, 12);
    tokio::time::sleep(ms(300)).await;
    let reply = cluster.cli(3, &["CLUSTER", "FAILOVER", "TAKEOVER"]);
    assert_eq!(reply, "OK", "TAKEOVER");
    while !cluster.cli(3, &["ROLE"]).starts_with("master") {
        tokio::time::sleep(ms(5)).await;
    }
    let outages = during.await;
    println!("[failover] outages while the master hung: {outages}");
    // The store follows the promotion within a few seconds: then every user
    // is checked to the end.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    for (u, user) in load.keys.iter().enumerate() {
        let mut checked = 0;
        while checked < limit + 2 {
            match load.check(u).await {
                Ok(_) => checked += 1,
                Err(e) => {
                    assert!(e.is_outage(), "{e}");
                    assert!(std::time::Instant::now() < deadline, "{user}: {e}");
                }
            }
        }
    }
    cluster.nodes()[0].thaw();
    for (u, user) in load.keys.iter().enumerate() {
        assert_eq!(load.admitted(u), limit, "{user}");
    }
}

/// Every master's functions flushed (`FUNCTION FLUSH`), twice, while 16
/// tasks decide on users of every master in pipelines: each call that met
/// `Function not found` is sent again once the library is loaded again, no
/// call fails, and each user admits exactly its limit of 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_flushed_on_every_master_under_load_fail_nothing_and_count_once() {
    let (cluster, store) = started_cluster().await;
    let limit = 5;
    let policy = fixed_window("flushed", limit, NO_EDGE);
    let users: Vec<String> = (0..30).map(|i| format!("fl-{i}")).collect();
    let masters: std::collections::HashSet<usize> = users
        .iter()
        .map(|u| {
            cluster.master_of(cluster_slot(
                store.state_key(u.as_bytes(), &policy).as_bytes(),
            ))
        })
        .collect();
    assert_eq!(masters.len(), 3, "users of every master");
    let tally = Tally::new(users.len());
    let tasks = tally.spawn_load(16, 3, 3_000, "flush", {
        let (store, policy, users) = (store.clone(), policy.clone(), users.clone());
        move |rng| {
            let u = rng.index(users.len());
            let call = store.check(users[u].as_bytes(), &policy, 1);
            (
                vec![u],
                Box::pin(async move { call.await.map(|d| vec![d]) }),
            )
        }
    });
    for _ in 0..2 {
        tokio::time::sleep(ms(20)).await;
        for node in 0..3 {
            assert_eq!(cluster.cli(node, &["FUNCTION", "FLUSH"]), "OK");
        }
    }
    tokio::time::sleep(ms(50)).await;
    tally.stop_and_join(tasks).await;
    for (u, user) in users.iter().enumerate() {
        tally
            .check_to_the_end(&store, u, user, &policy, limit + 1)
            .await;
    }
    assert_eq!(tally.errors(), 0, "calls failed while every node was up");
    assert!(
        tally.stopped.load(Ordering::Relaxed) > 0,
        "the load ended before the flushes"
    );
    for (u, user) in users.iter().enumerate() {
        assert_eq!(tally.admitted(u), limit, "{user}");
    }
}

/// Two runtimes share a cluster store and 48 keys of every master with a
/// limit of 3, and one runtime shuts down while its tasks carry pipelines
/// of the other's requests: those are sent again on their own, which may
/// count a request twice, never admit one past a limit. No call of the
/// runtime that lives on fails, and no key admits more than 3 in all,
/// counting the admissions either runtime's callers were told of.
#[test]
fn a_runtime_shut_down_under_shared_keys_admits_no_key_past_its_limit() {
    let cluster = RedisCluster::start();
    let serving = runtime(1);
    let store = cluster_store_on(&serving, &cluster);
    let limit = 3;
    let policy = fixed_window("shared-runtimes", limit, NO_EDGE);
    let keys = (0..48).map(|i| format!("shared-{i}")).collect();
    let load = CountedKeys::new(&store, &policy, keys);
    let doomed = runtime(1);
    for task in 0..24u64 {
        let load = load.clone();
        doomed.spawn(async move {
            let mut rng = Rng(task + 101);
            for _ in 0..10_000 {
                // An error here is the runtime going down under the call.
                let _ = load.check(rng.index(load.keys.len())).await;
            }
        });
    }
    let callers: Vec<_> = (0..24u64)
        .map(|task| {
            let load = load.clone();
            serving.spawn(async move {
                let mut rng = Rng(task + 1);
                let mut failed = Vec::new();
                for _ in 0..300 {
                    if let Err(e) = load.check(rng.index(load.keys.len())).await {
                        failed.push(e.to_string());
                    }
                }
                failed
            })
        })
        .collect();
    // Early, while the keys still admit: the pipelines lost with the
    // runtime then carry admissions.
    shut_down_midway(&serving, doomed, callers, ms(20));
    for (k, key) in load.keys.iter().enumerate() {
        let admitted = load.admitted(k);
        assert!(admitted <= limit, "{key} admitted {admitted}");
    }
}
