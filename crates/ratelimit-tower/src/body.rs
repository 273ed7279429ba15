//! The response body of the rate-limit service.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::permit::PermitGuard;

pin_project! {
    /// The inner service's body, or the body of a rejection built by the layer.
    ///
    /// Keeping the rejection in the body type (instead of an error) keeps the
    /// inner service's error type, so axum's `Infallible` routers still work.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B, permit: PermitGuard },
        Full { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    /// Wraps the inner service's body, holding a concurrency permit (renewed
    /// meanwhile) until a poll returns no more frames or the body is dropped.
    pub(crate) fn with_permit(body: B, permit: PermitGuard) -> Self {
        ResponseBody {
            kind: Kind::Inner { body, permit },
        }
    }

    /// A complete body of `data`: a refusal built by the layer.
    pub(crate) fn full(data: impl Into<Bytes>) -> Self {
        let data: Bytes = data.into();
        ResponseBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("ResponseBody::Inner"),
            Kind::Full { data } => f
                .debug_tuple("ResponseBody::Full")
                .field(&data.as_ref().map_or(0, Bytes::len))
                .finish(),
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body, permit } => {
                let frame = body.poll_frame(cx);
                // Complete: free the slot now. Only at `None`: an error frame
                // need not be the last (http-body does not say so), nor need
                // a frame after which the body says it ended be (a body may
                // say so early), and a body that goes on must keep its slot.
                // A consumer that stops reading frees the slot when it
                // drops the body (hyper drops it once the body says it
                // ended, and unread when it sends none: HEAD, 204, 304).
                if matches!(frame, Poll::Ready(None)) {
                    drop(std::mem::take(permit));
                }
                frame
            }
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
