//! Hostile clients of the examples, over HTTP on loopback only:
//! real processes, raw TCP for what `reqwest` will not send (absolute-form
//! targets, pipelining, unknown methods, oversized and duplicate headers).
//! Each test counts what passed against the limit the example's docs state;
//! windows are long (60 s or more) so nothing refills during a test, and
//! every socket read has a deadline.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use ratelimit_tests::loopback::client;
use ratelimit_tests::{Listening, spawn_listening, spawn_on_env_port};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Barrier;

const START: Duration = Duration::from_secs(30);
const READ_LIMIT: Duration = Duration::from_secs(10);

/// Writes `raw` on a new connection to `base` (`http://ADDR`) and reads until
/// the server closes or `READ_LIMIT` passes; returns every response's status
/// and whether it carried `Retry-After`, in order.
async fn raw(base: &str, raw: &[u8]) -> Vec<(u16, bool)> {
    let addr = base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(raw).await.expect("write");
    let mut bytes = Vec::new();
    let _ = tokio::time::timeout(READ_LIMIT, stream.read_to_end(&mut bytes)).await;
    parse_statuses(&String::from_utf8_lossy(&bytes))
}

fn parse_statuses(text: &str) -> Vec<(u16, bool)> {
    let mut out: Vec<(u16, bool)> = Vec::new();
    for line in text.split("\r\n") {
        if let Some(rest) = line.strip_prefix("HTTP/1.1 ") {
            let code = rest.get(..3).and_then(|c| c.parse().ok()).unwrap_or(0);
            out.push((code, false));
        } else if line.to_ascii_lowercase().starts_with("retry-after:")
            && let Some(last) = out.last_mut()
        {
            last.1 = true;
        }
    }
    out
}

/// One request, `Connection: close`.
fn req(method: &str, target: &str, extra: &str) -> Vec<u8> {
    format!("{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}Connection: close\r\n\r\n")
        .into_bytes()
}

/// Quickstart: 5 per 10 s per client IP (a sliding log). Every spelling,
/// method and header trick a client has, sent from 127.0.0.1, shares
/// those 5: no six admissions within 10 s (each admission known to lie
/// between its connection's write and its last read, so a slow machine
/// that takes longer than the window fails nothing).
#[tokio::test]
async fn quickstart_tricks_share_the_five() {
    let server = spawn_on_env_port("quickstart", START);
    let b = &server.base;
    let host = b.trim_start_matches("http://");
    let big = format!("x-pad: {}\r\n", "a".repeat(60_000));
    let many_dups: String = (0..90)
        .map(|i| format!("x-forwarded-for: 10.0.0.{i}\r\n"))
        .collect();
    let tricks: Vec<Vec<u8>> = vec![
        req("GET", "/", ""),
        req("GET", "/?x=1", ""),
        req("HEAD", "/", ""),
        req("OPTIONS", "/", ""),
        req("FOO", "/", ""),
        req("GET", "//", ""),
        req("GET", "/.", ""),
        req("GET", "/%2e", ""),
        req("GET", "/;a", ""),
        req("GET", "/%2F", ""),
        req("GET", &format!("http://{host}/"), ""),
        req("GET", &format!("http://{host}/?y"), ""),
        req("GET", "/", "X-Forwarded-For: 203.0.113.9\r\n"),
        req("GET", "/", "Forwarded: for=203.0.113.10\r\n"),
        req("GET", "/", "X-Real-IP: 203.0.113.11\r\n"),
        req("GET", "/", &big),
        req("GET", "/", &many_dups),
    ];
    let mut admitted = Vec::new();
    let mut log = Vec::new();
    for (i, t) in tricks.iter().enumerate() {
        let sent = Instant::now();
        for (status, retry) in raw(b, t).await {
            log.push((i, status));
            if (200..300).contains(&status) {
                admitted.push((sent, Instant::now()));
            }
            if status == 429 {
                assert!(retry, "trick {i}: 429 without Retry-After");
            }
        }
    }
    // Pipelined: 10 requests on one connection.
    let mut pipe = Vec::new();
    for _ in 0..9 {
        pipe.extend_from_slice(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    }
    pipe.extend_from_slice(&req("GET", "/", ""));
    let sent = Instant::now();
    for (status, _) in raw(b, &pipe).await {
        log.push((99, status));
        if (200..300).contains(&status) {
            admitted.push((sent, Instant::now()));
        }
    }
    // Many connections at once.
    let barrier = Arc::new(Barrier::new(20));
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (b, barrier) = (b.clone(), Arc::clone(&barrier));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let sent = Instant::now();
            (sent, raw(&b, &req("GET", "/", "")).await, Instant::now())
        }));
    }
    for t in tasks {
        let (sent, statuses, read) = t.await.unwrap();
        for (status, _) in statuses {
            if (200..300).contains(&status) {
                admitted.push((sent, read));
            }
        }
    }
    // Six admissions whose span, from the first write to the last read,
    // is under 10 s: six in one window.
    admitted.sort();
    assert!(!admitted.is_empty(), "nothing passed: {log:?}");
    for six in admitted.windows(6) {
        let last_read = six.iter().map(|(_, read)| *read).max().unwrap();
        assert!(
            last_read.duration_since(six[0].0) >= Duration::from_secs(10),
            "{} passed, six within 10 s; (trick, status): {log:?}",
            admitted.len()
        );
    }
    // Still alive.
    let alive = client().get(format!("{b}/")).send().await.expect("alive");
    assert_eq!(alive.status(), 429);
}

/// token_budget (defaults: 1,000 tokens a minute per API key, 10,000 per
/// client IP): a call is admitted on the 1 token it reserves and settled
/// after, a cost past twice a budget charged as twice it, so the example
/// bounds a call at `--limit` tokens (a model's `max_tokens`). Calls of a
/// million tokens, each with a new key, are refused (`400`) and serve
/// nothing; a call of the whole budget passes. (Before, the first of them
/// passed: a million tokens served against 10,000 a minute per IP.)
#[tokio::test]
async fn token_budget_bounds_what_one_call_uses() {
    let server: Listening = spawn_listening("token_budget", &[], START);
    let c = client();
    let call = async |tokens: u64, key: String| {
        c.post(format!("{}/v1/complete?tokens={tokens}", server.base))
            .header("x-api-key", key)
            .send()
            .await
            .expect("call")
            .status()
            .as_u16()
    };
    let mut statuses = Vec::new();
    for i in 0..3 {
        statuses.push(call(1_000_000, format!("key-{i}")).await);
    }
    assert_eq!(statuses, [400, 400, 400]);
    assert_eq!(call(1_000, String::from("whole")).await, 200);
}
