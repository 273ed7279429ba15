//! `MemoryStore` under a key-rotation attack, in process (the small-scale
//! twin of `examples/memory_attack.rs`): an attacker sends far more distinct
//! keys than the store may hold.
//!
//! - The number of keys held never exceeds `max_keys`, at any sampled step.
//! - The heap the store holds stops growing once it is full.
//! - Keys already held keep exact decisions; new keys are refused with
//!   `StoreError::Full` (a 503 through the layer, even when failing open).
//! - When keys expire, they are reclaimed: the store stays under its bound
//!   and admits new keys again.
//!
//! - Deciding for a known key allocates nothing on the common paths: a
//!   client IP keyed by `PeerIp`, a header value keyed by `HeaderKey`, a
//!   short binary key. Through the layer, an allowed request on such a
//!   store is decided in `call`, without a boxed future.
//!
//! Heap bytes are counted by a counting global allocator (`cap`). Tests run
//! one at a time (a lock), so the counts are this test's own.

use std::alloc::System;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use cap::Cap;
use http::{Request, Response, StatusCode};
use ratelimit_core::clock::ManualClock;
use ratelimit_core::{MemoryStore, Policy, Rate, StoreError};
use ratelimit_tests::fixtures::bounded_memory;
use ratelimit_tests::{admits_now, named};
use ratelimit_tower::{HeaderKey, KeyExtractor, PeerAddr, PeerIp, RateLimitLayer};
use tower::{Layer, ServiceExt};

#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, usize::MAX);

/// One test at a time, so that allocation counts are not mixed.
static SERIAL: Mutex<()> = Mutex::new(());

const MAX_KEYS: usize = 10_000;
/// New keys an attack sends: ten times the bound.
const ATTEMPTED: u64 = 100_000;
const SAMPLE_EVERY: u64 = 1_000;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn key(i: u64) -> String {
    format!("client-{i}")
}

/// What an attack did.
#[derive(Debug, Default)]
struct Attack {
    full_errors: u64,
    /// The most keys held at a sampled step.
    max_held: usize,
    /// Keys that were admitted (held), a sample of them.
    admitted: Vec<u64>,
    /// The store's heap at the end.
    bytes_at_end: usize,
}

/// Sends the distinct keys `keys`, one check each (after `advance` of the
/// clock), checking the bound every `SAMPLE_EVERY` keys.
fn attack(
    store: &MemoryStore<ManualClock>,
    policy: &Policy,
    heap_before: usize,
    keys: std::ops::Range<u64>,
    advance: impl Fn(u64),
) -> Attack {
    let mut attack = Attack::default();
    for i in keys {
        advance(i);
        match store.check_now(key(i).as_bytes(), policy, 1) {
            Ok(d) => {
                assert!(d.is_allowed(), "a new key's first request: {d:?}");
                if attack.admitted.len() < 200 && i % 7 == 0 {
                    attack.admitted.push(i);
                }
            }
            Err(StoreError::Full { max_keys }) => {
                assert_eq!(max_keys, MAX_KEYS);
                attack.full_errors += 1;
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
        if i % SAMPLE_EVERY == 0 {
            let held = store.len();
            assert!(held <= MAX_KEYS, "held {held} keys at step {i}");
            attack.max_held = attack.max_held.max(held);
        }
    }
    attack.bytes_at_end = ALLOCATOR.allocated() - heap_before;
    attack
}

fn bounded_store(clock: &ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .max_keys(MAX_KEYS)
        .clock(clock.clone())
        .build()
}

/// [`ATTEMPTED`] new keys into a new [`bounded_store`], one every `every` on
/// its clock; checks that the store never held more than [`MAX_KEYS`] and
/// stayed under 400 bytes per key of the bound.
fn attack_over_time(policy: &Policy, every: Duration) -> (MemoryStore<ManualClock>, Attack) {
    let heap_before = ALLOCATOR.allocated();
    let clock = ManualClock::new(1_000_000_000);
    let store = bounded_store(&clock);
    let attack = attack(&store, policy, heap_before, 0..ATTEMPTED, |_| {
        clock.advance(every);
    });
    assert!(attack.max_held <= MAX_KEYS, "{attack:?}");
    let per_max_key = attack.bytes_at_end / MAX_KEYS;
    assert!(
        per_max_key < 400,
        "{per_max_key} bytes per key of the bound"
    );
    (store, attack)
}

#[test]
fn rotating_keys_through_long_windows_fill_the_store_and_no_more() {
    let _serial = serial();
    let limit = 5;
    let policies = [
        Policy::fixed_window(limit, Duration::from_secs(3600)).unwrap(),
        Policy::gcra(limit, Rate::per_hour(limit)).unwrap(),
        Policy::token_bucket(limit, Rate::per_hour(limit)).unwrap(),
        Policy::sliding_window_log(limit, Duration::from_secs(3600)).unwrap(),
    ];
    for policy in policies {
        let heap_before = ALLOCATOR.allocated();
        let clock = ManualClock::new(1_000_000_000);
        let store = bounded_store(&clock);
        let attack = attack(&store, &policy, heap_before, 0..ATTEMPTED, |_| {});
        let held = store.len();
        let name = policy.name();
        assert!(
            held <= MAX_KEYS && held > MAX_KEYS * 9 / 10,
            "{name}: {held}"
        );
        assert_eq!(attack.full_errors, ATTEMPTED - held as u64, "{name}");

        // Once full, refusing more keys costs no memory.
        let more = self::attack(
            &store,
            &policy,
            heap_before,
            ATTEMPTED..ATTEMPTED + ATTEMPTED / 3,
            |_| {},
        );
        assert_eq!(more.full_errors, ATTEMPTED / 3, "{name}");
        assert_eq!(store.len(), held);
        assert!(
            more.bytes_at_end <= attack.bytes_at_end + 1024,
            "{name}: {} bytes when full, {} after more keys",
            attack.bytes_at_end,
            more.bytes_at_end
        );
        let per_key = attack.bytes_at_end / held;
        assert!(per_key < 400, "{name}: {per_key} bytes per key");

        // Held keys keep exact decisions: limit - 1 more, then refused.
        for &i in &attack.admitted {
            let k = key(i);
            for n in 1..limit {
                let d = store.check_now(k.as_bytes(), &policy, 1).unwrap();
                assert!(d.is_allowed(), "{name}: {k} request {n}: {d:?}");
                assert_eq!(d.remaining(), limit - 1 - n, "{name}: {k}");
            }
            let d = store.check_now(k.as_bytes(), &policy, 1).unwrap();
            assert!(!d.is_allowed(), "{name}: {k}: {d:?}");
            assert!(d.retry_after().is_some());
        }
        // A refused key stays refused: it never gets a fresh budget.
        let refused = key(ATTEMPTED - 1);
        assert!(matches!(
            store.check_now(refused.as_bytes(), &policy, 1),
            Err(StoreError::Full { .. })
        ));
        // A peek of a new key holds nothing, so it is answered.
        assert!(admits_now(&store, b"peek", &policy, 0));
        assert!(store.len() <= MAX_KEYS);
        drop(store);
    }
}

#[test]
fn expired_keys_are_reclaimed_and_the_bound_holds() {
    let _serial = serial();
    // A one-second window; keys arrive every 200 µs, so about 5,000 (half
    // the bound) are live at any time.
    let policy = Policy::fixed_window(3, Duration::from_secs(1)).unwrap();
    let (store, attack) = attack_over_time(&policy, Duration::from_micros(200));
    assert_eq!(attack.full_errors, 0, "{attack:?}");
    // Recent keys are still exact.
    let recent = key(ATTEMPTED - 1);
    let d = store.check_now(recent.as_bytes(), &policy, 1).unwrap();
    assert_eq!((d.is_allowed(), d.remaining()), (true, 1));
}

#[test]
fn a_saturated_store_reclaims_keys_one_by_one() {
    let _serial = serial();
    // GCRA: each key expires one emission interval (100 ms) after its
    // request, so expiries are spread out. Keys arrive every 5 µs: about
    // 20,000 would be live, twice the bound.
    let policy = Policy::gcra(10, Rate::per_second(10)).unwrap();
    let (_store, attack) = attack_over_time(&policy, Duration::from_micros(5));
    // About half the keys are refused; the other half got in as older keys
    // expired.
    let admitted = ATTEMPTED - attack.full_errors;
    assert!(
        admitted > ATTEMPTED / 3 && attack.full_errors > ATTEMPTED / 3,
        "{admitted} admitted, {} refused",
        attack.full_errors
    );
}

#[test]
fn through_the_layer_a_full_store_refuses_new_clients_with_503_even_failing_open() {
    let _serial = serial();
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(full_store_through_the_layer());
}

async fn full_store_through_the_layer() {
    let store = bounded_memory(3, 1, &ManualClock::new(0));
    let policy = Policy::fixed_window(2, Duration::from_secs(60)).unwrap();
    let service = RateLimitLayer::new(store.clone(), policy, PeerIp).layer(tower::service_fn(
        |_req: Request<&'static str>| async {
            Ok::<_, std::convert::Infallible>(Response::new(String::from("ok")))
        },
    ));
    let send = |ip: [u8; 4]| {
        let service = service.clone();
        async move {
            let mut req = Request::new("");
            req.extensions_mut()
                .insert(PeerAddr(SocketAddr::from((ip, 4000))));
            service.oneshot(req).await.unwrap().status()
        }
    };
    for last in 1..=3 {
        assert_eq!(send([192, 0, 2, last]).await, StatusCode::OK);
    }
    assert_eq!(store.len(), 3);
    // A fourth client: the store is full, and admitting it unchecked would be
    // the bypass the bound exists to prevent.
    for _ in 0..3 {
        assert_eq!(
            send([198, 51, 100, 1]).await,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
    // The clients already held keep exact decisions.
    assert_eq!(send([192, 0, 2, 1]).await, StatusCode::OK);
    assert_eq!(send([192, 0, 2, 1]).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(send([192, 0, 2, 2]).await, StatusCode::OK);
    assert_eq!(store.len(), 3);
}

/// Decisions per case in the allocation test.
const DECISIONS: usize = 10_000;

/// Bytes allocated (by any thread) while `decide` runs `DECISIONS` times:
/// the least of three runs. The counter sees every thread, and the test
/// harness allocates now and then (reporting the previous test, starting
/// threads), which once landed in a run on a loaded machine; an allocation
/// of the decision itself is in every run.
fn bytes_allocated_by(mut decide: impl FnMut()) -> usize {
    (0..3)
        .map(|_| {
            let before = ALLOCATOR.total_allocated();
            for _ in 0..DECISIONS {
                decide();
            }
            ALLOCATOR.total_allocated() - before
        })
        .min()
        .unwrap_or(usize::MAX)
}

#[test]
fn a_decision_on_a_known_key_allocates_nothing() {
    let _serial = serial();
    let store = MemoryStore::new();
    let policy = Policy::gcra(1_000_000, Rate::per_second(1_000_000)).expect("valid policy");
    let mut req = Request::new(());
    req.extensions_mut()
        .insert(PeerAddr(SocketAddr::from(([203, 0, 113, 7], 443))));
    let v6 = {
        let mut req = Request::new(());
        let addr: SocketAddr = "[2001:db8:85a3::8a2e:370:7334]:443".parse().expect("valid");
        req.extensions_mut().insert(PeerAddr(addr));
        req
    };
    let header = HeaderKey::new(http::HeaderName::from_static("x-api-key"));
    let with_header = Request::builder()
        .header("x-api-key", "k-3f9a2c71d0e84b6f")
        .body(())
        .expect("valid request");
    let binary: &[u8] = &[0x00, 0xff, 0x10, 0x7b];

    let decide = |key: &[u8]| {
        let decision = store.check_now(key, &policy, 1).expect("decided");
        assert!(decision.is_allowed());
    };
    // The first decision of each key inserts it (that allocates the table).
    for request in [&req, &v6] {
        decide(PeerIp.extract(request).expect("a peer").as_bytes());
    }
    decide(header.extract(&with_header).expect("a header").as_bytes());
    decide(binary);

    // Before, every PeerIp key was `ip.to_string()` in `Bytes`, every header
    // key a `Vec` of its hash, and a binary key was hashed into a `Vec` by the
    // store: tens of bytes per decision. Less than a byte per decision is
    // room for the test harness's own threads.
    for (name, request) in [("PeerIp, IPv4", &req), ("PeerIp, IPv6", &v6)] {
        let bytes = bytes_allocated_by(|| {
            decide(PeerIp.extract(request).expect("a peer").as_bytes());
        });
        assert!(
            bytes < DECISIONS,
            "{name}: {bytes} bytes for {DECISIONS} decisions"
        );
    }
    let bytes = bytes_allocated_by(|| {
        decide(header.extract(&with_header).expect("a header").as_bytes());
    });
    assert!(
        bytes < DECISIONS,
        "HeaderKey: {bytes} bytes for {DECISIONS} decisions"
    );
    let bytes = bytes_allocated_by(|| decide(binary));
    assert!(
        bytes < DECISIONS,
        "binary key: {bytes} bytes for {DECISIONS} decisions"
    );
}

/// Bytes allocated per request by `service` on `req` (a clone of it each
/// time), the response dropped; every call must complete at once.
fn bytes_per_request<S>(service: &S, req: &Request<()>) -> usize
where
    S: tower::Service<Request<()>, Error = std::convert::Infallible> + Clone,
{
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut send = || {
        let mut request = Request::new(());
        *request.extensions_mut() = req.extensions().clone();
        let mut future = std::pin::pin!(service.clone().oneshot(request));
        match future.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(Ok(response)) => drop(response),
            _ => panic!("the layer over a memory store answers at once"),
        }
    };
    send();
    let requests = bytes_allocated_by(send);
    requests / DECISIONS
}

#[test]
fn an_allowed_request_through_the_memory_layer_allocates_no_future_and_two_exact_header_values() {
    let _serial = serial();
    let policy = named(
        "bench",
        Policy::gcra(1_000_000, Rate::per_second(1_000_000)),
    );
    let mut req = Request::new(());
    req.extensions_mut()
        .insert(PeerAddr(SocketAddr::from(([203, 0, 113, 7], 443))));
    let inner = tower::service_fn(|_req: Request<()>| async {
        let mut response = Response::new(());
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain"),
        );
        Ok::<_, std::convert::Infallible>(response)
    });
    let bare = bytes_per_request(&inner, &req);
    let layered = RateLimitLayer::new(MemoryStore::new(), policy.clone(), PeerIp);
    let with_headers = bytes_per_request(&layered.clone().layer(inner), &req);
    let without = bytes_per_request(
        &layered
            .headers(ratelimit_tower::headers::RateLimitHeaders::none())
            .layer(inner),
        &req,
    );
    // Before, every request boxed its decision's future (about 1,500
    // bytes) and collected its limit and decision into vectors: the layer
    // added 2,294 bytes per request with its headers, 2,141 without. What
    // is left: the decisions the request carries, the two header values,
    // and the metrics' labels (this crate turns the feature on).
    for (name, bytes) in [("with headers", with_headers), ("without headers", without)] {
        let added = bytes.saturating_sub(bare);
        assert!(
            added < 512,
            "{name}: the layer adds {added} bytes per request"
        );
    }
    // Each response owns its two values, of their exact sizes and nothing
    // more: `RateLimit: "bench";r=999999;t=1` and `RateLimit-Policy:
    // "bench";q=1000000;w=1`, the latter copied from the layer's cache (a
    // value shared between responses would have its count written by every
    // thread). Before, each value was a `Vec` of a guessed capacity (55
    // bytes here) turned into `Bytes` with a shared header of its own: 158
    // bytes per request.
    let exact = r#""bench";r=999999;t=1"#.len() + r#""bench";q=1000000;w=1"#.len();
    let headers = with_headers.saturating_sub(without);
    assert!(
        headers <= exact,
        "the two IETF headers add {headers} bytes per request"
    );
}
