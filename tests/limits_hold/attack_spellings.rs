//! Attacks by spelling one value, or one path, another way that the
//! service behind the layer reads as the same: a client gets no second
//! budget, and escapes no rule, that way.

use std::convert::Infallible;
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
use tower::{Layer, Service, ServiceExt};

use crate::rules::{layer_of, one_a_window};

type App = BoxCloneService<Request<Body>, Response, Infallible>;

/// The status `app` answers each `GET` of `requests`, `(path, header)`, in
/// turn.
async fn answers<'a, S>(
    app: &S,
    requests: impl IntoIterator<Item = (&'a str, (&'a str, &'a str))>,
) -> Vec<u16>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone,
{
    let mut statuses = Vec::new();
    for (path, (name, value)) in requests {
        let req = Request::get(path)
            .header(name, value)
            .body(Body::empty())
            .unwrap();
        statuses.push(app.clone().oneshot(req).await.unwrap().status().as_u16());
    }
    statuses
}

/// [`answers`] to `paths`, each sent by the client `x-id: one`.
async fn as_one<'a, S>(app: &S, paths: impl IntoIterator<Item = &'a str>) -> Vec<u16>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone,
{
    answers(app, paths.into_iter().map(|path| (path, ("x-id", "one")))).await
}

/// What each handler was given, in order.
type Runs = Arc<Mutex<Vec<String>>>;

/// A rule of `policy` (one request a window, keyed by `x-id`) on `route`.
fn rule_on(policy: &str, route: &str) -> String {
    format!(
        "{}\n[[rules]]\npolicy = \"{policy}\"\nkey = \"header:x-id\"\nroutes = [{route:?}]\n",
        one_a_window(policy)
    )
}

/// axum's `/files/{*path}`, whose handler records the tail `Path` gives it.
fn files() -> (Runs, Router) {
    let runs = Runs::default();
    let serve = |State(runs): State<Runs>, Path(path): Path<String>| async move {
        runs.lock().unwrap().push(path);
        "file"
    };
    let router = Router::new()
        .route("/files/{*path}", get(serve))
        .with_state(runs.clone());
    (runs, router)
}

/// `router` with the layer of `rules` on it, and around it.
fn placements(rules: &str, router: &Router) -> [(&'static str, App); 2] {
    [
        (
            "on the router",
            App::new(router.clone().layer(layer_of(rules))),
        ),
        ("around the router", around(rules, router.clone())),
    ]
}

/// A service that answers `GET /` when `accepts` the `Authorization` value
/// (else `401`), one request an hour per value as `HeaderKey` keys it.
fn authorized(accepts: fn(&str) -> bool) -> Router {
    let policy = fixtures::fixed_window("per-token", 1, Duration::from_secs(3600));
    let checked = move |req: Request<Body>| async move {
        let value = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        if value.is_some_and(accepts) {
            StatusCode::OK
        } else {
            StatusCode::UNAUTHORIZED
        }
    };
    Router::new()
        .route("/", get(checked))
        .route_layer(RateLimitLayer::new(
            MemoryStore::new(),
            policy,
            HeaderKey::from_static("authorization"),
        ))
}

/// `what` with the statuses it got and what the handlers ran, unless the
/// statuses are one pass and one refusal.
fn escape(what: &str, statuses: &[u16], runs: &Runs) -> Option<String> {
    (statuses != [200, 429])
        .then(|| format!("{what}: {statuses:?}, ran {:?}", runs.lock().unwrap()))
}

/// [`escape`] of `path` sent twice by one client to `app`, the handlers'
/// runs cleared first.
async fn twice<S>(app: &S, path: &str, runs: &Runs, what: &str) -> Option<String>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone,
{
    runs.lock().unwrap().clear();
    let statuses = as_one(app, [path; 2]).await;
    escape(what, &statuses, runs)
}

/// axum's `/{tenant}/files/{*path}`, whose handler records the tenant
/// `Path` gives it and the tail cleaned from its own root ([`cleaned`]).
fn tenant_files() -> (Runs, Router) {
    tenant_route("/{tenant}/files/{*path}")
}

/// [`tenant_files`] on `route`, a tenant's then a wildcard's.
fn tenant_route(route: &str) -> (Runs, Router) {
    let runs = Runs::default();
    let serve = |State(runs): State<Runs>, Path((tenant, path)): Path<(String, String)>| async move {
        runs.lock()
            .unwrap()
            .push(format!("{tenant:?}: {}", cleaned(&path)));
        "file"
    };
    let router = Router::new()
        .route(route, get(serve))
        .with_state(runs.clone());
    (runs, router)
}

/// A wildcard's tail cleaned from the handler's own root, as Go's
/// `http.Dir` cleans it: `..` never climbs above it.
fn cleaned(tail: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in tail.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    parts.join("/")
}

/// `router` behind the layer of `rules`, a plain Tower layer around it.
fn around(rules: &str, router: Router) -> App {
    App::new(ServiceExt::<Request<Body>>::map_response(
        layer_of(rules).layer(router),
        IntoResponse::into_response,
    ))
}

/// One bearer token, keyed by `Authorization`, is one budget whatever the
/// case of its scheme, which RFC 9110 makes case-insensitive and services
/// accept alike (`Bearer`, `bearer`, `BEARER`...): otherwise 64 spellings
/// of `Bearer` would be 64 budgets for one token.
#[tokio::test]
async fn one_bearer_token_under_another_case_of_its_scheme_is_one_budget() {
    let app = authorized(|value| {
        value
            .split_once(' ')
            .is_some_and(|(scheme, token)| scheme.eq_ignore_ascii_case("bearer") && token == "tok")
    });
    let spellings = ["Bearer tok", "bearer tok", "BEARER tok", "BeArEr tok"];
    let statuses = answers(&app, spellings.map(|value| ("/", ("authorization", value)))).await;
    // One pass under a limit of 1, whichever spelling comes first.
    assert_eq!(statuses, [200, 429, 429, 429], "{spellings:?}");
}

/// axum's `Path` decodes a wildcard's tail, so `/files/private%2Freport.pdf`
/// serves `private/report.pdf` from `/files/{*path}`: a rule on
/// `/files/private` covers it, with the layer on the router and around it.
#[tokio::test]
async fn an_encoded_slash_in_a_wildcard_tail_does_not_escape_a_rule_under_it() {
    let (runs, router) = files();
    let rules = rule_on("private", "/files/private");
    for (placement, app) in placements(&rules, &router) {
        runs.lock().unwrap().clear();
        let statuses = as_one(
            &app,
            ["/files/private/report.pdf", "/files/private%2Freport.pdf"],
        )
        .await;
        let served = runs.lock().unwrap().clone();
        assert_eq!(
            statuses,
            [200, 429],
            "{placement}: the handler served {served:?} under a limit of one"
        );
    }
}

/// A rule's route written as axum writes it, `/users/{id}`, applies around
/// the router too, where only the path is known (on the router,
/// `MatchedPath` is the pattern itself); a configuration that refused it
/// would pass too, never one that loads and limits nothing.
#[tokio::test]
async fn a_route_written_as_an_axum_pattern_is_refused_or_limits_around_the_router() {
    let rules = rule_on("users", "/users/{id}");
    if ratelimit_tower::config::Config::from_toml(&rules).is_err() {
        return;
    }
    let router = Router::new().route("/users/{id}", get(|| async { "user" }));
    let around: App = around(&rules, router);
    let statuses = as_one(&around, ["/users/7"; 2]).await;
    assert_eq!(
        statuses,
        [200, 429],
        "routes = [\"/users/{{id}}\"] loaded and limited nothing around the router"
    );
}

/// A bare key in `Authorization` (no scheme) keeps its case: `Key-AbC` and
/// `Key-aBc`, two clients' keys, are two budgets, and neither spends the
/// other's.
#[tokio::test]
async fn two_bare_keys_in_authorization_differing_in_case_are_two_budgets() {
    let app = authorized(|value| matches!(value, "Key-AbC" | "Key-aBc"));
    let statuses = answers(
        &app,
        ["Key-AbC", "Key-aBc"].map(|value| ("/", ("authorization", value))),
    )
    .await;
    assert_eq!(
        statuses,
        [200, 200],
        "the second client's first request was refused: its key shares the first client's budget"
    );
}

/// One token through `HeaderKey` on one route and through `Limits::one` of
/// `HeaderKey::key_for` of the header's value on another, under one policy
/// and store, is one budget whatever the spelling of its scheme on either
/// (the key `Limits::one`'s docs give for a header's raw value).
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
    let statuses = answers(
        &app,
        [
            ("/a", "Bearer tok"),
            ("/b", "Bearer tok"),
            ("/b", "bearer  tok"),
            ("/a", "BEARER tok"),
        ]
        .map(|(path, value)| (path, ("authorization", value))),
    )
    .await;
    assert_eq!(
        statuses,
        [200, 429, 429, 429],
        "one token passed more than once through HeaderKey and Limits::one of its key"
    );
}

/// A prefix holding an escape of a reserved or non-ASCII byte (a file name
/// with `é`, `:` or `/`) covers every spelling axum's `/files/{*path}`
/// hands its handler as that name (the escape in lowercase hex, the
/// character itself), on the router and around it; refusing such a prefix
/// at load would pass too.
#[tokio::test]
async fn a_prefix_with_a_reserved_escape_is_refused_or_covers_every_spelling_of_it() {
    let (runs, router) = files();
    let mut escaped = Vec::new();
    for (prefix, spellings) in [
        ("/files/caf%C3%A9", ["/files/caf%C3%A9", "/files/caf%c3%a9"]),
        ("/files/a%3Ab", ["/files/a%3Ab", "/files/a:b"]),
        ("/files/a%2Fb", ["/files/a%2Fb", "/files/a/b"]),
    ] {
        let rules = rule_on("file", prefix);
        if ratelimit_tower::config::Config::from_toml(&rules).is_err() {
            continue;
        }
        for (placement, app) in placements(&rules, &router) {
            runs.lock().unwrap().clear();
            let statuses = as_one(&app, spellings).await;
            let what = format!("{prefix} {placement}: {spellings:?}");
            escaped.extend(escape(&what, &statuses, &runs));
        }
    }
    assert!(
        escaped.is_empty(),
        "a rule loaded and a limited file was served twice under a limit of one:\n{}",
        escaped.join("\n")
    );
}

/// axum (matchit 0.8) runs `/users/{id}/posts` for `/users//posts` and
/// `/{tenant}/admin` for `//admin`, the parameter empty: a rule copied from
/// those routes covers them around the router, where `MatchedPath` is not
/// known.
#[tokio::test]
async fn an_empty_parameter_axum_routes_does_not_escape_a_rule_copied_from_the_route() {
    let runs: Runs = Arc::default();
    let posts = |State(runs): State<Runs>, Path(id): Path<String>| async move {
        runs.lock().unwrap().push(format!("posts of {id:?}"));
        "posts"
    };
    let admin = |State(runs): State<Runs>, Path(tenant): Path<String>| async move {
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
        let rules = rule_on("r", route);
        let around: App = around(&rules, router.clone());
        escaped.extend(twice(&around, path, &runs, &format!("{route} on {path}")).await);
    }
    assert!(
        escaped.is_empty(),
        "around the router, a handler ran twice under a limit of one: {escaped:#?}"
    );
}

/// A parameter before a wildcard whose tail holds a `..`:
/// `/{tenant}/files/{*path}` runs `/../files/../private/r` with `tenant`
/// `..`, `/a%2F..%2Fb/...` with `a/../b`, `/caf%c3%a9/...` with `café`,
/// and a handler cleaning its tail from its own root serves `private/r`.
/// A rule copied from the route (`/{tenant}/files/private`) covers them
/// all, and so does one naming the tenant, as written or decoded.
#[tokio::test]
async fn a_dot_dot_parameter_before_a_wildcard_tail_does_not_escape_a_rule_under_it() {
    let (runs, router) = tenant_files();
    let cases = [
        // The tail's `..` resolved below the wildcard's root.
        ("/{tenant}/files/private", "/acme/files/../private/r"),
        ("/{tenant}/files/private", "/../files/../private/r"),
        ("/{tenant}/files/private", "/%2e%2e/files/../private/r"),
        (
            "/{tenant}/files/private",
            "/a%2F..%2Fb/files/x%2F..%2F..%2Fprivate/r",
        ),
        // A tenant as `Path` decodes it.
        ("/caf%C3%A9/files/private", "/caf%c3%a9/files/../private/r"),
        ("/a:b/files/private", "/a%3Ab/files/../private/r"),
    ];
    let mut escaped = Vec::new();
    for (prefix, path) in cases {
        let rules = rule_on("private", prefix);
        for (placement, app) in placements(&rules, &router) {
            let what = format!("{prefix} {placement}: {path}");
            escaped.extend(twice(&app, path, &runs, &what).await);
        }
    }
    assert!(
        escaped.is_empty(),
        "a handler served private/r twice under a limit of one: {escaped:#?}"
    );
}

/// axum's `route` (its wildcard named `path`), whose handler records its
/// tail cleaned from its own root ([`cleaned`]).
fn cleaning_route(route: &str) -> (Runs, Router) {
    handing_tail_to(route, cleaned)
}

/// What a handler of `route` (a wildcard's) that cleans its tail from its
/// own root (as Go's `http.Dir` does: `..` stops there) serves for each of
/// `paths`, one client's, in turn, behind a rule of one request a window on
/// `prefix`, the layer on the router and around it: asserts the statuses
/// are `want`, and returns what the handler served, per placement.
async fn served_from_root(
    route: &str,
    prefix: &str,
    paths: &[&str],
    want: &[u16],
) -> Vec<Vec<String>> {
    let (runs, router) = cleaning_route(route);
    let rules = rule_on("private", prefix);
    let mut served_by_placement = Vec::new();
    for (placement, app) in placements(&rules, &router) {
        runs.lock().unwrap().clear();
        let statuses = as_one(&app, paths.iter().copied()).await;
        let served = runs.lock().unwrap().clone();
        assert_eq!(
            statuses, want,
            "{placement}: the handler served {served:?} under a limit of one"
        );
        served_by_placement.push(served);
    }
    served_by_placement
}

/// A wildcard may start inside a segment (`/download-{*path}`): its handler,
/// cleaning its tail from its own root, serves `private/report.pdf` for
/// `/download-../private/report.pdf`, `/download-x/../../private/report.pdf`
/// and `/download-..%2Fprivate%2Freport.pdf`, as for
/// `/download-private/report.pdf`: a rule on `/download-private` covers them.
#[tokio::test]
async fn a_dot_dot_after_a_wildcard_rooted_inside_a_segment_does_not_escape_a_rule_under_it() {
    let served = served_from_root(
        "/download-{*path}",
        "/download-private",
        &[
            "/download-private/report.pdf",
            "/download-../private/report.pdf",
            "/download-x/../../private/report.pdf",
            "/download-..%2Fprivate%2Freport.pdf",
            "/download-%2e%2e/private/report.pdf",
            "/download-public/report.pdf",
        ],
        &[200, 429, 429, 429, 429, 200],
    )
    .await;
    for served in served {
        assert_eq!(served, ["private/report.pdf", "public/report.pdf"]);
    }
}

/// A handler of `/files/{*path}` that cleans its tail from its own root
/// serves `private/report.pdf` for `/files/../private/report.pdf` and
/// `/files/x/..%2F..%2Fprivate/report.pdf`, which axum routes to it: a rule
/// on `/files/private` covers both. (tower-http's `ServeDir` refuses any
/// `..`.)
#[tokio::test]
async fn a_dot_dot_above_a_wildcard_tail_does_not_escape_a_rule_under_it() {
    served_from_root(
        "/files/{*path}",
        "/files/private",
        &[
            "/files/private/report.pdf",
            "/files/../private/report.pdf",
            "/files/x/..%2F..%2Fprivate/report.pdf",
        ],
        &[200, 429, 429],
    )
    .await;
}

/// The part of a segment after a wildcard's root inside it may be dropped
/// without any `..`: empty (`/download-/private/r`, `/download-%2Fprivate`)
/// or a `.` (`/download-./private/r`, `/download-%2e/private/r`). A handler
/// of `/download-{*path}` cleaning its tail from its own root serves
/// `private/report.pdf` for each, as for `/download-private/report.pdf`: a
/// rule on `/download-private` covers them, as it covers
/// `/download-../private/report.pdf`.
#[tokio::test]
async fn an_empty_or_dot_part_after_a_wildcard_rooted_inside_a_segment_does_not_escape_a_rule_under_it()
 {
    let served = served_from_root(
        "/download-{*path}",
        "/download-private",
        &[
            "/download-private/report.pdf",
            "/download-/private/report.pdf",
            "/download-./private/report.pdf",
            "/download-%2e/private/report.pdf",
            "/download-%2Fprivate%2Freport.pdf",
            "/download-.%2Fprivate/report.pdf",
            "/download-public/report.pdf",
        ],
        &[200, 429, 429, 429, 429, 429, 200],
    )
    .await;
    for served in served {
        assert_eq!(served, ["private/report.pdf", "public/report.pdf"]);
    }
}

/// A prefix ending with a slash keeps it below a root inside a segment as
/// below a root between segments: `/files/private/` covers
/// `/files/../private/` (the handler of `/files/{*path}` serves `private`,
/// as for `/files/private/`), so `/download-private/` covers
/// `/download-../private/`, `/download-x/../private/` and
/// `/download-..%2Fprivate%2F`, which the handler of `/download-{*path}`
/// serves as `private`, as for `/download-private/`.
#[tokio::test]
async fn a_trailing_slash_after_a_wildcard_rooted_inside_a_segment_does_not_escape_a_rule_under_it()
{
    // Below a root between segments, the slash is kept.
    served_from_root(
        "/files/{*path}",
        "/files/private/",
        &["/files/private/", "/files/../private/"],
        &[200, 429],
    )
    .await;
    let served = served_from_root(
        "/download-{*path}",
        "/download-private/",
        &[
            "/download-private/",
            "/download-../private/",
            "/download-x/../private/",
            "/download-..%2Fprivate%2F",
        ],
        &[200, 429, 429, 429],
    )
    .await;
    for served in served {
        assert_eq!(served, ["private"]);
    }
}

/// A rule naming a parameter before a wildcard rooted inside a segment
/// (`/a:b/download-private` on `/{tenant}/download-{*path}`) covers the
/// parameter as `Path` decodes it (`a%3Ab` is `a:b`) whatever the tail: a
/// handler cleaning its tail from its own root serves `private/r` for
/// `/a%3Ab/download-../x%252Fy/../private/r` (its tail, decoded once, is
/// `../x%2Fy/../private/r`: `x%2Fy` is one name, which the `..` undoes),
/// as for `/a%3Ab/download-private/r` and `/a%3Ab/download-../private/r`;
/// and so does one naming it escaped (`/a%3Ab/download-private`) for
/// `/a%3ab/download-../x%252Fy/../private/r`.
#[tokio::test]
async fn an_escaped_percent_in_the_tail_after_a_decoded_parameter_does_not_escape_a_rule_under_it()
{
    let (runs, router) = tenant_route("/{tenant}/download-{*path}");
    let mut escaped = Vec::new();
    for prefix in ["/a:b/download-private", "/a%3Ab/download-private"] {
        let rules = rule_on("private", prefix);
        for path in [
            // Held: the tail's `..` resolved, the tenant decoded.
            "/a%3Ab/download-../private/r",
            "/a%3ab/download-../private/r",
            // The tail's `%252F` decoded once, as `Path` decodes it.
            "/a%3Ab/download-../x%252Fy/../private/r",
            "/a%3ab/download-../x%252Fy/../private/r",
        ] {
            for (placement, app) in placements(&rules, &router) {
                runs.lock().unwrap().clear();
                let statuses = as_one(&app, ["/a%3Ab/download-private/r", path]).await;
                let what = format!("{prefix} {placement}: {path}");
                escaped.extend(escape(&what, &statuses, &runs));
            }
        }
    }
    assert!(
        escaped.is_empty(),
        "a handler served a:b's private/r twice under a limit of one: {escaped:#?}"
    );
}

/// What the handler of `route` (a wildcard's, cleaning its tail from its
/// own root) serves for `path`, with no layer: `None` unless it runs.
async fn served_without_a_layer(route: &str, path: &str) -> Option<String> {
    let (runs, router) = cleaning_route(route);
    let req = Request::get(path).body(Body::empty()).unwrap();
    let status = router.oneshot(req).await.unwrap().status();
    let served = runs.lock().unwrap().pop();
    (status == StatusCode::OK).then_some(served).flatten()
}

/// What escapes a rule of one request a window on `prefix` when one client
/// sends `plain`, then `path`, to `router` (whose handlers record their
/// runs in `runs`), with the layer on the router and around it.
async fn escapes_after(
    runs: &Runs,
    router: &Router,
    prefix: &str,
    plain: &str,
    path: &str,
) -> Vec<String> {
    let rules = rule_on("private", prefix);
    let mut escaped = Vec::new();
    for (placement, app) in placements(&rules, router) {
        runs.lock().unwrap().clear();
        let statuses = as_one(&app, [plain, path]).await;
        let what = format!("rule on {prefix}, {placement}: {plain} then {path}");
        escaped.extend(escape(&what, &statuses, runs));
    }
    escaped
}

/// For each `(route, prefix, plain, spellings)`: the handler of `route`
/// (a wildcard's, cleaning its tail from its own root) serves each of
/// `spellings` as it serves `plain`, and a rule of one request a window on
/// `prefix` refuses each after `plain` from the same client, with the
/// layer on the router and around it.
async fn assert_limited_after_plain(cases: &[(&str, &str, &str, &[&str])]) {
    for &(route, prefix, plain, spellings) in cases {
        let served = served_without_a_layer(route, plain)
            .await
            .unwrap_or_else(|| panic!("{route} does not serve {plain}"));
        assert_spellings_limited(cleaning_route(route), prefix, (plain, &served), spellings).await;
    }
}

/// axum matches a route's literal text against the raw path, so a route
/// whose literal part before a wildcard rooted inside a segment needs an
/// escape is written with it: `/caf%C3%A9-{*path}` (what a browser sends
/// for `/café-...`), `/a%3Ab-{*path}`, `/a%2Fb-{*path}`. A rule naming the
/// prefix decoded (`/café-private`, `/a:b-private`; SECURITY.md: "a prefix
/// with escapes is matched with them decoded too"), or with escapes on both
/// sides of the root (`/caf%C3%A9-priv%C3%A9`), or with an encoded slash
/// before it (`/a%2Fb-private`) limits the plain spelling, and must limit
/// `/caf%C3%A9-../private/r` and `/caf%C3%A9-/private/r`, which the
/// handler serves the same (`private/r`): the root inside a segment is
/// also tried on the path with every escape decoded.
#[tokio::test]
async fn an_escaped_route_literal_before_a_wildcard_rooted_inside_a_segment_does_not_escape_a_rule_under_it()
 {
    assert_limited_after_plain(&[
        (
            "/caf%C3%A9-{*path}",
            "/café-private",
            "/caf%C3%A9-private/r",
            &["/caf%C3%A9-../private/r", "/caf%C3%A9-/private/r"],
        ),
        (
            "/caf%C3%A9-{*path}",
            "/caf%C3%A9-priv%C3%A9",
            "/caf%C3%A9-priv%C3%A9/r",
            &["/caf%C3%A9-../priv%C3%A9/r", "/caf%C3%A9-/priv%C3%A9/r"],
        ),
        (
            "/a%3Ab-{*path}",
            "/a:b-private",
            "/a%3Ab-private/r",
            &["/a%3Ab-../private/r", "/a%3Ab-/private/r"],
        ),
        (
            "/a%2Fb-{*path}",
            "/a%2Fb-private",
            "/a%2Fb-private/r",
            &["/a%2Fb-../private/r", "/a%2Fb-/private/r"],
        ),
    ])
    .await;
}

/// A parameter of a rule's prefix (`/{dir}/private`) matches any segment,
/// `download-x` included: the rule limits `/download-x/private/r`, which
/// the handler of `/download-{*path}` (cleaning its tail from its own root)
/// serves as `x/private/r`. It serves `/download-../x/private/r` and
/// `/download-./x/private/r` the same: the root inside the segment is
/// tried where the parameter is, wherever the layer is.
#[tokio::test]
async fn a_wildcard_rooted_inside_a_segment_a_prefix_parameter_matches_does_not_escape_a_rule() {
    assert_limited_after_plain(&[(
        "/download-{*path}",
        "/{dir}/private",
        "/download-x/private/r",
        &["/download-../x/private/r", "/download-./x/private/r"],
    )])
    .await;
}

/// With the layer on the router of `route` (a wildcard's, whose handler
/// cleans its tail from its own root) and a rule on `prefix`: `path` after
/// `plain` from one client is refused, the router's route telling that it
/// is served alike; and `unrelated`, which `prefix` does not cover, is not
/// limited on the router or around it (where the route is unknown).
async fn assert_limited_on_the_router(
    route: &str,
    prefix: &str,
    (plain, path): (&str, &str),
    unrelated: &str,
) {
    let (runs, router) = cleaning_route(route);
    let router = router.fallback(|| async { "other" });
    let rules = rule_on("private", prefix);
    let [(_, on_the_router), (_, around_the_router)] = placements(&rules, &router);
    let statuses = as_one(&on_the_router, [plain, path]).await;
    assert_eq!(statuses, [200, 429], "ran {:?}", runs.lock().unwrap());
    for app in [on_the_router, around_the_router] {
        assert_eq!(as_one(&app, [unrelated; 3]).await, [200; 3], "{unrelated}");
    }
}

/// Two readings only the router's route tells, covered with the layer on
/// the router (axum's `MatchedPath`) and not around it:
/// - `/download-/x/private/r` is served by `/download-{*path}` as
///   `x/private/r`, as `/download-x/private/r` is, which a rule on
///   `/{dir}/private` limits; around the router, a parameter joining any
///   two segments would put every `/a/b/private` under that rule;
/// - `/staticprivate/r` is served by `/static{*path}` (given `private/r`)
///   as `/static/private/r` is, which a rule on `/static/private` limits;
///   around the router, splitting a segment wherever it starts as a
///   literal does would put every `/apiary` under `/api`.
#[tokio::test]
async fn what_only_the_route_tells_is_limited_on_the_router() {
    assert_limited_on_the_router(
        "/download-{*path}",
        "/{dir}/private",
        ("/download-x/private/r", "/download-/x/private/r"),
        "/a/b/private",
    )
    .await;
    assert_limited_on_the_router(
        "/static{*path}",
        "/static/private",
        ("/static/private/r", "/staticprivate/r"),
        "/static-assets/private/r",
    )
    .await;
}

/// `path` with repeated slashes merged and dot segments resolved, as a
/// proxy in front of a router may forward it (RFC 3986 remove_dot_segments).
fn proxy_normalized(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/').skip(1) {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    format!("/{}", parts.join("/"))
}

/// SECURITY.md: "servers and proxies in front of [the router] may merge
/// slashes, resolve dot segments or decode bytes first. So a rule applies
/// when its prefix matches any spelling any of them may route on". A hop
/// between the layer and the router that resolves dot segments forwards
/// `/x/../download-../private/r` as `/download-../private/r`, which the
/// handler of `/download-{*path}` serves as `private/r`, as it serves
/// `/download-private/r`: the root inside a segment is also tried on the
/// path with dot segments resolved (`download-..` is no dot segment, so
/// resolving keeps it).
#[tokio::test]
async fn a_dot_dot_resolved_before_routing_then_below_a_root_inside_a_segment_does_not_escape_a_rule()
 {
    assert_limited_behind_a_dot_resolving_hop(&[
        (
            "/download-{*path}",
            "/download-private",
            "/download-private/r",
            "/x/../download-../private/r",
        ),
        (
            "/download-{*path}",
            "/download-private",
            "/download-private/r",
            "/download-x/../download-../private/r",
        ),
    ])
    .await;
}

/// A parameter holding an encoded slash (`a%2Fb`: `Path` gives the handler
/// the tenant `a/b`) and an encoded slash in the tail's first name
/// (`private%2Fr`, given as `private/r`): the handler of
/// `/{tenant}/files/{*path}` serves `/a%2Fb/files/private%2Fr` as it serves
/// `/a%2Fb/files/private/r`, which a rule on `/{tenant}/files/private`
/// limits: the roots between segments are tried where the path has an
/// encoded slash, as where it has a `..`. The same with a root inside a
/// segment (`/{tenant}/download-{*path}`, `/a%2Fb/download-private%2Fr`).
#[tokio::test]
async fn an_encoded_slash_in_a_parameter_and_in_the_tail_does_not_escape_a_rule_under_it() {
    let mut escaped = Vec::new();
    for (route, prefix, plain, path) in [
        (
            "/{tenant}/files/{*path}",
            "/{tenant}/files/private",
            "/a%2Fb/files/private/r",
            "/a%2Fb/files/private%2Fr",
        ),
        (
            "/{tenant}/download-{*path}",
            "/{tenant}/download-private",
            "/a%2Fb/download-private/r",
            "/a%2Fb/download-private%2Fr",
        ),
    ] {
        let (runs, router) = tenant_route(route);
        escaped.extend(escapes_after(&runs, &router, prefix, plain, path).await);
    }
    assert!(
        escaped.is_empty(),
        "a handler served a/b's private/r twice under a limit of one: {escaped:#?}"
    );
}

/// Checks that the handler of `router` (recording in `runs`) serves each
/// of `paths` as it serves `plain`, which it records as `served`; then that
/// a rule of one request a window on `prefix` refuses each after `plain`
/// from the same client, with the layer on the router and around it.
async fn assert_spellings_limited(
    (runs, router): (Runs, Router),
    prefix: &str,
    (plain, served): (&str, &str),
    paths: &[&str],
) {
    let mut escaped = Vec::new();
    for &path in paths {
        for sent in [plain, path] {
            runs.lock().unwrap().clear();
            let req = Request::get(sent).body(Body::empty()).unwrap();
            let status = router.clone().oneshot(req).await.unwrap().status();
            assert_eq!(status, StatusCode::OK, "{sent}");
            assert_eq!(
                runs.lock().unwrap().pop().as_deref(),
                Some(served),
                "{sent}"
            );
        }
        escaped.extend(escapes_after(&runs, &router, prefix, plain, path).await);
    }
    assert!(
        escaped.is_empty(),
        "a handler served {served} twice under a limit of one: {escaped:#?}"
    );
}

/// A parameter holding an encoded slash before a route literal that needs
/// an escape, on `/{tenant}/caf%C3%A9-{*path}`: the handler (cleaning its
/// tail from its own root) serves tenant `a/b`'s `private/r` for
/// `/a%2Fb/caf%C3%A9-private/r`, which a rule on `/{tenant}/café-private`
/// limits, and the same for `/a%2Fb/caf%C3%A9-../private/r`,
/// `-/private/r`, `-./private/r` and `-..%2Fprivate%2Fr`: each segment is
/// read as `Path` decodes it (the tenant one segment `a/b`, the literal
/// `café-`), so the rule covers them.
#[tokio::test]
async fn an_encoded_slash_in_a_parameter_before_an_escaped_literal_rooted_inside_a_segment_does_not_escape_a_rule()
 {
    assert_spellings_limited(
        tenant_route("/{tenant}/caf%C3%A9-{*path}"),
        "/{tenant}/café-private",
        ("/a%2Fb/caf%C3%A9-private/r", "\"a/b\": private/r"),
        &[
            "/a%2Fb/caf%C3%A9-../private/r",
            "/a%2Fb/caf%C3%A9-/private/r",
            "/a%2Fb/caf%C3%A9-./private/r",
            "/a%2Fb/caf%C3%A9-..%2Fprivate%2Fr",
        ],
    )
    .await;
}

/// The same below a root between segments: on `/{tenant}/caf%C3%A9/{*path}`
/// the handler serves tenant `a/b`'s `private/r` for
/// `/a%2Fb/caf%C3%A9/private/r`, which a rule on `/{tenant}/café/private`
/// limits, and for `/a%2Fb/caf%C3%A9/../private/r`,
/// `/a%2Fb/caf%C3%A9/..%2Fprivate%2Fr` and `/a%2Fb/caf%C3%A9/x/../../private/r`.
#[tokio::test]
async fn an_encoded_slash_in_a_parameter_before_an_escaped_literal_above_a_wildcard_does_not_escape_a_rule()
 {
    assert_spellings_limited(
        tenant_route("/{tenant}/caf%C3%A9/{*path}"),
        "/{tenant}/café/private",
        ("/a%2Fb/caf%C3%A9/private/r", "\"a/b\": private/r"),
        &[
            "/a%2Fb/caf%C3%A9/../private/r",
            "/a%2Fb/caf%C3%A9/..%2Fprivate%2Fr",
            "/a%2Fb/caf%C3%A9/x/../../private/r",
        ],
    )
    .await;
}

/// axum runs `/{tenant}/files/{*path}` for `/./files/private/r` with the
/// tenant `.` (the router does not resolve dot segments), and a rule on
/// `/{tenant}/files/private` limits it. The handler serves the same
/// (tenant `.`, `private/r`) for `/./files//private/r` and
/// `/./files/./private/r`: the tail is cleaned below each root between
/// segments wherever cleaning changes it (an empty or dot segment), so the
/// rule covers them around the router too.
#[tokio::test]
async fn a_dot_parameter_and_an_empty_or_dot_segment_in_the_tail_do_not_escape_a_rule_around_the_router()
 {
    assert_spellings_limited(
        tenant_files(),
        "/{tenant}/files/private",
        ("/./files/private/r", "\".\": private/r"),
        &["/./files//private/r", "/./files/./private/r"],
    )
    .await;
}

/// What escapes a rule of one request a window on `prefix` when one client
/// sends `plain`, then `path`, through the layer to a hop that resolves dot
/// segments ([`proxy_normalized`]) in front of the handler of `route` (a
/// wildcard's, cleaning its tail from its own root), after checking that
/// the handler serves both the same through the hop.
async fn assert_limited_behind_a_dot_resolving_hop(cases: &[(&str, &str, &str, &str)]) {
    assert_limited_behind_a_hop(proxy_normalized, cases).await;
}

/// [`assert_limited_behind_a_dot_resolving_hop`] behind a hop that
/// forwards each path as `forward` rewrites it.
async fn assert_limited_behind_a_hop(
    forward: fn(&str) -> String,
    cases: &[(&str, &str, &str, &str)],
) {
    let mut escaped = Vec::new();
    for &(route, prefix, plain, path) in cases {
        escaped.extend(escapes_behind_a_hop(forward, route, prefix, plain, path).await);
    }
    assert!(
        escaped.is_empty(),
        "a handler behind a hop served a file twice under a limit of one: {escaped:#?}"
    );
}

/// What escapes a rule of one request a window on `prefix` when one client
/// sends `plain`, then `path`, through the layer to a hop that forwards
/// each path as `forward` rewrites it, in front of the handler of `route`
/// (a wildcard's, cleaning its tail from its own root), after checking
/// that the handler serves both the same through the hop.
async fn escapes_behind_a_hop(
    forward: fn(&str) -> String,
    route: &str,
    prefix: &str,
    plain: &str,
    path: &str,
) -> Vec<String> {
    let (runs, router) = if route.contains("{tenant}") {
        tenant_route(route)
    } else {
        cleaning_route(route)
    };
    let hop = |router: Router| {
        ServiceExt::<Request<Body>>::map_request(router, move |mut req: Request<Body>| {
            let path = forward(req.uri().path());
            *req.uri_mut() = path.parse().unwrap();
            req
        })
    };
    let mut served = Vec::new();
    for p in [plain, path] {
        runs.lock().unwrap().clear();
        let req = Request::get(p).body(Body::empty()).unwrap();
        let status = hop(router.clone()).oneshot(req).await.unwrap().status();
        assert_eq!(
            status,
            StatusCode::OK,
            "{route} does not serve {p} behind the hop"
        );
        served.push(runs.lock().unwrap().pop().unwrap());
    }
    assert_eq!(
        served[0], served[1],
        "{route} serves {path} otherwise than {plain}"
    );
    let app = App::new(ServiceExt::<Request<Body>>::map_response(
        layer_of(&rule_on("private", prefix)).layer(hop(router)),
        IntoResponse::into_response,
    ));
    runs.lock().unwrap().clear();
    let statuses = as_one(&app, [plain, path]).await;
    escape(
        &format!("rule on {prefix}, behind a hop: {plain} then {path}"),
        &statuses,
        &runs,
    )
    .into_iter()
    .collect()
}

/// SECURITY.md: proxies in front of the router may resolve dot segments
/// first, and a rule applies to any spelling any of them may route on. A
/// hop resolving dot segments (an encoded slash is no separator to it)
/// forwards `/x/../files/..%2Fprivate%2Fr` as `/files/..%2Fprivate%2Fr`,
/// which the handler of `/files/{*path}` serves as `private/r`; and
/// `/x/../caf%C3%A9-x%2F../private/r` as `/caf%C3%A9-x%2F../private/r`,
/// which the handler of `/caf%C3%A9-{*path}` serves as `private/r`: the
/// path as such a hop forwards it is read below each root too, so a rule
/// on the plain path's prefix covers both.
#[tokio::test]
async fn a_dot_resolving_hop_then_an_encoded_slash_dot_dot_below_a_wildcard_does_not_escape_a_rule()
{
    assert_limited_behind_a_dot_resolving_hop(&[
        (
            "/files/{*path}",
            "/files/private",
            "/files/private/r",
            "/x/../files/..%2Fprivate%2Fr",
        ),
        (
            "/caf%C3%A9-{*path}",
            "/café-private",
            "/caf%C3%A9-private/r",
            "/x/../caf%C3%A9-x%2F../private/r",
        ),
    ])
    .await;
}

/// A hop that resolves dot segments as written (`.`, `..`: the test's own
/// [`proxy_normalized`]) keeps `%2e%2e`, so it forwards
/// `/x/../%2e%2e/download-/private/r` as `/%2e%2e/download-/private/r`,
/// which axum runs on `/{tenant}/download-{*path}` with the tenant `..`
/// and the tail `/private/r`, served as for `/%2e%2e/download-private/r`,
/// which a rule on `/{tenant}/download-private` limits: the path is also
/// read as a hop that takes `%2e` for no dot forwards it.
#[tokio::test]
async fn a_hop_keeping_an_escaped_dot_dot_parameter_does_not_escape_a_rule() {
    assert_limited_behind_a_dot_resolving_hop(&[(
        "/{tenant}/download-{*path}",
        "/{tenant}/download-private",
        "/%2e%2e/download-private/r",
        "/x/../%2e%2e/download-/private/r",
    )])
    .await;
}

/// axum allows a wildcard right after a segment's literal start, with no
/// slash between (`/static{*path}`, as `/download-{*path}`). Its handler,
/// cleaning its tail from its own root, is given `/private/r` for
/// `/static/private/r`, which a rule on `/static/private` limits, and
/// `../private/r` and `./private/r` for `/static../private/r` and
/// `/static./private/r`: it serves all as `private/r`, so the rule limits
/// each of them, with the layer on the router and around it.
#[tokio::test]
async fn a_wildcard_rooted_right_after_a_literal_start_does_not_escape_a_rule_with_a_slash_at_its_root()
 {
    assert_limited_after_plain(&[(
        "/static{*path}",
        "/static/private",
        "/static/private/r",
        &["/static../private/r", "/static./private/r"],
    )])
    .await;
}

/// `path` with every escape decoded, as a hop may forward it (SECURITY.md:
/// "or every escape decoded first, `%2F` then a separator").
fn fully_decoded(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

/// Hops that decode every escape, alone or around one that resolves dot
/// segments as written, forward a path the router's `Path` decodes once
/// more: `/files/%2570rivate/r` as `/files/%70rivate/r`,
/// `/files/x/%252e%252e/private/r` as `/files/x/%2e%2e/private/r`, and
/// `/x/%2e%2e/files/%252e%252e/private/r` (decoded, then resolved) or
/// `/x/../files/%252e%252e/private/r` (resolved, then decoded) as
/// `/files/%2e%2e/private/r`. The handler of `/files/{*path}` serves each
/// as `private/r`, as for `/files/private/r`, which a rule on
/// `/files/private` limits: the layer reads the path as each hop forwards
/// it, then decodes its segments as `Path` does, so the rule covers them.
#[tokio::test]
async fn hops_decoding_every_escape_do_not_escape_a_rule() {
    for (forward, path) in [
        (fully_decoded as fn(&str) -> String, "/files/%2570rivate/r"),
        (fully_decoded, "/files/x/%252e%252e/private/r"),
        (
            decoded_then_dot_resolved,
            "/x/%2e%2e/files/%252e%252e/private/r",
        ),
        (
            dot_resolved_then_decoded,
            "/x/../files/%252e%252e/private/r",
        ),
    ] {
        let case = ("/files/{*path}", "/files/private", "/files/private/r", path);
        assert_limited_behind_a_hop(forward, &[case]).await;
    }
}

/// [`fully_decoded`], then dot segments resolved as written
/// ([`proxy_normalized`]): a hop that decodes every escape once and then
/// resolves `.`/`..` (as nginx normalises a path: `%252e` decodes to the
/// text `%2e`, which it does not decode again, so is no dot to it).
fn decoded_then_dot_resolved(path: &str) -> String {
    proxy_normalized(&fully_decoded(path))
}

/// A hop that decodes every escape (SECURITY.md: "every escape decoded
/// first") turns `%3F` into `?`, which ends the path it forwards:
/// `/files/private%3Fx` reaches the router as `/files/private` (query `x`),
/// and the handler of `/files/{*path}` serves `private`, as for
/// `/files/private`, which a rule on `/files/private` limits. The layer's
/// decoded reading ends the path there too; `%23` (`#`) likewise.
#[tokio::test]
async fn a_hop_decoding_an_escaped_question_mark_does_not_escape_a_rule() {
    assert_limited_behind_a_hop(
        fully_decoded,
        &[
            (
                "/files/{*path}",
                "/files/private",
                "/files/private",
                "/files/private%3Fx",
            ),
            (
                "/files/{*path}",
                "/files/private/r",
                "/files/private/r",
                "/files/private/r%3F",
            ),
            (
                "/files/{*path}",
                "/files/private",
                "/files/private",
                "/files/private%23x",
            ),
        ],
    )
    .await;
}

/// On `/{tenant}/static{*path}`, the handler (cleaning its tail from its
/// own root) serves tenant `a/b`'s `private/r` for
/// `/a%2Fb/static/private/r`, which a rule on `/{tenant}/static/private`
/// limits, and the same for `/a%2Fb/static%2F..%2Fprivate/r` (tail
/// `/../private/r`): the wildcard's start is read as a segment of its own
/// where what follows it in the segment is empty, the encoded slash then
/// the tail's, so the rule covers it around the router too.
#[tokio::test]
async fn an_encoded_slash_in_a_parameter_and_after_a_wildcards_literal_start_does_not_escape_a_rule()
 {
    assert_spellings_limited(
        tenant_route("/{tenant}/static{*path}"),
        "/{tenant}/static/private",
        ("/a%2Fb/static/private/r", "\"a/b\": private/r"),
        &[
            "/a%2Fb/static%2F..%2Fprivate/r",
            "/a%2Fb/static%2F..%2Fprivate%2Fr",
            "/a%2Fb/static%2F%2e%2e/private/r",
        ],
    )
    .await;
}

/// [`proxy_normalized`], then [`fully_decoded`]: a hop that resolves dot
/// segments, then one that decodes every escape.
fn dot_resolved_then_decoded(path: &str) -> String {
    fully_decoded(&proxy_normalized(path))
}

/// [`proxy_normalized`] after backslashes are turned into slashes, as
/// Istio's default path normalization (`BASE`: "Istio will normalize the
/// backslash `\` to the forward slash `/`"), Envoy's `normalize_path` and
/// Cloudflare's URL normalization (type "Cloudflare") forward a path.
fn backslash_normalized(path: &str) -> String {
    proxy_normalized(&path.replace('\\', "/"))
}

/// A hop that turns `\` into `/` before resolving dot segments (Istio's
/// default `BASE` normalization, Cloudflare's) forwards `/files\private/r`
/// and `/x\..\files/private/r` as `/files/private/r`, which the handler of
/// `/files/{*path}` serves as `private/r` and a rule on `/files/private`
/// limits; `http` accepts a raw `\` in a path, so a client can send it. The
/// layer also reads the path with backslashes as slashes, so the rule
/// covers them.
#[tokio::test]
async fn a_hop_turning_backslashes_into_slashes_does_not_escape_a_rule() {
    assert_limited_behind_a_hop(
        backslash_normalized,
        &[
            (
                "/files/{*path}",
                "/files/private",
                "/files/private/r",
                "/files\\private/r",
            ),
            (
                "/files/{*path}",
                "/files/private",
                "/files/private/r",
                "/x\\..\\files/private/r",
            ),
            (
                "/download-{*path}",
                "/download-private",
                "/download-private/r",
                "/download-\\private/r",
            ),
        ],
    )
    .await;
}

/// A hop that decodes every escape, merges slashes, resolves dot segments,
/// then escapes again what would change the request line (`%`, `?`, `#`,
/// bytes outside printable ASCII), as nginx forwards a path to a
/// `proxy_pass` with a URI: a decoded `%3F` does not end the path it
/// forwards.
fn nginx_forwarded(path: &str) -> String {
    let mut out = String::new();
    for &byte in proxy_normalized(&fully_decoded(path)).as_bytes() {
        if matches!(byte, b'%' | b'?' | b'#') || !byte.is_ascii_graphic() {
            out.push_str(&format!("%{byte:02X}"));
        } else {
            out.push(byte as char);
        }
    }
    out
}

/// A hop that decodes only encoded slashes, then merges slashes and
/// resolves dot segments (Envoy's `UNESCAPE_AND_FORWARD`, Istio's
/// `DECODE_AND_MERGE_SLASHES`): a `%3F` stays as it is.
fn slashes_decoded_then_resolved(path: &str) -> String {
    proxy_normalized(&path.replace("%2F", "/").replace("%2f", "/"))
}

/// A hop that decodes `%2F` but keeps `?` in the path (nginx re-escapes
/// it; Envoy and Istio decode only `%2F`) forwards
/// `/x%3F/..%2Fdownload-/private/r` as `/download-/private/r`, which
/// `/download-{*path}` serves as `private/r`, as for `/download-private/r`;
/// and `/x%3F/..%2Fstatic../private/r` as `/static../private/r`, served as
/// `private/r` by `/static{*path}`, as for `/static/private/r`. The layer
/// also reads a path as such a hop forwards it (every escape but `%`, `?`
/// and `#` decoded), so a rule on the plain path's prefix covers them.
#[tokio::test]
async fn an_escaped_question_mark_before_an_encoded_slash_does_not_hide_a_wildcard_rooted_inside_a_segment()
 {
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "/download-{*path}",
            "/download-private",
            "/download-private/r",
            "/x%3F/..%2Fdownload-/private/r",
        ),
        (
            "/static{*path}",
            "/static/private",
            "/static/private/r",
            "/x%3F/..%2Fstatic../private/r",
        ),
        (
            "/{tenant}/download-{*path}",
            "/{tenant}/download-private",
            "/t%3F/download-private/r",
            "/t%3F/%2Fdownload-/private/r",
        ),
    ];
    let mut escaped = Vec::new();
    for forward in [
        nginx_forwarded as fn(&str) -> String,
        slashes_decoded_then_resolved,
    ] {
        for &(route, prefix, plain, path) in cases {
            escaped.extend(escapes_behind_a_hop(forward, route, prefix, plain, path).await);
        }
    }
    assert!(
        escaped.is_empty(),
        "a handler behind a hop served a file twice under a limit of one: {escaped:#?}"
    );
}

/// RFC 3986's `remove_dot_segments`, as a hop that resolves dot segments
/// but does not merge slashes forwards a path (Envoy's `normalize_path`,
/// Istio's default `BASE` normalization: merging slashes is a separate
/// option): a `..` after an empty segment removes the empty one, so
/// `/api//../x` is `/api/x`, where merging first would give `/x`.
fn dot_resolved_keeping_empty_segments(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').skip(1).collect();
    let mut out: Vec<&str> = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        match *part {
            "." => {}
            ".." => {
                out.pop();
            }
            part => {
                out.push(part);
                continue;
            }
        }
        if last {
            out.push("");
        }
    }
    format!("/{}", out.join("/"))
}

/// A hop resolving dot segments without merging slashes (Istio's default,
/// Envoy's `normalize_path`) forwards `/api//../download-../private/r` as
/// `/api/download-../private/r`, which the handler of
/// `/api/download-{*path}` (cleaning its tail from its own root) serves as
/// `private/r`, as it serves `/api/download-private/r`, which a rule on
/// `/api/download-private` limits. The layer also reads the path as such a
/// hop forwards it, so the rule covers it. The same for
/// `/api/static{*path}` and `/{tenant}/download-{*path}`.
#[tokio::test]
async fn a_hop_resolving_dot_segments_without_merging_slashes_does_not_hide_a_root_inside_a_segment()
 {
    assert_limited_behind_a_hop(
        dot_resolved_keeping_empty_segments,
        &[
            (
                "/api/download-{*path}",
                "/api/download-private",
                "/api/download-private/r",
                "/api//../download-../private/r",
            ),
            (
                "/api/static{*path}",
                "/api/static/private",
                "/api/static/private/r",
                "/api//../static../private/r",
            ),
            (
                "/{tenant}/download-{*path}",
                "/{tenant}/download-private",
                "/t/download-private/r",
                "/t//../download-../private/r",
            ),
        ],
    )
    .await;
}

/// Limited more: GitLab-style APIs name a project by its encoded path
/// (`/projects/acme%2Fexport` is the project `export` of the group
/// `acme`), which axum's `/projects/{id}` runs with the one segment
/// `acme/export`. The layer cannot tell that handler from a service that
/// decodes the path it is given (see
/// `a_service_decoding_an_encoded_slash_in_a_parameter_does_not_escape_a_rule_on_the_router`),
/// so a parameter holding an encoded slash is also read with the slash a
/// separator, and a rule on `/projects/{id}/export` counts the project,
/// on a route with a wildcard as on one without.
#[tokio::test]
async fn an_encoded_slash_in_a_parameter_is_also_read_as_a_separator_on_the_router() {
    let cases = [
        (
            &["/projects/{id}", "/projects/{id}/export"],
            "/projects/acme%2Fexport",
        ),
        (
            &["/projects/{id}/files/{*path}", "/projects/{id}/export"],
            "/projects/acme%2Fexport/files/readme",
        ),
    ];
    for (routes, path) in cases {
        let statuses = on_routes(routes, "/projects/{id}/export", path).await;
        assert_eq!(
            statuses,
            [200, 429, 429],
            "{path} under /projects/{{id}}/export"
        );
    }
}

/// A reverse proxy mounted with `route_service` on `/{service}` and
/// `/{service}/{*rest}`, to a backend that decodes the path before routing
/// it (Go's `http.FileServer`, `http.ServeMux` before 1.22), serves
/// `/admin%2Fkeys` (one `service`, `admin/keys`, to axum) as `/admin/keys`,
/// which a rule on `/admin/keys` limits: on the router a parameter holding
/// an encoded slash is also read with the slash a separator.
#[tokio::test]
async fn a_service_decoding_an_encoded_slash_in_a_parameter_does_not_escape_a_rule_on_the_router() {
    let (runs, proxy) = proxy_serving(|path| cleaned(&fully_decoded(path)));
    let router = Router::new()
        .route_service("/{service}", proxy.clone())
        .route_service("/{service}/{*rest}", proxy);
    for escape in ["/admin%2Fkeys", "/admin%2Fkeys/r", "/admin%252Fkeys/r"] {
        assert_only_the_first_on_the_router(
            &router,
            &runs,
            "/admin/keys",
            &["/admin/keys", escape],
        )
        .await;
    }
}

/// With the layer on a router of `routes` (each answering `200`) and a
/// rule of one request a window on `prefix`, the statuses of `path` sent
/// three times.
async fn on_routes(routes: &[&str], prefix: &str, path: &str) -> Vec<u16> {
    let router = routes.iter().fold(Router::new(), |router, route| {
        router.route(route, get(|| async { "ok" }))
    });
    let app = App::new(router.layer(layer_of(&rule_on("rule", prefix))));
    as_one(&app, [path; 3]).await
}

/// With the layer on a router of `routes` (each answering `200`) and a
/// rule of one request a window on `prefix`, `path`, which no route under
/// `prefix` runs, is answered three times: the rule does not count it.
async fn assert_not_counted_on_the_router(routes: &[&str], prefix: &str, path: &str) {
    let statuses = on_routes(routes, prefix, path).await;
    assert_eq!(statuses, [200; 3], "{path} counted under {prefix}");
}

/// `paths`, one client's, sent in turn to `router` with the layer of a rule
/// of one request a window on `prefix` on the router (`Router::layer`, so
/// `MatchedPath` is set): the statuses and what the handler served.
async fn on_the_router(
    router: &Router,
    runs: &Runs,
    prefix: &str,
    paths: &[&str],
) -> (Vec<u16>, Vec<String>) {
    let rules = rule_on("private", prefix);
    let app = App::new(router.clone().layer(layer_of(&rules)));
    runs.lock().unwrap().clear();
    let statuses = as_one(&app, paths.iter().copied()).await;
    let served = runs.lock().unwrap().clone();
    (statuses, served)
}

/// [`on_the_router`], asserting that only the first of `paths` is
/// served (the rest refused, one request a window).
async fn assert_only_the_first_on_the_router(
    router: &Router,
    runs: &Runs,
    prefix: &str,
    paths: &[&str],
) {
    let (statuses, served) = on_the_router(router, runs, prefix, paths).await;
    let mut want = vec![429; paths.len()];
    want[0] = 200;
    assert_eq!(
        statuses, want,
        "on the router, {served:?} served under a limit of one"
    );
}

/// matchit 0.8 lets a route's segment start with a literal before a
/// parameter (`/user_{name}/{*path}`); axum runs
/// `/user_bob/x/../private/r` with `name` `bob` and the tail
/// `x/../private/r`, which a handler cleaning its tail from its own root
/// serves as `private/r`, as for `/user_bob/private/r`: on the router the
/// layer takes the route's segment `user_{name}` for a parameter, reads
/// below the wildcard, and a rule on `/user_bob/private` covers it.
#[tokio::test]
async fn a_parameter_with_a_literal_start_before_a_wildcard_does_not_escape_a_rule_on_the_router() {
    let (runs, router) = tenant_route("/user_{name}/{*path}");
    assert_only_the_first_on_the_router(
        &router,
        &runs,
        "/user_bob/private",
        &[
            "/user_bob/private/r",
            "/user_bob/x/../private/r",
            "/user_bob/../private/r",
        ],
    )
    .await;
}

/// A route literal with matchit's escaped braces (`/v{{1}}/{*path}`, the
/// literal segment `v{1}`): axum runs `/v{1}/x/../private/r` under it, and a
/// handler cleaning its tail serves `private/r`, as for `/v{1}/private/r`.
/// On the router the layer reads the registered `v{{1}}` as `v{1}`, so the
/// path follows the route and is read below its wildcard.
#[tokio::test]
async fn a_route_literal_with_escaped_braces_before_a_wildcard_does_not_escape_a_rule_on_the_router()
 {
    let (runs, router) = cleaning_route("/v{{1}}/{*path}");
    assert_only_the_first_on_the_router(
        &router,
        &runs,
        "/v%7B1%7D/private",
        &["/v{1}/private/r", "/v{1}/x/../private/r"],
    )
    .await;
}

/// Below `/files/{*path}`, `Path` decodes `%2F` in the tail into a
/// separator, so `/files/a%2Fb/x` and `/files/a/b/x` are one file,
/// `a/b/x`: on the router a wildcard's tail is read as `Path` hands it
/// over, so a rule on `/files/{dir}/x` gives both one answer.
#[tokio::test]
async fn an_encoded_slash_in_a_wildcard_tail_is_read_as_the_handler_reads_it_on_the_router() {
    let (runs, router) = cleaning_route("/files/{*path}");
    let mut answers = Vec::new();
    for path in ["/files/a%2Fb/x", "/files/a/b/x"] {
        let (statuses, served) = on_the_router(&router, &runs, "/files/{dir}/x", &[path; 2]).await;
        assert_eq!(served.first().map(String::as_str), Some("a/b/x"));
        answers.push((path, statuses));
    }
    assert_eq!(
        answers[0].1, answers[1].1,
        "on the router, one file a/b/x was limited one way and not the other: {answers:?}"
    );
}

/// A reverse proxy's backend, given the whole path, that serves what
/// `resolve` makes of it ([`cleaned`]: dot segments resolved, RFC 3986,
/// slashes merged; [`rfc3986_resolved`]: empty segments kept), noted in
/// `runs`.
fn proxy_serving(
    resolve: fn(&str) -> String,
) -> (
    Runs,
    impl tower::Service<
        Request<Body>,
        Response = Response,
        Error = Infallible,
        Future = impl Send + 'static,
    > + Clone
    + Send
    + Sync
    + 'static,
) {
    let runs: Runs = Arc::default();
    let seen = runs.clone();
    let proxy = tower::service_fn(move |req: Request<Body>| {
        let runs = seen.clone();
        async move {
            runs.lock().unwrap().push(resolve(req.uri().path()));
            Ok::<_, Infallible>("proxied".into_response())
        }
    });
    (runs, proxy)
}

/// A service mounted with `route_service` (or a handler reading `Uri`)
/// is given the whole path, not the wildcard's tail: a reverse proxy on
/// `/api/{*rest}` forwards `/api/../api/admin/r` to a backend that
/// resolves dot segments (RFC 3986), which serves `/api/admin/r`. On the
/// router the layer also reads the whole path decoded and cleaned, so a
/// rule on `/api/admin` covers it, as it does around the router.
#[tokio::test]
async fn a_route_service_given_the_whole_path_does_not_escape_a_rule_on_the_router() {
    let (runs, proxy) = proxy_serving(cleaned);
    let router = Router::new().route_service("/api/{*rest}", proxy);
    assert_only_the_first_on_the_router(
        &router,
        &runs,
        "/api/admin",
        &["/api/admin/r", "/api/../api/admin/r"],
    )
    .await;
}

/// A rule on a literal path with braces (`/users/%7Bid%7D`, what a client
/// sends for `/users/{id}` written out) is over that one path: on the
/// router a rule's literal segment matches a route's literal segment,
/// never a parameter's braces, so `/users/7` is not counted under it.
#[tokio::test]
async fn a_rule_on_a_literal_brace_segment_does_not_count_every_request_of_the_route_on_the_router()
{
    assert_not_counted_on_the_router(&["/users/{id}"], "/users/%7Bid%7D", "/users/7").await;
}

/// A middleware around a router mounted with `route_service` (axum refuses
/// a bare `Router` there).
fn wrapped_router(router: Router) -> tower::util::MapResponse<Router, fn(Response) -> Response> {
    ServiceExt::<Request<Body>>::map_response(router, |response| response)
}

/// [`escape`] of `paths`, one client's (`label` its key), sent to `app`,
/// the handlers' runs cleared first.
async fn escape_of(app: &App, runs: &Runs, label: &str, paths: &[&str]) -> Option<String> {
    runs.lock().unwrap().clear();
    let statuses = answers(app, paths.iter().map(|path| (*path, ("x-id", label)))).await;
    escape(label, &statuses, runs)
}

/// A router mounted whole with `route_service` behind a middleware of its
/// own (axum refuses a bare `Router` there, not one wrapped in a Tower
/// layer, as `ServiceBuilder` stacks are) runs its own routes on the whole
/// path: its `/api/files/{*path}` handler, cleaning its tail from its own
/// root, serves `private/r` for `/api/files/../private/r` as for
/// `/api/files/private/r`. With the layer on the inner router,
/// `MatchedPath` joins the two routes (`/api/{*rest}/api/files/{*path}`):
/// the path does not follow that, so the layer reads it every way, and a
/// rule on `/api/files/private` covers it. (On the outer router, whose
/// route `/api/{*rest}` says nothing of the inner one's, it does not: see
/// SECURITY.md.)
#[tokio::test]
async fn a_router_mounted_with_route_service_is_limited_with_the_layer_on_it() {
    let (runs, inner) = cleaning_route("/api/files/{*path}");
    let rules = rule_on("private", "/api/files/private");
    let paths = ["/api/files/private/r", "/api/files/../private/r"];
    let mut escaped = Vec::new();
    for (placement, app) in [(
        "on the inner router",
        App::new(Router::new().route_service(
            "/api/{*rest}",
            wrapped_router(inner.clone().layer(layer_of(&rules))),
        )),
    )] {
        escaped.extend(escape_of(&app, &runs, placement, &paths).await);
    }
    assert!(escaped.is_empty(), "served private/r twice: {escaped:#?}");
}

/// Below `/files/{*path}`, `Path` decodes `%252e%252e` once, into the
/// name `%2e%2e`, which a handler cleaning its tail from its own root (as
/// Go's `http.Dir` does) takes for a name, not a `..`: it serves
/// `/files/y/..%2Fprivate/x/%252e%252e/../../r` as `private/r` (`y`, `..`,
/// `private`, `x`, `%2e%2e`, then two `..` undo `%2e%2e` and `x`), as it
/// serves `/files/private/r`. On the router the layer cleans the tail as
/// the handler does, `%2e` in what `Path` gives a name, not a dot (taken
/// for a dot, the tail would clean to `r`), so a rule on `/files/private`
/// covers both.
#[tokio::test]
async fn an_escaped_percent_dot_dot_in_a_wildcard_tail_does_not_escape_a_rule_on_the_router() {
    let (runs, router) = cleaning_route("/files/{*path}");
    assert_only_the_first_on_the_router(
        &router,
        &runs,
        "/files/private",
        &[
            "/files/private/r",
            "/files/y/..%2Fprivate/x/%252e%252e/../../r",
        ],
    )
    .await;
}

/// A service given the whole path (`route_service`, or a handler reading
/// `Uri`) on a route without a wildcard, as a gateway's
/// `/{service}/{id}` and `/{service}`: a backend resolving dot segments
/// (RFC 3986) serves `/../admin` and `/./admin` (which axum runs on
/// `/{service}/{id}`, `service` `..` or `.`) as `/admin`, which a rule on
/// `/admin` limits. On the router a path with dot segments is read cleaned
/// whole on a route without a wildcard too.
#[tokio::test]
async fn a_route_service_without_a_wildcard_given_the_whole_path_does_not_escape_a_rule_on_the_router()
 {
    let (runs, proxy) = proxy_serving(cleaned);
    let router = Router::new()
        .route_service("/{service}", proxy.clone())
        .route_service("/{service}/{id}", proxy);
    assert_only_the_first_on_the_router(
        &router,
        &runs,
        "/admin",
        &["/admin", "/../admin", "/./admin"],
    )
    .await;
}

/// `router` with the layer of a rule of one request a window on `prefix`
/// on it, mounted whole with `route_service` below `/api/{*rest}` behind a
/// middleware of its own (as `a_router_mounted_with_route_service_is_limited_with_the_layer_on_it`).
fn mounted_with_the_layer_inside(router: Router, prefix: &str) -> App {
    let rules = rule_on("private", prefix);
    App::new(Router::new().route_service(
        "/api/{*rest}",
        wrapped_router(router.layer(layer_of(&rules))),
    ))
}

/// Limited more, as on a router alone
/// (`an_encoded_slash_in_a_parameter_is_also_read_as_a_separator_on_the_router`):
/// the inner router's `/api/projects/{id}` runs
/// `/api/projects/acme%2Fexport` with the one id `acme/export`, which a
/// service there may read as two segments. Mounted with `route_service`
/// below the outer `/api/{*rest}`, with the layer on the inner router,
/// `MatchedPath` is `/api/{*rest}/api/projects/{id}`: the layer reads the
/// inner route, and a rule on `/api/projects/{id}/export` counts the id.
#[tokio::test]
async fn an_encoded_slash_in_a_parameter_of_a_router_mounted_with_route_service_is_counted() {
    let inner = Router::new()
        .route("/api/projects/{id}", get(|| async { "ok" }))
        .route("/api/projects/{id}/export", get(|| async { "export" }));
    let app = mounted_with_the_layer_inside(inner, "/api/projects/{id}/export");
    let path = "/api/projects/acme%2Fexport";
    let statuses = as_one(&app, [path; 3]).await;
    assert_eq!(
        statuses,
        [200, 429, 429],
        "{path} under /api/projects/{{id}}/export"
    );
}

/// The inner router's `/api/static{*path}` (its handler cleaning its tail
/// from its own root) serves `/api/staticprivate/r` as
/// `/api/static/private/r` (`private/r`), which a rule on
/// `/api/static/private` limits; on a router alone the layer reads it so
/// (`what_only_the_route_tells_is_limited_on_the_router`). Mounted with
/// `route_service` below `/api/{*rest}`, with the layer on the inner
/// router, `MatchedPath` is `/api/{*rest}/api/static{*path}`, and the
/// layer reads the inner route, as on a router alone (taking the outer
/// wildcard for one segment, the path would be off the route, and read
/// only as around a router, which does not split a segment).
#[tokio::test]
async fn a_wildcard_right_after_a_literal_start_in_a_router_mounted_with_route_service_does_not_escape_a_rule()
 {
    let (runs, inner) = cleaning_route("/api/static{*path}");
    let app = mounted_with_the_layer_inside(inner, "/api/static/private");
    let statuses = as_one(&app, ["/api/static/private/r", "/api/staticprivate/r"]).await;
    assert_eq!(
        statuses,
        [200, 429],
        "served {:?} under a limit of one",
        runs.lock().unwrap()
    );
}

/// A router mounted with `route_service` below `/api/{*rest}` nests
/// (`nest("/api/v1", files)`) a router whose `/files/{*path}` has the layer
/// on it (`Router::layer` on the nested router, so `MatchedPath` is
/// `/api/{*rest}/api/v1/files/{*path}`). The nested router is given the
/// path with its prefix stripped (`/files/private/r`); the layer reads the
/// whole path (`OriginalUri`) on the inner route `/api/v1/files/{*path}`,
/// so a rule on `/api/v1/files/private` limits `/api/v1/files/private/r`
/// and `/api/v1/files/../private/r`, as it does for the same nest without
/// the `route_service` mount.
#[tokio::test]
async fn a_router_nested_inside_a_router_mounted_with_route_service_does_not_escape_a_rule() {
    let rules = rule_on("private", "/api/v1/files/private");
    let (runs, files) = cleaning_route("/files/{*path}");
    let files = files.layer(layer_of(&rules));
    let mounted = App::new(Router::new().route_service(
        "/api/{*rest}",
        wrapped_router(Router::new().nest("/api/v1", files.clone())),
    ));
    let nested_alone = App::new(Router::new().nest("/api/v1", files));
    let mut escaped = Vec::new();
    for (placement, app) in [("nested alone", nested_alone), ("mounted", mounted)] {
        for paths in [
            ["/api/v1/files/private/r"; 2],
            ["/api/v1/files/private/r", "/api/v1/files/../private/r"],
        ] {
            // A client of its own per case.
            let label = format!("{placement} {paths:?}");
            escaped.extend(escape_of(&app, &runs, &label, &paths).await);
        }
    }
    assert!(escaped.is_empty(), "served private/r twice: {escaped:#?}");
}

/// The same with a route without a wildcard: the nested router's
/// `/projects/{id}` (layer on it), nested at `/api/v1` in a router mounted
/// with `route_service` below `/api/{*rest}`: a rule on
/// `/api/v1/projects/acme` limits `/api/v1/projects/acme`, and a rule on
/// `/projects/{id}` (a route of the outer router's own) does not count it,
/// as it is not under it.
#[tokio::test]
async fn a_router_nested_inside_a_router_mounted_with_route_service_is_read_as_routed() {
    fn app(prefix: &str) -> App {
        let rules = rule_on("private", prefix);
        let projects = Router::new()
            .route("/projects/{id}", get(|| async { "project" }))
            .layer(layer_of(&rules));
        App::new(
            Router::new()
                .route("/projects/{id}", get(|| async { "outer project" }))
                .route_service(
                    "/api/{*rest}",
                    wrapped_router(Router::new().nest("/api/v1", projects)),
                ),
        )
    }
    assert_under_one_not_the_other(
        app,
        "/api/v1/projects/acme",
        "/api/v1/projects/acme",
        "/projects/{id}",
    )
    .await;
}

/// The outer router nested (`nest("/app", ...)`) around a router mounted
/// with `route_service` below `/api/{*rest}`, the layer on the inner
/// router: `MatchedPath` is `/app/api/{*rest}/api/files/{*path}`,
/// `OriginalUri` `/app/api/files/private/r`, and the inner router is
/// given `/api/files/private/r`. A rule on `/app/api/files/private`
/// (the path as sent, as for any nested route) limits
/// `/app/api/files/private/r`; a rule on `/api/files/private` (a route of
/// the outer router's own, here) does not count it.
#[tokio::test]
async fn a_router_mounted_with_route_service_in_a_nested_router_is_read_on_the_whole_path() {
    fn app(prefix: &str) -> App {
        let rules = rule_on("private", prefix);
        let (_, inner) = cleaning_route("/api/files/{*path}");
        let (_, own) = cleaning_route("/api/files/{*path}");
        App::new(own.nest(
            "/app",
            Router::new().route_service(
                "/api/{*rest}",
                wrapped_router(inner.layer(layer_of(&rules))),
            ),
        ))
    }
    assert_under_one_not_the_other(
        app,
        "/app/api/files/private/r",
        "/app/api/files/private",
        "/api/files/private",
    )
    .await;
}

/// Asserts that `path` is limited by a rule on `under` (one request a
/// window: a second is refused) and not by one on `not_under` (three
/// pass), each on the `app` made with that rule's prefix.
async fn assert_under_one_not_the_other(
    app: fn(&str) -> App,
    path: &str,
    under: &str,
    not_under: &str,
) {
    let limited = as_one(&app(under), [path; 2]).await;
    let other = as_one(&app(not_under), [path; 3]).await;
    assert_eq!(
        (limited, other),
        (vec![200, 429], vec![200; 3]),
        "{path}: under {under} (want [200, 429]), under {not_under} (want [200; 3])"
    );
}

/// A whole app mounted with `route_service` below a root catch-all
/// (`/{*rest}`, behind a middleware of its own), the layer on the inner
/// router: `MatchedPath` joins the two routes into `/{*rest}/users/{id}`,
/// whose outer wildcard is no segment of the path. `/users/7`, which the
/// inner router runs on `/users/{id}`, is not under a rule on
/// `/{tenant}/users` (a tenant's user list), mounted as on `/users/{id}`
/// alone: a rule's parameter does not take the outer wildcard's braces.
#[tokio::test]
async fn a_router_mounted_below_a_root_catch_all_is_not_counted_by_a_rule_over_the_joined_route() {
    let inner = || {
        Router::new()
            .route("/users/{id}", get(|| async { "user" }))
            .route("/{tenant}/users", get(|| async { "tenant's users" }))
    };
    let rules = rule_on("private", "/{tenant}/users");
    let alone = App::new(inner().layer(layer_of(&rules)));
    let mounted = App::new(
        Router::new().route_service("/{*rest}", wrapped_router(inner().layer(layer_of(&rules)))),
    );
    let path = "/users/7";
    let statuses = (
        as_one(&alone, [path; 3]).await,
        as_one(&mounted, [path; 3]).await,
    );
    assert_eq!(
        statuses,
        (vec![200; 3], vec![200; 3]),
        "{path} counted under /{{tenant}}/users (alone, mounted below /{{*rest}})"
    );
}

/// An app mounted with `route_service` below `/{*rest}` in a router
/// nested at `/{tenant}`, the layer on the app, whose `/{project}/{*file}`
/// serves a project's files, is read as the app nested alone: axum runs
/// `/acme/grp%2Fexport/readme` with the tenant `acme`, the project
/// `grp/export` (`NestedPath`, `/{tenant}`, says which segments above the
/// outer wildcard of `/{tenant}/{*rest}/{project}/{*file}` are the nest's
/// prefix) and the file `readme`; the project's encoded slash is also read
/// as a separator (limited more, as on a router alone), so a rule on
/// `/{tenant}/{project}/export` counts it in both placements.
#[tokio::test]
async fn a_router_mounted_with_route_service_in_a_nest_reads_a_parameter_as_the_app_nested_alone() {
    fn app(nested: bool) -> App {
        let files = Router::new()
            .route("/{project}/{*file}", get(|| async { "file" }))
            .route("/{project}/export", get(|| async { "export" }))
            .layer(layer_of(&rule_on("private", "/{tenant}/{project}/export")));
        if nested {
            App::new(Router::new().nest(
                "/{tenant}",
                Router::new().route_service("/{*rest}", wrapped_router(files)),
            ))
        } else {
            App::new(Router::new().nest("/{tenant}", files))
        }
    }
    let path = "/acme/grp%2Fexport/readme";
    let statuses = (
        as_one(&app(false), [path; 3]).await,
        as_one(&app(true), [path; 3]).await,
    );
    assert_eq!(
        statuses,
        (vec![200, 429, 429], vec![200, 429, 429]),
        "{path} under /{{tenant}}/{{project}}/export (nested alone, mounted in the nest)"
    );
}

/// A service mounted with `route_service` in a nested router is given the
/// path below the nest's prefix (axum strips it), not the whole path: a
/// reverse proxy's backend that resolves dot segments (RFC 3986) resolves
/// them from that root, never above it. In `nest("/v1", ...)`, a gateway's
/// `/{service}` and `/{service}/{id}` forward `/v1/admin` as `/admin` and
/// `/v1/../admin` (`service` `..`, `id` `admin`) as `/../admin`: both
/// serve `admin`, and a rule on `/v1/admin` limits both (cleaned whole,
/// the path is `/admin`; below the nest's prefix, `/v1/admin`). Likewise
/// below a wildcard: `/v1/api/{*rest}` forwards
/// `/v1/api/../../api/admin/r` as `/api/../../api/admin/r`, served as
/// `api/admin/r`, as for `/v1/api/admin/r`, under a rule on
/// `/v1/api/admin`. The layer, on the outer router, sees neither the
/// stripped path nor `NestedPath`: it cleans the path below each count of
/// the route's first segments.
#[tokio::test]
async fn a_route_service_in_a_nested_router_given_the_path_below_the_prefix_does_not_escape_a_rule()
{
    let (runs, proxy) = proxy_serving(cleaned);
    let gateway = Router::new().nest(
        "/v1",
        Router::new()
            .route_service("/{service}", proxy.clone())
            .route_service("/{service}/{id}", proxy.clone()),
    );
    let (statuses, served) =
        on_the_router(&gateway, &runs, "/v1/admin", &["/v1/admin", "/v1/../admin"]).await;
    let mut escaped = Vec::new();
    if statuses != [200, 429] {
        escaped.push(format!(
            "/{{service}}/{{id}}: {statuses:?}, served {served:?}"
        ));
    }
    let api = Router::new().nest("/v1", Router::new().route_service("/api/{*rest}", proxy));
    let (statuses, served) = on_the_router(
        &api,
        &runs,
        "/v1/api/admin",
        &["/v1/api/admin/r", "/v1/api/../../api/admin/r"],
    )
    .await;
    if statuses != [200, 429] {
        escaped.push(format!("/api/{{*rest}}: {statuses:?}, served {served:?}"));
    }
    assert!(
        escaped.is_empty(),
        "served twice under a limit of one: {escaped:#?}"
    );
}

/// `path` with its dot segments removed as RFC 3986 (5.2.4) removes them:
/// an empty segment is a segment, which a `..` removes (`/api//../admin`
/// is `/api/admin`), as Envoy's `normalize_path`, Java's `URI.normalize`
/// and the layer's own `dots_resolved_keeping_empty_segments` read it.
fn rfc3986_resolved(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let mut trailing = false;
    for segment in &segments {
        trailing = false;
        match *segment {
            "." => trailing = true,
            ".." => {
                out.pop();
                trailing = true;
            }
            segment => out.push(segment),
        }
    }
    let mut resolved: String = out.iter().flat_map(|s| ["/", s]).collect();
    if trailing || resolved.is_empty() {
        resolved.push('/');
    }
    resolved
}

/// A service given the whole path (`route_service`) that resolves dot
/// segments as RFC 3986 does keeps empty segments: a `..` after `//`
/// removes the empty segment, not the one before it. A gateway's root
/// catch-all `/{*rest}` forwards `/api//../admin/r` to a backend that
/// serves `/api/admin/r`, as for `/api/admin/r`, which a rule on
/// `/api/admin` limits; likewise `/v1/{*rest}` and `/v1/api//../admin/r`
/// (served `/v1/api/admin/r`) under `/v1/api/admin`. On the router, as
/// around it, the path is also read with empty segments kept (merged
/// first, they would be `/admin/r` and `/v1/admin/r`).
#[tokio::test]
async fn an_empty_segment_before_a_dot_dot_for_an_rfc3986_service_does_not_escape_a_rule_on_the_router()
 {
    let mut escaped = Vec::new();
    for (route, prefix, paths) in [
        (
            "/{*rest}",
            "/api/admin",
            ["/api/admin/r", "/api//../admin/r"],
        ),
        (
            "/v1/{*rest}",
            "/v1/api/admin",
            ["/v1/api/admin/r", "/v1/api//../admin/r"],
        ),
    ] {
        let (runs, proxy) = proxy_serving(rfc3986_resolved);
        let router = Router::new().route_service(route, proxy);
        let (statuses, served) = on_the_router(&router, &runs, prefix, &paths).await;
        if statuses != [200, 429] {
            escaped.push(format!(
                "{route} under {prefix}: {statuses:?}, served {served:?}"
            ));
        }
    }
    assert!(
        escaped.is_empty(),
        "served twice under a limit of one: {escaped:#?}"
    );
}

/// `path` as a backend given the whole path serves it when it decodes
/// every escape first, then cleans dot segments (Go's `http.FileServer`,
/// which cleans the decoded `URL.Path`; Python's `http.server`, which
/// `normpath`s the unquoted path): `%2F` is then a separator like any
/// other.
fn decoded_then_cleaned(path: &str) -> String {
    cleaned(&fully_decoded(path))
}

/// A gateway's `/{service}` and `/{service}/{id}`, mounted with
/// `route_service` on a backend that decodes the path before cleaning it
/// ([`decoded_then_cleaned`]): axum runs `/..%2Fadmin` and
/// `/x%2F..%2Fadmin` on `/{service}` (one segment), and the backend serves
/// each as `admin`, as for `/admin`, which a rule on `/admin` limits.
/// Likewise below a wildcard's root: `/api/{*rest}` gives it
/// `/api/..%2F..%2Fapi/admin/r`, served as `api/admin/r` (not
/// `api/api/admin/r`, as the tail cleaned from the wildcard's root would
/// be). The layer reads the path decoded, then cleaned, too, around the
/// router and on it (none of these raw segments is a dot segment).
#[tokio::test]
async fn a_route_service_decoding_before_cleaning_does_not_escape_a_rule() {
    let (runs, proxy) = proxy_serving(decoded_then_cleaned);
    let gateway = Router::new()
        .route_service("/{service}", proxy.clone())
        .route_service("/{service}/{id}", proxy.clone());
    let api = Router::new().route_service("/api/{*rest}", proxy);
    let cases = [
        (&gateway, "/admin", "/admin", "/..%2Fadmin"),
        (&gateway, "/admin", "/admin", "/x%2F..%2Fadmin"),
        (&gateway, "/admin", "/admin/r", "/x%2F..%2Fadmin/r"),
        (
            &api,
            "/api/admin",
            "/api/admin/r",
            "/api/..%2F..%2Fapi/admin/r",
        ),
    ];
    let mut escaped = Vec::new();
    for (router, prefix, first, path) in cases {
        for (placement, app) in placements(&rule_on("private", prefix), router) {
            runs.lock().unwrap().clear();
            let statuses = as_one(&app, [first, path]).await;
            let what = format!("{placement}: {first} then {path}");
            escaped.extend(escape(&what, &statuses, &runs));
        }
    }
    assert!(escaped.is_empty(), "served twice: {escaped:#?}");
}

/// A tenant's pages `/{tenant}` and the site's index `/` are two routes:
/// axum never runs `/{tenant}` for `/` (a parameter is never empty at the
/// end of a path), nor `/users/{id}` for `/users/`, nor a catch-all for an
/// empty tail (`/files/{*path}` for `/files/`, `/{*rest}` for `/`). On the
/// router, where `MatchedPath` says `/` (or `/users/`, `/files/`), a rule
/// on `/{tenant}` (or `/users/{id}`, or one copied from a catch-all route)
/// is not over the index: it does not count it.
#[tokio::test]
async fn an_index_route_is_not_counted_by_a_rule_on_a_parameter_below_it_on_the_router() {
    let mut counted = Vec::new();
    for (routes, prefix, path) in [
        (&["/", "/{tenant}"][..], "/{tenant}", "/"),
        (&["/users/", "/users/{id}"][..], "/users/{id}", "/users/"),
        (&["/files/", "/files/{*path}"], "/files/{*path}", "/files/"),
        (&["/", "/{*rest}"], "/{*rest}", "/"),
        (
            &["/users/{id}/", "/users/{id}/{*rest}"],
            "/users/{id}/{*rest}",
            "/users/7/",
        ),
    ] {
        let router = routes.iter().fold(Router::new(), |router, route| {
            router.route(route, get(|| async { "ok" }))
        });
        let app = App::new(router.layer(layer_of(&rule_on("rule", prefix))));
        let statuses = as_one(&app, [path; 3]).await;
        if statuses != [200; 3] {
            counted.push(format!("{path} counted under {prefix}: {statuses:?}"));
        }
    }
    assert!(counted.is_empty(), "{counted:#?}");
}

/// `path` as Apache Tomcat (and so Spring Boot, Jetty likewise) maps it:
/// each segment's path parameters (`;jsessionid=...`, any `;...`) removed
/// first, then escapes decoded, then dot segments resolved and slashes
/// merged. `/api/admin;x/r` and `/api/x/..;/admin/r` are `/api/admin/r`
/// to it (the well-known `..;` of "Breaking Parser Logic", Orange Tsai,
/// Black Hat 2018).
fn tomcat_resolved(path: &str) -> String {
    let stripped: Vec<&str> = path
        .split('/')
        .map(|segment| segment.split(';').next().unwrap_or_default())
        .collect();
    cleaned(&fully_decoded(&stripped.join("/")))
}

/// A reverse proxy on `/api/{*rest}` (`route_service`) forwards the whole
/// path to a Tomcat or Spring backend ([`tomcat_resolved`]), which serves
/// `/api/admin;x/r`, `/api/admin;/r` and `/api/x/..;/admin/r` as
/// `/api/admin/r`, which a rule on `/api/admin` limits: none of them is
/// counted, on the router or around it (a `;` is no separator nor dot to
/// the layer).
#[tokio::test]
async fn path_parameters_a_tomcat_backend_strips_do_not_escape_a_rule() {
    let (runs, proxy) = proxy_serving(tomcat_resolved);
    let router = Router::new().route_service("/api/{*rest}", proxy);
    let mut escaped = Vec::new();
    for path in ["/api/admin;x/r", "/api/admin;/r", "/api/x/..;/admin/r"] {
        for (placement, app) in placements(&rule_on("private", "/api/admin"), &router) {
            runs.lock().unwrap().clear();
            let statuses = as_one(&app, ["/api/admin/r", path]).await;
            let what = format!("{placement}: /api/admin/r then {path}");
            escaped.extend(escape(&what, &statuses, &runs));
        }
    }
    assert!(escaped.is_empty(), "served twice: {escaped:#?}");
}

/// axum's `route` (its wildcard named `path`), whose handler hands its
/// tail, as `Path` gives it, to another server, which serves what
/// `serve` makes of it, noted in `runs`.
fn handing_tail_to(route: &str, serve: fn(&str) -> String) -> (Runs, Router) {
    let runs: Runs = Arc::default();
    let handler =
        move |State(runs): State<Runs>,
              Path(params): Path<std::collections::HashMap<String, String>>| async move {
            runs.lock().unwrap().push(serve(&params["path"]));
            "file"
        };
    let router = Router::new()
        .route(route, get(handler))
        .with_state(runs.clone());
    (runs, router)
}

/// Asserts, for each line of `cases` (a route, a prefix, a first path and
/// a path), that a rule on the prefix limiting the first path limits the
/// path after it, on the router and around it, where the route's handler
/// hands its tail to a server that serves what `serve` makes of it
/// ([`handing_tail_to`]).
async fn assert_tails_limited(serve: fn(&str) -> String, cases: &str) {
    let mut escaped = Vec::new();
    for line in cases.lines().filter(|line| !line.trim().is_empty()) {
        let case: Vec<&str> = line.split_whitespace().collect();
        let [route, prefix, first, path] = case[..] else {
            panic!("a case is a route, a prefix and two paths: {line:?}");
        };
        let (runs, router) = handing_tail_to(route, serve);
        for (placement, app) in placements(&rule_on("private", prefix), &router) {
            runs.lock().unwrap().clear();
            let statuses = as_one(&app, [first, path]).await;
            let what = format!("{placement}: {route}: {first} then {path}");
            escaped.extend(escape(&what, &statuses, &runs));
        }
    }
    assert!(escaped.is_empty(), "served twice: {escaped:#?}");
}

/// A tail proxied to the root of a Tomcat or Spring backend (`/{tail}`,
/// `;` a path character, sent as it is), which serves it as
/// [`tomcat_resolved`] does.
fn tomcat_below(tail: &str) -> String {
    tomcat_resolved(&format!("/{tail}"))
}

/// A tail proxied with reqwest (`reqwest::get(format!("{backend}/{tail}"))`,
/// the way handlers write a proxy): reqwest's `Url` parses it as the
/// WHATWG URL standard says, a `\` a `/` in an `http` URL and `%2e%2e`
/// (any case, or `.%2e`) a `..`, both resolved before the request is sent;
/// the backend serves the path it is sent.
fn url_proxy_below(tail: &str) -> String {
    let sent = reqwest::Url::parse(&format!("http://backend/{tail}")).unwrap();
    cleaned(&fully_decoded(sent.path()))
}

/// A tail proxied (decoded once, by `Path`) to a backend that decodes the
/// path it is sent and cleans it, as Go's `http.FileServer` (`r.URL.Path`,
/// then `path.Clean`) and nginx (decoding, then resolving dot segments) do.
fn decoding_backend_below(tail: &str) -> String {
    cleaned(&fully_decoded(&format!("/{tail}")))
}

/// Below `/download-{*path}` proxying its tail to Tomcat ([`tomcat_below`]):
/// `/download-private/r` (tail `private/r`) and `/download-;x/private/r`
/// (tail `;x/private/r`, whose first segment Tomcat reads as empty) are
/// both `/private/r` to the backend. The rule on `/download-private`
/// counts the first (and `/download-/private/r`, SECURITY.md), and the
/// second too: a tail with a path parameter is also read as a hop's would
/// be. So too with a `..;` in the tail (`/download-x/..;/private/r`, and
/// `/staticx/..;/private/r` on `/static{*path}`), counted as without the
/// `;`; and with `%3B`, which `Path` decodes to `;` (`/files/private%3Bx/r`
/// and `/files/x/..%3B/private/r` reach the backend as `/private;x/r` and
/// `/x/..;/private/r`).
#[tokio::test]
async fn path_parameters_in_a_wildcards_tail_do_not_escape() {
    let cases = "
        /download-{*path} /download-private /download-private/r /download-;x/private/r
        /download-{*path} /download-private /download-private/r /download-;/private/r
        /download-{*path} /download-private /download-private/r /download-x/..;/private/r
        /static{*path} /static/private /static/private/r /staticx/..;/private/r
        /files/{*path} /files/private /files/private/r /files/private%3Bx/r
        /files/{*path} /files/private /files/private/r /files/x/..%3B/private/r
    ";
    assert_tails_limited(tomcat_below, cases).await;
}

/// Through a reqwest proxy below the wildcard ([`url_proxy_below`]),
/// `/files/x%5C..%5Cprivate/r` (tail `x\..\private/r`) and
/// `/files/x/..%5Cprivate/r` are sent as `/private/r`, as
/// `/files/private/r` is (a backslash a slash), and so is
/// `/files/x/%252e%252e/private/r` (tail `x/%2e%2e/private/r`: the URL
/// standard reads `%2e%2e` as `..`). A tail with an escape or a backslash
/// is also read as a hop's would be, so a rule on `/files/private` counts
/// them on the router and around it; likewise on `/download-{*path}` under
/// `/download-private`.
#[tokio::test]
async fn a_tail_a_url_parser_resolves_does_not_escape() {
    let cases = "
        /files/{*path} /files/private /files/private/r /files/x%5C..%5Cprivate/r
        /files/{*path} /files/private /files/private/r /files/x/..%5Cprivate/r
        /download-{*path} /download-private /download-private/r /download-x%5C..%5Cprivate/r
        /files/{*path} /files/private /files/private/r /files/x/%252e%252e/private/r
        /files/{*path} /files/private /files/private/r /files/x/.%252E/private/r
        /download-{*path} /download-private /download-private/r /download-x/%252e%252e/private/r
    ";
    assert_tails_limited(url_proxy_below, cases).await;
}

/// Through a proxy below the wildcard to a backend that decodes its path
/// ([`decoding_backend_below`]), `/files/x%252F..%252Fprivate/r` (tail
/// `x%2F..%2Fprivate/r`), `/files/x/%252e%252e/private/r` and
/// `/files/%2570rivate/r` are `/private/r`, as `/files/private/r` is: the
/// tail is decoded twice, once by `Path` and once by the backend. The rule
/// on `/files/private` counts them on the router and around it.
#[tokio::test]
async fn a_tail_a_backend_decodes_again_does_not_escape() {
    let cases = "
        /files/{*path} /files/private /files/private/r /files/x%252F..%252Fprivate/r
        /files/{*path} /files/private /files/private/r /files/x/%252e%252e/private/r
        /files/{*path} /files/private /files/private/r /files/%2570rivate/r
        /download-{*path} /download-private /download-private/r /download-x%252F..%252Fprivate/r
    ";
    assert_tails_limited(decoding_backend_below, cases).await;
}

/// reqwest's `Url` (the WHATWG URL standard) removes every ASCII tab and
/// newline from the URL it parses, anywhere, and trims leading and
/// trailing C0 controls and spaces: through a reqwest proxy below the
/// wildcard ([`url_proxy_below`]), `/files/pri%09vate/r` (tail
/// `pri\tvate/r` once `Path` decodes it), `/files/pri%0Avate/r`,
/// `/files/x/.%0D./private/r` and `/files/private%20` are sent as
/// `/private/r` (or `/private`), as `/files/private/r` is. A rule on
/// `/files/private` counts them, on the router and around it.
#[tokio::test]
async fn a_tail_a_url_parser_strips_tabs_and_newlines_from_does_not_escape() {
    let cases = "
        /files/{*path} /files/private /files/private/r /files/pri%09vate/r
        /files/{*path} /files/private /files/private/r /files/pri%0Avate/r
        /files/{*path} /files/private /files/private/r /files/x/.%0D./private/r
        /files/{*path} /files/private /files/private /files/private%20
        /download-{*path} /download-private /download-private/r /download-pri%09vate/r
    ";
    assert_tails_limited(url_proxy_below, cases).await;
}

/// reqwest's `Url` takes a `?` in the URL for the start of the query and a
/// `#` for the fragment's: through a reqwest proxy below the wildcard
/// ([`url_proxy_below`]), `/files/private%3Fx` (tail `private?x` once
/// `Path` decodes it) and `/files/private%23x` are sent as `/private`, as
/// `/files/private` is. A rule on `/files/private` counts them on the
/// router as it does around it.
#[tokio::test]
async fn a_tail_a_url_parser_cuts_at_a_query_mark_does_not_escape() {
    let cases = "
        /files/{*path} /files/private /files/private /files/private%3Fx
        /files/{*path} /files/private /files/private /files/private%23x
        /files/{*path} /files/private /files/private/r /files/private%3F/r
        /download-{*path} /download-private /download-private /download-private%3Fx
    ";
    assert_tails_limited(url_proxy_below, cases).await;
}

/// A request whose target is no path: `CONNECT example.com:443`
/// (authority form, an empty path) or `OPTIONS *` (asterisk form, the
/// path `*`), both of which hyper accepts from any client. axum's router
/// runs its fallback for them, as it does for `/other`: a rule on `/`,
/// which covers every path, limits them as it limits `/other`. Else one
/// client gets the fallback (a proxy, an SPA's index) past a limit of one.
#[tokio::test]
async fn a_request_whose_target_is_no_path_does_not_escape_a_rule_on_every_path() {
    let router = Router::new()
        .route("/files/{*path}", get(|| async { "file" }))
        .fallback(|| async { "other" });
    let rules = rule_on("everything", "/");
    for (placement, app) in placements(&rules, &router) {
        assert_eq!(as_one(&app, ["/other"; 2]).await, [200, 429], "{placement}");
    }
    let mut escaped = Vec::new();
    for (method, target) in [("CONNECT", "example.com:443"), ("OPTIONS", "*")] {
        for (placement, app) in placements(&rules, &router) {
            let mut statuses = Vec::new();
            for (method, target) in [("GET", "/other"), (method, target)] {
                let req = Request::builder()
                    .method(method)
                    .uri(target)
                    .header("x-id", "one")
                    .body(Body::empty())
                    .unwrap();
                statuses.push(app.clone().oneshot(req).await.unwrap().status().as_u16());
            }
            if statuses != [200, 429] {
                escaped.push(format!(
                    "{placement}: GET /other then {method} {target}: {statuses:?}"
                ));
            }
        }
    }
    assert!(escaped.is_empty(), "{escaped:#?}");
}
