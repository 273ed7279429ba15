//! [`RateLimit`]: the service.

use std::sync::Arc;
use std::task::{Context, Poll};

use ratelimit_core::Store;
use tower_layer::Layer;
use tower_service::Service;

use crate::decide::{Outcome, decide, decide_at_once};
use crate::future::ResponseFuture;
use crate::layer::RateLimitLayer;
use crate::responses::reject::Reject;
use crate::responses::reject::sealed::Token;
use crate::rules::rule::RuleProvider;

/// Rate-limits requests before they reach the inner service. Built by
/// [`RateLimitLayer`].
///
/// The decision is made in `call`; `poll_ready` is the inner service's. When
/// the decision is known at once (static rules on a store that decides in
/// memory), an allowed request is passed to the inner service in `call`;
/// otherwise the inner service that was made ready goes with the request,
/// and a clone of it waits for the next one.
///
/// The layer's settings are shared behind one `Arc`: routers such as axum's
/// clone the service for every request, and a clone costs the inner
/// service's clone and one reference count.
#[derive(Debug)]
pub struct RateLimit<S, St, P, J> {
    inner: S,
    config: Arc<RateLimitLayer<St, P, J>>,
}

impl<S: Clone, St, P, J> Clone for RateLimit<S, St, P, J> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S, St, P, J> RateLimit<S, St, P, J> {
    pub(crate) fn new(inner: S, config: Arc<RateLimitLayer<St, P, J>>) -> Self {
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

impl<S, St, P, J, Req> Service<Req> for RateLimit<S, St, P, J>
where
    S: Service<Req> + Clone,
    St: Store + Clone,
    P: RuleProvider<Req>,
    J: Reject<Req, S::Response, S::Error>,
{
    type Response = J::Response;
    type Error = J::Error;
    type Future = ResponseFuture<S, Req, J>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(J::error)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let config = &*self.config;
        let outcome = match config.rules.limits_at_once(&req) {
            // Lent, not moved: the limits stay where they were made.
            Some(mut limits) => decide_at_once(&config.settings, &mut limits),
            None => Err(decide(config.settings.clone(), config.rules.limits(&req))),
        };
        match outcome {
            // Allowed now, the common case: the request, annotated here, goes
            // to the inner service (made ready) without being moved first.
            Ok(Outcome::Allowed(decisions, permit, None)) => {
                let fields = config.reject.allowing(Some(&decisions), Token);
                config.reject.annotate(&mut req, decisions);
                ResponseFuture::calling(self.inner.call(req), permit, fields)
            }
            // Decided now otherwise: the inner service is called now if allowed.
            Ok(outcome) => ResponseFuture::decided(outcome, &mut self.inner, req, &config.reject),
            Err(outcome) => {
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::new(outcome, inner, req, config.reject.clone())
            }
        }
    }
}

impl<S, St, P, J> Layer<S> for RateLimitLayer<St, P, J>
where
    St: Clone,
    P: Clone,
    J: Clone,
{
    type Service = RateLimit<S, St, P, J>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::new(self.clone()))
    }
}
