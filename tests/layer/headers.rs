//! Every rate-limit header, byte for byte, over loopback: real axum servers on
//! `127.0.0.1:0` (with `ConnectInfo`, so requests are keyed by peer IP) asked
//! by a real HTTP client. The stores run on a [`ManualClock`], so every `t`
//! and `Retry-After` is computed by hand from the policy and asserted exactly.
//!
//! - every algorithm with one policy: `RateLimit-Policy`, `RateLimit` and
//!   `Retry-After` on allowed and denied responses;
//! - a per-IP and a global limit on one route: two list members, in order,
//!   whichever of them denies;
//! - the legacy `X-RateLimit-*` fields, with the reset in delay-seconds and in
//!   Unix epoch seconds;
//! - on every response: both IETF fields parse as RFC 9651 lists (the `sfv`
//!   crate) of sf-strings with exactly the integer parameters `q`,`w` /
//!   `r`,`t`; on every denial, `Retry-After` is an integer of at least 1 equal
//!   to the largest `t` of the denying members, and the body is
//!   `application/problem+json` of type `quota-exceeded` naming them;
//! - [`ratelimit_axum::Limiter`] checked inside a handler (login attempts per
//!   username from a JSON body), alone, twice in one response, and behind a
//!   layer: the response carries both the limiter's and the layer's
//!   policies, and a handler's own fields can neither loosen the layer's nor
//!   make it send an invalid field;
//! - the quickstart example's sixth response;
//! - in process, on four threads: the fields of a single-policy rule (whose
//!   `RateLimit-Policy` the layer keeps and copies) and of a two-policy rule,
//!   byte for byte what `RateLimitHeaders::apply` writes from nothing.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::Router;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use ratelimit_axum::{Limiter, QuotaExceeded};
use ratelimit_core::clock::ManualClock;
use ratelimit_core::{MemoryStore, Policy, Rate};
use ratelimit_tests::loopback::{Reply, client};
use ratelimit_tests::{named, spawn_on_env_port};
use ratelimit_tower::headers::{RateLimitHeaders, ResetFormat};
use ratelimit_tower::{GlobalKey, PeerIp, RateLimitLayer, Rule};
use serde_json::Value;
use tokio::sync::{mpsc, watch};

/// The problem type of a request over its quota.
const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// Where the manual clocks start, in µs: a whole multiple of 20 s (and of
/// 900 s), so aligned windows of 10 s and 20 s start exactly here.
const BASE: u64 = 1_700_000_000_000_000;

/// A store on a manual clock.
type Store = MemoryStore<ManualClock>;

/// A store whose clock reads `micros`, and the clock.
fn store_at(micros: u64) -> (Store, ManualClock) {
    let clock = ManualClock::new(micros);
    (MemoryStore::builder().clock(clock.clone()).build(), clock)
}

/// Serves `app` on a fresh loopback port, in this runtime, with the peer
/// address as `ConnectInfo`. Returns its base URL.
pub(super) async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serve");
    });
    format!("http://{addr}")
}

/// The current Unix time in whole seconds, rounded down.
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// One member of `RateLimit-Policy` (`q`, `w`) or `RateLimit` (`r`, `t`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Member {
    name: String,
    first: i64,
    second: i64,
}

/// Parses `value` as an RFC 9651 List whose members are sf-strings with
/// exactly the integer parameters `keys`, in that order.
fn members(field: &str, value: &str, keys: [&str; 2]) -> Vec<Member> {
    let list: sfv::List = sfv::Parser::new(value)
        .parse()
        .unwrap_or_else(|e| panic!("{field}: {value:?} is not an RFC 9651 list: {e}"));
    assert!(!list.is_empty(), "{field}: {value:?} is an empty list");
    list.into_iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else {
                panic!("{field}: {value:?} has an inner list member");
            };
            let name = item
                .bare_item
                .as_string()
                .unwrap_or_else(|| {
                    panic!(
                        "{field}: {value:?}: member {:?} is not an sf-string",
                        item.bare_item
                    )
                })
                .as_str()
                .to_owned();
            let params: Vec<(String, i64)> = item
                .params
                .iter()
                .map(|(key, bare)| {
                    let n = bare.as_integer().unwrap_or_else(|| {
                        panic!(
                            "{field}: {value:?}: parameter {key:?}={bare:?} is not an sf-integer"
                        )
                    });
                    (key.as_str().to_owned(), i64::from(n))
                })
                .collect();
            let names: Vec<&str> = params.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(names, keys, "{field}: {value:?}: parameters of {name:?}");
            Member {
                name,
                first: params[0].1,
                second: params[1].1,
            }
        })
        .collect()
}

/// Sends `request`, reads the response and checks what every response
/// must satisfy (see [`Checks::check_invariants`]).
async fn fetch(request: reqwest::RequestBuilder) -> Reply {
    let reply = Reply::read(request).await;
    reply.check_invariants();
    reply
}

/// What these tests check of a [`Reply`].
trait Checks {
    /// The `RateLimit` members (`r`, `t`).
    fn state(&self) -> Vec<Member>;
    /// The integer value of the header `name`.
    fn number(&self, name: &str) -> u64;
    /// What every response must satisfy (see the impl).
    fn check_invariants(&self);
    /// An allowed response with exactly these `RateLimit-Policy` and
    /// `RateLimit` values.
    fn assert_allowed(&self, what: &str, policy: &str, ratelimit: &str);
    /// An allowed response with exactly these `RateLimit-Policy` and
    /// `RateLimit` values, and the legacy limit, remaining and reset.
    fn assert_allowed_with_legacy(
        &self,
        what: &str,
        policy: &str,
        ratelimit: &str,
        legacy: [u64; 3],
    );
    /// A denial with exactly these fields, `Retry-After` and violated policies.
    fn assert_denied(
        &self,
        what: &str,
        policy: &str,
        ratelimit: &str,
        retry_after: u64,
        violated: &[&str],
    );
    /// A problem+json body of type `quota-exceeded`.
    fn assert_problem(&self, what: &str, retry_after: u64, violated: &[&str]);
    /// No `X-RateLimit-*` field.
    fn assert_no_legacy(&self, what: &str);
    /// Neither `RateLimit-Policy` nor `RateLimit`.
    fn assert_no_ietf(&self);
    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset` (delay-seconds).
    fn assert_legacy(&self, what: &str, limit: u64, remaining: u64, reset: u64);
}

impl Checks for Reply {
    /// The `RateLimit` members (`r`, `t`).
    fn state(&self) -> Vec<Member> {
        members(
            "RateLimit",
            self.header("ratelimit").expect("RateLimit"),
            ["r", "t"],
        )
    }

    /// The integer value of the header `name`.
    fn number(&self, name: &str) -> u64 {
        let value = self
            .header(name)
            .unwrap_or_else(|| panic!("no {name}: {self:?}"));
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}: {value:?} is not a whole number"))
    }

    /// For every response:
    ///
    /// - `RateLimit-Policy` and `RateLimit` come together, each as one list
    ///   of sf-strings with the integer parameters `q`,`w` / `r`,`t`, naming
    ///   the same policies in the same order, with `q >= 1`, `w >= 0`,
    ///   `0 <= r <= q` and `t >= 0`;
    /// - an allowed response has no `Retry-After`;
    /// - a quota refusal (429 with `Retry-After`) has `Retry-After` >= 1, a
    ///   problem+json body of type `quota-exceeded` with `status` 429, a
    ///   `title`, a `detail`, the violated policies and `retry-after` equal to
    ///   the header, and `Retry-After` equal to the largest `t` of the
    ///   violated policies' members (so never below any of them).
    fn check_invariants(&self) {
        let policy = self.header("ratelimit-policy");
        let state = self.header("ratelimit");
        assert_eq!(
            policy.is_some(),
            state.is_some(),
            "RateLimit-Policy and RateLimit come together: {self:?}"
        );
        let mut limits = Vec::new();
        if let (Some(policy), Some(state)) = (policy, state) {
            let policies = members("RateLimit-Policy", policy, ["q", "w"]);
            let states = members("RateLimit", state, ["r", "t"]);
            let names = |m: &[Member]| m.iter().map(|m| m.name.clone()).collect::<Vec<_>>();
            assert_eq!(
                names(&policies),
                names(&states),
                "the same policies in the same order: {self:?}"
            );
            for (p, s) in policies.iter().zip(&states) {
                assert!(p.first >= 1 && p.second >= 0, "q, w of {p:?}");
                assert!((0..=p.first).contains(&s.first), "r of {s:?} vs {p:?}");
                assert!(s.second >= 0, "t of {s:?}");
            }
            limits = states;
        }
        if (200..300).contains(&self.status) {
            assert!(
                self.header("retry-after").is_none(),
                "Retry-After on an allowed response: {self:?}"
            );
        }
        if self.status != 429 || self.header("retry-after").is_none() {
            return;
        }
        let retry_after = self.number("retry-after");
        assert!(retry_after >= 1, "Retry-After: {retry_after}");
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{self:?}"
        );
        let body: Value = serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("problem+json body {:?}: {e}", self.body));
        assert_eq!(body["type"], QUOTA_EXCEEDED, "{body}");
        assert_eq!(body["status"], 429, "{body}");
        assert!(
            body["title"].as_str().is_some_and(|t| !t.is_empty()),
            "{body}"
        );
        let detail = body["detail"].as_str().expect("detail");
        assert_eq!(body["retry-after"], retry_after, "{body}");
        let violated: Vec<&str> = body["violated-policies"]
            .as_array()
            .expect("violated-policies")
            .iter()
            .map(|v| v.as_str().expect("a policy name"))
            .collect();
        assert!(!violated.is_empty(), "{body}");
        let mut largest = 0;
        for name in &violated {
            assert!(detail.contains(name), "detail {detail:?} names {name}");
            if !limits.is_empty() {
                let member = limits
                    .iter()
                    .find(|m| m.name == *name)
                    .unwrap_or_else(|| panic!("{name} violated but not in RateLimit: {self:?}"));
                let t = u64::try_from(member.second).expect("t >= 0");
                assert!(
                    retry_after >= t,
                    "Retry-After {retry_after} < t of {member:?}"
                );
                largest = largest.max(t);
            }
        }
        if !limits.is_empty() {
            assert_eq!(
                retry_after, largest,
                "Retry-After is the largest t: {self:?}"
            );
        }
    }

    /// A `200` with exactly these IETF fields and no legacy ones.
    fn assert_allowed(&self, what: &str, policy: &str, state: &str) {
        assert_eq!(self.status, 200, "{what}: {self:?}");
        assert_eq!(
            self.header("ratelimit-policy"),
            Some(policy),
            "{what}: RateLimit-Policy"
        );
        assert_eq!(self.header("ratelimit"), Some(state), "{what}: RateLimit");
        self.assert_no_legacy(what);
    }

    /// A `200` with exactly these IETF fields and these legacy ones.
    fn assert_allowed_with_legacy(&self, what: &str, policy: &str, state: &str, legacy: [u64; 3]) {
        assert_eq!(self.status, 200, "{what}");
        assert_eq!(self.header("ratelimit-policy"), Some(policy), "{what}");
        assert_eq!(self.header("ratelimit"), Some(state), "{what}");
        let [limit, remaining, reset] = legacy;
        self.assert_legacy(what, limit, remaining, reset);
    }

    /// A `429` with exactly these IETF fields, `Retry-After: retry_after` and a
    /// problem+json body naming `violated`.
    fn assert_denied(
        &self,
        what: &str,
        policy: &str,
        state: &str,
        retry_after: u64,
        violated: &[&str],
    ) {
        assert_eq!(self.status, 429, "{what}: {self:?}");
        assert_eq!(
            self.header("ratelimit-policy"),
            Some(policy),
            "{what}: RateLimit-Policy"
        );
        assert_eq!(self.header("ratelimit"), Some(state), "{what}: RateLimit");
        assert_eq!(
            self.header("retry-after"),
            Some(retry_after.to_string().as_str()),
            "{what}: Retry-After"
        );
        self.assert_problem(what, retry_after, violated);
    }

    /// A problem+json body of type `quota-exceeded`.
    fn assert_problem(&self, what: &str, retry_after: u64, violated: &[&str]) {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{what}"
        );
        let body: Value = serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("{what}: problem+json body {:?}: {e}", self.body));
        assert_eq!(body["type"], QUOTA_EXCEEDED, "{what}: {body}");
        assert_eq!(body["status"], 429, "{what}: {body}");
        assert!(body["title"].is_string(), "{what}: {body}");
        assert!(body["detail"].is_string(), "{what}: {body}");
        assert_eq!(
            body["violated-policies"],
            serde_json::json!(violated),
            "{what}: {body}"
        );
        assert_eq!(body["retry-after"], retry_after, "{what}: {body}");
    }

    /// Neither `RateLimit-Policy` nor `RateLimit`.
    fn assert_no_ietf(&self) {
        assert!(self.header("ratelimit").is_none() && self.header("ratelimit-policy").is_none());
    }

    /// No `X-RateLimit-*` field.
    fn assert_no_legacy(&self, what: &str) {
        for name in [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ] {
            assert!(self.header(name).is_none(), "{what}: {name} sent: {self:?}");
        }
    }

    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset` (delay-seconds).
    fn assert_legacy(&self, what: &str, limit: u64, remaining: u64, reset: u64) {
        assert_eq!(self.number("x-ratelimit-limit"), limit, "{what}: limit");
        assert_eq!(
            self.number("x-ratelimit-remaining"),
            remaining,
            "{what}: remaining"
        );
        assert_eq!(self.number("x-ratelimit-reset"), reset, "{what}: reset");
    }
}

/// A server under test and the clock of its store.
struct Harness {
    clock: ManualClock,
    url: String,
    client: reqwest::Client,
}

impl Harness {
    /// Serves the router `app` builds from a store whose clock reads `start`.
    async fn new(start: u64, app: impl FnOnce(Store) -> Router) -> Harness {
        let (store, clock) = store_at(start);
        Harness {
            clock,
            url: serve(app(store)).await,
            client: client(),
        }
    }

    /// Moves the clock `advance_ms` forward, then asks `GET /`.
    async fn get_after(&self, advance_ms: u64) -> Reply {
        self.clock.advance(Duration::from_millis(advance_ms));
        fetch(self.client.get(&self.url)).await
    }
}

/// `GET /` limited by `layer`.
fn limited<L>(layer: L) -> Router
where
    L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<axum::extract::Request> + Clone + Send + Sync + 'static,
    <L::Service as tower::Service<axum::extract::Request>>::Response: IntoResponse + 'static,
    <L::Service as tower::Service<axum::extract::Request>>::Error:
        Into<std::convert::Infallible> + 'static,
    <L::Service as tower::Service<axum::extract::Request>>::Future: Send + 'static,
{
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(layer)
}

/// What one request should get.
#[derive(Debug, Clone, Copy)]
enum Expect<'a> {
    /// `200`.
    Allowed,
    /// `429` with this `Retry-After`, denied by these policies.
    Denied(u64, &'a [&'a str]),
}

/// One request of a script: after moving the clock `advance_ms` forward,
/// `GET /` answers `expect` with exactly this `RateLimit`.
#[derive(Debug, Clone, Copy)]
struct Step<'a> {
    advance_ms: u64,
    ratelimit: &'a str,
    expect: Expect<'a>,
}

/// An allowed step.
const fn ok(advance_ms: u64, ratelimit: &str) -> Step<'_> {
    Step {
        advance_ms,
        ratelimit,
        expect: Expect::Allowed,
    }
}

/// A denied step.
const fn no<'a>(
    advance_ms: u64,
    ratelimit: &'a str,
    retry_after: u64,
    violated: &'a [&'a str],
) -> Step<'a> {
    Step {
        advance_ms,
        ratelimit,
        expect: Expect::Denied(retry_after, violated),
    }
}

/// Runs `steps` against `harness`, whose `RateLimit-Policy` is always `policy`.
async fn run(harness: &Harness, what: &str, policy: &str, steps: &[Step<'_>]) {
    for (i, step) in steps.iter().enumerate() {
        let reply = harness.get_after(step.advance_ms).await;
        let what = format!("{what}, request {}", i + 1);
        match step.expect {
            Expect::Allowed => reply.assert_allowed(&what, policy, step.ratelimit),
            Expect::Denied(retry_after, violated) => {
                reply.assert_denied(&what, policy, step.ratelimit, retry_after, violated);
                reply.assert_no_legacy(&what);
            }
        }
    }
}

/// One policy, keyed by peer IP, on `GET /`, from a clock at `start`.
async fn run_one(policy: Policy, start: u64, expected_policy: &str, steps: &[Step<'_>]) {
    let name = policy.name().to_owned();
    let harness = Harness::new(start, |store| {
        limited(RateLimitLayer::new(store, policy, PeerIp))
    })
    .await;
    run(&harness, &name, expected_policy, steps).await;
}

#[tokio::test]
async fn fixed_window() {
    // 3 per 10 s, windows aligned on the clock; start 2.5 s into a window.
    let policy = named("fixed", Policy::fixed_window(3, Duration::from_secs(10)));
    run_one(
        policy,
        BASE + 2_500_000,
        r#""fixed";q=3;w=10"#,
        &[
            // t: until the window ends, 7.5 s, 6.5 s, 5.5 s, rounded up.
            ok(0, r#""fixed";r=2;t=8"#),
            ok(1_000, r#""fixed";r=1;t=7"#),
            ok(1_000, r#""fixed";r=0;t=6"#),
            // 5.5 s into the window: 4.5 s to go.
            no(1_000, r#""fixed";r=0;t=5"#, 5, &["fixed"]),
            // A new window: the full quota, used once, for its whole 10 s.
            ok(4_500, r#""fixed";r=2;t=10"#),
        ],
    )
    .await;
}

#[tokio::test]
async fn sliding_window_log() {
    let policy = named(
        "log",
        Policy::sliding_window_log(3, Duration::from_secs(10)),
    );
    run_one(
        policy,
        BASE,
        r#""log";q=3;w=10"#,
        &[
            // t: until the newest entry leaves the window, always 10 s here.
            ok(0, r#""log";r=2;t=10"#),
            ok(1_500, r#""log";r=1;t=10"#),
            ok(1_500, r#""log";r=0;t=10"#),
            // 4.5 s after the first entry, which frees its slot 5.5 s later.
            no(1_500, r#""log";r=0;t=6"#, 6, &["log"]),
            // 10 s after the first: its slot is free again.
            ok(5_500, r#""log";r=0;t=10"#),
        ],
    )
    .await;
}

#[tokio::test]
async fn sliding_window_counter() {
    // 3 per 10 s, aligned windows; start 2.5 s into a window.
    let policy = named(
        "counter",
        Policy::sliding_window_counter(3, Duration::from_secs(10)),
    );
    run_one(
        policy,
        BASE + 2_500_000,
        r#""counter";q=3;w=10"#,
        &[
            // t: until the current window's count has slid out: the end of
            // the next window, 17.5 s, 16.5 s, 15.5 s away.
            ok(0, r#""counter";r=2;t=18"#),
            ok(1_000, r#""counter";r=1;t=17"#),
            ok(1_000, r#""counter";r=0;t=16"#),
            // At 5.5 s: 4.5 s to the next window, where 3 previous count as
            // 3 * (10 - x) / 10 and 1 more fits once x >= 6.666666 s:
            // 4.5 + 3.333334 = 7.833334 s.
            no(1_000, r#""counter";r=0;t=8"#, 8, &["counter"]),
            // 2.5 s into the next window: 3 * 7.5 / 10 = 2.25 weighted, no
            // room for 1 before 3.333334 s: 0.833334 s.
            no(7_000, r#""counter";r=0;t=1"#, 1, &["counter"]),
            // At 3.5 s: 3 * 6.5 / 10 = 1.95, 1 fits; 16.5 s until both
            // windows' counts have slid out.
            ok(1_000, r#""counter";r=0;t=17"#),
        ],
    )
    .await;
}

#[tokio::test]
async fn token_bucket() {
    // 3 tokens, one more every 10 s: refilling an empty bucket takes 30 s.
    let policy = named(
        "bucket",
        Policy::token_bucket(3, Rate::new(1, Duration::from_secs(10))),
    );
    run_one(
        policy,
        BASE,
        r#""bucket";q=3;w=30"#,
        &[
            // t: until the bucket is full, (3 - tokens) * 10 s less the
            // progress towards the next token.
            ok(0, r#""bucket";r=2;t=10"#),
            ok(1_500, r#""bucket";r=1;t=19"#),
            ok(1_500, r#""bucket";r=0;t=27"#),
            // The next token comes 10 s after the first request: 5.5 s.
            no(1_500, r#""bucket";r=0;t=6"#, 6, &["bucket"]),
            // It came, and went at once: 30 s to a full bucket.
            ok(5_500, r#""bucket";r=0;t=30"#),
        ],
    )
    .await;
}

/// Runs the script of GCRA and the leaky bucket with a capacity of 3 and
/// one request every 10 s for `policy`: the same numbers as the token
/// bucket.
async fn run_tat(policy: Policy) {
    let name = policy.name().to_owned();
    let state = |r: u64, t: u64| format!(r#""{name}";r={r};t={t}"#);
    let states = [
        state(2, 10),
        state(1, 19),
        state(0, 27),
        state(0, 6),
        state(0, 30),
    ];
    let violated = [name.as_str()];
    let steps = [
        ok(0, &states[0]),
        ok(1_500, &states[1]),
        ok(1_500, &states[2]),
        no(1_500, &states[3], 6, &violated),
        ok(5_500, &states[4]),
    ];
    let expected_policy = format!(r#""{name}";q=3;w=30"#);
    run_one(policy, BASE, &expected_policy, &steps).await;
}

#[tokio::test]
async fn gcra() {
    // Theoretical arrival time: T+10, T+20, T+30 (t = tat - now); the fourth
    // would push it to 40 s ahead, 5.5 s past the 30 s allowed at T+4.5.
    run_tat(named(
        "gcra",
        Policy::gcra(3, Rate::new(1, Duration::from_secs(10))),
    ))
    .await;
}

#[tokio::test]
async fn leaky_bucket() {
    // GCRA's arithmetic; rejecting mode, so admitted requests are not delayed.
    run_tat(named(
        "leaky",
        Policy::leaky_bucket(3, Rate::new(1, Duration::from_secs(10))),
    ))
    .await;
}

#[tokio::test]
async fn concurrency() {
    // 2 in flight, each permit leased for 30 s. The handler holds requests
    // until the gate opens.
    let (entered_tx, mut entered) = mpsc::unbounded_channel::<()>();
    let (gate, gate_rx) = watch::channel(false);
    let hold = move || {
        let (entered, mut gate) = (entered_tx.clone(), gate_rx.clone());
        async move {
            let _ = entered.send(());
            let _ = gate.wait_for(|open| *open).await;
            "done"
        }
    };
    let policy = named("inflight", Policy::concurrency(2, Duration::from_secs(30)));
    let harness = Harness::new(BASE, |store| {
        Router::new()
            .route("/", get(hold))
            .route_layer(RateLimitLayer::new(store, policy, PeerIp))
    })
    .await;
    let expected_policy = r#""inflight";q=2;w=30"#;

    let first = tokio::spawn(fetch(harness.client.get(&harness.url)));
    entered.recv().await.expect("first request in the handler");
    // The second comes 5.5 s later, while the first is still in flight.
    harness.clock.advance(Duration::from_millis(5_500));
    let second = tokio::spawn(fetch(harness.client.get(&harness.url)));
    entered.recv().await.expect("second request in the handler");

    // 11 s after the first: its lease, the first to expire, ends in 19 s.
    let third = harness.get_after(5_500).await;
    third.assert_denied(
        "third in flight",
        expected_policy,
        r#""inflight";r=0;t=19"#,
        19,
        &["inflight"],
    );

    gate.send(true).expect("open the gate");
    // t: until every lease held has expired, 30 s after the newest.
    first.await.expect("first").assert_allowed(
        "first in flight",
        expected_policy,
        r#""inflight";r=1;t=30"#,
    );
    second.await.expect("second").assert_allowed(
        "second in flight",
        expected_policy,
        r#""inflight";r=0;t=30"#,
    );

    // Both permits are released with their response bodies: a new request
    // finds both free (released asynchronously, so allow it a moment).
    let mut last = None;
    for _ in 0..100 {
        let reply = harness.get_after(0).await;
        if reply.status == 200 && reply.header("ratelimit") == Some(r#""inflight";r=1;t=30"#) {
            reply.assert_allowed("after release", expected_policy, r#""inflight";r=1;t=30"#);
            return;
        }
        last = Some(reply);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("permits never released: {last:?}");
}

/// A per-IP policy and a global one on `GET /`, from a clock at `BASE`.
async fn two_policies(per_ip: Policy, global: Policy) -> Harness {
    Harness::new(BASE, |store| {
        limited(
            RateLimitLayer::new(store, per_ip, PeerIp).and(Rule::new(global, GlobalKey::default())),
        )
    })
    .await
}

/// `policy`, keyed by peer IP, on `GET /`, sending the fields `headers`
/// names, from a clock at `BASE`.
async fn with_headers(policy: Policy, headers: RateLimitHeaders) -> Harness {
    Harness::new(BASE, |store| {
        limited(RateLimitLayer::new(store, policy, PeerIp).headers(headers))
    })
    .await
}

/// A sliding log of `limit` per `window_s` seconds named `name`.
fn log(name: &str, limit: u64, window_s: u64) -> Policy {
    named(
        name,
        Policy::sliding_window_log(limit, Duration::from_secs(window_s)),
    )
}

#[tokio::test]
async fn two_policies_per_ip_denies() {
    let harness = two_policies(log("per-ip", 2, 10), log("global", 10, 20)).await;
    run(
        &harness,
        "per-ip denies",
        r#""per-ip";q=2;w=10, "global";q=10;w=20"#,
        &[
            ok(0, r#""per-ip";r=1;t=10, "global";r=9;t=20"#),
            ok(1_000, r#""per-ip";r=0;t=10, "global";r=8;t=20"#),
            // per-ip frees a slot 10 s after the first request; global did
            // not count the refused request and is full again 20 s after
            // the second.
            no(
                1_000,
                r#""per-ip";r=0;t=8, "global";r=8;t=19"#,
                8,
                &["per-ip"],
            ),
        ],
    )
    .await;
}

#[tokio::test]
async fn two_policies_global_denies() {
    let harness = two_policies(log("per-ip", 10, 10), log("global", 2, 20)).await;
    run(
        &harness,
        "global denies",
        r#""per-ip";q=10;w=10, "global";q=2;w=20"#,
        &[
            ok(0, r#""per-ip";r=9;t=10, "global";r=1;t=20"#),
            ok(1_000, r#""per-ip";r=8;t=10, "global";r=0;t=20"#),
            no(
                1_000,
                r#""per-ip";r=8;t=9, "global";r=0;t=18"#,
                18,
                &["global"],
            ),
        ],
    )
    .await;
}

#[tokio::test]
async fn two_policies_both_deny() {
    let harness = two_policies(log("per-ip", 2, 10), log("global", 2, 20)).await;
    run(
        &harness,
        "both deny",
        r#""per-ip";q=2;w=10, "global";q=2;w=20"#,
        &[
            ok(0, r#""per-ip";r=1;t=10, "global";r=1;t=20"#),
            ok(1_000, r#""per-ip";r=0;t=10, "global";r=0;t=20"#),
            // Retry-After is the longer of the two retries.
            no(
                1_000,
                r#""per-ip";r=0;t=8, "global";r=0;t=18"#,
                18,
                &["per-ip", "global"],
            ),
        ],
    )
    .await;
}

#[tokio::test]
async fn legacy_delay_seconds() {
    let harness = with_headers(
        log("legacy", 3, 10),
        RateLimitHeaders::ietf().with_legacy(ResetFormat::DelaySeconds),
    )
    .await;
    let policy = r#""legacy";q=3;w=10"#;
    let steps = [
        (0, r#""legacy";r=2;t=10"#, 2, 10),
        (1_500, r#""legacy";r=1;t=10"#, 1, 10),
        (1_500, r#""legacy";r=0;t=10"#, 0, 10),
    ];
    for (i, (advance_ms, state, remaining, reset)) in steps.into_iter().enumerate() {
        let reply = harness.get_after(advance_ms).await;
        let what = format!("legacy, request {}", i + 1);
        reply.assert_allowed_with_legacy(&what, policy, state, [3, remaining, reset]);
    }
    let denied = harness.get_after(1_500).await;
    denied.assert_denied(
        "legacy denied",
        policy,
        r#""legacy";r=0;t=6"#,
        6,
        &["legacy"],
    );
    denied.assert_legacy("legacy denied", 3, 0, 6);
}

#[tokio::test]
async fn legacy_fields_describe_the_tightest_policy() {
    let harness = Harness::new(BASE, |store| {
        limited(
            RateLimitLayer::new(store, log("per-ip", 10, 10), PeerIp)
                .and(Rule::new(log("global", 2, 20), GlobalKey::default()))
                .headers(RateLimitHeaders::ietf().with_legacy(ResetFormat::DelaySeconds)),
        )
    })
    .await;
    // global has the least left, then is the one that denies.
    harness.get_after(0).await.assert_legacy("first", 2, 1, 20);
    harness
        .get_after(1_000)
        .await
        .assert_legacy("second", 2, 0, 20);
    let denied = harness.get_after(1_000).await;
    assert_eq!(denied.status, 429);
    denied.assert_legacy("denied", 2, 0, 18);
    assert_eq!(denied.number("retry-after"), 18);
}

#[tokio::test]
async fn legacy_epoch_seconds() {
    let harness = with_headers(
        log("epoch", 3, 10),
        RateLimitHeaders::ietf().with_legacy(ResetFormat::EpochSeconds),
    )
    .await;
    // (advance, remaining, delay until reset, denied)
    let steps = [
        (0, 2, 10, false),
        (1_500, 1, 10, false),
        (1_500, 0, 10, false),
        (1_500, 0, 6, true),
    ];
    for (i, (advance_ms, remaining, delay, denied)) in steps.into_iter().enumerate() {
        let what = format!("epoch, request {}", i + 1);
        let before = unix_now();
        let reply = harness.get_after(advance_ms).await;
        let after = unix_now();
        assert_eq!(reply.status, if denied { 429 } else { 200 }, "{what}");
        assert_eq!(reply.number("x-ratelimit-limit"), 3, "{what}");
        assert_eq!(reply.number("x-ratelimit-remaining"), remaining, "{what}");
        // The server's now, rounded up, plus the delay.
        let reset = reply.number("x-ratelimit-reset");
        assert!(
            (before + delay..=after + delay + 1).contains(&reset),
            "{what}: X-RateLimit-Reset {reset} not now ({before}..={after}) + {delay} (+1)"
        );
        assert_eq!(
            reply.header("ratelimit"),
            Some(format!(r#""epoch";r={remaining};t={delay}"#).as_str()),
            "{what}"
        );
        if denied {
            assert_eq!(reply.number("retry-after"), delay, "{what}");
        }
    }
}

#[tokio::test]
async fn legacy_only_and_none() {
    let legacy = with_headers(log("old", 1, 10), RateLimitHeaders::legacy()).await;
    let allowed = legacy.get_after(0).await;
    assert_eq!(allowed.status, 200);
    allowed.assert_no_ietf();
    allowed.assert_legacy("legacy only", 1, 0, 10);
    let denied = legacy.get_after(2_000).await;
    assert_eq!(denied.status, 429);
    denied.assert_no_ietf();
    denied.assert_legacy("legacy only, denied", 1, 0, 8);
    denied.assert_problem("legacy only, denied", 8, &["old"]);
    assert_eq!(denied.number("retry-after"), 8);

    let none = with_headers(log("quiet", 1, 10), RateLimitHeaders::none()).await;
    let allowed = none.get_after(0).await;
    assert_eq!(allowed.status, 200);
    allowed.assert_no_ietf();
    allowed.assert_no_legacy("none");
    // Retry-After is sent on a denial whatever the header settings.
    let denied = none.get_after(2_000).await;
    assert_eq!(denied.status, 429);
    denied.assert_no_ietf();
    denied.assert_no_legacy("none, denied");
    assert_eq!(denied.number("retry-after"), 8);
    denied.assert_problem("none, denied", 8, &["quiet"]);
}

/// `POST` a login attempt for `username` as JSON.
fn login_request(client: &reqwest::Client, url: &str, username: &str) -> reqwest::RequestBuilder {
    client
        .post(url)
        .header("content-type", "application/json")
        .body(serde_json::json!({ "username": username, "password": "hunter2" }).to_string())
}

/// The login handler: checks the attempt against `logins` once the username
/// is known from the body.
async fn login(logins: Limiter<Store>, body: Value) -> Result<impl IntoResponse, QuotaExceeded> {
    let username = body["username"].as_str().unwrap_or_default().to_owned();
    let granted = logins.check(username.as_bytes(), 1).await?;
    Ok((granted, format!("checked {username}\n")))
}

/// `POST` answered by [`login`] with `logins`.
fn login_route(logins: Limiter<Store>) -> axum::routing::MethodRouter {
    post(move |Json(body): Json<Value>| login(logins.clone(), body))
}

/// Three login attempts for alice 10 s apart at `url`, each allowed with
/// `policy` and its state in `states`, then a fourth 10 s later: the three
/// allowed replies and the fourth.
async fn alice_attempts(
    client: &reqwest::Client,
    clock: &ManualClock,
    url: &str,
    policy: &str,
    states: [&str; 3],
) -> (Vec<Reply>, Reply) {
    let mut allowed = Vec::new();
    for (i, state) in states.into_iter().enumerate() {
        if i > 0 {
            clock.advance(Duration::from_secs(10));
        }
        let reply = fetch(login_request(client, url, "alice")).await;
        reply.assert_allowed(&format!("alice, attempt {}", i + 1), policy, state);
        allowed.push(reply);
    }
    clock.advance(Duration::from_secs(10));
    (allowed, fetch(login_request(client, url, "alice")).await)
}

#[tokio::test]
async fn limiter_in_a_handler() {
    // 3 attempts per username in any 15 minutes.
    let (store, clock) = store_at(BASE);
    let logins = Limiter::new(store.clone(), log("login", 3, 900));
    let legacy = Limiter::new(store, log("login-legacy", 3, 900))
        .headers(RateLimitHeaders::ietf().with_legacy(ResetFormat::DelaySeconds));
    let app = Router::new()
        .route("/login", login_route(logins))
        .route("/login-legacy", login_route(legacy));
    let base = serve(app).await;
    let (url, legacy_url) = (format!("{base}/login"), format!("{base}/login-legacy"));
    let client = client();
    let policy = r#""login";q=3;w=900"#;

    let states = [
        r#""login";r=2;t=900"#,
        r#""login";r=1;t=900"#,
        r#""login";r=0;t=900"#,
    ];
    let (allowed, denied) = alice_attempts(&client, &clock, &url, policy, states).await;
    for reply in allowed {
        assert_eq!(reply.body, "checked alice\n");
    }
    // 30 s after the first attempt, which leaves the window 870 s later.
    denied.assert_denied(
        "alice, attempt 4",
        policy,
        r#""login";r=0;t=870"#,
        870,
        &["login"],
    );
    denied.assert_no_legacy("alice, attempt 4");
    // Another username has its own attempts.
    fetch(login_request(&client, &url, "bob"))
        .await
        .assert_allowed("bob", policy, r#""login";r=2;t=900"#);

    // The same limiter with the legacy fields too.
    let policy = r#""login-legacy";q=3;w=900"#;
    for (i, remaining) in [2, 1, 0].into_iter().enumerate() {
        let reply = fetch(login_request(&client, &legacy_url, "carol")).await;
        let what = format!("carol, attempt {}", i + 1);
        let state = format!(r#""login-legacy";r={remaining};t=900"#);
        reply.assert_allowed_with_legacy(&what, policy, &state, [3, remaining, 900]);
    }
    clock.advance(Duration::from_millis(500));
    let denied = fetch(login_request(&client, &legacy_url, "carol")).await;
    // 899.5 s, rounded up.
    denied.assert_denied(
        "carol, attempt 4",
        policy,
        r#""login-legacy";r=0;t=900"#,
        900,
        &["login-legacy"],
    );
    denied.assert_legacy("carol, attempt 4", 3, 0, 900);
}

/// The login brute-force guard behind a per-client layer: the layer allows
/// every request (100 a minute per client), the handler's `Limiter` refuses
/// the fourth attempt for one username. Every response carries both
/// policies, the handler's first, as one list per field; the refusal keeps
/// the handler's `Retry-After`, the larger wait (the layer allowed it).
#[tokio::test]
async fn limiter_behind_the_layer_keeps_both_policies() {
    let (store, clock) = store_at(BASE);
    let logins = Limiter::new(store.clone(), log("login", 3, 900));
    let app = Router::new()
        .route("/login", login_route(logins))
        .layer(RateLimitLayer::new(
            store,
            log("per-client", 100, 60),
            PeerIp,
        ));
    let url = format!("{}/login", serve(app).await);
    let client = client();
    let policy = r#""login";q=3;w=900, "per-client";q=100;w=60"#;
    let states = [
        r#""login";r=2;t=900, "per-client";r=99;t=60"#,
        r#""login";r=1;t=900, "per-client";r=98;t=60"#,
        r#""login";r=0;t=900, "per-client";r=97;t=60"#,
    ];
    let (_, denied) = alice_attempts(&client, &clock, &url, policy, states).await;
    denied.assert_denied(
        "alice, attempt 4",
        policy,
        r#""login";r=0;t=870, "per-client";r=96;t=60"#,
        870,
        &["login"],
    );
    let states = denied.state();
    assert!(
        states[0].second > states[1].second,
        "Retry-After is the larger wait: {states:?}"
    );
}

/// Two limits a handler checks (per username, per client) answer with both
/// policies: the second `Granted` adds its members to the first's.
#[tokio::test]
async fn two_limiters_in_one_response_send_both_policies() {
    let (store, _clock) = store_at(BASE);
    let per_user = Limiter::new(store.clone(), log("login", 3, 900));
    let per_client = Limiter::new(store, log("login-per-client", 20, 3600));
    let app = Router::new().route(
        "/login",
        post(move |Json(body): Json<Value>| async move {
            let username = body["username"].as_str().unwrap_or_default().to_owned();
            let user = per_user.check(username.as_bytes(), 1).await?;
            let client = per_client.check(b"127.0.0.1", 1).await?;
            Ok::<_, QuotaExceeded>((user, client, "checked"))
        }),
    );
    let url = format!("{}/login", serve(app).await);
    fetch(login_request(&client(), &url, "alice"))
        .await
        .assert_allowed(
            "two limiters",
            r#""login";q=3;w=900, "login-per-client";q=20;w=3600"#,
            r#""login";r=2;t=900, "login-per-client";r=19;t=3600"#,
        );
}

/// The legacy fields of a `Limiter` behind a layer that sends them too: the
/// trio that leaves less remaining, whole.
#[tokio::test]
async fn legacy_fields_behind_the_layer_describe_the_tighter_limit() {
    let (store, clock) = store_at(BASE);
    let both = RateLimitHeaders::ietf().with_legacy(ResetFormat::DelaySeconds);
    let logins = Limiter::new(store.clone(), log("login", 3, 900)).headers(both);
    let app = Router::new()
        .route("/login", login_route(logins))
        .layer(RateLimitLayer::new(store, log("per-client", 5, 60), PeerIp).headers(both));
    let url = format!("{}/login", serve(app).await);
    let client = client();
    // (user, login remaining, per-client remaining): the trio of the lesser.
    for (i, (user, login_left, client_left)) in [
        ("alice", 2, 4),
        ("alice", 1, 3),
        ("bob", 2, 2),
        ("carol", 2, 1),
    ]
    .into_iter()
    .enumerate()
    {
        clock.advance(Duration::from_secs(1));
        let reply = fetch(login_request(&client, &url, user)).await;
        let what = format!("request {}", i + 1);
        assert_eq!(reply.status, 200, "{what}");
        if login_left <= client_left {
            reply.assert_legacy(&what, 3, login_left, 900);
        } else {
            reply.assert_legacy(&what, 5, client_left, 60);
        }
    }
}

/// A handler's own fields never loosen the layer's nor make it send an
/// invalid field: a member claiming more quota under the layer's policy
/// name gives way to the layer's; one that is not a structured-field list
/// is dropped; fields on several lines leave on one.
#[tokio::test]
async fn a_handlers_own_fields_cannot_loosen_or_break_the_layers() {
    fn with(fields: &'static [(&'static str, &'static str)]) -> axum::routing::MethodRouter {
        get(move || async move {
            let mut headers = http::HeaderMap::new();
            for (name, value) in fields {
                headers.append(*name, http::HeaderValue::from_static(value));
            }
            (headers, "ok")
        })
    }
    let (store, _clock) = store_at(BASE);
    let app = Router::new()
        .route(
            "/forged",
            with(&[
                ("ratelimit-policy", r#""per-client";q=1000000;w=1"#),
                ("ratelimit", r#""per-client";r=999999;t=0"#),
            ]),
        )
        .route(
            "/broken",
            with(&[
                ("ratelimit-policy", r#""upstream";q=5;w=9"#),
                ("ratelimit", "\"upstream"),
            ]),
        )
        .route(
            "/lines",
            with(&[
                ("ratelimit-policy", r#""a";q=5;w=9"#),
                ("ratelimit-policy", r#""b";q=7;w=9"#),
                ("ratelimit", r#""a";r=4;t=9"#),
                ("ratelimit", r#""b";r=6;t=9"#),
            ]),
        )
        .layer(RateLimitLayer::new(
            store,
            log("per-client", 100, 60),
            PeerIp,
        ));
    let base = serve(app).await;
    let client = client();
    let policy = r#""per-client";q=100;w=60"#;
    fetch(client.get(format!("{base}/forged")))
        .await
        .assert_allowed("forged", policy, r#""per-client";r=99;t=60"#);
    fetch(client.get(format!("{base}/broken")))
        .await
        .assert_allowed("broken", policy, r#""per-client";r=98;t=60"#);
    fetch(client.get(format!("{base}/lines")))
        .await
        .assert_allowed(
            "lines",
            r#""a";q=5;w=9, "b";q=7;w=9, "per-client";q=100;w=60"#,
            r#""a";r=4;t=9, "b";r=6;t=9, "per-client";r=97;t=60"#,
        );
}

#[tokio::test]
async fn quickstart_sixth_response() {
    let server = spawn_on_env_port("quickstart", Duration::from_secs(30));
    let url = format!("{}/", server.base);
    let client = client();
    let policy = r#""per-ip";q=5;w=10"#;
    for i in 0..5 {
        let reply = fetch(client.get(&url)).await;
        // A sliding log: its newest entry, this request, leaves in 10 s.
        reply.assert_allowed(
            &format!("quickstart, request {}", i + 1),
            policy,
            &format!(r#""per-ip";r={};t=10"#, 4 - i),
        );
    }
    let sixth = fetch(client.get(&url)).await;
    assert_eq!(sixth.status, 429, "{sixth:?}");
    assert_eq!(sixth.header("ratelimit-policy"), Some(policy));
    let retry_after = sixth.number("retry-after");
    // The first request's slot frees up at most 10 s after it was taken.
    assert!((1..=10).contains(&retry_after), "Retry-After {retry_after}");
    assert_eq!(
        sixth.state(),
        [Member {
            name: String::from("per-ip"),
            first: 0,
            second: i64::try_from(retry_after).unwrap(),
        }]
    );
    assert_eq!(
        sixth.header("ratelimit"),
        Some(format!(r#""per-ip";r=0;t={retry_after}"#).as_str())
    );
    sixth.assert_problem("quickstart, request 6", retry_after, &["per-ip"]);
}

/// The fields of every response from four threads on one layer, in
/// process: a single-policy rule (whose `RateLimit-Policy` the layer keeps
/// and copies into each response) and a two-policy rule (written for each
/// response) send byte for byte the fields that [`RateLimitHeaders::apply`]
/// writes from nothing, and each `r` from the limit down to 0 exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cached_fields_are_byte_for_byte_on_every_thread() {
    use ratelimit_tests::fixtures::{
        answer, by_client, fixed_window, frozen_memory, ok_service, request_from,
    };
    use ratelimit_tower::{Decisions, PolicyDecision};
    use tower::Layer;

    const PER_THREAD: u64 = 50;
    const THREADS: u64 = 4;
    let limit = PER_THREAD * THREADS;
    let window = Duration::from_secs(60);
    let api = fixed_window("api", limit, window);
    let global = fixed_window("global", limit * 2, window);
    // A clock that stays at 0: every window ends in 60 s.
    let store = frozen_memory();
    let single = RateLimitLayer::new(store.clone(), api.clone(), by_client).layer(ok_service());
    let pair = RateLimitLayer::new(store, global.clone(), GlobalKey::default())
        .and(Rule::new(fixed_window("pair", limit, window), by_client))
        .layer(ok_service());
    // What `apply` writes for a decision with `remaining` left and a full
    // window ahead, with no field cached anywhere.
    let expected = |policies: &[&Policy], remaining: &[u64]| {
        let decisions = Decisions::new(
            policies
                .iter()
                .zip(remaining)
                .map(|(&p, &r)| {
                    let d = ratelimit_core::Decision::allow(p.limit(), r, 60_000_000);
                    PolicyDecision::new(p.clone(), d)
                })
                .collect(),
        );
        let mut headers = http::HeaderMap::new();
        RateLimitHeaders::ietf().apply(&decisions, &mut headers);
        (
            headers["ratelimit-policy"].clone(),
            headers["ratelimit"].clone(),
        )
    };
    let pair_policy = fixed_window("pair", limit, window);

    let tasks = (0..THREADS).map(|_| {
        let (single, pair) = (single.clone(), pair.clone());
        tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..PER_THREAD {
                let one = answer(single.clone(), request_from("client")).await;
                let two = answer(pair.clone(), request_from("client")).await;
                seen.push((one, two));
            }
            seen
        })
    });
    let mut remaining = Vec::new();
    for task in tasks {
        for (one, two) in task.await.expect("the task") {
            assert_eq!(one.status, 200, "{one:?}");
            assert_eq!(two.status, 200, "{two:?}");
            let r = one.header("ratelimit");
            let r = r
                .strip_prefix(r#""api";r="#)
                .and_then(|rest| rest.strip_suffix(";t=60"))
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("RateLimit {r:?}"));
            let (policy, state) = expected(&[&api], &[r]);
            assert_eq!(
                one.headers["ratelimit-policy"].as_bytes(),
                policy.as_bytes()
            );
            assert_eq!(one.headers["ratelimit"].as_bytes(), state.as_bytes());
            let members: Vec<u64> = two
                .header("ratelimit")
                .split(", ")
                .map(|m| {
                    m.split(['=', ';'])
                        .nth(2)
                        .and_then(|n| n.parse().ok())
                        .expect("r")
                })
                .collect();
            let (policy, state) = expected(&[&global, &pair_policy], &members);
            assert_eq!(
                two.headers["ratelimit-policy"].as_bytes(),
                policy.as_bytes()
            );
            assert_eq!(two.headers["ratelimit"].as_bytes(), state.as_bytes());
            remaining.push(r);
        }
    }
    remaining.sort_unstable();
    assert_eq!(remaining, (0..limit).collect::<Vec<_>>());
    let denied = answer(single, request_from("client")).await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("ratelimit-policy"), r#""api";q=200;w=60"#);
}
