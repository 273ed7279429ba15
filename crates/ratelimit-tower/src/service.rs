//! [`RateLimit`]: the service.

use std::task::{Context, Poll};

use http::{Request, Response};
use ratelimit_core::Store;
use tower_service::Service;

use crate::body::ResponseBody;
use crate::cost::Cost;
use crate::future::ResponseFuture;
use crate::key::KeyExtractor;
use crate::layer::{MissingKey, RateLimitLayer};
use crate::permit;

/// Rate-limits requests before they reach the inner service. Built by
/// [`RateLimitLayer`].
///
/// The decision is made in `call`; `poll_ready` is the inner service's.
#[derive(Debug, Clone)]
pub struct RateLimit<S, St, K, C> {
    inner: S,
    config: RateLimitLayer<St, K, C>,
}

impl<S, St, K, C> RateLimit<S, St, K, C> {
    pub(crate) fn new(inner: S, config: RateLimitLayer<St, K, C>) -> Self {
        RateLimit { inner, config }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes the middleware, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, St, K, C, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, St, K, C>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    St: Store + Clone,
    K: KeyExtractor<Request<ReqBody>>,
    C: Cost<Request<ReqBody>>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, ResBody, St::CheckFuture>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The ready service goes with this request; the clone waits for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = &self.config;
        let Some(key) = config.key.extract(&req) else {
            return match config.missing_key {
                MissingKey::Allow => ResponseFuture::call(inner, req),
                MissingKey::Reject => ResponseFuture::missing_key(),
            };
        };
        let cost = config.cost.cost(&req);
        let check = config.store.check(key.as_bytes(), &config.policy, cost);
        let releaser = permit::releaser(&config.store, &key, &config.policy);
        ResponseFuture::checking(
            check,
            inner,
            req,
            config.policy.clone(),
            config.failure,
            releaser,
        )
    }
}
