//! `MultiRegionStore` on three real `redis-server`s, one per region, on
//! loopback: uneven traffic within the stated bound, spaced requests exact,
//! partitions through the fault proxy (each side within its conservative
//! share), healing (convergence, nothing lost), TTLs on every key; many
//! keys, several instances per region (one cut off from a peer), a lost
//! reply, clocks apart, reloads, peers that lost their data or scripts; the
//! lag and overshoot metrics.

use std::time::{Duration, Instant};

use ratelimit_core::clock::{Clock, ManualClock};
use ratelimit_core::multi_region::MultiRegionStore;
use ratelimit_core::{Check, Decision, Policy, Store, StoreError};
use ratelimit_tests::fault_proxy::{FaultProxy, Mode};
use ratelimit_tests::fixtures::fixed_window;
use ratelimit_tests::fixtures::ok_service;
use ratelimit_tests::{RedisServer, admits, build, named};

pub(crate) const NAMES: [&str; 3] = ["eu", "us", "ap"];
/// A fixed time (µs) a second into a window of an hour: the script clock,
/// so no test crosses a window boundary.
const T0: u64 = 1_800_000_000_000_000 + 1_000_000;
/// How often the regions of most tests sync: quick, so that each hears
/// from its peers within moments.
pub(crate) const SYNC: Duration = Duration::from_millis(20);

/// The staleness of tests that count the one skewed peer at its share and
/// every other peer as heard: long enough that a loaded machine never lets
/// the third region go stale between two syncs, which would count it at its
/// share too.
const STALENESS_LOADED: Duration = Duration::from_secs(30);

pub(crate) struct Regions {
    pub(crate) servers: Vec<RedisServer>,
    /// `proxies[from][to]`: the path from region `from` to `to`'s Redis
    /// (`None` on the diagonal).
    proxies: Vec<Vec<Option<FaultProxy>>>,
    pub(crate) stores: Vec<MultiRegionStore>,
    /// Region 0's script clock; every region's unless started apart.
    clock: ManualClock,
    /// Each region's script clock.
    clocks: Vec<ManualClock>,
    sync: Duration,
    staleness: Duration,
    /// The most outbox entries a round reads, when not the store's own.
    round: Option<usize>,
}

impl Regions {
    async fn start(sync: Duration, staleness: Duration) -> Regions {
        Self::start_apart(sync, staleness, [0; 3]).await
    }

    /// [`start`](Self::start), then waits until every region has heard
    /// from every peer.
    pub(crate) async fn start_fresh(sync: Duration, staleness: Duration) -> Regions {
        let regions = Self::start(sync, staleness).await;
        regions.wait_fresh().await;
        regions
    }

    /// Three regions whose script clocks read `T0 + ahead[i]` µs (one
    /// shared clock when they are all equal).
    async fn start_apart(sync: Duration, staleness: Duration, ahead: [u64; 3]) -> Regions {
        Self::launch(sync, staleness, ahead, None).await
    }

    /// [`start`](Self::start), with rounds of at most `round` entries.
    async fn start_with_round(sync: Duration, staleness: Duration, round: usize) -> Regions {
        Self::launch(sync, staleness, [0; 3], Some(round)).await
    }

    async fn launch(
        sync: Duration,
        staleness: Duration,
        ahead: [u64; 3],
        round: Option<usize>,
    ) -> Regions {
        let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
        let proxies: Vec<Vec<Option<FaultProxy>>> = (0..3)
            .map(|from| {
                (0..3)
                    .map(|to| (from != to).then(|| FaultProxy::start(servers[to].addr())))
                    .collect()
            })
            .collect();
        let clock = ManualClock::new(T0 + ahead[0]);
        let clocks: Vec<ManualClock> = ahead
            .iter()
            .map(|&a| {
                if a == ahead[0] {
                    clock.clone()
                } else {
                    ManualClock::new(T0 + a)
                }
            })
            .collect();
        let mut regions = Regions {
            servers,
            proxies,
            stores: Vec::new(),
            clock,
            clocks,
            sync,
            staleness,
            round,
        };
        for i in 0..3 {
            let urls: Vec<Option<String>> = regions.proxies[i]
                .iter()
                .map(|p| p.as_ref().map(FaultProxy::redis_url))
                .collect();
            let store = regions
                .builder(i, regions.servers[i].url(), &urls)
                .build()
                .await
                .expect("a multi-region store");
            regions.stores.push(store);
        }
        regions
    }

    /// The builder of one instance of region `i`, deciding in `local` and
    /// reaching each peer `j` at `peers[j]`.
    fn builder(
        &self,
        i: usize,
        local: String,
        peers: &[Option<String>],
    ) -> ratelimit_core::multi_region::MultiRegionStoreBuilder {
        let mut builder = MultiRegionStore::builder(NAMES[i], local)
            .sync(self.sync)
            .staleness(self.staleness)
            .call_timeout(Duration::from_secs(2))
            .push_timeout(Duration::from_millis(500))
            .script_clock_for_tests(self.clocks[i].clone());
        if let Some(round) = self.round {
            builder = builder.round_entries_for_tests(round);
        }
        for (j, peer) in NAMES.iter().enumerate() {
            if let Some(url) = &peers[j] {
                builder = builder
                    .peer(*peer, url.clone())
                    .peer_script_clock_for_tests(*peer, self.clocks[j].clone());
            }
        }
        builder
    }

    /// Another instance of region `i`, with proxies of its own to each peer
    /// (`None` on the diagonal), deciding in `local` (its region's Redis
    /// when `None`).
    pub(crate) async fn instance(
        &self,
        i: usize,
        local: Option<String>,
        call_timeout: Duration,
    ) -> (MultiRegionStore, Vec<Option<FaultProxy>>) {
        let proxies: Vec<Option<FaultProxy>> = (0..3)
            .map(|j| (i != j).then(|| FaultProxy::start(self.servers[j].addr())))
            .collect();
        let urls: Vec<Option<String>> = proxies
            .iter()
            .map(|p| p.as_ref().map(FaultProxy::redis_url))
            .collect();
        let store = self
            .builder(i, local.unwrap_or_else(|| self.servers[i].url()), &urls)
            .call_timeout(call_timeout)
            .build()
            .await
            .expect("a multi-region store");
        (store, proxies)
    }

    /// Waits (at most 10 s) until region `to` has heard from region `from`
    /// since `since`: everything `from` admitted before `since` has landed
    /// in `to`'s Redis, and `to` counts `from` at what it sent (not at its
    /// share). Returns how long after `since` that was.
    pub(crate) async fn wait_heard_since(
        &self,
        to: usize,
        from: usize,
        since: Instant,
    ) -> Duration {
        self.wait_heard_within(to, from, since, Duration::from_secs(10))
            .await
    }

    /// Waits until `eu` has heard from `us` since `since`, then asserts
    /// that none of `keys` has budget left in `eu` under `policy`.
    pub(crate) async fn assert_eu_heard_all(
        &self,
        policy: &Policy,
        keys: &[String],
        since: Instant,
    ) {
        self.wait_heard_since(0, 1, since).await;
        assert_eq!(with_budget_left(&self.stores[0], policy, keys).await, 0);
    }

    /// [`Regions::wait_heard_since`], waiting at most `limit`.
    async fn wait_heard_within(
        &self,
        to: usize,
        from: usize,
        since: Instant,
        limit: Duration,
    ) -> Duration {
        loop {
            let elapsed = since.elapsed();
            let _ = self.stores[to].sync_now().await;
            let status = self.stores[to]
                .peers()
                .into_iter()
                .find(|p| p.region == NAMES[from])
                .expect("a peer");
            if !status.stale && status.last_heard.is_some_and(|age| age < elapsed) {
                return since.elapsed();
            }
            assert!(
                elapsed < limit,
                "{} never heard from {} within {limit:?}: {status:?}",
                NAMES[to],
                NAMES[from]
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
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

    /// Waits (at most 5 s) until region `to` has found region `from`'s
    /// clock too far off, and counts it at its share.
    async fn wait_skewed(&self, to: usize, from: usize) {
        let start = Instant::now();
        loop {
            let status = self.stores[to]
                .peers()
                .into_iter()
                .find(|p| p.region == NAMES[from])
                .expect("a peer");
            if status.skewed && status.stale {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{} never found {}'s clock off: {status:?}",
                NAMES[to],
                NAMES[from]
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
    pub(crate) fn fields(&self, i: usize, hash: &str) -> Vec<(String, u64)> {
        let out = self.servers[i].cli(&["HGETALL", hash]);
        let lines: Vec<&str> = out.lines().collect();
        let mut fields: Vec<(String, u64)> = lines
            .chunks_exact(2)
            .map(|p| (p[0].to_owned(), p[1].parse().expect("a count")))
            .collect();
        fields.sort();
        fields
    }

    pub(crate) fn assert_every_key_has_a_ttl(&self) {
        for server in &self.servers {
            let keys = server.cli(&["--scan", "--pattern", "*"]);
            for key in keys.lines().filter(|k| !k.is_empty()) {
                let ttl: i64 = server.cli(&["PTTL", key]).parse().expect("a TTL");
                assert!(ttl > 0 || ttl == -2, "{key} has no TTL ({ttl})");
            }
        }
    }
}

pub(crate) fn fixed(limit: usize) -> Policy {
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
    let regions = Regions::start_fresh(sync, Duration::from_secs(2)).await;
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

/// Requests in turn in each region, each sent once every other region has
/// heard the last admission: the regions together admit the limit exactly.
/// (Waiting for a count, not for a fixed gap: on a loaded machine a push can
/// take longer than any gap.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spaced_requests_admit_the_limit_exactly() {
    let sync = Duration::from_millis(10);
    let regions = Regions::start_fresh(sync, Duration::from_secs(2)).await;
    let limit = 12;
    let policy = fixed(limit);
    let mut admitted = [0; 3];
    for i in 0..30 {
        let region = i % 3;
        let decision = regions.stores[region]
            .check(b"spaced", &policy, 1)
            .await
            .expect("a decision");
        if decision.is_allowed() {
            admitted[region] += 1;
            let written = Instant::now();
            for to in (0..3).filter(|&to| to != region) {
                regions.wait_heard_since(to, region, written).await;
            }
        }
    }
    assert_eq!(admitted.iter().sum::<usize>(), limit, "{admitted:?}");
}

/// Several limits of one request are all or nothing within the region;
/// algorithms whose state is not a count per window are refused clearly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_all_is_all_or_nothing_and_other_algorithms_are_refused() {
    let regions = Regions::start_fresh(SYNC, Duration::from_secs(2)).await;
    let small = fixed(2);
    let large = named(
        "mr-large",
        Policy::sliding_window_counter(10, Duration::from_secs(3600)),
    );
    let store = &regions.stores[0];
    let both = [Check::new(b"k", &small, 1), Check::new(b"k", &large, 1)];
    for _ in 0..2 {
        let decisions = store.check_all(&both).await.expect("decisions");
        assert!(decisions.iter().all(Decision::is_allowed));
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

/// The error `store` answers a request of `j` under `other` and of `key`
/// twice, under the policies and costs of `twice`.
async fn refused(
    store: &MultiRegionStore,
    other: &Policy,
    key: &[u8],
    twice: [(&Policy, u64); 2],
) -> StoreError {
    let [(a, a_cost), (b, b_cost)] = twice;
    let checks = [
        Check::new(b"j", other, 1),
        Check::new(key, a, a_cost),
        Check::new(key, b, b_cost),
    ];
    store.check_all(&checks).await.expect_err("refused")
}

/// Two checks of one key under one policy in a request (overlapping
/// rules) are one check of their summed cost, and both get its decision;
/// the same name with other numbers twice, or a sum above the limit, is
/// refused before anything is counted, the other limits of the request
/// included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_checks_are_one_check_of_their_summed_cost() {
    let regions = Regions::start_fresh(SYNC, Duration::from_secs(2)).await;
    let store = &regions.stores[0];
    let five = fixed(5);
    let other = named(
        "mr-other",
        Policy::fixed_window(10, Duration::from_secs(3600)),
    );
    let checks = [
        Check::new(b"k", &five, 1),
        Check::new(b"j", &other, 1),
        Check::new(b"k", &five, 2),
    ];
    let remaining = |decisions: &[Decision]| -> Vec<(bool, u64)> {
        decisions
            .iter()
            .map(|d| (d.is_allowed(), d.remaining()))
            .collect()
    };
    let first = store.check_all(&checks).await.expect("decisions");
    assert_eq!(remaining(&first), [(true, 2), (true, 9), (true, 2)]);
    // 3 more of the 2 left: denied together, and `other` only peeked.
    let second = store.check_all(&checks).await.expect("decisions");
    assert_eq!(remaining(&second), [(false, 2), (true, 9), (false, 2)]);

    let seven = fixed(7);
    let error = refused(store, &other, b"c", [(&five, 1), (&seven, 1)]).await;
    assert!(
        matches!(&error, StoreError::PolicyConflict { policy } if policy == "mr"),
        "{error:?}"
    );
    let error = refused(store, &other, b"s", [(&five, 3), (&five, 3)]).await;
    assert!(
        matches!(
            error,
            StoreError::CostExceedsLimit {
                cost: 6,
                max: 5,
                ..
            }
        ),
        "{error:?}"
    );
    for (key, policy, left) in [
        (&b"j"[..], &other, 9),
        (b"k", &five, 2),
        (b"c", &five, 5),
        (b"s", &five, 5),
    ] {
        let peek = store.check(key, policy, 0).await.expect("a peek");
        assert_eq!(peek.remaining(), left, "{}", String::from_utf8_lossy(key));
    }
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
    let regions = Regions::start_fresh(sync, staleness).await;
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

/// The merge counts what it had not heard: a replayed, duplicated or late
/// push (a smaller count arriving after a larger one) adds nothing; what
/// is new is added in the window of the receiving Redis's clock; the hash
/// and the units by policy both get a TTL.
#[test]
fn merges_are_idempotent_and_ignore_late_smaller_counts() {
    let server = RedisServer::start();
    // As the store sends it: the shared helpers, then the merge.
    let merge = concat!(
        include_str!("../../crates/ratelimit-core/src/redis/lua/numbers.lua"),
        "\n",
        include_str!("../../crates/ratelimit-core/src/multi_region/lua/fields.lua"),
        "\n",
        include_str!("../../crates/ratelimit-core/src/multi_region/lua/merge.lua")
    );
    let window = 3_600_000_000u64;
    let start = T0 - T0 % window;
    let hash = "ratelimit:mr:{k}:mr";
    let push = |value: u64| {
        server.cli(&[
            "EVAL",
            merge,
            "3",
            "ratelimit:mr:arrived:us",
            "ratelimit:mr:rounds:us",
            hash,
            "us",
            "1",
            &T0.to_string(),
            "1000000",
            "ratelimit",
            "round-1",
            &start.to_string(),
            &window.to_string(),
            &value.to_string(),
        ])
    };
    assert_eq!(push(5), "5");
    assert_eq!(push(3), "0", "a late, smaller count changes nothing");
    assert_eq!(push(5), "0", "a duplicate changes nothing");
    assert_eq!(push(7), "2");
    let counted = format!("us:{start}:{window}");
    assert_eq!(server.cli(&["HGET", hash, &counted]), "7");
    assert_eq!(
        server.cli(&["HGET", "ratelimit:mr:arrived:us", "mr"]),
        "7",
        "units by policy"
    );
    assert_eq!(
        server.cli(&["HGET", "ratelimit:mr:rounds:us", "round-1"]),
        "4"
    );
    for key in [hash, "ratelimit:mr:arrived:us", "ratelimit:mr:rounds:us"] {
        let ttl: i64 = server.cli(&["PTTL", key]).parse().expect("a TTL");
        assert!(ttl > 0, "{key}: {ttl}");
    }
}

/// The tower layer works unchanged on top: one limit across two regions'
/// layers, 429 with `Retry-After` once the shared budget is used, and the
/// failure policy when the region's own Redis is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_works_unchanged_on_top() {
    use http::{Request, StatusCode};
    use ratelimit_tower::{FailurePolicy, GlobalKey, RateLimitLayer};
    use tower::{Layer, ServiceExt};

    let mut regions = Regions::start_fresh(Duration::from_millis(10), Duration::from_secs(2)).await;
    let policy = fixed(4);
    let inner = ok_service();
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
        assert!(admits(&regions.stores[0], b"lat", &policy).await);
        local_times.push(start.elapsed());
        let start = Instant::now();
        assert!(admits(&global, b"lat", &policy).await);
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
    // Measured side by side, so a loaded machine slows both: the local
    // decision crosses no 50 ms link.
    assert!(
        local_p50 * 5 < global_p50,
        "local {local_p50:?}, global {global_p50:?}"
    );
}

/// Partitions are logged and counted: the lag gauge per region and peer
/// (growing while a peer is cut off), the count of stale transitions, and
/// failed rounds.
#[test]
fn the_lag_is_a_gauge_and_stale_transitions_are_counted() {
    use ratelimit_tests::metrics::{
        REGION_PEER_LAG, REGION_PUSH_FAILURES, REGION_STALE_TRANSITIONS, capture,
    };

    let ((), recorded) = capture(false, || async {
        let regions = Regions::start_fresh(SYNC, Duration::from_millis(200)).await;
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
        .gauge(REGION_PEER_LAG, &eu_us)
        .expect("a staleness gauge");
    assert!(stale_for > 0.2, "{stale_for}");
    let fresh = recorded
        .gauge(REGION_PEER_LAG, &[("region", "us"), ("peer", "ap")])
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
            "1000d".into(),
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

/// The next step of a fixed pseudo-random timeline (xorshift), which
/// `seed` keeps.
fn next_seed(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// `store` decides `cost` on `key` as `expected` (as far as a caller
/// sees); returns its decision.
async fn assert_decides_as(
    store: &MultiRegionStore,
    key: &[u8],
    policy: &Policy,
    cost: u64,
    expected: &Decision,
    what: &str,
) -> Decision {
    let ours = store.check(key, policy, cost).await.expect("a decision");
    assert_eq!(
        ratelimit_tests::observable(&ours),
        ratelimit_tests::observable(expected),
        "{what}"
    );
    ours
}

/// Within one region (its peers idle), the store decides exactly as the
/// single-region algorithm: a timeline of costs across window boundaries
/// replayed on a `MemoryStore` and on one region gives the same decisions,
/// for the fixed window and the sliding window counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_region_decides_as_the_single_region_algorithm() {
    use ratelimit_core::MemoryStore;

    let regions = Regions::start_fresh(SYNC, Duration::from_secs(60)).await;
    let memory = MemoryStore::builder().clock(regions.clock.clone()).build();
    let window = Duration::from_millis(1000);
    let policies = [
        fixed_window("one-fw", 5, window),
        named("one-swc", Policy::sliding_window_counter(5, window)),
    ];
    // Steps of 37 to 411 ms, costs 0 to 3: a fixed pseudo-random timeline.
    let mut timeline: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut compared = 0;
    for _ in 0..120 {
        let seed = next_seed(&mut timeline);
        regions
            .clock
            .advance(Duration::from_millis(37 + seed % 375));
        let cost = (seed >> 20) % 4;
        for policy in &policies {
            let reference = memory
                .check(b"same", policy, cost)
                .await
                .expect("a decision");
            let what = format!("{policy:?} cost {cost}");
            assert_decides_as(&regions.stores[0], b"same", policy, cost, &reference, &what).await;
            compared += 1;
        }
    }
    assert_eq!(compared, 240);
}

/// How many of `keys` region `i` admits once each, at cost 1.
pub(crate) async fn admitted_once_each(
    store: &MultiRegionStore,
    policy: &Policy,
    keys: &[String],
) -> usize {
    let mut admitted = 0;
    for key in keys {
        let decision = store
            .check(key.as_bytes(), policy, 1)
            .await
            .expect("a decision");
        if decision.is_allowed() {
            admitted += 1;
        }
    }
    admitted
}

/// Many keys, 50 ms between regions, two instances in `us`, one of them
/// cut off from `eu` by a proxy: a peer counts as heard only once every
/// count it admitted before has landed, whichever instance admitted it, so
/// 3,000 clients that each spent their limit of 1 in `us` (half through
/// the cut-off instance) are all refused in `eu` as soon as `eu` has heard
/// from `us` since. The time that took (the lag `D` with 3,000 keys in one
/// round) and the other instance's backlog are printed for BENCHMARKS.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_is_heard_only_once_all_its_counts_landed() {
    let sync = Duration::from_millis(20);
    let regions = Regions::start(sync, Duration::from_secs(2)).await;
    for proxy in regions.proxies.iter().flatten().flatten() {
        proxy.set_latency(Duration::from_millis(50));
    }
    let (cut, proxies) = regions.instance(1, None, Duration::from_secs(2)).await;
    for proxy in proxies.iter().flatten() {
        proxy.set_latency(Duration::from_millis(50));
    }
    if let Some(proxy) = &proxies[0] {
        proxy.set_mode(Mode::Drop);
    }
    regions.wait_fresh().await;
    let policy = fixed(1);
    let keys: Vec<String> = (0..3_000).map(|i| format!("client-{i}")).collect();
    // Admitted at once, half through each instance: one round carries
    // them all.
    let started = Instant::now();
    for (i, chunk) in keys.chunks(1_500).enumerate() {
        let store = if i % 2 == 0 { &regions.stores[1] } else { &cut };
        admit_all(store, &policy, chunk, 1).await;
    }
    let done = Instant::now();
    // When the last count admitted landed in eu, watched meanwhile with peeks.
    let landed = {
        let (eu, policy) = (regions.stores[0].clone(), policy.clone());
        let last = keys[keys.len() - 1].clone();
        tokio::spawn(async move {
            loop {
                let peek = eu.check(last.as_bytes(), &policy, 0).await.expect("a peek");
                if peek.remaining() == 0 {
                    return done.elapsed();
                }
                assert!(done.elapsed() < Duration::from_secs(10), "never landed");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let lag = regions.wait_heard_since(0, 1, done).await;
    let unseen = with_budget_left(&regions.stores[0], &policy, &keys).await;
    let status = regions.stores[0].peers();
    let landed = landed.await.expect("the watch");
    eprintln!(
        "3,000 keys admitted in us in {:?} (two instances, one cut off from eu); the last one \
         landed in eu {landed:?} later, and eu heard us since {lag:?} later (sync {sync:?}, \
         50 ms between regions)",
        done - started
    );
    assert_eq!(
        unseen, 0,
        "eu still had budget for clients that us had admitted: {status:?}"
    );
    assert!(status.iter().all(|p| !p.stale), "{status:?}");
    let cut_status = cut.peers();
    assert!(
        cut_status.iter().any(|p| p.region == "eu" && !p.reachable),
        "{cut_status:?}"
    );
}

/// One `check_all` of every key of `keys` at `cost`, which admits them all.
pub(crate) async fn admit_all(
    store: &MultiRegionStore,
    policy: &Policy,
    keys: &[String],
    cost: u64,
) {
    let checks: Vec<Check<'_>> = keys
        .iter()
        .map(|k| Check::new(k.as_bytes(), policy, cost))
        .collect();
    let decisions = store.check_all(&checks).await.expect("decisions");
    assert!(
        decisions.iter().all(Decision::is_allowed),
        "{cost} on each of {} keys from {:?}: {decisions:?}",
        keys.len(),
        keys.first()
    );
}

/// How many of `keys` still have budget in `store`, peeked at once (cost 0,
/// 500 keys per call).
pub(crate) async fn with_budget_left(
    store: &MultiRegionStore,
    policy: &Policy,
    keys: &[String],
) -> usize {
    let mut left = 0;
    for chunk in keys.chunks(500) {
        let checks: Vec<Check<'_>> = chunk
            .iter()
            .map(|k| Check::new(k.as_bytes(), policy, 0))
            .collect();
        let decisions = store.check_all(&checks).await.expect("decisions");
        left += decisions.iter().filter(|d| d.remaining() > 0).count();
    }
    left
}

/// Two instances in `us`, one cut off from `eu`: what it admits reaches
/// `eu` through its region (or `eu` counts `us` at its share), never
/// neither: `eu` admits nothing more of a limit the cut-off instance spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_cut_off_from_a_peer_is_heard_through_its_region() {
    let regions = Regions::start_fresh(SYNC, Duration::from_millis(300)).await;
    let (cut, proxies) = regions.instance(1, None, Duration::from_secs(2)).await;
    if let Some(proxy) = &proxies[0] {
        proxy.set_mode(Mode::Drop);
    }
    let policy = fixed(5);
    let keys: Vec<String> = (0..5).map(|_| String::from("cut")).collect();
    assert_eq!(admitted_once_each(&cut, &policy, &keys).await, 5);
    let done = Instant::now();
    regions.wait_heard_since(0, 1, done).await;
    // Well past the staleness too: the answer does not change with time.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let admitted = admitted_once_each(&regions.stores[0], &policy, &keys).await;
    assert_eq!(
        admitted, 0,
        "eu never learnt what the cut-off instance admitted"
    );
}

/// A window changed under one policy name keeps what was counted, as the
/// single-region stores do: 5 per hour spent, reloaded as 5 per 7 min,
/// nothing more passes where `MemoryStore` on the same timeline admits
/// nothing; and the other way, for both algorithms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_change_under_one_name_keeps_what_was_counted() {
    use ratelimit_core::MemoryStore;

    let regions = Regions::start_fresh(SYNC, Duration::from_secs(60)).await;
    let memory = MemoryStore::builder().clock(regions.clock.clone()).build();
    let hour = Duration::from_secs(3600);
    let seven = Duration::from_secs(420);
    let timelines = [
        (
            fixed_window("reload-fw", 5, hour),
            fixed_window("reload-fw", 5, seven),
        ),
        (
            named("reload-swc", Policy::sliding_window_counter(5, hour)),
            named("reload-swc", Policy::sliding_window_counter(5, seven)),
        ),
        (
            fixed_window("reload-up", 5, seven),
            fixed_window("reload-up", 5, hour),
        ),
    ];
    for (before, after) in &timelines {
        let key = before.name().as_bytes();
        for policy in [before, after] {
            let mut admitted = 0;
            for _ in 0..6 {
                regions.clock.advance(Duration::from_millis(300));
                let reference = memory.check(key, policy, 1).await.expect("a decision");
                let what = format!("{policy:?}");
                let ours =
                    assert_decides_as(&regions.stores[0], key, policy, 1, &reference, &what).await;
                admitted += usize::from(ours.is_allowed());
            }
            let expected = if std::ptr::eq(policy, before) { 5 } else { 0 };
            assert_eq!(admitted, expected, "{policy:?}");
        }
    }
}

/// A peer whose clock is two windows ahead pushes one count: this region's
/// own count of its current window stays, and nothing more passes. The
/// skew is found, and the peer counted at its share (2 of 5) meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_ahead_never_erases_this_regions_counts() {
    let hour: u64 = 3_600_000_000;
    let regions = Regions::start_apart(SYNC, STALENESS_LOADED, [0, 2 * hour, 0]).await;
    regions.wait_skewed(0, 1).await;
    regions.wait_heard_since(0, 2, Instant::now()).await;
    let policy = fixed(5);
    let keys: Vec<String> = (0..5).map(|_| String::from("ahead")).collect();
    assert_eq!(
        admitted_once_each(&regions.stores[0], &policy, &keys).await,
        3
    );
    let own = format!("eu:{}:3600000000", T0 - T0 % hour);
    a_pushed_count_keeps(&regions, &policy, &keys, (own, 3), "own count").await;
}

/// `us` admits one of `keys` (all one key) and both regions sync: `eu`
/// still holds `kept` (a field and its count) and admits none of `keys`.
async fn a_pushed_count_keeps(
    regions: &Regions,
    policy: &Policy,
    keys: &[String],
    kept: (String, u64),
    what: &str,
) {
    assert_eq!(
        admitted_once_each(&regions.stores[1], policy, &keys[..1]).await,
        1
    );
    let _ = regions.stores[1].sync_now().await;
    let _ = regions.stores[0].sync_now().await;
    let hash = regions.stores[0].state_key(keys[0].as_bytes(), policy);
    assert!(
        regions.fields(0, &hash).contains(&kept),
        "eu's {what} was erased by the peer: {:?}",
        regions.fields(0, &hash)
    );
    assert_eq!(
        admitted_once_each(&regions.stores[0], policy, keys).await,
        0
    );
}

/// The sliding window counter at a boundary: a peer a little ahead, already
/// in the next window, pushes one count; this region's previous window
/// (which still weighs) is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_past_a_boundary_keeps_the_previous_window() {
    let hour: u64 = 3_600_000_000;
    // eu at 30 min into the window before T0's; us already an hour ahead.
    let regions = Regions::start_apart(SYNC, STALENESS_LOADED, [0, hour + 6 * 60_000_000, 0]).await;
    regions.clock.set(T0 - hour / 2);
    regions.wait_skewed(0, 1).await;
    regions.wait_heard_since(0, 2, Instant::now()).await;
    let policy = named(
        "mr-swc",
        Policy::sliding_window_counter(10, Duration::from_secs(3600)),
    );
    let keys: Vec<String> = (0..10).map(|_| String::from("boundary")).collect();
    // us counted at its share (4 of 10): 6 pass.
    assert_eq!(
        admitted_once_each(&regions.stores[0], &policy, &keys).await,
        6
    );
    // 6 min into eu's next window: the previous 6 weigh 5.4.
    regions.clock.set(T0 + 6 * 60_000_000);
    let previous = format!("eu:{}:3600000000", T0 - T0 % hour - hour);
    a_pushed_count_keeps(&regions, &policy, &keys, (previous, 6), "previous window").await;
}

/// A decision whose reply was lost (the call timed out after the script
/// ran) still reaches the peers: `eu` refuses the key once it has heard
/// from `us` since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_whose_reply_was_lost_still_reaches_the_peers() {
    let regions = Regions::start_fresh(SYNC, Duration::from_secs(2)).await;
    let slow = FaultProxy::start(regions.servers[1].addr());
    let (lost, _proxies) = regions
        .instance(1, Some(slow.redis_url()), Duration::from_millis(200))
        .await;
    let policy = fixed(1);
    // Warm: the script loaded and the connection made.
    let _ = lost.check(b"warm", &policy, 0).await.expect("a peek");
    slow.set_latency(Duration::from_millis(600));
    let error = lost
        .check(b"lost", &policy, 1)
        .await
        .expect_err("a timeout");
    assert!(error.is_outage(), "{error}");
    slow.set_latency(Duration::ZERO);
    // The script ran: us holds the count.
    let peek = regions.stores[1]
        .check(b"lost", &policy, 0)
        .await
        .expect("a peek");
    assert_eq!(peek.remaining(), 0);
    let done = Instant::now();
    regions.wait_heard_since(0, 1, done).await;
    let decision = regions.stores[0]
        .check(b"lost", &policy, 1)
        .await
        .expect("a decision");
    assert!(
        !decision.is_allowed(),
        "eu never heard of the count whose reply was lost"
    );
}

/// A decision never shortens the TTL a peer's count needs: after a merge of
/// an hourly count, a decision under a shorter window of the same name
/// leaves the hash's TTL at least as long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_never_shortens_a_peers_ttl() {
    let regions = Regions::start_fresh(SYNC, Duration::from_secs(2)).await;
    let hourly = fixed_window("mr-ttl", 5, Duration::from_secs(3600));
    let short = fixed_window("mr-ttl", 5, Duration::from_secs(60));
    assert!(admits(&regions.stores[1], b"ttl", &hourly).await);
    let _ = regions.stores[1].sync_now().await;
    let hash = regions.stores[0].state_key(b"ttl", &hourly);
    let before: i64 = regions.servers[0]
        .cli(&["PTTL", &hash])
        .parse()
        .expect("a TTL");
    assert!(before > 3_600_000, "{before}");
    let _ = regions.stores[0]
        .check(b"ttl", &short, 1)
        .await
        .expect("a decision");
    let after: i64 = regions.servers[0]
        .cli(&["PTTL", &hash])
        .parse()
        .expect("a TTL");
    assert!(
        after + 1_000 >= before,
        "the TTL went from {before} to {after} ms"
    );
}

/// The script reads a hash's fields as `counts::view` does: after traffic
/// in two regions and reloads of two policies (other windows and limits
/// under the same names), every decision of `eu` equals the one computed
/// in Rust from the hash's fields read just before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_script_reads_fields_as_counts_view_does() {
    use ratelimit_core::multi_region::counts::{self, Count};

    let regions = Regions::start_fresh(SYNC, Duration::from_secs(60)).await;
    let ms = Duration::from_millis;
    let fixed_variants = [
        fixed_window("view-fw", 5, ms(1000)),
        fixed_window("view-fw", 8, ms(2500)),
        fixed_window("view-fw", 3, ms(400)),
    ];
    let sliding_variants = [
        named("view-swc", Policy::sliding_window_counter(6, ms(1000))),
        named("view-swc", Policy::sliding_window_counter(9, ms(3000))),
        named("view-swc", Policy::sliding_window_counter(4, ms(700))),
    ];
    // Counts from us first, heard in eu.
    for policy in [&fixed_variants[0], &sliding_variants[0]] {
        for _ in 0..2 {
            let _ = regions.stores[1]
                .check(b"view", policy, 1)
                .await
                .expect("a decision");
        }
    }
    let since = Instant::now();
    regions.wait_heard_since(0, 1, since).await;
    let mut timeline: u64 = 0x2545_f491_4f6c_dd1d;
    let mut compared = 0;
    for _ in 0..150 {
        let seed = next_seed(&mut timeline);
        regions.clock.advance(ms(20 + seed % 300));
        let variants = if seed.is_multiple_of(2) {
            &fixed_variants
        } else {
            &sliding_variants
        };
        let policy = &variants[usize::try_from((seed >> 8) % 3).expect("an index")];
        let cost = (seed >> 16) % 3;
        let hash = regions.stores[0].state_key(b"view", policy);
        let counts: Vec<Count> = regions
            .fields(0, &hash)
            .into_iter()
            .filter_map(|(name, value)| {
                let mut parts = name.split(':');
                let region = parts.next()?;
                let start = parts.next()?.parse().ok()?;
                let window = parts.next()?.parse().ok()?;
                (!region.contains('@')).then(|| Count::new(region, start, window, value))
            })
            .collect();
        let now = regions.clock.now();
        let window = policy.algorithm().window_micros();
        let share = counts::conservative_share(policy.limit(), 3);
        let (start, global) = counts::view("eu", &counts, window, now, &[], share);
        let expected = counts::decide(policy, start, now, cost, global).expect("supported");
        let what = format!("{policy:?} cost {cost} at {now}: {counts:?}");
        assert_decides_as(&regions.stores[0], b"view", policy, cost, &expected, &what).await;
        compared += 1;
    }
    assert_eq!(compared, 150);
}

/// The operator sees `D` and its cost: the lag of each peer and the
/// overshoot estimate per policy are recorded (no label carries a key), and
/// a peer's clock offset is reported.
#[test]
fn the_lag_and_the_overshoot_estimate_are_recorded_per_peer_and_policy() {
    use ratelimit_tests::metrics::{REGION_OVERSHOOT, REGION_PEER_LAG, REGION_PEER_SKEW, capture};

    let (estimate, recorded) = capture(false, || async {
        let regions = Regions::start(SYNC, Duration::from_secs(2)).await;
        for proxy in regions.proxies.iter().flatten().flatten() {
            proxy.set_latency(Duration::from_millis(50));
        }
        regions.wait_fresh().await;
        let policy = fixed(1_000_000);
        // About 1,000 units a second in us, on 50 keys, for half a second.
        let started = Instant::now();
        let mut i = 0u64;
        while started.elapsed() < Duration::from_millis(500) {
            let key = format!("secret-tenant-{}", i % 50);
            let _ = regions.stores[1]
                .check(key.as_bytes(), &policy, 10)
                .await
                .expect("a decision");
            i += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = regions.stores[0].sync_now().await;
        regions.stores[0].overshoot_estimate()
    });
    let lag = recorded
        .gauge(REGION_PEER_LAG, &[("region", "eu"), ("peer", "us")])
        .expect("a lag gauge");
    assert!(lag > 0.0 && lag < 2.0, "{lag}");
    let overshoot = recorded
        .gauge(REGION_OVERSHOOT, &[("region", "eu"), ("policy", "mr")])
        .expect("an overshoot estimate");
    assert!(overshoot > 0.0, "{overshoot}");
    assert_eq!(estimate.get("mr").copied(), Some(overshoot));
    let skew = recorded
        .gauge(REGION_PEER_SKEW, &[("region", "eu"), ("peer", "us")])
        .expect("a skew gauge");
    assert!(skew.abs() < 1.0, "{skew}");
    let labels = recorded.label_values();
    assert!(
        labels.iter().all(|l| !l.contains("secret-tenant")),
        "{labels:?}"
    );
}

/// A backlog longer than one round is delivered over several rounds, and
/// only the round that reaches its end marks `us` heard: 5,000 clients
/// spent in `us` while it could not reach `eu` (from the start, so the first
/// rounds deliver into an `eu` that never heard of `us`), in rounds of
/// 2,048 entries (the store's own are 65,536), are all refused in `eu` once
/// it has heard from `us` since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_longer_than_a_round_is_delivered_over_rounds() {
    const ROUND: usize = 2_048;
    const CLIENTS: usize = 5_000;
    let regions = Regions::start_with_round(SYNC, Duration::from_secs(2), ROUND).await;
    let path = regions.proxies[1][0]
        .as_ref()
        .expect("a path from us to eu");
    path.set_mode(Mode::Drop);
    // us hears from its peers (the other way is open).
    let start = Instant::now();
    while !regions.stores[1].peers().iter().all(|p| !p.stale) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "us never heard its peers"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Each client spends its whole limit of 3: a peer counted at its share
    // (1) would still leave budget.
    let policy = fixed(3);
    let keys: Vec<String> = (0..CLIENTS).map(|i| format!("c{i}")).collect();
    for chunk in keys.chunks(1_000) {
        admit_all(&regions.stores[1], &policy, chunk, 3).await;
    }
    path.set_mode(Mode::Forward);
    let done = Instant::now();
    regions.assert_eu_heard_all(&policy, &keys, done).await;
}

/// A peer whose Redis lost its data (restarted without persistence) gets
/// the whole outbox again before it counts this region as heard: `eu`
/// restarted refuses the clients `us` spent before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_lost_its_data_gets_everything_again() {
    let mut regions = Regions::start_fresh(SYNC, Duration::from_millis(500)).await;
    let policy = fixed(3);
    let keys: Vec<String> = (0..200).map(|i| format!("before-{i}")).collect();
    admit_all(&regions.stores[1], &policy, &keys, 3).await;
    let done = Instant::now();
    regions.assert_eu_heard_all(&policy, &keys, done).await;
    regions.servers[0].restart();
    let restarted = Instant::now();
    // Heard again since the restart: everything landed again.
    loop {
        let elapsed = restarted.elapsed();
        let _ = regions.stores[0].sync_now().await;
        let status = regions.stores[0].peers();
        let us = status.iter().find(|p| p.region == "us").expect("a peer");
        if !us.stale && us.last_heard.is_some_and(|age| age < elapsed) {
            break;
        }
        assert!(
            elapsed < Duration::from_secs(10),
            "never heard again: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        with_budget_left(&regions.stores[0], &policy, &keys).await,
        0
    );
}

/// A peer whose script cache was flushed gets the scripts again, and the
/// counts with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_whose_scripts_were_flushed_still_hears_everything() {
    let regions = Regions::start_fresh(SYNC, Duration::from_secs(2)).await;
    let policy = fixed(1);
    assert_eq!(regions.servers[0].cli(&["SCRIPT", "FLUSH"]), "OK");
    let keys: Vec<String> = (0..50).map(|i| format!("flushed-{i}")).collect();
    assert_eq!(
        admitted_once_each(&regions.stores[1], &policy, &keys).await,
        50
    );
    let done = Instant::now();
    regions.assert_eu_heard_all(&policy, &keys, done).await;
}

/// A peer whose clock is behind by more than `max_skew`, marked while its
/// last ticket was a second old (so the bounds of its skew still overlap
/// the allowed range): the counts it pushes, over by this region's clock,
/// are not placed, but the peer is counted at its share until they would
/// have expired, never as heard with nothing. `us` is 1.5 s behind `eu` and
/// `ap`, the window 100 ms: `us` admits its 3 of 9 (it counts both others
/// at their share), and `eu` then admits at most the other 6.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_behind_never_hides_its_counts() {
    let regions = Regions::start_apart(
        Duration::from_secs(30),
        Duration::from_secs(120),
        [1_500_000, 0, 1_500_000],
    )
    .await;
    for store in &regions.stores {
        let _ = store.sync_now().await;
    }
    for store in &regions.stores {
        let _ = store.sync_now().await;
    }
    // us's ticket of eu's clock is now a second old.
    regions.clock.advance(Duration::from_secs(1));
    regions.clocks[1].advance(Duration::from_secs(1));
    let policy = fixed_window("mr-behind", 9, Duration::from_millis(100));
    let keys: Vec<String> = (0..9).map(|_| String::from("behind")).collect();
    assert_eq!(
        admitted_once_each(&regions.stores[1], &policy, &keys).await,
        3
    );
    regions.stores[1].sync_now().await.expect("pushed");
    let _ = regions.stores[0].sync_now().await;
    let admitted = admitted_once_each(&regions.stores[0], &policy, &keys).await;
    assert!(
        admitted <= 6,
        "eu admitted {admitted} after us admitted 3 of 9 in the same window"
    );
    regions.assert_every_key_has_a_ttl();
}
