//! The Tower layer settling costs known after the response (`Settlement`):
//! a rule reserves its cost as an estimate before the call, and the layer
//! settles every such limit of the request to the cost the response names
//! (a header, removed before the response leaves, or an extension), in one
//! store call, when the response head arrives.
//!
//! The same scenarios run on `MemoryStore`, a single Redis and a Redis
//! Cluster, each on a manual clock (the scripts take their time from it), so
//! every number is exact: the response's `RateLimit` field after the
//! settlement, the debt and the `Retry-After` it causes, refunds of failed
//! and cancelled requests, hostile cost headers, what a zero estimate admits
//! on each algorithm, and many tasks settling two limits at once with no
//! admission beyond the documented debt. Then what is refused when built
//! (concurrency policies, bad configurations), what a store failure does,
//! the metrics, and the `token_budget` example as a real process, on memory
//! and on a Redis the test starts, and as two processes sharing that Redis.

use std::convert::Infallible;
use std::future::{pending, ready};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use ratelimit_core::clock::ManualClock;
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{
    Algorithm, MemoryStore, PermitId, Policy, Rate, Settle, SettleFuture, SettlementId, Store,
    StoreError,
};
use ratelimit_tests::fixtures::{Answer, answer, by_client, request_from};
use ratelimit_tests::loopback::{Reply, client};
use ratelimit_tests::{
    CALL_TIMEOUT, NOW_MICROS, RedisCluster, RedisServer, assert_refuses_flags, build,
    every_algorithm, named, redis_store_on_clock, spawn_listening,
};
use ratelimit_tower::config::Config;
use ratelimit_tower::{
    ActualCost, Decisions, Key, Limits, PeerAddr, RateLimitLayer, Rejection, Rule, SettleError,
    Settlement,
};
use tokio::sync::Notify;
use tower::{Layer, Service, ServiceExt, service_fn};

/// The header the inner service names a request's cost in.
const COST_HEADER: &str = "x-tokens-used";

/// How requests are keyed: their client's name (`x-client`).
type ByClient = fn(&Request<String>) -> Option<Vec<u8>>;

/// The key of every request: one budget for all.
fn everyone(_: &Request<String>) -> Option<Vec<u8>> {
    Some(b"everyone".to_vec())
}

/// A token bucket of `capacity` tokens refilled at `capacity` per hour (one
/// token every `3600 / capacity` seconds), named `name`.
fn bucket(name: &str, capacity: u64) -> Policy {
    named(
        name,
        Policy::token_bucket(capacity, Rate::per_hour(capacity)),
    )
}

/// A memory store whose clock stands still at [`NOW_MICROS`].
fn still_store() -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .clock(ManualClock::new(NOW_MICROS))
        .build()
}

/// The settlement from [`COST_HEADER`].
fn from_header() -> Settlement {
    Settlement::from_static_header(COST_HEADER)
}

/// A layer keyed by client under `policy` in `store`, reserving `estimate`
/// and settled as `settlement` says.
fn settling<St: Store + Clone>(
    store: &St,
    policy: &Policy,
    estimate: u64,
    settlement: Settlement,
) -> RateLimitLayer<St, Rule<ByClient>> {
    RateLimitLayer::new(store.clone(), policy.clone(), by_client as ByClient)
        .cost(estimate)
        .settle(settlement)
        .expect("a policy that settles")
}

/// The inner service: answers as the request asks (see [`reply`]).
fn model()
-> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future: Send>
+ Clone
+ Send {
    service_fn(|req: Request<String>| ready(Ok::<_, Infallible>(reply(&req))))
}

/// The answer to `req`: the status `x-reply-status` names (200 without),
/// each `x-reply-cost` value as an `x-tokens-used` value, `x-reply-extension`
/// as an [`ActualCost`]; and what the handler was told of its first limit:
/// `x-seen-estimate` (when it settles) and `x-seen-remaining`.
fn reply(req: &Request<String>) -> Response<String> {
    let mut response = Response::new(String::from("done"));
    let asked = req.headers();
    if let Some(status) = asked.get("x-reply-status") {
        *response.status_mut() = StatusCode::from_bytes(status.as_bytes()).expect("a status");
    }
    for cost in asked.get_all("x-reply-cost") {
        response.headers_mut().append(COST_HEADER, cost.clone());
    }
    if let Some(cost) = asked.get("x-reply-extension") {
        let cost = cost.to_str().expect("text").parse().expect("a number");
        response.extensions_mut().insert(ActualCost(cost));
    }
    if let Some(first) = req
        .extensions()
        .get::<Decisions>()
        .and_then(|d| d.iter().next())
    {
        let headers = response.headers_mut();
        if let Some(estimate) = first.estimate() {
            headers.insert("x-seen-estimate", HeaderValue::from(estimate));
        }
        headers.insert(
            "x-seen-remaining",
            HeaderValue::from(first.decision().remaining()),
        );
    }
    response
}

/// A request from `client` asking the inner service for the `reply` headers.
fn call(client: &str, reply: &[(&str, &[u8])]) -> Request<String> {
    let mut req = request_from(client);
    for (name, value) in reply {
        req.headers_mut().append(
            HeaderName::from_bytes(name.as_bytes()).expect("a header name"),
            HeaderValue::from_bytes(value).expect("a header value"),
        );
    }
    req
}

/// A request from `client` whose response names `cost` in [`COST_HEADER`].
fn costing(client: &str, cost: u64) -> Request<String> {
    call(client, &[("x-reply-cost", cost.to_string().as_bytes())])
}

/// What the `RateLimit` field of `answer` says `policy` has left (its `r`).
#[track_caller]
fn left(answer: &Answer, policy: &str) -> u64 {
    let field = answer.header("ratelimit");
    let member = format!("\"{policy}\";r=");
    let at = field
        .find(&member)
        .unwrap_or_else(|| panic!("no {member} in {field}"))
        + member.len();
    field[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|digits| digits.parse().ok())
        .unwrap_or_else(|| panic!("r of {policy} in {field}"))
}

/// `Retry-After` of `answer`, in seconds.
#[track_caller]
fn retry_after(answer: &Answer) -> u64 {
    answer.header("retry-after").parse().expect("delay-seconds")
}

/// The level of `key`'s token bucket under `policy` while the clock stands
/// still: the tokens left, or minus the tokens owed.
async fn level<St: Store>(store: &St, policy: &Policy, key: &str) -> i64 {
    let decision = store
        // The state of the value's hash, as the layer keys it.
        .check(Key::from(key).as_bytes(), policy, 0)
        .await
        .expect("a peek");
    let Algorithm::TokenBucket(bucket) = policy.algorithm() else {
        panic!("{} is not a token bucket", policy.name());
    };
    if decision.is_allowed() {
        i64::try_from(decision.remaining()).expect("small")
    } else {
        let owed = decision.retry_after_micros() / bucket.interval_micros();
        -i64::try_from(owed).expect("small")
    }
}

/// Waits (at most 10 s) until `key`'s level is `expected`: a give-back that
/// the layer sent on the runtime, after the request that made it was gone.
async fn level_becomes<St: Store>(store: &St, policy: &Policy, key: &str, expected: i64) {
    let start = Instant::now();
    loop {
        let now = level(store, policy, key).await;
        if now == expected {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{key} under {}: level {now}, not {expected}",
            policy.name()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every scenario, on `store` whose clock is `clock`.
async fn every_scenario<St: Store + Clone>(store: &St, clock: &ManualClock) {
    settles_to_the_response_cost(store).await;
    refunds_failures_and_cancellations(store).await;
    hostile_costs_never_lift_a_limit(store).await;
    zero_estimates_admit_until_in_debt(store).await;
    many_tasks_settle_two_limits_with_no_more_than_the_debt(store).await;
    debt_is_refused_until_paid(store, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_memory() {
    let clock = ManualClock::new(NOW_MICROS);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    every_scenario(&store, &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_server() {
    let server = RedisServer::start();
    let clock = ManualClock::new(NOW_MICROS);
    let store = redis_store_on_clock(server.url(), &clock).await;
    every_scenario(&store, &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let clock = ManualClock::new(NOW_MICROS);
    let store = build(
        RedisStore::cluster_builder(cluster.urls())
            .script_clock_for_tests(clock.clone())
            .call_timeout(CALL_TIMEOUT),
    )
    .await;
    every_scenario(&store, &clock).await;
}

/// The estimate is reserved, then settled up or down to the cost the
/// response names; the `RateLimit` field reports what is left after the
/// settlement, the cost header stays inside, and the handler saw the
/// estimate. Two settling limits are settled together.
async fn settles_to_the_response_cost<St: Store + Clone>(store: &St) {
    let tokens = bucket("s-tokens", 1_000);
    let service = settling(store, &tokens, 10, from_header()).layer(model());

    let up = answer(service.clone(), costing("s-a", 400)).await;
    assert_eq!(up.status, StatusCode::OK);
    assert_eq!(left(&up, "s-tokens"), 600, "10 reserved, 390 more charged");
    assert!(up.headers.get(COST_HEADER).is_none(), "{:?}", up.headers);
    assert_eq!(up.header("x-seen-estimate"), "10");
    assert_eq!(up.header("x-seen-remaining"), "990");
    assert_eq!(level(store, &tokens, "s-a").await, 600);

    let down = answer(service.clone(), costing("s-a", 5)).await;
    assert_eq!(left(&down, "s-tokens"), 595, "5 of the 10 given back");
    let exact = answer(service.clone(), costing("s-a", 10)).await;
    assert_eq!(left(&exact, "s-tokens"), 585);
    assert_eq!(level(store, &tokens, "s-a").await, 585);

    let kept = settling(store, &tokens, 10, from_header().keep_header(true)).layer(model());
    let shown = answer(kept, costing("s-a", 100)).await;
    assert_eq!(shown.header(COST_HEADER), "100");
    assert_eq!(left(&shown, "s-tokens"), 485);

    // From the response's extensions: a header there is not read.
    let by_extension = settling(store, &tokens, 10, Settlement::from_extension()).layer(model());
    let extension = call(
        "s-a",
        &[("x-reply-extension", b"50"), ("x-reply-cost", b"400")],
    );
    let read = answer(by_extension, extension).await;
    assert_eq!(left(&read, "s-tokens"), 435);
    assert_eq!(read.header(COST_HEADER), "400", "not this rule's header");

    #[derive(Clone)]
    struct Usage {
        prompt: u64,
        completion: u64,
    }
    let usage = Settlement::from_extension_with(|u: &Usage| u.prompt + u.completion);
    let with_usage =
        settling(store, &tokens, 10, usage).layer(service_fn(|_req: Request<String>| {
            let mut response = Response::new(String::new());
            response.extensions_mut().insert(Usage {
                prompt: 20,
                completion: 30,
            });
            ready(Ok::<_, Infallible>(response))
        }));
    let read = answer(with_usage, request_from("s-a")).await;
    assert_eq!(left(&read, "s-tokens"), 385);

    // Two limits, each settled, in one call.
    let all = bucket("s-all", 5_000);
    let both = settling(store, &tokens, 10, from_header())
        .and(
            Rule::new(all.clone(), everyone as ByClient)
                .cost(10)
                .settle(from_header())
                .expect("settles"),
        )
        .layer(model());
    let two = answer(both, costing("s-b", 300)).await;
    assert_eq!((left(&two, "s-tokens"), left(&two, "s-all")), (700, 4_700));
    assert_eq!(level(store, &all, "everyone").await, 4_700);
    assert_eq!(level(store, &tokens, "s-b").await, 700);
}

/// A cost beyond what is left takes the key into debt; every request is
/// then refused, a zero estimate's too, with `Retry-After` until the refill
/// has paid the debt (and, for an estimate, the estimate).
async fn debt_is_refused_until_paid<St: Store + Clone>(store: &St, clock: &ManualClock) {
    // 1,000 tokens an hour: one every 3.6 s.
    let tokens = bucket("d-tokens", 1_000);
    let ten = settling(store, &tokens, 10, from_header()).layer(model());
    let zero = settling(store, &tokens, 0, from_header()).layer(model());

    let deep = answer(ten.clone(), costing("d-a", 1_500)).await;
    assert_eq!(deep.status, StatusCode::OK);
    assert_eq!(left(&deep, "d-tokens"), 0);
    assert_eq!(level(store, &tokens, "d-a").await, -500);
    // RateLimit's `t` of a key in debt: the time until it is paid.
    assert!(deep.header("ratelimit").ends_with(";t=1800"), "{deep:?}");

    let refused = answer(ten.clone(), costing("d-a", 1)).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&refused), 1_836, "510 tokens at 3.6 s");
    let refused = answer(zero.clone(), costing("d-a", 1)).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&refused), 1_800, "the 500 owed");
    assert_eq!(
        level(store, &tokens, "d-a").await,
        -500,
        "refusals take nothing"
    );

    clock.advance(Duration::from_secs(1_800));
    assert_eq!(level(store, &tokens, "d-a").await, 0);
    let refused = answer(ten.clone(), costing("d-a", 1)).await;
    assert_eq!(retry_after(&refused), 36);
    let admitted = answer(zero, costing("d-a", 0)).await;
    assert_eq!(
        admitted.status,
        StatusCode::OK,
        "paid: a zero estimate passes"
    );
    clock.advance(Duration::from_secs(36));
    let admitted = answer(ten, costing("d-a", 10)).await;
    assert_eq!(admitted.status, StatusCode::OK);
    assert_eq!(left(&admitted, "d-tokens"), 0);
}

/// A failure response (`5xx`, or what `refund_if` says) gives the whole
/// reservation back, whatever cost it names; so does a request whose
/// service fails or whose future is dropped before its response head,
/// unless the rule keeps the estimate then.
async fn refunds_failures_and_cancellations<St: Store + Clone>(store: &St) {
    let tokens = bucket("r-tokens", 1_000);
    let service = settling(store, &tokens, 10, from_header()).layer(model());

    let failed = call(
        "r-5xx",
        &[("x-reply-status", b"500"), ("x-reply-cost", b"400")],
    );
    let failed = answer(service.clone(), failed).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(left(&failed, "r-tokens"), 1_000, "the headers say so too");
    assert!(failed.headers.get(COST_HEADER).is_none());
    assert_eq!(level(store, &tokens, "r-5xx").await, 1_000);
    for _ in 0..10 {
        let unavailable = answer(
            service.clone(),
            call("r-5xx", &[("x-reply-status", b"503")]),
        );
        assert_eq!(unavailable.await.status, StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(
        level(store, &tokens, "r-5xx").await,
        1_000,
        "ten failures cost nothing"
    );

    let not_found = call(
        "r-4xx",
        &[("x-reply-status", b"404"), ("x-reply-cost", b"50")],
    );
    answer(service.clone(), not_found).await;
    assert_eq!(
        level(store, &tokens, "r-4xx").await,
        950,
        "a 4xx is charged"
    );
    let client_errors = from_header().refund_if(|head| head.status.is_client_error());
    let refunding = settling(store, &tokens, 10, client_errors).layer(model());
    let not_found = call(
        "r-4xx",
        &[("x-reply-status", b"404"), ("x-reply-cost", b"50")],
    );
    answer(refunding.clone(), not_found).await;
    assert_eq!(level(store, &tokens, "r-4xx").await, 950, "refunded");
    let server_error = call(
        "r-4xx",
        &[("x-reply-status", b"500"), ("x-reply-cost", b"5")],
    );
    answer(refunding, server_error).await;
    assert_eq!(
        level(store, &tokens, "r-4xx").await,
        945,
        "not a failure to it"
    );

    // The service fails: no response head.
    let broken = service_fn(|_req: Request<String>| {
        ready(Err::<Response<String>, _>(std::io::Error::other("boom")))
    });
    let failing = settling(store, &tokens, 10, from_header()).layer(broken);
    assert!(failing.oneshot(request_from("r-error")).await.is_err());
    level_becomes(store, &tokens, "r-error", 1_000).await;
    let keeping = settling(store, &tokens, 10, from_header().refund_on_cancel(false));
    assert!(
        keeping
            .layer(broken)
            .oneshot(request_from("r-error"))
            .await
            .is_err()
    );
    assert_eq!(level(store, &tokens, "r-error").await, 990, "kept");

    // Cancelled while the service works: the future is dropped.
    for (refund, key, expected) in [(true, "r-cancel", 1_000), (false, "r-kept", 990)] {
        let called = Arc::new(Notify::new());
        let notify = called.clone();
        let hanging = service_fn(move |_req: Request<String>| {
            notify.notify_one();
            pending::<Result<Response<String>, Infallible>>()
        });
        let settlement = from_header().refund_on_cancel(refund);
        let service = settling(store, &tokens, 10, settlement).layer(hanging);
        tokio::select! {
            _ = service.oneshot(request_from(key)) => panic!("the service never answers"),
            () = called.notified() => {}
        }
        level_becomes(store, &tokens, key, expected).await;
    }
}

/// Costs that are not whole numbers keep the estimate; costs above twice
/// the limit are charged as twice the limit (a full debt); none panics, and
/// each is counted.
async fn hostile_costs_never_lift_a_limit<St: Store + Clone>(store: &St) {
    let tokens = bucket("h-tokens", 1_000);
    let layer = settling(store, &tokens, 10, from_header());
    let service = layer.clone().layer(model());
    let nines = [b'9'; 4_096];
    let cases: [(&[&[u8]], i64); 13] = [
        (&[&b"-1"[..]], 990),
        (&[&b"+5"[..]], 990),
        (&[&b"1.5"[..]], 990),
        (&[&b"0x10"[..]], 990),
        (&[&b"1e3"[..]], 990),
        (&[&b""[..]], 990),
        (&[&b"5"[..], &b"6"[..]], 990),
        (&[&b"\xff\xfe"[..]], 990),
        (&[&b" 400\t"[..]], 600),
        // Twice the limit: a full debt, not clamped.
        (&[&b"2000"[..]], -1_000),
        (&[&b"99999999999999999999999"[..]], -1_000),
        (&[&nines[..]], -1_000),
        (&[], 990),
    ];
    for (i, (values, expected)) in cases.iter().enumerate() {
        let key = format!("h-{i}");
        let reply: Vec<(&str, &[u8])> = values.iter().map(|v| ("x-reply-cost", *v)).collect();
        let answered = answer(service.clone(), call(&key, &reply)).await;
        assert_eq!(answered.status, StatusCode::OK, "{values:?}");
        assert!(answered.headers.get(COST_HEADER).is_none(), "{values:?}");
        assert_eq!(level(store, &tokens, &key).await, *expected, "{values:?}");
    }
    let stats = layer.stats();
    assert_eq!(
        (
            stats.costs_invalid(),
            stats.costs_clamped(),
            stats.costs_missing()
        ),
        (8, 2, 1)
    );
    // An extension can name anything a `u64` holds.
    let by_extension = settling(store, &tokens, 10, Settlement::from_extension()).layer(model());
    let huge = u64::MAX.to_string();
    let answered = answer(
        by_extension,
        call("h-ext", &[("x-reply-extension", huge.as_bytes())]),
    );
    assert_eq!(answered.await.status, StatusCode::OK);
    assert_eq!(level(store, &tokens, "h-ext").await, -1_000);
}

/// A zero estimate reserves nothing: on every algorithm it admits a
/// request while the key is not in debt, an exactly empty budget included,
/// and refuses it, with `Retry-After`, once a settlement took the key below
/// zero; an estimate of 1 is refused at exactly empty.
async fn zero_estimates_admit_until_in_debt<St: Store + Clone>(store: &St) {
    let day = Duration::from_secs(86_400);
    for policy in every_algorithm(10, day, Rate::new(10, day)) {
        if !policy.supports_settlement() {
            continue;
        }
        let kind = policy.algorithm().kind();
        let name = format!("z-{kind}");
        let policy = policy.with_name(name.clone()).expect("a valid name");
        let zero = settling(store, &policy, 0, from_header()).layer(model());
        let one = settling(store, &policy, 1, from_header()).layer(model());

        let all = answer(zero.clone(), costing("z", 10)).await;
        assert_eq!(all.status, StatusCode::OK, "{kind}");
        assert_eq!(left(&all, &name), 0, "{kind}");
        let one_more = answer(one.clone(), costing("z", 1)).await;
        assert_eq!(one_more.status, StatusCode::TOO_MANY_REQUESTS, "{kind}");
        let at_zero = answer(zero.clone(), costing("z", 1)).await;
        assert_eq!(at_zero.status, StatusCode::OK, "{kind}: empty, not in debt");
        let in_debt = answer(zero, costing("z", 1)).await;
        assert_eq!(in_debt.status, StatusCode::TOO_MANY_REQUESTS, "{kind}");
        assert!(retry_after(&in_debt) >= 1, "{kind}");
        let in_debt = answer(one, costing("z", 0)).await;
        assert_eq!(in_debt.status, StatusCode::TOO_MANY_REQUESTS, "{kind}");
    }
}

/// 16 tasks send 25 requests each from 4 clients through two settling
/// limits of each client (a small budget and a larger one), all or nothing,
/// with costs of 0 to 40 against estimates of 10, while the clock stands
/// still. Each limit ends exactly at its capacity minus the costs of the
/// requests it admitted (every settlement applied once, to both limits;
/// nothing taken by a request the other limit refused), the small budget
/// ran out, and its debt is no more than the requests in flight could run up
/// beyond their estimates: at most 16 × (40 − 10) tokens.
///
/// Both limits of a client share its key, so on a Redis Cluster they share
/// a slot: one script decides them, and one settles them. (Limits of
/// different keys are decided slot by slot there, with refunds that give
/// way to a concurrent change, which errs towards denying: the layer's
/// reservations are the store's.)
async fn many_tasks_settle_two_limits_with_no_more_than_the_debt<St: Store + Clone>(store: &St) {
    const TASKS: u64 = 16;
    const PER_TASK: u64 = 25;
    const ESTIMATE: u64 = 10;
    const MOST: u64 = 40;
    const CLIENTS: u64 = 4;
    let small = bucket("c-small", 600);
    let large = bucket("c-large", 900);
    let service = settling(store, &small, ESTIMATE, from_header())
        .and(
            Rule::new(large.clone(), by_client as ByClient)
                .cost(ESTIMATE)
                .settle(from_header())
                .expect("settles"),
        )
        .layer(model());
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..TASKS {
        let service = service.clone();
        tasks.spawn(async move {
            let mut admitted = Vec::new();
            for n in 0..PER_TASK {
                let client = (task + n) % CLIENTS;
                let cost = (task * 7 + n * 13) % (MOST + 1);
                let answered = answer(service.clone(), costing(&format!("c-{client}"), cost)).await;
                match answered.status {
                    StatusCode::OK => admitted.push((client, cost)),
                    StatusCode::TOO_MANY_REQUESTS => {}
                    other => panic!("{other}: {}", answered.body),
                }
            }
            admitted
        });
    }
    let admitted: Vec<(u64, u64)> = tasks.join_all().await.into_iter().flatten().collect();
    let bound = i64::try_from(TASKS * (MOST - ESTIMATE)).expect("small");
    for client in 0..CLIENTS {
        let key = format!("c-{client}");
        let spent: u64 = admitted
            .iter()
            .filter(|(c, _)| *c == client)
            .map(|(_, cost)| cost)
            .sum();
        let spent = i64::try_from(spent).expect("small");
        let small_level = level(store, &small, &key).await;
        assert_eq!(
            small_level,
            600 - spent,
            "{key}: {} admitted",
            admitted.len()
        );
        assert_eq!(level(store, &large, &key).await, 900 - spent, "{key}");
        assert!(
            small_level < i64::try_from(ESTIMATE).expect("small"),
            "{key}: the small budget ran out: {small_level}"
        );
        assert!(
            small_level >= -bound,
            "{key}: debt {small_level} beyond {bound}"
        );
    }
}

/// Concurrency policies have no settlement: a rule or a layer that would
/// settle one is refused when built, and a rule provider that gives one has
/// its request refused (`500`), counted, taking nothing.
#[tokio::test]
async fn concurrency_limits_cannot_settle() {
    let store = MemoryStore::new();
    let in_flight = named("in-flight", Policy::concurrency(2, Duration::from_secs(30)));
    let refused = Rule::new(in_flight.clone(), by_client as ByClient).settle(from_header());
    let error = refused.expect_err("refused");
    assert!(matches!(error, SettleError::Unsupported { .. }));
    assert_eq!(
        error.to_string(),
        "policy `in-flight` (concurrency) cannot settle costs after the response: \
         its units are permits held and released, not consumed"
    );
    assert!(
        RateLimitLayer::new(store.clone(), in_flight.clone(), by_client as ByClient)
            .settle(from_header())
            .is_err()
    );

    let policy = in_flight.clone();
    let layer = RateLimitLayer::with_rules(store.clone(), move |_req: &Request<String>| {
        ready(Limits::none().with_settlement(policy.clone(), "k", 1, from_header()))
    });
    let answered = answer(layer.clone().layer(model()), request_from("k")).await;
    assert_eq!(answered.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(layer.stats().refused_on_error(), 1);
    let peek = store
        .check(Key::from("k").as_bytes(), &in_flight, 0)
        .await
        .expect("a peek");
    assert_eq!(peek.remaining(), 2, "no permit taken");
}

/// A configuration file's `settle` settles from its header; its mistakes
/// are refused with the field named.
#[tokio::test]
async fn configured_settlements() {
    const CONFIG: &str = r#"
        [policies.tokens]
        algorithm = "token-bucket"
        limit = 1000
        rate = "1000/h"

        [[rules]]
        policy = "tokens"
        key = "header:x-api-key"
        settle = { header = "X-Tokens-Used", estimate = 5 }
    "#;
    let config = Config::from_toml(CONFIG).expect("valid");
    let store = still_store();
    let service = RateLimitLayer::with_rules(store.clone(), config).layer(model());
    let request = |cost: &[u8], status: &[u8]| {
        let mut req = call("c", &[("x-reply-cost", cost), ("x-reply-status", status)]);
        req.headers_mut()
            .insert("x-api-key", HeaderValue::from_static("k1"));
        req
    };
    let settled = answer(service.clone(), request(b"400", b"200")).await;
    assert_eq!(left(&settled, "tokens"), 600);
    assert_eq!(settled.header("x-seen-estimate"), "5");
    assert!(settled.headers.get(COST_HEADER).is_none());
    let refunded = answer(service.clone(), request(b"400", b"502")).await;
    assert_eq!(left(&refunded, "tokens"), 600);

    let with =
        |settle: &str| CONFIG.replace(r#"{ header = "X-Tokens-Used", estimate = 5 }"#, settle);
    let kept = Config::from_toml(&with(
        r#"{ header = "x-tokens-used", refund_on = "never", keep_header = true, refund_cancelled = false }"#,
    ))
    .expect("valid");
    let service = RateLimitLayer::with_rules(store, kept).layer(model());
    let charged = answer(service, request(b"100", b"500")).await;
    assert_eq!(left(&charged, "tokens"), 500, "never refunded");
    assert_eq!(charged.header(COST_HEADER), "100");

    let concurrency = CONFIG.replace(
        "algorithm = \"token-bucket\"\n        limit = 1000\n        rate = \"1000/h\"",
        "algorithm = \"concurrency\"\n        limit = 10\n        lease = \"30s\"",
    );
    let cases = [
        (
            with(r#"{ header = "x-tokens-used", estimate = 1001 }"#),
            "rules[0].settle.estimate: 1001 is more than policy \"tokens\" can ever admit (1000)",
        ),
        (
            with(r#"{ header = "x-tokens-used", refund_on = "sometimes" }"#),
            "rules[0].settle.refund_on: unknown variant `sometimes`",
        ),
        (
            with(r#"{ header = "bad header" }"#),
            "rules[0].settle.header: invalid header name \"bad header\"",
        ),
        (
            with(r#"{ estimate = 1 }"#),
            "rules[0].settle: missing field `header`",
        ),
        (
            with(r#"{ header = "x-tokens-used", cost = 1 }"#),
            "rules[0].settle.cost: unknown field `cost`",
        ),
        (
            CONFIG.replace("settle =", "cost = 2\n        settle ="),
            "rules[0].cost: a rule that settles reserves settle.estimate before the call: \
             leave cost out",
        ),
        (
            concurrency,
            "rules[0].settle: policy `tokens` (concurrency) cannot settle costs after the \
             response: its units are permits held and released, not consumed",
        ),
    ];
    for (config, expected) in cases {
        let error = Config::from_toml(&config).expect_err(expected);
        assert!(
            error.to_string().starts_with(expected),
            "{error}\nnot {expected}"
        );
    }
}

/// A store whose settlements fail as an unreachable one's would; it decides
/// in memory, unless `decides` is false: then its checks fail too.
#[derive(Clone)]
struct CannotSettle {
    memory: MemoryStore<ManualClock>,
    decides: bool,
}

/// The error of a store that cannot be reached.
fn unreachable() -> StoreError {
    StoreError::Unavailable("connection refused".into())
}

impl Store for CannotSettle {
    type CheckFuture = <MemoryStore<ManualClock> as Store>::CheckFuture;
    type CheckAllFuture = <MemoryStore<ManualClock> as Store>::CheckAllFuture;
    type ReleaseFuture = <MemoryStore<ManualClock> as Store>::ReleaseFuture;
    type RenewFuture = <MemoryStore<ManualClock> as Store>::RenewFuture;

    fn check(&self, key: &[u8], policy: &Policy, cost: u64) -> Self::CheckFuture {
        if !self.decides {
            return ready(Err(unreachable()));
        }
        self.memory.check(key, policy, cost)
    }

    fn check_all(&self, checks: &[ratelimit_core::Check<'_>]) -> Self::CheckAllFuture {
        if !self.decides {
            return ready(Err(unreachable()));
        }
        self.memory.check_all(checks)
    }

    fn release(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::ReleaseFuture {
        self.memory.release(key, policy, permit)
    }

    fn settle(&self, _id: SettlementId, _settles: &[Settle<'_>]) -> SettleFuture {
        Box::pin(ready(Err(unreachable())))
    }

    fn supports_settlement(&self, policy: &Policy) -> bool {
        self.memory.supports_settlement(policy)
    }

    fn renew(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::RenewFuture {
        self.memory.renew(key, policy, permit)
    }
}

/// Each settlement is counted under its outcome; a store that cannot settle
/// leaves the reservation as it was taken, and the request, which already
/// ran, is answered with the headers of its reservation.
#[test]
fn metrics_and_a_store_that_cannot_settle() {
    let ((), recorded) = ratelimit_tests::metrics::capture(false, || async {
        let store = still_store();
        let tokens = bucket("m-tokens", 1_000);
        let layer = settling(&store, &tokens, 10, from_header());
        let service = layer.clone().layer(model());
        for req in [
            costing("m", 100),
            costing("m", 10),
            call("m", &[("x-reply-status", b"500")]),
            call("m", &[("x-reply-cost", b"many")]),
            call("m", &[]),
            costing("m", 5_000),
        ] {
            answer(service.clone(), req).await;
        }
        let called = Arc::new(Notify::new());
        let notify = called.clone();
        let hanging = settling(&store, &tokens, 10, from_header()).layer(service_fn(
            move |_req: Request<String>| {
                notify.notify_one();
                pending::<Result<Response<String>, Infallible>>()
            },
        ));
        tokio::select! {
            _ = hanging.oneshot(request_from("m-cancel")) => panic!("the service never answers"),
            () = called.notified() => {}
        }

        let failing = CannotSettle {
            memory: store.clone(),
            decides: true,
        };
        let layer = settling(&failing, &tokens, 10, from_header());
        let answered = answer(layer.clone().layer(model()), costing("m-down", 400)).await;
        assert_eq!(answered.status, StatusCode::OK, "the request ran");
        assert_eq!(
            left(&answered, "m-tokens"),
            990,
            "what the reservation left"
        );
        assert!(answered.headers.get(COST_HEADER).is_none());
        assert_eq!(layer.stats().settle_failed(), 1);
        assert_eq!(level(&store, &tokens, "m-down").await, 990);
    });
    recorded.assert_outcomes(
        ratelimit_tests::metrics::SETTLEMENTS,
        "m-tokens",
        "cancelled=1 clamped=1 error=1 invalid_cost=1 missing_cost=1 refunded=1 settled=2",
    );
}

/// A request let through because the store could not decide (failing
/// open) reserved nothing and settles nothing, but its cost header still
/// stays inside the service.
#[tokio::test]
async fn failing_open_keeps_the_cost_header_inside() {
    let down = CannotSettle {
        memory: MemoryStore::builder()
            .clock(ManualClock::new(NOW_MICROS))
            .build(),
        decides: false,
    };
    let tokens = bucket("o-tokens", 1_000);
    let layer = settling(&down, &tokens, 10, from_header());
    let answered = answer(layer.clone().layer(model()), costing("o", 400)).await;
    assert_eq!(answered.status, StatusCode::OK, "failed open");
    assert!(answered.headers.get(COST_HEADER).is_none(), "{answered:?}");
    assert!(answered.headers.get("ratelimit").is_none(), "no decision");
    assert_eq!(layer.stats().failed_open(), 1);
    assert_eq!(layer.stats().settle_failed(), 0, "nothing to settle");
}

/// A layer for requests that are not HTTP sees no response head: it keeps
/// the estimate of a response (counted as a missing cost) and gives back
/// the reservation of a request whose service fails.
#[tokio::test]
async fn layers_for_errors_refund_errors_and_keep_estimates() {
    let store = still_store();
    let tokens = bucket("e-tokens", 1_000);
    let layer = RateLimitLayer::new(store.clone(), tokens.clone(), |n: &u64| {
        Some(n.to_be_bytes().to_vec())
    })
    .cost(10)
    .settle(from_header())
    .expect("settles")
    .for_errors();
    let service = layer.clone().layer(service_fn(|n: u64| async move {
        if n == 0 {
            Err(std::io::Error::other("failed"))
        } else {
            Ok(n)
        }
    }));
    assert_eq!(service.clone().oneshot(7).await.expect("allowed"), 7);
    assert!(service.oneshot(0).await.is_err());
    // A closure's value is hashed as every value is.
    let left = async |n: u64| {
        let key = Key::from(n.to_be_bytes().to_vec());
        let peek = store.check(key.as_bytes(), &tokens, 0).await;
        peek.expect("peek").remaining()
    };
    assert_eq!(left(7).await, 990);
    assert_eq!(left(0).await, 1_000);
    assert_eq!(layer.stats().costs_missing(), 1);
}

/// An HTTP client's layer reads the response's head as the HTTP layer does:
/// the downstream API's cost header settles the reservation (and stays on
/// the response when the settlement keeps it), a `5xx` gives the
/// reservation back, a refusal is an error.
#[tokio::test]
async fn an_http_clients_layer_settles_from_the_response_head() {
    let store = still_store();
    let tokens = bucket("c-tokens", 1_000);
    let layer = RateLimitLayer::new(store.clone(), tokens.clone(), everyone)
        .cost(10)
        .settle(from_header().keep_header(true))
        .expect("settles")
        .for_http_client();
    let client = layer.clone().layer(model());
    let response = client
        .clone()
        .oneshot(costing("o", 400))
        .await
        .expect("allowed");
    assert_eq!(
        response.headers()[COST_HEADER],
        "400",
        "kept for the caller"
    );
    assert_eq!(level(&store, &tokens, "everyone").await, 600);
    let failed = call("o", &[("x-reply-status", b"503")]);
    let response = client.clone().oneshot(failed).await.expect("allowed");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(level(&store, &tokens, "everyone").await, 600, "given back");
    client
        .clone()
        .oneshot(costing("o", 600))
        .await
        .expect("allowed");
    let refused = client.oneshot(costing("o", 1)).await.expect_err("refused");
    assert!(
        matches!(
            refused.downcast_ref::<Rejection>(),
            Some(Rejection::Limited(_))
        ),
        "{refused}"
    );
    assert_eq!(layer.stats().costs_missing(), 0);
}

/// A request with a peer address, for the example's routes.
fn peer_request(mut req: Request<String>) -> Request<String> {
    req.extensions_mut()
        .insert(PeerAddr(std::net::SocketAddr::from(([192, 0, 2, 1], 4000))));
    req
}

/// The estimate a handler sees is the reservation's, under `ratelimit-axum`'s
/// extractor too; a decision without a settlement has none.
#[tokio::test]
async fn handlers_see_the_estimate() {
    use axum::routing::get;
    use ratelimit_axum::RateLimitInfo;

    let store = MemoryStore::new();
    let tokens = bucket("a-tokens", 1_000);
    let per_ip = bucket("a-ip", 1_000);
    let layer = RateLimitLayer::new(store, per_ip, ratelimit_tower::PeerIp).and(
        Rule::new(tokens, ratelimit_tower::HeaderKey::from_static("x-client"))
            .cost(7)
            .settle(from_header())
            .expect("settles"),
    );
    let app: axum::Router = axum::Router::new()
        .route(
            "/",
            get(|info: RateLimitInfo| async move {
                let each: Vec<String> = info
                    .iter()
                    .map(|e| format!("{}={:?}", e.policy().name(), e.estimate()))
                    .collect();
                format!("{:?} {}", info.estimate(), each.join(" "))
            }),
        )
        .route_layer(layer);
    let response = app
        .oneshot(peer_request(request_from("a")).map(axum::body::Body::from))
        .await
        .expect("answered");
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .expect("a body")
        .to_bytes();
    assert_eq!(body, "Some(7) a-ip=None a-tokens=Some(7)");
}

/// How long the example may take to print `listening on http://ADDR`.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Drives the `token_budget` example started with `args`: three calls of
/// 400 tokens pass, the fourth is refused with `Retry-After` until the
/// debt of 200 tokens (at 1,000 a minute) is paid; ten failures of another
/// key cost it nothing; the cost header never leaves the service.
async fn drive_token_budget(args: &[&str]) {
    let example = spawn_listening("token_budget", args, START_TIMEOUT);
    let client = client();
    let complete = format!("{}/v1/complete?tokens=400", example.base);
    let quota = |key: &'static str| {
        Reply::read(
            client
                .get(format!("{}/v1/quota", example.base))
                .header("x-api-key", key),
        )
    };
    for n in 1..=3 {
        let reply = Reply::read(client.post(&complete).header("x-api-key", "alice")).await;
        assert_eq!(reply.status, 200, "call {n}: {reply:?}");
        assert!(reply.header(COST_HEADER).is_none(), "{reply:?}");
        assert!(reply.body.contains("reserved 1"), "{}", reply.body);
    }
    let refused = Reply::read(client.post(&complete).header("x-api-key", "alice")).await;
    assert_eq!(refused.status, 429, "{refused:?}");
    let wait: u64 = refused
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    // 200 tokens owed and 1 to reserve, at 60 ms each (less what refilled
    // since): about 12 s.
    assert!((11..=13).contains(&wait), "Retry-After {wait}");
    let owed: serde_json::Value = serde_json::from_str(&quota("alice").await.body).expect("JSON");
    assert_eq!(owed["in_debt"], true, "{owed}");
    assert_eq!(owed["remaining"], 0, "{owed}");

    for _ in 0..10 {
        let failed = Reply::read(
            client
                .get(format!("{}/v1/fail", example.base))
                .header("x-api-key", "bob"),
        )
        .await;
        assert_eq!(failed.status, 500);
    }
    let full: serde_json::Value = serde_json::from_str(&quota("bob").await.body).expect("JSON");
    assert_eq!(full["remaining"], 1_000, "{full}");
    assert_eq!(full["in_debt"], false, "{full}");

    let anonymous = Reply::read(client.post(&complete)).await;
    assert_eq!(anonymous.status, 429, "no API key");
    assert!(anonymous.header("retry-after").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_budget_example_in_memory() {
    drive_token_budget(&[]).await;
    assert_refuses_flags("token_budget", &["--limit", "0"], "--limit");
    assert_refuses_flags("token_budget", &["--redis", "127.0.0.1:6379"], "--redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_budget_example_on_redis() {
    let server = RedisServer::start();
    drive_token_budget(&["--redis", &server.url()]).await;
}

/// The `token_budget` example's budget per API key: tokens a minute, and
/// the capacity of its bucket.
const TOKENS_PER_MINUTE: u64 = 1_000;

/// `GET /v1/quota` of `key` at `base`, read as JSON.
async fn quota_of(client: &reqwest::Client, base: &str, key: &str) -> serde_json::Value {
    let reply = Reply::read(
        client
            .get(format!("{base}/v1/quota"))
            .header("x-api-key", key),
    )
    .await;
    assert_eq!(reply.status, 200, "{base}: {reply:?}");
    serde_json::from_str(&reply.body).expect("JSON")
}

/// A number of a `GET /v1/quota` answer.
fn field(quota: &serde_json::Value, name: &str) -> u64 {
    quota[name]
        .as_u64()
        .unwrap_or_else(|| panic!("{name} in {quota}"))
}

/// Two `token_budget` processes on one Redis share one budget per API key:
/// 16 tasks call them in turn with one key, each call reserving 1 token and
/// settling to 50..=150, and what the two admit together stays within what
/// `Store::settle` promises.
///
/// Each call is admitted only while the bucket holds the token it reserves,
/// so the calls admitted, counted at their settled costs, spend at most the
/// budget, what refilled meanwhile, and what the calls in flight when it ran
/// out cost beyond their estimates: at most 16 × (150 − 1). The store caps
/// the debt at one full budget, so the bucket never owes more than a minute
/// of refill: no `Retry-After` and no quota says longer than 60 s (plus the
/// token a call reserves). And the budget did run out: a call is refused
/// only once the bucket holds less than its token, so the calls admitted
/// cost at least the 1,000 tokens it held (settlements lost would admit
/// nearly every call, far beyond the bound; settlements charged twice,
/// less than the budget).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_budget_holds_across_two_processes() {
    const TASKS: u64 = 16;
    const PER_TASK: u64 = 12;
    const ESTIMATE: u64 = 1;
    const MOST: u64 = 150;
    const KEY: &str = "shared";
    let server = RedisServer::start();
    let url = server.url();
    let processes = [
        spawn_listening("token_budget", &["--redis", &url], START_TIMEOUT),
        spawn_listening("token_budget", &["--redis", &url], START_TIMEOUT),
    ];
    let bases: Vec<String> = processes.iter().map(|p| p.base.clone()).collect();
    let client = client();

    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..TASKS {
        let (client, bases) = (client.clone(), bases.clone());
        tasks.spawn(async move {
            // (tokens admitted, Retry-After of each refusal)
            let mut admitted = Vec::new();
            let mut refusals = Vec::new();
            for n in 0..PER_TASK {
                let base = &bases[usize::try_from((task + n) % 2).expect("small")];
                let tokens = 50 + (task * 37 + n * 53) % (MOST - 50 + 1);
                let reply = Reply::read(
                    client
                        .post(format!("{base}/v1/complete?tokens={tokens}"))
                        .header("x-api-key", KEY),
                )
                .await;
                match reply.status {
                    200 => {
                        assert!(reply.header(COST_HEADER).is_none(), "{reply:?}");
                        admitted.push(tokens);
                    }
                    429 => refusals.push(reply.header("retry-after").map(|v| {
                        v.parse::<u64>()
                            .unwrap_or_else(|_| panic!("Retry-After {v:?}"))
                    })),
                    other => panic!("{base}: {other}: {reply:?}"),
                }
            }
            (admitted, refusals)
        });
    }
    let answers = tokio::time::timeout(Duration::from_secs(15), tasks.join_all())
        .await
        .expect("every task done within 15 s");
    let elapsed = started.elapsed();
    let (admitted, refusals): (Vec<u64>, Vec<Option<u64>>) = answers.into_iter().fold(
        (Vec::new(), Vec::new()),
        |(mut admitted, mut refusals), (a, r)| {
            admitted.extend(a);
            refusals.extend(r);
            (admitted, refusals)
        },
    );
    let spent: u64 = admitted.iter().sum();

    // A minute's refill over the time the calls took, and a second more.
    let elapsed_ms = u64::try_from(elapsed.as_millis()).expect("short");
    let refilled = (elapsed_ms + 1_000) * TOKENS_PER_MINUTE / 60_000 + 1;
    let in_flight = TASKS * (MOST - ESTIMATE);
    let bound = TOKENS_PER_MINUTE + refilled + in_flight;
    assert!(
        spent <= bound,
        "{spent} tokens in {} calls admitted over {elapsed:?}: beyond {TOKENS_PER_MINUTE} + \
         {refilled} refilled + {in_flight} in flight",
        admitted.len()
    );
    assert!(
        spent >= TOKENS_PER_MINUTE,
        "{spent} tokens admitted, yet calls were refused: settlements charged more than the calls cost"
    );
    assert!(
        !refusals.is_empty(),
        "no call refused; {spent} tokens admitted"
    );
    for wait in &refusals {
        let wait = wait.expect("every refusal of a key in debt has Retry-After");
        assert!(
            (1..=61).contains(&wait),
            "Retry-After {wait}: the debt is at most one budget"
        );
    }

    // Nothing calls now, so the bucket only refills: what the second
    // process reports lies between two reports of the first.
    let before = quota_of(&client, &bases[0], KEY).await;
    let other = quota_of(&client, &bases[1], KEY).await;
    let after = quota_of(&client, &bases[0], KEY).await;
    for quota in [&before, &other, &after] {
        assert_eq!(field(quota, "limit"), TOKENS_PER_MINUTE, "{quota}");
        assert!(field(quota, "retry_after_ms") <= 60_060, "{quota}");
    }
    for (name, rising) in [
        ("remaining", true),
        ("retry_after_ms", false),
        ("reset_after_ms", false),
    ] {
        let (first, middle, last) = (
            field(&before, name),
            field(&other, name),
            field(&after, name),
        );
        let in_order = if rising {
            first <= middle && middle <= last
        } else {
            first >= middle && middle >= last
        };
        assert!(in_order, "{name}: {before} then {other} then {after}");
    }
    if before["in_debt"] == after["in_debt"] {
        assert_eq!(other["in_debt"], before["in_debt"], "{before} {other}");
    }
    eprintln!(
        "{spent} tokens in {} calls admitted, {} refused, over {elapsed:?}; \
         bound {bound}; quota {other}",
        admitted.len(),
        refusals.len()
    );
}

/// A settling rule with an estimate of 0 (a peek; `Rule::cost(0)`, which a
/// configuration file refuses) whose service never sends the named header
/// (a typo in its name, a handler that forgot it, a streaming reply that
/// writes it as a trailer): each response is charged 1, not the estimate
/// of 0, so the limit holds instead of every request passing free: 3 of 20
/// pass a limit of 2 (a peek admits while the bucket holds zero tokens or
/// more, and the third's charge takes it into debt), and the debt keeps the
/// rest out.
#[tokio::test]
async fn a_cost_header_never_sent_is_charged_one_on_an_estimate_of_zero() {
    let tokens = named("tokens", Policy::token_bucket(2, Rate::per_hour(2)));
    let store = still_store();
    let rule = Rule::new(tokens, ratelimit_tower::HeaderKey::from_static("x-api-key"))
        .cost(0)
        .settle(Settlement::from_static_header("x-tokens-used"))
        .expect("a token bucket settles");
    // The service answers with `x-token-used` (the typo), never `x-tokens-used`.
    let service =
        RateLimitLayer::with_rules(store, rule).layer(service_fn(|_req: Request<String>| {
            ready(Ok::<_, Infallible>(
                Response::builder()
                    .header("x-token-used", "1")
                    .body(String::from("ok"))
                    .expect("response"),
            ))
        }));
    let mut passed = 0;
    for _ in 0..20 {
        let mut req = Request::get("/").body(String::new()).expect("request");
        req.headers_mut()
            .insert("x-api-key", HeaderValue::from_static("k1"));
        let response = service.clone().oneshot(req).await.expect("infallible");
        if response.status() == StatusCode::OK {
            passed += 1;
        }
    }
    assert_eq!(passed, 3, "requests of one API key passing a limit of 2");
}

/// An estimate of 0 reserves nothing: every request in flight at once
/// passes before any is charged (20 concurrent requests of one key under a
/// limit of 2, each costing 1). A configuration file refuses it, naming the
/// field.
#[test]
fn a_configured_estimate_of_zero_is_refused() {
    let error = Config::from_toml(
        "[policies.tokens]\nalgorithm = \"token-bucket\"\nlimit = 2\nrate = \"2/h\"\n\
         [[rules]]\npolicy = \"tokens\"\nkey = \"header:x-api-key\"\n\
         settle = { header = \"x-tokens-used\", estimate = 0 }\n",
    )
    .expect_err("an estimate of 0");
    assert_eq!(error.path(), "rules[0].settle.estimate", "{error}");
}
