//! Hostile input through a real `RateLimitLayer` over a `MemoryStore`:
//! non-UTF-8 and oversized header values, forwarding headers of a megabyte or
//! of 10,000 entries, keys of a megabyte, costs of `u64::MAX`, and policies
//! that cannot be represented. Nothing may panic, nothing may be admitted
//! beyond its limit, and the variations of one client that the extractor
//! folds into one key never earn it more than one budget.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::header::RETRY_AFTER;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use proptest::prelude::*;
use ratelimit_core::clock::ManualClock;
use ratelimit_core::key;
use ratelimit_core::{MemoryStore, Policy, PolicyError, Rate, StoreError};
use ratelimit_tests::{every_algorithm, named, try_every_algorithm};
use ratelimit_tower::{
    ClientIp, ForwardingHeader, HeaderKey, KeyExtractor, MissingKey, NoKey, PeerAddr, PeerIp,
    RateLimitLayer, RouteKey, Rule, TrustedProxies,
};
use tower::{Layer, Service, ServiceExt};

type Req = Request<&'static str>;

const API_KEY: HeaderName = HeaderName::from_static("x-api-key");
const XFF: HeaderName = HeaderName::from_static("x-forwarded-for");
const FORWARDED: HeaderName = http::header::FORWARDED;

const HOUR: Duration = Duration::from_secs(3600);

/// The first byte of a hashed key, which no verbatim key starts with.
const HASHED_KEY_MARKER: u8 = b'#';

/// The longest span a policy covers, in µs (2^50, about 35 years), as its
/// constructors document it.
const MAX_HORIZON_MICROS: u64 = 1 << 50;

fn store() -> MemoryStore<ManualClock> {
    MemoryStore::builder().clock(ManualClock::new(0)).build()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime")
}

/// The inner service: 200, counting the requests that reach it.
#[derive(Debug, Clone, Default)]
struct Counting(Arc<AtomicUsize>);

impl Service<Req> for Counting {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Req) -> Self::Future {
        self.0.fetch_add(1, Ordering::SeqCst);
        ready(Ok(Response::new(String::from("ok"))))
    }
}

/// What became of a batch of requests.
#[derive(Debug)]
struct Outcome {
    statuses: Vec<StatusCode>,
    /// Whether each response had a `Retry-After`.
    retry_after: Vec<bool>,
    /// Requests that reached the inner service.
    hits: usize,
}

impl Outcome {
    fn admitted(&self) -> usize {
        self.statuses
            .iter()
            .filter(|s| **s == StatusCode::OK)
            .count()
    }
}

/// Sends `requests`, one after another, through `layer` over a counting
/// inner service. Every response must be 200 or 429, or 500 for a request
/// without a peer address under a peer or client IP key.
fn send_all<L>(layer: &L, requests: Vec<Req>) -> Outcome
where
    L: Layer<Counting>,
    L::Service:
        Service<Req, Response = Response<ratelimit_tower::body::ResponseBody<String>>> + Clone,
    <L::Service as Service<Req>>::Error: std::fmt::Debug,
{
    let inner = Counting::default();
    let hits = inner.0.clone();
    let service = layer.layer(inner);
    let mut statuses = Vec::new();
    let mut retry_after = Vec::new();
    // Responses (and so concurrency permits) are held until the batch ends.
    let mut held = Vec::new();
    runtime().block_on(async {
        for req in requests {
            let req_has_no_peer = req.extensions().get::<PeerAddr>().is_none();
            let response = service.clone().oneshot(req).await.expect("no error");
            let status = response.status();
            let no_peer = req_has_no_peer;
            assert!(
                status == StatusCode::OK
                    || status == StatusCode::TOO_MANY_REQUESTS
                    || (no_peer && status == StatusCode::INTERNAL_SERVER_ERROR),
                "unexpected status {status}"
            );
            retry_after.push(response.headers().contains_key(RETRY_AFTER));
            statuses.push(status);
            held.push(response);
        }
    });
    drop(held);
    let hits = hits.load(Ordering::SeqCst);
    let outcome = Outcome {
        statuses,
        retry_after,
        hits,
    };
    assert_eq!(outcome.hits, outcome.admitted(), "{outcome:?}");
    outcome
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A request from `peer` (if any) with header lines.
fn request(peer: Option<SocketAddr>, headers: &[(HeaderName, HeaderValue)]) -> Req {
    let mut req = Request::new("body");
    if let Some(peer) = peer {
        req.extensions_mut().insert(PeerAddr(peer));
    }
    for (name, value) in headers {
        req.headers_mut().append(name.clone(), value.clone());
    }
    req
}

fn peer(s: &str) -> Option<SocketAddr> {
    Some(SocketAddr::new(ip(s), 40_000))
}

/// `bytes` as a header value: the bytes a header may not hold (controls other
/// than tab, and DEL) are moved into the printable range; everything else,
/// including non-UTF-8 bytes, is kept.
fn header_value(bytes: &[u8]) -> HeaderValue {
    let cleaned: Vec<u8> = bytes
        .iter()
        .map(|&b| match b {
            b'\t' => b,
            0..=0x1f => b | 0x40,
            0x7f => b'~',
            _ => b,
        })
        .collect();
    HeaderValue::from_bytes(&cleaned).expect("only valid header bytes are left")
}

fn trusted_proxies() -> TrustedProxies {
    TrustedProxies::parse(["10.0.0.0/8", "2001:db8:ffff::/48"]).unwrap()
}

fn fixed(limit: u64) -> Policy {
    Policy::fixed_window(limit, HOUR).unwrap()
}

fn repeat(req: impl Fn() -> Req, n: usize) -> Vec<Req> {
    (0..n).map(|_| req()).collect()
}

// ---------------------------------------------------------------------------
// Tables: oversized and malformed headers.

#[test]
fn a_64_kib_api_key_and_a_non_utf8_one_are_limited_like_any_other() {
    let huge = header_value(&vec![b'k'; 64 * 1024]);
    let binary = header_value(&(0x80..=0xff).collect::<Vec<u8>>());
    for value in [huge, binary] {
        let store = store();
        let layer = RateLimitLayer::new(store.clone(), fixed(2), HeaderKey::new(API_KEY));
        let outcome = send_all(
            &layer,
            repeat(|| request(None, &[(API_KEY, value.clone())]), 5),
        );
        assert_eq!(outcome.admitted(), 2, "{outcome:?}");
        assert_eq!(store.len(), 1);
        // The key a store sees is a hash, never the value.
        let key = HeaderKey::new(API_KEY)
            .extract(&request(None, &[(API_KEY, value.clone())]))
            .unwrap();
        assert_eq!(key.as_bytes().len(), 33);
        assert_eq!(key.as_bytes()[0], HASHED_KEY_MARKER);
    }
}

#[test]
fn a_grpc_binary_key_written_padded_and_unpadded_is_one_budget() {
    const KEY_BIN: HeaderName = HeaderName::from_static("x-api-key-bin");
    let store = store();
    let layer = RateLimitLayer::new(store.clone(), fixed(3), HeaderKey::new(KEY_BIN));
    // "secret!" (7 bytes) in base64: padded, unpadded, half padded, in turn.
    let spellings = ["c2VjcmV0IQ==", "c2VjcmV0IQ", "c2VjcmV0IQ="];
    let requests = (0..9)
        .map(|i| {
            let value = HeaderValue::from_static(spellings[i % 3]);
            request(None, &[(KEY_BIN, value)])
        })
        .collect();
    let outcome = send_all(&layer, requests);
    assert_eq!(outcome.admitted(), 3, "one value, one budget: {outcome:?}");
    assert_eq!(store.len(), 1);

    // Values that are not base64 (or not in its one canonical spelling) have
    // no key: refused, by default, as an absent header.
    for bad in [
        "not base64!",
        "c2VjcmV0IR",
        "c2Vj cmV0IQ",
        "c2VjcmV0IQ,c2Vj",
        "====",
    ] {
        let req = request(None, &[(KEY_BIN, HeaderValue::from_static(bad))]);
        assert_eq!(
            HeaderKey::new(KEY_BIN).try_extract(&req).map(|_| ()),
            Err(NoKey::Absent),
            "{bad:?}"
        );
        let outcome = send_all(
            &RateLimitLayer::new(store.clone(), fixed(3), HeaderKey::new(KEY_BIN)),
            vec![req],
        );
        assert_eq!(outcome.admitted(), 0, "{bad:?}: {outcome:?}");
    }
    assert_eq!(store.len(), 1, "a bad value takes no room");
}

#[test]
fn oversized_forwarding_headers_from_a_trusted_proxy_are_walked_from_the_right() {
    let mib = 1 << 20;
    // One entry of a megabyte, a megabyte of entries, 10,000 entries.
    let one_entry = header_value(&vec![b'1'; mib]);
    let many: String = std::iter::repeat_n("198.51.100.1, ", mib / 14).collect();
    let many = header_value(many.trim_end_matches([',', ' ']).as_bytes());
    let ten_thousand: Vec<String> = (0..10_000)
        .map(|i| format!("10.{}.{}.{}", i / 65_536, (i / 256) % 256, i % 256))
        .collect();
    let ten_thousand = header_value(ten_thousand.join(", ").as_bytes());
    let forwarded: String = std::iter::repeat_n("for=198.51.100.1, ", mib / 18).collect();
    let forwarded = header_value(forwarded.trim_end_matches([',', ' ']).as_bytes());
    let unterminated = header_value(format!("for=\"{}", "9".repeat(mib)).as_bytes());

    // Over max_header_bytes (8 KiB): still walked from the right. A
    // malformed entry (over 1 KiB) stops the walk at the last trusted hop
    // (here the peer); the first untrusted address is the client. Without
    // the size cap the walk is still bounded: an entry over 1 KiB is
    // malformed, and at most 64 entries are read: of 10,000 trusted ones,
    // 9999 down to 9936, the 64th, the last trusted one read, is the result.
    let cases = [
        ("1 MiB entry", (XFF, one_entry), "10.0.0.1"),
        ("1 MiB of entries", (XFF, many), "198.51.100.1"),
        ("10,000 entries", (XFF, ten_thousand), "10.0.38.208"),
        ("1 MiB Forwarded", (FORWARDED, forwarded), "198.51.100.1"),
        ("unterminated quote", (FORWARDED, unterminated), "10.0.0.1"),
    ];
    let runs = cases.into_iter().flat_map(|(what, header, want)| {
        let capped = if header.0 == FORWARDED {
            behind_forwarded()
        } else {
            behind()
        };
        let uncapped = capped.clone().max_header_bytes(usize::MAX);
        [
            (what.to_owned(), capped, header.clone(), want),
            (format!("{what}, uncapped"), uncapped, header, want),
        ]
    });
    for (what, client_ip, header, want) in runs {
        let make = || request(peer("10.0.0.1"), std::slice::from_ref(&header));
        let started = Instant::now();
        for _ in 0..100 {
            assert_eq!(client_ip.client_ip(&make()), Some(ip(want)), "{what}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{what}: 100 extractions took {:?}",
            started.elapsed()
        );
        let layer = RateLimitLayer::new(store(), fixed(3), client_ip);
        let outcome = send_all(&layer, repeat(make, 6));
        assert_eq!(outcome.admitted(), 3, "{what}: {outcome:?}");
    }
}

#[test]
fn an_oversized_forwarding_header_keys_the_client_its_proxy_appended() {
    // Each client writes 9 KiB of spoofed entries (over the old 8 KiB cap);
    // the trusted proxy appends the address it saw. The walk from the right
    // finds that address first: the client is keyed, never the proxy, so no
    // client drains the proxy's shared bucket.
    let spoofed: String = std::iter::repeat_n("198.51.100.1, ", 9 * 1024 / 14).collect();
    let store = store();
    let layer = RateLimitLayer::new(store.clone(), fixed(3), behind());
    for client in ["203.0.113.1", "203.0.113.2", "203.0.113.3"] {
        let header = (XFF, header_value(format!("{spoofed}{client}").as_bytes()));
        let make = || request(peer("10.0.0.1"), std::slice::from_ref(&header));
        assert_eq!(behind().client_ip(&make()), Some(ip(client)));
        let outcome = send_all(&layer, repeat(make, 5));
        assert_eq!(outcome.admitted(), 3, "{client}: {outcome:?}");
    }
    // The same through `Forwarded`.
    let spoofed: String = std::iter::repeat_n("for=198.51.100.1, ", 9 * 1024 / 18).collect();
    let header = (
        FORWARDED,
        header_value(format!("{spoofed}for=203.0.113.4").as_bytes()),
    );
    let req = request(peer("10.0.0.1"), std::slice::from_ref(&header));
    assert_eq!(behind_forwarded().client_ip(&req), Some(ip("203.0.113.4")));
}

/// Behind proxies that append to X-Forwarded-For.
fn behind() -> ClientIp {
    ClientIp::trusting(trusted_proxies(), ForwardingHeader::XForwardedFor)
}

/// Behind proxies that append to Forwarded.
fn behind_forwarded() -> ClientIp {
    ClientIp::trusting(trusted_proxies(), ForwardingHeader::Forwarded)
}

fn uncapped() -> ClientIp {
    behind().max_header_bytes(usize::MAX)
}

#[test]
fn non_utf8_forwarding_entries_stop_the_walk_at_the_last_trusted_hop() {
    let cases: &[(&[u8], &str)] = &[
        (b"203.0.113.9, \xff\xfe", "10.0.0.1"),
        (b"\xff, 203.0.113.9", "203.0.113.9"),
        (b"203.0.113.9, \xc0\xaf, 10.0.0.7", "10.0.0.7"),
        (b"\x80", "10.0.0.1"),
    ];
    for (value, want) in cases {
        let header = (XFF, header_value(value));
        let req = request(peer("10.0.0.1"), std::slice::from_ref(&header));
        assert_eq!(behind().client_ip(&req), Some(ip(want)), "{value:?}");
    }
}

#[test]
fn a_key_of_a_megabyte_is_hashed_and_limited_exactly() {
    let store = store();
    let extractor = |req: &Req| -> Option<Vec<u8>> {
        let last = req.headers().get("x-last")?.as_bytes()[0];
        let mut key = vec![b'x'; 1 << 20];
        key.push(last);
        Some(key)
    };
    let layer = RateLimitLayer::new(store.clone(), fixed(2), extractor);
    let with_last = |b: &'static str| {
        move || {
            request(
                None,
                &[(
                    HeaderName::from_static("x-last"),
                    HeaderValue::from_static(b),
                )],
            )
        }
    };
    let a = send_all(&layer, repeat(with_last("a"), 4));
    let b = send_all(&layer, repeat(with_last("b"), 4));
    // Keys that differ in their last byte of a megabyte are different keys.
    assert_eq!((a.admitted(), b.admitted()), (2, 2));
    assert_eq!(store.len(), 2);
    let normalized = key::normalize(&[b'x'; 1 << 20]);
    assert_eq!(normalized.len(), 33);
}

#[test]
fn a_cost_of_u64_max_is_refused_without_retry_after_on_every_algorithm() {
    for policy in every_algorithm(5, HOUR, Rate::per_hour(5)) {
        for cost in [u64::MAX, u64::MAX - 1, 1 << 63, 6] {
            let store = store();
            let layer = RateLimitLayer::new(store.clone(), policy.clone(), PeerIp)
                .cost(move |_req: &Req| cost);
            let outcome = send_all(&layer, repeat(|| request(peer("192.0.2.1"), &[]), 3));
            assert_eq!(outcome.admitted(), 0, "{} cost {cost}", policy.name());
            assert!(
                outcome.retry_after.iter().all(|r| !r),
                "waiting cannot help: no Retry-After ({})",
                policy.name()
            );
            assert!(store.is_empty(), "nothing is stored for a refused cost");
            assert!(matches!(
                store.check_now(b"k", &policy, cost),
                Err(StoreError::CostExceedsLimit { .. })
            ));
        }
        // The most a policy admits at once still passes, once.
        let store = store();
        let limit = policy.limit();
        let layer = RateLimitLayer::new(store, policy.clone(), PeerIp).cost(move |_: &Req| limit);
        let outcome = send_all(&layer, repeat(|| request(peer("192.0.2.1"), &[]), 3));
        assert_eq!(outcome.admitted(), 1, "{}", policy.name());
    }
}

#[test]
fn zero_and_overflowing_configurations_are_typed_errors() {
    const S: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::MAX;
    const ZERO: Duration = Duration::ZERO;
    const SUB_MICRO: Duration = Duration::from_nanos(999);
    type Build = fn() -> Result<Policy, PolicyError>;
    type Kind = fn(&PolicyError) -> bool;
    // Each error kind with the configurations that must meet it.
    let cases: [(Kind, &[(&str, Build)]); 5] = [
        (
            is_zero_limit,
            &[
                ("fixed 0", || Policy::fixed_window(0, S)),
                ("log 0", || Policy::sliding_window_log(0, S)),
                ("counter 0", || Policy::sliding_window_counter(0, S)),
                ("bucket 0", || Policy::token_bucket(0, Rate::per_second(1))),
                ("bucket rate 0", || Policy::token_bucket(1, Rate::new(0, S))),
                ("gcra 0", || Policy::gcra(0, Rate::per_second(1))),
                ("leaky 0", || Policy::leaky_bucket(0, Rate::per_second(1))),
                ("concurrency 0", || Policy::concurrency(0, S)),
            ],
        ),
        (
            is_zero_window,
            &[
                ("fixed zero window", || Policy::fixed_window(1, ZERO)),
                ("fixed 999ns", || Policy::fixed_window(1, SUB_MICRO)),
                ("bucket period 0", || {
                    Policy::token_bucket(1, Rate::new(1, ZERO))
                }),
                ("leaky > 1/us", || {
                    Policy::leaky_bucket(1, Rate::new(u64::MAX, SUB_MICRO))
                }),
                ("concurrency zero lease", || Policy::concurrency(1, ZERO)),
            ],
        ),
        (
            is_unrepresentable,
            &[
                ("fixed MAX window", || Policy::fixed_window(1, MAX)),
                ("fixed u64::MAX", || Policy::fixed_window(u64::MAX, S)),
                ("log MAX", || Policy::sliding_window_log(u64::MAX, MAX)),
                ("counter MAX window", || {
                    Policy::sliding_window_counter(1, MAX)
                }),
                ("counter product", || {
                    Policy::sliding_window_counter(1 << 40, HOUR)
                }),
                ("bucket MAX period", || {
                    Policy::token_bucket(1, Rate::new(1, MAX))
                }),
                ("bucket u64::MAX", || {
                    Policy::token_bucket(u64::MAX, Rate::per_second(1))
                }),
                ("bucket horizon", || {
                    Policy::token_bucket(1 << 40, Rate::per_hour(1))
                }),
                ("gcra u64::MAX", || {
                    Policy::gcra(u64::MAX, Rate::new(u64::MAX, MAX))
                }),
                ("leaky horizon", || {
                    Policy::leaky_bucket(1 << 39, Rate::per_hour(1))
                }),
                ("concurrency MAX lease", || Policy::concurrency(1, MAX)),
            ],
        ),
        (
            is_rate_too_high,
            &[
                ("bucket > 1/us", || {
                    Policy::token_bucket(1, Rate::new(1_000_001, S))
                }),
                ("bucket u64::MAX/us", || {
                    Policy::token_bucket(1, Rate::new(u64::MAX, S))
                }),
                ("gcra > 1/us", || {
                    Policy::gcra(1, Rate::new(2, Duration::from_micros(1)))
                }),
            ],
        ),
        (
            is_too_large,
            &[
                ("concurrency u64::MAX", || Policy::concurrency(u64::MAX, S)),
                // Each held permit is an entry a decision reads: a larger max
                // would make a Redis call's work grow with it.
                (
                    "concurrency 1,025 (one above the documented maximum)",
                    || Policy::concurrency(1025, S),
                ),
            ],
        ),
    ];
    for (expected, builds) in cases {
        for &(what, build) in builds {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(build))
                .unwrap_or_else(|_| panic!("{what}: panicked"));
            let error = result.expect_err(what);
            assert!(expected(&error), "{what}: {error:?}");
            assert!(!error.to_string().is_empty());
        }
    }
    // Names are checked too.
    let p = fixed(1);
    for name in ["", "a b", "{x}", "é", &"n".repeat(65), "a:b", "a\nb"] {
        assert!(
            matches!(
                p.clone().with_name(name),
                Err(PolicyError::InvalidName { .. })
            ),
            "{name:?}"
        );
    }
}

fn is_zero_limit(e: &PolicyError) -> bool {
    matches!(e, PolicyError::ZeroLimit { .. })
}
fn is_zero_window(e: &PolicyError) -> bool {
    matches!(e, PolicyError::ZeroWindow { .. })
}
fn is_too_large(e: &PolicyError) -> bool {
    matches!(e, PolicyError::TooLarge { .. })
}
fn is_unrepresentable(e: &PolicyError) -> bool {
    matches!(e, PolicyError::Unrepresentable { .. })
}
fn is_rate_too_high(e: &PolicyError) -> bool {
    matches!(e, PolicyError::RateTooHigh { .. })
}

// ---------------------------------------------------------------------------
// Properties.

/// Any bytes, mostly short; sometimes printable, so that verbatim keys come up.
fn key_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..80),
        proptest::collection::vec(0x20u8..0x7f, 0..80),
        proptest::collection::vec(
            prop_oneof![Just(b'{'), Just(b'}'), Just(b'#'), 0x21u8..0x7f],
            60..70
        ),
        proptest::collection::vec(any::<u8>(), 1000..5000),
    ]
}

fn name() -> impl Strategy<Value = String> {
    "[A-Za-z0-9._-]{1,64}"
}

/// Every stored key form: printable ASCII, no braces, bounded.
fn assert_stored_form(input: &[u8], stored: &[u8]) {
    assert!(
        stored
            .iter()
            .all(|b| (0x21..=0x7e).contains(b) && *b != b'{' && *b != b'}'),
        "{stored:?}"
    );
    // The documented rule: 1 to 64 bytes of printable ASCII without braces,
    // not starting with the marker, are kept as they are.
    let verbatim = (1..=64).contains(&input.len())
        && input[0] != HASHED_KEY_MARKER
        && input
            .iter()
            .all(|b| (0x21..=0x7e).contains(b) && *b != b'{' && *b != b'}');
    if verbatim {
        assert_eq!(stored, input);
        assert_ne!(stored[0], HASHED_KEY_MARKER);
    } else {
        assert_eq!(stored.len(), 33);
        assert_eq!(stored[0], HASHED_KEY_MARKER);
        assert!(stored[1..].iter().all(|b| b.is_ascii_hexdigit()));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_key_builder_is_bounded_printable_and_injective(
        a in key_bytes(),
        b in key_bytes(),
        prefix in name(),
        policy in name(),
        other_policy in name(),
    ) {
        let na = key::normalize(&a);
        let nb = key::normalize(&b);
        assert_stored_form(&a, &na);
        assert_stored_form(&b, &nb);
        // Distinct keys stay distinct: verbatim ones are themselves, hashed
        // ones start with a marker no verbatim key starts with.
        if a != b {
            prop_assert_ne!(&*na, &*nb);
        }
        // The store's key `<prefix>:<policy>:{<normalized>}` (its layout is
        // checked against the store's own in `redis_store`).
        let stored = format!("{prefix}:{policy}:{{{}}}", String::from_utf8_lossy(&na));
        prop_assert!(stored.len() <= 64 + 64 + 4 + 64);
        // The hash tag is the whole normalized key: every policy of one user
        // key lands in one cluster slot, and a key cannot pick another's slot
        // by smuggling braces.
        let again = format!("{prefix}:{other_policy}:{{{}}}", String::from_utf8_lossy(&na));
        prop_assert_eq!(
            ratelimit_tests::cluster_slot(stored.as_bytes()),
            ratelimit_tests::cluster_slot(again.as_bytes())
        );
        let tag = format!("{{{}}}", String::from_utf8_lossy(&na));
        prop_assert_eq!(
            ratelimit_tests::cluster_slot(stored.as_bytes()),
            ratelimit_tests::cluster_slot(tag.as_bytes())
        );
    }

    #[test]
    fn any_policy_parameters_build_or_fail_without_panicking(
        limit in prop_oneof![
            Just(0u64),
            Just(1),
            Just(u64::MAX),
            Just(1 << 40),
            Just((1 << 40) + 1),
            any::<u64>(),
            1u64..1000,
        ],
        secs in prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>(), 0u64..100_000],
        nanos in prop_oneof![Just(0u32), Just(999), Just(999_999_999), 0u32..1_000_000_000],
        amount in prop_oneof![Just(0u64), Just(1), Just(u64::MAX), any::<u64>(), 1u64..10_000_000],
        now in prop_oneof![Just(0u64), Just(1u64 << 51), 0u64..(1u64 << 52)],
    ) {
        let window = Duration::new(secs, nanos);
        let rate = Rate::new(amount, window);
        for policy in try_every_algorithm(limit, window, rate).into_iter().flatten() {
            prop_assert!(policy.limit() >= 1);
            prop_assert!(u64::try_from(policy.window().as_micros()).unwrap() <= MAX_HORIZON_MICROS);
            // A built policy decides at any time and any cost without panicking.
            let store = MemoryStore::builder().clock(ManualClock::new(now)).build();
            for cost in [0, 1, policy.limit(), policy.limit().saturating_add(1), u64::MAX] {
                let result = store.check_now(b"k", &policy, cost);
                if cost > policy.limit() {
                    let refused = matches!(result, Err(StoreError::CostExceedsLimit { .. }));
                    prop_assert!(refused);
                } else {
                    prop_assert!(result.is_ok());
                }
            }
        }
    }
}

/// Bits of forwarding headers, honest and not, to build hostile values from.
const FRAGMENTS: &[&[u8]] = &[
    b"203.0.113.9",
    b"10.0.0.1",
    b"10.0.0.2",
    b"::ffff:10.0.0.3",
    b"::ffff:203.0.113.9",
    b"[2001:db8::1]:80",
    b"2001:db8:ffff::9",
    b"[2001:db8:ffff::9]",
    b"203.0.113.9:8080",
    b"unknown",
    b"_hidden",
    b"for=",
    b"For=",
    b"for=\"",
    b"\"",
    b";",
    b",",
    b", ",
    b" ",
    b"\t",
    b"proto=https",
    b"by=10.0.0.1",
    b"for=10.0.0.1",
    b"for=\"[2001:db8:ffff::1]:443\"",
    b"\xff",
    b"\xc3\xa9",
    b"{",
    b"}",
    b"#",
    b"\\",
    b"[",
    b"]",
    b":",
    b"",
];

/// A header value: structured from fragments, or any bytes.
fn hostile_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => proptest::collection::vec(proptest::sample::select(FRAGMENTS), 0..24)
            .prop_map(|parts| parts.concat()),
        1 => proptest::collection::vec(any::<u8>(), 0..300),
        1 => proptest::collection::vec(any::<u8>(), 1000..3000),
    ]
}

/// A peer: trusted or not, IPv4, IPv6 or IPv4-mapped; sometimes none.
fn hostile_peer() -> impl Strategy<Value = Option<SocketAddr>> {
    const IPS: [&str; 8] = [
        "10.0.0.1",
        "::ffff:10.0.0.1",
        "203.0.113.9",
        "::ffff:203.0.113.9",
        "2001:db8:ffff::1",
        "2001:db8:1:2::3",
        "127.0.0.1",
        "::1",
    ];
    prop_oneof![
        9 => (proptest::sample::select(&IPS[..]), any::<u16>())
            .prop_map(|(ip, port)| Some(SocketAddr::new(ip.parse().unwrap(), port))),
        1 => Just(None),
    ]
}

/// One hostile request: a peer and lines of x-api-key, X-Forwarded-For and
/// Forwarded.
#[derive(Debug, Clone)]
struct Hostile {
    peer: Option<SocketAddr>,
    headers: Vec<(HeaderName, Vec<u8>)>,
}

impl Hostile {
    fn request(&self) -> Req {
        let headers: Vec<(HeaderName, HeaderValue)> = self
            .headers
            .iter()
            .map(|(n, v)| (n.clone(), header_value(v)))
            .collect();
        request(self.peer, &headers)
    }
}

fn hostile_request() -> impl Strategy<Value = Hostile> {
    let header = (
        proptest::sample::select(vec![API_KEY, XFF, FORWARDED]),
        hostile_value(),
    );
    (hostile_peer(), proptest::collection::vec(header, 0..5))
        .prop_map(|(peer, headers)| Hostile { peer, headers })
}

/// Sends every request (each `repeats` times, interleaved) through a layer
/// limiting `extractor`'s key to `limit`, and checks that each key got
/// exactly `min(requests, limit)` admissions and requests without a key none.
fn admitted_per_key_within_limit<K>(extractor: K, requests: &[Hostile], repeats: usize)
where
    K: KeyExtractor<Req>,
{
    const LIMIT: usize = 3;
    let mut sent = Vec::new();
    for _ in 0..repeats {
        sent.extend(requests.iter().map(Hostile::request));
    }
    let keys: Vec<Result<Vec<u8>, NoKey>> = sent
        .iter()
        .map(|r| extractor.try_extract(r).map(|k| k.as_bytes().to_vec()))
        .collect();
    let layer = RateLimitLayer::new(store(), fixed(LIMIT as u64), extractor)
        .on_missing_key(MissingKey::Reject);
    let outcome = send_all(&layer, sent);
    let mut per_key: std::collections::HashMap<&[u8], (usize, usize)> = Default::default();
    for (key, status) in keys.iter().zip(&outcome.statuses) {
        match key {
            Err(NoKey::NoPeerAddress) => assert_eq!(*status, StatusCode::INTERNAL_SERVER_ERROR),
            Err(_) => assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS),
            Ok(key) => {
                let entry = per_key.entry(key).or_default();
                entry.0 += 1;
                if *status == StatusCode::OK {
                    entry.1 += 1;
                }
            }
        }
    }
    for (key, (sent, admitted)) in per_key {
        assert_eq!(
            admitted,
            sent.min(LIMIT),
            "key {:?}",
            String::from_utf8_lossy(key)
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn arbitrary_header_bytes_never_panic_and_never_exceed_a_limit(
        requests in proptest::collection::vec(hostile_request(), 1..6),
        repeats in 1usize..5,
    ) {
        admitted_per_key_within_limit(HeaderKey::new(API_KEY), &requests, repeats);
        admitted_per_key_within_limit(behind(), &requests, repeats);
        admitted_per_key_within_limit(uncapped().ipv6_prefix(64).unwrap(), &requests, repeats);
        admitted_per_key_within_limit(
            behind().header(ForwardingHeader::Forwarded).max_hops(3),
            &requests,
            repeats,
        );
        admitted_per_key_within_limit(
            behind().header(ForwardingHeader::XForwardedFor).max_header_bytes(64),
            &requests,
            repeats,
        );
        admitted_per_key_within_limit(ClientIp::peer(), &requests, repeats);
        admitted_per_key_within_limit(PeerIp, &requests, repeats);
    }

    /// Two rules at once (all or nothing): no key of either rule is admitted
    /// beyond its own limit.
    #[test]
    fn arbitrary_headers_under_two_rules_never_exceed_either_limit(
        requests in proptest::collection::vec(hostile_request(), 1..6),
        repeats in 1usize..5,
    ) {
        let api = named("api", Policy::fixed_window(3, HOUR));
        let per_ip = named("ip", Policy::gcra(2, Rate::per_hour(1)));
        let layer = RateLimitLayer::new(store(), api, HeaderKey::new(API_KEY))
            .and(Rule::new(per_ip, behind()));
        let mut sent = Vec::new();
        for _ in 0..repeats {
            sent.extend(requests.iter().map(Hostile::request));
        }
        type Keys = (Option<Vec<u8>>, Option<Vec<u8>>);
        let keys: Vec<Keys> = sent
            .iter()
            .map(|r| {
                (
                    HeaderKey::new(API_KEY).extract(r).map(|k| k.as_bytes().to_vec()),
                    behind().extract(r).map(|k| k.as_bytes().to_vec()),
                )
            })
            .collect();
        let outcome = send_all(&layer, sent);
        let mut by_api: std::collections::HashMap<Vec<u8>, usize> = Default::default();
        let mut by_ip: std::collections::HashMap<Vec<u8>, usize> = Default::default();
        for ((api, ip), status) in keys.into_iter().zip(&outcome.statuses) {
            if *status == StatusCode::OK {
                if let Some(api) = api {
                    *by_api.entry(api).or_default() += 1;
                }
                if let Some(ip) = ip {
                    *by_ip.entry(ip).or_default() += 1;
                }
            }
        }
        prop_assert!(by_api.values().all(|&n| n <= 3), "{by_api:?}");
        prop_assert!(by_ip.values().all(|&n| n <= 2), "{by_ip:?}");
    }
}

// ---------------------------------------------------------------------------
// No bypass: variations of one client that map to one key share one budget.

/// A spoofed prefix a client may write in front of what proxies append.
fn spoof() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("1.1.1.1, ".to_owned()),
        Just("10.0.0.9, ".to_owned()),
        Just("garbage, ".to_owned()),
        Just("203.0.113.10, 2001:db8::66, ".to_owned()),
        "[0-9a-f:., ]{0,40}".prop_map(|s| format!("{s}, ")),
    ]
}

/// Ways the IPv4 client 203.0.113.9 reaches us: directly (as IPv4 or
/// IPv4-mapped IPv6, with spoofed forwarding headers that must be ignored), or
/// through trusted proxies that append to `X-Forwarded-For` or `Forwarded`.
fn ipv4_client_variation(header: ForwardingHeader) -> impl Strategy<Value = Hostile> {
    let port = any::<u16>();
    let proxy = prop_oneof![
        Just("10.0.0.1"),
        Just("::ffff:10.0.0.1"),
        Just("10.200.0.7")
    ];
    let as_written = prop_oneof![
        Just("203.0.113.9"),
        Just("::ffff:203.0.113.9"),
        Just("203.0.113.9:4711"),
        Just("[::ffff:203.0.113.9]:4711"),
    ];
    // The proxy writes the header it maintains: one or the other.
    let via_proxy = if header == ForwardingHeader::Forwarded {
        (proxy, port, as_written)
            .prop_map(|(proxy, port, written)| Hostile {
                peer: Some(SocketAddr::new(proxy.parse().unwrap(), port)),
                headers: vec![
                    (FORWARDED, b"for=198.51.100.77".to_vec()),
                    (
                        FORWARDED,
                        format!("for=\"{written}\";proto=https").into_bytes(),
                    ),
                ],
            })
            .boxed()
    } else {
        (
            proxy.clone(),
            port,
            spoof(),
            as_written.clone(),
            any::<bool>(),
        )
            .prop_map(|(proxy, port, spoof, written, two_hops)| {
                let hops = if two_hops { ", 10.0.0.2" } else { "" };
                Hostile {
                    peer: Some(SocketAddr::new(proxy.parse().unwrap(), port)),
                    headers: vec![(XFF, format!("{spoof}{written}{hops}").into_bytes())],
                }
            })
            .boxed()
    };
    prop_oneof![
        (
            prop_oneof![Just("203.0.113.9"), Just("::ffff:203.0.113.9")],
            any::<u16>(),
            spoof()
        )
            .prop_map(|(peer, port, spoof)| Hostile {
                peer: Some(SocketAddr::new(peer.parse().unwrap(), port)),
                headers: vec![
                    (XFF, format!("{spoof}10.0.0.1").into_bytes()),
                    (FORWARDED, b"for=10.0.0.2".to_vec()),
                ],
            }),
        via_proxy,
    ]
}

/// Ways a client of the IPv6 network 2001:db8:1:2::/64 reaches us, from any
/// address of its /64.
fn ipv6_client_variation(header: ForwardingHeader) -> impl Strategy<Value = Hostile> {
    let host = any::<u64>().prop_map(|low| {
        let net: u128 = 0x2001_0db8_0001_0002 << 64;
        IpAddr::from((net | u128::from(low)).to_be_bytes())
    });
    // Directly, or through a proxy that writes the header it maintains.
    (host, any::<u16>(), any::<bool>(), spoof()).prop_map(move |(host, port, direct, spoof)| {
        if direct {
            Hostile {
                peer: Some(SocketAddr::new(host, port)),
                headers: vec![(XFF, format!("{spoof}2001:db8:ffff::1").into_bytes())],
            }
        } else if header == ForwardingHeader::Forwarded {
            Hostile {
                peer: peer("10.0.0.1"),
                headers: vec![(FORWARDED, format!("for=\"[{host}]:{port}\"").into_bytes())],
            }
        } else {
            Hostile {
                peer: peer("2001:db8:ffff::1"),
                headers: vec![(XFF, format!("{spoof}[{host}]:{port}").into_bytes())],
            }
        }
    })
}

/// Sends the variations through one layer with a limit of `limit` and
/// checks that they are all one key and that exactly `min(n, limit)` pass.
fn one_budget<K: KeyExtractor<Req>>(extractor: K, variations: &[Hostile], limit: u64, want: &str) {
    let requests: Vec<Req> = variations.iter().map(Hostile::request).collect();
    for (req, variation) in requests.iter().zip(variations) {
        let key = extractor.extract(req).expect("a key");
        assert_eq!(
            String::from_utf8_lossy(key.as_bytes()),
            want,
            "{variation:?}"
        );
    }
    let n = requests.len();
    let layer = RateLimitLayer::new(store(), fixed(limit), extractor);
    let outcome = send_all(&layer, requests);
    assert_eq!(
        outcome.admitted(),
        n.min(usize::try_from(limit).unwrap()),
        "{outcome:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn variations_of_one_ipv4_client_share_one_budget(
        xff in proptest::collection::vec(ipv4_client_variation(ForwardingHeader::XForwardedFor), 1..20),
        forwarded in proptest::collection::vec(ipv4_client_variation(ForwardingHeader::Forwarded), 1..20),
        limit in 1u64..8,
    ) {
        one_budget(behind(), &xff, limit, "203.0.113.9");
        one_budget(behind().ipv6_prefix(64).unwrap(), &xff, limit, "203.0.113.9");
        one_budget(behind_forwarded(), &forwarded, limit, "203.0.113.9");
        one_budget(behind_forwarded().ipv6_prefix(64).unwrap(), &forwarded, limit, "203.0.113.9");
    }

    #[test]
    fn variations_of_one_ipv6_network_share_one_budget(
        xff in proptest::collection::vec(ipv6_client_variation(ForwardingHeader::XForwardedFor), 1..20),
        forwarded in proptest::collection::vec(ipv6_client_variation(ForwardingHeader::Forwarded), 1..20),
        limit in 1u64..8,
    ) {
        one_budget(behind().ipv6_prefix(64).unwrap(), &xff, limit, "2001:db8:1:2::/64");
        let forwarded_v6 = behind_forwarded().ipv6_prefix(64).unwrap();
        one_budget(forwarded_v6, &forwarded, limit, "2001:db8:1:2::/64");
        // PeerIp keys a direct IPv6 client by its /64 too.
        let proxy = ip("2001:db8:ffff::1");
        let direct: Vec<Hostile> = xff
            .into_iter()
            .filter(|h| h.peer.is_some_and(|p| p.ip() != proxy))
            .collect();
        if !direct.is_empty() {
            one_budget(PeerIp, &direct, limit, "2001:db8:1:2::/64");
        }
    }

    /// Without trusted proxies the peer is the client however it is written,
    /// whatever headers it sends.
    #[test]
    fn a_direct_client_cannot_escape_with_mapped_addresses_or_headers(
        mapped in proptest::collection::vec(any::<bool>(), 1..20),
        values in proptest::collection::vec(hostile_value(), 20),
        limit in 1u64..8,
    ) {
        let variations: Vec<Hostile> = mapped
            .iter()
            .zip(values)
            .enumerate()
            .map(|(i, (mapped, value))| Hostile {
                peer: peer(if *mapped { "::ffff:192.0.2.7" } else { "192.0.2.7" })
                    .map(|a| SocketAddr::new(a.ip(), u16::try_from(i).unwrap())),
                headers: vec![(XFF, value.clone()), (FORWARDED, value)],
            })
            .collect();
        one_budget(PeerIp, &variations, limit, "192.0.2.7");
        one_budget(ClientIp::peer(), &variations, limit, "192.0.2.7");
        // A trusted list that does not include the client changes nothing.
        one_budget(behind(), &variations, limit, "192.0.2.7");
    }
}

// ---------------------------------------------------------------------------
// No bypass: spellings of one path that reach one handler share one rule.

/// Spellings of `/api/items` a client may send: repeated slashes and dot
/// segments (`%2e` too), which some servers behind the layer normalise.
const API_ITEMS_SPELLINGS: &[&str] = &[
    "/api/items",
    "/api//items",
    "//api/items",
    "/api/./items",
    "/./api/items",
    "/api/other/../items",
    "/../api/items",
    "/api/%2e/items",
    "/api/other/%2E%2e/items",
    "/api///items/",
];

#[test]
fn dot_segments_and_repeated_slashes_map_to_one_route_key_and_one_rule() {
    let config = ratelimit_tower::config::Config::from_toml(
        r#"
        [policies.api]
        algorithm = "fixed-window"
        limit = 3
        window = "1h"

        [[rules]]
        policy = "api"
        key = "global"
        routes = ["/api/items"]
        "#,
    )
    .unwrap();
    for spelling in API_ITEMS_SPELLINGS {
        let req = Request::get(*spelling).body("").unwrap();
        let names: Vec<String> = config
            .limits(&req)
            .iter()
            .map(|(policy, _, _)| policy.name().to_owned())
            .collect();
        assert_eq!(names, ["api"], "{spelling}");
        let key = RouteKey.extract(&req).unwrap();
        let want: &[u8] = if spelling.ends_with("items/") {
            b"/api/items/"
        } else {
            b"/api/items"
        };
        assert_eq!(key.as_bytes(), want, "{spelling}");
    }
    // Through the layer: one budget for every spelling.
    let layer = RateLimitLayer::with_rules(store(), config.clone());
    let sent = API_ITEMS_SPELLINGS
        .iter()
        .map(|s| Request::get(*s).body("body").unwrap())
        .collect();
    assert_eq!(send_all(&layer, sent).admitted(), 3);
    // Case is left alone (axum routes on it as it is; see SECURITY.md).
    for other in ["/API/items", "/apiary/items"] {
        let req = Request::get(other).body("").unwrap();
        assert!(config.limits(&req).is_empty(), "{other}");
    }
    // An encoded slash is a slash to axum's `Path`, which may hand it to a
    // wildcard's handler: the rule covers it too.
    let req = Request::get("/api%2Fitems").body("").unwrap();
    assert_eq!(config.limits(&req).len(), 1);
}
