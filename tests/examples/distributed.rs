//! The `distributed` example as real processes: three instances share one
//! Redis (or one Redis Cluster, or the master Redis Sentinel names), and a burst of concurrent requests spread
//! across them is admitted exactly up to the limit, for every algorithm.
//!
//! Every request also counts against its client IP: a client that sends a
//! new API key with every request gets no more than the limit.
//!
//! With `--admin`, an operator resets, penalises, rewards, blocks and
//! unblocks one client through one instance, and every instance sees it;
//! the admin API asks for its bearer token, and refuses to start beyond
//! loopback without one.
//!
//! Everything runs on loopback and is bounded in time: servers and instances
//! are killed when dropped, every HTTP request has a timeout, and windows are
//! long enough that nothing refills while a test runs.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimit_core::AlgorithmKind;
use ratelimit_tests::loopback::{Answer, client, get, get_by_ip};
use ratelimit_tests::sentinels::MASTER_NAME;
use ratelimit_tests::{
    Listening, RedisCluster, RedisSentinels, RedisServer, assert_refuses_flags, example_binary,
    flags, free_port, spawn_listening,
};
use ratelimit_tower::HeaderKey;
use tokio::sync::Barrier;

/// How long an instance may take to print `listening on http://ADDR`.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Instances per shared limit.
const INSTANCES: usize = 3;

/// Concurrent requests sent to each instance in a burst.
const PER_INSTANCE: usize = 30;

/// A running instance of the example, killed when dropped.
type Instance = Listening;

/// `--redis`, `--algorithm`, `--limit` and `--window`, then `more` flags.
fn policy_flags<'a>(
    redis: &'a str,
    algorithm: &'a str,
    limit: &'a str,
    window: &'a str,
    more: &[&'a str],
) -> Vec<&'a str> {
    let policy = [
        "--redis",
        redis,
        "--algorithm",
        algorithm,
        "--limit",
        limit,
        "--window",
        window,
    ];
    [&policy[..], more].concat()
}

/// The admin API's token in these tests.
const ADMIN_TOKEN: &str = "test-admin-token-0123456789abcdef";

/// Spawns an instance with `args`, `--admin` on a free loopback port and
/// `--admin-token` [`ADMIN_TOKEN`]; returns it and the admin address.
fn spawn_with_admin(args: &[&str]) -> (Instance, String) {
    let admin_addr = format!("127.0.0.1:{}", free_port());
    let admin = ["--admin", admin_addr.as_str(), "--admin-token", ADMIN_TOKEN];
    let instance = spawn_instance(&[args, &admin[..]].concat());
    (instance, admin_addr)
}

/// Spawns an instance on a free loopback port with `args` after `--listen`,
/// and waits for its `listening on http://ADDR` line.
fn spawn_instance(args: &[&str]) -> Instance {
    spawn_listening("distributed", args, START_TIMEOUT)
}

/// Spawns with `spawn` what serves a fixed window of `limit` per 1,000 days
/// (no window edge falls within a test) on `redis`.
fn per_1000_days<T>(redis: &RedisServer, limit: &str, spawn: fn(&[&str]) -> T) -> T {
    let url = redis.url();
    spawn(&policy_flags(&url, "fixed-window", limit, "1000d", &[]))
}

/// Spawns [`INSTANCES`] instances with the same `args`.
/// Three instances with `common` after the `nodes` named each its own way:
/// `flag` repeated before each node, `flag` once before a comma-separated
/// list, and `flag` before the node `one` alone.
fn spawn_three_ways(flag: &str, nodes: &[String], one: usize, common: &[&str]) -> Vec<Instance> {
    let repeated: Vec<&str> = nodes.iter().flat_map(|n| [flag, n.as_str()]).collect();
    let listed = nodes.join(",");
    vec![
        spawn_instance(&[repeated.as_slice(), common].concat()),
        spawn_instance(&[&[flag, listed.as_str()][..], common].concat()),
        spawn_instance(&[&[flag, nodes[one].as_str()][..], common].concat()),
    ]
}

fn spawn_instances(args: &[&str]) -> Vec<Instance> {
    (0..INSTANCES).map(|_| spawn_instance(args)).collect()
}

/// Sends [`PER_INSTANCE`] requests for `path` to every instance at once (all
/// released together by a barrier), with the same `api_key`.
async fn burst(instances: &[Instance], path: &str, api_key: &str) -> Vec<Answer> {
    let client = client();
    let total = instances.len() * PER_INSTANCE;
    let barrier = Arc::new(Barrier::new(total));
    let mut tasks = Vec::with_capacity(total);
    for instance in instances {
        for _ in 0..PER_INSTANCE {
            let client = client.clone();
            let barrier = Arc::clone(&barrier);
            let url = format!("{}{path}", instance.base);
            let api_key = api_key.to_owned();
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                get(&client, &url, &api_key).await
            }));
        }
    }
    let mut answers = Vec::with_capacity(total);
    for task in tasks {
        answers.push(task.await.expect("request task"));
    }
    answers
}

/// Asserts exactly `limit` answers are 200 and the others 429 with a
/// `Retry-After` of at least 1 s, and that the admitted requests saw every
/// remaining quota from `limit - 1` down to 0 once: the instances drew from
/// one budget, one decision at a time.
fn assert_exactly(answers: &[Answer], limit: usize, what: &str) {
    let mut statuses = BTreeMap::new();
    for answer in answers {
        *statuses.entry(answer.status).or_insert(0_usize) += 1;
    }
    let expected = BTreeMap::from([(200, limit), (429, answers.len() - limit)]);
    assert_eq!(
        statuses,
        expected,
        "{what}: statuses (status → count); first answers: {:?}",
        &answers[..answers.len().min(5)]
    );
    for answer in answers.iter().filter(|a| a.status == 429) {
        let retry = answer
            .retry_after
            .unwrap_or_else(|| panic!("{what}: a 429 without Retry-After: {answer:?}"));
        assert!(retry >= 1, "{what}: Retry-After {retry}");
    }
    let mut remaining: Vec<usize> = answers
        .iter()
        .filter(|a| a.status == 200)
        .map(|a| remaining_in(&a.body, limit))
        .collect();
    remaining.sort_unstable();
    assert_eq!(
        remaining,
        (0..limit).collect::<Vec<_>>(),
        "{what}: remaining quota seen by the admitted requests"
    );
}

/// The `N` of an answer `...: N of LIMIT left (...)`.
fn remaining_in(body: &str, limit: usize) -> usize {
    let marker = format!(" of {limit} left");
    body.split_once(&marker)
        .and_then(|(head, _)| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no \"N of {limit} left\" in {body:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_share_one_limit_for_every_algorithm() {
    let redis = RedisServer::start();
    let url = redis.url();
    let client = client();
    for kind in AlgorithmKind::ALL {
        let algorithm = kind.name();
        let started = Instant::now();
        // Concurrency: at most 5 in flight, leases far longer than the test.
        // The others: 20 per 50 days, so nothing refills (and no window
        // boundary passes) during the burst; 50 days is about the longest
        // window a sliding counter of the IP limit, 1,000, takes (limit times
        // window at most 2^52 µs).
        let (limit, window, path) = if kind == AlgorithmKind::Concurrency {
            (5, "1h", "/slow")
        } else {
            (20, "50d", "/")
        };
        let limit_text = limit.to_string();
        // The warm-up's requests come from the burst's address: room for both.
        let more = ["--ip-limit", "1000"];
        let instances = spawn_instances(&policy_flags(&url, algorithm, &limit_text, window, &more));
        // Open each instance's Redis connection and load the scripts with
        // another key, so the burst's checks all land well within /slow's second.
        for instance in &instances {
            let warm_up = get(&client, &format!("{}/", instance.base), "warm-up").await;
            assert_eq!(warm_up.status, 200, "{algorithm}: warm-up {warm_up:?}");
        }
        let api_key = format!("key-{algorithm}");
        let answers = burst(&instances, path, &api_key).await;
        assert_exactly(&answers, limit, algorithm);
        eprintln!("{algorithm}: exact in {:?}", started.elapsed());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expensive_requests_cost_ten_from_the_same_budget() {
    let redis = RedisServer::start();
    let instances = per_1000_days(&redis, "25", spawn_instances);
    let client = client();
    let mut next = instances.iter().map(|i| i.base.as_str()).cycle();
    let mut ask = async |path: &str| {
        let url = format!("{}{path}", next.next().expect("an instance"));
        get(&client, &url, "expensive-test").await
    };

    // (path, what is left after each allowed request): two /expensive take
    // 20 of 25 and a third is denied; then five / take the last 5 and a sixth
    // is denied.
    let script: [(&str, &[usize]); 2] = [("/expensive", &[15, 5]), ("/", &[4, 3, 2, 1, 0])];
    for (path, lefts) in script {
        for &expected_left in lefts {
            let answer = ask(path).await;
            assert_eq!(answer.status, 200, "{path}: {answer:?}");
            assert_eq!(remaining_in(&answer.body, 25), expected_left, "{answer:?}");
        }
        let denied = ask(path).await;
        let nth = lefts.len() + 1;
        assert_eq!(denied.status, 429, "{path} number {nth}: {denied:?}");
        assert!(denied.retry_after.is_some_and(|s| s >= 1), "{denied:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_share_one_limit_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    // A per-IP budget far from the key's: what is left is the key's alone.
    let common = flags("--cluster --algorithm gcra --limit 20 --window 1d --ip-limit 1000");
    // One node alone: the others are discovered.
    let instances = spawn_three_ways("--redis", &urls, 1, &common);
    let answers = burst(&instances, "/", "cluster-key").await;
    assert_exactly(&answers, 20, "gcra on a Redis Cluster");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_share_one_limit_behind_redis_sentinel() {
    let set = tokio::task::spawn_blocking(RedisSentinels::start)
        .await
        .expect("starting the sentinels");
    let addresses = set.addresses();
    let common = format!("--master-name {MASTER_NAME} --algorithm gcra --limit 20 --window 1d");
    let common = flags(&common);
    let instances = spawn_three_ways("--sentinel", &addresses, 2, &common);
    let answers = burst(&instances, "/", "sentinel-key").await;
    assert_exactly(&answers, 20, "gcra behind Redis Sentinel");
    drop(instances);
    drop(set);
}

/// Flags the example accepts (it then fails to reach Redis): each bad-flag
/// case changes one of them or adds one.
const GOOD_FLAGS: [&str; 10] = [
    "--listen",
    "127.0.0.1:1",
    "--redis",
    "redis://127.0.0.1:1",
    "--algorithm",
    "gcra",
    "--limit",
    "10",
    "--window",
    "1m",
];

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    let good = GOOD_FLAGS;
    let with = |flag: &str, value: &str| -> Vec<String> {
        let mut args: Vec<String> = good.iter().map(|s| (*s).to_owned()).collect();
        let at = args.iter().position(|a| a == flag).expect("a known flag");
        args[at + 1] = value.to_owned();
        args
    };
    let without = |flag: &str| -> Vec<String> {
        let mut args: Vec<String> = good.iter().map(|s| (*s).to_owned()).collect();
        let at = args.iter().position(|a| a == flag).expect("a known flag");
        args.drain(at..at + 2);
        args
    };
    let mut two_redis = with("--redis", "redis://127.0.0.1:1");
    two_redis.extend(["--redis".to_owned(), "redis://127.0.0.1:2".to_owned()]);
    let mut unknown = with("--limit", "10");
    unknown.push("--bogus".to_owned());

    // clap's messages quote the flag with its value name ('--limit <N>'),
    // which the usage line it may add never does.
    let mut sentinel_and_redis = with("--limit", "10");
    sentinel_and_redis
        .extend(["--sentinel", "127.0.0.1:1", "--master-name", "m"].map(String::from));
    let mut sentinel_alone = without("--redis");
    sentinel_alone.extend(["--sentinel".to_owned(), "127.0.0.1:1".to_owned()]);
    let mut name_alone = with("--limit", "10");
    name_alone.extend(["--master-name".to_owned(), "m".to_owned()]);
    let mut sentinel_cluster = sentinel_alone.clone();
    sentinel_cluster.extend(["--master-name", "m", "--cluster"].map(String::from));
    let mut sentinel_region = sentinel_alone.clone();
    sentinel_region.extend(
        [
            "--master-name",
            "m",
            "--region",
            "eu",
            "--peer",
            "us=redis://127.0.0.1:2",
        ]
        .map(String::from),
    );
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            sentinel_and_redis,
            "'--redis <URL>' cannot be used with '--sentinel <HOST:PORT>'",
        ),
        (sentinel_alone, "not provided:\n  --master-name <NAME>"),
        (name_alone, "--master-name: give the sentinels"),
        (
            sentinel_cluster,
            "'--sentinel <HOST:PORT>' cannot be used with '--cluster'",
        ),
        (sentinel_region, "--region"),
        (with("--algorithm", "nope"), "'--algorithm <NAME>'"),
        (with("--limit", "0"), "'--limit <N>'"),
        (with("--limit", "many"), "'--limit <N>'"),
        (with("--window", "10 parsecs"), "'--window <DURATION>'"),
        (with("--window", "0s"), "'--window <DURATION>'"),
        (with("--listen", "localhost"), "'--listen <ADDR>'"),
        (with("--redis", "127.0.0.1:6379"), "'--redis <URL>'"),
        (without("--window"), "not provided:\n  --window <DURATION>"),
        (without("--redis"), "not provided:\n  --redis <URL>"),
        (two_redis, "need --cluster"),
        (unknown, "'--bogus'"),
    ];
    for (args, expected) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_refuses_flags("distributed", &args, expected);
    }
}

#[test]
fn bad_failure_timeout_and_instances_flags_exit_2_naming_the_flag() {
    let good = GOOD_FLAGS;
    let cases: [(&[&str], &str); 15] = [
        (&["--failure", "sometimes"], "'--failure <MODE>'"),
        (
            &["--failure", "open", "--failure", "closed"],
            "'--failure <MODE>' cannot be used multiple times",
        ),
        (&["--failure"], "'--failure <MODE>'"),
        (&["--timeout", "0ms"], "'--timeout <DURATION>'"),
        (&["--timeout", "soon"], "'--timeout <DURATION>'"),
        (&["--instances", "0"], "'--instances <N>'"),
        (&["--instances", "-1"], "'--instances <N>'"),
        (&["--instances", "99999999999"], "'--instances <N>'"),
        (&["--admin", "localhost:9091"], "'--admin <ADDR>'"),
        (&["--ip-limit", "0"], "'--ip-limit <N>'"),
        (&["--ip-limit", "lots"], "'--ip-limit <N>'"),
        (&["--admin"], "'--admin <ADDR>'"),
        // The admin API never shares the public listener, nor the metrics one.
        (&["--admin", "127.0.0.1:1"], "not --listen's"),
        (&["--admin", "0.0.0.0:1"], "not --listen's"),
        (
            &["--metrics", "127.0.0.1:2", "--admin", "127.0.0.1:2"],
            "not --metrics'",
        ),
    ];
    for (extra, expected) in cases {
        assert_refuses_flags("distributed", &[&good[..], extra].concat(), expected);
    }
}

#[test]
fn help_describes_the_admin_api() {
    let output = Command::new(example_binary("distributed"))
        .arg("--help")
        .env("RATELIMIT_ADMIN_TOKEN", ADMIN_TOKEN)
        .stdin(Stdio::null())
        .output()
        .expect("running the distributed example");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(!stdout.contains(ADMIN_TOKEN), "the token shows: {stdout}");
    assert!(stdout.contains("Usage: distributed"), "{stdout}");
    for needle in [
        "--admin <ADDR>",
        "--admin-token <TOKEN>",
        "RATELIMIT_ADMIN_TOKEN",
        "--ip-limit <N>",
        "Bearer",
        "loopback",
        "/admin/keys/KEY/penalize?amount=N",
        "/admin/keys/KEY/block?for=DURATION",
        "sha256sum",
    ] {
        assert!(stdout.contains(needle), "{needle:?} in {stdout}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_is_not_rate_limited_and_says_ok_without_fallback() {
    let redis = RedisServer::start();
    let instance = per_1000_days(&redis, "1", spawn_instance);
    let client = client();
    let root = format!("{}/", instance.base);
    let health = format!("{}/health", instance.base);
    assert_eq!(get(&client, &root, "health-key").await.status, 200);
    assert_eq!(get(&client, &root, "health-key").await.status, 429);
    for _ in 0..5 {
        let answer = get(&client, &health, "health-key").await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.body, "ok\n", "{answer:?}");
        assert_eq!(answer.retry_after, None, "{answer:?}");
    }
}

/// With Redis down from the start: `closed` refuses, `open` lets everything
/// through, `fallback` enforces the limit divided among `--instances` (and
/// its `/health` shows the breaker open).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failure_flag_decides_what_a_dead_redis_means() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    redis.stop();
    // Two keys from one address: its budget (20 per instance while Redis is
    // down) leaves each key its own.
    let common = policy_flags(
        url.as_str(),
        "sliding-log",
        "8",
        "1h",
        &["--timeout", "50ms", "--ip-limit", "80"],
    );
    let closed = spawn_instance(&common);
    let explicit_closed = spawn_instance(&[&common[..], &["--failure", "closed"]].concat());
    let open = spawn_instance(&[&common[..], &["--failure", "open"]].concat());
    let fallback =
        spawn_instance(&[&common[..], &["--failure", "fallback", "--instances", "4"]].concat());
    let client = client();
    let statuses = async |instance: &Instance| {
        let mut statuses = BTreeMap::new();
        for _ in 0..12 {
            let answer = get(&client, &format!("{}/", instance.base), "dead-redis").await;
            *statuses.entry(answer.status).or_insert(0_usize) += 1;
        }
        statuses
    };
    assert_eq!(statuses(&closed).await, BTreeMap::from([(503, 12)]));
    assert_eq!(
        statuses(&explicit_closed).await,
        BTreeMap::from([(503, 12)])
    );
    assert_eq!(statuses(&open).await, BTreeMap::from([(200, 12)]));
    // 8 divided among 4 instances: 2 each.
    assert_eq!(
        statuses(&fallback).await,
        BTreeMap::from([(200, 2), (429, 10)])
    );
    let answer = get(&client, &format!("{}/", fallback.base), "dead-redis-2").await;
    assert!(answer.body.contains("1 of 2 left"), "{answer:?}");
    let health = get(&client, &format!("{}/health", fallback.base), "").await;
    assert_eq!((health.status, health.body.as_str()), (200, "open\n"));
    let health = get(&client, &format!("{}/health", open.base), "").await;
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
}

/// The key the limiter gives this test's requests without `x-api-key`: the
/// client IP.
const LOOPBACK_KEY: &str = "127.0.0.1";

/// An admin API answer: status and JSON body (`Null` when there is none).
#[derive(Debug)]
struct AdminAnswer {
    status: u16,
    json: serde_json::Value,
}

impl AdminAnswer {
    /// The `remaining` of a decision, asserting a `200` decision of `limit`.
    fn remaining(&self, limit: u64) -> u64 {
        assert_eq!(self.status, 200, "{self:?}");
        assert_eq!(self.json["limit"], limit, "{self:?}");
        self.json["remaining"]
            .as_u64()
            .unwrap_or_else(|| panic!("no remaining: {self:?}"))
    }

    /// Asserts a JSON error of `status` whose message mentions `mentions`.
    fn assert_error(&self, status: u16, mentions: &str, what: &str) {
        assert_eq!(self.status, status, "{what}: {self:?}");
        let message = self.json["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: no JSON error: {self:?}"));
        assert!(message.contains(mentions), "{what}: {self:?}");
    }
}

/// Sends an admin request (`GET` when `post` is false) to `url`, with the
/// token.
async fn admin(client: &reqwest::Client, post: bool, url: &str) -> AdminAnswer {
    let request = if post {
        client.post(url)
    } else {
        client.get(url)
    };
    admin_request(request.bearer_auth(ADMIN_TOKEN), url).await
}

async fn admin_request(request: reqwest::RequestBuilder, url: &str) -> AdminAnswer {
    let response = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    let body = response.text().await.unwrap_or_default();
    let json = if body.is_empty() {
        serde_json::Value::Null
    } else {
        assert_eq!(
            content_type.as_deref(),
            Some("application/json"),
            "{url}: {status} {body}"
        );
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{url}: {status} {body:?}: {e}"))
    };
    AdminAnswer { status, json }
}

/// Two instances share one Redis, the first with `--admin`: what the
/// operator does there holds on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_resets_blocks_and_unblocks_a_client_on_every_instance() {
    let redis = RedisServer::start();
    let url = redis.url();
    // 5 per day: nothing refills while the test runs (one unit per 4.8 h).
    let common = policy_flags(url.as_str(), "gcra", "5", "1d", &[]);
    let (with_admin, admin_addr) = spawn_with_admin(&common);
    let plain = spawn_instance(&common);
    let client = client();
    let keys = format!("http://{admin_addr}/admin/keys/{LOOPBACK_KEY}");
    let request =
        async |instance: &Instance| get_by_ip(&client, &format!("{}/", instance.base)).await;
    let expect_left = async |instance: &Instance, left: usize, what: &str| {
        let answer = request(instance).await;
        assert_eq!(answer.status, 200, "{what}: {answer:?}");
        assert_eq!(remaining_in(&answer.body, 5), left, "{what}: {answer:?}");
    };

    // The client uses up its budget, across both instances: refused on both.
    for left in (0..5).rev() {
        let instance = if left % 2 == 0 { &with_admin } else { &plain };
        expect_left(instance, left, "spending the budget").await;
    }
    for instance in [&with_admin, &plain] {
        let answer = request(instance).await;
        assert_eq!(answer.status, 429, "exhausted: {answer:?}");
    }
    let peek = admin(&client, false, &keys).await;
    assert_eq!(peek.remaining(5), 0, "{peek:?}");
    assert_eq!(peek.json["key"], LOOPBACK_KEY, "{peek:?}");
    assert_eq!(peek.json["policy"], "gcra-5-at-5-per-1d", "{peek:?}");

    // Reset through the admin listener: a full budget again on both, and
    // peeks (two, agreeing) consume nothing of it.
    let reset = admin(&client, true, &format!("{keys}/reset")).await;
    assert_eq!((reset.status, &reset.json), (204, &serde_json::Value::Null));
    let first = admin(&client, false, &keys).await;
    let second = admin(&client, false, &keys).await;
    assert_eq!(first.remaining(5), 5, "{first:?}");
    assert_eq!(second.remaining(5), 5, "{second:?}");
    assert_eq!(first.json["allowed"], true, "{first:?}");
    assert_eq!(
        first.json["retry_after_ms"],
        serde_json::Value::Null,
        "{first:?}"
    );
    expect_left(&with_admin, 4, "after the reset").await;
    expect_left(&plain, 3, "after the reset").await;

    // Penalties and rewards move `remaining` by their amount.
    let penalized = admin(&client, true, &format!("{keys}/penalize?amount=2")).await;
    assert_eq!(penalized.remaining(5), 1, "{penalized:?}");
    let rewarded = admin(&client, true, &format!("{keys}/reward?amount=1")).await;
    assert_eq!(rewarded.remaining(5), 2, "{rewarded:?}");
    assert_eq!(admin(&client, false, &keys).await.remaining(5), 2);

    // Blocked for 60 s: refused on both, with a Retry-After of about 60 s,
    // whatever the budget says; the block consumes nothing.
    let block = admin(&client, true, &format!("{keys}/block?for=60s")).await;
    assert_eq!(block.status, 204, "{block:?}");
    for instance in [&with_admin, &plain] {
        let answer = request(instance).await;
        assert_eq!(answer.status, 429, "blocked: {answer:?}");
        let retry = answer.retry_after.unwrap_or_else(|| panic!("{answer:?}"));
        assert!(
            (50..=60).contains(&retry),
            "Retry-After {retry}: {answer:?}"
        );
    }
    let blocked = admin(&client, false, &keys).await;
    assert_eq!(blocked.remaining(5), 0, "{blocked:?}");
    assert_eq!(blocked.json["allowed"], false, "{blocked:?}");
    let retry_ms = blocked.json["retry_after_ms"].as_u64().unwrap_or_default();
    assert!((50_000..=60_000).contains(&retry_ms), "{blocked:?}");

    // A browser sent by a web page cannot unblock it.
    let from_page = admin_request(
        client
            .post(format!("{keys}/unblock"))
            .bearer_auth(ADMIN_TOKEN)
            .header("origin", "https://attacker.example"),
        "unblock with Origin",
    )
    .await;
    from_page.assert_error(403, "browser", "unblock with Origin");
    assert_eq!(request(&plain).await.status, 429, "still blocked");

    // Unblocked: both instances serve it again, from the budget it had.
    let unblock = admin(&client, true, &format!("{keys}/unblock")).await;
    assert_eq!(unblock.status, 204, "{unblock:?}");
    expect_left(&plain, 1, "after the unblock").await;
    expect_left(&with_admin, 0, "after the unblock").await;

    // Bad input: 400 with a JSON error naming what is wrong, and nothing done.
    admin(&client, true, &format!("{keys}/reset")).await;
    for (path, mentions) in [
        ("penalize?amount=lots", "amount"),
        ("penalize?amount=0", "amount"),
        ("penalize?amount=-3", "amount"),
        ("penalize?amount=99999999999999999999999", "amount"),
        ("penalize", "amount"),
        ("reward?amount=1&amount=2", "amount"),
        ("reward?amunt=1", "amunt"),
        ("block?for=60", "for"),
        ("block?for=soon", "for"),
        ("block?for=0s", "for"),
        ("block?for=500ns", "for"),
        ("block", "for"),
        ("reset?amount=1", "amount"),
        ("unblock?for=1s", "for"),
    ] {
        let answer = admin(&client, true, &format!("{keys}/{path}")).await;
        answer.assert_error(400, mentions, path);
    }
    let peek_with_query = admin(&client, false, &format!("{keys}?x=1")).await;
    peek_with_query.assert_error(400, "\"x\"", "a peek with a query");
    assert_eq!(admin(&client, false, &keys).await.remaining(5), 5);

    // Neither public listener serves the admin API, and the admin listener
    // serves nothing else.
    for instance in [&with_admin, &plain] {
        let peek = get_by_ip(
            &client,
            &format!("{}/admin/keys/{LOOPBACK_KEY}", instance.base),
        )
        .await;
        assert_eq!(peek.status, 404, "{peek:?}");
        let penalize = admin(
            &client,
            true,
            &format!(
                "{}/admin/keys/{LOOPBACK_KEY}/penalize?amount=5",
                instance.base
            ),
        )
        .await;
        assert_eq!(penalize.status, 404, "{penalize:?}");
    }
    assert_eq!(admin(&client, false, &keys).await.remaining(5), 5);
    let root = get_by_ip(&client, &format!("http://{admin_addr}/")).await;
    assert_eq!(root.status, 404, "{root:?}");
}

/// A client with an `x-api-key` is keyed by `#` and 32 hex digits of the
/// SHA-256 of its key (`%23...` in the URL), separately from its IP.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_api_key_client_is_reset_by_the_hash_of_its_key() {
    let redis = RedisServer::start();
    let url = redis.url();
    // 2 per key, 10 per address: the address keeps room after the key's 2.
    let (instance, admin_addr) = spawn_with_admin(&policy_flags(
        &url,
        "fixed-window",
        "2",
        "1d",
        &["--ip-limit", "10"],
    ));
    let client = client();
    let root = format!("{}/", instance.base);
    for expected in [200, 200, 429] {
        assert_eq!(get(&client, &root, "customer-7").await.status, expected);
    }
    let hashed = HeaderKey::from_static("x-api-key").key_for(b"customer-7");
    let hashed = String::from_utf8(hashed.as_bytes().to_vec()).expect("hex");
    let hex = hashed.strip_prefix('#').expect("a # first");
    assert_eq!(hex.len(), 32, "{hashed}");
    let keys = format!("http://{admin_addr}/admin/keys");

    // The IP's own budget as a client is untouched (its budget as an
    // address has 8 of 10 left); the API key's is spent.
    let by_ip = admin(&client, false, &format!("{keys}/{LOOPBACK_KEY}")).await;
    assert_eq!(by_ip.remaining(2), 2, "{by_ip:?}");
    let by_key = admin(&client, false, &format!("{keys}/%23{hex}")).await;
    assert_eq!(by_key.remaining(2), 0, "{by_key:?}");
    assert_eq!(by_key.json["key"], hashed.as_str(), "{by_key:?}");

    let reset = admin(&client, true, &format!("{keys}/%23{hex}/reset")).await;
    assert_eq!(reset.status, 204, "{reset:?}");
    let answer = get(&client, &root, "customer-7").await;
    assert_eq!(answer.status, 200, "after the reset: {answer:?}");
    assert_eq!(remaining_in(&answer.body, 2), 1, "{answer:?}");
}

/// Penalties and rewards of a concurrency limit are 409; with Redis gone,
/// every operation is 503, even with `--failure open`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_operations_refuse_concurrency_adjustments_and_need_redis() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    // A timeout long enough for a loaded machine's first call: with Redis
    // stopped, calls are refused at once anyway.
    let failing_open = flags("--timeout 5s --failure open");
    let (instance, admin_addr) =
        spawn_with_admin(&policy_flags(&url, "concurrency", "3", "1h", &failing_open));
    let client = client();
    let keys = format!("http://{admin_addr}/admin/keys/{LOOPBACK_KEY}");
    let peek = admin(&client, false, &keys).await;
    assert_eq!(peek.remaining(3), 3, "{peek:?}");
    for operation in ["penalize", "reward"] {
        let answer = admin(&client, true, &format!("{keys}/{operation}?amount=1")).await;
        answer.assert_error(409, operation, operation);
    }
    let block = admin(&client, true, &format!("{keys}/block?for=1h")).await;
    assert_eq!(block.status, 204, "blocks apply to concurrency: {block:?}");
    let refused = get_by_ip(&client, &format!("{}/", instance.base)).await;
    assert_eq!(refused.status, 429, "{refused:?}");

    redis.stop();
    for (post, path) in [
        (false, ""),
        (true, "/reset"),
        (true, "/unblock"),
        (true, "/block?for=1m"),
    ] {
        let answer = admin(&client, post, &format!("{keys}{path}")).await;
        answer.assert_error(503, "unavailable", path);
    }
    // The limiter itself fails open, as asked.
    let open = get_by_ip(&client, &format!("{}/", instance.base)).await;
    assert_eq!(open.status, 200, "{open:?}");
}

/// A client that sends a new `x-api-key` with every request, spread across
/// three instances: no more than the limit passes (its address's budget,
/// `--limit` by default, `--ip-limit` when given), and Redis holds no more
/// keys than the requests admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_api_key_per_request_passes_no_more_than_the_limit() {
    let client = client();
    for (more, limit) in [(&[][..], 5), (&["--ip-limit", "8"][..], 8)] {
        let redis = RedisServer::start();
        let url = redis.url();
        let instances = spawn_instances(&policy_flags(&url, "gcra", "5", "1d", more));
        let mut passed = 0;
        for i in 0..30 {
            let instance = &instances[i % INSTANCES];
            let answer = get(&client, &format!("{}/", instance.base), &format!("k-{i}")).await;
            match answer.status {
                200 => passed += 1,
                429 => assert!(answer.body.contains("per-ip-gcra-"), "{answer:?}"),
                _ => panic!("{more:?}: {answer:?}"),
            }
        }
        assert_eq!(passed, limit, "{more:?}: 30 requests, each with a new key");
        // The address's key, and one per admitted request's API key.
        let keys: usize = redis.cli(&["DBSIZE"]).trim().parse().expect("DBSIZE");
        assert!(keys <= limit + 1, "{more:?}: {keys} keys in Redis");
    }
}

/// The admin API on loopback with a token: nothing without
/// `Authorization: Bearer` and the token (`401` naming the scheme), anything
/// with it, given by the flag or by `RATELIMIT_ADMIN_TOKEN`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_admin_api_asks_for_its_token() {
    let redis = RedisServer::start();
    let url = redis.url();
    let common = policy_flags(&url, "gcra", "5", "1d", &[]);
    let client = client();

    let from_flag = spawn_with_admin(&common);
    let admin_addr = format!("127.0.0.1:{}", free_port());
    let from_env = ratelimit_tests::spawn_listening_with_env(
        "distributed",
        &[&common[..], &["--admin", admin_addr.as_str()]].concat(),
        &[("RATELIMIT_ADMIN_TOKEN", ADMIN_TOKEN)],
        START_TIMEOUT,
    );
    for (instance, admin_addr) in [(&from_flag.0, &from_flag.1), (&from_env, &admin_addr)] {
        let keys = format!("http://{admin_addr}/admin/keys/{LOOPBACK_KEY}");
        let spend = get_by_ip(&client, &format!("{}/", instance.base)).await;
        assert_eq!(spend.status, 200, "{spend:?}");
        let wrong = format!("{ADMIN_TOKEN}x");
        let refused: [(&str, Option<String>); 5] = [
            ("no Authorization", None),
            ("a wrong token", Some(format!("Bearer {wrong}"))),
            (
                "a prefix of the token",
                Some(format!("Bearer {}", &ADMIN_TOKEN[..20])),
            ),
            ("another scheme", Some(format!("Basic {ADMIN_TOKEN}"))),
            ("the scheme alone", Some(String::from("Bearer "))),
        ];
        for (what, authorization) in refused {
            for (post, path) in [(false, ""), (true, "/reset"), (true, "/block?for=1h")] {
                let request = if post {
                    client.post(format!("{keys}{path}"))
                } else {
                    client.get(format!("{keys}{path}"))
                };
                let request = match &authorization {
                    Some(value) => request.header("authorization", value),
                    None => request,
                };
                let response = request.send().await.expect("an answer");
                assert_eq!(response.status().as_u16(), 401, "{what}, {path:?}");
                let challenge = response.headers()["www-authenticate"].to_str().unwrap();
                assert!(challenge.starts_with("Bearer"), "{what}: {challenge}");
                let body = response.text().await.unwrap();
                assert!(body.contains("Bearer"), "{what}: {body}");
            }
        }
        // Nothing was reset or blocked: the request above still counts.
        let peek = admin(&client, false, &keys).await;
        assert_eq!(peek.remaining(5), 4, "{peek:?}");
        // The scheme in any case.
        let lower = client
            .post(format!("{keys}/reset"))
            .header("authorization", format!("bearer {ADMIN_TOKEN}"))
            .send()
            .await
            .expect("an answer");
        assert_eq!(lower.status().as_u16(), 204);
        assert_eq!(admin(&client, false, &keys).await.remaining(5), 5);
    }
}

/// Beyond loopback the admin API needs a token, which must be long enough;
/// the refusals never echo a token.
#[test]
fn the_admin_api_is_not_served_beyond_loopback_without_a_token() {
    let good = GOOD_FLAGS;
    let admin = format!("0.0.0.0:{}", free_port());
    let admin_v6 = format!("[::]:{}", free_port());
    let short = ["--admin", "127.0.0.1:2", "--admin-token", "hunter2"];
    let spaced = ["--admin-token", "sixteen chars or more"];
    let cases: [(&[&str], &str); 4] = [
        (&["--admin", &admin], "not a loopback address"),
        (&["--admin", &admin_v6], "--admin-token"),
        (
            &short,
            "--admin-token: a token of 7 characters is too short",
        ),
        (
            &[&["--admin", "127.0.0.1:2"][..], &spaced].concat(),
            "visible ASCII",
        ),
    ];
    for (extra, expected) in cases {
        assert_refuses_flags("distributed", &[&good[..], extra].concat(), expected);
    }
}

/// On loopback without a token the admin API is served unauthenticated, and
/// the example says so on stderr when it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_admin_api_on_loopback_without_a_token_is_announced() {
    use std::io::{BufRead, BufReader};

    let redis = RedisServer::start();
    let url = redis.url();
    let listen = format!("127.0.0.1:{}", free_port());
    let admin_addr = format!("127.0.0.1:{}", free_port());
    let mut args = vec!["--listen", listen.as_str(), "--admin", admin_addr.as_str()];
    args.extend(policy_flags(&url, "gcra", "5", "1d", &[]));
    let mut command = Command::new(example_binary("distributed"));
    command
        .args(&args)
        .env_remove("RATELIMIT_ADMIN_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut process = ratelimit_tests::ChildGuard::spawn(&mut command).expect("spawning");
    let stderr = process.child().stderr.take().expect("piped stderr");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + START_TIMEOUT;
    let warning = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = receiver
            .recv_timeout(left)
            .expect("a warning about the token on stderr");
        if line.starts_with("warning: the admin API") {
            break line;
        }
    };
    assert!(warning.contains("no token"), "{warning}");
    assert!(warning.contains("RATELIMIT_ADMIN_TOKEN"), "{warning}");

    let keys = format!("http://{admin_addr}/admin/keys/{LOOPBACK_KEY}");
    let peek = admin_request(client().get(&keys), &keys).await;
    assert_eq!(peek.remaining(5), 5, "{peek:?}");
}
