//! gRPC refusals: trailers-only responses with a `grpc-status`, built without
//! depending on tonic (its `Status::into_http` does the same).

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, header};
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

use crate::responses::rejection::Rejection;

/// The gRPC status codes a refusal uses (the gRPC spec's numbers, as tonic's
/// `Code` has them).
pub(crate) mod code {
    /// `RESOURCE_EXHAUSTED`: over a quota.
    pub(crate) const RESOURCE_EXHAUSTED: i32 = 8;
    /// `INTERNAL`: a store error that is not an outage, or no peer address.
    pub(crate) const INTERNAL: i32 = 13;
    /// `UNAVAILABLE`: the store is unavailable.
    pub(crate) const UNAVAILABLE: i32 = 14;
}

/// What `grpc-message` percent-encodes besides non-ASCII bytes: the gRPC
/// HTTP/2 protocol allows printable ASCII (`0x20..=0x7E`) except `%`.
const GRPC_MESSAGE: &AsciiSet = &CONTROLS.add(b'%');

/// Whether a request is gRPC (`content-type: application/grpc...`).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The trailers-only response for `rejection`: HTTP 200 with `grpc-status`,
/// `grpc-message` and, for `RESOURCE_EXHAUSTED`, `grpc-retry-pushback-ms`
/// (the retry delay; `-1`, "do not retry", when retrying cannot help).
pub(crate) fn trailers_only(rejection: &Rejection) -> Response<Bytes> {
    let (status, pushback) = match rejection {
        Rejection::Limited(_) => (
            code::RESOURCE_EXHAUSTED,
            rejection.retry_after_micros().map_or(-1, |us| {
                i64::try_from(us.div_ceil(1_000)).unwrap_or(i64::MAX)
            }),
        ),
        Rejection::CostTooHigh { .. } | Rejection::MissingKey => (code::RESOURCE_EXHAUSTED, -1),
        Rejection::Unavailable(_) => (code::UNAVAILABLE, 0),
        Rejection::Internal(_) | Rejection::NoPeerAddress => (code::INTERNAL, 0),
    };
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", HeaderValue::from(status));
    if let Ok(message) = HeaderValue::from_str(&message(&rejection.public_detail())) {
        headers.insert("grpc-message", message);
    }
    if status == code::RESOURCE_EXHAUSTED {
        headers.insert("grpc-retry-pushback-ms", HeaderValue::from(pushback));
    }
    response
}

/// Percent-encodes a `grpc-message` as the gRPC HTTP/2 protocol asks.
fn message(text: &str) -> String {
    utf8_percent_encode(text, GRPC_MESSAGE).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(message("a b%c\né~\x7f"), "a b%25c%0A%C3%A9~%7F");
    }

    #[cfg(feature = "tonic")]
    #[test]
    fn codes_are_tonics() {
        assert_eq!(
            code::RESOURCE_EXHAUSTED,
            tonic::Code::ResourceExhausted as i32
        );
        assert_eq!(code::INTERNAL, tonic::Code::Internal as i32);
        assert_eq!(code::UNAVAILABLE, tonic::Code::Unavailable as i32);
    }
}
