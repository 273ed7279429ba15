//! How refusals reach the client: responses for HTTP and gRPC, errors for
//! other request types and for an HTTP client's stack.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};

use crate::body::ResponseBody;
use crate::decisions::Decisions;
use crate::permit::PermitGuard;
use crate::responses::fields::Fields;
use crate::responses::grpc::{is_grpc, trailers_only};
use crate::responses::headers::{PolicyFieldCache, RateLimitHeaders};
use crate::responses::problem::{PROBLEM_JSON, problem_json};
use crate::responses::rejection::{Rejection, retry_after_seconds};

/// A boxed error, as tower uses for middleware errors (`tower::BoxError`).
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// How refusals reach the client: the third type parameter of
/// [`RateLimitLayer`](crate::RateLimitLayer) and [`RateLimit`](crate::RateLimit),
/// which gives the service its response and error types.
///
/// [`HttpRejections`] (the default) answers refusals with HTTP responses
/// (`429`, `503`, or a gRPC trailers-only response), and keeps the inner
/// service's error; [`ErrorRejections`] makes them errors, for request
/// types that are not HTTP; [`ClientRejections`] makes them errors for an
/// HTTP client's stack, whose response bodies hold their permits.
///
/// Sealed: these three are the only implementations, and only the
/// associated types [`Response`](Reject::Response) and
/// [`Error`](Reject::Error) are API; the hidden items are how this crate's
/// service uses them, called nowhere else. Answers are customised with
/// [`HttpRejections::on_rejection`].
pub trait Reject<Req, Res, E>: sealed::Sealed + Clone + Send + Sync + 'static {
    /// The service's response.
    type Response;
    /// The service's error.
    type Error;
    /// What an allowed request's response takes from its decisions and these
    /// settings (HTTP: its rate-limit fields), taken when the request is
    /// decided: the response future holds it instead of the decisions and a
    /// clone of the settings, whose reference count every request on every
    /// thread would write.
    // Hidden, as every item below: this crate's service uses it, and the
    // trait is sealed.
    #[doc(hidden)]
    type Allowed: Send + 'static;

    /// What the response to a request allowed with `decisions` will take.
    /// Only this crate can call it (`token`), so its HTTP answer, a type
    /// private to the crate, never reaches a caller outside.
    #[doc(hidden)]
    fn allowing(&self, decisions: Option<&Decisions>, token: sealed::Token) -> Self::Allowed;

    /// Records the decisions on an allowed request (HTTP: its extensions).
    #[doc(hidden)]
    fn annotate(&self, req: &mut Req, decisions: Decisions);

    /// Wraps the inner service's response. `permit` holds the request's
    /// concurrency permits; dropping it releases them.
    #[doc(hidden)]
    fn allowed(allowing: Self::Allowed, response: Res, permit: PermitGuard) -> Self::Response;

    /// Gives `f` the head of the inner service's response (HTTP: its
    /// status, headers and extensions; `None` for a response that is not
    /// HTTP), to settle costs from and remove cost headers from.
    #[doc(hidden)]
    fn inspect(response: Res, f: impl FnOnce(Option<&mut http::response::Parts>)) -> Res;

    /// Answers a refusal of `req` (read, such as "is it gRPC?", only when
    /// it is refused).
    #[doc(hidden)]
    fn rejected(&self, req: &Req, rejection: Rejection) -> Result<Self::Response, Self::Error>;

    /// Converts the inner service's error.
    #[doc(hidden)]
    fn error(error: E) -> Self::Error;
}

/// Keeps [`Reject`] to the implementations of this crate, and
/// `Reject::allowing` to its callers.
pub(crate) mod sealed {
    pub trait Sealed {}

    /// Taken by `Reject::allowing`: only this crate can name it, so only
    /// this crate can call that method.
    #[derive(Debug, Clone, Copy)]
    pub struct Token;

    impl Sealed for super::HttpRejections {}
    impl Sealed for super::ErrorRejections {}
    impl Sealed for super::ClientRejections {}
}

type CustomHttp = Box<dyn Fn(&Rejection, Response<Bytes>) -> Response<Bytes> + Send + Sync>;

/// What the clones of one [`HttpRejections`] share: behind one `Arc`, so the
/// clone each request takes costs one reference count.
#[derive(Default)]
struct Shared {
    custom: Option<CustomHttp>,
    policy_field: PolicyFieldCache,
}

/// How refusals are answered: the one rejection builder, with the layer's
/// settings ([`RateLimitLayer::headers`](crate::RateLimitLayer::headers),
/// [`RateLimitLayer::on_rejection`](crate::RateLimitLayer::on_rejection)).
///
/// For an HTTP request:
///
/// - denied by a limit: `429 Too Many Requests` with `Retry-After`
///   (delay-seconds, rounded up, never 0) and an `application/problem+json`
///   body (RFC 9457) of type `quota-exceeded` naming the violated policies;
/// - a cost that can never pass, or a missing key: `429` without `Retry-After`;
/// - the store unavailable and the failure policy closed: `503 Service Unavailable`;
/// - a store error that is not an outage (a configuration mistake or a bug):
///   `500 Internal Server Error`;
/// - no peer address for a peer or client IP key: `500 Internal Server Error`;
///
/// and for a gRPC request (`content-type: application/grpc...`) a
/// trailers-only response, never a 429 (gRPC clients read HTTP 429 as
/// `UNAVAILABLE` and retry): HTTP 200 with `grpc-status: 8`
/// (`RESOURCE_EXHAUSTED`), `grpc-message`, and `grpc-retry-pushback-ms` (the
/// retry delay; `-1`, "do not retry", when retrying cannot help),
/// `grpc-status: 14` (`UNAVAILABLE`) when the store is unavailable, or
/// `grpc-status: 13` (`INTERNAL`) for a store error that is not an outage.
///
/// Allowed and denied HTTP responses carry the selected [`RateLimitHeaders`]
/// (by default the IETF `RateLimit-Policy` and `RateLimit` fields).
///
/// ```
/// use ratelimit_tower::{HttpRejections, Rejection};
/// use ratelimit_tower::headers::RateLimitHeaders;
///
/// let rejections = HttpRejections::default().headers(RateLimitHeaders::legacy());
/// let response = rejections.response(&Rejection::MissingKey);
/// assert_eq!(response.status(), 429);
/// ```
#[derive(Clone, Default)]
pub struct HttpRejections {
    shared: Arc<Shared>,
    headers: RateLimitHeaders,
}

impl fmt::Debug for HttpRejections {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpRejections")
            .field("custom", &self.shared.custom.is_some())
            .field("headers", &self.headers)
            .finish()
    }
}

impl HttpRejections {
    /// Which rate-limit headers to send (default: the IETF fields).
    #[must_use]
    pub fn headers(mut self, headers: RateLimitHeaders) -> Self {
        self.headers = headers;
        self
    }

    /// Answers refusals with `f`, which is given the refusal and the response
    /// these settings would send (return it for the cases `f` leaves alone).
    /// A denial's response still gets the rate-limit headers and
    /// `Retry-After` that `f` did not set; a gRPC response is sent as `f`
    /// returns it.
    #[must_use]
    pub fn on_rejection<F>(mut self, f: F) -> Self
    where
        F: Fn(&Rejection, Response<Bytes>) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.shared = Arc::new(Shared {
            custom: Some(Box::new(f)),
            policy_field: PolicyFieldCache::default(),
        });
        self
    }

    /// The HTTP response to `rejection`: status, body, `Retry-After` and the
    /// rate-limit headers, as these settings give them.
    pub fn response(&self, rejection: &Rejection) -> Response<Bytes> {
        self.respond(false, rejection)
    }

    /// The response to `rejection` for an HTTP or a gRPC request.
    fn respond(&self, grpc: bool, rejection: &Rejection) -> Response<Bytes> {
        let default = if grpc {
            trailers_only(rejection)
        } else {
            standard_http(rejection)
        };
        let mut response = match &self.shared.custom {
            Some(custom) => custom(rejection, default),
            None => default,
        };
        if !grpc && let Rejection::Limited(decisions) = rejection {
            let mut headers = HeaderMap::new();
            self.headers
                .fields(decisions, Some(&self.shared.policy_field))
                .insert_into(&mut headers);
            // Retry-After on every denial, even from a custom builder.
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(retry_after_seconds(
                    rejection.retry_after_micros().unwrap_or(0),
                )),
            );
            for (name, value) in headers {
                if let Some(name) = name
                    && !response.headers().contains_key(&name)
                {
                    response.headers_mut().insert(name, value);
                }
            }
        }
        response
    }
}

/// The standard HTTP response to `rejection`: its status and a problem+json
/// body (the rate-limit headers and `Retry-After` are added by
/// [`HttpRejections::respond`]).
fn standard_http(rejection: &Rejection) -> Response<Bytes> {
    let status = match rejection {
        Rejection::Limited(_) | Rejection::CostTooHigh { .. } | Rejection::MissingKey => {
            StatusCode::TOO_MANY_REQUESTS
        }
        Rejection::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        Rejection::Internal(_) | Rejection::NoPeerAddress => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let mut response = Response::new(Bytes::from(problem_json(rejection)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response
}

impl<B, ResB, E> Reject<Request<B>, Response<ResB>, E> for HttpRejections {
    type Response = Response<ResponseBody<ResB>>;
    type Error = E;
    type Allowed = Fields;

    fn allowing(&self, decisions: Option<&Decisions>, _: sealed::Token) -> Fields {
        decisions.map_or_else(Fields::default, |decisions| {
            self.headers
                .fields(decisions, Some(&self.shared.policy_field))
        })
    }

    fn annotate(&self, req: &mut Request<B>, decisions: Decisions) {
        req.extensions_mut().insert(decisions);
    }

    fn allowed(
        fields: Fields,
        mut response: Response<ResB>,
        permit: PermitGuard,
    ) -> Self::Response {
        // The fields go into the inner service's response before it is
        // rebuilt around the wrapped body, the larger value to move.
        fields.insert_into(response.headers_mut());
        response.map(|body| ResponseBody::with_permit(body, permit))
    }

    fn inspect(
        response: Response<ResB>,
        f: impl FnOnce(Option<&mut http::response::Parts>),
    ) -> Response<ResB> {
        let (mut parts, body) = response.into_parts();
        f(Some(&mut parts));
        Response::from_parts(parts, body)
    }

    fn rejected(&self, req: &Request<B>, rejection: Rejection) -> Result<Self::Response, E> {
        let grpc = is_grpc(req.headers());
        Ok(self.respond(grpc, &rejection).map(ResponseBody::full))
    }

    fn error(error: E) -> E {
        error
    }
}

/// Refusals as errors, for request types that are not HTTP (a client-side
/// stack calling a downstream API, a queue consumer; for HTTP requests a
/// client sends, see [`ClientRejections`]): the service's error
/// becomes a boxed error (`Box<dyn Error + Send + Sync>`, `tower::BoxError`),
/// and a refusal is a [`Rejection`] inside it (downcast to read the
/// decisions). Chosen by
/// [`RateLimitLayer::for_errors`](crate::RateLimitLayer::for_errors); nothing
/// about it is configurable.
#[derive(Debug, Clone, Copy, Default)]
pub struct ErrorRejections;

impl<Req, Res, E> Reject<Req, Res, E> for ErrorRejections
where
    E: Into<BoxError>,
{
    type Response = Res;
    type Error = BoxError;
    type Allowed = ();

    fn allowing(&self, _: Option<&Decisions>, _: sealed::Token) {}

    fn annotate(&self, _: &mut Req, _: Decisions) {}

    fn allowed((): (), response: Res, _permit: PermitGuard) -> Res {
        // Without a body to outlive the response, the permits end with it.
        response
    }

    fn inspect(response: Res, f: impl FnOnce(Option<&mut http::response::Parts>)) -> Res {
        // Not necessarily HTTP: no head to read costs from.
        f(None);
        response
    }

    fn rejected(&self, _: &Req, rejection: Rejection) -> Result<Res, BoxError> {
        Err(Box::new(rejection))
    }

    fn error(error: E) -> BoxError {
        error.into()
    }
}

/// Refusals as errors, for HTTP requests a client sends (a stack around
/// `hyper_util`'s client, or a service returning `http::Response`s): a
/// refusal is a [`Rejection`] inside a boxed error, as with
/// [`ErrorRejections`], and an allowed response is the inner one with its
/// body wrapped, so a concurrency permit is held until that body ends or is
/// dropped (a download holds its slot while it streams), and costs settle
/// from the response's head ([`Settlement`](crate::Settlement); a cost
/// header is removed from the response unless the settlement keeps it,
/// [`Settlement::keep_header`](crate::Settlement::keep_header)). Chosen by
/// [`RateLimitLayer::for_http_client`](crate::RateLimitLayer::for_http_client).
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientRejections;

impl<B, ResB, E> Reject<Request<B>, Response<ResB>, E> for ClientRejections
where
    E: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = BoxError;
    type Allowed = ();

    fn allowing(&self, _: Option<&Decisions>, _: sealed::Token) {}

    fn annotate(&self, req: &mut Request<B>, decisions: Decisions) {
        req.extensions_mut().insert(decisions);
    }

    fn allowed((): (), response: Response<ResB>, permit: PermitGuard) -> Self::Response {
        response.map(|body| ResponseBody::with_permit(body, permit))
    }

    fn inspect(
        response: Response<ResB>,
        f: impl FnOnce(Option<&mut http::response::Parts>),
    ) -> Response<ResB> {
        <HttpRejections as Reject<Request<B>, Response<ResB>, E>>::inspect(response, f)
    }

    fn rejected(&self, _: &Request<B>, rejection: Rejection) -> Result<Self::Response, BoxError> {
        Err(Box::new(rejection))
    }

    fn error(error: E) -> BoxError {
        error.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_up_never_zero() {
        assert_eq!(retry_after_seconds(0), 1);
        assert_eq!(retry_after_seconds(1), 1);
        assert_eq!(retry_after_seconds(1_000_000), 1);
        assert_eq!(retry_after_seconds(1_000_001), 2);
        assert_eq!(retry_after_seconds(9_999_999), 10);
    }
}
