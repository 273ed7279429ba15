//! A tonic gRPC server behind the rate limiter: the standard health service
//! (`grpc.health.v1.Health`), at most `--limit` calls per `--window` per
//! caller and `--ip-limit` per client address, in memory.
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
//! - `--ip-limit N`: the most calls per window and client address, whatever
//!   keys they carry (default: `--limit`);
//! - `--window DURATION` (`500ms`, `10s`, `1m`, `1h`): the window (default `60s`).
//!
//! Every call counts twice, all or nothing: against its caller, keyed by the
//! `x-api-key` metadata (hashed before it reaches the store) or by its IP
//! address without one (an IPv6 caller by its /64), and against its IP
//! address, whatever key it sends. The key is the client's to choose, and
//! this server does not check it: without the limit per address, a client
//! sending a new key with every call would never be limited, and would fill
//! the store. A service that knows its keys refuses unknown ones instead (the
//! `tiers` example). Raise `--ip-limit` when many callers share an address
//! (behind one NAT), each with a key of its own. The address is the TCP
//! peer's (`PeerIp`): behind a proxy or a load balancer, key by
//! `ClientIp::trusting` its addresses instead, or every caller shares the
//! proxy's budget.
//!
//! Both limits are sliding window logs: at most `--limit` (and `--ip-limit`)
//! calls in any `--window`. A call past a limit is answered by the layer with
//! a trailers-only response, `grpc-status: 8`: any gRPC client sees
//! `RESOURCE_EXHAUSTED`, with `grpc-retry-pushback-ms` (when the call could
//! pass again) in the metadata.
//!
//! The layer sees calls, not messages: a streaming call is charged once, when
//! it starts, however many messages it carries, and a concurrency limit's
//! permit is held for the stream's whole life, until its response ends or is
//! dropped. To limit messages, check each one in the handler against a store
//! (`Store::check`) and end the stream with `Status::resource_exhausted`.
//!
//! Once bound, the server prints one line, `listening on ADDR`, on stdout. Bad
//! flags exit with status 2 and a message naming the flag (`clap`).

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use ratelimit_core::{MemoryStore, Policy};
use ratelimit_examples::{exit_with_flag_error, nonzero_duration};
use ratelimit_tower::{HeaderKey, PeerIp, RateLimitLayer, Rule};
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::SERVICE_NAME;

/// The metadata (HTTP/2 header) callers are keyed by.
const API_KEY_HEADER: &str = "x-api-key";

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "tonic_grpc",
    about = "A gRPC health service, rate limited in memory per caller (x-api-key, else IP)\n\
             and per client IP."
)]
struct Args {
    /// The address to serve on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// The most calls per window and caller.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    limit: u64,
    /// The most calls per window and client IP, whatever their keys [default: --limit].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    ip_limit: Option<u64>,
    /// The window (500ms, 10s, 1m, 1h).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = nonzero_duration)]
    window: Duration,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let policy = |flag: &str, limit: u64, name: &str| {
        Policy::sliding_window_log(limit, args.window)
            .and_then(|p| p.with_name(name))
            .unwrap_or_else(|e| {
                exit_with_flag_error::<Args>(format_args!(
                    "{flag} {limit} --window {:?}: {e}",
                    args.window
                ))
            })
    };
    let per_caller = policy("--limit", args.limit, "grpc-per-caller");
    let ip_limit = args.ip_limit.unwrap_or(args.limit);
    let per_ip = policy("--ip-limit", ip_limit, "grpc-per-ip");
    match serve(args.listen, per_caller, per_ip).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Binds `listen` and serves until killed (or Ctrl-C).
async fn serve(listen: SocketAddr, per_caller: Policy, per_ip: Policy) -> Result<(), String> {
    let (reporter, health) = tonic_health::server::health_reporter();
    // "" (the whole server) is serving from the start; the health service too.
    reporter
        .set_service_status(SERVICE_NAME, ServingStatus::Serving)
        .await;

    // Per client IP, whatever key the call sends, and per caller: its API key
    // (hashed), or its IP without one. The IP comes from tonic's
    // `TcpConnectInfo` (feature `tonic`); a call without one is refused
    // (`INTERNAL`), never let through.
    let limit = RateLimitLayer::new(MemoryStore::new(), per_ip, PeerIp).and(Rule::new(
        per_caller,
        HeaderKey::from_static(API_KEY_HEADER).or(PeerIp),
    ));

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
