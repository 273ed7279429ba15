//! A token budget whose cost is known only after the response: each call of
//! a model reserves 1 token before it runs, and its response says how many
//! it really used, which the layer then charges.
//!
//! ```text
//! cargo run --example token_budget                     # in memory, 127.0.0.1:3000
//! redis-server --port 6379 --save ''
//! cargo run --example token_budget -- --redis redis://127.0.0.1:6379
//! curl -si -X POST -H 'x-api-key: demo' 'http://127.0.0.1:3000/v1/complete?tokens=400'
//! curl -s -H 'x-api-key: demo' http://127.0.0.1:3000/v1/quota
//! ```
//!
//! Flags, all optional:
//!
//! - `--listen ADDR` (default `127.0.0.1:3000`): where to serve;
//! - `--redis URL`: keep the budgets in Redis, shared by every instance
//!   (in memory without it); while Redis cannot decide, calls are refused
//!   with `503` (`FailurePolicy::Closed`), and a settlement it cannot make
//!   leaves the call's reservation as it was taken;
//! - `--limit N` (default 1000): tokens per minute per API key;
//! - `--ip-limit N` (default 10000): tokens per minute per client IP,
//!   whatever API keys its requests carry.
//!
//! Routes:
//!
//! - `POST /v1/complete?tokens=N` stands for a model call that generated `N`
//!   tokens, at most `--limit` (a model's `max_tokens`; more is `400`): it
//!   answers `x-tokens-used: N`. The rule settles the call from
//!   that header, then removes it, so the client never sees it; the
//!   response's `RateLimit` field says what is left after the settlement.
//! - `GET /v1/fail` stands for a call that failed: it answers `500`, and its
//!   reservation is given back, so failures cost nothing.
//! - `GET /v1/quota` reports the caller's budget without taking anything
//!   (`Limiter::peek`): `{"limit":..,"remaining":..,"in_debt":..,"reset_after_ms":..,"retry_after_ms":..}`.
//!
//! Each API key (`x-api-key`, hashed before it reaches the store) has a token
//! bucket of `--limit` tokens refilled at `--limit` a minute. A call is
//! admitted while its key has at least the 1 token it reserves; a call that
//! used more than its key had left takes the key into debt (at most one
//! more full budget), and the key's calls are refused with `429` and
//! `Retry-After` until the refill has paid it. With the defaults, three calls
//! of 400 tokens pass (the third leaves the key 200 tokens in debt) and the
//! fourth is refused for about 12 seconds.
//!
//! Bound what one call may use, as this example does with `--limit`: a call
//! is admitted on its reservation and settled after, and a cost past twice
//! a budget is charged as twice the budget, so without a bound one call
//! could use far more than it is charged.
//!
//! The API key is the client's to choose, and this example does not check
//! it: a client sending a new key with every request would get a new budget
//! each time. So every call also counts against its client IP's budget,
//! `--ip-limit` tokens a minute, settled from the same header in the same
//! store call (all or nothing). Requests without an `x-api-key` are refused
//! with `429` and no `Retry-After`.
//!
//! Once bound, the server prints one line, `listening on http://ADDR`.

use std::error::Error;
use std::net::SocketAddr;
use std::process::ExitCode;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Parser;
use ratelimit_axum::{
    FailurePolicy, HeaderKey, Limiter, MemoryStore, PeerIp, Policy, Rate, RateLimitInfo,
    RateLimitLayer, Rule, Settlement, Store,
};
use ratelimit_core::redis::RedisStore;
use ratelimit_examples::{API_KEY_HEADER, bind_listener, problem, redis_url, serve};
use serde::Deserialize;

/// The header the model's answer names the tokens it used in.
const TOKENS_USED: &str = "x-tokens-used";

/// What each call reserves before it runs.
const ESTIMATE: u64 = 1;

/// A token budget settled after the response.
#[derive(Parser)]
#[command(name = "token_budget", about)]
struct Args {
    /// Where to serve.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Keep the budgets in this Redis (in memory without it).
    #[arg(long, value_name = "URL", value_parser = redis_url)]
    redis: Option<String>,
    /// Tokens per minute per API key.
    #[arg(long, value_name = "N", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..))]
    limit: u64,
    /// Tokens per minute per client IP, whatever its API keys.
    #[arg(long, value_name = "N", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    ip_limit: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let served = match &args.redis {
        Some(url) => match RedisStore::builder(url.clone()).build().await {
            Ok(store) => run(&args, store).await,
            Err(e) => Err(format!("--redis {url}: {e}").into()),
        },
        None => run(&args, MemoryStore::new()).await,
    };
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Serves the routes with the budgets in `store`, until the process ends.
async fn run<St: Store + Clone>(args: &Args, store: St) -> Result<(), Box<dyn Error>> {
    let per_key =
        Policy::token_bucket(args.limit, Rate::per_minute(args.limit))?.with_name("tokens")?;
    let per_ip = Policy::token_bucket(args.ip_limit, Rate::per_minute(args.ip_limit))?
        .with_name("tokens-per-ip")?;
    // Both budgets reserve the estimate and settle from the same header,
    // together.
    let settlement = Settlement::from_static_header(TOKENS_USED);
    let key_rule = Rule::new(per_key.clone(), HeaderKey::from_static(API_KEY_HEADER))
        .cost(ESTIMATE)
        .settle(settlement.clone())?;
    let budgets = RateLimitLayer::new(store.clone(), per_ip, PeerIp)
        .cost(ESTIMATE)
        .settle(settlement)?
        .and(key_rule)
        // Model calls are expensive: while Redis cannot decide, refuse them
        // (503) rather than let them through unbudgeted.
        .on_failure(FailurePolicy::Closed);
    let quota = Quota {
        limiter: Limiter::new(store, per_key),
        max_tokens: args.limit,
    };

    let app = Router::new()
        .route("/v1/complete", post(complete::<St>))
        .route("/v1/fail", get(fail))
        .route_layer(budgets)
        // Not limited: it only looks.
        .route("/v1/quota", get(quota_left::<St>))
        .with_state(quota);

    let (listener, _) = bind_listener("--listen", args.listen).await?;
    serve(listener, app).await?;
    Ok(())
}

/// `?tokens=N`.
#[derive(Deserialize)]
struct Completion {
    tokens: u64,
}

/// `POST /v1/complete?tokens=N`: a model call that used `N` tokens, at
/// most `max_tokens`.
async fn complete<St>(
    State(quota): State<Quota<St>>,
    info: RateLimitInfo,
    Query(call): Query<Completion>,
) -> Response {
    if call.tokens > quota.max_tokens {
        // No header: charged the reservation.
        return (
            StatusCode::BAD_REQUEST,
            format!("a call uses at most {} tokens\n", quota.max_tokens),
        )
            .into_response();
    }
    let reserved = info.estimate().unwrap_or(0);
    (
        [(TOKENS_USED, call.tokens.to_string())],
        format!(
            "completion: {} tokens (reserved {reserved}, settled after this response)\n",
            call.tokens
        ),
    )
        .into_response()
}

/// `GET /v1/fail`: a model call that failed; its reservation is given back.
async fn fail() -> (StatusCode, &'static str) {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        "the model failed; this call costs nothing\n",
    )
}

/// What `GET /v1/quota` looks at, and the most tokens one call may use.
#[derive(Clone)]
struct Quota<St> {
    limiter: Limiter<St>,
    max_tokens: u64,
}

/// `GET /v1/quota`: the caller's token budget, consuming nothing.
async fn quota_left<St: Store + Clone>(
    State(quota): State<Quota<St>>,
    headers: HeaderMap,
) -> Response {
    let Some(api_key) = headers.get(API_KEY_HEADER) else {
        return refused(StatusCode::BAD_REQUEST, "send your x-api-key");
    };
    // The limiter hashes the value as the layer's HeaderKey does: this is
    // the budget the rule charges.
    match quota.limiter.peek(api_key.as_bytes()).await {
        Ok(decision) => axum::Json(serde_json::json!({
            "limit": decision.limit(),
            "remaining": decision.remaining(),
            "in_debt": !decision.is_allowed(),
            "reset_after_ms": decision.reset_after().as_millis(),
            "retry_after_ms": decision.retry_after().map_or(0, |d| d.as_millis()),
        }))
        .into_response(),
        Err(e) => {
            eprintln!("error: the budget could not be read: {e}");
            refused(
                StatusCode::SERVICE_UNAVAILABLE,
                "the budget could not be read",
            )
        }
    }
}

/// A problem+json refusal of this example's own.
fn refused(status: StatusCode, detail: &str) -> Response {
    problem(status, detail).map(axum::body::Body::from)
}
