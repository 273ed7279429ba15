//! A missing key is never a silent bypass: no peer address is a wiring
//! mistake (`500` naming `into_make_service_with_connect_info`, gRPC
//! `INTERNAL`, logged once at `error`), a missing header follows
//! `on_missing_key` (by default refused), and both are counted.

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::BodyExt;
use ratelimit_axum::{
    ClientIp, GlobalKey, HeaderKey, MemoryStore, MissingKey, PeerIp, Policy, RateLimitLayer, Rule,
};
use ratelimit_tests::fixtures::{answer, fixed_window, ok_service};
use tower::{Layer, Service, ServiceExt};

const API_KEY: HeaderName = HeaderName::from_static("x-api-key");

fn policy() -> Policy {
    fixed_window("per-client", 100, Duration::from_secs(60))
}

/// Sends `req` through `service`: the status and the body.
async fn status_and_body<S, B>(service: S, req: Request<String>) -> (StatusCode, String)
where
    S: Service<Request<String>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let answer = answer(service, req).await;
    (answer.status, answer.body)
}

/// Sends a request without a key through a new service of `layer` around
/// `inner`: the status and the body.
async fn without_key<L, S, B>(layer: &L, inner: S) -> (StatusCode, String)
where
    L: Layer<S> + Clone,
    L::Service: Service<Request<String>, Response = Response<B>>,
    <L::Service as Service<Request<String>>>::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    status_and_body(layer.clone().layer(inner), Request::new(String::new())).await
}

#[tokio::test]
async fn axum_served_without_connect_info_answers_500_naming_the_fix() {
    // A Router called without `into_make_service_with_connect_info`: no
    // `ConnectInfo` in the request, so no peer address.
    for app in [
        Router::new()
            .route("/", get(|| async { "ok" }))
            .route_layer(RateLimitLayer::new(MemoryStore::new(), policy(), PeerIp)),
        Router::new()
            .route("/", get(|| async { "ok" }))
            .route_layer(RateLimitLayer::new(
                MemoryStore::new(),
                policy(),
                ClientIp::peer(),
            )),
    ] {
        for _ in 0..3 {
            let req = Request::get("/").body(axum::body::Body::empty()).unwrap();
            let response = app.clone().oneshot(req).await.unwrap();
            assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            let body = String::from_utf8(bytes.to_vec()).unwrap();
            assert!(
                body.contains("into_make_service_with_connect_info"),
                "the 500 names the fix: {body}"
            );
        }
    }
}

#[tokio::test]
async fn no_peer_address_wins_over_missing_key_allow_and_other_rules() {
    let layer = RateLimitLayer::new(MemoryStore::new(), policy(), PeerIp)
        .on_missing_key(MissingKey::Allow)
        .and(Rule::new(
            policy().with_name("global").unwrap(),
            GlobalKey::default(),
        ));
    let (status, _) = status_and_body(layer.layer(ok_service()), Request::new(String::new())).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
}

#[tokio::test]
async fn grpc_without_a_peer_address_is_trailers_only_internal() {
    let service = RateLimitLayer::new(MemoryStore::new(), policy(), PeerIp).layer(ok_service());
    let req = Request::post("/pkg.Service/Method")
        .header("content-type", "application/grpc")
        .body(String::new())
        .unwrap();
    let response = service.oneshot(req).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["grpc-status"], "13");
    let message = response.headers()["grpc-message"].to_str().unwrap();
    assert!(
        message.contains("into_make_service_with_connect_info"),
        "{message}"
    );
}

#[tokio::test]
async fn a_missing_header_is_refused_by_default() {
    let layer = RateLimitLayer::new(MemoryStore::new(), policy(), HeaderKey::new(API_KEY));
    for _ in 0..3 {
        let (status, _) = without_key(&layer, ok_service()).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(layer.stats().missing_key_rejected(), 3);
    assert_eq!(layer.stats().missing_key_allowed(), 0);
    // With the header, the same layer limits as usual.
    let req = Request::builder()
        .header(API_KEY, "k1")
        .body(String::new())
        .unwrap();
    let (status, _) = status_and_body(layer.layer(ok_service()), req).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_missing_header_with_allow_passes_and_is_counted() {
    let layer = RateLimitLayer::new(MemoryStore::new(), policy(), HeaderKey::new(API_KEY))
        .on_missing_key(MissingKey::Allow);
    for _ in 0..4 {
        let (status, body) = without_key(&layer, ok_service()).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
    }
    assert_eq!(layer.stats().missing_key_allowed(), 4);
    assert_eq!(layer.stats().missing_key_rejected(), 0);
    assert_eq!(layer.stats().no_peer_address(), 0);
}

#[tokio::test]
async fn a_closure_returning_none_does_not_apply_and_is_counted() {
    let by_tenant =
        |req: &Request<String>| req.headers().get("x-tenant").map(|v| v.as_bytes().to_vec());
    let layer = RateLimitLayer::new(MemoryStore::new(), policy(), by_tenant);
    let (status, _) = without_key(&layer, ok_service()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(layer.stats().missing_key_allowed(), 1);
}

#[tokio::test]
async fn a_closure_key_falls_back_to_the_peer_ip_through_fallback_and_refuses_without_one() {
    let tenant =
        |req: &Request<String>| req.headers().get("x-tenant").map(|v| v.as_bytes().to_vec());
    // A closure cannot say why it found nothing: one that reads the peer
    // address itself lets a request without one through, as documented.
    let by_hand = move |req: &Request<String>| {
        tenant(req)
            .map(ratelimit_axum::Key::from)
            .or_else(|| ratelimit_axum::KeyExtractor::extract(&PeerIp, req))
    };
    let layer = RateLimitLayer::new(MemoryStore::new(), policy(), by_hand);
    let (status, _) = without_key(&layer, ok_service()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(layer.stats().missing_key_allowed(), 1);

    // Through `Fallback`, the missing peer address is PeerIp's: 500.
    let layer = RateLimitLayer::new(
        MemoryStore::new(),
        policy(),
        ratelimit_axum::Fallback::new(tenant, PeerIp),
    );
    let (status, body) = without_key(&layer, ok_service()).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(layer.stats().no_peer_address(), 1);
    // A tenant is keyed by it, peer or not.
    let req = Request::builder()
        .header("x-tenant", "acme")
        .body(String::new())
        .unwrap();
    let (status, _) = status_and_body(layer.layer(ok_service()), req).await;
    assert_eq!(status, StatusCode::OK);
}
