//! Attacks on settlements after the response: what a client can get beyond
//! its budget by choosing when its requests end.
//!
//! A reservation consumes its estimate in the window (or the bucket level)
//! of the moment it is decided; a refund given back later, once that
//! window ended or the bucket refilled the reserved units, would give back
//! units a later request consumed. A client that keeps requests in flight
//! across a window's edge and cancels them (or makes them fail) after
//! spending the next window would get that window twice.
//!
//! The layer's scenarios run on a `MemoryStore` whose clock follows the
//! paused tokio clock (Unix time, for calendar periods), so the layer and
//! the store see the same time; the stores' own rule runs on memory, a
//! Redis and a Redis Cluster on one manual clock.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use ratelimit_axum::Limiter;
use ratelimit_core::clock::{Clock, ManualClock};
use ratelimit_core::multi_region::MultiRegionStore;
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{Decision, MemoryStore, Period, Policy, Rate, Settle, SettlementId, Store};
use ratelimit_tests::fixtures::{Answer, answer, by_client, request_from};
use ratelimit_tests::{
    CALL_TIMEOUT, Observed, RedisCluster, RedisServer, build, every_algorithm, named, observable,
    twin_stores,
};
use ratelimit_tower::{Key, RateLimitLayer, Rule, SettleError, Settlement};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tower::{Layer, Service, service_fn};

/// The header the inner service names a request's cost in.
const COST_HEADER: &str = "x-tokens-used";

/// How requests are keyed: their client's name (`x-client`).
type ByClient = fn(&Request<String>) -> Option<Vec<u8>>;

const SECOND: u64 = 1_000_000;
const DAY: u64 = 86_400 * SECOND;

/// A clock in Unix microseconds that follows tokio's (paused) clock from
/// `at`: the layer measures time on tokio's clock, the store on this one.
#[derive(Clone)]
struct PausedUnix {
    at: u64,
    origin: tokio::time::Instant,
}

impl PausedUnix {
    fn at(at: u64) -> Self {
        PausedUnix {
            at,
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Clock for PausedUnix {
    fn now(&self) -> u64 {
        let elapsed = u64::try_from(self.origin.elapsed().as_micros()).expect("small");
        self.at + elapsed
    }
}

/// A layer keyed by client under `policy` in `store`, reserving `estimate`
/// and settling from [`COST_HEADER`].
fn settling<St: Store + Clone>(
    store: &St,
    policy: &Policy,
    estimate: u64,
) -> RateLimitLayer<St, Rule<ByClient>> {
    RateLimitLayer::new(store.clone(), policy.clone(), by_client as ByClient)
        .cost(estimate)
        .settle(Settlement::from_static_header(COST_HEADER))
        .expect("a policy that settles")
}

/// A `MemoryStore` on a [`PausedUnix`] clock from `at`.
fn paused_store(at: u64) -> MemoryStore<PausedUnix> {
    MemoryStore::builder().clock(PausedUnix::at(at)).build()
}

/// What [`model`]'s hanging requests wait on (`open`) and tell of their
/// call by (`called`).
#[derive(Clone, Default)]
struct Gate {
    open: Arc<Notify>,
    called: Arc<Notify>,
}

impl Gate {
    /// Sends a [`hanging`] request from `client` through `service` on a task
    /// of its own, returned once the request reached [`model`].
    async fn hang<S, B>(&self, service: &S, client: &str) -> JoinHandle<Answer>
    where
        S: Service<Request<String>, Response = Response<B>> + Clone + Send + 'static,
        S::Future: Send,
        S::Error: std::fmt::Debug + Send,
        B: http_body::Body + Send + 'static,
        B::Data: Send,
        B::Error: std::fmt::Debug,
    {
        let slow = tokio::spawn(answer(service.clone(), hanging(client)));
        self.called.notified().await;
        slow
    }

    /// Opens the gate for `slow`, the one request hanging, and checks that
    /// it failed.
    async fn fail(&self, slow: JoinHandle<Answer>) {
        self.open.notify_one();
        let failed = slow.await.expect("answered");
        assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    }
}

/// Cancels `slow`, a hanging request: its client went away.
async fn cancel(slow: JoinHandle<Answer>) {
    slow.abort();
    assert!(slow.await.is_err(), "cancelled");
}

/// The inner service: a request with `x-hang` waits on `gate` (after
/// notifying it was called) and then fails with `500`; any other request
/// answers at once, naming `x-reply-cost` as its cost.
fn model(
    gate: &Gate,
) -> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future: Send>
+ Clone
+ Send
+ use<> {
    let gate = gate.clone();
    service_fn(move |req: Request<String>| {
        let (gate, called) = (gate.open.clone(), gate.called.clone());
        async move {
            let mut response = Response::new(String::from("done"));
            if req.headers().contains_key("x-hang") {
                called.notify_one();
                gate.notified().await;
                *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            } else if let Some(cost) = req.headers().get("x-reply-cost") {
                response.headers_mut().insert(COST_HEADER, cost.clone());
            }
            Ok::<_, Infallible>(response)
        }
    })
}

/// A request from `client` whose response names `cost`.
fn costing(client: &str, cost: u64) -> Request<String> {
    let mut req = request_from(client);
    req.headers_mut()
        .insert("x-reply-cost", cost.to_string().parse().expect("a value"));
    req
}

/// A request from `client` that hangs until its gate opens, then fails.
fn hanging(client: &str) -> Request<String> {
    let mut req = request_from(client);
    req.headers_mut()
        .insert("x-hang", "1".parse().expect("a value"));
    req
}

/// How many of `n` requests of `cost` from `client` pass `service`.
async fn admitted<S, B>(service: &S, client: &str, cost: u64, n: u64) -> u64
where
    S: Service<Request<String>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let mut passed = 0;
    for _ in 0..n {
        let answered = answer(service.clone(), costing(client, cost)).await;
        if answered.status == StatusCode::OK {
            passed += 1;
        } else {
            assert_eq!(answered.status, StatusCode::TOO_MANY_REQUESTS);
        }
    }
    passed
}

/// A request reserved at the end of a window and cancelled (the client
/// went away) once the next window began gives back nothing of the next
/// window: the client that spent the next window already gets no more.
#[tokio::test(start_paused = true)]
async fn a_request_cancelled_after_its_window_ended_gives_back_nothing_of_the_next() {
    // 59 s into a minute.
    let store = paused_store(1_000 * 60 * SECOND + 59 * SECOND);
    let policy = named("w", Policy::fixed_window(10, Duration::from_secs(60)));
    let gate = Gate::default();
    let service = settling(&store, &policy, 10).layer(model(&gate));

    // Reserves the whole window, then hangs.
    let slow = gate.hang(&service, "c").await;
    tokio::time::advance(Duration::from_secs(2)).await;
    // The next window: the client spends it whole.
    assert_eq!(admitted(&service, "c", 10, 1).await, 1);
    // Then goes away from the slow request.
    cancel(slow).await;
    assert_eq!(
        admitted(&service, "c", 10, 3).await,
        0,
        "the next window was spent, and the cancelled request's units had left with its own"
    );
}

/// A monthly budget at UTC-23:59:59: a request reserved in the last second
/// of January (local time) fails in February; its refund does not give
/// back February's units.
#[tokio::test(start_paused = true)]
async fn a_failure_refunded_after_the_month_ended_does_not_pay_the_next_month_twice() {
    const WEST: i32 = -86_399;
    // 2024-02-01 00:00 at UTC-23:59:59 is 2024-02-01 23:59:59 UTC.
    let february = 19_754 * DAY + 86_399 * SECOND;
    let store = paused_store(february - SECOND);
    let policy = Policy::calendar(100, Period::Month.utc_offset(WEST)).expect("a calendar");
    let gate = Gate::default();
    let service = settling(&store, &policy, 100).layer(model(&gate));

    let slow = gate.hang(&service, "m").await;
    assert_eq!(admitted(&service, "m", 1, 1).await, 0, "January is spent");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(admitted(&service, "m", 100, 1).await, 1, "February");
    gate.fail(slow).await;
    assert_eq!(
        admitted(&service, "m", 100, 2).await,
        0,
        "February was spent; January's refund is not February's"
    );
}

/// The token bucket of the `token_budget` example (an estimate of 1): ten
/// requests reserve the whole bucket and hang; the bucket refills while
/// they do, the client spends it, then cancels them. Their tokens had come
/// back with the refill: the cancellation gives back nothing more.
#[tokio::test(start_paused = true)]
async fn reservations_cancelled_after_the_bucket_refilled_them_give_back_nothing() {
    let store = paused_store(1_700_000_000 * SECOND);
    let policy = named("t", Policy::token_bucket(10, Rate::per_minute(10)));
    let gate = Gate::default();
    let service = settling(&store, &policy, 1).layer(model(&gate));

    let mut slow = Vec::new();
    for _ in 0..10 {
        slow.push(gate.hang(&service, "t").await);
    }
    assert_eq!(admitted(&service, "t", 1, 1).await, 0, "all reserved");
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(admitted(&service, "t", 1, 10).await, 10, "refilled");
    for task in slow {
        cancel(task).await;
    }
    assert_eq!(
        admitted(&service, "t", 1, 10).await,
        0,
        "ten tokens a minute: the refill paid the reservations back already"
    );
}

/// `Limiter::reserve` in a handler: a reservation refunded after its
/// window ended gives back nothing of the window the client spent since.
#[tokio::test(start_paused = true)]
async fn a_limiter_refund_after_the_window_ended_gives_back_nothing() {
    let store = paused_store(1_000 * 60 * SECOND + 59 * SECOND);
    let policy = named("l", Policy::fixed_window(10, Duration::from_secs(60)));
    let limiter = Limiter::new(store.clone(), policy.clone());

    let reservation = limiter.reserve(b"k", 10).await.expect("reserved");
    tokio::time::advance(Duration::from_secs(2)).await;
    let spent = limiter.reserve(b"k", 10).await.expect("the next window");
    drop(spent);
    reservation.refund().await.expect("settled");
    let left = store
        .check(Key::from("k").as_bytes(), &policy, 0)
        .await
        .expect("a peek");
    assert_eq!(left.remaining(), 0, "{left:?}");
    assert!(limiter.reserve(b"k", 1).await.is_err());
}

/// A reservation refunded before its window ended (or before the refill
/// could have paid it) still gives back its whole estimate through the
/// layer: a failure in time costs nothing.
#[tokio::test(start_paused = true)]
async fn a_failure_refunded_in_time_gives_the_whole_estimate_back() {
    let clock = PausedUnix::at(1_000 * 60 * SECOND);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    for policy in every_algorithm(10, Duration::from_secs(60), Rate::per_minute(10))
        .into_iter()
        .filter(Policy::supports_settlement)
    {
        // 58 s into a minute.
        let into = clock.now() % (60 * SECOND);
        let wait = (58 * SECOND + 60 * SECOND - into) % (60 * SECOND);
        tokio::time::advance(Duration::from_micros(wait)).await;
        let gate = Gate::default();
        let service = settling(&store, &policy, 10).layer(model(&gate));
        let client = policy.name().to_owned();
        let slow = gate.hang(&service, &client).await;
        tokio::time::advance(Duration::from_millis(900)).await;
        gate.fail(slow).await;
        assert_eq!(
            admitted(&service, &client, 10, 1).await,
            1,
            "{}: the failure was refunded",
            policy.name()
        );
    }
}

/// Every store applies one rule to a settlement that says how long its
/// reservation was held: a refund once the reservation's window ended, or
/// once the refill paid its units back, gives back nothing; one in time
/// gives everything back. Memory, a Redis and a Redis Cluster agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_gives_back_only_what_a_held_reservation_still_holds() {
    let server = RedisServer::start();
    let cluster = RedisCluster::start();
    // The last second of a minute.
    let clock = ManualClock::new(29_383_333 * 60 * SECOND + 59 * SECOND);
    let (memory, single) = twin_stores(RedisStore::builder(server.url()), &clock).await;
    let clustered = build(
        RedisStore::cluster_builder(cluster.urls())
            .script_clock_for_tests(clock.clone())
            .call_timeout(CALL_TIMEOUT),
    )
    .await;
    let plain: Vec<Policy> = every_algorithm(10, Duration::from_secs(60), Rate::per_minute(10))
        .into_iter()
        .filter(Policy::supports_settlement)
        .collect();
    let mut seen: Vec<Vec<Observed>> = Vec::new();
    for store in [&memory as &dyn Stores, &single, &clustered] {
        let mut observed = Vec::new();
        for i in 0..=plain.len() {
            // Last, days whose local midnight is a second away, far west.
            let policy = &plain.get(i).cloned().unwrap_or_else(|| {
                let midnight = (clock.now() / SECOND + 1) % 86_400;
                let west = -i32::try_from(midnight).expect("under a day");
                Policy::calendar(10, Period::Day.utc_offset(west)).expect("valid")
            });
            // Late: held across the window's edge, a minute and a second.
            let key = format!("late-{i}");
            let reserved = store.decide(key.as_bytes(), policy, 10).await;
            assert!(reserved.is_allowed(), "{}", policy.name());
            let held = Duration::from_secs(61);
            clock.advance(held);
            let spent = store.decide(key.as_bytes(), policy, 10).await;
            assert!(spent.is_allowed(), "{}: the next budget", policy.name());
            let settle = Settle::new(key.as_bytes(), policy, 10, 0, &reserved).held_for(held);
            let settled = store.settle_one(settle).await;
            observed.push(observable(&settled));
            let after = store.decide(key.as_bytes(), policy, 1).await;
            assert!(
                !after.is_allowed(),
                "{}: the next budget was spent; the reservation's units had left: {after:?}",
                policy.name()
            );
            observed.push(observable(&after));

            // In time: held under a second, nothing else consumed.
            let key = format!("early-{i}");
            let reserved = store.decide(key.as_bytes(), policy, 10).await;
            let held = Duration::from_millis(500);
            clock.advance(held);
            let settle = Settle::new(key.as_bytes(), policy, 10, 0, &reserved).held_for(held);
            let settled = store.settle_one(settle).await;
            observed.push(observable(&settled));
            let after = store.decide(key.as_bytes(), policy, 10).await;
            assert!(
                after.is_allowed(),
                "{}: refunded whole: {after:?}",
                policy.name()
            );
            observed.push(observable(&after));
            // The next policy starts in the last second of a minute again.
            let into = clock.now() % (60 * SECOND);
            clock.advance(Duration::from_micros(
                (59 * SECOND + 60 * SECOND - into) % (60 * SECOND),
            ));
        }
        seen.push(observed);
    }
    assert_eq!(seen[1], seen[0], "a Redis agrees with memory");
    assert_eq!(seen[2], seen[0], "a Redis Cluster agrees with memory");
}

/// A decision on its way from a store.
type Deciding<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Decision> + Send + 'a>>;

/// The two calls the store-level scenario makes, on any store.
trait Stores: Sync {
    fn decide<'a>(&'a self, key: &'a [u8], policy: &'a Policy, cost: u64) -> Deciding<'a>;

    /// Settles one reservation.
    fn settle_one<'a>(&'a self, settle: Settle<'a>) -> Deciding<'a>;
}

impl<S: Store> Stores for S {
    fn decide<'a>(&'a self, key: &'a [u8], policy: &'a Policy, cost: u64) -> Deciding<'a> {
        Box::pin(async move {
            Store::check(self, key, policy, cost)
                .await
                .expect("a check")
        })
    }

    fn settle_one<'a>(&'a self, settle: Settle<'a>) -> Deciding<'a> {
        Box::pin(async move {
            let settles = [settle];
            let mut settled = self
                .settle(SettlementId::random(), &settles)
                .await
                .expect("settled");
            settled.pop().expect("one decision")
        })
    }
}

/// A store without settlements (`MultiRegionStore`, whose counts only
/// grow) under a rule that settles: a request that costs more than its
/// estimate could never be charged, so the layer would admit every request
/// at its estimate while each runs a whole budget. Such a layer is refused
/// when built; a settling rule that reaches it anyway (added with `and`)
/// has its requests refused, never run; so are `Limiter::reserve`'s.
#[tokio::test]
async fn a_store_that_cannot_settle_runs_no_cost_it_cannot_charge() {
    let server = RedisServer::start();
    let clock = ManualClock::new(29_383_333 * 60 * SECOND);
    let store = MultiRegionStore::builder("eu", server.url())
        .call_timeout(CALL_TIMEOUT)
        .script_clock_for_tests(clock)
        .build()
        .await
        .expect("a multi-region store");
    let policy = named("mr", Policy::fixed_window(100, Duration::from_secs(60)));
    let refused = RateLimitLayer::new(store.clone(), policy.clone(), by_client as ByClient)
        .cost(1)
        .settle(Settlement::from_static_header(COST_HEADER));
    assert!(
        matches!(refused, Err(SettleError::StoreUnsupported { .. })),
        "{refused:?}"
    );

    let per_client = named(
        "mr-plain",
        Policy::fixed_window(1_000, Duration::from_secs(60)),
    );
    let settling_rule = Rule::new(policy.clone(), by_client as ByClient)
        .cost(1)
        .settle(Settlement::from_static_header(COST_HEADER))
        .expect("a policy that settles");
    let service = RateLimitLayer::new(store.clone(), per_client, by_client as ByClient)
        .and(settling_rule)
        .layer(model(&Gate::default()));
    let mut ran = 0;
    for _ in 0..5 {
        let answered = answer(service.clone(), costing("c", 100)).await;
        if answered.status == StatusCode::OK {
            ran += 100;
        } else {
            assert_eq!(answered.status, StatusCode::INTERNAL_SERVER_ERROR);
        }
    }
    assert!(ran <= 200, "{ran} units run on a budget of 100");

    let limiter = Limiter::new(store, policy);
    assert!(limiter.reserve(b"c", 1).await.is_err());
}

/// Extreme settlements at the largest limits (reservations and costs up to
/// `u64::MAX`, twice in one call, held for nothing, a second or
/// `Duration::MAX`): memory and Redis answer alike, and nothing panics or
/// errs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extreme_settlements_at_the_largest_limits_agree_on_every_store() {
    const MAX_LIMIT: u64 = 1 << 40;
    let server = RedisServer::start();
    let clock = ManualClock::new(29_383_333 * 60 * SECOND + 30 * SECOND);
    let (memory, single) = twin_stores(RedisStore::builder(server.url()), &clock).await;
    let policies = [
        Policy::fixed_window(MAX_LIMIT, Duration::from_secs(60)),
        Policy::sliding_window_log(MAX_LIMIT, Duration::from_secs(60)),
        Policy::sliding_window_counter(MAX_LIMIT, Duration::from_micros(4_000)),
        Policy::token_bucket(MAX_LIMIT, Rate::per_second(1_000_000)),
        Policy::gcra(MAX_LIMIT, Rate::per_second(1_000_000)),
        Policy::leaky_bucket(MAX_LIMIT, Rate::per_second(1_000_000)),
        Policy::calendar(MAX_LIMIT, Period::Year.utc_offset(-86_399)),
    ];
    let cases = [
        (MAX_LIMIT, 0),
        (1, u64::MAX),
        (u64::MAX, 0),
        (u64::MAX, u64::MAX - 1),
        (0, u64::MAX),
    ];
    let mut seen: Vec<Vec<Observed>> = Vec::new();
    for (name, store) in [("memory", &memory as &dyn Stores), ("redis", &single)] {
        let mut observed = Vec::new();
        for (p, policy) in policies.iter().enumerate() {
            let policy = policy.clone().expect("a valid policy");
            for (c, &(reserved, actual)) in cases.iter().enumerate() {
                for held in [None, Some(Duration::from_secs(1)), Some(Duration::MAX)] {
                    let key = format!("x-{p}-{c}-{held:?}");
                    let decision = store.decide(key.as_bytes(), &policy, 1).await;
                    let mut settle =
                        Settle::new(key.as_bytes(), &policy, reserved, actual, &decision);
                    if let Some(held) = held {
                        settle = settle.held_for(held);
                    }
                    let settles = [settle, settle];
                    let id = SettlementId::random();
                    let settled = match name {
                        "memory" => memory.settle(id, &settles).await,
                        _ => single.settle(id, &settles).await,
                    };
                    let settled = settled.unwrap_or_else(|e| panic!("{key}: {e}"));
                    assert_eq!(settled.len(), 2);
                    observed.extend(settled.iter().map(observable));
                    observed.push(observable(&store.decide(key.as_bytes(), &policy, 0).await));
                }
            }
        }
        seen.push(observed);
    }
    assert_eq!(seen[1], seen[0], "a Redis agrees with memory");
}
