//! `RateLimitLayer` with `tower-test`: keys, costs, rejections, failure policy.

use std::future::{Ready, ready};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use ratelimit_core::clock::ManualClock;
use ratelimit_core::{Check, Decision, MemoryStore, PermitId, Policy, Store, StoreError};
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

    // Without the header the rule does not apply by default...
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let mut service =
        RateLimitLayer::new(store(), per_ten_seconds(1), extractor.clone()).layer(mock);
    for _ in 0..3 {
        let (r, reached) = send(&mut service, &mut handle, Request::new("")).await;
        assert!(reached);
        assert_eq!(r.status(), StatusCode::OK);
    }
    // ...or rejects, when configured so.
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let mut service = RateLimitLayer::new(store(), per_ten_seconds(1), extractor)
        .on_missing_key(MissingKey::Reject)
        .layer(mock);
    let (r, reached) = send(&mut service, &mut handle, Request::new("")).await;
    assert!(!reached);
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// A store that is always down.
#[derive(Clone)]
struct DownStore;

fn down() -> StoreError {
    StoreError::Backend("connection refused".into())
}

impl Store for DownStore {
    type CheckFuture = Ready<Result<Decision, StoreError>>;
    type CheckAllFuture = Ready<Result<Vec<Decision>, StoreError>>;
    type ReleaseFuture = Ready<Result<(), StoreError>>;

    fn check(&self, _: &[u8], _: &Policy, _: u64) -> Self::CheckFuture {
        ready(Err(down()))
    }

    fn check_all(&self, _: &[Check<'_>]) -> Self::CheckAllFuture {
        ready(Err(down()))
    }

    fn release(&self, _: &[u8], _: &Policy, _: PermitId) -> Self::ReleaseFuture {
        ready(Err(down()))
    }
}

#[tokio::test]
async fn store_failures_follow_the_failure_policy() {
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let mut open = RateLimitLayer::new(DownStore, per_ten_seconds(1), GlobalKey::default())
        .on_failure(FailurePolicy::Open)
        .layer(mock);
    for _ in 0..3 {
        let (r, reached) = send(&mut open, &mut handle, Request::new("")).await;
        assert!(reached);
        assert_eq!(r.status(), StatusCode::OK);
    }

    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let mut closed = RateLimitLayer::new(DownStore, per_ten_seconds(1), GlobalKey::default())
        .on_failure(FailurePolicy::Closed)
        .layer(mock);
    let (r, reached) = send(&mut closed, &mut handle, Request::new("")).await;
    assert!(!reached);
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
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

/// A body fed through a channel: it ends when the sender is dropped.
struct ChannelBody(tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl http_body::Body for ChannelBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(http_body::Frame::data(c))))
    }
}

#[tokio::test]
async fn a_streaming_response_holds_its_concurrency_permit_until_the_body_ends() {
    use tower::ServiceExt as _;
    let senders = Arc::new(std::sync::Mutex::new(Vec::new()));
    let inner = {
        let senders = senders.clone();
        tower::service_fn(move |_req: Request<&'static str>| {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            senders.lock().unwrap().push(tx);
            async move { Ok::<_, std::convert::Infallible>(Response::new(ChannelBody(rx))) }
        })
    };
    let policy = Policy::concurrency(1, Duration::from_secs(60)).unwrap();
    let service = RateLimitLayer::new(store(), policy, GlobalKey::default()).layer(inner);

    let first = service.clone().oneshot(Request::new("")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    // The response future has resolved, but its body is still streaming.
    let second = service.clone().oneshot(Request::new("")).await.unwrap();
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);

    let tx = senders.lock().unwrap().remove(0);
    tx.send(bytes::Bytes::from_static(b"chunk")).await.unwrap();
    drop(tx);
    let body = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"chunk");
    // The body ended: the slot is free again.
    let third = service.clone().oneshot(Request::new("")).await.unwrap();
    assert_eq!(third.status(), StatusCode::OK);
    // Dropping a body before its end frees the slot too.
    drop(third);
    let fourth = service.clone().oneshot(Request::new("")).await.unwrap();
    assert_eq!(fourth.status(), StatusCode::OK);
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
