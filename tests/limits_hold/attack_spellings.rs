//! Attacks by spelling one value, or one path, another way that the
//! service behind the layer reads as the same: each test fails while a
//! client gets a second budget (or escapes a rule) that way.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use ratelimit_core::MemoryStore;
use ratelimit_tests::fixtures;
use ratelimit_tower::{HeaderKey, RateLimitLayer};
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt};

use crate::rules::{layer_of, one_a_window};

type App = BoxCloneService<Request<Body>, Response, std::convert::Infallible>;

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

/// A rule on `/files/private` in front of axum's `/files/{*path}`, whose
/// `Path` extractor percent-decodes the tail: `/files/private%2Freport.pdf`
/// runs the handler for `private/report.pdf`, the file the rule limits, but
/// no spelling the layer tries (raw, normalised, unreserved bytes decoded,
/// `MatchedPath` = `/files/{*path}`) is under `/files/private`. With the
/// layer on the router and around it, the limited file is served twice
/// under a limit of one.
#[tokio::test]
async fn an_encoded_slash_in_a_wildcard_tail_does_not_escape_a_rule_under_it() {
    let runs: Arc<Mutex<Vec<String>>> = Arc::default();
    let rules = format!(
        "{}\n[[rules]]\npolicy = \"private\"\nkey = \"header:x-id\"\nroutes = [\"/files/private\"]\n",
        one_a_window("private")
    );
    let serve = |State(runs): State<Arc<Mutex<Vec<String>>>>, Path(path): Path<String>| async move {
        runs.lock().unwrap().push(path);
        "file"
    };
    let router = Router::new()
        .route("/files/{*path}", get(serve))
        .with_state(runs.clone());
    let on: App = App::new(router.clone().layer(layer_of(&rules)));
    let around: App = App::new(ServiceExt::<Request<Body>>::map_response(
        layer_of(&rules).layer(router),
        IntoResponse::into_response,
    ));
    for (placement, app) in [("on the router", on), ("around the router", around)] {
        runs.lock().unwrap().clear();
        let mut statuses = Vec::new();
        for path in ["/files/private/report.pdf", "/files/private%2Freport.pdf"] {
            let req = Request::get(path)
                .header("x-id", "one")
                .body(Body::empty())
                .unwrap();
            statuses.push(app.clone().oneshot(req).await.unwrap().status().as_u16());
        }
        let served = runs.lock().unwrap().clone();
        assert_eq!(
            statuses,
            [200, 429],
            "{placement}: the handler served {served:?} under a limit of one"
        );
    }
}

/// An operator writes a rule's route as axum writes the route,
/// `routes = ["/users/{id}"]`. The file loads, and with the layer on the
/// router it applies (`MatchedPath` is `/users/{id}`); with the same file
/// on a layer around the router (a plain Tower layer, where only the path
/// is known) no request path is under `/users/{id}`, so the rule limits
/// nothing, silently. The configuration refuses prefixes that can never
/// match (`//`, `.`, `%2e`); a pattern should be refused too, or match as
/// the route it names. Either outcome passes this test.
#[tokio::test]
async fn a_route_written_as_an_axum_pattern_is_refused_or_limits_around_the_router() {
    let rules = format!(
        "{}\n[[rules]]\npolicy = \"users\"\nkey = \"header:x-id\"\nroutes = [\"/users/{{id}}\"]\n",
        one_a_window("users")
    );
    if ratelimit_tower::config::Config::from_toml(&rules).is_err() {
        return;
    }
    let router = Router::new().route("/users/{id}", get(|| async { "user" }));
    let around: App = App::new(ServiceExt::<Request<Body>>::map_response(
        layer_of(&rules).layer(router),
        IntoResponse::into_response,
    ));
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let req = Request::get("/users/7")
            .header("x-id", "one")
            .body(Body::empty())
            .unwrap();
        statuses.push(around.clone().oneshot(req).await.unwrap().status().as_u16());
    }
    assert_eq!(
        statuses,
        [200, 429],
        "routes = [\"/users/{{id}}\"] loaded and limited nothing around the router"
    );
}

/// A service that takes its API key bare in `Authorization`
/// (`Authorization: <key>`, no scheme), as many do, with case-sensitive
/// keys. HeaderKey now reads the first word of the value as a scheme and
/// lowercases it; a bare key is all first word, so `Key-AbC` and `Key-aBc`,
/// two clients' distinct keys, are one budget: one client spends the
/// other's (and one that knows a key up to case can drain it with refused
/// requests). HeaderKey's docs say "the credentials are kept as they are:
/// a token's case matters".
#[tokio::test]
async fn two_bare_keys_in_authorization_differing_in_case_are_two_budgets() {
    let policy = fixtures::fixed_window("per-key", 1, Duration::from_secs(3600));
    let checked = |req: Request<Body>| async move {
        let value = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        if matches!(value, Some("Key-AbC" | "Key-aBc")) {
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
    for value in ["Key-AbC", "Key-aBc"] {
        let req = Request::get("/")
            .header("authorization", value)
            .body(Body::empty())
            .unwrap();
        statuses.push(app.clone().oneshot(req).await.unwrap().status().as_u16());
    }
    assert_eq!(
        statuses,
        [200, 200],
        "the second client's first request was refused: its key shares the first client's budget"
    );
}

/// A service keys `Authorization` with HeaderKey on one route and with a
/// closure giving `Limits::one` of the header's value on another, under one
/// policy and store. HeaderKey writes the scheme in lowercase before keying,
/// so the closure keys the raw value as the docs of `Limits::one` say, by
/// `HeaderKey::key_for`: one token is one budget on both routes, whatever
/// the spelling of its scheme on either (each spelling sent to each route
/// once, under a limit of 1: one pass).
#[tokio::test]
async fn one_bearer_token_through_header_key_and_limits_one_is_one_budget() {
    let store = MemoryStore::new();
    let policy = fixtures::fixed_window("per-token", 1, Duration::from_secs(3600));
    let raw = {
        let policy = policy.clone();
        move |req: &Request<Body>| {
            let value = req.headers().get("authorization").cloned();
            let policy = policy.clone();
            async move {
                match value {
                    Some(value) => ratelimit_tower::Limits::one(
                        policy,
                        HeaderKey::from_static("authorization").key_for(value.as_bytes()),
                        1,
                    ),
                    None => ratelimit_tower::Limits::reject(),
                }
            }
        }
    };
    let app = Router::new()
        .route(
            "/a",
            get(|| async { "a" }).route_layer(RateLimitLayer::new(
                store.clone(),
                policy,
                HeaderKey::from_static("authorization"),
            )),
        )
        .route(
            "/b",
            get(|| async { "b" }).route_layer(RateLimitLayer::with_rules(store, raw)),
        );
    let mut statuses = Vec::new();
    for (path, value) in [
        ("/a", "Bearer tok"),
        ("/b", "Bearer tok"),
        ("/b", "bearer  tok"),
        ("/a", "BEARER tok"),
    ] {
        let req = Request::get(path)
            .header("authorization", value)
            .body(Body::empty())
            .unwrap();
        statuses.push(app.clone().oneshot(req).await.unwrap().status().as_u16());
    }
    assert_eq!(
        statuses,
        [200, 429, 429, 429],
        "one token passed more than once through HeaderKey and Limits::one of its key"
    );
}

/// A rule whose prefix holds a percent-escape of a reserved or non-ASCII
/// byte (a file name with `é`, `:` or a `/` in it) loads, and is matched
/// against the path's spellings, every escape decoded among them, but the
/// prefix itself is compared as written. axum routes the other spellings of
/// that name (escapes in lowercase hex, the character unescaped, as `:` may
/// be in a path) to the same `/files/{*path}`, whose `Path` hands the
/// handler the same name: the limited file is served twice under a limit
/// of one. Refusing such a prefix at load (as `%2e` is) or decoding it
/// both pass this test.
#[tokio::test]
async fn a_prefix_with_a_reserved_escape_is_refused_or_covers_every_spelling_of_it() {
    let runs: Arc<Mutex<Vec<String>>> = Arc::default();
    let serve = |State(runs): State<Arc<Mutex<Vec<String>>>>, Path(path): Path<String>| async move {
        runs.lock().unwrap().push(path);
        "file"
    };
    let router = Router::new()
        .route("/files/{*path}", get(serve))
        .with_state(runs.clone());
    let mut escaped = Vec::new();
    for (prefix, spellings) in [
        ("/files/caf%C3%A9", ["/files/caf%C3%A9", "/files/caf%c3%a9"]),
        ("/files/a%3Ab", ["/files/a%3Ab", "/files/a:b"]),
        ("/files/a%2Fb", ["/files/a%2Fb", "/files/a/b"]),
    ] {
        let rules = format!(
            "{}\n[[rules]]\npolicy = \"file\"\nkey = \"header:x-id\"\nroutes = [\"{prefix}\"]\n",
            one_a_window("file")
        );
        if ratelimit_tower::config::Config::from_toml(&rules).is_err() {
            continue;
        }
        let on: App = App::new(router.clone().layer(layer_of(&rules)));
        let around: App = App::new(ServiceExt::<Request<Body>>::map_response(
            layer_of(&rules).layer(router.clone()),
            IntoResponse::into_response,
        ));
        for (placement, app) in [("on the router", on), ("around the router", around)] {
            runs.lock().unwrap().clear();
            let mut statuses = Vec::new();
            for path in spellings {
                let req = Request::get(path)
                    .header("x-id", "one")
                    .body(Body::empty())
                    .unwrap();
                statuses.push(app.clone().oneshot(req).await.unwrap().status().as_u16());
            }
            if statuses != [200, 429] {
                let served = runs.lock().unwrap().clone();
                escaped.push(format!(
                    "{prefix} {placement}: {spellings:?} -> {statuses:?}, served {served:?}"
                ));
            }
        }
    }
    assert!(
        escaped.is_empty(),
        "a rule loaded and a limited file was served twice under a limit of one:\n{}",
        escaped.join("\n")
    );
}

/// axum (matchit 0.8) runs `/users/{id}/posts` for `/users//posts`, with
/// `id` empty (a parameter followed by more of the route may be empty), and
/// `/{tenant}/admin` for `//admin`. A rule copied from those routes matches
/// a parameter segment only when it is not empty, and the merged spelling
/// (`/users/posts`, `/admin`) has one segment fewer: around the router
/// (where `MatchedPath` is not known) the handler runs twice under a limit
/// of one.
#[tokio::test]
async fn an_empty_parameter_axum_routes_does_not_escape_a_rule_copied_from_the_route() {
    let runs: Arc<Mutex<Vec<String>>> = Arc::default();
    let posts = |State(runs): State<Arc<Mutex<Vec<String>>>>, Path(id): Path<String>| async move {
        runs.lock().unwrap().push(format!("posts of {id:?}"));
        "posts"
    };
    let admin = |State(runs): State<Arc<Mutex<Vec<String>>>>, Path(tenant): Path<String>| async move {
        runs.lock().unwrap().push(format!("admin of {tenant:?}"));
        "admin"
    };
    let router = Router::new()
        .route("/users/{id}/posts", get(posts))
        .route("/{tenant}/admin", get(admin))
        .with_state(runs.clone());
    let mut escaped = Vec::new();
    for (route, path) in [
        ("/users/{id}/posts", "/users//posts"),
        ("/{tenant}/admin", "//admin"),
    ] {
        let rules = format!(
            "{}\n[[rules]]\npolicy = \"r\"\nkey = \"header:x-id\"\nroutes = [\"{route}\"]\n",
            one_a_window("r")
        );
        let around: App = App::new(ServiceExt::<Request<Body>>::map_response(
            layer_of(&rules).layer(router.clone()),
            IntoResponse::into_response,
        ));
        runs.lock().unwrap().clear();
        let mut statuses = Vec::new();
        for _ in 0..2 {
            let req = Request::get(path)
                .header("x-id", "one")
                .body(Body::empty())
                .unwrap();
            statuses.push(around.clone().oneshot(req).await.unwrap().status().as_u16());
        }
        if statuses != [200, 429] {
            let served = runs.lock().unwrap().clone();
            escaped.push(format!("{route} on {path}: {statuses:?}, ran {served:?}"));
        }
    }
    assert!(
        escaped.is_empty(),
        "around the router, a handler ran twice under a limit of one:\n{}",
        escaped.join("\n")
    );
}

/// A file handler under `/files/{*path}` that cleans its tail as a rooted
/// path (as Go's `http.Dir` does with `path.Clean("/" + name)`: `..`
/// stops at the handler's root) serves `private/report.pdf` for
/// `/files/../private/report.pdf` and for
/// `/files/x/..%2F..%2Fprivate/report.pdf` (axum routes both raw paths to
/// `/files/{*path}`). The layer resolves dot segments from `/`, not from
/// the wildcard's root, so those spellings are `/private/report.pdf`, and
/// the raw and decoded ones are not under `/files/private` either: the
/// limited file is served three times under a limit of one. (tower-http's
/// `ServeDir` refuses a `..` and is not affected.)
#[tokio::test]
async fn a_dot_dot_above_a_wildcard_tail_does_not_escape_a_rule_under_it() {
    let runs: Arc<Mutex<Vec<String>>> = Arc::default();
    let serve = |State(runs): State<Arc<Mutex<Vec<String>>>>, Path(path): Path<String>| async move {
        let mut parts: Vec<&str> = Vec::new();
        for part in path.split('/') {
            match part {
                "" | "." => {}
                ".." => {
                    parts.pop();
                }
                part => parts.push(part),
            }
        }
        runs.lock().unwrap().push(parts.join("/"));
        "file"
    };
    let rules = format!(
        "{}\n[[rules]]\npolicy = \"private\"\nkey = \"header:x-id\"\nroutes = [\"/files/private\"]\n",
        one_a_window("private")
    );
    let router = Router::new()
        .route("/files/{*path}", get(serve))
        .with_state(runs.clone());
    let on: App = App::new(router.clone().layer(layer_of(&rules)));
    let around: App = App::new(ServiceExt::<Request<Body>>::map_response(
        layer_of(&rules).layer(router),
        IntoResponse::into_response,
    ));
    for (placement, app) in [("on the router", on), ("around the router", around)] {
        runs.lock().unwrap().clear();
        let mut statuses = Vec::new();
        for path in [
            "/files/private/report.pdf",
            "/files/../private/report.pdf",
            "/files/x/..%2F..%2Fprivate/report.pdf",
        ] {
            let req = Request::get(path)
                .header("x-id", "one")
                .body(Body::empty())
                .unwrap();
            statuses.push(app.clone().oneshot(req).await.unwrap().status().as_u16());
        }
        let served = runs.lock().unwrap().clone();
        assert_eq!(
            statuses,
            [200, 429, 429],
            "{placement}: the handler served {served:?} under a limit of one"
        );
    }
}
