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
//! flags exit with status 2 and a message naming the flag (`clap`).

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use http::HeaderName;
use ratelimit_core::{MemoryStore, Policy};
use ratelimit_examples::{exit_with_flag_error, nonzero_duration};
use ratelimit_tower::{HeaderKey, Key, KeyExtractor, RateLimitLayer};
use tonic::transport::Server;
use tonic::transport::server::{TcpConnectInfo, TcpIncoming};
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::SERVICE_NAME;

/// The metadata (HTTP/2 header) callers are keyed by.
const API_KEY_HEADER: &str = "x-api-key";

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "tonic_grpc",
    about = "A gRPC health service, rate limited per caller (x-api-key, else IP) in memory."
)]
struct Args {
    /// The address to serve on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// The most calls per window and caller.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    limit: u64,
    /// The window (500ms, 10s, 1m, 1h).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = nonzero_duration)]
    window: Duration,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let policy = match Policy::sliding_window_log(args.limit, args.window)
        .and_then(|p| p.with_name("grpc-per-caller"))
    {
        Ok(policy) => policy,
        Err(e) => exit_with_flag_error::<Args>(format_args!(
            "--limit {} --window {:?}: {e}",
            args.limit, args.window
        )),
    };
    match serve(args.listen, policy).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
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
