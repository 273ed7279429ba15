//! Response futures.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use ratelimit_core::{Decision, Policy, StoreError};
use tower_service::Service;

use crate::body::ResponseBody;
use crate::decisions::{Decisions, PolicyDecision};
use crate::layer::FailurePolicy;
use crate::permit::{PermitGuard, Releaser};
use crate::rejection;

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit): waits for the
    /// store's decision, then calls the inner service or answers with a rejection.
    pub struct ResponseFuture<S, ReqBody, ResBody, CF>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, Request<ReqBody>, CF, S::Future, Response<ResponseBody<ResBody>>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req, CF, F, Res> {
        Checking {
            #[pin]
            check: CF,
            pending: Option<(S, Req)>,
            policy: Policy,
            failure: FailurePolicy,
            releaser: Option<Releaser>,
        },
        Calling {
            #[pin]
            future: F,
            // Dropped with the future if the request is cancelled.
            permit: Option<PermitGuard>,
        },
        Answered {
            response: Option<Res>,
        },
    }
}

impl<S, ReqBody, ResBody, CF> ResponseFuture<S, ReqBody, ResBody, CF>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    pub(crate) fn checking(
        check: CF,
        service: S,
        req: Request<ReqBody>,
        policy: Policy,
        failure: FailurePolicy,
        releaser: Option<Releaser>,
    ) -> Self {
        ResponseFuture {
            state: State::Checking {
                check,
                pending: Some((service, req)),
                policy,
                failure,
                releaser,
            },
        }
    }

    pub(crate) fn call(mut service: S, req: Request<ReqBody>) -> Self {
        ResponseFuture {
            state: State::Calling {
                future: service.call(req),
                permit: None,
            },
        }
    }

    pub(crate) fn missing_key() -> Self {
        ResponseFuture {
            state: State::Answered {
                response: Some(rejection::plain(
                    StatusCode::TOO_MANY_REQUESTS,
                    "Too Many Requests: no rate-limit key\n",
                )),
            },
        }
    }
}

impl<S, ReqBody, ResBody, CF> Future for ResponseFuture<S, ReqBody, ResBody, CF>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    CF: Future<Output = Result<Decision, StoreError>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Checking {
                    check,
                    pending,
                    policy,
                    failure,
                    releaser,
                } => {
                    let outcome = ready!(check.poll(cx));
                    let Some((mut service, mut req)) = pending.take() else {
                        panic!("ResponseFuture polled after completion");
                    };
                    let next = match outcome {
                        Ok(decision) => {
                            let allowed = decision.is_allowed();
                            // Taken before the inner call, so it is released on every path.
                            let permit = decision
                                .permit()
                                .zip(releaser.take())
                                .map(|(id, releaser)| releaser(id));
                            let decisions =
                                Decisions::new(vec![PolicyDecision::new(policy.clone(), decision)]);
                            if allowed {
                                req.extensions_mut().insert(decisions);
                                State::Calling {
                                    future: service.call(req),
                                    permit,
                                }
                            } else {
                                State::Answered {
                                    response: Some(rejection::too_many_requests(&decisions)),
                                }
                            }
                        }
                        Err(StoreError::CostExceedsLimit { .. }) => State::Answered {
                            // Retrying cannot help, so no Retry-After.
                            response: Some(rejection::plain(
                                StatusCode::TOO_MANY_REQUESTS,
                                "Too Many Requests: the request costs more than the limit allows\n",
                            )),
                        },
                        Err(StoreError::Full { .. }) => State::Answered {
                            // Admitting new keys while full is the bypass the bound exists to stop.
                            response: Some(rejection::plain(
                                StatusCode::SERVICE_UNAVAILABLE,
                                "Service Unavailable: rate limiter at capacity\n",
                            )),
                        },
                        Err(_) => match failure {
                            FailurePolicy::Open => State::Calling {
                                future: service.call(req),
                                permit: None,
                            },
                            FailurePolicy::Closed => State::Answered {
                                response: Some(rejection::plain(
                                    StatusCode::SERVICE_UNAVAILABLE,
                                    "Service Unavailable: rate limiter unavailable\n",
                                )),
                            },
                        },
                    };
                    state.set(next);
                }
                StateProj::Calling { future, permit } => {
                    let response = ready!(future.poll(cx));
                    let permit = permit.take();
                    // An error drops the permit here; a response carries it in its body.
                    let response = response?;
                    return Poll::Ready(Ok(response.map(|b| ResponseBody::with_permit(b, permit))));
                }
                StateProj::Answered { response } => {
                    let Some(response) = response.take() else {
                        panic!("ResponseFuture polled after completion");
                    };
                    return Poll::Ready(Ok(response));
                }
            }
        }
    }
}
