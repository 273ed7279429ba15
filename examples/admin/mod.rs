//! The operators' admin API ([`AdminApi`]) over HTTP and JSON.

mod error;
mod token;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ratelimit_core::{AdminStore, Decision, Policy};
use serde::Serialize;

use crate::parse_duration;
use error::AdminError;
pub use token::AdminToken;

/// A JSON admin API over `store`: what an operator does to one client's key
/// ([`AdminStore`]) while the service runs, under each policy the service
/// limits it by.
///
/// | request | what | answer |
/// |---|---|---|
/// | `GET /admin/keys/{key}` | [`peek`](AdminStore::peek): consumes nothing | `200`, the decision |
/// | `POST /admin/keys/{key}/reset` | [`reset`](AdminStore::reset): a full budget again, any block lifted | `204` |
/// | `POST /admin/keys/{key}/penalize?amount=N` | [`penalize`](AdminStore::penalize): consume `N` units, even into debt | `200`, the decision after |
/// | `POST /admin/keys/{key}/reward?amount=N` | [`reward`](AdminStore::reward): give back `N` units | `200`, the decision after |
/// | `POST /admin/keys/{key}/block?for=DURATION` | [`block`](AdminStore::block) for `30s`, `10m`, `1h`, `1d`... ([`parse_duration`](crate::parse_duration)) | `204` |
/// | `POST /admin/keys/{key}/unblock` | [`unblock`](AdminStore::unblock) | `204` |
///
/// Each operation applies to the key under every policy of the API
/// ([`new`](AdminApi::new) and [`and`](AdminApi::and), in the order given;
/// a policy that never sees the key is not affected by it). A decision is
/// the tightest of the key's, as
/// [`Decisions::tightest`](ratelimit_tower::Decisions::tightest) picks it
/// (a denial first, then the least left; the last policy on a tie):
/// `{"policy":"gcra-10-at-10-per-1m","key":"203.0.113.7","allowed":true,"limit":10,"remaining":7,"reset_after_ms":18000,"retry_after_ms":null}`,
/// the policy's name, the key as given, and the fields of [`Decision`]
/// (`remaining`: what a request of cost 1 could still take; the times in
/// whole milliseconds, rounded up; `retry_after_ms` is `null` unless
/// denied, as while blocked or in debt).
///
/// `{key}` is the key the rate limiter passes to the store, as its key
/// extractor made it (for [`PeerIp`](struct@ratelimit_tower::PeerIp), an
/// IPv4 client's address as Rust prints it, `203.0.113.7`, and an IPv6
/// client's /64, `2001:db8::/64`; for a
/// [`HeaderKey`](ratelimit_tower::HeaderKey), what its
/// [`key_for`](ratelimit_tower::HeaderKey::key_for) gives), percent-decoded:
/// write `/` as `%2F` and `#` as `%23`.
///
/// With a [`bearer_token`](AdminApi::bearer_token), every request must
/// carry `Authorization: Bearer <token>`, or is answered `401` with
/// `WWW-Authenticate: Bearer`. Without one the API has no authentication:
/// whoever reaches it can reset, unblock or block any client. Serve it on
/// its own listener, never next to the public routes, and without a token
/// on loopback only.
///
/// Errors are `{"error":"..."}`: `400` for a bad key, amount or duration,
/// a missing, repeated or unknown query parameter (amounts are whole
/// numbers above 0, durations of a microsecond or more); `401` without the token; `403`
/// for requests sent by a web browser from a page (they carry `Origin`, or
/// a `Sec-Fetch-Site` other than `none`): no web page can reset or unblock
/// anything through an operator's browser; `409` when the operation does
/// not apply to the policy ([`StoreError::Unsupported`](ratelimit_core::StoreError::Unsupported):
/// penalties and rewards of a concurrency limit) or the policy conflicts
/// with what the store holds; `503` when the store is unavailable
/// ([`StoreError::is_outage`](ratelimit_core::StoreError::is_outage):
/// unreachable, timed out, full); `500` otherwise. The router has no
/// fallback of its own, so it can be merged into another: other paths are
/// whatever that router answers (axum's bare `404` alone).
///
/// ```
/// use axum::body::{Body, to_bytes};
/// use axum::http::{Request, StatusCode};
/// use ratelimit_core::{MemoryStore, Policy, Rate, Store};
/// use ratelimit_examples::{AdminApi, AdminToken};
/// use tower::ServiceExt;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let policy = Policy::gcra(10, Rate::per_hour(10))?.with_name("api")?;
/// store.check(b"203.0.113.7", &policy, 3).await?;
///
/// let token = "0123456789abcdef0123456789abcdef";
/// let admin = AdminApi::new(store, policy)
///     .bearer_token(AdminToken::new(token)?)
///     .router();
/// let peek = Request::get("/admin/keys/203.0.113.7")
///     .header("authorization", format!("Bearer {token}"))
///     .body(Body::empty())?;
/// let response = admin.clone().oneshot(peek).await?;
/// assert_eq!(response.status(), StatusCode::OK);
/// let body = to_bytes(response.into_body(), 1 << 16).await?;
/// let json = String::from_utf8(body.to_vec())?;
/// assert!(json.contains(r#""key":"203.0.113.7""#), "{json}");
/// assert!(json.contains(r#""remaining":7"#), "{json}");
///
/// let block = Request::post("/admin/keys/203.0.113.7/block?for=30s")
///     .header("authorization", format!("Bearer {token}"))
///     .body(Body::empty())?;
/// assert_eq!(admin.clone().oneshot(block).await?.status(), StatusCode::NO_CONTENT);
/// let bad = Request::post("/admin/keys/203.0.113.7/penalize?amount=lots")
///     .header("authorization", format!("Bearer {token}"))
///     .body(Body::empty())?;
/// assert_eq!(admin.clone().oneshot(bad).await?.status(), StatusCode::BAD_REQUEST);
/// let without_token = Request::post("/admin/keys/203.0.113.7/unblock").body(Body::empty())?;
/// let refused = admin.oneshot(without_token).await?;
/// assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
/// assert!(refused.headers()["www-authenticate"].to_str()?.starts_with("Bearer"));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct AdminApi<S> {
    store: S,
    policies: Vec<Policy>,
    token: Option<AdminToken>,
}

impl<S: AdminStore + Clone> AdminApi<S> {
    /// The API over `store` for keys limited by `policy`, without
    /// authentication until [`bearer_token`](AdminApi::bearer_token).
    pub fn new(store: S, policy: Policy) -> Self {
        AdminApi {
            store,
            policies: vec![policy],
            token: None,
        }
    }

    /// `policy` too: the service limits keys by it as well (a per-IP limit
    /// beside a per-client one), so operations act under it as well.
    #[must_use]
    pub fn and(mut self, policy: Policy) -> Self {
        self.policies.push(policy);
        self
    }

    /// Asks every request for `Authorization: Bearer <token>`.
    #[must_use]
    pub fn bearer_token(mut self, token: AdminToken) -> Self {
        self.token = Some(token);
        self
    }

    /// The router: `/admin/keys/{key}` and the operations below it.
    pub fn router(self) -> Router {
        let router = Router::new()
            .route("/admin/keys/{key}", get(peek::<S>))
            .route("/admin/keys/{key}/reset", post(reset::<S>))
            .route("/admin/keys/{key}/penalize", post(penalize::<S>))
            .route("/admin/keys/{key}/reward", post(reward::<S>))
            .route("/admin/keys/{key}/block", post(block::<S>))
            .route("/admin/keys/{key}/unblock", post(unblock::<S>));
        let router = match self.token {
            Some(token) => router.route_layer(middleware::from_fn_with_state(
                Arc::new(token),
                token::require_token,
            )),
            None => router,
        };
        router
            .route_layer(middleware::from_fn(refuse_browsers))
            .with_state(Admin {
                store: self.store,
                policies: Arc::from(self.policies),
            })
    }
}

/// The router's state: the store and the policies every operation is on.
#[derive(Clone)]
struct Admin<S> {
    store: S,
    policies: Arc<[Policy]>,
}

/// A request on one key: the router's state, the `{key}` of the path
/// (percent-decoded, not empty) and the query parameters, not yet
/// checked (each operation names the one it takes).
struct OnKey<S> {
    admin: Admin<S>,
    key: String,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
}

impl<S: Clone + Send + Sync> FromRequestParts<Admin<S>> for OnKey<S> {
    type Rejection = AdminError;

    async fn from_request_parts(parts: &mut Parts, admin: &Admin<S>) -> Result<Self, AdminError> {
        let key = key_of(Path::from_request_parts(parts, admin).await)?;
        let query = Query::from_request_parts(parts, admin).await;
        Ok(OnKey {
            admin: admin.clone(),
            key,
            query,
        })
    }
}

impl<S: AdminStore> OnKey<S> {
    /// The value of the query parameter `expected`, required when named;
    /// any other parameter, or one given twice, is an error.
    fn parameter(self, expected: Option<&str>) -> Result<(Self, Option<String>), AdminError> {
        let Query(pairs) = self
            .query
            .as_ref()
            .map_err(|e| AdminError::bad(format!("query string: {}", e.body_text())))?;
        let value = only(pairs, expected)?;
        Ok((self, value))
    }

    /// No query parameter at all.
    fn without_parameters(self) -> Result<Self, AdminError> {
        self.parameter(None).map(|(on, _)| on)
    }

    fn key(&self) -> &[u8] {
        self.key.as_bytes()
    }

    fn store(&self) -> &S {
        &self.admin.store
    }

    fn policies(&self) -> &[Policy] {
        &self.admin.policies
    }

    /// The `200` answer with the tightest of `decisions` (one per policy,
    /// in order) about this key.
    fn json(&self, decisions: &[Decision]) -> Result<Response, AdminError> {
        let (policy, decision) = tightest(self.policies(), decisions)
            .ok_or_else(|| AdminError::bad("no policy to decide under"))?;
        Ok(decision_json(policy, &self.key, decision))
    }
}

/// The decision that refuses first, with its policy: what
/// `Decisions::tightest` picks among a request's decisions (the last one on
/// a tie).
fn tightest<'a>(
    policies: &'a [Policy],
    decisions: &'a [Decision],
) -> Option<(&'a Policy, &'a Decision)> {
    policies.iter().zip(decisions).max_by_key(|(policy, d)| {
        (
            !d.is_allowed() && !policy.is_shadow(),
            !d.is_allowed(),
            d.retry_after_micros(),
            std::cmp::Reverse(d.remaining()),
        )
    })
}

/// `GET /admin/keys/{key}`.
async fn peek<S: AdminStore + Clone>(on: OnKey<S>) -> Result<Response, AdminError> {
    let on = on.without_parameters()?;
    let mut decisions = Vec::with_capacity(on.policies().len());
    for policy in on.policies() {
        decisions.push(on.store().peek(on.key(), policy).await?);
    }
    on.json(&decisions)
}

/// `POST /admin/keys/{key}/reset`.
async fn reset<S: AdminStore + Clone>(on: OnKey<S>) -> Result<StatusCode, AdminError> {
    let on = on.without_parameters()?;
    for policy in on.policies() {
        on.store().reset(on.key(), policy).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /admin/keys/{key}/penalize?amount=N`.
async fn penalize<S: AdminStore + Clone>(on: OnKey<S>) -> Result<Response, AdminError> {
    adjust(on, true).await
}

/// `POST /admin/keys/{key}/reward?amount=N`.
async fn reward<S: AdminStore + Clone>(on: OnKey<S>) -> Result<Response, AdminError> {
    adjust(on, false).await
}

/// A penalty (`penalize`) or a reward of `?amount=N` units: the decision after.
async fn adjust<S: AdminStore>(on: OnKey<S>, penalize: bool) -> Result<Response, AdminError> {
    let (on, amount) = amount(on)?;
    let (store, key) = (&on.admin.store, on.key());
    let mut decisions = Vec::with_capacity(on.admin.policies.len());
    for policy in on.admin.policies.iter() {
        decisions.push(if penalize {
            store.penalize(key, policy, amount).await?
        } else {
            store.reward(key, policy, amount).await?
        });
    }
    on.json(&decisions)
}

/// `POST /admin/keys/{key}/block?for=DURATION`.
async fn block<S: AdminStore + Clone>(on: OnKey<S>) -> Result<StatusCode, AdminError> {
    let (on, text) = on.parameter(Some("for"))?;
    let text = text.unwrap_or_default();
    let duration = parse_duration(&text).map_err(|e| AdminError::bad(format!("for: {e}")))?;
    // Blocks count whole microseconds: less is zero, and the store would
    // unblock. Say so rather than do it quietly.
    if duration < Duration::from_micros(1) {
        return Err(AdminError::bad(format!(
            "for: {text:?} is under a microsecond (to end a block, POST .../unblock)"
        )));
    }
    for policy in on.policies() {
        on.store().block(on.key(), policy, duration).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /admin/keys/{key}/unblock`.
async fn unblock<S: AdminStore + Clone>(on: OnKey<S>) -> Result<StatusCode, AdminError> {
    let on = on.without_parameters()?;
    for policy in on.policies() {
        on.store().unblock(on.key(), policy).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Refuses requests a web page made a browser send: an API on loopback is
/// still reachable from every page the operator opens.
async fn refuse_browsers(request: Request, next: Next) -> Response {
    if from_a_web_page(request.headers()) {
        return AdminError::FromWebPage.into_response();
    }
    next.run(request).await
}

/// Whether a browser sent the request on behalf of a page: browsers add
/// `Origin` to every cross-origin request and every `POST`, and
/// `Sec-Fetch-Site` to every request (`none` when the user typed the URL).
fn from_a_web_page(headers: &HeaderMap) -> bool {
    headers.contains_key(header::ORIGIN)
        || headers
            .get("sec-fetch-site")
            .is_some_and(|site| site.as_bytes() != b"none")
}

/// The key, percent-decoded.
fn key_of(key: Result<Path<String>, PathRejection>) -> Result<String, AdminError> {
    let Path(key) = key.map_err(|e| AdminError::bad(format!("key: {}", e.body_text())))?;
    if key.is_empty() {
        return Err(AdminError::bad("key: empty"));
    }
    Ok(key)
}

/// The value of the query parameter `expected` among `pairs`, required
/// when named; any other parameter, or one given twice, is an error.
fn only(pairs: &[(String, String)], expected: Option<&str>) -> Result<Option<String>, AdminError> {
    let mut value = None;
    for (name, text) in pairs {
        if Some(name.as_str()) != expected {
            let takes = match expected {
                Some(expected) => format!("only {expected}"),
                None => String::from("none"),
            };
            return Err(AdminError::bad(format!(
                "unknown query parameter {name:?} (this operation takes {takes})"
            )));
        }
        if value.replace(text.clone()).is_some() {
            return Err(AdminError::bad(format!("{name} given twice")));
        }
    }
    match expected {
        Some(expected) if value.is_none() => Err(AdminError::bad(format!(
            "missing query parameter {expected}"
        ))),
        _ => Ok(value),
    }
}

/// `?amount=N`, a whole number above 0.
fn amount<S: AdminStore>(on: OnKey<S>) -> Result<(OnKey<S>, u64), AdminError> {
    let (on, text) = on.parameter(Some("amount"))?;
    let text = text.unwrap_or_default();
    let amount = text.parse::<u64>().ok().filter(|&n| n > 0).ok_or_else(|| {
        AdminError::bad(format!("amount: {text:?} is not a whole number above 0"))
    })?;
    Ok((on, amount))
}

/// A decision as the API shows it, fields in this order.
#[derive(Debug, Serialize)]
struct DecisionBody<'a> {
    policy: &'a str,
    key: &'a str,
    allowed: bool,
    limit: u64,
    remaining: u64,
    reset_after_ms: u64,
    retry_after_ms: Option<u64>,
}

/// The `200` answer with `decision`.
fn decision_json(policy: &Policy, key: &str, decision: &Decision) -> Response {
    let millis = |micros: u64| micros.div_ceil(1_000);
    Json(DecisionBody {
        policy: policy.name(),
        key,
        allowed: decision.is_allowed(),
        limit: decision.limit(),
        remaining: decision.remaining(),
        reset_after_ms: millis(decision.reset_after_micros()),
        retry_after_ms: decision
            .retry_after()
            .map(|_| millis(decision.retry_after_micros())),
    })
    .into_response()
}
