//! The quickstart: an axum server that allows 5 requests per 10 seconds per
//! client IP, with the in-memory store.
//!
//! ```text
//! cargo run --example quickstart            # serves on 127.0.0.1:3000
//! PORT=8080 cargo run --example quickstart  # another port
//! for i in 1 2 3 4 5 6; do curl -si http://127.0.0.1:3000/ | head -1; done
//! ```
//!
//! The sixth request within 10 seconds is answered `429 Too Many Requests`
//! with `Retry-After`.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use ratelimit_axum::{MemoryStore, PeerIp, Policy, RateLimitInfo, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port
            .parse()
            .map_err(|_| format!("PORT must be a port number, not {port:?}"))?,
        Err(_) => 3000,
    };

    // At most 5 requests in any 10 seconds, per client IP.
    let policy = Policy::sliding_window_log(5, Duration::from_secs(10))?.with_name("per-ip")?;
    let limit = RateLimitLayer::new(MemoryStore::new(), policy, PeerIp);

    let app = Router::new().route("/", get(hello)).route_layer(limit);

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

async fn hello(info: RateLimitInfo) -> String {
    match info.tightest() {
        Some(entry) => format!(
            "Hello! {} of {} requests left in this window.\n",
            entry.decision().remaining(),
            entry.decision().limit()
        ),
        None => String::from("Hello!\n"),
    }
}
