//! Adversarial tests of a `RedisStore` on a Redis Cluster while slots move:
//! slots moved back and forth under 64 tasks, with and without coalescing,
//! many slots at once, chained moves, a slot moved to a master the store
//! has never met, concurrency permits cancelled in flight while their slot
//! moves, and a failover right after a move. Every admission is counted
//! against the limit exactly, and every error while all nodes are up is a
//! failure (a fail-open policy would let it through unlimited).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratelimit_core::redis::RedisStore;
use ratelimit_core::{Policy, Store};
use ratelimit_tests::fixtures::fixed_window;
use ratelimit_tests::{NO_EDGE, RedisCluster, RedisServer, build, cluster_slot};
use std::sync::Mutex;

use crate::shared::keys_in_slot;

/// Every node's id (`CLUSTER MYID`), by index.
fn ids(cluster: &RedisCluster) -> Vec<String> {
    (0..cluster.nodes().len())
        .map(|i| cluster.cli(i, &["CLUSTER", "MYID"]))
        .collect()
}

/// The masters among the nodes (by `ROLE`).
fn masters(cluster: &RedisCluster) -> Vec<usize> {
    (0..cluster.nodes().len())
        .filter(|&i| cluster.cli(i, &["ROLE"]).starts_with("master"))
        .collect()
}

fn setslot(
    cluster: &RedisCluster,
    ids: &[String],
    node: usize,
    slot: u16,
    state: &str,
    other: usize,
) {
    let slot = slot.to_string();
    let reply = cluster.cli(node, &["CLUSTER", "SETSLOT", &slot, state, &ids[other]]);
    assert_eq!(reply, "OK", "SETSLOT {slot} {state} {other} on node {node}");
}

/// Starts moving `slots` from `source` to `target` (importing, migrating).
fn begin(cluster: &RedisCluster, ids: &[String], slots: &[u16], source: usize, target: usize) {
    for &slot in slots {
        setslot(cluster, ids, target, slot, "IMPORTING", source);
        setslot(cluster, ids, source, slot, "MIGRATING", target);
    }
}

/// `MIGRATE`s every key of `slots` from `source` to `target`, a few at a
/// time, until the source holds none, pausing `pause` between batches.
fn migrate_all(
    cluster: &RedisCluster,
    slots: &[u16],
    source: usize,
    target: usize,
    pause: Duration,
) {
    let port = cluster.nodes()[target].port().to_string();
    for &slot in slots {
        for round in 0..1000 {
            let keys: Vec<String> = cluster.nodes()[source].query(&[
                "CLUSTER",
                "GETKEYSINSLOT",
                &slot.to_string(),
                "4",
            ]);
            if keys.is_empty() {
                break;
            }
            assert!(round < 999, "slot {slot} never emptied");
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            let reply = cluster.cli(source, &args);
            assert!(
                reply == "OK" || reply == "NOKEY",
                "MIGRATE {keys:?}: {reply}"
            );
            std::thread::sleep(pause);
        }
    }
}

/// Gives `slots` to `target` on every master (target first, then source).
fn finish(cluster: &RedisCluster, ids: &[String], slots: &[u16], source: usize, target: usize) {
    let mut order = vec![target, source];
    order.extend(
        masters(cluster)
            .into_iter()
            .filter(|&m| m != target && m != source),
    );
    for &slot in slots {
        for &node in &order {
            let reply = cluster.cli(
                node,
                &[
                    "CLUSTER",
                    "SETSLOT",
                    &slot.to_string(),
                    "NODE",
                    &ids[target],
                ],
            );
            // A source that gave away its last slot may have become a
            // replica of the target meanwhile (replica migration).
            assert!(
                reply == "OK" || (node == source && reply.contains("only with masters")),
                "SETSLOT {slot} NODE {target} on node {node}: {reply}"
            );
        }
    }
}

/// A whole move of `slots` from `source` to `target`, keys and all.
fn move_slots(
    cluster: &RedisCluster,
    ids: &[String],
    slots: &[u16],
    source: usize,
    target: usize,
    pause: Duration,
) {
    begin(cluster, ids, slots, source, target);
    migrate_all(cluster, slots, source, target, pause);
    finish(cluster, ids, slots, source, target);
}

/// Waits until every node names `target` as the owner of `slot` (so the
/// next move starts from a settled map).
fn wait_owner(cluster: &RedisCluster, slot: u16, target: usize) {
    let started = Instant::now();
    while cluster.master_of(slot) != target {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "slot {slot} never settled"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether `node` names node 3's own line as serving `slot` in its
/// `CLUSTER NODES` (the node asked need not be the owner).
fn serves(cluster: &RedisCluster, node: usize, slot: u16) -> bool {
    let me = cluster.cli(3, &["CLUSTER", "MYID"]);
    let nodes = cluster.cli(node, &["CLUSTER", "NODES"]);
    nodes.lines().filter(|l| l.starts_with(&me)).any(|line| {
        line.split_whitespace().skip(8).any(|range| {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            match (a.parse::<u16>(), b.parse::<u16>()) {
                (Ok(a), Ok(b)) => (a..=b).contains(&slot),
                _ => false,
            }
        })
    })
}

/// Counts of a load: per key admissions, errors (with the first few).
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) admitted: Vec<AtomicU64>,
    pub(crate) checks: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) first_errors: Mutex<Vec<String>>,
    slowest_ms: AtomicU64,
}

impl Tally {
    pub(crate) fn new(n: usize) -> Arc<Tally> {
        Arc::new(Tally {
            admitted: (0..n).map(|_| AtomicU64::new(0)).collect(),
            ..Tally::default()
        })
    }

    pub(crate) fn error(&self, what: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_errors.lock().unwrap();
        if first.len() < 8 {
            first.push(what);
        }
    }
}

/// Tasks checking keys (cost 1) until stopped, or for 90 s at most.
pub(crate) struct Load {
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
    started: Instant,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// `tasks` tasks checking `keys` in turn under `policy`.
    pub(crate) fn start(
        store: &RedisStore,
        policy: &Policy,
        keys: &[String],
        tasks: usize,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let tally = Tally::new(keys.len());
        let started = Instant::now();
        let tasks = (0..tasks)
            .map(|task| {
                let (store, policy, keys) = (store.clone(), policy.clone(), keys.to_vec());
                let (stop, tally) = (stop.clone(), tally.clone());
                tokio::spawn(async move {
                    for j in 0..200_000usize {
                        if stop.load(Ordering::Relaxed)
                            || started.elapsed() > Duration::from_secs(90)
                        {
                            break;
                        }
                        let k = (task * 7 + j) % keys.len();
                        let at = Instant::now();
                        let result = store.check(keys[k].as_bytes(), &policy, 1).await;
                        let ms = u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX);
                        tally.slowest_ms.fetch_max(ms, Ordering::Relaxed);
                        tally.checks.fetch_add(1, Ordering::Relaxed);
                        match result {
                            Ok(d) => {
                                tally.admitted[k]
                                    .fetch_add(u64::from(d.is_allowed()), Ordering::Relaxed);
                            }
                            Err(e) => {
                                tally.error(format!("{:?} after {ms} ms: {e}", started.elapsed()))
                            }
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            tally,
            started,
            tasks,
        }
    }

    /// Stops the tasks, waits for them, and reports what they counted as `what`.
    pub(crate) async fn stop(self, what: &str) -> Arc<Tally> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
        report(what, &self.tally, self.started);
        self.tally
    }
}

/// 48 tasks taking and releasing concurrency permits of `keys`, a third of
/// the checks cancelled after up to 3 ms, until stopped or `bound` passed:
/// how many each key held at once, by this load's count.
pub(crate) struct PermitLoad {
    stop: Arc<AtomicBool>,
    pub(crate) tally: Arc<Tally>,
    /// The most permits held at once on any key.
    pub(crate) most: Arc<AtomicU64>,
    cancelled: Arc<AtomicU64>,
    /// Per key, the explicit releases that failed (each may hold its
    /// permit for the lease: not the store's leak).
    pub(crate) release_failed: Arc<Vec<AtomicU64>>,
    started: Instant,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl PermitLoad {
    pub(crate) fn start(
        store: &RedisStore,
        policy: &Policy,
        keys: &[String],
        bound: Duration,
    ) -> PermitLoad {
        let counts = || -> Arc<Vec<AtomicU64>> {
            Arc::new(keys.iter().map(|_| AtomicU64::new(0)).collect())
        };
        let (held, release_failed) = (counts(), counts());
        let load = PermitLoad {
            stop: Arc::new(AtomicBool::new(false)),
            tally: Tally::new(keys.len()),
            most: Arc::new(AtomicU64::new(0)),
            cancelled: Arc::new(AtomicU64::new(0)),
            release_failed,
            started: Instant::now(),
            tasks: Vec::new(),
        };
        let tasks = (0..48usize)
            .map(|task| {
                let (store, policy, keys) = (store.clone(), policy.clone(), keys.to_vec());
                let (stop, tally, most) =
                    (load.stop.clone(), load.tally.clone(), load.most.clone());
                let (held, cancelled) = (held.clone(), load.cancelled.clone());
                let release_failed = load.release_failed.clone();
                let started = load.started;
                tokio::spawn(async move {
                    for j in 0..100_000usize {
                        if stop.load(Ordering::Relaxed) || started.elapsed() > bound {
                            break;
                        }
                        let k = (task * 5 + j) % keys.len();
                        let check = store.check(keys[k].as_bytes(), &policy, 1);
                        let result = if (task + j) % 3 == 0 {
                            let wait = Duration::from_micros(((task * 131 + j * 17) % 3000) as u64);
                            match tokio::time::timeout(wait, check).await {
                                Ok(result) => result,
                                Err(_) => {
                                    cancelled.fetch_add(1, Ordering::Relaxed);
                                    continue;
                                }
                            }
                        } else {
                            check.await
                        };
                        tally.checks.fetch_add(1, Ordering::Relaxed);
                        match result {
                            Ok(d) if d.is_allowed() => {
                                let now = held[k].fetch_add(1, Ordering::SeqCst) + 1;
                                most.fetch_max(now, Ordering::SeqCst);
                                tally.admitted[k].fetch_add(1, Ordering::Relaxed);
                                tokio::task::yield_now().await;
                                held[k].fetch_sub(1, Ordering::SeqCst);
                                let permit = d.permit().expect("a permit");
                                let released =
                                    store.release(keys[k].as_bytes(), &policy, permit).await;
                                if let Err(e) = released {
                                    tally.error(format!("release: {e}"));
                                    release_failed[k].fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            Ok(_) => {}
                            Err(e) => tally.error(format!("{:?}: {e}", started.elapsed())),
                        }
                    }
                })
            })
            .collect();
        PermitLoad { tasks, ..load }
    }

    /// Never more than `max` held at once, and once all is released, each
    /// key gives its `max` permits again (less the explicit releases that
    /// failed, which may hold theirs for the lease).
    pub(crate) async fn assert_none_held(
        &self,
        store: &RedisStore,
        policy: &Policy,
        keys: &[String],
        max: u64,
    ) {
        assert!(
            self.most.load(Ordering::SeqCst) <= max,
            "more than {max} held at once"
        );
        let mut leaked = Vec::new();
        for (key, failed) in keys.iter().zip(self.release_failed.iter()) {
            let failed = failed.load(Ordering::Relaxed);
            let mut got = 0;
            for _ in 0..max {
                let d = store.check(key.as_bytes(), policy, 1).await.expect("after");
                got += u64::from(d.is_allowed());
            }
            if got + failed < max {
                leaked.push((key.clone(), max - got, failed));
            }
        }
        assert!(
            leaked.is_empty(),
            "permits left held after every release (key, held, explicit releases that failed): \
             {leaked:?}; errors: {:?}",
            self.tally.first_errors.lock().unwrap()
        );
    }

    /// Stops the tasks, waits for them and then `settle` (the releases of
    /// unclaimed permits run in tasks of their own), and reports as `what`.
    pub(crate) async fn stop(mut self, what: &str, settle: Duration) -> PermitLoad {
        self.stop.store(true, Ordering::Relaxed);
        for task in std::mem::take(&mut self.tasks) {
            task.await.unwrap();
        }
        tokio::time::sleep(settle).await;
        let tally = &self.tally;
        eprintln!(
            "{what}: {} checks, {} cancelled, {} admitted, {} errors, {:?}",
            tally.checks.load(Ordering::Relaxed),
            self.cancelled.load(Ordering::Relaxed),
            tally
                .admitted
                .iter()
                .map(|a| a.load(Ordering::Relaxed))
                .sum::<u64>(),
            tally.errors.load(Ordering::Relaxed),
            self.started.elapsed()
        );
        self
    }
}

/// After the load: each key admitted at most `limit`, and exactly the rest
/// of it is left (a check of the rest is allowed, one more denied), unless
/// `resent`: connections were killed, and a call whose connection broke
/// may have run and is sent again, counted twice at worst (towards
/// denying), never admitted twice.
pub(crate) async fn assert_exact(
    store: &RedisStore,
    policy: &Policy,
    keys: &[String],
    limit: u64,
    tally: &Tally,
    resent: bool,
) {
    let mut over = Vec::new();
    let mut short = Vec::new();
    for (key, admitted) in keys.iter().zip(&tally.admitted) {
        let admitted = admitted.load(Ordering::Relaxed);
        if admitted > limit {
            over.push((key.clone(), admitted));
            continue;
        }
        let rest = limit - admitted;
        if rest > 0 {
            let d = store
                .check(key.as_bytes(), policy, rest)
                .await
                .expect("rest");
            if !d.is_allowed() {
                short.push((key.clone(), admitted, d.remaining()));
                continue;
            }
        }
        let d = store
            .check(key.as_bytes(), policy, 1)
            .await
            .expect("one more");
        if d.is_allowed() {
            // Counted less than admitted: over-admission by a lost count.
            over.push((key.clone(), admitted));
        }
    }
    assert!(
        over.is_empty(),
        "keys admitted past the limit {limit}: {over:?}"
    );
    // A check that failed may have run: counted, never admitted.
    assert!(
        short.is_empty() || resent || tally.errors.load(Ordering::Relaxed) > 0,
        "keys counted more than admitted (double counts), (key, admitted, remaining): {short:?}"
    );
}

fn report(what: &str, tally: &Tally, started: Instant) {
    eprintln!(
        "{what}: {} checks, {} errors, slowest {} ms, {:?}",
        tally.checks.load(Ordering::Relaxed),
        tally.errors.load(Ordering::Relaxed),
        tally.slowest_ms.load(Ordering::Relaxed),
        started.elapsed(),
    );
}

pub(crate) fn assert_no_errors(tally: &Tally) {
    let errors = tally.errors.load(Ordering::Relaxed);
    assert_eq!(
        errors,
        0,
        "errors while every node was up: {:?}",
        tally.first_errors.lock().unwrap()
    );
}

async fn store_on(cluster: &RedisCluster, max_batch: Option<usize>) -> RedisStore {
    let mut builder =
        RedisStore::cluster_builder(cluster.urls()).call_timeout(Duration::from_secs(2));
    if let Some(max_batch) = max_batch {
        builder = builder.max_batch(max_batch);
    }
    build(builder).await
}

/// A 3-master cluster, a store on it, and `keys` of one slot under a fixed
/// window of `limit`.
struct Scene {
    cluster: RedisCluster,
    store: RedisStore,
    limit: u64,
    policy: Policy,
    slot: u16,
    keys: Vec<String>,
    ids: Vec<String>,
}

impl Scene {
    /// `keys` keys of the slot of `k0` under the window `name`.
    async fn start(name: &str, limit: u64, keys: usize, max_batch: Option<usize>) -> Scene {
        let cluster = RedisCluster::start();
        let store = store_on(&cluster, max_batch).await;
        let policy = fixed_window(name, limit, NO_EDGE);
        let slot = cluster_slot(store.state_key(b"k0", &policy).as_bytes());
        let keys = keys_in_slot(&store, &policy, slot, keys);
        let ids = ids(&cluster);
        Scene {
            cluster,
            store,
            limit,
            policy,
            slot,
            keys,
            ids,
        }
    }

    /// 64 tasks checking the keys.
    fn load(&self) -> Load {
        Load::start(&self.store, &self.policy, &self.keys, 64)
    }

    /// No error, and each key admitted exactly its limit (see [`assert_exact`]).
    async fn assert_held(&self, tally: &Tally, resent: bool) {
        assert_exact(
            &self.store,
            &self.policy,
            &self.keys,
            self.limit,
            tally,
            resent,
        )
        .await;
        assert_no_errors(tally);
    }
}

/// Moves `slot` to the next master, its keys `pause` apart; when `kill`,
/// every client connection of every master is killed (`CLIENT KILL TYPE
/// normal`) as the move begins and again once its keys have migrated.
fn move_to_next(cluster: &RedisCluster, ids: &[String], slot: u16, pause: Duration, kill: bool) {
    let source = cluster.master_of(slot);
    let target = (source + 1) % 3;
    let kill_all = || {
        if kill {
            for node in 0..3 {
                cluster.cli(node, &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
            }
        }
    };
    kill_all();
    begin(cluster, ids, &[slot], source, target);
    migrate_all(cluster, &[slot], source, target, pause);
    kill_all();
    finish(cluster, ids, &[slot], source, target);
    wait_owner(cluster, slot, target);
}

/// One slot with 16 live keys moved round the three masters `moves` times
/// under 64 tasks.
async fn ping_pong(max_batch: Option<usize>, moves: usize, pause: Duration) {
    ping_pong_killing(max_batch, moves, pause, false).await;
}

/// [`ping_pong`], and when `kill`, every client connection of every master
/// killed (`CLIENT KILL TYPE normal`) as each move begins and again once
/// its keys have migrated: calls then go through the cluster client while
/// the store's own connections open again, in the middle of the move.
async fn ping_pong_killing(max_batch: Option<usize>, moves: usize, pause: Duration, kill: bool) {
    let scene = Scene::start("pingpong", 400, 16, max_batch).await;
    let (cluster, ids, slot) = (&scene.cluster, &scene.ids, scene.slot);
    let load = scene.load();
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..moves {
        tokio::task::block_in_place(|| move_to_next(cluster, ids, slot, pause, kill));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let tally = load
        .stop(if kill {
            "ping_pong killing"
        } else {
            "ping_pong"
        })
        .await;
    scene.assert_held(&tally, kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_moves_ping_pong_coalesced() {
    ping_pong(None, 6, Duration::from_millis(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_moves_ping_pong_killing_connections() {
    ping_pong_killing(None, 6, Duration::from_millis(2), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_moves_ping_pong_max_batch_1() {
    ping_pong(Some(1), 6, Duration::from_millis(2)).await;
}

/// The control of [`attack_moves_ping_pong_killing_connections`]: the
/// same kills under the same load, and no slot moving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_moves_killing_connections_without_moves_control() {
    let scene = Scene::start("killonly", 400, 16, None).await;
    let load = scene.load();
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..12 {
        tokio::task::block_in_place(|| {
            for node in 0..3 {
                scene
                    .cluster
                    .cli(node, &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
            }
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let tally = load.stop("killing, no moves").await;
    scene.assert_held(&tally, true).await;
}

/// Empty-ish slot moved A -> B -> C -> A with no pause between the moves
/// (only the keys the load wrote meanwhile migrate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_moves_chained_without_pause() {
    let scene = Scene::start("chained", 400, 8, None).await;
    let (cluster, slot) = (&scene.cluster, scene.slot);
    let load = scene.load();
    tokio::time::sleep(Duration::from_millis(30)).await;
    tokio::task::block_in_place(|| {
        for _ in 0..6 {
            let source = cluster.master_of(slot);
            let target = (source + 1) % 3;
            move_slots(cluster, &scene.ids, &[slot], source, target, Duration::ZERO);
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let tally = load.stop("chained").await;
    scene.assert_held(&tally, false).await;
}

/// Twelve slots of one master, each with live keys, moved to the next
/// master at once (all importing, all migrated, all given) while coalesced
/// pipelines carry calls of every slot; then back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_moves_many_slots_at_once() {
    let Scene {
        cluster,
        store,
        limit,
        policy,
        slot: first,
        mut keys,
        ids,
    } = Scene::start("many", 300, 3, None).await;
    let source = cluster.master_of(first);
    let mut slots = vec![first];
    let mut s = first;
    while slots.len() < 12 {
        s = (s + 37) % 16_384;
        if cluster.master_of(s) == source && !slots.contains(&s) {
            slots.push(s);
            keys.extend(keys_in_slot(&store, &policy, s, 3));
        }
    }
    let target = (source + 1) % 3;
    let load = Load::start(&store, &policy, &keys, 64);
    tokio::time::sleep(Duration::from_millis(50)).await;
    for (from, to) in [(source, target), (target, source)] {
        tokio::task::block_in_place(|| {
            move_slots(&cluster, &ids, &slots, from, to, Duration::from_millis(1));
            for &slot in &slots {
                wait_owner(&cluster, slot, to);
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let tally = load.stop("many slots").await;
    assert_exact(&store, &policy, &keys, limit, &tally, false).await;
    assert_no_errors(&tally);
}

/// The replica of a cluster started with one made an empty master of its
/// own (`CLUSTER RESET SOFT`, `MEET`), which the store has never met as a
/// master; then a live slot moves to it under load, and back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_moves_to_a_master_the_store_never_met() {
    to_a_fourth_master(64).await;
}

/// A live slot moved to a master just added to the cluster, under
/// `n_tasks` tasks, and back.
async fn to_a_fourth_master(n_tasks: usize) {
    let cluster = RedisCluster::start_with_replica();
    let store = store_on(&cluster, None).await;
    let limit = 400;
    let policy = fixed_window("newmaster", limit, NO_EDGE);
    // Node 3 leaves its master and joins again as an empty master.
    tokio::task::block_in_place(|| {
        assert_eq!(cluster.cli(3, &["CLUSTER", "RESET", "SOFT"]), "OK");
        let port = cluster.nodes()[0].port().to_string();
        assert_eq!(
            cluster.cli(3, &["CLUSTER", "MEET", "127.0.0.1", &port]),
            "OK"
        );
        let started = Instant::now();
        loop {
            let ok = (0..4).all(|i| {
                let nodes = cluster.cli(i, &["CLUSTER", "NODES"]);
                nodes
                    .lines()
                    .filter(|l| l.contains("master") && !l.contains("fail"))
                    .count()
                    == 4
            }) && (0..4).all(|i| {
                cluster
                    .cli(i, &["CLUSTER", "INFO"])
                    .contains("cluster_state:ok")
            });
            if ok {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "node 3 never became a master"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let slot = cluster_slot(store.state_key(b"k0", &policy).as_bytes());
    let keys = keys_in_slot(&store, &policy, slot, 8);
    let ids = ids(&cluster);
    let load = Load::start(&store, &policy, &keys, n_tasks);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let source = cluster.master_of(slot);
    tokio::task::block_in_place(|| begin(&cluster, &ids, &[slot], source, 3));
    // The slot half moved (only `ASK`, no `MOVED`) for a while.
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::task::block_in_place(|| {
        migrate_all(&cluster, &[slot], source, 3, Duration::from_millis(2));
    });
    // Every key on the target, the slot not yet given: `ASK` for each.
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::task::block_in_place(|| {
        finish(&cluster, &ids, &[slot], source, 3);
        wait_owner(&cluster, slot, 3);
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| {
        move_slots(&cluster, &ids, &[slot], 3, source, Duration::from_millis(2));
        wait_owner(&cluster, slot, source);
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let tally = load.stop("new master").await;
    assert_exact(&store, &policy, &keys, limit, &tally, false).await;
    assert_no_errors(&tally);
}

/// Concurrency permits (at most 3 per key, a lease of an hour) checked by
/// 48 tasks, a third of the checks cancelled after a random short while,
/// while their slot moves round the masters: never more than 3 held at
/// once per key, no error, and once every task is done and every
/// unclaimed permit released, each key gives all 3 permits again (none
/// left held by a release that ran before its check).
async fn concurrency_cancelled(max_batch: Option<usize>) {
    concurrency_cancelled_killing(max_batch, false).await;
}

/// [`concurrency_cancelled`]; when `kill`, every client connection of
/// every master is killed as each move begins and once its keys migrated,
/// and errors are allowed (see `attack_moves_killing_connections_without_moves_control`):
/// only the permits are checked, none left held once all is released.
async fn concurrency_cancelled_killing(max_batch: Option<usize>, kill: bool) {
    let cluster = RedisCluster::start();
    let store = store_on(&cluster, max_batch).await;
    let max = 3;
    let policy = Policy::concurrency(max, Duration::from_secs(3600))
        .unwrap()
        .with_name("conc")
        .unwrap();
    let slot = cluster_slot(store.state_key(b"k0", &policy).as_bytes());
    let keys = keys_in_slot(&store, &policy, slot, 8);
    let ids = ids(&cluster);
    let load = PermitLoad::start(&store, &policy, &keys, Duration::from_secs(90));
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..6 {
        tokio::task::block_in_place(|| {
            move_to_next(&cluster, &ids, slot, Duration::from_millis(2), kill);
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Unclaimed permits' releases run in tasks of their own (retried a
    // second, then two, apart while the store is unreachable).
    let load = load
        .stop(
            "concurrency",
            Duration::from_millis(if kill { 6000 } else { 1500 }),
        )
        .await;
    load.assert_none_held(&store, &policy, &keys, max).await;
    if !kill {
        assert_no_errors(&load.tally);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_moves_concurrency_cancelled_killing_connections() {
    concurrency_cancelled_killing(None, true).await;
}

/// The connections the store holds to each node do not grow with the
/// number of moves: 14 moves (each a `MOVED`, so each opens the cluster
/// connections again) leave as many clients on each node as 2 did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_moves_leave_no_connections_behind() {
    let Scene {
        cluster,
        store,
        policy,
        slot,
        keys,
        ids,
        ..
    } = Scene::start("conns", 1_000_000, 8, None).await;
    let load = Load::start(&store, &policy, &keys, 32);
    let clients = || -> Vec<u64> {
        (0..3)
            .map(|i| {
                let info = cluster.cli(i, &["INFO", "clients"]);
                info.lines()
                    .find_map(|l| l.trim().strip_prefix("connected_clients:"))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0)
            })
            .collect()
    };
    let mut after_two = Vec::new();
    for round in 0..14 {
        let source = cluster.master_of(slot);
        let target = (source + 1) % 3;
        tokio::task::block_in_place(|| {
            move_slots(&cluster, &ids, &[slot], source, target, Duration::ZERO);
            wait_owner(&cluster, slot, target);
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        if round == 1 {
            after_two = tokio::task::block_in_place(clients);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after_all = tokio::task::block_in_place(clients);
    let tally = load.stop("connections").await;
    eprintln!("clients per node after 2 moves {after_two:?}, after 14 {after_all:?}");
    for (two, all) in after_two.iter().zip(&after_all) {
        assert!(
            *all <= two + 4,
            "clients grew from {after_two:?} to {after_all:?}"
        );
    }
    assert_no_errors(&tally);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_moves_concurrency_cancelled_in_flight() {
    concurrency_cancelled(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_moves_concurrency_cancelled_max_batch_1() {
    concurrency_cancelled(Some(1)).await;
}

/// A live slot moves to node 0 under load, whose replica then takes over
/// while node 0 hangs: once the promotion is known everywhere, decisions
/// on the slot resume within a few seconds and stay error free (no wedge
/// on the patched slot map or the old master's connections).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_moves_then_failover_of_the_target() {
    let cluster = RedisCluster::start_with_replica();
    let store = build(
        RedisStore::cluster_builder(cluster.urls())
            .call_timeout(Duration::from_millis(300))
            .connect_timeout(Duration::from_millis(300)),
    )
    .await;
    let policy = fixed_window("failover-moved", 1_000_000, NO_EDGE);
    // A slot not on node 0.
    let slot = (0..16_384u16)
        .map(|i| {
            cluster_slot(
                store
                    .state_key(format!("u{i}").as_bytes(), &policy)
                    .as_bytes(),
            )
        })
        .find(|&s| cluster.master_of(s) == 1)
        .unwrap();
    let keys = keys_in_slot(&store, &policy, slot, 4);
    let ids = ids(&cluster);
    let load = Load::start(&store, &policy, &keys, 16);
    tokio::time::sleep(Duration::from_millis(50)).await;
    tokio::task::block_in_place(|| {
        move_slots(&cluster, &ids, &[slot], 1, 0, Duration::from_millis(1));
        wait_owner(&cluster, slot, 0);
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = load.tally.errors.load(Ordering::Relaxed);
    assert_eq!(
        before,
        0,
        "errors before the failover: {:?}",
        load.tally.first_errors.lock().unwrap()
    );
    cluster.nodes()[0].freeze();
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| {
        assert_eq!(cluster.cli(3, &["CLUSTER", "FAILOVER", "TAKEOVER"]), "OK");
        while !cluster.cli(3, &["ROLE"]).starts_with("master") {
            std::thread::sleep(Duration::from_millis(5));
        }
        let t = Instant::now();
        while !serves(&cluster, 3, slot) || !serves(&cluster, 2, slot) {
            assert!(t.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let promoted = Instant::now();
    // Give the store 3 s to find the new master, then no more errors.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let at_3s = load.tally.errors.load(Ordering::Relaxed);
    let checks_at_3s = load.tally.checks.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = load.tally.errors.load(Ordering::Relaxed) - at_3s;
    let checks_after = load.tally.checks.load(Ordering::Relaxed) - checks_at_3s;
    cluster.nodes()[0].thaw();
    let tally = load.stop("failover after move").await;
    assert!(
        checks_after > 50,
        "only {checks_after} checks in the 2 s after {:?}",
        promoted.elapsed()
    );
    assert_eq!(
        after,
        0,
        "errors 3 s after the promotion: {:?}",
        tally.first_errors.lock().unwrap()
    );
    for key in &keys {
        let decision = store.check(key.as_bytes(), &policy, 1).await;
        assert!(decision.unwrap().is_allowed(), "{key} after the failover");
    }
}

/// 64 tasks check `keys` (each peeked once first) while `kill` closes every
/// client connection of the nodes, 120 times about 5 ms apart: no call fails while every node is
/// up (a call whose connection broke goes again on a new one, even when
/// redis-rs leaves it with neither a reply nor an error), and every key
/// holds its limit.
async fn storm(store: &RedisStore, policy: &Policy, keys: &[String], kill: impl Fn()) {
    // The library loaded first: its load goes through redis-rs's cluster
    // client, which the storm is not about.
    for key in keys {
        store.check(key.as_bytes(), policy, 0).await.expect("peek");
    }
    let load = Load::start(store, policy, keys, 64);
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..120 {
        tokio::task::block_in_place(&kill);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let tally = load.stop("connection storm").await;
    assert_exact(store, policy, keys, 100_000, &tally, true).await;
    assert_no_errors(&tally);
}

pub(crate) const KILL: [&str; 6] = ["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"];

/// [`storm`] on every master of a 3-master cluster.
async fn cluster_storm(max_batch: Option<usize>) {
    let scene = Scene::start("storm", 100_000, 16, max_batch).await;
    storm(&scene.store, &scene.policy, &scene.keys, || {
        for node in 0..3 {
            scene.cluster.cli(node, &KILL);
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_storm_on_a_cluster_fails_no_call() {
    cluster_storm(Some(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_storm_on_a_coalescing_cluster_fails_no_call() {
    cluster_storm(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_storm_on_one_node_fails_no_call() {
    let server = RedisServer::start();
    let store = build(RedisStore::builder(server.url()).call_timeout(Duration::from_secs(2))).await;
    let policy = fixed_window("storm", 100_000, NO_EDGE);
    let keys: Vec<String> = (0..16).map(|k| format!("k{k}")).collect();
    storm(&store, &policy, &keys, || {
        server.cli(&KILL);
    })
    .await;
}
