//! Attacks on how user keys reach the stores: a client choosing the text of
//! its key to spend another client's budget or to escape its own (an API key
//! spelled as an address, as a hash, with a Redis hash tag's braces or bytes
//! that are not text; joined keys whose parts shift; IPv4-mapped and IPv6
//! addresses), one value reaching a store by several paths, and store errors
//! a client can provoke that must not lift a limit. Each runs in memory and
//! on a real Redis, whose keys are then read back.

use std::net::{IpAddr, SocketAddr};

use http::{Request, StatusCode};
use ratelimit_axum::Limiter;
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{MemoryStore, Policy, Store};
use ratelimit_tests::fixtures::{answer, fixed_window, ok_service};
use ratelimit_tests::{NO_EDGE, RedisServer, redis_store};
use ratelimit_tower::config::Config;
use ratelimit_tower::{
    ClientIp, Composite, ForwardingHeader, HeaderKey, Key, Limits, PeerAddr, PeerIp,
    RateLimitLayer, Rule, TrustedProxies,
};
use tower::{Layer, Service};

/// A request from `peer` with `headers`.
fn request(peer: &str, headers: &[(&str, &[u8])]) -> Request<String> {
    let mut builder = Request::get("/");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let mut req = builder.body(String::new()).expect("a valid request");
    let addr: SocketAddr = peer.parse().expect("a socket address");
    req.extensions_mut().insert(PeerAddr(addr));
    req
}

/// The status `service` answers `req` with.
async fn status<S, B>(service: &S, req: Request<String>) -> StatusCode
where
    S: Service<Request<String>, Response = http::Response<B>> + Clone,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    answer(service.clone(), req).await.status
}

/// The statuses of `n` requests `make` builds, through `service`.
async fn statuses<S, B>(service: &S, n: usize, make: impl Fn() -> Request<String>) -> Vec<u16>
where
    S: Service<Request<String>, Response = http::Response<B>> + Clone,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(status(service, make()).await.as_u16());
    }
    out
}

/// A layer keying `policy` by the `x-api-key` header, on `store`.
fn by_api_key<St>(store: St, policy: Policy) -> RateLimitLayer<St, Rule<HeaderKey>> {
    RateLimitLayer::new(store, policy, HeaderKey::from_static("x-api-key"))
}

/// Every key Redis holds under `pattern`.
fn redis_keys(server: &RedisServer, pattern: &str) -> Vec<String> {
    let mut keys: Vec<String> = server
        .cli(&["--scan", "--pattern", pattern])
        .lines()
        .map(str::to_owned)
        .collect();
    keys.sort();
    keys
}

/// The state keys under `policy` of the clients the address tests send:
/// 192.0.2.1, and two IPv6 /64 networks.
fn client_keys(policy: &str) -> Vec<String> {
    ["192.0.2.1", "2001:db8:1:2::/64", "2001:db8:1:3::/64"]
        .map(|client| format!("ratelimit:{policy}:{{{client}}}"))
        .to_vec()
}

/// Runs `scenario` on a store on a fresh Redis server, then reads back the
/// keys it left under `pattern`; returns what `scenario` returned and them.
async fn on_redis<T, F>(pattern: &str, scenario: impl FnOnce(RedisStore) -> F) -> (T, Vec<String>)
where
    F: Future<Output = T>,
{
    let server = RedisServer::start();
    let out = scenario(redis_store(server.url()).await).await;
    (out, redis_keys(&server, pattern))
}

/// Whether `key` is `<prefix>:<policy>:{#<32 hex digits>}`: a hash, nothing
/// of the value it was made from.
fn is_hashed_state_key(key: &str, prefix_and_policy: &str) -> bool {
    let Some(tag) = key
        .strip_prefix(prefix_and_policy)
        .and_then(|rest| rest.strip_prefix(":{#"))
        .and_then(|rest| rest.strip_suffix('}'))
    else {
        return false;
    };
    tag.len() == 32
        && tag
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A client sending an address, or anything shaped like another key, as its
/// API key spends a budget of its own: never the address's, never another
/// value's.
mod chosen_key_text {
    use super::*;

    /// An address as an API key: the victim at 192.0.2.1 (keyed by its
    /// address) and the victim network 2001:db8:1:2::/64 keep their budgets
    /// while a client elsewhere sends their texts (and the texts a store
    /// would hold for them) as its `x-api-key`, under the same policy.
    async fn addresses_as_api_keys<St>(store: St)
    where
        St: Store + Clone + Send + Sync + 'static,
    {
        let policy = fixed_window("shared", 2, NO_EDGE);
        let by_ip = RateLimitLayer::new(store.clone(), policy.clone(), PeerIp).layer(ok_service());
        let by_key = RateLimitLayer::new(
            store.clone(),
            policy,
            HeaderKey::from_static("x-api-key").or(PeerIp),
        )
        .layer(ok_service());
        for spelled in [
            "192.0.2.1",
            "::ffff:192.0.2.1",
            "2001:db8:1:2::/64",
            "2001:db8:1:2::9",
        ] {
            let from_attacker =
                || request("198.51.100.66:4000", &[("x-api-key", spelled.as_bytes())]);
            assert_eq!(statuses(&by_key, 3, from_attacker).await, [200, 200, 429]);
        }
        for victim in ["192.0.2.1:5000", "[2001:db8:1:2::1]:5000"] {
            assert_eq!(
                statuses(&by_ip, 3, || request(victim, &[])).await,
                [200, 200, 429],
                "{victim} spent nothing of its own"
            );
        }
    }

    /// Values shaped like other keys: the hash of a victim's value (what
    /// `Key` holds for it), the hash a Redis key holds for it, a leading
    /// `#`, the braces of a Redis hash tag, the `:` of a Redis key, bytes
    /// that are not text. Each is a budget of its own; the victim's stays
    /// spent, and none of them refills it.
    async fn values_shaped_like_keys<St>(store: St) -> Vec<Vec<u8>>
    where
        St: Store + Clone + Send + Sync + 'static,
    {
        let policy = fixed_window("per-key", 1, NO_EDGE);
        let service = by_api_key(store, policy).layer(ok_service());
        let victim = b"victim-key".as_slice();
        let from = |value: &[u8]| request("198.51.100.66:4000", &[("x-api-key", value)]);
        assert_eq!(statuses(&service, 2, || from(victim)).await, [200, 429]);

        let as_key = Key::from(victim).as_bytes().to_vec();
        let as_stored = ratelimit_core::key::normalize(&as_key).into_owned();
        let hostile: Vec<Vec<u8>> = vec![
            as_key.clone(),
            as_stored,
            as_key[1..].to_vec(),
            [b"#".as_slice(), victim].concat(),
            [b"{".as_slice(), victim, b"}"].concat(),
            [victim, b"}"].concat(),
            [b"ratelimit:per-key:{".as_slice(), &as_key, b"}"].concat(),
            [victim, b":"].concat(),
            [b":".as_slice(), victim].concat(),
            [victim, b"\t"].concat(),
            [victim, &[0x80, 0xff]].concat(),
            vec![0xff; 300],
            b"VICTIM-KEY".to_vec(),
        ];
        for value in &hostile {
            assert_eq!(
                statuses(&service, 2, || from(value)).await,
                [200, 429],
                "{value:?} has a budget of its own"
            );
        }
        assert_eq!(
            status(&service, from(victim)).await,
            StatusCode::TOO_MANY_REQUESTS
        );
        hostile
    }

    #[tokio::test]
    async fn an_address_sent_as_an_api_key_is_not_the_address_in_memory_and_redis() {
        addresses_as_api_keys(MemoryStore::new()).await;
        let ((), keys) = on_redis("ratelimit:shared:*", addresses_as_api_keys).await;
        // The two addresses' keys are their texts; the four values are hashes.
        assert!(
            keys.contains(&"ratelimit:shared:{192.0.2.1}".to_owned()),
            "{keys:?}"
        );
        assert!(
            keys.contains(&"ratelimit:shared:{2001:db8:1:2::/64}".to_owned()),
            "{keys:?}"
        );
        let hashed = keys
            .iter()
            .filter(|k| is_hashed_state_key(k, "ratelimit:shared"))
            .count();
        assert_eq!((keys.len(), hashed), (6, 4), "{keys:?}");
    }

    #[tokio::test]
    async fn values_shaped_like_keys_are_budgets_of_their_own_in_memory_and_redis() {
        values_shaped_like_keys(MemoryStore::new()).await;
        let (hostile, keys) = on_redis("*", values_shaped_like_keys).await;
        // One hashed key per value, the victim's included, and no value (nor
        // any part of the victim's) in Redis.
        assert_eq!(keys.len(), hostile.len() + 1, "{keys:?}");
        for key in &keys {
            assert!(is_hashed_state_key(key, "ratelimit:per-key"), "{key}");
            assert!(!key.to_ascii_lowercase().contains("victim"), "{key}");
        }
    }
}

/// Joined keys: the parts of `("a:b", "c")` and `("a", "b:c")` never shift
/// into one another, in code (`Composite`) or in a configuration's list.
mod joined_keys {
    use super::*;

    const SPLITS: [(&str, &str); 6] = [
        ("a:b", "c"),
        ("a", "b:c"),
        ("ab", "c"),
        ("a", "bc"),
        ("33:a", "b"),
        ("33", ":ab"),
    ];

    fn two(first: &str, second: &str) -> Request<String> {
        request(
            "198.51.100.66:4000",
            &[("x-a", first.as_bytes()), ("x-b", second.as_bytes())],
        )
    }

    async fn every_split_is_its_own_budget<S, B>(service: &S)
    where
        S: Service<Request<String>, Response = http::Response<B>> + Clone,
        S::Error: std::fmt::Debug,
        B: http_body::Body,
        B::Error: std::fmt::Debug,
    {
        for (first, second) in SPLITS {
            assert_eq!(
                statuses(service, 2, || two(first, second)).await,
                [200, 429],
                "({first:?}, {second:?})"
            );
        }
    }

    async fn composite<St>(store: St)
    where
        St: Store + Clone + Send + Sync + 'static,
    {
        let key = Composite::new(HeaderKey::from_static("x-a"), HeaderKey::from_static("x-b"));
        let service =
            RateLimitLayer::new(store, fixed_window("pair", 1, NO_EDGE), key).layer(ok_service());
        every_split_is_its_own_budget(&service).await;
    }

    #[tokio::test]
    async fn composite_parts_never_shift_in_memory_and_redis() {
        composite(MemoryStore::new()).await;
        let ((), keys) = on_redis("ratelimit:pair:*", composite).await;
        assert_eq!(keys.len(), SPLITS.len());
    }

    #[tokio::test]
    async fn configured_parts_never_shift() {
        let config = Config::from_toml(
            r#"
            [policies.pair]
            algorithm = "fixed-window"
            limit = 1
            window = "1000d"

            [[rules]]
            policy = "pair"
            key = ["header:x-a", "header:x-b"]
            "#,
        )
        .expect("a valid configuration");
        let service = RateLimitLayer::with_rules(MemoryStore::new(), config).layer(ok_service());
        every_split_is_its_own_budget(&service).await;
    }
}

/// Addresses: an IPv4-mapped IPv6 address is the IPv4 client whatever path
/// keys it, and an IPv6 client is its /64.
mod addresses {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("an address")
    }

    /// A rule provider keying by the raw peer address (an IPv4 client on a
    /// dual-stack socket shows as `::ffff:a.b.c.d`) and a layer keying by
    /// `PeerIp` share one budget per client under one policy; an address
    /// as a key is an IPv6 client's /64, as `PeerIp` keys it.
    #[tokio::test]
    async fn a_mapped_address_given_as_a_key_is_the_ipv4_clients_budget() {
        assert_eq!(
            Key::from(ip("::ffff:192.0.2.1")),
            Key::from(ip("192.0.2.1"))
        );
        assert_eq!(
            Key::from(ip("2001:db8:1:2::9")),
            Key::from(ip("2001:db8:1:2:ffff::1"))
        );

        let store = MemoryStore::new();
        let policy = fixed_window("per-ip", 2, NO_EDGE);
        let by_peer_ip =
            RateLimitLayer::new(store.clone(), policy.clone(), PeerIp).layer(ok_service());
        let raw_peer = move |req: &Request<String>| {
            let peer = req.extensions().get::<PeerAddr>().map(|p| p.0.ip());
            let policy = policy.clone();
            async move {
                match peer {
                    Some(peer) => Limits::one(policy, peer, 1),
                    None => Limits::reject(),
                }
            }
        };
        let by_raw_peer = RateLimitLayer::with_rules(store, raw_peer).layer(ok_service());

        let mapped = || request("[::ffff:192.0.2.1]:4000", &[]);
        let plain = || request("192.0.2.1:4000", &[]);
        assert_eq!(statuses(&by_raw_peer, 1, mapped).await, [200]);
        assert_eq!(statuses(&by_peer_ip, 1, plain).await, [200]);
        assert_eq!(statuses(&by_raw_peer, 1, mapped).await, [429]);
        assert_eq!(statuses(&by_peer_ip, 1, mapped).await, [429]);
    }

    /// A handler's `Limiter` checking a client's address (login attempts per
    /// client, from `ConnectInfo`) keys it as the layer's `PeerIp` does: an
    /// IPv6 client taking another address of its /64 for each attempt stays
    /// on one budget, shared with the layer's, and so does an IPv4 client
    /// however its address is written. Checked by the address's text (the
    /// only key a `Limiter` took), every address was a fresh budget: 20 of
    /// 20 attempts from one /64 passed a limit of 3.
    async fn limiter_keys_addresses_as_the_layer<St>(store: St)
    where
        St: Store + Clone + Send + Sync + 'static,
    {
        let policy = fixed_window("logins-per-client", 3, NO_EDGE);
        let layer = RateLimitLayer::new(store.clone(), policy.clone(), PeerIp).layer(ok_service());
        let logins = Limiter::new(store, policy);

        assert_eq!(
            status(&layer, request("[2001:db8:1:2::1]:1", &[])).await,
            200
        );
        let mut passed = 0;
        for n in 2..=20u16 {
            let attempt = ip(&format!("2001:db8:1:2::{n:x}"));
            if logins.check(attempt, 1).await.is_ok() {
                passed += 1;
            }
        }
        assert_eq!(passed, 2, "one /64, one budget of 3");
        assert_eq!(
            status(&layer, request("[2001:db8:1:2::99]:1", &[])).await,
            429
        );
        assert!(
            logins.check(ip("2001:db8:1:3::1"), 1).await.is_ok(),
            "another /64"
        );
        assert_eq!(
            logins
                .peek(ip("2001:db8:1:2:ffff::1"))
                .await
                .expect("peeked")
                .remaining(),
            0
        );

        assert!(logins.check(ip("::ffff:192.0.2.1"), 1).await.is_ok());
        assert!(logins.reserve(ip("192.0.2.1"), 1).await.is_ok());
        assert_eq!(status(&layer, request("192.0.2.1:1", &[])).await, 200);
        assert_eq!(
            status(&layer, request("[::ffff:192.0.2.1]:1", &[])).await,
            429
        );
    }

    #[tokio::test]
    async fn a_limiter_keys_an_address_as_the_layer_does_in_memory_and_redis() {
        limiter_keys_addresses_as_the_layer(MemoryStore::new()).await;
        let ((), keys) = on_redis("*", limiter_keys_addresses_as_the_layer).await;
        assert_eq!(keys, client_keys("logins-per-client"));
    }

    /// Through `PeerIp` and a trusted proxy's `X-Forwarded-For`, the mapped
    /// and plain spellings of one IPv4 client are one budget, and so are the
    /// addresses of one IPv6 /64; another /64 is another budget.
    async fn one_client_one_budget<St>(store: St)
    where
        St: Store + Clone + Send + Sync + 'static,
    {
        let proxies = TrustedProxies::parse(["10.0.0.0/8"]).expect("valid networks");
        let client_ip = ClientIp::trusting(proxies, ForwardingHeader::XForwardedFor);
        let policy = fixed_window("per-client", 3, NO_EDGE);
        let by_peer =
            RateLimitLayer::new(store.clone(), policy.clone(), PeerIp).layer(ok_service());
        let by_client = RateLimitLayer::new(store, policy, client_ip).layer(ok_service());
        let forwarded =
            |client: &str| request("10.0.0.1:4000", &[("x-forwarded-for", client.as_bytes())]);
        let from = |peer: &str| request(peer, &[]);

        assert_eq!(status(&by_peer, from("192.0.2.1:1")).await, 200);
        assert_eq!(status(&by_peer, from("[::ffff:192.0.2.1]:1")).await, 200);
        assert_eq!(status(&by_client, forwarded("::ffff:192.0.2.1")).await, 200);
        assert_eq!(status(&by_client, forwarded("192.0.2.1")).await, 429);

        for addr in [
            "[2001:db8:1:2::1]:1",
            "[2001:db8:1:2:ffff:ffff:ffff:ffff]:1",
        ] {
            assert_eq!(status(&by_peer, from(addr)).await, 200);
        }
        assert_eq!(
            status(&by_client, forwarded("[2001:db8:1:2:abcd::7]:9")).await,
            200
        );
        assert_eq!(status(&by_client, forwarded("2001:db8:1:2::8")).await, 429);
        assert_eq!(status(&by_peer, from("[2001:db8:1:3::1]:1")).await, 200);
    }

    #[tokio::test]
    async fn one_client_one_budget_however_its_address_is_written_in_memory_and_redis() {
        one_client_one_budget(MemoryStore::new()).await;
        let ((), keys) = on_redis("ratelimit:per-client:*", one_client_one_budget).await;
        assert_eq!(keys, client_keys("per-client"));
    }
}

/// One value is one budget through the paths the existing tests do not
/// take: a gRPC `-bin` header (base64, padded or not), a `Limiter`'s
/// reservation and peek, a number, and a `metrics::Recorder`.
mod one_value {
    use super::*;

    async fn every_other_path<St>(store: St)
    where
        St: Store + Clone + Send + Sync + 'static,
    {
        let policy = fixed_window("per-tenant", 5, NO_EDGE);
        let binary = RateLimitLayer::new(
            store.clone(),
            policy.clone(),
            HeaderKey::from_static("x-tenant-bin"),
        )
        .layer(ok_service());
        let limiter = Limiter::new(store.clone(), policy.clone());
        // "7" is the tenant; "Nw==" and "Nw" its base64.
        for encoded in ["Nw==", "Nw"] {
            let req = request(
                "198.51.100.66:4000",
                &[("x-tenant-bin", encoded.as_bytes())],
            );
            assert_eq!(status(&binary, req).await, StatusCode::OK, "{encoded}");
        }
        let reservation = limiter.reserve(b"7", 1).await.expect("reserved");
        drop(reservation);
        let decision = ratelimit_tower::metrics::Recorder::default()
            .check(&store, &Key::from(7u64), &policy, 1)
            .await
            .expect("decided");
        assert_eq!(decision.remaining(), 1);
        assert_eq!(limiter.peek(b"7").await.expect("peeked").remaining(), 1);
        assert!(limiter.check(b"7", 1).await.is_ok());
        assert!(limiter.check(b"7", 1).await.is_err());
    }

    #[tokio::test]
    async fn in_memory_and_redis() {
        every_other_path(MemoryStore::new()).await;
        let (state_key, keys) = on_redis("*", |store: RedisStore| async move {
            every_other_path(store.clone()).await;
            store.state_key(
                Key::from("7").as_bytes(),
                &fixed_window("per-tenant", 5, NO_EDGE),
            )
        })
        .await;
        assert_eq!(keys, [state_key]);
    }
}

/// Store errors a client can bring about by what it sends: a Redis filled
/// up by fresh keys (each new API key value is a key), state another
/// writer put at a key. Neither is an outage, so the default failure
/// policy (open) must not let the request through.
mod errors_a_client_can_provoke {
    use super::*;

    /// A Redis server, a store on it and the policy "per-key" (100 an hour)
    /// that a `Limiter` there and the layer [`by_api_key`] enforce.
    async fn per_key_on_redis() -> (RedisServer, RedisStore, Policy, Limiter<RedisStore>) {
        let server = RedisServer::start();
        let store: RedisStore = redis_store(server.url()).await;
        let policy = fixed_window("per-key", 100, NO_EDGE);
        let limiter = Limiter::new(store.clone(), policy.clone());
        (server, store, policy, limiter)
    }

    #[tokio::test]
    async fn a_full_redis_is_refused_by_the_layer_and_the_limiter_failing_open() {
        let (server, store, policy, limiter) = per_key_on_redis().await;
        let layer = by_api_key(store, policy).layer(ok_service());
        let fresh = |n: u32| {
            request(
                "198.51.100.66:4000",
                &[("x-api-key", format!("k{n}").as_bytes())],
            )
        };
        assert_eq!(status(&layer, fresh(0)).await, StatusCode::OK);

        // What a flood of fresh keys leads to under the `noeviction` policy
        // the store requires: every write refused with `OOM`.
        server.cli(&["CONFIG", "SET", "maxmemory", "1"]);
        for n in 1..4 {
            assert_eq!(
                status(&layer, fresh(n)).await,
                StatusCode::INTERNAL_SERVER_ERROR,
                "a write Redis refuses is no outage"
            );
            assert!(limiter.check(format!("k{n}").as_bytes(), 1).await.is_err());
        }
    }

    #[tokio::test]
    async fn foreign_data_at_a_state_key_is_refused() {
        let (server, store, policy, limiter) = per_key_on_redis().await;
        let layer = by_api_key(store.clone(), policy.clone()).layer(ok_service());
        let state = store.state_key(Key::from("k1").as_bytes(), &policy);
        server.cli(&["RPUSH", &state, "not a limiter's state"]);
        let req = request("198.51.100.66:4000", &[("x-api-key", b"k1")]);
        assert_eq!(status(&layer, req).await, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(limiter.check(b"k1", 1).await.is_err());
    }
}

/// A policy keyed by one header cannot be keyed by another through a
/// reload either: while the instances sharing a store reload one after the
/// other (or a rolling deploy runs), both headers would key one policy, so
/// a client could send a tenant's id (no secret) as its API key to spend
/// that tenant's budget on the instances not yet reloaded.
mod reloads {
    use ratelimit_tower::config::{ConfigErrorKind, Format, ReloadableRules};

    use super::*;

    fn keyed_by(policy: &str, header: &str) -> String {
        format!(
            r#"
            [policies.{policy}]
            algorithm = "fixed-window"
            limit = 2
            window = "1000d"

            [[rules]]
            policy = "{policy}"
            key = "header:{header}"
            "#
        )
    }

    #[tokio::test]
    async fn a_reload_cannot_key_a_policy_in_force_by_another_header() {
        let store = MemoryStore::new();
        let in_force = || Config::from_toml(&keyed_by("per-client", "x-tenant")).expect("valid");
        let (first, second) = (
            ReloadableRules::new(in_force()),
            ReloadableRules::new(in_force()),
        );
        let reloaded = RateLimitLayer::with_rules(store.clone(), first.clone()).layer(ok_service());
        let not_yet = RateLimitLayer::with_rules(store, second).layer(ok_service());

        // The first instance reloads; the second has not yet.
        let reload = first.reload_from_str(&keyed_by("per-client", "x-api-key"), Format::Toml);
        let as_api_key = || request("198.51.100.66:4000", &[("x-api-key", b"acme")]);
        let as_tenant = || request("192.0.2.7:4000", &[("x-tenant", b"acme")]);
        statuses(&reloaded, 2, as_api_key).await;
        assert_eq!(
            statuses(&not_yet, 2, as_tenant).await,
            [200, 200],
            "the tenant keeps its budget"
        );
        let error = reload.expect_err("refused");
        assert_eq!(error.kind(), ConfigErrorKind::Rule, "{error}");
        assert!(error.to_string().contains("rules[0].key"), "{error}");
        assert!(first.current().policy("per-client").is_some());

        // A new header under a new name is a new limit: accepted.
        first
            .reload_from_str(&keyed_by("per-api-key", "x-api-key"), Format::Toml)
            .expect("a renamed policy");
    }
}
