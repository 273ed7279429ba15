//! Fixtures of the tests that drive the layer in process: a request from a
//! client, the key extractor that reads it back, a store on a manual clock,
//! an inner service that answers `ok`, and [`answer`], which sends one
//! request through a service and reads the whole response.

use std::convert::Infallible;
use std::future::ready;
use std::net::SocketAddr;
use std::time::Duration;

use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use ratelimit_core::clock::{ManualClock, TokioClock};
use ratelimit_core::{MemoryStore, Policy, Rate};
use ratelimit_tower::{And, GlobalKey, PeerAddr, RateLimitLayer, Rule};
use tower::{Service, ServiceExt, service_fn};

/// The header [`request_from`] names the client in, and [`by_client`] reads.
pub const CLIENT_HEADER: &str = "x-client";

/// A `GET /` with an empty body from `client` (in [`CLIENT_HEADER`]).
pub fn request_from(client: &str) -> Request<String> {
    Request::builder()
        .header(CLIENT_HEADER, client)
        .body(String::new())
        .expect("a valid request")
}

/// A `GET path` with an empty body from the peer address `ip` (port 40000,
/// as the layer's `PeerAddr`) with `headers`.
pub fn request_at(path: &str, ip: &str, headers: &[(&str, &str)]) -> Request<String> {
    let mut builder = Request::get(path);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let mut request = builder.body(String::new()).expect("a valid request");
    let ip = ip.parse().expect("an IP address");
    request
        .extensions_mut()
        .insert(PeerAddr(SocketAddr::new(ip, 40_000)));
    request
}

/// The status of each of `requests`, sent in order through clones of
/// `service`.
pub async fn statuses<S, B, R>(
    service: S,
    requests: impl IntoIterator<Item = Request<B>>,
) -> Vec<u16>
where
    S: Service<Request<B>, Response = Response<R>> + Clone,
    S::Error: std::fmt::Debug,
{
    let mut statuses = Vec::new();
    for request in requests {
        let response = service
            .clone()
            .oneshot(request)
            .await
            .expect("the service answers");
        statuses.push(response.status().as_u16());
    }
    statuses
}

/// The key extractor of [`request_from`]'s requests: the client's name.
pub fn by_client(req: &Request<String>) -> Option<Vec<u8>> {
    req.headers()
        .get(CLIENT_HEADER)
        .map(|v| v.as_bytes().to_vec())
}

/// A `MemoryStore` on a manual clock at 0 that nobody advances: nothing
/// refills while a test runs.
pub fn frozen_memory() -> MemoryStore<ManualClock> {
    MemoryStore::builder().clock(ManualClock::new(0)).build()
}

/// A `MemoryStore` on tokio's clock: under a paused clock (`start_paused`),
/// time passes only as the test sleeps or advances it.
pub fn tokio_memory() -> MemoryStore<TokioClock> {
    MemoryStore::builder().clock(TokioClock::new()).build()
}

/// A `MemoryStore` on `clock` that holds at most `max_keys` keys over
/// `shards` shards.
pub fn bounded_memory(
    max_keys: usize,
    shards: usize,
    clock: &ManualClock,
) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .max_keys(max_keys)
        .shards(shards)
        .clock(clock.clone())
        .build()
}

/// A fixed window of `limit` per `window` named `name`.
pub fn fixed_window(name: &str, limit: u64, window: Duration) -> Policy {
    Policy::fixed_window(limit, window)
        .and_then(|p| p.with_name(name))
        .expect("a valid policy")
}

/// A layer of two limits on the global key.
pub type TwoGlobalLimits<St> = RateLimitLayer<St, And<Rule<GlobalKey>, Rule<GlobalKey>>>;

/// The layer of the wait-mode tests, over `store`, waiting at most `wait`:
/// a leaky bucket of one a second with 5 slots (`smooth`, returned second)
/// and a fixed window of 5 (`hourly`, returned last; its window is
/// [`crate::NO_EDGE`], so no edge restarts its count), both on the global key.
pub fn smooth_and_hourly<St>(store: St, wait: Duration) -> (TwoGlobalLimits<St>, Policy, Policy) {
    let smooth = Policy::leaky_bucket(5, Rate::per_second(1))
        .and_then(|p| p.with_name("smooth"))
        .expect("a valid policy");
    let hourly = fixed_window("hourly", 5, crate::NO_EDGE);
    let layer = RateLimitLayer::new(store, smooth.clone(), GlobalKey::default())
        .and(Rule::new(hourly.clone(), GlobalKey::default()))
        .wait(wait);
    (layer, smooth, hourly)
}

/// The inner service that answers `200 ok` to every request, whatever its
/// body.
pub fn ok_service<B>()
-> impl Service<Request<B>, Response = Response<String>, Error = Infallible, Future: Send> + Copy + Send
{
    service_fn(|_req: Request<B>| ready(Ok::<_, Infallible>(Response::new(String::from("ok")))))
}

/// A whole response: status, headers and the body as text.
#[derive(Debug)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body, read to its end.
    pub body: String,
}

impl Answer {
    /// The header `name` as text; panics naming it (and the body) when absent.
    pub fn header(&self, name: &str) -> String {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} header; body {:?}", self.body))
            .to_str()
            .expect("a text header")
            .to_owned()
    }
}

/// Sends `request` through `service` (`&mut service` to keep it) and reads
/// the whole response.
pub async fn answer<S, B>(service: S, request: Request<String>) -> Answer
where
    S: Service<Request<String>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let response = service.oneshot(request).await.expect("the service answers");
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.expect("the body").to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(bytes.to_vec()).expect("a UTF-8 body"),
    }
}

/// A body fed through a channel: it streams what is sent and ends when the
/// sender is dropped.
#[derive(Debug)]
pub struct ChannelBody(pub tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl http_body::Body for ChannelBody {
    type Data = bytes::Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(http_body::Frame::data(c))))
    }
}

/// A small deterministic generator (xorshift64*), so a failing random test
/// replays from its seed.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// An index into a slice of `len` items.
    pub fn index(&mut self, len: usize) -> usize {
        usize::try_from(self.below(len as u64)).unwrap_or(0)
    }
}
