//! Attacks on the HTTP face, written from the documents alone: each test
//! asserts a promise of SECURITY.md or RELIABILITY.md the way an
//! attacker would try to break it (extension methods on `any` routes,
//! `nest_service` and fallbacks, percent-encoded spellings, never-matching
//! prefixes, requests dropped while they wait, hostile forwarding headers,
//! store error text).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::routing::any;
use ratelimit_core::{AdminStore, MemoryStore, Policy, Rate};
use ratelimit_tests::fixtures::fixed_window;
use ratelimit_tests::fixtures::ok_service;
use ratelimit_tests::fixtures::tokio_memory;
use ratelimit_tests::named;
use ratelimit_tower::config::Config;

use crate::rules::{layer_of, one_a_window, per_route};
use ratelimit_tower::{GlobalKey, HeaderKey, KeyExtractor, RateLimitLayer, Rule};
use tower::{Layer, ServiceExt};

fn route_layer() -> RateLimitLayer<MemoryStore, Config, ratelimit_tower::HttpRejections> {
    layer_of(&per_route(r#"["/api/export", "/files"]"#))
}

fn counting(
    runs: &Arc<AtomicUsize>,
) -> impl Fn() -> std::future::Ready<&'static str> + Clone + use<> {
    let runs = runs.clone();
    move || {
        runs.fetch_add(1, Ordering::SeqCst);
        std::future::ready("ran")
    }
}

async fn send<S, B>(app: &S, method: &str, path: &str) -> StatusCode
where
    S: tower::Service<Request<Body>, Response = http::Response<B>, Error = Infallible> + Clone,
{
    let req = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).unwrap())
        .uri(path)
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(req).await.unwrap().status()
}

/// [`assert_ran_once`] with a `GET` of each of `paths`.
async fn assert_gets_ran_once<S, B>(app: &S, runs: &AtomicUsize, paths: &[&str], what: &str)
where
    S: tower::Service<Request<Body>, Response = http::Response<B>, Error = Infallible> + Clone,
{
    let requests: Vec<_> = paths.iter().map(|path| ("GET", *path)).collect();
    assert_ran_once(app, runs, &requests, what).await;
}

/// `app` under [`route_layer`], sent `GET /files/{spelling}` for each of
/// `spellings`: the limited handler, counted by `runs`, ran once in all.
async fn assert_files_ran_once(app: Router, runs: &AtomicUsize, spellings: &[&str], what: &str) {
    let paths: Vec<String> = spellings.iter().map(|s| format!("/files/{s}")).collect();
    let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
    assert_gets_ran_once(&app.layer(route_layer()), runs, &paths, what).await;
}

/// Sends each `(method, path)` once through `app` and asserts that the
/// limited handler, counted by `runs`, ran once in all (`what` says why
/// once is right).
async fn assert_ran_once<S, B>(app: &S, runs: &AtomicUsize, requests: &[(&str, &str)], what: &str)
where
    S: tower::Service<Request<Body>, Response = http::Response<B>, Error = Infallible> + Clone,
{
    let mut statuses = Vec::new();
    for (method, path) in requests {
        statuses.push((*method, *path, send(app, method, path).await));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "{what}, ran: {statuses:?}");
}

/// Claim: `RouteKey` on a router keys by the matched route (one budget per
/// route), and a limited handler never runs more often than its limit,
/// whatever the method (extension methods included). With the layer on the
/// router, `key = "route"` and an `any` route, every method a client invents
/// is a budget of its own.
#[tokio::test]
async fn route_key_on_an_any_route_is_not_split_by_extension_methods() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/api/export", any(counting(&runs)))
        .layer(route_layer());
    let requests = ["GET", "POST", "FOO", "BAR", "PURGE", "get"].map(|m| (m, "/api/export"));
    assert_ran_once(
        &app,
        &runs,
        &requests,
        "the limited handler ran more than its limit of 1",
    )
    .await;
}

/// Claim: `RouteKey` is the route the router chose when the layer is on the
/// `Router` (`Router::layer`), and spellings of one path share one budget.
/// Under `nest_service` there is no `MatchedPath`, so the key is the path,
/// and `/files/report` and `/files/%72eport` (the same path, RFC 3986) are
/// two budgets.
#[tokio::test]
async fn route_key_on_the_router_covers_nest_service_spellings() {
    let runs = Arc::new(AtomicUsize::new(0));
    let inner_runs = runs.clone();
    let files = tower::service_fn(move |_req: Request<Body>| {
        inner_runs.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok::<_, Infallible>(axum::response::Response::new(
            Body::from("file"),
        )))
    });
    let spellings = ["report", "%72eport", "%72%65port", "r%65port"];
    let app = Router::new().nest_service("/files", files);
    assert_files_ran_once(app, &runs, &spellings, "one route (and one path), limit 1").await;
}

/// Claim (hostile_input, SECURITY.md): spellings of one path share one
/// budget under `RouteKey`; rules treat `%61` as `a`. Around the router the
/// key is the "normalised" path, which keeps encoded unreserved bytes:
/// `/api/export/%61` and `/api/export/a` (axum's `Path` gives `a` for both)
/// are two budgets.
#[tokio::test]
async fn route_key_around_the_router_shares_one_budget_across_spellings() {
    let runs = Arc::new(AtomicUsize::new(0));
    let router: Router = Router::new().route("/api/export/{name}", any(counting(&runs)));
    let svc = route_layer().layer(router);
    let paths = ["/api/export/a", "/api/export/%61", "/api/%65xport/a"];
    assert_gets_ran_once(&svc, &runs, &paths, "one path spelt three ways, limit 1").await;
}

/// Claim: a route prefix that can never match is refused when the
/// configuration is built. A prefix with a space (a typo: a trailing space)
/// or another byte no request target may hold never matches any request's
/// path, yet it is accepted.
#[test]
fn route_prefixes_no_request_can_hold_are_refused() {
    let mut accepted = Vec::new();
    for prefix in [
        "/api/export ",
        "/api export",
        "/api/export\t",
        "/api/\"export\"",
        "/api/<x>",
        "/api\\export",
        "/é",
        "/a%zz",
        "/api/^",
        "/api/`x`",
        "/api/|",
    ] {
        // No request target can hold this prefix: http refuses it as a path.
        if http::Uri::try_from(prefix).is_ok() {
            continue;
        }
        let text = format!(
            "{}\n[[rules]]\npolicy = \"p\"\nkey = \"global\"\nroutes = [{prefix:?}]\n",
            one_a_window("p")
        );
        if Config::from_toml(&text).is_ok() {
            accepted.push(prefix);
        }
    }
    assert!(
        accepted.is_empty(),
        "never-matching prefixes accepted: {accepted:?}"
    );
}

/// Claim (RELIABILITY.md): in wait mode a refused request gives back every
/// limit it took, whatever the algorithm of the other limits, so the state
/// after one admitted and four refused requests is the state after the one
/// admitted request alone.
#[tokio::test(start_paused = true)]
async fn wait_mode_refusals_give_back_every_algorithm() {
    let mut wrong = Vec::new();
    for other in ratelimit_tests::every_algorithm(5, Duration::from_secs(3600), Rate::per_hour(5)) {
        if matches!(other.algorithm(), ratelimit_core::Algorithm::Concurrency(_)) {
            continue;
        }
        let other = other.with_name("other").unwrap();
        let run = |requests: usize| {
            let other = other.clone();
            async move {
                let store = tokio_memory();
                let smooth = named("smooth", Policy::leaky_bucket(5, Rate::per_second(1)));
                let inner = ok_service();
                let service =
                    RateLimitLayer::new(store.clone(), smooth.clone(), GlobalKey::default())
                        .and(Rule::new(other.clone(), GlobalKey::default()))
                        .wait(Duration::from_millis(100))
                        .layer(inner);
                let mut statuses = Vec::new();
                for _ in 0..requests {
                    let r = service.clone().oneshot(Request::new("")).await.unwrap();
                    statuses.push(r.status().as_u16());
                }
                let global = GlobalKey::default().extract(&Request::new("")).unwrap();
                let d = store.peek(global.as_bytes(), &other).into_inner().unwrap();
                let s = store.peek(global.as_bytes(), &smooth).into_inner().unwrap();
                (statuses, d.remaining(), s.remaining())
            }
        };
        let (_, want_other, want_smooth) = run(1).await;
        let (statuses, got_other, got_smooth) = run(5).await;
        if statuses != [200, 429, 429, 429, 429]
            || (got_other, got_smooth) != (want_other, want_smooth)
        {
            wrong.push(format!(
                "{:?}: {statuses:?}, remaining {got_other}/{got_smooth}, want {want_other}/{want_smooth}",
                other.algorithm()
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Claim (RELIABILITY.md): wait mode never admits more than the limits
/// allow; a request dropped while it waits gives back what it took. The
/// sliding log's refund removes the *most recent* entry, which may be
/// another client's admitted request: the dropped request's own (older)
/// entry stays, expires early, and a sliding window of 3 per 10 s admits 4
/// requests within 10 s.
#[tokio::test(start_paused = true)]
async fn wait_mode_drops_never_let_a_sliding_log_admit_more_than_its_limit() {
    let store = tokio_memory();
    // Per client: one request a second, queued (wait mode).
    // For everyone: 3 per 10 s.
    let window = Duration::from_secs(10);
    let log = named("log", Policy::sliding_window_log(3, window));
    let admitted = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = admitted.clone();
    let start = tokio::time::Instant::now();
    let inner = tower::service_fn(move |req: Request<&'static str>| {
        let seen = seen.clone();
        async move {
            let client = req.headers()["x-client"].to_str().unwrap().to_owned();
            seen.lock().unwrap().push((start.elapsed(), client));
            Ok::<_, Infallible>(http::Response::new(String::from("ok")))
        }
    });
    let service = smooth_per_client_and(store.clone(), log).layer(inner);
    let at = |t: Duration| tokio::time::sleep_until(start + t);

    // t=0: client x is admitted, and its second request waits 1 s for its
    // slot (both counted in the sliding log: 2 of 3).
    assert_eq!(
        service.clone().oneshot(from("x")).await.unwrap().status(),
        200
    );
    let waiting = tokio::spawn(service.clone().oneshot(from("x")));
    tokio::task::yield_now().await;
    // t=0.2: client y is admitted (3 of 3).
    at(Duration::from_millis(200)).await;
    assert_eq!(
        service.clone().oneshot(from("y")).await.unwrap().status(),
        200
    );
    // t=0.4: x's waiting request is dropped: it gives back one unit of the log.
    at(Duration::from_millis(400)).await;
    waiting.abort();
    let _ = waiting.await;
    assert_eq!(
        service.clone().oneshot(from("z")).await.unwrap().status(),
        200
    );
    // t=10.1: the entries of t=0 have left the window; y's (t=0.2) and z's
    // (t=0.4) have not.
    at(Duration::from_millis(10_100)).await;
    for client in ["v", "w"] {
        let _ = service.clone().oneshot(from(client)).await.unwrap();
    }
    assert_three_in_any_ten_seconds(&admitted.lock().unwrap());
}

/// Asserts that no 10 s from one of the `admitted` (its time since the
/// start, its client; in order) hold more than 3 of them: the limit of a
/// sliding log of 3 per 10 s.
fn assert_three_in_any_ten_seconds(admitted: &[(Duration, String)]) {
    let window = Duration::from_secs(10);
    for (i, (t, _)) in admitted.iter().enumerate() {
        let in_window = admitted[i..]
            .iter()
            .filter(|(u, _)| *u < *t + window)
            .count();
        assert!(
            in_window <= 3,
            "a sliding window of 3 per 10 s admitted {in_window} from {t:?}: {admitted:?}"
        );
    }
}

/// Wait mode (up to 5 s) behind a leaky bucket of 10 a second per client
/// (`x-client`, see [`from`]) and `shared` on one global key.
fn smooth_per_client_and<St>(
    store: St,
    shared: Policy,
) -> RateLimitLayer<St, ratelimit_tower::And<Rule<HeaderKey>, Rule<GlobalKey>>> {
    let smooth = named("smooth", Policy::leaky_bucket(10, Rate::per_second(1)));
    RateLimitLayer::new(
        store,
        smooth,
        HeaderKey::new(http::HeaderName::from_static("x-client")),
    )
    .and(Rule::new(shared, GlobalKey::default()))
    .wait(Duration::from_secs(5))
}

/// A request from the client `client` (`x-client`).
fn from(client: &str) -> Request<&'static str> {
    Request::builder()
        .header("x-client", client)
        .body("")
        .unwrap()
}

/// On a paused clock, times in ms from the start, behind a per-client leaky
/// bucket of 10 a second and `shared` on one global key, in wait mode:
/// client x is admitted at `x_ms` and, if `drop_one`, sends a second
/// request that waits for its leaky slot; client y is admitted at `y_ms`;
/// x's waiting request is dropped at `drop_ms`. Returns what `shared` has
/// left at each of `peek_ms`.
async fn remaining_after_a_drop(
    shared: &Policy,
    drop_one: bool,
    [x_ms, y_ms, drop_ms]: [u64; 3],
    peek_ms: &[u64],
) -> Vec<u64> {
    let store = tokio_memory();
    let start = tokio::time::Instant::now();
    let inner = ok_service();
    let service = smooth_per_client_and(store.clone(), shared.clone()).layer(inner);
    let at = |ms: u64| tokio::time::sleep_until(start + Duration::from_millis(ms));
    let global = GlobalKey::default().extract(&Request::new("")).unwrap();
    let peek = || {
        store
            .peek(global.as_bytes(), shared)
            .into_inner()
            .unwrap()
            .remaining()
    };
    at(x_ms).await;
    service.clone().oneshot(from("x")).await.unwrap();
    let waiting = drop_one.then(|| tokio::spawn(service.clone().oneshot(from("x"))));
    tokio::task::yield_now().await;
    at(y_ms).await;
    service.clone().oneshot(from("y")).await.unwrap();
    at(drop_ms).await;
    if let Some(waiting) = waiting {
        waiting.abort();
        let _ = waiting.await;
    }
    let mut seen = Vec::new();
    for &ms in peek_ms {
        at(ms).await;
        seen.push(peek());
    }
    seen
}

/// [`remaining_after_a_drop`] with the drop, and as if the request had never
/// come.
async fn with_and_without_a_drop(
    shared: &Policy,
    times_ms: [u64; 3],
    peek_ms: &[u64],
) -> (Vec<u64>, Vec<u64>) {
    let want = remaining_after_a_drop(shared, false, times_ms, peek_ms).await;
    let got = remaining_after_a_drop(shared, true, times_ms, peek_ms).await;
    (got, want)
}

/// A limit of 3 named `shared` under each algorithm that counts units: the
/// windows of `window`, the buckets refilled at `rate`.
fn shared_limits(window: Duration, rate: Rate) -> [Policy; 5] {
    [
        Policy::fixed_window(3, window),
        Policy::sliding_window_log(3, window),
        Policy::sliding_window_counter(3, window),
        Policy::token_bucket(3, rate),
        Policy::gcra(3, rate),
    ]
    .map(|policy| named("shared", policy))
}

/// Claim (RELIABILITY.md): a request dropped while it waits gives back what
/// it took: afterwards each limit is as if the request had never come. Per
/// algorithm of the shared limit: client x is admitted and its second
/// request waits for its leaky slot; client y is admitted; x's waiting
/// request is dropped. The shared limit must then read, now and later, as
/// after x's and y's admitted requests alone.
#[tokio::test(start_paused = true)]
async fn a_dropped_waiting_request_leaves_every_algorithm_as_if_it_never_came() {
    let limits = shared_limits(Duration::from_secs(10), Rate::per_hour(3));
    let times = ([0, 200, 400], &[400, 5_000, 10_100, 10_300][..]);
    let wrong = drops_where(limits, times, |got, want| got != want).await;
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// For each of `limits`, [`with_and_without_a_drop`] at `times` (x, y and
/// the drop; the peeks): where `wrong` says the remaining units after the
/// drop and as if it never came are wrong, which and how.
async fn drops_where(
    limits: [Policy; 5],
    (times, peeks): ([u64; 3], &[u64]),
    wrong: fn(&[u64], &[u64]) -> bool,
) -> Vec<String> {
    let mut found = Vec::new();
    for shared in limits {
        let (got, want) = with_and_without_a_drop(&shared, times, peeks).await;
        if wrong(&got, &want) {
            let algorithm = shared.algorithm();
            found.push(format!(
                "{algorithm:?}: remaining {got:?}, as if it never came {want:?}"
            ));
        }
    }
    found
}

/// A request dropped while it waits after the window it was counted in
/// ended (x's second request counted at 400 ms in a window of 500 ms,
/// dropped at 700 ms, after y's request of the next window) must never
/// leave a limit with more than if it had never come: it gives back what
/// its limit still holds, never later requests' units (a sliding window
/// counter's refund would take y's unit from the new window's count).
#[tokio::test(start_paused = true)]
async fn a_request_dropped_while_it_waits_never_leaves_more_than_if_it_never_came() {
    let limits = shared_limits(Duration::from_millis(500), Rate::per_second(6));
    let times = ([400, 600, 700], &[700, 1_000, 1_100, 1_300][..]);
    let more = |got: &[u64], want: &[u64]| got.iter().zip(want).any(|(got, want)| got > want);
    let wrong = drops_where(limits, times, more).await;
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The sliding log over-admission after a wait-mode drop, on a real Redis
/// (`RedisStore::refund` is an admin reward, which also takes the most
/// recent units). Script clock: a `ManualClock`; waits: real time.
#[tokio::test]
async fn on_redis_wait_mode_drops_never_let_a_sliding_log_admit_more_than_its_limit() {
    use ratelimit_core::clock::ManualClock;
    use ratelimit_core::redis::RedisStore;
    let server = ratelimit_tests::RedisServer::start();
    let clock = ManualClock::new(ratelimit_tests::NOW_MICROS);
    let store = RedisStore::builder(server.url())
        .script_clock_for_tests(clock.clone())
        .call_timeout(ratelimit_tests::CALL_TIMEOUT)
        .build()
        .await
        .unwrap();
    let log = named(
        "log",
        Policy::sliding_window_log(3, Duration::from_secs(10)),
    );
    let admitted = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = admitted.clone();
    let script_clock = clock.clone();
    let inner = tower::service_fn(move |req: Request<&'static str>| {
        let seen = seen.clone();
        let now = ratelimit_core::clock::Clock::now(&script_clock);
        async move {
            let client = req.headers()["x-client"].to_str().unwrap().to_owned();
            let since_start = Duration::from_micros(now - ratelimit_tests::NOW_MICROS);
            seen.lock().unwrap().push((since_start, client));
            Ok::<_, Infallible>(http::Response::new(String::from("ok")))
        }
    });
    let service = smooth_per_client_and(store, log).layer(inner);
    assert_eq!(
        service.clone().oneshot(from("x")).await.unwrap().status(),
        200
    );
    let waiting = tokio::spawn(service.clone().oneshot(from("x")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    clock.advance(Duration::from_millis(200));
    assert_eq!(
        service.clone().oneshot(from("y")).await.unwrap().status(),
        200
    );
    waiting.abort();
    let _ = waiting.await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    clock.advance(Duration::from_millis(200));
    assert_eq!(
        service.clone().oneshot(from("z")).await.unwrap().status(),
        200
    );
    clock.set(ratelimit_tests::NOW_MICROS + 10_100_000);
    for client in ["v", "w"] {
        let _ = service.clone().oneshot(from(client)).await.unwrap();
    }
    assert_three_in_any_ten_seconds(&admitted.lock().unwrap());
}

/// Claim 1, probed (expected to hold): a `routes = ["/api/export"]`,
/// `methods = ["GET"]` rule covers the export handler under nesting
/// (`nest` with `layer` or `route_layer` on the inner router, `nest_service`
/// of a router or of a bare service with the layer inside), whatever the
/// spelling; each spelling is sent twice under a fresh key with a limit of 1.
#[tokio::test]
async fn nested_placements_never_run_the_export_handler_twice_for_one_key() {
    use axum::routing::get;
    use std::collections::HashMap;
    use std::sync::Mutex;
    type Runs = Arc<Mutex<HashMap<String, usize>>>;
    type Shape = Box<dyn Fn(Runs) -> Router>;
    fn rl() -> RateLimitLayer<MemoryStore, Config, ratelimit_tower::HttpRejections> {
        let rule = r#"
            [[rules]]
            policy = "export"
            key = "header:x-id"
            routes = ["/api/export"]
            methods = ["GET"]
        "#;
        layer_of(&format!("{}{rule}", one_a_window("export")))
    }
    fn export(runs: Runs) -> impl Fn(Request<Body>) -> std::future::Ready<&'static str> + Clone {
        move |req: Request<Body>| {
            let id = req.headers()["x-id"].to_str().unwrap().to_owned();
            *runs.lock().unwrap().entry(id).or_default() += 1;
            std::future::ready("export")
        }
    }
    // The export handler at `/export` and below it, on one inner router.
    fn export_routes(runs: Runs) -> Router {
        Router::new()
            .route("/export", get(export(runs.clone())))
            .route("/export/{*rest}", get(export(runs)))
    }
    let shapes: Vec<(&str, Shape)> = vec![
        (
            "nest + layer",
            Box::new(move |r: Runs| Router::new().nest("/api", export_routes(r).layer(rl()))),
        ),
        (
            "nest + route_layer",
            Box::new(move |r: Runs| Router::new().nest("/api", export_routes(r).route_layer(rl()))),
        ),
        (
            "nest_service(router.layer)",
            Box::new(move |r: Runs| {
                Router::new().nest_service("/api", export_routes(r).layer(rl()))
            }),
        ),
        (
            "nest_service(layer(service))",
            Box::new(move |r: Runs| {
                let svc = tower::service_fn(move |req: Request<Body>| {
                    let f = export(r.clone());
                    let out = f(req);
                    async move {
                        Ok::<_, Infallible>(axum::response::IntoResponse::into_response(out.await))
                    }
                });
                Router::new().nest_service("/api/export", rl().layer(svc))
            }),
        ),
        (
            "nested fallback + layer",
            Box::new(move |r: Runs| {
                Router::new().nest(
                    "/api",
                    Router::new()
                        .nest(
                            "/export",
                            Router::new()
                                .route("/", get(export(r.clone())))
                                .fallback(export(r)),
                        )
                        .layer(rl()),
                )
            }),
        ),
        (
            "any + route_layer",
            Box::new(move |r: Runs| {
                Router::new()
                    .route("/api/export", any(export(r.clone())))
                    .route("/api/export/{*rest}", any(export(r)))
                    .route_layer(rl())
            }),
        ),
    ];
    let spellings = [
        "/api/export",
        "/api/export/",
        "/api//export",
        "//api/export",
        "/api/./export",
        "/api/x/../export",
        "/api/export/x/..",
        "/api/export/%2e%2e",
        "/api/%65xport",
        "/API/export",
        "/api/export;x",
        "/api/export?x=1",
        "http://h/api/export",
        "/api/export/a",
        "/api/export//a",
        "/api/export/%61",
        "/api/export/a/../../export",
        "/api/export%2F",
        "/api/export%2Fa",
        "/api/export/.",
        "/api/export/%2E",
    ];
    let mut escaped = Vec::new();
    let mut n = 0;
    for (name, shape) in &shapes {
        let runs: Runs = Arc::default();
        let app = shape(runs.clone());
        for path in spellings {
            for method in ["GET", "HEAD"] {
                n += 1;
                let id = n.to_string();
                for _ in 0..2 {
                    let req = Request::builder()
                        .method(method)
                        .uri(path)
                        .header("x-id", &id)
                        .body(Body::empty())
                        .unwrap();
                    let _ = app.clone().oneshot(req).await.unwrap();
                }
                let ran = runs.lock().unwrap().get(&id).copied().unwrap_or(0);
                if ran > 1 {
                    escaped.push(format!("{name}: {method} {path} ran {ran} times"));
                }
            }
        }
        let total: usize = runs.lock().unwrap().values().sum();
        assert!(
            total >= 6,
            "{name}: the export handler ran only {total} times in all"
        );
    }
    assert!(escaped.is_empty(), "{escaped:#?}");
}

/// Claim 7, probed (expected to hold): no forwarding header makes
/// `ClientIp` panic, whatever the bytes, with every network trusted (the
/// deepest walk) and any IPv6 prefix.
#[test]
fn hostile_forwarding_headers_never_panic() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config as Cases, TestRunner};
    use ratelimit_tower::{ClientIp, ForwardingHeader, PeerAddr, TrustedProxies};
    let alphabet = proptest::sample::select(vec![
        "1", "0", "9", "f", "F", ":", "::", ".", "[", "]", "_", ",", ";", "=", "\"", " ", "\t",
        "for", "FOR", "by", "host", "proto", "\\", "%", "255", "65536", "ffff", "unknown", "é",
        "\u{80}", "x",
    ]);
    let header = proptest::collection::vec(alphabet, 0..40).prop_map(|v| v.concat());
    let mut runner = TestRunner::new(Cases {
        cases: 3000,
        ..Cases::default()
    });
    runner
        .run(
            &(
                proptest::collection::vec(header.clone(), 0..4),
                proptest::collection::vec(header, 0..4),
                0u8..=128,
                0usize..3,
            ),
            |(forwarded, xff, prefix, which)| {
                let mut req = Request::new(());
                for v in &forwarded {
                    if let Ok(v) = http::HeaderValue::from_str(v) {
                        req.headers_mut().append("forwarded", v);
                    }
                }
                for v in &xff {
                    if let Ok(v) = http::HeaderValue::from_str(v) {
                        req.headers_mut().append("x-forwarded-for", v);
                    }
                }
                req.extensions_mut()
                    .insert(PeerAddr("10.0.0.1:1".parse().unwrap()));
                let header =
                    [ForwardingHeader::Forwarded, ForwardingHeader::XForwardedFor][which % 2];
                let client = ClientIp::trusting(
                    TrustedProxies::parse(["0.0.0.0/0", "::/0"]).unwrap(),
                    header,
                )
                .ipv6_prefix(prefix)
                .unwrap();
                let _ = client.extract(&req);
                Ok(())
            },
        )
        .unwrap();
}

/// The same drop as above across a window boundary of a sliding window
/// counter: the dropped request counted in the previous window, its refund
/// comes out of the current one (another client's unit).
#[tokio::test(start_paused = true)]
async fn a_dropped_waiting_request_leaves_a_sliding_counter_as_if_it_never_came() {
    let window = Duration::from_secs(10);
    let shared = named("shared", Policy::sliding_window_counter(3, window));
    let (got, want) = with_and_without_a_drop(
        &shared,
        [9_700, 10_100, 10_200],
        &[10_200, 15_000, 19_000, 19_900],
    )
    .await;
    assert_eq!(got, want, "remaining after the drop vs as if it never came");
}

/// Claim 5, probed (expected to hold): a 503 or a gRPC refusal never
/// carries the store error's text (here: the Redis host name).
#[tokio::test]
async fn store_errors_never_reach_the_client() {
    use ratelimit_core::redis::RedisStore;
    use ratelimit_tower::FailurePolicy;
    let store = RedisStore::builder("redis://secret-redis-host.invalid:6379/0")
        .allow_unresolved_hosts()
        .call_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let inner = ok_service();
    let service = RateLimitLayer::new(
        store,
        fixed_window("one", 1, Duration::from_secs(60)),
        GlobalKey::default(),
    )
    .on_failure(FailurePolicy::Closed)
    .layer(inner);
    for grpc in [false, true] {
        let mut req = Request::new(String::new());
        if grpc {
            req.headers_mut().insert(
                "content-type",
                http::HeaderValue::from_static("application/grpc"),
            );
        }
        let res = service.clone().oneshot(req).await.unwrap();
        let status = res.status();
        let headers = format!("{:?}", res.headers());
        let body = http_body_util::BodyExt::collect(res.into_body())
            .await
            .unwrap()
            .to_bytes();
        let all = format!("{headers} {}", String::from_utf8_lossy(&body));
        assert!(status != StatusCode::OK || grpc, "{status}");
        for secret in ["secret-redis-host", "6379", "invalid", "lookup", "resolve"] {
            assert!(!all.contains(secret), "grpc={grpc}: {secret} leaked: {all}");
        }
    }
}

/// As `route_key_on_the_router_covers_nest_service_spellings`, with a
/// nested router's fallback (`nest` of a router with only a fallback) and
/// the layer on the outer router: each spelling is a budget of its own.
#[tokio::test]
async fn route_key_on_the_router_covers_a_nested_fallback() {
    let runs = Arc::new(AtomicUsize::new(0));
    let spellings = ["report", "%72eport", "r%65port", "re%70ort"];
    let app = Router::new().nest("/files", Router::new().fallback(counting(&runs)));
    assert_files_ran_once(app, &runs, &spellings, "limit 1 per route").await;
}
