//! [`AdminToken`]: the bearer token the admin API asks for, and the
//! middleware that checks it.

use std::fmt;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ratelimit_core::key::hashed;
use subtle::ConstantTimeEq;

use super::error::AdminError;

/// The secret an operator sends as `Authorization: Bearer <token>` to use
/// the admin API ([`AdminApi::bearer_token`](crate::AdminApi::bearer_token)).
///
/// At least [`MIN_LEN`](AdminToken::MIN_LEN) characters, visible ASCII
/// without spaces (what a header carries as it is); make one with
/// `openssl rand -hex 32`. Only its digest is kept, and `Debug` shows none
/// of it.
///
/// ```
/// use ratelimit_examples::AdminToken;
///
/// assert!(AdminToken::new("0123456789abcdef0123456789abcdef").is_ok());
/// assert!(AdminToken::new("hunter2").is_err(), "too short to resist guessing");
/// assert!(AdminToken::new("with a space in the middle").is_err());
/// ```
#[derive(Clone)]
pub struct AdminToken {
    digest: Vec<u8>,
}

impl AdminToken {
    /// The fewest characters a token may have.
    pub const MIN_LEN: usize = 16;

    /// A token of `text`.
    ///
    /// # Errors
    ///
    /// When `text` is shorter than [`MIN_LEN`](AdminToken::MIN_LEN), or
    /// holds anything but visible ASCII; the message says which, never the
    /// token.
    pub fn new(text: &str) -> Result<Self, String> {
        if text.len() < Self::MIN_LEN {
            return Err(format!(
                "a token of {} characters is too short: use at least {} (openssl rand -hex 32)",
                text.len(),
                Self::MIN_LEN
            ));
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(String::from(
                "a token holds visible ASCII only, without spaces (openssl rand -hex 32)",
            ));
        }
        Ok(AdminToken {
            digest: hashed(text.as_bytes()),
        })
    }

    /// Whether `presented` is the token. Both sides are hashed first, and
    /// the digests compared in constant time, so neither the time taken
    /// nor an early mismatch tells a guesser how much of a guess was right,
    /// nor how long the token is.
    fn accepts(&self, presented: &[u8]) -> bool {
        hashed(presented).ct_eq(&self.digest).into()
    }
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

/// Lets a request through only with `Authorization: Bearer <token>` (the
/// scheme in any case, as RFC 9110 has it); else `401` with
/// `WWW-Authenticate: Bearer`.
pub(super) async fn require_token(
    State(token): State<Arc<AdminToken>>,
    request: Request,
    next: Next,
) -> Response {
    match bearer(request.headers()) {
        Some(presented) if token.accepts(presented) => next.run(request).await,
        _ => AdminError::Unauthorized.into_response(),
    }
}

/// The credentials of an `Authorization: Bearer ...` header, if that is what
/// the request sent.
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, credentials) = value.split_at_checked(b"Bearer ".len())?;
    if !scheme.eq_ignore_ascii_case(b"Bearer ") {
        return None;
    }
    let credentials = credentials.trim_ascii_start();
    (!credentials.is_empty()).then_some(credentials)
}
