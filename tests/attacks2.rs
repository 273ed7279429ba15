//! Second-round attacks (reviewer 2). Each test asserts what RELIABILITY.md
//! or SECURITY.md promises; those that fail are findings.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use http::{Request, Response};
use ratelimit_core::{MemoryStore, Policy};
use ratelimit_tower::config::{Config, ConfigErrorKind, Format, ReloadableRules};
use ratelimit_tower::Key;
use ratelimit_tower::{FailurePolicy, PeerAddr, PermitGuard, RateLimitLayer};
use tower::{ServiceBuilder, ServiceExt};

async fn ok(_req: Request<String>) -> Result<Response<String>, Infallible> {
    Ok(Response::new(String::from("ok")))
}

fn req_from(ip: &str, headers: &[(&str, &str)]) -> Request<String> {
    let mut builder = Request::get("/api/items");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let mut req = builder.body(String::new()).expect("request");
    req.extensions_mut().insert(PeerAddr(SocketAddr::new(
        ip.parse().expect("an address"),
        40_000,
    )));
    req
}

async fn statuses<R>(layer: RateLimitLayer<MemoryStore, R, ratelimit_tower::HttpRejections>, reqs: Vec<Request<String>>) -> Vec<u16>
where
    R: ratelimit_tower::RuleProvider<Request<String>> + Clone + Send + Sync + 'static,
    R::Future: Send,
{
    let service = ServiceBuilder::new().layer(layer).service_fn(ok);
    let mut out = Vec::new();
    for req in reqs {
        let response = service.clone().oneshot(req).await.expect("infallible");
        out.push(response.status().as_u16());
    }
    out
}

// ---------------------------------------------------------------------------
// Claim 2: a permit is held as long as its holder, "whatever lease was chosen".
// ---------------------------------------------------------------------------

/// RELIABILITY.md: "a live holder renews it, so a permit lasts exactly as
/// long as the work it guards, however long that is ..., whatever lease was
/// chosen". The guard renews every `max(lease / 3, 1 ms)`: a lease of 1 ms
/// (accepted by `Policy::concurrency`, which takes any lease from 1 µs) is
/// renewed only once it has already lapsed, so the held slot is given to a
/// second request under a max of 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_with_a_short_lease_is_still_held_while_its_guard_lives() {
    let store = MemoryStore::new();
    let policy = Policy::concurrency(1, Duration::from_millis(1)).expect("valid");
    let key = Key::from(b"stream".to_vec());
    let first = store.check_now(key.as_bytes(), &policy, 1).expect("check");
    assert!(first.is_allowed());
    let mut guard = PermitGuard::default();
    guard.hold(&store, &key, &policy, first.permit().expect("a permit"));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let second = store.check_now(key.as_bytes(), &policy, 1).expect("check");
    assert!(
        !second.is_allowed(),
        "a second permit was admitted under a max of 1 while the first guard still lives"
    );
    drop(guard);
}

// ---------------------------------------------------------------------------
// Claim 5: IPv6 clients keyed by network.
// ---------------------------------------------------------------------------

/// SECURITY.md, "Trusted proxies": "`PeerIp` (and `ClientIp::peer()`) never
/// reads headers. Use it when clients connect directly", and "A client cannot
/// earn a second budget by ... writing its address another way"; "IPv6
/// clients are keyed by network". A configuration with `[client_ip]` (the
/// documented setup behind proxies) keys a directly connected (untrusted)
/// IPv6 peer by its whole address: it rotates through its /64 for a fresh
/// budget per request. (The same holds for `ClientIp::peer()`.)
#[tokio::test]
async fn the_client_ip_key_keys_a_direct_ipv6_peer_by_network() {
    let config = Config::from_toml(
        "[client_ip]\ntrusted_proxies = [\"10.0.0.0/8\"]\nheader = \"x-forwarded-for\"\n\n\
         [policies.api]\nalgorithm = \"gcra\"\nlimit = 1\nrate = \"1/h\"\n\n\
         [[rules]]\npolicy = \"api\"\nkey = \"client-ip\"\n",
    )
    .expect("valid");
    let layer = RateLimitLayer::with_rules(MemoryStore::new(), config).on_failure(FailurePolicy::Closed);
    let reqs = ["2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2::3"]
        .iter()
        .map(|ip| req_from(ip, &[]))
        .collect();
    assert_eq!(
        statuses(layer, reqs).await,
        [200, 429, 429],
        "one IPv6 /64, connecting directly, got a fresh budget per address"
    );
}

/// The same through a trusted proxy: the client's proxy appends its address
/// to X-Forwarded-For; the client rotates through its /64.
#[tokio::test]
async fn the_client_ip_key_keys_a_forwarded_ipv6_client_by_network() {
    let config = Config::from_toml(
        "[client_ip]\ntrusted_proxies = [\"10.0.0.0/8\"]\nheader = \"x-forwarded-for\"\n\n\
         [policies.api]\nalgorithm = \"gcra\"\nlimit = 1\nrate = \"1/h\"\n\n\
         [[rules]]\npolicy = \"api\"\nkey = \"client-ip\"\n",
    )
    .expect("valid");
    let layer = RateLimitLayer::with_rules(MemoryStore::new(), config).on_failure(FailurePolicy::Closed);
    let reqs = ["2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2::3"]
        .iter()
        .map(|ip| req_from("10.0.0.5", &[("x-forwarded-for", ip)]))
        .collect();
    assert_eq!(
        statuses(layer, reqs).await,
        [200, 429, 429],
        "one IPv6 /64 behind the proxy got a fresh budget per address"
    );
}

// ---------------------------------------------------------------------------
// Claim 1: reloads never lift limits by accident.
// ---------------------------------------------------------------------------

fn api(policy: &str, limit: u64) -> String {
    format!(
        "[policies.{policy}]\nalgorithm = \"gcra\"\nlimit = {limit}\nrate = \"1/h\"\n\n\
         [[rules]]\npolicy = \"{policy}\"\nkey = \"header:x-client\"\n"
    )
}

/// RELIABILITY.md: "one that would drop rules or policies in force, leaves
/// the configuration in force as it was". A reload that keeps the counts but
/// renames the policy in force drops it (by name, the only thing the stores
/// key state by): the new one starts with a fresh budget for every client.
/// The check counts policies; it never asks whether those in force remain.
#[tokio::test]
async fn a_reload_that_renames_the_policy_in_force_is_refused() {
    let rules = ReloadableRules::from_str(&api("api", 1), Format::Toml).expect("valid");
    let layer = RateLimitLayer::with_rules(MemoryStore::new(), rules.clone()).on_failure(FailurePolicy::Closed);
    let service = ServiceBuilder::new().layer(layer).service_fn(ok);
    let send = || async {
        service
            .clone()
            .oneshot(req_from("192.0.2.1", &[("x-client", "a")]))
            .await
            .expect("infallible")
            .status()
            .as_u16()
    };
    assert_eq!(send().await, 200);
    assert_eq!(send().await, 429);
    let result = rules.reload_from_str(&api("api2", 1), Format::Toml);
    let after = send().await;
    assert_eq!(after, 429, "the renamed policy gave client a a fresh budget");
    assert_eq!(
        result.map_err(|e| e.kind()),
        Err(ConfigErrorKind::RulesDropped),
        "a reload that drops the policy in force (renamed) was accepted"
    );
}
