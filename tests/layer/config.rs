//! Policies and rules from configuration (`ratelimit_tower::config`): every
//! bad configuration names its field, in TOML and JSON; every algorithm
//! parses; rules match by route, method and key; and rules reload while
//! requests flow, without failing one, enforcing the new limit exactly,
//! keeping the old one when the new file is bad, and following a watched file.
//! Also why an algorithm change needs a new policy name: both stores refuse
//! another algorithm's state under one name (`PolicyConflict`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use ratelimit_core::{AlgorithmKind, MemoryStore, Policy, PolicyError, Rate, Store, StoreError};
use ratelimit_tests::fixtures::{self, ok_service, request_at};
use ratelimit_tests::loopback::client;
use ratelimit_tests::{NO_EDGE, RedisServer, assert_refuses_flags, redis_store, spawn_listening};
use ratelimit_tower::body::ResponseBody;
use ratelimit_tower::config::{Config, ConfigError, ConfigErrorKind, Format, ReloadableRules};
use ratelimit_tower::headers::RateLimitHeaders;
use ratelimit_tower::{
    Composite, Decisions, FailurePolicy, HeaderKey, KeyExtractor, PeerAddr, PeerIp, RateLimitLayer,
    RouteKey,
};
use tower::{Service, ServiceBuilder, ServiceExt};

// ---------------------------------------------------------------------------
// Helpers

/// A GCRA policy `api` of burst `limit` refilling one an hour (nothing refills
/// during a test), keyed by the `x-client` header.
fn api_config(limit: u64) -> String {
    format!(
        r#"
[policies.api]
algorithm = "gcra"
limit = {limit}
rate = "1/h"

[[rules]]
policy = "api"
key = "header:x-client"
"#
    )
}

fn request(client: &str) -> Request<String> {
    Request::get("/api/items")
        .header("x-client", client)
        .body(String::new())
        .expect("request")
}

fn peer(req: &mut Request<String>, ip: [u8; 4]) {
    req.extensions_mut()
        .insert(PeerAddr(SocketAddr::from((ip, 40_000))));
}

/// The layer over a `MemoryStore`: store failures refuse (503) so that none
/// can hide as a 200, and the legacy headers carry each decision's limit.
fn layer(
    rules: ReloadableRules,
) -> RateLimitLayer<MemoryStore, ReloadableRules, ratelimit_tower::HttpRejections> {
    RateLimitLayer::with_rules(MemoryStore::new(), rules)
        .on_failure(FailurePolicy::Closed)
        .headers(RateLimitHeaders::legacy())
}

/// An always-`200` service behind [`layer`] of `rules`.
fn limited(
    rules: &ReloadableRules,
) -> impl Service<Request<String>, Response = Response<ResponseBody<String>>, Error = Infallible>
+ Clone
+ use<> {
    ServiceBuilder::new()
        .layer(layer(rules.clone()))
        .service(ok_service())
}

/// The limit the response's decision was made under (`X-RateLimit-Limit`).
fn limit_of<B>(response: &Response<B>) -> u64 {
    response
        .headers()
        .get("x-ratelimit-limit")
        .expect("X-RateLimit-Limit")
        .to_str()
        .expect("ascii")
        .parse()
        .expect("a number")
}

/// Sends `client`'s requests until one is refused; returns how many passed.
async fn allowed_until_refused<S, B>(service: &S, client: &str, at_most: u64) -> u64
where
    S: Service<Request<String>, Response = Response<B>, Error = Infallible> + Clone,
{
    for passed in 0..at_most {
        let response = service
            .clone()
            .oneshot(request(client))
            .await
            .expect("infallible");
        match response.status() {
            StatusCode::OK => {}
            StatusCode::TOO_MANY_REQUESTS => return passed,
            other => panic!("unexpected status {other}"),
        }
    }
    panic!("{client}: more than {at_most} requests passed");
}

#[track_caller]
fn assert_error(
    result: Result<Config, ConfigError>,
    path: &str,
    fragment: &str,
    kind: ConfigErrorKind,
    case: &str,
) {
    let error = result.expect_err(case);
    let text = error.to_string();
    assert_eq!(error.path(), path, "{case}: {text}");
    assert_eq!(error.kind(), kind, "{case}: {text}");
    assert!(
        error.message().contains(fragment),
        "{case}: {text:?} does not say {fragment:?}"
    );
    if !path.is_empty() {
        assert!(
            text.starts_with(&format!("{path}: ")),
            "{case}: {text:?} does not start with the path"
        );
    }
}

// ---------------------------------------------------------------------------
// Bad configurations

/// A TOML document: the policy `api` with `fields`, then `rest`.
fn toml_policy(fields: &str, rest: &str) -> String {
    format!("[policies.api]\n{fields}\n{rest}")
}

const GCRA: &str = "algorithm = \"gcra\"\nlimit = 20\nrate = \"10/s\"";
const RULE: &str = "[[rules]]\npolicy = \"api\"\nkey = \"ip\"";

#[test]
fn bad_toml_configurations_name_the_field() {
    use ConfigErrorKind::{Parse, Policy, Rule};
    let rule = |fields: &str| toml_policy(GCRA, &format!("{RULE}\n{fields}"));
    let cases: Vec<(String, &str, &str, ConfigErrorKind)> = vec![
        // policies: numbers refused by Policy
        (
            toml_policy("algorithm = \"gcra\"\nlimit = 0\nrate = \"10/s\"", ""),
            "policies.api.limit",
            "must be at least 1",
            Policy,
        ),
        (
            toml_policy(
                "algorithm = \"gcra\"\nlimit = 2199023255553\nrate = \"10/s\"",
                "",
            ),
            "policies.api.limit",
            "too large",
            Policy,
        ),
        (
            toml_policy("algorithm = \"gcra\"\nlimit = 5\nrate = \"0/s\"", ""),
            "policies.api.rate",
            "amount must be at least 1",
            Policy,
        ),
        (
            toml_policy("algorithm = \"gcra\"\nlimit = 5\nrate = \"2000000/s\"", ""),
            "policies.api.rate",
            "above one per microsecond",
            Policy,
        ),
        (
            toml_policy(
                "algorithm = \"fixed-window\"\nlimit = 5\nwindow = \"0s\"",
                "",
            ),
            "policies.api.window",
            "at least one microsecond",
            Policy,
        ),
        (
            toml_policy(
                "algorithm = \"concurrency\"\nlimit = 5\nlease = \"0ms\"",
                "",
            ),
            "policies.api.lease",
            "at least one microsecond",
            Policy,
        ),
        (
            toml_policy(
                "algorithm = \"sliding-window\"\nlimit = 1073741824\nwindow = \"1d\"",
                "",
            ),
            "policies.api",
            "too large to represent",
            Policy,
        ),
        // policies: the parameter each algorithm takes
        (
            toml_policy("algorithm = \"gcra\"\nlimit = 5", ""),
            "policies.api.rate",
            "gcra needs a rate",
            Policy,
        ),
        (
            toml_policy("algorithm = \"concurrency\"\nlimit = 5", ""),
            "policies.api.lease",
            "concurrency needs a lease",
            Policy,
        ),
        (
            toml_policy("algorithm = \"gcra\"\nlimit = 5\nwindow = \"1m\"", ""),
            "policies.api.window",
            "gcra takes no window",
            Policy,
        ),
        (
            toml_policy(
                "algorithm = \"sliding-log\"\nlimit = 5\nwindow = \"1m\"\nrate = \"1/s\"",
                "",
            ),
            "policies.api.rate",
            "sliding-log takes no rate",
            Policy,
        ),
        // policies: names
        (
            "[policies.\"bad name\"]\nalgorithm = \"gcra\"\nlimit = 5\nrate = \"1/s\"".to_owned(),
            "policies.bad name",
            "invalid policy name",
            Policy,
        ),
        // policies: the schema
        (
            toml_policy("algorithm = \"gcr\"\nlimit = 5\nrate = \"1/s\"", ""),
            "policies.api.algorithm",
            "unknown variant `gcr`",
            Parse,
        ),
        (
            toml_policy("algorithm = \"gcra\"\nlimit = \"5\"\nrate = \"1/s\"", ""),
            "policies.api.limit",
            "invalid type",
            Parse,
        ),
        (
            toml_policy("algorithm = \"gcra\"\nlimit = -5\nrate = \"1/s\"", ""),
            "policies.api.limit",
            "invalid value",
            Parse,
        ),
        (
            toml_policy("algorithm = \"gcra\"\nlimt = 5\nrate = \"1/s\"", ""),
            "policies.api.limt",
            "unknown field `limt`",
            Parse,
        ),
        (
            toml_policy("algorithm = \"gcra\"\nrate = \"1/s\"", ""),
            "policies.api",
            "missing field `limit`",
            Parse,
        ),
        (
            toml_policy("algorithm = \"gcra\"\nlimit = 5\nrate = \"10/x\"", ""),
            "policies.api.rate",
            "unknown time unit \"x\"",
            Parse,
        ),
        (
            toml_policy("algorithm = \"gcra\"\nlimit = 5\nrate = \"10\"", ""),
            "policies.api.rate",
            "an amount per period",
            Parse,
        ),
        (
            toml_policy(
                "algorithm = \"fixed-window\"\nlimit = 5\nwindow = \"a minute\"",
                "",
            ),
            "policies.api.window",
            "invalid duration",
            Parse,
        ),
        (
            toml_policy("algorithm = \"fixed-window\"\nlimit = 5\nwindow = 60", ""),
            "policies.api.window",
            "expected a duration",
            Parse,
        ),
        (
            toml_policy(
                "algorithm = \"gcra\"\nlimit = 5\nrate = \"1/s\"\nshadow = \"yes\"",
                "",
            ),
            "policies.api.shadow",
            "invalid type",
            Parse,
        ),
        // rules
        (
            toml_policy(
                GCRA,
                "[[rules]]\npolicy = \"api\"\nkey = \"ip\"\n[[rules]]\npolicy = \"apii\"\nkey = \"ip\"",
            ),
            "rules[1].policy",
            "unknown policy \"apii\" (defined: api)",
            Rule,
        ),
        (
            rule("cost = 21"),
            "rules[0].cost",
            "21 is more than policy \"api\" can ever admit (20)",
            Rule,
        ),
        (rule("cost = -1"), "rules[0].cost", "invalid value", Parse),
        (
            rule("routes = []"),
            "rules[0].routes",
            "must not be empty",
            Rule,
        ),
        (
            rule("routes = [\"/ok\", \"api\"]"),
            "rules[0].routes[1]",
            "starts with '/'",
            Parse,
        ),
        (
            rule("routes = [\"/users/{id}x\"]"),
            "rules[0].routes[0]",
            "a parameter as a whole segment",
            Parse,
        ),
        (
            rule("routes = [\"/files/{*path}/x\"]"),
            "rules[0].routes[0]",
            "a last `{*name}`",
            Parse,
        ),
        (
            rule("routes = [\"/users/{}\"]"),
            "rules[0].routes[0]",
            "a parameter as a whole segment",
            Parse,
        ),
        (
            rule(
                "routes = [\"/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a\"]",
            ),
            "rules[0].routes[0]",
            "at most 32 segments",
            Parse,
        ),
        (
            rule("methods = []"),
            "rules[0].methods",
            "must not be empty",
            Rule,
        ),
        (
            rule("methods = [\"post\"]"),
            "rules[0].methods[0]",
            "write \"POST\"",
            Parse,
        ),
        (
            rule("methods = [\"GE T\"]"),
            "rules[0].methods[0]",
            "invalid HTTP method",
            Parse,
        ),
        (
            rule("missing_key = \"deny\""),
            "rules[0].missing_key",
            "unknown variant `deny`",
            Parse,
        ),
        (
            rule("weight = 2"),
            "rules[0].weight",
            "unknown field `weight`",
            Parse,
        ),
        (
            toml_policy(GCRA, "[[rules]]\npolicy = \"api\"\nkey = \"user\""),
            "rules[0].key",
            "unknown key \"user\"",
            Parse,
        ),
        (
            toml_policy(
                GCRA,
                "[[rules]]\npolicy = \"api\"\nkey = \"header:x api key\"",
            ),
            "rules[0].key",
            "invalid header name",
            Parse,
        ),
        (
            toml_policy(
                GCRA,
                "[[rules]]\npolicy = \"api\"\nkey = [\"route\", \"header:\"]",
            ),
            "rules[0].key[1]",
            "invalid header name",
            Parse,
        ),
        (
            toml_policy(GCRA, "[[rules]]\npolicy = \"api\"\nkey = []"),
            "rules[0].key",
            "must not be empty",
            Parse,
        ),
        (
            toml_policy(GCRA, "[[rules]]\npolicy = \"api\""),
            "rules[0]",
            "missing field `key`",
            Parse,
        ),
        (
            toml_policy(GCRA, "[[rules]]\npolicy = \"api\"\nkey = \"client-ip\""),
            "rules[0].key",
            "needs trusted proxies",
            Rule,
        ),
        // client_ip
        (
            toml_policy(
                GCRA,
                "[client_ip]\ntrusted_proxies = [\"10.0.0.0/8\", \"10.0.0.1/8\"]",
            ),
            "client_ip.trusted_proxies[1]",
            "bits set after its prefix",
            Parse,
        ),
        (
            toml_policy(GCRA, "[client_ip]\ntrusted_proxies = [\"10.0.0/8\"]"),
            "client_ip.trusted_proxies[0]",
            "invalid IP address",
            Parse,
        ),
        (
            toml_policy(
                GCRA,
                "[client_ip]\ntrusted_proxies = [\"10.0.0.0/8\"]\nheader = \"forwarded\"\nipv6_prefix = 129",
            ),
            "client_ip.ipv6_prefix",
            "longer than /128",
            Parse,
        ),
        (
            toml_policy(GCRA, "[client_ip]\nheader = \"x-real-ip\""),
            "client_ip.header",
            "unknown variant `x-real-ip`",
            Parse,
        ),
        // Trusted proxies need the header they write: there is no default.
        (
            toml_policy(GCRA, "[client_ip]\ntrusted_proxies = [\"10.0.0.0/8\"]"),
            "client_ip.header",
            "missing: name the header your trusted proxies write",
            Parse,
        ),
        (
            toml_policy(
                GCRA,
                "[client_ip]\ntrusted_proxies = [\"10.0.0.0/8\"]\nheader = \"auto\"",
            ),
            "client_ip.header",
            "\"auto\" is not accepted",
            Parse,
        ),
        // ip
        (
            toml_policy(GCRA, &format!("{RULE}\n[ip]\nipv6_prefix = 129")),
            "ip.ipv6_prefix",
            "prefix length /129 is longer than /128",
            Parse,
        ),
        (
            toml_policy(GCRA, "[ip]\nipv6_prefix = 300"),
            "ip.ipv6_prefix",
            "invalid value: integer `300`",
            Parse,
        ),
        (
            toml_policy(GCRA, "[ip]\nipv6_prefix = -1"),
            "ip.ipv6_prefix",
            "invalid value",
            Parse,
        ),
        (
            toml_policy(GCRA, "[ip]\nipv4_prefix = 24"),
            "ip.ipv4_prefix",
            "unknown field `ipv4_prefix`",
            Parse,
        ),
        // the document
        (
            toml_policy(GCRA, "[[rule]]\npolicy = \"api\""),
            "rule",
            "unknown field `rule`",
            Parse,
        ),
        (
            toml_policy(GCRA, "[policies.api]\nlimit = 3"),
            "",
            "duplicate key",
            Parse,
        ),
        ("limit = = 3".to_owned(), "", "", Parse),
    ];
    for (text, path, fragment, kind) in cases {
        assert_error(Config::from_toml(&text), path, fragment, kind, &text);
    }
}

#[test]
fn bad_json_configurations_name_the_field() {
    use ConfigErrorKind::{Parse, Policy, Rule};
    let cases: Vec<(&str, &str, &str, ConfigErrorKind)> = vec![
        (
            r#"{"policies": {"api": {"algorithm": "gcra", "limit": 0, "rate": "10/s"}}}"#,
            "policies.api.limit",
            "must be at least 1",
            Policy,
        ),
        (
            r#"{"policies": {"api": {"algorithm": "gcra", "limit": 5, "rate": "10/s"}},
                "rules": [{"policy": "api", "key": "ip"}, {"policy": "apii", "key": "ip"}, {"policy": "api", "key": "ip"}]}"#,
            "rules[1].policy",
            "unknown policy \"apii\" (defined: api)",
            Rule,
        ),
        (
            r#"{"policies": {"api": {"algorithm": "gcra", "limit": 5, "rate": "10/s"}},
                "rules": [{"policy": "api", "key": "ip"}, {"policy": "api", "key": "ip", "cost": 6}]}"#,
            "rules[1].cost",
            "6 is more than policy \"api\" can ever admit (5)",
            Rule,
        ),
        (
            r#"{"policies": {"api": {"algorithm": "gcra", "limit": "5", "rate": "10/s"}}}"#,
            "policies.api.limit",
            "invalid type",
            Parse,
        ),
        (
            r#"{"policies": {"api": {"algorithm": "gcra", "limit": 5, "rate": "10/s", "burst": 3}}}"#,
            "policies.api.burst",
            "unknown field `burst`",
            Parse,
        ),
        (
            r#"{"policies": {"api": {"algorithm": "gcra", "limit": 5, "rate": "10/s"},
                             "api": {"algorithm": "gcra", "limit": 9, "rate": "10/s"}}}"#,
            "policies",
            "policy \"api\" is defined twice",
            Parse,
        ),
        (
            r#"{"policies": {"w": {"algorithm": "fixed-window", "limit": 5, "window": "5 fortnights"}}}"#,
            "policies.w.window",
            "invalid duration",
            Parse,
        ),
        (
            r#"{"policies": {"api": {"algorithm": "gcra", "limit": 5, "rate": "10/s"}},
                "rules": [{"policy": "api", "key": ["ip", 7]}]}"#,
            "rules[0].key[1]",
            "invalid type",
            Parse,
        ),
        (
            r#"{"policies": {}, "client_ip": {"trusted_proxies": ["300.0.0.0/8"]}}"#,
            "client_ip.trusted_proxies[0]",
            "invalid IP address",
            Parse,
        ),
        (
            r#"{"policies": {}} trailing"#,
            "",
            "trailing characters",
            Parse,
        ),
        (r#"{"policies": "#, "policies", "EOF", Parse),
    ];
    for (text, path, fragment, kind) in cases {
        assert_error(Config::from_json(text), path, fragment, kind, text);
    }
}

#[test]
fn errors_give_the_position_and_the_file() {
    // TOML: the line and column of the bad value.
    let text = "[policies.api]\nalgorithm = \"gcra\"\nlimit = 5\nrate = \"10/x\"\n";
    let error = Config::from_toml(text).unwrap_err();
    assert_eq!(error.line_column(), Some((4, 8)));
    assert!(error.to_string().ends_with("(line 4, column 8)"), "{error}");
    // A syntax error has a position but no path.
    let error = Config::from_toml("[policies.api]\nlimit = = 3\n").unwrap_err();
    assert_eq!(error.path(), "");
    assert_eq!(error.line_column().map(|(line, _)| line), Some(2));
    // JSON: the position serde_json reports, shown apart from the message.
    let error = Config::from_json("{\n  \"rules\": 5\n}").unwrap_err();
    assert_eq!(error.path(), "rules");
    assert_eq!(error.line_column().map(|(line, _)| line), Some(2));
    assert!(!error.message().contains("at line"), "{error}");
    // The source is the parser's error.
    assert!(std::error::Error::source(&error).is_some());

    // Files: named in the message, format by extension.
    let dir = tempfile::tempdir().expect("temp dir");
    let toml = dir.path().join("limits.toml");
    std::fs::write(
        &toml,
        "[policies.api]\nalgorithm = \"gcra\"\nlimit = 0\nrate = \"1/s\"\n",
    )
    .expect("write");
    let error = Config::from_file(&toml).unwrap_err();
    assert_eq!(error.file(), Some(toml.as_path()));
    assert_eq!(
        error.to_string(),
        format!("{}: policies.api.limit: must be at least 1", toml.display())
    );
    assert!(
        std::error::Error::source(&error)
            .and_then(|s| s.downcast_ref::<ratelimit_core::PolicyError>())
            .is_some()
    );

    let missing = dir.path().join("missing.json");
    let error = Config::from_file(&missing).unwrap_err();
    assert_eq!(error.kind(), ConfigErrorKind::Io);
    assert!(
        error
            .to_string()
            .starts_with(&missing.display().to_string())
    );

    let yaml = dir.path().join("limits.yaml");
    std::fs::write(&yaml, "policies: {}").expect("write");
    let error = Config::from_file(&yaml).unwrap_err();
    assert_eq!(error.kind(), ConfigErrorKind::UnknownFormat);
}

// ---------------------------------------------------------------------------
// Every algorithm

/// One policy of each algorithm, no rules.
const ALL_TOML: &str = include_str!("configs/every_algorithm.toml");

/// The policies of `ALL_TOML`, written in JSON.
const ALL_JSON: &str = include_str!("configs/every_algorithm.json");

#[test]
fn every_algorithm_parses_in_toml_and_json() {
    let s = Duration::from_secs;
    let expected = [
        Policy::fixed_window(10, s(60)),
        Policy::sliding_window_log(11, s(30)),
        Policy::sliding_window_counter(12, s(5400)),
        Policy::token_bucket(13, Rate::per_second(5)),
        Policy::gcra(14, Rate::per_minute(100)),
        Policy::leaky_bucket(15, Rate::new(1, Duration::from_millis(500))),
        Policy::concurrency(16, s(30)),
    ];
    let names = [
        "fixed", "log", "counter", "bucket", "gcra", "leaky", "slots",
    ];
    // `expected` is in the order of the one table of algorithm names.
    let kinds = AlgorithmKind::ALL;
    let toml = Config::from_toml(ALL_TOML).expect("toml");
    let json = Config::from_json(ALL_JSON).expect("json");
    let mut sorted = names;
    sorted.sort_unstable();
    assert_eq!(
        toml.policies().map(Policy::name).collect::<Vec<_>>(),
        sorted
    );
    assert_eq!(
        json.policies().map(Policy::name).collect::<Vec<_>>(),
        sorted
    );
    for ((name, kind), expected) in names.iter().zip(kinds).zip(expected) {
        let expected = expected
            .expect("valid")
            .with_name(*name)
            .expect("name")
            .with_shadow(*name == "gcra");
        let from_toml = toml.policy(name).expect("in toml");
        assert_eq!(from_toml.algorithm().algorithm_kind(), kind);
        assert_eq!(*from_toml, expected, "{name} from TOML");
        // Equal rates written differently (`1/500ms` and `2/s` differ as
        // rates but not as emission intervals) build equal algorithms.
        let from_json = json.policy(name).expect("in json");
        assert_eq!(from_json.algorithm().algorithm_kind(), kind);
        assert_eq!(from_json.limit(), expected.limit(), "{name} from JSON");
        assert_eq!(from_json.window(), expected.window(), "{name} from JSON");
        assert_eq!(
            from_json.is_shadow(),
            expected.is_shadow(),
            "{name} from JSON"
        );
    }
    assert_eq!(toml.rule_count(), 0);
}

// ---------------------------------------------------------------------------
// Rule matching

/// Five policies, each with its rule: global, by IP, by header, by client
/// IP behind a trusted proxy, by route and IP.
const RULES: &str = include_str!("configs/rules.toml");

/// (policy, key bytes, cost) of each limit, in rule order.
fn limits_of(config: &Config, req: &Request<String>) -> Vec<(String, Vec<u8>, u64)> {
    let limits = config.limits(req);
    assert!(!limits.is_reject());
    limits
        .iter()
        .map(|(policy, key, cost)| (policy.name().to_owned(), key.as_bytes().to_vec(), cost))
        .collect()
}

fn names(limits: &[(String, Vec<u8>, u64)]) -> Vec<&str> {
    limits.iter().map(|(n, _, _)| n.as_str()).collect()
}

#[test]
fn rules_match_by_route_method_and_key() {
    let config = Config::from_toml(RULES).expect("valid");
    assert_eq!(config.rule_count(), 5);
    let build = |method: &str, path: &str, headers: &[(&str, &str)], ip: Option<[u8; 4]>| {
        let mut builder = Request::builder().method(method).uri(path);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let mut req = builder.body(String::new()).expect("request");
        if let Some(ip) = ip {
            peer(&mut req, ip);
        }
        req
    };
    let client = Some([192, 0, 2, 1]);

    // Only the global rule: `/apiary` is not under `/api`.
    let req = build("GET", "/apiary", &[], client);
    let limits = limits_of(&config, &req);
    assert_eq!(names(&limits), ["everyone"]);
    assert_eq!(limits[0].1, b"global");

    // `/api` itself: the `/api` rule, not the `/api/` one.
    let req = build("GET", "/api", &[], client);
    let limits = limits_of(&config, &req);
    assert_eq!(names(&limits), ["everyone", "api"]);
    assert_eq!(limits[1].1, b"192.0.2.1");

    // Below `/api/` with an API key: the key is hashed, the cost is 3.
    let api_key = [("x-api-key", "secret")];
    let req = build("GET", "/api/items?page=2", &api_key, client);
    let limits = limits_of(&config, &req);
    assert_eq!(names(&limits), ["everyone", "api", "keyed"]);
    let hashed = HeaderKey::new(http::HeaderName::from_static("x-api-key"))
        .extract(&req)
        .expect("key");
    assert_eq!(limits[2].1, hashed.as_bytes());
    assert_ne!(limits[2].1, b"secret");
    assert_eq!(limits[2].2, 3);

    // Without the API key, `missing_key = "reject"` refuses the request.
    let req = build("GET", "/api/items", &[], client);
    assert!(config.limits(&req).is_reject());

    // Without a peer address the `ip` rule has no key: the server is wired
    // wrong, and the request is refused (500), never let through.
    let req = build("GET", "/api", &[], None);
    assert!(config.limits(&req).is_no_peer_address());

    // POST /login from a trusted proxy: keyed by the forwarded client.
    let forwarded = [("x-forwarded-for", "203.0.113.7")];
    let req = build("POST", "/login", &forwarded, Some([10, 0, 0, 5]));
    let limits = limits_of(&config, &req);
    assert_eq!(names(&limits), ["everyone", "login"]);
    assert_eq!(limits[1].1, b"203.0.113.7");
    // A `Forwarded` the client wrote, passed through by a proxy that appends
    // to X-Forwarded-For, is not read: the key stays the client's.
    let spoofed = [
        ("forwarded", "for=198.51.100.99"),
        ("x-forwarded-for", "203.0.113.7"),
    ];
    let req = build("POST", "/login", &spoofed, Some([10, 0, 0, 5]));
    assert_eq!(limits_of(&config, &req)[1].1, b"203.0.113.7");
    // The same header from an untrusted peer is not believed.
    let req = build("POST", "/login", &forwarded, client);
    assert_eq!(limits_of(&config, &req)[1].1, b"192.0.2.1");
    // GET /login: not a method of the rule.
    let req = build("GET", "/login", &[], client);
    assert_eq!(names(&limits_of(&config, &req)), ["everyone"]);

    // A list of keys is joined as `Composite` joins them.
    for path in ["/static/app.js", "/docs/index.html"] {
        let req = build("GET", path, &[], client);
        let limits = limits_of(&config, &req);
        assert_eq!(names(&limits), ["everyone", "per-route"]);
        let composite = Composite::new(RouteKey, PeerIp).extract(&req).expect("key");
        assert_eq!(limits[1].1, composite.as_bytes());
    }
    // `/docs/` needs the slash; `/static` matches itself.
    let req = build("GET", "/docs", &[], client);
    assert_eq!(names(&limits_of(&config, &req)), ["everyone"]);
    let req = build("GET", "/static", &[], client);
    assert_eq!(names(&limits_of(&config, &req)), ["everyone", "per-route"]);

    // No rule at all: nothing to check.
    let empty = Config::from_toml("").expect("empty is valid");
    assert!(empty.limits(&build("GET", "/", &[], client)).is_empty());
}

/// Sends a request from each IPv6 peer through a layer over `config`
/// (`/api`, a limit of 2), and returns the statuses.
async fn statuses_from(config: Config, peers: &[&str]) -> Vec<u16> {
    let service = ServiceBuilder::new()
        .layer(RateLimitLayer::with_rules(MemoryStore::new(), config))
        .service(ok_service());
    let requests = peers.iter().map(|ip| request_at("/api/items", ip, &[]));
    fixtures::statuses(service, requests).await
}

/// The `ip` key keys a directly connected IPv6 client by its /64 (or the
/// `[ip]` prefix): rotating addresses within it spends one budget.
#[tokio::test]
async fn the_ip_key_keys_ipv6_peers_by_network() {
    let config = |ip_section: &str| {
        Config::from_toml(&format!(
            "{ip_section}\n[policies.api]\nalgorithm = \"gcra\"\nlimit = 2\nrate = \"1/h\"\n\n\
             [[rules]]\npolicy = \"api\"\nkey = \"ip\"\nroutes = [\"/api\"]\n"
        ))
        .expect("valid")
    };
    let one_64 = ["2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2:a:b:c:d"];
    let other_64s = ["2001:db8:1:2::1", "2001:db8:1:3::1", "2001:db8:1:4::1"];
    let one_48 = [
        "2001:db8:1:2::1",
        "2001:db8:1:3::1",
        "2001:db8:1:ffff::1",
        "2001:db8:2::1",
    ];

    // The default, and the default written out.
    for section in ["", "[ip]", "[ip]\nipv6_prefix = 64"] {
        assert_eq!(
            statuses_from(config(section), &one_64).await,
            [200, 200, 429],
            "{section}"
        );
        assert_eq!(
            statuses_from(config(section), &other_64s).await,
            [200, 200, 200],
            "{section}"
        );
        let keys = limits_of(&config(section), &{
            let mut req = request("c");
            req.extensions_mut()
                .insert(PeerAddr("[2001:db8:1:2::9]:1".parse().expect("addr")));
            req
        });
        assert_eq!(keys[0].1, b"2001:db8:1:2::/64");
    }
    // /48: the neighbouring /64s share one budget; another /48 has its own.
    let per_48 = config("[ip]\nipv6_prefix = 48");
    assert_eq!(statuses_from(per_48, &one_48).await, [200, 200, 429, 200]);
    // /128: each address on its own.
    let per_128 = config("[ip]\nipv6_prefix = 128");
    assert_eq!(statuses_from(per_128, &one_64).await, [200, 200, 200]);
    // IPv4 peers are keyed by their address whatever the IPv6 prefix.
    let ipv4 = ["192.0.2.1", "192.0.2.2", "192.0.2.1", "192.0.2.1"];
    let per_48 = config("[ip]\nipv6_prefix = 48");
    assert_eq!(statuses_from(per_48, &ipv4).await, [200, 200, 200, 429]);
}

#[tokio::test]
async fn a_config_limits_requests_through_the_layer() {
    let config = Config::from_toml(RULES).expect("valid");
    let service = ServiceBuilder::new()
        .layer(
            RateLimitLayer::with_rules(MemoryStore::new(), config)
                .on_failure(FailurePolicy::Closed),
        )
        .service(ok_service());
    let login = async |ip: [u8; 4]| {
        let mut req = Request::post("/login")
            .body(String::new())
            .expect("request");
        peer(&mut req, ip);
        service.clone().oneshot(req).await.expect("ok").status()
    };
    // 5 logins per client (in a window far longer than the test), each
    // client on its own: the sixth from one client is refused, the first
    // from another is not.
    let first = [192, 0, 2, 1];
    let logins = [first, first, first, first, first, first, [192, 0, 2, 2]];
    let mut statuses = Vec::new();
    for ip in logins {
        statuses.push(login(ip).await.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 200]);
    // `missing_key = "reject"` through the layer.
    let mut req = Request::get("/api/items")
        .body(String::new())
        .expect("request");
    peer(&mut req, [192, 0, 2, 1]);
    let response = service.clone().oneshot(req).await.expect("ok");
    assert!(response.status().is_client_error(), "{}", response.status());
}

// ---------------------------------------------------------------------------
// Reloading

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloading_under_load_fails_no_request_and_enforces_the_new_limit() {
    const N: u64 = 3;
    const M: u64 = 7;
    const WORKERS: usize = 4;
    const KEYS: u64 = 5;
    /// A bound on each worker, far above what it needs.
    const MAX_REQUESTS: u64 = 5_000;

    let rules = ReloadableRules::from_str(&api_config(N), Format::Toml).expect("valid");
    let layer = layer(rules.clone());
    let service = ServiceBuilder::new()
        .layer(layer.clone())
        .service(ok_service());
    let reloaded = Arc::new(AtomicBool::new(false));
    let progress: Arc<Vec<AtomicU64>> = Arc::new((0..WORKERS).map(|_| AtomicU64::new(0)).collect());

    let mut workers = Vec::new();
    for worker in 0..WORKERS {
        let (service, reloaded, progress) = (service.clone(), reloaded.clone(), progress.clone());
        workers.push(tokio::spawn(async move {
            // (key, status, limit it was decided under, sent after the reload returned)
            let mut seen: Vec<(u64, StatusCode, u64, bool)> = Vec::new();
            let mut after = 0;
            for i in 0..MAX_REQUESTS {
                let key = i % KEYS;
                let sent_after_reload = reloaded.load(Ordering::SeqCst);
                let response = service
                    .clone()
                    .oneshot(request(&format!("w{worker}-k{key}")))
                    .await
                    .expect("infallible");
                seen.push((
                    key,
                    response.status(),
                    limit_of(&response),
                    sent_after_reload,
                ));
                progress[worker].fetch_add(1, Ordering::SeqCst);
                if sent_after_reload {
                    after += 1;
                    // Every key asked more than M times under the new limit.
                    if after >= KEYS * (M + 1) {
                        break;
                    }
                }
                tokio::task::yield_now().await;
            }
            seen
        }));
    }

    // Reload while the workers run, once each has exhausted its keys under N.
    let exhausted = KEYS * (N + 1);
    tokio::time::timeout(Duration::from_secs(60), async {
        while progress
            .iter()
            .any(|p| p.load(Ordering::SeqCst) < exhausted)
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the workers made progress");
    rules
        .reload_from_str(&api_config(M), Format::Toml)
        .expect("reload");
    reloaded.store(true, Ordering::SeqCst);

    let mut results = Vec::new();
    for worker in workers {
        let seen = tokio::time::timeout(Duration::from_secs(60), worker)
            .await
            .expect("workers finish")
            .expect("no panic");
        results.push(seen);
    }

    for (worker, seen) in results.iter().enumerate() {
        assert!(
            u64::try_from(seen.len()).expect("small") < MAX_REQUESTS,
            "worker {worker} did not see the reload"
        );
        let mut allowed_under: HashMap<(u64, u64), u64> = HashMap::new();
        let mut saw_new = false;
        for &(key, status, limit, sent_after_reload) in seen {
            // Only 200 or 429: nothing failed, nothing fell to the failure policy.
            assert!(
                status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
                "worker {worker}: status {status}"
            );
            assert!(limit == N || limit == M, "limit {limit}");
            // One worker's requests are sequential: once the new limit is
            // seen, the old one never comes back.
            if limit == M {
                saw_new = true;
            }
            assert!(
                !(saw_new && limit == N),
                "worker {worker}: old limit after the new one"
            );
            if sent_after_reload {
                assert_eq!(
                    limit, M,
                    "sent after the reload, decided under the old limit"
                );
            }
            if status == StatusCode::OK {
                *allowed_under.entry((key, limit)).or_default() += 1;
            }
        }
        for key in 0..KEYS {
            let old = allowed_under.get(&(key, N)).copied().unwrap_or(0);
            let new = allowed_under.get(&(key, M)).copied().unwrap_or(0);
            // N before the reload (each key was exhausted), and the new limit
            // counts on from there: M in all, exactly.
            assert_eq!(old, N, "worker {worker} key {key} under the old limit");
            assert_eq!(old + new, M, "worker {worker} key {key} in all");
        }
    }
    assert_eq!(
        layer.stats().failed_open() + layer.stats().failed_closed(),
        0
    );

    // A fresh key gets exactly M, then 429.
    assert_eq!(allowed_until_refused(&service, "fresh", 100).await, M);
}

#[tokio::test(start_paused = true)]
async fn requests_in_flight_keep_the_rules_they_started_with() {
    let rules = ReloadableRules::from_str(&api_config(2), Format::Toml).expect("valid");
    let entered = Arc::new(tokio::sync::Notify::new());
    let release = Arc::new(tokio::sync::Notify::new());
    let (inside, go) = (entered.clone(), release.clone());
    let service = ServiceBuilder::new()
        .layer(layer(rules.clone()))
        .service_fn(move |req: Request<String>| {
            let (inside, go) = (inside.clone(), go.clone());
            async move {
                let limit = req
                    .extensions()
                    .get::<Decisions>()
                    .and_then(|d| d.tightest())
                    .map(|d| d.decision().limit());
                inside.notify_one();
                go.notified().await;
                Ok::<_, Infallible>(Response::new(format!("{limit:?}")))
            }
        });

    let slow = tokio::spawn(service.clone().oneshot(request("a")));
    entered.notified().await;
    rules
        .reload_from_str(&api_config(5), Format::Toml)
        .expect("reload");
    release.notify_one();
    let response = slow.await.expect("no panic").expect("infallible");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        limit_of(&response),
        2,
        "headers of the limit it was decided under"
    );

    // The next request is decided under the new limit, and counts on: one of
    // the five was used before the reload.
    let next = tokio::spawn(service.clone().oneshot(request("a")));
    entered.notified().await;
    release.notify_one();
    let response = next.await.expect("no panic").expect("infallible");
    assert_eq!(limit_of(&response), 5);
    assert_eq!(
        response
            .headers()
            .get("x-ratelimit-remaining")
            .and_then(|v| v.to_str().ok()),
        Some("3")
    );
}

#[tokio::test]
async fn a_bad_reload_keeps_the_old_limit() {
    let rules = ReloadableRules::from_str(&api_config(3), Format::Toml).expect("valid");
    let service = limited(&rules);
    let before = rules.current();
    let dir = tempfile::tempdir().expect("temp dir");
    let yaml = dir.path().join("limits.yaml");
    std::fs::write(&yaml, api_config(9)).expect("write");

    let attempts: Vec<(Result<(), ConfigError>, ConfigErrorKind)> = vec![
        (
            rules.reload_from_str(&api_config(0), Format::Toml),
            ConfigErrorKind::Policy,
        ),
        (
            rules.reload_from_str("[policies.api\nlimit = 9", Format::Toml),
            ConfigErrorKind::Parse,
        ),
        (
            rules.reload_from_str(
                &api_config(9).replace("policy = \"api\"", "policy = \"apii\""),
                Format::Toml,
            ),
            ConfigErrorKind::Rule,
        ),
        (
            rules.reload_from_str(&api_config(9), Format::Json),
            ConfigErrorKind::Parse,
        ),
        (
            rules.reload_from_file(dir.path().join("missing.toml")),
            ConfigErrorKind::Io,
        ),
        (
            rules.reload_from_file(&yaml),
            ConfigErrorKind::UnknownFormat,
        ),
        (
            rules.reload_from_str(
                &api_config(9)
                    .replace("\"gcra\"", "\"fixed-window\"")
                    .replace("rate = \"1/h\"", "window = \"1h\""),
                Format::Toml,
            ),
            ConfigErrorKind::AlgorithmChanged,
        ),
    ];
    for (i, (result, kind)) in attempts.into_iter().enumerate() {
        let error = result.expect_err("a bad reload fails");
        assert_eq!(error.kind(), kind, "attempt {i}: {error}");
        assert!(
            Arc::ptr_eq(&before, &rules.current()),
            "attempt {i} replaced the config"
        );
    }
    assert_eq!(allowed_until_refused(&service, "fresh", 100).await, 3);

    // Renaming is how an algorithm changes: a new name starts afresh.
    let renamed = api_config(4)
        .replace("[policies.api]", "[policies.api-v2]")
        .replace("policy = \"api\"", "policy = \"api-v2\"")
        .replace("\"gcra\"", "\"fixed-window\"")
        .replace("rate = \"1/h\"", "window = \"1000d\"");
    rules
        .reload_from_str(&renamed, Format::Toml)
        .expect("a new name");
    assert_eq!(allowed_until_refused(&service, "fresh", 100).await, 4);
}

/// Three policies and three rules, as an operator writes them: every prefix
/// of it is what a watcher may read mid-write, or a dead writer leaves.
const FULL_CONFIG: &str = include_str!("configs/full.toml");

/// The policy names of `config`, sorted.
fn policy_names(config: &Config) -> Vec<String> {
    config.policies().map(|p| p.name().to_owned()).collect()
}

/// An empty or truncated document is refused on reload when it defines no
/// rules, fewer rules or fewer policies; a key at 429 stays at 429.
#[tokio::test]
async fn a_reload_that_drops_rules_is_refused() {
    let rules = ReloadableRules::from_str(&api_config(1), Format::Toml).expect("valid");
    let service = limited(&rules);
    assert_eq!(allowed_until_refused(&service, "a", 10).await, 1);
    let before = rules.current();

    let two_rules = format!(
        "{}\n[[rules]]\npolicy = \"api\"\nkey = \"global\"\n",
        api_config(1)
    );
    rules
        .reload_from_str(&two_rules, Format::Toml)
        .expect("a rule more drops nothing");
    let two = rules.current();
    let two_policies =
        format!("{two_rules}\n[policies.spare]\nalgorithm = \"gcra\"\nlimit = 1\nrate = \"1/h\"\n");
    let cases: [(&str, String, &str, &str); 5] = [
        ("empty", String::new(), "rules", "defines no rules"),
        (
            "blank",
            String::from("\n# nothing yet\n"),
            "rules",
            "defines no rules",
        ),
        (
            "policies only",
            api_config(1).replace(
                "[[rules]]\npolicy = \"api\"\nkey = \"header:x-client\"\n",
                "",
            ),
            "rules",
            "defines no rules",
        ),
        (
            "a rule less",
            api_config(1),
            "rules",
            "1 rules where 2 are in force",
        ),
        ("json", String::from("{}"), "rules", "defines no rules"),
    ];
    for (case, text, path, fragment) in cases {
        let format = if case == "json" {
            Format::Json
        } else {
            Format::Toml
        };
        let error = rules.reload_from_str(&text, format).expect_err(case);
        assert_eq!(
            error.kind(),
            ConfigErrorKind::RulesDropped,
            "{case}: {error}"
        );
        assert_eq!(error.path(), path, "{case}: {error}");
        assert!(error.message().contains(fragment), "{case}: {error}");
        assert!(
            error.message().contains("allow_dropping_rules"),
            "{case}: {error}"
        );
        assert!(
            Arc::ptr_eq(&two, &rules.current()),
            "{case} replaced the config"
        );
    }
    // The key at 429 is still refused.
    assert_eq!(allowed_until_refused(&service, "a", 10).await, 0);

    // A policy less, as many rules: refused too, naming it.
    rules
        .reload_from_str(&two_policies, Format::Toml)
        .expect("a policy more drops nothing");
    let error = rules
        .reload_from_str(&two_rules, Format::Toml)
        .expect_err("a policy less");
    assert_eq!(error.kind(), ConfigErrorKind::RulesDropped, "{error}");
    assert_eq!(error.path(), "policies");
    assert!(error.message().contains("missing: spare"), "{error}");

    // A rename replaces a policy: not a drop.
    let renamed = two_policies.replace("[policies.spare]", "[policies.spare-v2]");
    rules
        .reload_from_str(&renamed, Format::Toml)
        .expect("a renamed policy is not dropped");
    assert_eq!(policy_names(&rules.current()), ["api", "spare-v2"]);
    assert!(!Arc::ptr_eq(&before, &rules.current()));
}

/// What the caller says is meant goes through: an empty configuration lifts
/// the limits.
#[tokio::test]
async fn dropping_rules_on_purpose_is_allowed_when_the_reloader_says_so() {
    let rules = ReloadableRules::from_str(&api_config(1), Format::Toml)
        .expect("valid")
        .allow_dropping_rules(true);
    let service = limited(&rules);
    assert_eq!(allowed_until_refused(&service, "a", 10).await, 1);
    rules
        .reload_from_str("", Format::Toml)
        .expect("an empty configuration, allowed");
    assert_eq!(rules.current().rule_count(), 0);
    for _ in 0..5 {
        let response = service
            .clone()
            .oneshot(request("a"))
            .await
            .expect("infallible");
        assert_eq!(response.status(), StatusCode::OK);
    }
    // The setting is the reloader's, and can be taken back.
    let rules = rules.allow_dropping_rules(false);
    rules
        .reload_from_str(&api_config(1), Format::Toml)
        .expect("rules again");
    let error = rules
        .reload_from_str("", Format::Toml)
        .expect_err("refused again");
    assert_eq!(error.kind(), ConfigErrorKind::RulesDropped);
}

/// Every prefix of a real configuration (what a reader sees of a file written
/// in place, or what a writer that died leaves) is refused, or is a valid
/// configuration with every rule and policy in force.
#[test]
fn every_prefix_of_a_config_is_refused_or_drops_nothing() {
    let full = Config::from_toml(FULL_CONFIG).expect("valid");
    let names = policy_names(&full);
    let mut parsed_dropping = 0;
    let mut loaded = 0;
    for len in 0..=FULL_CONFIG.len() {
        let prefix = &FULL_CONFIG[..len];
        let rules = ReloadableRules::new(full.clone());
        // Without the check, these would have been loaded.
        if Config::from_toml(prefix).is_ok_and(|c| c.rule_count() < full.rule_count()) {
            parsed_dropping += 1;
        }
        match rules.reload_from_str(prefix, Format::Toml) {
            Ok(()) => {
                let now = rules.current();
                assert_eq!(now.rule_count(), full.rule_count(), "prefix of {len} bytes");
                assert_eq!(policy_names(&now), names, "prefix of {len} bytes");
                loaded += 1;
            }
            Err(error) => assert!(
                matches!(
                    error.kind(),
                    ConfigErrorKind::Parse
                        | ConfigErrorKind::Policy
                        | ConfigErrorKind::Rule
                        | ConfigErrorKind::RulesDropped
                ),
                "prefix of {len} bytes: {error}"
            ),
        }
    }
    assert!(
        parsed_dropping >= 40,
        "only {parsed_dropping} prefixes parsed with rules missing"
    );
    // The whole file, and the ones that only miss its last bytes.
    assert!(loaded >= 1);
}

/// Why an algorithm change needs a new name: under one name, both stores
/// refuse the state of an algorithm that keeps another kind of state
/// (`PolicyConflict`, for every such pair); GCRA and the leaky bucket share
/// theirs. The same algorithm with other numbers counts on.
#[tokio::test]
async fn a_store_refuses_another_algorithm_under_one_name() {
    let server = RedisServer::start();
    let redis = redis_store(server.url()).await;
    let memory = MemoryStore::new();
    let hour = Duration::from_secs(3600);
    let api = |p: Result<Policy, PolicyError>| p.and_then(|p| p.with_name("api")).expect("valid");
    let policies = [
        api(Policy::fixed_window(5, NO_EDGE)),
        api(Policy::sliding_window_log(5, hour)),
        api(Policy::sliding_window_counter(5, NO_EDGE)),
        api(Policy::token_bucket(5, Rate::per_hour(5))),
        api(Policy::gcra(5, Rate::per_hour(5))),
        api(Policy::leaky_bucket(5, Rate::per_hour(5))),
        api(Policy::concurrency(5, hour)),
    ];
    let family = |p: &Policy| match p.algorithm().kind() {
        "leaky-bucket" => "gcra",
        kind => kind,
    };
    for old in &policies {
        for new in &policies {
            let (old_kind, new_kind) = (old.algorithm().kind(), new.algorithm().kind());
            let key = format!("{old_kind}-then-{new_kind}");
            let key = key.as_bytes();
            memory.check(key, old, 1).await.expect("first");
            redis.check(key, old, 1).await.expect("first");
            let answers = [
                ("memory", memory.check(key, new, 1).await),
                ("redis", redis.check(key, new, 1).await),
            ];
            for (store, answer) in answers {
                if family(old) == family(new) {
                    assert!(
                        answer.is_ok(),
                        "{store}: {old_kind} then {new_kind}: {answer:?}"
                    );
                } else {
                    assert!(
                        matches!(&answer, Err(StoreError::PolicyConflict { policy }) if policy == "api"),
                        "{store}: {old_kind} then {new_kind}: {answer:?}"
                    );
                }
            }
        }
    }
    // Same algorithm, other numbers: counting goes on.
    let bigger = api(Policy::fixed_window(9, hour));
    for remaining in [
        memory.check(b"k", &policies[0], 1).await,
        redis.check(b"k", &policies[0], 1).await,
    ] {
        assert_eq!(remaining.expect("first").remaining(), 4);
    }
    for decision in [
        memory.check(b"k", &bigger, 1).await,
        redis.check(b"k", &bigger, 1).await,
    ] {
        assert_eq!(decision.expect("same kind").remaining(), 7);
    }
}

// ---------------------------------------------------------------------------
// Watching a file

async fn wait_for_limit(rules: &ReloadableRules, limit: u64) {
    for _ in 0..100 {
        if rules.current().policy("api").map(Policy::limit) == Some(limit) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "limit {limit} not loaded; in force: {:?}",
        rules.current().policy("api").map(Policy::limit)
    );
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write");
}

#[tokio::test(start_paused = true)]
async fn the_watcher_follows_a_changed_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ratelimit.toml");
    write(&path, &api_config(3));
    let rules = ReloadableRules::from_file(&path).expect("valid");
    let service = limited(&rules);
    let watch = rules.watch_file(&path, Duration::from_millis(100));

    // Unchanged: nothing is reloaded.
    let first = rules.current();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(Arc::ptr_eq(&first, &rules.current()));

    write(&path, &api_config(12));
    wait_for_limit(&rules, 12).await;
    assert_eq!(allowed_until_refused(&service, "a", 100).await, 12);

    // A broken file is not loaded, and stays not loaded.
    let good = rules.current();
    write(&path, &api_config(0));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(Arc::ptr_eq(&good, &rules.current()));
    assert_eq!(allowed_until_refused(&service, "b", 100).await, 12);

    // Fixed: loaded.
    write(&path, &api_config(5));
    wait_for_limit(&rules, 5).await;

    // Replaced by a rename, same size: another inode, loaded too.
    let next = dir.path().join("next.toml");
    write(&next, &api_config(6));
    std::fs::rename(&next, &path).expect("rename");
    wait_for_limit(&rules, 6).await;
    assert_eq!(allowed_until_refused(&service, "c", 100).await, 6);

    watch.abort();
    assert!(watch.await.expect_err("aborted").is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn the_watcher_loads_a_file_the_rules_did_not_come_from() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ratelimit.json");
    write(
        &path,
        r#"{"policies": {"api": {"algorithm": "gcra", "limit": 4, "rate": "1/h"}},
            "rules": [{"policy": "api", "key": "header:x-client"}]}"#,
    );
    let rules = ReloadableRules::from_str(&api_config(1), Format::Toml).expect("valid");
    let watch = rules.watch_file(&path, Duration::from_millis(100));
    wait_for_limit(&rules, 4).await;
    watch.abort();
}

/// A file written in place is read only once its writer has stopped for a
/// whole interval: a first part that is itself a valid configuration (a
/// limit of 1 where 12 is being written) is never loaded.
#[tokio::test(start_paused = true)]
async fn the_watcher_waits_for_a_file_written_in_place_to_settle() {
    use std::io::Write;

    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ratelimit.toml");
    // The policy last, so that a prefix ending in `limit = 1` parses.
    let text = "[[rules]]\npolicy = \"api\"\nkey = \"header:x-client\"\n\n\
                [policies.api]\nalgorithm = \"gcra\"\nrate = \"1/h\"\nlimit = 12";
    write(&path, &text.replace("limit = 12", "limit = 3"));
    let rules = ReloadableRules::from_file(&path).expect("valid");
    let watch = rules.watch_file(&path, Duration::from_millis(100));
    tokio::time::sleep(Duration::from_millis(1030)).await;

    let (head, tail) = text.split_at(text.len() - 1);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .expect("open");
    file.write_all(head.as_bytes()).expect("write");
    file.flush().expect("flush");
    let mut seen = Vec::new();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        seen.extend(rules.current().policy("api").map(Policy::limit));
    }
    file.write_all(tail.as_bytes()).expect("write");
    drop(file);
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        seen.extend(rules.current().policy("api").map(Policy::limit));
    }
    assert!(
        !seen.contains(&1),
        "the half-written file was loaded: {seen:?}"
    );
    assert_eq!(seen.last(), Some(&12), "{seen:?}");
    watch.abort();
}

/// A writer that dies halfway leaves a prefix that stays: refused (it drops
/// rules), logged and counted as a failed reload, and the limits in force
/// stay; the fixed file, renamed over it, is loaded.
#[test]
fn the_watcher_keeps_the_limits_when_a_writer_dies_halfway() {
    let ((), recorded) = ratelimit_tests::metrics::capture(true, || async {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("ratelimit.toml");
        write(&path, FULL_CONFIG);
        let rules = ReloadableRules::from_file(&path).expect("valid");
        let watch = rules.watch_file(&path, Duration::from_millis(100));
        let first = rules.current();

        // Killed after the second rule: a valid document with two rules.
        let cut = FULL_CONFIG.rfind("[[rules]]").expect("rules");
        let prefix = &FULL_CONFIG[..cut];
        assert_eq!(Config::from_toml(prefix).expect("parses").rule_count(), 2);
        for text in [prefix, "", &FULL_CONFIG[..40]] {
            write(&path, text);
            tokio::time::sleep(Duration::from_secs(2)).await;
            assert!(Arc::ptr_eq(&first, &rules.current()), "{text:?} was loaded");
        }

        // Atomically replaced by a complete file: loaded.
        let next = dir.path().join("next.toml");
        write(&next, &FULL_CONFIG.replace("limit = 20", "limit = 30"));
        std::fs::rename(&next, &path).expect("rename");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(rules.current().policy("api").map(Policy::limit), Some(30));
        watch.abort();
    });
    let reloads = ratelimit_tests::metrics::CONFIG_RELOADS;
    assert_eq!(recorded.counter(reloads, &[("outcome", "failed")]), 3);
    assert_eq!(recorded.counter(reloads, &[("outcome", "loaded")]), 1);
}

/// With the reloader's consent, an emptied file is loaded by the watcher.
#[tokio::test(start_paused = true)]
async fn the_watcher_loads_an_empty_file_when_dropping_rules_is_allowed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ratelimit.toml");
    write(&path, &api_config(3));
    let rules = ReloadableRules::from_file(&path)
        .expect("valid")
        .allow_dropping_rules(true);
    let watch = rules.watch_file(&path, Duration::from_millis(100));
    write(&path, "");
    for _ in 0..100 {
        if rules.current().rule_count() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(rules.current().rule_count(), 0);
    assert!(rules.current().policy("api").is_none());
    watch.abort();
}

// ---------------------------------------------------------------------------
// The example, over loopback HTTP

/// A poll of zero would read the file every millisecond (the watcher's
/// floor): refused, naming the flag (it was accepted before the flags moved
/// to clap).
#[test]
fn the_config_reload_example_refuses_a_zero_poll() {
    for poll in ["0s", "0ms", "soon"] {
        assert_refuses_flags("config_reload", &["--poll", poll], "'--poll <DURATION>'");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_reload_example_follows_its_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ratelimit.toml");
    let config = |limit: u64| {
        format!(
            "[policies.api]\nalgorithm = \"gcra\"\nlimit = {limit}\nrate = \"1/h\"\n\n\
             [[rules]]\npolicy = \"api\"\nkey = \"ip\"\nroutes = [\"/api\"]\n"
        )
    };
    write(&path, &config(2));
    let example = spawn_listening(
        "config_reload",
        &[
            "--config",
            path.to_str().expect("utf-8 path"),
            "--poll",
            "50ms",
        ],
        Duration::from_secs(60),
    );
    let client = client();
    let get = |path: &'static str| {
        let client = client.clone();
        let url = format!("{}{path}", example.base);
        async move { client.get(url).send().await.expect("request").status() }
    };
    for _ in 0..2 {
        assert_eq!(get("/api/items").await, reqwest::StatusCode::OK);
    }
    assert_eq!(
        get("/api/items").await,
        reqwest::StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(get("/").await, reqwest::StatusCode::OK, "no rule for /");

    // A bad file: reported, and the limit in force stays.
    write(&path, &config(0));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        get("/api/items").await,
        reqwest::StatusCode::TOO_MANY_REQUESTS
    );

    // Limit 5: three more than the two used, once the file is seen.
    write(&path, &config(5));
    let started = std::time::Instant::now();
    while get("/api/items").await != reqwest::StatusCode::OK {
        assert!(started.elapsed() < Duration::from_secs(20), "not reloaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..2 {
        assert_eq!(get("/api/items").await, reqwest::StatusCode::OK);
    }
    assert_eq!(
        get("/api/items").await,
        reqwest::StatusCode::TOO_MANY_REQUESTS
    );
}

/// A policy asked only at cost 0 (a `cost = 0` written for 10, or copied
/// from a peek rule) would never be limited: a cost of 0 reports without
/// spending. Such a configuration is refused, naming the rule's cost; a
/// cost-0 rule beside a rule that spends the same policy loads.
#[test]
fn a_policy_asked_only_at_cost_zero_is_refused() {
    const POLICY: &str = "[policies.api]\nalgorithm = \"gcra\"\nlimit = 2\nrate = \"1/h\"\n";
    let rule = |cost: &str| format!("[[rules]]\npolicy = \"api\"\nkey = \"ip\"\n{cost}\n");
    for rules in [
        rule("cost = 0"),
        format!("{}{}", rule("cost = 0"), rule("cost = 0")),
    ] {
        let error = Config::from_toml(&format!("{POLICY}{rules}")).expect_err(&rules);
        assert_eq!(error.path(), "rules[0].cost", "{error}");
        assert!(error.to_string().contains("cost 0"), "{error}");
    }
    for rules in [
        format!("{}{}", rule("cost = 0"), rule("")),
        format!(
            "{}{}",
            rule("cost = 0"),
            rule("settle = { header = \"x-cost\" }")
        ),
    ] {
        Config::from_toml(&format!("{POLICY}{rules}")).expect(&rules);
    }
}

/// `[client_ip] trusted_proxies` that trust more public addresses than any
/// proxy fleet has (a network holding every address of a family,
/// `0.0.0.0/0`, `::/0`, `::ffff:0:0/96` or `::/64`, which hold every IPv4
/// address mapped; NAT64's `64:ff9b::/96` and `64:ff9b:1::/48`, 6to4's
/// `2002::/16` and Teredo's `2001::/32`, which carry every IPv4 client;
/// `2000::/3`, every global IPv6 address; or networks that
/// add up to more than a `/8` of public IPv4 or a `/16` of public IPv6)
/// would let any client there write its own address in `X-Forwarded-For`,
/// a fresh budget per request: refused, naming the network, or the list
/// when only together they trust too many. Private networks and a CDN's
/// published ranges load.
#[test]
fn trusting_more_public_addresses_than_a_proxy_fleet_is_refused_by_the_config() {
    let config = |trusted: &[String]| {
        let list: Vec<String> = trusted.iter().map(|t| format!("{t:?}")).collect();
        Config::from_toml(&format!(
            "[client_ip]\ntrusted_proxies = [\"10.0.0.0/8\", {}]\n\
             header = \"x-forwarded-for\"\n\n\
             [policies.api]\nalgorithm = \"gcra\"\nlimit = 2\nrate = \"1/h\"\n\n\
             [[rules]]\npolicy = \"api\"\nkey = \"client-ip\"\n",
            list.join(", ")
        ))
    };
    let list = |text: &str| {
        text.split_whitespace()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    // Every IPv6 network but the IPv4-mapped one: every address an IPv6
    // peer can have (a mapped peer is read as IPv4).
    let mapped: u128 = 0xffff << 32;
    let all_but_mapped: Vec<String> = (0..96u32)
        .map(|i| {
            let network = (mapped ^ (1u128 << (127 - i))) & !(u128::MAX >> (i + 1));
            format!("{}/{}", std::net::Ipv6Addr::from(network), i + 1)
        })
        .collect();
    let refused: [(Vec<String>, &str); 16] = [
        (list("0.0.0.0/0"), "client_ip.trusted_proxies[1]"),
        // IPv6 ranges carrying every IPv4 client: NAT64's well-known and
        // local-use prefixes, 6to4 and Teredo.
        (list("64:ff9b::/96"), "client_ip.trusted_proxies[1]"),
        (list("64:ff9b:1::/96"), "client_ip.trusted_proxies[1]"),
        (list("64:ff9b:1::/48"), "client_ip.trusted_proxies[1]"),
        (list("2002::/16"), "client_ip.trusted_proxies[1]"),
        (list("2001::/32"), "client_ip.trusted_proxies[1]"),
        (list("64:ff9b::/64"), "client_ip.trusted_proxies[1]"),
        (list("64:ff9b::/97"), "client_ip.trusted_proxies[1]"),
        (list("::/0"), "client_ip.trusted_proxies[1]"),
        (list("::ffff:0:0/96"), "client_ip.trusted_proxies[1]"),
        (list("::/64"), "client_ip.trusted_proxies[1]"),
        (list("2000::/3"), "client_ip.trusted_proxies[1]"),
        (list("0.0.0.0/1"), "client_ip.trusted_proxies[1]"),
        (list("11.0.0.0/8 12.0.0.0/8"), "client_ip.trusted_proxies"),
        (
            list("2400::/17 2400:8000::/17 2401::/17"),
            "client_ip.trusted_proxies",
        ),
        (all_but_mapped, "client_ip.trusted_proxies[1]"),
    ];
    for (trusted, path) in refused {
        let error = config(&trusted).expect_err(&trusted.join(" "));
        assert_eq!(error.path(), path, "{error}");
        assert!(error.to_string().contains("public"), "{error}");
    }
    for trusted in [
        "fc00::/7 172.16.0.0/12 192.168.0.0/16 100.64.0.0/10",
        "::ffff:10.0.0.0/104",
        "173.245.48.0/20 103.21.244.0/22 104.16.0.0/13 2400:cb00::/32 2606:4700::/32",
        "11.0.0.0/8",
        "2002:a00::/24",
    ] {
        config(&list(trusted)).expect(trusted);
    }
}
