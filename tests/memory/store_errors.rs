//! Only an outage reaches a failure policy: every `StoreError` variant
//! through the layer, `FallbackStore` and the axum `Limiter`.
//!
//! The stores here are stand-ins that fail with a chosen error (the layer's
//! and the wrappers' handling is under test, not a store); the errors a real
//! Redis gives are classified in `redis_store.rs`, `redis_acl.rs` and
//! `resilience.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::response::IntoResponse;
use http::{Request, Response, StatusCode};
use ratelimit_axum::Limiter;
use ratelimit_core::{
    BreakerState, Check, CircuitBreaker, DecisionSource, DeniedCache, FallbackStore, MemoryStore,
    Policy, Store, StoreError,
};
use ratelimit_tests::faulty::Faulty;
use ratelimit_tests::fixtures::fixed_window;
use ratelimit_tests::fixtures::ok_service;
use ratelimit_tests::{NO_EDGE, named};
use ratelimit_tower::{FailurePolicy, GlobalKey, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

/// Every variant of `StoreError`, made afresh (it is not `Clone`).
fn every_error() -> Vec<StoreError> {
    vec![
        StoreError::CostExceedsLimit {
            policy: "p".into(),
            cost: 9,
            max: 5,
        },
        StoreError::Full { max_keys: 10 },
        StoreError::PolicyConflict { policy: "p".into() },
        StoreError::Unsupported {
            policy: "p".into(),
            algorithm: "concurrency",
            operation: "penalize",
        },
        StoreError::Timeout(Duration::from_millis(100)),
        StoreError::Unavailable("connection refused".into()),
        StoreError::Backend("unexpected reply to a decision: Int(-1)".into()),
    ]
}

fn policy() -> Policy {
    fixed_window("p", 5, Duration::from_secs(60))
}

/// The status the layer and the `Limiter` answer for `error` under a
/// failure policy that would let the request through (`open`) or not.
fn expected(error: &StoreError, open: bool) -> StatusCode {
    match error {
        StoreError::Timeout(_) | StoreError::Unavailable(_) if open => StatusCode::OK,
        StoreError::Timeout(_) | StoreError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        StoreError::CostExceedsLimit { .. } => StatusCode::TOO_MANY_REQUESTS,
        StoreError::Full { .. } => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[tokio::test]
async fn through_the_layer_only_an_outage_reaches_the_failure_policy() {
    let inner = ok_service();
    for error in every_error() {
        for (failure, open) in [
            (FailurePolicy::Open, true),
            (FailurePolicy::Closed, false),
            // A custom policy that would admit anything it is asked about.
            (FailurePolicy::custom(|_| true), true),
        ] {
            let layer = RateLimitLayer::new(Faulty::always(&error), policy(), GlobalKey::default())
                .on_failure(failure.clone());
            let service = layer.clone().layer(inner);
            for _ in 0..3 {
                assert_eq!(
                    status_of(&service).await,
                    expected(&error, open),
                    "{error:?} with {failure:?}"
                );
            }
            let stats = layer.stats();
            let (failed_open, failed_closed, refused) = match &error {
                e if e.is_outage() && open => (3, 0, 0),
                e if e.is_outage() => (0, 3, 0),
                StoreError::CostExceedsLimit { .. } => (0, 0, 0),
                _ => (0, 0, 3),
            };
            assert_eq!(
                (
                    stats.failed_open(),
                    stats.failed_closed(),
                    stats.refused_on_error()
                ),
                (failed_open, failed_closed, refused),
                "{error:?} with {failure:?}: (failed open, failed closed, refused on error)"
            );
        }
    }
}

#[tokio::test]
async fn a_grpc_request_gets_internal_for_a_store_bug_and_no_detail_of_it() {
    let inner = ok_service();
    let secret = StoreError::Backend("RATELIMIT_CONFLICT ratelimit:p:{secret-key}".into());
    let service = RateLimitLayer::new(Faulty::always(&secret), policy(), GlobalKey::default())
        .on_failure(FailurePolicy::Open)
        .layer(inner);
    let grpc = Request::builder()
        .header("content-type", "application/grpc")
        .body(String::new())
        .unwrap();
    let response = service.clone().oneshot(grpc).await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "13");
    let message = response.headers()["grpc-message"].to_str().unwrap();
    assert!(!message.contains("secret"), "{message}");

    let response = service.oneshot(Request::new(String::new())).await.unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("500") && !body.contains("secret"), "{body}");
}

/// An outage refused by a closed failure policy: the 503 body and gRPC's
/// `grpc-message` say the store is unavailable, never the error's text (a
/// host name, Redis's words); the layer counts the refusal (and logs the
/// error). The same for the axum `Limiter`, and for a full store.
#[tokio::test]
async fn an_unavailable_store_answers_in_general_terms_and_names_no_host() {
    let inner = ok_service();
    let secrets = [
        StoreError::Unavailable(
            "failed to connect to redis-primary.secret-zone.internal:6379: Connection refused"
                .into(),
        ),
        StoreError::Timeout(Duration::from_millis(1234)),
        StoreError::Full { max_keys: 4321 },
    ];
    for error in secrets {
        let leaks = |text: &str| {
            ["secret", "6379", "refused", "1234", "4321"]
                .iter()
                .any(|s| text.contains(s))
        };
        let general = if matches!(error, StoreError::Full { .. }) {
            "rate limit store full"
        } else {
            "rate limit store unavailable"
        };
        let layer = RateLimitLayer::new(Faulty::always(&error), policy(), GlobalKey::default())
            .on_failure(FailurePolicy::Closed);
        let service = layer.clone().layer(inner);

        let response = service.clone().oneshot(Request::new(String::new())).await;
        let response = response.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = body_of(response).await;
        let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(!leaks(&body), "{error:?}: {body}");
        assert!(
            problem["detail"].as_str().unwrap().starts_with(general),
            "{body}"
        );

        let grpc = Request::builder()
            .header("content-type", "application/grpc")
            .body(String::new())
            .unwrap();
        let response = service.oneshot(grpc).await.unwrap();
        assert_eq!(response.headers()["grpc-status"], "14");
        let message = response.headers()["grpc-message"].to_str().unwrap();
        assert!(!leaks(message), "{error:?}: {message}");
        assert!(message.starts_with(general), "{message}");

        // Counted: two refusals, on error or failed closed.
        let stats = layer.stats();
        assert_eq!(stats.failed_closed() + stats.refused_on_error(), 2);

        let limiter =
            Limiter::new(Faulty::always(&error), policy()).on_failure(FailurePolicy::Closed);
        let Err(refused) = limiter.check(b"k", 1).await else {
            panic!("{error:?} was granted");
        };
        let response = refused.into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = body_of(response).await;
        assert!(!leaks(&body), "{error:?}: {body}");
    }
}

#[tokio::test]
async fn a_fallback_store_falls_back_on_outages_only() {
    for error in every_error() {
        let breaker = Arc::new(CircuitBreaker::new(3, Duration::from_secs(3600)));
        let store = FallbackStore::new(
            Faulty::always(&error),
            MemoryStore::new(),
            2,
            Arc::clone(&breaker),
        );
        let policy = policy();
        let checks = [Check::new(b"k", &policy, 1)];
        for _ in 0..5 {
            let one = store.check(b"k", &policy, 1).await;
            let all = store.check_all(&checks).await;
            if error.is_outage() {
                let one = one.unwrap_or_else(|e| panic!("{error:?}: {e:?}"));
                assert_eq!(one.source(), DecisionSource::Fallback, "{error:?}");
                let all = all.unwrap_or_else(|e| panic!("{error:?}: {e:?}"));
                assert_eq!(all[0].source(), DecisionSource::Fallback, "{error:?}");
            } else {
                let one = one.expect_err("not an outage: the error comes back");
                assert_eq!(one.kind(), error.kind());
                let all = all.expect_err("not an outage: the error comes back");
                assert_eq!(all.kind(), error.kind());
            }
        }
        if error.is_outage() {
            assert_eq!(breaker.state(), BreakerState::Open, "{error:?}");
        } else {
            assert_eq!(store.fallback_decisions(), 0, "{error:?}");
            assert_eq!(breaker.state(), BreakerState::Closed, "{error:?}");
            assert_eq!(breaker.trips(), 0, "{error:?}");
        }
    }
}

/// A `DeniedCache` in front of a `FallbackStore` keeps no denial of the
/// fallback's: once the primary answers again, it decides, whatever the
/// fallback's local share denied during the outage.
#[tokio::test]
async fn a_denied_cache_keeps_no_denial_of_the_fallback_past_the_outage() {
    // Every call refused while `down` is set.
    let down = Arc::new(AtomicBool::new(false));
    let primary = Faulty::refused_while(down.clone());
    // A threshold never reached: every call asks the primary first.
    let breaker = Arc::new(CircuitBreaker::new(1_000, Duration::from_secs(3600)));
    let cache = DeniedCache::new(FallbackStore::new(
        primary.clone(),
        MemoryStore::new(),
        4,
        breaker,
    ));
    let policy = fixed_window("p", 8, NO_EDGE);
    down.store(true, Ordering::Relaxed);
    // The fallback's share is 8 / 4 = 2 a window.
    for _ in 0..2 {
        let d = cache.check(b"k", &policy, 1).await.unwrap();
        assert!(d.is_allowed() && d.source() == DecisionSource::Fallback);
    }
    let denied = cache.check(b"k", &policy, 1).await.unwrap();
    assert!(!denied.is_allowed() && denied.source() == DecisionSource::Fallback);
    down.store(false, Ordering::Relaxed);
    let d = cache.check(b"k", &policy, 1).await.unwrap();
    assert!(
        d.is_allowed() && d.source() == DecisionSource::Store,
        "the primary is back and admits: {d:?}"
    );
    assert_eq!(cache.hits(), 0);
    // The primary's own denials are cached.
    for _ in 0..7 {
        assert!(cache.check(b"k", &policy, 1).await.unwrap().is_allowed());
    }
    assert!(!cache.check(b"k", &policy, 1).await.unwrap().is_allowed());
    let d = cache.check(b"k", &policy, 1).await.unwrap();
    assert_eq!(d.source(), DecisionSource::DeniedCache);
}

#[tokio::test]
async fn the_limiter_fails_open_on_outages_only() {
    for error in every_error() {
        for (failure, open) in [
            (FailurePolicy::Open, true),
            (FailurePolicy::Closed, false),
            (FailurePolicy::custom(|_| true), true),
        ] {
            let limiter =
                Limiter::new(Faulty::always(&error), policy()).on_failure(failure.clone());
            let status = match limiter.check(b"k", 1).await {
                Ok(granted) => {
                    assert!(granted.decisions().is_none());
                    StatusCode::OK
                }
                Err(refused) => refused.into_response().status(),
            };
            assert_eq!(status, expected(&error, open), "{error:?} with {failure:?}");
        }
    }
}

/// The layer and the `Limiter` share one default failure policy, open:
/// built without `on_failure`, both let an outage through and refuse every
/// other error, alike.
#[tokio::test]
async fn the_layer_and_the_limiter_both_fail_open_by_default() {
    let inner = tower::service_fn(|_req: Request<String>| async {
        Ok::<_, std::convert::Infallible>(Response::new(String::from("ok")))
    });
    for error in every_error() {
        let layer = RateLimitLayer::new(Faulty::always(&error), policy(), GlobalKey::default());
        let through_layer = status_of(&layer.clone().layer(inner)).await;
        let limiter = Limiter::new(Faulty::always(&error), policy());
        let through_limiter = match limiter.check(b"k", 1).await {
            Ok(_) => StatusCode::OK,
            Err(refused) => refused.into_response().status(),
        };
        assert_eq!(through_layer, expected(&error, true), "layer, {error:?}");
        assert_eq!(through_limiter, through_layer, "limiter, {error:?}");
        if error.is_outage() {
            assert_eq!(layer.stats().failed_open(), 1, "{error:?}");
        }
    }
}

/// A `FallbackStore` (two instances) over a primary that never answers,
/// and its breaker: three failures open it for an hour.
fn hanging_behind_fallback() -> (
    FallbackStore<Faulty<MemoryStore>, MemoryStore>,
    Arc<CircuitBreaker>,
) {
    let breaker = Arc::new(CircuitBreaker::new(3, Duration::from_secs(3600)));
    let store = FallbackStore::new(
        Faulty::hanging(),
        MemoryStore::new(),
        2,
        Arc::clone(&breaker),
    );
    (store, breaker)
}

/// Clients that go away (a disconnect, an HTTP/2 reset)
/// drop their store calls; three of them used to open the breaker for
/// everyone.
#[tokio::test(start_paused = true)]
async fn requests_dropped_by_their_clients_do_not_open_the_breaker() {
    let (store, breaker) = hanging_behind_fallback();
    let inner = ok_service();
    let service = RateLimitLayer::new(store, policy(), GlobalKey::default()).layer(inner);
    for _ in 0..10 {
        let call = service.clone().oneshot(Request::new(String::new()));
        // The client goes away before the store answers.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), call)
                .await
                .is_err()
        );
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
    assert_eq!(breaker.trips(), 0);
}

/// A layer timeout shorter than the store's (the store is too slow for its
/// callers) still opens the breaker: a call dropped after the breaker's
/// slow-call time is a failure.
#[tokio::test]
async fn calls_the_layer_times_out_open_the_breaker() {
    let (store, breaker) = hanging_behind_fallback();
    let inner = ok_service();
    let service = RateLimitLayer::new(store, policy(), GlobalKey::default())
        .on_failure(FailurePolicy::Closed)
        // Three times the breaker's default slow-call time (20 ms).
        .timeout(Duration::from_millis(60))
        .layer(inner);
    for _ in 0..3 {
        assert_eq!(status_of(&service).await, StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(breaker.state(), BreakerState::Open);
}

/// A concurrency permit granted to a handler is held by
/// `Granted` and released when it is dropped (it used to be dropped at once,
/// never released, and held until its lease expired).
#[tokio::test]
async fn a_limiter_permit_is_held_by_granted_until_dropped() {
    let policy = named("uploads", Policy::concurrency(1, Duration::from_secs(3600)));
    let limiter = Limiter::new(MemoryStore::new(), policy);
    let granted = limiter
        .check(b"alice", 1)
        .await
        .expect("the first is granted");
    assert_eq!(
        refused_status(&limiter, b"alice").await,
        StatusCode::TOO_MANY_REQUESTS,
        "one in flight at most"
    );
    drop(granted);
    let again = limiter.check(b"alice", 1).await;
    assert!(again.is_ok(), "the permit was released with its Granted");
}

/// A `Limiter` that fails open still refuses a new key in
/// a full `MemoryStore` (it admitted it: a key-rotation flood got through).
#[tokio::test]
async fn a_fail_open_limiter_refuses_new_keys_in_a_full_store() {
    let full = MemoryStore::builder().max_keys(1).build();
    let limiter = Limiter::new(full, policy()).on_failure(FailurePolicy::Open);
    assert!(limiter.check(b"a", 1).await.is_ok());
    assert_eq!(
        refused_status(&limiter, b"b").await,
        StatusCode::SERVICE_UNAVAILABLE,
        "a full store admits no new key"
    );
}

/// The status of `limiter`'s refusal of a request from `key`; panics when
/// it is granted.
async fn refused_status<St: Store + Clone>(limiter: &Limiter<St>, key: &[u8]) -> StatusCode {
    let Err(refused) = limiter.check(key, 1).await else {
        panic!("{key:?} was granted");
    };
    refused.into_response().status()
}

/// The body of `response`, as text.
async fn body_of<B>(response: Response<B>) -> String
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The status `service` answers an empty request with.
async fn status_of<S, B>(service: &S) -> StatusCode
where
    S: Service<Request<String>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
{
    let response = service.clone().oneshot(Request::new(String::new())).await;
    response.expect("the service answers").status()
}
