//! Attacks on reloads, permits, parameter changes, the key bound and client
//! keys, written from the documents alone: each test asserts a promise
//! of RELIABILITY.md or SECURITY.md the way an operator's accident or an
//! attacker would try to break it (cut, swapped and same-size files, short
//! waits, permits of other keys, extreme parameters, IPv6 rotation, spoofed
//! forwarding headers).

use std::time::Duration;

use http::Request;
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{AdminStore, MemoryStore, Policy};
use ratelimit_tests::fixtures::{self, ok_service, request_at, tokio_memory};
use ratelimit_tests::{NO_EDGE, admits_now, every_algorithm, long_policies, named, twin_stores};
use ratelimit_tower::Key;
use ratelimit_tower::config::{Config, Format, ReloadableRules};
use ratelimit_tower::{FailurePolicy, RateLimitLayer};
use tower::{ServiceBuilder, ServiceExt};

/// A windowed policy's constructor (`Policy::fixed_window` and the like).
type Windowed = fn(u64, Duration) -> Result<Policy, ratelimit_core::PolicyError>;

/// A metered policy's constructor (`Policy::token_bucket`, `Policy::gcra`).
type Metered = fn(u64, ratelimit_core::Rate) -> Result<Policy, ratelimit_core::PolicyError>;

/// A windowed policy's change: its (limit, window µs) before and after.
type Change = ((u64, u64), (u64, u64));

/// A bucket's capacity, amount and period in µs.
type Bucket = (u64, u64, u64);

/// A request to `/api/items` from the peer `ip` with `headers`.
fn req_from(ip: &str, headers: &[(&str, &str)]) -> Request<String> {
    request_at("/api/items", ip, headers)
}

async fn statuses<R>(
    layer: RateLimitLayer<MemoryStore, R, ratelimit_tower::HttpRejections>,
    reqs: Vec<Request<String>>,
) -> Vec<u16>
where
    R: ratelimit_tower::RuleProvider<Request<String>> + Clone + Send + Sync + 'static,
    R::Future: Send,
{
    fixtures::statuses(
        ServiceBuilder::new().layer(layer).service(ok_service()),
        reqs,
    )
    .await
}

/// A layer of `rules` on a fresh `MemoryStore`, refusing while it fails.
fn closed<R>(rules: R) -> RateLimitLayer<MemoryStore, R> {
    RateLimitLayer::with_rules(MemoryStore::new(), rules).on_failure(FailurePolicy::Closed)
}

/// A request to `/api/items` from each peer of `ips`.
fn from_each(ips: &[&str]) -> Vec<Request<String>> {
    ips.iter().map(|ip| req_from(ip, &[])).collect()
}

/// A request to `/api/items` for each client of `ips`, through the trusted
/// proxy 10.0.0.5, which wrote the client into `X-Forwarded-For`.
fn forwarded_for_each(ips: &[&str]) -> Vec<Request<String>> {
    ips.iter()
        .map(|ip| req_from("10.0.0.5", &[("x-forwarded-for", ip)]))
        .collect()
}

/// GCRA, one an hour, keyed by the client IP that the proxies of 10.0.0.0/8
/// write in the forwarding header `header`.
fn client_ip_config(header: &str) -> Config {
    Config::from_toml(&format!(
        "[client_ip]\ntrusted_proxies = [\"10.0.0.0/8\"]\nheader = \"{header}\"\n\n\
         [policies.api]\nalgorithm = \"gcra\"\nlimit = 1\nrate = \"1/h\"\n\n\
         [[rules]]\npolicy = \"api\"\nkey = \"client-ip\"\n",
    ))
    .expect("valid")
}

/// Fails with the first `shown` of `failures`, if there are any, counted as
/// `what`.
fn assert_none(failures: &[String], what: &str, shown: usize) {
    assert!(
        failures.is_empty(),
        "{} {what}, first: {:?}",
        failures.len(),
        &failures[..failures.len().min(shown)]
    );
}

// ---------------------------------------------------------------------------
// Claim 2: a permit is held as long as its holder, "whatever lease was chosen".
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// Claim 5: IPv6 clients keyed by network.
// ---------------------------------------------------------------------------

/// SECURITY.md, "Trusted proxies": "`PeerIp` (and `ClientIp::peer()`) never
/// reads headers. Use it when clients connect directly", and "A client cannot
/// earn a second budget by ... writing its address another way"; "IPv6
/// clients are keyed by network". A configuration with `[client_ip]` (the
/// documented setup behind proxies) keys an IPv6 client that rotates through
/// its /64 by network, whether it connects directly (an untrusted peer; the
/// same holds for `ClientIp::peer()`) or through a trusted proxy that
/// appends its address to X-Forwarded-For.
#[tokio::test]
async fn the_client_ip_key_keys_a_direct_or_forwarded_ipv6_client_by_network() {
    let rotating = ["2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2::3"];
    for (forwarded, how) in [(false, "connecting directly"), (true, "behind the proxy")] {
        let requests = if forwarded {
            forwarded_for_each(&rotating)
        } else {
            from_each(&rotating)
        };
        let layer = closed(client_ip_config("x-forwarded-for"));
        assert_eq!(
            statuses(layer, requests).await,
            [200, 429, 429],
            "one IPv6 /64, {how}, got a fresh budget per address"
        );
    }
}

// ---------------------------------------------------------------------------
// Claim 1: reloads never lift limits by accident.
// ---------------------------------------------------------------------------

fn api(policy: &str, limit: u64) -> String {
    format!(
        "[policies.{policy}]\nalgorithm = \"gcra\"\nlimit = {limit}\nrate = \"1/h\"\n\n\
         [[rules]]\npolicy = \"{policy}\"\nkey = \"header:x-client\"\n"
    )
}

// ---------------------------------------------------------------------------
// Claims 4 and 6: a full store; denied requests consume nothing.
// ---------------------------------------------------------------------------

/// SECURITY.md: a full store answers a new key `503`; RELIABILITY.md:
/// "Denied requests consume nothing". A request under two rules (a global
/// limit held already, and a per-client limit for a new client) is refused
/// 503 because the store is full; the refused requests must not spend the
/// global budget every client shares.
#[tokio::test]
async fn requests_refused_by_a_full_store_spend_nothing_of_the_limits_in_force() {
    let config = Config::from_toml(
        "[policies.global]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"1000d\"\n\n\
         [policies.client]\nalgorithm = \"fixed-window\"\nlimit = 100\nwindow = \"1000d\"\n\n\
         [[rules]]\npolicy = \"global\"\nkey = \"global\"\n\n\
         [[rules]]\npolicy = \"client\"\nkey = \"header:x-client\"\n",
    )
    .expect("valid");
    let store = MemoryStore::builder().max_keys(2).build();
    let layer = RateLimitLayer::with_rules(store, config).on_failure(FailurePolicy::Closed);
    let reqs = vec![
        req_from("192.0.2.1", &[("x-client", "a")]),
        req_from("192.0.2.2", &[("x-client", "b")]),
        req_from("192.0.2.3", &[("x-client", "c")]),
        req_from("192.0.2.1", &[("x-client", "a")]),
        req_from("192.0.2.1", &[("x-client", "a")]),
    ];
    // a: global 1, a 1 (2 keys, full). b, c: 503, nothing spent.
    // a again: global 2, global 3.
    assert_eq!(statuses(layer, reqs).await, [200, 503, 503, 200, 200]);
}

// ---------------------------------------------------------------------------
// Claim 3: parameter changes under one name never over-admit (large limits).
// ---------------------------------------------------------------------------

/// A small deterministic generator that takes any seed, 0 included.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn index(&mut self, len: usize) -> usize {
        usize::try_from(self.below(len as u64)).unwrap_or(0)
    }
}

/// A timeline of (time µs, units, after the change) admissions of `make`'s
/// `old` then `new` (limit, window µs) on one MemoryStore key; returns the
/// admissions and the change's time.
fn timeline(
    seed: u64,
    make: fn(u64, Duration) -> Result<Policy, ratelimit_core::PolicyError>,
    old: (u64, u64),
    new: (u64, u64),
    steps: usize,
) -> (Vec<(u64, u64, bool)>, u64) {
    use ratelimit_core::clock::ManualClock;
    let mut rng = Lcg(seed);
    let clock = ManualClock::new(1_000_000_000 + rng.below(10_000_000));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let p_old = named("p", make(old.0, Duration::from_micros(old.1)));
    let p_new = named("p", make(new.0, Duration::from_micros(new.1)));
    let mut admitted = Vec::new();
    let mut change_at = 0;
    for i in 0..steps {
        let after = i >= steps / 2;
        if after && change_at == 0 {
            change_at = ratelimit_core::clock::Clock::now(&clock);
        }
        let policy = if after { &p_new } else { &p_old };
        let cost = 1 + rng.below(policy.limit().min(40));
        let d = store.check_now(b"k", policy, cost).unwrap();
        if d.is_allowed() {
            admitted.push((ratelimit_core::clock::Clock::now(&clock), cost, after));
        }
        let span = old.1.max(new.1);
        let step = match rng.below(4) {
            0 => 0,
            1 => rng.below(span / 500 + 1),
            2 => rng.below(span / 20 + 1),
            _ => rng.below(span / 3 + 1),
        };
        clock.advance(Duration::from_micros(step));
    }
    (admitted, change_at)
}

/// For each `(old, new)` of `cases` and seeds 0 to 11, the [`timeline`] of
/// `steps` steps, checked by `over` (given the admissions, the change's time
/// and `new`): the first over-admission it names in each timeline.
fn over_admissions(
    make: Windowed,
    cases: &[Change],
    steps: usize,
    over: impl Fn(&[(u64, u64, bool)], u64, (u64, u64)) -> Option<String>,
) -> Vec<String> {
    let mut failures = Vec::new();
    for &(old, new) in cases {
        for seed in 0..12u64 {
            let (admitted, change_at) = timeline(seed, make, old, new, steps);
            if let Some(failure) = over(&admitted, change_at, new) {
                failures.push(format!("old {old:?} new {new:?} seed {seed}: {failure}"));
            }
        }
    }
    failures
}

/// RELIABILITY.md, "Parameter changes under one name", sliding log: "in every
/// interval of the new window's length, everything admitted is at most the
/// new limit, or the earlier admissions alone" -- checked here for limits
/// above LOG_SLOTS (1,024), where entries share slots, which the property
/// test (limits 1 to 6) never reaches.
#[test]
fn a_tightened_large_sliding_log_never_over_admits() {
    let cases = [
        ((3_000, 60_000_000), (2_000, 60_000_000)),
        ((3_000, 60_000_000), (2_000, 45_000_000)),
        ((5_000, 60_000_000), (1_500, 10_000_000)),
        ((2_000, 60_000_000), (500, 7_000_000)),
        ((1_500, 10_000_000), (1_100, 9_999_999)),
        ((2_048, 1_024_000), (1_025, 1_000_001)),
    ];
    let failures = over_admissions(
        Policy::sliding_window_log,
        &cases,
        4_000,
        |admitted, change_at, new| {
            admitted.iter().filter(|a| a.2).find_map(|&(t, _, _)| {
                let total: u64 = admitted
                    .iter()
                    .filter(|&&(u, _, _)| u + new.1 > t && u <= t)
                    .map(|&(_, c, _)| c)
                    .sum();
                (total > new.0).then(|| {
                    format!(
                        "{total} units in the window ending {} µs after the change",
                        t - change_at
                    )
                })
            })
        },
    );
    assert_none(&failures, "over-admissions", 5);
}

/// RELIABILITY.md, fixed window and sliding window counter: "when the new
/// window divides the old one ...: in every aligned new window, everything
/// admitted before and after the change is at most the new limit, or what
/// the old numbers had admitted there if that alone is more (and then nothing
/// passes after the change)" -- with large limits and costs.
#[test]
fn tightened_large_windows_never_over_admit_in_an_aligned_new_window() {
    let cases = [
        ((3_000, 60_000_000), (2_000, 60_000_000)),
        ((3_000, 60_000_000), (2_000, 10_000_000)),
        ((5_000, 3_600_000_000), (300, 60_000_000)),
        ((100, 60_000_000), (100, 1_000_000)),
        ((2_000, 60_000_000), (1_999, 30_000_000)),
    ];
    let makes: [(&str, Windowed); 2] = [
        ("fixed", Policy::fixed_window),
        ("counter", Policy::sliding_window_counter),
    ];
    let mut failures = Vec::new();
    for (name, make) in makes {
        let found = over_admissions(make, &cases, 3_000, |admitted, change_at, new| {
            let w = new.1;
            let mut windows: Vec<u64> = admitted
                .iter()
                .filter(|a| a.2)
                .map(|a| a.0 - a.0 % w)
                .collect();
            windows.dedup();
            windows.into_iter().find_map(|start| {
                let inside = admitted.iter().filter(|a| a.0 >= start && a.0 < start + w);
                let (total, before): (u64, u64) =
                    inside.fold((0, 0), |(t, b), a| (t + a.1, b + if a.2 { 0 } else { a.1 }));
                (total > new.0 && total != before).then(|| {
                    format!(
                        "{total} units ({before} before the change) in the aligned window starting {} µs after the change",
                        start as i64 - change_at as i64
                    )
                })
            })
        });
        failures.extend(found.into_iter().map(|f| format!("{name} {f}")));
    }
    assert_none(&failures, "over-admissions", 6);
}

/// RELIABILITY.md, token bucket and GCRA: "From any admission after the
/// change to any later one, at most the new capacity plus one unit per new
/// interval between them is admitted" -- large capacities, costs above 1,
/// fractional intervals. (One unit of slack for rounding.)
#[test]
fn tightened_large_buckets_never_over_admit() {
    use ratelimit_core::clock::{Clock, ManualClock};
    // (capacity, amount, period µs)
    let cases: [(Bucket, Bucket); 5] = [
        ((3_000, 100, 1_000_000), (2_000, 100, 1_000_000)),
        ((3_000, 100, 1_000_000), (500, 7, 1_000_000)),
        ((10, 3, 1_000), (10, 1, 1_000)),
        ((5_000, 1_000, 60_000_000), (1, 1, 3_600_000_000)),
        ((64, 64, 1_000_000), (63, 63, 1_000_001)),
    ];
    let makes: [(&str, Metered); 2] = [("token", Policy::token_bucket), ("gcra", Policy::gcra)];
    let mut failures = Vec::new();
    for (name, make) in makes {
        for (old, new) in cases {
            for seed in 0..12u64 {
                let mut rng = Lcg(seed);
                let clock = ManualClock::new(1_000_000_000 + rng.below(10_000_000));
                let store = MemoryStore::builder().clock(clock.clone()).build();
                let p = |(c, a, per): (u64, u64, u64)| {
                    make(c, ratelimit_core::Rate::new(a, Duration::from_micros(per)))
                        .unwrap()
                        .with_name("p")
                        .unwrap()
                };
                let (p_old, p_new) = (p(old), p(new));
                let mut after: Vec<(u64, u64)> = Vec::new();
                for i in 0..3_000 {
                    let policy = if i >= 1_500 { &p_new } else { &p_old };
                    let cost = 1 + rng.below(policy.limit().min(20));
                    let d = store.check_now(b"k", policy, cost).unwrap();
                    if d.is_allowed() && i >= 1_500 {
                        after.push((clock.now(), cost));
                    }
                    let span = old.2.max(new.2);
                    clock.advance(Duration::from_micros(match rng.below(4) {
                        0 => 0,
                        1 => rng.below(span / 50 + 1),
                        2 => rng.below(span / 5 + 1),
                        _ => rng.below(span * 2 + 1),
                    }));
                }
                'outer: for i in 0..after.len() {
                    let mut sum = 0;
                    for j in i..after.len() {
                        sum += after[j].1;
                        let dt = u128::from(after[j].0 - after[i].0);
                        let refill = dt * u128::from(new.1) / u128::from(new.2);
                        if u128::from(sum) > u128::from(new.0) + refill + 1 {
                            failures.push(format!(
                                "{name} old {old:?} new {new:?} seed {seed}: {sum} units over {dt} µs (bound {})",
                                u128::from(new.0) + refill
                            ));
                            break 'outer;
                        }
                    }
                }
            }
        }
    }
    assert_none(&failures, "over-admissions", 6);
}

/// `MemoryStore::builder().max_keys(n)`: "any `max_keys` distinct keys are
/// held whichever shards they fall in, and never one more" -- under threads
/// racing, with keys that are expired making room: n live keys exactly.
#[test]
fn racing_threads_over_expiring_keys_hold_exactly_max_keys() {
    use ratelimit_core::clock::ManualClock;
    let clock = ManualClock::new(1_000_000);
    // 64 shards, as the builder has by default.
    let store = ratelimit_tests::fixtures::bounded_memory(50, 64, &clock);
    let short = Policy::fixed_window(10, Duration::from_secs(1)).unwrap();
    // 50 keys that expire in 1 s.
    for i in 0..50 {
        assert!(admits_now(&store, format!("old{i}").as_bytes(), &short, 1));
    }
    clock.advance(Duration::from_secs(2));
    let long = Policy::fixed_window(10, Duration::from_secs(3600)).unwrap();
    let admitted = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..8 {
            let (store, long, admitted) = (&store, &long, &admitted);
            s.spawn(move || {
                for i in 0..40 {
                    if let Ok(d) = store.check_now(format!("new{t}-{i}").as_bytes(), long, 1) {
                        assert!(d.is_allowed());
                        admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(
        admitted.into_inner(),
        50,
        "expired keys did not make room for exactly max_keys new ones under racing threads"
    );
}

/// SECURITY.md: the watcher "reads a changed file only once it has held
/// still for one poll interval". A change that keeps the size, the inode and
/// the modification time (a copy in place that preserves times, `cp -p`,
/// `rsync --inplace -t`, `touch -r`; or two same-size writes within the
/// filesystem's timestamp granularity) is never seen: a tightened limit
/// (5 to 1) is never put in force, although the file says 1.
#[tokio::test(start_paused = true)]
async fn the_watcher_sees_a_change_that_keeps_size_and_modification_time() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("limits.toml");
    std::fs::write(&path, api("api", 5)).expect("write");
    let rules = ReloadableRules::from_file(&path).expect("valid");
    let watcher = rules.watch_file(&path, Duration::from_millis(10));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let modified = std::fs::metadata(&path)
        .expect("meta")
        .modified()
        .expect("mtime");
    // Tightened in place, same length, and the time put back.
    {
        use std::io::{Seek, Write};
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        file.seek(std::io::SeekFrom::Start(0)).expect("seek");
        file.write_all(api("api", 1).as_bytes()).expect("write");
        file.set_modified(modified).expect("set mtime");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    watcher.abort();
    let layer = closed(rules);
    let reqs = (0..3)
        .map(|_| req_from("192.0.2.1", &[("x-client", "a")]))
        .collect();
    assert_eq!(
        statuses(layer, reqs).await,
        [200, 429, 429],
        "the file says limit = 1; the watcher kept limit = 5"
    );
}

/// "Nothing panics on hostile input": configuration values at and past
/// their ranges either load or fail with an error, and a loaded one decides
/// requests without panicking.
#[tokio::test]
async fn extreme_configuration_values_never_panic() {
    let algos = [
        ("fixed-window", "window"),
        ("sliding-window", "window"),
        ("sliding-log", "window"),
        ("token-bucket", "rate"),
        ("gcra", "rate"),
        ("leaky-bucket", "rate"),
        ("concurrency", "lease"),
    ];
    let limits = [
        "0",
        "1",
        "18446744073709551615",
        "9223372036854775807",
        "4294967296",
        "1048576",
    ];
    let periods = [
        "\"0s\"",
        "\"1us\"",
        "\"1ns\"",
        "\"0/s\"",
        "\"1/0s\"",
        "\"18446744073709551615/s\"",
        "\"1/18446744073709551615s\"",
        "\"18446744073709551615d\"",
        "\"99999999999999999999s\"",
        "\"1/1us\"",
        "\"1000000/1us\"",
        "\"1/584942y\"",
        "\"584942y\"",
        "\"1.5s\"",
        "\"-1s\"",
        "\"1/ms\"",
        "\"10/s \"",
        "\" 10/s\"",
        "\"1e3/s\"",
        "\"1s1s\"",
    ];
    let costs = ["0", "1", "18446744073709551615"];
    let mut loaded = 0;
    for (algo, field) in algos {
        for limit in limits {
            for period in periods {
                for cost in costs {
                    let text = format!(
                        "[policies.p]\nalgorithm = \"{algo}\"\nlimit = {limit}\n{field} = {period}\n\n\
                         [[rules]]\npolicy = \"p\"\nkey = \"header:x-client\"\ncost = {cost}\n"
                    );
                    let Ok(config) = std::panic::catch_unwind(|| Config::from_toml(&text))
                        .unwrap_or_else(|_| panic!("parsing panicked:\n{text}"))
                    else {
                        continue;
                    };
                    loaded += 1;
                    let layer = closed(config);
                    let service = ServiceBuilder::new().layer(layer).service(ok_service());
                    for _ in 0..3 {
                        let req = req_from("192.0.2.1", &[("x-client", "a")]);
                        let fut = service.clone().oneshot(req);
                        let result = tokio::spawn(fut).await;
                        assert!(result.is_ok(), "deciding panicked:\n{text}");
                    }
                }
            }
        }
    }
    assert!(loaded > 0);
}

/// RELIABILITY.md: "Both stores read a state written under other numbers as
/// a state of the new policy, alike" -- large limits (sliding log above
/// LOG_SLOTS, buckets in the thousands), costs above 1, several changes,
/// every algorithm but concurrency, decided on a MemoryStore and a real
/// Redis on one manual clock: the same decision at every step.
#[tokio::test]
async fn large_parameter_changes_decide_alike_on_both_stores() {
    use ratelimit_core::Rate;
    use ratelimit_core::Store;
    use ratelimit_core::clock::ManualClock;
    let server = ratelimit_tests::RedisServer::start();
    let clock = ManualClock::new(1_700_000_000_000_000);
    let (memory, redis) = twin_stores(RedisStore::builder(server.url()), &clock).await;
    type Make = fn(u64, u64) -> Policy;
    let makes: [(&str, Make); 6] = [
        ("fixed", |l, w| {
            Policy::fixed_window(l, Duration::from_micros(w)).unwrap()
        }),
        ("counter", |l, w| {
            Policy::sliding_window_counter(l, Duration::from_micros(w)).unwrap()
        }),
        ("log", |l, w| {
            Policy::sliding_window_log(l, Duration::from_micros(w)).unwrap()
        }),
        ("token", |l, w| {
            Policy::token_bucket(l, Rate::new(l.max(7) / 7, Duration::from_micros(w))).unwrap()
        }),
        ("gcra", |l, w| {
            Policy::gcra(l, Rate::new(l.max(7) / 7, Duration::from_micros(w))).unwrap()
        }),
        ("leaky", |l, w| {
            Policy::leaky_bucket(l, Rate::new(l.max(7) / 7, Duration::from_micros(w))).unwrap()
        }),
    ];
    let limits = [1u64, 3, 500, 1_024, 1_025, 2_000, 5_000];
    let windows = [1_000_000u64, 7_000_000, 60_000_000, 999_999];
    let mut mismatches = Vec::new();
    for (name, make) in makes {
        for seed in 0..3u64 {
            let mut rng = Lcg(seed * 31 + 7);
            let key = format!("{name}-{seed}");
            let mut expires: Option<u64> = None;
            let mut policy = make(limits[rng.index(7)], windows[rng.index(4)])
                .with_name(format!("p-{name}"))
                .unwrap();
            for step in 0..400 {
                if rng.below(150) == 0 {
                    policy = make(limits[rng.index(7)], windows[rng.index(4)])
                        .with_name(format!("p-{name}"))
                        .unwrap();
                }
                let cost = 1 + rng.below(policy.limit().min(50));
                let now = ratelimit_core::clock::Clock::now(&clock);
                // Redis TTLs run on the server's clock: the key is dropped
                // when the last write's lifetime ends on this timeline (as
                // tests/redis/parameter_changes.rs does).
                if expires.is_some_and(|e| now >= e) {
                    server.cli(&["DEL", &redis.state_key(key.as_bytes(), &policy)]);
                    expires = None;
                }
                let m = memory.check_now(key.as_bytes(), &policy, cost).unwrap();
                let r = redis.check(key.as_bytes(), &policy, cost).await.unwrap();
                if (m.is_allowed(), m.remaining()) != (r.is_allowed(), r.remaining()) {
                    mismatches.push(format!(
                        "{name} seed {seed} step {step} {policy:?} cost {cost}: memory {:?}/{} redis {:?}/{}",
                        m.is_allowed(), m.remaining(), r.is_allowed(), r.remaining()
                    ));
                    break;
                }
                if m.is_allowed() {
                    let reset = m.reset_after_micros();
                    expires = (reset > 0).then_some(now + reset);
                }
                clock.advance(Duration::from_micros(match rng.below(4) {
                    0 => 0,
                    1 => rng.below(2_000),
                    2 => rng.below(200_000),
                    _ => rng.below(20_000_000),
                }));
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} mismatches: {:#?}",
        mismatches.len(),
        &mismatches[..mismatches.len().min(6)]
    );
}

/// RELIABILITY.md: "every prefix of a ... file is refused, or is a valid
/// configuration with every rule and policy in force"; what is "not caught"
/// is "a prefix ... cut inside a number or after a rule's optional field".
/// A file laid out as the schema in `config/mod.rs` shows (the
/// `[client_ip]` section last, `ipv6_prefix = 64` then `max_hops`), cut just
/// before its `ipv6_prefix` line, keeps every rule and policy, is loaded, and
/// keys IPv6 clients behind the proxy by their whole address: each address of
/// a /64 gets a fresh budget. Neither inside a number nor a rule's field.
#[tokio::test]
async fn every_prefix_of_a_client_ip_config_keeps_ipv6_clients_keyed_by_network() {
    let full = "[policies.api]\nalgorithm = \"gcra\"\nlimit = 1\nrate = \"1/h\"\n\n\
                [[rules]]\npolicy = \"api\"\nkey = \"client-ip\"\n\n\
                [client_ip]\ntrusted_proxies = [\"10.0.0.0/8\"]\nheader = \"x-forwarded-for\"\n\
                ipv6_prefix = 64\nmax_hops = 64\n";
    let mut lifted = Vec::new();
    for cut in 0..=full.len() {
        let rules = ReloadableRules::from_str(full, Format::Toml).expect("valid");
        if rules.reload_from_str(&full[..cut], Format::Toml).is_err() {
            continue;
        }
        let reqs = forwarded_for_each(&["2001:db8:1:2::1", "2001:db8:1:2::2"]);
        if statuses(closed(rules), reqs).await != [200, 429] {
            lifted.push(format!("{:?}", &full[cut.saturating_sub(30)..cut]));
        }
    }
    assert!(
        lifted.is_empty(),
        "{} prefixes were loaded and gave each address of one /64 its own budget; ends: {lifted:#?}",
        lifted.len()
    );
}

/// `max_keys(n)` counts states, one per (policy, key) ("each state and each
/// block counting as one", `MemoryStore::len`): four clients under two
/// policies each fill a store of 8, not of 4. (Noted, not a finding: size
/// `max_keys` as clients x policies.)
#[test]
fn max_keys_counts_one_state_per_policy_and_key() {
    let store = MemoryStore::builder().max_keys(8).build();
    let a = named("a", Policy::fixed_window(10, NO_EDGE));
    let b = named("b", Policy::fixed_window(10, NO_EDGE));
    for i in 0..4 {
        let key = format!("client{i}");
        assert!(store.check_now(key.as_bytes(), &a, 1).is_ok());
        assert!(store.check_now(key.as_bytes(), &b, 1).is_ok());
    }
    assert_eq!(store.len(), 8);
    assert!(store.check_now(b"client4", &a, 1).is_err());
}

/// "Denied requests consume nothing": after a limit is used up, a flood of
/// denied requests of every cost does not move the time the next request
/// passes (every algorithm but concurrency, MemoryStore).
#[test]
fn denied_floods_do_not_move_the_next_admission() {
    use ratelimit_core::Rate;
    use ratelimit_core::clock::ManualClock;
    let minute = Duration::from_secs(60);
    let mut policies = every_algorithm(10, minute, Rate::per_minute(10));
    // Concurrency, the last, has no time to move; a long log, many entries.
    policies.pop();
    policies.push(Policy::sliding_window_log(3_000, minute).unwrap());
    let mut failures = Vec::new();
    for policy in policies {
        let clock = ManualClock::new(5_000_000_000);
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let limit = policy.limit();
        // Use it up.
        let mut first_denial = None;
        for _ in 0..(limit * 3) {
            let d = store.check_now(b"k", &policy, 1).unwrap();
            if !d.is_allowed() {
                first_denial = Some(d);
                break;
            }
        }
        let Some(denied) = first_denial else {
            failures.push(format!("{policy:?}: never denied"));
            continue;
        };
        let retry = denied.retry_after_micros();
        // A flood of denials, costs 1..=limit, over most of the wait.
        for i in 0..2_000u64 {
            let _ = store.check_now(b"k", &policy, 1 + i % limit);
            if i % 100 == 99 {
                clock.advance(Duration::from_micros(retry / 40));
            }
        }
        // Back to the time the first denial named.
        let now = ratelimit_core::clock::Clock::now(&clock);
        let target = 5_000_000_000 + retry;
        if target > now {
            clock.advance(Duration::from_micros(target - now));
        }
        let d = store.check_now(b"k", &policy, 1).unwrap();
        if !d.is_allowed() {
            failures.push(format!(
                "{policy:?}: denied at its retry time after a flood: {d:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The watcher keeps the limits in force when its file is deleted, replaced
/// by a directory, by an empty file, by a symlink to nowhere, then follows a
/// valid file again (watcher alive, nothing lifted).
#[tokio::test(start_paused = true)]
async fn the_watcher_keeps_limits_through_deleted_dir_and_dangling_files() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("limits.toml");
    std::fs::write(&path, api("api", 1)).expect("write");
    let rules = ReloadableRules::from_file(&path).expect("valid");
    let watcher = rules.watch_file(&path, Duration::from_millis(5));
    let service = ServiceBuilder::new()
        .layer(closed(rules.clone()))
        .service(ok_service());
    let send = |client: &'static str| {
        let service = service.clone();
        async move {
            service
                .oneshot(req_from("192.0.2.1", &[("x-client", client)]))
                .await
                .expect("infallible")
                .status()
                .as_u16()
        }
    };
    let settle = || tokio::time::sleep(Duration::from_millis(80));
    assert_eq!(send("a").await, 200);
    assert_eq!(send("a").await, 429);
    std::fs::remove_file(&path).expect("rm");
    settle().await;
    assert_eq!(send("a").await, 429, "deleted");
    std::fs::create_dir(&path).expect("mkdir");
    settle().await;
    assert_eq!(send("a").await, 429, "a directory");
    std::fs::remove_dir(&path).expect("rmdir");
    std::os::unix::fs::symlink(dir.path().join("nowhere"), &path).expect("symlink");
    settle().await;
    assert_eq!(send("a").await, 429, "a dangling symlink");
    std::fs::remove_file(&path).expect("rm link");
    std::fs::write(&path, "").expect("empty");
    settle().await;
    assert_eq!(send("a").await, 429, "empty");
    // A valid file under another policy name... (see the rename finding);
    // the same policy, tighter elsewhere: a second rule added.
    let tmp = dir.path().join("next.toml");
    std::fs::write(
        &tmp,
        format!(
            "{}\n[[rules]]\npolicy = \"api\"\nkey = \"global\"\n",
            api("api", 1)
        ),
    )
    .expect("write");
    std::fs::rename(&tmp, &path).expect("rename");
    settle().await;
    assert_eq!(rules.current().rule_count(), 2, "the valid file was loaded");
    assert_eq!(send("b").await, 200);
    assert_eq!(send("c").await, 429, "the global rule applies");
    watcher.abort();
}

/// On Redis: many permits of cost > 1 under two concurrency policies on one
/// key, held by the grants of `ratelimit-axum`'s `Limiter` well past their
/// lease (renewed), a second request refused meanwhile; released at once
/// when the grants drop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_permits_are_held_past_their_lease_and_freed_on_drop() {
    use ratelimit_core::Store;
    let server = ratelimit_tests::RedisServer::start();
    let store = ratelimit_tests::stores::redis_store(server.url()).await;
    // Leases of a second and more, renewed every third of them: a renewal
    // late by hundreds of milliseconds on a loaded machine still lands in
    // time, and each lease outlasts the half second the release may take
    // after the drop below by at least 300 ms.
    let a = named("ca", Policy::concurrency(6, Duration::from_millis(1_500)));
    let b = named("cb", Policy::concurrency(4, Duration::from_millis(1_200)));
    // The Limiter hashes the value it is given; `key` is that hash, the key
    // its permits are held under.
    let key = Key::from(b"k".to_vec());
    let mut guards = Vec::new();
    for (policy, cost, n) in [(&a, 2u64, 3), (&b, 1, 4)] {
        let limiter = ratelimit_axum::Limiter::new(store.clone(), policy.clone());
        for _ in 0..n {
            let granted = limiter.check(key.clone(), cost).await;
            guards.push(granted.expect("a slot is free"));
        }
    }
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(
        !store
            .check(key.as_bytes(), &a, 1)
            .await
            .unwrap()
            .is_allowed(),
        "a: a slot lapsed while held"
    );
    assert!(
        !store
            .check(key.as_bytes(), &b, 1)
            .await
            .unwrap()
            .is_allowed(),
        "b: a slot lapsed while held"
    );
    drop(guards);
    // The releases are sent on the runtime: look for half a second, less
    // than any lease has left (a lapse is not a release).
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    let d = loop {
        let d = store.check(key.as_bytes(), &a, 6).await.unwrap();
        if d.is_allowed() || tokio::time::Instant::now() >= deadline {
            break d;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(d.is_allowed(), "a: not freed on drop");
    store
        .release(key.as_bytes(), &a, d.permit().unwrap())
        .await
        .unwrap();
}

/// The key budget never leaks: after random checks, batches, rewards,
/// penalties, resets, blocks, unblocks, permits and renewals over many keys,
/// policies and threads, `len()` never passes `max_keys`, and once every key
/// has expired exactly `max_keys` new keys are admitted (a budget that leaked
/// down would admit more, up would refuse live clients forever).
#[test]
fn the_key_budget_never_leaks_under_random_operations() {
    use ratelimit_core::Check;
    use ratelimit_core::Rate;
    use ratelimit_core::clock::ManualClock;
    const MAX: usize = 40;
    let clock = ManualClock::new(1_000_000_000);
    let store = MemoryStore::builder()
        .max_keys(MAX)
        .shards(8)
        .clock(clock.clone())
        .build();
    let policies = [
        Policy::fixed_window(3, Duration::from_secs(2)).unwrap(),
        Policy::sliding_window_counter(3, Duration::from_secs(2)).unwrap(),
        Policy::sliding_window_log(3, Duration::from_secs(2)).unwrap(),
        Policy::token_bucket(3, Rate::per_second(2)).unwrap(),
        Policy::gcra(3, Rate::per_second(2)).unwrap(),
        Policy::leaky_bucket(3, Rate::per_second(2)).unwrap(),
        Policy::concurrency(3, Duration::from_secs(2)).unwrap(),
    ];
    let over = std::sync::atomic::AtomicUsize::new(0);
    for round in 0..20u64 {
        std::thread::scope(|s| {
            for t in 0..threads() {
                let (store, policies, over) = (&store, &policies, &over);
                s.spawn(move || {
                    let mut rng = Lcg(round * 1_000 + t);
                    let mut permits: Vec<(Vec<u8>, &Policy, _)> = Vec::new();
                    for _ in 0..400 {
                        let key = format!("k{}", rng.below(90));
                        let policy = &policies[rng.index(policies.len())];
                        let cost = rng.below(4);
                        match rng.below(10) {
                            0 => {
                                let _ = store.reward(key.as_bytes(), policy, 1 + cost).into_inner();
                            }
                            1 => {
                                let _ = store
                                    .penalize(key.as_bytes(), policy, 1 + cost)
                                    .into_inner();
                            }
                            2 => store
                                .reset(key.as_bytes(), policy)
                                .into_inner()
                                .expect("reset"),
                            3 => {
                                let _ = store
                                    .block(
                                        key.as_bytes(),
                                        policy,
                                        Duration::from_millis(1 + rng.below(3_000)),
                                    )
                                    .into_inner();
                            }
                            4 => store
                                .unblock(key.as_bytes(), policy)
                                .into_inner()
                                .expect("unblock"),
                            5 => {
                                let other = format!("k{}", rng.below(90));
                                let p2 = &policies[rng.index(policies.len())];
                                let _ = store.check_all_now(&[
                                    Check::new(key.as_bytes(), policy, cost),
                                    Check::new(other.as_bytes(), p2, 1),
                                ]);
                            }
                            6 => {
                                if let Some((k, p, id)) = permits.pop() {
                                    let p: &Policy = p;
                                    if rng.below(2) == 0 {
                                        store.release_now(&k, p, id);
                                    } else {
                                        store.renew_now(&k, p, id);
                                    }
                                }
                            }
                            _ => {
                                if let Ok(d) = store.check_now(key.as_bytes(), policy, cost)
                                    && let Some(id) = d.permit()
                                {
                                    permits.push((key.clone().into_bytes(), policy, id));
                                }
                            }
                        }
                        if threads() == 1 && store.len() > MAX {
                            over.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert!(
            store.len() <= MAX,
            "round {round}: len() {} passed max_keys",
            store.len()
        );
        clock.advance(Duration::from_millis(rng_step(round)));
    }
    assert_eq!(over.into_inner(), 0, "len() passed max_keys");
    // With threads, len() (read shard by shard) is checked once they stop.
    assert!(store.len() <= MAX, "len() {} passed max_keys", store.len());
    // Everything expires (blocks at most 3 s, windows and leases 2 s).
    clock.advance(Duration::from_secs(3_600));
    let long = named(
        "long",
        Policy::fixed_window(10, Duration::from_secs(86_400)),
    );
    let admitted = (0..(2 * MAX))
        .filter(|i| {
            store
                .check_now(format!("fresh{i}").as_bytes(), &long, 1)
                .is_ok()
        })
        .count();
    assert_eq!(
        admitted, MAX,
        "after everything expired, {admitted} new keys were admitted of max_keys {MAX}"
    );
}

fn rng_step(round: u64) -> u64 {
    [0, 1, 300, 900, 2_100][usize::try_from(round % 5).unwrap_or(0)]
}

fn threads() -> u64 {
    std::env::var("A2_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
}

/// One request under two rules that name the same policy and key (two rules
/// that both match, a config listing a limit twice): the all-or-nothing
/// batch holds both checks against one state. Limit 5: a batch of 2 + 2 is
/// admitted and counts 4 (duplicates are merged; 2 + 2 under a limit of 3 is
/// `CostExceedsLimit`), one single request more passes. On both stores, every algorithm.
#[tokio::test]
async fn a_batch_naming_one_state_twice_never_over_admits() {
    use ratelimit_core::Check;
    let (_server, stores) = Both::start().await;
    let policies = long_policies(5);
    let mut failures = Vec::new();
    for policy in &policies {
        for (store_name, store) in &stores {
            let key = format!("dup-{}-{store_name}", policy.name());
            let batch = [
                Check::new(key.as_bytes(), policy, 2),
                Check::new(key.as_bytes(), policy, 2),
            ];
            let decisions = store.check_all(&batch).await;
            let Ok(decisions) = decisions else {
                failures.push(format!("{store_name} {}: {decisions:?}", policy.name()));
                continue;
            };
            let batch_allowed = decisions.iter().all(|d| d.is_allowed());
            let mut single = Vec::new();
            for _ in 0..3 {
                single.push(store.check(key.as_bytes(), policy, 1).await.unwrap());
            }
            // Limit 5: the batch's 4 and the singles' admissions.
            let total = if batch_allowed { 4 } else { 0 }
                + single.iter().filter(|d| d.is_allowed()).count() as u64;
            if total > 5 || !batch_allowed {
                failures.push(format!(
                    "{store_name} {}: batch {decisions:?}, then single {single:?}",
                    policy.name()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A `MemoryStore` and a store on a fresh Redis server, to run one scenario
/// on both.
#[derive(Clone)]
enum Both {
    Memory(MemoryStore),
    Redis(ratelimit_core::redis::RedisStore),
}

impl Both {
    /// A fresh Redis server and each store, named.
    async fn start() -> (ratelimit_tests::RedisServer, [(&'static str, Both); 2]) {
        let server = ratelimit_tests::RedisServer::start();
        let redis = ratelimit_tests::stores::redis_store(server.url()).await;
        let stores = [
            ("memory", Both::Memory(MemoryStore::new())),
            ("redis", Both::Redis(redis)),
        ];
        (server, stores)
    }

    async fn check(
        &self,
        key: &[u8],
        policy: &Policy,
        cost: u64,
    ) -> Result<ratelimit_core::Decision, ratelimit_core::StoreError> {
        use ratelimit_core::Store;
        match self {
            Both::Memory(store) => store.check(key, policy, cost).await,
            Both::Redis(store) => store.check(key, policy, cost).await,
        }
    }

    async fn check_all(
        &self,
        checks: &[ratelimit_core::Check<'_>],
    ) -> Result<Vec<ratelimit_core::Decision>, ratelimit_core::StoreError> {
        use ratelimit_core::Store;
        match self {
            Both::Memory(store) => store.check_all(checks).await,
            Both::Redis(store) => store.check_all(checks).await,
        }
    }
}

/// A reload shortens a concurrency policy's lease (60 s to 100 ms) while a
/// permit taken under the long lease is held (no guard here: within its
/// lease it needs none). A permit taken under the short lease must not cut
/// the key's life short: the long permit still counts once the short one
/// ends ("Permits taken before the change count against the new max"; "the
/// key keeps the TTL of its longest lease").
#[tokio::test]
async fn a_shorter_lease_after_a_change_never_drops_a_longer_permit() {
    let (_server, stores) = Both::start().await;
    let long = named("c", Policy::concurrency(2, Duration::from_secs(60)));
    let short = named("c", Policy::concurrency(2, Duration::from_millis(100)));
    let mut failures = Vec::new();
    for (name, store) in &stores {
        let check =
            async |policy: &Policy| store.check(b"k", policy, 1).await.unwrap().is_allowed();
        assert!(check(&long).await);
        assert!(check(&short).await);
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        let after = [check(&short).await, check(&short).await];
        if after != [true, false] {
            failures.push(format!("{name}: after the short permit ended, {after:?} (one slot is held by the 60 s permit)"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Permit ids of another key (or another policy) neither release nor renew
/// a permit, nor bring one back, on either store.
#[tokio::test]
async fn permit_ids_of_another_key_or_policy_touch_nothing() {
    use ratelimit_core::Store;
    let server = ratelimit_tests::RedisServer::start();
    let redis = ratelimit_tests::stores::redis_store(server.url()).await;
    let memory = MemoryStore::new();
    let p = named("cp", Policy::concurrency(1, Duration::from_secs(60)));
    let q = named("cq", Policy::concurrency(1, Duration::from_secs(60)));
    async fn run<S: Store>(store: &S, p: &Policy, q: &Policy) -> Vec<String> {
        let mut bad = Vec::new();
        let a = store.check(b"a", p, 1).await.unwrap().permit().unwrap();
        let b = store.check(b"b", p, 1).await.unwrap().permit().unwrap();
        let c = store.check(b"a", q, 1).await.unwrap().permit().unwrap();
        // b's id against a, a's id under q.
        store.release(b"a", p, b).await.unwrap();
        store.release(b"a", q, a).await.unwrap();
        if store.check(b"a", p, 1).await.unwrap().is_allowed() {
            bad.push("a/p freed by another key's or policy's id".to_owned());
        }
        if store.check(b"a", q, 1).await.unwrap().is_allowed() {
            bad.push("a/q freed by p's id".to_owned());
        }
        // Release b, then renew it under a, and under b again.
        store.release(b"b", p, b).await.unwrap();
        if store.renew(b"a", p, b).await.unwrap() {
            bad.push("b's id renewed on a".to_owned());
        }
        if store.renew(b"b", p, b).await.unwrap() {
            bad.push("a released permit renewed".to_owned());
        }
        if !store.check(b"b", p, 1).await.unwrap().is_allowed() {
            bad.push("b not free after release and renewals".to_owned());
        }
        let _ = c;
        bad
    }
    let mut bad = run(&memory, &p, &q).await;
    bad.extend(
        run(&redis, &p, &q)
            .await
            .into_iter()
            .map(|s| format!("redis: {s}")),
    );
    assert!(bad.is_empty(), "{bad:#?}");
}

/// RELIABILITY.md, "Waiting for a slot": "In `Mode::Wait`, a request denied
/// by a full semaphore waits for a release"; the layer's `wait(max_delay)`
/// is the longest a request may wait. A slot freed at 900 ms of a 1 s wait
/// is never taken: the backoff (10, 20, 40, ... 250 ms, each plus up to 10%
/// jitter) last asks between 810 and 891 ms, and the next ask (1,060 ms or
/// later) "would exceed" the wait, so the request is refused then, over
/// 100 ms before its wait ends, although a slot is free for the last 100 ms.
#[tokio::test(start_paused = true)]
async fn a_waiting_request_takes_a_slot_freed_before_its_wait_ends() {
    use ratelimit_tower::GlobalKey;
    let store = tokio_memory();
    let policy = Policy::concurrency(1, Duration::from_secs(60)).unwrap();
    let global = ratelimit_tower::KeyExtractor::<Request<String>>::extract(
        &GlobalKey::default(),
        &Request::new(String::new()),
    )
    .expect("a global key");
    let held = store.check_now(global.as_bytes(), &policy, 1).unwrap();
    assert!(held.is_allowed());
    // The holder: the global key's permit, released at 900 ms.
    let layer = RateLimitLayer::new(store.clone(), policy.clone(), GlobalKey::default())
        .wait(Duration::from_secs(1));
    let holder_store = store.clone();
    let holder_policy = policy.clone();
    let permit = held.permit().unwrap();
    let started = tokio::time::Instant::now();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(900)).await;
        holder_store.release_now(global.as_bytes(), &holder_policy, permit);
    });
    let service = ServiceBuilder::new().layer(layer).service(ok_service());
    let status = service
        .oneshot(Request::new(String::new()))
        .await
        .expect("infallible")
        .status();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(100),
        "it did not wait ({took:?}): the permit was not on its key"
    );
    assert_eq!(
        status.as_u16(),
        200,
        "refused after {took:?} of a 1 s wait; the slot freed at 900 ms"
    );
}

/// SECURITY.md, "Trusted proxies": "A malformed entry yields the last
/// trusted hop, never a value an untrusted party wrote", and a client must
/// not be able to choose its key nor drain the budget every client behind
/// the proxy shares. A proxy that appends to the client's own `Forwarded`
/// line (`$http_forwarded, for=<client>`) after a client value with an
/// unterminated quote, or a dangling parameter, must still key the client
/// by the address its proxy wrote.
#[tokio::test]
async fn a_client_written_forwarded_prefix_never_picks_or_merges_the_key() {
    let config = client_ip_config("forwarded");
    let prefixes = [
        "for=\"198.51.100.1",
        "for=\"198.51.100.2\\",
        "for=198.51.100.3;by=\"x",
        "for=\"[2001:db8::1]",
        "for=\"198.51.100.4\";for",
        "proto=\"",
        "for=\"198.51.100.5, for=",
    ];
    let mut failures = Vec::new();
    for (n, prefix) in prefixes.iter().enumerate() {
        let layer = closed(config.clone());
        let attacker = format!("203.0.113.{}", 10 + n);
        let spoofed = format!("{prefix}, for={attacker}");
        let reqs = vec![
            req_from("10.0.0.5", &[("forwarded", &spoofed)]),
            req_from("10.0.0.5", &[("forwarded", &spoofed)]),
            // An honest client behind the same proxy.
            req_from("10.0.0.5", &[("forwarded", "for=203.0.113.99")]),
        ];
        let got = statuses(layer, reqs).await;
        if got != [200, 429, 200] {
            failures.push(format!("{spoofed:?}: {got:?}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Extreme numbers (limits up to 2^40, rates of one per day to 2^40 per
/// microsecond, windows of 1 µs to years), costs up to the limit, changes
/// between them under one name: both stores answer alike, with values in
/// range, and nothing panics.
#[tokio::test]
async fn extreme_numbers_decide_alike_on_both_stores() {
    use ratelimit_core::clock::{Clock, ManualClock};
    use ratelimit_core::{Rate, Store};
    let server = ratelimit_tests::RedisServer::start();
    let clock = ManualClock::new(1_700_000_000_000_000);
    let (memory, redis) = twin_stores(RedisStore::builder(server.url()), &clock).await;
    let limits = [1u64, 2, 1 << 20, (1 << 40) - 1, 1 << 40];
    let spans = [1u64, 999, 1_000_000, 86_400_000_000, 1 << 45];
    type Make = fn(u64, u64) -> Result<Policy, ratelimit_core::PolicyError>;
    let makes: [(&str, Make); 6] = [
        ("fixed", |l, w| {
            Policy::fixed_window(l, Duration::from_micros(w))
        }),
        ("counter", |l, w| {
            Policy::sliding_window_counter(l, Duration::from_micros(w))
        }),
        ("log", |l, w| {
            Policy::sliding_window_log(l, Duration::from_micros(w))
        }),
        ("token", |l, w| {
            Policy::token_bucket(l, Rate::new(l, Duration::from_micros(w)))
        }),
        ("gcra", |l, w| {
            Policy::gcra(l, Rate::new(1, Duration::from_micros(w)))
        }),
        ("leaky", |l, w| {
            Policy::leaky_bucket(l, Rate::new(l.div_ceil(3), Duration::from_micros(w)))
        }),
    ];
    let mut bad = Vec::new();
    for (name, make) in makes {
        let mut rng = Lcg(name.len() as u64 * 977);
        let key = format!("x-{name}");
        let mut expires: Option<u64> = None;
        let mut policy = None;
        for step in 0..300 {
            if policy.is_none() || rng.below(20) == 0 {
                let made = make(limits[rng.index(5)], spans[rng.index(5)]);
                if let Ok(p) = made {
                    policy = Some(p.with_name(format!("x-{name}")).unwrap());
                }
            }
            let Some(policy) = policy.as_ref() else {
                continue;
            };
            let now = clock.now();
            if expires.is_some_and(|e| now >= e) {
                server.cli(&["DEL", &redis.state_key(key.as_bytes(), policy)]);
                expires = None;
            }
            let cost = match rng.below(4) {
                0 => policy.limit(),
                1 => 1,
                2 => 1 + rng.below(policy.limit()),
                _ => policy.limit() / 2 + 1,
            };
            let m = memory.check_now(key.as_bytes(), policy, cost);
            let r = redis.check(key.as_bytes(), policy, cost).await;
            match (&m, &r) {
                (Ok(m), Ok(r)) => {
                    if (m.is_allowed(), m.remaining()) != (r.is_allowed(), r.remaining())
                        || m.remaining() > policy.limit()
                    {
                        bad.push(format!(
                            "{name} step {step} {policy:?} cost {cost}: memory {m:?} redis {r:?}"
                        ));
                        break;
                    }
                    if m.is_allowed() {
                        let reset = m.reset_after_micros();
                        expires = (reset > 0).then_some(now + reset);
                    }
                }
                (m, r) => {
                    if m.is_ok() != r.is_ok() {
                        bad.push(format!(
                            "{name} step {step} {policy:?} cost {cost}: memory {m:?} redis {r:?}"
                        ));
                        break;
                    }
                }
            }
            clock.advance(Duration::from_micros(match rng.below(4) {
                0 => 0,
                1 => rng.below(1_000),
                2 => rng.below(10_000_000),
                _ => rng.below(1 << 40),
            }));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// The `ip` key inside a key list (`["route", "ip"]`) keys IPv6 peers by
/// their /64 too, and an IPv4-mapped peer as its IPv4 address.
#[tokio::test]
async fn the_ip_key_in_a_list_keys_ipv6_by_network_and_mapped_as_ipv4() {
    let config = Config::from_toml(
        "[policies.api]\nalgorithm = \"gcra\"\nlimit = 1\nrate = \"1/h\"\n\n\
         [[rules]]\npolicy = \"api\"\nkey = [\"route\", \"ip\"]\n",
    )
    .expect("valid");
    let reqs = from_each(&["2001:db8:1:2::1", "2001:db8:1:2:ffff::2"]);
    assert_eq!(statuses(closed(config.clone()), reqs).await, [200, 429]);
    let reqs = from_each(&["192.0.2.7", "::ffff:192.0.2.7", "::ffff:c000:207"]);
    assert_eq!(statuses(closed(config), reqs).await, [200, 429, 429]);
}

/// A Kubernetes-style config map: the watched path is a symlink through
/// `..data`, which is swapped atomically to a new directory. The watcher
/// follows it, and a swap to a truncated file is refused.
#[tokio::test(start_paused = true)]
async fn the_watcher_follows_a_config_map_symlink_swap() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path();
    let v1 = root.join("..v1");
    std::fs::create_dir(&v1).unwrap();
    std::fs::write(v1.join("limits.toml"), api("api", 5)).unwrap();
    symlink("..v1", root.join("..data")).unwrap();
    symlink("..data/limits.toml", root.join("limits.toml")).unwrap();
    let path = root.join("limits.toml");
    let rules = ReloadableRules::from_file(&path).expect("valid");
    let watcher = rules.watch_file(&path, Duration::from_millis(5));
    let swap = |name: &str, text: String| {
        let v = root.join(name);
        std::fs::create_dir(&v).unwrap();
        std::fs::write(v.join("limits.toml"), text).unwrap();
        symlink(name, root.join("..tmp")).unwrap();
        std::fs::rename(root.join("..tmp"), root.join("..data")).unwrap();
    };
    // Truncated (no rules): refused.
    swap(
        "..v2",
        String::from("[policies.api]\nalgorithm = \"gcra\"\n"),
    );
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert_eq!(rules.current().policy("api").map(|p| p.limit()), Some(5));
    // Tightened: loaded.
    swap("..v3", api("api", 1));
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert_eq!(rules.current().policy("api").map(|p| p.limit()), Some(1));
    watcher.abort();
}
