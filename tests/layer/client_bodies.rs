//! A client's layer (`RateLimitLayer::for_http_client`) and the bodies that
//! hold concurrency permits: a body keeps its slot while it can still
//! stream (after an error frame too), frees it at the end a consumer sees
//! (`None`) or when dropped, never on its word alone;
//! every refusal is an error.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::ready;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use ratelimit_core::clock::ManualClock;
use ratelimit_core::{MemoryStore, Policy, Store, StoreError};
use ratelimit_tests::faulty::Faulty;
use ratelimit_tests::named;
use ratelimit_tower::body::ResponseBody;
use ratelimit_tower::{FailurePolicy, GlobalKey, HeaderKey, RateLimitLayer, Rejection};
use tokio::sync::mpsc;
use tower::{BoxError, Layer, Service, ServiceExt, service_fn};

pub(super) fn still() -> MemoryStore<ManualClock> {
    MemoryStore::builder().clock(ManualClock::new(0)).build()
}

pub(super) fn one_at_a_time() -> Policy {
    named("downloads", Policy::concurrency(1, Duration::from_secs(60)))
}

/// What a scripted body does next.
pub(super) enum Step {
    Data(&'static str),
    /// A trailers frame, after which the body reports its end.
    Trailers,
    /// A data frame after which the body says it has ended, though it may
    /// go on (a body that breaks http-body's contract).
    SaysEnded(&'static str),
    /// An error frame (not necessarily the last: the script goes on).
    Fail,
}

/// A body whose frames are sent by the test, one step at a time.
pub(super) struct Scripted {
    rx: mpsc::UnboundedReceiver<Step>,
    ended: bool,
    says_ended: bool,
}

impl Body for Scripted {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        match std::task::ready!(self.rx.poll_recv(cx)) {
            None => Poll::Ready(None),
            Some(Step::Data(s)) => {
                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(s.as_bytes())))))
            }
            Some(Step::Trailers) => {
                self.ended = true;
                let mut trailers = HeaderMap::new();
                trailers.insert("x-checksum", HeaderValue::from_static("abc"));
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
            Some(Step::SaysEnded(s)) => {
                self.says_ended = true;
                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(s.as_bytes())))))
            }
            Some(Step::Fail) => Poll::Ready(Some(Err(std::io::Error::other("stream reset")))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.says_ended
    }
}

type Scripts = Arc<Mutex<VecDeque<mpsc::UnboundedSender<Step>>>>;

/// An "HTTP client" whose every response body is scripted; the senders, in
/// call order, are in the returned queue.
fn scripted_client() -> (
    impl Service<Request<()>, Response = Response<Scripted>, Error = Infallible, Future: Send>
    + Clone
    + Send,
    Scripts,
) {
    let scripts: Scripts = Arc::default();
    let senders = scripts.clone();
    let service = service_fn(move |_req: Request<()>| {
        let (tx, rx) = mpsc::unbounded_channel();
        senders.lock().unwrap().push_back(tx);
        ready(Ok::<_, Infallible>(Response::new(Scripted {
            rx,
            ended: false,
            says_ended: false,
        })))
    });
    (service, scripts)
}

#[track_caller]
pub(super) fn refused(result: &Result<impl std::fmt::Debug, BoxError>) -> bool {
    match result {
        Ok(_) => false,
        Err(e) => {
            assert!(
                e.downcast_ref::<Rejection>().is_some(),
                "an error that is not a refusal: {e}"
            );
            true
        }
    }
}

/// A client's layer of one slot around [`scripted_client`], the body of
/// its first call (streaming, holding the slot) and that body's script.
pub(super) async fn one_body() -> (
    impl Service<Request<()>, Response = Response<ResponseBody<Scripted>>, Error = BoxError> + Clone,
    ResponseBody<Scripted>,
    mpsc::UnboundedSender<Step>,
) {
    let (inner, scripts) = scripted_client();
    let client = RateLimitLayer::new(still(), one_at_a_time(), GlobalKey::default())
        .for_http_client()
        .layer(inner);
    let first = client.clone().oneshot(Request::new(())).await.unwrap();
    let script = scripts.lock().unwrap().pop_front().unwrap();
    (client, first.into_body(), script)
}

/// http-body does not make an error frame the last one (a `StreamBody`
/// over a stream of results goes on after one): a body that failed and
/// streams on keeps its slot, so no second body streams beside it under a
/// max of 1.
#[tokio::test]
async fn a_body_that_goes_on_after_an_error_frame_keeps_its_slot() {
    let (client, mut first, script) = one_body().await;
    script.send(Step::Fail).unwrap();
    script.send(Step::Data("more of the download")).unwrap();
    assert!(first.frame().await.unwrap().is_err(), "the error frame");
    let second = client.clone().oneshot(Request::new(())).await;
    let frame = first.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "more of the download");
    assert!(
        refused(&second),
        "two bodies streamed at once under a max of 1"
    );
    // A consumer that gives up drops the body: the slot frees.
    drop(first);
    assert!(!refused(&client.oneshot(Request::new(())).await));
}

/// A body whose last frame is its trailers says it has ended: it keeps its
/// slot until it is polled to `None` or dropped (hyper drops it there), not
/// on its word, which a body may give too early.
#[tokio::test]
async fn a_body_that_says_it_ended_keeps_its_slot_until_none_or_drop() {
    let (client, mut first, script) = one_body().await;
    script.send(Step::Data("the whole file")).unwrap();
    script.send(Step::Trailers).unwrap();
    assert!(first.frame().await.unwrap().unwrap().is_data());
    assert!(first.frame().await.unwrap().unwrap().is_trailers());
    assert!(first.is_end_stream(), "the body says it has ended");
    assert!(refused(&client.clone().oneshot(Request::new(())).await));
    assert!(first.frame().await.is_none());
    let second = client.clone().oneshot(Request::new(())).await;
    assert!(
        !refused(&second),
        "a body polled to its end still held its slot"
    );
}

/// A body read to its end frees its slot, and answers `None` when polled
/// again; a body dropped on a thread outside any runtime, a response whose
/// head is kept and body dropped, and a response dropped unread free it
/// too; a failed body frees it once dropped.
#[tokio::test]
async fn bodies_free_their_slot_however_they_end() {
    let (inner, scripts) = scripted_client();
    let client = RateLimitLayer::new(still(), one_at_a_time(), GlobalKey::default())
        .for_http_client()
        .layer(inner);
    let call = || client.clone().oneshot(Request::new(()));

    // Read to the end, then polled again.
    let mut body = call().await.unwrap().into_body();
    let script = scripts.lock().unwrap().pop_front().unwrap();
    assert!(refused(&call().await));
    script.send(Step::Data("x")).unwrap();
    drop(script);
    assert!(body.frame().await.unwrap().is_ok());
    assert!(body.frame().await.is_none());
    assert!(body.frame().await.is_none(), "polled after its end");
    let next = call().await;
    assert!(!refused(&next), "freed at the end");
    drop(next);

    // Dropped on another thread, outside any runtime.
    let response = call().await.unwrap();
    assert!(refused(&call().await));
    std::thread::spawn(move || drop(response)).join().unwrap();
    let next = call().await;
    assert!(!refused(&next), "freed when dropped on a plain thread");
    drop(next);

    // The head kept, the body dropped.
    let (head, body) = call().await.unwrap().into_parts();
    assert!(refused(&call().await));
    drop(body);
    let next = call().await;
    assert!(!refused(&next), "freed with the body");
    drop((head, next));

    // Never polled, the response dropped unread.
    let response = call().await.unwrap();
    drop(response);
    let next = call().await;
    assert!(!refused(&next));
    drop(next);

    // A failed body, once dropped.
    scripts.lock().unwrap().clear();
    let mut body = call().await.unwrap().into_body();
    scripts
        .lock()
        .unwrap()
        .pop_front()
        .unwrap()
        .send(Step::Fail)
        .unwrap();
    assert!(body.frame().await.unwrap().is_err());
    drop(body);
    let next = call().await;
    assert!(!refused(&next), "freed when the failed body was dropped");
}

/// Every refusal is an error: a missing key, a cost too high, a closed
/// outage, a store error that is not an outage under an open failure
/// policy, a full store under an open policy.
#[tokio::test]
async fn every_refusal_is_an_error_never_an_answer() {
    let window = Policy::fixed_window(3, Duration::from_secs(10)).unwrap();
    assert!(matches!(
        refusal_of(RateLimitLayer::new(
            still(),
            window.clone(),
            HeaderKey::from_static("x-key")
        ))
        .await,
        Rejection::MissingKey
    ));
    let costly = RateLimitLayer::new(still(), window.clone(), GlobalKey::default())
        .cost(|_: &Request<()>| u64::MAX);
    assert!(matches!(
        refusal_of(costly).await,
        Rejection::CostTooHigh { .. }
    ));
    let closed = RateLimitLayer::new(Faulty::down(), window.clone(), GlobalKey::default())
        .on_failure(FailurePolicy::Closed);
    assert!(matches!(
        refusal_of(closed).await,
        Rejection::Unavailable(_)
    ));
    let broken = RateLimitLayer::new(
        Faulty::always(&StoreError::Backend("a script error".into())),
        window.clone(),
        GlobalKey::default(),
    )
    .on_failure(FailurePolicy::Open);
    assert!(matches!(refusal_of(broken).await, Rejection::Internal(_)));
    // A full store is no outage: refused with the failure policy open.
    let full = MemoryStore::builder()
        .max_keys(1)
        .clock(ManualClock::new(0))
        .build();
    let by_header = RateLimitLayer::new(full, window, HeaderKey::from_static("x-key"))
        .on_failure(FailurePolicy::Open)
        .for_http_client()
        .layer(empty_answers());
    let keyed = |k: &'static str| Request::builder().header("x-key", k).body(()).unwrap();
    assert!(by_header.clone().oneshot(keyed("a")).await.is_ok());
    let error = by_header.oneshot(keyed("b")).await.expect_err("refused");
    assert!(
        matches!(
            error.downcast_ref::<Rejection>(),
            Some(Rejection::Unavailable(_))
        ),
        "{error}"
    );
}

/// A service answering every request with an empty `200`.
fn empty_answers()
-> impl Service<Request<()>, Response = Response<String>, Error = Infallible, Future: Send> + Clone
{
    service_fn(|_: Request<()>| ready(Ok::<_, Infallible>(Response::new(String::new()))))
}

/// How a client's `layer` refuses a request without headers: the
/// [`Rejection`] in its error.
async fn refusal_of<St, P>(layer: RateLimitLayer<St, P>) -> Rejection
where
    St: Store + Clone,
    P: ratelimit_tower::RuleProvider<Request<()>> + Clone,
{
    let error = layer
        .for_http_client()
        .layer(empty_answers())
        .oneshot(Request::new(()))
        .await
        .expect_err("refused");
    error
        .downcast_ref::<Rejection>()
        .cloned()
        .unwrap_or_else(|| panic!("not a Rejection: {error}"))
}
