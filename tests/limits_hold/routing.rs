//! Route rules against a real axum router: whenever the router runs a
//! handler that a rule limits, the rule applies, whatever the client's
//! spelling of the path (dot segments written every way, percent-encoding,
//! doubled and trailing slashes, case) or its method (`HEAD` runs the `GET`
//! handler). Generated requests go through the layer placed on the router
//! (`Router::layer`, where axum's `MatchedPath` is known) and around it (a
//! plain Tower layer, where only the path is).
//!
//! Each generated request is sent twice with one fresh key under limits of
//! one per hour: a limited handler that runs twice for one key ran outside
//! its rule.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Request, StatusCode};
use axum::routing::{get, post};
use proptest::prelude::*;
use proptest::test_runner::{Config as Cases, TestCaseError, TestRunner};
use ratelimit_core::MemoryStore;
use ratelimit_tower::config::{Config, ConfigErrorKind};
use ratelimit_tower::{KeyExtractor, RateLimitLayer, RouteKey};
use std::convert::Infallible;

use axum::response::{IntoResponse, Response};
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt};

use crate::rules::{layer_of, one_a_window};

/// Three limited areas, each one a window per `x-id` (the policies
/// [`one_a_window`] of their names); the rest unlimited.
const RULES: &str = r#"
    [[rules]]
    policy = "export"
    key = "header:x-id"
    routes = ["/api/export"]
    methods = ["GET"]

    [[rules]]
    policy = "items"
    key = "header:x-id"
    routes = ["/api/items"]

    [[rules]]
    policy = "admin"
    key = ["route", "header:x-id"]
    routes = ["/v2/admin"]
"#;

/// The area that limits a handler, `None` for an unlimited one.
type Area = Option<&'static str>;

/// The handlers that ran, per `x-id`, by their area.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<HashMap<String, Vec<Area>>>>);

impl Runs {
    fn record(&self, req: &Request<Body>, area: Option<&'static str>) {
        let id = req.headers()["x-id"].to_str().unwrap().to_owned();
        self.0.lock().unwrap().entry(id).or_default().push(area);
    }

    fn of(&self, id: &str) -> Vec<Option<&'static str>> {
        self.0.lock().unwrap().get(id).cloned().unwrap_or_default()
    }
}

/// A handler of `area` that records its runs.
fn handler(
    area: Option<&'static str>,
) -> impl Fn(State<Runs>, Request<Body>) -> std::future::Ready<&'static str> + Clone {
    move |State(runs): State<Runs>, req: Request<Body>| {
        runs.record(&req, area);
        std::future::ready("ran")
    }
}

fn router(runs: Runs) -> Router {
    let export = || get(handler(Some("export"))).post(handler(None));
    let items = || get(handler(Some("items"))).post(handler(Some("items")));
    let admin = Router::new()
        .route("/admin", get(handler(Some("admin"))))
        .route("/admin/{id}", get(handler(Some("admin"))))
        .route("/open", get(handler(None)));
    Router::new()
        .route("/api/export", export())
        .route("/api/export/{*rest}", export())
        .route("/api/items", items())
        .route("/api/items/{id}", items())
        .route("/api/public", get(handler(None)))
        .route("/api/{name}", get(handler(None)).post(handler(None)))
        .route("/api/", get(handler(None)))
        .route("/", get(handler(None)))
        .route("/upload", post(handler(None)))
        .nest("/v2", admin)
        .fallback(handler(None))
        .with_state(runs)
}

fn layer() -> RateLimitLayer<MemoryStore, Config, ratelimit_tower::HttpRejections> {
    let policies = ["export", "items", "admin"].map(one_a_window).concat();
    layer_of(&format!("{policies}{RULES}"))
}

/// The router with the layer on it, or around it.
#[derive(Debug, Clone, Copy)]
enum Placement {
    OnTheRouter,
    AroundTheRouter,
}

type App = BoxCloneService<Request<Body>, Response, Infallible>;

/// The router recording its runs in `runs`, with one layer placed as
/// `placement` says.
fn app(placement: Placement, runs: Runs) -> App {
    match placement {
        Placement::OnTheRouter => BoxCloneService::new(router(runs).layer(layer())),
        Placement::AroundTheRouter => BoxCloneService::new(
            ServiceExt::<Request<Body>>::map_response(layer().layer(router(runs)), |response| {
                response.into_response()
            }),
        ),
    }
}

async fn send(app: &App, req: Request<Body>) -> StatusCode {
    app.clone().oneshot(req).await.unwrap().status()
}

/// Path segments a client may write, limited areas and tricks among them.
fn segment() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "api",
        "export",
        "items",
        "admin",
        "v2",
        "open",
        "public",
        "upload",
        "x",
        "7",
        ".",
        "..",
        "%2e",
        "%2E",
        "%2e%2e",
        "%2E%2e",
        ".%2e",
        "%2e.",
        "...",
        "",
        "API",
        "Export",
        "%65xport",
        "%61pi",
        "items%2F..",
        "%2F",
        "%2fadmin",
        "~",
        "-",
        "%7E",
        "a%20b",
        "export.",
        ".export",
    ])
}

fn method() -> impl Strategy<Value = Method> {
    prop::sample::select(vec![
        Method::GET,
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::OPTIONS,
        Method::DELETE,
    ])
}

/// A path: most often a route's start then more segments, maybe a leading
/// `//`, a trailing `/`, a query.
fn path() -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec![
            "/api/export",
            "/api/items",
            "/v2/admin",
            "/api",
            "/v2",
            "",
        ]),
        prop::collection::vec(segment(), 0..5),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(start, segments, double, trailing, query)| {
            let mut path = String::from(if double { "/" } else { "" });
            path.push_str(start);
            for segment in segments {
                path.push('/');
                path.push_str(segment);
            }
            if trailing || path.is_empty() {
                path.push('/');
            }
            if query {
                path.push_str("?q=1");
            }
            path
        })
}

/// Sends generated requests twice each through `placement`; fails on a
/// limited handler that ran twice for one key. The number of requests that
/// ran a limited handler, so the caller can check they were reached.
fn a_limited_handler_never_runs_outside_its_rule(placement: Placement, cases: u32) -> usize {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let runs = Runs::default();
    let app = app(placement, runs.clone());
    let reached = std::cell::Cell::new(0);
    let next_id = std::cell::Cell::new(0u64);
    let mut runner = TestRunner::new(Cases {
        cases,
        failure_persistence: None,
        ..Cases::default()
    });
    runner
        .run(&(method(), path()), |(method, path)| {
            next_id.set(next_id.get() + 1);
            let id = next_id.get().to_string();
            let request = || {
                Request::builder()
                    .method(method.clone())
                    .uri(&path)
                    .header("x-id", &id)
                    .body(Body::empty())
            };
            let Ok(first) = request() else {
                return Ok(());
            };
            runtime.block_on(async {
                send(&app, first).await;
                send(&app, request().unwrap()).await;
            });
            let ran = runs.of(&id);
            let limited = ran.iter().flatten().count();
            reached.set(reached.get() + usize::from(limited > 0));
            if limited > 1 {
                return Err(TestCaseError::fail(format!(
                    "{placement:?}: {method} {path} ran {ran:?}: a limited handler ran twice under a limit of one"
                )));
            }
            Ok(())
        })
        .unwrap();
    reached.get()
}

/// Runs [`a_limited_handler_never_runs_outside_its_rule`] with 2,500 cases
/// and checks that enough of them reached a limited handler to mean
/// something. The cases are random, and so is how many reach one: a run
/// of CI reached 99, so the floor is 50, far below any run seen and far
/// above none.
fn limited_handlers_run_only_within_their_rules(placement: Placement) {
    let reached = a_limited_handler_never_runs_outside_its_rule(placement, 2_500);
    assert!(
        reached >= 50,
        "only {reached} requests reached a limited handler"
    );
}

#[test]
fn a_limited_handler_never_runs_outside_its_rule_with_the_layer_on_the_router() {
    limited_handlers_run_only_within_their_rules(Placement::OnTheRouter);
}

#[test]
fn a_limited_handler_never_runs_outside_its_rule_with_the_layer_around_the_router() {
    limited_handlers_run_only_within_their_rules(Placement::AroundTheRouter);
}

/// The known escaping spellings, each sent to the router twice: the second
/// is refused, and the handler ran once.
#[tokio::test]
async fn dot_segments_and_head_do_not_escape_a_rule() {
    for placement in [Placement::OnTheRouter, Placement::AroundTheRouter] {
        for (method, path) in [
            (Method::GET, "/api/export/x/../.."),
            (Method::GET, "/api/export/%2e%2e"),
            (Method::GET, "/api/export/%2E%2e/%2e"),
            (Method::GET, "/api/items/.."),
            (Method::HEAD, "/api/export"),
            (Method::HEAD, "/api/items/7"),
            (Method::GET, "/api/items"),
            (Method::GET, "/v2/admin/.."),
        ] {
            let runs = Runs::default();
            let app = app(placement, runs.clone());
            let request = || {
                Request::builder()
                    .method(method.clone())
                    .uri(path)
                    .header("x-id", "1")
                    .body(Body::empty())
                    .unwrap()
            };
            let first = send(&app, request()).await;
            let second = send(&app, request()).await;
            assert_eq!(
                (first, second),
                (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS),
                "{placement:?}: {method} {path}"
            );
            assert_eq!(runs.of("1").len(), 1, "{placement:?}: {method} {path}");
        }
    }
}

/// On the router, `RouteKey` is the route the router chose, whatever the
/// spelling and the method.
#[tokio::test]
async fn route_keys_on_the_router_are_the_matched_route_whatever_the_method() {
    let keys = Arc::new(Mutex::new(Vec::new()));
    let seen = keys.clone();
    let app = Router::new()
        .route("/api/export/{*rest}", get(|| async { "ran" }))
        .layer(tower::layer::layer_fn(
            move |inner: axum::routing::Route| {
                let seen = seen.clone();
                tower::service_fn(move |req: Request<Body>| {
                    let key = RouteKey.extract(&req).unwrap().as_bytes().to_vec();
                    seen.lock().unwrap().push(String::from_utf8(key).unwrap());
                    inner.clone().oneshot(req)
                })
            },
        ));
    for (method, path) in [
        (Method::GET, "/api/export/x/../.."),
        (Method::HEAD, "/api/export/%2e%2e"),
        (Method::GET, "/api/export/a"),
    ] {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .unwrap();
        assert_eq!(
            app.clone().oneshot(req).await.unwrap().status(),
            StatusCode::OK
        );
    }
    assert_eq!(
        *keys.lock().unwrap(),
        ["/api/export/{*rest}"; 3],
        "one route, one key"
    );
}

#[test]
fn route_prefixes_that_can_never_match_are_refused_naming_the_field() {
    for prefix in [
        "/api//export",
        "//api",
        "/api/./export",
        "/api/../export",
        "/api/..",
        "/api/.",
        "/api/%2e%2e/x",
        "/api/%2Eexport",
        "/%61pi",
        "/api/export%7E",
    ] {
        let text = format!(
            "[policies.p]\nalgorithm = \"fixed-window\"\nlimit = 1\nwindow = \"1h\"\n\n[[rules]]\npolicy = \"p\"\nkey = \"global\"\nroutes = [{prefix:?}]\n"
        );
        let error = Config::from_toml(&text).expect_err(prefix);
        assert_eq!(error.path(), "rules[0].routes[0]", "{prefix}: {error}");
        assert_eq!(error.kind(), ConfigErrorKind::Parse, "{prefix}: {error}");
    }
    for prefix in [
        "/api/export",
        "/api/",
        "/",
        "/a%20b",
        "/api%2Fx",
        "/.well-known",
        "/a..b",
    ] {
        let text = format!(
            "[policies.p]\nalgorithm = \"fixed-window\"\nlimit = 1\nwindow = \"1h\"\n\n[[rules]]\npolicy = \"p\"\nkey = \"global\"\nroutes = [{prefix:?}]\n"
        );
        Config::from_toml(&text).unwrap_or_else(|e| panic!("{prefix}: {e}"));
    }
}
