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
//! The tenant is whatever the client writes in the header, and this example
//! does not check it: a client that names a new tenant with every request
//! would get a new budget each time. So every request also counts against
//! its client IP, whatever tenant it names: `per-ip`, at most 20 requests in
//! any minute (four tenants' worth from one address), all or nothing with
//! the tenant's. A service that knows its tenants (from a login, a signed
//! token) keys by what it checked instead, or refuses unknown ones (the
//! `tiers` example).
//!
//! A request without `x-tenant` (or with an empty one) is a client error: it is
//! answered `400 Bad Request` (a problem+json body), is not rate limited, and
//! takes nothing from any tenant. Keying it by client IP instead would let a
//! client that forgets the header share one anonymous budget with everyone
//! behind the same address; refusing it makes the mistake visible.
//!
//! Once bound, the server prints one line, `listening on http://ADDR`.

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::Request;
use axum::routing::get;
use http::StatusCode;
use ratelimit_axum::{
    MemoryStore, MissingKey, PeerIp, Policy, Rate, RateLimitInfo, RateLimitLayer, Rejection, Rule,
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

    // 5 requests per tenant, refilled at 5 a minute; no tenant: refuse the
    // request.
    let per_tenant = Policy::token_bucket(5, Rate::per_minute(5))?.with_name("per-tenant")?;
    let tenants = Rule::new(per_tenant, tenant).on_missing_key(MissingKey::Reject);
    // And at most 20 in any minute per client IP, whatever the tenant.
    let per_ip = Policy::sliding_window_log(20, Duration::from_secs(60))?.with_name("per-ip")?;
    let limit = RateLimitLayer::new(MemoryStore::new(), per_ip, PeerIp)
        .and(tenants)
        // No tenant: 400, while quota refusals keep the default 429.
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

/// `GET /`: the quota left under the tighter limit (the tenant's, unless its
/// address has used more of its own).
async fn hello(info: RateLimitInfo) -> String {
    ratelimit_examples::answer("Hello", &info)
}
