//! Redis Sentinel (a module of the `resilience` binary): stores built with
//! `RedisStore::sentinel_builder` on a real master, its replica and three
//! `redis-sentinel` processes ([`RedisSentinels`]), all on loopback.
//!
//! What `build()` checks, decisions on the master the sentinels name, and
//! failovers: the master killed (`SIGKILL`) under load and under light
//! traffic. The promotion is timed from the moment a sentinel names the
//! promoted replica (`SENTINEL get-master-addr-by-name`): a client learns
//! the master from the sentinels, and a replica that says it is a master
//! (`ROLE`) before they name it may still be dropped by a failover that
//! aborts. Both moments are printed. Every test takes its turn with the
//! other fault tests (they measure latencies).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ratelimit_core::redis::RedisStore;
use ratelimit_core::{Policy, Store, StoreError};
use ratelimit_tests::sentinels::MASTER_NAME;
use ratelimit_tests::{RedisSentinels, RedisServer, named};

use ratelimit_tests::warm_up;

use super::{CALL_TIMEOUT, MARGIN, Turn, ahead_of_turn, bounded, ms, start_clients, timed, turn};

/// The promoted replica must decide within this of the sentinels naming it.
const FOLLOW_DEADLINE: Duration = Duration::from_secs(2);

/// The longest the sentinels may take to fail over a dead master.
const FAILOVER_LIMIT: Duration = Duration::from_secs(15);

/// Runs `start` on a blocking thread while the test waits for its turn,
/// so that a test parked on the turn sets up meanwhile; returns both. One
/// test at a time sets up ahead ([`ahead_of_turn`]), so at most one set
/// exists outside the turns. What `start` returns is dropped with the task
/// if the test ends first, so a set started early is killed all the same.
async fn started_in_turn<T: Send + 'static>(
    what: &str,
    start: impl FnOnce() -> T + Send + 'static,
) -> (Turn, T) {
    let ahead = ahead_of_turn().await;
    let started = tokio::task::spawn_blocking(start);
    let turn = turn().await;
    drop(ahead);
    let value = started.await.unwrap_or_else(|e| panic!("{what}: {e}"));
    (turn, value)
}

/// Starts the set on a blocking thread (it waits for the sentinels) while
/// the test waits for its turn.
async fn start_set(password: Option<&'static str>) -> (Turn, RedisSentinels) {
    started_in_turn("starting the sentinels", move || match password {
        Some(password) => RedisSentinels::start_with_password(password),
        None => RedisSentinels::start(),
    })
    .await
}

/// As [`start_set`], a set whose sentinels can fail its master over (they
/// know one another).
pub(crate) async fn start_quorum() -> (Turn, RedisSentinels) {
    started_in_turn("starting the sentinels", || {
        let set = RedisSentinels::start();
        set.wait_for_quorum();
        set
    })
    .await
}

/// Kills the set's first master (`SIGKILL`) on a blocking thread; returns
/// the set and the moment it was dead.
async fn kill_master(mut set: RedisSentinels) -> (RedisSentinels, Instant) {
    tokio::task::spawn_blocking(move || {
        set.master_mut().stop();
        let dead = Instant::now();
        (set, dead)
    })
    .await
    .expect("killing the master")
}

pub(crate) async fn sentinel_store(set: &RedisSentinels) -> RedisStore {
    RedisStore::sentinel_builder(set.addresses(), MASTER_NAME)
        .call_timeout(CALL_TIMEOUT)
        .build()
        .await
        .expect("a store behind the sentinels")
}

/// A set whose sentinels can fail its master over (see [`start_quorum`]),
/// the test's turn, a store behind the set and the counting policy `name` at
/// `limit`.
pub(crate) async fn start_counting(
    name: &str,
    limit: u64,
) -> (Turn, RedisSentinels, RedisStore, Policy) {
    let (turn, set) = start_quorum().await;
    let store = sentinel_store(&set).await;
    (turn, set, store, counting_policy(name, limit))
}

/// A fixed window far longer than any test (no window edge passes while one
/// runs, but once in millions), whose state is `f<window's end> <count>`:
/// the count is read back from a replica.
pub(crate) fn counting_policy(name: &str, limit: u64) -> Policy {
    named(
        name,
        Policy::fixed_window(limit, Duration::from_secs(30 * 24 * 3600)),
    )
}

/// The count of a fixed window's state as `GET` shows it (0 for no key).
pub(crate) fn window_count(state: &str) -> u64 {
    let state = state.trim();
    if state.is_empty() {
        return 0;
    }
    state
        .rsplit(' ')
        .next()
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("not a fixed window's state: {state:?}"))
}

/// When the failover became visible.
#[derive(Debug, Default)]
struct Promotion {
    /// The replica answered `ROLE` as a master.
    role: OnceLock<Instant>,
    /// A sentinel named the replica as the master.
    named: OnceLock<Instant>,
}

impl Promotion {
    /// When the replica became a master (when it was named, if its `ROLE`
    /// was never seen to change) and when a sentinel named it.
    fn times(&self) -> (Instant, Instant) {
        let named = *self.named.get().expect("named");
        (self.role.get().copied().unwrap_or(named), named)
    }
}

/// What light traffic sees of a failover: the master of `set` killed, then
/// one check of `policy` every `every` until `enough` of the calls are made.
/// The calls, when the master died, the promotion the sentinels report, and
/// the set.
async fn calls_across_a_failover(
    set: RedisSentinels,
    store: &RedisStore,
    policy: &Policy,
    every: Duration,
    enough: impl Fn(&[Call]) -> bool,
) -> (Vec<Call>, Instant, Arc<Promotion>, RedisSentinels) {
    bounded(async {
        let (set, t_kill) = kill_master(set).await;
        let promotion = watch_promotion(&set);
        let mut calls = Vec::new();
        while !enough(&calls) {
            tokio::time::sleep(every).await;
            calls.push(Call::check(store, policy).await);
        }
        (calls, t_kill, promotion, set)
    })
    .await
}

/// Polls the replica's `ROLE` and every sentinel's
/// `SENTINEL get-master-addr-by-name` every 10 ms until both show the
/// replica as the master, or [`FAILOVER_LIMIT`] passes.
fn watch_promotion(set: &RedisSentinels) -> Arc<Promotion> {
    let promotion = Arc::new(Promotion::default());
    let replica_port = set.replica().port();
    let sentinel_ports: Vec<u16> = set.sentinels().iter().map(RedisServer::port).collect();
    let watching = Arc::clone(&promotion);
    tokio::spawn(async move {
        let connect = |port: u16| async move {
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
            tokio::time::timeout(
                Duration::from_millis(500),
                client.get_multiplexed_async_connection(),
            )
            .await
            .ok()?
            .ok()
        };
        let mut replica = None;
        let mut sentinels: Vec<_> = sentinel_ports.iter().map(|_| None).collect();
        let start = Instant::now();
        while start.elapsed() < FAILOVER_LIMIT
            && (watching.role.get().is_none() || watching.named.get().is_none())
        {
            if replica.is_none() {
                replica = connect(replica_port).await;
            }
            if let Some(connection) = replica.as_mut() {
                let role = tokio::time::timeout(
                    Duration::from_millis(200),
                    redis::cmd("ROLE").query_async::<redis::Role>(connection),
                )
                .await;
                match role {
                    Ok(Ok(redis::Role::Primary { .. })) => {
                        let _ = watching.role.set(Instant::now());
                    }
                    Ok(Ok(_)) => {}
                    // A promoted replica closes its clients' connections.
                    _ => replica = None,
                }
            }
            for (port, slot) in sentinel_ports.iter().zip(sentinels.iter_mut()) {
                if slot.is_none() {
                    *slot = connect(*port).await;
                }
                let Some(connection) = slot.as_mut() else {
                    continue;
                };
                let named = tokio::time::timeout(
                    Duration::from_millis(200),
                    redis::cmd("SENTINEL")
                        .arg("get-master-addr-by-name")
                        .arg(MASTER_NAME)
                        .query_async::<Option<(String, u16)>>(connection),
                )
                .await;
                match named {
                    Ok(Ok(Some((_, port)))) if port == replica_port => {
                        let _ = watching.named.set(Instant::now());
                    }
                    Ok(Ok(_)) => {}
                    _ => *slot = None,
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    promotion
}

/// Waits (at most [`FAILOVER_LIMIT`]) until a sentinel names the replica.
async fn until_named(promotion: &Promotion) -> Instant {
    let start = Instant::now();
    loop {
        if let Some(named) = promotion.named.get() {
            return *named;
        }
        assert!(
            start.elapsed() < FAILOVER_LIMIT,
            "no sentinel named the replica within {FAILOVER_LIMIT:?} of the master's death"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the replica has seen its master go (`master_link_status:down`),
/// so it has applied everything the master sent, then reads the count at
/// `key`, checking (`ROLE`) that the replica was not promoted yet: the count
/// is what replication saved, before anyone wrote on the promoted replica.
fn replicated_count(set: &RedisSentinels, key: &str) -> u64 {
    let replica = set.replica();
    let auth = set.auth_args();
    let cli = |args: &[&str]| replica.cli(&[&auth[..], args].concat());
    let start = Instant::now();
    while !cli(&["INFO", "replication"])
        .lines()
        .any(|l| l.trim() == "master_link_status:down")
    {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the replica did not see its master die"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let role = |when: &str| {
        let role = cli(&["ROLE"]);
        assert!(
            role.starts_with("slave"),
            "the replica was promoted {when} its count was read: {role}"
        );
    };
    role("before");
    let count = window_count(&cli(&["GET", key]));
    role("as");
    count
}

/// One call of a load.
#[derive(Debug, Clone)]
struct Call {
    start: Instant,
    end: Instant,
    outcome: Outcome,
}

/// What one call gave (also to `attack_failover`'s calls).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Admitted,
    Denied,
    /// An outage (the failure policy's case), with its message.
    Outage(String),
    /// Any other error: never expected here.
    Error(String),
}

impl Outcome {
    fn of(result: Result<ratelimit_core::Decision, StoreError>) -> Outcome {
        Outcome::of_all(&result.map(|d| vec![d]))
    }

    /// A check of several limits: admitted when every one admits it.
    pub(crate) fn of_all(result: &Result<Vec<ratelimit_core::Decision>, StoreError>) -> Outcome {
        match result {
            Ok(d) if d.iter().all(ratelimit_core::Decision::is_allowed) => Outcome::Admitted,
            Ok(_) => Outcome::Denied,
            Err(e) if e.is_outage() => Outcome::Outage(e.to_string()),
            Err(e) => Outcome::Error(e.to_string()),
        }
    }

    pub(crate) fn decided(&self) -> bool {
        matches!(self, Outcome::Admitted | Outcome::Denied)
    }
}

impl Call {
    /// Times one check of `k` under `policy`.
    async fn check(store: &RedisStore, policy: &Policy) -> Call {
        let start = Instant::now();
        let outcome = Outcome::of(store.check(b"k", policy, 1).await);
        Call {
            start,
            end: Instant::now(),
            outcome,
        }
    }

    fn took(&self) -> Duration {
        self.end - self.start
    }
}

/// Every call an outage or a decision (never a mistake), none past the
/// call timeout (and [`MARGIN`]).
fn assert_outages_only_and_bounded(calls: &[Call]) {
    for call in calls {
        assert!(
            !matches!(call.outcome, Outcome::Error(_)),
            "a call failed as a mistake, not an outage: {call:?}"
        );
        assert!(
            call.took() <= CALL_TIMEOUT + MARGIN,
            "a call took {} (call timeout {}): {call:?}",
            ms(call.took()),
            ms(CALL_TIMEOUT)
        );
    }
}

/// The longest call of `calls`.
fn slowest(calls: &[Call]) -> Duration {
    calls.iter().map(Call::took).max().unwrap_or_default()
}

/// How many of `calls` were outages.
fn outages(calls: &[Call]) -> usize {
    calls
        .iter()
        .filter(|c| matches!(c.outcome, Outcome::Outage(_)))
        .count()
}

/// How many of `calls` were admitted.
fn admitted<'a>(calls: impl IntoIterator<Item = &'a Call>) -> u64 {
    calls
        .into_iter()
        .filter(|c| c.outcome == Outcome::Admitted)
        .count() as u64
}

/// The calls decided while a failover was under way: on the old master
/// after its replica became a master at `role`, or on the promoted replica
/// before a sentinel named it at `named`.
fn decided_during(calls: &[Call], role: Instant, named: Instant) -> Vec<&Call> {
    calls
        .iter()
        .filter(|c| c.outcome.decided() && c.end > role && c.start < named)
        .collect()
}

/// The end of the first decision among the calls started at `named` or
/// later.
fn first_decision_after(calls: &[Call], named: Instant) -> Option<Instant> {
    calls
        .iter()
        .filter(|c| c.start >= named && c.outcome.decided())
        .map(|c| c.end)
        .min()
}

/// The limit of the loads, their clients, the pause between two calls of a
/// client, how long they run before the failover, and how long on the
/// promoted replica, at least.
const LIMIT: u64 = 400;
const TASKS: usize = 4;
const PACE: Duration = Duration::from_millis(10);
const BEFORE: Duration = Duration::from_millis(600);
const AFTER: Duration = Duration::from_secs(1);

/// A set whose sentinels can fail its master over, a store behind it, the
/// counting policy `name` at [`LIMIT`] and its state key, the master
/// answering: what a load over a failover starts from.
async fn start_loaded(name: &str) -> (Turn, RedisSentinels, RedisStore, Policy, String) {
    let (turn, set, store, policy) = start_counting(name, LIMIT).await;
    let key = store.state_key(b"k", &policy);
    warm_up("the master answers", || store.ping()).await;
    (turn, set, store, policy, key)
}

/// A load of [`TASKS`] clients each checking `k` every [`PACE`], until
/// [`Load::stop`].
struct Load {
    done: Arc<AtomicBool>,
    denied: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Call>>>,
}

impl Load {
    /// Starts the load and lets it run for [`BEFORE`].
    async fn start(store: &RedisStore, policy: &Policy) -> Load {
        let done = Arc::new(AtomicBool::new(false));
        let denied = Arc::new(AtomicBool::new(false));
        let with = (store.clone(), policy.clone(), Arc::clone(&denied));
        let tasks = start_clients(TASKS, &done, &with, |(store, policy, denied)| async move {
            let start = Instant::now();
            // The outer bound only catches a hang: every call is checked
            // against the call timeout.
            let result = tokio::time::timeout(CALL_TIMEOUT * 10, store.check(b"k", &policy, 1))
                .await
                .unwrap_or(Err(StoreError::Backend("hung".into())));
            let outcome = Outcome::of(result);
            if outcome == Outcome::Denied {
                denied.store(true, Ordering::Relaxed);
            }
            let call = Call {
                start,
                end: Instant::now(),
                outcome,
            };
            tokio::time::sleep(PACE).await;
            Some(call)
        });
        tokio::time::sleep(BEFORE).await;
        Load {
            done,
            denied,
            tasks,
        }
    }

    /// Lets the load run on the promoted replica for `after` at least from
    /// `named`, and until it denies (the limit reached), within the test's
    /// bound; then stops it and returns every call.
    async fn stop(self, named: Instant, after: Duration) -> Vec<Call> {
        while named.elapsed() < after || !self.denied.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.done.store(true, Ordering::Release);
        let mut calls = Vec::new();
        for task in self.tasks {
            calls.extend(task.await.expect("a load task panicked"));
        }
        calls
    }
}

/// Runs a [`Load`] while `order` (on a blocking thread) orders a failover
/// of `set`, until a sentinel names the promoted replica and the load has
/// run [`AFTER`] on it: the calls, when `order` returned, the promotion
/// and the set.
async fn load_over_ordered_failover(
    set: RedisSentinels,
    store: &RedisStore,
    policy: &Policy,
    order: impl FnOnce(&RedisSentinels) + Send + 'static,
) -> (Vec<Call>, Instant, Arc<Promotion>, RedisSentinels) {
    bounded(async {
        let load = Load::start(store, policy).await;
        let (set, t_failover) = tokio::task::spawn_blocking(move || {
            order(&set);
            (set, Instant::now())
        })
        .await
        .expect("ordering the failover");
        let promotion = watch_promotion(&set);
        let named = until_named(&promotion).await;
        let calls = load.stop(named, AFTER).await;
        (calls, t_failover, promotion, set)
    })
    .await
}

/// `build()` fails as a mistake (never an outage a failure policy would
/// let through) whose message names `needle`; returns the error.
async fn assert_refused(
    build: impl Future<Output = Result<RedisStore, StoreError>>,
    what: &str,
    needle: &str,
) -> StoreError {
    let refused = build.await.expect_err(what);
    assert!(
        !refused.is_outage() && refused.to_string().contains(needle),
        "{what}: {refused}"
    );
    refused
}

/// `limit` checks of `k` admitted, then one denied.
async fn assert_admits_then_denies(store: &RedisStore, policy: &Policy, limit: u64) {
    for i in 0..limit {
        let d = store.check(b"k", policy, 1).await.unwrap();
        assert!(d.is_allowed(), "call {i} of {limit}: {d:?}");
    }
    let d = store.check(b"k", policy, 1).await.unwrap();
    assert!(!d.is_allowed(), "past {limit}: {d:?}");
}

/// What `build()` checks: the sentinels answer and name a master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_asks_the_sentinels_for_the_master() {
    let (_turn, set) = start_set(None).await;
    bounded(async {
        let store = sentinel_store(&set).await;
        assert_eq!(
            store.sentinel_master(),
            Some(format!("127.0.0.1:{}", set.master().port()))
        );
        assert!(format!("{store:?}").contains("sentinel"), "{store:?}");

        for (what, builder, needle) in [
            (
                "a name no sentinel monitors",
                RedisStore::sentinel_builder(set.addresses(), "no-such-master"),
                "no-such-master",
            ),
            // The master's own address instead of a sentinel's.
            (
                "a Redis node is no sentinel",
                RedisStore::sentinel_builder(
                    [format!("127.0.0.1:{}", set.master().port())],
                    MASTER_NAME,
                ),
                "no sentinel answers",
            ),
            (
                "no sentinel given",
                RedisStore::sentinel_builder(Vec::<String>::new(), MASTER_NAME),
                "at least one sentinel",
            ),
            (
                "not an address",
                RedisStore::sentinel_builder(["http://127.0.0.1:1"], MASTER_NAME),
                "not an address",
            ),
            // The master's options are for a store behind sentinels only.
            (
                "master_db on a single node",
                RedisStore::builder(set.master().url()).master_db(1),
                "sentinel_builder",
            ),
        ] {
            assert_refused(builder.build(), what, needle).await;
        }

        // Nothing listens there.
        let closed = ratelimit_tests::free_port();
        let nobody = RedisStore::sentinel_builder([format!("127.0.0.1:{closed}")], MASTER_NAME)
            .build()
            .await
            .expect_err("no sentinel at all");
        assert!(
            nobody.to_string().contains("no sentinel answers"),
            "{nobody}"
        );

        // One sentinel down of three: the others answer.
        let mut addresses = set.addresses();
        addresses.insert(0, format!("127.0.0.1:{closed}"));
        let store = RedisStore::sentinel_builder(addresses, MASTER_NAME)
            .build()
            .await
            .expect("two sentinels of three answer");
        let policy = counting_policy("one-sentinel-down", 5);
        assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());
    })
    .await;
}

/// The master's credentials and database come from the builder; wrong or
/// missing credentials fail `build()`, never a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_masters_credentials_and_database_come_from_the_builder() {
    const PASSWORD: &str = "sentinel-secret";
    let (_turn, set) = start_set(Some(PASSWORD)).await;
    bounded(async {
        let store = RedisStore::sentinel_builder(set.addresses(), MASTER_NAME)
            .master_credentials("default", PASSWORD)
            .master_db(3)
            .call_timeout(CALL_TIMEOUT)
            .build()
            .await
            .expect("the right password");
        let policy = counting_policy("credentials", 5);
        for _ in 0..2 {
            assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());
        }
        let key = store.state_key(b"k", &policy);
        let auth = set.auth_args();
        let in_db = |db: &str| {
            let args = [&auth[..], &["-n", db, "GET", key.as_str()]].concat();
            window_count(&set.master().cli(&args))
        };
        assert_eq!(
            (in_db("3"), in_db("0")),
            (2, 0),
            "the state is in database 3"
        );

        for (what, builder) in [
            (
                "a wrong password",
                RedisStore::sentinel_builder(set.addresses(), MASTER_NAME)
                    .master_credentials("default", "wrong"),
            ),
            (
                "no credentials",
                RedisStore::sentinel_builder(set.addresses(), MASTER_NAME),
            ),
        ] {
            let refused = assert_refused(builder.build(), what, "credentials").await;
            assert!(!refused.to_string().contains("wrong"), "{what}: {refused}");
        }
    })
    .await;
}

/// The master killed (`SIGKILL`) under load: calls fail as outages (never
/// past the call timeout) until the sentinels name the promoted replica,
/// then the store decides there within [`FOLLOW_DEADLINE`], from the state
/// replication saved.
///
/// What a failover can lose: Redis replicates asynchronously, so the
/// admissions the old master acknowledged but had not yet sent to the
/// replica die with it. The test reads the count the replica holds once the
/// master is dead (before its promotion) and checks that the promoted
/// replica admits at most `limit - that count`: the admissions over the
/// limit, across both masters, are at most those the replica never saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_store_follows_a_failover_under_load() {
    let (_turn, set, store, policy, key) = start_loaded("failover-load").await;

    let (calls, t_kill, promotion, replicated) = bounded(async {
        let load = Load::start(&store, &policy).await;
        let (set, t_kill) = kill_master(set).await;
        let promotion = watch_promotion(&set);
        let (set, replicated) = tokio::task::spawn_blocking({
            let key = key.clone();
            move || {
                let count = replicated_count(&set, &key);
                (set, count)
            }
        })
        .await
        .expect("reading the replica");
        let named = until_named(&promotion).await;
        let calls = load.stop(named, AFTER).await;
        drop(set);
        (calls, t_kill, promotion, replicated)
    })
    .await;

    let (role, named) = promotion.times();
    let since = |t: Instant| t.saturating_duration_since(t_kill);
    let (slowest, outages) = (slowest(&calls), outages(&calls));
    // Nothing decides while no node is the master: a reply the old master
    // sent before it died may still be read a moment later, and the
    // promoted replica decides nothing before it is one.
    let in_the_gap: Vec<&Call> = calls
        .iter()
        .filter(|c| c.outcome.decided() && c.end > t_kill + CALL_TIMEOUT && c.end < role)
        .collect();
    let old: Vec<&Call> = calls
        .iter()
        .filter(|c| c.end <= t_kill + CALL_TIMEOUT)
        .collect();
    let new: Vec<&Call> = calls.iter().filter(|c| c.end >= role).collect();
    let (admitted_old, admitted_new) =
        (admitted(old.iter().copied()), admitted(new.iter().copied()));
    let denied_new = new.iter().filter(|c| c.outcome == Outcome::Denied).count();
    let first_new = new
        .iter()
        .filter(|c| c.outcome.decided())
        .map(|c| c.end)
        .min();
    let lost = admitted_old.saturating_sub(replicated);
    println!(
        "[resilience] sentinel failover under load ({TASKS} tasks, limit {LIMIT}): {} calls, \
         {outages} outages, slowest {}; old master admitted {admitted_old}, the replica held \
         {replicated} (lost with the old master: {lost}); killed at 0, replica a master at {}, \
         named by a sentinel at {}, first decision on it at {} ({} after it was named); \
         promoted replica admitted {admitted_new} (≤ {LIMIT} - {replicated}) and denied {denied_new}",
        calls.len(),
        ms(slowest),
        ms(since(role)),
        ms(since(named)),
        first_new.map_or_else(|| String::from("never"), |t| ms(since(t))),
        first_new.map_or_else(
            || String::from("-"),
            |t| ms(t.saturating_duration_since(named))
        ),
    );
    assert_outages_only_and_bounded(&calls);
    assert!(outages > 0, "the failover went unnoticed");
    assert!(
        in_the_gap.is_empty(),
        "decided with no master: {in_the_gap:?}"
    );
    let first_new = first_new.expect("the store never decided on the promoted replica");
    assert!(
        first_new <= named + FOLLOW_DEADLINE,
        "the first decision on the promoted replica came {} after a sentinel named it",
        ms(first_new.saturating_duration_since(named))
    );
    assert!(admitted_old > 0, "nothing admitted before the kill");
    assert!(
        admitted_new <= LIMIT - replicated.min(LIMIT),
        "the promoted replica admitted {admitted_new} over the {replicated} it held of {LIMIT}"
    );
    assert!(
        admitted_old + admitted_new <= LIMIT + lost,
        "admitted {} in all, over the limit {LIMIT} plus the {lost} replication lost",
        admitted_old + admitted_new
    );
    assert!(
        denied_new > 0,
        "the load never reached the limit on the promoted replica"
    );
}

/// Light traffic, one call every 1.5 s: the first call after the sentinels
/// name the promoted replica decides there (no call after it fails first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn light_traffic_resumes_within_two_seconds_of_the_promotion() {
    const EVERY: Duration = Duration::from_millis(1_500);
    const CALLS: usize = 12;
    let (_turn, set, store, policy) = start_counting("failover-light", 100).await;
    assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());

    // Until a call decides, or CALLS have not.
    let enough =
        |calls: &[Call]| calls.len() == CALLS || calls.last().is_some_and(|c| c.outcome.decided());
    let (calls, t_kill, promotion, set) =
        calls_across_a_failover(set, &store, &policy, EVERY, enough).await;
    let named = *promotion
        .named
        .get()
        .expect("no sentinel named the promoted replica");
    let since = |t: Instant| ms(t.saturating_duration_since(t_kill));
    let timeline: Vec<String> = calls
        .iter()
        .map(|c| format!("{} {:?} ({})", since(c.start), c.outcome, ms(c.took())))
        .collect();
    println!(
        "[resilience] sentinel failover, a call every {}: killed at 0, replica a master at {}, \
         named at {}; calls: {timeline:?}; now on {:?}",
        ms(EVERY),
        promotion
            .role
            .get()
            .map_or_else(|| "-".into(), |t| since(*t)),
        since(named),
        store.sentinel_master(),
    );
    assert_outages_only_and_bounded(&calls);
    // The test sees the new master by asking one sentinel; the store hears
    // it from the sentinels' `+switch-master` events, which may land a
    // moment later: a call in that moment is an outage, and the next one
    // must decide, within the deadline.
    let first_after =
        first_decision_after(&calls, named).expect("no call decided after the promotion");
    assert!(
        first_after <= named + FOLLOW_DEADLINE,
        "decided {} after the promotion",
        ms(first_after.saturating_duration_since(named))
    );
    assert_eq!(
        store.sentinel_master(),
        Some(format!("127.0.0.1:{}", set.replica().port()))
    );
}

/// A failover ordered with `SENTINEL FAILOVER` (maintenance) under load:
/// the old master stays up, and the sentinels demote it only seconds after
/// its replica's promotion. Whatever it admits after the promotion is lost
/// (it then copies the promoted replica's data), so a store that kept
/// deciding on it would admit those requests again. The store stops
/// deciding as soon as a sentinel reports the failover, and decides on the
/// promoted replica once one names it.
///
/// What the failover lost is what the load saw admitted less what the
/// promoted replica holds at the end: nothing, when nothing is decided
/// between the promotion and the sentinels naming the promoted replica
/// (the old master's writes before it reached the replica long before).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ordered_failover_loses_no_admission() {
    let (_turn, set, store, policy, key) = start_loaded("failover-ordered").await;

    let (calls, t_failover, promotion, set) =
        load_over_ordered_failover(set, &store, &policy, |set| {
            let ordered = set.sentinels()[0].cli(&["SENTINEL", "FAILOVER", MASTER_NAME]);
            assert_eq!(ordered, "OK", "SENTINEL FAILOVER");
        })
        .await;

    let held = {
        let replica = set.replica();
        window_count(&replica.cli(&["GET", key.as_str()]))
    };
    let old_master_role = set.master().cli(&["ROLE"]);
    let (role, named) = promotion.times();
    let since = |t: Instant| ms(t.saturating_duration_since(t_failover));
    let admitted = admitted(&calls);
    let lost = admitted.saturating_sub(held);
    let (slowest, outages) = (slowest(&calls), outages(&calls));
    let first_after = first_decision_after(&calls, named);
    let during = decided_during(&calls, role, named);
    println!(
        "[resilience] ordered sentinel failover under load ({TASKS} tasks, limit {LIMIT}): {} \
         calls, {outages} outages, slowest {}; failover ordered at 0, replica a master at {}, \
         named at {}, first decision after it at {}; admitted {admitted}, the promoted replica \
         holds {held} (lost: {lost}); the old master now: {}",
        calls.len(),
        ms(slowest),
        since(role),
        since(named),
        first_after.map_or_else(|| String::from("never"), since),
        old_master_role.lines().next().unwrap_or_default(),
    );
    assert_outages_only_and_bounded(&calls);
    let first_after = first_after.expect("the store never decided on the promoted replica");
    assert!(
        first_after <= named + FOLLOW_DEADLINE,
        "the first decision after the promotion came {} after a sentinel named the replica",
        ms(first_after.saturating_duration_since(named))
    );
    assert!(during.is_empty(), "decided during the failover: {during:?}");
    assert_eq!(
        lost, 0,
        "admissions lost with the old master (admitted {admitted}, the promoted replica holds \
         {held})"
    );
    assert!(
        held <= LIMIT,
        "the promoted replica holds {held} of {LIMIT}"
    );
    assert_eq!(
        store.sentinel_master(),
        Some(format!("127.0.0.1:{}", set.replica().port())),
        "the store decides on the promoted replica"
    );
    assert!(outages > 0, "the failover went unnoticed");
}

/// The number of pub/sub clients of `sentinel` (the store subscribes to
/// each sentinel's failover events).
fn subscribers(sentinel: &RedisServer) -> usize {
    sentinel
        .cli(&["CLIENT", "LIST", "TYPE", "pubsub"])
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

/// The sentinels all down while the master is fine: the store keeps
/// deciding on the master it knows (it asks the sentinels only after an
/// error). Once the store is dropped, its subscriptions to the sentinels'
/// events end with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_needs_the_sentinels_only_to_find_the_master() {
    let (_turn, set) = start_set(None).await;
    let set = bounded(async move {
        let store = sentinel_store(&set).await;
        let policy = counting_policy("sentinels-down", 5);
        assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());
        // Every sentinel has the store's subscription (and one of its own
        // to the master is not a client of the sentinel).
        let start = Instant::now();
        while set.sentinels().iter().any(|s| subscribers(s) == 0) {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the store did not subscribe to every sentinel"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let with_store: Vec<usize> = set.sentinels().iter().map(subscribers).collect();
        drop(store);
        let start = Instant::now();
        loop {
            let now: Vec<usize> = set.sentinels().iter().map(subscribers).collect();
            if now.iter().zip(&with_store).all(|(n, w)| n < w) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the store's subscriptions outlived it: {with_store:?} then {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        let store = sentinel_store(&set).await;
        assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());
        let set = tokio::task::spawn_blocking(move || {
            let mut set = set;
            for i in 0..3 {
                set.sentinel_mut(i).stop();
            }
            set
        })
        .await
        .expect("stopping the sentinels");
        for expected in [2, 1, 0] {
            let d = store.check(b"k", &policy, 1).await.unwrap();
            assert!(d.is_allowed(), "{d:?}");
            assert_eq!(d.remaining(), expected);
        }
        assert!(!store.check(b"k", &policy, 1).await.unwrap().is_allowed());
        set
    })
    .await;
    drop(set);
}

/// A master demoted by hand under the store (`REPLICAOF`, the sentinels not
/// told): its writes fail with `READONLY`, the store asks the sentinels,
/// who still name it but find it no master (`ROLE`): every call is an
/// outage for the failure policy, never a decision on the demoted node,
/// nor a mistake. Once it is a master again, the store decides on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_demoted_under_the_store_is_never_decided_on() {
    let (_turn, set) = start_set(None).await;
    bounded(async {
        let store = sentinel_store(&set).await;
        let policy = counting_policy("demoted", 100);
        assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());
        // Replication is asynchronous: the admission reaches the replica
        // before the roles swap, or the count read from it below races.
        set.master().wait_replicated(set.replica());
        let replica_port = set.replica().port().to_string();
        assert_eq!(set.replica().cli(&["REPLICAOF", "NO", "ONE"]), "OK");
        assert_eq!(
            set.master().cli(&["REPLICAOF", "127.0.0.1", &replica_port]),
            "OK"
        );
        for _ in 0..5 {
            let (took, result) = timed(store.check(b"k", &policy, 1)).await;
            let e = result.expect_err("decided on a demoted master");
            assert!(e.is_outage(), "{e}");
            assert!(took <= CALL_TIMEOUT + MARGIN, "{e} after {}", ms(took));
        }
        // Nothing more was counted on either node: the one admission made
        // before the demotion at most (the sentinels may resynchronise the
        // swapped nodes meanwhile, which can drop even that one).
        let key = store.state_key(b"k", &policy);
        for node in [set.replica(), set.master()] {
            let count = window_count(&node.cli(&["GET", key.as_str()]));
            assert!(count <= 1, "{count} admissions counted, one made");
        }
        // Roles back as the sentinels know them.
        assert_eq!(set.master().cli(&["REPLICAOF", "NO", "ONE"]), "OK");
        let master_port = set.master().port().to_string();
        assert_eq!(
            set.replica().cli(&["REPLICAOF", "127.0.0.1", &master_port]),
            "OK"
        );
        let start = Instant::now();
        loop {
            match store.check(b"k", &policy, 1).await {
                Ok(d) => {
                    assert!(d.is_allowed(), "{d:?}");
                    break;
                }
                Err(e) => assert!(e.is_outage(), "{e}"),
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the store did not decide on the master again"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    drop(set);
}

/// The first sentinel of the list hangs (a proxy that accepts connections
/// and forwards nothing). One redis-rs client of every sentinel asks them in
/// the order given, and waits for one that hangs (its connection and
/// response timeouts, 1.5 s) before it asks the next: longer than a lookup
/// may take, so every lookup failed, and the store never decided again
/// after the failover. The store asks every sentinel at once (a client
/// each), so it builds, and decides on the promoted replica soon after the
/// others name it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_sentinel_slows_each_lookup_but_the_store_follows() {
    use ratelimit_tests::fault_proxy::{FaultProxy, Mode};
    const EVERY: Duration = Duration::from_millis(100);
    let (_turn, set) = start_quorum().await;
    let hung = FaultProxy::start(set.sentinels()[0].addr());
    hung.set_mode(Mode::Stall);
    let mut addresses = vec![hung.addr().to_string()];
    addresses.extend(set.addresses());
    let (built_in, store) = timed(
        RedisStore::sentinel_builder(addresses, MASTER_NAME)
            .call_timeout(CALL_TIMEOUT)
            .build(),
    )
    .await;
    let store = store.expect("two sentinels answer, after the hung one");
    let policy = counting_policy("hung-sentinel", 1_000);
    assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());

    // Until half a second after the first call that decided.
    let enough = |calls: &[Call]| {
        calls
            .iter()
            .find(|c| c.outcome.decided())
            .is_some_and(|c| c.end.elapsed() >= Duration::from_millis(500))
    };
    let (calls, t_kill, promotion, set) =
        calls_across_a_failover(set, &store, &policy, EVERY, enough).await;
    let named = *promotion.named.get().expect("named");
    let first = calls
        .iter()
        .find(|c| c.outcome.decided())
        .expect("decided after the failover");
    println!(
        "[resilience] sentinel failover, the first sentinel hung: built in {}; killed at 0, \
         named at {}, first decision at {} ({} after it was named), {} calls",
        ms(built_in),
        ms(named.saturating_duration_since(t_kill)),
        ms(first.end.saturating_duration_since(t_kill)),
        ms(first.end.saturating_duration_since(named)),
        calls.len()
    );
    assert_outages_only_and_bounded(&calls);
    assert!(
        first.end <= named + FOLLOW_DEADLINE,
        "decided {} after the promotion",
        ms(first.end.saturating_duration_since(named))
    );
    drop(set);
}

/// The least-privileged ACL user of SECURITY.md decides behind Sentinel:
/// redis-rs checks the named master with `ROLE`, which that list lacks, and
/// then with `INFO replication`, which it has. Without `+info` either, the
/// master cannot be checked: `build()` refuses the user, naming what it
/// needs (a mistake, never an outage).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_user_decides_behind_sentinel() {
    const DOCUMENTED: &str = "on >limiter-secret ~ratelimit:* resetchannels -@all +fcall \
         +function|load +evalsha +eval +time +get +set +pexpire +pttl +del +zrange +ping +info";
    let (_turn, set) = start_set(None).await;
    bounded(async {
        let set_user = |rules: &[&str]| {
            for node in [set.master(), set.replica()] {
                node.cli(&["ACL", "DELUSER", "limiter"]);
                let args = [&["ACL", "SETUSER", "limiter"][..], rules].concat();
                assert_eq!(node.cli(&args), "OK");
            }
        };
        let builder = || {
            RedisStore::sentinel_builder(set.addresses(), MASTER_NAME)
                .master_credentials("limiter", "limiter-secret")
                .call_timeout(CALL_TIMEOUT)
        };
        let documented: Vec<&str> = DOCUMENTED.split_whitespace().collect();
        set_user(&documented);
        let store = builder().build().await.expect("the documented user");
        assert_admits_then_denies(&store, &counting_policy("acl", 3), 3).await;

        let without_info: Vec<&str> = documented
            .iter()
            .copied()
            .filter(|r| *r != "+info")
            .collect();
        set_user(&without_info);
        assert_refused(
            builder().build(),
            "neither ROLE nor INFO allowed",
            "+role or +info",
        )
        .await;
    })
    .await;
}

/// A master and replica that speak TLS only, behind plain sentinels:
/// `master_tls()` with the CA of `tls_root_cert` decides; with the system's
/// roots, which do not know that CA, `build()` refuses the certificate as a
/// mistake (never an outage a failure policy would let through).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_master_behind_sentinel() {
    let (_turn, (set, certs)) = started_in_turn("starting the TLS set", || {
        let certs = ratelimit_tests::Certificates::make();
        (RedisSentinels::start_tls(&certs), certs)
    })
    .await;
    bounded(async {
        let store = RedisStore::sentinel_builder(set.addresses(), MASTER_NAME)
            .master_tls()
            .tls_root_cert(certs.ca_pem())
            // A TLS handshake in a debug build may take longer than the
            // fault tests' short call timeout.
            .call_timeout(ratelimit_tests::CALL_TIMEOUT)
            .build()
            .await
            .expect("the master over TLS");
        assert_admits_then_denies(&store, &counting_policy("tls", 2), 2).await;

        assert_refused(
            RedisStore::sentinel_builder(set.addresses(), MASTER_NAME)
                .master_tls()
                .build(),
            "a certificate the system's roots do not know",
            "certificate",
        )
        .await;
    })
    .await;
    drop(set);
}

/// A failover ordered (`SENTINEL FAILOVER`) of the same sentinel just after
/// it aborted one (`-failover-abort-slave-timeout`: the replica refused
/// `REPLICAOF NO ONE`) is a real one: a sentinel ordered to fail over
/// starts at once, whatever its last start. The store stops deciding on the
/// old master while it is under way, and loses no admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_ordered_just_after_an_abort_loses_no_admission() {
    let (_turn, set, store, policy, key) = start_loaded("failover-after-abort").await;

    let (calls, t_failover, promotion, set) =
        load_over_ordered_failover(set, &store, &policy, |set| {
            let replica = set.replica();
            let refuse = replica.cli(&["ACL", "SETUSER", "default", "-replicaof", "-slaveof"]);
            assert_eq!(refuse, "OK", "ACL SETUSER");
            let sentinel = &set.sentinels()[0];
            let in_progress = || {
                sentinel
                    .cli(&["SENTINEL", "MASTER", MASTER_NAME])
                    .contains("failover_in_progress")
            };
            let ordered = sentinel.cli(&["SENTINEL", "FAILOVER", MASTER_NAME]);
            assert_eq!(ordered, "OK", "the first SENTINEL FAILOVER");
            let start = Instant::now();
            while in_progress() {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "the first failover did not abort"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            assert!(
                sentinel.log().contains("-failover-abort-slave-timeout"),
                "the first failover ended otherwise:\n{}",
                sentinel.log()
            );
            let allow = replica.cli(&["ACL", "SETUSER", "default", "+replicaof", "+slaveof"]);
            assert_eq!(allow, "OK", "ACL SETUSER");
            let ordered = sentinel.cli(&["SENTINEL", "FAILOVER", MASTER_NAME]);
            assert_eq!(ordered, "OK", "the second SENTINEL FAILOVER");
        })
        .await;

    let held = window_count(&set.replica().cli(&["GET", key.as_str()]));
    let (role, named) = promotion.times();
    let since = |t: Instant| ms(t.saturating_duration_since(t_failover));
    let admitted = admitted(&calls);
    let during = decided_during(&calls, role, named);
    println!(
        "[resilience] failover ordered after an abort: {} calls, {} outages; second failover \
         ordered at 0, replica a master at {}, named at {}; admitted {admitted}, the promoted \
         replica holds {held}; {} decided during the failover",
        calls.len(),
        outages(&calls),
        since(role),
        since(named),
        during.len(),
    );
    assert_outages_only_and_bounded(&calls);
    assert!(
        during.is_empty(),
        "decided during the failover: {:?}",
        &during[..during.len().min(3)]
    );
    assert_eq!(
        admitted.saturating_sub(held),
        0,
        "admissions lost with the old master (admitted {admitted}, the promoted replica holds \
         {held})"
    );
}

/// Two failovers in a row, ordered (`SENTINEL FAILOVER`) of two sentinels:
/// from the first master to its replica, then back once the first master
/// replicates the promoted one. The second switch names the node the first
/// failed over from: the store decides on it again within
/// [`FOLLOW_DEADLINE`] of a sentinel naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_follows_a_failover_back() {
    let (_turn, set, store, policy) = start_counting("failover-back", 1_000_000).await;
    warm_up("the master answers", || store.ping()).await;
    let (first, second) = (set.master().port(), set.replica().port());
    // A sentinel turns the first master, still up after the first switch,
    // into a replica of the promoted one only once that node has reported
    // the master role for four publish periods, seen at its next INFO: 8 s,
    // and INFO every 10 s, by default. Shorter periods make it seconds.
    for sentinel in set.sentinels() {
        let periods = ["info-period", "1000", "publish-period", "500"];
        let set_periods = sentinel.cli(&[&["SENTINEL", "DEBUG"][..], &periods].concat());
        assert_eq!(set_periods, "OK", "SENTINEL DEBUG {periods:?}");
    }

    bounded(async {
        let order = |set: RedisSentinels, sentinel: usize, from: u16, to: u16| {
            tokio::task::spawn_blocking(move || {
                // The node failed over to replicates the one failed over
                // from, and a sentinel knows it (a good replica).
                let start = Instant::now();
                loop {
                    let node = [set.master(), set.replica()]
                        .into_iter()
                        .find(|n| n.port() == to)
                        .expect("a node of the set");
                    let info = node.cli(&["INFO", "replication"]);
                    let synced = info.lines().any(|l| l.trim() == "master_link_status:up")
                        && info
                            .lines()
                            .any(|l| l.trim() == format!("master_port:{from}"));
                    if synced {
                        let ordered =
                            set.sentinels()[sentinel].cli(&["SENTINEL", "FAILOVER", MASTER_NAME]);
                        if ordered == "OK" {
                            break;
                        }
                    }
                    assert!(
                        start.elapsed() < Duration::from_secs(30),
                        "{to} never became a replica of {from} that a sentinel fails over to"
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
                set
            })
        };
        let named_port = |set: RedisSentinels, port: u16| {
            tokio::task::spawn_blocking(move || {
                let start = Instant::now();
                while set.named_master_port() != Some(port) {
                    assert!(start.elapsed() < FAILOVER_LIMIT, "{port} never named");
                    std::thread::sleep(Duration::from_millis(10));
                }
                (set, Instant::now())
            })
        };
        let set = order(set, 0, first, second).await.expect("first failover");
        let (set, _) = named_port(set, second).await.expect("named");
        let set = order(set, 1, second, first).await.expect("second failover");
        let (set, named) = named_port(set, first).await.expect("named back");
        loop {
            let decided = store.check(b"k", &policy, 1).await;
            let master = store.sentinel_master();
            if decided.is_ok() && master == Some(format!("127.0.0.1:{first}")) {
                break;
            }
            assert!(
                named.elapsed() <= FOLLOW_DEADLINE,
                "not following the first master back {} after it was named: {decided:?} on \
                 {master:?}",
                ms(named.elapsed())
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!(
            "[resilience] failed over back: decided on the first master {} after it was named",
            ms(named.elapsed())
        );
        drop(set);
    })
    .await;
}

/// A failover that aborts (`-failover-abort-slave-timeout`) although its
/// replica does become a master after it: the replica, paused
/// (`CLIENT PAUSE`), runs the sentinel's `REPLICAOF NO ONE` only after the
/// failover timeout. The sentinels still name the first master (and turn
/// the replica back): the store keeps deciding on it, and every admission
/// is counted there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_promoted_after_its_failover_aborted_is_not_decided_on() {
    let (_turn, set, store, policy, key) = start_loaded("failover-late-promotion").await;

    let (calls, set) = bounded(async {
        let load = Load::start(&store, &policy).await;
        let set = tokio::task::spawn_blocking(move || {
            let sentinel = &set.sentinels()[0];
            let ordered = sentinel.cli(&["SENTINEL", "FAILOVER", MASTER_NAME]);
            assert_eq!(ordered, "OK", "SENTINEL FAILOVER");
            let paused = set.replica().cli(&["CLIENT", "PAUSE", "3500", "ALL"]);
            assert_eq!(paused, "OK", "CLIENT PAUSE");
            let start = Instant::now();
            while !sentinel.log().contains("-failover-abort-slave-timeout") {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "the failover did not abort:\n{}",
                    sentinel.log()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            // The paused replica runs REPLICAOF NO ONE (and closes its
            // clients' connections).
            let start = Instant::now();
            while !String::from_utf8_lossy(&set.replica().cli_output(&["ROLE"]).stdout)
                .starts_with("master")
            {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "the replica was never promoted"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            set
        })
        .await
        .expect("ordering the failover");
        let promoted = Instant::now();
        let calls = load.stop(promoted, Duration::from_secs(2)).await;
        (calls, set)
    })
    .await;

    let held = window_count(&set.master().cli(&["GET", key.as_str()]));
    let admitted = admitted(&calls);
    println!(
        "[resilience] failover aborted, replica promoted after it: {} calls, {} outages; \
         admitted {admitted}, the first master holds {held}; the store on {:?}",
        calls.len(),
        outages(&calls),
        store.sentinel_master(),
    );
    assert_outages_only_and_bounded(&calls);
    assert_eq!(
        store.sentinel_master(),
        Some(format!("127.0.0.1:{}", set.master().port())),
        "the store follows the master the sentinels name"
    );
    assert_eq!(admitted, held, "admissions not counted on the master");
}
