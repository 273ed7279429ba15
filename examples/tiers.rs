//! Limits per customer tier: the API key is looked up (a `HashMap` stands in
//! for a database) to pick the policy for each request.
//!
//! ```text
//! cargo run --example tiers            # serves on 127.0.0.1:3000
//! PORT=8080 cargo run --example tiers  # another port
//! curl -si -H 'x-api-key: free-key' http://127.0.0.1:3000/
//! ```
//!
//! The keys known to this example:
//!
//! - `free-key`: the `free` tier, 10 requests an hour (GCRA, bursts of 10);
//! - `pro-key`: the `pro` tier, 100 requests an hour (GCRA, bursts of 100);
//! - `internal-key`: an internal service, allowlisted: never limited;
//! - any other key, or no `x-api-key` at all: refused with `401 Unauthorized`
//!   (a problem+json body), before any quota is spent.
//!
//! `GET /` shows the quota left, read from the layer's decision with
//! `RateLimitInfo`. Refused requests over their quota are answered
//! `429 Too Many Requests` with `Retry-After`.
//!
//! Once bound, the server prints one line, `listening on http://ADDR`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::Request;
use axum::routing::get;
use http::{HeaderValue, StatusCode, header};
use ratelimit_axum::{Limits, MemoryStore, Policy, Rate, RateLimitInfo, RateLimitLayer, Rejection};

/// The header carrying the API key.
const API_KEY_HEADER: &str = "x-api-key";

/// What an API key is entitled to.
#[derive(Debug, Clone, Copy)]
enum Tier {
    /// The free tier.
    Free,
    /// The paid tier.
    Pro,
    /// Internal services: not limited.
    Internal,
}

/// The API keys and their tiers: a stand-in for a database.
type Accounts = Arc<HashMap<&'static str, Tier>>;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listen = ratelimit_examples::listen_addr_from_env()?;

    let accounts: Accounts = Arc::new(HashMap::from([
        ("free-key", Tier::Free),
        ("pro-key", Tier::Pro),
        ("internal-key", Tier::Internal),
    ]));
    let free = Policy::gcra(10, Rate::per_hour(10))?.with_name("free")?;
    let pro = Policy::gcra(100, Rate::per_hour(100))?.with_name("pro")?;

    // The limits of each request: take what is needed from the request now,
    // look the key up in the future (a database query in a real service).
    let rules = move |req: &Request| {
        let api_key = req
            .headers()
            .get(API_KEY_HEADER)
            .map(|value| value.as_bytes().to_vec());
        let (accounts, free, pro) = (accounts.clone(), free.clone(), pro.clone());
        async move {
            let Some(api_key) = api_key else {
                return Limits::reject();
            };
            let tier = std::str::from_utf8(&api_key)
                .ok()
                .and_then(|key| accounts.get(key).copied());
            // A value as a key is hashed (as a `HeaderKey` hashes it): the
            // store never holds the raw secret.
            match tier {
                None => Limits::reject(),
                Some(Tier::Internal) => Limits::none(),
                Some(Tier::Free) => Limits::one(free, api_key, 1),
                Some(Tier::Pro) => Limits::one(pro, api_key, 1),
            }
        }
    };
    let limit = RateLimitLayer::with_rules(MemoryStore::new(), rules)
        // A missing or unknown key is not a quota problem: 401.
        .on_rejection(|rejection, default| match rejection {
            Rejection::MissingKey => unauthorized(),
            _ => default,
        });

    let app = Router::new().route("/", get(quota)).route_layer(limit);

    ratelimit_examples::serve_on(listen, app).await?;
    Ok(())
}

/// `401 Unauthorized` for a missing or unknown API key.
fn unauthorized() -> http::Response<Bytes> {
    let mut response = ratelimit_examples::problem(
        StatusCode::UNAUTHORIZED,
        &format!("missing or unknown {API_KEY_HEADER}"),
    );
    // A 401 names how to authenticate.
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(r#"ApiKey realm="tiers", header="x-api-key""#),
    );
    response
}

/// `GET /`: the quota left. Allowlisted keys pass without a decision, hence
/// the `Option`.
async fn quota(info: Option<RateLimitInfo>) -> String {
    match info.as_ref().and_then(|info| info.tightest()) {
        Some(entry) => format!(
            "{} of {} requests left this hour ({} tier)\n",
            entry.decision().remaining(),
            entry.decision().limit(),
            entry.policy().name(),
        ),
        None => String::from("not limited (internal)\n"),
    }
}
