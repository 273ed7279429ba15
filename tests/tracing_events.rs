//! What the libraries log: a missing peer address once per layer at
//! `error`, and a handler's `Limiter` a `debug` event per decision, as the
//! layer does. A binary of its own: `tracing` caches per call site whether
//! anyone listens, so a test that asserts events must own the process's
//! subscriber ([`Events::of_this_process`]).

use std::time::Duration;

use std::convert::Infallible;
use std::future::ready;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use http::{Request, Response, StatusCode};
use ratelimit_axum::{FailurePolicy, MemoryStore, Mode, PeerIp, Policy, RateLimitLayer};
use ratelimit_tests::events::Events;
use ratelimit_tests::faulty::Faulty;
use ratelimit_tests::fixtures::{
    answer, by_client, fixed_window, frozen_memory, ok_service, request_from,
};
use ratelimit_tests::metrics::{DECISIONS, NEAR_LIMIT, SETTLEMENTS, capture};
use ratelimit_tests::named;
use ratelimit_tower::Settlement;
use ratelimit_tower::metrics::STORE_CALL_DURATION;
use tower::{Layer, ServiceExt, service_fn};

/// The key of the limiter's requests: it must never show in a label or an
/// event.
const SECRET_KEY: &str = "alice-secret-key-4242";

/// A fixed window of `limit` an hour named `name`.
fn policy(name: &str, limit: u64) -> Policy {
    fixed_window(name, limit, Duration::from_secs(3600))
}

/// Runs `future` to its end on a runtime of this thread, whose events
/// this thread's recorder sees.
fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(future)
}

#[test]
fn no_peer_address_is_logged_once_per_layer_and_counted_each_time() {
    let events = Events::of_this_process();
    let policy = named(
        "per-client",
        Policy::fixed_window(100, Duration::from_secs(60)),
    );
    let layer = RateLimitLayer::new(MemoryStore::new(), policy, PeerIp);
    let ok = ok_service();
    block_on(async {
        for _ in 0..5 {
            let response = layer
                .clone()
                .layer(ok)
                .oneshot(Request::new(String::new()))
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        }
    });
    assert_eq!(layer.stats().no_peer_address(), 5);
    assert_eq!(
        events.at(tracing::Level::ERROR),
        1,
        "one error event per layer"
    );
}

/// A layer's clones share its settings: the services they build, deciding
/// at once (`Mode::Reject` on memory) or in a future (`Mode::Wait`), show
/// one key as one `key_hash` and count into one `Stats`. Another layer
/// draws a seed and keeps counts of its own.
#[test]
fn a_layers_clones_share_its_key_seed_and_stats_and_another_layer_does_not() {
    let events = Events::of_this_process();
    let wait = Mode::Wait {
        max_delay: Duration::ZERO,
    };
    let store = frozen_memory();
    let layer = RateLimitLayer::new(store.clone(), policy("seeded", 1), by_client);
    let other = RateLimitLayer::new(store, policy("seeded", 1), by_client);
    let down = Faulty::down();
    let open = RateLimitLayer::new(down.clone(), policy("seeded-down", 1), by_client)
        .on_failure(FailurePolicy::Open);
    let open_other = RateLimitLayer::new(down, policy("seeded-down", 1), by_client)
        .on_failure(FailurePolicy::Open);
    let statuses = block_on(async {
        let mut statuses = Vec::new();
        let memory = [
            layer.clone(),
            layer.clone(),
            layer.clone().mode(wait),
            other.clone(),
        ];
        for each in memory {
            let answered = answer(each.layer(ok_service()), request_from(SECRET_KEY)).await;
            statuses.push(answered.status.as_u16());
        }
        for each in [open.clone(), open.clone().mode(wait), open_other.clone()] {
            let answered = answer(each.layer(ok_service()), request_from(SECRET_KEY)).await;
            statuses.push(answered.status.as_u16());
        }
        statuses
    });
    assert_eq!(statuses, [200, 429, 429, 429, 200, 200, 200]);
    let decided = outcomes(events, "rate-limit decision");
    let outcomes: Vec<(&str, &str)> = decided
        .iter()
        .map(|(policy, outcome, _)| (policy.as_str(), outcome.as_str()))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("seeded", "allowed"),
            ("seeded", "denied"),
            ("seeded", "denied"),
            ("seeded", "denied"),
            ("seeded-down", "error"),
            ("seeded-down", "error"),
            ("seeded-down", "error"),
        ]
    );
    let hashes: Vec<&str> = decided.iter().map(|(_, _, hash)| hash.as_str()).collect();
    assert!(hashes.iter().all(|h| h.len() == 16), "{hashes:?}");
    assert!(hashes[..3].iter().all(|h| *h == hashes[0]), "{hashes:?}");
    assert_eq!(hashes[4], hashes[5], "{hashes:?}");
    for (clone, other) in [(0, 3), (4, 6), (0, 4)] {
        assert_ne!(hashes[clone], hashes[other], "{hashes:?}");
    }
    assert_eq!(open.stats().failed_open(), 2);
    assert_eq!(open_other.stats().failed_open(), 1);
    assert_eq!(layer.stats().failed_open(), 0);
    assert_no_event_holds_the_key(events);
}

/// The `(policy, outcome, key_hash)` of every event with `message`, in
/// order (an empty hash where an event has none).
fn outcomes(events: &Events, message: &str) -> Vec<(String, String, String)> {
    events
        .all()
        .into_iter()
        .filter(|(_, fields)| fields.get("message").map(String::as_str) == Some(message))
        .map(|(_, f)| {
            (
                f["policy"].clone(),
                f["outcome"].clone(),
                f.get("key_hash").cloned().unwrap_or_default(),
            )
        })
        .collect()
}

/// No field of any event this thread emitted holds [`SECRET_KEY`].
fn assert_no_event_holds_the_key(events: &Events) {
    for value in events
        .all()
        .into_iter()
        .flat_map(|(_, fields)| fields.into_values())
    {
        assert!(
            !value.contains(SECRET_KEY),
            "an event holds the key: {value:?}"
        );
    }
}

/// A limit checked in a handler (`ratelimit_axum::Limiter`, the login
/// guard) is counted and traced as the layer's are: decisions by policy and
/// outcome (near-limit ones too), store call durations, outages as `error`
/// and other store errors as `invalid`, a `debug` event per decision, and
/// never the key.
#[test]
fn limiter_decisions_are_counted_and_traced_like_the_layers() {
    let events = Events::of_this_process();
    let (statuses, recorded) = capture(false, || async {
        let status =
            |answer: Result<ratelimit_axum::Granted, ratelimit_axum::QuotaExceeded>| match answer {
                Ok(_) => 200,
                Err(refused) => axum::response::IntoResponse::into_response(refused)
                    .status()
                    .as_u16(),
            };
        let mut statuses = Vec::new();
        let logins = ratelimit_axum::Limiter::new(frozen_memory(), policy("login", 2));
        for _ in 0..3 {
            statuses.push(status(logins.check(SECRET_KEY.as_bytes(), 1).await));
        }
        let down = ratelimit_axum::Limiter::new(
            Faulty::decisions_refused_while(Arc::new(AtomicBool::new(true))),
            policy("login-down", 2),
        )
        .on_failure(FailurePolicy::Closed);
        statuses.push(status(down.check(SECRET_KEY.as_bytes(), 1).await));
        // One name, two algorithms in one store: not an outage.
        let store = frozen_memory();
        let window = ratelimit_axum::Limiter::new(store.clone(), policy("login-conflict", 2));
        let bucket = ratelimit_axum::Limiter::new(
            store,
            named(
                "login-conflict",
                Policy::gcra(2, ratelimit_core::Rate::per_second(1)),
            ),
        );
        statuses.push(status(window.check(SECRET_KEY.as_bytes(), 1).await));
        statuses.push(status(bucket.check(SECRET_KEY.as_bytes(), 1).await));
        statuses
    });
    assert_eq!(statuses, [200, 200, 429, 503, 200, 500]);
    recorded.assert_outcomes(DECISIONS, "login", "allowed=2 denied=1");
    recorded.assert_outcomes(DECISIONS, "login-down", "error=1");
    recorded.assert_outcomes(DECISIONS, "login-conflict", "allowed=1 invalid=1");
    // Under a tenth of 2 left: the decision leaving 0.
    assert_eq!(recorded.counter(NEAR_LIMIT, &[("policy", "login")]), 1);
    let store_calls = |outcome| {
        recorded
            .histogram(STORE_CALL_DURATION, &[("outcome", outcome)])
            .len()
    };
    assert_eq!(store_calls("ok"), 4);
    assert_eq!(store_calls("error"), 2);
    for value in recorded.label_values() {
        assert!(
            !value.contains(SECRET_KEY),
            "a label holds the key: {value:?}"
        );
    }
    let decisions: Vec<(String, String)> = outcomes(events, "rate-limit decision")
        .into_iter()
        .map(|(policy, outcome, _)| (policy, outcome))
        .collect();
    let expected = [
        ("login", "allowed"),
        ("login", "allowed"),
        ("login", "denied"),
        ("login-down", "error"),
        ("login-conflict", "allowed"),
        ("login-conflict", "invalid"),
    ]
    .map(|(p, o)| (p.to_owned(), o.to_owned()));
    assert_eq!(decisions, expected);
    // One limiter shows one key as one `key_hash`, drawn from its own seed;
    // another limiter's seed shows it as another.
    let hashes = |policy: &str| -> Vec<String> {
        events
            .all()
            .into_iter()
            .filter(|(_, fields)| fields.get("policy").map(String::as_str) == Some(policy))
            .filter_map(|(_, fields)| fields.get("key_hash").cloned())
            .collect()
    };
    let login = hashes("login");
    assert_eq!(login.len(), 3, "{login:?}");
    assert!(
        login.iter().all(|h| h == &login[0] && h.len() == 16),
        "{login:?}"
    );
    let down = hashes("login-down");
    assert_eq!(down.len(), 1, "{down:?}");
    assert_ne!(down[0], login[0]);
    assert_no_event_holds_the_key(events);
}

/// Each limit a settling rule reserved gets a `debug` event when it is
/// settled, whether the store was called or not, as each decision does:
/// its policy, its outcome and the key's hash (the decision's), never the
/// key; and the count under the same outcome.
#[test]
fn settlements_are_traced_and_counted_by_outcome() {
    let events = Events::of_this_process();
    let ((), recorded) = capture(false, || async {
        let tokens = named(
            "s-tokens",
            Policy::token_bucket(1_000, ratelimit_core::Rate::per_hour(1_000)),
        );
        let layer = RateLimitLayer::new(frozen_memory(), tokens, by_client)
            .cost(10)
            .settle(Settlement::from_static_header("x-tokens-used"))
            .expect("a policy that settles");
        // Names the cost `x-reply-cost` asks for; fails on `x-reply-fail`.
        let service = layer.layer(service_fn(|req: Request<String>| {
            let mut response = Response::new(String::new());
            if req.headers().contains_key("x-reply-fail") {
                *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            }
            if let Some(cost) = req.headers().get("x-reply-cost") {
                response.headers_mut().insert("x-tokens-used", cost.clone());
            }
            ready(Ok::<_, Infallible>(response))
        }));
        for reply in [
            Some(("x-reply-cost", "3")),
            Some(("x-reply-cost", "10")),
            Some(("x-reply-fail", "1")),
            None,
        ] {
            let mut req = request_from(SECRET_KEY);
            if let Some((name, value)) = reply {
                req.headers_mut()
                    .insert(name, value.parse().expect("a value"));
            }
            answer(service.clone(), req).await;
        }
    });
    recorded.assert_outcomes(
        SETTLEMENTS,
        "s-tokens",
        "missing_cost=1 refunded=1 settled=2",
    );
    recorded.assert_outcomes(DECISIONS, "s-tokens", "allowed=4");
    let decided = outcomes(events, "rate-limit decision");
    let settled = outcomes(events, "rate-limit settlement");
    let hash = &decided.first().expect("decisions").2;
    assert_eq!(hash.len(), 16, "{hash}");
    let expected = ["settled", "settled", "refunded", "missing_cost"]
        .map(|o| ("s-tokens".to_owned(), o.to_owned(), hash.clone()));
    assert_eq!(settled, expected);
    assert_eq!(decided.len(), 4, "{decided:?}");
    assert_no_event_holds_the_key(events);
}
