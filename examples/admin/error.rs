//! [`AdminError`]: why an admin request failed, and its answer.

use std::error::Error;
use std::fmt;

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ratelimit_core::StoreError;
use serde_json::json;

/// Why an admin request failed; answered as `{"error":"..."}`.
#[derive(Debug)]
pub(super) enum AdminError {
    /// A bad key, amount, duration or query string: `400`.
    BadRequest(String),
    /// Without the bearer token, or with another: `401`.
    Unauthorized,
    /// Sent by a browser for a web page: `403`.
    FromWebPage,
    /// The store refused or failed: `409`, `503` or `500`.
    Store(StoreError),
}

impl AdminError {
    pub(super) fn bad(message: impl Into<String>) -> Self {
        AdminError::BadRequest(message.into())
    }

    fn status(&self) -> StatusCode {
        match self {
            AdminError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AdminError::Unauthorized => StatusCode::UNAUTHORIZED,
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
            AdminError::Unauthorized => {
                f.write_str("missing or wrong token: send Authorization: Bearer <token>")
            }
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
            AdminError::BadRequest(_) | AdminError::Unauthorized | AdminError::FromWebPage => None,
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
        let mut response =
            (self.status(), Json(json!({ "error": self.to_string() }))).into_response();
        if let AdminError::Unauthorized = self {
            // A 401 names the scheme that would be accepted (RFC 9110, RFC 6750).
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(r#"Bearer realm="ratelimit-admin""#),
            );
        }
        response
    }
}
