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
        state: State<S, Req, S::Future, Result<J::Response, J::Error>, J, J::Allowed>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req, F, A, J, W> {
        // The settings are held only while the decision is to come: a
        // request decided in `call` borrows them.
        Deciding {
            outcome: OutcomeFuture,
            pending: Option<(S, Req)>,
            reject: J,
        },
        Calling {
            #[pin]
            future: F,
            // Dropped, and released, if the request is cancelled.
            permit: PermitGuard,
            allowing: Option<W>,
        },
        // Refused when the request was decided in `call`.
        Answered {
            answer: Option<A>,
        },
        Done,
    }
}

impl<S, Req, J> ResponseFuture<S, Req, J>
where
    S: Service<Req>,
    J: Reject<Req, S::Response, S::Error>,
{
    /// The request, to call `service` with once `outcome` allows it.
    pub(crate) fn new(outcome: OutcomeFuture, service: S, req: Req, reject: J) -> Self {
        ResponseFuture {
            state: State::Deciding {
                outcome,
                pending: Some((service, req)),
                reject,
            },
        }
    }

    /// The request, decided as `outcome` already: `service` (made ready) is
    /// called now if it is allowed.
    #[inline(always)]
    pub(crate) fn decided(outcome: Outcome, service: &mut S, req: Req, reject: &J) -> Self {
        ResponseFuture {
            state: proceed(outcome, service, req, reject),
        }
    }
}

/// The state of the response future of `S` and `J`.
type StateOf<S, Req, J> = State<
    S,
    Req,
    <S as Service<Req>>::Future,
    Result<
        <J as Reject<Req, <S as Service<Req>>::Response, <S as Service<Req>>::Error>>::Response,
        <J as Reject<Req, <S as Service<Req>>::Response, <S as Service<Req>>::Error>>::Error,
    >,
    J,
    <J as Reject<Req, <S as Service<Req>>::Response, <S as Service<Req>>::Error>>::Allowed,
>;

/// What follows a decision: the inner service called with the request
/// (with its decisions), or the refusal.
#[inline(always)]
fn proceed<S, Req, J>(
    outcome: Outcome,
    service: &mut S,
    mut req: Req,
    reject: &J,
) -> StateOf<S, Req, J>
where
    S: Service<Req>,
    J: Reject<Req, S::Response, S::Error>,
{
    let (allowing, permit) = match outcome {
        Outcome::Rejected(rejection) => {
            return State::Answered {
                answer: Some(reject.rejected(&req, rejection)),
            };
        }
        Outcome::Allowed(decisions, permit) => {
            let allowing = reject.allowing(Some(&decisions));
            reject.annotate(&mut req, decisions);
            (allowing, permit)
        }
        Outcome::Unlimited => {
            // No limit applied (allowlisted): handlers still find an empty
            // set of decisions.
            reject.annotate(&mut req, Decisions::default());
            (reject.allowing(None), PermitGuard::default())
        }
        Outcome::FailedOpen(decisions, permit) => {
            // The store failed open: handlers find the shadow policies'
            // decisions, if any, else none.
            let allowing = reject.allowing(Some(&decisions));
            reject.annotate(&mut req, decisions);
            (allowing, permit)
        }
    };
    State::Calling {
        allowing: Some(allowing),
        future: service.call(req),
        permit,
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
                StateProj::Deciding {
                    outcome,
                    pending,
                    reject,
                } => {
                    let outcome = ready!(Pin::new(outcome).poll(cx));
                    let Some((mut service, req)) = pending.take() else {
                        panic!("ResponseFuture polled after completion");
                    };
                    let next = proceed(outcome, &mut service, req, reject);
                    this.state.set(next);
                }
                StateProj::Calling {
                    future,
                    permit,
                    allowing,
                } => {
                    let result = ready!(future.poll(cx));
                    let permit = std::mem::take(permit);
                    let Some(allowing) = allowing.take() else {
                        panic!("ResponseFuture polled after completion");
                    };
                    this.state.set(State::Done);
                    // An error drops the permits here; a response carries them.
                    return Poll::Ready(match result {
                        Ok(response) => Ok(J::allowed(allowing, response, permit)),
                        Err(error) => Err(J::error(error)),
                    });
                }
                StateProj::Answered { answer } => {
                    let Some(answer) = answer.take() else {
                        panic!("ResponseFuture polled after completion");
                    };
                    this.state.set(State::Done);
                    return Poll::Ready(answer);
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}
