//! Shadow policies: decided, consuming, counted and in the headers, never
//! refusing; enforced policies alongside keep their exact semantics; permits
//! of both are released; wait mode never waits for them; and the
//! `distributed` example's `--shadow` seen through its `/metrics`.

use std::convert::Infallible;
use std::future::ready;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use ratelimit_core::clock::ManualClock;
use ratelimit_core::{MemoryStore, Policy, Rate, Store, StoreError};
use ratelimit_tests::faulty::Faulty;
use ratelimit_tests::fixtures::tokio_memory;
use ratelimit_tests::fixtures::{
    Answer, answer, by_client, fixed_window, frozen_memory, request_from,
};
use ratelimit_tests::loopback::client;
use ratelimit_tests::metrics::DECISIONS;
use ratelimit_tests::metrics::{Scrape, capture};
use ratelimit_tests::{RedisServer, flags, free_port, named, spawn_listening};
use ratelimit_tower::body::ResponseBody;
use ratelimit_tower::{Decisions, FailurePolicy, Key, RateLimitLayer, Rule};
use tower::{Layer, Service, ServiceExt, service_fn};

const KEY: &str = "client-1";

fn request() -> Request<String> {
    request_from(KEY)
}

fn per_ten_seconds(name: &str, limit: u64) -> Policy {
    fixed_window(name, limit, Duration::from_secs(10))
}

/// The inner service: answers what the layer decided, as the handler sees it.
fn echo_service()
-> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future: Send>
+ Clone
+ Send {
    service_fn(|req: Request<String>| {
        let decisions = req
            .extensions()
            .get::<Decisions>()
            .cloned()
            .unwrap_or_default();
        let mut body = format!("allowed={}", decisions.allowed());
        for entry in &decisions {
            body.push_str(&format!(
                " {}:{}{}",
                entry.policy().name(),
                if entry.decision().is_allowed() {
                    "allowed"
                } else {
                    "denied"
                },
                if entry.is_shadow() { ":shadow" } else { "" },
            ));
        }
        ready(Ok::<_, Infallible>(Response::new(body)))
    })
}

/// Sends a request from [`KEY`] through `service`; the whole answer.
async fn send<S>(service: &mut S) -> Answer
where
    S: Service<Request<String>, Response = Response<ResponseBody<String>>>,
    S::Error: std::fmt::Debug,
{
    answer(service, request()).await
}

/// `enforced`, then `trial` (a shadow policy) as a rule of its own, both
/// keyed by client, on `store` around [`echo_service`].
fn with_trial(
    store: &MemoryStore<ManualClock>,
    enforced: &Policy,
    trial: &Policy,
) -> impl Service<Request<String>, Response = Response<ResponseBody<String>>, Error = Infallible> {
    RateLimitLayer::new(store.clone(), enforced.clone(), by_client)
        .and(Rule::new(trial.clone(), by_client))
        .layer(echo_service())
}

/// An enforced policy and a shadow one on a frozen store, both keyed by
/// client.
struct Trial {
    store: MemoryStore<ManualClock>,
    enforced: Policy,
    trial: Policy,
}

impl Trial {
    /// `enforced` and `trial`, made a shadow policy, on a new frozen store.
    fn new(enforced: Policy, trial: Policy) -> Trial {
        Trial {
            store: frozen_memory(),
            enforced,
            trial: trial.with_shadow(true),
        }
    }

    /// `enforced` as `per-client` and `trial` as `trial`, fixed windows of
    /// 10 s.
    fn per_ten_seconds(enforced: u64, trial: u64) -> Trial {
        Trial::new(
            per_ten_seconds("per-client", enforced),
            per_ten_seconds("trial", trial),
        )
    }

    /// The layer of both policies around [`echo_service`].
    fn service(
        &self,
    ) -> impl Service<Request<String>, Response = Response<ResponseBody<String>>, Error = Infallible>
    {
        with_trial(&self.store, &self.enforced, &self.trial)
    }

    /// What remains of the enforced policy and of the trial.
    async fn remaining(&self) -> (u64, u64) {
        (
            remaining(&self.store, &self.enforced).await,
            remaining(&self.store, &self.trial).await,
        )
    }
}

/// What remains of `policy` for [`KEY`] in `store` (a peek: cost 0), under
/// the key the layer and the `Limiter` give it.
async fn remaining<St: Store>(store: &St, policy: &Policy) -> u64 {
    store
        .check(Key::from(KEY).as_bytes(), policy, 0)
        .await
        .unwrap()
        .remaining()
}

#[test]
fn a_shadow_policy_admits_everything_and_counts_exactly_what_it_would_deny() {
    let (answers, recorded) = capture(false, || async {
        let store = frozen_memory();
        let trial = per_ten_seconds("trial", 3).with_shadow(true);
        let mut service =
            RateLimitLayer::new(store.clone(), trial.clone(), by_client).layer(echo_service());
        let mut answers = Vec::new();
        for _ in 0..10 {
            answers.push(send(&mut service).await);
        }
        assert_eq!(remaining(&store, &trial).await, 0, "it consumed");
        answers
    });
    for (i, answer) in answers.iter().enumerate() {
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "request {i}: {}",
            answer.body
        );
        assert!(answer.headers.get("retry-after").is_none());
        assert_eq!(answer.header("ratelimit-policy"), r#""trial";q=3;w=10"#);
        let state = answer.header("ratelimit");
        if i < 3 {
            assert_eq!(answer.body, "allowed=true trial:allowed:shadow");
            assert!(
                state.starts_with(&format!(r#""trial";r={};t="#, 2 - i)),
                "{state}"
            );
        } else {
            assert_eq!(answer.body, "allowed=true trial:denied:shadow");
            assert_eq!(state, r#""trial";r=0;t=10"#, "t: when it would pass again");
        }
    }
    // Not one `denied`: the shadow policy only ever reports.
    recorded.assert_outcomes(DECISIONS, "trial", "allowed=3 shadow_denied=7");
}

#[test]
fn an_enforced_policy_alongside_is_still_enforced_and_consumes_as_if_alone() {
    let (answers, recorded) = capture(false, || async {
        let trial = Trial::per_ten_seconds(5, 2);
        let mut service = trial.service();
        let mut answers = Vec::new();
        for _ in 0..8 {
            answers.push(send(&mut service).await);
        }
        // Both consumed on their own: the shadow's denials never stopped the
        // enforced policy (all or nothing would have stopped it at 2).
        assert_eq!(trial.remaining().await, (0, 0));
        answers
    });
    let statuses: Vec<u16> = answers.iter().map(|a| a.status.as_u16()).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);
    assert_eq!(
        answers[0].body,
        "allowed=true per-client:allowed trial:allowed:shadow"
    );
    assert_eq!(
        answers[2].body,
        "allowed=true per-client:allowed trial:denied:shadow"
    );
    for answer in &answers {
        assert_eq!(
            answer.header("ratelimit-policy"),
            r#""per-client";q=5;w=10, "trial";q=2;w=10"#
        );
    }
    let refused = &answers[5];
    assert_eq!(refused.header("retry-after"), "10");
    assert!(
        refused
            .body
            .contains(r#""violated-policies":["per-client"]"#),
        "the shadow policy is not named: {}",
        refused.body
    );
    assert_eq!(
        refused.header("ratelimit"),
        r#""per-client";r=0;t=10, "trial";r=0;t=10"#,
        "the shadow decision is not hidden by the enforced denial"
    );
    recorded.assert_outcomes(DECISIONS, "per-client", "allowed=5 denied=3");
    recorded.assert_outcomes(DECISIONS, "trial", "allowed=2 shadow_denied=6");
}

#[test]
fn a_shadow_policy_consumes_even_for_requests_the_enforced_one_refuses() {
    let ((), recorded) = capture(false, || async {
        let trial = Trial::per_ten_seconds(2, 5);
        let mut service = trial.service();
        let mut statuses = Vec::new();
        for _ in 0..4 {
            statuses.push(send(&mut service).await.status.as_u16());
        }
        assert_eq!(statuses, [200, 200, 429, 429]);
        // The trial kept 1: the documented consequence of deciding the
        // groups apart.
        assert_eq!(trial.remaining().await, (0, 1));
    });
    recorded.assert_outcomes(DECISIONS, "per-client", "allowed=2 denied=2");
    // No `shadow_denied`.
    recorded.assert_outcomes(DECISIONS, "trial", "allowed=4");
}

#[test]
fn several_shadow_policies_are_all_or_nothing_among_themselves_only() {
    let ((), recorded) = capture(false, || async {
        let store = frozen_memory();
        let enforced = per_ten_seconds("per-client", 10);
        let wide = per_ten_seconds("wide", 4).with_shadow(true);
        let narrow = per_ten_seconds("narrow", 2).with_shadow(true);
        let mut service = RateLimitLayer::new(store.clone(), enforced.clone(), by_client)
            .and(Rule::new(wide.clone(), by_client))
            .and(Rule::new(narrow.clone(), by_client))
            .layer(echo_service());
        for _ in 0..5 {
            assert_eq!(send(&mut service).await.status, StatusCode::OK);
        }
        assert_eq!(remaining(&store, &enforced).await, 5);
        // Once `narrow` denied, the shadow group consumed nothing more.
        assert_eq!(remaining(&store, &narrow).await, 0);
        assert_eq!(remaining(&store, &wide).await, 2);
    });
    recorded.assert_outcomes(DECISIONS, "per-client", "allowed=5");
    recorded.assert_outcomes(DECISIONS, "narrow", "allowed=2 shadow_denied=3");
    // `wide` allowed each time, but the group was denied for three: those
    // consumed nothing under it.
    recorded.assert_outcomes(DECISIONS, "wide", "allowed=2 not_consumed=3");
}

#[test]
fn concurrency_permits_of_shadow_and_enforced_policies_are_released() {
    capture(false, || async {
        let lease = Duration::from_secs(3600);
        let trial = Trial::new(
            named("in-flight", Policy::concurrency(1, lease)),
            named("in-flight-trial", Policy::concurrency(5, lease)),
        );
        let mut service = trial.service();

        // The first response is held: its body keeps both permits.
        let held = service
            .ready()
            .await
            .unwrap()
            .call(request())
            .await
            .unwrap();
        assert_eq!(held.status(), StatusCode::OK);
        assert_eq!(trial.remaining().await, (0, 4));

        // Refused by the enforced policy while the first is in flight: the
        // shadow permit it took is released at once.
        for _ in 0..3 {
            assert_eq!(
                send(&mut service).await.status,
                StatusCode::TOO_MANY_REQUESTS
            );
        }
        assert_eq!(trial.remaining().await, (0, 4));

        // The body ends: both permits come back.
        let body = held.into_body().collect().await.unwrap().to_bytes();
        assert!(body.starts_with(b"allowed=true"));
        assert_eq!(trial.remaining().await, (1, 5));

        // A shadow concurrency policy alone: permits held and released too.
        let mut alone = RateLimitLayer::new(trial.store.clone(), trial.trial.clone(), by_client)
            .layer(echo_service());
        let mut responses = Vec::new();
        for _ in 0..7 {
            let response = alone.ready().await.unwrap().call(request()).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK, "a shadow never refuses");
            responses.push(response);
        }
        assert_eq!(trial.remaining().await.1, 0);
        drop(responses);
        assert_eq!(trial.remaining().await.1, 5);
    });
}

#[test]
fn wait_mode_never_waits_for_a_shadow_policy_and_decides_it_once_per_request() {
    let ((), recorded) = capture(true, || async {
        let store = tokio_memory();
        // A shadow denial and a shadow leaky-bucket slot: neither may delay.
        let trial = per_ten_seconds("trial", 1).with_shadow(true);
        let spaced =
            named("spaced", Policy::leaky_bucket(10, Rate::per_second(1))).with_shadow(true);
        let mut service = RateLimitLayer::new(store.clone(), trial.clone(), by_client)
            .and(Rule::new(spaced, by_client))
            .wait(Duration::from_secs(30))
            .layer(echo_service());
        let start = tokio::time::Instant::now();
        for _ in 0..4 {
            assert_eq!(send(&mut service).await.status, StatusCode::OK);
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "no request waited");

        // An enforced policy that makes requests wait: one per second. The
        // shadow policy beside it is asked once per request, not per attempt.
        let enforced = named("one-per-second", Policy::gcra(1, Rate::per_second(1)));
        let counted = fixed_window("counted", 100, Duration::from_secs(3600)).with_shadow(true);
        let mut service = RateLimitLayer::new(store.clone(), enforced, by_client)
            .and(Rule::new(counted.clone(), by_client))
            .wait(Duration::from_secs(30))
            .layer(echo_service());
        let start = tokio::time::Instant::now();
        for _ in 0..3 {
            assert_eq!(send(&mut service).await.status, StatusCode::OK);
        }
        assert!(
            start.elapsed() >= Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(remaining(&store, &counted).await, 97);
    });
    recorded.assert_outcomes(DECISIONS, "trial", "allowed=1 shadow_denied=3");
    recorded.assert_outcomes(DECISIONS, "counted", "allowed=3");
    let count = |outcome| recorded.outcome(DECISIONS, "one-per-second", outcome);
    assert_eq!(count("allowed"), 3);
    assert!(count("denied") >= 2, "waited attempts count");
}

/// A `MemoryStore` whose decisions involving the policy named `trial` fail.
fn fails_for_trial() -> Faulty<MemoryStore<ManualClock>> {
    Faulty::new(frozen_memory(), |call| {
        (call.decides() && call.names("trial"))
            .then(|| StoreError::Unavailable("the shard of trial is down".into()))
    })
}

#[test]
fn a_store_failure_on_shadow_policies_changes_nothing_for_the_request() {
    let (stats, recorded) = capture(false, || async {
        let layer = RateLimitLayer::new(
            fails_for_trial(),
            per_ten_seconds("per-client", 2),
            by_client,
        )
        .and(Rule::new(
            per_ten_seconds("trial", 1).with_shadow(true),
            by_client,
        ))
        .on_failure(FailurePolicy::Closed);
        let mut service = layer.layer(echo_service());
        let mut statuses = Vec::new();
        for _ in 0..3 {
            let answer = send(&mut service).await;
            statuses.push(answer.status.as_u16());
            if answer.status == StatusCode::OK {
                assert!(answer.body.starts_with("allowed=true per-client:allowed"));
                assert!(!answer.body.contains("trial"), "{}", answer.body);
            }
        }
        assert_eq!(statuses, [200, 200, 429]);
        (layer.stats().failed_open(), layer.stats().failed_closed())
    });
    assert_eq!(stats, (0, 0), "the failure policy was never asked");
    recorded.assert_outcomes(DECISIONS, "trial", "error=3");
    recorded.assert_outcomes(DECISIONS, "per-client", "allowed=2 denied=1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_shadow_admits_everything_and_its_metrics_count_what_it_would_deny() {
    let redis = RedisServer::start();
    let url = redis.url();
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut args = flags("--algorithm fixed-window --limit 3 --window 1000d --shadow");
    args.extend(["--redis", &url, "--metrics", &metrics]);
    let example = spawn_listening("distributed", &args, Duration::from_secs(60));
    let client = client();
    let mut policy_names = Vec::new();
    for i in 0..7 {
        let response = client
            .get(format!("{}/", example.base))
            .header("x-api-key", "shadow-secret")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200, "request {i}");
        assert!(response.headers().get("retry-after").is_none());
        let state = response.headers()["ratelimit"].to_str().unwrap().to_owned();
        let expected_r = 2_i64.saturating_sub(i).max(0);
        assert!(
            state.contains(&format!(";r={expected_r};")),
            "request {i}: {state}"
        );
        let policy = response.headers()["ratelimit-policy"]
            .to_str()
            .unwrap()
            .to_owned();
        policy_names.push(policy.split('"').nth(1).unwrap().to_owned());
    }
    // The per-IP policy first, then the per-client one: both in shadow mode.
    let name = policy_names[0].clone();
    assert!(name.starts_with("per-ip-"), "{name}");
    assert!(policy_names.iter().all(|n| *n == name));

    let response = client
        .get(format!("http://{metrics}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let text = response.text().await.unwrap();
    let page = Scrape::parse(&text);
    assert_eq!(page.types[DECISIONS], "counter", "{text}");
    let decisions = page.named(DECISIONS);
    assert_eq!(decisions.len(), 4, "{text}");
    let per_client = name.strip_prefix("per-ip-").unwrap_or_default();
    for policy in [name.as_str(), per_client] {
        let count = |outcome| page.value(DECISIONS, &[("policy", policy), ("outcome", outcome)]);
        assert_eq!(count("allowed"), Some(3.0), "{policy}: {text}");
        assert_eq!(count("shadow_denied"), Some(4.0), "{policy}: {text}");
    }
    assert!(!text.contains("shadow-secret"));
}

#[tokio::test]
async fn a_shadow_policy_checked_in_a_handler_is_always_granted() {
    let store = frozen_memory();
    let login = per_ten_seconds("login", 1).with_shadow(true);
    let limiter = ratelimit_axum::Limiter::new(store.clone(), login.clone());
    for _ in 0..3 {
        assert!(limiter.check(KEY.as_bytes(), 1).await.is_ok());
    }
    assert_eq!(remaining(&store, &login).await, 0, "it consumed");
}
