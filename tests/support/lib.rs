//! Test support for the workspace's integration tests: free loopback ports,
//! child processes that are stopped on drop, the example binaries, and real
//! Redis servers and clusters ([`redis_server`]).

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod fault_proxy;
pub mod metrics;
pub mod redis_server;

pub use redis_server::{RedisCluster, RedisServer};

use ratelimit_core::clock::ManualClock;
use ratelimit_core::redis::{RedisStore, RedisStoreBuilder};
use ratelimit_core::{Decision, MemoryStore, Policy, Rate};

/// A `MemoryStore` and the `RedisStore` `redis` builds, both on `clock` (the
/// scripts take their time from it), to replay one timeline through both.
pub async fn twin_stores(
    redis: RedisStoreBuilder,
    clock: &ManualClock,
) -> (MemoryStore<ManualClock>, RedisStore) {
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let redis = redis
        .script_clock_for_tests(clock.clone())
        .call_timeout(Duration::from_secs(5))
        .build()
        .await
        .expect("a Redis store");
    (memory, redis)
}

/// Every algorithm with long windows: nothing refills while a test runs.
pub fn long_policies(limit: u64) -> Vec<Policy> {
    let hour = Duration::from_secs(3600);
    let slow = Rate::per_hour(1);
    vec![
        Policy::fixed_window(limit, hour).expect("valid"),
        Policy::sliding_window_log(limit, hour).expect("valid"),
        Policy::sliding_window_counter(limit, hour).expect("valid"),
        Policy::token_bucket(limit, slow).expect("valid"),
        Policy::gcra(limit, slow).expect("valid"),
        Policy::leaky_bucket(limit, slow).expect("valid"),
        Policy::concurrency(limit, hour).expect("valid"),
    ]
}

/// What [`observable`] keeps of a decision.
pub type Observed = (bool, u64, u64, u64, u64, u64, bool);

/// Everything observable of a decision, to compare two stores: allowed,
/// limit, remaining, reset, retry, delay, and whether it holds a permit (the
/// ids differ between stores by design).
pub fn observable(d: &Decision) -> Observed {
    (
        d.is_allowed(),
        d.limit(),
        d.remaining(),
        d.reset_after_micros(),
        d.retry_after_micros(),
        d.delay_micros(),
        d.permit().is_some(),
    )
}

/// How `clap` ends every error about the examples' flags (after the message
/// naming the flag, and sometimes the usage line); they exit with status 2.
pub const CLAP_FOOTER: &str = "For more information, try '--help'.";

/// A free TCP port on 127.0.0.1 (bound, then released, so a child can take it).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

/// A child process killed (and reaped) when dropped.
#[derive(Debug)]
pub struct ChildGuard {
    child: Child,
}

impl ChildGuard {
    /// Spawns `command`.
    pub fn spawn(command: &mut Command) -> std::io::Result<Self> {
        Ok(ChildGuard {
            child: command.spawn()?,
        })
    }

    /// The process.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds the example `name` of the `ratelimit-examples` package and returns
/// the path of its executable.
pub fn example_binary(name: &str) -> PathBuf {
    let run = escargot::CargoBuild::new()
        .package("ratelimit-examples")
        .example(name)
        .current_target()
        .run()
        .unwrap_or_else(|e| panic!("building example {name}: {e}"));
    run.path().to_path_buf()
}

/// Spawns the example `name` with `args` and extra environment.
pub fn spawn_example(name: &str, args: &[&str], env: &[(&str, &str)]) -> ChildGuard {
    let mut command = Command::new(example_binary(name));
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        command.env(k, v);
    }
    ChildGuard::spawn(&mut command).unwrap_or_else(|e| panic!("spawning example {name}: {e}"))
}

/// Waits until something accepts TCP connections on `addr`, for at most `limit`.
pub fn wait_for_port(addr: SocketAddr, limit: Duration) {
    let start = Instant::now();
    while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(
            start.elapsed() < limit,
            "nothing listened on {addr} within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Spawns the example `name` with `args` and stdout piped, and returns it
/// with the first `lines` lines it printed there, waiting at most `limit`
/// for them (the example is killed when the guard drops).
pub fn spawn_example_lines(
    name: &str,
    args: &[&str],
    lines: usize,
    limit: Duration,
) -> (ChildGuard, Vec<String>) {
    use std::io::{BufRead, BufReader};
    let mut command = Command::new(example_binary(name));
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child =
        ChildGuard::spawn(&mut command).unwrap_or_else(|e| panic!("spawning example {name}: {e}"));
    let stdout = child.child().stdout.take().expect("piped stdout");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        for _ in 0..lines {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if sender.send(line.trim_end().to_owned()).is_err() {
                        break;
                    }
                }
            }
        }
        // Keep reading, so the example never writes into a closed pipe.
        let _ = std::io::copy(&mut reader, &mut std::io::sink());
    });
    let deadline = Instant::now() + limit;
    let mut printed = Vec::with_capacity(lines);
    while printed.len() < lines {
        let left = deadline.saturating_duration_since(Instant::now());
        match receiver.recv_timeout(left) {
            Ok(line) => printed.push(line),
            Err(_) => panic!(
                "example {name} {args:?} printed {printed:?}, not {lines} lines, within {limit:?}"
            ),
        }
    }
    (child, printed)
}
