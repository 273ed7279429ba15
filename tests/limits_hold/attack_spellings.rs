//! Attacks by spelling one value, or one path, another way that the
//! service behind the layer reads as the same: each test fails while a
//! client gets a second budget (or escapes a rule) that way.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use ratelimit_core::MemoryStore;
use ratelimit_tests::fixtures;
use ratelimit_tower::{HeaderKey, RateLimitLayer};
use tower::ServiceExt;

/// A budget per bearer token, keyed by `Authorization` (a header the
/// service checks, which HeaderKey's docs give as the case where a key the
/// client chooses limits it). The auth scheme is case-insensitive
/// (RFC 7235 section 2.1; `headers::Authorization<Bearer>` and every
/// common parser accept `bearer`, `BEARER`...), so the service accepts one
/// token under 2^6 spellings of `Bearer`, and HeaderKey, which hashes the
/// raw value, gives each spelling a budget of its own: 64 times the limit
/// for one token.
#[tokio::test]
async fn one_bearer_token_under_another_case_of_its_scheme_is_one_budget() {
    let policy = fixtures::fixed_window("per-token", 1, Duration::from_secs(3600));
    let checked = |req: Request<Body>| async move {
        let value = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let valid = value
            .and_then(|v| v.split_once(' '))
            .is_some_and(|(scheme, token)| scheme.eq_ignore_ascii_case("bearer") && token == "tok");
        if valid {
            StatusCode::OK
        } else {
            StatusCode::UNAUTHORIZED
        }
    };
    let app = Router::new()
        .route("/", get(checked))
        .route_layer(RateLimitLayer::new(
            MemoryStore::new(),
            policy,
            HeaderKey::from_static("authorization"),
        ));
    let mut statuses = Vec::new();
    for value in ["Bearer tok", "bearer tok", "BEARER tok", "BeArEr tok"] {
        let req = Request::get("/")
            .header("authorization", value)
            .body(Body::empty())
            .unwrap();
        statuses.push(app.clone().oneshot(req).await.unwrap().status().as_u16());
    }
    assert_eq!(
        statuses,
        [200, 429, 429, 429],
        "one valid token passed once per spelling of its scheme under a limit of 1"
    );
}
