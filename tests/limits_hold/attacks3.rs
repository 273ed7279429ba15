//! Attacks on shared policies, escape spellings, Redis eviction, upgrades
//! and cancellation beside shadow policies, written from the documents
//! alone: each test asserts a promise of SECURITY.md or RELIABILITY.md ("Every limit
//! holds") the way an attacker or an operator's ordinary configuration would
//! try to break it.

use http::Request;
use ratelimit_core::MemoryStore;
use ratelimit_tests::fixtures::{self, ok_service, request_at};
use ratelimit_tower::config::Config;
use ratelimit_tower::{FailurePolicy, RateLimitLayer};
use tower::{ServiceBuilder, ServiceExt};

async fn statuses(config: Config, reqs: Vec<Request<String>>) -> Vec<u16> {
    let layer =
        RateLimitLayer::with_rules(MemoryStore::new(), config).on_failure(FailurePolicy::Closed);
    fixtures::statuses(
        ServiceBuilder::new().layer(layer).service(ok_service()),
        reqs,
    )
    .await
}

/// SECURITY.md, "Every limit holds": a client cannot "drain another client's
/// budget" through the headers it sends. One policy (one quota per client)
/// used by two rules that key clients by two headers, `x-tenant` on the
/// tenant API and `x-api-key` on the public API, an ordinary way to say "10
/// requests an hour per client" once. A value is one key whichever header
/// brings it, so the store key of `x-api-key: acme` is the store key of
/// `x-tenant: acme`: a client that knows another's tenant id (not a secret)
/// could send it as its API key on the public API and drain that tenant's
/// budget. Such a configuration is refused, naming both rules; with a policy
/// per header, the budgets are apart.
#[tokio::test]
async fn two_header_keys_under_one_policy_are_refused() {
    let rules = |second_policy: &str| {
        format!(
            "[policies.per-client]\nalgorithm = \"fixed-window\"\nlimit = 2\nwindow = \"1000d\"\n\n\
             [policies.per-api-key]\nalgorithm = \"fixed-window\"\nlimit = 2\nwindow = \"1000d\"\n\n\
             [[rules]]\npolicy = \"per-client\"\nkey = \"header:x-tenant\"\nroutes = [\"/tenant\"]\n\n\
             [[rules]]\npolicy = \"{second_policy}\"\nkey = \"header:x-api-key\"\nroutes = [\"/public\"]\n"
        )
    };
    let refused = Config::from_toml(&rules("per-client")).expect_err("one policy, two headers");
    assert_eq!(refused.path(), "rules[1].key", "{refused}");
    let message = refused.to_string();
    assert!(
        message.contains("header:x-tenant") && message.contains("header:x-api-key"),
        "{message}"
    );

    let config = Config::from_toml(&rules("per-api-key")).expect("a policy per header");
    let attacker = |_| request_at("/public/items", "198.51.100.9", &[("x-api-key", "acme")]);
    let mut reqs: Vec<_> = (0..2).map(attacker).collect();
    // The tenant `acme`, from its own address, on its own API.
    reqs.push(request_at(
        "/tenant/items",
        "192.0.2.1",
        &[("x-tenant", "acme")],
    ));
    assert_eq!(
        statuses(config, reqs).await,
        [200, 200, 200],
        "a client sending another's tenant id as its API key drained that tenant's budget"
    );
}

mod around_the_router {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::Router;
    use axum::body::Body;
    use axum::extract::Path;
    use axum::http::Request;
    use axum::routing::any;
    use tower::{Layer, ServiceExt};

    use crate::rules::{layer_of, per_route};

    /// SECURITY.md, "Route rules": where axum's `MatchedPath` is not known
    /// (the layer around the router) `RouteKey` "keys by the path with
    /// unreserved bytes decoded, slashes merged and dot segments resolved, so
    /// the spellings of one path share one key". RFC 3986 says the hex digits
    /// of an escape are case-insensitive (`%3A` is `%3a`), and axum's `Path`
    /// decodes every escape, so `/api/export/a:b`, `/api/export/a%3Ab` and
    /// `/api/export/a%3ab` are one path to the handler (it is given `a:b`
    /// each time) but three keys: three budgets for one export. (Every
    /// escaped byte with a hex letter doubles the count, and each sub-delim
    /// can be written raw or escaped.)
    #[tokio::test]
    async fn route_key_around_the_router_shares_one_budget_across_escape_spellings() {
        let runs = Arc::new(AtomicUsize::new(0));
        let names = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (r, n) = (runs.clone(), names.clone());
        let router: Router = Router::new().route(
            "/api/export/{name}",
            any(move |Path(name): Path<String>| {
                r.fetch_add(1, Ordering::SeqCst);
                n.lock().unwrap().push(name);
                std::future::ready("ran")
            }),
        );
        let layer = layer_of(&per_route(r#"["/api/export"]"#));
        let svc = layer.layer(router);
        let mut statuses = Vec::new();
        for path in ["/api/export/a:b", "/api/export/a%3Ab", "/api/export/a%3ab"] {
            let req = Request::get(path).body(Body::empty()).unwrap();
            statuses.push((path, svc.clone().oneshot(req).await.unwrap().status()));
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "one path spelt three ways, limit 1, ran for {:?}: {statuses:?}",
            names.lock().unwrap()
        );
    }
}

/// A Redis run with a memory bound and an eviction policy (`volatile-lru` is
/// the default of managed services such as ElastiCache; every rate-limit key
/// has a TTL, so each is a candidate) would let a client that rotates keys
/// push counters out, its own included: a key at `429` at `200` again within
/// its window. Such a node is refused at build, naming the policy; under
/// `noeviction` with the same bound, the same flood leaves the spent key
/// limited (a full node refuses writes, never forgets).
#[tokio::test]
async fn a_redis_that_evicts_keys_never_hands_a_limited_key_a_fresh_budget() {
    use ratelimit_core::redis::RedisStore;
    use ratelimit_core::{Check, Policy, Store};
    let evicting = ratelimit_tests::RedisServer::start_with_args(&[
        "--maxmemory",
        "4mb",
        "--maxmemory-policy",
        "volatile-lru",
    ]);
    ratelimit_tests::stores::assert_refused_while_evicting(|| RedisStore::builder(evicting.url()))
        .await;

    let server = ratelimit_tests::RedisServer::start_with_args(&[
        "--maxmemory",
        "4mb",
        "--maxmemory-policy",
        "noeviction",
    ]);
    let store = ratelimit_tests::stores::redis_store(server.url()).await;
    let policy = Policy::fixed_window(1, ratelimit_tests::NO_EDGE).expect("policy");
    let victim = b"attacker-key".as_slice();
    assert!(ratelimit_tests::stores::admits(&store, victim, &policy).await);
    assert!(!ratelimit_tests::stores::admits(&store, victim, &policy).await);
    // The attacker rotates a header value: one request per fresh key.
    let keys: Vec<Vec<u8>> = (0..60_000u32)
        .map(|i| format!("rotated-key-{i:08}").into_bytes())
        .collect();
    for chunk in keys.chunks(500) {
        let checks: Vec<Check<'_>> = chunk.iter().map(|k| Check::new(k, &policy, 1)).collect();
        // Refusals (an out-of-memory reply) are the limiter holding.
        let _ = store.check_all(&checks).await;
    }
    let decision = store.check(victim, &policy, 1).await;
    assert!(
        !matches!(&decision, Ok(d) if d.is_allowed()),
        "a key denied within its window was admitted again: {decision:?}"
    );
}

mod cancelled_with_a_shadow_policy {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use http::Request;
    use ratelimit_core::{MemoryStore, Policy};
    use ratelimit_tests::faulty::{Call, Faulty};
    use ratelimit_tests::named;
    use ratelimit_tower::{GlobalKey, RateLimitLayer, Rule};
    use tower::{ServiceBuilder, ServiceExt};

    /// A `MemoryStore` whose shadow checks take as long as a slow store's
    /// (a Redis call still in flight) while `slow` is set.
    fn slow_shadow(slow: Arc<AtomicBool>) -> Faulty<MemoryStore> {
        Faulty::slow(MemoryStore::new(), move |call| {
            let shadow = matches!(call, Call::Check(policy) if policy.is_shadow());
            (shadow && slow.load(Ordering::SeqCst)).then_some(Duration::from_secs(3600))
        })
    }

    /// RELIABILITY.md, "Concurrency permits": "Dropping the guard (... the
    /// request was cancelled ...) stops the renewals and releases the permit
    /// at once", and SECURITY.md: a client cannot "drain another client's
    /// budget" through "cancellation". The enforced and the shadow policies
    /// of a request are asked together (`tokio::join!`); when the enforced
    /// answer (with a concurrency permit) is in and the shadow answer is not
    /// yet (a store call in flight), a client that goes away drops the
    /// request there: the permit was never put in a guard, so nothing
    /// releases it, and it stays held for its whole lease. Under a global
    /// concurrency limit (the documented "global limit in front") a client
    /// that connects and hangs up holds every slot, for every client, with
    /// no request running.
    #[tokio::test]
    async fn a_request_cancelled_while_its_shadow_policy_is_asked_releases_its_permit() {
        let slow = Arc::new(AtomicBool::new(true));
        let store = slow_shadow(slow.clone());
        let global = named("in-flight", Policy::concurrency(1, Duration::from_secs(60)));
        let trial =
            named("trial", Policy::fixed_window(100, Duration::from_secs(60))).with_shadow(true);
        let rules =
            Rule::new(global, GlobalKey::default()).and(Rule::new(trial, GlobalKey::default()));
        let service = ServiceBuilder::new()
            .layer(RateLimitLayer::with_rules(store, rules))
            .service(ratelimit_tests::fixtures::ok_service());
        let get = || Request::get("/").body(String::new()).unwrap();
        // The attacker's request, cancelled while the shadow call is in flight.
        let cancelled =
            tokio::time::timeout(Duration::from_millis(50), service.clone().oneshot(get())).await;
        assert!(
            cancelled.is_err(),
            "the shadow call was meant to be in flight"
        );
        slow.store(false, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Another client, with no request in flight anywhere.
        let status = service.clone().oneshot(get()).await.unwrap().status();
        assert_eq!(
            status.as_u16(),
            200,
            "a cancelled request's permit stayed held: nothing runs, yet the global slot is taken"
        );
    }
}

/// RELIABILITY.md, "Refused credentials": "Should credentials be revoked
/// later, every call fails with the authentication error, which is not an
/// outage: the layer refuses it with `500` whatever the failure policy". An
/// operator rotates the Redis password (`CONFIG SET requirepass`) and the
/// old connections go (`CLIENT KILL`, a restart, a failover): the store's
/// new connections are refused. With `FailurePolicy::Open` the limit must
/// not be lifted.
#[tokio::test]
async fn revoked_credentials_never_fail_open() {
    use ratelimit_core::Policy;
    use ratelimit_core::redis::RedisStore;
    use ratelimit_tower::GlobalKey;
    use std::time::Duration;

    let server = ratelimit_tests::RedisServer::start_with_args(&["--requirepass", "right"]);
    let port = server.port();
    let store = RedisStore::builder(format!("redis://:right@127.0.0.1:{port}"))
        .call_timeout(Duration::from_millis(1_000))
        .build()
        .await
        .expect("the right password builds");
    let policy = Policy::fixed_window(1, ratelimit_tests::NO_EDGE).unwrap();
    let layer =
        RateLimitLayer::new(store, policy, GlobalKey::default()).on_failure(FailurePolicy::Open);
    let service = ServiceBuilder::new().layer(layer).service(ok_service());
    let get = || Request::get("/").body(String::new()).unwrap();
    let first = service
        .clone()
        .oneshot(get())
        .await
        .unwrap()
        .status()
        .as_u16();
    assert_eq!(first, 200);
    // The password is rotated and the old connections are closed.
    server.cli(&[
        "-a",
        "right",
        "--no-auth-warning",
        "CONFIG",
        "SET",
        "requirepass",
        "rotated",
    ]);
    server.cli(&[
        "-a",
        "rotated",
        "--no-auth-warning",
        "CLIENT",
        "KILL",
        "TYPE",
        "normal",
    ]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut after = Vec::new();
    for _ in 0..4 {
        after.push(
            service
                .clone()
                .oneshot(get())
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("after the rotation: {after:?}");
    assert!(
        !after.contains(&200),
        "after the password was rotated, a limit of 1 (already used) admitted again \
         under FailurePolicy::Open: {after:?}"
    );
}

/// SECURITY.md, "Trusted proxies": "A malformed entry yields the last
/// trusted hop, never a value an untrusted party wrote", and a client cannot
/// drain the budget every client behind a proxy shares. A client writes its
/// own `Forwarded` with an unclosed quote (or a dangling escape) so that a
/// quote-aware reader would swallow the element its proxy appends and fall
/// back to the proxy's address; the reader splits from the right, so the
/// appended element is still the key. (Held.)
#[test]
fn a_client_forwarded_with_an_open_quote_cannot_swallow_its_proxys_element() {
    use ratelimit_tower::{ClientIp, ForwardingHeader, KeyExtractor, TrustedProxies};
    let client_ip = ClientIp::trusting(
        TrustedProxies::parse(["10.0.0.0/8"]).expect("cidr"),
        ForwardingHeader::Forwarded,
    );
    for written in [
        "for=\"198.51.100.7",
        "for=\"198.51.100.7\\",
        "for=198.51.100.7;by=\"",
        "for=\"[2001:db8::1",
        "\"",
    ] {
        let value = format!("{written}, for=203.0.113.9");
        let req = request_at("/", "10.0.0.5", &[("forwarded", &value)]);
        let key = client_ip.extract(&req).expect("a key");
        assert_eq!(key.as_bytes(), b"203.0.113.9", "{value:?}");
    }
}

/// A refund gives a key back what a request took: a denial the cache
/// remembered from before it no longer holds in the store, so the cache
/// must not answer it either (it denies only what the store would).
#[tokio::test]
async fn a_refund_ends_a_cached_denial_the_store_no_longer_makes() {
    use ratelimit_core::{DeniedCache, Rate, Store};
    use std::time::Duration;
    let policies =
        ratelimit_tests::every_algorithm(10, Duration::from_secs(60), Rate::per_hour(10));
    // The windows, the token bucket and GCRA.
    for policy in policies.into_iter().take(5) {
        let store = DeniedCache::new(MemoryStore::new());
        let taken = store.check(b"client", &policy, 10).await.expect("decided");
        assert!(taken.is_allowed(), "{policy:?}");
        let denied = store.check(b"client", &policy, 1).await.expect("decided");
        assert!(!denied.is_allowed(), "{policy:?}");
        store
            .refund(b"client", &policy, 10, &taken)
            .await
            .expect("refunded");
        let inner = store.get_ref().check(b"client", &policy, 0).await;
        assert!(
            inner.expect("decided").remaining() >= 1,
            "{policy:?}: the store has room again"
        );
        let after = store.check(b"client", &policy, 1).await.expect("decided");
        assert!(
            after.is_allowed(),
            "{policy:?}: the cache still denies what the store allows: {after:?}"
        );
    }
}
