//! The `bench` example's contract: its flags, and one JSON line with the
//! documented fields, for the in-memory store and for Redis.

use std::process::Command;

use ratelimit_tests::{RedisServer, assert_refuses_flags, example_binary};

/// 3,000 requests from `concurrency` tasks on one key of the Redis at `url`,
/// under a fixed window of 50 per 1,000 days, with the flags `extra`.
fn on_a_hot_redis_key(url: &str, concurrency: &str, extra: &[&str]) -> serde_json::Value {
    run_bench(&format!(
        "--store redis --redis {url} --algorithm fixed-window --keys 1 \
         --concurrency {concurrency} --requests 3000 --limit 50 --window 1000d {}",
        extra.join(" ")
    ))
}

/// Runs `bench` with the flags of `command_line` (split at white space) and
/// reads its one JSON line.
fn run_bench(command_line: &str) -> serde_json::Value {
    let args: Vec<&str> = command_line.split_whitespace().collect();
    let output = Command::new(example_binary("bench"))
        .args(&args)
        .output()
        .expect("bench runs");
    assert!(
        output.status.success(),
        "bench {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one JSON line: {stdout:?}");
    serde_json::from_str(lines[0]).unwrap()
}

fn check_fields(json: &serde_json::Value, store: &str, decisions: u64) {
    for field in [
        "store",
        "algorithm",
        "keys",
        "concurrency",
        "decisions",
        "allowed",
        "denied",
        "secs",
        "per_sec",
        "p50_us",
        "p99_us",
    ] {
        assert!(json.get(field).is_some(), "missing {field}: {json}");
    }
    assert_eq!(json["store"], store);
    assert_eq!(json["decisions"], decisions);
    let (allowed, denied) = (
        json["allowed"].as_u64().unwrap(),
        json["denied"].as_u64().unwrap(),
    );
    assert_eq!(allowed + denied, decisions);
    assert!(json["per_sec"].as_f64().unwrap() > 0.0);
    assert!(json["p99_us"].as_u64().unwrap() >= json["p50_us"].as_u64().unwrap());
}

#[test]
fn bench_prints_one_json_line_for_memory() {
    let json = run_bench(
        "--store memory --algorithm gcra --keys 1 --concurrency 4 --requests 20000 \
         --limit 100 --window 1h",
    );
    check_fields(&json, "memory", 20_000);
    // One hot key with a burst of 100 and a slow refill: exactly 100 pass.
    assert_eq!(json["allowed"], 100);
    assert_eq!(json["keys"], 1);
}

#[test]
fn bench_prints_one_json_line_for_redis() {
    let server = RedisServer::start();
    let json = run_bench(&format!(
        "--store redis --redis {} --algorithm token-bucket --keys 1000 --concurrency 16 \
         --requests 5000",
        server.url()
    ));
    check_fields(&json, "redis", 5_000);
    assert_eq!(json["algorithm"], "token-bucket");
}

/// `--max-batch N`: the JSON line reports it and the mean batch (requests
/// per call); 1 turns coalescing off (mean 0, no call through it). On one
/// hot key with a burst of 50, exactly 50 pass either way.
#[test]
fn bench_max_batch_reports_the_mean_batch_and_keeps_the_limit() {
    let server = RedisServer::start();
    let url = server.url();
    for max_batch in ["64", "1"] {
        server.cli(&["FLUSHALL"]);
        let json = on_a_hot_redis_key(&url, "64", &["--max-batch", max_batch]);
        check_fields(&json, "redis", 3_000);
        assert_eq!(json["allowed"], 50, "{json}");
        assert_eq!(json["max_batch"].as_u64(), max_batch.parse().ok(), "{json}");
        let mean = json["mean_batch"].as_f64().unwrap();
        if max_batch == "1" {
            assert_eq!(mean, 0.0, "{json}");
        } else {
            assert!((1.0..=64.0).contains(&mean), "{json}");
        }
    }
}

#[test]
fn bench_rejects_bad_flags() {
    let load = ["--concurrency", "1", "--requests", "1"];
    for (bad, expected) in [
        (
            "--store disk --algorithm gcra --keys 1",
            "'--store <STORE>'",
        ),
        (
            "--store memory --algorithm nope --keys 1",
            "'--algorithm <NAME>'",
        ),
        ("--store memory --algorithm gcra --keys 0", "'--keys <N>'"),
        (
            "--store memory --algorithm gcra --keys 1 --max-batch 0",
            "'--max-batch <N>'",
        ),
        ("--algorithm gcra --keys 1", "--store <STORE>"),
        ("--print-script", "--algorithm <NAME>"),
        (
            "--store redis --cluster --pool bb8 --algorithm gcra --keys 1",
            "'--pool <POOL>'",
        ),
    ] {
        let args: Vec<&str> = bad.split_whitespace().chain(load).collect();
        assert_refuses_flags("bench", &args, expected);
    }
}

#[test]
fn bench_denied_cache_lease_and_bb8_pool_keep_the_limit_on_a_hot_redis_key() {
    let server = RedisServer::start();
    let url = server.url();
    for extra in [
        &["--denied-cache"][..],
        &["--lease", "10"][..],
        &["--pool", "bb8"][..],
    ] {
        // Each run gets its own window's worth of state: start empty.
        server.cli(&["FLUSHALL"]);
        let json = on_a_hot_redis_key(&url, "16", extra);
        check_fields(&json, "redis", 3_000);
        // A window's worth passes and nothing more (leases spend only what
        // Redis granted, and a lease cannot outlive this hour-long window).
        assert_eq!(json["allowed"], 50, "{extra:?}: {json}");
        let pool = if extra[0] == "--pool" { "bb8" } else { "own" };
        assert_eq!(json["pool"], pool, "{extra:?}: {json}");
    }
}

#[test]
fn bench_prints_the_decision_script() {
    let output = Command::new(example_binary("bench"))
        .args(["--print-script", "--algorithm", "gcra"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let script = String::from_utf8(output.stdout).unwrap();
    assert!(script.contains("redis.call('TIME')"), "{script}");
    assert!(
        script
            .trim_end()
            .ends_with("return run_single(ALGORITHMS['gcra'], KEYS, ARGV)")
    );
}

/// `--print-library` and `--print-function` give what the store runs on
/// Redis 7: the library loads, and its function decides as the script does.
#[test]
fn bench_prints_the_function_library_and_its_functions() {
    let print = |args: &[&str]| {
        let output = Command::new(example_binary("bench"))
            .args(args)
            .output()
            .unwrap();
        assert!(output.status.success(), "{args:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    let library = print(&["--print-library"]);
    let name = library
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("#!lua name="))
        .unwrap()
        .to_owned();
    let function = print(&["--print-function", "--algorithm", "gcra"]);
    let function = function.trim();
    assert_eq!(function, format!("{name}_gcra"));
    let server = RedisServer::start();
    assert_eq!(server.cli(&["FUNCTION", "LOAD", &library]), name);
    // burst 2, one unit per hour: two admissions, then a denial. The reply
    // is four integers, as redis-cli shows them: allowed, then remaining,
    // reset and wait in µs; the server's time, no permit.
    let call = || {
        let out = server.cli(&["FCALL", function, "1", "p:{k}", "1", "2", "3600000000"]);
        let fields: Vec<u64> = out.lines().map(|l| l.trim().parse().unwrap()).collect();
        assert_eq!(fields.len(), 4, "{out:?}");
        (fields[0], fields[1])
    };
    assert_eq!(call(), (1, 1));
    assert_eq!(call(), (1, 0));
    assert_eq!(call(), (0, 0));
}

#[test]
fn http_bench_serves_each_variant() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut fields = std::collections::HashMap::new();
    for variant in [
        "none",
        "none-fields",
        "memory",
        "memory-no-headers",
        "governor",
        "governor-headers",
        "redis",
    ] {
        let example = ratelimit_tests::spawn_listening(
            "http_bench",
            &["--variant", variant, "--redis", &server.url()],
            std::time::Duration::from_secs(60),
        );
        let response = runtime
            .block_on(reqwest::get(format!("{}/", example.base)))
            .unwrap();
        assert_eq!(response.status(), 200, "{variant}");
        let field = |name: &str| response.headers().get(name).cloned();
        let sent = (field("ratelimit-policy"), field("ratelimit"));
        assert_eq!(
            sent.1.is_some(),
            matches!(variant, "none-fields" | "memory" | "redis"),
            "{variant}"
        );
        fields.insert(variant, sent);
        let governed = response.headers().contains_key("x-ratelimit-remaining");
        assert_eq!(governed, variant == "governor-headers", "{variant}");
        let body = runtime.block_on(response.text()).unwrap();
        assert_eq!(body, "Hello, World!", "{variant}");
    }
    // The constants are the fields the memory layer sends for a fresh
    // server's first request, byte for byte.
    assert_eq!(fields["none-fields"], fields["memory"]);
}
