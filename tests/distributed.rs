//! The `distributed` example as real processes: three instances share one
//! Redis (or one Redis Cluster), and a burst of concurrent requests spread
//! across them is admitted exactly up to the limit, for every algorithm.
//!
//! Everything runs on loopback and is bounded in time: servers and instances
//! are killed when dropped, every HTTP request has a timeout, and windows are
//! long enough that nothing refills while a test runs.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::{Duration, Instant};

use ratelimit_tests::{ChildGuard, RedisCluster, RedisServer, example_binary, free_port};
use tokio::sync::Barrier;

/// How long an instance may take to print `listening on http://ADDR`.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The timeout of every HTTP request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Instances per shared limit.
const INSTANCES: usize = 3;

/// Concurrent requests sent to each instance in a burst.
const PER_INSTANCE: usize = 30;

/// The `distributed` example, built once per test binary.
fn binary() -> &'static PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| example_binary("distributed"))
}

/// A running instance of the example, killed when dropped.
struct Instance {
    _process: ChildGuard,
    base: String,
}

/// Spawns an instance on a free loopback port with `args` after `--listen`,
/// and waits for its `listening on http://ADDR` line.
fn spawn_instance(args: &[&str]) -> Instance {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut command = Command::new(binary());
    command
        .arg("--listen")
        .arg(&listen)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut process = ChildGuard::spawn(&mut command).expect("spawning the distributed example");
    let stdout = process.child().stdout.take().expect("piped stdout");
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let result = BufReader::new(stdout).read_line(&mut line).map(|_| line);
        let _ = sender.send(result);
    });
    let line = receiver
        .recv_timeout(START_TIMEOUT)
        .unwrap_or_else(|_| panic!("no line on stdout within {START_TIMEOUT:?} ({args:?})"))
        .expect("reading stdout");
    assert_eq!(
        line.trim_end(),
        format!("listening on http://{listen}"),
        "first line on stdout ({args:?}); did the process exit?"
    );
    Instance {
        _process: process,
        base: format!("http://{listen}"),
    }
}

/// Spawns [`INSTANCES`] instances with the same `args`.
fn spawn_instances(args: &[&str]) -> Vec<Instance> {
    (0..INSTANCES).map(|_| spawn_instance(args)).collect()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .expect("an HTTP client")
}

/// One answer: status, `Retry-After` (when present), body.
#[derive(Debug)]
struct Answer {
    status: u16,
    retry_after: Option<u64>,
    body: String,
}

async fn get(client: &reqwest::Client, url: &str, api_key: &str) -> Answer {
    let response = client
        .get(url)
        .header("x-api-key", api_key)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = response.status().as_u16();
    let retry_after = response.headers().get("retry-after").map(|v| {
        v.to_str()
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("Retry-After in delay-seconds, not {v:?}"))
    });
    let body = response.text().await.unwrap_or_default();
    Answer {
        status,
        retry_after,
        body,
    }
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
    for algorithm in [
        "fixed-window",
        "sliding-log",
        "sliding-window",
        "token-bucket",
        "gcra",
        "leaky-bucket",
        "concurrency",
    ] {
        let started = Instant::now();
        // Concurrency: at most 5 in flight, leases far longer than the test.
        // The others: 20 per day, so nothing refills (and no fixed window
        // boundary passes) during the burst.
        let (limit, window, path) = if algorithm == "concurrency" {
            (5, "1h", "/slow")
        } else {
            (20, "1d", "/")
        };
        let limit_text = limit.to_string();
        let instances = spawn_instances(&[
            "--redis",
            &url,
            "--algorithm",
            algorithm,
            "--limit",
            &limit_text,
            "--window",
            window,
        ]);
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
    let url = redis.url();
    let instances = spawn_instances(&[
        "--redis",
        &url,
        "--algorithm",
        "fixed-window",
        "--limit",
        "25",
        "--window",
        "1d",
    ]);
    let client = client();
    let mut next = instances.iter().map(|i| i.base.as_str()).cycle();
    let mut ask = async |path: &str| {
        let url = format!("{}{path}", next.next().expect("an instance"));
        get(&client, &url, "expensive-test").await
    };

    for expected_left in [15, 5] {
        let answer = ask("/expensive").await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(remaining_in(&answer.body, 25), expected_left, "{answer:?}");
    }
    let denied = ask("/expensive").await;
    assert_eq!(denied.status, 429, "a third /expensive: {denied:?}");
    assert!(denied.retry_after.is_some_and(|s| s >= 1), "{denied:?}");

    for expected_left in (0..5).rev() {
        let answer = ask("/").await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(remaining_in(&answer.body, 25), expected_left, "{answer:?}");
    }
    let denied = ask("/").await;
    assert_eq!(denied.status, 429, "a sixth /: {denied:?}");
    assert!(denied.retry_after.is_some_and(|s| s >= 1), "{denied:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_share_one_limit_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let common = [
        "--cluster",
        "--algorithm",
        "gcra",
        "--limit",
        "20",
        "--window",
        "1d",
    ];
    // The three ways to name the nodes: the flag repeated, a comma-separated
    // list, and one node (the others are discovered).
    let repeated: Vec<&str> = urls.iter().flat_map(|u| ["--redis", u.as_str()]).collect();
    let listed = urls.join(",");
    let instances = vec![
        spawn_instance(&[repeated.as_slice(), &common].concat()),
        spawn_instance(&[&["--redis", listed.as_str()][..], &common].concat()),
        spawn_instance(&[&["--redis", urls[1].as_str()][..], &common].concat()),
    ];
    let answers = burst(&instances, "/", "cluster-key").await;
    assert_exactly(&answers, 20, "gcra on a Redis Cluster");
}

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    let good = [
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

    let cases: Vec<(Vec<String>, &str)> = vec![
        (with("--algorithm", "nope"), "--algorithm"),
        (with("--limit", "0"), "--limit"),
        (with("--limit", "many"), "--limit"),
        (with("--window", "10 parsecs"), "--window"),
        (with("--listen", "localhost"), "--listen"),
        (with("--redis", "127.0.0.1:6379"), "--redis"),
        (without("--window"), "missing --window"),
        (without("--redis"), "missing --redis"),
        (two_redis, "--cluster"),
        (unknown, "--bogus"),
    ];
    for (args, expected) in cases {
        let output = Command::new(binary())
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("running the distributed example");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(stderr.contains("usage: distributed"), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}: nothing on stdout");
    }
}

#[test]
fn bad_failure_timeout_and_instances_flags_exit_2_naming_the_flag() {
    let good = [
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
    let cases: [(&[&str], &str); 8] = [
        (&["--failure", "sometimes"], "--failure"),
        (&["--failure", "open", "--failure", "closed"], "--failure"),
        (&["--failure"], "--failure"),
        (&["--timeout", "0ms"], "--timeout"),
        (&["--timeout", "soon"], "--timeout"),
        (&["--instances", "0"], "--instances"),
        (&["--instances", "-1"], "--instances"),
        (&["--instances", "99999999999"], "--instances"),
    ];
    for (extra, expected) in cases {
        let output = Command::new(binary())
            .args(good)
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .expect("running the distributed example");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(expected), "{extra:?}: {stderr}");
        assert!(stderr.contains("usage: distributed"), "{extra:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{extra:?}: nothing on stdout");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_is_not_rate_limited_and_says_ok_without_fallback() {
    let redis = RedisServer::start();
    let url = redis.url();
    let instance = spawn_instance(&[
        "--redis",
        &url,
        "--algorithm",
        "fixed-window",
        "--limit",
        "1",
        "--window",
        "1d",
    ]);
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
    let common = [
        "--redis",
        url.as_str(),
        "--algorithm",
        "sliding-log",
        "--limit",
        "8",
        "--window",
        "1h",
        "--timeout",
        "50ms",
    ];
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
