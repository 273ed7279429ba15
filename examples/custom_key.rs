//! A custom key: requests are limited per tenant, named by the `x-tenant`
//! header, with a key extractor that is a plain closure.
//!
//! ```text
//! cargo run --example custom_key            # serves on 127.0.0.1:3000
//! PORT=8080 cargo run --example custom_key  # another port
//! curl -si -H 'x-tenant: acme' http://127.0.0.1:3000/
//! ```
//!
//! Each tenant has a token bucket named `per-tenant` of 5 requests, refilled at
//! 5 a minute (one every 12 s); tenants do not share it, so one busy tenant
//! never uses up another's quota. The sixth request of a burst is answered
//! `429 Too Many Requests` with `Retry-After`.
//!
//! A request without `x-tenant` (or with an empty one) is a client error: it is
//! answered `400 Bad Request` (a problem+json body), is not rate limited, and
//! takes nothing from any tenant. Keying it by client IP instead would let a
//! client that forgets the header share one anonymous budget with everyone
//! behind the same address; refusing it makes the mistake visible.
//!
//! Once bound, the server prints one line, `listening on http://ADDR`.

use axum::Router;
use axum::body::Bytes;
use axum::extract::Request;
use axum::routing::get;
use http::StatusCode;
use ratelimit_axum::{
    MemoryStore, MissingKey, Policy, Rate, RateLimitInfo, RateLimitLayer, Rejection,
};

/// The header naming the tenant.
const TENANT_HEADER: &str = "x-tenant";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listen = ratelimit_examples::listen_addr_from_env()?;

    // The key: the tenant's name, or none when the header is missing or empty.
    let tenant = |req: &Request| -> Option<Vec<u8>> {
        req.headers()
            .get(TENANT_HEADER)
            .filter(|value| !value.is_empty())
            .map(|value| value.as_bytes().to_vec())
    };

    // 5 requests per tenant, refilled at 5 a minute.
    let policy = Policy::token_bucket(5, Rate::per_minute(5))?.with_name("per-tenant")?;
    let limit = RateLimitLayer::new(MemoryStore::new(), policy, tenant)
        // No tenant: refuse the request...
        .on_missing_key(MissingKey::Reject)
        // ...with 400, while quota refusals keep the default 429.
        .on_rejection(|rejection, default| match rejection {
            Rejection::MissingKey => missing_tenant(),
            _ => default,
        });

    let app = Router::new().route("/", get(hello)).route_layer(limit);

    ratelimit_examples::serve_on(listen, app).await?;
    Ok(())
}

/// `400 Bad Request` for a request without a tenant.
fn missing_tenant() -> http::Response<Bytes> {
    ratelimit_examples::problem(
        StatusCode::BAD_REQUEST,
        &format!("missing {TENANT_HEADER} header"),
    )
}

/// `GET /`: the tenant's quota left.
async fn hello(info: RateLimitInfo) -> String {
    match info.tightest() {
        Some(entry) => format!(
            "Hello! {} of {} requests left for your tenant.\n",
            entry.decision().remaining(),
            entry.decision().limit(),
        ),
        None => String::from("Hello!\n"),
    }
}
