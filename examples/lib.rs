//! Helpers shared by the examples (see the `[[example]]` targets of this package).

pub use admin::admin_router;
pub use flags::{
    PolicyArgs, algorithm_parser, exit_with_flag_error, nonzero_duration, parse_duration,
    policy_for, redis_url,
};

pub use serve::{
    API_KEY_HEADER, api_key_or_peer_ip, bind_listener, listen_addr_from_env, problem, serve,
    serve_on, serve_with_peers, spawn_serve,
};

pub mod http_apps;
pub mod region;

mod flags;
mod serve;

/// A Prometheus recorder for the examples' metrics: installs it as the
/// global `metrics` recorder, describes the rate limiter's metrics, renders
/// `ratelimit_store_call_duration_seconds` as a histogram with buckets from
/// 100 µs to 1 s (instead of the exporter's default summary), and runs the
/// exporter's upkeep every 5 seconds on the current tokio runtime.
///
/// # Errors
///
/// When a global recorder is already installed.
#[cfg(feature = "metrics")]
pub fn install_prometheus()
-> Result<metrics_exporter_prometheus::PrometheusHandle, metrics_exporter_prometheus::BuildError> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    const STORE_CALL_BUCKETS: [f64; 11] = [
        0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 1.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(ratelimit_tower::metrics::STORE_CALL_DURATION.to_owned()),
            &STORE_CALL_BUCKETS,
        )?
        .install_recorder()?;
    ratelimit_tower::metrics::describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            interval.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// The media type of the Prometheus text format.
#[cfg(feature = "metrics")]
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A router answering `GET /metrics` with what `handle` holds, in the
/// Prometheus text format.
#[cfg(feature = "metrics")]
pub fn metrics_router(handle: metrics_exporter_prometheus::PrometheusHandle) -> axum::Router {
    use axum::http::header;
    use axum::routing::get;
    axum::Router::new().route(
        "/metrics",
        get(move || {
            let handle = handle.clone();
            async move { ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], handle.render()) }
        }),
    )
}

/// Binds `addr` and serves [`metrics_router`] there in the background;
/// returns the address bound.
///
/// # Errors
///
/// When `addr` cannot be bound.
#[cfg(feature = "metrics")]
pub async fn serve_metrics(
    addr: std::net::SocketAddr,
    handle: metrics_exporter_prometheus::PrometheusHandle,
) -> std::io::Result<std::net::SocketAddr> {
    spawn_serve(addr, metrics_router(handle), "metrics").await
}

/// The operators' admin API ([`admin_router`]) over HTTP and JSON.
mod admin {
    use std::error::Error;
    use std::fmt;

    use axum::extract::rejection::{PathRejection, QueryRejection};
    use axum::extract::{FromRequestParts, Path, Query, Request};
    use axum::http::request::Parts;
    use axum::http::{HeaderMap, StatusCode, header};
    use axum::middleware::{self, Next};
    use axum::response::{IntoResponse, Response};
    use axum::routing::{get, post};
    use axum::{Json, Router};
    use ratelimit_core::{AdminStore, Decision, Policy, StoreError};
    use serde::Serialize;
    use serde_json::json;

    use crate::parse_duration;

    /// A JSON admin API over `store` for one `policy`: what an operator does
    /// to one client's key ([`AdminStore`]) while the service runs.
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
    /// A decision is
    /// `{"policy":"gcra-10-at-10-per-1m","key":"203.0.113.7","allowed":true,"limit":10,"remaining":7,"reset_after_ms":18000,"retry_after_ms":null}`:
    /// the policy's name, the key as given, and the fields of [`Decision`]
    /// (`remaining`: what a request of cost 1 could still take; the times in
    /// whole milliseconds, rounded up; `retry_after_ms` is `null` unless
    /// denied, as while blocked or in debt).
    ///
    /// `{key}` is the key the rate limiter passes to the store, as its key
    /// extractor made it (for [`PeerIp`](struct@ratelimit_tower::PeerIp), an
    /// IPv4 client's address as Rust prints it, `203.0.113.7`, and an IPv6
    /// client's /64, `2001:db8::/64`), percent-decoded: write `/` as `%2F`
    /// and `#` as `%23`.
    ///
    /// Errors are `{"error":"..."}`: `400` for a bad key, amount or duration,
    /// a missing, repeated or unknown query parameter (amounts are whole
    /// numbers above 0, durations above zero); `403` for requests sent by a
    /// web browser from a page (they carry `Origin`, or a `Sec-Fetch-Site`
    /// other than `none`): no web page can reset or unblock anything through
    /// an operator's browser; `409` when the operation does not apply to the
    /// policy ([`StoreError::Unsupported`]: penalties and rewards of a
    /// concurrency limit) or the policy conflicts with what the store holds;
    /// `503` when the store is unavailable ([`StoreError::is_outage`]:
    /// unreachable, timed out, full); `500` otherwise. The router has no
    /// fallback of its own, so it can be merged into another: other paths are
    /// whatever that router answers (axum's bare `404` alone).
    ///
    /// The API has no authentication: serve it on its own listener, bound to
    /// loopback or an internal network only, never next to the public routes.
    ///
    /// ```
    /// use axum::body::{Body, to_bytes};
    /// use axum::http::{Request, StatusCode};
    /// use ratelimit_core::{MemoryStore, Policy, Rate, Store};
    /// use tower::ServiceExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = MemoryStore::new();
    /// let policy = Policy::gcra(10, Rate::per_hour(10))?.with_name("api")?;
    /// store.check(b"203.0.113.7", &policy, 3).await?;
    ///
    /// let admin = ratelimit_examples::admin_router(store, policy);
    /// let peek = Request::get("/admin/keys/203.0.113.7").body(Body::empty())?;
    /// let response = admin.clone().oneshot(peek).await?;
    /// assert_eq!(response.status(), StatusCode::OK);
    /// let body = to_bytes(response.into_body(), 1 << 16).await?;
    /// let json = String::from_utf8(body.to_vec())?;
    /// assert!(json.contains(r#""key":"203.0.113.7""#), "{json}");
    /// assert!(json.contains(r#""remaining":7"#), "{json}");
    ///
    /// let block = Request::post("/admin/keys/203.0.113.7/block?for=30s").body(Body::empty())?;
    /// assert_eq!(admin.clone().oneshot(block).await?.status(), StatusCode::NO_CONTENT);
    /// let bad = Request::post("/admin/keys/203.0.113.7/penalize?amount=lots").body(Body::empty())?;
    /// assert_eq!(admin.oneshot(bad).await?.status(), StatusCode::BAD_REQUEST);
    /// # Ok(())
    /// # }
    /// ```
    pub fn admin_router<S>(store: S, policy: Policy) -> Router
    where
        S: AdminStore + Clone,
    {
        Router::new()
            .route("/admin/keys/{key}", get(peek::<S>))
            .route("/admin/keys/{key}/reset", post(reset::<S>))
            .route("/admin/keys/{key}/penalize", post(penalize::<S>))
            .route("/admin/keys/{key}/reward", post(reward::<S>))
            .route("/admin/keys/{key}/block", post(block::<S>))
            .route("/admin/keys/{key}/unblock", post(unblock::<S>))
            .route_layer(middleware::from_fn(refuse_browsers))
            .with_state(Admin { store, policy })
    }

    /// The router's state: the store and the policy every operation is on.
    #[derive(Clone)]
    struct Admin<S> {
        store: S,
        policy: Policy,
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

        async fn from_request_parts(
            parts: &mut Parts,
            admin: &Admin<S>,
        ) -> Result<Self, AdminError> {
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

        /// The `200` answer with `decision` about this key.
        fn json(&self, decision: &Decision) -> Response {
            decision_json(&self.admin.policy, &self.key, decision)
        }
    }

    /// `GET /admin/keys/{key}`.
    async fn peek<S: AdminStore + Clone>(on: OnKey<S>) -> Result<Response, AdminError> {
        let on = on.without_parameters()?;
        Ok(on.json(&on.admin.store.peek(on.key(), &on.admin.policy).await?))
    }

    /// `POST /admin/keys/{key}/reset`.
    async fn reset<S: AdminStore + Clone>(on: OnKey<S>) -> Result<StatusCode, AdminError> {
        let on = on.without_parameters()?;
        on.admin.store.reset(on.key(), &on.admin.policy).await?;
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
        let (store, key, policy) = (&on.admin.store, on.key(), &on.admin.policy);
        let decision = if penalize {
            store.penalize(key, policy, amount).await?
        } else {
            store.reward(key, policy, amount).await?
        };
        Ok(on.json(&decision))
    }

    /// `POST /admin/keys/{key}/block?for=DURATION`.
    async fn block<S: AdminStore + Clone>(on: OnKey<S>) -> Result<StatusCode, AdminError> {
        let (on, text) = on.parameter(Some("for"))?;
        let text = text.unwrap_or_default();
        let duration = parse_duration(&text).map_err(|e| AdminError::bad(format!("for: {e}")))?;
        if duration.is_zero() {
            // The store would unblock: say so rather than do it quietly.
            return Err(AdminError::bad(format!(
                "for: {text:?} is zero (to end a block, POST .../unblock)"
            )));
        }
        on.admin
            .store
            .block(on.key(), &on.admin.policy, duration)
            .await?;
        Ok(StatusCode::NO_CONTENT)
    }

    /// `POST /admin/keys/{key}/unblock`.
    async fn unblock<S: AdminStore + Clone>(on: OnKey<S>) -> Result<StatusCode, AdminError> {
        let on = on.without_parameters()?;
        on.admin.store.unblock(on.key(), &on.admin.policy).await?;
        Ok(StatusCode::NO_CONTENT)
    }

    /// Refuses requests a web page made a browser send: an unauthenticated
    /// API on loopback is still reachable from every page the operator opens.
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
    fn only(
        pairs: &[(String, String)],
        expected: Option<&str>,
    ) -> Result<Option<String>, AdminError> {
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

    /// Why an admin request failed; answered as `{"error":"..."}`.
    #[derive(Debug)]
    enum AdminError {
        /// A bad key, amount, duration or query string: `400`.
        BadRequest(String),
        /// Sent by a browser for a web page: `403`.
        FromWebPage,
        /// The store refused or failed: `409`, `503` or `500`.
        Store(StoreError),
    }

    impl AdminError {
        fn bad(message: impl Into<String>) -> Self {
            AdminError::BadRequest(message.into())
        }

        fn status(&self) -> StatusCode {
            match self {
                AdminError::BadRequest(_) => StatusCode::BAD_REQUEST,
                AdminError::FromWebPage => StatusCode::FORBIDDEN,
                AdminError::Store(
                    StoreError::Unsupported { .. } | StoreError::PolicyConflict { .. },
                ) => StatusCode::CONFLICT,
                AdminError::Store(e) if e.is_outage() => StatusCode::SERVICE_UNAVAILABLE,
                AdminError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
            }
        }
    }

    impl fmt::Display for AdminError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                AdminError::BadRequest(message) => f.write_str(message),
                AdminError::FromWebPage => f.write_str(
                    "refused: sent by a web browser for a page (Origin or Sec-Fetch-Site); \
                     the admin API is for operators' tools",
                ),
                AdminError::Store(e) if e.is_outage() => {
                    write!(f, "the store is unavailable: {e}")
                }
                AdminError::Store(e) => e.fmt(f),
            }
        }
    }

    impl Error for AdminError {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            match self {
                AdminError::Store(e) => Some(e),
                AdminError::BadRequest(_) | AdminError::FromWebPage => None,
            }
        }
    }

    impl From<StoreError> for AdminError {
        fn from(e: StoreError) -> Self {
            AdminError::Store(e)
        }
    }

    impl IntoResponse for AdminError {
        fn into_response(self) -> Response {
            (self.status(), Json(json!({ "error": self.to_string() }))).into_response()
        }
    }
}
