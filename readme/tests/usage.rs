//! The README's Usage block, served as a user would run it, refuses the
//! sixth request; and the README still has that block.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ratelimit_readme::blocks;

const README: &str = include_str!("../../README.md");

/// The `usage` binary, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

/// One `GET /`: the status and the response head.
fn get(addr: SocketAddr) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    Ok((status, response))
}

fn retry_after(response: &str) -> Option<u64> {
    response
        .lines()
        .take_while(|l| !l.is_empty())
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("retry-after")
                .then(|| value.trim().parse().ok())?
        })
}

#[test]
fn usage_block_refuses_the_sixth_request() {
    let port = free_port();
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let _server = Server(
        Command::new(env!("CARGO_BIN_EXE_usage"))
            .env("README_LISTEN", addr.to_string())
            .stdin(Stdio::null())
            .spawn()
            .expect("start the usage binary"),
    );
    // The first answer, once the server listens (bounded).
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        match get(addr) {
            Ok(answer) => break answer,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("the usage binary never answered on {addr}: {e}"),
        }
    };
    let mut answers = vec![first];
    for _ in 0..6 {
        answers.push(get(addr).expect("GET /"));
    }
    let statuses: Vec<u16> = answers.iter().map(|(status, _)| *status).collect();
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 200, 429, 429],
        "the README's Usage code must allow 5 requests in 10 s per client, then refuse"
    );
    assert!(answers[0].1.ends_with("4 left"), "{}", answers[0].1);
    let retry = retry_after(&answers[5].1).expect("a 429 has Retry-After");
    assert!((1..=10).contains(&retry), "Retry-After {retry}");
}

#[test]
fn readme_has_the_usage_block_that_runs() {
    let usage = blocks::usage_block(README).expect("README.md has a Usage block");
    // What the binary serves is this block (the build script extracted it).
    assert_eq!(
        blocks::usage_program(&usage).expect("the block binds one address"),
        include_str!(concat!(env!("OUT_DIR"), "/usage.rs"))
    );
    for needed in [
        "RateLimitLayer::new",
        "PeerIp",
        "into_make_service_with_connect_info::<SocketAddr>()",
    ] {
        assert!(usage.code.contains(needed), "the Usage block lost {needed}");
    }
}

#[test]
fn blocks_are_found_under_their_heading() {
    let markdown = "# T\n\n## Usage\n\ntext\n\n```sh\nls\n```\n\n```rust,no_run\nfn main() {}\n```\n\n## Other\n```rust\nlet x = 1;\n```\n";
    let found = blocks::rust_blocks(markdown).unwrap();
    assert_eq!(found.len(), 2);
    assert_eq!(found[0].section, "Usage");
    assert!(found[0].has("no_run"));
    assert_eq!(found[0].code, "fn main() {}\n");
    assert_eq!(found[1].section, "Other");
    assert!(blocks::usage_block("## Usage\n```sh\nls\n```\n").is_err());
    assert!(blocks::rust_blocks("```rust\nunclosed\n").is_err());
}
