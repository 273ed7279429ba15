//! Metrics: every outcome of `ratelimit_decisions_total`, near-limit counts,
//! store call durations and the circuit breaker's gauge, read back through a
//! local `DebuggingRecorder`, for the layer (a handler's `Limiter` is in
//! `tracing_events.rs`, with its `tracing` events); and the examples'
//! `/metrics` endpoints scraped over loopback in the Prometheus text format.
//!
//! Each in-process test runs on a current-thread runtime inside its own
//! local recorder (`ratelimit_tests::metrics::capture`), so tests running in
//! parallel never see each other's metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{Request, Response};
use ratelimit_core::clock::ManualClock;
use ratelimit_core::{CircuitBreaker, DeniedCache, FallbackStore, MemoryStore, Policy};
use ratelimit_tests::faulty::Faulty;
use ratelimit_tests::fixtures::{
    answer, by_client, fixed_window, frozen_memory, ok_service, request_from,
};
use ratelimit_tests::loopback::{client, get, statuses};
use ratelimit_tests::metrics::{
    CIRCUIT_BREAKER_STATE, CIRCUIT_BREAKER_TRANSITIONS, DECISIONS, NEAR_LIMIT, Recorded, Scrape,
    capture,
};
use ratelimit_tests::{ChildGuard, NO_EDGE, flags, free_port, named, spawn_example_lines};
use ratelimit_tower::metrics::STORE_CALL_DURATION;
use ratelimit_tower::{FailurePolicy, HeaderKey, MissingKey, PeerIp, RateLimitLayer, Rule};
use tower::{Layer, Service, ServiceExt};

/// The key of every request in these tests: it must never show in a label.
const SECRET_KEY: &str = "alice-secret-key-4242";

/// How long an example may take to print its first lines.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// [`by_client`] as a key extractor.
type ClientKey = fn(&Request<String>) -> Option<Vec<u8>>;

/// A fixed window of `limit` named `name`, with no edge in a test.
fn policy(name: &str, limit: u64) -> Policy {
    fixed_window(name, limit, NO_EDGE)
}

/// A layer keyed by client (`by_client`) on a frozen `MemoryStore`, with
/// the policy `name` of `limit` an hour.
fn per_client(name: &str, limit: u64) -> RateLimitLayer<MemoryStore<ManualClock>, Rule<ClientKey>> {
    RateLimitLayer::new(frozen_memory(), policy(name, limit), by_client)
}

/// Sends `n` requests from [`SECRET_KEY`] through `service`, one after the
/// other; their statuses.
async fn send_n<S, B>(service: &mut S, n: usize) -> Vec<u16>
where
    S: Service<Request<String>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let mut statuses = Vec::with_capacity(n);
    for _ in 0..n {
        let answer = answer(&mut *service, request_from(SECRET_KEY)).await;
        statuses.push(answer.status.as_u16());
    }
    statuses
}

fn assert_no_key_in_labels(recorded: &Recorded) {
    for value in recorded.label_values() {
        assert!(
            !value.contains(SECRET_KEY) && !value.contains("alice"),
            "a label holds the key: {value:?}"
        );
    }
}

/// How many store calls `recorded` timed with the outcome `outcome`.
fn store_calls(recorded: &Recorded, outcome: &str) -> usize {
    recorded
        .histogram(STORE_CALL_DURATION, &[("outcome", outcome)])
        .len()
}

fn counts(statuses: &[u16]) -> std::collections::BTreeMap<u16, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for &s in statuses {
        *counts.entry(s).or_insert(0) += 1;
    }
    counts
}

#[test]
fn allowed_and_denied_decisions_are_counted_by_policy_with_store_call_durations() {
    let (statuses, recorded) = capture(false, || async {
        let mut service = per_client("per-client", 10).layer(ok_service());
        send_n(&mut service, 13).await
    });
    assert_eq!(counts(&statuses), [(200, 10), (429, 3)].into());
    let labels = |outcome| [("policy", "per-client"), ("outcome", outcome)];
    assert_eq!(recorded.counter(DECISIONS, &labels("allowed")), 10);
    assert_eq!(recorded.counter(DECISIONS, &labels("denied")), 3);
    assert_eq!(
        recorded.counters_named(DECISIONS).len(),
        2,
        "only the outcomes that happened: {:?}",
        recorded.counters
    );
    // Under a tenth of 10 left: only the decision leaving 0.
    assert_eq!(recorded.counter(NEAR_LIMIT, &[("policy", "per-client")]), 1);
    let durations = recorded.histogram(STORE_CALL_DURATION, &[("outcome", "ok")]);
    assert_eq!(durations.len(), 13, "one store call per request");
    assert!(
        durations.iter().all(|&d| (0.0..1.0).contains(&d)),
        "{durations:?}"
    );
    assert_no_key_in_labels(&recorded);
}

#[test]
fn the_near_limit_fraction_is_configurable() {
    let (_, recorded) = capture(false, || async {
        let mut half = per_client("half", 10).near_limit(0.5).layer(ok_service());
        send_n(&mut half, 12).await;
        let mut never = per_client("never", 10).near_limit(0.0).layer(ok_service());
        send_n(&mut never, 12).await;
    });
    // Remaining 4, 3, 2, 1 and 0 are under half of 10; denials never count.
    assert_eq!(recorded.counter(NEAR_LIMIT, &[("policy", "half")]), 5);
    assert_eq!(recorded.counter(NEAR_LIMIT, &[("policy", "never")]), 0);
    assert_no_key_in_labels(&recorded);
}

/// A `MemoryStore` whose decisions fail: the store is down.
fn flaky_down() -> Faulty<MemoryStore> {
    Faulty::decisions_refused_while(Arc::new(AtomicBool::new(true)))
}

#[test]
fn store_failures_count_as_errors_whatever_the_failure_policy() {
    let (statuses, recorded) = capture(false, || async {
        let mut open = RateLimitLayer::new(flaky_down(), policy("open", 5), by_client)
            .on_failure(FailurePolicy::Open)
            .layer(ok_service());
        let mut closed = RateLimitLayer::new(flaky_down(), policy("closed", 5), by_client)
            .on_failure(FailurePolicy::Closed)
            .layer(ok_service());
        (send_n(&mut open, 3).await, send_n(&mut closed, 2).await)
    });
    assert_eq!(statuses, (vec![200; 3], vec![503; 2]));
    assert_eq!(recorded.outcome(DECISIONS, "open", "error"), 3);
    assert_eq!(recorded.outcome(DECISIONS, "closed", "error"), 2);
    assert_eq!(recorded.counters_named(DECISIONS).len(), 2);
    assert_eq!(store_calls(&recorded, "error"), 5);
    assert_eq!(store_calls(&recorded, "ok"), 0);
    assert_no_key_in_labels(&recorded);
}

/// A store error that is not an outage (here a policy conflict: one name,
/// two algorithms in one store) is refused and counted as `invalid`, never
/// `error`, even with fail open.
#[test]
fn errors_that_are_not_outages_count_as_invalid_and_are_refused() {
    let (statuses, recorded) = capture(false, || async {
        let store = frozen_memory();
        let window = policy("shared-name", 5);
        let bucket = named(
            "shared-name",
            Policy::gcra(5, ratelimit_core::Rate::per_second(1)),
        );
        let mut first = RateLimitLayer::new(store.clone(), window, by_client)
            .on_failure(FailurePolicy::Open)
            .layer(ok_service());
        let mut second = RateLimitLayer::new(store, bucket, by_client)
            .on_failure(FailurePolicy::Open)
            .layer(ok_service());
        (send_n(&mut first, 1).await, send_n(&mut second, 2).await)
    });
    assert_eq!(statuses, (vec![200], vec![500; 2]));
    assert_eq!(
        recorded.counter(
            DECISIONS,
            &[("policy", "shared-name"), ("outcome", "invalid")]
        ),
        2
    );
    assert_eq!(
        recorded.counter(
            DECISIONS,
            &[("policy", "shared-name"), ("outcome", "error")]
        ),
        0
    );
    assert_no_key_in_labels(&recorded);
}

#[test]
fn fallback_decisions_are_counted_and_the_breaker_reports_every_transition() {
    let cool_down = Duration::from_millis(50);
    let (statuses, recorded) = capture(false, || async move {
        let down = Arc::new(AtomicBool::new(true));
        let primary = Faulty::decisions_refused_while(down.clone());
        let breaker = Arc::new(CircuitBreaker::new(2, cool_down).with_name("test-primary"));
        let store = FallbackStore::new(primary.clone(), MemoryStore::new(), 2, breaker.clone());
        // 6 per hour shared by 2 instances: 3 each while the primary is down.
        let mut service =
            RateLimitLayer::new(store, policy("shared", 6), by_client).layer(ok_service());
        let mut statuses = send_n(&mut service, 5).await;
        assert_eq!(
            breaker.state(),
            ratelimit_core::BreakerState::Open,
            "open after 2 failures"
        );
        // The primary is back: after the cool-down, a probe closes the breaker.
        down.store(false, Ordering::Relaxed);
        tokio::time::sleep(cool_down * 2).await;
        statuses.extend(send_n(&mut service, 1).await);
        assert_eq!(breaker.state(), ratelimit_core::BreakerState::Closed);
        statuses
    });
    assert_eq!(statuses, [200, 200, 200, 429, 429, 200]);
    let outcome = |outcome| recorded.outcome(DECISIONS, "shared", outcome);
    assert_eq!(
        outcome("fallback"),
        5,
        "allowed or denied, the fallback decided"
    );
    assert_eq!(outcome("allowed"), 1, "the primary decided the probe");
    assert_eq!(recorded.counters_named(DECISIONS).len(), 2);
    // From the layer's side every call succeeded: the fallback answered.
    assert_eq!(store_calls(&recorded, "ok"), 6);

    let breaker = [("breaker", "test-primary")];
    assert_eq!(recorded.gauge(CIRCUIT_BREAKER_STATE, &breaker), Some(0.0));
    let transition = |from, to| {
        recorded.counter(
            CIRCUIT_BREAKER_TRANSITIONS,
            &[("breaker", "test-primary"), ("from", from), ("to", to)],
        )
    };
    assert_eq!(transition("closed", "open"), 1);
    assert_eq!(transition("open", "half_open"), 1);
    assert_eq!(transition("half_open", "closed"), 1);
    assert_eq!(
        recorded.counters_named(CIRCUIT_BREAKER_TRANSITIONS).len(),
        3
    );
    assert_no_key_in_labels(&recorded);
}

#[test]
fn the_breaker_gauge_reads_open_while_the_primary_is_down() {
    let ((), recorded) = capture(false, || async {
        let breaker = Arc::new(CircuitBreaker::new(3, Duration::from_secs(3600)));
        let store = FallbackStore::new(flaky_down(), MemoryStore::new(), 1, breaker);
        let mut service =
            RateLimitLayer::new(store, policy("down", 100), by_client).layer(ok_service());
        assert_eq!(send_n(&mut service, 10).await, vec![200; 10]);
    });
    // Unnamed breakers are "default".
    assert_eq!(
        recorded.gauge(CIRCUIT_BREAKER_STATE, &[("breaker", "default")]),
        Some(2.0)
    );
    assert_eq!(recorded.outcome(DECISIONS, "down", "fallback"), 10);
}

#[test]
fn denials_answered_by_the_denied_cache_are_counted_as_cached_denied() {
    let (statuses, recorded) = capture(false, || async {
        let store = DeniedCache::new(MemoryStore::new());
        let mut service =
            RateLimitLayer::new(store.clone(), policy("cached", 2), by_client).layer(ok_service());
        let statuses = send_n(&mut service, 7).await;
        assert_eq!(store.hits(), 4);
        statuses
    });
    assert_eq!(counts(&statuses), [(200, 2), (429, 5)].into());
    let outcome = |outcome| recorded.outcome(DECISIONS, "cached", outcome);
    assert_eq!(outcome("allowed"), 2);
    assert_eq!(outcome("denied"), 1, "the store's denial, then cached");
    assert_eq!(outcome("cached_denied"), 4);
    assert_no_key_in_labels(&recorded);
}

#[test]
fn shadow_denials_are_counted_apart_from_enforced_ones() {
    let (statuses, recorded) = capture(false, || async {
        let mut service = per_client("enforced", 3)
            .and(Rule::new(policy("trial", 1).with_shadow(true), by_client))
            .layer(ok_service());
        send_n(&mut service, 5).await
    });
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    recorded.assert_outcomes(DECISIONS, "enforced", "allowed=3 denied=2");
    recorded.assert_outcomes(DECISIONS, "trial", "allowed=1 shadow_denied=4");
    assert_eq!(recorded.counters_named(DECISIONS).len(), 4);
    assert_eq!(
        store_calls(&recorded, "ok"),
        10,
        "two store calls per request: the enforced and the shadow group"
    );
    assert_no_key_in_labels(&recorded);
}

#[test]
fn a_policy_that_allowed_while_another_denied_counts_not_consumed() {
    let (statuses, recorded) = capture(false, || async {
        let mut service = per_client("wide", 10)
            .and(Rule::new(policy("narrow", 2), by_client))
            .layer(ok_service());
        send_n(&mut service, 5).await
    });
    assert_eq!(statuses, [200, 200, 429, 429, 429]);
    // `allowed` counts what passed: the wide policy consumed nothing for the
    // three requests the narrow one refused.
    recorded.assert_outcomes(DECISIONS, "wide", "allowed=2 not_consumed=3");
    recorded.assert_outcomes(DECISIONS, "narrow", "allowed=2 denied=3");
    assert_no_key_in_labels(&recorded);
}

/// Two requests without a key or a peer address.
async fn send_two<S, B>(service: S) -> Vec<u16>
where
    S: Service<Request<String>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
{
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let response = service
            .clone()
            .oneshot(Request::new(String::new()))
            .await
            .unwrap();
        statuses.push(response.status().as_u16());
    }
    statuses
}

#[test]
fn missing_keys_and_missing_peers_are_counted_under_their_policy() {
    let api_key = http::HeaderName::from_static("x-api-key");
    let (statuses, recorded) = capture(false, || async {
        let refused = RateLimitLayer::new(
            frozen_memory(),
            policy("keyed", 10),
            HeaderKey::new(api_key.clone()),
        )
        .layer(ok_service());
        let allowed = RateLimitLayer::new(
            frozen_memory(),
            policy("optional", 10),
            HeaderKey::new(api_key),
        )
        .on_missing_key(MissingKey::Allow)
        .layer(ok_service());
        let no_peer =
            RateLimitLayer::new(frozen_memory(), policy("per-ip", 10), PeerIp).layer(ok_service());
        let mut statuses = Vec::new();
        statuses.extend(send_two(refused).await);
        statuses.extend(send_two(allowed).await);
        statuses.extend(send_two(no_peer).await);
        statuses
    });
    assert_eq!(statuses, [429, 429, 200, 200, 500, 500]);
    recorded.assert_outcomes(DECISIONS, "keyed", "missing_key_rejected=2");
    recorded.assert_outcomes(DECISIONS, "optional", "missing_key_allowed=2");
    recorded.assert_outcomes(DECISIONS, "per-ip", "no_peer_address=2");
}

#[test]
fn describe_gives_help_and_units() {
    let ((), recorded) = capture(false, || async {
        ratelimit_tower::metrics::describe();
        let mut service = per_client("described", 1).layer(ok_service());
        send_n(&mut service, 2).await;
    });
    assert_eq!(recorded.described.get(DECISIONS), Some(&None));
    assert_eq!(recorded.described.get(NEAR_LIMIT), Some(&None));
    assert_eq!(
        recorded.described.get(STORE_CALL_DURATION),
        Some(&Some(metrics::Unit::Seconds))
    );
}

// ---- the examples' /metrics, scraped over loopback ----

/// GETs `url` (a `/metrics` endpoint): the text, checked to be the
/// Prometheus text format, parsed.
async fn scrape(client: &reqwest::Client, url: &str) -> (String, Scrape) {
    let response = client
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(response.status().as_u16(), 200, "GET {url}");
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    let text = response.text().await.unwrap();
    let parsed = Scrape::parse(&text);
    (text, parsed)
}

/// The first line of the example: `listening on http://ADDR` → `http://ADDR`.
fn base_of(line: &str) -> String {
    line.strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("not a listening line: {line:?}"))
        .to_owned()
}

/// An example serving metrics on their own address.
struct WithMetrics {
    _process: ChildGuard,
    /// The lines it printed.
    lines: Vec<String>,
    /// `http://ADDR` of the app.
    base: String,
    /// `ADDR` of the metrics listener.
    metrics: String,
}

/// Spawns the example `name` with `--listen` and `--metrics` on free
/// loopback ports and then `args`, and waits for its first `lines` lines.
fn spawn_with_metrics(name: &str, args: &[&str], lines: usize) -> WithMetrics {
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut all = vec!["--listen", &listen, "--metrics", &metrics];
    all.extend_from_slice(args);
    let (process, lines) = spawn_example_lines(name, &all, lines, START_TIMEOUT);
    WithMetrics {
        _process: process,
        base: base_of(&lines[0]),
        lines,
        metrics,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prometheus_example_serves_every_metric_on_its_listener() {
    let listen = format!("127.0.0.1:{}", free_port());
    let (_example, lines) = spawn_example_lines(
        "prometheus",
        &[
            "--listen",
            &listen,
            "--limit",
            "3",
            "--shadow-limit",
            "1",
            "--window",
            "1000d",
        ],
        2,
        START_TIMEOUT,
    );
    let base = base_of(&lines[0]);
    assert_eq!(lines[1], format!("metrics on {base}/metrics"));
    let client = client();
    let statuses = statuses(&client, &format!("{base}/"), SECRET_KEY, 5).await;
    assert_eq!(statuses, [200, 200, 200, 429, 429]);

    let (text, page) = scrape(&client, &format!("{base}/metrics")).await;
    assert_eq!(page.types[DECISIONS], "counter");
    assert_eq!(page.types[NEAR_LIMIT], "counter");
    assert_eq!(page.types[STORE_CALL_DURATION], "histogram");
    let decisions =
        |policy, outcome| page.value(DECISIONS, &[("policy", policy), ("outcome", outcome)]);
    assert_eq!(decisions("per-client", "allowed"), Some(3.0));
    assert_eq!(decisions("per-client", "denied"), Some(2.0));
    assert_eq!(decisions("per-client-trial", "allowed"), Some(1.0));
    assert_eq!(decisions("per-client-trial", "shadow_denied"), Some(4.0));
    assert_eq!(page.named(DECISIONS).len(), 4, "{text}");
    assert_eq!(
        page.value(NEAR_LIMIT, &[("policy", "per-client")]),
        Some(1.0)
    );
    assert_eq!(
        page.value(
            &format!("{STORE_CALL_DURATION}_count"),
            &[("outcome", "ok")]
        ),
        Some(10.0),
        "{text}"
    );
    assert_eq!(
        page.value(
            &format!("{STORE_CALL_DURATION}_bucket"),
            &[("outcome", "ok"), ("le", "+Inf")]
        ),
        Some(10.0)
    );
    assert!(!text.contains(SECRET_KEY), "the key shows in:\n{text}");
    let hashed = ratelimit_core::key::hashed(SECRET_KEY.as_bytes());
    assert!(
        !text.contains(std::str::from_utf8(&hashed[1..]).unwrap()),
        "the hashed key shows in:\n{text}"
    );

    // Scrapes are not rate limited, and do not count.
    for _ in 0..5 {
        scrape(&client, &format!("{base}/metrics")).await;
    }
    let (_, again) = scrape(&client, &format!("{base}/metrics")).await;
    assert_eq!(again.named(DECISIONS), page.named(DECISIONS));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prometheus_example_serves_metrics_on_their_own_address_with_cached_denials() {
    let example = spawn_with_metrics(
        "prometheus",
        &["--limit", "2", "--window", "1000d", "--denied-cache"],
        2,
    );
    let (base, metrics) = (&example.base, &example.metrics);
    assert_eq!(
        example.lines[1],
        format!("metrics on http://{metrics}/metrics")
    );
    let client = client();
    let statuses = statuses(&client, &format!("{base}/"), SECRET_KEY, 5).await;
    assert_eq!(statuses, [200, 200, 429, 429, 429]);
    assert_eq!(
        get(&client, &format!("{base}/metrics"), "").await.status,
        404,
        "not on the app's listener"
    );
    let (text, page) = scrape(&client, &format!("http://{metrics}/metrics")).await;
    let decisions =
        |outcome| page.value(DECISIONS, &[("policy", "per-client"), ("outcome", outcome)]);
    assert_eq!(decisions("allowed"), Some(2.0), "{text}");
    assert_eq!(decisions("denied"), Some(1.0), "{text}");
    assert_eq!(decisions("cached_denied"), Some(2.0), "{text}");
    assert!(!text.contains(SECRET_KEY));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_with_redis_down_counts_fallback_decisions_and_the_open_breaker() {
    // Nothing listens there: every Redis call is refused at once.
    let dead_redis = format!("redis://127.0.0.1:{}", free_port());
    let mut args = flags("--algorithm fixed-window --limit 4 --window 1000d --failure fallback");
    args.extend(flags("--instances 2 --timeout 200ms --redis"));
    args.push(&dead_redis);
    let example = spawn_with_metrics("distributed", &args, 1);
    let (base, metrics) = (&example.base, &example.metrics);
    let client = client();
    let statuses = statuses(&client, &format!("{base}/"), SECRET_KEY, 5).await;
    // 4 divided between 2 instances.
    assert_eq!(statuses, [200, 200, 429, 429, 429]);
    let (text, page) = scrape(&client, &format!("http://{metrics}/metrics")).await;
    // Each request is decided under both policies, per client IP and per
    // client, by the fallback.
    let decisions = page.named(DECISIONS);
    assert_eq!(decisions.len(), 2, "{text}");
    for (labels, count) in decisions {
        assert_eq!(labels["outcome"], "fallback", "{text}");
        assert_eq!(count, 5.0, "{text}");
    }
    for policy in [
        "fixed-window-4-per-1000d",
        "per-ip-fixed-window-4-per-1000d",
    ] {
        assert_eq!(
            page.value(DECISIONS, &[("policy", policy), ("outcome", "fallback")]),
            Some(5.0),
            "{text}"
        );
    }
    assert_eq!(page.types[CIRCUIT_BREAKER_STATE], "gauge");
    assert_eq!(
        page.value(CIRCUIT_BREAKER_STATE, &[("breaker", "redis")]),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        page.value(
            CIRCUIT_BREAKER_TRANSITIONS,
            &[("breaker", "redis"), ("from", "closed"), ("to", "open")]
        ),
        Some(1.0),
        "{text}"
    );
    assert!(!text.contains(SECRET_KEY));
}
