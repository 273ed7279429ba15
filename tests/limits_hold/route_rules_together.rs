//! A path is read once for every route rule of a configuration: each rule
//! applies exactly when a configuration of that rule alone applies it (as
//! reading the path once per rule did), with many rules, any mix of
//! methods and routes, on costly paths, on axum's router and around it.
//!
//! Each rule `i` has its own policy and the cost `i + 1`, so the costs of
//! a request's limits name the rules that apply.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, Uri};
use axum::routing::any;
use ratelimit_tests::fixtures::Rng;
use ratelimit_tower::config::Config;
use tower::ServiceExt;

/// A policy `name` that admits any cost a rule here has.
fn one_a_window(name: &str) -> String {
    format!("[policies.{name}]\nalgorithm = \"fixed-window\"\nlimit = 100000\nwindow = \"1000d\"\n")
}

/// Prefixes that interact: shared starts, parameters, wildcards, trailing
/// slashes, encoded slashes, literals starting like others, deep ones
/// (raising the configuration's depth above a rule's own).
const PREFIXES: &[&str] = &[
    "/files/private",
    "/files/",
    "/api/admin",
    "/api/keys/",
    "/api",
    "/api/",
    "/api/{name}",
    "/apiary",
    "/{tenant}/users",
    "/{a}/{b}/admin",
    "/download-private",
    "/download-",
    "/users/{id}/posts",
    "/static/",
    "/a%2Fb",
    "/files/private%2Fr",
    "/",
    "/v2/admin",
    "/mount/admin",
    "/mount/",
    "/x/y/z/w/v/u/t/deep",
    "/private",
    "/admin",
    "/files/{*rest}",
];

const METHODS: &[Option<&str>] = &[
    None,
    None,
    Some(r#"["GET"]"#),
    Some(r#"["HEAD"]"#),
    Some(r#"["POST"]"#),
    Some(r#"["GET", "POST"]"#),
    Some(r#"["PUT"]"#),
];

const PIECES: &[&str] = &[
    "files",
    "private",
    "api",
    "admin",
    "keys",
    "users",
    "7",
    "posts",
    "static",
    "download-",
    "download-private",
    "downloadprivate",
    "a%2Fb",
    "a",
    "b",
    "..",
    ".",
    "%2e%2e",
    "%2E.",
    "",
    "%2F",
    "..%2F",
    ";x",
    "admin;y",
    "%5C",
    "\\",
    "%252e%252e",
    "%20",
    "%3F",
    "%09",
    "x?",
    "private%2Fr",
    "v2",
    "mount",
    "apiary",
    "api..",
    "static..",
    "download-..",
    "p%2e%2e",
    "x",
    "y",
    "z",
    "deep",
    "%61pi",
    "files%2F..",
];

/// One rule: its routes (none for a rule on every path) and methods.
#[derive(Debug, Clone)]
struct Rule {
    routes: Option<Vec<&'static str>>,
    methods: Option<&'static str>,
}

fn rule_toml(index: usize, rule: &Rule) -> String {
    let mut text = format!(
        "[[rules]]\npolicy = \"p{index}\"\nkey = \"global\"\ncost = {}\n",
        index + 1
    );
    if let Some(routes) = &rule.routes {
        let routes: Vec<String> = routes.iter().map(|r| format!("{r:?}")).collect();
        text.push_str(&format!("routes = [{}]\n", routes.join(", ")));
    }
    if let Some(methods) = rule.methods {
        text.push_str(&format!("methods = {methods}\n"));
    }
    text
}

/// The configuration of `rules` (numbered from `first`), each its own
/// policy.
fn config_of(rules: &[(usize, &Rule)]) -> Config {
    let mut text = String::new();
    for (index, _) in rules {
        text.push_str(&one_a_window(&format!("p{index}")));
    }
    for (index, rule) in rules {
        text.push_str(&rule_toml(*index, rule));
    }
    Config::from_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// A configuration of all `rules`, and one of each alone.
struct Configs {
    rules: Vec<Rule>,
    all: Config,
    alone: Vec<Config>,
}

impl Configs {
    fn new(rules: Vec<Rule>) -> Configs {
        let numbered: Vec<(usize, &Rule)> = rules.iter().enumerate().collect();
        let all = config_of(&numbered);
        let alone = numbered.iter().map(|&r| config_of(&[r])).collect();
        Configs { rules, all, alone }
    }

    /// `None` when the rules that apply to `req` together are those that
    /// apply alone, else a description of the difference.
    fn differ<B>(&self, req: &Request<B>) -> Option<String> {
        let together: BTreeSet<u64> = self.all.limits(req).iter().map(|(_, _, c)| c).collect();
        let alone: BTreeSet<u64> = self
            .alone
            .iter()
            .filter_map(|config| config.limits(req).iter().map(|(_, _, c)| c).next())
            .collect();
        (together != alone).then(|| {
            let missing: Vec<_> = alone.difference(&together).map(|c| c - 1).collect();
            let extra: Vec<_> = together.difference(&alone).map(|c| c - 1).collect();
            let rules = |numbers: &[u64]| -> Vec<String> {
                numbers
                    .iter()
                    .map(|&n| format!("{n}: {:?}", self.rules[usize::try_from(n).unwrap_or(0)]))
                    .collect()
            };
            format!(
                "{} {} (original {:?}): bypassed {:?}, extra {:?}; {} rules",
                req.method(),
                req.uri(),
                req.extensions()
                    .get::<axum::extract::OriginalUri>()
                    .map(|u| u.0.to_string()),
                rules(&missing),
                rules(&extra),
                self.rules.len()
            )
        })
    }
}

fn random_rules(rng: &mut Rng, count: usize) -> Vec<Rule> {
    (0..count)
        .map(|_| {
            let routes = (rng.index(6) != 0).then(|| {
                (0..1 + rng.index(3))
                    .map(|_| PREFIXES[rng.index(PREFIXES.len())])
                    .collect()
            });
            Rule {
                routes,
                methods: METHODS[rng.index(METHODS.len())],
            }
        })
        .collect()
}

fn random_path(rng: &mut Rng) -> String {
    let segments: Vec<&str> = (0..1 + rng.index(7))
        .map(|_| PIECES[rng.index(PIECES.len())])
        .collect();
    let mut path = format!("/{}", segments.join("/"));
    if rng.index(8) == 0 {
        path.insert(0, '/');
    }
    path
}

fn random_method(rng: &mut Rng) -> Method {
    [
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::DELETE,
    ][rng.index(5)]
    .clone()
}

/// Around the router: a request's path (and, as a nest would leave it, an
/// `OriginalUri`) read for many rules at once covers each rule as it alone
/// does, with up to 80 rules of any mix of methods and routes.
#[test]
fn rules_read_together_apply_as_each_alone_around_the_router() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut failures = Vec::new();
    let mut applied = 0;
    let mut cases = 0;
    for round in 0..24 {
        let count = if round % 6 == 0 {
            65 + rng.index(16)
        } else {
            1 + rng.index(12)
        };
        let configs = Configs::new(random_rules(&mut rng, count));
        for _ in 0..40 {
            let path = random_path(&mut rng);
            let Ok(uri) = path.parse::<Uri>() else {
                continue;
            };
            let mut req = Request::builder()
                .method(random_method(&mut rng))
                .uri(uri)
                .body(())
                .unwrap();
            if rng.index(3) == 0 {
                // Nested: the original path had a prefix.
                let original = format!("{}{path}", ["/v2", "/mount", "/api"][rng.index(3)]);
                if let Ok(original) = original.parse::<Uri>() {
                    req.extensions_mut()
                        .insert(axum::extract::OriginalUri(original));
                }
            }
            cases += 1;
            applied += configs.all.limits(&req).iter().count();
            if let Some(failure) = configs.differ(&req) {
                failures.push(failure);
            }
        }
    }
    assert_none(&failures, cases);
    // Some rules applied, not all: the comparison means something.
    assert!(applied > cases, "{applied} of {cases}");
}

/// The longest and costliest paths: the budget runs out, or the path is too
/// long, with rules covered before and after that point.
#[test]
fn rules_read_together_apply_as_each_alone_on_costly_paths() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut failures = Vec::new();
    let costly = [
        "%2e%2e/", "a%5C", ";x/", "%252e/", "%3F", "%09/", "..%2F", "./", "//",
    ];
    for round in 0..12 {
        let count = 3 + rng.index(20) + if round % 3 == 0 { 60 } else { 0 };
        let configs = Configs::new(random_rules(&mut rng, count));
        for _ in 0..8 {
            let mut path = random_path(&mut rng);
            let target = [200, 400, 800, 1600, 2040, 2100][rng.index(6)];
            while path.len() < target {
                path.push_str(costly[rng.index(costly.len())]);
            }
            path.push_str(&random_path(&mut rng));
            let Ok(uri) = path.parse::<Uri>() else {
                continue;
            };
            let req = Request::builder()
                .method(random_method(&mut rng))
                .uri(uri)
                .body(())
                .unwrap();
            if let Some(failure) = configs.differ(&req) {
                failures.push(failure);
            }
        }
    }
    assert_none(&failures, 96);
}

/// On axum's router (`MatchedPath`, `NestedPath`, `OriginalUri`): nested
/// routers, wildcards, a router mounted with `route_service` below a
/// wildcard, and `nest_service`; the handler compares the rules together
/// with each alone on the request as the router hands it over.
#[tokio::test]
async fn rules_read_together_apply_as_each_alone_on_the_router() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let configs: Arc<Vec<Configs>> = Arc::new(
        (0..6)
            .map(|i| {
                let count = if i == 0 { 70 } else { 4 + rng.index(10) };
                Configs::new(random_rules(&mut rng, count))
            })
            .collect(),
    );
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = Arc::new(Mutex::new(0usize));
    let check = {
        let configs = configs.clone();
        let failures = failures.clone();
        let seen = seen.clone();
        move |req: Request<Body>| {
            let configs = configs.clone();
            let failures = failures.clone();
            let seen = seen.clone();
            async move {
                *seen.lock().unwrap() += 1;
                let matched = req
                    .extensions()
                    .get::<axum::extract::MatchedPath>()
                    .map(|m| m.as_str().to_owned());
                for config in configs.iter() {
                    if let Some(failure) = config.differ(&req) {
                        failures
                            .lock()
                            .unwrap()
                            .push(format!("{failure} matched {matched:?}"));
                    }
                }
                "ran"
            }
        }
    };
    let inner = Router::new()
        .route("/admin", any(check.clone()))
        .route("/admin/{id}", any(check.clone()))
        .route("/{name}/users", any(check.clone()));
    let mounted = Router::new()
        .route("/admin", any(check.clone()))
        .route("/private/{*rest}", any(check.clone()));
    let app = Router::new()
        .route("/files/{*rest}", any(check.clone()))
        .route("/download-{*rest}", any(check.clone()))
        .route("/static{*rest}", any(check.clone()))
        .route("/api/{name}", any(check.clone()))
        .route("/api/admin", any(check.clone()))
        .route("/{tenant}/users", any(check.clone()))
        .route("/users/{id}/posts", any(check.clone()))
        .route("/x/{*rest}", any(check.clone()))
        .route_service(
            "/mount/{*rest}",
            ServiceExt::<Request<Body>>::map_request(mounted, |req: Request<Body>| req),
        )
        .nest("/v2", inner)
        .fallback(any(check.clone()));
    // 800 random paths, then 100 below each of a few prefixes.
    let mut sent = 0;
    for (prefix, count) in [
        ("", 800),
        ("/v2", 100),
        ("/mount", 100),
        ("/files", 100),
        ("/x/y/z/w", 100),
        ("/download-", 100),
        ("/static", 100),
    ] {
        for _ in 0..count {
            let path = format!("{prefix}{}", random_path(&mut rng));
            let Ok(uri) = path.parse::<Uri>() else {
                continue;
            };
            let req = Request::builder()
                .method(random_method(&mut rng))
                .uri(uri)
                .body(Body::empty())
                .unwrap();
            sent += 1;
            let _ = app.clone().oneshot(req).await;
        }
    }
    let failures = failures.lock().unwrap();
    assert_none(&failures, sent);
    assert!(*seen.lock().unwrap() > sent / 2);
}

/// Asserts that no request of `cases` applied other rules together than
/// alone, showing the first few that did.
fn assert_none(failures: &[String], cases: usize) {
    assert!(
        failures.is_empty(),
        "{} of {cases}:\n{}",
        failures.len(),
        failures[..failures.len().min(10)].join("\n")
    );
}
