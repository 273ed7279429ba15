//! A tonic gRPC server behind the rate limiter: the standard health service
//! (`grpc.health.v1.Health`), at most `--limit` calls per `--window` per
//! caller, in memory.
//!
//! ```text
//! cargo run --example tonic_grpc -- --listen 127.0.0.1:50051 --limit 5 --window 60s
//! for i in 1 2 3 4 5 6; do
//!     grpcurl -plaintext -H 'x-api-key: alice' 127.0.0.1:50051 grpc.health.v1.Health/Check
//! done
//! ```
//!
//! Flags (a contract other tools rely on), all optional:
//!
//! - `--listen ADDR`: the address to serve on (default `127.0.0.1:50051`);
//! - `--limit N`: the most calls per window and caller (default 5);
//! - `--window DURATION` (`500ms`, `10s`, `1m`, `1h`): the window (default `60s`).
//!
//! Callers are keyed by the `x-api-key` metadata (hashed before it reaches the
//! store), or by their IP address without one. The limit is a sliding window
//! log: at most `--limit` calls in any `--window`. A call past the limit is
//! answered by the layer with a trailers-only response, `grpc-status: 8`: any
//! gRPC client sees `RESOURCE_EXHAUSTED`, with `grpc-retry-pushback-ms` (when
//! the call could pass again) in the metadata.
//!
//! Once bound, the server prints one line, `listening on ADDR`, on stdout. Bad
//! flags exit with status 2 and a usage line.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use http::HeaderName;
use ratelimit_core::{MemoryStore, Policy};
use ratelimit_examples::parse_duration;
use ratelimit_tower::{HeaderKey, Key, KeyExtractor, RateLimitLayer};
use tonic::transport::Server;
use tonic::transport::server::{TcpConnectInfo, TcpIncoming};
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::SERVICE_NAME;

/// The usage line printed with every flag error.
const USAGE: &str = "usage: tonic_grpc [--listen ADDR] [--limit N] [--window DURATION]";

/// The metadata (HTTP/2 header) callers are keyed by.
const API_KEY_HEADER: &str = "x-api-key";

/// The command line, parsed.
#[derive(Debug)]
struct Args {
    listen: SocketAddr,
    limit: u64,
    window: Duration,
}

/// What the command line asks for.
enum Command {
    Run(Args),
    Help,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Command::Run(args)) => args,
        Ok(Command::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("error: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let policy = match Policy::sliding_window_log(args.limit, args.window)
        .and_then(|p| p.with_name("grpc-per-caller"))
    {
        Ok(policy) => policy,
        Err(e) => {
            eprintln!(
                "error: --limit {} --window {:?}: {e}\n{USAGE}",
                args.limit, args.window
            );
            return ExitCode::from(2);
        }
    };
    match serve(args.listen, policy).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Parses the flags (without the program name).
fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let mut listen = None;
    let mut limit = None;
    let mut window = None;

    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_owned(), Some(value.to_owned()))
            }
            _ => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--listen" => {
                let text = value()?;
                let addr = text.parse().map_err(|_| {
                    format!("--listen: {text:?} is not a socket address such as 127.0.0.1:50051")
                })?;
                set_once(&mut listen, addr, "--listen")?;
            }
            "--limit" => {
                let text = value()?;
                let n =
                    text.parse::<u64>().ok().filter(|&n| n > 0).ok_or_else(|| {
                        format!("--limit: {text:?} is not a whole number above 0")
                    })?;
                set_once(&mut limit, n, "--limit")?;
            }
            "--window" => {
                let text = value()?;
                let duration = parse_duration(&text).map_err(|e| format!("--window: {e}"))?;
                if duration.is_zero() {
                    return Err(format!("--window: {text:?} is zero"));
                }
                set_once(&mut window, duration, "--window")?;
            }
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    Ok(Command::Run(Args {
        listen: listen.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 50051))),
        limit: limit.unwrap_or(5),
        window: window.unwrap_or(Duration::from_secs(60)),
    }))
}

/// Stores `value` in `slot`, refusing a flag given twice.
fn set_once<T>(slot: &mut Option<T>, value: T, flag: &str) -> Result<(), String> {
    if slot.replace(value).is_some() {
        return Err(format!("{flag} given twice"));
    }
    Ok(())
}

/// The key of a call: its `x-api-key` (hashed), else the IP address of the
/// peer, which tonic puts into the request's extensions as [`TcpConnectInfo`].
/// Hashed keys start with `#`, so they never collide with an address.
fn caller_key(req: &http::Request<tonic::body::Body>) -> Option<Key> {
    HeaderKey::new(HeaderName::from_static(API_KEY_HEADER))
        .extract(req)
        .or_else(|| {
            req.extensions()
                .get::<TcpConnectInfo>()
                .and_then(TcpConnectInfo::remote_addr)
                .map(|addr| Key::from(addr.ip().to_canonical()))
        })
}

/// Binds `listen` and serves until killed (or Ctrl-C).
async fn serve(listen: SocketAddr, policy: Policy) -> Result<(), String> {
    let (reporter, health) = tonic_health::server::health_reporter();
    // "" (the whole server) is serving from the start; the health service too.
    reporter
        .set_service_status(SERVICE_NAME, ServingStatus::Serving)
        .await;

    let limit = RateLimitLayer::new(MemoryStore::new(), policy, caller_key);

    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("cannot read the bound address: {e}"))?;
    println!("listening on {local}");
    // Tools wait for this line: do not leave it in a buffer.
    let _ = std::io::stdout().flush();

    Server::builder()
        .layer(limit)
        .add_service(health)
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| format!("server failed: {e}"))
}
