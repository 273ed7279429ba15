//! The futures the layer's types return: the service's response future and
//! [`And`](crate::And)'s rule future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_service::Service;

use crate::decide::{Outcome, OutcomeFuture};
use crate::decisions::Decisions;
use crate::permit::PermitGuard;
use crate::responses::reject::Reject;

pub use crate::rules::rule::AndFuture;

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit): waits for the
    /// decision, then calls the inner service or answers with a refusal.
    pub struct ResponseFuture<S, Req, J>
    where
        S: Service<Req>,
        J: Reject<Req, S::Response, S::Error>,
    {
        #[pin]
        state: State<S, Req, S::Future, J::Context>,
        reject: J,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req, F, Ctx> {
        Deciding {
            outcome: OutcomeFuture,
            pending: Option<(S, Req, Ctx)>,
        },
        Calling {
            #[pin]
            future: F,
            decisions: Option<Decisions>,
            // Dropped, and released, if the request is cancelled.
            permit: Option<PermitGuard>,
        },
        Done,
    }
}

impl<S, Req, J> ResponseFuture<S, Req, J>
where
    S: Service<Req>,
    J: Reject<Req, S::Response, S::Error>,
{
    pub(crate) fn new(
        outcome: OutcomeFuture,
        service: S,
        req: Req,
        context: J::Context,
        reject: J,
    ) -> Self {
        ResponseFuture {
            state: State::Deciding {
                outcome,
                pending: Some((service, req, context)),
            },
            reject,
        }
    }
}

impl<S, Req, J> Future for ResponseFuture<S, Req, J>
where
    S: Service<Req>,
    J: Reject<Req, S::Response, S::Error>,
{
    type Output = Result<J::Response, J::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Deciding { outcome, pending } => {
                    let outcome = ready!(outcome.as_mut().poll(cx));
                    let Some((mut service, mut req, context)) = pending.take() else {
                        panic!("ResponseFuture polled after completion");
                    };
                    let (decisions, permit) = match outcome {
                        Outcome::Rejected(rejection) => {
                            this.state.set(State::Done);
                            return Poll::Ready(this.reject.rejected(&context, rejection));
                        }
                        Outcome::Allowed(decisions, permit) => {
                            this.reject.annotate(&mut req, &decisions);
                            (Some(decisions), (!permit.is_empty()).then_some(permit))
                        }
                        Outcome::Unlimited => {
                            // No limit applied (allowlisted): handlers still
                            // find an empty set of decisions.
                            this.reject.annotate(&mut req, &Decisions::default());
                            (None, None)
                        }
                        Outcome::FailedOpen(decisions, permit) => {
                            // The store failed open: handlers find the shadow
                            // policies' decisions, if any, else none.
                            this.reject.annotate(&mut req, &decisions);
                            (
                                (!decisions.is_empty()).then_some(decisions),
                                (!permit.is_empty()).then_some(permit),
                            )
                        }
                    };
                    let future = service.call(req);
                    this.state.set(State::Calling {
                        future,
                        decisions,
                        permit,
                    });
                }
                StateProj::Calling {
                    future,
                    decisions,
                    permit,
                } => {
                    let result = ready!(future.poll(cx));
                    let permit = permit.take();
                    let decisions = decisions.take();
                    this.state.set(State::Done);
                    // An error drops the permits here; a response carries them.
                    return Poll::Ready(match result {
                        Ok(response) => {
                            Ok(this.reject.allowed(response, decisions.as_ref(), permit))
                        }
                        Err(error) => Err(this.reject.error(error)),
                    });
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}
