//! Per-route costs from one budget: every API key has 100 units a minute;
//! `GET /search` costs 1 unit and `GET /export` costs 10, both drawn from the
//! same budget, and each price is declared next to its route.
//!
//! ```text
//! cargo run --example per_route_cost            # serves on 127.0.0.1:3000
//! PORT=8080 cargo run --example per_route_cost  # another port
//! curl -si -H 'x-api-key: demo' http://127.0.0.1:3000/export
//! ```
//!
//! The budget is a GCRA policy named `api`: bursts of up to 100 units, refilled
//! at 100 a minute (one unit every 600 ms), per `x-api-key` (hashed before it
//! reaches the store). Nine exports leave 10 units; a search then leaves 9, so
//! the next export is refused with `429 Too Many Requests` and `Retry-After`
//! while searches still pass until the budget is empty.
//!
//! The API key is whatever the client sends, and this example does not check
//! it: a client that sends a new key with every request would get a new
//! budget each time. So every request also takes its price from its client
//! IP's budget, whatever key it sends: `per-ip`, at most 1,000 units in any
//! minute (ten keys' worth from one address), all or nothing with the key's.
//! A service that knows its keys refuses unknown ones instead (the `tiers`
//! example).
//!
//! Every response carries both: `RateLimit-Policy: "per-ip";q=1000;w=60,
//! "api";q=100;w=60` and `RateLimit: "per-ip";r=<units left>;t=<s>,
//! "api";r=<units left>;t=<s>`.
//!
//! Requests without an `x-api-key` are refused with `429` and no `Retry-After`
//! (waiting cannot help).
//!
//! Once bound, the server prints one line, `listening on http://ADDR`.

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use ratelimit_axum::{
    HeaderKey, MemoryStore, MissingKey, PeerIp, Policy, Rate, RateLimitInfo, RateLimitLayer, Rule,
};

/// What `GET /search` costs.
const SEARCH_COST: u64 = 1;

/// What `GET /export` costs.
const EXPORT_COST: u64 = 10;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listen = ratelimit_examples::listen_addr_from_env()?;

    // One budget per API key: 100 units, refilled at 100 a minute.
    let api = Policy::gcra(100, Rate::per_minute(100))?.with_name("api")?;
    // One per client IP, whatever the key: 1,000 units in any minute.
    let per_ip = Policy::sliding_window_log(1_000, Duration::from_secs(60))?.with_name("per-ip")?;
    let store = MemoryStore::new();
    // The same store and policies (so the same budgets) on each route, each
    // with its own price.
    let budget = |cost: u64| {
        let per_key = Rule::new(api.clone(), HeaderKey::from_static("x-api-key"))
            .on_missing_key(MissingKey::Reject)
            .cost(cost);
        RateLimitLayer::new(store.clone(), per_ip.clone(), PeerIp)
            .cost(cost)
            .and(per_key)
    };

    let app = Router::new()
        .route("/search", get(search).route_layer(budget(SEARCH_COST)))
        .route("/export", get(export).route_layer(budget(EXPORT_COST)));

    ratelimit_examples::serve_on(listen, app).await?;
    Ok(())
}

/// `GET /search`: 1 unit.
async fn search(info: RateLimitInfo) -> String {
    answer("search results", SEARCH_COST, &info)
}

/// `GET /export`: 10 units.
async fn export(info: RateLimitInfo) -> String {
    answer("export file", EXPORT_COST, &info)
}

/// A short answer with the units left.
fn answer(what: &str, cost: u64, info: &RateLimitInfo) -> String {
    match info.tightest() {
        Some(entry) => format!(
            "{what} (cost {cost}): {} of {} units left\n",
            entry.decision().remaining(),
            entry.decision().limit(),
        ),
        None => format!("{what}\n"),
    }
}
