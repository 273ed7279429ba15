//! The responses the layer answers with instead of calling the inner service.

use http::{HeaderValue, Response, StatusCode, header};

use crate::body::ResponseBody;
use crate::decisions::Decisions;

/// `Retry-After` in delay-seconds: rounded up, and at least 1 while denied.
pub fn retry_after_seconds(micros: u64) -> u64 {
    micros.div_ceil(1_000_000).max(1)
}

/// `429 Too Many Requests` with `Retry-After`.
pub(crate) fn too_many_requests<B>(decisions: &Decisions) -> Response<ResponseBody<B>> {
    let retry = decisions
        .iter()
        .filter(|e| !e.decision().is_allowed())
        .map(|e| e.decision().retry_after_micros())
        .max()
        .unwrap_or(1);
    let mut response = Response::new(ResponseBody::full("Too Many Requests\n"));
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(
        header::RETRY_AFTER,
        HeaderValue::from(retry_after_seconds(retry)),
    );
    response
}

/// A bare response with `status` and a short text body.
pub(crate) fn plain<B>(status: StatusCode, text: &'static str) -> Response<ResponseBody<B>> {
    let mut response = Response::new(ResponseBody::full(text));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::retry_after_seconds;

    #[test]
    fn rounds_up_never_zero() {
        assert_eq!(retry_after_seconds(0), 1);
        assert_eq!(retry_after_seconds(1), 1);
        assert_eq!(retry_after_seconds(1_000_000), 1);
        assert_eq!(retry_after_seconds(1_000_001), 2);
        assert_eq!(retry_after_seconds(9_999_999), 10);
    }
}
