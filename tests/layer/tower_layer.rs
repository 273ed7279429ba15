//! `RateLimitLayer` with `tower-test`: keys, costs, rejections, failure policy.

use std::future::{Ready, ready};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use ratelimit_core::clock::{ManualClock, TokioClock};
use ratelimit_core::{AdminStore, MemoryStore, Policy, StoreError};
use ratelimit_tests::faulty::Faulty;
use ratelimit_tests::fixtures::{ChannelBody, fixed_window};
use ratelimit_tests::named;
use ratelimit_tower::{
    Decisions, FailurePolicy, GlobalKey, HeaderKey, KeyExtractor, MissingKey, PeerAddr, PeerIp,
    RateLimitLayer,
};
use tower::{Layer, Service, ServiceExt};
use tower_test::mock;

type Mock = mock::Mock<Request<&'static str>, Response<String>>;
type Handle = mock::Handle<Request<&'static str>, Response<String>>;

fn store() -> MemoryStore<ManualClock> {
    MemoryStore::builder().clock(ManualClock::new(0)).build()
}

fn per_ten_seconds(limit: u64) -> Policy {
    Policy::fixed_window(limit, Duration::from_secs(10)).unwrap()
}

fn from(ip: [u8; 4]) -> Request<&'static str> {
    let mut req = Request::new("body");
    req.extensions_mut()
        .insert(PeerAddr(SocketAddr::from((ip, 4000))));
    req
}

async fn body_text<B: http_body::Body>(response: Response<B>) -> String
where
    B::Error: std::fmt::Debug,
{
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Sends `req` through `service`, answering from the mock with 200 "ok" if it
/// gets there. Returns the status and whether the inner service was reached.
async fn send<S>(
    service: &mut S,
    handle: &mut Handle,
    req: Request<&'static str>,
) -> (Response<String>, bool)
where
    S: tower::Service<
            Request<&'static str>,
            Response = Response<ratelimit_tower::body::ResponseBody<String>>,
        >,
    S::Error: std::fmt::Debug,
{
    handle.allow(1);
    let call = service.ready().await.unwrap().call(req);
    let responder = async {
        match handle.next_request().await {
            Some((req, send)) => {
                let remaining = req
                    .extensions()
                    .get::<Decisions>()
                    .and_then(|d| d.tightest())
                    .map(|e| e.decision().remaining().to_string())
                    .unwrap_or_default();
                send.send_response(Response::new(format!("ok {remaining}")));
                true
            }
            None => false,
        }
    };
    let (response, reached) = tokio::join!(call, async {
        tokio::time::timeout(Duration::from_millis(50), responder)
            .await
            .unwrap_or(false)
    });
    let response = response.unwrap();
    let (parts, body) = response.into_parts();
    let text = body.collect().await.unwrap().to_bytes();
    (
        Response::from_parts(parts, String::from_utf8(text.to_vec()).unwrap()),
        reached,
    )
}

#[tokio::test]
async fn allows_up_to_the_limit_then_429_with_retry_after() {
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let layer = RateLimitLayer::new(store(), per_ten_seconds(2), PeerIp);
    let mut service = layer.layer(mock);

    let (r, reached) = send(&mut service, &mut handle, from([192, 0, 2, 1])).await;
    assert!(reached);
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.body(), "ok 1", "decision visible to the inner service");
    let (r, _) = send(&mut service, &mut handle, from([192, 0, 2, 1])).await;
    assert_eq!(r.body(), "ok 0");

    let (r, reached) = send(&mut service, &mut handle, from([192, 0, 2, 1])).await;
    assert!(!reached, "a denied request never reaches the inner service");
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["retry-after"], "10");

    // Another client has its own budget.
    let (r, reached) = send(&mut service, &mut handle, from([192, 0, 2, 2])).await;
    assert!(reached);
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn ipv4_mapped_ipv6_peers_share_the_ipv4_key() {
    let req = {
        let mut req = Request::new("");
        req.extensions_mut()
            .insert(PeerAddr("[::ffff:192.0.2.9]:80".parse().unwrap()));
        req
    };
    let key = PeerIp.extract(&req).unwrap();
    assert_eq!(key.as_bytes(), b"192.0.2.9");
}

#[tokio::test]
async fn costs_come_from_the_request() {
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let layer = RateLimitLayer::new(store(), per_ten_seconds(10), GlobalKey::default())
        .cost(|req: &Request<&'static str>| if req.uri().path() == "/export" { 10 } else { 1 });
    let mut service = layer.layer(mock);

    let search = || Request::get("/search").body("").unwrap();
    let export = || Request::get("/export").body("").unwrap();
    let (r, _) = send(&mut service, &mut handle, search()).await;
    assert_eq!(r.body(), "ok 9");
    // 9 left: an export (10) is denied and consumes nothing.
    let (r, _) = send(&mut service, &mut handle, export()).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let (r, _) = send(&mut service, &mut handle, search()).await;
    assert_eq!(r.body(), "ok 8");
}

#[tokio::test]
async fn a_constant_cost_is_a_number() {
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let layer = RateLimitLayer::new(store(), per_ten_seconds(25), GlobalKey::default()).cost(10);
    let mut service = layer.layer(mock);
    let (r, _) = send(&mut service, &mut handle, Request::new("")).await;
    assert_eq!(r.body(), "ok 15");
    let (r, _) = send(&mut service, &mut handle, Request::new("")).await;
    assert_eq!(r.body(), "ok 5");
    let (r, reached) = send(&mut service, &mut handle, Request::new("")).await;
    assert!(!reached);
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_header_key_falls_back_to_the_peer_ip() {
    let key = HeaderKey::from_static("x-api-key").or(PeerIp);
    let with_header = |ip: [u8; 4], api_key: &str| {
        let mut req = from(ip);
        req.headers_mut()
            .insert("x-api-key", api_key.parse().unwrap());
        req
    };
    let header_only = HeaderKey::from_static("x-api-key");
    assert_eq!(
        key.try_extract(&with_header([192, 0, 2, 1], "k1")),
        header_only.try_extract(&with_header([192, 0, 2, 1], "k1"))
    );
    assert_eq!(
        key.try_extract(&from([192, 0, 2, 1])).unwrap().as_bytes(),
        b"192.0.2.1"
    );
    // Neither a header nor a peer: the fallback's reason, a wiring mistake.
    assert_eq!(
        key.try_extract(&Request::new("")),
        Err(ratelimit_tower::NoKey::NoPeerAddress)
    );

    // Through a layer: one budget per API key, else one per client IP.
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let mut service = RateLimitLayer::new(store(), per_ten_seconds(1), key).layer(mock);
    let (r, _) = send(&mut service, &mut handle, with_header([192, 0, 2, 1], "k1")).await;
    assert_eq!(r.status(), StatusCode::OK);
    let (r, _) = send(&mut service, &mut handle, from([192, 0, 2, 1])).await;
    assert_eq!(r.status(), StatusCode::OK, "the IP's budget is its own");
    let (r, _) = send(&mut service, &mut handle, from([192, 0, 2, 1])).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let (r, _) = send(&mut service, &mut handle, with_header([192, 0, 2, 1], "k2")).await;
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_cost_above_the_limit_is_refused_without_retry_after() {
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let layer = RateLimitLayer::new(store(), per_ten_seconds(3), GlobalKey::default())
        .cost(|_: &Request<&'static str>| u64::MAX);
    let mut service = layer.layer(mock);
    let (r, reached) = send(&mut service, &mut handle, Request::new("")).await;
    assert!(!reached);
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(r.headers().get("retry-after").is_none());
}

#[tokio::test]
async fn header_keys_are_hashed_and_missing_keys_follow_the_setting() {
    let extractor = HeaderKey::new(http::HeaderName::from_static("x-api-key"));
    let req = Request::builder()
        .header("x-api-key", "secret-123")
        .body("")
        .unwrap();
    let key = extractor.extract(&req).unwrap();
    assert!(!key.as_bytes().windows(6).any(|w| w == b"secret"));
    assert_eq!(key.as_bytes().len(), 33);

    // Without the header the request is refused by default (leaving the
    // header out must not lift the limit)...
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let mut service =
        RateLimitLayer::new(store(), per_ten_seconds(1), extractor.clone()).layer(mock);
    let (r, reached) = send(&mut service, &mut handle, Request::new("")).await;
    assert!(!reached);
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // ...or the rule does not apply, when configured so.
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let mut service = RateLimitLayer::new(store(), per_ten_seconds(1), extractor)
        .on_missing_key(MissingKey::Allow)
        .layer(mock);
    for _ in 0..3 {
        let (r, reached) = send(&mut service, &mut handle, Request::new("")).await;
        assert!(reached);
        assert_eq!(r.status(), StatusCode::OK);
    }
}

#[tokio::test]
async fn store_failures_follow_the_failure_policy() {
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let open_layer = RateLimitLayer::new(Faulty::down(), per_ten_seconds(1), GlobalKey::default())
        .on_failure(FailurePolicy::Open);
    let mut open = open_layer.layer(mock);
    for _ in 0..3 {
        let (r, reached) = send(&mut open, &mut handle, Request::new("")).await;
        assert!(reached);
        assert_eq!(r.status(), StatusCode::OK);
    }
    // Failing open is counted (and logged).
    assert_eq!(open_layer.stats().failed_open(), 3);
    assert_eq!(open_layer.stats().failed_closed(), 0);

    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let closed_layer =
        RateLimitLayer::new(Faulty::down(), per_ten_seconds(1), GlobalKey::default())
            .on_failure(FailurePolicy::Closed);
    let mut closed = closed_layer.layer(mock);
    let (r, reached) = send(&mut closed, &mut handle, Request::new("")).await;
    assert!(!reached);
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(closed_layer.stats().failed_closed(), 1);
}

#[tokio::test]
async fn a_full_store_never_admits_new_keys() {
    let full = MemoryStore::builder()
        .max_keys(1)
        .clock(ManualClock::new(0))
        .build();
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let mut service = RateLimitLayer::new(full, per_ten_seconds(5), PeerIp)
        .on_failure(FailurePolicy::Open)
        .layer(mock);
    let (r, _) = send(&mut service, &mut handle, from([192, 0, 2, 1])).await;
    assert_eq!(r.status(), StatusCode::OK);
    let (r, reached) = send(&mut service, &mut handle, from([192, 0, 2, 2])).await;
    assert!(
        !reached,
        "even with fail-open, a full store is not a bypass"
    );
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn poll_ready_is_the_inner_service() {
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let mut service = tower_test::mock::Spawn::new(
        RateLimitLayer::new(store(), per_ten_seconds(1), GlobalKey::default()).layer(mock),
    );
    handle.allow(0);
    assert!(service.poll_ready().is_pending());
    handle.allow(1);
    assert!(service.poll_ready().is_ready());
    let fut = service.call(Request::new("x"));
    let ((), response) = tokio::join!(
        async {
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!(*req.body(), "x");
            send.send_response(Response::new(String::from("ok")));
        },
        fut
    );
    assert_eq!(body_text(response.unwrap()).await, "ok");
}

/// Calls a layer of a concurrency limit of 1 whose inner service streams
/// every body from a channel: the slot stays taken while a body streams,
/// and frees when it ends or is dropped. `choose` picks how refusals come
/// back, and `allowed` tells an allowed call (the HTTP layer answers a
/// refusal, a client's layer returns it as an error).
async fn streamed_bodies_hold_their_slot<J, B, E>(
    choose: impl FnOnce(
        RateLimitLayer<MemoryStore<ManualClock>, Rule<GlobalKey>>,
    ) -> RateLimitLayer<MemoryStore<ManualClock>, Rule<GlobalKey>, J>,
    allowed: impl Fn(&Result<Response<B>, E>) -> bool,
) where
    J: ratelimit_tower::Reject<
            Request<&'static str>,
            Response<ChannelBody>,
            std::convert::Infallible,
            Response = Response<B>,
            Error = E,
        > + Clone,
    B: http_body::Body<Data = bytes::Bytes>,
    B::Error: std::fmt::Debug,
    E: std::fmt::Debug,
{
    let senders = Arc::new(std::sync::Mutex::new(Vec::new()));
    let inner = {
        let senders = senders.clone();
        tower::service_fn(move |_req: Request<&'static str>| {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            senders.lock().unwrap().push(tx);
            ready(Ok::<_, std::convert::Infallible>(Response::new(
                ChannelBody(rx),
            )))
        })
    };
    let policy = Policy::concurrency(1, Duration::from_secs(60)).unwrap();
    let service = choose(RateLimitLayer::new(store(), policy, GlobalKey::default())).layer(inner);

    let first = service.clone().oneshot(Request::new("")).await;
    assert!(allowed(&first), "{:?}", first.as_ref().err());
    // The response future has resolved, but its body is still streaming.
    let second = service.clone().oneshot(Request::new("")).await;
    assert!(!allowed(&second), "a second body streamed at once");

    let tx = senders.lock().unwrap().remove(0);
    tx.send(bytes::Bytes::from_static(b"chunk")).await.unwrap();
    drop(tx);
    let body = first
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(&body[..], b"chunk");
    // The body ended: the slot is free again.
    let third = service.clone().oneshot(Request::new("")).await;
    assert!(allowed(&third));
    // Dropping a body before its end frees the slot too.
    drop(third);
    let fourth = service.clone().oneshot(Request::new("")).await;
    assert!(allowed(&fourth));
}

#[tokio::test]
async fn a_streaming_response_holds_its_concurrency_permit_until_the_body_ends() {
    streamed_bodies_hold_their_slot(
        |layer| layer,
        |r| r.as_ref().unwrap().status() == StatusCode::OK,
    )
    .await;
}

/// An HTTP client's layer returns refusals as errors and, unlike a layer
/// `for_errors`, holds a permit while the downloaded body streams.
#[tokio::test]
async fn an_http_clients_download_holds_its_concurrency_permit_until_the_body_ends() {
    streamed_bodies_hold_their_slot(RateLimitLayer::for_http_client, |r| match r {
        Ok(_) => true,
        Err(e) => {
            assert!(e.downcast_ref::<Rejection>().is_some(), "{e}");
            false
        }
    })
    .await;
}

#[tokio::test]
async fn a_cancelled_request_releases_its_concurrency_permit() {
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let policy = Policy::concurrency(1, Duration::from_secs(60)).unwrap();
    let mut service = RateLimitLayer::new(store(), policy, GlobalKey::default()).layer(mock);
    handle.allow(2);
    let pending = service.ready().await.unwrap().call(Request::new("slow"));
    let mut pending = Box::pin(pending);
    // Let it take the permit and reach the inner service, then cancel it.
    assert!(futures_poll_once(pending.as_mut()).await.is_none());
    let (_req, _respond_later) = handle.next_request().await.unwrap();
    drop(pending);
    let (r, reached) = send(&mut service, &mut handle, Request::new("next")).await;
    assert!(reached, "the cancelled request's slot was freed");
    assert_eq!(r.status(), StatusCode::OK);
}

async fn futures_poll_once<F: std::future::Future + Unpin>(mut f: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

// ---- Several limits, rule providers, modes, gRPC and non-HTTP requests ----

use ratelimit_core::Rate;
use ratelimit_tests::fixtures::ok_service;
use ratelimit_tests::fixtures::{smooth_and_hourly, tokio_memory};
use ratelimit_tower::{Limits, Mode, Rejection, Rule};

#[tokio::test]
async fn several_limits_are_all_or_nothing() {
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let per_ip = fixed_window("per-ip", 2, Duration::from_secs(10));
    let global = fixed_window("global", 3, Duration::from_secs(10));
    let mut service = RateLimitLayer::new(store(), per_ip, PeerIp)
        .and(Rule::new(global, GlobalKey::default()))
        .layer(mock);
    // Two clients take the global budget of 3.
    for ip in [[192, 0, 2, 1], [192, 0, 2, 1], [192, 0, 2, 2]] {
        let (r, _) = send(&mut service, &mut handle, from(ip)).await;
        assert_eq!(r.status(), StatusCode::OK);
    }
    // A third client is within its own limit but the global one is spent.
    let (r, reached) = send(&mut service, &mut handle, from([192, 0, 2, 3])).await;
    assert!(!reached);
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = r.body();
    assert!(
        body.contains("global") && !body.contains("per-ip"),
        "{body}"
    );
}

#[tokio::test]
async fn a_rule_provider_picks_tiers_and_allowlists() {
    let free = fixed_window("free", 1, Duration::from_secs(60));
    let pro = fixed_window("pro", 3, Duration::from_secs(60));
    let rules = move |req: &Request<&'static str>| {
        let api_key = req
            .headers()
            .get("x-api-key")
            .map(|v| v.to_str().unwrap_or("").to_owned());
        let (free, pro) = (free.clone(), pro.clone());
        async move {
            // An asynchronous lookup, as a database would be.
            tokio::task::yield_now().await;
            match api_key.as_deref() {
                None => Limits::reject(),
                Some("internal") => Limits::none(),
                Some(key) if key.starts_with("pro-") => Limits::one(pro, key.to_owned(), 1),
                Some(key) => Limits::one(free, key.to_owned(), 1),
            }
        }
    };
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let mut service = RateLimitLayer::with_rules(store(), rules).layer(mock);
    let with_key = |key: &'static str| {
        Request::builder()
            .header("x-api-key", key)
            .body("")
            .unwrap()
    };
    let mut statuses = Vec::new();
    for key in ["free-1", "free-1", "pro-1", "pro-1", "pro-1", "pro-1"] {
        statuses.push(
            send(&mut service, &mut handle, with_key(key))
                .await
                .0
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 429, 200, 200, 200, 429]);
    for _ in 0..5 {
        let (r, reached) = send(&mut service, &mut handle, with_key("internal")).await;
        assert!(
            reached && r.status() == StatusCode::OK,
            "allowlisted keys bypass"
        );
    }
    let (r, reached) = send(&mut service, &mut handle, Request::new("")).await;
    assert!(!reached);
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
}

fn grpc_request() -> Request<&'static str> {
    Request::builder()
        .header("content-type", "application/grpc+proto")
        .body("")
        .unwrap()
}

#[tokio::test]
async fn grpc_requests_get_trailers_only_resource_exhausted_never_429() {
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let mut service =
        RateLimitLayer::new(store(), per_ten_seconds(1), GlobalKey::default()).layer(mock);
    let (r, reached) = send(&mut service, &mut handle, grpc_request()).await;
    assert!(reached);
    assert_eq!(r.status(), StatusCode::OK);
    let (r, reached) = send(&mut service, &mut handle, grpc_request()).await;
    assert!(!reached);
    assert_eq!(r.status(), StatusCode::OK, "never a 429 for gRPC");
    assert_eq!(r.headers()["content-type"], "application/grpc");
    assert_eq!(r.headers()["grpc-status"], "8");
    assert!(
        r.headers()["grpc-message"]
            .to_str()
            .unwrap()
            .starts_with("rate limit exceeded")
    );
    assert_eq!(r.headers()["grpc-retry-pushback-ms"], "10000");
    assert!(r.body().is_empty(), "trailers-only: no body");

    // A cost that can never pass: do not retry.
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let mut service = RateLimitLayer::new(store(), per_ten_seconds(1), GlobalKey::default())
        .cost(|_: &Request<&'static str>| 2)
        .layer(mock);
    let (r, _) = send(&mut service, &mut handle, grpc_request()).await;
    assert_eq!(r.headers()["grpc-status"], "8");
    assert_eq!(r.headers()["grpc-retry-pushback-ms"], "-1");

    // The store down and the failure policy closed: UNAVAILABLE.
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let mut service = RateLimitLayer::new(Faulty::down(), per_ten_seconds(1), GlobalKey::default())
        .on_failure(FailurePolicy::Closed)
        .layer(mock);
    let (r, _) = send(&mut service, &mut handle, grpc_request()).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["grpc-status"], "14");
}

#[tokio::test]
async fn non_http_requests_get_a_typed_error_with_the_decision() {
    let inner =
        tower::service_fn(
            |job: String| async move { Ok::<_, std::convert::Infallible>(job.len()) },
        );
    let policy = Policy::gcra(2, Rate::per_second(1)).unwrap();
    let service = RateLimitLayer::new(store(), policy, |job: &String| Some(job.clone()))
        .for_errors()
        .layer(inner);
    assert_eq!(
        service.clone().oneshot(String::from("job")).await.unwrap(),
        3
    );
    assert_eq!(
        service.clone().oneshot(String::from("job")).await.unwrap(),
        3
    );
    let error = service
        .clone()
        .oneshot(String::from("job"))
        .await
        .unwrap_err();
    let rejection = error.downcast_ref::<Rejection>().expect("a Rejection");
    let Rejection::Limited(decisions) = rejection else {
        panic!("{rejection:?}")
    };
    let denied = decisions.tightest().unwrap().decision();
    assert!(!denied.is_allowed());
    assert_eq!(denied.retry_after(), Some(Duration::from_secs(1)));
}

#[tokio::test]
async fn a_custom_rejection_replaces_the_default() {
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let mut service = RateLimitLayer::new(store(), per_ten_seconds(1), GlobalKey::default())
        .on_rejection(|rejection: &Rejection, _| {
            let mut response = Response::new(bytes::Bytes::from(format!("slow down: {rejection}")));
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            response
        })
        .layer(mock);
    send(&mut service, &mut handle, Request::new("")).await;
    let (r, _) = send(&mut service, &mut handle, Request::new("")).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.body().starts_with("slow down: rate limit exceeded"));
}

#[tokio::test(start_paused = true)]
async fn a_hanging_store_times_out_into_the_failure_policy() {
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let hanging = Faulty::hanging();
    let mut service = RateLimitLayer::new(hanging, per_ten_seconds(1), GlobalKey::default())
        // Shorter than the 50 ms the test's mock waits for a request.
        .timeout(Duration::from_millis(20))
        .on_failure(FailurePolicy::custom(|e: &StoreError| {
            matches!(e, StoreError::Timeout(_))
        }))
        .layer(mock);
    let started = tokio::time::Instant::now();
    let (r, reached) = send(&mut service, &mut handle, Request::new("")).await;
    assert!(reached, "the custom policy lets timeouts through");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(20));
    assert!(started.elapsed() < Duration::from_millis(50));
}

#[tokio::test(start_paused = true)]
async fn wait_mode_sleeps_until_allowed_or_refuses_past_max_delay() {
    let clock = ratelimit_core::clock::TokioClock::new();
    let store = MemoryStore::builder().clock(clock).build();
    let policy = Policy::gcra(1, Rate::per_second(1)).unwrap();
    let inner = ok_service();
    let service = RateLimitLayer::new(store.clone(), policy.clone(), GlobalKey::default())
        .wait(Duration::from_secs(5))
        .layer(inner);
    let started = tokio::time::Instant::now();
    for _ in 0..3 {
        let r = service.clone().oneshot(Request::new("")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    // One immediately, then one per second: about two seconds of waiting (plus jitter).
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(2), "{waited:?}");
    assert!(waited < Duration::from_millis(2_300), "{waited:?}");

    let impatient = RateLimitLayer::new(store, policy, GlobalKey::default())
        .mode(Mode::Wait {
            max_delay: Duration::from_millis(100),
        })
        .layer(inner);
    let r = impatient.oneshot(Request::new("")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn composite_and_route_keys() {
    use ratelimit_tower::{Composite, RouteKey};
    let key = Composite::new(
        RouteKey,
        HeaderKey::new(http::HeaderName::from_static("x-user")),
    );
    let req = |path: &str, user: &str| {
        Request::builder()
            .uri(path)
            .header("x-user", user.to_owned())
            .body("")
            .unwrap()
    };
    let a = key.extract(&req("/export", "alice")).unwrap();
    let b = key.extract(&req("/export", "bob")).unwrap();
    let c = key.extract(&req("/search", "alice")).unwrap();
    assert_ne!(a, b);
    assert_ne!(a, c);
    assert_eq!(a, key.extract(&req("/export", "alice")).unwrap());
    // No user, no key.
    assert!(key.extract(&Request::new("")).is_none());
}

#[tokio::test(start_paused = true)]
async fn wait_mode_refuses_a_leaky_bucket_slot_beyond_max_delay() {
    let store = tokio_memory();
    // Three units in the bucket, one per second: the third slot is 2 s away.
    let policy = Policy::leaky_bucket(3, Rate::per_second(1)).unwrap();
    let inner = ok_service();
    let service = RateLimitLayer::new(store, policy, GlobalKey::default())
        .wait(Duration::from_millis(1_500))
        .layer(inner);
    // Three callers at once: slots now, in 1 s and in 2 s.
    let (a, b, c) = tokio::join!(
        service.clone().oneshot(Request::new("")),
        service.clone().oneshot(Request::new("")),
        service.clone().oneshot(Request::new("")),
    );
    let mut statuses = [a, b, c].map(|r| r.unwrap().status().as_u16());
    statuses.sort_unstable();
    assert_eq!(
        statuses,
        [200, 200, 429],
        "the slot 2 s away is beyond 1.5 s"
    );
}

/// What the global key has left under `policy` in `store`.
fn global_remaining(store: &MemoryStore<TokioClock>, policy: &Policy) -> u64 {
    let global = GlobalKey::default().extract(&Request::new("")).unwrap();
    store
        .peek(global.as_bytes(), policy)
        .into_inner()
        .unwrap()
        .remaining()
}

/// A leaky bucket (one a second) with an hourly fixed window of 5, waiting
/// at most 100 ms: the first request passes, the next four find their slot
/// a second away and are refused, and give back the hourly unit they took.
#[tokio::test(start_paused = true)]
async fn wait_mode_refusals_give_back_every_limit_they_took() {
    let store = tokio_memory();
    let (layer, smooth, hourly) = smooth_and_hourly(store.clone(), Duration::from_millis(100));
    let service = layer.layer(ok_service());
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let r = service.clone().oneshot(Request::new("")).await.unwrap();
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, [200, 429, 429, 429, 429]);
    let remaining = |policy: &Policy| global_remaining(&store, policy);
    assert_eq!(remaining(&hourly), 4, "only the admitted request counts");
    // The leaky bucket holds only the admitted request's slot: one more
    // waits the second it takes to drain, no longer.
    assert_eq!(remaining(&smooth), 4);
    tokio::time::advance(Duration::from_secs(1)).await;
    let r = service.clone().oneshot(Request::new("")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(remaining(&hourly), 3);
}

/// A request dropped while it waits for its leaky bucket slot gives back
/// what it took, as a refused one does.
#[tokio::test(start_paused = true)]
async fn a_request_dropped_mid_wait_gives_back_what_it_took() {
    let store = tokio_memory();
    let (layer, smooth, hourly) = smooth_and_hourly(store.clone(), Duration::from_secs(5));
    let service = layer.layer(ok_service());
    let remaining = |policy: &Policy| global_remaining(&store, policy);
    let r = service.clone().oneshot(Request::new("")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // The second request's slot is a second away: it waits, and its caller
    // gives up after 300 ms.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        service.clone().oneshot(Request::new("")),
    )
    .await;
    assert!(gave_up.is_err(), "the second request was still waiting");
    assert_eq!(remaining(&hourly), 4, "the dropped request took nothing");
    assert_eq!(remaining(&smooth), 4);
}

/// Behind a `FallbackStore` whose primary is down, wait-mode refusals give
/// back what they took to the local store that decided.
#[tokio::test(start_paused = true)]
async fn wait_mode_refusals_give_back_to_the_fallback_that_decided() {
    use ratelimit_core::{CircuitBreaker, FallbackStore};
    let local = tokio_memory();
    let breaker = Arc::new(CircuitBreaker::new(1, Duration::from_secs(60)));
    let store = FallbackStore::new(Faulty::down(), local.clone(), 1, breaker);
    let smooth = named("smooth", Policy::leaky_bucket(5, Rate::per_second(1)));
    let hourly = fixed_window("hourly", 5, Duration::from_secs(3600));
    let inner = ok_service();
    let service = RateLimitLayer::new(store, smooth, GlobalKey::default())
        .and(Rule::new(hourly.clone(), GlobalKey::default()))
        .wait(Duration::from_millis(100))
        .layer(inner);
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let r = service.clone().oneshot(Request::new("")).await.unwrap();
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, [200, 429, 429, 429, 429]);
    let global = GlobalKey::default().extract(&Request::new("")).unwrap();
    let hourly_here = hourly.divided_among(1).unwrap();
    let left = local
        .peek(global.as_bytes(), &hourly_here)
        .into_inner()
        .unwrap();
    assert_eq!(left.remaining(), 4, "only the admitted request counts");
}

#[tokio::test]
async fn unlimited_and_failed_open_requests_still_carry_decisions() {
    let inner = tower::service_fn(|req: Request<&'static str>| async move {
        let seen = req.extensions().get::<Decisions>().map(|d| d.len());
        Ok::<_, std::convert::Infallible>(Response::new(format!("{seen:?}")))
    });
    let allowlisted = RateLimitLayer::with_rules(store(), |_: &Request<&'static str>| async {
        Limits::none()
    })
    .layer(inner);
    let body = body_text(allowlisted.oneshot(Request::new("")).await.unwrap()).await;
    assert_eq!(body, "Some(0)", "an empty set, not a missing one");

    let failed_open = RateLimitLayer::new(Faulty::down(), per_ten_seconds(1), GlobalKey::default())
        .on_failure(FailurePolicy::Open)
        .layer(inner);
    let body = body_text(failed_open.oneshot(Request::new("")).await.unwrap()).await;
    assert_eq!(body, "Some(0)");
}

#[tokio::test]
async fn a_custom_rejection_still_gets_retry_after_and_headers() {
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let mut service = RateLimitLayer::new(store(), per_ten_seconds(1), GlobalKey::default())
        .on_rejection(|_: &Rejection, _| Response::new(bytes::Bytes::from_static(b"custom")))
        .layer(mock);
    send(&mut service, &mut handle, Request::new("")).await;
    let (r, _) = send(&mut service, &mut handle, Request::new("")).await;
    assert_eq!(r.body(), "custom");
    assert_eq!(r.headers()["retry-after"], "10");
    assert!(r.headers().contains_key("ratelimit"));
}

#[tokio::test]
async fn a_custom_rejection_leaves_grpc_denials_trailers_only() {
    // A custom builder for one case (no tenant: 401) and the default for the
    // rest: a gRPC request over its quota still gets `RESOURCE_EXHAUSTED`,
    // never an HTTP 429 (before, the fallback was always the HTTP answer).
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let mut service = RateLimitLayer::new(store(), per_ten_seconds(1), GlobalKey::default())
        .on_rejection(|rejection: &Rejection, default| match rejection {
            Rejection::MissingKey => {
                let mut r = Response::new(bytes::Bytes::new());
                *r.status_mut() = StatusCode::UNAUTHORIZED;
                r
            }
            _ => default,
        })
        .layer(mock);
    let grpc = || {
        Request::builder()
            .header("content-type", "application/grpc")
            .body("")
            .unwrap()
    };
    send(&mut service, &mut handle, grpc()).await;
    let (r, reached) = send(&mut service, &mut handle, grpc()).await;
    assert!(!reached);
    assert_eq!(r.status(), StatusCode::OK, "trailers-only, not 429");
    assert_eq!(r.headers()["grpc-status"], "8");
    assert!(!r.headers().contains_key("retry-after"));
}

#[tokio::test]
async fn a_custom_rejection_is_given_the_response_of_the_layers_settings() {
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let mut service = RateLimitLayer::new(store(), per_ten_seconds(1), GlobalKey::default())
        .headers(ratelimit_tower::headers::RateLimitHeaders::legacy())
        .on_rejection(|_: &Rejection, mut default| {
            default.headers_mut().insert(
                "x-support",
                http::HeaderValue::from_static("ops@example.com"),
            );
            default
        })
        .layer(mock);
    send(&mut service, &mut handle, Request::new("")).await;
    let (r, _) = send(&mut service, &mut handle, Request::new("")).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["x-support"], "ops@example.com");
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert_eq!(r.headers()["retry-after"], "10");
    assert_eq!(r.headers()["x-ratelimit-limit"], "1");
    assert!(!r.headers().contains_key("ratelimit"), "legacy fields only");
    assert!(r.body().contains("quota-exceeded"));
}

/// An inner service that counts its clones.
#[derive(Debug)]
struct CountsClones(Arc<std::sync::atomic::AtomicUsize>);

impl Clone for CountsClones {
    fn clone(&self) -> Self {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        CountsClones(self.0.clone())
    }
}

impl Service<Request<&'static str>> for CountsClones {
    type Response = Response<String>;
    type Error = std::convert::Infallible;
    type Future = Ready<Result<Response<String>, std::convert::Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<&'static str>) -> Self::Future {
        ready(Ok(Response::new(String::from("ok"))))
    }
}

/// The status `service`, made ready, answers to a request from 192.0.2.1,
/// called on `service` itself (not on a clone, as `oneshot` would).
async fn call_ready<S, B>(service: &mut S) -> StatusCode
where
    S: Service<Request<&'static str>, Response = Response<B>, Error = std::convert::Infallible>,
{
    let ready = service.ready().await.unwrap();
    ready.call(from([192, 0, 2, 1])).await.unwrap().status()
}

#[tokio::test]
async fn decided_in_call_the_ready_inner_service_is_called_without_a_clone() {
    // A static rule on a store that decides in memory is decided in `call`:
    // the inner service made ready is called there, as tower_governor calls
    // it, instead of a clone going with a future (for axum's routes, a clone
    // is a boxed service). Before, every request cloned it.
    let clones = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut service = RateLimitLayer::new(store(), per_ten_seconds(2), PeerIp)
        .layer(CountsClones(clones.clone()));
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(call_ready(&mut service).await);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(clones.load(std::sync::atomic::Ordering::Relaxed), 0);

    // Rules decided later (a closure's future) still take a clone along.
    let policy = per_ten_seconds(2);
    let mut later = RateLimitLayer::with_rules(store(), move |_: &Request<&'static str>| {
        ready(ratelimit_tower::Limits::one(policy.clone(), "everyone", 1))
    })
    .layer(CountsClones(clones.clone()));
    assert_eq!(call_ready(&mut later).await, StatusCode::OK);
    assert_eq!(clones.load(std::sync::atomic::Ordering::Relaxed), 1);
}

/// One value (an API key) is one budget whichever path brings it to the
/// store: a `HeaderKey`, `Limits::one` in a rule provider, a closure, a
/// handler's `Limiter`. Each path spends one of four, then each is refused;
/// the store holds the value's hash (`Key::from`), never the value.
mod one_value_is_one_budget_through_every_path {
    use http::{Request, Response};
    use ratelimit_axum::Limiter;
    use ratelimit_core::redis::RedisStore;
    use ratelimit_core::{MemoryStore, Policy, Store};
    use ratelimit_tests::fixtures::{answer, fixed_window, ok_service};
    use ratelimit_tests::{NO_EDGE, RedisServer, redis_store};
    use ratelimit_tower::{HeaderKey, Key, Limits, RateLimitLayer};
    use tower::{Layer, Service};

    const SECRET: &str = "acme-secret-7";

    fn policy() -> Policy {
        fixed_window("per-client", 4, NO_EDGE)
    }

    fn api_key(req: &Request<String>) -> Option<Vec<u8>> {
        req.headers()
            .get("x-api-key")
            .map(|v| v.as_bytes().to_vec())
    }

    /// The status of one request with `x-api-key: SECRET` through `service`.
    async fn status<S, B>(service: S) -> u16
    where
        S: Service<Request<String>, Response = Response<B>>,
        S::Error: std::fmt::Debug,
        B: http_body::Body,
        B::Error: std::fmt::Debug,
    {
        let req = Request::get("/")
            .header("x-api-key", SECRET)
            .body(String::new())
            .unwrap();
        answer(service, req).await.status.as_u16()
    }

    /// Spends the budget of `SECRET` through every path, one unit each, and
    /// checks that every path then finds it spent.
    async fn spend_through_every_path<St>(store: St)
    where
        St: Store + Clone + Send + Sync + 'static,
    {
        let by_header =
            RateLimitLayer::new(store.clone(), policy(), HeaderKey::from_static("x-api-key"))
                .layer(ok_service());
        let by_rules = RateLimitLayer::with_rules(store.clone(), |req: &Request<String>| {
            let key = api_key(req);
            async move {
                match key {
                    Some(key) => Limits::one(policy(), key, 1),
                    None => Limits::reject(),
                }
            }
        })
        .layer(ok_service());
        let by_closure = RateLimitLayer::new(store.clone(), policy(), api_key).layer(ok_service());
        let limiter = Limiter::new(store.clone(), policy());

        assert_eq!(status(by_header.clone()).await, 200);
        assert_eq!(status(by_rules.clone()).await, 200);
        assert_eq!(status(by_closure.clone()).await, 200);
        assert!(limiter.check(SECRET.as_bytes(), 1).await.is_ok());

        assert_eq!(status(by_header).await, 429, "the header path");
        assert_eq!(status(by_rules).await, 429, "Limits::one");
        assert_eq!(status(by_closure).await, 429, "a closure");
        assert!(
            limiter.check(SECRET.as_bytes(), 1).await.is_err(),
            "Limiter"
        );

        let remaining = |key: Vec<u8>| {
            let store = store.clone();
            async move { store.check(&key, &policy(), 0).await.unwrap().remaining() }
        };
        assert_eq!(remaining(Key::from(SECRET).as_bytes().to_vec()).await, 0);
        // The value itself never reached the store.
        assert_eq!(remaining(SECRET.as_bytes().to_vec()).await, 4);
    }

    #[tokio::test]
    async fn in_memory() {
        spend_through_every_path(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn in_redis() {
        let server = RedisServer::start();
        let store: RedisStore = redis_store(server.url()).await;
        spend_through_every_path(store.clone()).await;
        let hashed = store.state_key(Key::from(SECRET).as_bytes(), &policy());
        let keys = server.cli(&["--scan", "--pattern", "ratelimit:per-client:*"]);
        // One state, under the hash (the peek of the raw value wrote none).
        assert_eq!(keys.lines().collect::<Vec<_>>(), [hashed.as_str()]);
        assert!(!keys.contains(SECRET), "{keys}");
    }
}
