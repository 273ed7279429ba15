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
use crate::responses::reject::sealed::Token;
use crate::settlement::reservation::Reservation;

pub use crate::rules::rule::AndFuture;

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit): waits for the
    /// decision, then calls the inner service or answers with a refusal;
    /// for limits that settle after the response, settles them once the
    /// response head arrives.
    pub struct ResponseFuture<S, Req, J>
    where
        S: Service<Req>,
        J: Reject<Req, S::Response, S::Error>,
    {
        #[pin]
        state: State<
            S,
            Req,
            S::Future,
            S::Response,
            Result<J::Response, J::Error>,
            J,
            J::Allowed,
        >,
    }
}

/// What an allowed request's response takes once it arrives.
enum After<W, J> {
    /// Its rate-limit fields, written when it was decided.
    Fields(W),
    /// A reservation to settle first; the fields are written from what the
    /// settlement reports, with these settings.
    Settle(Box<Reservation>, J),
    /// Taken by the response.
    Taken,
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req, F, R, A, J, W> {
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
            // Dropped, and released, if the request is cancelled; so is the
            // reservation, given back.
            permit: PermitGuard,
            after: After<W, J>,
        },
        // The response head arrived; the store settles what it cost.
        Settling {
            reservation: Box<Reservation>,
            reject: J,
            response: Option<R>,
            permit: PermitGuard,
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

    /// The inner service's `future` for a request allowed at once, without
    /// a reservation, holding `permit`; its response takes `fields`. Built
    /// in place: the inner future is large (it holds the request until it
    /// is polled), and each move of it is a copy.
    #[inline(always)]
    pub(crate) fn calling(future: S::Future, permit: PermitGuard, fields: J::Allowed) -> Self {
        ResponseFuture {
            state: State::Calling {
                future,
                permit,
                after: After::Fields(fields),
            },
        }
    }
}

/// The state of the response future of `S` and `J`.
type StateOf<S, Req, J> = State<
    S,
    Req,
    <S as Service<Req>>::Future,
    <S as Service<Req>>::Response,
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
    let (after, permit) = match outcome {
        Outcome::Rejected(rejection) => {
            return State::Answered {
                answer: Some(reject.rejected(&req, rejection)),
            };
        }
        // The store failed open: handlers find the shadow policies'
        // decisions, if any, else none.
        Outcome::Allowed(decisions, permit, reservation)
        | Outcome::FailedOpen(decisions, permit, reservation) => {
            let after = match reservation {
                Some(reservation) => After::Settle(reservation, reject.clone()),
                None => After::Fields(reject.allowing(Some(&decisions), Token)),
            };
            reject.annotate(&mut req, decisions);
            (after, permit)
        }
        Outcome::Unlimited => {
            // No limit applied (allowlisted): handlers still find an empty
            // set of decisions.
            reject.annotate(&mut req, Decisions::default());
            (
                After::Fields(reject.allowing(None, Token)),
                PermitGuard::default(),
            )
        }
    };
    State::Calling {
        after,
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
                    after,
                } => {
                    let result = ready!(future.poll(cx));
                    let permit = std::mem::take(permit);
                    let after = std::mem::replace(after, After::Taken);
                    // An error drops the permits here, and gives the
                    // reservation back as its rules say; a response carries
                    // the permits. Matched on what follows first, without
                    // pairing it with the result: a pair would be one more
                    // copy of both.
                    match after {
                        After::Taken => panic!("ResponseFuture polled after completion"),
                        After::Fields(allowing) => {
                            this.state.set(State::Done);
                            return Poll::Ready(match result {
                                Ok(response) => Ok(J::allowed(allowing, response, permit)),
                                Err(error) => Err(J::error(error)),
                            });
                        }
                        After::Settle(mut reservation, reject) => match result {
                            Err(error) => {
                                this.state.set(State::Done);
                                return Poll::Ready(Err(J::error(error)));
                            }
                            Ok(response) => {
                                let response =
                                    J::inspect(response, |head| reservation.inspect(head));
                                this.state.set(State::Settling {
                                    reservation,
                                    reject,
                                    response: Some(response),
                                    permit,
                                });
                            }
                        },
                    }
                }
                StateProj::Settling {
                    reservation,
                    reject,
                    response,
                    permit,
                } => {
                    let decisions = ready!(reservation.poll_settled(cx));
                    let Some(response) = response.take() else {
                        panic!("ResponseFuture polled after completion");
                    };
                    let allowing = reject.allowing(Some(&decisions), Token);
                    let permit = std::mem::take(permit);
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(J::allowed(allowing, response, permit)));
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
