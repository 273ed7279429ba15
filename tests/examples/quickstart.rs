//! The quickstart example, run as a real process and asked by a real HTTP
//! client over loopback: 5 × 200, then 429 with `Retry-After`.

use std::process::Command;
use std::time::Duration;

use ratelimit_tests::loopback::client;
use ratelimit_tests::{ChildGuard, example_binary, spawn_on_env_port};

#[tokio::test]
async fn quickstart_allows_five_then_429_with_retry_after() {
    let server = spawn_on_env_port("quickstart", Duration::from_secs(30));
    let url = format!("{}/", server.base);
    let client = client();

    for i in 0..5 {
        let response = client.get(&url).send().await.unwrap();
        assert_eq!(response.status(), 200, "request {}", i + 1);
        assert!(response.headers().get("retry-after").is_none());
        let body = response.text().await.unwrap();
        assert!(
            body.contains(&format!("{} of 5", 4 - i)),
            "request {}: {body:?}",
            i + 1
        );
    }

    let response = client.get(&url).send().await.unwrap();
    assert_eq!(response.status(), 429);
    let retry_after: u64 = response
        .headers()
        .get("retry-after")
        .expect("Retry-After on a 429")
        .to_str()
        .unwrap()
        .parse()
        .expect("Retry-After in delay-seconds");
    // Sliding log of 10 s: the first request frees its slot at most 10 s later.
    assert!(
        (1..=10).contains(&retry_after),
        "Retry-After: {retry_after}"
    );
}

#[test]
fn quickstart_rejects_a_bad_port() {
    let output = Command::new(example_binary("quickstart"))
        .env("PORT", "not-a-port")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("PORT must be a port number"), "{stderr}");
}

#[test]
fn child_guard_stops_the_process() {
    let mut guard = ChildGuard::spawn(Command::new("sleep").arg("30")).unwrap();
    let pid = guard.child().id();
    drop(guard);
    // After the guard, the process is gone (reaped), so signalling it fails.
    let alive = Command::new("kill")
        .arg("-0")
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(!alive.success());
}
