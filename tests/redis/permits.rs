//! Permits, duplicate checks and denials that must stay denials, on
//! `MemoryStore`, `FallbackStore` and `RedisStore` (real Redis servers and a
//! real Redis Cluster started by `tests/support`):
//!
//! - a `FallbackStore` releases a permit to the store that issued it,
//!   whatever ids the primary chooses;
//! - two checks of one key under one policy in a `check_all` are summed, the
//!   same way on every store, single node and cluster;
//! - a concurrency permit the caller never received (a reply that timed out,
//!   a dropped call) is released by `RedisStore`, not held for its lease;
//! - on a cluster, a denial across slots stays a denial when the peeks of the
//!   other limits fail.

use std::collections::HashMap;
use std::future::{Ready, ready};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ratelimit_core::clock::ManualClock;
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{
    Check, CircuitBreaker, Decision, FallbackStore, MemoryStore, PermitId, Policy, Store,
    StoreError,
};
use ratelimit_tests::fault_proxy::FaultProxy;
use ratelimit_tests::fixtures::fixed_window;
use ratelimit_tests::{
    NO_EDGE, NOW_MICROS, RedisCluster, RedisServer, admits, build, cluster_store, long_policies,
    named, observable, permits_left, small_store, take_permit, twin_stores, twins_at,
};

const HIGH_BIT: u128 = 1 << 127;

/// A primary whose permit ids have bit 127 set, as any `Store` may choose
/// (and as `MemoryStore` and `RedisStore` do in about half of process
/// starts); it can also be switched into an outage.
#[derive(Clone)]
struct HighBitPermits {
    store: MemoryStore<ManualClock>,
    down: Arc<AtomicBool>,
    /// The ids it gave out, each for its inner store's id.
    ids: Arc<Mutex<HashMap<u128, PermitId>>>,
}

impl HighBitPermits {
    fn new() -> Self {
        HighBitPermits {
            store: MemoryStore::builder().clock(ManualClock::new(0)).build(),
            down: Arc::new(AtomicBool::new(false)),
            ids: Arc::default(),
        }
    }

    /// A `FallbackStore` on this primary and a local `MemoryStore`, one
    /// instance, with a breaker of its own.
    fn behind_fallback(&self) -> FallbackStore<HighBitPermits, MemoryStore> {
        let breaker = Arc::new(CircuitBreaker::default());
        FallbackStore::new(self.clone(), MemoryStore::new(), 1, breaker)
    }

    /// What remains of `policy` for `k` in this primary (a peek).
    fn remaining(&self, policy: &Policy) -> u64 {
        let peek = self.store.check_now(b"k", policy, 0);
        peek.expect("the primary decides").remaining()
    }

    /// What `answer` returns, or an outage while switched off.
    fn answer<T>(
        &self,
        answer: impl FnOnce() -> Result<T, StoreError>,
    ) -> Ready<Result<T, StoreError>> {
        if self.down.load(Ordering::SeqCst) {
            return ready(Err(StoreError::Unavailable(
                "switched off by the test".into(),
            )));
        }
        ready(answer())
    }

    /// The decision with its permit renamed to an id with bit 127 set.
    fn high(&self, d: Decision) -> Decision {
        match d.permit() {
            Some(p) => {
                let mut ids = self.ids.lock().unwrap();
                let id = HIGH_BIT | (ids.len() as u128 + 1);
                ids.insert(id, p);
                d.with_permit(PermitId(id))
            }
            None => d,
        }
    }
}

impl Store for HighBitPermits {
    type CheckFuture = Ready<Result<Decision, StoreError>>;
    type CheckAllFuture = Ready<Result<Vec<Decision>, StoreError>>;
    type ReleaseFuture = Ready<Result<(), StoreError>>;
    type RenewFuture = Ready<Result<bool, StoreError>>;

    fn check(&self, key: &[u8], policy: &Policy, cost: u64) -> Self::CheckFuture {
        self.answer(|| {
            let decision = self.store.check_now(key, policy, cost)?;
            Ok(self.high(decision))
        })
    }

    fn check_all(&self, checks: &[Check<'_>]) -> Self::CheckAllFuture {
        self.answer(|| {
            let decisions = self.store.check_all_now(checks)?;
            Ok(decisions.into_iter().map(|d| self.high(d)).collect())
        })
    }

    fn release(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::ReleaseFuture {
        self.answer(|| {
            let inner = self.ids.lock().unwrap().remove(&permit.0);
            let inner =
                inner.unwrap_or_else(|| panic!("{permit:?} is not one of this store's permits"));
            self.store.release_now(key, policy, inner);
            Ok(())
        })
    }

    fn renew(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::RenewFuture {
        self.answer(|| {
            let inner = self.ids.lock().unwrap().get(&permit.0).copied();
            Ok(inner.is_some_and(|inner| self.store.renew_now(key, policy, inner)))
        })
    }
}

fn semaphore(max: u64) -> Policy {
    named("sem", Policy::concurrency(max, Duration::from_secs(3600)))
}

/// A primary of high-bit permits, a `FallbackStore` over it, and a
/// semaphore of `max`.
fn fallback_over_high_bits(
    max: u64,
) -> (
    HighBitPermits,
    FallbackStore<HighBitPermits, MemoryStore>,
    Policy,
) {
    let primary = HighBitPermits::new();
    let store = primary.behind_fallback();
    (primary, store, semaphore(max))
}

#[tokio::test]
async fn fallback_releases_a_primary_permit_to_the_primary_whatever_its_id() {
    let (primary, store, policy) = fallback_over_high_bits(1);
    for round in 0..3 {
        let d = store.check(b"k", &policy, 1).await.unwrap();
        assert!(d.is_allowed(), "round {round}: the permit leaked: {d:?}");
        let permit = d.permit().unwrap();
        assert_ne!(permit.0 & HIGH_BIT, 0);
        store.release(b"k", &policy, permit).await.unwrap();
        assert_eq!(
            primary.remaining(&policy),
            1,
            "round {round}: the primary still holds the permit"
        );
    }
    // The same through check_all.
    let d = store
        .check_all(&[Check::new(b"k", &policy, 1)])
        .await
        .unwrap();
    store
        .release(b"k", &policy, d[0].permit().unwrap())
        .await
        .unwrap();
    assert_eq!(primary.remaining(&policy), 1);
}

#[tokio::test]
async fn fallback_releases_its_own_permits_locally_and_never_to_the_primary() {
    let (primary, store, policy) = fallback_over_high_bits(1);
    // A permit of the primary, held across the outage.
    let held = store.check(b"k", &policy, 1).await.unwrap();
    primary.down.store(true, Ordering::SeqCst);
    for round in 0..3 {
        let d = store.check(b"k", &policy, 1).await.unwrap();
        assert!(d.is_allowed(), "round {round}: {d:?}");
        assert_eq!(d.source(), ratelimit_core::DecisionSource::Fallback);
        // Released locally (the primary is down: a release sent there fails).
        store
            .release(b"k", &policy, d.permit().unwrap())
            .await
            .unwrap();
    }
    primary.down.store(false, Ordering::SeqCst);
    store
        .release(b"k", &policy, held.permit().unwrap())
        .await
        .unwrap();
    assert_eq!(primary.remaining(&policy), 1);
}

/// Two rules of one request with the same policy and key (overlapping
/// routes), next to another limit: both stores sum the duplicates into one
/// check and give each the merged decision; a permit is one for the summed
/// cost, and releasing it once per duplicate is harmless.
async fn duplicates_agree(memory: &MemoryStore<ManualClock>, redis: &RedisStore, label: &str) {
    for (round, policy) in long_policies(5).into_iter().enumerate() {
        let policy = policy.with_name(format!("dup-{round}")).unwrap();
        let other = named(
            format!("dup-other-{round}"),
            Policy::fixed_window(100, Duration::from_secs(3600)),
        );
        let user = format!("user-{label}-{round}");
        let checks = [
            Check::new(user.as_bytes(), &policy, 1),
            Check::new(b"global", &other, 1),
            Check::new(user.as_bytes(), &policy, 2),
        ];
        let mut held = Vec::new();
        for step in 0..3 {
            let m = memory.check_all(&checks).await.unwrap();
            let r = redis.check_all(&checks).await.unwrap_or_else(|e| {
                panic!("{label} {}: step {step}: {e}", policy.name());
            });
            let mo: Vec<_> = m.iter().map(observable).collect();
            let ro: Vec<_> = r.iter().map(observable).collect();
            assert_eq!(mo, ro, "{label} {}: step {step}", policy.name());
            // The duplicates share one decision: the sum of their costs.
            assert_eq!(mo[0], mo[2], "{label} {}: step {step}", policy.name());
            assert_eq!(m[0].permit(), m[2].permit());
            assert_eq!(r[0].permit(), r[2].permit());
            let expect_allowed = step == 0;
            assert_eq!(
                m[0].is_allowed(),
                expect_allowed,
                "{}: {m:?}",
                policy.name()
            );
            if expect_allowed {
                // 5 - (1 + 2) left.
                assert_eq!(m[0].remaining(), 2, "{}: {m:?}", policy.name());
            }
            if let (Some(a), Some(b)) = (m[0].permit(), r[0].permit()) {
                held.push((a, b));
            }
        }
        if !held.is_empty() {
            // Each duplicate releases its permit: twice the same id.
            for (a, b) in held {
                for _ in 0..2 {
                    memory.release(user.as_bytes(), &policy, a).await.unwrap();
                    redis.release(user.as_bytes(), &policy, b).await.unwrap();
                }
            }
            let m = memory.check(user.as_bytes(), &policy, 0).await.unwrap();
            let r = redis.check(user.as_bytes(), &policy, 0).await.unwrap();
            assert_eq!(m.remaining(), 5, "{label}: {m:?}");
            assert_eq!(observable(&m), observable(&r), "{label}");
        }
    }
    // The same policy name with other parameters twice in one request is a
    // conflict on both stores, never a silent pass.
    let a = fixed_window("dup-conflict", 5, Duration::from_secs(60));
    let b = fixed_window("dup-conflict", 7, Duration::from_secs(60));
    let checks = [Check::new(b"k", &a, 1), Check::new(b"k", &b, 1)];
    for (store, result) in on_both(memory, redis, &checks).await {
        assert!(
            matches!(result, Err(StoreError::PolicyConflict { ref policy }) if policy == "dup-conflict"),
            "{label} {store}: {result:?}"
        );
    }
    // Summed costs above what the policy admits: a clear error on both.
    let small = fixed_window("dup-small", 2, Duration::from_secs(60));
    let checks = [Check::new(b"k", &small, 2), Check::new(b"k", &small, 1)];
    for (store, result) in on_both(memory, redis, &checks).await {
        assert!(
            matches!(
                result,
                Err(StoreError::CostExceedsLimit {
                    cost: 3,
                    max: 2,
                    ..
                })
            ),
            "{label} {store}: {result:?}"
        );
    }
}

/// `checks` as one request on `memory`, then on `redis`, each result
/// named by its store.
async fn on_both(
    memory: &MemoryStore<ManualClock>,
    redis: &RedisStore,
    checks: &[Check<'_>],
) -> [(&'static str, Result<Vec<Decision>, StoreError>); 2] {
    [
        ("memory", memory.check_all(checks).await),
        ("redis", redis.check_all(checks).await),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_checks_are_summed_alike_on_memory_and_a_redis_node() {
    let (_server, _clock, memory, redis) = twins_at(NOW_MICROS).await;
    duplicates_agree(&memory, &redis, "node").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_checks_are_summed_alike_on_memory_and_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let clock = ManualClock::new(1_763_000_000_000_001);
    let (memory, redis) = twin_stores(RedisStore::cluster_builder(cluster.urls()), &clock).await;
    // `user-*` and `global` live in different slots: across slots, with refunds.
    duplicates_agree(&memory, &redis, "cluster").await;
}

/// A store on one pooled connection with `call_timeout`, connected.
async fn one_connection(url: String, call_timeout: Duration) -> RedisStore {
    let store = build(
        RedisStore::builder(url)
            .pool_size(1)
            .call_timeout(call_timeout),
    )
    .await;
    store.ping().await.unwrap();
    store
}

/// A semaphore of 5 for `user` on [`one_connection`] to `url`, and the
/// state key of `user`'s permits; its script is loaded, so the next check is
/// one EVALSHA.
async fn semaphore_on_one_connection(
    url: String,
    call_timeout: Duration,
    user: &[u8],
) -> (RedisStore, Policy, String) {
    let store = one_connection(url, call_timeout).await;
    let policy = semaphore(5);
    let key = store.state_key(user, &policy);
    store.check(user, &policy, 0).await.unwrap();
    (store, policy, key)
}

/// A [`semaphore_on_one_connection`] for `user` through a proxy in front of
/// a new Redis; the proxy then delays every reply by 400 ms.
async fn semaphore_behind_a_slow_proxy(
    call_timeout: Duration,
    user: &[u8],
) -> (RedisServer, FaultProxy, (RedisStore, Policy, String)) {
    let (server, proxy) = FaultProxy::with_new_server();
    let semaphore = semaphore_on_one_connection(proxy.redis_url(), call_timeout, user).await;
    proxy.set_latency(Duration::from_millis(400));
    (server, proxy, semaphore)
}

/// Asserts that `user` holds no permit: Redis lets go of every entry within
/// `limit`, and a peek sees the whole semaphore free.
async fn assert_released(
    server: &RedisServer,
    (store, policy, key): &(RedisStore, Policy, String),
    user: &[u8],
    limit: Duration,
) {
    assert_eq!(permits_left(server, key, limit).await, "0");
    let d = store.check(user, policy, 0).await.unwrap();
    assert_eq!(d.remaining(), 5, "{d:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_whose_reply_timed_out_is_released() {
    // The script runs; its reply comes too late.
    let (server, proxy, slow) =
        semaphore_behind_a_slow_proxy(Duration::from_millis(100), b"slow").await;
    let (store, policy, _) = &slow;
    let result = store.check(b"slow", policy, 1).await;
    assert!(matches!(result, Err(StoreError::Timeout(_))), "{result:?}");
    proxy.set_latency(Duration::ZERO);
    // The lease is an hour: only a release frees it this soon.
    assert_released(&server, &slow, b"slow", Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_whose_call_was_dropped_in_flight_is_released() {
    let (server, proxy, gone) =
        semaphore_behind_a_slow_proxy(Duration::from_secs(5), b"gone").await;
    let (store, policy, key) = &gone;
    // The caller goes away (a client disconnect) while the call is in flight.
    let dropped =
        tokio::time::timeout(Duration::from_millis(100), store.check(b"gone", policy, 1)).await;
    assert!(dropped.is_err(), "{dropped:?}");
    // Through the slow proxy, before the check of `assert_released`.
    assert_eq!(
        permits_left(&server, key, Duration::from_secs(3)).await,
        "0"
    );
    proxy.set_latency(Duration::ZERO);
    assert_released(&server, &gone, b"gone", Duration::from_secs(3)).await;
}

/// A Redis busy with a long script: the check waits behind it on its
/// connection and times out; its release must not overtake it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_taken_after_its_timeout_behind_a_busy_script_is_released() {
    let server = RedisServer::start();
    let busy_user =
        semaphore_on_one_connection(server.url(), Duration::from_millis(50), b"busy").await;
    let (store, policy, _) = &busy_user;
    // 2 s of a script that holds the server (below the 5 s busy limit):
    // long enough that the check below, sent once `redis-cli` has had half
    // a second to start on a loaded machine, meets it running.
    let script = "local t = redis.call('TIME') \
        local start = t[1] * 1000000 + t[2] \
        while true do \
          local n = redis.call('TIME') \
          if n[1] * 1000000 + n[2] - start > 2000000 then return 1 end \
        end";
    let port = server.port();
    let busy = std::thread::spawn(move || {
        let output = std::process::Command::new("redis-cli")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "EVAL",
                script,
                "0",
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let result = store.check(b"busy", policy, 1).await;
    assert!(result.is_err(), "{result:?}");
    assert_eq!(busy.join().unwrap(), "1");
    assert_released(&server, &busy_user, b"busy", Duration::from_secs(5)).await;
}

/// A user key whose state key, under `policy`, is in a slot with `pick`.
fn user_in_slot(
    store: &RedisStore,
    policy: &Policy,
    prefix: &str,
    pick: impl Fn(u16) -> bool,
) -> String {
    (0..10_000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|u| {
            pick(ratelimit_tests::cluster_slot(
                store.state_key(u.as_bytes(), policy).as_bytes(),
            ))
        })
        .unwrap()
}

/// On a cluster, a request denied in one slot stays denied when the peeks
/// of its other limits fail: here the later slot's state belongs to another
/// algorithm (its check was never reached, so only the peek meets it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_slot_denial_stays_a_denial_when_a_peek_fails() {
    let cluster = RedisCluster::start();
    let store = cluster_store(&cluster).await;
    let hour = Duration::from_secs(3600);
    let policy = fixed_window("peek", 1, NO_EDGE);
    let other = fixed_window("peek-other", 10, NO_EDGE);
    // Slot order: `early` (consumes, refunded), `denier`, `late` (never checked).
    let denier = user_in_slot(&store, &policy, "denier", |s| (6000..7000).contains(&s));
    let early = user_in_slot(&store, &other, "early", |s| s < 5000);
    let late = user_in_slot(&store, &policy, "late", |s| s > 12_000);
    assert!(admits(&store, denier.as_bytes(), &policy).await);
    // Another algorithm's state under the name "peek" for `late`.
    let semaphore = named("peek", Policy::concurrency(5, hour));
    assert!(admits(&store, late.as_bytes(), &semaphore).await);
    let checks = [
        Check::new(early.as_bytes(), &other, 1),
        Check::new(denier.as_bytes(), &policy, 1),
        Check::new(late.as_bytes(), &policy, 1),
    ];
    let decisions = store.check_all(&checks).await.unwrap();
    assert!(!decisions[1].is_allowed(), "{decisions:?}");
    assert!(
        decisions.iter().all(|d| d.permit().is_none()),
        "{decisions:?}"
    );
    // `early` was refunded.
    let peek = store.check(early.as_bytes(), &other, 0).await.unwrap();
    assert_eq!(peek.remaining(), 10, "{peek:?}");
}

/// The same when the later slot's node is down: an outage after the denial
/// does not turn it into an error (which a failure policy might admit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_slot_denial_stays_a_denial_when_a_node_is_down_for_the_peek() {
    let mut cluster = RedisCluster::start();
    let store =
        build(RedisStore::cluster_builder(cluster.urls()).call_timeout(Duration::from_millis(500)))
            .await;
    let policy = fixed_window("down", 1, NO_EDGE);
    let denier = user_in_slot(&store, &policy, "denier", |s| s < 5000);
    let late = user_in_slot(&store, &policy, "late", |s| s > 11_000);
    let slot_of =
        |k: &str| ratelimit_tests::cluster_slot(store.state_key(k.as_bytes(), &policy).as_bytes());
    let late_node = cluster.master_of(slot_of(&late));
    assert_ne!(late_node, cluster.master_of(slot_of(&denier)));
    assert!(admits(&store, denier.as_bytes(), &policy).await);
    cluster.node_mut(late_node).stop();
    let checks = [
        Check::new(denier.as_bytes(), &policy, 1),
        Check::new(late.as_bytes(), &policy, 1),
    ];
    let decisions = store.check_all(&checks).await.unwrap();
    assert!(!decisions[0].is_allowed(), "{decisions:?}");
    // Nothing is known of the limit on the node that is down: nothing left.
    assert!(
        decisions[1].is_allowed() && decisions[1].remaining() == 0,
        "{decisions:?}"
    );
}

// ---- A permit lasts as long as its holder: renewed leases ----

use ratelimit_tests::fixtures::{ChannelBody, tokio_memory};
use ratelimit_tower::body::ResponseBody;
use ratelimit_tower::{GlobalKey, Mode, RateLimitLayer};
use tower::{Layer as _, ServiceExt as _};

/// The senders of the bodies still streaming.
type Senders = Arc<Mutex<Vec<tokio::sync::mpsc::Sender<bytes::Bytes>>>>;

/// A response of [`streaming`]: its body streams while it lives.
type Streaming = http::Response<ResponseBody<ChannelBody>>;

/// A service whose every response streams a body until its sender (kept in
/// the returned list) is dropped, behind a layer of `policy` (one global
/// key) on `store`, in `mode`.
fn streaming<St: Store + Clone>(
    store: St,
    policy: Policy,
    mode: Mode,
) -> (
    impl tower::Service<
        http::Request<&'static str>,
        Response = Streaming,
        Error = std::convert::Infallible,
        Future: Send,
    > + Clone
    + Send
    + 'static,
    Senders,
) {
    let senders: Senders = Arc::default();
    let inner = {
        let senders = Arc::clone(&senders);
        tower::service_fn(move |_req: http::Request<&'static str>| {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            senders.lock().unwrap().push(tx);
            async move { Ok(http::Response::new(ChannelBody(rx))) }
        })
    };
    let layer = RateLimitLayer::new(store, policy, GlobalKey::default()).mode(mode);
    (layer.layer(inner), senders)
}

/// A service as [`streaming`] builds it.
trait StreamingService:
    tower::Service<
        http::Request<&'static str>,
        Response = Streaming,
        Error = std::convert::Infallible,
    > + Clone
{
}

impl<S> StreamingService for S where
    S: tower::Service<
            http::Request<&'static str>,
            Response = Streaming,
            Error = std::convert::Infallible,
        > + Clone
{
}

/// One request through `service`: its response, whose body holds the
/// request's permit while it lives.
async fn request(service: &impl StreamingService) -> Streaming {
    service
        .clone()
        .oneshot(http::Request::new(""))
        .await
        .unwrap()
}

/// Under a max of 1, with the first request's body still streaming: a
/// second request is refused at each of `at` after `start`.
async fn assert_a_second_is_refused_at(
    service: &impl StreamingService,
    start: tokio::time::Instant,
    at: &[Duration],
) {
    for at in at {
        tokio::time::sleep_until(start + *at).await;
        assert_eq!(
            request(service).await.status(),
            http::StatusCode::TOO_MANY_REQUESTS,
            "at {at:?}: two in flight under a max of 1"
        );
    }
}

/// A concurrency policy of `max` leased for `lease`.
fn semaphore_leased(max: u64, lease: Duration) -> Policy {
    named("leased", Policy::concurrency(max, lease))
}

/// With a max of 1 and a lease of 30 s, a response body that streams for
/// longer than the lease still holds its permit: a second request is
/// refused at 31 s and at 5 min. Once the body is dropped, the slot frees.
#[tokio::test(start_paused = true)]
async fn a_body_streaming_past_its_lease_still_holds_its_permit_in_memory() {
    let t0 = tokio::time::Instant::now();
    let store = tokio_memory();
    let policy = semaphore_leased(1, Duration::from_secs(30));
    let (service, _senders) = streaming(store, policy, Mode::Reject);
    let first = request(&service).await;
    assert_eq!(first.status(), http::StatusCode::OK);
    let at = [31, 300].map(Duration::from_secs);
    assert_a_second_is_refused_at(&service, t0, &at).await;
    drop(first);
    assert_eq!(request(&service).await.status(), http::StatusCode::OK);
}

/// A permit whose holder went away is released at once: the slot is free
/// long before the lease ends, and stays free (its renewals stopped with
/// it).
#[tokio::test(start_paused = true)]
async fn a_dropped_body_frees_its_permit_and_stops_renewing_it() {
    let store = tokio_memory();
    let policy = semaphore_leased(1, Duration::from_secs(30));
    let (service, _senders) = streaming(store.clone(), policy.clone(), Mode::Reject);
    let first = request(&service).await;
    assert_eq!(first.status(), http::StatusCode::OK);
    tokio::time::sleep(Duration::from_secs(45)).await;
    drop(first);
    assert_eq!(
        store.check_now(b"global", &policy, 0).unwrap().remaining(),
        1
    );
    // A later request takes the slot, and nothing the first one left
    // running brings its permit back.
    let second = request(&service).await;
    assert_eq!(second.status(), http::StatusCode::OK);
    tokio::time::sleep(Duration::from_secs(120)).await;
    let peek = store.check_now(b"global", &policy, 0).unwrap();
    assert_eq!(peek.remaining(), 0, "{peek:?}");
    assert_eq!(
        request(&service).await.status(),
        http::StatusCode::TOO_MANY_REQUESTS
    );
    drop(second);
    assert_eq!(
        store.check_now(b"global", &policy, 0).unwrap().remaining(),
        1
    );
}

/// Two instances share a store (one clock, moved in step with each
/// runtime's paused time). The first takes the only permit and renews it
/// while its response streams, then dies: its runtime stops (no more
/// renewals) and its response is never dropped (no release), as when the
/// process is killed. The permit ends with its last lease (renewed at 60 s,
/// ending at 90 s), not before: the second instance is refused until then,
/// and admitted after.
#[test]
fn a_holder_that_dies_loses_its_permit_when_its_lease_ends() {
    let clock = ManualClock::new(NOW_MICROS);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let policy = semaphore_leased(1, Duration::from_secs(30));
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    };
    // Both clocks move one second at a time, together.
    let run_for = |seconds: u64| {
        let clock = clock.clone();
        async move {
            for _ in 0..seconds {
                tokio::time::sleep(Duration::from_secs(1)).await;
                clock.advance(Duration::from_secs(1));
            }
        }
    };
    let dying = runtime();
    let held = dying.block_on(async {
        let (service, senders) = streaming(store.clone(), policy.clone(), Mode::Reject);
        let held = request(&service).await;
        assert_eq!(held.status(), http::StatusCode::OK);
        // Renewed at 10, 20, ..., 60 s: its last lease ends at 90 s.
        run_for(65).await;
        (held, senders)
    });
    // Killed: no more renewals, and no release.
    drop(dying);
    std::mem::forget(held);

    let other = runtime();
    other.block_on(async {
        let (service, _senders) = streaming(store.clone(), policy.clone(), Mode::Reject);
        assert_eq!(
            request(&service).await.status(),
            http::StatusCode::TOO_MANY_REQUESTS,
            "at 65 s, the dead holder's last lease runs"
        );
        run_for(20).await;
        assert_eq!(
            request(&service).await.status(),
            http::StatusCode::TOO_MANY_REQUESTS,
            "at 85 s, the dead holder's last lease runs"
        );
        run_for(10).await;
        let admitted = request(&service).await;
        assert_eq!(
            admitted.status(),
            http::StatusCode::OK,
            "at 95 s, its lease has ended"
        );
    });
}

/// A handler's `Granted` holds its permit as long as the handler keeps it,
/// past the lease; dropping it frees the slot.
#[tokio::test(start_paused = true)]
async fn a_limiter_grant_held_past_its_lease_still_holds_its_permit() {
    let store = tokio_memory();
    let limiter = ratelimit_axum::Limiter::new(store, semaphore_leased(1, Duration::from_secs(30)));
    let granted = limiter.check(b"job", 1).await.unwrap();
    tokio::time::sleep(Duration::from_secs(100)).await;
    let refused = limiter.check(b"job", 1).await;
    assert!(refused.is_err(), "two in flight under a max of 1");
    drop(granted);
    assert!(limiter.check(b"job", 1).await.is_ok());
}

/// In wait mode, a request that meets a full semaphore passes soon after
/// the permit is released, long before the lease would end (and even when
/// the lease ends after its longest wait).
#[tokio::test(start_paused = true)]
async fn a_waiting_request_passes_soon_after_a_release() {
    let store = tokio_memory();
    let policy = semaphore_leased(1, Duration::from_secs(60));
    let mode = Mode::Wait {
        max_delay: Duration::from_secs(5),
    };
    let (service, _senders) = streaming(store, policy, mode);
    let first = request(&service).await;
    assert_eq!(first.status(), http::StatusCode::OK);
    let waiting = tokio::spawn(service.clone().oneshot(http::Request::new("")));
    let waiting = tokio::spawn(async move {
        let response = waiting.await.unwrap().unwrap();
        (response.status(), tokio::time::Instant::now())
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!waiting.is_finished(), "it waits while the slot is held");
    let released = tokio::time::Instant::now();
    drop(first);
    let (status, passed) = waiting.await.unwrap();
    assert_eq!(status, http::StatusCode::OK);
    let after = passed - released;
    assert!(
        after <= Duration::from_millis(300),
        "passed {after:?} after the release"
    );
}

/// The same with `RedisStore` on a real server, on its own clock: a lease
/// of 2 s, a body streaming for 4.5 s still holds its permit (renewed
/// every third of the lease), and its slot frees when it is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_streaming_past_its_lease_still_holds_its_permit_in_redis() {
    let server = RedisServer::start();
    let store = ratelimit_tests::redis_store(server.url()).await;
    let policy = semaphore_leased(1, Duration::from_secs(2));
    let (service, _senders) = streaming(store.clone(), policy.clone(), Mode::Reject);
    let first = request(&service).await;
    assert_eq!(first.status(), http::StatusCode::OK);
    let started = tokio::time::Instant::now();
    let at = [2_400, 4_500].map(Duration::from_millis);
    assert_a_second_is_refused_at(&service, started, &at).await;
    drop(first);
    // The release is sent on the runtime: look until it has landed, for a
    // second (a real server on a loaded machine), well before the lease,
    // renewed until the drop, could end (1.3 s at the soonest).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    loop {
        let peek = store.check(b"global", &policy, 0).await.unwrap();
        if peek.remaining() == 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not released: {peek:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(request(&service).await.status(), http::StatusCode::OK);
}

/// A `FallbackStore` renews each permit in the store that issued it: the
/// primary's there (a renewal sent to the fallback would find nothing), the
/// fallback's locally while the primary is down (one sent to the primary
/// would fail).
#[tokio::test]
async fn fallback_renews_each_permit_in_the_store_that_issued_it() {
    let (primary, store, policy) = fallback_over_high_bits(2);
    let held = store.check(b"k", &policy, 1).await.unwrap();
    let held = held.permit().unwrap();
    assert!(store.renew(b"k", &policy, held).await.unwrap());
    primary.down.store(true, Ordering::SeqCst);
    let local = store.check(b"k", &policy, 1).await.unwrap();
    assert_eq!(local.source(), ratelimit_core::DecisionSource::Fallback);
    let local = local.permit().unwrap();
    assert!(store.renew(b"k", &policy, local).await.unwrap());
    store.release(b"k", &policy, local).await.unwrap();
    primary.down.store(false, Ordering::SeqCst);
    // Released: neither store holds it any more.
    assert!(!store.renew(b"k", &policy, local).await.unwrap());
    assert!(store.renew(b"k", &policy, held).await.unwrap());
}

/// On a Redis Cluster, a renewal goes to the master of the key's slot, as
/// its check and release do: a permit outlives its first lease there, and
/// once released it is not brought back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_on_a_redis_cluster_extends_the_permit_in_its_slot() {
    let cluster = RedisCluster::start();
    let clock = ManualClock::new(NOW_MICROS);
    let (_, redis) = twin_stores(RedisStore::cluster_builder(cluster.urls()), &clock).await;
    let policy = semaphore_leased(1, Duration::from_secs(1));
    for user in ["alice", "bob", "carol", "dave"] {
        let user = user.as_bytes();
        let permit = take_permit(&redis, user, &policy).await;
        clock.advance(Duration::from_millis(700));
        assert!(redis.renew(user, &policy, permit).await.unwrap());
        clock.advance(Duration::from_millis(700));
        let d = redis.check(user, &policy, 1).await.unwrap();
        assert!(!d.is_allowed(), "past its first lease: {d:?}");
        redis.release(user, &policy, permit).await.unwrap();
        assert!(!redis.renew(user, &policy, permit).await.unwrap());
        assert!(redis.check(user, &policy, 0).await.unwrap().remaining() == 1);
    }
}

/// The permit ids held in the semaphore at `key` (its entries: 32 hex
/// digits each, after the tag and the base), in order; none when there is
/// no semaphore.
fn held_permits(server: &RedisServer, key: &str) -> Vec<String> {
    let script = "local s = redis.call('GET', KEYS[1]) local out = {} \
                  if s then for i = 9, #s, 46 do out[#out + 1] = string.sub(s, i, i + 31) end end \
                  return out";
    let reply = server.cli(&["EVAL", script, "1", key]);
    reply
        .lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .collect()
}

/// A store through `proxy` on one pooled connection, coalescing or not,
/// connected, with `policy`'s script or function loaded: the next call of
/// `user` is one command on that connection.
async fn one_connection_through(
    proxy: &FaultProxy,
    coalescing: bool,
    policy: &Policy,
    user: &[u8],
) -> RedisStore {
    let max_batch = if coalescing {
        ratelimit_tests::DEFAULT_MAX_BATCH
    } else {
        1
    };
    let store = small_store(proxy.redis_url(), 1, max_batch, Duration::from_secs(5)).await;
    store.check(user, policy, 0).await.unwrap();
    store
        .check_all(&[Check::new(user, policy, 0), Check::new(b"x", policy, 0)])
        .await
        .unwrap();
    store
}

/// A check whose reply is lost with its connection after the script took
/// the permit is sent again, with the same permit id: that resend finds its
/// own permit and is allowed (not denied by it), and the caller holds the
/// one permit taken, which its release frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_whose_reply_was_lost_holds_its_one_permit_for_its_caller() {
    let (server, proxy) = FaultProxy::with_new_server();
    for coalescing in [true, false] {
        let policy = semaphore(1);
        let user: &[u8] = if coalescing { b"lost-c" } else { b"lost-1" };
        let store = one_connection_through(&proxy, coalescing, &policy, user).await;
        let key = store.state_key(user, &policy);
        proxy.cut_replies(1);
        let d = store.check(user, &policy, 1).await.unwrap();
        assert_eq!(proxy.cuts_left(), 0, "the first reply was cut");
        assert!(d.is_allowed(), "coalescing {coalescing}: {d:?}");
        let permit = d.permit().expect("an allowed check holds its permit");
        assert_eq!(held_permits(&server, &key), vec![permit.to_string()]);
        store.release(user, &policy, permit).await.unwrap();
        assert_eq!(held_permits(&server, &key), Vec::<String>::new());
        assert!(admits(&store, user, &policy).await, "the semaphore is free");
    }
}

/// The same for a request of several limits: the resend finds its own
/// permit, but the other limit, which the first run consumed, now denies,
/// so the request is denied, and the permit that its first run took is
/// released: nobody holds it for its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_resend_of_several_limits_releases_the_permit_its_first_run_took() {
    let (server, proxy) = FaultProxy::with_new_server();
    let once = fixed_window("once", 1, NO_EDGE);
    for coalescing in [true, false] {
        let policy = semaphore(1);
        let user: &[u8] = if coalescing {
            b"lost-all-c"
        } else {
            b"lost-all-1"
        };
        let store = one_connection_through(&proxy, coalescing, &policy, user).await;
        let key = store.state_key(user, &policy);
        proxy.cut_replies(1);
        let checks = [Check::new(user, &policy, 1), Check::new(user, &once, 1)];
        let decisions = store.check_all(&checks).await.unwrap();
        assert_eq!(proxy.cuts_left(), 0, "the first reply was cut");
        assert!(!decisions[1].is_allowed(), "{decisions:?}");
        assert!(
            decisions.iter().all(|d| d.permit().is_none()),
            "{decisions:?}"
        );
        // Released on the runtime, within moments; the lease is an hour.
        assert_eq!(
            permits_left(&server, &key, Duration::from_secs(3)).await,
            "0"
        );
        assert_eq!(store.check(user, &policy, 0).await.unwrap().remaining(), 1);
    }
}

/// A release and a renewal whose replies are lost are sent again: each
/// changes nothing more than once, and touches no other permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_and_renewals_sent_twice_change_nothing_more() {
    let (server, proxy) = FaultProxy::with_new_server();
    let policy = semaphore(2);
    let user: &[u8] = b"twice";
    let store = one_connection_through(&proxy, false, &policy, user).await;
    let key = store.state_key(user, &policy);
    let mine = take_permit(&store, user, &policy).await;
    let other = take_permit(&store, user, &policy).await;
    proxy.cut_replies(1);
    assert!(store.renew(user, &policy, mine).await.unwrap());
    assert_eq!(proxy.cuts_left(), 0, "the renewal's reply was cut");
    let mut held = held_permits(&server, &key);
    held.sort();
    let mut both = vec![mine.to_string(), other.to_string()];
    both.sort();
    assert_eq!(held, both, "one entry each");
    proxy.cut_replies(1);
    store.release(user, &policy, mine).await.unwrap();
    assert_eq!(proxy.cuts_left(), 0, "the release's reply was cut");
    assert_eq!(held_permits(&server, &key), vec![other.to_string()]);
    store.release(user, &policy, mine).await.unwrap();
    assert!(
        !store.renew(user, &policy, mine).await.unwrap(),
        "gone for good"
    );
    assert_eq!(held_permits(&server, &key), vec![other.to_string()]);
    assert_eq!(store.check(user, &policy, 0).await.unwrap().remaining(), 1);
}
