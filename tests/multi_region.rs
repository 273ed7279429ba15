//! `MultiRegionStore` on three real `redis-server`s, one per region, on
//! loopback: uneven traffic within the stated bound, spaced requests exact,
//! partitions through the fault proxy (each side within its conservative
//! share), healing (convergence, nothing lost), and TTLs on every key.

use std::time::{Duration, Instant};

use ratelimit_core::clock::ManualClock;
use ratelimit_core::multi_region::MultiRegionStore;
use ratelimit_core::{Check, Policy, Store, StoreError};
use ratelimit_tests::fault_proxy::{FaultProxy, Mode};
use ratelimit_tests::fixtures::fixed_window;
use ratelimit_tests::{RedisServer, build, named};

const NAMES: [&str; 3] = ["eu", "us", "ap"];
/// A fixed time (µs) a second into a window of an hour: the script clock,
/// so no test crosses a window boundary.
const T0: u64 = 1_800_000_000_000_000 + 1_000_000;

struct Regions {
    servers: Vec<RedisServer>,
    /// `proxies[from][to]`: the path from region `from` to `to`'s Redis
    /// (`None` on the diagonal).
    proxies: Vec<Vec<Option<FaultProxy>>>,
    stores: Vec<MultiRegionStore>,
    clock: ManualClock,
}

impl Regions {
    async fn start(sync: Duration, staleness: Duration) -> Regions {
        let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
        let proxies: Vec<Vec<Option<FaultProxy>>> = (0..3)
            .map(|from| {
                (0..3)
                    .map(|to| (from != to).then(|| FaultProxy::start(servers[to].addr())))
                    .collect()
            })
            .collect();
        let clock = ManualClock::new(T0);
        let mut stores = Vec::new();
        for (i, name) in NAMES.iter().enumerate() {
            let mut builder = MultiRegionStore::builder(*name, servers[i].url())
                .sync(sync)
                .staleness(staleness)
                .call_timeout(Duration::from_secs(2))
                .push_timeout(Duration::from_millis(500))
                .script_clock_for_tests(clock.clone());
            for (j, peer) in NAMES.iter().enumerate() {
                if let Some(proxy) = &proxies[i][j] {
                    builder = builder.peer(*peer, proxy.redis_url());
                }
            }
            stores.push(builder.build().await.expect("a multi-region store"));
        }
        Regions {
            servers,
            proxies,
            stores,
            clock,
        }
    }

    /// Waits (at most 5 s) until every region has heard from every peer.
    async fn wait_fresh(&self) -> Duration {
        let start = Instant::now();
        loop {
            if self
                .stores
                .iter()
                .all(|s| s.peers().iter().all(|p| !p.stale))
            {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "peers still stale: {:?}",
                self.stores.iter().map(|s| s.peers()).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Cuts (or heals) every path between `region` and the others, both ways.
    fn isolate(&self, region: usize, mode: Mode) {
        for other in (0..3).filter(|&o| o != region) {
            for (from, to) in [(region, other), (other, region)] {
                if let Some(proxy) = &self.proxies[from][to] {
                    proxy.set_mode(mode);
                }
            }
        }
    }

    /// The G-counter fields of `hash` in region `i`'s Redis, as `region:start value` pairs.
    fn fields(&self, i: usize, hash: &str) -> Vec<(String, u64)> {
        let out = self.servers[i].cli(&["HGETALL", hash]);
        let lines: Vec<&str> = out.lines().collect();
        let mut fields: Vec<(String, u64)> = lines
            .chunks_exact(2)
            .map(|p| (p[0].to_owned(), p[1].parse().expect("a count")))
            .collect();
        fields.sort();
        fields
    }

    fn assert_every_key_has_a_ttl(&self) {
        for server in &self.servers {
            let keys = server.cli(&["--scan", "--pattern", "*"]);
            for key in keys.lines().filter(|k| !k.is_empty()) {
                let ttl: i64 = server.cli(&["PTTL", key]).parse().expect("a TTL");
                assert!(ttl > 0 || ttl == -2, "{key} has no TTL ({ttl})");
            }
        }
    }
}

fn fixed(limit: usize) -> Policy {
    let limit = u64::try_from(limit).expect("a limit");
    fixed_window("mr", limit, Duration::from_secs(3600))
}

/// Sends `count` requests for `key`, the i-th to region `pick(i)`, `gap`
/// apart; returns each region's admission times.
async fn traffic(
    regions: &Regions,
    policy: &Policy,
    key: &[u8],
    count: usize,
    gap: Duration,
    pick: impl Fn(usize) -> usize,
) -> Vec<Vec<Instant>> {
    let mut admitted = vec![Vec::new(); 3];
    let deadline = Instant::now() + Duration::from_secs(30);
    for i in 0..count {
        assert!(Instant::now() < deadline, "traffic took over 30 s");
        let region = pick(i);
        let decision = regions.stores[region]
            .check(key, policy, 1)
            .await
            .expect("a decision");
        if decision.is_allowed() {
            admitted[region].push(Instant::now());
        }
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
    }
    admitted
}

/// The stated bound's extra term, measured: what the regions other than the
/// last to admit admitted during `d` before its last admission.
fn lagging(admitted: &[Vec<Instant>], d: Duration) -> usize {
    let Some((last_region, last)) = admitted
        .iter()
        .enumerate()
        .filter_map(|(r, times)| times.last().map(|t| (r, *t)))
        .max_by_key(|(_, t)| *t)
    else {
        return 0;
    };
    admitted
        .iter()
        .enumerate()
        .filter(|(r, _)| *r != last_region)
        .flat_map(|(_, times)| times.iter())
        .filter(|t| **t + d >= last)
        .count()
}

/// The limit of [`within_the_bound`].
const SHARED_LIMIT: usize = 100;

/// `count` requests for `key`, 1 ms apart, each in the region `pick` names,
/// under a fixed window of [`SHARED_LIMIT`]: asserts that the regions used
/// the budget and stayed within it plus what the others admitted within
/// `lag` of the last admission. Returns what each region admitted, the
/// total and that extra.
async fn within_the_bound(
    regions: &Regions,
    key: &[u8],
    count: usize,
    pick: impl Fn(usize) -> usize,
    lag: Duration,
) -> (Vec<usize>, usize, usize) {
    let limit = SHARED_LIMIT;
    let gap = Duration::from_millis(1);
    let admitted = traffic(regions, &fixed(limit), key, count, gap, pick).await;
    let per_region: Vec<usize> = admitted.iter().map(Vec::len).collect();
    let total: usize = per_region.iter().sum();
    let extra = lagging(&admitted, lag);
    assert!(total >= limit, "the budget was used: {per_region:?}");
    assert!(total <= limit + extra, "{total} > {limit} + {extra}");
    (per_region, total, extra)
}

/// 80 % of the traffic in one region: it uses far more than `limit / 3`,
/// and the three together stay within `limit` plus what the others
/// admitted during one sync interval plus one replication lag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uneven_traffic_uses_the_shared_budget_within_the_bound() {
    let sync = Duration::from_millis(20);
    let regions = Regions::start(sync, Duration::from_secs(2)).await;
    regions.wait_fresh().await;
    let limit = SHARED_LIMIT;
    let pick = |i: usize| match i % 10 {
        8 => 1,
        9 => 2,
        _ => 0,
    };
    // One sync interval plus a generous replication lag on loopback.
    let lag = sync + Duration::from_millis(30);
    let (per_region, total, extra) = within_the_bound(&regions, b"uneven", 400, pick, lag).await;
    eprintln!("80/10/10: admitted {per_region:?}, total {total}, bound {limit} + {extra}");
    assert!(per_region[0] > 2 * limit / 3, "{per_region:?}");
    regions.assert_every_key_has_a_ttl();
}

/// Requests further apart than one sync interval plus the replication lag:
/// the regions together admit the limit exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spaced_requests_admit_the_limit_exactly() {
    let sync = Duration::from_millis(10);
    let regions = Regions::start(sync, Duration::from_secs(2)).await;
    regions.wait_fresh().await;
    let limit = 12;
    let policy = fixed(limit);
    let admitted = traffic(
        &regions,
        &policy,
        b"spaced",
        30,
        Duration::from_millis(40),
        |i| i % 3,
    )
    .await;
    let total: usize = admitted.iter().map(Vec::len).sum();
    assert_eq!(total, limit, "{admitted:?}");
}

/// Several limits of one request are all or nothing within the region;
/// algorithms whose state is not a count per window are refused clearly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_all_is_all_or_nothing_and_other_algorithms_are_refused() {
    let regions = Regions::start(Duration::from_millis(20), Duration::from_secs(2)).await;
    regions.wait_fresh().await;
    let small = fixed(2);
    let large = named(
        "mr-large",
        Policy::sliding_window_counter(10, Duration::from_secs(3600)),
    );
    let store = &regions.stores[0];
    let both = [Check::new(b"k", &small, 1), Check::new(b"k", &large, 1)];
    for _ in 0..2 {
        assert!(ratelimit_core::all_allowed(
            &store.check_all(&both).await.expect("decisions")
        ));
    }
    let denied = store.check_all(&both).await.expect("decisions");
    assert!(!denied[0].is_allowed());
    assert!(denied[1].is_allowed(), "the larger limit reports a peek");
    assert_eq!(denied[1].remaining(), 8, "and nothing was consumed from it");
    let gcra = Policy::gcra(5, ratelimit_core::Rate::per_second(1)).expect("valid");
    let error = store.check(b"k", &gcra, 1).await.expect_err("unsupported");
    assert!(matches!(error, StoreError::Unsupported { .. }), "{error}");
    assert!(!error.is_outage());
}

/// A region cut off from the two others: once each side counts the other
/// side's regions as stale, the isolated region admits at most `limit`
/// less two shares, the other side at most `limit` less one; healed, the
/// counts converge within a few sync intervals, nothing is lost, and every
/// key keeps a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_keeps_each_side_within_its_share_and_heals() {
    let sync = Duration::from_millis(20);
    let staleness = Duration::from_millis(200);
    let regions = Regions::start(sync, staleness).await;
    regions.wait_fresh().await;
    let limit = 99;
    let share = 33;
    let policy = fixed(limit);
    // Some traffic before the partition, seen everywhere.
    traffic(
        &regions,
        &policy,
        b"split",
        9,
        Duration::from_millis(30),
        |i| i % 3,
    )
    .await;
    regions.isolate(0, Mode::Drop);
    let cut = Instant::now();
    loop {
        let isolated = regions.stores[0].peers().iter().all(|p| p.stale);
        let others = regions.stores[1..]
            .iter()
            .all(|s| s.peers().iter().any(|p| p.region == "eu" && p.stale));
        if isolated && others {
            break;
        }
        assert!(cut.elapsed() < Duration::from_secs(5), "never stale");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let detected = cut.elapsed();
    // Each side hammers the key.
    let eu = traffic(&regions, &policy, b"split", 100, Duration::ZERO, |_| 0).await;
    let us = traffic(&regions, &policy, b"split", 100, Duration::ZERO, |_| 1).await;
    let (eu, us) = (eu[0].len(), us[1].len());
    // Before: 3 per region. The isolated region counts each peer at
    // max(3, 33): it reaches 99 - 66 in all, 30 more. The other side counts
    // it at 33 and itself at 6: 60 more.
    assert_eq!(eu, limit - 2 * share - 3, "isolated side");
    assert_eq!(us, limit - share - 6, "the other side");
    regions.isolate(0, Mode::Forward);
    let healed = Instant::now();
    let hash = regions.stores[0].state_key(b"split", &policy);
    let expected: Vec<u64> = vec![3 + eu as u64, 3 + us as u64, 3];
    loop {
        let converged = (0..3).all(|i| {
            let fields = regions.fields(i, &hash);
            NAMES.iter().zip(&expected).all(|(name, value)| {
                fields
                    .iter()
                    .any(|(f, v)| f.starts_with(&format!("{name}:")) && v == value)
            })
        });
        if converged
            && regions
                .stores
                .iter()
                .all(|s| s.peers().iter().all(|p| !p.stale))
        {
            break;
        }
        assert!(
            healed.elapsed() < Duration::from_secs(5),
            "not converged: {:?}",
            (0..3).map(|i| regions.fields(i, &hash)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eprintln!(
        "partition detected in {detected:?}, healed and converged in {:?}",
        healed.elapsed()
    );
    // Healed: the global count is the sum, nothing more passes anywhere.
    for store in &regions.stores {
        let d = store.check(b"split", &policy, 0).await.expect("a peek");
        assert_eq!(d.remaining(), 0);
    }
    regions.assert_every_key_has_a_ttl();
}

/// The merge is by maximum: a replayed, duplicated or late push (a smaller
/// count arriving after a larger one) leaves the larger count, and the hash
/// and the heard key both get a TTL.
#[test]
fn merges_are_idempotent_and_ignore_late_smaller_counts() {
    let server = RedisServer::start();
    // As the store sends it: the shared integer helpers, then the merge.
    let merge = concat!(
        include_str!("../crates/ratelimit-core/src/redis/lua/numbers.lua"),
        "\n",
        include_str!("../crates/ratelimit-core/src/multi_region/lua/merge.lua")
    );
    let window = 3_600_000_000u64;
    let start = T0 - T0 % window;
    let push = |value: u64| {
        server.cli(&[
            "EVAL",
            merge,
            "2",
            "ratelimit:mr:heard:us",
            "ratelimit:mr:{k}:mr",
            "us",
            "60000",
            &T0.to_string(),
            &start.to_string(),
            &window.to_string(),
            &value.to_string(),
        ])
    };
    assert_eq!(push(5), "1");
    assert_eq!(push(3), "0", "a late, smaller count changes nothing");
    assert_eq!(push(5), "0", "a duplicate changes nothing");
    assert_eq!(
        server.cli(&["HGET", "ratelimit:mr:{k}:mr", &format!("us:{start}")]),
        "5"
    );
    assert_eq!(push(7), "1");
    for key in ["ratelimit:mr:{k}:mr", "ratelimit:mr:heard:us"] {
        let ttl: i64 = server.cli(&["PTTL", key]).parse().expect("a TTL");
        assert!(ttl > 0, "{key}: {ttl}");
    }
}

/// The tower layer works unchanged on top: one limit across two regions'
/// layers, 429 with `Retry-After` once the shared budget is used, and the
/// failure policy when the region's own Redis is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_works_unchanged_on_top() {
    use http::{Request, Response, StatusCode};
    use ratelimit_tower::{FailurePolicy, GlobalKey, RateLimitLayer};
    use tower::{Layer, ServiceExt};

    let mut regions = Regions::start(Duration::from_millis(10), Duration::from_secs(2)).await;
    regions.wait_fresh().await;
    let policy = fixed(4);
    let inner = tower::service_fn(|_: Request<()>| async {
        Ok::<_, std::convert::Infallible>(Response::new(String::from("ok")))
    });
    let layers: Vec<_> = regions
        .stores
        .iter()
        .map(|store| {
            RateLimitLayer::new(store.clone(), policy.clone(), GlobalKey::default())
                .on_failure(FailurePolicy::Closed)
        })
        .collect();
    let mut statuses = Vec::new();
    for i in 0..6 {
        let service = layers[i % 2].layer(inner);
        let response = service.oneshot(Request::new(())).await.expect("a response");
        statuses.push(response.status());
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            assert!(response.headers().contains_key("retry-after"));
        }
        // Further apart than one sync plus the lag on loopback.
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(ok, 4, "{statuses:?}");

    // A cost, two limits and a shadow policy, with their headers, on the
    // third region: a budget of 6 at cost 2 admits three requests; the
    // shadow policy (limit 1) is decided and counted but never refuses.
    let named = |name: &str, limit: u64| fixed_window(name, limit, Duration::from_secs(3600));
    let layer = RateLimitLayer::new(
        regions.stores[2].clone(),
        named("mr-costly", 6),
        GlobalKey::default(),
    )
    .cost(2)
    .and(ratelimit_tower::Rule::new(
        named("mr-hourly", 100),
        GlobalKey::default(),
    ))
    .and(ratelimit_tower::Rule::new(
        named("mr-shadow", 1).with_shadow(true),
        GlobalKey::default(),
    ));
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let response = layer
            .layer(inner)
            .oneshot(Request::new(()))
            .await
            .expect("a response");
        if response.status() == StatusCode::OK {
            assert!(response.headers().contains_key("ratelimit"), "{response:?}");
        }
        statuses.push(response.status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );

    regions.servers[0].stop();
    let response = layers[0]
        .layer(inner)
        .oneshot(Request::new(()))
        .await
        .expect("a response");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
}

/// With 100 ms between regions (the fault proxy's latency), uneven and even
/// traffic both stay within `limit` plus what the other regions admitted
/// during one sync interval plus one replication lag; the over-admission is
/// printed for BENCHMARKS.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_holds_with_100_ms_between_regions() {
    let sync = Duration::from_millis(100);
    let latency = Duration::from_millis(100);
    for (name, pick) in [
        (
            "80/10/10",
            (|i: usize| [0, 0, 0, 0, 0, 0, 0, 0, 1, 2][i % 10]) as fn(usize) -> usize,
        ),
        ("even", |i: usize| i % 3),
    ] {
        let regions = Regions::start(sync, Duration::from_secs(2)).await;
        for proxy in regions.proxies.iter().flatten().flatten() {
            proxy.set_latency(latency);
        }
        regions.wait_fresh().await;
        let limit = SHARED_LIMIT;
        // The lag: the proxy's latency plus a margin for loopback and scheduling.
        let lag = sync + latency + Duration::from_millis(30);
        let (per_region, total, extra) = within_the_bound(&regions, b"far", 600, pick, lag).await;
        eprintln!(
            "{name}, sync {sync:?}, {latency:?} between regions: admitted {per_region:?}, \
             total {total}, over-admission {}, bound {limit} + {extra}",
            total.saturating_sub(limit)
        );
    }
}

/// The point of it: a decision in the region's own Redis against one in a
/// global Redis 50 ms away (through the fault proxy). Prints the medians
/// and 99th percentiles for BENCHMARKS.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_decision_avoids_the_round_trip_to_a_global_redis() {
    use ratelimit_core::redis::RedisStore;

    let regions = Regions::start(Duration::from_millis(100), Duration::from_secs(2)).await;
    for proxy in regions.proxies.iter().flatten().flatten() {
        proxy.set_latency(Duration::from_millis(50));
    }
    regions.wait_fresh().await;
    let global_redis = RedisServer::start();
    let far = FaultProxy::start(global_redis.addr());
    far.set_latency(Duration::from_millis(50));
    let global =
        build(RedisStore::builder(far.redis_url()).call_timeout(Duration::from_secs(2))).await;
    let policy = fixed(1_000_000);
    // Warm up: connections, the ACL probe and script loads are not timed.
    regions.stores[0]
        .check(b"lat", &policy, 1)
        .await
        .expect("a decision");
    global.check(b"lat", &policy, 1).await.expect("a decision");
    let samples = 100;
    let mut local_times = Vec::with_capacity(samples);
    let mut global_times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = Instant::now();
        assert!(
            regions.stores[0]
                .check(b"lat", &policy, 1)
                .await
                .expect("a decision")
                .is_allowed()
        );
        local_times.push(start.elapsed());
        let start = Instant::now();
        assert!(
            global
                .check(b"lat", &policy, 1)
                .await
                .expect("a decision")
                .is_allowed()
        );
        global_times.push(start.elapsed());
    }
    local_times.sort();
    global_times.sort();
    let (local_p50, local_p99) = (local_times[samples / 2], local_times[samples * 99 / 100]);
    let (global_p50, global_p99) = (global_times[samples / 2], global_times[samples * 99 / 100]);
    eprintln!(
        "decision latency over {samples} sequential checks: local region p50 {local_p50:?} p99 {local_p99:?}; \
         global Redis 50 ms away p50 {global_p50:?} p99 {global_p99:?}"
    );
    assert!(global_p50 >= Duration::from_millis(50));
    assert!(local_p50 < Duration::from_millis(10), "{local_p50:?}");
}

/// Partitions are logged and counted: the staleness gauge per region and
/// peer, the count of stale transitions, and failed pushes.
#[test]
fn staleness_is_a_gauge_and_transitions_are_counted() {
    use ratelimit_core::metrics::{
        REGION_PEER_STALENESS, REGION_PUSH_FAILURES, REGION_STALE_TRANSITIONS,
    };
    use ratelimit_tests::metrics::capture;

    let ((), recorded) = capture(false, || async {
        let regions = Regions::start(Duration::from_millis(20), Duration::from_millis(200)).await;
        regions.wait_fresh().await;
        regions.isolate(0, Mode::Drop);
        let cut = Instant::now();
        while !regions.stores[0].peers().iter().all(|p| p.stale) {
            assert!(cut.elapsed() < Duration::from_secs(5), "never stale");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let _ = regions.stores[0].sync_now().await;
        let _ = regions.stores[1].sync_now().await;
    });
    let eu_us = [("region", "eu"), ("peer", "us")];
    let stale_for = recorded
        .gauge(REGION_PEER_STALENESS, &eu_us)
        .expect("a staleness gauge");
    assert!(stale_for > 0.2, "{stale_for}");
    let fresh = recorded
        .gauge(REGION_PEER_STALENESS, &[("region", "us"), ("peer", "ap")])
        .expect("a staleness gauge");
    assert!(fresh < 0.2, "{fresh}");
    assert_eq!(recorded.counter(REGION_STALE_TRANSITIONS, &eu_us), 1);
    assert_eq!(
        recorded.counter(
            REGION_STALE_TRANSITIONS,
            &[("region", "us"), ("peer", "ap")]
        ),
        0
    );
    assert!(recorded.counter(REGION_PUSH_FAILURES, &eu_us) > 0);
}

/// The README's three-region demo: three `redis-server`s, three
/// `distributed --region` instances, 15 requests 80/10/10 spaced further
/// apart than the sync interval: exactly the limit (10) passes across the
/// regions, the busy region far more than a third of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_distributed_example_serves_three_regions() {
    use ratelimit_tests::{free_port, spawn_example_lines};

    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut instances = Vec::new();
    for (i, name) in NAMES.iter().enumerate() {
        let listen = format!("127.0.0.1:{}", ports[i]);
        let redis = servers[i].url();
        let mut args: Vec<String> = vec![
            "--listen".into(),
            listen,
            "--redis".into(),
            redis,
            "--region".into(),
            (*name).into(),
            "--algorithm".into(),
            "fixed-window".into(),
            "--limit".into(),
            "10".into(),
            "--window".into(),
            "1h".into(),
        ];
        for (j, peer) in NAMES.iter().enumerate().filter(|(j, _)| *j != i) {
            args.push("--peer".into());
            args.push(format!("{peer}={}", servers[j].url()));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (child, lines) = spawn_example_lines("distributed", &args, 1, Duration::from_secs(120));
        assert!(lines[0].starts_with("listening on http://"), "{lines:?}");
        instances.push(child);
    }
    // Every region heard from every peer (a fresh region counts unheard
    // peers at their share): ten sync intervals.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let client = reqwest::Client::new();
    let mut passed = [0; 3];
    for i in 0..15 {
        let region = [0, 0, 0, 0, 0, 0, 0, 0, 1, 2][i % 10];
        let response = client
            .get(format!("http://127.0.0.1:{}/", ports[region]))
            .header("x-api-key", "demo")
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .expect("an answer");
        match response.status().as_u16() {
            200 => passed[region] += 1,
            429 => assert!(response.headers().contains_key("retry-after")),
            other => panic!("status {other}"),
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(passed.iter().sum::<usize>(), 10, "{passed:?}");
    assert!(passed[0] > 4, "{passed:?}");
}

/// Within one region (its peers idle), the store decides exactly as the
/// single-region algorithm: a timeline of costs across window boundaries
/// replayed on a `MemoryStore` and on one region gives the same decisions,
/// for the fixed window and the sliding window counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_region_decides_as_the_single_region_algorithm() {
    use ratelimit_core::MemoryStore;
    use ratelimit_tests::observable;

    let regions = Regions::start(Duration::from_millis(20), Duration::from_secs(60)).await;
    regions.wait_fresh().await;
    let memory = MemoryStore::builder().clock(regions.clock.clone()).build();
    let window = Duration::from_millis(1000);
    let policies = [
        fixed_window("one-fw", 5, window),
        named("one-swc", Policy::sliding_window_counter(5, window)),
    ];
    // Steps of 37 to 411 ms, costs 0 to 3: a fixed pseudo-random timeline.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut compared = 0;
    for _ in 0..120 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        regions
            .clock
            .advance(Duration::from_millis(37 + seed % 375));
        let cost = (seed >> 20) % 4;
        for policy in &policies {
            let ours = regions.stores[0]
                .check(b"same", policy, cost)
                .await
                .expect("a decision");
            let reference = memory
                .check(b"same", policy, cost)
                .await
                .expect("a decision");
            assert_eq!(
                observable(&ours),
                observable(&reference),
                "{policy:?} cost {cost}"
            );
            compared += 1;
        }
    }
    assert_eq!(compared, 240);
}
