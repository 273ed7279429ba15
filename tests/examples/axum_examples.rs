//! The axum examples `per_route_cost`, `custom_key` and `tiers`, each run as a
//! real process on a free loopback port (`PORT`) and asked by a real HTTP
//! client: one budget drained across routes at each route's price, tenants
//! limited independently, and tiers looked up per API key. A client that
//! sends a new key (a new tenant) with every request gets no more than its
//! address's limit.
//!
//! The examples use the wall clock, so the tests pick numbers that do not move
//! within a fast run (a refill interval far longer than the requests take),
//! and where a refill could intervene (`per_route_cost`, one unit every
//! 600 ms) a run that took too long is repeated with a fresh key.

use std::time::{Duration, Instant};

use ratelimit_tests::loopback::{Reply, client};
use ratelimit_tests::{Listening, spawn_on_env_port};
use serde_json::Value;

/// An example serving on loopback, stopped on drop.
struct Example {
    listening: Listening,
    client: reqwest::Client,
}

impl Example {
    /// Builds and starts the example `name` on a free port, and waits for it.
    fn start(name: &str) -> Example {
        Example {
            listening: spawn_on_env_port(name, Duration::from_secs(30)),
            client: client(),
        }
    }

    /// `GET path` with `headers`.
    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        let mut request = self.client.get(format!("{}{path}", self.listening.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        Reply::read(request).await
    }

    /// Sends `n` requests to `path`, the `i`th with the header `name` set to
    /// `<prefix>-<i>` (a new value each time); returns how many passed. Each
    /// refusal (`<what> <i>`) is the address's quota, `per-ip`.
    async fn passed_rotating(
        &self,
        path: &str,
        (name, prefix): (&str, &str),
        n: usize,
        what: &str,
    ) -> usize {
        let mut passed = 0;
        for i in 0..n {
            let value = format!("{prefix}-{i}");
            let reply = self.get(path, &[(name, &value)]).await;
            match reply.status {
                200 => passed += 1,
                _ => {
                    reply.assert_quota_exceeded(&format!("{what} {i}"), "per-ip");
                }
            }
        }
        passed
    }
}

/// The members of a reply's `RateLimit`: each policy's name, `r` and `t`.
trait Members {
    fn ratelimit_members(&self) -> Vec<(String, i64, i64)>;
}

impl Members for Reply {
    fn ratelimit_members(&self) -> Vec<(String, i64, i64)> {
        let value = self
            .header("ratelimit")
            .unwrap_or_else(|| panic!("no RateLimit: {self:?}"));
        let list: sfv::List = sfv::Parser::new(value).parse().expect("an RFC 9651 list");
        list.iter()
            .map(|entry| {
                let sfv::ListEntry::Item(item) = entry else {
                    panic!("RateLimit {value:?}: an inner list");
                };
                let name = item.bare_item.as_string().expect("sf-string").as_str();
                let param = |key: &str| -> i64 {
                    item.params
                        .iter()
                        .find(|(k, _)| k.as_str() == key)
                        .and_then(|(_, v)| v.as_integer())
                        .map(i64::from)
                        .unwrap_or_else(|| panic!("RateLimit {value:?}: no integer {key}"))
                };
                (name.to_owned(), param("r"), param("t"))
            })
            .collect()
    }
}

/// What these tests read of a [`Reply`].
trait ReplyExt {
    /// `Retry-After`, a whole number of seconds.
    fn retry_after(&self) -> u64;
    /// The single member of `RateLimit`: its policy name, `r` and `t`.
    fn ratelimit(&self) -> (String, i64, i64);
    /// The `r` and `t` of `policy`'s member of `RateLimit`.
    fn ratelimit_of(&self, policy: &str) -> (i64, i64);
    /// The body as JSON.
    fn json(&self) -> Value;
    /// A problem+json refusal with `status` (asked with `headers`).
    fn assert_problem(&self, status: u16, headers: &[(&str, &str)]);
    /// A quota refusal: 429, `Retry-After` equal to the `t` of `policy`'s
    /// member, a problem+json body naming `policy`. Returns `Retry-After`.
    fn assert_quota_exceeded(&self, what: &str, policy: &str) -> u64;
}

impl ReplyExt for Reply {
    fn assert_problem(&self, status: u16, headers: &[(&str, &str)]) {
        assert_eq!(self.status, status, "{headers:?}: {self:?}");
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json")
        );
        assert_eq!(self.json()["status"], status);
    }

    fn retry_after(&self) -> u64 {
        self.header("retry-after")
            .unwrap_or_else(|| panic!("no Retry-After: {self:?}"))
            .parse()
            .expect("Retry-After in delay-seconds")
    }

    fn ratelimit(&self) -> (String, i64, i64) {
        let members = self.ratelimit_members();
        let [member] = members.as_slice() else {
            panic!("RateLimit {members:?}: one item expected");
        };
        member.clone()
    }

    fn ratelimit_of(&self, policy: &str) -> (i64, i64) {
        let members = self.ratelimit_members();
        let mut named = members.iter().filter(|(name, _, _)| name == policy);
        let Some((_, r, t)) = named.next() else {
            panic!("RateLimit {members:?}: no member {policy:?}");
        };
        assert!(named.next().is_none(), "{policy:?} twice in {members:?}");
        (*r, *t)
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{:?}: {e}", self.body))
    }

    fn assert_quota_exceeded(&self, what: &str, policy: &str) -> u64 {
        assert_eq!(self.status, 429, "{what}: {self:?}");
        let retry_after = self.retry_after();
        let (_, t) = self.ratelimit_of(policy);
        assert_eq!(i64::try_from(retry_after).unwrap(), t, "{what}: {self:?}");
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{what}"
        );
        let body = self.json();
        assert_eq!(
            body["type"], "https://iana.org/assignments/http-problem-types#quota-exceeded",
            "{what}"
        );
        assert_eq!(body["violated-policies"], serde_json::json!([policy]));
        assert_eq!(body["retry-after"], retry_after, "{what}");
        retry_after
    }
}

/// Whether the per-route-cost script ran fast enough for its numbers to be
/// exact: the GCRA budget refills one unit every 600 ms.
const FAST_ENOUGH: Duration = Duration::from_millis(500);

/// `GET /search` costs 1 and `GET /export` 10 from one budget of 100 units a
/// minute per `x-api-key`.
#[tokio::test]
async fn per_route_cost_drains_one_budget_across_routes() {
    let example = Example::start("per_route_cost");
    // (path, cost): 9 exports (90 units), a search (91), an export that does
    // not fit in the 9 left, 9 searches (100), then nothing fits.
    let mut script = vec![("/export", 10); 9];
    script.push(("/search", 1));
    script.push(("/export", 10));
    script.extend([("/search", 1); 9]);
    script.push(("/search", 1));
    script.push(("/export", 10));

    for attempt in 1..=5 {
        let key = format!("demo-key-{attempt}");
        let started = Instant::now();
        let mut replies = Vec::with_capacity(script.len());
        for (path, _) in &script {
            replies.push(example.get(path, &[("x-api-key", &key)]).await);
        }
        if started.elapsed() >= FAST_ENOUGH {
            eprintln!(
                "attempt {attempt} took {:?}, refills may have happened: again",
                started.elapsed()
            );
            continue;
        }

        let mut spent: u64 = 0;
        for (i, ((path, cost), reply)) in script.iter().zip(&replies).enumerate() {
            let what = format!("request {} ({path}, {spent} spent)", i + 1);
            assert_eq!(
                reply.header("ratelimit-policy"),
                Some(r#""per-ip";q=1000;w=60, "api";q=100;w=60"#),
                "{what}"
            );
            let fits = spent + cost <= 100;
            if fits {
                spent += cost;
            }
            let (r, t) = reply.ratelimit_of("api");
            // What a request of cost 1 could still take: exactly 100 - spent.
            assert_eq!(r, i64::try_from(100 - spent).unwrap(), "{what}: {reply:?}");
            if fits {
                assert_eq!(reply.status, 200, "{what}: {reply:?}");
                assert!(reply.header("retry-after").is_none(), "{what}");
                assert!(
                    reply
                        .body
                        .contains(&format!("{} of 100 units left", 100 - spent)),
                    "{what}: {:?}",
                    reply.body
                );
                // Full again once every unit spent has come back, 600 ms
                // each, less the time the script has run.
                let full = i64::try_from((spent * 600).div_ceil(1000)).unwrap();
                assert!(
                    (full - 1..=full).contains(&t),
                    "{what}: t={t}, {full} expected"
                );
            } else {
                let retry_after = reply.assert_quota_exceeded(&what, "api");
                // The units missing, back at one per 600 ms.
                let missing = cost - (100 - spent);
                assert_eq!(retry_after, (missing * 600).div_ceil(1000), "{what}");
            }
        }
        assert_eq!(spent, 100);

        // Another key has its own budget.
        let other = example
            .get("/search", &[("x-api-key", &format!("other-key-{attempt}"))])
            .await;
        assert_eq!(other.status, 200);
        assert_eq!(other.ratelimit_of("api").0, 99);

        // No key: refused, and waiting would not help (no Retry-After).
        let anonymous = example.get("/export", &[]).await;
        assert_eq!(anonymous.status, 429, "{anonymous:?}");
        assert!(anonymous.header("retry-after").is_none());
        assert!(anonymous.header("ratelimit").is_none());
        assert_eq!(anonymous.json()["type"], "about:blank");
        return;
    }
    panic!("the script never ran within {FAST_ENOUGH:?}");
}

/// Per-tenant token buckets of 5, keyed by a closure over `x-tenant`.
#[tokio::test]
async fn custom_key_limits_tenants_independently() {
    let example = Example::start("custom_key");
    let policy = r#""per-ip";q=20;w=60, "per-tenant";q=5;w=60"#;

    for remaining in (0..5).rev() {
        let reply = example.get("/", &[("x-tenant", "acme")]).await;
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.header("ratelimit-policy"), Some(policy));
        // One token back every 12 s: exact within this test.
        assert_eq!(
            reply.ratelimit_of("per-tenant").0,
            remaining,
            "acme, {remaining} left: {reply:?}"
        );
        assert!(
            reply
                .body
                .contains(&format!("{remaining} of 5 left (per-tenant)")),
            "{:?}",
            reply.body
        );
    }
    let denied = example.get("/", &[("x-tenant", "acme")]).await;
    let retry_after = denied.assert_quota_exceeded("acme, sixth", "per-tenant");
    assert!((1..=12).contains(&retry_after), "Retry-After {retry_after}");
    assert_eq!(denied.ratelimit_of("per-tenant").0, 0);

    // Another tenant is not affected by acme's burst.
    let globex = example.get("/", &[("x-tenant", "globex")]).await;
    assert_eq!(globex.status, 200, "{globex:?}");
    assert_eq!(globex.ratelimit_of("per-tenant"), (4, 12));

    // No tenant, or an empty one: 400, not limited, nothing spent.
    for headers in [&[][..], &[("x-tenant", "")][..]] {
        let reply = example.get("/", headers).await;
        reply.assert_problem(400, headers);
        assert!(reply.header("retry-after").is_none());
        assert!(reply.header("ratelimit").is_none());
    }
    assert_eq!(
        example
            .get("/", &[("x-tenant", "globex")])
            .await
            .ratelimit_of("per-tenant")
            .0,
        3
    );
    assert_eq!(example.get("/", &[("x-tenant", "acme")]).await.status, 429);
}

/// A new key with every request: the address's budget passes, and nothing
/// more, whatever the keys; a request naming yet another key is refused
/// too. `per_route_cost`: a new `x-api-key` with every export, 1,000 units
/// a minute at 10 each, and the address's budget is spent on `/search` as
/// well. `custom_key`: a new `x-tenant` with every request, 20 a minute.
#[tokio::test]
async fn a_new_key_per_request_is_limited_by_its_address() {
    // (example, path, the header rotated, requests, how many pass, where
    // the next request goes)
    let cases = [
        (
            "per_route_cost",
            "/export",
            "x-api-key",
            110,
            100,
            "/search",
        ),
        ("custom_key", "/", "x-tenant", 30, 20, "/"),
    ];
    for (name, path, header, n, budget, then) in cases {
        let example = Example::start(name);
        let passed = example
            .passed_rotating(path, (header, "rotating"), n, name)
            .await;
        assert_eq!(
            passed, budget,
            "{name}: {n} requests, each naming a new key"
        );
        let next = example.get(then, &[(header, "never-seen")]).await;
        next.assert_quota_exceeded(&format!("{name}: {then} with a new key"), "per-ip");
    }
}

/// Free and pro tiers per API key, an allowlisted internal key, unknown and
/// missing keys refused.
#[tokio::test]
async fn tiers_free_pro_internal_and_unknown() {
    let example = Example::start("tiers");

    // Missing and unknown keys: 401, before any quota.
    for headers in [&[][..], &[("x-api-key", "no-such-key")][..]] {
        let reply = example.get("/", headers).await;
        reply.assert_problem(401, headers);
        assert!(reply.header("www-authenticate").is_some());
        assert!(reply.header("ratelimit").is_none());
    }

    // (tier, its quota an hour, the range of Retry-After once spent): free
    // gets one back every 6 minutes, pro one every 36 s.
    for (tier, quota, retry) in [("free", 10, 355..=360), ("pro", 100, 31..=36)] {
        let key = format!("{tier}-key");
        let api_key = [("x-api-key", key.as_str())];
        for remaining in (0..quota).rev() {
            let reply = example.get("/", &api_key).await;
            assert_eq!(reply.status, 200, "{reply:?}");
            assert_eq!(
                reply.header("ratelimit-policy"),
                Some(format!(r#""{tier}";q={quota};w=3600"#).as_str())
            );
            assert_eq!(reply.ratelimit().0, tier);
            assert_eq!(reply.ratelimit().1, remaining, "{reply:?}");
            assert_eq!(
                reply.body,
                format!("{remaining} of {quota} requests left this hour ({tier} tier)\n")
            );
        }
        let denied = example.get("/", &api_key).await;
        let what = format!("{tier}, request {}", quota + 1);
        let retry_after = denied.assert_quota_exceeded(&what, tier);
        assert!(retry.contains(&retry_after), "{tier}: {retry_after}");
    }

    // Internal: never limited, no rate-limit fields.
    for i in 0..150 {
        let reply = example.get("/", &[("x-api-key", "internal-key")]).await;
        assert_eq!(reply.status, 200, "internal {i}: {reply:?}");
        assert!(reply.header("ratelimit").is_none());
        assert!(reply.header("ratelimit-policy").is_none());
        assert_eq!(reply.body, "not limited (internal)\n");
    }

    // Free is still refused.
    assert_eq!(
        example.get("/", &[("x-api-key", "free-key")]).await.status,
        429
    );
}
